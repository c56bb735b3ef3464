//! What can go wrong, each with what to do about it.

use thiserror::Error;

/// A failure of the command; printed as `tgsync: <message>`, exit code 1.
#[derive(Debug, Error)]
pub enum CliError {
    /// A setting the command needs is not given.
    #[error(
        "{flag} is not set (or {variable}); give the deployment's value (the stack's outputs have it)"
    )]
    Missing {
        /// The flag.
        flag: &'static str,
        /// The environment variable that can stand for it.
        variable: &'static str,
    },
    /// A setting is not valid (names the variable).
    #[error(transparent)]
    Config(#[from] tgsync::config::ConfigError),
    /// The adapters could not be set up (region, credentials, CA file).
    #[error(transparent)]
    App(#[from] tgsync::app::AppError),
    /// A target group named on the command line does not exist.
    #[error(
        "no target group named `{0}` in this account and region; give its ARN (groups of other accounts are named by ARN)"
    )]
    NoSuchGroup(String),
    /// An ELBv2 read failed.
    #[error(transparent)]
    Elb(#[from] tgsync::groups::ElbError),
    /// The Invoke call failed (permissions, endpoint, function name).
    #[error("invoking {function} failed: {message}")]
    Invoke {
        /// The function (and qualifier) invoked.
        function: String,
        /// What the Lambda API said.
        message: String,
    },
    /// Every attempt found the manual function's slots busy.
    #[error(
        "{function} stayed busy for {waited} s (another manual run holds its slot: Lambda answered 429 TooManyRequestsException); try again, or raise --wait"
    )]
    Busy {
        /// The function.
        function: String,
        /// Seconds spent retrying.
        waited: u64,
    },
    /// The function ran and failed, or refused the request.
    #[error("{function} failed: {message}")]
    Function {
        /// The function (and qualifier) invoked.
        function: String,
        /// Its error message.
        message: String,
    },
    /// The answer was not a report.
    #[error("{function} answered something that is not a report: {message}")]
    Answer {
        /// The function.
        function: String,
        /// Why it could not be read.
        message: String,
    },
    /// Reading the confirmation failed.
    #[error("reading the confirmation failed: {0}")]
    Io(#[from] std::io::Error),
    /// JSON output failed (never expected).
    #[error("JSON output failed: {0}")]
    Json(#[from] serde_json::Error),
}
