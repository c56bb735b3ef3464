//! Wiring for a Lambda container: settings → SDK config → the real adapters → an engine.
//! Built once per container (cold start) and shared by every invocation.

use std::sync::Arc;

use thiserror::Error;

use crate::aws::accounts::{Accounts, session_name};
use crate::aws::dynamo::DynamoState;
use crate::aws::elbv2::{Elbv2TargetGroups, MutationRate};
use crate::clock::{Clock, SystemClock};
use crate::config::{ConfigError, Settings};
use crate::controller::Engine;
use crate::core::UnixMillis;
use crate::eks::access::{AccessError, ClusterAccess, Overrides};
use crate::eks::pods::KubePods;
use crate::reconcile::EngineSettings;

/// The engine with the production adapters (ELBv2 in this account and in every target
/// account of `TGSYNC_TARGET_ACCOUNT_ROLES`).
pub type LiveEngine = Engine<KubePods, Accounts, DynamoState>;

/// A configured container.
pub struct App {
    /// The validated settings.
    pub settings: Settings,
    /// The engine.
    pub engine: LiveEngine,
}

/// Why the container could not be configured; every invocation reports it.
#[derive(Debug, Error)]
pub enum AppError {
    /// A setting is missing or wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The CA file could not be read.
    #[error("TGSYNC_CLUSTER_CA_FILE={path:?} cannot be read: {source}")]
    CaFile {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The cluster access could not be set up (no region or credentials).
    #[error(transparent)]
    Access(#[from] AccessError),
    /// An ELBv2 rate is invalid.
    #[error("ELBv2 rate setting: {0}")]
    Rate(String),
}

impl App {
    /// Reads the environment and builds everything (`function` names lease owners).
    pub async fn from_env(function: &str) -> Result<Self, AppError> {
        let settings = Settings::from_env()?;
        let sdk = crate::aws::sdk_config().await;
        Self::build(settings, &sdk, Arc::new(SystemClock), function)
    }

    /// Builds the adapters and engine from settings and an SDK configuration.
    pub fn build(
        settings: Settings,
        sdk: &aws_config::SdkConfig,
        clock: Arc<dyn Clock>,
        function: &str,
    ) -> Result<Self, AppError> {
        let ca_pem = match &settings.ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|source| AppError::CaFile {
                path: path.display().to_string(),
                source,
            })?),
            None => None,
        };
        let overrides = Overrides {
            endpoint: settings.endpoint_override.clone(),
            ca_pem,
        };
        let access = ClusterAccess::from_sdk_config(&settings.cluster_name, sdk, overrides)?;
        let pods = KubePods::new(Arc::new(access)).with_page_size(settings.page_size);
        // The budgets are the deployment's: this container's share of them.
        let (rate, describes) = MutationRate::container_shares(
            settings.mutations_per_second,
            settings.describes_per_second,
            settings.budget_share,
            settings.max_containers,
        )
        .map_err(|e| AppError::Rate(e.to_string()))?;
        let smaller = settings
            .mutations_per_second
            .min(settings.describes_per_second);
        if f64::from(settings.max_containers) > f64::from(smaller) * settings.budget_share {
            tracing::warn!(
                containers = settings.max_containers,
                share = settings.budget_share,
                budget = smaller,
                "more containers than this function's share of the ELBv2 budget: each still makes up to one call a second, so the deployment can exceed its budget in a busy second; raise the budget or lower the reserved concurrency"
            );
        }
        let home = Elbv2TargetGroups::from_sdk_config(sdk, rate).with_describe_rate(describes);
        let groups = Accounts::assuming(
            home,
            sdk,
            &settings.target_account_roles,
            settings.target_account_external_id.as_deref(),
            &session_name(&settings.cluster_name),
        );
        let state = DynamoState::from_sdk_config(sdk, &settings.table_name, &settings.cluster_name);
        let engine = Engine::new(settings.cluster_name.clone(), pods, groups, state, clock)
            .with_settings(EngineSettings {
                concurrency: settings.concurrency,
                verify_describes_per_second: settings.verify_describes_per_second,
                schedule_period: settings.schedule,
                binding_policy: settings.binding_policy(),
                relist_after: settings.relist,
                rollout: settings.rollout(),
                ..EngineSettings::default()
            })
            .with_owner_prefix(function);
        Ok(Self { settings, engine })
    }
}

/// The Lambda main of the functions: allocator settings, logging, crypto provider,
/// configuration once per container, then the runtime loop calling `handler` with the
/// app, the payload and the invocation deadline. A bad setting does not crash the
/// container: every invocation answers with the one-line error instead, so `aws lambda
/// invoke` shows it.
pub async fn serve<F, Fut>(function: &'static str, handler: F) -> Result<(), lambda_runtime::Error>
where
    F: Fn(Arc<App>, serde_json::Value, UnixMillis) -> Fut,
    Fut: std::future::Future<Output = Result<serde_json::Value, crate::handlers::HandlerError>>,
{
    serve_invocations(function, move |app, payload, invocation| {
        let deadline = invocation.deadline.unwrap_or_default();
        handler(app, payload, deadline)
    })
    .await
}

/// [`serve`], handing the handler everything Lambda says about the invocation (its
/// deadline and the function, version or alias ARN the caller invoked).
pub async fn serve_invocations<F, Fut>(
    function: &'static str,
    handler: F,
) -> Result<(), lambda_runtime::Error>
where
    F: Fn(Arc<App>, serde_json::Value, crate::handlers::manual::Invocation) -> Fut,
    Fut: std::future::Future<Output = Result<serde_json::Value, crate::handlers::HandlerError>>,
{
    crate::allocator::configure();
    crate::logging::init();
    install_crypto_provider();
    let app = App::from_env(function)
        .await
        .map(Arc::new)
        .map_err(|e| e.to_string());
    if let Err(e) = &app {
        tracing::error!("configuration error: {e}");
    }
    if let Ok(app) = &app {
        graceful_shutdown(app.clone()).await;
    }
    let handler = &handler;
    let app = &app;
    lambda_runtime::run(lambda_runtime::service_fn(
        move |event: lambda_runtime::LambdaEvent<serde_json::Value>| async move {
            let app = app.clone().map_err(lambda_runtime::Error::from)?;
            let invocation = crate::handlers::manual::Invocation {
                deadline: Some(UnixMillis(event.context.deadline)),
                invoked_function_arn: event.context.invoked_function_arn,
            };
            Ok::<_, lambda_runtime::Error>(handler(app, event.payload, invocation).await?)
        },
    ))
    .await
}

/// How long the shutdown hook lets passes in flight give their leases back: Lambda
/// allows 500 ms between SIGTERM and SIGKILL.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_millis(400);

/// On SIGTERM (Lambda shutting the container down, also at an invocation's timeout) or
/// SIGINT: every pass in flight stops before its next change and gives its lease back
/// with a request for another pass, within [`SHUTDOWN_GRACE`]; then the process exits.
/// (A pass whose call in flight outlasts the grace has handed its lease over at the
/// signal: see `Lease::hand_over`.)
/// Lambda sends SIGTERM only to a runtime with an extension registered, so a no-op
/// internal extension is registered first (before the runtime loop starts, as Lambda
/// requires); where no Extensions API answers (local runs), the signal handler still
/// works and the registration is skipped with one log line.
async fn graceful_shutdown(app: Arc<App>) {
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
        let registered = lambda_extension::Extension::new()
            .with_events(&[])
            .with_extension_name("tgsync-graceful-shutdown")
            .register()
            .await;
        match registered {
            Ok(extension) => {
                tokio::spawn(async move {
                    // Never returns while the container lives: no event is subscribed.
                    let _ = extension.run().await;
                });
            }
            Err(e) => {
                tracing::info!(error = %e, "no Lambda Extensions API: SIGTERM is not announced here")
            }
        }
    }
    let Some(terminated) = termination() else {
        tracing::warn!(
            "cannot listen for SIGTERM; leases in flight at shutdown expire on their own"
        );
        return;
    };
    tokio::spawn(async move {
        terminated.await;
        tracing::info!("shutting down: passes in flight give their leases back");
        app.engine.core.stop.shut_down();
        let give_up = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        while app.engine.core.stop.passes_in_flight() > 0 && tokio::time::Instant::now() < give_up {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        std::process::exit(0);
    });
}

/// Completes at SIGTERM or SIGINT; `None` when they cannot be listened for.
#[cfg(unix)]
fn termination() -> Option<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return None;
    };
    Some(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Completes at Ctrl-C: the library builds for the CLI on every platform, and only Unix
/// has SIGTERM (the functions run on Lambda's Linux).
#[cfg(not(unix))]
fn termination() -> Option<impl std::future::Future<Output = ()>> {
    Some(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// Installs aws-lc-rs as the process-wide rustls provider, so kube and the AWS SDK agree
/// on one (mixing providers panics at runtime when none is the default).
pub fn install_crypto_provider() {
    // Err means one is installed already, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
