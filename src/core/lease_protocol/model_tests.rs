//! An exhaustive model check of the lease and ledger protocol with `stateright`, over the
//! protocol's own transitions: every change of the group's item is one of
//! [`super`]'s [`Step`]s applied with [`Step::apply`] (as the fake applies them and the
//! DynamoDB adapter renders them), refusals are read with [`super::release_refused`] and
//! [`super::renewed`], the holder fences its ELBv2 requests with [`super::may_write`]
//! and plans its pass with [`crate::core::plan`]; what a deregistration leaves in the
//! ledger is [`crate::core::plan::tombstone`]; a write made without the lease (a
//! verification's checkpoint, the index's retirement) finds the lease free by
//! [`super::verified`] / [`super::retire`] with [`super::expired_before`]; a process
//! SIGTERMed ends its run in [`super::winding_up`]'s order, as the runner does. The model
//! only adds the world around them: time, clocks, ELBv2, the network and the processes.
//!
//! One group, one target T, two pod-events processes (each with its clock offset),
//! 1-s ticks and the real constants. Every time is kept relative to now and clamped
//! where smaller values behave the same, lease ids (owner ids: one per take) are
//! renumbered by age and the item's version kept relative, so the state space is finite
//! and the search covers runs of any length. The adversary: pod changes, ELBv2 requests
//! landing at any tick until their abandonment and up to `delta` after it, a stall
//! between the fence check and the request leaving, renewals that hang and land late
//! (after later ones), renewals that fail for good, ledger writes sent again by the SDK
//! that land late (a pass's write-ahead, or the change it writes as it runs again),
//! kills, SIGTERM hand-overs, a request queued behind another group's pass at SIGTERM,
//! and verifications and retirements made without the lease.
//!
//! Each finding of issue 55, put back, fails a configuration with a trace:
//! a release that deletes the owner after an abandoned attempt (`late_landings`,
//! `late_landings_mirror`, `sigterm`, ...), no tombstone (`late_landings`,
//! `beyond_the_bounds`, ...), renewals that may shorten the lease (`clock_offset`),
//! ledger writes not conditional on the item's version (`duplicated_write`), requests
//! handed on only after the passes in flight drain at SIGTERM (`sigterm_queued`), and a
//! verification or retirement that treats a lease as free at its expiry
//! (`writes_without_the_lease`).
//!
//! Run: `cargo test -p tgsync --lib lease_model`.

// Two processes, by index.
#![allow(clippy::needless_range_loop)]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use stateright::{Checker, Model, Property};

use super::{Record, Refused, Step, Timings, Wind};
use crate::core::lease_protocol as p;
use crate::core::plan::{Claim, Rules, plan, tombstone};
use crate::core::{HealthState, Mode, Target, UnixMillis};

/// One tick of the model, in milliseconds.
const TICK: u64 = 1000;
/// The absolute time (ms) every stored time is relative to: "now" in every state.
const NOW: u64 = 1_000_000;
/// The pod-events process's wait for a held lease before it hands its request on.
const LEASE_WAIT: u8 = 23;
/// The item's version in every state (versions are kept relative to it).
const V: u64 = 10;

fn secs(d: std::time::Duration) -> u64 {
    d.as_secs()
}

/// The adversary's bounds and budgets.
#[derive(Debug, Clone)]
struct Cfg {
    name: &'static str,
    /// Each process's clock offset (s).
    skew: [i64; 2],
    /// How long after its abandonment an ELBv2 attempt may still land (s).
    delta: u8,
    /// The longest stall between the fence check and the request leaving (s; one stall).
    stall: u8,
    kills: u8,
    terms: u8,
    /// Renewals that hang (land late, any time within `late_renewal`, answer lost).
    hangs: u8,
    late_renewal: u8,
    /// One process's renewals may start failing for good.
    fails: u8,
    /// Ledger writes the SDK sends again (a pass's write-ahead, or the change a pass
    /// writes as it runs again), landing late (within `late_copy`).
    copies: u8,
    late_copy: u8,
    /// Pod changes.
    flips: u8,
    /// Pod changes that find the process's room taken by another group's pass, its
    /// ELBv2 call in flight: the request waits in a watching container's queue.
    busy: u8,
    /// Writes made without the lease (a verification recording its checkpoint, the
    /// index's retirement of the group), each when it finds the lease free.
    unleased: u8,
    /// T registered, in the ledger and desired at the start.
    registered: bool,
    /// The ledger holds a tombstone of T older than the forget grace at the start (T
    /// neither registered nor desired).
    old_tomb: bool,
    /// A pass is asked of A at the start (the full diff), no pod change needed.
    ask: bool,
    /// Within the stated bounds: every property; beyond them only the ledger's.
    within: bool,
}

impl Cfg {
    fn base(name: &'static str) -> Self {
        Self {
            name,
            skew: [0, 0],
            delta: 0,
            stall: 0,
            kills: 0,
            terms: 0,
            hangs: 0,
            late_renewal: 0,
            fails: 0,
            copies: 0,
            late_copy: 0,
            flips: 2,
            busy: 0,
            unleased: 0,
            registered: false,
            old_tomb: false,
            ask: false,
            within: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Pc {
    Idle,
    /// Killed or SIGTERMed; `retry`: its invocation is retried as a new process.
    Dead {
        retry: bool,
    },
    Want,
    /// A pod change waits in the queue for room, taken by another group's pass whose
    /// ELBv2 call is in flight.
    Queued,
    /// A take refused: marks the holder seen.
    Mark,
    Parked,
    Read,
    /// The write-ahead ledger entry before RegisterTargets.
    LedgerWrite,
    /// The fence check before an attempt.
    Check,
    /// The fence check passed; the request leaves after `stall`.
    Emit,
    Await,
    /// The pass ends: release.
    Release,
    /// `Lease::ready`: waits for a renewal.
    Wait,
    Cut,
}

impl Pc {
    fn holding(self) -> bool {
        matches!(
            self,
            Pc::Read
                | Pc::LedgerWrite
                | Pc::Check
                | Pc::Emit
                | Pc::Await
                | Pc::Release
                | Pc::Wait
                | Pc::Cut
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Nothing,
    Register,
    Deregister,
    Adopt,
    Forget,
}

/// T's ledger entry and the lease id that wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Led {
    None,
    Live(u8),
    Tomb(u8),
    /// A tombstone older than the forget grace (from before the start).
    Old,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Actor {
    pc: Pc,
    /// The lease id (owner id) held, or seen held (`Mark`).
    ep: u8,
    /// The holder's views (absolute ms; wall clock, monotonic clock) and when the lease
    /// was last extended (wall).
    until: u64,
    deadline: u64,
    confirmed: u64,
    /// The item's version as the holder last wrote or read it.
    version: u64,
    op: Op,
    /// Pod changes read by the pass.
    read: u8,
    /// Seconds since the attempt started (clamped at the deadline).
    att: u8,
    answered: bool,
    /// An attempt was abandoned under this lease (`Fence::abandoned`).
    doubt: bool,
    lost: bool,
    handed: bool,
    /// Seconds waited for a renewal.
    waited: u8,
    ret: Pc,
    failing: bool,
    stall: u8,
    /// Parked: when to look again (wall, absolute ms), and seconds left to wait.
    park: u64,
    left: u8,
}

impl Actor {
    fn idle() -> Self {
        Self {
            pc: Pc::Idle,
            ep: 0,
            until: 0,
            deadline: 0,
            confirmed: 0,
            version: 0,
            op: Op::Nothing,
            read: 0,
            att: 0,
            answered: false,
            doubt: false,
            lost: false,
            handed: false,
            waited: 0,
            ret: Pc::Idle,
            failing: false,
            stall: 0,
            park: 0,
            left: 0,
        }
    }

    fn wanting() -> Self {
        Self {
            pc: Pc::Want,
            left: LEASE_WAIT,
            ..Self::idle()
        }
    }
}

/// An ELBv2 request in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Req {
    register: bool,
    ep: u8,
    actor: u8,
    /// Its sender still waits for it (not abandoned).
    current: bool,
    /// Seconds within which it lands.
    by: u8,
}

/// Which DynamoDB write is in flight late.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    /// A hung renewal ([`p::renew`]).
    Renewal,
    /// A copy of a pass's write-ahead ([`p::write`]).
    Write,
    /// A copy of the change a pass wrote as it ran again ([`p::run_again`]).
    RunAgain,
}

/// A DynamoDB write in flight: a hung renewal or a ledger write sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Late {
    kind: Kind,
    owner: u8,
    /// The renewal's expiry, or the write's `now` (absolute ms).
    at: u64,
    version: u64,
    /// A run-again's new expiry (absolute ms) and whether it writes a change.
    until: u64,
    changes: bool,
    /// What the write leaves as T's ledger entry (`None`: it does not touch it).
    led: Option<Led>,
    age: u8,
}

const OUTLIVES: u8 = 1;
const CLOBBER: u8 = 2;
const UNLEASED: u8 = 4;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct S {
    item: Record<u8>,
    led: Led,
    elb: bool,
    desired: bool,
    flips: u8,
    served: u8,
    requested: bool,
    /// The newest lease id granted.
    latest: u8,
    net: Vec<Req>,
    late: Vec<Late>,
    acts: [Actor; 2],
    kills: u8,
    terms: u8,
    hangs: u8,
    fails: u8,
    copies: u8,
    stalls: u8,
    busy: u8,
    unleased: u8,
    /// A write made without the lease found it free, and no lease was taken since.
    free: bool,
    /// A killed holder's lease id, the seconds since, and the process that waits for
    /// the group since then (`u8::MAX`: none).
    killed: Option<(u8, u8, u8)>,
    bad: u8,
}

/// One step of the model: its label and the state it leads to.
#[derive(Clone, PartialEq)]
struct Act(String, Box<S>);

impl fmt::Debug for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

struct Lease {
    c: Cfg,
    t: Timings,
    /// A violation was reported (see [`Lease::sound`]).
    reported: AtomicBool,
}

const NAMES: [&str; 2] = ["A", "B"];

impl Lease {
    fn new(c: Cfg) -> Self {
        Self {
            c,
            t: Timings::default(),
            reported: AtomicBool::new(false),
        }
    }

    fn wall(&self, i: usize) -> u64 {
        NOW.saturating_add_signed(self.c.skew[i] * 1000)
    }

    fn l(&self) -> u64 {
        self.t.duration_ms()
    }

    fn deadline_secs() -> u8 {
        u8::try_from(secs(crate::aws::MUTATION_ATTEMPT_DEADLINE)).unwrap_or(u8::MAX)
    }

    fn init(&self) -> S {
        let reg = self.c.registered;
        S {
            item: Record {
                owner: None,
                until: 0,
                dirty: false,
                version: V,
            },
            led: if reg {
                Led::Live(0)
            } else if self.c.old_tomb {
                Led::Old
            } else {
                Led::None
            },
            elb: reg,
            desired: reg,
            flips: 0,
            served: 0,
            requested: false,
            latest: 0,
            net: Vec::new(),
            late: Vec::new(),
            acts: [
                if self.c.ask {
                    Actor::wanting()
                } else {
                    Actor::idle()
                },
                Actor::idle(),
            ],
            kills: self.c.kills,
            terms: self.c.terms,
            hangs: self.c.hangs,
            fails: self.c.fails,
            copies: self.c.copies,
            stalls: u8::from(self.c.stall > 0),
            busy: self.c.busy,
            unleased: self.c.unleased,
            free: false,
            killed: None,
            bad: 0,
        }
    }

    /// The fence, by the protocol.
    fn fresh(&self, i: usize, a: &Actor) -> bool {
        !a.lost && !a.handed && p::may_write(self.wall(i), a.until, NOW, a.deadline, &self.t)
    }

    /// Applies `step` to the item; whether its condition held.
    fn apply(s: &mut S, step: &Step<u8>) -> bool {
        step.apply(&mut s.item)
    }

    /// The pass's plan, by the diff (shared mode).
    fn plan(&self, s: &S, i: usize) -> Op {
        let t: Target = "10.0.0.1:80".parse().unwrap_or_else(|_| unreachable!());
        let now = UnixMillis(self.wall(i));
        let desired: BTreeMap<Target, ()> = if s.desired {
            [(t, ())].into()
        } else {
            BTreeMap::new()
        };
        let actual: Vec<(Target, HealthState)> = if s.elb {
            vec![(t, HealthState::Healthy)]
        } else {
            vec![]
        };
        let rules = Rules::new(Mode::Shared, now);
        let claim = |tomb, since| Claim {
            mine: true,
            since,
            tombstone: tomb,
        };
        // Older than the forget grace.
        let long_ago = UnixMillis(now.0 - secs(rules.forget_grace) * 1000 - TICK);
        let claims: BTreeMap<Target, Claim> = match s.led {
            Led::None => BTreeMap::new(),
            Led::Live(_) => [(t, claim(false, now))].into(),
            Led::Tomb(_) => [(t, claim(true, now))].into(),
            Led::Old => [(t, claim(true, long_ago))].into(),
        };
        let pl = plan(
            &desired,
            actual.iter().map(|(t, h)| (t, h)),
            &claims,
            &rules,
        );
        if !pl.register.is_empty() {
            Op::Register
        } else if !pl.deregister.is_empty() {
            Op::Deregister
        } else if !pl.adopt.is_empty() {
            Op::Adopt
        } else if !pl.forget.is_empty() {
            Op::Forget
        } else {
            Op::Nothing
        }
    }

    /// The ledger the pass's end writes (`None`: no change).
    fn ledger_change(&self, i: usize, a: &Actor) -> Option<Led> {
        match a.op {
            Op::Deregister => Some(match tombstone(UnixMillis(self.wall(i))) {
                Some(_) => Led::Tomb(a.ep),
                None => Led::None,
            }),
            Op::Adopt => Some(Led::Live(a.ep)),
            Op::Forget => Some(Led::None),
            Op::Register | Op::Nothing => None,
        }
    }

    /// The lease given up: `give_up`, or `just_go` when refused.
    fn give_up(&self, s: &mut S, i: usize, changes: Option<Led>, ask: bool) {
        let a = s.acts[i];
        let step = p::give_up(
            &a.ep,
            self.wall(i),
            a.version,
            changes.is_some(),
            ask,
            a.doubt,
        );
        if Self::apply(s, &step) {
            if let Some(l) = changes {
                s.led = l;
            }
        } else if let Some(go) = p::just_go(&a.ep, ask, a.doubt) {
            Self::apply(s, &go);
        }
        s.acts[i] = Actor::idle();
    }

    /// Process `i` SIGTERMed: each lease it holds is handed over at the signal
    /// (`Lease::hold`), then the runner ends in the protocol's order
    /// ([`p::winding_up`]), and the process exits ~400 ms after the signal, before a
    /// pass whose ELBv2 call is in flight (T's, or the other group's a queued request
    /// waits behind) ends. A pod-events invocation is retried; a request from the watch
    /// is not.
    fn sigterm(&self, s: &S, i: usize) -> (String, S) {
        let a = &s.acts[i];
        let mut n = s.clone();
        n.terms -= 1;
        let mut did: Vec<&str> = Vec::new();
        if a.pc.holding() {
            Self::apply(
                &mut n,
                &p::hand_over(&a.ep, self.wall(i) + self.t.margin_ms()),
            );
            did.push("hands the lease over");
        }
        for wind in p::winding_up(true) {
            match wind {
                Wind::HandOn => {
                    if a.pc == Pc::Queued {
                        n.requested = true;
                        did.push("hands on its queued request");
                    }
                }
                Wind::Drain => {
                    if matches!(a.pc, Pc::Emit | Pc::Await | Pc::Queued) {
                        did.push("exits while a pass in flight waits for its ELBv2 call");
                        break;
                    }
                    did.push("its passes drain");
                }
            }
        }
        n.acts[i] = Actor {
            pc: Pc::Dead {
                retry: a.pc != Pc::Queued,
            },
            ..Actor::idle()
        };
        (format!("{} SIGTERM: {}", NAMES[i], did.join("; ")), n)
    }

    fn succ(&self, s: &S) -> Vec<(String, S)> {
        let mut urgent: Vec<(String, S)> = Vec::new();
        let mut free: Vec<(String, S)> = Vec::new();
        if s.bad != 0 {
            return urgent;
        }
        let l = self.l();
        let d = Self::deadline_secs();
        for i in 0..2 {
            let a = &s.acts[i];
            let nm = NAMES[i];
            let wall = self.wall(i);
            let rel = |x: u64| (x as i64 - wall as i64) / 1000;
            let mut n = s.clone();
            match a.pc {
                Pc::Idle | Pc::Dead { retry: false } => {}
                Pc::Dead { retry: true } => {
                    n.acts[i] = Actor::wanting();
                    free.push((
                        format!("{nm}: its invocation is retried (a new process)"),
                        n,
                    ));
                }
                Pc::Queued => {
                    n.acts[i] = Actor::wanting();
                    free.push((
                        format!("{nm}: the other group's pass ends; T's pass starts"),
                        n,
                    ));
                }
                Pc::Want => {
                    let me = max_id(s) + 1;
                    let (before, until) = p::take_times(wall, &self.t);
                    if Self::apply(&mut n, &p::take(&me, before, until)) {
                        n.latest = me;
                        n.free = false;
                        n.acts[i] = Actor {
                            pc: Pc::Read,
                            ep: me,
                            until,
                            deadline: NOW + l,
                            confirmed: wall,
                            version: n.item.version,
                            ..Actor::idle()
                        };
                        urgent.push((
                            format!("{nm} takes the lease, until now{:+}", rel(until)),
                            n,
                        ));
                    } else {
                        n.acts[i].pc = Pc::Mark;
                        n.acts[i].ep = s.item.owner.unwrap_or(0);
                        urgent.push((
                            format!("{nm}: take refused (held until now{:+})", rel(s.item.until)),
                            n,
                        ));
                    }
                }
                Pc::Mark => {
                    let (before, _) = p::take_times(wall, &self.t);
                    if Self::apply(&mut n, &p::mark(&a.ep, before)) {
                        n.acts[i].pc = Pc::Parked;
                        n.acts[i].park = p::busy_until(s.item.until, &self.t) + TICK;
                        urgent.push((format!("{nm} marks the holder dirty and parks"), n));
                    } else {
                        n.acts[i].pc = Pc::Want;
                        urgent.push((format!("{nm}: mark refused; takes again"), n));
                    }
                }
                Pc::Parked => {
                    if a.left == 0 {
                        n.acts[i] = Actor::idle();
                        n.requested = true;
                        urgent.push((format!("{nm}: run over; hands the request on"), n));
                    } else if s.item.owner.is_none()
                        || p::busy_until(s.item.until, &self.t) < wall
                        || a.park <= wall
                    {
                        n.acts[i].pc = Pc::Want;
                        urgent.push((format!("{nm} unparks"), n));
                    }
                }
                Pc::Read => {
                    let op = self.plan(s, i);
                    n.acts[i].op = op;
                    n.acts[i].read = s.flips;
                    n.acts[i].pc = match op {
                        Op::Register => Pc::LedgerWrite,
                        Op::Deregister => Pc::Check,
                        Op::Adopt | Op::Forget | Op::Nothing => Pc::Release,
                    };
                    urgent.push((format!("{nm} reads pods, health, ledger: plan {op:?}"), n));
                }
                Pc::LedgerWrite | Pc::Check | Pc::Wait if a.lost || a.handed => {
                    n.acts[i].pc = Pc::Cut;
                    urgent.push((format!("{nm}: lease lost; the pass is cut"), n));
                }
                Pc::LedgerWrite | Pc::Check if !self.fresh(i, a) => {
                    n.acts[i].pc = Pc::Wait;
                    n.acts[i].ret = a.pc;
                    n.acts[i].waited = 0;
                    urgent.push((format!("{nm}: lease not fresh; waits for a renewal"), n));
                }
                Pc::LedgerWrite => {
                    if Self::apply(&mut n, &p::write(&a.ep, wall, a.version)) {
                        n.led = Led::Live(a.ep);
                        n.acts[i].version = n.item.version;
                        n.acts[i].pc = Pc::Check;
                        if s.copies > 0 {
                            let mut m = n.clone();
                            m.copies -= 1;
                            m.late.push(Late {
                                kind: Kind::Write,
                                owner: a.ep,
                                at: wall,
                                version: a.version,
                                until: 0,
                                changes: true,
                                led: Some(Led::Live(a.ep)),
                                age: 0,
                            });
                            m.late.sort();
                            free.push((
                                format!(
                                    "{nm} writes the ledger +T ahead (the SDK will send it AGAIN, late)"
                                ),
                                m,
                            ));
                        }
                        urgent.push((format!("{nm} writes the ledger +T ahead"), n));
                    } else {
                        n.acts[i].lost = true;
                        n.acts[i].pc = Pc::Cut;
                        urgent.push((format!("{nm}: ledger write refused"), n));
                    }
                }
                Pc::Check => {
                    n.acts[i].pc = Pc::Emit;
                    n.acts[i].att = 0;
                    n.acts[i].answered = false;
                    n.acts[i].stall = 0;
                    if s.stalls > 0 {
                        for st in 1..=self.c.stall {
                            let mut m = n.clone();
                            m.stalls -= 1;
                            m.acts[i].stall = st;
                            free.push((
                                format!("{nm}: fence passes, then the process STALLS {st} s"),
                                m,
                            ));
                        }
                    }
                    urgent.push((format!("{nm}: fence passes"), n));
                }
                Pc::Emit if a.stall == 0 => {
                    let by = d.saturating_sub(a.att) + self.c.delta;
                    n.net.push(Req {
                        register: a.op == Op::Register,
                        ep: a.ep,
                        actor: i as u8,
                        current: true,
                        by,
                    });
                    n.net.sort();
                    n.acts[i].pc = Pc::Await;
                    let what = if a.op == Op::Register {
                        "Register"
                    } else {
                        "Deregister"
                    };
                    urgent.push((format!("{nm}: {what}(T) leaves (lands within {by} s)"), n));
                }
                Pc::Emit => {}
                Pc::Await => {
                    let due = s
                        .net
                        .iter()
                        .any(|r| usize::from(r.actor) == i && r.current && r.by == 0);
                    // The answer comes before the attempt's deadline, or the attempt
                    // is abandoned (whether its request landed or not).
                    if a.att >= d && !due {
                        n.acts[i].pc = Pc::Check;
                        n.acts[i].doubt = true;
                        for r in &mut n.net {
                            if usize::from(r.actor) == i {
                                r.current = false;
                            }
                        }
                        n.net.sort();
                        urgent.push((format!("{nm}: attempt ABANDONED after {d} s; retried"), n));
                    } else if a.answered {
                        n.acts[i].pc = Pc::Release;
                        free.push((format!("{nm} gets the answer"), n));
                    }
                }
                Pc::Release => {
                    let change = self.ledger_change(i, a);
                    let changes = change.is_some();
                    let now = wall;
                    let step = p::release(&a.ep, now, a.version, changes, a.doubt);
                    let served = s.served.max(a.read);
                    let mut g = s.clone();
                    self.give_up(&mut g, i, change, false);
                    g.served = served;
                    free.push((format!("{nm}: out of time; gives the lease up"), g));
                    if Self::apply(&mut n, &step) {
                        if let Some(c) = change {
                            n.led = c;
                        }
                        n.served = served;
                        n.acts[i] = Actor::idle();
                        let lg = if n.item.owner.is_some() {
                            " (the lease ends now: an attempt may still land)"
                        } else {
                            " (the lease deleted)"
                        };
                        urgent.push((format!("{nm} releases{lg}"), n));
                    } else {
                        match p::release_refused(Some(&s.item), &a.ep, now, a.version, changes) {
                            Refused::Landed => {
                                n.acts[i] = Actor::idle();
                                n.served = served;
                                urgent.push((format!("{nm}: release had landed"), n));
                            }
                            Refused::RunAgain => {
                                let until = now + l;
                                if Self::apply(
                                    &mut n,
                                    &p::run_again(&a.ep, now, a.version, until, changes),
                                ) {
                                    if let Some(c) = change {
                                        n.led = c;
                                    }
                                    n.served = served;
                                    let b = &mut n.acts[i];
                                    b.version = n.item.version;
                                    b.until = b.until.max(until);
                                    b.deadline = b.deadline.max(NOW + l);
                                    b.confirmed = now;
                                    b.pc = Pc::Read;
                                    if s.copies > 0 && changes {
                                        let mut m = n.clone();
                                        m.copies -= 1;
                                        m.late.push(Late {
                                            kind: Kind::RunAgain,
                                            owner: a.ep,
                                            at: now,
                                            version: a.version,
                                            until,
                                            changes,
                                            led: change,
                                            age: 0,
                                        });
                                        m.late.sort();
                                        free.push((
                                            format!(
                                                "{nm}: release finds dirty; writes {} and runs another pass (the SDK will send the write AGAIN, late)",
                                                led_name(change)
                                            ),
                                            m,
                                        ));
                                    }
                                    urgent.push((
                                        format!("{nm}: release finds dirty; runs another pass"),
                                        n,
                                    ));
                                } else {
                                    self.give_up(&mut n, i, None, true);
                                    urgent.push((format!("{nm}: run-again refused; gives up"), n));
                                }
                            }
                            Refused::Lost => {
                                self.give_up(&mut n, i, None, true);
                                urgent.push((
                                    format!("{nm}: lease lost at release; gives up (dirty)"),
                                    n,
                                ));
                            }
                        }
                    }
                }
                Pc::Wait => {
                    if self.fresh(i, a) {
                        n.acts[i].pc = a.ret;
                        urgent.push((format!("{nm}: renewed; goes on"), n));
                    } else if u64::from(a.waited) >= secs(self.t.ready_wait) {
                        n.acts[i].lost = true;
                        n.acts[i].pc = Pc::Cut;
                        urgent.push((format!("{nm}: no renewal within ready_wait; lost"), n));
                    }
                }
                Pc::Cut => {
                    self.give_up(&mut n, i, None, true);
                    urgent.push((format!("{nm} gives the lease up (dirty)"), n));
                }
            }
            if a.pc == Pc::Queued && s.terms > 0 {
                free.push(self.sigterm(s, i));
            }
            if !a.pc.holding() || (a.pc == Pc::Emit && a.stall > 0) {
                // A stalled process does nothing, its heartbeat included.
                continue;
            }
            // The heartbeat.
            if a.pc != Pc::Cut && !a.lost && !a.handed {
                if !a.failing && s.fails > 0 {
                    let mut n = s.clone();
                    n.fails -= 1;
                    n.acts[i].failing = true;
                    free.push((format!("{nm}: renewals start FAILING"), n));
                }
                let due = p::renewal_due(wall, a.confirmed, &self.t) || a.pc == Pc::Wait;
                let spaced = !s
                    .late
                    .iter()
                    .any(|x| x.kind == Kind::Renewal && x.owner == a.ep && x.age == 0);
                if due && spaced && !a.failing {
                    let until = wall + l;
                    let mut n = s.clone();
                    let ok = Self::apply(&mut n, &p::renew(&a.ep, until))
                        || p::renewed(Some(&n.item), &a.ep, until);
                    let b = &mut n.acts[i];
                    if ok {
                        b.until = b.until.max(until);
                        b.deadline = b.deadline.max(NOW + l);
                        b.confirmed = wall;
                        urgent.push((format!("{nm} renews to now{:+}", rel(until)), n));
                    } else {
                        b.lost = true;
                        urgent.push((format!("{nm}: renewal refused"), n));
                    }
                    if s.hangs > 0 {
                        let mut m = s.clone();
                        m.hangs -= 1;
                        m.late.push(Late {
                            kind: Kind::Renewal,
                            owner: a.ep,
                            at: until,
                            version: 0,
                            until: 0,
                            changes: false,
                            led: None,
                            age: 0,
                        });
                        m.late.sort();
                        free.push((format!("{nm}'s renewal to now{:+} HANGS", rel(until)), m));
                    }
                }
            }
            if s.kills > 0 {
                let mut n = s.clone();
                n.kills -= 1;
                n.acts[i] = Actor {
                    pc: Pc::Dead { retry: true },
                    ..Actor::idle()
                };
                // The other process, if it waits for the group since the kill.
                let other = 1 - i;
                let w = if matches!(s.acts[other].pc, Pc::Want | Pc::Mark | Pc::Parked) {
                    other as u8
                } else {
                    u8::MAX
                };
                n.killed = Some((a.ep, 0, w));
                free.push((format!("{nm} KILLED"), n));
            }
            if s.terms > 0 && !a.handed {
                free.push(self.sigterm(s, i));
            }
        }
        // DynamoDB writes landing late.
        for (k, x) in s.late.iter().enumerate() {
            let mut n = s.clone();
            n.late.remove(k);
            let step = match x.kind {
                Kind::Renewal => p::renew(&x.owner, x.at),
                Kind::Write => p::write(&x.owner, x.at, x.version),
                Kind::RunAgain => p::run_again(&x.owner, x.at, x.version, x.until, x.changes),
            };
            let applied = Self::apply(&mut n, &step);
            if applied && let Some(l) = x.led {
                n.led = l;
            }
            let label = match x.kind {
                Kind::Renewal => format!(
                    "the hung renewal (to now{:+}) lands: {}",
                    (x.at as i64 - NOW as i64) / 1000,
                    if applied { "APPLIED" } else { "refused" }
                ),
                _ => format!(
                    "the ledger write ({}) sent again lands: {}",
                    led_name(x.led),
                    if applied { "APPLIED" } else { "refused" }
                ),
            };
            let bound = if x.kind == Kind::Renewal {
                self.c.late_renewal
            } else {
                self.c.late_copy
            };
            if x.age >= bound {
                urgent.push((label, n));
            } else {
                free.push((label, n));
            }
        }
        // Writes made without the lease, each if it finds the lease free (from either
        // process's clock): a scheduled run that found the group right records its
        // verification; the index's retirement of the group (its guard: the item it
        // would delete, or whose index row it would drop, is not modelled, so neither is
        // its other condition, a ledger without the cluster's entries).
        if s.unleased > 0 {
            for i in 0..2 {
                let nm = NAMES[i];
                let wall = self.wall(i);
                let before = p::expired_before(wall, &self.t);
                let lease = if s.item.owner.is_some() {
                    format!(
                        "the lease ends now{:+}",
                        (s.item.until as i64 - wall as i64) / 1000
                    )
                } else {
                    "no lease".to_owned()
                };
                let mut n = s.clone();
                n.unleased -= 1;
                n.free = true;
                if s.elb == s.desired {
                    let mut m = n.clone();
                    if Self::apply(&mut m, &p::verified(s.item.version, before)) {
                        free.push((
                            format!("{nm}: a verification finds the group right; records it WITHOUT the lease ({lease})"),
                            m,
                        ));
                    }
                }
                if p::retire(s.item.version, before).holds(&s.item) {
                    free.push((
                        format!("{nm}: the index's retirement finds the lease free ({lease})"),
                        n,
                    ));
                }
            }
        }
        // ELBv2 requests landing.
        for (k, r) in s.net.iter().enumerate() {
            let mut n = s.clone();
            n.net.remove(k);
            if r.ep < s.latest {
                n.bad |= OUTLIVES;
            }
            if s.free {
                n.bad |= UNLEASED;
            }
            if r.register {
                n.elb = true;
            } else {
                if let Led::Live(e) = s.led
                    && e > r.ep
                    && s.desired
                {
                    n.bad |= CLOBBER;
                }
                n.elb = false;
            }
            let b = &mut n.acts[usize::from(r.actor)];
            if r.current && b.pc == Pc::Await && b.ep == r.ep {
                b.answered = true;
            }
            let what = if r.register { "Register" } else { "Deregister" };
            let label = format!(
                "ELBv2 applies {what}(T) sent under {}",
                if r.ep < s.latest {
                    "an OLDER lease"
                } else {
                    "the newest lease"
                }
            );
            if r.by == 0 {
                urgent.push((label, n));
            } else {
                free.push((label, n));
            }
        }
        // Pod changes.
        if s.flips < self.c.flips {
            for i in 0..2 {
                if s.acts[i].pc == Pc::Idle {
                    let mut n = s.clone();
                    n.desired = !s.desired;
                    n.flips += 1;
                    n.acts[i] = Actor::wanting();
                    if s.busy > 0 {
                        let mut m = n.clone();
                        m.busy -= 1;
                        m.acts[i] = Actor {
                            pc: Pc::Queued,
                            ..Actor::idle()
                        };
                        free.push((
                            format!(
                                "pod change (T desired: {}) -> {}, QUEUED: another group's pass (its ELBv2 call in flight) takes the room",
                                n.desired, NAMES[i]
                            ),
                            m,
                        ));
                    }
                    free.push((
                        format!("pod change (T desired: {}) -> {}", n.desired, NAMES[i]),
                        n,
                    ));
                }
            }
        }
        let tick = urgent.is_empty();
        urgent.append(&mut free);
        if tick {
            urgent.push(("tick".to_owned(), self.tick(s)));
        }
        urgent
            .into_iter()
            .map(|(label, n)| (label, self.canon(n)))
            .collect()
    }

    fn tick(&self, s: &S) -> S {
        let mut n = s.clone();
        let back = |x: &mut u64| *x = x.saturating_sub(TICK);
        if n.item.owner.is_some() {
            back(&mut n.item.until);
        }
        for r in &mut n.net {
            r.by = r.by.saturating_sub(1);
        }
        for x in &mut n.late {
            back(&mut x.at);
            back(&mut x.until);
            x.age = x.age.saturating_add(1);
        }
        let d = Self::deadline_secs();
        for a in &mut n.acts {
            if a.pc.holding() {
                back(&mut a.until);
                back(&mut a.deadline);
                back(&mut a.confirmed);
                a.att = (a.att + 1).min(d);
                a.waited = a.waited.saturating_add(1);
                a.stall = a.stall.saturating_sub(1);
            }
            if a.pc == Pc::Parked {
                back(&mut a.park);
                a.left = a.left.saturating_sub(1);
            }
        }
        if let Some((_, age, _)) = &mut n.killed {
            *age = age.saturating_add(1);
        }
        n
    }

    /// Relative values clamped where smaller ones behave the same; ids renumbered by
    /// age; versions relative to the item's.
    fn canon(&self, mut s: S) -> S {
        let l = self.l();
        let m = self.t.margin_ms();
        let min_skew = self.c.skew.iter().copied().min().unwrap_or(0);
        let floor = NOW.saturating_add_signed((min_skew - 2) * 1000) - self.t.grace_ms();
        if s.item.owner.is_some() {
            s.item.until = s.item.until.max(floor);
        }
        for (i, a) in s.acts.iter_mut().enumerate() {
            if a.pc.holding() {
                let wall = self.wall(i);
                a.until = a.until.max(wall + m);
                a.deadline = a.deadline.max(NOW + m);
                a.confirmed = a.confirmed.max(wall.saturating_sub(self.t.renew_ms()));
                a.waited = a
                    .waited
                    .min(u8::try_from(secs(self.t.ready_wait)).unwrap_or(u8::MAX));
                let _ = l;
            }
        }
        for x in &mut s.late {
            if x.kind == Kind::Renewal {
                x.at = x.at.max(floor);
            }
        }
        if let Some((_, age, _)) = &mut s.killed {
            *age = (*age).min(40);
        }
        // Versions: the item's is V; others at most two behind (all older ones behave
        // the same).
        let v = s.item.version;
        let rebase = |x: u64| V - (v - x.min(v)).min(2);
        for a in &mut s.acts {
            if a.pc.holding() {
                a.version = rebase(a.version);
            }
        }
        for x in &mut s.late {
            if x.kind != Kind::Renewal {
                x.version = rebase(x.version);
            }
        }
        s.item.version = V;
        // Ids.
        let mut ids: Vec<u8> = vec![s.latest];
        ids.extend(s.item.owner);
        ids.extend(s.acts.iter().map(|a| a.ep));
        ids.extend(s.net.iter().map(|r| r.ep));
        ids.extend(s.late.iter().map(|x| x.owner));
        for x in &s.late {
            if let Some(Led::Live(e) | Led::Tomb(e)) = x.led {
                ids.push(e);
            }
        }
        if let Led::Live(e) | Led::Tomb(e) = s.led {
            ids.push(e);
        }
        if let Some((e, _, _)) = s.killed {
            ids.push(e);
        }
        ids.retain(|&e| e != 0);
        ids.sort_unstable();
        ids.dedup();
        let map = |e: u8| -> u8 {
            if e == 0 {
                0
            } else {
                ids.iter().position(|&x| x == e).map_or(0, |k| k as u8 + 1)
            }
        };
        s.latest = map(s.latest);
        s.item.owner = s.item.owner.map(map);
        if s.item.owner.is_none() {
            s.item.until = 0;
        }
        for a in &mut s.acts {
            a.ep = map(a.ep);
        }
        for r in &mut s.net {
            r.ep = map(r.ep);
        }
        s.net.sort();
        let led = |l: Led| match l {
            Led::Live(e) => Led::Live(map(e)),
            Led::Tomb(e) => Led::Tomb(map(e)),
            Led::None | Led::Old => l,
        };
        for x in &mut s.late {
            x.owner = map(x.owner);
            x.led = x.led.map(led);
        }
        s.late.sort();
        s.led = led(s.led);
        s.killed = s.killed.map(|(e, age, w)| {
            let waits = usize::from(w) < 2
                && matches!(s.acts[usize::from(w)].pc, Pc::Want | Pc::Mark | Pc::Parked);
            (map(e), age, if waits { w } else { u8::MAX })
        });
        if let Some((e, _, _)) = s.killed
            && s.item.owner != Some(e)
        {
            s.killed = None;
        }
        s
    }

    fn quiet(&self, s: &S) -> bool {
        s.acts
            .iter()
            .all(|a| matches!(a.pc, Pc::Idle | Pc::Dead { retry: false }))
            && s.net.is_empty()
            && s.late.is_empty()
            && s.flips == self.c.flips
    }

    /// The most a waiter may wait for a killed holder's group: the protocol's bound
    /// with one tick for the waiter's look, plus the clocks' difference.
    fn takeover_secs(&self) -> u64 {
        let skew = (self.c.skew[0] - self.c.skew[1]).unsigned_abs();
        secs(p::takeover_bound(
            &self.t,
            std::time::Duration::from_millis(TICK),
        )) + skew
    }
}

/// A ledger write's effect on T's entry, for traces.
fn led_name(l: Option<Led>) -> &'static str {
    match l {
        None => "T's entry untouched",
        Some(Led::None) => "T forgotten",
        Some(Led::Live(_)) => "+T",
        Some(Led::Tomb(_) | Led::Old) => "T's tombstone",
    }
}

/// The largest lease id in `s`.
fn max_id(s: &S) -> u8 {
    let mut m = s.latest.max(s.item.owner.unwrap_or(0));
    for a in &s.acts {
        m = m.max(a.ep);
    }
    for r in &s.net {
        m = m.max(r.ep);
    }
    for x in &s.late {
        m = m.max(x.owner);
        if let Some(Led::Live(e) | Led::Tomb(e)) = x.led {
            m = m.max(e);
        }
    }
    if let Led::Live(e) | Led::Tomb(e) = s.led {
        m = m.max(e);
    }
    m
}

/// A check of one state against one invariant.
type Check = fn(&Lease, &S) -> bool;

/// The invariants: each with its name and whether it holds only within the stated
/// bounds.
const INVARIANTS: [(&str, bool, Check); 6] = [
    (
        "no write lands after a newer lease was granted",
        true,
        |_, s| s.bad & OUTLIVES == 0,
    ),
    (
        "no write lands after a write made without the lease found the lease free",
        true,
        |_, s| s.bad & UNLEASED == 0,
    ),
    (
        "the ledger holds every target tgsync may have registered",
        false,
        |_, s| !(s.elb && s.led == Led::None),
    ),
    (
        "no target another holder registered is removed",
        true,
        |_, s| s.bad & CLOBBER == 0,
    ),
    ("no request is dropped", false, |m, s| {
        !m.quiet(s) || s.flips <= s.served || s.item.dirty || s.requested
    }),
    (
        "a killed holder's group is taken over within the bound",
        true,
        |m, s| {
            // A process that waits for the group since the holder was killed.
            let Some((e, age, waiter)) = s.killed else {
                return true;
            };
            !(usize::from(waiter) < 2
                && s.item.owner == Some(e)
                && u64::from(age) > m.takeover_secs())
        },
    ),
];

impl Lease {
    /// The invariants `s` breaks (within the bounds: all of them; beyond them only the
    /// ledger's).
    fn broken(&self, s: &S) -> impl Iterator<Item = &'static str> {
        INVARIANTS
            .iter()
            .filter(move |(_, within, check)| (self.c.within || !within) && !check(self, s))
            .map(|(name, _, _)| *name)
    }

    /// Whether `s` breaks no invariant, reporting only the first state that does: the
    /// breadth-first search visits the shortest path to a violation first, but
    /// stateright replaces a property's trace with every later violating state it
    /// visits until it stops (at the end of its block of states), and the states after
    /// a violation usually still violate.
    fn sound(&self, s: &S) -> bool {
        self.broken(s).next().is_none() || self.reported.swap(true, Ordering::Relaxed)
    }

    /// How the model starts, for traces.
    fn start(&self) -> String {
        let c = &self.c;
        let mut t = vec![
            if c.registered {
                "T registered, desired and in the ledger"
            } else if c.old_tomb {
                "T neither registered nor desired; its tombstone, older than the forget grace, in the ledger"
            } else {
                "T neither registered, desired nor in the ledger"
            }
            .to_owned(),
        ];
        if c.ask {
            t.push("a pass asked of A (the full diff)".to_owned());
        }
        if c.skew != [0, 0] {
            t.push(format!("clocks: A {:+} s, B {:+} s", c.skew[0], c.skew[1]));
        }
        format!("  start: {}", t.join("; "))
    }
}

impl Model for Lease {
    type State = S;
    type Action = Act;

    fn init_states(&self) -> Vec<S> {
        vec![self.canon(self.init())]
    }

    fn actions(&self, s: &S, out: &mut Vec<Act>) {
        for (label, n) in self.succ(s) {
            out.push(Act(label, Box::new(n)));
        }
    }

    fn next_state(&self, _: &S, a: Act) -> Option<S> {
        Some(*a.1)
    }

    /// One property for every invariant ([`INVARIANTS`]): the checker stops once it
    /// has a trace for every property, here at the first violation; and it looks each
    /// property up in a map at every state it visits, which in a debug build cost a
    /// fifth of the run with one property per invariant.
    fn properties(&self) -> Vec<Property<Self>> {
        vec![Property::always("the invariants", |m: &Lease, s: &S| {
            m.sound(s)
        })]
    }
}

/// The trace of a counterexample, step by step with the time of each, and the
/// invariants its last state breaks.
fn trace(m: &Lease, path: stateright::Path<S, Act>) -> String {
    let broken: Vec<&str> = m.broken(path.last_state()).collect();
    let mut out: Vec<String> = vec![format!("`{}` violated:", broken.join("`, `")), m.start()];
    let mut t = 0;
    for (_, action) in path.into_vec() {
        let Some(Act(label, _)) = action else {
            continue;
        };
        if label == "tick" {
            t += 1;
        } else {
            out.push(format!("  t={t:>2}  {label}"));
        }
    }
    if let Some(last) = out.last_mut() {
        last.push_str("   <== here");
    }
    out.join("\n")
}

/// Checks `cfg`'s every state; the shortest trace to a violation found, if any.
fn check(cfg: Cfg) -> (usize, Vec<String>) {
    let name = cfg.name;
    let started = std::time::Instant::now();
    let checker = Lease::new(cfg).checker().spawn_bfs().join();
    let states = checker.unique_state_count();
    let model = checker.model();
    let found: Vec<String> = checker
        .discoveries()
        .into_values()
        .map(|path| format!("{name}: {}", trace(model, path)))
        .collect();
    eprintln!(
        "lease model {name}: {states} states in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    (states, found)
}

/// Asserts that `cfg` breaks no invariant (the checker stops at the first violation,
/// so that is reported before the count of states).
fn assert_holds(cfg: Cfg) {
    let (states, found) = check(cfg);
    assert!(found.is_empty(), "\n{}", found.join("\n\n"));
    assert!(states > 1000, "the model explored only {states} states");
}

/// Within the bounds: two pod-events processes, abandoned attempts landing up to
/// 6 s late, a ledger write sent again by the SDK that lands up to 6 s late.
#[test]
fn lease_model_late_landings() {
    assert_holds(Cfg {
        delta: 6,
        copies: 1,
        late_copy: 6,
        ..Cfg::base("late landings")
    });
}

/// Within the bounds: the mirror case (T registered and desired at the start).
#[test]
fn lease_model_late_landings_mirror() {
    assert_holds(Cfg {
        delta: 6,
        registered: true,
        ..Cfg::base("late landings, mirror")
    });
}

/// Within the bounds: one process's clock 8 s ahead, a renewal that hangs and lands
/// after later ones (up to 15 s after it was sent), renewals failing for good.
#[test]
fn lease_model_clock_offset() {
    assert_holds(Cfg {
        skew: [0, 8],
        fails: 1,
        hangs: 1,
        late_renewal: 15,
        ..Cfg::base("clock offset 8 s")
    });
}

/// Within the bounds: a stall of up to 16 s between the fence check and the request
/// leaving.
#[test]
fn lease_model_stall() {
    assert_holds(Cfg {
        stall: 16,
        ..Cfg::base("stall 16 s")
    });
}

/// A killed holder's group is taken over within 21 s (plus one look at the lease).
#[test]
fn lease_model_kill() {
    assert_holds(Cfg {
        kills: 1,
        ..Cfg::base("kill")
    });
}

/// A holder SIGTERMed mid-pass hands its lease over and exits.
#[test]
fn lease_model_sigterm() {
    assert_holds(Cfg {
        terms: 1,
        delta: 1,
        ..Cfg::base("SIGTERM")
    });
}

/// Beyond the bounds (attempts landing up to 8 s after their abandonment) a write may
/// land after a newer lease, but the ledger still holds every target that may be
/// registered and no request is dropped.
#[test]
fn lease_model_beyond_the_bounds() {
    assert_holds(Cfg {
        delta: 8,
        within: false,
        ..Cfg::base("beyond the bounds")
    });
}

/// Within the bounds: a ledger write sent again by the SDK landing up to 6 s late,
/// after the same holder's newer writes. A's pass forgets T's old tombstone and, asked
/// by a pod change, runs again and writes T back ahead of registering it: a copy of the
/// write that forgot T lands after that.
#[test]
fn lease_model_duplicated_write() {
    assert_holds(Cfg {
        copies: 1,
        late_copy: 6,
        old_tomb: true,
        ask: true,
        ..Cfg::base("duplicated write")
    });
}

/// At SIGTERM a request queued behind another group's pass in flight is handed on
/// before the process exits, while that pass's ELBv2 call is still in flight.
#[test]
fn lease_model_sigterm_queued() {
    assert_holds(Cfg {
        terms: 1,
        busy: 1,
        delta: 1,
        flips: 1,
        ..Cfg::base("SIGTERM, a request queued")
    });
}

/// Within the bounds: a verification recorded without the lease, or the index's
/// retirement, finds the lease free only once no write of its holder may land.
#[test]
fn lease_model_writes_without_the_lease() {
    assert_holds(Cfg {
        delta: 6,
        unleased: 1,
        ..Cfg::base("writes without the lease")
    });
}
