//! The manual function, invoked as `aws lambda invoke` does (Lambda's Invoke API,
//! synchronous), and target groups named on the command line turned into ARNs.

use std::time::{Duration, Instant};

use aws_sdk_lambda::config::retry::RetryConfig;
use aws_sdk_lambda::config::timeout::TimeoutConfig;
use aws_sdk_lambda::primitives::Blob;
use serde_json::Value;
use tgsync::aws::{Elbv2TargetGroups, MutationRate};
use tgsync::core::BackoffPolicy;
use tgsync::report::Report;

use crate::error::{Call, CliError};
use crate::progress::Progress;
use crate::session::Session;

/// The longest a Lambda invocation can run (its maximum timeout), plus a margin: the
/// answer of a synchronous invoke is waited for that long.
const LONGEST_INVOCATION: Duration = Duration::from_secs(15 * 60 + 30);

/// Retries of an invoke Lambda refused with 429 (the function's one slot is busy): from
/// 1 s, doubling to 8 s, jittered into the upper half of each step, so operators (or a
/// script's loop) that found it busy together do not come back together.
const BUSY_RETRY: BackoffPolicy = BackoffPolicy {
    min: Duration::from_secs(1),
    max: Duration::from_secs(8),
};

/// The wait after the `refused`-th 429 in a row.
fn busy_wait(refused: u32, rng: &mut fastrand::Rng) -> Duration {
    BUSY_RETRY.delay(refused, rng)
}

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
        let mut rng = fastrand::Rng::new();
        let mut refused = 0u32;
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
                    refused += 1;
                    let delay = busy_wait(refused, &mut rng);
                    if started.elapsed() + delay > self.wait {
                        return Err(CliError::Busy {
                            function: target,
                            waited: started.elapsed().as_secs(),
                        });
                    }
                    progress.note(&format!(
                        "{target} is busy (another manual run holds its slot); trying again in {:.1} s",
                        delay.as_secs_f64()
                    ));
                    tokio::time::sleep(delay).await;
                }
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_not_found_exception()) =>
                {
                    return Err(CliError::FunctionNotFound {
                        function: target,
                        region: self.region.clone(),
                        detail: tgsync::aws::error_detail(&e),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two CLIs refused together come back apart: from the second retry on, the waits
    /// of 100 differently seeded runs spread over the upper half of each step (before,
    /// every CLI waited exactly 1, 2, 4, 8, 8 … s).
    #[test]
    fn retries_of_a_busy_function_are_jittered_and_bounded() {
        for refused in 1..=8u32 {
            let waits: std::collections::BTreeSet<Duration> = (0..100)
                .map(|seed| busy_wait(refused, &mut fastrand::Rng::with_seed(seed)))
                .collect();
            let ceiling = Duration::from_secs(1 << (refused - 1).min(3));
            assert!(
                waits
                    .iter()
                    .all(|w| *w <= ceiling && *w >= (ceiling / 2).max(Duration::from_secs(1))),
                "{refused}: {waits:?}"
            );
            if refused > 1 {
                assert!(
                    waits.len() > 50,
                    "{refused}: only {} distinct waits",
                    waits.len()
                );
            }
        }
    }
}
