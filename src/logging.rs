//! Log setup for every function: Lambda's conventions (`AWS_LAMBDA_LOG_LEVEL`, else
//! `RUST_LOG`; JSON lines when `AWS_LAMBDA_LOG_FORMAT=JSON`), plus one guard.
//!
//! **The guard.** At TRACE, `aws_sigv4` logs every canonical request and
//! `aws_smithy_runtime` every request's headers, session token included. Their TRACE
//! events are therefore dropped whatever level or directives are asked for: they never
//! go above DEBUG. The guard is a second filter that an event must pass *as well as*
//! the requested one, so it can only take events away — it never turns on a level the
//! operator did not ask for (`info` stays INFO for the SDK too: a quiet run writes one
//! line, not hundreds of SDK DEBUG lines). Credentials and tokens never reach a log
//! line, even at TRACE (`tests/secrets.rs` checks it).
//!
//! **JSON lines for Lambda.** With JSON logs and an application log level, Lambda drops
//! lines whose `level` is below the configured one, and treats a line without a valid
//! `level`, or without an RFC 3339 `timestamp`, as INFO. So every JSON line carries both:
//! `timestamp` (RFC 3339, UTC) and `level` in the upper case Lambda recognises (`TRACE`,
//! `DEBUG`, `INFO`, `WARN`, `ERROR`; `FATAL` exists only for the metric lines, see
//! [`crate::metrics`]).

use std::fmt;

use tracing::{Level, Metadata};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Filter, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// Targets (and every target they prefix, like tracing's own directives) that log
/// secrets at TRACE, and are therefore never logged above DEBUG.
pub const CAPPED: [&str; 2] = ["aws_sigv4", "aws_smithy_runtime"];

/// The log levels Lambda's advanced logging controls know, least to most severe. Used
/// to read `AWS_LAMBDA_LOG_LEVEL` (what Lambda filters on) and to label metric lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LambdaLevel {
    /// Most detail.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation; Lambda's default, and what a line without a level counts as.
    Info,
    /// Possible problems.
    Warn,
    /// Problems.
    Error,
    /// Least detail: only fatal errors.
    Fatal,
}

impl LambdaLevel {
    /// Parses a Lambda level name, any case (`WARN`, `warn`); `None` for anything else,
    /// including tracing directive strings such as `tgsync=debug`.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        [
            Self::Trace,
            Self::Debug,
            Self::Info,
            Self::Warn,
            Self::Error,
            Self::Fatal,
        ]
        .into_iter()
        .find(|l| l.as_str().eq_ignore_ascii_case(s))
    }

    /// The level as Lambda writes and recognises it (upper case).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trace => "TRACE",
            Self::Debug => "DEBUG",
            Self::Info => "INFO",
            Self::Warn => "WARN",
            Self::Error => "ERROR",
            Self::Fatal => "FATAL",
        }
    }

    /// The application log level Lambda filters this function's lines at
    /// (`AWS_LAMBDA_LOG_LEVEL`, set from the template's `LogLevel`), if one is set.
    pub fn configured() -> Option<Self> {
        std::env::var("AWS_LAMBDA_LOG_LEVEL")
            .ok()
            .and_then(|v| Self::parse(&v))
    }
}

impl fmt::Display for LambdaLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The requested filter for a level or directive string (`debug`,
/// `tgsync=debug,kube=info`); default INFO. Exactly what was asked for: the secret guard
/// ([`SecretGuard`]) is applied on top of it by [`init_with`].
pub fn filter(spec: Option<&str>) -> EnvFilter {
    let spec = spec
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("info");
    // Lambda's log levels include FATAL, which tracing does not have.
    let spec = if spec.eq_ignore_ascii_case("fatal") {
        "error"
    } else {
        spec
    };
    match spec.parse::<LevelFilter>() {
        Ok(level) => EnvFilter::default().add_directive(level.into()),
        Err(_) => EnvFilter::builder()
            .with_default_directive(LevelFilter::INFO.into())
            .parse_lossy(spec),
    }
}

/// Drops TRACE events and spans of the [`CAPPED`] targets, and nothing else. Combined
/// with the requested filter as "both must allow", so it can lower a level but never
/// raise one, and no directive (a bare `trace`, `aws_sigv4=trace`, a more specific
/// `aws_smithy_runtime::client=trace`, or a span filter like `[invoke]=trace`) gets past
/// it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SecretGuard;

impl SecretGuard {
    /// Whether a callsite may be logged: anything but TRACE of a capped target.
    pub fn allows(meta: &Metadata<'_>) -> bool {
        *meta.level() != Level::TRACE || !is_capped(meta.target())
    }
}

/// Whether `target` is one of [`CAPPED`] or starts with one (tracing matches directive
/// targets by prefix, so this covers the same targets a `aws_sigv4=...` directive does).
pub fn is_capped(target: &str) -> bool {
    CAPPED.iter().any(|c| target.starts_with(c))
}

impl<S> Filter<S> for SecretGuard {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        Self::allows(meta)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        if Self::allows(meta) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    /// No limit of its own (TRACE), so combined with the requested filter the hint is
    /// the requested one, and disabled levels stay cheap.
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }
}

/// Installs the global subscriber writing to stdout (where Lambda collects logs).
pub fn init() {
    let spec = std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok();
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    init_with(spec.as_deref(), json, std::io::stdout);
}

/// Installs the global subscriber with an explicit level/directives, format and writer
/// (tests capture logs this way). Does nothing if one is installed already.
pub fn init_with<W>(spec: Option<&str>, json: bool, writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::filter::FilterExt::and(filter(spec), SecretGuard);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_target(false);
    let layer = if json {
        // `timestamp` (RFC 3339, UTC, microseconds) and `level` (upper case) on every
        // line: without a valid timestamp Lambda would count the line as INFO whatever
        // its level, and filter it as such.
        layer
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_filter(filter)
            .boxed()
    } else {
        // Text lines: Lambda adds its own timestamp to each line.
        layer
            .without_time()
            .with_ansi(false)
            .with_filter(filter)
            .boxed()
    };
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// `ms` (milliseconds since the Unix epoch) as an RFC 3339 UTC timestamp with
/// milliseconds, `2027-01-15T08:00:00.250Z`: the form Lambda accepts in a JSON line's
/// `timestamp`. Infallible for every `u64`, so a metric line always has one: a time past
/// the year 9999 is written as its last millisecond. (The calendar arithmetic is jiff's,
/// on civil UTC time, whose range covers all of year 9999.)
pub fn rfc3339(ms: u64) -> String {
    const EPOCH: jiff::civil::DateTime = jiff::civil::DateTime::constant(1970, 1, 1, 0, 0, 0, 0);
    let at = i64::try_from(ms)
        .ok()
        .and_then(|ms| {
            EPOCH
                .checked_add(jiff::SignedDuration::from_millis(ms))
                .ok()
        })
        .unwrap_or(jiff::civil::DateTime::MAX);
    at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// One event per (target, level) this test cares about; the message names both.
    /// Targets must be literals (callsite metadata is static), hence the macro.
    macro_rules! emit_all {
        ($($target:literal),*) => {$(
            tracing::event!(target: $target, Level::TRACE, "{} TRACE", $target);
            tracing::event!(target: $target, Level::DEBUG, "{} DEBUG", $target);
            tracing::event!(target: $target, Level::INFO, "{} INFO", $target);
            tracing::event!(target: $target, Level::WARN, "{} WARN", $target);
            tracing::event!(target: $target, Level::ERROR, "{} ERROR", $target);
        )*};
    }

    const TARGETS: [&str; 6] = [
        "tgsync::reconcile",
        "aws_sigv4::http_request::sign",
        "aws_smithy_runtime::client::orchestrator",
        "aws_smithy_runtime_api::http::headers",
        "aws_config::default_provider",
        "kube_client::client",
    ];

    fn emit() {
        emit_all!(
            "tgsync::reconcile",
            "aws_sigv4::http_request::sign",
            "aws_smithy_runtime::client::orchestrator",
            "aws_smithy_runtime_api::http::headers",
            "aws_config::default_provider",
            "kube_client::client"
        );
        // An event inside a span, for span-scoped directives.
        let span = tracing::span!(target: "aws_smithy_runtime::client", Level::DEBUG, "invoke");
        let _g = span.enter();
        tracing::event!(target: "aws_smithy_runtime::client::orchestrator", Level::TRACE, "aws_smithy_runtime::client::orchestrator TRACE in span");
    }

    /// The (target, level) pairs that reach the writer, with `filter` as given.
    fn logged(
        layer_filter: impl Filter<tracing_subscriber::Registry> + Send + Sync + 'static,
    ) -> Vec<String> {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .without_time()
                .with_target(false)
                .with_level(false)
                .with_filter(layer_filter),
        );
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| l.rsplit(": ").next().unwrap_or(l).trim().to_owned())
            .collect()
    }

    fn requested(spec: &str) -> Vec<String> {
        logged(filter(Some(spec)))
    }

    fn effective(spec: &str) -> Vec<String> {
        logged(tracing_subscriber::filter::FilterExt::and(
            filter(Some(spec)),
            SecretGuard,
        ))
    }

    fn has(lines: &[String], target: &str, level: &str) -> bool {
        lines
            .iter()
            .any(|l| l.starts_with(&format!("{target} {level}")))
    }

    const SPECS: [&str; 14] = [
        "trace",
        "TRACE",
        "debug",
        "info",
        "INFO",
        "warn",
        "WARN",
        "error",
        "FATAL",
        "tgsync=trace",
        "tgsync=trace,info",
        "aws_sigv4=trace",
        "aws=trace,tgsync=debug",
        "aws_smithy_runtime::client=trace,[invoke]=trace",
    ];

    /// The guard only ever removes: every line that gets through was requested, and the
    /// only requested lines it removes are TRACE lines of the capped targets.
    #[test]
    fn the_guard_only_lowers_and_only_capped_trace() {
        for spec in SPECS {
            let requested = requested(spec);
            let effective = effective(spec);
            for line in &effective {
                assert!(requested.contains(line), "{spec}: {line} was not requested");
                assert!(
                    !(line.contains("TRACE") && CAPPED.iter().any(|c| line.starts_with(c))),
                    "{spec}: a capped target logged at TRACE: {line}"
                );
            }
            for line in &requested {
                let dropped = !effective.contains(line);
                let capped_trace =
                    line.contains("TRACE") && CAPPED.iter().any(|c| line.starts_with(c));
                assert_eq!(dropped, capped_trace, "{spec}: {line}");
            }
        }
    }

    #[test]
    fn info_means_info_for_every_target() {
        for spec in ["info", "INFO"] {
            let lines = effective(spec);
            for target in TARGETS {
                assert!(!has(&lines, target, "DEBUG"), "{spec}: {target} DEBUG");
                assert!(has(&lines, target, "INFO"), "{spec}: {target} INFO");
            }
        }
        // The default is INFO too.
        let lines = logged(tracing_subscriber::filter::FilterExt::and(
            filter(None),
            SecretGuard,
        ));
        assert!(!has(
            &lines,
            "aws_smithy_runtime::client::orchestrator",
            "DEBUG"
        ));
        assert!(has(&lines, "tgsync::reconcile", "INFO"));
    }

    #[test]
    fn each_level_and_directive_means_what_it_says() {
        let warn = effective("warn");
        for target in TARGETS {
            assert!(
                !has(&warn, target, "INFO") && has(&warn, target, "WARN"),
                "warn: {target}"
            );
        }
        let debug = effective("debug");
        for target in TARGETS {
            assert!(
                has(&debug, target, "DEBUG") && !has(&debug, target, "TRACE"),
                "debug: {target}"
            );
        }
        // TRACE everywhere, except the capped targets, which stop at DEBUG.
        let trace = effective("trace");
        for target in TARGETS {
            let capped = is_capped(target);
            assert_eq!(has(&trace, target, "TRACE"), !capped, "trace: {target}");
            assert!(has(&trace, target, "DEBUG"), "trace: {target}");
        }
        // Directives name what is logged (RUST_LOG's meaning: other targets are off);
        // the guard adds nothing for the SDK, which used to get DEBUG here.
        let tgsync = effective("tgsync=trace");
        assert!(has(&tgsync, "tgsync::reconcile", "TRACE"));
        assert!(!has(&tgsync, "aws_sigv4::http_request::sign", "ERROR"));
        assert!(!has(
            &tgsync,
            "aws_smithy_runtime::client::orchestrator",
            "DEBUG"
        ));
        let mixed = effective("tgsync=trace,info");
        assert!(has(&mixed, "tgsync::reconcile", "TRACE"));
        assert!(has(&mixed, "aws_sigv4::http_request::sign", "INFO"));
        assert!(!has(&mixed, "aws_sigv4::http_request::sign", "DEBUG"));
        // Asking for the capped crate at TRACE gives it DEBUG, and everything else INFO.
        let sigv4 = effective("aws_sigv4=trace");
        assert!(has(&sigv4, "aws_sigv4::http_request::sign", "DEBUG"));
        assert!(!has(&sigv4, "aws_sigv4::http_request::sign", "TRACE"));
        assert!(!has(&sigv4, "tgsync::reconcile", "DEBUG"));
        // FATAL (Lambda's) is ERROR (tracing's).
        let fatal = effective("FATAL");
        assert!(
            has(&fatal, "tgsync::reconcile", "ERROR") && !has(&fatal, "tgsync::reconcile", "WARN")
        );
        // A span directive cannot lift a capped target to TRACE either.
        let span = effective("aws_smithy_runtime::client=trace,[invoke]=trace");
        assert!(
            !span.iter().any(|l| l.contains("TRACE in span")),
            "{span:?}"
        );
        assert!(
            requested("aws_smithy_runtime::client=trace,[invoke]=trace")
                .iter()
                .any(|l| l.contains("TRACE in span"))
        );
    }

    #[test]
    fn lambda_levels_parse_in_any_case() {
        assert_eq!(LambdaLevel::parse("warn"), Some(LambdaLevel::Warn));
        assert_eq!(LambdaLevel::parse(" FATAL "), Some(LambdaLevel::Fatal));
        assert_eq!(LambdaLevel::parse("tgsync=debug"), None);
        assert!(LambdaLevel::Warn > LambdaLevel::Info);
        assert_eq!(LambdaLevel::Error.to_string(), "ERROR");
    }

    #[test]
    fn rfc3339_is_exact() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_800_000_000_250), "2027-01-15T08:00:00.250Z");
        assert_eq!(rfc3339(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59.999Z");
        // Every millisecond value round-trips through an RFC 3339 parser.
        for ms in [1u64, 86_399_999, 1_709_164_800_123, 253_402_300_799_999] {
            let s = rfc3339(ms);
            let parsed = aws_smithy_types::DateTime::from_str(
                &s,
                aws_smithy_types::date_time::Format::DateTime,
            )
            .unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(parsed.to_millis().unwrap(), ms as i64, "{s}");
        }
    }
}
