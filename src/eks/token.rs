//! The EKS bearer token, minted exactly as `aws eks get-token` mints it.
//!
//! The token is `k8s-aws-v1.` + base64url (no padding) of a SigV4-presigned STS
//! `GetCallerIdentity` GET URL that also signs the header `x-k8s-aws-id: <cluster>`. The
//! cluster's authenticator replays the URL against STS to learn who signed it, so the
//! URL must be byte-compatible with what botocore produces (see the golden vectors in the
//! tests). Signing is done by the `aws-sigv4` crate, never by hand.

use std::fmt;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use secrecy::SecretString;
use thiserror::Error;
use url::Url;

/// Prefix of every EKS token; the authenticator rejects tokens without it.
pub const TOKEN_PREFIX: &str = "k8s-aws-v1.";
/// Signed header that binds a token to one cluster, so a token for one cluster cannot be
/// replayed against another.
pub const CLUSTER_ID_HEADER: &str = "x-k8s-aws-id";
/// `X-Amz-Expires` of the presigned URL; the AWS CLI uses 60 s (the authenticator accepts
/// the URL for 15 minutes after `X-Amz-Date` regardless).
pub const PRESIGN_EXPIRES: Duration = Duration::from_secs(60);
/// Age at which a token is re-minted: well before the authenticator's 15-minute limit
/// (and the CLI's 14-minute `expirationTimestamp`), so a request never carries a token
/// that expires in flight.
pub const REFRESH_AFTER: Duration = Duration::from_secs(10 * 60);

const STS_ACTION_QUERY: &str = "Action=GetCallerIdentity&Version=2011-06-15";
/// How far the clock may step back before a token is treated as stale (the authenticator
/// rejects `X-Amz-Date` more than 5 minutes in the future).
const MAX_BACKWARD_SKEW: Duration = Duration::from_secs(60);

/// Why a token could not be minted. Nothing here contains a secret.
#[derive(Debug, Clone, Error)]
pub enum TokenError {
    /// The STS endpoint is not a plain `scheme://host[:port]` URL.
    #[error(
        "STS endpoint `{endpoint}` cannot be used to mint EKS tokens: {reason}; set \
         AWS_ENDPOINT_URL_STS (or AWS_ENDPOINT_URL) to an http(s) URL without path or query, \
         or unset it to use https://sts.<region>.amazonaws.com"
    )]
    BadEndpoint {
        /// The endpoint as configured.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No region to sign for.
    #[error("no AWS region to sign the EKS token for; set AWS_REGION (Lambda sets it)")]
    NoRegion,
    /// `aws-sigv4` refused the request or parameters.
    #[error(
        "signing the EKS token for cluster `{cluster}` failed: {reason}; check the AWS \
         credentials of the function role"
    )]
    Signing {
        /// Cluster the token was for.
        cluster: String,
        /// The signer's error.
        reason: String,
    },
}

/// A minted EKS bearer token. The value is kept in a [`SecretString`] and never printed:
/// anyone holding it can act as the function's role in the cluster for 15 minutes.
#[derive(Clone)]
pub struct EksToken {
    token: SecretString,
    minted_at: SystemTime,
    refresh_at: SystemTime,
}

impl fmt::Debug for EksToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EksToken")
            .field("token", &"<redacted>")
            .field("minted_at", &self.minted_at)
            .field("refresh_at", &self.refresh_at)
            .finish()
    }
}

impl EksToken {
    /// The bearer token (without `Bearer `), still wrapped so it is not logged by accident.
    pub fn secret(&self) -> &SecretString {
        &self.token
    }

    /// When the token was signed (`X-Amz-Date`).
    pub fn minted_at(&self) -> SystemTime {
        self.minted_at
    }

    /// Whether a new token must be minted before the next request: from
    /// [`REFRESH_AFTER`] after minting, once the signing credentials have expired, or when
    /// the clock has stepped back so far that the token would look future-dated.
    pub fn needs_refresh(&self, now: SystemTime) -> bool {
        match now.duration_since(self.minted_at) {
            Ok(_) => now >= self.refresh_at,
            Err(back) => back.duration() > MAX_BACKWARD_SKEW,
        }
    }
}

/// The STS endpoint tokens are presigned for, resolved like the AWS SDKs and CLI do:
/// `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL`, else `https://sts.{region}.amazonaws.com`.
/// `env` looks a variable up (pass `|k| std::env::var(k).ok()` in production), so tests
/// never touch the process environment. Empty values count as unset.
///
/// # Errors
/// [`TokenError::BadEndpoint`] for a URL the authenticator would reject (not http(s), or
/// with a path or query); [`TokenError::NoRegion`] when nothing is configured and the
/// region is empty.
pub fn sts_endpoint(region: &str, env: impl Fn(&str) -> Option<String>) -> Result<Url, TokenError> {
    let configured = ["AWS_ENDPOINT_URL_STS", "AWS_ENDPOINT_URL"]
        .into_iter()
        .find_map(|key| {
            env(key)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        });
    let raw = match configured {
        Some(raw) => raw,
        None if region.is_empty() => return Err(TokenError::NoRegion),
        None => format!("https://sts.{region}.amazonaws.com"),
    };
    let bad = |reason: &str| TokenError::BadEndpoint {
        endpoint: raw.clone(),
        reason: reason.to_owned(),
    };
    let url = Url::parse(&raw).map_err(|e| bad(&e.to_string()))?;
    check_endpoint(&url).map_err(bad)?;
    Ok(url)
}

/// The checks the authenticator applies to the token's URL that can be made up front.
fn check_endpoint(url: &Url) -> Result<(), &'static str> {
    if !matches!(url.scheme(), "https" | "http") {
        return Err("scheme must be https (or http for a local emulator)");
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("no host");
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("user info is not allowed");
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err("path, query and fragment are not allowed");
    }
    Ok(())
}

/// Mints the EKS token for `cluster` at time `now`: presigns
/// `GET {sts_endpoint}/?Action=GetCallerIdentity&Version=2011-06-15` for service `sts` in
/// `region` with `X-Amz-Expires=60`, signing `host` and `x-k8s-aws-id`, and including
/// `X-Amz-Security-Token` when the credentials have a session token. Pure: the same
/// inputs give the same token.
///
/// # Errors
/// An empty region, an unusable endpoint, or a signer failure ([`TokenError`]).
pub fn mint(
    credentials: &Credentials,
    region: &str,
    sts_endpoint: &Url,
    cluster: &str,
    now: SystemTime,
) -> Result<EksToken, TokenError> {
    if region.is_empty() {
        return Err(TokenError::NoRegion);
    }
    check_endpoint(sts_endpoint).map_err(|reason| TokenError::BadEndpoint {
        endpoint: sts_endpoint.to_string(),
        reason: reason.to_owned(),
    })?;
    let signing = |reason: String| TokenError::Signing {
        cluster: cluster.to_owned(),
        reason,
    };
    // `Url` already drops a default port and brackets IPv6 hosts, like botocore does.
    let mut url = sts_endpoint.clone();
    url.set_query(Some(STS_ACTION_QUERY));

    let identity: Identity = credentials.clone().into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(PRESIGN_EXPIRES);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("sts")
        .time(now)
        .settings(settings)
        .build()
        .map_err(|e| signing(e.to_string()))?
        .into();
    // botocore hashes the empty body of the GET (not UNSIGNED-PAYLOAD), and so does STS.
    let request = SignableRequest::new(
        "GET",
        url.as_str(),
        std::iter::once((CLUSTER_ID_HEADER, cluster)),
        SignableBody::Bytes(&[]),
    )
    .map_err(|e| signing(e.to_string()))?;
    let (instructions, _signature) = sign(request, &params)
        .map_err(|e| signing(e.to_string()))?
        .into_parts();
    {
        // botocore puts X-Amz-Signature last (after X-Amz-Security-Token); aws-sigv4 does
        // not. Order does not change the signature, but matching byte for byte keeps the
        // token identical to the CLI's.
        let mut query = url.query_pairs_mut();
        let (signature, rest): (Vec<_>, Vec<_>) = instructions
            .params()
            .iter()
            .partition(|(name, _)| *name == "X-Amz-Signature");
        for (name, value) in rest.into_iter().chain(signature) {
            query.append_pair(name, value);
        }
    }
    let token = format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(url.as_str()));
    let refresh_at = credentials.expiry().map_or(now + REFRESH_AFTER, |expiry| {
        expiry.min(now + REFRESH_AFTER)
    });
    Ok(EksToken {
        token: SecretString::from(token),
        minted_at: now,
        refresh_at,
    })
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret as _;

    use super::*;

    const AKID: &str = "AKIAIOSFODNN7EXAMPLE";
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
    const SESSION: &str = "FwoGZXIvYXdzE+/session==";

    /// `aws eks get-token` (botocore 1.43, get_token.py's TokenGenerator) for cluster
    /// `prod-cluster` in us-west-2 at 2024-05-01T12:34:56Z with the keys above.
    const BOTOCORE_URL: &str = "https://sts.us-west-2.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20240501%2Fus-west-2%2Fsts%2Faws4_request&X-Amz-Date=20240501T123456Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host%3Bx-k8s-aws-id&X-Amz-Signature=585f81a53de7ceb3ba79a458b09f54881707f0a89516e53541c3d48795c84c8a";
    /// The same with session token [`SESSION`].
    const BOTOCORE_SESSION_URL: &str = "https://sts.us-west-2.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20240501%2Fus-west-2%2Fsts%2Faws4_request&X-Amz-Date=20240501T123456Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host%3Bx-k8s-aws-id&X-Amz-Security-Token=FwoGZXIvYXdzE%2B%2Fsession%3D%3D&X-Amz-Signature=b2fa10ba95ae8db6150a0a164e5bd3dbb4e9a17d044177d480d897872102285d";
    /// `aws eks get-token` output for [`BOTOCORE_URL`].
    const BOTOCORE_TOKEN: &str = "k8s-aws-v1.aHR0cHM6Ly9zdHMudXMtd2VzdC0yLmFtYXpvbmF3cy5jb20vP0FjdGlvbj1HZXRDYWxsZXJJZGVudGl0eSZWZXJzaW9uPTIwMTEtMDYtMTUmWC1BbXotQWxnb3JpdGhtPUFXUzQtSE1BQy1TSEEyNTYmWC1BbXotQ3JlZGVudGlhbD1BS0lBSU9TRk9ETk43RVhBTVBMRSUyRjIwMjQwNTAxJTJGdXMtd2VzdC0yJTJGc3RzJTJGYXdzNF9yZXF1ZXN0JlgtQW16LURhdGU9MjAyNDA1MDFUMTIzNDU2WiZYLUFtei1FeHBpcmVzPTYwJlgtQW16LVNpZ25lZEhlYWRlcnM9aG9zdCUzQngtazhzLWF3cy1pZCZYLUFtei1TaWduYXR1cmU9NTg1ZjgxYTUzZGU3Y2ViM2JhNzlhNDU4YjA5ZjU0ODgxNzA3ZjBhODk1MTZlNTM1NDFjM2Q0ODc5NWM4NGM4YQ";

    fn at_vector_time() -> SystemTime {
        // 2024-05-01T12:34:56Z
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_714_566_896)
    }

    fn creds(session: Option<&str>) -> Credentials {
        Credentials::new(AKID, SECRET, session.map(str::to_owned), None, "test")
    }

    fn endpoint(region: &str) -> Url {
        sts_endpoint(region, |_| None).unwrap()
    }

    fn mint_for(cluster: &str, session: Option<&str>) -> EksToken {
        mint(
            &creds(session),
            "us-west-2",
            &endpoint("us-west-2"),
            cluster,
            at_vector_time(),
        )
        .unwrap()
    }

    /// The presigned URL inside a token.
    fn presigned_url(token: &EksToken) -> String {
        let encoded = token
            .secret()
            .expose_secret()
            .strip_prefix(TOKEN_PREFIX)
            .unwrap();
        String::from_utf8(URL_SAFE_NO_PAD.decode(encoded).unwrap()).unwrap()
    }

    fn query(url: &str) -> Vec<(String, String)> {
        Url::parse(url)
            .unwrap()
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    #[test]
    fn matches_aws_eks_get_token_byte_for_byte() {
        let token = mint_for("prod-cluster", None);
        assert_eq!(token.secret().expose_secret(), BOTOCORE_TOKEN);
        assert_eq!(presigned_url(&token), BOTOCORE_URL);
        let with_session = mint_for("prod-cluster", Some(SESSION));
        assert_eq!(presigned_url(&with_session), BOTOCORE_SESSION_URL);
    }

    #[test]
    fn decoded_token_has_every_query_parameter() {
        let token = mint_for("prod-cluster", Some(SESSION));
        let raw = token.secret().expose_secret();
        let encoded = raw.strip_prefix(TOKEN_PREFIX).unwrap();
        assert!(!encoded.contains('='), "no padding");
        assert!(!encoded.contains(['+', '/']), "base64url alphabet");
        let url = presigned_url(&token);
        assert!(
            url.starts_with("https://sts.us-west-2.amazonaws.com/?"),
            "{url}"
        );
        let params = query(&url);
        let names: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "Action",
                "Version",
                "X-Amz-Algorithm",
                "X-Amz-Credential",
                "X-Amz-Date",
                "X-Amz-Expires",
                "X-Amz-SignedHeaders",
                "X-Amz-Security-Token",
                "X-Amz-Signature",
            ]
        );
        let get = |name: &str| params.iter().find(|(k, _)| k == name).unwrap().1.as_str();
        assert_eq!(get("Action"), "GetCallerIdentity");
        assert_eq!(get("Version"), "2011-06-15");
        assert_eq!(get("X-Amz-Algorithm"), "AWS4-HMAC-SHA256");
        assert_eq!(
            get("X-Amz-Credential"),
            "AKIAIOSFODNN7EXAMPLE/20240501/us-west-2/sts/aws4_request"
        );
        assert_eq!(get("X-Amz-Date"), "20240501T123456Z");
        assert_eq!(get("X-Amz-Expires"), "60");
        assert_eq!(get("X-Amz-SignedHeaders"), "host;x-k8s-aws-id");
        assert_eq!(get("X-Amz-Security-Token"), SESSION);
        let signature = get("X-Amz-Signature");
        assert_eq!(signature.len(), 64);
        assert!(signature.bytes().all(|b| b.is_ascii_hexdigit()));

        let plain = query(&presigned_url(&mint_for("prod-cluster", None)));
        assert!(plain.iter().all(|(k, _)| k != "X-Amz-Security-Token"));
    }

    #[test]
    fn deterministic_and_bound_to_the_cluster() {
        let signature = |cluster: &str| {
            query(&presigned_url(&mint_for(cluster, None)))
                .into_iter()
                .find(|(k, _)| k == "X-Amz-Signature")
                .unwrap()
                .1
        };
        assert_eq!(
            mint_for("a", None).secret().expose_secret(),
            mint_for("a", None).secret().expose_secret()
        );
        assert_ne!(signature("a"), signature("b"));
        let later = mint(
            &creds(None),
            "us-west-2",
            &endpoint("us-west-2"),
            "a",
            at_vector_time() + Duration::from_secs(1),
        )
        .unwrap();
        assert_ne!(
            later.secret().expose_secret(),
            mint_for("a", None).secret().expose_secret()
        );
    }

    #[test]
    fn debug_never_prints_the_token() {
        let token = mint_for("prod-cluster", Some(SESSION));
        let shown = format!("{token:?}");
        assert!(shown.contains("redacted"), "{shown}");
        assert!(!shown.contains(TOKEN_PREFIX), "{shown}");
        assert!(!shown.contains(token.secret().expose_secret()));
    }

    #[test]
    fn refresh_after_ten_minutes_or_credential_expiry() {
        let t0 = at_vector_time();
        let token = mint_for("c", None);
        assert!(!token.needs_refresh(t0));
        assert!(!token.needs_refresh(t0 + Duration::from_secs(9 * 60 + 59)));
        assert!(token.needs_refresh(t0 + REFRESH_AFTER));
        assert!(token.needs_refresh(t0 + Duration::from_secs(14 * 60)));
        // A small backward step is tolerated, a big one is not.
        assert!(!token.needs_refresh(t0 - Duration::from_secs(1)));
        assert!(token.needs_refresh(t0 - Duration::from_secs(10 * 60)));

        let expiring = Credentials::new(
            AKID,
            SECRET,
            Some(SESSION.to_owned()),
            Some(t0 + Duration::from_secs(120)),
            "test",
        );
        let token = mint(&expiring, "us-west-2", &endpoint("us-west-2"), "c", t0).unwrap();
        assert!(!token.needs_refresh(t0 + Duration::from_secs(119)));
        assert!(token.needs_refresh(t0 + Duration::from_secs(120)));
    }

    #[test]
    fn sts_endpoint_resolution() {
        fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            move |key| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
        }
        assert_eq!(
            sts_endpoint("eu-west-1", env(&[])).unwrap().as_str(),
            "https://sts.eu-west-1.amazonaws.com/"
        );
        assert_eq!(
            sts_endpoint(
                "eu-west-1",
                env(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")])
            )
            .unwrap()
            .as_str(),
            "http://127.0.0.1:5000/"
        );
        assert_eq!(
            sts_endpoint(
                "eu-west-1",
                env(&[
                    ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
                    ("AWS_ENDPOINT_URL_STS", "http://localhost:4566/"),
                ])
            )
            .unwrap()
            .as_str(),
            "http://localhost:4566/"
        );
        assert_eq!(
            sts_endpoint("eu-west-1", env(&[("AWS_ENDPOINT_URL_STS", " ")]))
                .unwrap()
                .as_str(),
            "https://sts.eu-west-1.amazonaws.com/"
        );
        for bad in [
            "ftp://x",
            "https://sts.example.com/path",
            "http://h/?q=1",
            "not a url",
        ] {
            let err = sts_endpoint("eu-west-1", env(&[("AWS_ENDPOINT_URL_STS", bad)])).unwrap_err();
            assert!(err.to_string().contains("AWS_ENDPOINT_URL_STS"), "{err}");
        }
        assert!(matches!(
            sts_endpoint("", env(&[])),
            Err(TokenError::NoRegion)
        ));
    }

    #[test]
    fn local_endpoint_keeps_its_port_and_scheme() {
        let local = Url::parse("http://127.0.0.1:5000").unwrap();
        let token = mint(&creds(None), "us-east-1", &local, "c", at_vector_time()).unwrap();
        assert!(presigned_url(&token).starts_with(
            "http://127.0.0.1:5000/?Action=GetCallerIdentity&Version=2011-06-15&X-Amz-Algorithm="
        ));
        let https_default_port = Url::parse("https://sts.us-east-1.amazonaws.com:443").unwrap();
        let token = mint(
            &creds(None),
            "us-east-1",
            &https_default_port,
            "c",
            at_vector_time(),
        )
        .unwrap();
        assert!(presigned_url(&token).starts_with("https://sts.us-east-1.amazonaws.com/?"));
        assert!(matches!(
            mint(&creds(None), "", &local, "c", at_vector_time()),
            Err(TokenError::NoRegion)
        ));
    }
}
