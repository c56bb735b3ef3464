//! Creating the state table, exactly as `template.yaml` declares it, for tests and the
//! local sandbox (production tables come from the template).

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification,
};
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use super::build_error;
use super::items::{EXPIRES_AT, PK, SK};
use crate::aws::error_summary;
use crate::state::StateError;

/// How long to wait for a new table to become ACTIVE (real DynamoDB takes seconds).
const ACTIVE_WAIT: Duration = Duration::from_secs(120);

/// Creates table `name`: on-demand billing, string keys `pk` (hash) and `sk` (range),
/// TTL on `expiresAt`. An existing table is left as it is (so the sandbox can rerun).
/// Waits until the table is ACTIVE. A failure to enable TTL is logged, not returned: TTL
/// only sweeps abandoned lease rows, and some emulators do not implement it.
pub async fn create_table(client: &Client, name: &str) -> Result<(), StateError> {
    const OP: &str = "CreateTable";
    let attr = |n: &str| {
        AttributeDefinition::builder()
            .attribute_name(n)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(|e| build_error(OP, e))
    };
    let key = |n: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(n)
            .key_type(t)
            .build()
            .map_err(|e| build_error(OP, e))
    };
    let created = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr(PK)?)
        .attribute_definitions(attr(SK)?)
        .key_schema(key(PK, KeyType::Hash)?)
        .key_schema(key(SK, KeyType::Range)?)
        .send()
        .await;
    match created {
        Ok(_) => tracing::info!(table = name, "state table created"),
        Err(e) if e.code() == Some("ResourceInUseException") => {
            tracing::info!(table = name, "state table exists already");
        }
        Err(e) => {
            return Err(StateError::Dynamo {
                operation: OP,
                message: error_summary(&e),
            });
        }
    }
    wait_active(client, name).await?;

    let ttl = TimeToLiveSpecification::builder()
        .attribute_name(EXPIRES_AT)
        .enabled(true)
        .build()
        .map_err(|e| build_error("UpdateTimeToLive", e))?;
    if let Err(e) = client
        .update_time_to_live()
        .table_name(name)
        .time_to_live_specification(ttl)
        .send()
        .await
    {
        tracing::warn!(
            table = name,
            error = %error_summary(&e),
            "could not enable TTL on {EXPIRES_AT}; abandoned lease rows will not be swept"
        );
    }
    Ok(())
}

async fn wait_active(client: &Client, name: &str) -> Result<(), StateError> {
    const OP: &str = "DescribeTable";
    let deadline = tokio::time::Instant::now() + ACTIVE_WAIT;
    loop {
        let out = client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .map_err(|e| StateError::Dynamo {
                operation: OP,
                message: error_summary(&e),
            })?;
        let status = out.table().and_then(|t| t.table_status());
        if status == Some(&TableStatus::Active) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StateError::Dynamo {
                operation: OP,
                message: format!(
                    "table {name} not ACTIVE after {}s (status {status:?}); check it in the console",
                    ACTIVE_WAIT.as_secs()
                ),
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
