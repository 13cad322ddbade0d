//! The one background-job abstraction: a named periodic task with a status and a
//! graceful shutdown. Heartbeats, eviction, persist and metadata sync all run as jobs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use std::sync::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a job has done so far.
#[derive(Clone, Debug, Default)]
pub struct JobStatus {
    pub name: String,
    pub runs: u64,
    pub failures: u64,
    pub last_error: Option<String>,
}

/// A running job.
pub struct Job {
    status: Arc<Mutex<JobStatus>>,
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
        let status = Arc::new(Mutex::new(JobStatus { name: name.to_string(), ..Default::default() }));
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
                let r = f().await;
                let mut s = st.lock().unwrap();
                s.runs += 1;
                if let Err(e) = r {
                    s.failures += 1;
                    if s.last_error.as_deref() != Some(&e.to_string()) {
                        tracing::warn!(job = %name, error = %e, "background job failed");
                    }
                    s.last_error = Some(e.to_string());
                } else {
                    s.last_error = None;
                }
            }
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
        let status = Arc::new(Mutex::new(JobStatus { name: name.to_string(), ..Default::default() }));
        let (stop, stopped) = watch::channel(false);
        let handle = tokio::spawn(f(stopped, JobHandle { status: status.clone() }));
        Job { status, stop, handle }
    }

    pub fn status(&self) -> JobStatus {
        self.status.lock().unwrap().clone()
    }

    /// Ask the job to stop after its current run, and wait for it.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.handle.await;
    }

    /// Stop at once, abandoning a run in progress (a simulated crash).
    pub fn abort(self) {
        self.handle.abort();
    }
}

/// What a loop job uses to report its runs.
#[derive(Clone)]
pub struct JobHandle {
    status: Arc<Mutex<JobStatus>>,
}

impl JobHandle {
    /// Count one unit of work and its outcome.
    pub fn record(&self, r: &crate::Result<()>) {
        let mut s = self.status.lock().unwrap();
        s.runs += 1;
        match r {
            Ok(()) => s.last_error = None,
            Err(e) => {
                s.failures += 1;
                s.last_error = Some(e.to_string());
            }
        }
    }
}
