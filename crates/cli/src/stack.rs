//! The deployment a command works on: its cluster, state table and manual function,
//! given on the command line (or in `TGSYNC_*` variables) or read from the outputs of
//! its CloudFormation stack (`--stack`, one DescribeStacks call), so nobody copies them
//! by hand.

use std::collections::HashMap;

use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use crate::error::{Call, CliError};
use crate::session::Session;

/// The manual function's name when neither a flag nor a stack names it (the template's
/// default `FunctionNamePrefix` is `tgsync`).
pub const DEFAULT_FUNCTION: &str = "tgsync-manual";

/// The template's default `WatchSeconds`: what `status` takes for the functions'
/// `TGSYNC_WATCH_SECONDS` when neither the stack nor the environment gives it (the
/// rollout check's latency is then watch mode's, as in a default deployment).
pub const TEMPLATE_WATCH_SECONDS: u32 = 55;

/// The stack outputs and parameters the CLI reads.
pub mod names {
    /// Output: the state table in use.
    pub const TABLE: &str = "StateTableName";
    /// Output: the manual function.
    pub const FUNCTION: &str = "ManualFunctionName";
    /// Output (when the template has it), else parameter: the cluster.
    pub const CLUSTER: &str = "ClusterName";
    /// Parameter: `TGSYNC_ALLOWED_NAMESPACES` of the functions.
    pub const ALLOWED_NAMESPACES: &str = "AllowedNamespaces";
    /// Parameter: `TGSYNC_ALLOW_EXCLUSIVE` of the functions.
    pub const ALLOW_EXCLUSIVE: &str = "AllowExclusive";
    /// Parameter: `TGSYNC_WATCH_SECONDS` (the rollout check's mode).
    pub const WATCH_SECONDS: &str = "WatchSeconds";
    /// Parameter: `TGSYNC_SCHEDULE_MINUTES` (the rollout check's schedule-only budget).
    pub const SCHEDULE_MINUTES: &str = "ScheduleMinutes";
    /// Parameter: `TGSYNC_NLB_PROPAGATION_SECONDS` (the rollout check's NLB allowance).
    pub const NLB_PROPAGATION_SECONDS: &str = "NlbPropagationSeconds";
    /// Parameter: `TGSYNC_ALB_PROPAGATION_SECONDS` (the rollout check's ALB allowance).
    pub const ALB_PROPAGATION_SECONDS: &str = "AlbPropagationSeconds";
}

/// What the command line says about the deployment.
#[derive(Debug, Default)]
pub struct Given {
    /// `--stack` / `TGSYNC_STACK`.
    pub stack: Option<String>,
    /// `--cluster` / `TGSYNC_CLUSTER_NAME`.
    pub cluster: Option<String>,
    /// `--table` / `TGSYNC_TABLE_NAME`.
    pub table: Option<String>,
    /// `--function` / `TGSYNC_MANUAL_FUNCTION`.
    pub function: Option<String>,
}

/// A stack's outputs and parameters, as DescribeStacks gives them.
#[derive(Debug, Default)]
pub struct Stack {
    /// The stack's name.
    pub name: String,
    /// `CREATE_COMPLETE`, `UPDATE_ROLLBACK_COMPLETE`, ...
    pub status: String,
    /// Output key to value.
    pub outputs: HashMap<String, String>,
    /// Parameter key to value.
    pub parameters: HashMap<String, String>,
}

impl Stack {
    /// Reads stack `name` (a name or a stack ID) with one DescribeStacks.
    pub async fn describe(session: &Session, name: &str) -> Result<Self, CliError> {
        let client = aws_sdk_cloudformation::Client::new(&session.sdk);
        let out = client
            .describe_stacks()
            .stack_name(name)
            .send()
            .await
            .map_err(|e| {
                // CloudFormation's answer for a stack that does not exist: ValidationError,
                // "Stack with id NAME does not exist".
                if e.code() == Some("ValidationError")
                    && e.message().is_some_and(|m| m.contains("does not exist"))
                {
                    return CliError::StackNotFound {
                        stack: name.to_owned(),
                        region: session.region.clone(),
                        detail: tgsync::aws::error_detail(&e),
                    };
                }
                CliError::from_sdk(
                    &e,
                    Call {
                        service: "CloudFormation",
                        operation: "CloudFormation DescribeStacks",
                        action: "cloudformation:DescribeStacks",
                        on: Some(format!("stack `{name}`")),
                        advice: "use credentials that may describe the stack, or give --cluster, --table and --function instead of --stack",
                    },
                )
            })?;
        let Some(stack) = out.stacks().first() else {
            return Err(CliError::StackNotFound {
                stack: name.to_owned(),
                region: session.region.clone(),
                detail: CliError::detail_of(
                    "an answer without the stack",
                    "DescribeStacks returned no stack",
                ),
            });
        };
        Ok(Self {
            name: stack.stack_name().unwrap_or(name).to_owned(),
            status: stack
                .stack_status()
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default(),
            outputs: stack
                .outputs()
                .iter()
                .filter_map(|o| Some((o.output_key()?.to_owned(), o.output_value()?.to_owned())))
                .collect(),
            parameters: stack
                .parameters()
                .iter()
                .filter_map(|p| {
                    Some((
                        p.parameter_key()?.to_owned(),
                        p.parameter_value()?.to_owned(),
                    ))
                })
                .collect(),
        })
    }

    fn output(&self, name: &'static str, flag: &'static str) -> Result<String, CliError> {
        self.outputs
            .get(name)
            .cloned()
            .ok_or_else(|| CliError::StackOutput {
                stack: self.name.clone(),
                status: self.status.clone(),
                what: "output",
                name,
                flag,
            })
    }
}

/// The deployment: what was given, completed from the stack.
#[derive(Debug)]
pub struct Deployment {
    given: Given,
    stack: Option<Stack>,
}

impl Deployment {
    /// `given`, with its stack read when one is named.
    pub async fn resolve(session: &Session, given: Given) -> Result<Self, CliError> {
        let stack = match &given.stack {
            Some(name) => Some(Stack::describe(session, name).await?),
            None => None,
        };
        Ok(Self { given, stack })
    }

    /// The cluster: `--cluster`, else the stack's `ClusterName` output, else its
    /// `ClusterName` parameter (a stack deployed before the template had that output).
    pub fn cluster(&self) -> Result<String, CliError> {
        if let Some(c) = &self.given.cluster {
            return Ok(c.clone());
        }
        let Some(stack) = &self.stack else {
            return Err(CliError::Missing {
                flag: "--cluster",
                variable: "TGSYNC_CLUSTER_NAME",
            });
        };
        stack
            .outputs
            .get(names::CLUSTER)
            .or_else(|| stack.parameters.get(names::CLUSTER))
            .cloned()
            .ok_or_else(|| CliError::StackOutput {
                stack: stack.name.clone(),
                status: stack.status.clone(),
                what: "output or parameter",
                name: names::CLUSTER,
                flag: "--cluster",
            })
    }

    /// The state table: `--table`, else the stack's `StateTableName` output.
    pub fn table(&self) -> Result<String, CliError> {
        match (&self.given.table, &self.stack) {
            (Some(t), _) => Ok(t.clone()),
            (None, Some(stack)) => stack.output(names::TABLE, "--table"),
            (None, None) => Err(CliError::Missing {
                flag: "--table",
                variable: "TGSYNC_TABLE_NAME",
            }),
        }
    }

    /// The manual function: `--function`, else the stack's `ManualFunctionName` output,
    /// else [`DEFAULT_FUNCTION`].
    pub fn function(&self) -> Result<String, CliError> {
        match (&self.given.function, &self.stack) {
            (Some(f), _) => Ok(f.clone()),
            (None, Some(stack)) => stack.output(names::FUNCTION, "--function"),
            (None, None) => Ok(DEFAULT_FUNCTION.to_owned()),
        }
    }

    /// The functions' settings that shape what `status` plans and checks, from the
    /// stack's parameters (`TGSYNC_ALLOWED_NAMESPACES`, `TGSYNC_ALLOW_EXCLUSIVE`; the
    /// rollout check's `TGSYNC_WATCH_SECONDS`, `TGSYNC_SCHEDULE_MINUTES` and
    /// propagation allowances), so its bindings and numbers are the functions'. Empty
    /// without a stack.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let Some(stack) = &self.stack else {
            return Vec::new();
        };
        [
            ("TGSYNC_ALLOWED_NAMESPACES", names::ALLOWED_NAMESPACES),
            ("TGSYNC_ALLOW_EXCLUSIVE", names::ALLOW_EXCLUSIVE),
            ("TGSYNC_WATCH_SECONDS", names::WATCH_SECONDS),
            ("TGSYNC_SCHEDULE_MINUTES", names::SCHEDULE_MINUTES),
            (
                "TGSYNC_NLB_PROPAGATION_SECONDS",
                names::NLB_PROPAGATION_SECONDS,
            ),
            (
                "TGSYNC_ALB_PROPAGATION_SECONDS",
                names::ALB_PROPAGATION_SECONDS,
            ),
        ]
        .into_iter()
        .filter_map(|(var, param)| Some((var, stack.parameters.get(param)?.clone())))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(outputs: &[(&str, &str)], parameters: &[(&str, &str)]) -> Stack {
        let map = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        Stack {
            name: "tgsync".into(),
            status: "CREATE_COMPLETE".into(),
            outputs: map(outputs),
            parameters: map(parameters),
        }
    }

    #[test]
    fn flags_win_over_the_stack_and_the_stack_over_defaults() {
        let d = Deployment {
            given: Given {
                table: Some("mine".into()),
                ..Given::default()
            },
            stack: Some(stack(
                &[("StateTableName", "t"), ("ManualFunctionName", "f")],
                &[("ClusterName", "prod"), ("AllowExclusive", "true")],
            )),
        };
        assert_eq!(d.table().unwrap(), "mine");
        assert_eq!(d.function().unwrap(), "f");
        assert_eq!(d.cluster().unwrap(), "prod");
        assert_eq!(
            d.settings(),
            [("TGSYNC_ALLOW_EXCLUSIVE", "true".to_owned())]
        );
        let bare = Deployment {
            given: Given::default(),
            stack: None,
        };
        assert_eq!(bare.function().unwrap(), DEFAULT_FUNCTION);
        assert!(matches!(
            bare.cluster(),
            Err(CliError::Missing {
                flag: "--cluster",
                ..
            })
        ));
    }

    /// The rollout check's numbers follow the stack's parameters; without them, the
    /// template's default watch mode (the same number as template.yaml's).
    #[test]
    fn the_rollout_checks_settings_come_from_the_stack() {
        let d = Deployment {
            given: Given::default(),
            stack: Some(stack(
                &[],
                &[
                    ("WatchSeconds", "0"),
                    ("ScheduleMinutes", "2"),
                    ("NlbPropagationSeconds", "120"),
                    ("AlbPropagationSeconds", "45"),
                ],
            )),
        };
        assert_eq!(
            d.settings(),
            [
                ("TGSYNC_WATCH_SECONDS", "0".to_owned()),
                ("TGSYNC_SCHEDULE_MINUTES", "2".to_owned()),
                ("TGSYNC_NLB_PROPAGATION_SECONDS", "120".to_owned()),
                ("TGSYNC_ALB_PROPAGATION_SECONDS", "45".to_owned()),
            ]
        );
        let template = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"),
        )
        .unwrap();
        let watch = template
            .split("\n  WatchSeconds:\n")
            .nth(1)
            .expect("template.yaml has WatchSeconds");
        let default = watch
            .lines()
            .find_map(|l| l.trim().strip_prefix("Default: "))
            .expect("WatchSeconds has a default");
        assert_eq!(default, TEMPLATE_WATCH_SECONDS.to_string());
    }

    #[test]
    fn a_missing_output_is_named_with_the_stack_status() {
        let d = Deployment {
            given: Given::default(),
            stack: Some(Stack {
                status: "ROLLBACK_COMPLETE".into(),
                ..stack(&[], &[])
            }),
        };
        let e = d.table().unwrap_err().to_string();
        assert!(
            e.contains("stack `tgsync` (ROLLBACK_COMPLETE) has no output `StateTableName`"),
            "{e}"
        );
        assert!(e.contains("--table"), "{e}");
        let e = d.cluster().unwrap_err().to_string();
        assert!(e.contains("no output or parameter `ClusterName`"), "{e}");
    }

    /// The names `--stack` reads are the template's: renaming an output or a parameter
    /// in template.yaml (or here) fails this test, not an operator's first `--stack`.
    #[test]
    fn the_names_read_from_the_stack_are_the_templates() {
        let template: serde_norway::Value =
            serde_norway::from_str(include_str!("../../../template.yaml")).unwrap();
        let keys = |section: &str| -> Vec<String> {
            template[section]
                .as_mapping()
                .unwrap_or_else(|| panic!("template.yaml has a {section} section"))
                .keys()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect()
        };
        let (outputs, parameters) = (keys("Outputs"), keys("Parameters"));
        for output in [names::TABLE, names::FUNCTION, names::CLUSTER] {
            assert!(outputs.iter().any(|o| o == output), "no output {output}");
        }
        for parameter in [
            names::CLUSTER,
            names::ALLOWED_NAMESPACES,
            names::ALLOW_EXCLUSIVE,
        ] {
            assert!(
                parameters.iter().any(|p| p == parameter),
                "no parameter {parameter}"
            );
        }
        // Without a stack the CLI names the manual function as the template does by
        // default: `${FunctionNamePrefix}-manual`.
        let prefix = template["Parameters"]["FunctionNamePrefix"]["Default"]
            .as_str()
            .unwrap();
        assert_eq!(DEFAULT_FUNCTION, format!("{prefix}-manual"));
        let name = &template["Resources"]["ManualFunction"]["Properties"]["FunctionName"];
        assert!(
            format!("{name:?}").contains("${FunctionNamePrefix}-manual"),
            "{name:?}"
        );
    }
}
