//! The SDK floor of a zero-drift full verification: the requests the engine makes, sent
//! straight through tgsync's production adapters (the kube client, the AWS SDK clients)
//! with no engine around them — no plan, no ledger logic, no report.

use futures::StreamExt;
use tgsync::app::LiveEngine;
use tgsync::groups::TargetGroupApi as _;
use tgsync::pods::PodSource as _;
use tgsync::state::StateStore as _;

/// Every namespace's LIST, decoded by the pod adapter, 4 namespaces at a time (as the
/// engine lists); the number of pods listed.
pub async fn lists(e: &LiveEngine, namespaces: &[String]) -> usize {
    futures::stream::iter(namespaces)
        .map(|ns| async move {
            e.pods
                .list_versioned(ns, None)
                .await
                .expect("LIST")
                .pods
                .len()
        })
        .buffer_unordered(4)
        .fold(0, |n, p| async move { n + p })
        .await
}

/// One consistent GetItem and one DescribeTargetHealth per group, 16 groups at a time
/// (the engine's concurrency), paced by the same Describe limiter; the ledger entries and
/// targets read.
pub async fn group_reads(e: &LiveEngine, arns: &[String]) -> (usize, usize) {
    futures::stream::iter(arns)
        .map(|arn| async move {
            let state = e.state.peek(arn).await.expect("GetItem");
            let health = e.groups.health(arn).await.expect("DescribeTargetHealth");
            (state.ledger.len(), health.len())
        })
        .buffer_unordered(16)
        .fold((0, 0), |(l, h), (l1, h1)| async move { (l + l1, h + h1) })
        .await
}
