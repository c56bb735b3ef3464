//! One line for an AWS SDK error, as an operator reads it: the service's error code and
//! message with the request ID to quote to AWS Support, or what went wrong before an
//! answer came (no credentials, a timeout, an endpoint out of reach) — each the chain of
//! `Display` messages, never the SDK's `Debug` dump of the raw response (HTTP headers,
//! the body's bytes) that `DisplayErrorContext` appends.

use std::any::Any;
use std::error::Error;
use std::fmt::Debug;

use aws_sdk_dynamodb::operation::RequestId as _;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

/// `Code: message (request ID …)` for a service's answer; for a failure before one, what
/// kind it was and the chain of messages (see the module docs).
pub fn error_line<E, R>(err: &SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + Error + 'static,
    R: Debug + 'static,
{
    // The SDK's deserializers keep the request ID in the error's metadata.
    let request = ProvideErrorMetadata::meta(err)
        .request_id()
        .map(|id| format!(" (request ID {id})"))
        .unwrap_or_default();
    let status = |raw: &R| {
        (raw as &dyn Any)
            .downcast_ref::<HttpResponse>()
            .map(|r| format!("HTTP {}", r.status().as_u16()))
            .unwrap_or_else(|| "an answer".to_owned())
    };
    match err {
        SdkError::ServiceError(service) => match (err.code(), err.message()) {
            (Some(code), Some(message)) if !message.is_empty() => {
                format!("{code}: {message}{request}")
            }
            (Some(code), _) => format!("{code}{request}"),
            _ => format!(
                "{} with no error code: {}{request}",
                status(service.raw()),
                chain(service.err())
            ),
        },
        SdkError::ResponseError(response) => format!(
            "{} that could not be read: {}{request}",
            status(response.raw()),
            chain(err)
        ),
        SdkError::TimeoutError(_) => format!("timed out: {}", chain(err)),
        _ => match super::credentials_failure(err) {
            Some(credentials) => format!("no credentials: {credentials}"),
            None if matches!(err, SdkError::DispatchFailure(_)) => {
                format!("the request was not sent: {}", chain(err))
            }
            None => format!("the request could not be made: {}", chain(err)),
        },
    }
}

/// The parts of an AWS SDK error an operator may be asked for (the CLI's `--verbose`),
/// one `(name, value)` each, those it has: what kind of failure, the service's error
/// code and message, the request ID, the HTTP status, and the chain of causes of a
/// failure before an answer. Never the SDK's `Debug` dump.
pub fn error_fields<E, R>(err: &SdkError<E, R>) -> Vec<(&'static str, String)>
where
    E: ProvideErrorMetadata + Error + 'static,
    R: Debug + 'static,
{
    let status = |raw: &R| {
        (raw as &dyn Any)
            .downcast_ref::<HttpResponse>()
            .map(|r| r.status().as_u16().to_string())
    };
    let (kind, status, cause) = match err {
        SdkError::ServiceError(service) => (
            "the service answered with an error",
            status(service.raw()),
            err.code().is_none().then(|| chain(service.err())),
        ),
        SdkError::ResponseError(response) => (
            "an answer that could not be read",
            status(response.raw()),
            Some(chain(err)),
        ),
        SdkError::TimeoutError(_) => ("timed out", None, Some(chain(err))),
        _ => match super::credentials_failure(err) {
            Some(credentials) => ("no credentials", None, Some(credentials.to_string())),
            None if matches!(err, SdkError::DispatchFailure(_)) => {
                ("the request was not sent", None, Some(chain(err)))
            }
            None => ("the request could not be made", None, Some(chain(err))),
        },
    };
    let meta = ProvideErrorMetadata::meta(err);
    [
        Some(("kind", kind.to_owned())),
        meta.code().map(|c| ("code", c.to_owned())),
        meta.message()
            .filter(|m| !m.is_empty())
            .map(|m| ("message", m.to_owned())),
        meta.request_id().map(|id| ("request ID", id.to_owned())),
        status.map(|s| ("HTTP status", s)),
        cause.filter(|c| !c.is_empty()).map(|c| ("cause", c)),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// [`error_fields`] as `name: value` lines.
pub fn error_detail<E, R>(err: &SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + Error + 'static,
    R: Debug + 'static,
{
    error_fields(err)
        .into_iter()
        .map(|(name, value)| format!("{name}: {value}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The messages of `err` and its sources, joined by `: `, each once (an SDK error's
/// `Display` often repeats its source's).
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut messages: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let message = e.to_string();
        if !message.is_empty() && !messages.iter().any(|m| m.contains(&message)) {
            messages.push(message);
        }
        next = e.source();
    }
    messages.join(": ")
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::operation::get_item::GetItemError;
    use aws_smithy_runtime_api::client::result::{ConnectorError, SdkError};
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::error::ErrorMetadata;

    use super::*;

    fn response(status: u16) -> HttpResponse {
        let mut r = HttpResponse::new(
            StatusCode::try_from(status).expect("a status"),
            SdkBody::from("{\"__type\":\"x\",\"padding\":\"".to_owned() + &"x".repeat(500) + "\"}"),
        );
        r.headers_mut()
            .insert("x-amzn-requestid", "REQ-123".to_owned());
        r.headers_mut().insert("x-amz-crc32", "12345".to_owned());
        r
    }

    fn service(meta: ErrorMetadata, status: u16) -> SdkError<GetItemError, HttpResponse> {
        SdkError::service_error(GetItemError::generic(meta), response(status))
    }

    /// No line carries the SDK's debug dump: no headers, no body, no struct names.
    fn plain(line: &str) {
        for noise in [
            "SdkBody",
            "x-amz-crc32",
            "padding",
            "Response {",
            "ErrorMetadata",
            "headers",
        ] {
            assert!(!line.contains(noise), "`{noise}` in `{line}`");
        }
        assert!(line.len() < 300, "{} characters: {line}", line.len());
    }

    #[test]
    fn a_service_error_is_its_code_message_and_request_id() {
        let err = service(
            ErrorMetadata::builder()
                .code("ResourceNotFoundException")
                .message("No cluster found for name: prod.")
                .custom("aws_request_id", "REQ-123")
                .build(),
            404,
        );
        let line = error_line(&err);
        assert_eq!(
            line,
            "ResourceNotFoundException: No cluster found for name: prod. (request ID REQ-123)"
        );
        plain(&line);
        assert_eq!(
            error_detail(&err),
            "kind: the service answered with an error\ncode: ResourceNotFoundException\nmessage: No cluster found for name: prod.\nrequest ID: REQ-123\nHTTP status: 404"
        );
    }

    #[test]
    fn a_service_error_without_a_code_says_its_status() {
        let err = service(
            ErrorMetadata::builder()
                .custom("aws_request_id", "REQ-123")
                .build(),
            502,
        );
        let line = error_line(&err);
        assert!(line.starts_with("HTTP 502 with no error code"), "{line}");
        assert!(line.ends_with("(request ID REQ-123)"), "{line}");
        plain(&line);
        let fields = error_fields(&err);
        assert!(
            fields.contains(&("HTTP status", "502".to_owned())),
            "{fields:?}"
        );
        assert!(
            fields.contains(&("request ID", "REQ-123".to_owned())),
            "{fields:?}"
        );
        assert!(fields.iter().any(|(n, _)| *n == "cause"), "{fields:?}");
        plain(&error_detail(&err));
    }

    #[test]
    fn a_timeout_says_so() {
        let err: SdkError<GetItemError, HttpResponse> = SdkError::timeout_error(
            "operation timeout (all attempts including retries) occurred after 40s",
        );
        let line = error_line(&err);
        assert!(line.starts_with("timed out: "), "{line}");
        assert!(line.contains("after 40s"), "{line}");
        plain(&line);
        let detail = error_detail(&err);
        assert!(detail.starts_with("kind: timed out\ncause: "), "{detail}");
        assert!(detail.contains("after 40s"), "{detail}");
    }

    #[test]
    fn a_dispatch_failure_says_the_request_was_not_sent() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let err: SdkError<GetItemError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io(Box::new(io)));
        let line = error_line(&err);
        assert!(line.starts_with("the request was not sent: "), "{line}");
        assert!(line.contains("connection refused"), "{line}");
        plain(&line);
        let detail = error_detail(&err);
        assert!(
            detail.starts_with("kind: the request was not sent\ncause: "),
            "{detail}"
        );
        plain(&detail);
    }

    #[test]
    fn missing_credentials_say_so() {
        let credentials = aws_credential_types::provider::error::CredentialsError::not_loaded(
            "no providers in chain provided credentials",
        );
        let err: SdkError<GetItemError, HttpResponse> = SdkError::construction_failure(credentials);
        let line = error_line(&err);
        assert!(line.starts_with("no credentials: "), "{line}");
        assert!(line.contains("no providers in chain"), "{line}");
        plain(&line);
        let detail = error_detail(&err);
        assert!(
            detail.starts_with("kind: no credentials\ncause: "),
            "{detail}"
        );
        assert!(detail.contains("no providers in chain"), "{detail}");
    }
}
