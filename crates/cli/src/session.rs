//! The caller's AWS session: region and credentials from `--region` / `--profile` or the
//! SDK's usual chain, checked before anything is read or printed, so a missing one is
//! one line that says so instead of every later call's dispatch failure.

use std::time::Duration;

use aws_config::{BehaviorVersion, ConfigLoader, Region, SdkConfig};
use aws_credential_types::provider::ProvideCredentials;

use crate::error::CliError;

/// How long the credentials chain may take (an SSO refresh, a container endpoint);
/// instance metadata that does not answer is given up on well before.
const CREDENTIALS_TIMEOUT: Duration = Duration::from_secs(30);

/// A region and credentials that work, and the settings they came from.
pub struct Session {
    /// tgsync's SDK configuration (its retries and timeouts) with this region and these
    /// credentials: what `status` and every read use.
    pub sdk: SdkConfig,
    /// The region in use.
    pub region: String,
}

impl Session {
    /// Resolves the region and the credentials (`region` and `profile` override the
    /// environment and the config files), failing with [`CliError::NoCredentials`] or
    /// [`CliError::NoRegion`] before any AWS call.
    pub async fn connect(region: Option<&str>, profile: Option<&str>) -> Result<Self, CliError> {
        let sdk = with(tgsync::aws::config_loader(), region, profile)
            .load()
            .await;
        // The profile in use, for the message (the SDK reads AWS_PROFILE itself).
        let profile = profile
            .map(str::to_owned)
            .or_else(|| std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty()));
        let Some(provider) = sdk.credentials_provider() else {
            return Err(CliError::NoCredentials {
                profile,
                detail: CliError::detail_of(
                    "no credentials",
                    "no credentials provider is configured",
                ),
            });
        };
        match tokio::time::timeout(CREDENTIALS_TIMEOUT, provider.provide_credentials()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(CliError::NoCredentials {
                    profile,
                    detail: CliError::detail_of("no credentials", &tgsync::aws::error_chain(&e)),
                });
            }
            Err(_) => {
                return Err(CliError::NoCredentials {
                    profile,
                    detail: CliError::detail_of(
                        "no credentials",
                        &format!(
                            "the credentials chain gave no answer in {} s",
                            CREDENTIALS_TIMEOUT.as_secs()
                        ),
                    ),
                });
            }
        }
        let Some(region) = sdk.region().map(|r| r.as_ref().to_owned()) else {
            return Err(CliError::NoRegion);
        };
        Ok(Self { sdk, region })
    }

    /// The SDK's default configuration (its own retries and timeouts, for clients that
    /// set their own) with this session's region and credentials.
    pub async fn defaults(&self) -> SdkConfig {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(self.region.clone()));
        if let Some(provider) = self.sdk.credentials_provider() {
            loader = loader.credentials_provider(provider);
        }
        loader.load().await
    }
}

/// `loader` with `region` and `profile`, when given.
fn with(mut loader: ConfigLoader, region: Option<&str>, profile: Option<&str>) -> ConfigLoader {
    if let Some(r) = region {
        loader = loader.region(Region::new(r.to_owned()));
    }
    if let Some(p) = profile {
        loader = loader.profile_name(p);
    }
    loader
}
