//! An exhaustive model check of the lease and ledger protocol with `stateright`, over the
//! protocol's own transitions: every change of the group's item is one of
//! [`super`]'s [`Step`]s applied with [`Step::apply`] (as the fake applies them and the
//! DynamoDB adapter renders them), refusals are read with [`super::release_refused`] and
//! [`super::renewed`], the holder fences its ELBv2 requests with [`super::may_write`]
//! and plans its pass with [`crate::core::plan`]; what a deregistration leaves in the
//! ledger is [`crate::core::plan::tombstone`]. The model only adds the world around
//! them: time, clocks, ELBv2, the network and the processes.
//!
//! One group, one target T, two pod-events processes (each with its clock offset),
//! 1-s ticks and the real constants. Every time is kept relative to now and clamped
//! where smaller values behave the same, lease ids (owner ids: one per take) are
//! renumbered by age and the item's version kept relative, so the state space is finite
//! and the search covers runs of any length. The adversary: pod changes, ELBv2 requests
//! landing at any tick until their abandonment and up to `delta` after it, a stall
//! between the fence check and the request leaving, renewals that hang and land late
//! (after later ones), renewals that fail for good, a ledger write sent again by the SDK that
//! lands late, kills and SIGTERM hand-overs.
//!
//! Run: `cargo test -p tgsync --lib lease_model`.

// Two processes, by index.
#![allow(clippy::needless_range_loop)]

use std::collections::BTreeMap;
use std::fmt;

use stateright::{Checker, Model, Property};

use super::{Record, Refused, Step, Timings};
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
    /// Ledger writes the SDK sends again, landing late (within `late_copy`).
    copies: u8,
    late_copy: u8,
    /// Pod changes.
    flips: u8,
    /// T registered, in the ledger and desired at the start.
    registered: bool,
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
            registered: false,
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
}

/// T's ledger entry and the lease id that wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Led {
    None,
    Live(u8),
    Tomb(u8),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Req {
    register: bool,
    ep: u8,
    actor: u8,
    /// Its sender still waits for it (not abandoned).
    current: bool,
    /// Seconds within which it lands.
    by: u8,
}

/// A DynamoDB write in flight: a hung renewal or a ledger write sent again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Late {
    renewal: bool,
    owner: u8,
    /// The renewal's expiry, or the write's `now` (absolute ms).
    at: u64,
    version: u64,
    age: u8,
}

const OUTLIVES: u8 = 1;
const CLOBBER: u8 = 2;

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
}

const NAMES: [&str; 2] = ["A", "B"];

impl Lease {
    fn new(c: Cfg) -> Self {
        Self {
            c,
            t: Timings::default(),
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
            led: if reg { Led::Live(0) } else { Led::None },
            elb: reg,
            desired: reg,
            flips: 0,
            served: 0,
            requested: false,
            latest: 0,
            net: Vec::new(),
            late: Vec::new(),
            acts: [Actor::idle(), Actor::idle()],
            kills: self.c.kills,
            terms: self.c.terms,
            hangs: self.c.hangs,
            fails: self.c.fails,
            copies: self.c.copies,
            stalls: u8::from(self.c.stall > 0),
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
        let claim = |tomb| Claim {
            mine: true,
            since: now,
            tombstone: tomb,
        };
        let claims: BTreeMap<Target, Claim> = match s.led {
            Led::None => BTreeMap::new(),
            Led::Live(_) => [(t, claim(false))].into(),
            Led::Tomb(_) => [(t, claim(true))].into(),
        };
        let pl = plan(
            &desired,
            actual.iter().map(|(t, h)| (t, h)),
            &claims,
            &Rules::new(Mode::Shared, now),
        );
        if !pl.register.is_empty() {
            Op::Register
        } else if !pl.deregister.is_empty() {
            Op::Deregister
        } else if !pl.adopt.is_empty() {
            Op::Adopt
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
            Op::Register | Op::Nothing => None,
        }
    }

    /// The lease given up: `give_up`, or `just_go` when refused.
    fn give_up(&self, s: &mut S, i: usize, changes: Option<Led>, ask: bool) {
        let a = s.acts[i].clone();
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
                Pc::Want => {
                    let me = max_id(s) + 1;
                    let (before, until) = p::take_times(wall, &self.t);
                    if Self::apply(&mut n, &p::take(&me, before, until)) {
                        n.latest = me;
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
                        Op::Adopt | Op::Nothing => Pc::Release,
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
                                renewal: false,
                                owner: a.ep,
                                at: wall,
                                version: a.version,
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
                    .any(|x| x.renewal && x.owner == a.ep && x.age == 0);
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
                            renewal: true,
                            owner: a.ep,
                            at: until,
                            version: 0,
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
                let mut n = s.clone();
                n.terms -= 1;
                Self::apply(&mut n, &p::hand_over(&a.ep, wall + self.t.margin_ms()));
                n.acts[i] = Actor {
                    pc: Pc::Dead { retry: true },
                    ..Actor::idle()
                };
                free.push((format!("{nm} SIGTERM: hands the lease over; exits"), n));
            }
        }
        // DynamoDB writes landing late.
        for (k, x) in s.late.iter().enumerate() {
            let mut n = s.clone();
            n.late.remove(k);
            let label = if x.renewal {
                Self::apply(&mut n, &p::renew(&x.owner, x.at));
                "the hung renewal lands".to_owned()
            } else {
                if Self::apply(&mut n, &p::write(&x.owner, x.at, x.version)) {
                    n.led = Led::Live(x.owner);
                }
                "the ledger write sent again lands".to_owned()
            };
            let bound = if x.renewal {
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
        // ELBv2 requests landing.
        for (k, r) in s.net.iter().enumerate() {
            let mut n = s.clone();
            n.net.remove(k);
            if r.ep < s.latest {
                n.bad |= OUTLIVES;
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
            if x.renewal {
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
            if !x.renewal {
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
        for x in &mut s.late {
            x.owner = map(x.owner);
        }
        s.late.sort();
        s.led = match s.led {
            Led::Live(e) => Led::Live(map(e)),
            Led::Tomb(e) => Led::Tomb(map(e)),
            Led::None => Led::None,
        };
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
    }
    if let Led::Live(e) | Led::Tomb(e) = s.led {
        m = m.max(e);
    }
    m
}

const P_OUTLIVES: &str = "no write lands after a newer lease was granted";
const P_LEDGER: &str = "the ledger holds every target tgsync may have registered";
const P_CLOBBER: &str = "no target another holder registered is removed";
const P_DROPPED: &str = "no request is dropped";
const P_TAKEOVER: &str = "a killed holder's group is taken over within the bound";

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

    fn properties(&self) -> Vec<Property<Self>> {
        let mut v = vec![
            Property::always(P_LEDGER, |_, s: &S| !(s.elb && s.led == Led::None)),
            Property::always(P_DROPPED, |m: &Lease, s: &S| {
                !m.quiet(s) || s.flips <= s.served || s.item.dirty || s.requested
            }),
        ];
        if self.c.within {
            v.push(Property::always(P_OUTLIVES, |_, s: &S| {
                s.bad & OUTLIVES == 0
            }));
            v.push(Property::always(P_CLOBBER, |_, s: &S| s.bad & CLOBBER == 0));
            v.push(Property::always(P_TAKEOVER, |m: &Lease, s: &S| {
                // A process that waits for the group since the holder was killed.
                let Some((e, age, waiter)) = s.killed else {
                    return true;
                };
                !(usize::from(waiter) < 2
                    && s.item.owner == Some(e)
                    && u64::from(age) > m.takeover_secs())
            }));
        }
        v
    }
}

/// The trace of a counterexample, step by step with the time of each.
fn trace(path: stateright::Path<S, Act>) -> String {
    let mut out: Vec<String> = Vec::new();
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

/// Checks `cfg`'s every state; the violated properties with their shortest trace.
fn check(cfg: Cfg) -> (usize, Vec<String>) {
    let name = cfg.name;
    let started = std::time::Instant::now();
    let checker = Lease::new(cfg).checker().spawn_bfs().join();
    let states = checker.unique_state_count();
    let mut found: Vec<String> = checker
        .discoveries()
        .into_iter()
        .map(|(property, path)| format!("{name}: `{property}` violated:\n{}", trace(path)))
        .collect();
    found.sort();
    eprintln!(
        "lease model {name}: {states} states in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    (states, found)
}

fn assert_holds(cfg: Cfg) {
    let (states, found) = check(cfg);
    assert!(states > 1000, "the model explored only {states} states");
    assert!(found.is_empty(), "\n{}", found.join("\n\n"));
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
