//! The manual function, invoked as `aws lambda invoke` does (Lambda's Invoke API,
//! synchronous), and target groups named on the command line turned into ARNs.

use std::time::{Duration, Instant};

use aws_sdk_lambda::config::retry::RetryConfig;
use aws_sdk_lambda::config::timeout::TimeoutConfig;
use aws_sdk_lambda::primitives::Blob;
use serde_json::Value;
use tgsync::aws::{Elbv2TargetGroups, MutationRate};
use tgsync::report::Report;

use crate::error::{Call, CliError};
use crate::progress::Progress;
use crate::session::Session;

/// The longest a Lambda invocation can run (its maximum timeout), plus a margin: the
/// answer of a synchronous invoke is waited for that long.
const LONGEST_INVOCATION: Duration = Duration::from_secs(15 * 60 + 30);

/// The manual function of one deployment.
pub struct Manual {
    client: aws_sdk_lambda::Client,
    elb: Elbv2TargetGroups,
    function: String,
    region: String,
    wait: Duration,
}

impl Manual {
    /// A client for `function` (name or ARN) with the session's region and credentials
    /// (and the SDK's other settings: `AWS_ENDPOINT_URL[_LAMBDA]`, ...). Retries are the
    /// CLI's own: only a 429 (Lambda ran nothing) is tried again, for up to `wait`; an
    /// invocation that may have run is never sent twice.
    pub async fn new(session: &Session, function: &str, wait: Duration) -> Self {
        let sdk = session.defaults().await;
        let conf = aws_sdk_lambda::config::Builder::from(&sdk)
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_timeout(LONGEST_INVOCATION)
                    .build(),
            )
            .build();
        Self {
            client: aws_sdk_lambda::Client::from_conf(conf),
            elb: Elbv2TargetGroups::from_sdk_config(&session.sdk, MutationRate::default()),
            function: function.to_owned(),
            region: session.region.clone(),
            wait,
        }
    }

    /// The ARNs of `groups` (ARNs as given; names looked up with one
    /// DescribeTargetGroups each, in this account and region).
    pub async fn resolve(&self, groups: &[String]) -> Result<Vec<String>, CliError> {
        resolve(&self.elb, groups).await
    }

    /// Invokes the function (through `qualifier`, when given) with `payload` and reads
    /// its report, showing `what` on stderr meanwhile.
    pub async fn run(
        &self,
        payload: Value,
        qualifier: Option<&str>,
        what: &str,
    ) -> Result<Report, CliError> {
        let target = match qualifier {
            Some(q) => format!("{}:{q}", self.function),
            None => self.function.clone(),
        };
        let progress = Progress::start(format!("{target}: {what}"));
        let started = Instant::now();
        let mut delay = Duration::from_secs(1);
        let out = loop {
            let sent = self
                .client
                .invoke()
                .function_name(&self.function)
                .set_qualifier(qualifier.map(str::to_owned))
                .payload(Blob::new(payload.to_string()))
                .send()
                .await;
            match sent {
                Ok(out) => break out,
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_too_many_requests_exception()) =>
                {
                    if started.elapsed() + delay > self.wait {
                        return Err(CliError::Busy {
                            function: target,
                            waited: started.elapsed().as_secs(),
                        });
                    }
                    progress.note(&format!(
                        "{target} is busy (another manual run holds its slot); trying again in {} s",
                        delay.as_secs()
                    ));
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(8));
                }
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_not_found_exception()) =>
                {
                    return Err(CliError::FunctionNotFound {
                        function: target,
                        region: self.region.clone(),
                        detail: tgsync::aws::error_summary(&e),
                    });
                }
                Err(e) => {
                    return Err(CliError::from_sdk(
                        &e,
                        Call {
                            service: "Lambda",
                            operation: "Lambda Invoke",
                            action: "lambda:InvokeFunction",
                            on: Some(format!("`{target}`")),
                            advice: "your credentials need lambda:InvokeFunction on the manual function (releases: on its `release` alias)",
                        },
                    ));
                }
            }
        };
        let body = out
            .payload()
            .map(|b| b.as_ref().to_vec())
            .unwrap_or_default();
        if out.function_error().is_some() {
            let message = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["errorMessage"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
            return Err(CliError::Function {
                function: target,
                message,
            });
        }
        let report = serde_json::from_slice(&body).map_err(|e| CliError::Answer {
            function: target,
            message: e.to_string(),
        })?;
        progress.done();
        Ok(report)
    }
}

/// The ARNs of `groups` through `elb`.
pub async fn resolve(elb: &Elbv2TargetGroups, groups: &[String]) -> Result<Vec<String>, CliError> {
    let mut arns = Vec::with_capacity(groups.len());
    for g in groups {
        if g.starts_with("arn:") {
            arns.push(g.clone());
        } else {
            arns.push(
                elb.arn_of_name(g)
                    .await?
                    .ok_or_else(|| CliError::NoSuchGroup(g.clone()))?,
            );
        }
    }
    Ok(arns)
}
