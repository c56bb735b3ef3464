//! A minimal HTTP(S) client for the integration tests: hyper over rustls
//! (aws-lc-rs), trusting only the CA it is given, one connection per request.

#![allow(dead_code)]

use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use kube_emulator::Emulator;
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// One HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// rustls client config trusting only `ca_pem`.
pub fn tls_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    kube_emulator::tls::client_config(ca_pem).expect("CA PEM parses")
}

/// Sends one request to the emulator. `ca_pem` is the CA to trust for
/// HTTPS (ignored for HTTP); `server_name` is what TLS verifies.
/// One request to send.
pub struct Call<'a> {
    pub method: Method,
    pub path: &'a str,
    pub token: Option<&'a str>,
    pub content_type: Option<&'a str>,
    pub body: Option<Vec<u8>>,
}

impl<'a> Call<'a> {
    /// An unauthenticated GET.
    pub fn get(path: &'a str) -> Self {
        Self {
            method: Method::GET,
            path,
            token: None,
            content_type: None,
            body: None,
        }
    }
}

pub async fn send_to(
    emulator: &Emulator,
    ca_pem: Option<&str>,
    server_name: &str,
    call: Call<'_>,
) -> Result<Answer, String> {
    let Call {
        method,
        path,
        token,
        content_type,
        body,
    } = call;
    let stream = TcpStream::connect(emulator.address())
        .await
        .map_err(|e| e.to_string())?;
    let host = format!("{}:{}", server_name, emulator.address().port());
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", host);
    if let Some(token) = token {
        builder = builder.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    if let Some(ct) = content_type {
        builder = builder.header(CONTENT_TYPE, ct);
    }
    let request = builder
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| e.to_string())?;
    let response = if emulator.url().starts_with("https://") {
        let ca = ca_pem.ok_or("no CA for HTTPS")?;
        let connector = TlsConnector::from(tls_config(ca));
        let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
        let tls = connector
            .connect(name, stream)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?
    };
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes()
        .to_vec();
    Ok(Answer {
        status,
        headers,
        body,
    })
}

/// Sends one request over HTTPS to `127.0.0.1:port`, trusting `ca_pem`.
pub async fn send_raw(
    port: u16,
    ca_pem: &str,
    method: Method,
    path: &str,
    token: Option<&str>,
) -> Answer {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let connector = TlsConnector::from(tls_config(ca_pem));
    let name = ServerName::try_from("127.0.0.1".to_owned()).expect("server name");
    let tls = connector
        .connect(name, stream)
        .await
        .expect("TLS handshake");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("HTTP handshake");
    tokio::spawn(conn);
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", format!("127.0.0.1:{port}"));
    if let Some(token) = token {
        builder = builder.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = sender
        .send_request(builder.body(Full::new(Bytes::new())).expect("request"))
        .await
        .expect("response");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

/// A client bound to one emulator, trusting its CA and using its token.
pub struct Client<'a> {
    pub emulator: &'a Emulator,
    pub token: Option<String>,
}

impl<'a> Client<'a> {
    pub fn new(emulator: &'a Emulator) -> Self {
        let token = emulator.token().expect("token");
        Self {
            emulator,
            token: Some(token),
        }
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let body = body.map(|b| serde_json::to_vec(&b).expect("serializable"));
        let call = Call {
            method,
            path,
            token: self.token.as_deref(),
            content_type,
            body,
        };
        send_to(self.emulator, self.emulator.ca_pem(), "127.0.0.1", call)
            .await
            .expect("request")
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, None, None).await
    }
}

/// An open WATCH: the response head, and its body read event by event.
pub struct WatchStream {
    pub status: u16,
    pub headers: HeaderMap,
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
}

/// How a watch stream ended.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchEnd {
    /// The final chunk arrived: the server ended the stream on purpose.
    Clean,
    /// The body broke off (no final chunk): the connection was lost.
    Broken(String),
}

impl WatchStream {
    /// The next event, `Err` when the stream ended, or `Ok(None)` when
    /// nothing arrived within `wait`.
    pub async fn next_within(
        &mut self,
        wait: std::time::Duration,
    ) -> Result<Option<Value>, WatchEnd> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                let value = serde_json::from_slice(&line).unwrap_or_else(|e| {
                    panic!(
                        "event is not JSON ({e}): {}",
                        String::from_utf8_lossy(&line)
                    )
                });
                return Ok(Some(value));
            }
            let frame = match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_elapsed) => return Ok(None),
                Ok(None) => {
                    assert!(
                        self.buffer.is_empty(),
                        "stream ended inside an event: {}",
                        String::from_utf8_lossy(&self.buffer)
                    );
                    return Err(WatchEnd::Clean);
                }
                Ok(Some(Err(e))) => return Err(WatchEnd::Broken(e.to_string())),
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }

    /// The next event, which must come within `wait`.
    pub async fn next(&mut self, wait: std::time::Duration) -> Value {
        match self.next_within(wait).await {
            Ok(Some(event)) => event,
            Ok(None) => panic!("no event within {wait:?}"),
            Err(end) => panic!("stream ended ({end:?}) while an event was expected"),
        }
    }

    /// Reads until the stream ends (it must within `wait`), returning the
    /// events read and how it ended.
    pub async fn until_end(&mut self, wait: std::time::Duration) -> (Vec<Value>, WatchEnd) {
        let deadline = tokio::time::Instant::now() + wait;
        let mut events = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_within(left).await {
                Ok(Some(event)) => events.push(event),
                Ok(None) => panic!("the stream did not end within {wait:?}; read {events:?}"),
                Err(end) => return (events, end),
            }
        }
    }
}

impl Client<'_> {
    /// Starts a GET that streams (a WATCH) and returns once the response
    /// head has arrived.
    pub async fn watch(&self, path: &str) -> WatchStream {
        let stream = TcpStream::connect(self.emulator.address())
            .await
            .expect("connect");
        let mut builder = Request::builder().method(Method::GET).uri(path).header(
            "host",
            format!("127.0.0.1:{}", self.emulator.address().port()),
        );
        if let Some(token) = &self.token {
            builder = builder.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = builder.body(Full::new(Bytes::new())).expect("request");
        let response = if self.emulator.url().starts_with("https://") {
            let ca = self.emulator.ca_pem().expect("CA");
            let connector = TlsConnector::from(tls_config(ca));
            let name = ServerName::try_from("127.0.0.1".to_owned()).expect("server name");
            let tls = connector.connect(name, stream).await.expect("TLS");
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .expect("HTTP handshake");
            tokio::spawn(conn);
            sender.send_request(request).await.expect("response")
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("HTTP handshake");
            tokio::spawn(conn);
            sender.send_request(request).await.expect("response")
        };
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        WatchStream {
            status,
            headers,
            body: response.into_body(),
            buffer: Vec::new(),
        }
    }
}
