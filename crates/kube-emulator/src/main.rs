//! `kube-emulator`: runs the Kubernetes API emulator for the local sandbox.
//! Prints the base URL on one stdout line once it accepts connections, then
//! serves until SIGTERM or Ctrl-C. Logs go to stderr.

use std::io::{IsTerminal as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube_emulator::{
    EXAMPLE_ACCESS_KEY_ID, EXAMPLE_SECRET_ACCESS_KEY, Emulator, EmulatorConfig, Store,
};
use serde_json::Value;

const HELP: &str = "\
kube-emulator: local Kubernetes API server emulator (pods), verifying EKS tokens

USAGE: kube-emulator [OPTIONS]

OPTIONS (each also read from the environment variable shown; flags win):
  --port N                   port to listen on, 0 = any free port   [KUBE_EMULATOR_PORT, default 0]
  --address IP               address to listen on                   [KUBE_EMULATOR_ADDRESS, default 127.0.0.1]
  --cluster-name NAME        cluster name tokens must sign           [KUBE_EMULATOR_CLUSTER_NAME, default kube-emulator]
  --tls | --no-tls           serve HTTPS with a fresh CA, or HTTP    [KUBE_EMULATOR_TLS=true|false, default true]
  --credentials AKID:SECRET  accepted signing key (repeatable)       [KUBE_EMULATOR_CREDENTIALS, comma-separated]
                             default: the AWS example key pair, plus
                             AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY when set
  --allowed-sts-host HOST    STS host[:port] tokens may name (repeatable)
                                                                     [KUBE_EMULATOR_ALLOWED_STS_HOSTS, comma-separated]
                             default: sts.amazonaws.com, sts.REGION.amazonaws.com
  --region REGION            AWS region                              [KUBE_EMULATOR_REGION, then AWS_REGION, default us-east-1]
  --ca-out PATH              write the CA certificate (PEM) here     [KUBE_EMULATOR_CA_OUT]
  --seed FILE                preload pods: a JSON PodList, array of Pods or one Pod
                                                                     [KUBE_EMULATOR_SEED]
  --graceful-delete | --no-graceful-delete
                             DELETE marks scheduled pods terminating
                             (grace period) instead of removing them
                                                                     [KUBE_EMULATOR_GRACEFUL_DELETE=true|false, default false]
  --bookmark-interval SECS   watch bookmark period                   [KUBE_EMULATOR_BOOKMARK_INTERVAL, default 5]
  --min-request-timeout SECS watches without timeoutSeconds end after
                             SECS to 2×SECS                          [KUBE_EMULATOR_MIN_REQUEST_TIMEOUT, default 1800]
  --log LEVEL                error|warn|info|debug|trace             [KUBE_EMULATOR_LOG, default info]
  -h, --help                 show this help
";

#[derive(Debug)]
struct Options {
    port: u16,
    address: IpAddr,
    cluster_name: String,
    tls: bool,
    credentials: Vec<(String, String)>,
    allowed_sts_hosts: Vec<String>,
    region: String,
    ca_out: Option<PathBuf>,
    seed: Option<PathBuf>,
    graceful_delete: bool,
    bookmark_interval: Duration,
    min_request_timeout: Duration,
    log: String,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn parse_bool(name: &str, value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("{name}: expected true or false, got {value:?}")),
    }
}

/// A positive number of seconds (fractions allowed).
fn parse_seconds(name: &str, value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{name}: expected a positive number of seconds, got {value:?}"))
}

fn parse_credential(value: &str) -> Result<(String, String), String> {
    match value.split_once(':') {
        Some((id, secret)) if !id.is_empty() && !secret.is_empty() => {
            Ok((id.to_owned(), secret.to_owned()))
        }
        _ => Err("credentials must be ACCESS_KEY_ID:SECRET_ACCESS_KEY".to_owned()),
    }
}

fn split_list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// Reads options from the environment, then from the flags.
fn parse_options(args: &[String]) -> Result<Option<Options>, String> {
    let mut port = env("KUBE_EMULATOR_PORT").unwrap_or_else(|| "0".to_owned());
    let mut address = env("KUBE_EMULATOR_ADDRESS").unwrap_or_else(|| "127.0.0.1".to_owned());
    let mut cluster_name =
        env("KUBE_EMULATOR_CLUSTER_NAME").unwrap_or_else(|| "kube-emulator".to_owned());
    let mut tls = match env("KUBE_EMULATOR_TLS") {
        Some(v) => parse_bool("KUBE_EMULATOR_TLS", &v)?,
        None => true,
    };
    let mut credentials = env("KUBE_EMULATOR_CREDENTIALS")
        .map(|v| {
            split_list(&v)
                .map(parse_credential)
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    let mut allowed_sts_hosts: Vec<String> = env("KUBE_EMULATOR_ALLOWED_STS_HOSTS")
        .map(|v| split_list(&v).map(str::to_owned).collect())
        .unwrap_or_default();
    let mut region = env("KUBE_EMULATOR_REGION")
        .or_else(|| env("AWS_REGION"))
        .unwrap_or_else(|| "us-east-1".to_owned());
    let mut ca_out = env("KUBE_EMULATOR_CA_OUT").map(PathBuf::from);
    let mut seed = env("KUBE_EMULATOR_SEED").map(PathBuf::from);
    let mut log = env("KUBE_EMULATOR_LOG").unwrap_or_else(|| "info".to_owned());
    let mut graceful_delete = match env("KUBE_EMULATOR_GRACEFUL_DELETE") {
        Some(v) => parse_bool("KUBE_EMULATOR_GRACEFUL_DELETE", &v)?,
        None => false,
    };
    let mut bookmark_interval = env("KUBE_EMULATOR_BOOKMARK_INTERVAL")
        .map(|v| parse_seconds("KUBE_EMULATOR_BOOKMARK_INTERVAL", &v))
        .transpose()?
        .unwrap_or(kube_emulator::DEFAULT_BOOKMARK_INTERVAL);
    let mut min_request_timeout = env("KUBE_EMULATOR_MIN_REQUEST_TIMEOUT")
        .map(|v| parse_seconds("KUBE_EMULATOR_MIN_REQUEST_TIMEOUT", &v))
        .transpose()?
        .unwrap_or(kube_emulator::DEFAULT_MIN_REQUEST_TIMEOUT);

    let mut flag_credentials = Vec::new();
    let mut flag_hosts = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (arg, None),
        };
        let mut value = || -> Result<String, String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag {
            "-h" | "--help" => return Ok(None),
            "--port" => port = value()?,
            "--address" => address = value()?,
            "--cluster-name" => cluster_name = value()?,
            "--tls" => tls = true,
            "--no-tls" => tls = false,
            "--credentials" => flag_credentials.push(parse_credential(&value()?)?),
            "--allowed-sts-host" => flag_hosts.push(value()?),
            "--region" => region = value()?,
            "--ca-out" => ca_out = Some(PathBuf::from(value()?)),
            "--seed" => seed = Some(PathBuf::from(value()?)),
            "--graceful-delete" => graceful_delete = true,
            "--no-graceful-delete" => graceful_delete = false,
            "--bookmark-interval" => {
                bookmark_interval = parse_seconds("--bookmark-interval", &value()?)?;
            }
            "--min-request-timeout" => {
                min_request_timeout = parse_seconds("--min-request-timeout", &value()?)?;
            }
            "--log" => log = value()?,
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
        i += 1;
    }
    if !flag_credentials.is_empty() {
        credentials = flag_credentials;
    }
    if !flag_hosts.is_empty() {
        allowed_sts_hosts = flag_hosts;
    }
    if credentials.is_empty() {
        credentials.push((
            EXAMPLE_ACCESS_KEY_ID.to_owned(),
            EXAMPLE_SECRET_ACCESS_KEY.to_owned(),
        ));
        if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            credentials.push((id, secret));
        }
    }
    Ok(Some(Options {
        port: port.parse().map_err(|_| format!("invalid port {port:?}"))?,
        address: address
            .parse()
            .map_err(|_| format!("invalid address {address:?}"))?,
        cluster_name,
        tls,
        credentials,
        allowed_sts_hosts,
        region,
        ca_out,
        seed,
        graceful_delete,
        bookmark_interval,
        min_request_timeout,
        log,
    }))
}

/// Pods from a JSON PodList (`items`), an array of Pods, or one Pod.
fn read_seed(path: &PathBuf) -> Result<Vec<Pod>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read seed file {}: {e}", path.display()))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| format!("seed file {} is not JSON: {e}", path.display()))?;
    let items = match value {
        Value::Array(items) => items,
        Value::Object(mut map) if map.contains_key("items") => match map.remove("items") {
            Some(Value::Array(items)) => items,
            Some(Value::Null) | None => Vec::new(),
            Some(_) => return Err("seed file: \"items\" must be a list".to_owned()),
        },
        pod @ Value::Object(_) => vec![pod],
        _ => return Err("seed file must hold a PodList, a list of Pods or a Pod".to_owned()),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            serde_json::from_value(item).map_err(|e| format!("seed item {i} is not a Pod: {e}"))
        })
        .collect()
}

fn init_logging(level: &str) {
    let level = match level.to_ascii_lowercase().as_str() {
        "error" => tracing::Level::ERROR,
        "warn" => tracing::Level::WARN,
        "debug" => tracing::Level::DEBUG,
        "trace" => tracing::Level::TRACE,
        _ => tracing::Level::INFO,
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn run(options: Options) -> Result<(), String> {
    let store = Store::new();
    if let Some(path) = &options.seed {
        store
            .put_pods(read_seed(path)?)
            .map_err(|e| format!("seed: {e}"))?;
    }
    let mut config = EmulatorConfig::new(options.cluster_name);
    config.tls = options.tls;
    config.credentials = options.credentials;
    config.allowed_sts_hosts = options.allowed_sts_hosts;
    config.region = options.region;
    config.listen = SocketAddr::new(options.address, options.port);
    config.graceful_delete = options.graceful_delete;
    config.bookmark_interval = options.bookmark_interval;
    config.min_request_timeout = options.min_request_timeout;
    let emulator = Emulator::start_with_store(config, store)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(path) = &options.ca_out {
        let pem = emulator
            .ca_pem()
            .ok_or("--ca-out needs TLS (it was turned off)")?;
        std::fs::write(path, pem)
            .map_err(|e| format!("cannot write CA to {}: {e}", path.display()))?;
    }
    tracing::info!(
        pods = emulator.store().pods().len(),
        sts_hosts = ?emulator.config().effective_sts_hosts(),
        "ready"
    );
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", emulator.url()).map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;
    drop(stdout);
    wait_for_stop().await;
    tracing::info!("stopping");
    emulator.shutdown();
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_options(&args) {
        Ok(Some(options)) => options,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("kube-emulator: {message}");
            return ExitCode::from(2);
        }
    };
    init_logging(&options.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("kube-emulator: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("kube-emulator: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn watch_and_delete_flags() {
        let options = parse_options(&args(&[
            "--graceful-delete",
            "--bookmark-interval",
            "0.5",
            "--min-request-timeout=60",
        ]))
        .unwrap()
        .unwrap();
        assert!(options.graceful_delete);
        assert_eq!(options.bookmark_interval, Duration::from_millis(500));
        assert_eq!(options.min_request_timeout, Duration::from_secs(60));
        assert!(parse_options(&args(&["--bookmark-interval", "0"])).is_err());
        assert!(parse_options(&args(&["--min-request-timeout", "soon"])).is_err());
    }
}
