//! What a pod's spec says of its termination, as far as tgsync can read it: the two
//! numbers per pod the rollout check (`super::rollout`) holds to the load balancer,
//! kept in [`super::PodFacts`] so the watch's stores stay compact.
//!
//! What it reads:
//!
//! - `spec.terminationGracePeriodSeconds`, Kubernetes' 30 s when absent;
//! - each app container's (`spec.containers`) `lifecycle.preStop`: the native sleep
//!   (`sleep: {seconds: N}`) or an `exec` of a sleep and nothing else: `["sleep", "N"]`,
//!   the same with a path (`["/bin/sleep", "N"]`, `["/usr/bin/sleep", "N"]`), or a shell
//!   (`sh`, `bash`, `ash`, `dash`, bare or by path) running exactly `sleep N`
//!   (`["sh", "-c", "sleep N"]`); `N` is whole seconds, optionally with an `s` suffix.
//!   Anything else (an `httpGet` or `tcpSocket` hook, a script that does more than
//!   sleep, a fraction, minutes) is [`PreStop::Unknown`]. Native sidecars and init
//!   containers are not read: Kubernetes stops sidecars after the app containers, so
//!   their hooks never keep the app serving.
//! - Several app containers: the longest readable sleep (Kubernetes runs their hooks at
//!   once and sends each container SIGTERM when its own hook ends; tgsync cannot tell
//!   which container serves the target, so it takes the one that serves longest). A
//!   container whose hook cannot be read does not hide another's sleep; the pod is
//!   [`PreStop::Unknown`] only when no container's sleep can be read.

/// Kubernetes' `terminationGracePeriodSeconds` when the pod spec has none.
pub const DEFAULT_GRACE_SECONDS: u32 = 30;

/// What a pod's `preStop` hook does, as far as tgsync can read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum PreStop {
    /// No app container has a `preStop` hook: SIGTERM comes at the deletion.
    #[default]
    None,
    /// The longest sleep of the app containers' hooks, in seconds.
    Sleep(u32),
    /// A hook tgsync cannot read (an `httpGet`, a script), and no readable sleep.
    Unknown,
}

impl PreStop {
    /// The native sleep hook (`lifecycle.preStop.sleep.seconds`); a negative number
    /// (which the API server refuses) cannot be read.
    pub fn native_sleep(seconds: i64) -> Self {
        u32::try_from(seconds).map_or(Self::Unknown, Self::Sleep)
    }

    /// An `exec` hook's `command`: a sleep tgsync can read (see the module docs), or
    /// [`PreStop::Unknown`].
    pub fn exec<S: AsRef<str>>(command: &[S]) -> Self {
        let words: Vec<&str> = command.iter().map(AsRef::as_ref).collect();
        let seconds = match words.as_slice() {
            [program, n] if is_program(program, &["sleep"]) => sleep_seconds(n),
            [shell, "-c", script] if is_program(shell, &["sh", "bash", "ash", "dash"]) => {
                match script.split_whitespace().collect::<Vec<_>>().as_slice() {
                    ["sleep", n] => sleep_seconds(n),
                    _ => None,
                }
            }
            _ => None,
        };
        seconds.map_or(Self::Unknown, Self::Sleep)
    }

    /// The hook of a pod with `self` in one app container and `other` in another: the
    /// longest readable sleep (see the module docs).
    #[must_use]
    pub fn longest(self, other: Self) -> Self {
        match (self, other) {
            (Self::Sleep(a), Self::Sleep(b)) => Self::Sleep(a.max(b)),
            (Self::Sleep(s), _) | (_, Self::Sleep(s)) => Self::Sleep(s),
            (Self::Unknown, _) | (_, Self::Unknown) => Self::Unknown,
            (Self::None, Self::None) => Self::None,
        }
    }

    /// The sleep, if one was read.
    pub fn seconds(self) -> Option<u32> {
        match self {
            Self::Sleep(s) => Some(s),
            Self::None | Self::Unknown => None,
        }
    }
}

/// Whether `word` runs one of `names`: the bare name, or an absolute path to it.
fn is_program(word: &str, names: &[&str]) -> bool {
    let name = match word.rsplit_once('/') {
        Some((dir, name)) if word.starts_with('/') && !dir.is_empty() => name,
        Some(_) => return false,
        None => word,
    };
    names.contains(&name)
}

/// Whole seconds as `sleep` takes them: digits, optionally with an `s` suffix.
fn sleep_seconds(word: &str) -> Option<u32> {
    let digits = word.strip_suffix('s').unwrap_or(word);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What a pod does between its deletion and SIGKILL, as its spec says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Termination {
    /// `terminationGracePeriodSeconds` ([`DEFAULT_GRACE_SECONDS`] when absent).
    pub grace_seconds: u32,
    /// The app containers' `preStop`.
    pub pre_stop: PreStop,
}

impl Default for Termination {
    fn default() -> Self {
        Self {
            grace_seconds: DEFAULT_GRACE_SECONDS,
            pre_stop: PreStop::None,
        }
    }
}

impl Termination {
    /// The grace period of a spec's `terminationGracePeriodSeconds` (absent: the
    /// default; negative, which the API server refuses: 0).
    pub fn grace(spec: Option<i64>) -> u32 {
        spec.map_or(DEFAULT_GRACE_SECONDS, |s| {
            u32::try_from(s.max(0)).unwrap_or(u32::MAX)
        })
    }
}
