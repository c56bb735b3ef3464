//! Log setup for both functions: Lambda's conventions (`AWS_LAMBDA_LOG_LEVEL`, else
//! `RUST_LOG`; JSON lines when `AWS_LAMBDA_LOG_FORMAT=JSON`), plus one guard: at TRACE,
//! `aws_sigv4` logs every canonical request and `aws_smithy_runtime` every request's
//! headers, session token included, so both are held at DEBUG whatever level is asked
//! for. Credentials and tokens never reach a
//! log line, even at TRACE (`tests/secrets.rs` checks it).

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{Directive, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;

/// Targets that log secrets at TRACE, and are therefore capped at DEBUG.
const CAPPED: [&str; 2] = ["aws_sigv4=debug", "aws_smithy_runtime=debug"];

/// The filter for a level or directive string (`debug`, `tgsync=debug,kube=info`).
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
    let mut filter = match spec.parse::<LevelFilter>() {
        Ok(level) => EnvFilter::default().add_directive(level.into()),
        Err(_) => EnvFilter::builder()
            .with_default_directive(LevelFilter::INFO.into())
            .parse_lossy(spec),
    };
    for capped in CAPPED {
        if let Ok(d) = capped.parse::<Directive>() {
            filter = filter.add_directive(d);
        }
    }
    filter
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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(spec))
        .with_writer(writer)
        .with_target(false);
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .without_time()
            .try_init()
    } else {
        builder.without_time().with_ansi(false).try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_directives_both_work_and_sigv4_stays_capped() {
        for spec in [
            "trace",
            "TRACE",
            "debug",
            "tgsync=trace,kube=debug",
            "aws_sigv4=trace",
        ] {
            let f = filter(Some(spec)).to_string();
            assert!(
                f.contains("aws_sigv4=debug") && f.contains("aws_smithy_runtime=debug"),
                "{spec}: {f}"
            );
        }
        assert!(filter(Some("debug")).to_string().contains("debug"));
        let fatal = filter(Some("FATAL")).to_string();
        assert!(fatal.to_ascii_lowercase().contains("error"), "{fatal}");
        assert!(filter(None).to_string().contains("info"));
        assert!(
            filter(Some("tgsync=trace"))
                .to_string()
                .contains("tgsync=trace")
        );
    }
}
