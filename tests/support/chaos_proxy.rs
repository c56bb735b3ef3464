//! A fault-injecting HTTP/1.1 proxy in front of moto's server, for the throttling tests
//! and benchmark.
//!
//! The proxy listens on `127.0.0.1:0`. For a configurable share of the requests to ELBv2
//! (query protocol, operation in the form body's `Action=`) and DynamoDB (JSON protocol,
//! operation in `X-Amz-Target: DynamoDB_20120810.<Op>`) it answers itself instead of
//! forwarding, alternately with the service's real throttling error (HTTP 400) and its
//! real internal error (HTTP 500) — the shapes and codes the AWS SDK's retry classifiers
//! recognise (`Throttling` / `ThrottlingException` are in the SDK's throttling-code list,
//! 500 is a transient status). Everything else (other services, and the requests that are
//! not faulted) is forwarded to moto unchanged. A faulted request never reaches moto, so
//! a retry is always safe.
//!
//! Every request is recorded: when it arrived, service, operation, the SDK's attempt
//! number (`amz-sdk-request: attempt=N`) and what the proxy did with it.
//!
//! The fault decisions are drawn from a seeded generator in arrival order, so the
//! sequence of decisions is reproducible; which request gets which decision still
//! depends on how concurrent requests interleave.
//!
//! The service of a request is read from its SigV4 credential scope
//! (`Credential=AKID/date/region/<service>/aws4_request`), as moto itself routes.
//!
//! Beside the faults, [`Rules`] model ELBv2 behaviour moto (5.2) lacks, each by the
//! documented error code and shape (the exact wording of a live message is ELBv2's
//! where a public source quotes it, a stand-in otherwise, as each rule says):
//! - the VPC: an IP outside it needs `AvailabilityZone=all` ([`Rules::vpc`]), and in an
//!   ALB group with cross-zone load balancing off a zone of the VPC instead
//!   ([`Rules::cross_zone_off`]);
//! - the targets quota of a group (`TooManyTargets`, [`Rules::quota`]);
//! - QUIC and TCP_QUIC groups ([`Rules::quic`]): moto creates neither, so a UDP group is
//!   described as QUIC, its registrations are validated as ELBv2 validates
//!   `QuicServerId`, and its health answers carry the IDs;
//! - what DescribeTargetHealth says beyond `healthy` ([`Rules::health`]): states with
//!   ELBv2's reason codes and descriptions, and the administrative override of an NLB
//!   zonal shift (every other target reports `no_override`, as an NLB does);
//! - the NLB's pace ([`Rules::initial_for`]);
//! - Availability Zone names per account ([`Rules::zone_names`]): AWS maps zone names to
//!   physical zones independently in each account (a zone ID is the same everywhere);
//!   moto names every account's zones alike.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The service a request was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Service {
    /// Elastic Load Balancing v2 (signing name `elasticloadbalancing`).
    Elbv2,
    /// DynamoDB (signing name `dynamodb`).
    DynamoDb,
    /// Anything else (EKS, STS, EC2…): always forwarded.
    Other,
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Elbv2 => "elasticloadbalancing",
            Self::DynamoDb => "dynamodb",
            Self::Other => "other",
        })
    }
}

/// What the proxy did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fate {
    /// Sent to moto; moto's answer relayed.
    Forwarded,
    /// Answered by the proxy with the service's throttling error (HTTP 400).
    Throttled,
    /// Answered by the proxy with the service's internal error (HTTP 500).
    ServerError,
    /// Refused by a [`Rules`] check with ELBv2's ValidationError (HTTP 400), or STS's
    /// AccessDenied (HTTP 403).
    Refused,
    /// Applied by moto, answered with an internal error (HTTP 500): see [`Rules`].
    AnswerLost,
    /// Held, never answered: see [`Rules`].
    Stalled,
}

impl Fate {
    /// Whether the proxy answered itself (or replaced moto's answer).
    pub fn injected(self) -> bool {
        matches!(self, Self::Throttled | Self::ServerError | Self::AnswerLost)
    }
}

/// One request the proxy received.
#[derive(Debug, Clone)]
pub struct Record {
    /// When its head had been read.
    pub at: Instant,
    /// Its service.
    pub service: Service,
    /// Its operation (`RegisterTargets`, `PutItem`, …; `METHOD /path` for others).
    pub operation: String,
    /// The SDK's attempt number from `amz-sdk-request` (1 = first attempt), if sent.
    pub attempt: Option<u32>,
    /// The SDK's `amz-sdk-invocation-id`: the same for every attempt of one call.
    pub invocation: Option<String>,
    /// The request body (lossy UTF-8, at most 4 KiB), for diagnostics.
    pub body: String,
    /// What the proxy did with it.
    pub fate: Fate,
    /// The status answered (moto's when forwarded); `None` until answered.
    pub status: Option<u16>,
    /// Time from arrival until the answer was written back.
    pub answered_after: Option<Duration>,
    /// Whether the answer reached the client (false: the client had hung up — an
    /// attempt timeout — so the SDK never saw it).
    pub delivered: bool,
}

/// Fault settings.
#[derive(Debug, Clone, Copy)]
pub struct Chaos {
    /// Share (0.0–1.0) of ELBv2 and DynamoDB requests answered with a fault.
    pub fault_share: f64,
    /// Seed of the fault decisions.
    pub seed: u64,
}

/// A fault mix other than [`Chaos`]'s even split: shares of throttling and of 500s, and
/// the share of the 500s that come after moto applied the call (its answer lost).
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Share of ELBv2 and DynamoDB requests answered with throttling (HTTP 400).
    pub throttle: f64,
    /// Share answered with an internal error (HTTP 500).
    pub error: f64,
    /// Of those 500s, the share forwarded to moto first (applied, answer lost).
    pub after_apply: f64,
}

/// The fault decisions: a seeded roll per request, faults alternating between
/// throttling and internal errors so exactly half of them are each (or by a [`Mix`]).
struct Decider {
    rng: fastrand::Rng,
    share: f64,
    injected: u64,
    mix: Option<Mix>,
}

impl Decider {
    fn decide(&mut self, service: Service) -> Fate {
        if service == Service::Other {
            return Fate::Forwarded;
        }
        if let Some(mix) = self.mix {
            let roll = self.rng.f64();
            return if roll < mix.throttle {
                Fate::Throttled
            } else if roll < mix.throttle + mix.error {
                if self.rng.f64() < mix.after_apply {
                    Fate::AnswerLost
                } else {
                    Fate::ServerError
                }
            } else {
                Fate::Forwarded
            };
        }
        if self.rng.f64() >= self.share {
            return Fate::Forwarded;
        }
        self.injected += 1;
        if self.injected % 2 == 1 {
            Fate::Throttled
        } else {
            Fate::ServerError
        }
    }
}

/// ELBv2 and DynamoDB behaviour moto lacks, or one-shot faults at a chosen request.
#[derive(Debug, Default, Clone)]
pub struct Rules {
    /// ELBv2's check of RegisterTargets in this VPC (network address, prefix length): an
    /// IPv4 target outside it must carry `AvailabilityZone=all`, or the whole call fails
    /// with ELBv2's ValidationError naming the address (moto does not check).
    pub vpc: Option<(std::net::Ipv4Addr, u8)>,
    /// Target IPs ELBv2 refuses whatever their zone, with the message to answer (a
    /// stand-in for any per-target refusal, e.g. an address ELBv2 does not accept).
    pub refuse: Vec<(String, String)>,
    /// The NLB's pace: a target stays `initial` in DescribeTargetHealth for this long
    /// after its RegisterTargets (moto reports it healthy at once), as a real NLB keeps
    /// it until its health checks pass.
    pub initial_for: Option<Duration>,
    /// The NLB's pace per target group: a group whose ARN contains the text keeps its new
    /// targets `initial` this long instead (two listeners' groups whose health checks
    /// pass at different times).
    pub initial_for_group: Vec<(String, Duration)>,
    /// Targets (`ip:port`) whose health checks fail: DescribeTargetHealth shows them
    /// `unhealthy` with ELBv2's `Target.FailedHealthChecks` (moto reports every IP
    /// target healthy).
    pub unhealthy: Vec<String>,
    /// One-shot: the next request of this operation (any, when empty) whose body contains
    /// the text is held and never answered (a call in flight when its caller is killed).
    pub stall: Vec<(String, String)>,
    /// One-shot: the next request of this operation (any, when empty) whose body contains the text is
    /// applied by moto, and its answer is replaced by an HTTP 500 (a response lost after
    /// the write landed, as a dropped connection or a timeout does).
    pub lose_answer: Vec<(String, String)>,
    /// Counted: the next `n` requests of this operation are answered with the service's
    /// throttling error (a storm aimed at one call, retried by the caller meanwhile).
    pub throttle: Vec<(String, u32)>,
    /// Requests of this operation whose body contains the text are forwarded only after
    /// this long (a slow call for one target group: ELBv2 under load, a long-tailed
    /// answer), every time.
    pub delay: Vec<(String, String, Duration)>,
    /// Role ARNs whose STS AssumeRole is refused with STS's AccessDenied (HTTP 403), as
    /// for a role whose trust policy does not name the caller, or that does not exist.
    /// moto lets anyone assume any role (it checks neither the role nor its trust
    /// policy nor the external ID), so a role that cannot be assumed is made here.
    pub deny_assume_role: Vec<String>,
    /// Target group ARNs of ALB groups with cross-zone load balancing off: with
    /// [`Rules::vpc`], a RegisterTargets naming an IP outside the VPC without a zone, or
    /// with `all`, is refused with ELBv2's ValidationError "When cross-zone load
    /// balancing is disabled on this target group, you must specify an Availability
    /// Zone for IP target '…' since it is outside of the VPC" (as quoted in the AWS Load
    /// Balancer Controller's fix for it); a zone not in [`Rules::zones`] is refused too
    /// (stand-in wording). The zone each target was registered in is kept and shows in
    /// DescribeTargetHealth, as ELBv2 shows it. moto ignores `AvailabilityZone`.
    pub cross_zone_off: Vec<String>,
    /// The Availability Zones of the VPC (for [`Rules::cross_zone_off`]).
    pub zones: Vec<String>,
    /// Targets per target group: a RegisterTargets that would take a group beyond it is
    /// refused as a whole with ELBv2's `TooManyTargets` (HTTP 400; the message is the API
    /// reference's description of the error). Counted: the targets registered through
    /// this proxy and not deregistered since (moto drops a deregistered target at once,
    /// so draining targets do not count here; a real group may count them until its
    /// deregistration delay ends).
    pub quota: Option<usize>,
    /// Target group ARNs of QUIC groups (created in moto as UDP, which moto has, and
    /// described as `QUIC`). A RegisterTargets to one must give every target a
    /// `QuicServerId` of `0x` and 16 lowercase hex digits, unique in the group, and may
    /// not change the ID of a registered target; to any other group it may give none.
    /// Each is refused with ELBv2's ValidationError (the rules are the API reference's;
    /// the messages are stand-ins). DescribeTargetHealth of a QUIC group shows each
    /// target's ID, as ELBv2 does; moto keeps none.
    pub quic: Vec<String>,
    /// What DescribeTargetHealth reports for these IPs instead of moto's `healthy`: the
    /// state, ELBv2's reason code and description, and whether a zonal shift
    /// (`AdministrativeOverride` state `zonal_shift_active`) applies. Every other
    /// target's answer gains `no_override`, as an NLB reports it.
    pub health: Vec<(String, HealthRule)>,
    /// Per account: the region's zones as that account names them, `(name, zone ID)`.
    /// EC2 DescribeAvailabilityZones signed with credentials of a listed account (the
    /// proxy learns whose credentials are whose from the AssumeRole answers it passes
    /// on) is answered from it, in EC2's shape; anyone else's is moto's, which names
    /// every account's zones alike.
    pub zone_names: Vec<(String, Vec<(String, String)>)>,
}

/// What DescribeTargetHealth reports for one IP ([`Rules::health`]).
#[derive(Debug, Clone, Default)]
pub struct HealthRule {
    /// `unused`, `initial`, `unhealthy`, …; `None` keeps moto's state.
    pub state: Option<String>,
    /// ELBv2's reason code, e.g. `Target.NotInUse`.
    pub reason: Option<String>,
    /// ELBv2's description.
    pub description: Option<String>,
    /// Under an NLB zonal shift.
    pub zonal_shift: bool,
}

struct Shared {
    /// moto's `host:port`.
    upstream: String,
    rules: Mutex<Rules>,
    /// When each target (`id:port`) was last registered through the proxy.
    registered_at: Mutex<std::collections::HashMap<String, Instant>>,
    /// Targets registered through the proxy per group: `id:port` → (QUIC server ID,
    /// zone), for the rules moto cannot apply.
    held: Mutex<BTreeMap<String, BTreeMap<String, Held>>>,
    decider: Mutex<Decider>,
    log: Mutex<Vec<Record>>,
    request_ids: std::sync::atomic::AtomicU64,
    /// Access key IDs handed out by the AssumeRole answers passed on → the role's
    /// account.
    key_accounts: Mutex<std::collections::HashMap<String, String>>,
}

/// The running proxy; stops accepting when dropped.
pub struct ChaosProxy {
    url: String,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl ChaosProxy {
    /// A proxy in front of moto that faults nothing until its rules say otherwise.
    pub async fn transparent() -> Self {
        Self::start(
            crate::moto::endpoint(),
            Chaos {
                fault_share: 0.0,
                seed: 1,
            },
        )
        .await
    }

    /// Starts a proxy in front of `upstream` (`http://host:port`, moto's endpoint).
    pub async fn start(upstream: &str, chaos: Chaos) -> Self {
        let upstream = upstream
            .strip_prefix("http://")
            .expect("upstream is http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the chaos proxy");
        let url = format!(
            "http://{}",
            listener.local_addr().expect("proxy has an address")
        );
        let shared = Arc::new(Shared {
            upstream,
            rules: Mutex::new(Rules::default()),
            registered_at: Mutex::new(std::collections::HashMap::new()),
            held: Mutex::new(BTreeMap::new()),
            decider: Mutex::new(Decider {
                rng: fastrand::Rng::with_seed(chaos.seed),
                share: chaos.fault_share,
                injected: 0,
                mix: None,
            }),
            log: Mutex::new(Vec::new()),
            request_ids: std::sync::atomic::AtomicU64::new(0),
            key_accounts: Mutex::new(std::collections::HashMap::new()),
        });
        let accept = tokio::spawn({
            let shared = shared.clone();
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(serve(shared.clone(), stream));
                }
            }
        });
        Self {
            url,
            shared,
            accept,
        }
    }

    /// The proxy's base URL, for an SDK config's `endpoint_url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Changes the share of faulted requests from now on (0.0 turns faults off).
    pub fn set_fault_share(&self, share: f64) {
        lock(&self.shared.decider).share = share;
    }

    /// Replaces the even split by `mix` from now on.
    pub fn set_mix(&self, mix: Mix) {
        lock(&self.shared.decider).mix = Some(mix);
    }

    /// Changes the rules from now on.
    pub fn set_rules(&self, f: impl FnOnce(&mut Rules)) {
        f(&mut lock(&self.shared.rules));
    }

    /// Every request received so far, in arrival order.
    pub fn records(&self) -> Vec<Record> {
        lock(&self.shared.log).clone()
    }

    /// The targets (`id:port`) of group `arn` registered through the proxy and not
    /// deregistered since, each with the zone it was registered in (if any) and its QUIC
    /// server ID (if any).
    pub fn held(&self, arn: &str) -> BTreeMap<String, (Option<String>, Option<String>)> {
        lock(&self.shared.held)
            .get(arn)
            .map(|g| {
                g.iter()
                    .map(|(k, h)| (k.clone(), (h.zone.clone(), h.quic.clone())))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An HTTP/1.1 message as read off the wire (body de-chunked).
struct Message {
    start: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Message {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn wants_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
            || self.start.ends_with("HTTP/1.0")
    }
}

/// Headers that belong to one hop, or that the proxy recomputes.
const HOP_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "content-length",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// Reads one message; `None` at a clean end of stream before a start line.
async fn read_message<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    response: bool,
) -> io::Result<Option<Message>> {
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        if !line.trim().is_empty() {
            break;
        }
    }
    let start = line.trim_end().to_owned();
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "headers cut short",
            ));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let mut msg = Message {
        start,
        headers,
        body: Vec::new(),
    };
    let status = if response {
        msg.start
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
    } else {
        None
    };
    if matches!(status, Some(100..=199 | 204 | 304)) {
        return Ok(Some(msg));
    }
    if msg
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        loop {
            line.clear();
            r.read_line(&mut line).await?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if size == 0 {
                // Trailers until the empty line.
                loop {
                    line.clear();
                    if r.read_line(&mut line).await? == 0 || line.trim().is_empty() {
                        break;
                    }
                }
                break;
            }
            let at = msg.body.len();
            msg.body.resize(at + size, 0);
            r.read_exact(&mut msg.body[at..]).await?;
            line.clear();
            r.read_line(&mut line).await?;
        }
    } else if let Some(len) = msg.header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        msg.body.resize(len, 0);
        r.read_exact(&mut msg.body).await?;
    } else if response {
        r.read_to_end(&mut msg.body).await?;
    }
    Ok(Some(msg))
}

/// Serves one client connection (keep-alive: many requests in sequence).
async fn serve(shared: Arc<Shared>, stream: TcpStream) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    while let Ok(Some(request)) = read_message(&mut read, false).await {
        let at = Instant::now();
        let (service, operation) = classify(&request);
        let mut verdict = lock(&shared.rules).judge(service, &operation, &request.body);
        if verdict == Verdict::Pass && service == Service::Elbv2 {
            verdict = model_judge(&shared, &operation, &request.body);
        }
        if verdict == Verdict::Pass && operation == "DescribeAvailabilityZones" {
            verdict = zones_answer(&shared, &request);
        }
        let fate = match verdict {
            Verdict::Pass => lock(&shared.decider).decide(service),
            Verdict::Refuse(_) | Verdict::Deny(_) | Verdict::Error { .. } => Fate::Refused,
            Verdict::LoseAnswer => Fate::AnswerLost,
            Verdict::Stall => Fate::Stalled,
            Verdict::Throttle => Fate::Throttled,
            Verdict::Delay(_) | Verdict::Answer(_) => Fate::Forwarded,
        };
        let attempt = request.header("amz-sdk-request").and_then(attempt_number);
        let invocation = request.header("amz-sdk-invocation-id").map(str::to_owned);
        let index = {
            let mut log = lock(&shared.log);
            log.push(Record {
                at,
                service,
                operation,
                attempt,
                invocation,
                body: String::from_utf8_lossy(&request.body[..request.body.len().min(4096)])
                    .into_owned(),
                fate,
                status: None,
                answered_after: None,
                delivered: false,
            });
            log.len() - 1
        };
        if fate == Fate::Stalled {
            // Logged above; the caller waits until it gives up or is killed.
            std::future::pending::<()>().await;
        }
        if let Verdict::Delay(after) = verdict {
            tokio::time::sleep(after).await;
        }
        let (status, headers, body) = match (fate, verdict) {
            (_, Verdict::Answer(xml)) => (
                "200 OK".to_owned(),
                vec![(
                    "Content-Type".to_owned(),
                    "text/xml;charset=UTF-8".to_owned(),
                )],
                xml.into_bytes(),
            ),
            (_, Verdict::Refuse(message)) => {
                let id = shared
                    .request_ids
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let request_id = format!("c4a05000-0000-4000-8000-{id:012x}");
                (
                    "400 Bad Request".to_owned(),
                    vec![
                        ("Content-Type".to_owned(), "text/xml".to_owned()),
                        ("x-amzn-RequestId".to_owned(), request_id.clone()),
                    ],
                    elbv2_error("Sender", "ValidationError", &message, &request_id).into_bytes(),
                )
            }
            (_, Verdict::Error { code, message }) => {
                let id = shared
                    .request_ids
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let request_id = format!("c4a05000-0000-4000-8000-{id:012x}");
                (
                    "400 Bad Request".to_owned(),
                    vec![
                        ("Content-Type".to_owned(), "text/xml".to_owned()),
                        ("x-amzn-RequestId".to_owned(), request_id.clone()),
                    ],
                    elbv2_error("Sender", code, &message, &request_id).into_bytes(),
                )
            }
            (_, Verdict::Deny(message)) => {
                let id = shared
                    .request_ids
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let request_id = format!("c4a05000-0000-4000-8000-{id:012x}");
                (
                    "403 Forbidden".to_owned(),
                    vec![
                        ("Content-Type".to_owned(), "text/xml".to_owned()),
                        ("x-amzn-RequestId".to_owned(), request_id.clone()),
                    ],
                    sts_error("AccessDenied", &message, &request_id).into_bytes(),
                )
            }
            (Fate::AnswerLost, _) => {
                let _ = forward(&shared.upstream, &request).await;
                let id = shared
                    .request_ids
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                fault_response(
                    service,
                    Fate::ServerError,
                    &format!("c4a05000-0000-4000-8000-{id:012x}"),
                )
            }
            (Fate::Forwarded, _) => match forward(&shared.upstream, &request).await {
                Ok(response) => {
                    let status = response
                        .start
                        .split_once(' ')
                        .map_or("502 Bad Gateway", |(_, s)| s)
                        .to_owned();
                    let body = nlb_pace(
                        &shared,
                        &operation_of(&request),
                        &request.body,
                        response.body,
                    );
                    let ok = status.starts_with('2');
                    if ok && operation_of(&request) == "AssumeRole" {
                        learn_key(&shared, &request.body, &body);
                    }
                    let body =
                        model_answer(&shared, &operation_of(&request), &request.body, ok, body);
                    (status, response.headers, body)
                }
                Err(e) => (
                    "502 Bad Gateway".to_owned(),
                    vec![("Content-Type".to_owned(), "text/plain".to_owned())],
                    format!("chaos proxy: moto unreachable: {e}").into_bytes(),
                ),
            },
            (fault, _) => {
                let id = shared
                    .request_ids
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                fault_response(
                    service,
                    fault,
                    &format!("c4a05000-0000-4000-8000-{id:012x}"),
                )
            }
        };
        let close = request.wants_close();
        let mut out = format!("HTTP/1.1 {status}\r\n");
        for (k, v) in &headers {
            if !HOP_HEADERS.contains(&k.to_ascii_lowercase().as_str()) {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        if close {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&body);
        let delivered = write.write_all(&bytes).await.is_ok();
        if let Some(record) = lock(&shared.log).get_mut(index) {
            record.status = status
                .split_whitespace()
                .next()
                .and_then(|s| s.parse().ok());
            record.answered_after = Some(at.elapsed());
            record.delivered = delivered;
        }
        if !delivered || close {
            break;
        }
    }
}

/// Sends `request` to moto on a fresh connection and reads the whole answer.
async fn forward(upstream: &str, request: &Message) -> io::Result<Message> {
    let mut conn = TcpStream::connect(upstream).await?;
    conn.set_nodelay(true)?;
    let mut head = format!("{}\r\n", request.start);
    for (k, v) in &request.headers {
        if !HOP_HEADERS.contains(&k.to_ascii_lowercase().as_str()) {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        request.body.len()
    ));
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&request.body);
    conn.write_all(&bytes).await?;
    let mut reader = BufReader::new(conn);
    read_message(&mut reader, true).await?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "moto closed without answering",
        )
    })
}

/// What the rules make of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// No rule applies.
    Pass,
    /// Answer ELBv2's ValidationError with this message.
    Refuse(String),
    /// Forward, then answer 500.
    LoseAnswer,
    /// Never answer.
    Stall,
    /// Answer STS's AccessDenied with this message.
    Deny(String),
    /// Answer with the service's throttling error.
    Throttle,
    /// Forward after this long.
    Delay(Duration),
    /// Answer HTTP 200 with this XML body (a model's own answer).
    Answer(String),
    /// Answer ELBv2's error `code` (HTTP 400) with this message.
    Error {
        /// The error code.
        code: &'static str,
        /// The message.
        message: String,
    },
}

impl Rules {
    fn judge(&mut self, service: Service, operation: &str, body: &[u8]) -> Verdict {
        let text = String::from_utf8_lossy(body);
        let matches = |(op, needle): &(String, String)| {
            (op.is_empty() || op == operation) && text.contains(needle.as_str())
        };
        if let Some(i) = self.stall.iter().position(matches) {
            self.stall.remove(i);
            return Verdict::Stall;
        }
        if let Some(i) = self.lose_answer.iter().position(|(op, needle)| {
            (op.is_empty() || op == operation) && text.contains(needle.as_str())
        }) {
            self.lose_answer.remove(i);
            return Verdict::LoseAnswer;
        }
        if let Some((_, left)) = self
            .throttle
            .iter_mut()
            .find(|(op, left)| op == operation && *left > 0)
        {
            *left -= 1;
            return Verdict::Throttle;
        }
        if let Some((_, _, after)) = self
            .delay
            .iter()
            .find(|(op, needle, _)| op == operation && text.contains(needle.as_str()))
        {
            return Verdict::Delay(*after);
        }
        if operation == "AssumeRole" {
            let role = text
                .split('&')
                .find_map(|pair| pair.strip_prefix("RoleArn="))
                .map(percent_decode)
                .unwrap_or_default();
            if self.deny_assume_role.contains(&role) {
                return Verdict::Deny(format!(
                    "User: arn:aws:sts::123456789012:assumed-role/tgsync-resync/test is not authorized to perform: sts:AssumeRole on resource: {role}"
                ));
            }
            return Verdict::Pass;
        }
        if service != Service::Elbv2 || operation != "RegisterTargets" {
            return Verdict::Pass;
        }
        for (id, _) in form_targets(&text) {
            if let Some((_, message)) = self.refuse.iter().find(|(ip, _)| *ip == id) {
                return Verdict::Refuse(message.clone());
            }
        }
        Verdict::Pass
    }

    /// Whether `id` is an IPv4 address outside [`Rules::vpc`].
    fn outside(&self, id: &str) -> bool {
        match (&self.vpc, id.parse::<std::net::Ipv4Addr>()) {
            (Some((net, len)), Ok(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
                u32::from(ip) & mask != u32::from(*net) & mask
            }
            _ => false,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The ELBv2 model: the VPC and its zones, the quota, QUIC groups, health reasons.

/// A target registered through the proxy.
#[derive(Debug, Clone, Default)]
struct Held {
    /// Its `QuicServerId`.
    quic: Option<String>,
    /// The `AvailabilityZone` it was registered with.
    zone: Option<String>,
}

/// One `Targets.member.N` of a form body.
#[derive(Debug, Clone, Default)]
struct FormTarget {
    id: String,
    port: String,
    zone: Option<String>,
    quic: Option<String>,
}

impl FormTarget {
    fn key(&self) -> String {
        format!("{}:{}", self.id, self.port)
    }
}

/// ELBv2's verdict on a RegisterTargets under the model's rules (before moto applies it).
fn model_judge(shared: &Shared, operation: &str, body: &[u8]) -> Verdict {
    if operation != "RegisterTargets" {
        return Verdict::Pass;
    }
    let text = String::from_utf8_lossy(body);
    let arn = form_param(&text, "TargetGroupArn").unwrap_or_default();
    let targets = form_target_list(&text);
    let rules = lock(&shared.rules);
    let held = lock(&shared.held);
    let group = held.get(&arn);
    let invalid = |message: String| Verdict::Error {
        code: "ValidationError",
        message,
    };
    let quic = rules.quic.contains(&arn);
    for t in &targets {
        if rules.outside(&t.id) {
            if rules.cross_zone_off.contains(&arn) {
                match t.zone.as_deref() {
                    None | Some("all") => {
                        return invalid(format!(
                            "When cross-zone load balancing is disabled on this target group, you must specify an Availability Zone for IP target '{}' since it is outside of the VPC",
                            t.id
                        ));
                    }
                    Some(z) if !rules.zones.iter().any(|v| v == z) => {
                        return invalid(format!(
                            "The Availability Zone '{z}' is not an Availability Zone of the target group's VPC"
                        ));
                    }
                    Some(_) => {}
                }
            } else if t.zone.is_none() {
                return invalid(format!(
                    "The Availability Zone is required for IP address '{}' because it is not in the VPC",
                    t.id
                ));
            }
        }
        match (&t.quic, quic) {
            (None, true) => {
                return invalid(format!(
                    "A QUIC server ID is required for target '{}' of a QUIC or TCP_QUIC target group",
                    t.key()
                ));
            }
            (Some(_), false) => {
                return invalid(format!(
                    "A QUIC server ID can only be specified for QUIC and TCP_QUIC target groups (target '{}')",
                    t.key()
                ));
            }
            (Some(id), true) => {
                let well_formed = id.len() == 18
                    && id.starts_with("0x")
                    && id[2..]
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                if !well_formed {
                    return invalid(format!(
                        "The QUIC server ID '{id}' is not valid: it must be 0x followed by 16 lowercase hexadecimal characters"
                    ));
                }
                let holder = group.and_then(|g| {
                    g.iter()
                        .find(|(k, h)| h.quic.as_deref() == Some(id) && **k != t.key())
                });
                if let Some((other, _)) = holder {
                    return invalid(format!(
                        "The QUIC server ID '{id}' is already used by target '{other}'"
                    ));
                }
                if let Some(old) = group
                    .and_then(|g| g.get(&t.key()))
                    .and_then(|h| h.quic.as_deref())
                    .filter(|old| *old != id)
                {
                    return invalid(format!(
                        "The QUIC server ID of registered target '{}' cannot be modified from '{old}'; deregister it first",
                        t.key()
                    ));
                }
            }
            (None, false) => {}
        }
    }
    if let Some(quota) = rules.quota {
        let new = targets
            .iter()
            .filter(|t| group.is_none_or(|g| !g.contains_key(&t.key())))
            .map(FormTarget::key)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        if group.map_or(0, BTreeMap::len) + new > quota {
            return Verdict::Error {
                code: "TooManyTargets",
                message: "You've reached the limit on the number of targets.".into(),
            };
        }
    }
    Verdict::Pass
}

/// Records what moto applied (registrations, deregistrations) and rewrites its Describe
/// answers as ELBv2 would give them under the model's rules.
fn model_answer(
    shared: &Shared,
    operation: &str,
    request: &[u8],
    ok: bool,
    body: Vec<u8>,
) -> Vec<u8> {
    let text = String::from_utf8_lossy(request);
    let arn = || form_param(&text, "TargetGroupArn").unwrap_or_default();
    match operation {
        "RegisterTargets" if ok => {
            let mut held = lock(&shared.held);
            let group = held.entry(arn()).or_default();
            for t in form_target_list(&text) {
                group.insert(
                    t.key(),
                    Held {
                        quic: t.quic.clone(),
                        zone: t.zone.clone(),
                    },
                );
            }
            body
        }
        "DeregisterTargets" if ok => {
            if let Some(group) = lock(&shared.held).get_mut(&arn()) {
                for t in form_target_list(&text) {
                    group.remove(&t.key());
                }
            }
            body
        }
        "DescribeTargetGroups" if ok => {
            let quic = lock(&shared.rules).quic.clone();
            if quic.is_empty() {
                return body;
            }
            let answer = String::from_utf8_lossy(&body).into_owned();
            rewrite_members(&answer, "TargetGroups", |member| {
                let is_quic = element(member, "TargetGroupArn").is_some_and(|a| quic.contains(&a));
                if !is_quic {
                    return member.to_owned();
                }
                match element(member, "Protocol") {
                    Some(p) => member.replacen(
                        &format!("<Protocol>{p}</Protocol>"),
                        "<Protocol>QUIC</Protocol>",
                        1,
                    ),
                    None => member.to_owned(),
                }
            })
            .into_bytes()
        }
        "DescribeTargetHealth" if ok => {
            let arn = arn();
            let rules = lock(&shared.rules).clone();
            let held = lock(&shared.held).get(&arn).cloned().unwrap_or_default();
            let answer = String::from_utf8_lossy(&body).into_owned();
            rewrite_members(&answer, "TargetHealthDescriptions", |member| {
                let id = element(member, "Id").unwrap_or_default();
                let port = element(member, "Port").unwrap_or_default();
                let mut member = member.to_owned();
                if let Some(h) = held.get(&format!("{id}:{port}")) {
                    let mut extra = String::new();
                    if let Some(q) = h.quic.as_ref().filter(|_| rules.quic.contains(&arn)) {
                        extra.push_str(&format!("<QuicServerId>{q}</QuicServerId>"));
                    }
                    if let Some(z) = &h.zone
                        && element(&member, "AvailabilityZone").is_none()
                    {
                        extra.push_str(&format!("<AvailabilityZone>{z}</AvailabilityZone>"));
                    }
                    member = member.replacen("</Target>", &format!("{extra}</Target>"), 1);
                }
                let rule = rules.health.iter().find(|(ip, _)| *ip == id).map(|(_, r)| r);
                if let Some(r) = rule
                    && let (Some(start), Some(end)) =
                        (member.find("<TargetHealth>"), member.find("</TargetHealth>"))
                {
                    let state = r
                        .state
                        .clone()
                        .or_else(|| element(&member, "State"))
                        .unwrap_or_default();
                    let mut health = format!("<TargetHealth><State>{state}</State>");
                    if let Some(reason) = &r.reason {
                        health.push_str(&format!("<Reason>{reason}</Reason>"));
                    }
                    if let Some(d) = &r.description {
                        health.push_str(&format!("<Description>{d}</Description>"));
                    }
                    health.push_str("</TargetHealth>");
                    member.replace_range(start..end + "</TargetHealth>".len(), &health);
                }
                let shifted = rule.is_some_and(|r| r.zonal_shift);
                let o = if shifted {
                    "<AdministrativeOverride><State>zonal_shift_active</State><Reason>AdministrativeOverride.ZonalShiftActive</Reason><Description>Target is in an Availability Zone that has traffic shifted away from it</Description></AdministrativeOverride>"
                } else {
                    "<AdministrativeOverride><State>no_override</State><Reason>AdministrativeOverride.NoOverride</Reason><Description>No override is currently active on target</Description></AdministrativeOverride>"
                };
                if !member.contains("<AdministrativeOverride>") {
                    member.push_str(o);
                }
                member
            })
            .into_bytes()
        }
        _ => body,
    }
}

/// `xml` with each top-level `<member>` of the `<list>` element replaced by `f` of its
/// content (nested `<member>`s are part of their parent's content).
fn rewrite_members(xml: &str, list: &str, mut f: impl FnMut(&str) -> String) -> String {
    let open = format!("<{list}>");
    let close = format!("</{list}>");
    let (Some(start), Some(end)) = (xml.find(&open), xml.rfind(&close)) else {
        return xml.to_owned();
    };
    let inner = &xml[start + open.len()..end];
    let mut out = String::with_capacity(xml.len() + 256);
    out.push_str(&xml[..start + open.len()]);
    let mut rest = inner;
    while let Some(at) = rest.find("<member>") {
        out.push_str(&rest[..at]);
        let content_start = at + "<member>".len();
        // Find the matching </member>, counting nested members.
        let mut depth = 1usize;
        let mut i = content_start;
        let bytes = rest.as_bytes();
        let mut content_end = rest.len();
        while i < bytes.len() {
            if rest[i..].starts_with("<member>") {
                depth += 1;
                i += "<member>".len();
            } else if rest[i..].starts_with("</member>") {
                depth -= 1;
                if depth == 0 {
                    content_end = i;
                    break;
                }
                i += "</member>".len();
            } else {
                i += 1;
            }
        }
        out.push_str("<member>");
        out.push_str(&f(&rest[content_start..content_end]));
        out.push_str("</member>");
        rest = rest
            .get(content_end + "</member>".len()..)
            .unwrap_or_default();
    }
    out.push_str(rest);
    out.push_str(&xml[end..]);
    out
}

/// The text of the first `<name>` element of `xml`.
fn element(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find('<')?;
    Some(xml[start..end].to_owned())
}

/// A top-level parameter of a form body, decoded.
pub fn form_param(body: &str, name: &str) -> Option<String> {
    body.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| percent_decode(v))
    })
}

/// Each `Targets.member.N` of a form body, in order.
fn form_target_list(body: &str) -> Vec<FormTarget> {
    let mut by_index: BTreeMap<u32, FormTarget> = BTreeMap::new();
    for pair in body.split('&') {
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        let Some((n, field)) = key
            .strip_prefix("Targets.member.")
            .and_then(|rest| rest.split_once('.'))
        else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else { continue };
        let entry = by_index.entry(n).or_default();
        let value = percent_decode(value);
        match field {
            "Id" => entry.id = value,
            "Port" => entry.port = value,
            "AvailabilityZone" => entry.zone = Some(value),
            "QuicServerId" => entry.quic = Some(value),
            _ => {}
        }
    }
    by_index.into_values().collect()
}

/// The operation of a request (as the log names it).
fn operation_of(request: &Message) -> String {
    classify(request).1
}

/// Keeps targets `initial` for [`Rules::initial_for`] after their registration, and
/// [`Rules::unhealthy`] ones unhealthy: records RegisterTargets, and rewrites the states
/// in DescribeTargetHealth answers.
fn nlb_pace(shared: &Shared, operation: &str, request: &[u8], response: Vec<u8>) -> Vec<u8> {
    let (initial_for, per_group, unhealthy) = {
        let rules = lock(&shared.rules);
        (
            rules.initial_for,
            rules.initial_for_group.clone(),
            rules.unhealthy.clone(),
        )
    };
    if initial_for.is_none() && per_group.is_empty() && unhealthy.is_empty() {
        return response;
    }
    let text = String::from_utf8_lossy(request);
    let group = text
        .split('&')
        .find_map(|pair| pair.strip_prefix("TargetGroupArn="))
        .map(percent_decode)
        .unwrap_or_default();
    let initial_for = per_group
        .iter()
        .find(|(needle, _)| group.contains(needle.as_str()))
        .map(|(_, d)| *d)
        .or(initial_for)
        .unwrap_or_default();
    match operation {
        "RegisterTargets" => {
            let now = Instant::now();
            let mut at = lock(&shared.registered_at);
            for key in form_target_keys(&text) {
                at.insert(format!("{group} {key}"), now);
            }
            response
        }
        "DescribeTargetHealth" => {
            let text = String::from_utf8_lossy(&response).into_owned();
            let at = lock(&shared.registered_at);
            let mut parts = text.split("<member>");
            let mut out = parts.next().unwrap_or_default().to_owned();
            for member in parts {
                let field = |name: &str| {
                    let open = format!("<{name}>");
                    let start = member.find(&open)? + open.len();
                    let end = start + member[start..].find('<')?;
                    Some(member[start..end].to_owned())
                };
                let key = format!(
                    "{}:{}",
                    field("Id").unwrap_or_default(),
                    field("Port").unwrap_or_default()
                );
                let young = at
                    .get(&format!("{group} {key}"))
                    .is_some_and(|t| t.elapsed() < initial_for);
                out.push_str("<member>");
                if unhealthy.contains(&key) {
                    out.push_str(&member.replace(
                        "<State>healthy</State>",
                        "<State>unhealthy</State><Reason>Target.FailedHealthChecks</Reason><Description>Health checks failed</Description>",
                    ));
                } else if young {
                    out.push_str(&member.replace(
                        "<State>healthy</State>",
                        "<State>initial</State><Reason>Elb.RegistrationInProgress</Reason><Description>Target registration is in progress</Description>",
                    ));
                } else {
                    out.push_str(member);
                }
            }
            out.into_bytes()
        }
        _ => response,
    }
}

/// `id:port` of each `Targets.member.N` of a form-encoded body.
fn form_target_keys(body: &str) -> Vec<String> {
    let mut by_index: BTreeMap<u32, (String, String)> = BTreeMap::new();
    for pair in body.split('&') {
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        let Some((n, field)) = key
            .strip_prefix("Targets.member.")
            .and_then(|rest| rest.split_once('.'))
        else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else { continue };
        let entry = by_index.entry(n).or_default();
        match field {
            "Id" => entry.0 = percent_decode(value),
            "Port" => entry.1 = percent_decode(value),
            _ => {}
        }
    }
    by_index
        .into_values()
        .map(|(id, port)| format!("{id}:{port}"))
        .collect()
}

/// `(Id, AvailabilityZone)` of each `Targets.member.N` of a form-encoded body.
fn form_targets(body: &str) -> Vec<(String, Option<String>)> {
    let mut by_index: BTreeMap<u32, (String, Option<String>)> = BTreeMap::new();
    for pair in body.split('&') {
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        let value = percent_decode(value);
        let Some(rest) = key.strip_prefix("Targets.member.") else {
            continue;
        };
        let Some((n, field)) = rest.split_once('.') else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else { continue };
        let entry = by_index.entry(n).or_default();
        match field {
            "Id" => entry.0 = value,
            "AvailabilityZone" => entry.1 = Some(value),
            _ => {}
        }
    }
    by_index.into_values().collect()
}

/// Decodes a form-encoded value (`%3A` → `:`).
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The service (from the SigV4 credential scope, or DynamoDB's target header) and the
/// operation of a request.
fn classify(request: &Message) -> (Service, String) {
    let scope_service = credential(request)
        .and_then(|c| c.split('/').nth(3))
        .map(str::to_owned);
    let target = request.header("x-amz-target");
    let service = match (scope_service.as_deref(), target) {
        (Some("elasticloadbalancing"), _) => Service::Elbv2,
        (Some("dynamodb"), _) => Service::DynamoDb,
        (None, Some(t)) if t.starts_with("DynamoDB_") => Service::DynamoDb,
        _ => Service::Other,
    };
    let operation = if let Some(op) = target.and_then(|t| t.rsplit_once('.')).map(|(_, op)| op) {
        op.to_owned()
    } else if let Some(action) = form_action(&request.body) {
        action
    } else {
        let mut parts = request.start.split_whitespace();
        let method = parts.next().unwrap_or("?");
        let path = parts.next().unwrap_or("?");
        format!("{method} {}", path.split('?').next().unwrap_or(path))
    };
    (service, operation)
}

/// `Action` of a form-encoded query-protocol body.
fn form_action(body: &[u8]) -> Option<String> {
    std::str::from_utf8(body)
        .ok()?
        .split('&')
        .find_map(|pair| pair.strip_prefix("Action="))
        .map(str::to_owned)
}

/// `N` of `amz-sdk-request: attempt=N; max=M`.
fn attempt_number(value: &str) -> Option<u32> {
    value
        .split(';')
        .find_map(|p| p.trim().strip_prefix("attempt="))
        .and_then(|n| n.parse().ok())
}

/// The service's own error answer for an injected fault.
fn fault_response(
    service: Service,
    fate: Fate,
    request_id: &str,
) -> (String, Vec<(String, String)>, Vec<u8>) {
    let (status, content_type, body) = match (service, fate) {
        (Service::Elbv2, Fate::Throttled) => (
            "400 Bad Request",
            "text/xml",
            elbv2_error("Sender", "Throttling", "Rate exceeded", request_id),
        ),
        (Service::Elbv2, _) => (
            "500 Internal Server Error",
            "text/xml",
            elbv2_error(
                "Receiver",
                "InternalFailure",
                "The request processing has failed because of an unknown error, exception or failure.",
                request_id,
            ),
        ),
        (_, Fate::Throttled) => (
            "400 Bad Request",
            "application/x-amz-json-1.0",
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}"#.to_owned(),
        ),
        (_, _) => (
            "500 Internal Server Error",
            "application/x-amz-json-1.0",
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"Internal server error"}"#.to_owned(),
        ),
    };
    (
        status.to_owned(),
        vec![
            ("Content-Type".to_owned(), content_type.to_owned()),
            ("x-amzn-RequestId".to_owned(), request_id.to_owned()),
        ],
        body.into_bytes(),
    )
}

/// The SigV4 credential of a signed request: `AKID/date/region/service/aws4_request`.
fn credential(request: &Message) -> Option<&str> {
    request
        .header("authorization")
        .and_then(|a| a.split("Credential=").nth(1))
        .and_then(|c| c.split(',').next())
}

/// The access key ID of a SigV4-signed request.
fn access_key(request: &Message) -> Option<String> {
    credential(request)
        .and_then(|c| c.split('/').next())
        .map(str::to_owned)
}

/// Records whose the credentials of an AssumeRole answer are: the account of the role
/// asked for.
fn learn_key(shared: &Shared, request: &[u8], answer: &[u8]) {
    let role = form_param(&String::from_utf8_lossy(request), "RoleArn").unwrap_or_default();
    let account = tgsync::core::arn::arn_account(&role)
        .unwrap_or_default()
        .to_owned();
    if let Some(key) = element(&String::from_utf8_lossy(answer), "AccessKeyId") {
        lock(&shared.key_accounts).insert(key, account);
    }
}

/// DescribeAvailabilityZones for an account [`Rules::zone_names`] lists: its zones, as
/// EC2 answers (query protocol, EC2's XML namespace); anyone else's goes to moto.
fn zones_answer(shared: &Shared, request: &Message) -> Verdict {
    let Some(account) =
        access_key(request).and_then(|k| lock(&shared.key_accounts).get(&k).cloned())
    else {
        return Verdict::Pass;
    };
    let rules = lock(&shared.rules);
    let Some((_, zones)) = rules.zone_names.iter().find(|(a, _)| *a == account) else {
        return Verdict::Pass;
    };
    let items: String = zones
        .iter()
        .map(|(name, id)| {
            let region = name.trim_end_matches(|c: char| c.is_ascii_lowercase());
            format!(
                "<item><zoneName>{name}</zoneName><zoneState>available</zoneState>\
                 <regionName>{region}</regionName><zoneId>{id}</zoneId>\
                 <zoneType>availability-zone</zoneType><messageSet/></item>"
            )
        })
        .collect();
    Verdict::Answer(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
         <DescribeAvailabilityZonesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
         <requestId>c4a05000-0000-4000-8000-0000000000ec</requestId>\
         <availabilityZoneInfo>{items}</availabilityZoneInfo>\
         </DescribeAvailabilityZonesResponse>"
    ))
}

/// STS's error document (query protocol).
fn sts_error(code: &str, message: &str, request_id: &str) -> String {
    format!(
        "<ErrorResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
         <Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>\
         <RequestId>{request_id}</RequestId></ErrorResponse>"
    )
}

fn elbv2_error(kind: &str, code: &str, message: &str, request_id: &str) -> String {
    format!(
        "<ErrorResponse xmlns=\"http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/\">\
         <Error><Type>{kind}</Type><Code>{code}</Code><Message>{message}</Message></Error>\
         <RequestId>{request_id}</RequestId></ErrorResponse>"
    )
}

// ---------------------------------------------------------------------------------------
// Reading the log.

/// Requests per (service, operation): forwarded, throttled, 500.
pub fn tally(records: &[Record]) -> BTreeMap<(Service, String), [u64; 3]> {
    let mut out: BTreeMap<(Service, String), [u64; 3]> = BTreeMap::new();
    for r in records {
        let slot = match r.fate {
            Fate::Forwarded | Fate::Refused | Fate::Stalled => 0,
            Fate::Throttled => 1,
            Fate::ServerError | Fate::AnswerLost => 2,
        };
        out.entry((r.service, r.operation.clone())).or_default()[slot] += 1;
    }
    out
}

/// How the calls (one SDK invocation each, all its attempts) in `records` ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallEnds {
    /// Calls whose last attempt was forwarded and answered 2xx by moto.
    pub succeeded: usize,
    /// Calls whose last attempt was forwarded and answered with an error by moto
    /// (e.g. a conditional check failing, which is part of the protocol).
    pub moto_errors: usize,
    /// Calls whose every attempt was faulted, `max_attempts` of them: the SDK gave up.
    pub exhausted: usize,
    /// Calls whose last attempt was faulted after fewer than `max_attempts`: the SDK
    /// stopped retrying early (retry quota, classification), or the call is in flight.
    pub stopped_early: Vec<(String, u32)>,
    /// Attempts that moto answered but that the SDK retried anyway (the answer came
    /// after the attempt timeout, or was a retryable error): operation, status, time.
    pub retried_after_forwarding: Vec<(String, Option<u16>, Option<Duration>)>,
}

/// Groups the records by SDK invocation id and says how each call ended.
pub fn call_ends(records: &[Record], max_attempts: u32) -> CallEnds {
    let mut calls: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.service != Service::Other) {
        if let Some(id) = r.invocation.as_deref() {
            calls.entry(id).or_default().push(r);
        }
    }
    let mut ends = CallEnds::default();
    for attempts in calls.into_values() {
        let Some(last) = attempts.last() else {
            continue;
        };
        for r in &attempts[..attempts.len() - 1] {
            if r.fate == Fate::Forwarded {
                ends.retried_after_forwarding.push((
                    r.operation.clone(),
                    r.status,
                    r.answered_after,
                ));
            }
        }
        match last.fate {
            Fate::Forwarded if last.status.is_some_and(|s| (200..300).contains(&s)) => {
                ends.succeeded += 1
            }
            Fate::Forwarded => ends.moto_errors += 1,
            _ if attempts.len() as u32 >= max_attempts => ends.exhausted += 1,
            _ => ends
                .stopped_early
                .push((last.operation.clone(), attempts.len() as u32)),
        }
    }
    ends
}

/// Whether a record is a RegisterTargets or DeregisterTargets attempt.
pub fn is_mutation(r: &Record) -> bool {
    r.service == Service::Elbv2
        && matches!(
            r.operation.as_str(),
            "RegisterTargets" | "DeregisterTargets"
        )
}

/// Whether a record is an ELBv2 Describe call (DescribeTargetGroups, DescribeTags,
/// DescribeTargetHealth): the calls of the account's shared Describe bucket.
pub fn is_describe(r: &Record) -> bool {
    r.service == Service::Elbv2 && r.operation.starts_with("Describe")
}

/// Arrival times (sorted) of the RegisterTargets / DeregisterTargets attempts in
/// `records`: every attempt, or only first attempts (SDK retries carry `attempt=2` and
/// up; tgsync's own retries of ELBv2 calls each count as a first attempt).
pub fn mutation_times(records: &[Record], first_attempts_only: bool) -> Vec<Instant> {
    times_of(records, is_mutation, first_attempts_only)
}

/// Arrival times (sorted) of the records `pick` selects, every attempt or only first
/// attempts.
pub fn times_of(
    records: &[Record],
    pick: impl Fn(&Record) -> bool,
    first_attempts_only: bool,
) -> Vec<Instant> {
    let mut times: Vec<Instant> = records
        .iter()
        .filter(|r| pick(r))
        .filter(|r| !first_attempts_only || r.attempt.is_none_or(|a| a <= 1))
        .map(|r| r.at)
        .collect();
    times.sort();
    times
}

/// A window in which more requests arrived than a token bucket allows.
#[derive(Debug, Clone)]
pub struct Excess {
    /// Requests in the window (first and last included).
    pub count: usize,
    /// What the bucket allows in it: `burst + per_second × (length + slack)`.
    pub allowed: f64,
    /// Length of the window (first to last request).
    pub length: Duration,
    /// Offset of the window's first request from the first request of all.
    pub from: Duration,
}

/// The worst window (most requests over the bound) among `times` (sorted) against a
/// token bucket of `per_second` and `burst`, with `slack` added to every window's length
/// for the transit time jitter between the client's limiter and the proxy; `None` when
/// every window is within the bound.
pub fn worst_excess(
    times: &[Instant],
    per_second: f64,
    burst: f64,
    slack: Duration,
) -> Option<Excess> {
    let mut worst: Option<Excess> = None;
    for (i, &first) in times.iter().enumerate() {
        for (j, &last) in times.iter().enumerate().skip(i) {
            let length = last - first;
            let count = j - i + 1;
            let allowed = burst + per_second * (length + slack).as_secs_f64();
            let over = count as f64 - allowed;
            if over > 0.0
                && worst
                    .as_ref()
                    .is_none_or(|w| over > w.count as f64 - w.allowed)
            {
                worst = Some(Excess {
                    count,
                    allowed,
                    length,
                    from: first - times[0],
                });
            }
        }
    }
    worst
}

/// The most requests among `times` (sorted) in any window of `window` (both ends
/// included).
pub fn max_in_window(times: &[Instant], window: Duration) -> usize {
    let mut best = 0;
    let mut start = 0;
    for (end, &at) in times.iter().enumerate() {
        while at - times[start] > window {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

// ---------------------------------------------------------------------------------------
// An engine whose AWS calls go through the proxy.

/// The production default for Describe calls: 8 per second, evenly spaced (burst 1).
pub fn describe_rate() -> tgsync::aws::MutationRate {
    tgsync::aws::MutationRate::new(8, Some(1)).expect("a valid rate")
}

/// tgsync's SDK configuration (retries, timeouts) pointed at the proxy.
pub async fn sdk_config(proxy: &ChaosProxy) -> aws_config::SdkConfig {
    crate::moto::sdk_config_for(proxy.url()).await
}

/// A fresh world whose engine reaches ELBv2 (and DynamoDB) through a proxy applying
/// `rules` (no random faults), at 50 mutations a second.
pub async fn world_behind(rules: impl FnOnce(&mut Rules)) -> (crate::world::World, ChaosProxy) {
    let mut w = crate::world::World::new().await;
    let proxy = ChaosProxy::transparent().await;
    proxy.set_rules(rules);
    w.engine = engine(
        &w,
        &sdk_config(&proxy).await,
        tgsync::aws::MutationRate::new(50, None).expect("a valid rate"),
    );
    (w, proxy)
}

/// The production adapters as `world::build_engine` wires them, but with the ELBv2,
/// DynamoDB and EKS clients on `sdk` (the proxy) and the ELBv2 mutations held to
/// `rate`. The EKS token still names moto's STS host, which the emulator checks.
pub fn engine(
    world: &crate::world::World,
    sdk: &aws_config::SdkConfig,
    rate: tgsync::aws::MutationRate,
) -> crate::world::LiveEngine {
    engine_on(world, sdk, rate, Arc::new(world.clock.clone()))
}

/// [`engine`] on another clock (the system clock: leases that expire in real time).
pub fn engine_on(
    world: &crate::world::World,
    sdk: &aws_config::SdkConfig,
    rate: tgsync::aws::MutationRate,
    clock: Arc<dyn tgsync::clock::Clock>,
) -> crate::world::LiveEngine {
    use tgsync::aws::{DynamoState, Elbv2TargetGroups};
    use tgsync::eks::{ClusterAccess, KubePods, Overrides};

    let access = ClusterAccess::new(
        world.cluster.as_str(),
        aws_sdk_eks::Client::new(sdk),
        crate::world::Creds::default().provider(),
        crate::moto::REGION,
        url::Url::parse(crate::moto::endpoint()).expect("moto URL"),
        Overrides {
            endpoint: Some(url::Url::parse(world.emulator.url()).expect("emulator URL")),
            ca_pem: world.emulator.ca_pem().map(|p| p.as_bytes().to_vec()),
        },
    );
    let pods = KubePods::new(Arc::new(access)).with_page_size(100);
    let groups = Elbv2TargetGroups::from_sdk_config(sdk, rate).with_describe_rate(describe_rate());
    let state = DynamoState::from_sdk_config(sdk, world.table.as_str(), world.cluster.as_str());
    tgsync::Engine::new(world.cluster.as_str(), pods, groups, state, clock).with_seed(1)
}

// ---------------------------------------------------------------------------------------
// The throttling scenario, shared by tests/throttling.rs and benches/throttling.rs.

/// One bound group of a [`Fleet`] and what it must end up holding.
#[derive(Debug, Clone)]
pub struct FleetGroup {
    /// The target group.
    pub arn: String,
    /// `ip:port` of its ready pods, sorted.
    pub desired: Vec<String>,
    /// Targets registered by hand (must survive), sorted.
    pub foreign: Vec<String>,
    /// Targets tgsync registered for pods since deleted (must be deregistered).
    pub stale: Vec<String>,
}

/// How far a fleet is from its goal.
#[derive(Debug, Default)]
pub struct FleetCheck {
    /// Groups whose targets or ledger differ from the goal, described.
    pub diverged: Vec<String>,
    /// Hand-registered targets no longer in their group.
    pub foreign_lost: Vec<String>,
}

/// A world with `groups` bound IP target groups in 4 namespaces, `pods` ready pods
/// each, a foreign (hand-registered) target in every 4th group, and an owned target of a
/// deleted pod in every 5th group — whose engine talks to AWS through a [`ChaosProxy`].
pub struct Fleet {
    /// The world (its `engine` goes through the proxy).
    pub world: crate::world::World,
    /// The proxy.
    pub proxy: ChaosProxy,
    /// The groups and their goals.
    pub groups: Vec<FleetGroup>,
}

impl Fleet {
    /// Builds the fleet. Setup (groups, the stale targets, the foreign targets) goes to
    /// moto directly, without faults; only the engine built last uses the proxy.
    pub async fn build(
        groups: usize,
        pods: usize,
        chaos: Chaos,
        rate: tgsync::aws::MutationRate,
    ) -> Self {
        use tgsync::testkit::PodBuilder;

        let mut world = crate::world::World::new().await;
        let port = 8080;
        let mut fleet_groups = Vec::with_capacity(groups);
        for g in 0..groups {
            let ns = format!("ns-{}", g % 4);
            let arn = world.group(&ns, &format!("app=svc-{g}"), port, &[]).await;
            let ip = |net: usize, host: usize| format!("10.{}.{}.{}", net + g / 250, g % 250, host);
            let desired: Vec<String> = (0..pods)
                .map(|p| format!("{}:{port}", ip(20, p + 1)))
                .collect();
            let stale = if g % 5 == 0 {
                vec![format!("{}:{port}", ip(30, 1))]
            } else {
                vec![]
            };
            let foreign = if g % 4 == 1 {
                vec![format!("{}:{port}", ip(40, 1))]
            } else {
                vec![]
            };
            fleet_groups.push((
                ns,
                g,
                FleetGroup {
                    arn,
                    desired,
                    foreign,
                    stale,
                },
            ));
        }
        // Owned targets of pods that are then deleted: registered by a fault-free run.
        for (ns, g, group) in &fleet_groups {
            for (i, stale) in group.stale.iter().enumerate() {
                let ip = stale.split(':').next().unwrap_or_default();
                world.put_pod(
                    PodBuilder::new(ns, &format!("stale-{g}-{i}"))
                        .label("app", &format!("svc-{g}"))
                        .ip(ip)
                        .build(),
                );
            }
        }
        let setup = world.resync().await;
        assert_eq!(
            setup.totals.registered,
            fleet_groups
                .iter()
                .map(|(_, _, fg)| fg.stale.len())
                .sum::<usize>(),
            "setup run: {:#?}",
            setup.errors
        );
        for (ns, g, group) in &fleet_groups {
            for i in 0..group.stale.len() {
                world
                    .emulator
                    .store()
                    .delete_pod(ns, &format!("stale-{g}-{i}"));
            }
            for target in &group.foreign {
                let (ip, port) = target.split_once(':').unwrap_or_default();
                world
                    .register_by_hand(&group.arn, ip, port.parse().unwrap_or_default())
                    .await;
            }
            for (p, target) in group.desired.iter().enumerate() {
                let ip = target.split(':').next().unwrap_or_default();
                world.put_pod(
                    PodBuilder::new(ns, &format!("svc-{g}-{p}"))
                        .label("app", &format!("svc-{g}"))
                        .ip(ip)
                        .build(),
                );
            }
        }
        let proxy = ChaosProxy::start(crate::moto::endpoint(), chaos).await;
        let sdk = sdk_config(&proxy).await;
        world.engine = engine(&world, &sdk, rate);
        Self {
            world,
            proxy,
            groups: fleet_groups.into_iter().map(|(_, _, fg)| fg).collect(),
        }
    }

    /// Compares every group's targets and ledger (read straight from moto) with its goal.
    pub async fn check(&self) -> FleetCheck {
        let mut check = FleetCheck::default();
        for g in &self.groups {
            let targets = self.world.targets(&g.arn).await;
            let ledger = self.world.ledger(&g.arn).await;
            let mut want: Vec<String> = g.desired.iter().chain(&g.foreign).cloned().collect();
            want.sort();
            let mut desired = g.desired.clone();
            desired.sort();
            for f in &g.foreign {
                if !targets.contains(f) {
                    check.foreign_lost.push(format!("{f} in {}", g.arn));
                }
            }
            if targets != want || ledger != desired {
                check.diverged.push(format!(
                    "{}: targets {targets:?} (want {want:?}), ledger {ledger:?} (want {desired:?})",
                    g.arn
                ));
            }
        }
        check
    }

    /// Moves the world's clock past every backoff the report announced, and at least a
    /// minute (the schedule's interval).
    pub fn advance_past_backoff(&self, report: &tgsync::report::Report) {
        let now = tgsync::clock::Clock::now(&self.world.clock).0;
        let until = report
            .groups
            .iter()
            .filter_map(|g| g.next_attempt_at)
            .map(|t| t.0)
            .max()
            .unwrap_or(0);
        self.world
            .clock
            .advance(60_000u64.max(until.saturating_sub(now) + 1));
    }
}
