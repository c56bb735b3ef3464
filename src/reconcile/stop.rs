//! When passes stop: the process told to shut down (SIGTERM), and the leases this
//! container's passes hold meanwhile, which the shutdown hook waits for.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Whether the process is shutting down, and how many leased passes still run. One per
/// container, shared by every pass.
#[derive(Debug, Default)]
pub struct Stop {
    /// Set when the process is told to stop: passes stop before their next change and
    /// give their leases back.
    shutting_down: AtomicBool,
    /// Signalled with `shutting_down`.
    notify: tokio::sync::Notify,
    /// Leased passes running now.
    leased: AtomicUsize,
}

impl Stop {
    /// Tells every pass to stop before its next change and give its lease back (the
    /// process is shutting down).
    pub fn shut_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Whether [`Stop::shut_down`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Leases held by passes of this container right now.
    pub fn passes_in_flight(&self) -> usize {
        self.leased.load(Ordering::SeqCst)
    }

    /// Counts a held lease for as long as the returned guard lives.
    pub(crate) fn holding(&self) -> Holding<'_> {
        self.leased.fetch_add(1, Ordering::SeqCst);
        Holding(&self.leased)
    }

    /// Completes when [`Stop::shut_down`] is called (after this was created).
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Completes when the process starts shutting down (at once if it has): what a
    /// lease holder waits on to hand its lease over.
    pub(crate) async fn shutting_down(&self) {
        let notified = self.notify.notified();
        if self.is_shutting_down() {
            return;
        }
        notified.await;
    }
}

/// A held lease, counted in [`Stop::passes_in_flight`] until dropped.
pub(crate) struct Holding<'a>(&'a AtomicUsize);

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lease_counts_until_its_guard_drops() {
        let stop = Stop::default();
        let held = stop.holding();
        let also = stop.holding();
        assert_eq!(stop.passes_in_flight(), 2);
        drop(held);
        assert_eq!(stop.passes_in_flight(), 1);
        drop(also);
        assert_eq!(stop.passes_in_flight(), 0);
    }

    #[tokio::test]
    async fn shutting_down_completes_at_once_once_told() {
        let stop = Stop::default();
        assert!(!stop.is_shutting_down());
        stop.shut_down();
        assert!(stop.is_shutting_down());
        // Told before it was awaited: completes without another signal.
        tokio::time::timeout(std::time::Duration::from_secs(1), stop.shutting_down())
            .await
            .expect("already shutting down");
    }
}
