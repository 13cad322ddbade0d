//! The one background-job abstraction: a named task with a status and a graceful
//! shutdown. Heartbeats, persist, replication and the jobs to come all run as jobs, and
//! `locus report` and the status page list them (state, runs, last run, backlog), the way
//! Garage's `garage worker list` does.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::now_ms;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a job is doing now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for its next run (or for work).
    #[default]
    Idle,
    /// A run is in progress.
    Running,
    /// Stopped (shut down); it runs no more.
    Stopped,
}

impl JobState {
    /// The lower-case name reports print.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Idle => "idle",
            JobState::Running => "running",
            JobState::Stopped => "stopped",
        }
    }
}

/// What a job has done so far.
#[derive(Clone, Debug, Default)]
pub struct JobStatus {
    pub name: String,
    pub state: JobState,
    pub runs: u64,
    pub failures: u64,
    pub last_error: Option<String>,
    /// When the last run (or unit of work) ended, in ms since the epoch; 0 before any.
    pub last_run_ms: i64,
    /// Work waiting (queued operations, blocks to copy, ...); 0 when the job keeps none.
    pub backlog: u64,
}

type Shared = Arc<Mutex<JobStatus>>;

fn record(s: &Shared, name: &str, r: &crate::Result<()>) {
    let mut s = s.lock().unwrap_or_else(PoisonError::into_inner);
    s.runs += 1;
    s.last_run_ms = now_ms();
    match r {
        Ok(()) => s.last_error = None,
        Err(e) => {
            s.failures += 1;
            let msg = e.to_string();
            if s.last_error.as_deref() != Some(&msg) {
                tracing::warn!(job = %name, error = %msg, "background job failed");
            }
            s.last_error = Some(msg);
        }
    }
}

/// A running job.
pub struct Job {
    status: Shared,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

impl Job {
    /// Run `f` now and then every `every` until stopped. A failed run is logged and
    /// counted; the job keeps going.
    pub fn spawn_periodic<F, Fut>(name: &str, every: Duration, mut f: F) -> Job
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = crate::Result<()>> + Send,
    {
        let status: Shared = Arc::new(Mutex::new(JobStatus { name: name.to_string(), ..Default::default() }));
        let (stop, mut stopped) = watch::channel(false);
        let st = status.clone();
        let name = name.to_string();
        let handle = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => break,
                }
                st.lock().unwrap_or_else(PoisonError::into_inner).state = JobState::Running;
                let r = f().await;
                record(&st, &name, &r);
                st.lock().unwrap_or_else(PoisonError::into_inner).state = JobState::Idle;
            }
            st.lock().unwrap_or_else(PoisonError::into_inner).state = JobState::Stopped;
        });
        Job { status, stop, handle }
    }

    /// Run a long-lived loop (a scheduler with its own pacing). `f` gets a receiver that
    /// turns true when the job must stop, and a handle to report its status.
    pub fn spawn_loop<F, Fut>(name: &str, f: F) -> Job
    where
        F: FnOnce(watch::Receiver<bool>, JobHandle) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let status: Shared = Arc::new(Mutex::new(JobStatus { name: name.to_string(), ..Default::default() }));
        let (stop, stopped) = watch::channel(false);
        let fut = f(stopped, JobHandle { status: status.clone() });
        let st = status.clone();
        let handle = tokio::spawn(async move {
            fut.await;
            st.lock().unwrap_or_else(PoisonError::into_inner).state = JobState::Stopped;
        });
        Job { status, stop, handle }
    }

    pub fn status(&self) -> JobStatus {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// A handle that reads this job's status (for reports), also after it stopped.
    pub fn watch(&self) -> JobWatch {
        JobWatch { status: self.status.clone() }
    }

    /// Ask the job to stop after its current run, and wait for it.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.handle.await;
    }

    /// Stop at once, abandoning a run in progress (a simulated crash).
    pub fn abort(self) {
        self.handle.abort();
        self.status.lock().unwrap_or_else(PoisonError::into_inner).state = JobState::Stopped;
    }
}

/// Reads a job's status.
#[derive(Clone)]
pub struct JobWatch {
    status: Shared,
}

impl JobWatch {
    pub fn status(&self) -> JobStatus {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// What a loop job uses to report its runs.
#[derive(Clone)]
pub struct JobHandle {
    status: Shared,
}

impl JobHandle {
    /// Count one unit of work and its outcome.
    pub fn record(&self, r: &crate::Result<()>) {
        let name = self.status.lock().unwrap_or_else(PoisonError::into_inner).name.clone();
        record(&self.status, &name, r);
    }
    /// Whether work is in progress now.
    pub fn set_running(&self, running: bool) {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).state =
            if running { JobState::Running } else { JobState::Idle };
    }
    /// The work waiting now.
    pub fn set_backlog(&self, backlog: u64) {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).backlog = backlog;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn periodic_jobs_report_runs_failures_and_stop() {
        let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let n2 = n.clone();
        let job = Job::spawn_periodic("t.periodic", Duration::from_millis(5), move || {
            let k = n2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { if k % 2 == 1 { Err(crate::Error::unavailable("odd run")) } else { Ok(()) } }
        });
        let w = job.watch();
        while w.status().runs < 4 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let s = w.status();
        assert_eq!(s.name, "t.periodic");
        assert!(s.failures >= 1 && s.failures < s.runs, "{s:?}");
        assert!(s.last_run_ms > 0);
        job.stop().await;
        assert_eq!(w.status().state, JobState::Stopped);
    }

    #[tokio::test]
    async fn loop_jobs_report_state_and_backlog() {
        let (go, mut wait) = tokio::sync::mpsc::channel::<()>(1);
        let job = Job::spawn_loop("t.loop", move |mut stop, h| async move {
            h.set_backlog(3);
            h.set_running(true);
            let _ = wait.recv().await;
            h.set_running(false);
            h.record(&Ok(()));
            let _ = stop.changed().await;
        });
        let w = job.watch();
        while w.status().state != JobState::Running {
            tokio::task::yield_now().await;
        }
        assert_eq!(w.status().backlog, 3);
        go.send(()).await.unwrap();
        while w.status().runs == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(w.status().state, JobState::Idle);
        job.stop().await;
        assert_eq!(w.status().state, JobState::Stopped);
    }
}
