//! Conversions between ELBv2 SDK shapes and the crate's types, kept apart from the calls
//! so they can be unit tested without a network.

use std::collections::BTreeMap;
use std::net::IpAddr;

use aws_sdk_elasticloadbalancingv2::types as sdk;

use crate::core::{AddressFamily, GroupFacts, HealthState, Target};
use crate::groups::TargetGroup;

/// A described target group as discovery reports it (tags filled in later). `None` for
/// a group without an ARN (never seen in practice) or with an `IpAddressType` this
/// version does not know, which could not be bound safely; the latter is logged.
pub(super) fn group(tg: &sdk::TargetGroup) -> Option<TargetGroup> {
    let arn = tg.target_group_arn()?.to_owned();
    let ip_type = tg.ip_address_type().map(|t| t.as_str());
    let Some(family) = AddressFamily::from_ip_address_type(ip_type) else {
        tracing::warn!(
            arn,
            ip_address_type = ip_type,
            "target group has an IpAddressType tgsync does not know; skipped"
        );
        return None;
    };
    Some(TargetGroup {
        name: tg.target_group_name().unwrap_or_default().to_owned(),
        facts: GroupFacts {
            target_type: tg
                .target_type()
                .map(|t| t.as_str().to_owned())
                .unwrap_or_default(),
            port: tg.port().and_then(|p| u16::try_from(p).ok()),
            family,
        },
        tags: BTreeMap::new(),
        arn,
    })
}

/// DescribeTags answers as a map from ARN to tags.
pub(super) fn tag_map(
    descriptions: &[sdk::TagDescription],
) -> std::collections::HashMap<String, BTreeMap<String, String>> {
    descriptions
        .iter()
        .filter_map(|d| {
            let tags = d
                .tags()
                .iter()
                .filter_map(|t| {
                    Some((
                        t.key()?.to_owned(),
                        t.value().unwrap_or_default().to_owned(),
                    ))
                })
                .collect();
            Some((d.resource_arn()?.to_owned(), tags))
        })
        .collect()
}

/// The SDK's description of an IP target: the IP as `Id`, and the port. No
/// AvailabilityZone for an IP in the group's VPC (ELBv2 then uses the IP's own zone, so
/// cross-zone-off routing keeps working); `all` for one outside it, which ELBv2 requires.
pub(super) fn description(target: &Target, outside_vpc: bool) -> sdk::TargetDescription {
    sdk::TargetDescription::builder()
        .id(target.ip.to_string())
        .port(i32::from(target.port))
        .set_availability_zone(outside_vpc.then(|| "all".to_owned()))
        .build()
}

/// One DescribeTargetHealth entry as `(target, state)`. `None` for targets whose `Id` is
/// not an IP (instance or Lambda targets cannot be tgsync's) or that lack a port.
pub(super) fn health(d: &sdk::TargetHealthDescription) -> Option<(Target, HealthState)> {
    let target = d.target()?;
    let ip: IpAddr = target.id()?.parse().ok()?;
    let port = u16::try_from(target.port()?).ok()?;
    let state = d.target_health().and_then(|h| h.state()).map_or_else(
        || HealthState::Other("unknown".into()),
        |s| HealthState::from_api(s.as_str()),
    );
    Some((Target::new(ip, port), state))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tg(ip_type: Option<&str>) -> sdk::TargetGroup {
        sdk::TargetGroup::builder()
            .target_group_arn("arn:tg")
            .target_group_name("tg")
            .port(8080)
            .target_type(sdk::TargetTypeEnum::Ip)
            .set_ip_address_type(ip_type.map(sdk::TargetGroupIpAddressTypeEnum::from))
            .build()
    }

    #[test]
    fn groups_default_to_ipv4_and_skip_unknown_families() {
        let g = group(&tg(None)).unwrap();
        assert_eq!(g.facts.family, AddressFamily::Ipv4);
        assert_eq!(g.facts.port, Some(8080));
        assert_eq!(g.facts.target_type, "ip");
        assert_eq!(
            group(&tg(Some("ipv6"))).unwrap().facts.family,
            AddressFamily::Ipv6
        );
        assert!(group(&tg(Some("dualstack-future"))).is_none());
    }

    #[test]
    fn health_skips_non_ip_targets() {
        let entry = |id: &str, state: &str| {
            sdk::TargetHealthDescription::builder()
                .target(sdk::TargetDescription::builder().id(id).port(80).build())
                .target_health(
                    sdk::TargetHealth::builder()
                        .state(sdk::TargetHealthStateEnum::from(state))
                        .build(),
                )
                .build()
        };
        assert_eq!(
            health(&entry("fd00::1", "draining")),
            Some(("[fd00::1]:80".parse().unwrap(), HealthState::Draining))
        );
        assert_eq!(health(&entry("i-0123456789abcdef0", "healthy")), None);
    }

    #[test]
    fn descriptions_use_the_ip_as_id() {
        let d = description(&"[fd00::1]:443".parse().unwrap(), false);
        assert_eq!(d.id(), Some("fd00::1"));
        assert_eq!(d.port(), Some(443));
        assert_eq!(d.availability_zone(), None);
        let d = description(&"192.168.5.5:443".parse().unwrap(), true);
        assert_eq!(d.availability_zone(), Some("all"));
    }
}
