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
            e.core
                .pods
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

/// The groups' states read as the engine reads them ahead (consistent BatchGetItems of
/// 100), and one DescribeTargetHealth per group, 16 groups at a time (the engine's
/// concurrency), paced by the same Describe limiter; the ledger entries and targets read.
pub async fn group_reads(e: &LiveEngine, arns: &[String]) -> (usize, usize) {
    let states = e.core.state.load_many(arns).await.expect("BatchGetItem");
    assert_eq!(states.len(), arns.len(), "every group's state read");
    let entries = states.iter().map(|(_, s)| s.ledger.len()).sum();
    let targets = futures::stream::iter(arns)
        .map(|arn| async move {
            e.core
                .groups
                .health(arn, &tgsync::groups::Priority::Reaction)
                .await
                .expect("DescribeTargetHealth")
                .len()
        })
        .buffer_unordered(16)
        .fold(0, |h, h1| async move { h + h1 })
        .await;
    (entries, targets)
}
