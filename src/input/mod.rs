//! Parsing what invokes the functions: pure, total (never panics on any bytes), and strict
//! where a lenient reading could do harm.

mod eventbridge;
pub mod pod_event;
pub mod resync;

#[cfg(test)]
mod fuzz_tests;

use thiserror::Error;

/// Input that cannot be acted on. The message says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InputError {
    /// Not JSON, or not the expected shape.
    #[error("unrecognised input: {0}")]
    Malformed(String),
}
