//! The Kubernetes side of I/O for an EKS cluster: the EKS bearer token, a verified
//! `kube::Client` per cluster, and the [`PodSource`](crate::pods::PodSource) built on it.
//!
//! Split like the design's "Reaching the cluster": [`token`] is pure (credentials in,
//! token out), [`access`] does the AWS lookups and caching, [`pods`] the paginated reads,
//! and [`decode`] (pure too) turns their bodies into facts without full `Pod` objects.

pub mod access;
pub mod decode;
mod nodes;
pub mod pods;
pub mod token;

#[cfg(test)]
mod test_server;

pub use access::{
    AccessError, ClusterAccess, DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT, Overrides,
};
pub use decode::{
    DecodeError, PodListPage, WatchEvent, WatchStatus, WatchedPod, decode_pod_list,
    decode_watch_event,
};
pub use pods::{DEFAULT_PAGE_SIZE, KubePods, MAX_EMPTY_PAGES, MAX_RESTARTS};
pub use token::{EksToken, TokenError, mint, sts_endpoint};
