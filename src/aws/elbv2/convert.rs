//! Conversions between ELBv2 SDK shapes and the crate's types, kept apart from the calls
//! so they can be unit tested without a network.

use std::collections::BTreeMap;
use std::net::IpAddr;

use aws_sdk_elasticloadbalancingv2::types as sdk;

use crate::core::health::NO_OVERRIDE;
use crate::core::{
    AddressFamily, AdministrativeOverride, GroupFacts, HealthState, Target, TargetHealth,
};
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
            quic: GroupFacts::is_quic_protocol(tg.protocol().map(|p| p.as_str())),
        },
        tags: BTreeMap::new(),
        arn,
    })
}

/// What the rollout check reads of a group: its description's protocol and health
/// check, and its attributes' deregistration delay and connection termination (an
/// attribute ELBv2 does not list, or one that is not a number or a boolean, is `None`).
pub(super) fn attributes(
    group: &sdk::TargetGroup,
    attributes: &[sdk::TargetGroupAttribute],
) -> crate::core::rollout::GroupAttributes {
    let value = |key: &str| {
        attributes
            .iter()
            .find(|a| a.key() == Some(key))
            .and_then(|a| a.value())
    };
    let seconds = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok());
    crate::core::rollout::GroupAttributes {
        protocol: group.protocol().map(|p| p.as_str().to_owned()),
        health_check_interval_seconds: seconds(group.health_check_interval_seconds()),
        unhealthy_threshold_count: seconds(group.unhealthy_threshold_count()),
        deregistration_delay_seconds: value("deregistration_delay.timeout_seconds")
            .and_then(|v| v.parse().ok()),
        connection_termination: value("deregistration_delay.connection_termination.enabled")
            .and_then(|v| v.parse().ok()),
    }
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

/// The SDK's description of an IP target: the IP as `Id`, the port, and the QUIC server
/// ID of a target of a QUIC group (never for any other). `zone` is `None` for an IP in
/// the group's VPC (ELBv2 then uses the IP's own zone, so cross-zone-off routing keeps
/// working), and `all` or a zone of the VPC for one outside it, which ELBv2 requires.
pub(super) fn description(target: &Target, zone: Option<&str>) -> sdk::TargetDescription {
    sdk::TargetDescription::builder()
        .id(target.ip.to_string())
        .port(i32::from(target.port))
        .set_availability_zone(zone.map(str::to_owned))
        .set_quic_server_id(target.quic_server_id.map(|id| id.to_string()))
        .build()
}

/// One DescribeTargetHealth entry: the target (with its QUIC server ID, if it has one),
/// its state, ELBv2's reason and description, and an administrative override in force.
/// `None` for targets whose `Id` is not an IP (instance or Lambda targets cannot be
/// tgsync's), that lack a port, or whose server ID is not one.
pub(super) fn health(d: &sdk::TargetHealthDescription) -> Option<TargetHealth> {
    let target = d.target()?;
    let ip: IpAddr = target.id()?.parse().ok()?;
    let port = u16::try_from(target.port()?).ok()?;
    let mut t = Target::new(ip, port);
    if let Some(id) = target.quic_server_id() {
        t = t.with_quic_server_id(id.parse().ok()?);
    }
    let health = d.target_health();
    let state = health.and_then(|h| h.state()).map_or_else(
        || HealthState::Other("unknown".into()),
        |s| HealthState::from_api(s.as_str()),
    );
    let administrative_override = d.administrative_override().and_then(|o| {
        let state = o.state()?.as_str();
        (state != NO_OVERRIDE).then(|| AdministrativeOverride {
            state: state.to_owned(),
            reason: o.reason().map(|r| r.as_str().to_owned()),
            description: o.description().map(str::to_owned),
        })
    });
    Some(TargetHealth {
        target: t,
        state,
        reason: health
            .and_then(|h| h.reason())
            .map(|r| r.as_str().to_owned()),
        description: health.and_then(|h| h.description()).map(str::to_owned),
        administrative_override,
    })
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
            Some(TargetHealth::new(
                "[fd00::1]:80".parse().unwrap(),
                HealthState::Draining
            ))
        );
        assert_eq!(health(&entry("i-0123456789abcdef0", "healthy")), None);
    }

    #[test]
    fn health_reads_reason_description_override_and_server_id() {
        let d = sdk::TargetHealthDescription::builder()
            .target(
                sdk::TargetDescription::builder()
                    .id("10.0.0.5")
                    .port(443)
                    .quic_server_id("0x0123456789abcdef")
                    .build(),
            )
            .target_health(
                sdk::TargetHealth::builder()
                    .state(sdk::TargetHealthStateEnum::Unused)
                    .reason(sdk::TargetHealthReasonEnum::NotInUse)
                    .description(
                        "Target group is not configured to receive traffic from the load balancer",
                    )
                    .build(),
            )
            .administrative_override(
                sdk::AdministrativeOverride::builder()
                    .state(sdk::TargetAdministrativeOverrideStateEnum::ZonalShiftActive)
                    .reason(sdk::TargetAdministrativeOverrideReasonEnum::ZonalShiftEngaged)
                    .description("Target is in a zone that is shifted away")
                    .build(),
            )
            .build();
        let h = health(&d).unwrap();
        assert_eq!(h.target.to_string(), "10.0.0.5:443@0x0123456789abcdef");
        assert_eq!(h.state, HealthState::Unused);
        assert_eq!(h.reason.as_deref(), Some("Target.NotInUse"));
        assert!(h.description.unwrap().starts_with("Target group is not"));
        let o = h.administrative_override.unwrap();
        assert_eq!(o.state, "zonal_shift_active");
        assert_eq!(
            o.reason.as_deref(),
            Some("AdministrativeOverride.ZonalShiftActive")
        );
        // `no_override` is no override.
        let d = sdk::TargetHealthDescription::builder()
            .target(
                sdk::TargetDescription::builder()
                    .id("10.0.0.5")
                    .port(443)
                    .build(),
            )
            .administrative_override(
                sdk::AdministrativeOverride::builder()
                    .state(sdk::TargetAdministrativeOverrideStateEnum::NoOverride)
                    .build(),
            )
            .build();
        assert_eq!(health(&d).unwrap().administrative_override, None);
    }

    #[test]
    fn descriptions_use_the_ip_as_id_and_send_a_server_id_only_when_there_is_one() {
        let d = description(&"[fd00::1]:443".parse().unwrap(), None);
        assert_eq!(d.id(), Some("fd00::1"));
        assert_eq!(d.port(), Some(443));
        assert_eq!(d.availability_zone(), None);
        assert_eq!(d.quic_server_id(), None);
        let d = description(&"192.168.5.5:443".parse().unwrap(), Some("all"));
        assert_eq!(d.availability_zone(), Some("all"));
        let d = description(
            &"192.168.5.5:443@0x00000000000000ff".parse().unwrap(),
            Some("eu-west-1b"),
        );
        assert_eq!(d.availability_zone(), Some("eu-west-1b"));
        assert_eq!(d.quic_server_id(), Some("0x00000000000000ff"));
    }

    #[test]
    fn quic_protocols_mark_the_group() {
        let mut g = tg(None);
        assert!(!group(&g).unwrap().facts.quic);
        for (p, quic) in [
            ("QUIC", true),
            ("TCP_QUIC", true),
            ("UDP", false),
            ("TCP", false),
        ] {
            g.protocol = Some(sdk::ProtocolEnum::from(p));
            assert_eq!(group(&g).unwrap().facts.quic, quic, "{p}");
        }
    }

    #[test]
    fn the_rollout_checks_attributes_from_the_description_and_the_attributes() {
        let mut g = tg(None);
        g.protocol = Some(sdk::ProtocolEnum::Tcp);
        g.health_check_interval_seconds = Some(10);
        g.unhealthy_threshold_count = Some(2);
        let attr = |k: &str, v: &str| sdk::TargetGroupAttribute::builder().key(k).value(v).build();
        let read = attributes(
            &g,
            &[
                attr("stickiness.enabled", "false"),
                attr("deregistration_delay.timeout_seconds", "300"),
                attr(
                    "deregistration_delay.connection_termination.enabled",
                    "true",
                ),
            ],
        );
        assert_eq!(
            read,
            crate::core::rollout::GroupAttributes {
                protocol: Some("TCP".into()),
                health_check_interval_seconds: Some(10),
                unhealthy_threshold_count: Some(2),
                deregistration_delay_seconds: Some(300),
                connection_termination: Some(true),
            }
        );
        assert_eq!(
            read.load_balancer(),
            Some(crate::core::rollout::LoadBalancerType::Nlb)
        );
        // An ALB group lists no connection termination; junk reads as unknown.
        g.protocol = Some(sdk::ProtocolEnum::Http);
        let read = attributes(&g, &[attr("deregistration_delay.timeout_seconds", "soon")]);
        assert_eq!(read.deregistration_delay_seconds, None);
        assert_eq!(read.connection_termination, None);
        assert_eq!(
            read.load_balancer(),
            Some(crate::core::rollout::LoadBalancerType::Alb)
        );
    }
}
