//! A local emulator of the Kubernetes API server's `core/v1` pod endpoints,
//! as an EKS cluster exposes them: EKS bearer tokens (SigV4-presigned STS
//! `GetCallerIdentity` URLs) verified by signature, LIST with label/field
//! selectors and consistent `limit`/`continue` paging, WATCH, real `Status`
//! error bodies, optimistic concurrency and preconditions, pod status
//! patches, and (optionally) graceful deletion. Nodes can be read one at a
//! time (`GET /api/v1/nodes/{name}`, seeded with [`Store::put_node`]), for
//! the zone label a registration outside the target group's VPC may need.
//!
//! No real API server can run where tgsync is tested, and tgsync will run
//! against a real one; so this emulator follows documented Kubernetes
//! behaviour rather than convenient shortcuts, and tests can also make it
//! misbehave on purpose ([`Faults`]).
//!
//! # Watch
//!
//! `GET …/pods?watch=true` streams `{"type","object"}` lines in a chunked
//! HTTP 200 body as the apiserver's watch cache does:
//!
//! - `resourceVersion` unset or `0`: ADDED for the current matching pods,
//!   then every change. `resourceVersion=N`: every change after N, replayed
//!   from the [`Store`]'s bounded history, then live; if N was compacted
//!   away ([`Store::compact`], [`Store::set_history_limit`]) the stream is
//!   one ERROR event with a 410 `Expired` Status, as a real watch fails.
//! - Selectors per event: a pod that starts matching is ADDED, one that
//!   stops matching is DELETED (with its previous state).
//! - `allowWatchBookmarks`: BOOKMARKs every
//!   [`EmulatorConfig::bookmark_interval`] and when the watch times out;
//!   `timeoutSeconds`, else [`EmulatorConfig::min_request_timeout`] to twice
//!   that, ends the stream cleanly; `sendInitialEvents` closes the initial
//!   ADDED events with a bookmark annotated [`INITIAL_EVENTS_END_ANNOTATION`].
//! - Every write, over HTTP or through the [`Store`] (including
//!   [`Store::put_pods`] and [`Store::set_terminating`]), is an event.
//! - [`Faults::cut_watch_after`] breaks a stream mid-way and
//!   [`Faults::expire_next_watch`] forces the 410 ERROR event.
//!
//! # Deletion
//!
//! By default a DELETE removes the pod at once. With
//! [`EmulatorConfig::graceful_delete`] a scheduled, running pod is first
//! marked terminating (watchers see MODIFIED) and stays until the test,
//! playing the kubelet, calls [`Store::finish_deletion`] (DELETED).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kube_emulator::Error> {
//! use kube_emulator::{Emulator, EmulatorConfig};
//! let emulator = Emulator::start(EmulatorConfig::new("my-cluster")).await?;
//! let token = emulator.token()?; // or mint one as the product does
//! println!("{} with CA {:?}", emulator.url(), emulator.ca_pem());
//! # let _ = token; Ok(()) }
//! ```

#![warn(missing_docs)]

mod auth;
mod clock;
mod faults;
mod paging;
mod patch;
mod pods;
mod selector;
mod server;
mod status;
mod store;
pub mod tls;
mod watch;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

pub use auth::{CLUSTER_ID_HEADER, Caller, TOKEN_PREFIX, TokenRequest};
pub use faults::{Faults, RequestRecord};
pub use selector::{FieldSelector, LabelSelector, Operator, Requirement, SelectorError};
pub use status::EXPIRED_CONTINUE_MESSAGE;
pub use store::{DEFAULT_HISTORY_LIMIT, Store, StoreError};
pub use watch::INITIAL_EVENTS_END_ANNOTATION;

/// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK by
/// default: far more often than the apiserver's roughly once a minute, so
/// tests see bookmarks without waiting.
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);

/// The apiserver's default `--min-request-timeout` (1800 s): a watch without
/// `timeoutSeconds` ends after a random time between this and twice this.
pub const DEFAULT_MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(1800);

/// The AWS documentation's example access key id, accepted by default so a
/// test can sign tokens without configuring credentials.
pub const EXAMPLE_ACCESS_KEY_ID: &str = "AKIAIOSFODNN7EXAMPLE";
/// The secret belonging to [`EXAMPLE_ACCESS_KEY_ID`].
pub const EXAMPLE_SECRET_ACCESS_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

/// Why the emulator could not start or a helper failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding or reading the listening socket failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Generating the CA, the server certificate or the TLS config failed.
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// The configuration cannot work (e.g. no credentials to sign with).
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// How to run an emulator: which cluster it pretends to be, which AWS
/// credentials may sign its tokens and which STS endpoints those tokens may
/// name.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    /// The cluster name tokens must sign in `x-k8s-aws-id`.
    pub cluster_name: String,
    /// Serve HTTPS with a fresh CA (true) or plain HTTP (false).
    pub tls: bool,
    /// `(access key id, secret access key)` pairs whose signatures are
    /// accepted, standing in for the IAM principals STS would know.
    pub credentials: Vec<(String, String)>,
    /// STS hosts (`host` or `host:port`) a token's URL may name. Empty means
    /// `sts.amazonaws.com` and `sts.{region}.amazonaws.com`. Plain `http` is
    /// accepted only for loopback hosts listed here (local STS emulators).
    pub allowed_sts_hosts: Vec<String>,
    /// The AWS region of the cluster (selects the regional STS host).
    pub region: String,
    /// Where to listen; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Delete pods the way a real cluster does (false keeps the old
    /// immediate removal, which most tests assume): a DELETE of a scheduled
    /// pod (`spec.nodeName` set) that has not terminated marks it
    /// terminating — `metadata.deletionTimestamp` = now + grace period and
    /// `metadata.deletionGracePeriodSeconds` — and answers 200 with it; the
    /// pod stays until the kubelet removes it ([`Store::finish_deletion`]).
    /// The grace period is `gracePeriodSeconds` of the DeleteOptions (body
    /// or query), else `spec.terminationGracePeriodSeconds`; 0 deletes at
    /// once, and a shorter one shortens an ongoing termination.
    pub graceful_delete: bool,
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK.
    pub bookmark_interval: Duration,
    /// A watch without `timeoutSeconds` ends cleanly after a random time in
    /// `[min_request_timeout, 2 × min_request_timeout)`, as the apiserver's
    /// watches do; shorten it to exercise a client's re-watch.
    pub min_request_timeout: Duration,
}

impl EmulatorConfig {
    /// HTTPS on `127.0.0.1:0`, region `us-east-1`, default STS hosts, the
    /// AWS documentation example key pair as the only credentials,
    /// immediate deletes, bookmarks every [`DEFAULT_BOOKMARK_INTERVAL`] and
    /// the apiserver's [`DEFAULT_MIN_REQUEST_TIMEOUT`].
    pub fn new(cluster_name: impl Into<String>) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            tls: true,
            credentials: vec![(
                EXAMPLE_ACCESS_KEY_ID.to_owned(),
                EXAMPLE_SECRET_ACCESS_KEY.to_owned(),
            )],
            allowed_sts_hosts: Vec::new(),
            region: "us-east-1".to_owned(),
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            graceful_delete: false,
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
            min_request_timeout: DEFAULT_MIN_REQUEST_TIMEOUT,
        }
    }

    /// The STS hosts tokens may name, with the region defaults applied.
    pub fn effective_sts_hosts(&self) -> Vec<String> {
        if self.allowed_sts_hosts.is_empty() {
            vec![
                "sts.amazonaws.com".to_owned(),
                format!("sts.{}.amazonaws.com", self.region),
            ]
        } else {
            self.allowed_sts_hosts.clone()
        }
    }
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self::new("kube-emulator")
    }
}

/// A running emulator. It serves until [`Emulator::shutdown`] or drop.
#[derive(Debug)]
pub struct Emulator {
    config: EmulatorConfig,
    url: String,
    address: SocketAddr,
    ca_pem: Option<String>,
    store: Store,
    faults: Faults,
    task: JoinHandle<()>,
}

impl Emulator {
    /// Binds `config.listen` and serves in a background tokio task (so it
    /// must be called inside a tokio runtime).
    pub async fn start(config: EmulatorConfig) -> Result<Self, Error> {
        Self::start_with_store(config, Store::new()).await
    }

    /// Like [`Emulator::start`], serving an existing (e.g. pre-seeded) store.
    pub async fn start_with_store(config: EmulatorConfig, store: Store) -> Result<Self, Error> {
        let listener = TcpListener::bind(config.listen).await?;
        let address = listener.local_addr()?;
        let tls = if config.tls {
            Some(tls::generate(&[address.ip()])?)
        } else {
            None
        };
        let host = match address.ip() {
            ip if ip.is_unspecified() || ip == IpAddr::V4(Ipv4Addr::LOCALHOST) => {
                "127.0.0.1".to_owned()
            }
            IpAddr::V6(ip) => format!("[{ip}]"),
            IpAddr::V4(ip) => ip.to_string(),
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{host}:{}", address.port());
        let faults = Faults::default();
        let state = Arc::new(server::AppState {
            store: store.clone(),
            faults: faults.clone(),
            verifier: auth::Verifier::new(
                &config.cluster_name,
                &config.credentials,
                &config.effective_sts_hosts(),
            ),
            address,
            graceful_delete: config.graceful_delete,
            watch: watch::WatchSettings {
                bookmark_interval: config.bookmark_interval.max(Duration::from_millis(1)),
                min_request_timeout: config.min_request_timeout,
            },
        });
        let acceptor = tls
            .as_ref()
            .map(|t| TlsAcceptor::from(Arc::clone(&t.config)));
        let task = tokio::spawn(server::serve(listener, acceptor, state));
        tracing::info!(%url, cluster = %config.cluster_name, "kube-emulator listening");
        Ok(Self {
            config,
            url,
            address,
            ca_pem: tls.map(|t| t.ca_pem),
            store,
            faults,
            task,
        })
    }

    /// Base URL, e.g. `https://127.0.0.1:43121`: what `eks:DescribeCluster`
    /// would return as the endpoint.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bound socket address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// PEM of the CA that signed the server certificate (SANs `127.0.0.1`,
    /// `::1`, `localhost`); `None` when serving plain HTTP.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &EmulatorConfig {
        &self.config
    }

    /// The pod store, to seed and mutate pods without HTTP.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Fault injection and the request log.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// A valid bearer token (without the `Bearer ` prefix) signed now with
    /// the first configured credentials, for tests that need access without
    /// exercising the product's own token minting.
    pub fn token(&self) -> Result<String, Error> {
        let (access_key_id, secret) = self
            .config
            .credentials
            .first()
            .ok_or_else(|| Error::Config("no credentials configured".to_owned()))?;
        let hosts = self.config.effective_sts_hosts();
        let regional = format!("sts.{}.amazonaws.com", self.config.region);
        let host = hosts
            .iter()
            .find(|h| **h == regional)
            .or_else(|| hosts.first())
            .ok_or_else(|| Error::Config("no STS hosts allowed".to_owned()))?;
        let bare = host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h);
        let loopback =
            bare == "localhost" || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        let mut request = TokenRequest::new(
            &self.config.cluster_name,
            access_key_id,
            secret,
            &self.config.region,
        );
        request.sts_endpoint = format!("{}://{host}", if loopback { "http" } else { "https" });
        request.token().map_err(Error::Config)
    }

    /// Stops serving: closes the listener and every open connection.
    pub fn shutdown(&self) {
        self.task.abort();
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}
