//! Kubernetes `Status` error bodies, built the way the apiserver builds them
//! (`k8s.io/apimachinery/pkg/api/errors`), so clients see the same reasons,
//! codes, messages and details as from a real cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    ListMeta, Status, StatusCause, StatusDetails,
};

/// The message the apiserver sends when a continue token refers to a
/// compacted snapshot (`storage/etcd3` `inconsistentContinue`).
pub const EXPIRED_CONTINUE_MESSAGE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// An API error: everything needed to answer with a `Status` body.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Box<StatusDetails>>,
    /// `metadata.continue` of the Status (set on 410 for an expired continue token).
    pub list_continue: Option<String>,
    /// Seconds for the `Retry-After` header and `details.retryAfterSeconds`.
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            list_continue: None,
            retry_after: None,
        }
    }

    fn pod_details(name: &str) -> Box<StatusDetails> {
        Box::new(StatusDetails {
            name: Some(name.to_owned()),
            kind: Some("pods".to_owned()),
            ..StatusDetails::default()
        })
    }

    /// 400 BadRequest (`errors.NewBadRequest`).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized, exactly as the authentication filter answers.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 404 for a pod that does not exist (`errors.NewNotFound`).
    pub fn pod_not_found(name: &str) -> Self {
        Self {
            details: Some(Self::pod_details(name)),
            ..Self::new(404, "NotFound", format!("pods \"{name}\" not found"))
        }
    }

    /// 404 for a node that does not exist, as the apiserver words it.
    pub fn node_not_found(name: &str) -> Self {
        Self {
            details: Some(Box::new(StatusDetails {
                name: Some(name.to_owned()),
                kind: Some("nodes".to_owned()),
                ..StatusDetails::default()
            })),
            ..Self::new(404, "NotFound", format!("nodes \"{name}\" not found"))
        }
    }

    /// 404 for a path that no handler serves.
    pub fn path_not_found() -> Self {
        Self {
            details: Some(Box::default()),
            ..Self::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        }
    }

    /// 405 for a known path with a verb it does not support.
    pub fn method_not_allowed() -> Self {
        Self {
            details: Some(Box::default()),
            ..Self::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        }
    }

    /// 409 AlreadyExists (`errors.NewAlreadyExists`).
    pub fn already_exists(name: &str) -> Self {
        Self {
            details: Some(Self::pod_details(name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("pods \"{name}\" already exists"),
            )
        }
    }

    /// 409 Conflict for a stale `metadata.resourceVersion` (`errors.NewConflict`
    /// wrapping `registry.OptimisticLockErrorMsg`).
    pub fn conflict(name: &str) -> Self {
        Self::conflict_with(
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 Conflict with a custom cause (failed delete preconditions).
    pub fn conflict_with(name: &str, cause: &str) -> Self {
        Self {
            details: Some(Self::pod_details(name)),
            ..Self::new(
                409,
                "Conflict",
                format!("Operation cannot be fulfilled on pods \"{name}\": {cause}"),
            )
        }
    }

    /// 410 Expired for a continue token whose snapshot is gone; `new_token`
    /// continues from the same key at the latest resourceVersion.
    pub fn continue_expired(new_token: Option<String>) -> Self {
        Self {
            list_continue: new_token,
            ..Self::new(410, "Expired", EXPIRED_CONTINUE_MESSAGE)
        }
    }

    /// 410 Expired for a watch from a resourceVersion older than the
    /// retained history (`watch_cache.go` `getAllEventsSinceLocked`), sent as
    /// the object of an ERROR watch event.
    pub fn watch_expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 409 Conflict as `rest.BeforeDelete` words a failed delete
    /// precondition: it qualifies the resource by its kind (`Pod`).
    pub fn delete_precondition_failed(name: &str, cause: &str) -> Self {
        Self {
            details: Some(Box::new(StatusDetails {
                name: Some(name.to_owned()),
                kind: Some("Pod".to_owned()),
                ..StatusDetails::default()
            })),
            ..Self::new(
                409,
                "Conflict",
                format!("Operation cannot be fulfilled on Pod \"{name}\": {cause}"),
            )
        }
    }

    /// 410 Expired for an exact-resourceVersion list of a compacted revision.
    pub fn resource_version_expired() -> Self {
        Self::new(
            410,
            "Expired",
            "The resourceVersion for the provided list is too old.",
        )
    }

    /// 413 for a body over the apiserver's request size limit.
    pub fn too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "the request body is too large",
        )
    }

    /// 415 for a PATCH with a content type the server cannot apply.
    pub fn unsupported_patch_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// 422 Invalid (`errors.NewInvalid`) with one cause per field error.
    pub fn invalid(name: &str, causes: Vec<(String, String)>) -> Self {
        let summary = causes
            .iter()
            .map(|(field, msg)| format!("{field}: {msg}"))
            .collect::<Vec<_>>();
        let message = if summary.len() == 1 {
            format!("Pod \"{name}\" is invalid: {}", summary.join(""))
        } else {
            format!("Pod \"{name}\" is invalid: [{}]", summary.join(", "))
        };
        let causes = causes
            .into_iter()
            .map(|(field, msg)| StatusCause {
                field: Some(field),
                message: Some(msg),
                reason: Some("FieldValueInvalid".to_owned()),
            })
            .collect();
        Self {
            details: Some(Box::new(StatusDetails {
                causes: Some(causes),
                ..*Self::pod_details(name)
            })),
            ..Self::new(422, "Invalid", message)
        }
    }

    /// 504 for a list at a resourceVersion newer than the store's
    /// (`storage.NewTooLargeResourceVersionError`).
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        Self {
            details: Some(Box::new(StatusDetails {
                causes: Some(vec![StatusCause {
                    message: Some(format!(
                        "Too large resource version: {requested}, current: {current}"
                    )),
                    reason: Some("ResourceVersionTooLarge".to_owned()),
                    field: None,
                }]),
                retry_after_seconds: Some(1),
                ..StatusDetails::default()
            })),
            retry_after: Some(1),
            ..Self::new(
                504,
                "Timeout",
                format!("Too large resource version: {requested}, current: {current}"),
            )
        }
    }

    /// 500 InternalError for a failure inside the emulator itself.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// An error with an arbitrary status code, shaped like
    /// `errors.NewGenericServerResponse` (used for injected faults).
    pub fn generic(code: u16) -> Self {
        let (reason, message): (&'static str, &str) = match code {
            400 => (
                "BadRequest",
                "the server rejected our request for an unknown reason",
            ),
            401 => ("Unauthorized", "Unauthorized"),
            403 => ("Forbidden", "forbidden"),
            404 => (
                "NotFound",
                "the server could not find the requested resource",
            ),
            405 => (
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ),
            409 => ("Conflict", "the server reported a conflict"),
            410 => ("Expired", "the resource has expired"),
            413 => ("RequestEntityTooLarge", "the request body is too large"),
            415 => (
                "UnsupportedMediaType",
                "the server does not support the media type of the request",
            ),
            422 => (
                "Invalid",
                "the server rejected our request due to an error in our request",
            ),
            429 => (
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
            ),
            500 => (
                "InternalError",
                "an error on the server (\"\") has prevented the request from succeeding",
            ),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            504 => (
                "Timeout",
                "the server was unable to return a response in the time allotted, but may still be processing the request",
            ),
            _ => ("", "the server responded with an unexpected status code"),
        };
        let retry_after = matches!(code, 429 | 503 | 504).then_some(1);
        Self {
            details: retry_after.map(|s| {
                Box::new(StatusDetails {
                    retry_after_seconds: i32::try_from(s).ok(),
                    ..StatusDetails::default()
                })
            }),
            retry_after,
            ..Self::new(code, reason, message)
        }
    }

    /// The `Status` object sent as the response body.
    pub fn to_status(&self) -> Status {
        Status {
            code: Some(i32::from(self.code)),
            details: self.details.as_deref().cloned(),
            message: Some(self.message.clone()),
            metadata: ListMeta {
                continue_: self.list_continue.clone(),
                ..ListMeta::default()
            },
            reason: (!self.reason.is_empty()).then(|| self.reason.to_owned()),
            status: Some("Failure".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_apiserver_body() {
        let body = serde_json::to_value(ApiError::pod_not_found("web-1").to_status()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "pods \"web-1\" not found", "reason": "NotFound",
                "details": {"name": "web-1", "kind": "pods"}, "code": 404
            })
        );
    }

    #[test]
    fn unauthorized_matches_apiserver_body() {
        let body = serde_json::to_value(ApiError::unauthorized().to_status()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Unauthorized", "reason": "Unauthorized", "code": 401
            })
        );
    }
}
