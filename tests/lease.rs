//! The lease protocol's promise to a waiter: a request for a pass (`dirty`) is served by
//! a pass that started after it, or left set for the next holder — never cleared by a
//! holder that then gives up. Against the in-memory state table, at the protocol's own
//! entry points (`take`, `Lease::run`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tgsync::clock::{Clock as _, ManualClock};
use tgsync::core::UnixMillis;
use tgsync::fakes::FakeState;
use tgsync::lease::{PassEnd, Taken, Timings, take};
use tgsync::state::{Acquire, Change, StateStore as _};

const GROUP: &str = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123";

fn timings() -> Timings {
    Timings::default()
}

/// The free lease of [`GROUP`], taken by `resync@demo#1`, and the group's state.
async fn held<'a>(
    store: &'a FakeState,
    clock: &'a ManualClock,
) -> (
    Box<tgsync::lease::Lease<'a, FakeState>>,
    tgsync::state::GroupState,
) {
    let Ok(Taken::Held(lease, state)) =
        take(store, clock, GROUP, "resync@demo#1".into(), timings()).await
    else {
        panic!("the lease is free");
    };
    (lease, state)
}

/// A waiter asks for a pass while the holder's pass runs, and that pass ends past the
/// run's cut-off: the holder gives the lease up without another pass, so the request
/// must stay set.
#[tokio::test]
async fn a_request_made_during_a_pass_that_ends_past_the_cut_off_stays_set() {
    let store = FakeState::default();
    let clock = ManualClock::new(UnixMillis(1_800_000_000_000));
    let (lease, state) = held(&store, &clock).await;
    let out_of_time = AtomicBool::new(false);
    let asked = AtomicBool::new(false);
    let end = lease
        .run(
            state,
            5,
            || !out_of_time.load(Ordering::SeqCst),
            std::future::pending(),
            async |_, _| {
                // A pod event's reconcile finds the lease held and asks for a pass.
                let now = clock.now();
                let waiter = store
                    .acquire(
                        GROUP,
                        "pod-events@demo#2",
                        now,
                        now.plus(Duration::from_secs(15)),
                    )
                    .await
                    .expect("acquire");
                asked.store(
                    matches!(waiter, Acquire::HeldElsewhere { .. }),
                    Ordering::SeqCst,
                );
                // This pass ends past the run's cut-off.
                out_of_time.store(true, Ordering::SeqCst);
                PassEnd::Done(Change::default())
            },
        )
        .await;
    assert!(asked.load(Ordering::SeqCst), "the race was staged: {end:?}");
    let stored = store.stored(GROUP);
    assert!(
        stored.lease.is_none(),
        "the lease was given back: {stored:?}"
    );
    assert!(
        stored.dirty,
        "the waiter's request was cleared and nobody served it: {end:?}, {stored:?}"
    );
}

/// A waiter whose holder died (its request parked until the holder's lease expired)
/// takes the lease over and finds no time left for a pass: its own request must stay set
/// for the next holder.
#[tokio::test]
async fn a_waiter_that_takes_over_with_no_time_left_leaves_its_request_set() {
    let store = FakeState::default();
    let clock = ManualClock::new(UnixMillis(1_800_000_000_000));
    let now = clock.now();
    // The holder takes the lease and dies.
    let held = store
        .acquire(
            GROUP,
            "resync@demo#1",
            now,
            now.plus(Duration::from_secs(15)),
        )
        .await
        .expect("acquire");
    assert!(matches!(held, Acquire::Acquired(_)));
    // The waiter asks (dirty) and is told the holder's lease: its queue parks it.
    let waiter = || take(&store, &clock, GROUP, "pod-events@demo#2".into(), timings());
    let Ok(Taken::Busy(busy)) = waiter().await else {
        panic!("the lease is held");
    };
    assert_eq!(busy.owner, "resync@demo#1");
    assert!(
        store.stored(GROUP).dirty,
        "the holder was asked to run again"
    );
    // The dead holder's lease runs out, and its takeover grace after it (what `busy`
    // says); the parked request comes back and takes over.
    clock.advance(busy.until.0 + 1_000 - clock.now().0);
    let Ok(Taken::Held(lease, state)) = waiter().await else {
        panic!("the waiter takes over from the dead holder");
    };
    // Taken at the limit of its time: no pass fits.
    let passes = AtomicBool::new(false);
    let end = lease
        .run(
            state,
            5,
            || false,
            std::future::pending(),
            async |_, _| {
                passes.store(true, Ordering::SeqCst);
                PassEnd::Done(Change::default())
            },
        )
        .await;
    assert!(!passes.load(Ordering::SeqCst), "no pass ran: {end:?}");
    let stored = store.stored(GROUP);
    assert!(stored.lease.is_none(), "given back: {stored:?}");
    assert!(
        stored.dirty,
        "the request the waiter took over is lost: {end:?}, {stored:?}"
    );
}

/// The process is told to shut down while a pass waits for a call in flight (Lambda
/// kills it 500 ms after SIGTERM, and the call may outlast that): the lease is handed
/// over at once, before the pass ends — shortened to one write margin, with a request
/// for another pass — and no write starts under it; when the pass ends in time, the
/// lease is given back with the request left set.
#[tokio::test]
async fn shutting_down_mid_pass_hands_the_lease_over_before_the_pass_ends() {
    let store = FakeState::default();
    let clock = ManualClock::new(UnixMillis(1_800_000_000_000));
    let (lease, state) = held(&store, &clock).await;
    let signalled = clock.now();
    let (signal, shutdown) = tokio::sync::oneshot::channel::<()>();
    let signal = std::sync::Mutex::new(Some(signal));
    let shutting_down = AtomicBool::new(false);
    let mut during = None;
    let end = lease
        .run(
            state,
            5,
            || !shutting_down.load(Ordering::SeqCst),
            async {
                let _ = shutdown.await;
            },
            async |_, lease| {
                // SIGTERM while the pass's call is in flight.
                shutting_down.store(true, Ordering::SeqCst);
                if let Some(s) = signal.lock().expect("signal").take() {
                    let _ = s.send(());
                }
                // The call takes its time; the pass looks at the table meanwhile.
                for _ in 0..200 {
                    let stored = store.stored(GROUP);
                    if stored.dirty {
                        let ready = tokio::time::timeout(Duration::from_secs(1), lease.ready())
                            .await
                            .expect("ready answers at once");
                        during = Some((stored, lease.check().is_err(), ready));
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                PassEnd::Cut(Change::default())
            },
        )
        .await;
    let Some((during, fenced, ready)) = during else {
        panic!("nothing was written while the pass's call was in flight: {end:?}");
    };
    let held = during.lease.expect("still held during the pass");
    assert_eq!(held.owner, "resync@demo#1");
    assert_eq!(
        held.until,
        signalled.plus(timings().write_margin),
        "the lease ends one write margin after the signal, not a lease duration"
    );
    assert!(fenced, "no ELBv2 call may start under a handed-over lease");
    assert!(
        matches!(ready, Err(tgsync::state::StateError::HandedOver { .. })),
        "no write waits for a renewal that will not come: {ready:?}"
    );
    assert_eq!(end, tgsync::lease::RunEnd::Cut);
    let stored = store.stored(GROUP);
    assert!(stored.lease.is_none(), "given back: {stored:?}");
    assert!(stored.dirty, "another pass is asked for: {stored:?}");
}
