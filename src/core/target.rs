//! Targets as the NLB sees them: an IP and a port, plus the health state it reports.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One IP target of a target group.
///
/// Ordered by `(ip, port)` so every set of targets iterates in one fixed order, which is
/// what makes plans (and therefore API calls) deterministic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    /// The pod IP (the target `Id` in ELBv2).
    pub ip: IpAddr,
    /// The port traffic is sent to.
    pub port: u16,
}

impl Target {
    /// Builds a target from its parts.
    pub fn new(ip: IpAddr, port: u16) -> Self {
        Self { ip, port }
    }

    /// The address family the target belongs to, which must match the group's.
    pub fn family(&self) -> AddressFamily {
        match self.ip {
            IpAddr::V4(_) => AddressFamily::Ipv4,
            IpAddr::V6(_) => AddressFamily::Ipv6,
        }
    }
}

/// `10.0.0.1:8080` or `[fd00::1]:8080`: the form used in reports and ledger keys.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        SocketAddr::new(self.ip, self.port).fmt(f)
    }
}

/// Parses the [`Display`](fmt::Display) form back, so ledger keys round-trip.
impl FromStr for Target {
    type Err = std::net::AddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let addr: SocketAddr = s.parse()?;
        Ok(Self::new(addr.ip(), addr.port()))
    }
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
