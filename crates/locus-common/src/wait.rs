//! Waiting for a condition that other tasks change, without polling: the waiter checks
//! it, then sleeps until the state's [`Notify`] is signalled (`notify_waiters`, by every
//! change of that state) or its deadline passes.

use std::time::Instant;

use tokio::sync::Notify;

/// Wait until `check` gives `Some`, checking again each time `changed` is signalled, or
/// until `deadline` (then `check`'s last answer, `None`). `wake_by` may name an earlier
/// time to check again at: a condition that also changes with time alone (a worker that
/// times out) is seen then, with no signal.
pub async fn until<T>(
    changed: &Notify,
    deadline: Instant,
    mut check: impl FnMut() -> (Option<T>, Option<Instant>),
) -> Option<T> {
    loop {
        // Registered before the check, so a change between the check and the sleep
        // still wakes this waiter.
        let signalled = changed.notified();
        tokio::pin!(signalled);
        signalled.as_mut().enable();
        let (got, wake_by) = check();
        if got.is_some() {
            return got;
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        let at = wake_by.map_or(deadline, |w| w.min(deadline)).max(now);
        let _ = tokio::time::timeout_at(at.into(), signalled).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_signal_wakes_the_waiter_at_once_and_the_deadline_ends_it() {
        let (n, v) = (Arc::new(Notify::new()), Arc::new(AtomicU32::new(0)));
        let (n2, v2) = (n.clone(), v.clone());
        let setter = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            v2.store(7, SeqCst);
            n2.notify_waiters();
        });
        let t = Instant::now();
        let got = until(&n, t + Duration::from_secs(30), || ((v.load(SeqCst) == 7).then_some(7), None)).await;
        assert_eq!(got, Some(7));
        assert!(t.elapsed() < Duration::from_secs(5), "woken by the signal, not the deadline");
        setter.await.unwrap();
        let t = Instant::now();
        let got: Option<()> = until(&n, t + Duration::from_millis(100), || (None, None)).await;
        assert_eq!(got, None);
        assert!(t.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn a_condition_that_changes_with_time_is_checked_at_its_wake_time() {
        let n = Notify::new();
        let t = Instant::now();
        let ready_at = t + Duration::from_millis(100);
        let got = until(&n, t + Duration::from_secs(30), || {
            let now = Instant::now();
            ((now >= ready_at).then_some(()), Some(ready_at))
        })
        .await;
        assert_eq!(got, Some(()));
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
