//! A stand-in for the Lambda Runtime API (`/2018-06-01/runtime/...`), enough to drive
//! the built function binaries from a test or benchmark: it hands out the invocations
//! queued with [`RuntimeApi::invoke`] (with a deadline, as Lambda does) on the runtime's
//! `next` long poll, and collects what the function answers.
//!
//! Protocol: <https://docs.aws.amazon.com/lambda/latest/dg/runtimes-api.html>. HTTP/1.1
//! with keep-alive, one request at a time per connection; `next` blocks until an
//! invocation is queued. The Extensions API's register and `event/next` are answered as
//! Lambda does for an internal extension that subscribes to no event
//! (<https://docs.aws.amazon.com/lambda/latest/dg/runtimes-extensions-api.html>).
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// What the function answered to one invocation.
#[derive(Debug, Clone)]
pub enum Answer {
    /// `POST .../response`: the handler's result.
    Response(Value),
    /// `POST .../error`: the handler failed.
    Error(Value),
}

#[derive(Default)]
struct State {
    queue: VecDeque<(String, Value, u64, String)>,
    answers: HashMap<String, Answer>,
    next_polls: usize,
}

/// The running stand-in; stops accepting when dropped.
pub struct RuntimeApi {
    address: String,
    state: Arc<Mutex<State>>,
    queued: Arc<Notify>,
    answered: Arc<Notify>,
    accept: JoinHandle<()>,
    ids: std::sync::atomic::AtomicU64,
}

impl Drop for RuntimeApi {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl RuntimeApi {
    /// Starts listening on a free loopback port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let state = Arc::new(Mutex::new(State::default()));
        let queued = Arc::new(Notify::new());
        let answered = Arc::new(Notify::new());
        let accept = tokio::spawn({
            let (state, queued, answered) = (state.clone(), queued.clone(), answered.clone());
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve(
                        stream,
                        state.clone(),
                        queued.clone(),
                        answered.clone(),
                    ));
                }
            }
        });
        Self {
            address,
            state,
            queued,
            answered,
            accept,
            ids: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// `host:port`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Queues an invocation with `payload` that must end within `timeout`; its id.
    pub fn invoke(&self, payload: Value, timeout: Duration) -> String {
        self.invoke_as(
            payload,
            timeout,
            "arn:aws:lambda:us-east-1:123456789012:function:tgsync-test",
        )
    }

    /// [`RuntimeApi::invoke`] of the function, version or alias `invoked_arn` (what
    /// Lambda hands the runtime as `Lambda-Runtime-Invoked-Function-Arn`).
    pub fn invoke_as(&self, payload: Value, timeout: Duration, invoked_arn: &str) -> String {
        let n = self.ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("00000000-0000-4000-8000-{n:012x}");
        let deadline = unix_ms() + timeout.as_millis() as u64;
        lock(&self.state)
            .queue
            .push_back((id.clone(), payload, deadline, invoked_arn.to_owned()));
        self.queued.notify_waiters();
        id
    }

    /// Waits up to `wait` for the answer to invocation `id`.
    pub async fn answer(&self, id: &str, wait: Duration) -> Option<Answer> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.answered.notified();
            if let Some(a) = lock(&self.state).answers.get(id).cloned() {
                return Some(a);
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Waits until the function polls `next` for the `n`-th time (it is ready for its
    /// `n`-th invocation), up to `wait`.
    pub async fn polled(&self, n: usize, wait: Duration) -> bool {
        let until = tokio::time::Instant::now() + wait;
        while lock(&self.state).next_polls < n {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

async fn serve(
    stream: TcpStream,
    state: Arc<Mutex<State>>,
    queued: Arc<Notify>,
    answered: Arc<Notify>,
) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut line = String::new();
        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let path = parts.next().unwrap_or_default().to_owned();
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if read.read_line(&mut header).await.unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if read.read_exact(&mut body).await.is_err() {
            return;
        }
        let response = if method == "POST" && path == "/2020-01-01/extension/register" {
            // The Extensions API: registered (an internal extension, so that Lambda sends
            // the runtime SIGTERM before shutting the container down).
            let body =
                r#"{"functionName":"tgsync","functionVersion":"$LATEST","handler":"bootstrap"}"#;
            format!(
                "HTTP/1.1 200 OK\r\nLambda-Extension-Identifier: ext-1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        } else if method == "GET" && path == "/2020-01-01/extension/event/next" {
            // An extension subscribed to no event waits here for as long as it lives.
            std::future::pending::<()>().await;
            return;
        } else if method == "GET" && path.ends_with("/invocation/next") {
            lock(&state).next_polls += 1;
            let (id, payload, deadline, arn) = loop {
                let notified = queued.notified();
                if let Some(next) = lock(&state).queue.pop_front() {
                    break next;
                }
                notified.await;
            };
            let body = payload.to_string();
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                 Lambda-Runtime-Aws-Request-Id: {id}\r\n\
                 Lambda-Runtime-Deadline-Ms: {deadline}\r\n\
                 Lambda-Runtime-Invoked-Function-Arn: {arn}\r\n\
                 Lambda-Runtime-Trace-Id: Root=1-00000000-000000000000000000000000\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
        } else if method == "POST" && path.contains("/invocation/") {
            let id = path
                .split("/invocation/")
                .nth(1)
                .and_then(|rest| rest.split('/').next())
                .unwrap_or_default()
                .to_owned();
            let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let answer = if path.ends_with("/error") {
                Answer::Error(value)
            } else {
                Answer::Response(value)
            };
            lock(&state).answers.insert(id, answer);
            answered.notify_waiters();
            "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n".to_owned()
        } else {
            "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n".to_owned()
        };
        if write.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}
