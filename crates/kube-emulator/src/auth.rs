//! Verification of EKS bearer tokens (`k8s-aws-v1.` + base64url of a
//! SigV4-presigned STS `GetCallerIdentity` URL that signs the header
//! `x-k8s-aws-id: <cluster>`).
//!
//! The format checks are those of aws-iam-authenticator's `Verify`; where the
//! authenticator would forward the URL to STS, this module instead checks
//! what STS checks (known access key, credential scope, signature) by
//! re-signing the same request with `aws-sigv4` and comparing signatures in
//! constant time.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::clock;

/// Prefix of every EKS token.
pub const TOKEN_PREFIX: &str = "k8s-aws-v1.";
/// The header whose signed value binds a token to one cluster.
pub const CLUSTER_ID_HEADER: &str = "x-k8s-aws-id";
/// Largest token accepted (aws-iam-authenticator's `maxTokenLenBytes`).
const MAX_TOKEN_LEN: usize = 4096;
/// Presigned STS URLs are valid for 15 minutes after `X-Amz-Date`,
/// whatever `X-Amz-Expires` says.
const TOKEN_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// How far in the future `X-Amz-Date` may be (clock skew).
const MAX_FUTURE_SKEW: Duration = Duration::from_secs(5 * 60);
const STS_API_VERSION: &str = "2011-06-15";
const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// The empty body of the presigned GET: its SHA-256 is the payload hash
/// botocore and the Go SDK sign (not `UNSIGNED-PAYLOAD`).
const EMPTY_BODY: &[u8] = &[];

/// Query parameters an EKS token may carry (aws-iam-authenticator's
/// `parameterWhitelist`), lowercased.
const ALLOWED_PARAMS: &[&str] = &[
    "action",
    "version",
    "x-amz-algorithm",
    "x-amz-credential",
    "x-amz-date",
    "x-amz-expires",
    "x-amz-security-token",
    "x-amz-signature",
    "x-amz-signedheaders",
];

/// Who a valid token was signed by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The access key id from the token's credential scope.
    pub access_key_id: String,
}

/// Verifies EKS tokens for one cluster.
#[derive(Clone)]
pub(crate) struct Verifier {
    cluster_name: String,
    secrets: HashMap<String, String>,
    allowed_hosts: Vec<String>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("cluster_name", &self.cluster_name)
            .field("access_key_ids", &self.secrets.keys().collect::<Vec<_>>())
            .field("allowed_hosts", &self.allowed_hosts)
            .finish()
    }
}

fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Constant-time equality of two byte strings (length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The region STS requires in the credential scope for a given host, when
/// the host is an AWS STS endpoint.
fn region_for_host(host: &str) -> Option<String> {
    let host = host.to_ascii_lowercase();
    if host == "sts.amazonaws.com" {
        return Some("us-east-1".to_owned());
    }
    let rest = host.strip_prefix("sts.")?;
    let region = rest
        .strip_suffix(".amazonaws.com")
        .or_else(|| rest.strip_suffix(".amazonaws.com.cn"))?;
    (!region.is_empty() && !region.contains('.')).then(|| region.to_owned())
}

/// Splits a URL into (scheme, authority, path, query); `None` if it is not
/// an absolute URL or carries a fragment or user info.
fn split_url(raw: &str) -> Option<(&str, &str, &str, &str)> {
    let (scheme, rest) = raw.split_once("://")?;
    if rest.contains('#') {
        return None;
    }
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let path_start = before_query.find('/').unwrap_or(before_query.len());
    let (authority, path) = before_query.split_at(path_start);
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some((scheme, authority, path, query))
}

impl Verifier {
    /// A verifier for `cluster_name` accepting the given `(access key id,
    /// secret)` pairs and presigned URLs for `allowed_hosts`.
    pub(crate) fn new(
        cluster_name: &str,
        credentials: &[(String, String)],
        allowed_hosts: &[String],
    ) -> Self {
        Self {
            cluster_name: cluster_name.to_owned(),
            secrets: credentials.iter().cloned().collect(),
            allowed_hosts: allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        }
    }

    /// Verifies an `Authorization` header value. The error is a reason fit
    /// for logs: it never contains the token or its signature.
    pub(crate) fn verify_authorization(
        &self,
        header: Option<&str>,
        now: SystemTime,
    ) -> Result<Caller, String> {
        let header = header.ok_or("no Authorization header")?.trim();
        let mut parts = header.splitn(3, ' ');
        let scheme = parts.next().unwrap_or_default();
        let token = parts.next().unwrap_or_default();
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return Err("Authorization is not a bearer token".to_owned());
        }
        self.verify_token(token, now)
    }

    /// Verifies one EKS token at time `now`.
    pub(crate) fn verify_token(&self, token: &str, now: SystemTime) -> Result<Caller, String> {
        if token.len() > MAX_TOKEN_LEN {
            return Err("token is too large".to_owned());
        }
        let encoded = token
            .strip_prefix(TOKEN_PREFIX)
            .ok_or_else(|| format!("token is missing expected {TOKEN_PREFIX:?} prefix"))?;
        let decoded = URL_SAFE_NO_PAD
            .decode(encoded)
            .map_err(|e| format!("token is not base64url without padding: {e}"))?;
        let url = String::from_utf8(decoded).map_err(|_| "token URL is not UTF-8".to_owned())?;
        let (scheme, authority, path, query) =
            split_url(&url).ok_or_else(|| "token is not an absolute URL".to_owned())?;
        let authority = authority.to_ascii_lowercase();
        let host_only = match authority.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => authority.as_str(),
        };

        if !self.allowed_hosts.iter().any(|h| h == &authority) {
            return Err(format!(
                "unexpected hostname {authority:?} in pre-signed URL"
            ));
        }
        match scheme {
            "https" => {}
            "http" if is_loopback_host(host_only) => {}
            _ => return Err(format!("unexpected scheme {scheme:?} in pre-signed URL")),
        }
        if path != "/" {
            return Err("unexpected path in pre-signed URL".to_owned());
        }
        if query.contains(';') {
            return Err("malformed query parameter".to_owned());
        }

        let mut params: HashMap<String, String> = HashMap::new();
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let lower = key.to_ascii_lowercase();
            if !ALLOWED_PARAMS.contains(&lower.as_str()) {
                return Err(format!("non-whitelisted query parameter {key:?}"));
            }
            if params.insert(lower, value.into_owned()).is_some() {
                return Err("query parameter with multiple values not supported".to_owned());
            }
        }
        let param = |name: &str| params.get(name).map(String::as_str).unwrap_or_default();

        if param("action") != "GetCallerIdentity" {
            return Err("unexpected action parameter in pre-signed URL".to_owned());
        }
        if param("version") != STS_API_VERSION {
            return Err("unexpected version parameter in pre-signed URL".to_owned());
        }
        if param("x-amz-algorithm") != ALGORITHM {
            return Err("unexpected X-Amz-Algorithm in pre-signed URL".to_owned());
        }
        let signed_headers: Vec<String> = param("x-amz-signedheaders")
            .split(';')
            .map(str::to_ascii_lowercase)
            .collect();
        if !signed_headers.iter().any(|h| h == CLUSTER_ID_HEADER) {
            return Err(format!(
                "client did not sign the {CLUSTER_ID_HEADER} header in the pre-signed URL"
            ));
        }
        if param("x-amz-signedheaders") != "host;x-k8s-aws-id" {
            return Err(
                "pre-signed URL must sign exactly the headers host and x-k8s-aws-id".to_owned(),
            );
        }
        let expires: u64 = param("x-amz-expires")
            .parse()
            .ok()
            .filter(|e| *e <= 900)
            .ok_or_else(|| "invalid X-Amz-Expires parameter in pre-signed URL".to_owned())?;
        let date = param("x-amz-date");
        if date.is_empty() {
            return Err("X-Amz-Date parameter must be present in pre-signed URL".to_owned());
        }
        let signed_at = clock::parse_amz_date(date)
            .ok_or_else(|| format!("error parsing X-Amz-Date parameter {date:?}"))?;
        if now > signed_at + TOKEN_LIFETIME {
            return Err("X-Amz-Date parameter is expired (15 minute expiration)".to_owned());
        }
        if signed_at > now + MAX_FUTURE_SKEW {
            return Err("X-Amz-Date parameter is in the future".to_owned());
        }

        let credential = param("x-amz-credential");
        let scope: Vec<&str> = credential.split('/').collect();
        let [access_key_id, day, region, service, terminator] = scope[..] else {
            return Err("malformed X-Amz-Credential".to_owned());
        };
        if service != "sts" || terminator != "aws4_request" || region.is_empty() {
            return Err("X-Amz-Credential scope is not for sts".to_owned());
        }
        if clock::amz_day(signed_at).as_deref() != Some(day) {
            return Err("X-Amz-Credential date does not match X-Amz-Date".to_owned());
        }
        if let Some(required) = region_for_host(host_only)
            && required != region
        {
            return Err(format!(
                "credential scope region {region:?} does not match endpoint region {required:?}"
            ));
        }
        let secret = self
            .secrets
            .get(access_key_id)
            .ok_or_else(|| format!("unknown access key id {access_key_id:?}"))?;

        let signature = param("x-amz-signature");
        let session_token = params.get("x-amz-security-token").cloned();
        let expected = presign_signature(&PresignInput {
            scheme,
            authority: &authority,
            cluster_name: &self.cluster_name,
            access_key_id,
            secret_access_key: secret,
            session_token,
            region,
            time: signed_at,
            expires_in: Duration::from_secs(expires),
        })?;
        if !constant_time_eq(expected.as_bytes(), signature.as_bytes()) {
            return Err(
                "signature does not match (wrong secret, cluster name or tampered URL)".to_owned(),
            );
        }
        Ok(Caller {
            access_key_id: access_key_id.to_owned(),
        })
    }
}

struct PresignInput<'a> {
    scheme: &'a str,
    authority: &'a str,
    cluster_name: &'a str,
    access_key_id: &'a str,
    secret_access_key: &'a str,
    session_token: Option<String>,
    region: &'a str,
    time: SystemTime,
    expires_in: Duration,
}

/// Signs the STS `GetCallerIdentity` GET as a presigned URL and returns the
/// query parameters to append (including `X-Amz-Signature`).
fn presign(input: &PresignInput<'_>) -> Result<(Vec<(String, String)>, String), String> {
    let identity: Identity = Credentials::new(
        input.access_key_id,
        input.secret_access_key,
        input.session_token.clone(),
        None,
        "kube-emulator",
    )
    .into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(input.expires_in);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(input.region)
        .name("sts")
        .time(input.time)
        .settings(settings)
        .build()
        .map_err(|e| format!("cannot build signing parameters: {e}"))?
        .into();
    let uri = format!(
        "{}://{}/?Action=GetCallerIdentity&Version={STS_API_VERSION}",
        input.scheme, input.authority
    );
    let request = SignableRequest::new(
        "GET",
        uri,
        std::iter::once((CLUSTER_ID_HEADER, input.cluster_name)),
        SignableBody::Bytes(EMPTY_BODY),
    )
    .map_err(|e| format!("cannot build the request to sign: {e}"))?;
    let (instructions, signature) = sign(request, &params)
        .map_err(|e| format!("cannot sign: {e}"))?
        .into_parts();
    let query = instructions
        .params()
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.to_string()))
        .collect();
    Ok((query, signature))
}

fn presign_signature(input: &PresignInput<'_>) -> Result<String, String> {
    presign(input).map(|(_, signature)| signature)
}

/// Everything needed to mint an EKS token, for tests and tools that need a
/// valid token without the product's own minting code.
#[derive(Clone, Debug)]
pub struct TokenRequest {
    /// Cluster name signed into `x-k8s-aws-id`.
    pub cluster_name: String,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Session token of temporary credentials, if any.
    pub session_token: Option<String>,
    /// Signing region.
    pub region: String,
    /// STS endpoint (scheme and authority), e.g. `https://sts.us-east-1.amazonaws.com`.
    pub sts_endpoint: String,
    /// Signing time (`X-Amz-Date`).
    pub time: SystemTime,
    /// `X-Amz-Expires` in seconds (the AWS CLI uses 60).
    pub expires_in: u64,
}

impl TokenRequest {
    /// A request for `cluster_name` signed now with the given key, against
    /// the regional STS endpoint of `region`.
    pub fn new(
        cluster_name: &str,
        access_key_id: &str,
        secret_access_key: &str,
        region: &str,
    ) -> Self {
        Self {
            cluster_name: cluster_name.to_owned(),
            access_key_id: access_key_id.to_owned(),
            secret_access_key: secret_access_key.to_owned(),
            session_token: None,
            region: region.to_owned(),
            sts_endpoint: format!("https://sts.{region}.amazonaws.com"),
            time: SystemTime::now(),
            expires_in: 60,
        }
    }

    /// The presigned STS URL.
    pub fn presigned_url(&self) -> Result<String, String> {
        let (scheme, authority) = self
            .sts_endpoint
            .split_once("://")
            .ok_or_else(|| "sts_endpoint needs a scheme".to_owned())?;
        let authority = authority.trim_end_matches('/');
        let (query, _) = presign(&PresignInput {
            scheme,
            authority,
            cluster_name: &self.cluster_name,
            access_key_id: &self.access_key_id,
            secret_access_key: &self.secret_access_key,
            session_token: self.session_token.clone(),
            region: &self.region,
            time: self.time,
            expires_in: Duration::from_secs(self.expires_in),
        })?;
        let mut url =
            format!("{scheme}://{authority}/?Action=GetCallerIdentity&Version={STS_API_VERSION}");
        for (k, v) in query {
            url.push('&');
            url.push_str(&k);
            url.push('=');
            url.extend(url::form_urlencoded::byte_serialize(v.as_bytes()));
        }
        Ok(url)
    }

    /// The bearer token: `k8s-aws-v1.` + base64url (no padding) of the URL.
    pub fn token(&self) -> Result<String, String> {
        let url = self.presigned_url()?;
        Ok(format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(url)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AKID: &str = "AKIDEXAMPLE";
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    fn verifier(cluster: &str) -> Verifier {
        Verifier::new(
            cluster,
            &[(AKID.to_owned(), SECRET.to_owned())],
            &[
                "sts.amazonaws.com".to_owned(),
                "sts.us-east-1.amazonaws.com".to_owned(),
                "127.0.0.1:5000".to_owned(),
            ],
        )
    }

    fn request() -> TokenRequest {
        TokenRequest::new("prod", AKID, SECRET, "us-east-1")
    }

    /// Builds the URL by hand with aws-sigv4, independent of `TokenRequest`.
    fn independent_token(cluster: &str, secret: &str, time: SystemTime) -> String {
        signed_url_token(Some(cluster), secret, time)
    }

    /// A genuinely signed token; `cluster: None` signs no x-k8s-aws-id header.
    fn signed_url_token(cluster: Option<&str>, secret: &str, time: SystemTime) -> String {
        let identity: Identity = Credentials::new(AKID, secret, None, None, "test").into();
        let mut settings = SigningSettings::default();
        settings.signature_location = SignatureLocation::QueryParams;
        settings.expires_in = Some(Duration::from_secs(60));
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("sts")
            .time(time)
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let base =
            "https://sts.us-east-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15";
        let req = SignableRequest::new(
            "GET",
            base,
            cluster.map(|c| ("x-k8s-aws-id", c)).into_iter(),
            SignableBody::Bytes(&[]),
        )
        .unwrap();
        let (instructions, _) = sign(req, &params).unwrap().into_parts();
        let mut http_req = http_request(base);
        instructions.apply_to_request_http1x(&mut http_req);
        let url = http_req.uri().to_string();
        format!("k8s-aws-v1.{}", URL_SAFE_NO_PAD.encode(url))
    }

    fn http_request(uri: &str) -> hyper::Request<()> {
        hyper::Request::builder().uri(uri).body(()).unwrap()
    }

    fn decode_url(token: &str) -> String {
        String::from_utf8(
            URL_SAFE_NO_PAD
                .decode(token.strip_prefix(TOKEN_PREFIX).unwrap())
                .unwrap(),
        )
        .unwrap()
    }

    fn encode_url(url: &str) -> String {
        format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(url))
    }

    #[test]
    fn accepts_a_token_signed_with_aws_sigv4() {
        let now = SystemTime::now();
        let token = independent_token("prod", SECRET, now);
        let url = decode_url(&token);
        assert!(
            url.contains("X-Amz-SignedHeaders=host%3Bx-k8s-aws-id"),
            "{url}"
        );
        assert!(url.contains("X-Amz-Expires=60"), "{url}");
        let caller = verifier("prod").verify_token(&token, now).unwrap();
        assert_eq!(caller.access_key_id, AKID);
        assert!(
            verifier("prod")
                .verify_authorization(Some(&format!("Bearer {token}")), now)
                .is_ok()
        );
        // Still valid just before 15 minutes, not after.
        let v = verifier("prod");
        assert!(
            v.verify_token(&token, now + Duration::from_secs(14 * 60))
                .is_ok()
        );
        assert!(
            v.verify_token(&token, now + Duration::from_secs(16 * 60))
                .is_err()
        );
    }

    #[test]
    fn token_request_round_trips() {
        let token = request().token().unwrap();
        assert!(
            verifier("prod")
                .verify_token(&token, SystemTime::now())
                .is_ok()
        );
        let mut with_session = request();
        with_session.session_token = Some("FwoGZXIvYXdzE+/session==".to_owned());
        let token = with_session.token().unwrap();
        assert!(
            decode_url(&token).contains("X-Amz-Security-Token=FwoGZXIvYXdzE%2B%2Fsession%3D%3D")
        );
        assert!(
            verifier("prod")
                .verify_token(&token, SystemTime::now())
                .is_ok()
        );
        // Removing the security token breaks the signature.
        let url = decode_url(&token);
        let stripped: Vec<&str> = url
            .split('&')
            .filter(|p| !p.starts_with("X-Amz-Security-Token="))
            .collect();
        assert!(
            verifier("prod")
                .verify_token(&encode_url(&stripped.join("&")), SystemTime::now())
                .is_err()
        );
        let mut local = request();
        local.sts_endpoint = "http://127.0.0.1:5000".to_owned();
        let token = local.token().unwrap();
        assert!(
            verifier("prod")
                .verify_token(&token, SystemTime::now())
                .is_ok()
        );
    }

    #[test]
    fn rejects_bad_tokens() {
        let now = SystemTime::now();
        let v = verifier("prod");
        let reject = |token: &str, why: &str| {
            assert!(v.verify_token(token, now).is_err(), "accepted: {why}");
        };
        reject(
            &independent_token("prod", "wrong-secret", now),
            "wrong secret",
        );
        reject(&independent_token("staging", SECRET, now), "wrong cluster");
        reject(
            &independent_token("prod", SECRET, now - Duration::from_secs(16 * 60)),
            "expired date",
        );
        reject(
            &independent_token("prod", SECRET, now + Duration::from_secs(30 * 60)),
            "future date",
        );
        reject(
            &signed_url_token(None, SECRET, now),
            "x-k8s-aws-id not signed (validly signed otherwise)",
        );
        let mut elsewhere = request();
        elsewhere.sts_endpoint = "https://sts.example.com".to_owned();
        reject(
            &elsewhere.token().unwrap(),
            "unknown host (validly signed otherwise)",
        );
        reject("garbage", "garbage");
        reject("k8s-aws-v1.", "empty");
        reject("k8s-aws-v1.!!!!", "bad base64");
        reject(&format!("k8s-aws-v1.{}", "A".repeat(5000)), "too long");

        let good = decode_url(&independent_token("prod", SECRET, now));
        let tampered = [
            (
                good.replace("https://", "http://"),
                "http to a non-loopback host",
            ),
            (
                good.replace("sts.us-east-1.amazonaws.com", "sts.evil.example.com"),
                "unknown host",
            ),
            (
                good.replace("sts.us-east-1.amazonaws.com", "sts.eu-west-1.amazonaws.com"),
                "unlisted regional host",
            ),
            (good.replace("amazonaws.com/?", "amazonaws.com/x?"), "path"),
            (good.replace("GetCallerIdentity", "AssumeRole"), "action"),
            (good.replace("2011-06-15", "2012-01-01"), "version"),
            (
                good.replace("host%3Bx-k8s-aws-id", "host"),
                "x-k8s-aws-id not signed",
            ),
            (
                good.replace("host%3Bx-k8s-aws-id", "host%3Bx-k8s-aws-id%3Bx-extra"),
                "extra signed header",
            ),
            (
                good.replace("X-Amz-Expires=60", "X-Amz-Expires=901"),
                "expires too big",
            ),
            (
                good.replace("X-Amz-Expires=60", "X-Amz-Expires=abc"),
                "expires not int",
            ),
            (good.replace("X-Amz-Expires=60&", ""), "expires missing"),
            (good.replace("AKIDEXAMPLE", "AKIDUNKNOWN"), "unknown key"),
            (good.replace("%2Fsts%2F", "%2Fs3%2F"), "wrong service"),
            (format!("{good}&Foo=bar"), "extra parameter"),
            (
                format!("{good}&Action=GetCallerIdentity"),
                "duplicate parameter",
            ),
            (format!("{good}#frag"), "fragment"),
        ];
        for (url, why) in tampered {
            reject(&encode_url(&url), why);
        }
        // Flip one signature digit.
        let sig_at = good.find("X-Amz-Signature=").unwrap() + "X-Amz-Signature=".len();
        let mut flipped = good.clone();
        let c = if &good[sig_at..=sig_at] == "0" {
            "1"
        } else {
            "0"
        };
        flipped.replace_range(sig_at..=sig_at, c);
        reject(&encode_url(&flipped), "bad signature");

        assert!(v.verify_authorization(None, now).is_err());
        assert!(v.verify_authorization(Some("Basic abc"), now).is_err());
        assert!(v.verify_authorization(Some("Bearer "), now).is_err());
    }

    #[test]
    fn global_endpoint_requires_us_east_1_scope() {
        let v = verifier("prod");
        let mut req = request();
        req.sts_endpoint = "https://sts.amazonaws.com".to_owned();
        assert!(
            v.verify_token(&req.token().unwrap(), SystemTime::now())
                .is_ok()
        );
        req.region = "eu-west-1".to_owned();
        assert!(
            v.verify_token(&req.token().unwrap(), SystemTime::now())
                .is_err()
        );
    }
}
