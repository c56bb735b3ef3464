//! Targets as the NLB sees them: an IP and a port (and, in a QUIC group, the server ID
//! the target was registered with), plus the health state it reports.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One IP target of a target group.
///
/// Ordered by `(ip, port, server id)` so every set of targets iterates in one fixed
/// order, which is what makes plans (and therefore API calls) deterministic.
///
/// The QUIC server ID is part of the identity: ELBv2 cannot change it in place, so a pod
/// whose ID changed is another target (deregistered and registered again). Targets of
/// every other protocol have none, and never send one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    /// The pod IP (the target `Id` in ELBv2).
    pub ip: IpAddr,
    /// The port traffic is sent to.
    pub port: u16,
    /// `QuicServerId` of a target of a QUIC or TCP_QUIC group; `None` for any other.
    pub quic_server_id: Option<QuicServerId>,
}

impl Target {
    /// Builds a target from its parts (no QUIC server ID).
    pub fn new(ip: IpAddr, port: u16) -> Self {
        Self {
            ip,
            port,
            quic_server_id: None,
        }
    }

    /// This target with the QUIC server ID `id`.
    pub fn with_quic_server_id(self, id: QuicServerId) -> Self {
        Self {
            quic_server_id: Some(id),
            ..self
        }
    }

    /// The address family the target belongs to, which must match the group's.
    pub fn family(&self) -> AddressFamily {
        match self.ip {
            IpAddr::V4(_) => AddressFamily::Ipv4,
            IpAddr::V6(_) => AddressFamily::Ipv6,
        }
    }
}

/// `10.0.0.1:8080` or `[fd00::1]:8080`, and `10.0.0.1:443@0x0123456789abcdef` for a
/// QUIC target: the form used in reports and ledger keys.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        SocketAddr::new(self.ip, self.port).fmt(f)?;
        match self.quic_server_id {
            Some(id) => write!(f, "@{id}"),
            None => Ok(()),
        }
    }
}

/// Parses the [`Display`](fmt::Display) form back, so ledger keys round-trip (keys
/// written before QUIC support, `ip:port`, read as targets without a server ID).
impl FromStr for Target {
    type Err = TargetParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, id) = match s.split_once('@') {
            Some((addr, id)) => (addr, Some(id.parse::<QuicServerId>()?)),
            None => (s, None),
        };
        let addr: SocketAddr = addr.parse()?;
        Ok(Self {
            ip: addr.ip(),
            port: addr.port(),
            quic_server_id: id,
        })
    }
}

/// A string that is not a target's [`Display`](fmt::Display) form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetParseError {
    /// Not `ip:port` (or `[ipv6]:port`).
    #[error("not ip:port ({0})")]
    Address(#[from] std::net::AddrParseError),
    /// The part after `@` is not a QUIC server ID.
    #[error(transparent)]
    QuicServerId(#[from] QuicServerIdError),
}

/// The server ID a target of a QUIC or TCP_QUIC group is registered with: 8 bytes,
/// written as ELBv2 wants them (`0x` and 16 lowercase hex digits). The NLB routes a QUIC
/// packet by the server ID the target put in its connection ID, so every target behind
/// a listener needs its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuicServerId([u8; 8]);

impl QuicServerId {
    /// The ID of these 8 bytes.
    pub fn from_bytes(bytes: [u8; 8]) -> Self {
        Self(bytes)
    }

    /// The server ID of a pod without a `tgsync/quic-server-id` annotation: `0x` and
    /// the first 16 hex digits of SHA-256 of its UID (`metadata.uid`), so nothing in the
    /// cluster has to write one: the app computes the same from its UID (Downward API),
    /// e.g. `printf %s "$POD_UID" | sha256sum | cut -c1-16`.
    pub fn from_uid(uid: &str) -> Self {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(uid.as_bytes());
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[..8]);
        Self(bytes)
    }
}

/// `0x0123456789abcdef`, as RegisterTargets takes it and DescribeTargetHealth returns it.
impl fmt::Display for QuicServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:016x}", u64::from_be_bytes(self.0))
    }
}

/// Reads exactly ELBv2's form: `0x` and 16 hex digits, letters lowercase (RegisterTargets
/// refuses anything else, so anything else is the workload's mistake to report).
impl FromStr for QuicServerId {
    type Err = QuicServerIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why| QuicServerIdError {
            value: s.chars().take(40).collect(),
            why,
        };
        let digits = s
            .strip_prefix("0x")
            .ok_or_else(|| bad("it does not start with `0x`"))?;
        if digits.len() != 16 {
            return Err(bad("it needs exactly 16 hex digits after `0x`"));
        }
        if !digits
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad("only the digits 0-9 and lowercase a-f may follow `0x`"));
        }
        u64::from_str_radix(digits, 16)
            .map(|v| Self(v.to_be_bytes()))
            .map_err(|_| bad("it is not a hex number"))
    }
}

/// A value that is not a QUIC server ID, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{value}` is not a QUIC server ID ({why}; ELBv2 wants `0x` and 16 lowercase hex digits, e.g. 0x0123456789abcdef)"
)]
pub struct QuicServerIdError {
    /// The value read (at most 40 characters of it).
    pub value: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl Serialize for Target {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// IP family of a target group (`IpAddressType` in ELBv2); decides which pod IP is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AddressFamily {
    /// IPv4 targets (the ELBv2 default).
    Ipv4,
    /// IPv6 targets.
    Ipv6,
}

impl AddressFamily {
    /// Reads ELBv2's `IpAddressType`; a group without one is IPv4, as ELBv2 defaults.
    pub fn from_ip_address_type(value: Option<&str>) -> Option<Self> {
        match value {
            None | Some("ipv4") => Some(Self::Ipv4),
            Some("ipv6") => Some(Self::Ipv6),
            Some(_) => None,
        }
    }

    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::Ipv4,
            IpAddr::V6(_) => Self::Ipv6,
        }
    }

    /// ELBv2's `IpAddressType` for this family (the inverse of `from_ip_address_type`).
    pub fn ip_address_type(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
        }
    }
}

impl fmt::Display for AddressFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ipv4 => "IPv4",
            Self::Ipv6 => "IPv6",
        })
    }
}

/// A target's state as DescribeTargetHealth reports it.
///
/// Only [`HealthState::Draining`] changes the diff (a draining target is on its way out
/// and counts as absent); the rest is reported and drives readiness gates.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthState {
    /// Registered, first health checks not passed yet.
    Initial,
    /// Passing health checks.
    Healthy,
    /// Failing health checks.
    Unhealthy,
    /// Failing health checks while its unhealthy connections drain (still registered).
    UnhealthyDraining,
    /// Not used by any listener or in a disabled zone.
    Unused,
    /// Being deregistered.
    Draining,
    /// Health checks disabled.
    Unavailable,
    /// A state this version does not know, kept verbatim.
    Other(String),
}

impl HealthState {
    /// Maps ELBv2's `TargetHealthStateEnum` string.
    pub fn from_api(value: &str) -> Self {
        match value {
            "initial" => Self::Initial,
            "healthy" => Self::Healthy,
            "unhealthy" => Self::Unhealthy,
            "unhealthy.draining" => Self::UnhealthyDraining,
            "unused" => Self::Unused,
            "draining" => Self::Draining,
            "unavailable" => Self::Unavailable,
            other => Self::Other(other.to_owned()),
        }
    }

    /// ELBv2's string for the state (`unhealthy.draining`, …).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Initial => "initial",
            Self::Healthy => "healthy",
            Self::Unhealthy => "unhealthy",
            Self::UnhealthyDraining => "unhealthy.draining",
            Self::Unused => "unused",
            Self::Draining => "draining",
            Self::Unavailable => "unavailable",
            Self::Other(s) => s,
        }
    }

    /// A draining target has been deregistered already; the diff treats it as absent.
    pub fn is_draining(&self) -> bool {
        matches!(self, Self::Draining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_round_trips_for_both_families() {
        for s in ["10.0.1.7:8080", "[fd00:10::7]:443"] {
            let t: Target = s.parse().unwrap();
            assert_eq!(t.to_string(), s);
        }
    }

    #[test]
    fn quic_targets_round_trip_and_old_keys_still_read() {
        for s in [
            "10.0.1.7:443@0x0123456789abcdef",
            "[fd00::7]:443@0x00000000000000ff",
        ] {
            let t: Target = s.parse().unwrap();
            assert!(t.quic_server_id.is_some());
            assert_eq!(t.to_string(), s);
        }
        let old: Target = "10.0.1.7:443".parse().unwrap();
        assert_eq!(old.quic_server_id, None);
        assert!("10.0.1.7:443@".parse::<Target>().is_err());
        assert!("10.0.1.7:443@0xABCDEF0123456789".parse::<Target>().is_err());
        assert!("10.0.1.7@0x0123456789abcdef".parse::<Target>().is_err());
    }

    #[test]
    fn quic_server_ids_are_exactly_elbv2s_form() {
        let id: QuicServerId = "0x00000000000000ff".parse().unwrap();
        assert_eq!(id, QuicServerId::from_bytes([0, 0, 0, 0, 0, 0, 0, 0xff]));
        assert_eq!(id.to_string(), "0x00000000000000ff");
        for (bad, why) in [
            ("0123456789abcdef", "`0x`"),
            ("0x0123456789abcde", "exactly 16"),
            ("0x0123456789abcdef0", "exactly 16"),
            ("0x0123456789ABCDEF", "lowercase"),
            ("0X0123456789abcdef", "`0x`"),
            ("0x0123456789abcdeg", "lowercase a-f"),
            ("0x+123456789abcdef", "lowercase a-f"),
            (" 0x0123456789abcdef", "`0x`"),
            ("", "`0x`"),
        ] {
            let err = bad.parse::<QuicServerId>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
            assert!(err.contains("16 lowercase hex digits"), "{err}");
        }
    }

    #[test]
    fn the_server_id_is_part_of_the_identity_and_sorts_after_ip_and_port() {
        let a: Target = "10.0.0.1:443@0x0000000000000002".parse().unwrap();
        let b: Target = "10.0.0.1:443@0x0000000000000001".parse().unwrap();
        let plain: Target = "10.0.0.1:443".parse().unwrap();
        let next: Target = "10.0.0.1:444".parse().unwrap();
        assert_ne!(a, b);
        assert!(plain < b && b < a && a < next);
    }

    #[test]
    fn ordering_is_by_ip_then_port() {
        let a: Target = "10.0.0.2:80".parse().unwrap();
        let b: Target = "10.0.0.10:80".parse().unwrap();
        let c: Target = "10.0.0.10:81".parse().unwrap();
        assert!(a < b && b < c);
    }

    #[test]
    fn health_states_map_from_the_api_strings() {
        assert_eq!(HealthState::from_api("draining"), HealthState::Draining);
        assert!(HealthState::from_api("draining").is_draining());
        assert!(!HealthState::from_api("unhealthy.draining").is_draining());
        assert_eq!(
            HealthState::from_api("bogus"),
            HealthState::Other("bogus".into())
        );
        for s in [
            "initial",
            "healthy",
            "unhealthy",
            "unhealthy.draining",
            "unused",
            "draining",
            "unavailable",
            "bogus",
        ] {
            assert_eq!(HealthState::from_api(s).as_str(), s);
        }
    }

    #[test]
    fn family_defaults_to_ipv4() {
        assert_eq!(
            AddressFamily::from_ip_address_type(None),
            Some(AddressFamily::Ipv4)
        );
        assert_eq!(
            AddressFamily::from_ip_address_type(Some("ipv6")),
            Some(AddressFamily::Ipv6)
        );
        assert_eq!(AddressFamily::from_ip_address_type(Some("dualstack")), None);
    }
}
