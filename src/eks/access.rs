//! Reaching one EKS cluster's API server: endpoint and CA (from `eks:DescribeCluster`,
//! or overridden for local runs), a freshly minted bearer token, and a `kube::Client`
//! that verifies TLS against the cluster CA and is rebuilt before the token ages out.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{ProvideCredentials as _, SharedCredentialsProvider};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kube::client::retry::RetryPolicy;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use secrecy::{ExposeSecret as _, SecretString};
use thiserror::Error;
use url::Url;

use super::token::{self, EksToken, TokenError};
use crate::pods::PodsError;

/// Default time allowed to open a TCP + TLS connection to the API server: a reachable
/// endpoint answers in milliseconds, and a Lambda must not spend its budget on one that
/// does not.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time allowed for one response (one LIST page of 500 pods takes well under a
/// second on a healthy API server).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Retries of 429/503/504 answers per Kubernetes request (kube's `Retry-After`-aware
/// policy, 100 ms to 2 s apart).
pub const KUBE_RETRIES: u32 = 3;

/// Requests queued in front of the client while it is busy (well above the reconcile
/// concurrency).
const KUBE_BUFFER: usize = 256;

/// Local-run replacements for what `eks:DescribeCluster` would return. Whatever is not
/// overridden still comes from DescribeCluster; the bearer token is minted and sent
/// either way.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// API server URL. Plain `http://` is accepted only here, never from DescribeCluster.
    pub endpoint: Option<Url>,
    /// PEM bytes of the CA that signs the API server's certificate.
    pub ca_pem: Option<Vec<u8>>,
}

/// Why the cluster could not be reached; converted to [`PodsError::Access`] for callers.
/// Messages say what to check; none contains the token or credentials.
#[derive(Debug, Error)]
pub enum AccessError {
    /// `eks:DescribeCluster` failed.
    #[error(
        "eks:DescribeCluster for cluster `{cluster}` failed: {reason}; check the cluster name \
         and region, and that the role making the call (in Lambda, the function's role) may \
         call eks:DescribeCluster"
    )]
    Describe {
        /// Cluster name.
        cluster: String,
        /// What EKS (or the SDK) said, in one line.
        reason: String,
    },
    /// DescribeCluster answered without an endpoint or CA (cluster still being created?).
    #[error(
        "eks:DescribeCluster for cluster `{cluster}` returned no {missing}; the cluster may \
         still be CREATING, or set the endpoint/CA overrides for a non-EKS cluster"
    )]
    Incomplete {
        /// Cluster name.
        cluster: String,
        /// `endpoint` or `certificate authority`.
        missing: &'static str,
    },
    /// The endpoint is not a usable URL, or is plain HTTP without being an explicit override.
    #[error("API server endpoint `{endpoint}` of cluster `{cluster}` cannot be used: {reason}")]
    Endpoint {
        /// Cluster name.
        cluster: String,
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The CA is not base64 / PEM or holds no certificate.
    #[error(
        "certificate authority of cluster `{cluster}` is unusable: {reason}; expected PEM \
         certificates (base64-encoded PEM in DescribeCluster's certificateAuthority.data)"
    )]
    Ca {
        /// Cluster name.
        cluster: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The credentials provider gave no credentials.
    #[error(
        "no AWS credentials to sign the EKS token for cluster `{cluster}`: {reason}; check the \
         function's execution role (or AWS_* variables when running locally)"
    )]
    Credentials {
        /// Cluster name.
        cluster: String,
        /// The provider's error with its causes.
        reason: String,
    },
    /// Minting the token failed.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// kube could not build a client from the configuration.
    #[error("building the Kubernetes client for cluster `{cluster}` failed: {reason}")]
    Client {
        /// Cluster name.
        cluster: String,
        /// kube's error.
        reason: String,
    },
}

/// Endpoint and CA of the cluster: what DescribeCluster says, cached per container.
#[derive(Clone, Debug)]
struct ClusterInfo {
    endpoint: Url,
    /// DER certificates of the CA.
    ca: Vec<Vec<u8>>,
}

/// The current client and the token it carries.
struct Current {
    token: EksToken,
    client: kube::Client,
}

/// Builds and caches the `kube::Client` for one EKS cluster.
///
/// Cheap to share (`Arc<ClusterAccess>`): the endpoint and CA are looked up once per
/// container, the client is reused (keeping its connection pool) until its token needs
/// refreshing, and concurrent callers wait for one rebuild instead of each minting.
pub struct ClusterAccess {
    cluster: String,
    eks: aws_sdk_eks::Client,
    credentials: SharedCredentialsProvider,
    region: String,
    sts_endpoint: Url,
    overrides: Overrides,
    connect_timeout: Duration,
    read_timeout: Duration,
    info: Mutex<Option<ClusterInfo>>,
    current: tokio::sync::Mutex<Option<Current>>,
}

impl std::fmt::Debug for ClusterAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterAccess")
            .field("cluster", &self.cluster)
            .field("region", &self.region)
            .field("sts_endpoint", &self.sts_endpoint.as_str())
            .field("endpoint_override", &self.overrides.endpoint)
            .field("ca_override", &self.overrides.ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

impl ClusterAccess {
    /// Access to `cluster` in `region`: `eks` answers DescribeCluster (not called for what
    /// `overrides` supplies), `credentials` sign the token (the SdkConfig's provider),
    /// `sts_endpoint` is the STS URL tokens name (see [`token::sts_endpoint`]).
    pub fn new(
        cluster: impl Into<String>,
        eks: aws_sdk_eks::Client,
        credentials: SharedCredentialsProvider,
        region: impl Into<String>,
        sts_endpoint: Url,
        overrides: Overrides,
    ) -> Self {
        Self {
            cluster: cluster.into(),
            eks,
            credentials,
            region: region.into(),
            sts_endpoint,
            overrides,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            info: Mutex::new(None),
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// Access built from the Lambda's `SdkConfig` (credentials, region, EKS client) and
    /// the process environment (`AWS_ENDPOINT_URL_STS` / `AWS_ENDPOINT_URL`), so `main`
    /// needs no AWS plumbing of its own.
    ///
    /// # Errors
    /// No region or credentials provider in the config, or an unusable STS endpoint in
    /// the environment.
    pub fn from_sdk_config(
        cluster: impl Into<String>,
        sdk_config: &aws_config::SdkConfig,
        overrides: Overrides,
    ) -> Result<Self, AccessError> {
        let cluster = cluster.into();
        let region = sdk_config
            .region()
            .map(|r| r.as_ref().to_owned())
            .ok_or(TokenError::NoRegion)?;
        let credentials =
            sdk_config
                .credentials_provider()
                .ok_or_else(|| AccessError::Credentials {
                    cluster: cluster.clone(),
                    reason: "the AWS config has no credentials provider".to_owned(),
                })?;
        let sts = token::sts_endpoint(&region, |key| std::env::var(key).ok())?;
        let eks = aws_sdk_eks::Client::from_conf(
            aws_sdk_eks::config::Builder::from(sdk_config)
                .retry_partition(crate::aws::retry_partition("tgsync-eks"))
                .build(),
        );
        Ok(Self::new(cluster, eks, credentials, region, sts, overrides))
    }

    /// Replaces the connect and read timeouts of the clients this builds.
    pub fn with_timeouts(mut self, connect: Duration, read: Duration) -> Self {
        self.connect_timeout = connect;
        self.read_timeout = read;
        self
    }

    /// The cluster name, for errors and reports.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// A client for the cluster whose token is fresh for at least the next few minutes.
    ///
    /// # Errors
    /// [`PodsError::Access`] when DescribeCluster, the CA, the credentials or the token
    /// fail; the reason says what to check. The callers skip the cluster's groups.
    pub async fn client(&self) -> Result<kube::Client, PodsError> {
        self.try_client().await.map_err(|e| PodsError::Access {
            cluster: self.cluster.clone(),
            reason: e.to_string(),
        })
    }

    /// Forgets the cached client and its token, so the next [`Self::client`] mints a new
    /// token: what an HTTP 401 (an expired or revoked token) calls for.
    pub async fn invalidate_token(&self) {
        *self.current.lock().await = None;
    }

    /// Forgets the cached client and DescribeCluster answer, so the next [`Self::client`]
    /// looks the endpoint and CA up again. Callers use it after a connection or TLS
    /// failure, which is what a rotated CA or moved endpoint looks like.
    pub async fn invalidate(&self) {
        let mut current = self.current.lock().await;
        *current = None;
        *self.info_lock() = None;
    }

    /// Like [`Self::client`], with the detailed error.
    ///
    /// # Errors
    /// See [`AccessError`].
    pub async fn try_client(&self) -> Result<kube::Client, AccessError> {
        self.client_at(SystemTime::now()).await
    }

    /// The client to use at `now`, rebuilt with a new token when the current one is due.
    async fn client_at(&self, now: SystemTime) -> Result<kube::Client, AccessError> {
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_ref().filter(|c| !c.token.needs_refresh(now)) {
            return Ok(c.client.clone());
        }
        let info = self.cluster_info().await?;
        let token = self.mint(now).await?;
        let client = self.build(&info, token.secret())?;
        tracing::debug!(cluster = %self.cluster, endpoint = %info.endpoint, "built Kubernetes client");
        *current = Some(Current {
            token,
            client: client.clone(),
        });
        Ok(client)
    }

    fn info_lock(&self) -> MutexGuard<'_, Option<ClusterInfo>> {
        // Only whole values are stored, so a poisoned lock still holds a consistent one.
        crate::sync::lock(&self.info)
    }

    async fn mint(&self, now: SystemTime) -> Result<EksToken, AccessError> {
        let credentials =
            self.credentials
                .provide_credentials()
                .await
                .map_err(|e| AccessError::Credentials {
                    cluster: self.cluster.clone(),
                    reason: crate::aws::error_chain(&e),
                })?;
        Ok(token::mint(
            &credentials,
            &self.region,
            &self.sts_endpoint,
            &self.cluster,
            now,
        )?)
    }

    /// Endpoint and CA: overrides first, the rest from a cached DescribeCluster.
    async fn cluster_info(&self) -> Result<ClusterInfo, AccessError> {
        let ca_override = self
            .overrides
            .ca_pem
            .as_deref()
            .map(|pem| parse_ca(&self.cluster, pem))
            .transpose()?;
        let endpoint_override = self.overrides.endpoint.as_ref().map(|url| {
            check_endpoint(&self.cluster, url, true)?;
            Ok::<_, AccessError>(url.clone())
        });
        let endpoint_override = endpoint_override.transpose()?;
        let needs_ca = endpoint_override
            .as_ref()
            .is_none_or(|url| url.scheme() == "https");
        if let Some(endpoint) = endpoint_override.clone()
            && (ca_override.is_some() || !needs_ca)
        {
            return Ok(ClusterInfo {
                endpoint,
                ca: ca_override.unwrap_or_default(),
            });
        }
        let described = self.described().await?;
        Ok(ClusterInfo {
            endpoint: endpoint_override.unwrap_or(described.endpoint),
            ca: ca_override.unwrap_or(described.ca),
        })
    }

    /// DescribeCluster's endpoint and CA, from the per-container cache when present.
    async fn described(&self) -> Result<ClusterInfo, AccessError> {
        if let Some(info) = self.info_lock().clone() {
            return Ok(info);
        }
        let cluster = self.cluster.clone();
        let output = self
            .eks
            .describe_cluster()
            .name(&cluster)
            .send()
            .await
            .map_err(|e| AccessError::Describe {
                cluster: cluster.clone(),
                reason: crate::aws::error_summary(&e),
            })?;
        let described = output.cluster();
        let endpoint = described
            .and_then(|c| c.endpoint())
            .filter(|e| !e.is_empty())
            .ok_or_else(|| AccessError::Incomplete {
                cluster: cluster.clone(),
                missing: "endpoint",
            })?;
        let ca_b64 = described
            .and_then(|c| c.certificate_authority())
            .and_then(|c| c.data())
            .filter(|d| !d.is_empty())
            .ok_or_else(|| AccessError::Incomplete {
                cluster: cluster.clone(),
                missing: "certificate authority",
            })?;
        let endpoint = Url::parse(endpoint).map_err(|e| AccessError::Endpoint {
            cluster: cluster.clone(),
            endpoint: endpoint.to_owned(),
            reason: e.to_string(),
        })?;
        check_endpoint(&cluster, &endpoint, false)?;
        let pem = STANDARD
            .decode(ca_b64.trim())
            .map_err(|e| AccessError::Ca {
                cluster: cluster.clone(),
                reason: format!("certificateAuthority.data is not base64: {e}"),
            })?;
        let info = ClusterInfo {
            endpoint,
            ca: parse_ca(&cluster, &pem)?,
        };
        *self.info_lock() = Some(info.clone());
        Ok(info)
    }

    fn build(&self, info: &ClusterInfo, token: &SecretString) -> Result<kube::Client, AccessError> {
        let client_error = |reason: String| AccessError::Client {
            cluster: self.cluster.clone(),
            reason,
        };
        let uri = info
            .endpoint
            .as_str()
            .parse()
            .map_err(|e| client_error(format!("endpoint is not a valid URI: {e}")))?;
        let mut config = kube::Config::new(uri);
        config.root_cert = (!info.ca.is_empty()).then(|| info.ca.clone());
        config.accept_invalid_certs = false;
        config.connect_timeout = Some(self.connect_timeout);
        config.read_timeout = Some(self.read_timeout);
        // Count the read timeout from when the request is written, not from when a pooled
        // connection went idle.
        config.reset_reader_on_write = true;
        config.auth_info.token = Some(SecretString::from(token.expose_secret()));
        // kube's default retry is a controller's (15 retries, up to 1000 s apart); inside
        // a Lambda that would outlive the invocation. Retry 429/503/504 a few times,
        // briefly, honouring Retry-After, then let the reconcile fail and back off.
        config.default_retry = false;
        let retry = RetryPolicy::new(
            Duration::from_millis(100),
            Duration::from_secs(2),
            KUBE_RETRIES,
            true,
        )
        .map_err(|e| client_error(format!("retry policy: {e}")))?;
        let builder = kube::client::ClientBuilder::try_from(config)
            .map_err(|e| client_error(e.to_string()))?;
        // Retry needs a cloneable service; a buffer makes kube's boxed stack one.
        Ok(builder
            .with_layer(&tower::buffer::BufferLayer::new(KUBE_BUFFER))
            .with_layer(&tower::retry::RetryLayer::new(retry))
            .build())
    }
}

/// Rejects endpoints kube cannot use, and plain HTTP unless it was explicitly configured.
fn check_endpoint(cluster: &str, url: &Url, explicit: bool) -> Result<(), AccessError> {
    let reason = match url.scheme() {
        "https" => None,
        "http" if explicit => None,
        "http" => Some("plain http is accepted only as an explicit endpoint override"),
        _ => Some("the scheme must be https"),
    }
    .or_else(|| url.host_str().is_none().then_some("it has no host"));
    match reason {
        None => Ok(()),
        Some(reason) => Err(AccessError::Endpoint {
            cluster: cluster.to_owned(),
            endpoint: url.to_string(),
            reason: reason.to_owned(),
        }),
    }
}

/// DER certificates of a PEM bundle; at least one is required, so an empty or garbled CA
/// fails here instead of as an opaque TLS error later.
fn parse_ca(cluster: &str, pem: &[u8]) -> Result<Vec<Vec<u8>>, AccessError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .map(|cert| cert.map(|c| c.as_ref().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| AccessError::Ca {
            cluster: cluster.to_owned(),
            reason: format!("invalid PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(AccessError::Ca {
            cluster: cluster.to_owned(),
            reason: "no CERTIFICATE block found".to_owned(),
        });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use aws_credential_types::credential_fn::provide_credentials_fn;
    use aws_credential_types::provider::error::CredentialsError;
    use kube_emulator::{Emulator, EmulatorConfig};

    use super::*;
    use crate::eks::test_server::{self, CLOSED, Scripted};

    async fn some_ca_pem() -> String {
        let emulator = Emulator::start(EmulatorConfig::new("test")).await.unwrap();
        emulator.ca_pem().unwrap().to_owned()
    }

    fn describe_reply(endpoint: &str, ca_pem: Option<&str>) -> (u16, String) {
        let mut cluster =
            serde_json::json!({ "name": "test", "endpoint": endpoint, "status": "ACTIVE" });
        if let Some(pem) = ca_pem {
            cluster["certificateAuthority"] = serde_json::json!({ "data": STANDARD.encode(pem) });
        }
        (200, serde_json::json!({ "cluster": cluster }).to_string())
    }

    #[tokio::test]
    async fn parses_pem_bundles_and_rejects_garbage() {
        let pem = some_ca_pem().await;
        assert_eq!(parse_ca("c", pem.as_bytes()).unwrap().len(), 1);
        let two = format!("{pem}\n{pem}");
        assert_eq!(parse_ca("c", two.as_bytes()).unwrap().len(), 2);
        let err = parse_ca("c", b"not a certificate").unwrap_err();
        assert!(err.to_string().contains("no CERTIFICATE block"), "{err}");
        let broken = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            parse_ca("c", broken.as_bytes()),
            Err(AccessError::Ca { .. })
        ));
    }

    #[test]
    fn plain_http_only_when_explicit() {
        let http = Url::parse("http://127.0.0.1:8080").unwrap();
        assert!(check_endpoint("c", &http, true).is_ok());
        let err = check_endpoint("c", &http, false).unwrap_err();
        assert!(
            err.to_string().contains("explicit endpoint override"),
            "{err}"
        );
        let ftp = Url::parse("ftp://example.com").unwrap();
        assert!(check_endpoint("c", &ftp, true).is_err());
        assert!(check_endpoint("c", &Url::parse("https://x.example").unwrap(), false).is_ok());
    }

    #[tokio::test]
    async fn overrides_skip_describe_cluster() {
        let pem = some_ca_pem().await;
        // Both overridden: DescribeCluster (aimed at a closed port) is never called.
        let access = test_server::access(
            CLOSED,
            Overrides {
                endpoint: Some(Url::parse("https://127.0.0.1:6443").unwrap()),
                ca_pem: Some(pem.into_bytes()),
            },
        );
        let info = access.cluster_info().await.unwrap();
        assert_eq!(info.endpoint.as_str(), "https://127.0.0.1:6443/");
        assert_eq!(info.ca.len(), 1);
        // Plain http needs no CA.
        let access = test_server::access(
            CLOSED,
            Overrides {
                endpoint: Some(Url::parse("http://127.0.0.1:8080").unwrap()),
                ca_pem: None,
            },
        );
        assert!(access.cluster_info().await.unwrap().ca.is_empty());
        // An https override without a CA takes the CA from DescribeCluster.
        let access = test_server::access(
            CLOSED,
            Overrides {
                endpoint: Some(Url::parse("https://127.0.0.1:6443").unwrap()),
                ca_pem: None,
            },
        );
        let err = access.cluster_info().await.unwrap_err();
        assert!(matches!(err, AccessError::Describe { .. }), "{err}");
        assert!(err.to_string().contains("eks:DescribeCluster"), "{err}");
    }

    #[tokio::test]
    async fn describe_cluster_is_cached_until_invalidated() {
        let pem = some_ca_pem().await;
        let eks = Scripted::start(vec![describe_reply("https://10.0.0.1", Some(&pem))]).await;
        let access = test_server::access(eks.url().as_str(), Overrides::default());
        let info = access.cluster_info().await.unwrap();
        assert_eq!(info.endpoint.as_str(), "https://10.0.0.1/");
        assert_eq!(info.ca.len(), 1);
        access.cluster_info().await.unwrap();
        let requests = eks.requests();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert!(
            requests[0].starts_with("GET /clusters/test "),
            "{requests:?}"
        );

        access.invalidate().await;
        // The script is exhausted: the second lookup reaches the server and fails.
        let err = access.cluster_info().await.unwrap_err();
        assert!(matches!(err, AccessError::Describe { .. }), "{err}");
        assert_eq!(eks.requests().len(), 2);
    }

    #[tokio::test]
    async fn describe_cluster_answers_are_checked() {
        let pem = some_ca_pem().await;
        let eks = Scripted::start(vec![
            describe_reply("http://10.0.0.1", Some(&pem)),
            describe_reply("https://10.0.0.1", None),
            describe_reply("", Some(&pem)),
        ])
        .await;
        let access = test_server::access(eks.url().as_str(), Overrides::default());
        let err = access.cluster_info().await.unwrap_err();
        assert!(
            err.to_string().contains("explicit endpoint override"),
            "{err}"
        );
        let err = access.cluster_info().await.unwrap_err();
        assert!(
            err.to_string().contains("no certificate authority"),
            "{err}"
        );
        let err = access.cluster_info().await.unwrap_err();
        assert!(err.to_string().contains("no endpoint"), "{err}");
    }

    #[tokio::test]
    async fn missing_credentials_are_an_access_error() {
        let access = ClusterAccess::new(
            "test",
            test_server::eks_client(CLOSED),
            SharedCredentialsProvider::new(provide_credentials_fn(|| async {
                Err(CredentialsError::not_loaded(
                    "no credentials in the environment",
                ))
            })),
            "us-east-1",
            Url::parse("https://sts.us-east-1.amazonaws.com").unwrap(),
            Overrides {
                endpoint: Some(Url::parse("http://127.0.0.1:8080").unwrap()),
                ca_pem: None,
            },
        );
        match access.client().await.err() {
            Some(PodsError::Access { cluster, reason }) => {
                assert_eq!(cluster, "test");
                assert!(reason.contains("execution role"), "{reason}");
            }
            other => panic!("expected an access error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn client_is_reused_until_the_token_is_due() {
        let access = test_server::access(
            CLOSED,
            Overrides {
                endpoint: Some(Url::parse("http://127.0.0.1:8080").unwrap()),
                ca_pem: None,
            },
        );
        let minted = |access: &ClusterAccess| {
            let current = access.current.try_lock().unwrap();
            current.as_ref().map(|c| c.token.minted_at())
        };
        let t0 = SystemTime::now();
        access.client_at(t0).await.unwrap();
        assert_eq!(minted(&access), Some(t0));
        access
            .client_at(t0 + Duration::from_secs(9 * 60))
            .await
            .unwrap();
        assert_eq!(minted(&access), Some(t0), "reused before 10 minutes");
        let t1 = t0 + Duration::from_secs(10 * 60);
        access.client_at(t1).await.unwrap();
        assert_eq!(minted(&access), Some(t1), "re-minted at 10 minutes");
        access.invalidate().await;
        assert_eq!(minted(&access), None);
    }

    #[test]
    fn debug_shows_no_secrets() {
        let access = test_server::access(CLOSED, Overrides::default());
        let shown = format!("{access:?}");
        assert!(shown.contains("test"), "{shown}");
        assert!(!shown.contains(test_server::SECRET_ACCESS_KEY), "{shown}");
    }
}
