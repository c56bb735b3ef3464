//! A model of the Lambda service's Invoke API, for what `cargo lambda watch` cannot show:
//! it has no concurrency limit, and it names no invoked ARN.
//!
//! What it models (Lambda API reference, `Invoke`; developer guide, "Lambda function
//! scaling" and "Configuring reserved concurrency"):
//! - `POST /2015-03-31/functions/{FunctionName}/invocations`, the function named by name,
//!   `name:qualifier`, full or partial ARN, and the `Qualifier` query parameter;
//!   `X-Amz-Invocation-Type` `RequestResponse` (default), `Event` (202, run when a slot
//!   is free, as Lambda's asynchronous queue does) and `DryRun` (204).
//! - **Reserved concurrency** per function, read from `template.yaml`
//!   (`ReservedConcurrentExecutions`, [`deployed`]): a synchronous invoke that finds
//!   every reserved slot busy is refused at once with HTTP 429, `x-amzn-ErrorType:
//!   TooManyRequestsException` and `{"Reason":
//!   "ReservedFunctionConcurrentInvocationLimitExceeded", "Type": "User", "message":
//!   "Rate Exceeded."}`. A slot is held from the start of an invocation to its answer.
//! - Versions and aliases: `$LATEST`, version `1`, and the template's `AutoPublishAlias`
//!   (pointing at version 1); the function code sees the ARN the caller invoked
//!   (qualified when the caller qualified it), as the Runtime API's
//!   `Lambda-Runtime-Invoked-Function-Arn` says. Another qualifier is a 404
//!   `ResourceNotFoundException`, as is an unknown function.
//! - The answer: 200 with the function's response, `X-Amz-Executed-Version`; a function
//!   error is 200 too, with `X-Amz-Function-Error: Unhandled` and the error payload; an
//!   invocation past the function's `Timeout` answers `Sandbox.Timedout`.
//!
//! Not modelled: IAM (every caller may invoke everything), the account-wide unreserved
//! pool (a function without reserved concurrency is unlimited), burst limits, payload
//! size limits, response streaming.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::runtime_api::{self, RuntimeApi};

/// The account and region of every modelled function ARN.
pub const ACCOUNT: &str = "123456789012";
/// The region of every modelled function ARN.
pub const REGION: &str = "us-east-1";

/// One invocation as the function code sees it.
#[derive(Debug, Clone)]
pub struct Call {
    /// The event.
    pub payload: Value,
    /// The function, version or alias ARN the caller invoked.
    pub invoked_arn: String,
    /// When Lambda stops the invocation (unix ms).
    pub deadline_ms: u64,
}

/// What the function code answered: its response, or its error payload.
pub type Answer = Result<Value, Value>;

/// The code behind a function: a Runtime API with function processes polling it, or a
/// handler in this process.
pub trait Backend: Send + Sync + 'static {
    /// Runs one invocation.
    fn call(&self, call: Call) -> Pin<Box<dyn Future<Output = Answer> + Send>>;
}

/// Handler code of this process, run as one execution environment: a thread of its own
/// with a single-threaded runtime that lives as long as the backend (clients the code
/// creates keep their background tasks there between invocations, as in a warm
/// container), invocations on it concurrently. The handler's future need not be `Send`.
pub struct InProcess {
    jobs: std::sync::mpsc::Sender<(Call, tokio::sync::oneshot::Sender<Answer>)>,
}

impl InProcess {
    /// Runs `code` for every invocation.
    pub fn new<F, Fut>(code: F) -> Self
    where
        F: Fn(Call) -> Fut + Send + 'static,
        Fut: Future<Output = Answer> + 'static,
    {
        let (jobs, inbox) =
            std::sync::mpsc::channel::<(Call, tokio::sync::oneshot::Sender<Answer>)>();
        std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, async move {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                std::thread::spawn(move || {
                    while let Ok(job) = inbox.recv() {
                        if tx.send(job).is_err() {
                            return;
                        }
                    }
                });
                while let Some((call, reply)) = rx.recv().await {
                    let answer = code(call);
                    tokio::task::spawn_local(async move {
                        let _ = reply.send(answer.await);
                    });
                }
            });
        });
        Self { jobs }
    }
}

impl Backend for InProcess {
    fn call(&self, call: Call) -> Pin<Box<dyn Future<Output = Answer> + Send>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = self.jobs.send((call, tx)).is_ok();
        Box::pin(async move {
            if !sent {
                return Err(
                    json!({ "errorType": "Runtime.ExitError", "errorMessage": "the execution environment is gone" }),
                );
            }
            rx.await.unwrap_or_else(|_| {
                Err(json!({ "errorType": "Runtime.ExitError", "errorMessage": "the handler panicked" }))
            })
        })
    }
}

/// Function processes (as many as the function's reserved concurrency, started by the
/// caller) polling a [`RuntimeApi`].
pub struct Processes(pub Arc<RuntimeApi>);

impl Backend for Processes {
    fn call(&self, call: Call) -> Pin<Box<dyn Future<Output = Answer> + Send>> {
        let runtime = self.0.clone();
        Box::pin(async move {
            let timeout = Duration::from_millis(call.deadline_ms.saturating_sub(unix_ms()));
            let id = runtime.invoke_as(call.payload, timeout, &call.invoked_arn);
            match runtime.answer(&id, timeout).await {
                Some(runtime_api::Answer::Response(v)) => Ok(v),
                Some(runtime_api::Answer::Error(v)) => Err(v),
                None => Err(timed_out(timeout)),
            }
        })
    }
}

/// A function as the template deploys it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployed {
    /// Its logical id in the template.
    pub logical_id: String,
    /// `FunctionName`, with the parameters' defaults.
    pub name: String,
    /// `ReservedConcurrentExecutions`, with the parameters' defaults (`None`: unreserved).
    pub reserved: Option<u32>,
    /// `Timeout`.
    pub timeout: Duration,
    /// `AutoPublishAlias`.
    pub alias: Option<String>,
}

/// The functions of `template.yaml` (`AWS::Serverless::Function`) with the parameters'
/// defaults: names (`!Sub` of parameters), reserved concurrency (a number or a `!Ref`),
/// timeout and alias.
pub fn deployed(template: &Path) -> Vec<Deployed> {
    use serde_norway::Value as Y;
    let text =
        std::fs::read_to_string(template).unwrap_or_else(|e| panic!("{}: {e}", template.display()));
    let doc: Y = serde_norway::from_str(&text).expect("template.yaml is YAML");
    let defaults: BTreeMap<String, String> = doc["Parameters"]
        .as_mapping()
        .map(|m| {
            m.iter()
                .filter_map(|(k, p)| {
                    let v = match p.get("Default")? {
                        Y::String(s) => s.clone(),
                        Y::Number(n) => n.to_string(),
                        Y::Bool(b) => b.to_string(),
                        _ => return None,
                    };
                    Some((k.as_str()?.to_owned(), v))
                })
                .collect()
        })
        .unwrap_or_default();
    let resolve = |v: &Y| -> Option<String> {
        match v {
            Y::String(s) => Some(s.clone()),
            Y::Number(n) => Some(n.to_string()),
            Y::Tagged(t) if t.tag == "Ref" => defaults.get(t.value.as_str()?).cloned(),
            Y::Tagged(t) if t.tag == "Sub" => {
                let mut s = t.value.as_str()?.to_owned();
                for (k, v) in &defaults {
                    s = s.replace(&format!("${{{k}}}"), v);
                }
                Some(s)
            }
            _ => None,
        }
    };
    let mut out = Vec::new();
    for (id, r) in doc["Resources"].as_mapping().into_iter().flatten() {
        if r["Type"].as_str() != Some("AWS::Serverless::Function") {
            continue;
        }
        let p = &r["Properties"];
        let logical_id = id.as_str().unwrap_or_default().to_owned();
        let name = resolve(&p["FunctionName"]).unwrap_or_else(|| logical_id.clone());
        out.push(Deployed {
            reserved: p
                .get("ReservedConcurrentExecutions")
                .and_then(resolve)
                .map(|v| v.parse().expect("reserved concurrency is a number")),
            timeout: Duration::from_secs(
                p.get("Timeout")
                    .and_then(resolve)
                    .map_or(3, |v| v.parse().expect("timeout is a number")),
            ),
            alias: p.get("AutoPublishAlias").and_then(resolve),
            logical_id,
            name,
        });
    }
    out
}

/// A function of the model: as deployed, and its code.
pub struct Function {
    /// Name, limits, alias.
    pub deployed: Deployed,
    /// Its code.
    pub backend: Arc<dyn Backend>,
}

#[derive(Default)]
struct Counters {
    in_flight: u32,
    invocations: u64,
    throttles: u64,
}

struct Served {
    deployed: Deployed,
    backend: Arc<dyn Backend>,
    counters: Mutex<Counters>,
    freed: tokio::sync::Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn timed_out(after: Duration) -> Value {
    json!({
        "errorType": "Sandbox.Timedout",
        "errorMessage": format!("Task timed out after {:.2} seconds", after.as_secs_f64()),
    })
}

/// The running model; stops accepting when dropped.
pub struct LambdaService {
    endpoint: String,
    functions: Arc<BTreeMap<String, Arc<Served>>>,
    accept: JoinHandle<()>,
}

impl Drop for LambdaService {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl LambdaService {
    /// Serves `functions` on a free loopback port.
    pub async fn start(functions: Vec<Function>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        let functions: Arc<BTreeMap<String, Arc<Served>>> = Arc::new(
            functions
                .into_iter()
                .map(|f| {
                    (
                        f.deployed.name.clone(),
                        Arc::new(Served {
                            deployed: f.deployed,
                            backend: f.backend,
                            counters: Mutex::default(),
                            freed: tokio::sync::Notify::new(),
                        }),
                    )
                })
                .collect(),
        );
        let accept = tokio::spawn({
            let functions = functions.clone();
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve(stream, functions.clone()));
                }
            }
        });
        Self {
            endpoint,
            functions,
            accept,
        }
    }

    /// `http://127.0.0.1:PORT`, for `AWS_ENDPOINT_URL_LAMBDA` or an SDK endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Invocations of `function` running now.
    pub fn in_flight(&self, function: &str) -> u32 {
        self.functions
            .get(function)
            .map_or(0, |f| lock(&f.counters).in_flight)
    }

    /// Invocations of `function` started so far.
    pub fn invocations(&self, function: &str) -> u64 {
        self.functions
            .get(function)
            .map_or(0, |f| lock(&f.counters).invocations)
    }

    /// Synchronous invocations of `function` refused with 429 so far.
    pub fn throttles(&self, function: &str) -> u64 {
        self.functions
            .get(function)
            .map_or(0, |f| lock(&f.counters).throttles)
    }

    /// Waits up to `wait` until `function` has `n` invocations running.
    pub async fn running(&self, function: &str, n: u32, wait: Duration) -> bool {
        let until = tokio::time::Instant::now() + wait;
        while self.in_flight(function) < n {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

/// An HTTP response: status, extra headers, body.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn error(status: u16, kind: &'static str, body: Value) -> Self {
        Self {
            status,
            headers: vec![
                ("x-amzn-ErrorType", kind.to_owned()),
                ("Content-Type", "application/json".to_owned()),
            ],
            body: body.to_string().into_bytes(),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        _ => "Error",
    }
}

/// `%XX` decoding of a path segment or query value.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The function name and qualifier in a `FunctionName` (name, `name:qualifier`, full or
/// partial ARN).
fn split_function_name(raw: &str) -> (String, Option<String>) {
    let parts: Vec<&str> = raw.split(':').collect();
    let rest: &[&str] = if parts.first() == Some(&"arn") && parts.len() >= 7 {
        &parts[6..]
    } else if parts.len() >= 3 && parts[1] == "function" {
        &parts[2..]
    } else {
        &parts[..]
    };
    (
        rest.first().copied().unwrap_or_default().to_owned(),
        rest.get(1).map(|q| (*q).to_owned()),
    )
}

async fn invoke(
    functions: &BTreeMap<String, Arc<Served>>,
    path: &str,
    query: &str,
    headers: &BTreeMap<String, String>,
    body: Vec<u8>,
) -> Reply {
    let Some(raw) = path
        .strip_prefix("/2015-03-31/functions/")
        .and_then(|p| p.strip_suffix("/invocations"))
    else {
        return Reply::error(
            404,
            "UnknownOperationException",
            json!({ "Type": "User", "message": format!("no operation at {path}") }),
        );
    };
    let (name, in_name) = split_function_name(&percent_decode(raw));
    let in_query = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "Qualifier")
        .map(|(_, v)| percent_decode(v));
    let qualifier = match (in_name, in_query) {
        (Some(a), Some(b)) if a != b => {
            return Reply::error(
                400,
                "InvalidParameterValueException",
                json!({ "Type": "User", "message": "The derived qualifier from the function name does not match the specified qualifier." }),
            );
        }
        (a, b) => a.or(b),
    };
    let unqualified = format!("arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}");
    let Some(f) = functions.get(&name) else {
        return Reply::error(
            404,
            "ResourceNotFoundException",
            json!({ "Type": "User", "Message": format!("Function not found: {unqualified}") }),
        );
    };
    let executed = match qualifier.as_deref() {
        None | Some("$LATEST") => "$LATEST",
        Some("1") => "1",
        Some(q) if f.deployed.alias.as_deref() == Some(q) => "1",
        Some(q) => {
            return Reply::error(
                404,
                "ResourceNotFoundException",
                json!({ "Type": "User", "Message": format!("Function not found: {unqualified}:{q}") }),
            );
        }
    };
    let invoked_arn = match &qualifier {
        Some(q) => format!("{unqualified}:{q}"),
        None => unqualified,
    };
    let payload: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return Reply::error(
                    400,
                    "InvalidRequestContentException",
                    json!({ "Type": "User", "message": format!("Could not parse request body into json: {e}") }),
                );
            }
        }
    };
    let kind = headers
        .get("x-amz-invocation-type")
        .map_or("RequestResponse", String::as_str);
    match kind {
        "DryRun" => Reply {
            status: 204,
            headers: Vec::new(),
            body: Vec::new(),
        },
        "Event" => {
            // Lambda's asynchronous queue: accepted now, run when a slot is free.
            let f = f.clone();
            tokio::spawn(async move {
                loop {
                    let freed = f.freed.notified();
                    if take_slot(&f) {
                        break;
                    }
                    freed.await;
                }
                // Lambda's asynchronous invoke: nobody waits for the answer.
                let _ = run(&f, payload, invoked_arn).await;
            });
            Reply {
                status: 202,
                headers: Vec::new(),
                body: Vec::new(),
            }
        }
        "RequestResponse" => {
            if !take_slot(f) {
                lock(&f.counters).throttles += 1;
                return Reply::error(
                    429,
                    "TooManyRequestsException",
                    json!({
                        "Reason": "ReservedFunctionConcurrentInvocationLimitExceeded",
                        "Type": "User",
                        "message": "Rate Exceeded.",
                    }),
                );
            }
            let answer = run(f, payload, invoked_arn).await;
            let mut headers = vec![
                ("X-Amz-Executed-Version", executed.to_owned()),
                ("Content-Type", "application/json".to_owned()),
            ];
            let body = match answer {
                Ok(v) => v,
                Err(e) => {
                    headers.push(("X-Amz-Function-Error", "Unhandled".to_owned()));
                    e
                }
            };
            Reply {
                status: 200,
                headers,
                body: body.to_string().into_bytes(),
            }
        }
        other => Reply::error(
            400,
            "InvalidParameterValueException",
            json!({ "Type": "User", "message": format!("unknown invocation type {other}") }),
        ),
    }
}

/// Takes one of `f`'s reserved slots, if one is free.
fn take_slot(f: &Served) -> bool {
    let mut c = lock(&f.counters);
    if f.deployed.reserved.is_some_and(|r| c.in_flight >= r) {
        return false;
    }
    c.in_flight += 1;
    c.invocations += 1;
    true
}

/// Runs one invocation in a slot already taken, and frees it.
async fn run(f: &Served, payload: Value, invoked_arn: String) -> Answer {
    let timeout = f.deployed.timeout;
    let call = Call {
        payload,
        invoked_arn,
        deadline_ms: unix_ms() + timeout.as_millis() as u64,
    };
    let answer = match tokio::time::timeout(timeout, f.backend.call(call)).await {
        Ok(a) => a,
        Err(_) => Err(timed_out(timeout)),
    };
    lock(&f.counters).in_flight -= 1;
    f.freed.notify_waiters();
    answer
}

async fn serve(stream: TcpStream, functions: Arc<BTreeMap<String, Arc<Served>>>) {
    static IDS: AtomicU64 = AtomicU64::new(0);
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut line = String::new();
        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let target = parts.next().unwrap_or_default().to_owned();
        let mut headers = BTreeMap::new();
        loop {
            let mut header = String::new();
            if read.read_line(&mut header).await.unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
            }
        }
        let length = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0usize);
        let mut body = vec![0; length];
        if read.read_exact(&mut body).await.is_err() {
            return;
        }
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let reply = if method == "POST" {
            invoke(&functions, path, query, &headers, body).await
        } else {
            Reply::error(
                404,
                "UnknownOperationException",
                json!({ "Type": "User", "message": format!("{method} {path} is not modelled") }),
            )
        };
        let n = IDS.fetch_add(1, Ordering::Relaxed);
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nx-amzn-RequestId: 00000000-0000-4000-9000-{n:012x}\r\nContent-Length: {}\r\n",
            reply.status,
            reason(reply.status),
            reply.body.len()
        );
        for (k, v) in &reply.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        if write.write_all(head.as_bytes()).await.is_err()
            || write.write_all(&reply.body).await.is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_names_in_every_form() {
        for (raw, name, q) in [
            ("tgsync-manual", "tgsync-manual", None),
            ("tgsync-manual:release", "tgsync-manual", Some("release")),
            (
                "arn:aws:lambda:us-east-1:123456789012:function:tgsync-manual:release",
                "tgsync-manual",
                Some("release"),
            ),
            ("123456789012:function:tgsync-manual", "tgsync-manual", None),
        ] {
            assert_eq!(
                split_function_name(raw),
                (name.to_owned(), q.map(str::to_owned)),
                "{raw}"
            );
        }
        assert_eq!(percent_decode("a%3Ab%3arelease"), "a:b:release");
    }
}
