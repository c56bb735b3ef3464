//! The lease and ledger protocol's transitions, side-effect free: what each write of a
//! group's lease is conditional on and what it changes ([`Step`]), how a holder reads a
//! refusal, and the fence's decision. [`crate::lease`] decides with these; the state
//! table adapters apply them — the in-memory fake by [`Step::apply`], DynamoDB by
//! rendering the same [`Guard`] and [`Effect`] into a condition and an update expression
//! (`aws::dynamo::update`) — and the model check (`model_tests.rs`, the tests
//! `lease_model_*`) explores every interleaving of these same functions.
//!
//! Times are milliseconds (Unix time for the wall clock; any origin for the monotonic
//! one): every function only adds and compares, so it behaves the same for any origin.
//!
//! ELBv2 takes no fencing token, so one writer per group rests on timing, with these
//! bounds (see docs/architecture.md, "Safety"):
//! - a write starts only with more than [`Timings::write_margin`] of lease left, by the
//!   holder's wall clock and by its monotonic clock ([`may_write`]);
//! - an ELBv2 attempt is abandoned after `MUTATION_ATTEMPT_DEADLINE` (5 s), less than the
//!   margin, and one abandoned may still land: a lease given back after one ends *now*
//!   instead of being deleted ([`release`], [`give_up`] with `linger`), so a taker waits
//!   the takeover grace as it does after an expiry;
//! - a waiter takes a lease over only [`Timings::takeover_grace`] after its expiry
//!   ([`take`]), and nothing that writes without the lease (a verification, the index's
//!   retirement) treats a lease as free before then ([`verified`], [`retire`] with
//!   [`expired_before`]);
//! - renewals only extend ([`renew`]), and every write of a holder is conditional on the
//!   item's version, so an older write delivered late (an SDK retry) never overwrites a
//!   newer one ([`write`]);
//! - at shutdown a process hands on the requests it has not served before its passes in
//!   flight drain, for it exits before a pass whose call is in flight may end
//!   ([`winding_up`]; the runner ends every run in its order).

use std::time::Duration;

/// The lease's clock settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long a lease lasts without renewal: the most a dead holder blocks its group
    /// (plus the takeover grace).
    pub duration: Duration,
    /// How often a holder renews while it works.
    pub renew_every: Duration,
    /// A holder stops writing when its lease has less than this left: longer than an
    /// ELBv2 attempt may take (`crate::aws::MUTATION_ATTEMPT_DEADLINE`), so an attempt
    /// started before has ended before the lease expires.
    pub write_margin: Duration,
    /// A waiter takes over an expired lease only this long after its expiry (as stored):
    /// longer than any ELBv2 attempt, so one sent by a holder whose clock ran behind, or
    /// that took its whole deadline, has landed before the new holder acts.
    pub takeover_grace: Duration,
    /// The longest (real time) a pass waits for its lease to be renewed before a write
    /// (`Lease::ready`) before it counts the lease as lost.
    pub ready_wait: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            write_margin: Duration::from_secs(6),
            takeover_grace: Duration::from_secs(6),
            ready_wait: Duration::from_secs(20),
        }
    }
}

/// Milliseconds of a duration (saturating).
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Timings {
    /// The lease's duration in milliseconds.
    pub fn duration_ms(&self) -> u64 {
        ms(self.duration)
    }

    /// The takeover grace in milliseconds.
    pub fn grace_ms(&self) -> u64 {
        ms(self.takeover_grace)
    }

    /// The write margin in milliseconds.
    pub fn margin_ms(&self) -> u64 {
        ms(self.write_margin)
    }

    /// The renewal period in milliseconds.
    pub fn renew_ms(&self) -> u64 {
        ms(self.renew_every)
    }
}

/// A group's lease as stored: its holder (`None`: given back), the expiry, the request
/// for another pass, and the item's version (bumped by every taking of the lease and
/// every write of the group's state).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Record<O> {
    /// The holder's owner id.
    pub owner: Option<O>,
    /// The expiry (0 without a holder).
    pub until: u64,
    /// Somebody asked for another pass.
    pub dirty: bool,
    /// The item's version (0: never written).
    pub version: u64,
}

/// One clause of a condition on the stored item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Clause<O> {
    /// Nobody holds the lease (`attribute_not_exists(owner)`).
    NoOwner,
    /// The lease's holder is this one.
    OwnerIs(O),
    /// The lease's expiry is at or after this time (and there is a holder).
    UntilAtLeast(u64),
    /// The lease's expiry is before this time (and there is a holder).
    UntilBefore(u64),
    /// No request for another pass is pending.
    NotDirty,
    /// The item's version is this one (0: the item has none).
    VersionIs(u64),
}

impl<O: PartialEq> Clause<O> {
    /// Whether the clause holds for `r`.
    pub fn holds(&self, r: &Record<O>) -> bool {
        match self {
            Self::NoOwner => r.owner.is_none(),
            Self::OwnerIs(o) => r.owner.as_ref() == Some(o),
            Self::UntilAtLeast(t) => r.owner.is_some() && r.until >= *t,
            Self::UntilBefore(t) => r.owner.is_some() && r.until < *t,
            Self::NotDirty => !r.dirty,
            Self::VersionIs(v) => r.version == *v,
        }
    }
}

/// A condition: any of its conjunctions holds (an empty guard always holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard<O>(pub Vec<Vec<Clause<O>>>);

impl<O> Guard<O> {
    /// A guard of one conjunction.
    pub fn all(clauses: Vec<Clause<O>>) -> Self {
        Self(vec![clauses])
    }
}

impl<O: PartialEq> Guard<O> {
    /// Whether the guard holds for `r`.
    pub fn holds(&self, r: &Record<O>) -> bool {
        self.0.is_empty() || self.0.iter().any(|c| c.iter().all(|x| x.holds(r)))
    }
}

/// What happens to the lease's holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder<O> {
    /// Unchanged.
    Keep,
    /// This one holds it now.
    Set(O),
    /// Nobody holds it (the expiry goes too).
    Remove,
}

/// What a write changes of the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect<O> {
    /// The holder.
    pub owner: Holder<O>,
    /// A new expiry.
    pub until: Option<u64>,
    /// A new `dirty` flag.
    pub dirty: Option<bool>,
    /// The version is bumped.
    pub bump: bool,
    /// The lease is taken (the adapters also clear the verification checkpoint).
    pub take: bool,
}

impl<O> Default for Effect<O> {
    fn default() -> Self {
        Self {
            owner: Holder::Keep,
            until: None,
            dirty: None,
            bump: false,
            take: false,
        }
    }
}

impl<O> Effect<O> {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        matches!(self.owner, Holder::Keep)
            && self.until.is_none()
            && self.dirty.is_none()
            && !self.bump
    }
}

/// One conditional write of a group's lease: applied whole if its guard holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step<O> {
    /// The condition.
    pub guard: Guard<O>,
    /// The change.
    pub effect: Effect<O>,
}

impl<O: PartialEq + Clone> Step<O> {
    /// Applies the step to `r` if its guard holds; whether it did.
    pub fn apply(&self, r: &mut Record<O>) -> bool {
        if !self.guard.holds(r) {
            return false;
        }
        let e = &self.effect;
        match &e.owner {
            Holder::Keep => {}
            Holder::Set(o) => r.owner = Some(o.clone()),
            Holder::Remove => {
                r.owner = None;
                r.until = 0;
            }
        }
        if let Some(u) = e.until {
            r.until = u;
        }
        if let Some(d) = e.dirty {
            r.dirty = d;
        }
        if e.bump {
            r.version += 1;
        }
        true
    }
}

/// The times of a taking of the lease at `now`: an expired lease of another holder is
/// taken only if it expired before the first (its expiry plus the takeover grace has
/// passed); the new lease lasts until the second.
pub fn take_times(now: u64, t: &Timings) -> (u64, u64) {
    (
        now.saturating_sub(t.grace_ms()),
        now.saturating_add(t.duration_ms()),
    )
}

/// When a waiter may take over a lease stored as expiring at `until`.
pub fn busy_until(until: u64, t: &Timings) -> u64 {
    until.saturating_add(t.grace_ms())
}

/// Takes the lease for `me` until `until` if nobody holds it, its holder's expiry is
/// before `expired_before` ([`take_times`]), or it is already `me`'s (a retried take
/// that had landed); clears `dirty`, bumps the version.
pub fn take<O: Clone>(me: &O, expired_before: u64, until: u64) -> Step<O> {
    Step {
        guard: Guard(vec![
            vec![Clause::NoOwner],
            vec![Clause::UntilBefore(expired_before)],
            vec![Clause::OwnerIs(me.clone())],
        ]),
        effect: Effect {
            owner: Holder::Set(me.clone()),
            until: Some(until),
            dirty: Some(false),
            bump: true,
            take: true,
        },
    }
}

/// Asks `holder` (seen holding the lease by a refused [`take`]) for another pass, while
/// its lease is not past its takeover grace (`expired_before` as in [`take`]).
pub fn mark<O: Clone>(holder: &O, expired_before: u64) -> Step<O> {
    Step {
        guard: Guard::all(vec![
            Clause::OwnerIs(holder.clone()),
            Clause::UntilAtLeast(expired_before),
        ]),
        effect: Effect {
            dirty: Some(true),
            ..Effect::default()
        },
    }
}

/// Extends `me`'s lease to `until`, only if that extends it: a renewal sent earlier and
/// delivered after a later one never shortens the lease. Conditional on ownership, not
/// on expiry: a lease that expired under a slow holder and that nobody took is taken
/// back.
pub fn renew<O: Clone>(me: &O, until: u64) -> Step<O> {
    Step {
        guard: Guard::all(vec![
            Clause::OwnerIs(me.clone()),
            Clause::UntilBefore(until),
        ]),
        effect: Effect {
            until: Some(until),
            ..Effect::default()
        },
    }
}

/// Whether a refused [`renew`] of `me`'s lease to `until` still finds the lease `me`'s
/// for at least that long (a later renewal landed first): the holder goes on.
pub fn renewed<O: PartialEq>(old: Option<&Record<O>>, me: &O, until: u64) -> bool {
    old.is_some_and(|r| r.owner.as_ref() == Some(me) && r.until >= until)
}

/// A holder shutting down: its lease ends at `until` (one write margin from now) with a
/// request for another pass, while it is `me`'s.
pub fn hand_over<O: Clone>(me: &O, until: u64) -> Step<O> {
    Step {
        guard: Guard::all(vec![Clause::OwnerIs(me.clone())]),
        effect: Effect {
            until: Some(until),
            dirty: Some(true),
            ..Effect::default()
        },
    }
}

/// The fencing condition of every write of a holder: the lease is `me`'s, unexpired at
/// `now`, and the item is still at the `version` the holder last wrote or read.
fn fenced<O: Clone>(me: &O, now: u64, version: u64) -> Vec<Clause<O>> {
    vec![
        Clause::OwnerIs(me.clone()),
        Clause::UntilAtLeast(now),
        Clause::VersionIs(version),
    ]
}

/// A fenced write of the group's state by `me` (see [`fenced`]); bumps the version.
pub fn write<O: Clone>(me: &O, now: u64, version: u64) -> Step<O> {
    Step {
        guard: Guard::all(fenced(me, now, version)),
        effect: Effect {
            bump: true,
            ..Effect::default()
        },
    }
}

/// Whether a refused [`write`] at `version` had in fact landed (a retry of it was
/// refused): the lease is still `me`'s and the item is one version on. Only `me` writes
/// under its lease, and any taking of it bumps the version, so this is `me`'s write.
pub fn write_landed<O: PartialEq>(old: Option<&Record<O>>, me: &O, version: u64) -> bool {
    old.is_some_and(|r| r.owner.as_ref() == Some(me) && r.version == version + 1)
}

/// The end of `me`'s lease: how the lease is given back. Deleted, so anyone may take
/// it at once, when every ELBv2 attempt under it was answered; otherwise (`linger`: an
/// attempt was abandoned and may still land) kept with its expiry set to `now`, so a
/// taker waits the takeover grace, as after an expiry.
fn ended<O>(now: u64, linger: bool) -> (Holder<O>, Option<u64>) {
    if linger {
        (Holder::Keep, Some(now))
    } else {
        (Holder::Remove, None)
    }
}

/// Releases `me`'s lease at `now` with the pass's change written (`changes`: the change
/// is not empty, so the version is bumped), unless a pass was asked for (`dirty`): then
/// [`run_again`]. See [`ended`] for `linger`.
pub fn release<O: Clone>(me: &O, now: u64, version: u64, changes: bool, linger: bool) -> Step<O> {
    let mut guard = fenced(me, now, version);
    guard.push(Clause::NotDirty);
    let (owner, until) = ended(now, linger);
    Step {
        guard: Guard::all(guard),
        effect: Effect {
            owner,
            until,
            dirty: Some(false),
            bump: changes,
            take: false,
        },
    }
}

/// Keeps `me`'s lease to `until` after a release found `dirty`: the flag is cleared and
/// the change written; the holder runs another pass.
pub fn run_again<O: Clone>(me: &O, now: u64, version: u64, until: u64, changes: bool) -> Step<O> {
    Step {
        guard: Guard::all(fenced(me, now, version)),
        effect: Effect {
            until: Some(until),
            dirty: Some(false),
            bump: changes,
            ..Effect::default()
        },
    }
}

/// What a refused [`release`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The release had landed (a retry of it was refused).
    Landed,
    /// A pass was asked for: [`run_again`].
    RunAgain,
    /// The lease is no longer `me`'s (expired, taken over).
    Lost,
}

/// Reads the item a refused [`release`] found.
pub fn release_refused<O: PartialEq>(
    old: Option<&Record<O>>,
    me: &O,
    now: u64,
    version: u64,
    changes: bool,
) -> Refused {
    let Some(r) = old else {
        return Refused::Lost;
    };
    let mine = r.owner.as_ref() == Some(me);
    let held = mine && r.until >= now;
    if held && r.version == version && r.dirty {
        return Refused::RunAgain;
    }
    let after = version + u64::from(changes);
    // Only `me` writes under its lease and every taking bumps the version: one version
    // on (or none, for an empty change) with the lease given back or ended is ours.
    if r.version == after && (r.owner.is_none() || (mine && !r.dirty)) && (changes || !held) {
        return Refused::Landed;
    }
    Refused::Lost
}

/// Gives `me`'s lease up at `now` with the change written, whatever `dirty` says
/// (setting it with `ask`): the holder leaves a request unserved. See [`ended`] for
/// `linger`.
pub fn give_up<O: Clone>(
    me: &O,
    now: u64,
    version: u64,
    changes: bool,
    ask: bool,
    linger: bool,
) -> Step<O> {
    let (owner, until) = ended(now, linger);
    Step {
        guard: Guard::all(fenced(me, now, version)),
        effect: Effect {
            owner,
            until,
            dirty: ask.then_some(true),
            bump: changes,
            take: false,
        },
    }
}

/// After a refused [`give_up`] (the lease expired, or the item moved on): writes
/// nothing, but gives back what may still be `me`'s and leaves the request. With
/// `linger` the holder stays recorded (its expiry, already past or near, lets a taker
/// in only after the grace); `None` when there is nothing to write.
pub fn just_go<O: Clone>(me: &O, ask: bool, linger: bool) -> Option<Step<O>> {
    let effect = Effect {
        owner: if linger { Holder::Keep } else { Holder::Remove },
        dirty: ask.then_some(true),
        ..Effect::default()
    };
    (!effect.is_empty()).then(|| Step {
        guard: Guard::all(vec![Clause::OwnerIs(me.clone())]),
        effect,
    })
}

/// What a write made without the lease at `now` (a verification, the index's
/// retirement: [`verified`], [`retire`]) passes as `expired_before`: one takeover grace
/// before now, as a waiter's [`take`] ([`take_times`]), for an ELBv2 attempt of the
/// holder may land until then.
pub fn expired_before(now: u64, t: &Timings) -> u64 {
    now.saturating_sub(t.grace_ms())
}

/// The lease is free for a write made without it at `now`: nobody holds it, or its
/// expiry is past by the takeover grace (`expired_before` from [`expired_before`]); the
/// item is still at `version`.
fn unleased<O>(version: u64, expired_before: u64) -> Guard<O> {
    Guard(vec![
        vec![Clause::VersionIs(version), Clause::NoOwner],
        vec![
            Clause::VersionIs(version),
            Clause::UntilBefore(expired_before),
        ],
    ])
}

/// A verification recorded without the lease (a checkpoint): only if the item is still
/// at `version` and the lease is free (see [`unleased`]); bumps the version.
pub fn verified<O>(version: u64, expired_before: u64) -> Step<O> {
    Step {
        guard: unleased(version, expired_before),
        effect: Effect {
            bump: true,
            ..Effect::default()
        },
    }
}

/// The guard of taking a group out of a cluster's index: the item is still at
/// `version`, the lease free (see [`unleased`]) and no pass asked for.
pub fn retire<O>(version: u64, expired_before: u64) -> Guard<O> {
    let Guard(mut any) = unleased(version, expired_before);
    for c in &mut any {
        c.push(Clause::NotDirty);
    }
    Guard(any)
}

/// The fence: whether a write may start, by the holder's two views of its lease — the
/// wall clock against the stored expiry `until`, the monotonic clock against its own
/// `deadline` (from before the request that last extended the lease) — each with more
/// than the write margin left. Asked right before every ELBv2 attempt.
pub fn may_write(wall_now: u64, until: u64, mono_now: u64, deadline: u64, t: &Timings) -> bool {
    let m = t.margin_ms();
    wall_now.saturating_add(m) < until && mono_now.saturating_add(m) < deadline
}

/// The holder's views of its lease after a hand-over at `wall_now` / `mono_now`: each
/// shortened to one write margin from now.
pub fn handed_over(
    until: u64,
    deadline: u64,
    wall_now: u64,
    mono_now: u64,
    t: &Timings,
) -> (u64, u64) {
    let m = t.margin_ms();
    (
        until.min(wall_now.saturating_add(m)),
        deadline.min(mono_now.saturating_add(m)),
    )
}

/// Whether a renewal is due at `wall_now`, the lease last extended at `confirmed`.
pub fn renewal_due(wall_now: u64, confirmed: u64, t: &Timings) -> bool {
    wall_now >= confirmed.saturating_add(t.renew_ms())
}

/// One stage of a run's end ([`winding_up`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wind {
    /// The requests the run has not served — still queued or parked, or left by the
    /// passes that ended — are handed on: each group's `dirty` flag (and the index's
    /// record of requests), so whoever holds or next takes its lease serves it.
    HandOn,
    /// The passes in flight end (each gives its lease back; at shutdown each lease was
    /// handed over at the signal, [`hand_over`]). A pass whose ELBv2 call is in flight
    /// may take its whole attempt deadline (5 s).
    Drain,
}

/// The order a run ends in. When its time is up the passes in flight drain, then
/// whatever is left is handed on. At shutdown the process exits ~400 ms after the
/// signal, before a pass whose ELBv2 call is in flight may end: what is queued or
/// parked is handed on first, then the passes drain, then what they left is handed on
/// (if the process still runs).
pub fn winding_up(shutting_down: bool) -> &'static [Wind] {
    if shutting_down {
        &[Wind::HandOn, Wind::Drain, Wind::HandOn]
    } else {
        &[Wind::Drain, Wind::HandOn]
    }
}

/// The longest a killed holder keeps its group from a waiter: its lease, renewed up to
/// the moment it dies, lasts one duration, then the grace; a waiter polling the lease
/// every `poll` notices within one more poll.
pub fn takeover_bound(t: &Timings, poll: Duration) -> Duration {
    t.duration + t.takeover_grace + poll
}

#[cfg(test)]
mod model_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        owner: Option<&'static str>,
        until: u64,
        dirty: bool,
        version: u64,
    ) -> Record<&'static str> {
        Record {
            owner,
            until,
            dirty,
            version,
        }
    }

    #[test]
    fn a_lease_ended_after_an_abandoned_attempt_is_taken_only_after_the_grace() {
        let t = Timings::default();
        let mut r = rec(Some("a"), 15_000, false, 1);
        assert!(release(&"a", 5_000, 1, true, true).apply(&mut r));
        assert_eq!(r, rec(Some("a"), 5_000, false, 2));
        let (before, until) = take_times(5_000 + t.grace_ms(), &t);
        assert!(
            !take(&"b", before, until).apply(&mut r.clone()),
            "within the grace"
        );
        let (before, until) = take_times(5_001 + t.grace_ms(), &t);
        assert!(take(&"b", before, until).apply(&mut r));
        // Without an abandoned attempt the lease is deleted: taken at once.
        let mut r = rec(Some("a"), 15_000, false, 1);
        assert!(release(&"a", 5_000, 1, false, false).apply(&mut r));
        assert_eq!(r, rec(None, 0, false, 1));
    }

    #[test]
    fn renewals_only_extend_and_writes_only_follow_their_version() {
        let mut r = rec(Some("a"), 15_000, false, 3);
        assert!(renew(&"a", 20_000).apply(&mut r));
        assert!(!renew(&"a", 18_000).apply(&mut r), "an older renewal, late");
        assert!(renewed(Some(&r), &"a", 18_000));
        assert_eq!(r.until, 20_000);
        assert!(write(&"a", 10_000, 3).apply(&mut r));
        assert!(write(&"a", 10_000, 4).apply(&mut r));
        assert!(!write(&"a", 10_000, 3).apply(&mut r), "a duplicate, late");
        assert!(!write_landed(Some(&r), &"a", 3));
        assert!(write_landed(Some(&r), &"a", 4));
    }

    #[test]
    fn nothing_written_without_the_lease_treats_it_as_free_at_its_expiry() {
        let t = Timings::default();
        let r = rec(Some("a"), 10_000, false, 2);
        let before = expired_before(10_001, &t);
        assert!(!verified::<&str>(2, before).guard.holds(&r));
        assert!(!retire::<&str>(2, before).holds(&r));
        let before = expired_before(10_001 + t.grace_ms(), &t);
        assert_eq!(before, take_times(10_001 + t.grace_ms(), &t).0, "as a take");
        assert!(verified::<&str>(2, before).guard.holds(&r));
        assert!(retire::<&str>(2, before).holds(&r));
    }

    #[test]
    fn at_shutdown_requests_are_handed_on_before_the_passes_drain() {
        assert_eq!(winding_up(true).first(), Some(&Wind::HandOn));
        assert_eq!(winding_up(true).last(), Some(&Wind::HandOn));
        assert_eq!(winding_up(false), &[Wind::Drain, Wind::HandOn]);
    }

    #[test]
    fn a_refused_release_says_whether_it_landed() {
        let mut r = rec(Some("a"), 15_000, false, 1);
        let step = release(&"a", 5_000, 1, true, false);
        assert!(step.apply(&mut r));
        assert!(!step.apply(&mut r), "its retry");
        assert_eq!(
            release_refused(Some(&r), &"a", 5_000, 1, true),
            Refused::Landed
        );
        let r = rec(Some("a"), 15_000, true, 1);
        assert_eq!(
            release_refused(Some(&r), &"a", 5_000, 1, true),
            Refused::RunAgain
        );
        let r = rec(Some("b"), 15_000, false, 2);
        assert_eq!(
            release_refused(Some(&r), &"a", 5_000, 1, true),
            Refused::Lost
        );
    }
}
