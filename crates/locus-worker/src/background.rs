//! The worker's background lane: a small Tokio runtime of its own whose threads run at a
//! lower CPU priority (`worker.persist_nice`), for the work no caller waits on: persisting
//! files to the UFS. On a host that also runs the compute, that work yields the CPU to
//! reads, writes and the compute itself, and catches up when the CPU is idle. Its UFS
//! connections are its own too (see [`crate::Inner::ufs`]), so that the I/O of a
//! foreground read is never driven by a low-priority thread.

use std::future::Future;

use locus_common::{Error, Result};

pub(crate) struct Background {
    rt: Option<tokio::runtime::Runtime>,
}

impl Background {
    /// Start the lane; its threads run `nice` steps below the thread that starts it.
    pub(crate) fn new(nice: u8) -> Result<Background> {
        let base = thread_nice();
        let threads = std::thread::available_parallelism().map(|n| n.get().min(2)).unwrap_or(1);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("locus-persist")
            .enable_all()
            // Every thread the runtime starts, its blocking threads too.
            .on_thread_start(move || set_thread_nice(base.saturating_add(nice as i32).min(19)))
            .build()
            .map_err(|e| Error::io("start the worker's background runtime", e))?;
        Ok(Background { rt: Some(rt) })
    }

    /// Run `f` on the lane and wait for its result.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let rt = self.rt.as_ref().expect("taken only by drop");
        rt.spawn(f).await.map_err(|e| Error::internal(format!("background task: {e}")))?
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // A runtime may not be dropped (which blocks) inside another one.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The calling thread's nice value (Linux keeps one per thread).
pub(crate) fn thread_nice() -> i32 {
    // SAFETY: plain system calls on the calling thread's id. getpriority may return -1 as
    // a value: errno is cleared first and read after.
    unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t);
        if n == -1 && *libc::__errno_location() != 0 { 0 } else { n }
    }
}

fn set_thread_nice(nice: i32) {
    if nice == thread_nice() {
        return;
    }
    // SAFETY: a plain system call on the calling thread's id. Raising a thread's nice value
    // needs no privilege.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) } != 0 {
        tracing::warn!(nice, error = %std::io::Error::last_os_error(), "could not lower the persist threads' priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_lane_runs_lower_and_leaves_the_caller_alone() {
        let base = thread_nice();
        let bg = Background::new(10).unwrap();
        let want = (base + 10).min(19);
        assert_eq!(bg.run(async { Ok(thread_nice()) }).await.unwrap(), want);
        let blocking = bg
            .run(async { tokio::task::spawn_blocking(thread_nice).await.map_err(|e| Error::internal(e.to_string())) });
        assert_eq!(blocking.await.unwrap(), want, "the lane's blocking threads run lower too");
        assert_eq!(thread_nice(), base, "the caller's thread is untouched");
        let same = Background::new(0).unwrap();
        assert_eq!(same.run(async { Ok(thread_nice()) }).await.unwrap(), base);
        assert!(bg.run(async { Err::<(), _>(Error::invalid("x")) }).await.is_err(), "errors come back");
    }
}
