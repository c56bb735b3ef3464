//! The Availability Zone of a node: its `topology.kubernetes.io/zone` label, read with a
//! `get` on `nodes` (the one cluster-scoped read tgsync makes, and only for targets an
//! ALB group with cross-zone load balancing off wants in a named zone).

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::pods::KubePods;
use crate::core::pod::ZONE_LABEL;
use crate::pods::PodsError;

impl KubePods {
    /// The zone label of node `name`; `Ok(None)` when the node is gone or has no label.
    /// A 401 mints a new token and tries once more.
    pub(super) async fn zone_of_node(&self, name: &str) -> Result<Option<String>, PodsError> {
        let mut retried = false;
        let result = loop {
            let client = self.access().client().await?;
            let api: Api<Node> = Api::all(client);
            match api.get_opt(name).await {
                Err(kube::Error::Api(status)) if status.code == 401 && !retried => {
                    retried = true;
                    self.access().invalidate_token().await;
                }
                other => break other,
            }
        };
        match result {
            Ok(node) => Ok(node
                .and_then(|n| n.metadata.labels)
                .and_then(|mut labels| labels.remove(ZONE_LABEL))),
            Err(error) => Err(PodsError::Node {
                name: name.to_owned(),
                reason: match &error {
                    kube::Error::Api(status) if status.code == 403 => format!(
                        "forbidden ({}); grant `get` on `nodes` to the Kubernetes group tgsync (infra/rbac.yaml, ClusterRole tgsync-nodes)",
                        status.message
                    ),
                    other => other.to_string(),
                },
            }),
        }
    }
}
