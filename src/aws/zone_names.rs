//! Availability Zone names across accounts.
//!
//! AWS maps zone *names* to physical zones independently in each account
//! (`us-east-1a` in the cluster's account may be `us-east-1c` in the networking
//! account); a zone's *ID* (`use1-az6`) is the same in every account. A pod's node names
//! its zone in the cluster's account (`topology.kubernetes.io/zone`), and an ALB group
//! with cross-zone load balancing off, in another account, wants its targets outside the
//! VPC registered in that account's name for the same zone. So the name is translated
//! through the ID, as the AWS Load Balancer Controller does for cross-account bindings:
//! name → ID with this deployment's EC2 `DescribeAvailabilityZones`, ID → name with the
//! target account's. Each account's zones are read once per container (they do not
//! change); a failed read is tried again by the next registration that needs it.

use std::collections::HashMap;
use std::sync::Arc;

use thiserror::Error;

/// The zones of one region as one account names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZoneMap {
    id_by_name: HashMap<String, String>,
    name_by_id: HashMap<String, String>,
}

impl ZoneMap {
    /// The map of `(name, id)` pairs, as `DescribeAvailabilityZones` lists them.
    pub fn new<N: Into<String>, I: Into<String>>(zones: impl IntoIterator<Item = (N, I)>) -> Self {
        let mut map = Self::default();
        for (name, id) in zones {
            let (name, id) = (name.into(), id.into());
            map.name_by_id.insert(id.clone(), name.clone());
            map.id_by_name.insert(name, id);
        }
        map
    }
}

/// Why a zone name could not be said in the group's account.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ZoneError {
    /// An account's zones could not be read.
    #[error(
        "ELBv2 wants an Availability Zone for this IP outside the group's VPC (cross-zone load balancing is off) and zone names differ between accounts: reading the zones of {account} to translate `{zone}` failed ({reason}); allow ec2:DescribeAvailabilityZones to {who}"
    )]
    Read {
        /// Whose zones: "this deployment's account" or "account N".
        account: String,
        /// The zone being translated.
        zone: String,
        /// The call's error.
        reason: String,
        /// Whose role needs the grant.
        who: &'static str,
    },
    /// The node's zone label names no zone of the region.
    #[error(
        "ELBv2 wants an Availability Zone for this IP outside the group's VPC (cross-zone load balancing is off), and the node's zone `{zone}` is no zone of this region in this deployment's account; fix the node's `topology.kubernetes.io/zone` label"
    )]
    UnknownName {
        /// The node's zone.
        zone: String,
    },
    /// The group's account has no zone with the ID (not enabled there: an opt-in zone).
    #[error(
        "ELBv2 wants an Availability Zone for this IP outside the group's VPC (cross-zone load balancing is off), and zone `{zone}` ({id}) is not a zone of account {account}; enable the zone in that account or run the pods in zones it has"
    )]
    NotInAccount {
        /// The node's zone, in this deployment's account.
        zone: String,
        /// Its zone ID.
        id: String,
        /// The group's account.
        account: String,
    },
}

/// `zone`, named in this deployment's account (`home`), as `account` (`theirs`) names it.
pub fn translate(
    home: &ZoneMap,
    theirs: &ZoneMap,
    zone: &str,
    account: &str,
) -> Result<String, ZoneError> {
    let id = home
        .id_by_name
        .get(zone)
        .ok_or_else(|| ZoneError::UnknownName {
            zone: zone.to_owned(),
        })?;
    theirs
        .name_by_id
        .get(id)
        .cloned()
        .ok_or_else(|| ZoneError::NotInAccount {
            zone: zone.to_owned(),
            id: id.clone(),
            account: account.to_owned(),
        })
}

/// One account's zones, read with its EC2 client on first use and kept. Cheap to clone;
/// clones share the read.
#[derive(Debug, Clone)]
pub struct AccountZones {
    client: aws_sdk_ec2::Client,
    zones: Arc<tokio::sync::OnceCell<Arc<ZoneMap>>>,
}

impl AccountZones {
    /// The zones `client`'s account sees in its region.
    pub fn new(client: aws_sdk_ec2::Client) -> Self {
        Self {
            client,
            zones: Arc::default(),
        }
    }

    /// The account's zones: one `DescribeAvailabilityZones` per container, kept once it
    /// answered (a failure is not kept).
    pub async fn get(&self) -> Result<Arc<ZoneMap>, String> {
        self.zones
            .get_or_try_init(|| async {
                let out = self
                    .client
                    .describe_availability_zones()
                    .send()
                    .await
                    .map_err(|e| super::error_summary(&e))?;
                let zones = out
                    .availability_zones()
                    .iter()
                    .filter_map(|z| Some((z.zone_name()?, z.zone_id()?)));
                Ok(Arc::new(ZoneMap::new(zones)))
            })
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two accounts that name the same physical zones differently (as AWS does).
    fn accounts() -> (ZoneMap, ZoneMap) {
        let home = ZoneMap::new([
            ("us-east-1a", "use1-az6"),
            ("us-east-1b", "use1-az1"),
            ("us-east-1c", "use1-az2"),
        ]);
        let theirs = ZoneMap::new([("us-east-1a", "use1-az1"), ("us-east-1b", "use1-az2")]);
        (home, theirs)
    }

    #[test]
    fn a_zone_is_named_as_the_groups_account_names_its_id() {
        let (home, theirs) = accounts();
        assert_eq!(
            translate(&home, &theirs, "us-east-1b", "222222222222").as_deref(),
            Ok("us-east-1a")
        );
        assert_eq!(
            translate(&home, &theirs, "us-east-1c", "222222222222").as_deref(),
            Ok("us-east-1b")
        );
    }

    #[test]
    fn a_zone_the_other_account_lacks_or_an_unknown_name_says_what_to_do() {
        let (home, theirs) = accounts();
        let missing = translate(&home, &theirs, "us-east-1a", "222222222222").unwrap_err();
        assert_eq!(
            missing,
            ZoneError::NotInAccount {
                zone: "us-east-1a".into(),
                id: "use1-az6".into(),
                account: "222222222222".into()
            }
        );
        assert!(missing.to_string().contains("enable the zone"), "{missing}");
        let unknown = translate(&home, &theirs, "eu-west-1a", "222222222222").unwrap_err();
        assert!(
            unknown.to_string().contains("topology.kubernetes.io/zone"),
            "{unknown}"
        );
    }
}
