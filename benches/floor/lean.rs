//! The physical floor's client: the same requests as a full verification with nothing
//! but what they need. One HTTP/1.1 connection pool over rustls (aws-lc-rs), SigV4 from
//! `aws-sigv4` on each AWS request, the Kubernetes LIST decoded by tgsync's lean decoder,
//! DescribeTargetHealth read with a pull XML tokenizer, BatchGetItem read into borrowed
//! typed structs. No retries, no interceptors, no endpoint rules, no tracing.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tgsync::eks::decode_pod_list;

use crate::{PAGE_SIZE, REGION, TABLE};

/// The floor's client.
pub struct Lean {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    base: String,
    identity: Identity,
    bearer: String,
}

impl Lean {
    /// A client of the server at `base`, trusting `ca_pem`.
    pub fn new(base: &str, ca_pem: &str, credentials: Credentials, bearer: String) -> Self {
        let tls = kube_emulator::tls::client_config(ca_pem).expect("the CA trusted");
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(Arc::unwrap_or_clone(tls))
            .https_only()
            .enable_http1()
            .build();
        Self {
            client: Client::builder(TokioExecutor::new()).build(https),
            base: base.to_owned(),
            identity: credentials.into(),
            bearer: format!("Bearer {bearer}"),
        }
    }

    async fn send(&self, req: Request<Full<Bytes>>) -> Bytes {
        let response = self.client.request(req).await.expect("request sent");
        assert!(response.status().is_success(), "{}", response.status());
        response
            .into_body()
            .collect()
            .await
            .expect("body read")
            .to_bytes()
    }

    /// A POST to `service` with `body`, signed with SigV4.
    async fn aws(&self, service: &str, headers: &[(&str, &str)], body: Bytes) -> Bytes {
        let mut req = Request::post(&self.base);
        let host = self.base.trim_start_matches("https://");
        req = req.header("host", host);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut req = req.body(Full::new(body.clone())).expect("request");
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(REGION)
            .name(service)
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .expect("signing params")
            .into();
        let signable = SignableRequest::new(
            "POST",
            &self.base,
            req.headers()
                .iter()
                .map(|(k, v)| (k.as_str(), v.to_str().unwrap_or(""))),
            SignableBody::Bytes(&body),
        )
        .expect("signable");
        let (instructions, _) = sign(signable, &params).expect("signed").into_parts();
        instructions.apply_to_request_http1x(&mut req);
        self.send(req).await
    }

    /// Every pod of `namespace`, page by page; returns how many.
    pub async fn list(&self, namespace: &str) -> usize {
        let mut pods = Vec::new();
        let mut token: Option<String> = None;
        for page in 0.. {
            let mut uri = format!(
                "{}/api/v1/namespaces/{namespace}/pods?limit={PAGE_SIZE}",
                self.base
            );
            if let Some(t) = &token {
                uri.push_str("&continue=");
                uri.push_str(t);
            }
            let req = Request::get(uri)
                .header("authorization", &self.bearer)
                .header("accept", "application/json")
                .body(Full::new(Bytes::new()))
                .expect("request");
            let body = self.send(req).await;
            let decoded = decode_pod_list(page, &body).expect("LIST page");
            pods.extend(decoded.pods);
            match decoded.continue_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        pods.len()
    }

    /// DescribeTargetHealth of `arn`: the targets and their states.
    pub async fn health(&self, arn: &str) -> usize {
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("Action", "DescribeTargetHealth")
            .append_pair("Version", "2015-12-01")
            .append_pair("TargetGroupArn", arn)
            .finish();
        let headers = [("content-type", "application/x-www-form-urlencoded")];
        let xml = self
            .aws("elasticloadbalancing", &headers, Bytes::from(body))
            .await;
        let targets = parse_health(std::str::from_utf8(&xml).expect("UTF-8"));
        targets.iter().filter(|t| t.2 == "healthy").count()
    }

    /// BatchGetItem (consistent) of the state items of `arns` (at most 100): their
    /// ledger entries.
    pub async fn items(&self, arns: &[String]) -> usize {
        let keys: Vec<_> = arns
            .iter()
            .map(|arn| serde_json::json!({"pk": {"S": format!("tg#{arn}")}, "sk": {"S": "group"}}))
            .collect();
        let body = serde_json::json!({
            "RequestItems": {TABLE: {"Keys": keys, "ConsistentRead": true}},
        })
        .to_string();
        let headers = [
            ("content-type", "application/x-amz-json-1.0"),
            ("x-amz-target", "DynamoDB_20120810.BatchGetItem"),
        ];
        let json = self.aws("dynamodb", &headers, Bytes::from(body)).await;
        let out: BatchGetOut<'_> = serde_json::from_slice(&json).expect("BatchGetItem answer");
        out.responses
            .values()
            .flatten()
            .filter_map(|i| i.ledger.as_ref())
            .flat_map(|l| l.m.iter())
            .filter(|(target, e)| {
                target.parse::<SocketAddrV4>().is_ok()
                    && e.m.at.n.parse::<u64>().is_ok()
                    && !e.m.uid.s.is_empty()
                    && !e.m.c.s.is_empty()
                    && !e.m.ns.s.is_empty()
                    && !e.m.pod.s.is_empty()
            })
            .count()
    }

    /// Every namespace's LIST, 4 at a time; returns the pods seen.
    pub async fn lists(&self, namespaces: &[String]) -> usize {
        futures::stream::iter(namespaces)
            .map(|ns| self.list(ns))
            .buffer_unordered(4)
            .fold(0, |n, p| async move { n + p })
            .await
    }

    /// A BatchGetItem per 100 groups, then one DescribeTargetHealth per group, 16 at a
    /// time; returns the ledger entries and healthy targets seen.
    pub async fn groups(&self, arns: &[String]) -> (usize, usize) {
        futures::stream::iter(arns.chunks(100))
            .map(|chunk| async move {
                let entries = self.items(chunk).await;
                let healthy = futures::stream::iter(chunk)
                    .map(|arn| self.health(arn))
                    .buffer_unordered(16)
                    .fold(0, |h, h1| async move { h + h1 })
                    .await;
                (entries, healthy)
            })
            .buffer_unordered(1)
            .fold((0, 0), |(e, h), (e1, h1)| async move { (e + e1, h + h1) })
            .await
    }
}

/// `(ip, port, state)` of every target in a DescribeTargetHealth answer.
fn parse_health(xml: &str) -> Vec<(SocketAddrV4, u16, &str)> {
    use xmlparser::{ElementEnd, Token, Tokenizer};
    let mut out = Vec::new();
    let (mut id, mut port, mut state) = (None, None, "");
    let mut current = "";
    for token in Tokenizer::from(xml) {
        match token.expect("XML") {
            Token::ElementStart { local, .. } => current = local.as_str(),
            Token::Text { text } => match current {
                "Id" => id = text.as_str().parse::<std::net::Ipv4Addr>().ok(),
                "Port" => port = text.as_str().parse::<u16>().ok(),
                "State" => state = text.as_str(),
                _ => {}
            },
            Token::ElementEnd {
                end: ElementEnd::Close(_, local),
                ..
            } => {
                if local.as_str() == "member"
                    && let (Some(ip), Some(p)) = (id.take(), port.take())
                {
                    out.push((SocketAddrV4::new(ip, p), p, state));
                }
                current = "";
            }
            _ => {}
        }
    }
    out
}

#[derive(Deserialize)]
struct BatchGetOut<'a> {
    #[serde(rename = "Responses", borrow)]
    responses: HashMap<Cow<'a, str>, Vec<GroupItem<'a>>>,
}

#[derive(Deserialize)]
struct GroupItem<'a> {
    #[serde(borrow)]
    ledger: Option<M<HashMap<Cow<'a, str>, M<Entry<'a>>>>>,
}

#[derive(Deserialize)]
struct M<T> {
    #[serde(rename = "M")]
    m: T,
}

#[derive(Deserialize)]
struct S<'a> {
    #[serde(rename = "S", borrow)]
    s: Cow<'a, str>,
}

#[derive(Deserialize)]
struct N<'a> {
    #[serde(rename = "N", borrow)]
    n: Cow<'a, str>,
}

#[derive(Deserialize)]
struct Entry<'a> {
    #[serde(borrow)]
    c: S<'a>,
    #[serde(borrow)]
    ns: S<'a>,
    #[serde(borrow)]
    pod: S<'a>,
    #[serde(borrow)]
    uid: S<'a>,
    #[serde(borrow)]
    at: N<'a>,
}
