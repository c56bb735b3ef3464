//! The canned HTTPS server (run in a child process, so its CPU is not the client's): the
//! Kubernetes pod LIST, ELBv2's Query API and DynamoDB's JSON API on one port, answering
//! from the [`World`]. Anything else is a 400 and a line on stderr, so an unexpected
//! request shows.

use std::convert::Infallible;
use std::io::Write as _;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::Sizes;
use crate::world::World;

type Reply = Response<Full<Bytes>>;

/// Builds the world, writes the CA to `ca_file`, prints `ready <port>` and serves until
/// killed.
pub fn main(ca_file: &str) {
    let sizes = Sizes::from_env();
    let world = Arc::new(World::build(&sizes));
    let tls = kube_emulator::tls::generate(&[]).expect("server certificate");
    std::fs::write(ca_file, &tls.ca_pem).expect("write the CA file");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("server runtime");
    runtime.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        println!("ready {port}");
        std::io::stdout().flush().expect("stdout");
        let acceptor = TlsAcceptor::from(tls.config);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let acceptor = acceptor.clone();
            let world = world.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req| handle(world.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
}

async fn handle(world: Arc<World>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let reply = if parts.method == Method::GET {
        kube(&world, &parts.uri)
    } else if let Some(target) = parts.headers.get("x-amz-target") {
        dynamo(&world, target.to_str().unwrap_or(""), &body)
    } else {
        elbv2(&world, &body)
    };
    Ok(reply.unwrap_or_else(|| {
        eprintln!(
            "unexpected request: {} {} {}",
            parts.method,
            parts.uri,
            String::from_utf8_lossy(&body)
        );
        respond(400, "text/plain", Bytes::from_static(b"unexpected request"))
    }))
}

fn respond(status: u16, content_type: &'static str, body: Bytes) -> Reply {
    let mut reply = Response::new(Full::new(body));
    *reply.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
    reply.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    reply.headers_mut().insert(
        "x-amzn-requestid",
        hyper::header::HeaderValue::from_static("f1007000-0000-4000-8000-000000000000"),
    );
    reply
}

/// `GET /api/v1/namespaces/<ns>/pods?limit=..&continue=p<n>`.
fn kube(world: &World, uri: &hyper::Uri) -> Option<Reply> {
    let ns = uri
        .path()
        .strip_prefix("/api/v1/namespaces/")?
        .strip_suffix("/pods")?;
    let page: usize = url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "continue")
        .map_or(Some(0), |(_, v)| v.strip_prefix('p')?.parse().ok())?;
    let body = world.pages.get(ns)?.get(page)?.clone();
    Some(respond(200, "application/json", body))
}

/// ELBv2's Query API: DescribeTargetGroups, DescribeTags, DescribeTargetHealth.
fn elbv2(world: &World, body: &[u8]) -> Option<Reply> {
    let form: Vec<(String, String)> = url::form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let get = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let xml = match get("Action")? {
        "DescribeTargetGroups" => {
            let from = get("Marker").and_then(|m| m.parse().ok()).unwrap_or(0);
            let size = get("PageSize").and_then(|m| m.parse().ok()).unwrap_or(400);
            world.groups_page(from, size)
        }
        "DescribeTags" => {
            let groups: Vec<usize> = form
                .iter()
                .filter(|(k, _)| k.starts_with("ResourceArns.member."))
                .filter_map(|(_, arn)| world.arns.get(arn).copied())
                .collect();
            world.tags(&groups)
        }
        "DescribeTargetHealth" => world
            .health
            .get(*world.arns.get(get("TargetGroupArn")?)?)?
            .clone(),
        _ => return None,
    };
    Some(respond(200, "text/xml", xml))
}

/// DynamoDB's JSON API: GetItem and BatchGetItem of the groups' items, Query of the
/// cluster's index.
fn dynamo(world: &World, target: &str, body: &[u8]) -> Option<Reply> {
    let request: serde_json::Value = serde_json::from_slice(body).ok()?;
    let group = |key: &serde_json::Value| {
        let pk = key.pointer("/pk/S")?.as_str()?;
        world.arns.get(pk.strip_prefix("tg#")?).copied()
    };
    let item = |key: &serde_json::Value| world.items.get(group(key)?);
    let answer = match target.strip_prefix("DynamoDB_20120810.")? {
        "GetItem" => {
            let item = item(request.get("Key")?)?;
            Bytes::from([&b"{\"Item\":"[..], item, b"}"].concat())
        }
        "BatchGetItem" => {
            let (table, keys) = request.get("RequestItems")?.as_object()?.iter().next()?;
            // A projection is taken to be a glance's (the item but its ledger), unless
            // `FLOOR_PROJECTION=0`: then whole items, as a server ignoring it would send.
            let items = if keys.get("ProjectionExpression").is_some()
                && crate::measure::env_or("FLOOR_PROJECTION", 1) == 1
            {
                &world.glances
            } else {
                &world.items
            };
            let items: Vec<&[u8]> = keys
                .get("Keys")?
                .as_array()?
                .iter()
                .filter_map(|k| items.get(group(k)?))
                .map(|i| &i[..])
                .collect();
            let mut out = format!(
                "{{\"Responses\":{{{}:[",
                serde_json::Value::from(table.as_str())
            )
            .into_bytes();
            out.extend(items.join(&b","[..]));
            out.extend(b"]},\"UnprocessedKeys\":{}}");
            Bytes::from(out)
        }
        // Only the index's partition is expected (the groups' items say `migrated`).
        "Query" if request.to_string().contains("owners#") => world.index.clone(),
        _ => return None,
    };
    Some(respond(200, "application/x-amz-json-1.0", answer))
}
