//! A scripted HTTP server for unit tests: answers requests with canned responses in
//! order, to produce answers a real API server (or the emulator) will not give on demand,
//! such as a page that reports more items but has no continue token.

use std::sync::{Arc, Mutex};

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use url::Url;

use super::access::{ClusterAccess, Overrides};

/// Static keys the unit tests sign with.
pub(crate) const ACCESS_KEY_ID: &str = "AKIAIOSFODNN7EXAMPLE";
/// Secret of [`ACCESS_KEY_ID`].
pub(crate) const SECRET_ACCESS_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

/// One canned answer: status and JSON body.
pub(crate) type Reply = (u16, String);

pub(crate) struct Scripted {
    url: Url,
    requests: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Scripted {
    /// Serves `replies` in order (one per request, one request per connection), then 599.
    pub(crate) async fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            let mut replies = replies.into_iter();
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let line = head.lines().next().unwrap_or_default().to_owned();
                log.lock().unwrap().push(line);
                let (status, body) = replies.next().unwrap_or((599, "{}".to_owned()));
                let response = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            }
        });
        Self {
            url,
            requests,
            task,
        }
    }

    pub(crate) fn url(&self) -> &Url {
        &self.url
    }

    /// Request lines received so far, e.g. `GET /api/v1/namespaces/a/pods?limit=2 HTTP/1.1`.
    pub(crate) fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

pub(crate) fn credentials() -> SharedCredentialsProvider {
    SharedCredentialsProvider::new(Credentials::new(
        ACCESS_KEY_ID,
        SECRET_ACCESS_KEY,
        None,
        None,
        "unit-test",
    ))
}

/// An EKS client aimed at `endpoint` (a scripted server, or a closed port so any call
/// fails fast), without retries.
pub(crate) fn eks_client(endpoint: &str) -> aws_sdk_eks::Client {
    let config = aws_sdk_eks::Config::builder()
        .behavior_version(aws_sdk_eks::config::BehaviorVersion::latest())
        .region(aws_sdk_eks::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_eks::config::Credentials::new(
            ACCESS_KEY_ID,
            SECRET_ACCESS_KEY,
            None,
            None,
            "unit-test",
        ))
        .endpoint_url(endpoint)
        .retry_config(aws_sdk_eks::config::retry::RetryConfig::disabled())
        .build();
    aws_sdk_eks::Client::from_conf(config)
}

/// Access to cluster `test` with the given overrides; DescribeCluster goes to `eks`.
pub(crate) fn access(eks: &str, overrides: Overrides) -> ClusterAccess {
    ClusterAccess::new(
        "test",
        eks_client(eks),
        credentials(),
        "us-east-1",
        Url::parse("https://sts.us-east-1.amazonaws.com").unwrap(),
        overrides,
    )
}

/// A URL nothing listens on.
pub(crate) const CLOSED: &str = "http://127.0.0.1:9";
