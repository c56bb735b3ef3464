//! `template.yaml` against what the code expects: the state table's layout, the IAM scope
//! of target group changes, the pod-events rule against the sample events, the schedule,
//! the runtime and build settings, the environment the functions read, and the alarms and
//! `Rules` over every allowed setting, against a simulated stack's metric series.
//!
//! The template keeps CloudFormation's short-form tags (`!Ref`, `!Sub`, `!GetAtt`, ...);
//! they are rewritten into the long JSON form (`{"Ref": ..}`, `{"Fn::Sub": ..}`) on load,
//! so every check below works on plain JSON values.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tgsync::aws::MutationRate;
use tgsync::config::Settings;
use tgsync::input::pod_event::{Parsed, parse};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: impl AsRef<Path>) -> String {
    let path = root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ------------------------------------------------------------------------------------
// Loading: YAML with CloudFormation tags -> JSON in long form.
// ------------------------------------------------------------------------------------

fn to_json(value: serde_norway::Value) -> Value {
    use serde_norway::Value as Y;
    match value {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => serde_json::to_value(&n).expect("a YAML number is a JSON number"),
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(items.into_iter().map(to_json).collect()),
        Y::Mapping(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let key = match k {
                        Y::String(s) => s,
                        other => panic!("non-string key in template: {other:?}"),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Y::Tagged(tagged) => {
            let tag = tagged.tag.to_string();
            let name = tag.trim_start_matches('!');
            let inner = to_json(tagged.value);
            match name {
                "Ref" => json!({ "Ref": inner }),
                "Condition" => json!({ "Condition": inner }),
                // `!GetAtt Resource.Attribute` is the string form of a two-element list.
                "GetAtt" => match inner {
                    Value::String(s) => {
                        let (resource, attribute) = s
                            .split_once('.')
                            .unwrap_or_else(|| panic!("!GetAtt {s}: expected Resource.Attribute"));
                        json!({ "Fn::GetAtt": [resource, attribute] })
                    }
                    other => json!({ "Fn::GetAtt": other }),
                },
                other => json!({ format!("Fn::{other}"): inner }),
            }
        }
    }
}

struct Template {
    doc: Value,
}

impl Template {
    fn load() -> Self {
        let yaml: serde_norway::Value =
            serde_norway::from_str(&read("template.yaml")).expect("template.yaml is YAML");
        Self { doc: to_json(yaml) }
    }

    fn resources(&self) -> &Map<String, Value> {
        self.doc["Resources"].as_object().expect("Resources")
    }

    fn resource(&self, name: &str) -> &Value {
        self.resources()
            .get(name)
            .unwrap_or_else(|| panic!("template.yaml has no resource {name}"))
    }

    fn props(&self, name: &str) -> &Value {
        &self.resource(name)["Properties"]
    }

    fn of_type<'a>(&'a self, ty: &'a str) -> impl Iterator<Item = (&'a String, &'a Value)> + 'a {
        self.resources()
            .iter()
            .filter(move |(_, r)| r["Type"] == ty)
    }

    fn parameter_default(&self, name: &str) -> Option<&Value> {
        self.doc["Parameters"][name].get("Default")
    }

    /// A deployment's parameter values (`given`, else the defaults) and the conditions
    /// they make true.
    fn parameters(&self, given: &[(&str, &str)]) -> Deployment {
        let mut values: BTreeMap<String, Value> = self.doc["Parameters"]
            .as_object()
            .expect("Parameters")
            .iter()
            .filter_map(|(k, p)| Some((k.clone(), scalar_string(p.get("Default")?))))
            .collect();
        for (k, v) in given {
            assert!(
                self.doc["Parameters"].get(*k).is_some(),
                "template.yaml has no parameter {k}"
            );
            values.insert((*k).to_owned(), Value::String((*v).to_owned()));
        }
        let lists = self.doc["Parameters"]
            .as_object()
            .expect("Parameters")
            .iter()
            .filter(|(_, p)| p["Type"] == "CommaDelimitedList")
            .map(|(k, _)| k.clone())
            .collect();
        let mut deployment = Deployment {
            params: values,
            lists,
            conditions: BTreeMap::new(),
            mappings: self.doc["Mappings"].clone(),
        };
        let conditions = self.doc["Conditions"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for name in conditions.keys() {
            let value = condition(&conditions, name, &deployment.params);
            deployment.conditions.insert(name.clone(), value);
        }
        deployment
    }
}

/// Parameter values and condition results of one deployment of the template.
struct Deployment {
    params: BTreeMap<String, Value>,
    /// The `CommaDelimitedList` parameters: a `Ref` to one is a list.
    lists: BTreeSet<String>,
    conditions: BTreeMap<String, bool>,
    /// The template's `Mappings`, for `Fn::FindInMap`.
    mappings: Value,
}

/// Evaluates the template condition `name` (`Fn::Equals`, `Fn::Not`, `Fn::And`, `Fn::Or`,
/// `Condition`, over `Ref`s to parameters and `Fn::Join`), as CloudFormation would.
fn condition(all: &Map<String, Value>, name: &str, params: &BTreeMap<String, Value>) -> bool {
    fn value(v: &Value, params: &BTreeMap<String, Value>) -> String {
        match v {
            Value::Object(m) if m.contains_key("Ref") => {
                let p = &params[m["Ref"].as_str().expect("Ref names a string")];
                p.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| p.to_string())
            }
            Value::Object(m) if m.contains_key("Fn::Join") => {
                let args = m["Fn::Join"].as_array().expect("Fn::Join [sep, list]");
                let sep = args[0].as_str().expect("separator");
                // A CommaDelimitedList parameter is one string of items here.
                let items = match &args[1] {
                    Value::Array(items) => items.iter().map(|i| value(i, params)).collect(),
                    other => vec![value(other, params)],
                };
                items.join(sep)
            }
            Value::String(s) => s.clone(),
            other => panic!("condition operand not understood: {other}"),
        }
    }
    fn eval(v: &Value, all: &Map<String, Value>, params: &BTreeMap<String, Value>) -> bool {
        let (op, args) = v
            .as_object()
            .and_then(|m| m.iter().next())
            .expect("a condition is a one-key object");
        let list = || args.as_array().expect("condition arguments are a list");
        match op.as_str() {
            "Fn::Equals" => value(&list()[0], params) == value(&list()[1], params),
            "Fn::Not" => !eval(&list()[0], all, params),
            "Fn::And" => list().iter().all(|c| eval(c, all, params)),
            "Fn::Or" => list().iter().any(|c| eval(c, all, params)),
            "Condition" => condition(all, args.as_str().expect("condition name"), params),
            other => panic!("condition function {other} not understood"),
        }
    }
    eval(&all[name], all, params)
}

/// CloudFormation passes every parameter value as a string.
fn scalar_string(v: &Value) -> Value {
    match v {
        Value::String(_) => v.clone(),
        Value::Number(n) => Value::String(n.to_string()),
        Value::Bool(b) => Value::String(b.to_string()),
        other => other.clone(),
    }
}

/// Replaces `{"Ref": <parameter>}` by the parameter's value (a list of strings for a
/// `CommaDelimitedList`, split at commas as CloudFormation does), `{"Ref": <resource>}`
/// by `refs[resource]` when given, `Fn::If` by its chosen branch, `Fn::FindInMap` by the
/// mapping's value, and `Fn::Join` of strings by the joined string; everything else is
/// left as it is.
fn resolve(v: &Value, deployment: &Deployment, refs: &BTreeMap<&str, &str>) -> Value {
    let params = &deployment.params;
    match v {
        Value::Object(map) if map.len() == 1 && map.contains_key("Fn::If") => {
            let args = map["Fn::If"]
                .as_array()
                .expect("Fn::If [condition, then, else]");
            let name = args[0].as_str().expect("Fn::If names a condition");
            let chosen = if deployment.conditions[name] {
                &args[1]
            } else {
                &args[2]
            };
            resolve(chosen, deployment, refs)
        }
        Value::Object(map) if map.len() == 1 && map.contains_key("Fn::FindInMap") => {
            let args = map["Fn::FindInMap"]
                .as_array()
                .expect("Fn::FindInMap [map, top-level key, second-level key]");
            let keys: Vec<String> = args
                .iter()
                .map(|a| match scalar_string(&resolve(a, deployment, refs)) {
                    Value::String(s) => s,
                    other => panic!("Fn::FindInMap: a key that is not a string: {other}"),
                })
                .collect();
            deployment.mappings[&keys[0]][&keys[1]]
                .get(&keys[2])
                .unwrap_or_else(|| panic!("Mappings has no {keys:?}"))
                .clone()
        }
        Value::Object(map) if map.len() == 1 && map.contains_key("Fn::Join") => {
            let args = map["Fn::Join"].as_array().expect("Fn::Join [sep, list]");
            let sep = args[0].as_str().expect("separator");
            let list = resolve(&args[1], deployment, refs);
            let items: Option<Vec<&str>> = list
                .as_array()
                .map(|items| items.iter().map(Value::as_str).collect())
                .unwrap_or_default();
            match items {
                Some(items) => Value::String(items.join(sep)),
                None => json!({ "Fn::Join": [sep, list] }),
            }
        }
        Value::Object(map) if map.len() == 1 && map.contains_key("Fn::Split") => {
            let args = map["Fn::Split"]
                .as_array()
                .expect("Fn::Split [sep, string]");
            let sep = args[0].as_str().expect("separator");
            match resolve(&args[1], deployment, refs) {
                Value::String(s) => s.split(sep).map(|i| json!(i)).collect(),
                other => json!({ "Fn::Split": [sep, other] }),
            }
        }
        Value::Object(map) if map.len() == 1 && map.contains_key("Ref") => {
            let name = map["Ref"].as_str().expect("Ref names a string");
            if let Some(p) = params.get(name) {
                match (deployment.lists.contains(name), p.as_str()) {
                    (true, Some(list)) => list.split(',').map(|i| json!(i.trim())).collect(),
                    _ => p.clone(),
                }
            } else if let Some(r) = refs.get(name) {
                Value::String((*r).to_owned())
            } else {
                v.clone()
            }
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), resolve(v, deployment, refs)))
                .collect(),
        ),
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| resolve(i, deployment, refs)).collect())
        }
        other => other.clone(),
    }
}

fn get_att(resource: &str, attribute: &str) -> Value {
    json!({ "Fn::GetAtt": [resource, attribute] })
}

fn as_list(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items.clone(),
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    }
}

// ------------------------------------------------------------------------------------
// Cross-checks against the source: constants the code defines.
// ------------------------------------------------------------------------------------

/// The value of `const NAME: &str = "...";` in a source file. The state table's layout is
/// defined in src/aws/dynamo/items.rs (`PK`, `SK`, `EXPIRES_AT`, `pub(super)`, so not
/// reachable from here); reading the source keeps template and code in step without
/// widening the crate's API.
fn str_const(file: &str, name: &str) -> String {
    let source = read(file);
    let needle = format!("const {name}: &str = \"");
    let start = source.find(&needle).unwrap_or_else(|| {
        panic!("{file} no longer defines `const {name}: &str`; update tests/template.rs")
    }) + needle.len();
    let len = source[start..].find('"').expect("closing quote");
    source[start..start + len].to_owned()
}

/// Every `TGSYNC_*` variable name src/config.rs mentions.
fn config_variables() -> BTreeSet<String> {
    let source = read("src/config.rs");
    source
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.starts_with("TGSYNC_")
                && s.len() > 7
                && s.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        })
        .map(str::to_owned)
        .collect()
}

// ------------------------------------------------------------------------------------
// The state table
// ------------------------------------------------------------------------------------

#[test]
fn state_table_has_the_layout_the_code_uses() {
    let t = Template::load();
    let pk = str_const("src/aws/dynamo/items.rs", "PK");
    let sk = str_const("src/aws/dynamo/items.rs", "SK");
    let ttl = str_const("src/aws/dynamo/items.rs", "EXPIRES_AT");
    assert_eq!(
        (pk.as_str(), sk.as_str(), ttl.as_str()),
        ("pk", "sk", "expiresAt")
    );

    let tables: Vec<_> = t.of_type("AWS::DynamoDB::Table").collect();
    assert_eq!(tables.len(), 1, "exactly one state table");
    assert_eq!(tables[0].0, "StateTable");
    let p = t.props("StateTable");
    assert_eq!(p["BillingMode"], "PAY_PER_REQUEST");
    assert_eq!(
        p["KeySchema"],
        json!([
            { "AttributeName": pk, "KeyType": "HASH" },
            { "AttributeName": sk, "KeyType": "RANGE" },
        ])
    );
    assert_eq!(
        p["AttributeDefinitions"],
        json!([
            { "AttributeName": pk, "AttributeType": "S" },
            { "AttributeName": sk, "AttributeType": "S" },
        ]),
        "only the key attributes are declared, both strings"
    );
    assert_eq!(
        p["TimeToLiveSpecification"],
        json!({ "AttributeName": ttl, "Enabled": true })
    );
    assert_eq!(
        p["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"],
        true
    );
    assert!(
        p.get("GlobalSecondaryIndexes").is_none() && p.get("LocalSecondaryIndexes").is_none(),
        "the code queries the base table only"
    );
    // The ledger must outlive the stack (it records which targets tgsync registered).
    assert_eq!(t.resource("StateTable")["DeletionPolicy"], "Retain");
}

/// The state table's name as the template passes it on: the one it created, or the one
/// named by ExistingTableName.
fn table_name() -> Value {
    json!({ "Fn::If": ["CreateTable", { "Ref": "StateTable" }, { "Ref": "ExistingTableName" }] })
}

/// The ARN of the table named by ExistingTableName.
fn existing_table_arn() -> Value {
    json!({ "Fn::Sub": "arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${ExistingTableName}" })
}

/// The state table's ARN, for the grants.
fn table_arn() -> Value {
    json!({ "Fn::If": ["CreateTable", get_att("StateTable", "Arn"), existing_table_arn()] })
}

/// A redeployed stack can keep the ledger of the one before it: with ExistingTableName the
/// table is not created, both functions use the named table, and the grants name it.
#[test]
fn an_existing_table_replaces_the_new_one() {
    let t = Template::load();
    assert_eq!(t.resource("StateTable")["Condition"], "CreateTable");
    let refs = BTreeMap::from([("StateTable", "tgsync-StateTable-ABC123")]);
    for (given, created, name) in [
        (
            vec![("ClusterName", "demo")],
            true,
            "tgsync-StateTable-ABC123",
        ),
        (
            vec![
                ("ClusterName", "demo"),
                ("ExistingTableName", "tgsync-old-StateTable-XYZ"),
            ],
            false,
            "tgsync-old-StateTable-XYZ",
        ),
    ] {
        let deployment = t.parameters(&given);
        assert_eq!(deployment.conditions["CreateTable"], created, "{given:?}");
        for function in ["ResyncFunction", "PodEventsFunction"] {
            let vars = &t.props(function)["Environment"]["Variables"];
            assert_eq!(
                resolve(&vars["TGSYNC_TABLE_NAME"], &deployment, &refs),
                name,
                "{function} with {given:?}"
            );
        }
        let output = resolve(
            &t.doc["Outputs"]["StateTableName"]["Value"],
            &deployment,
            &refs,
        );
        assert_eq!(output, name, "{given:?}");
        let want = if created {
            get_att("StateTable", "Arn")
        } else {
            existing_table_arn()
        };
        let grants: Vec<Value> = statements(&t)
            .iter()
            .filter(|(_, s)| actions(s).iter().any(|a| a.starts_with("dynamodb:")))
            .map(|(_, s)| resolve(&s["Resource"], &deployment, &refs))
            .collect();
        assert!(!grants.is_empty(), "no DynamoDB grant");
        for grant in grants {
            assert_eq!(grant, want, "{given:?}");
        }
    }
    // Every other reference to the table goes through the same choice.
    fn unguarded(v: &Value, path: &str, found: &mut Vec<String>) {
        match v {
            Value::Object(m)
                if m.get("Fn::If").and_then(|a| a[0].as_str()) == Some("CreateTable") => {}
            Value::Object(m) => {
                let names_table = m.get("Ref") == Some(&json!("StateTable"))
                    || m.get("Fn::GetAtt").and_then(|a| a[0].as_str()) == Some("StateTable");
                if names_table {
                    found.push(path.to_owned());
                }
                for (k, v) in m {
                    unguarded(v, &format!("{path}.{k}"), found);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    unguarded(v, &format!("{path}[{i}]"), found);
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    for (name, resource) in t.resources() {
        if name != "StateTable" {
            unguarded(resource, name, &mut found);
        }
    }
    unguarded(&t.doc["Outputs"], "Outputs", &mut found);
    assert!(
        found.is_empty(),
        "StateTable used without Fn::If CreateTable: {found:?}"
    );
}

// ------------------------------------------------------------------------------------
// IAM
// ------------------------------------------------------------------------------------

/// Every IAM statement in the template, with where it is.
fn statements(t: &Template) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut push = |owner: String, doc: &Value| {
        for s in as_list(&doc["Statement"]) {
            // A statement under `!If` is checked as granted (its widest case).
            match s.get("Fn::If").and_then(Value::as_array) {
                Some(branches) => {
                    for branch in &branches[1..] {
                        if branch.get("Ref").is_none() {
                            out.push((owner.clone(), branch.clone()));
                        }
                    }
                }
                None => out.push((owner.clone(), s)),
            }
        }
    };
    for (name, r) in t.resources() {
        let p = &r["Properties"];
        match r["Type"].as_str() {
            Some("AWS::IAM::Role") => {
                for pol in as_list(&p["Policies"]) {
                    push(
                        format!("{name}/{}", pol["PolicyName"]),
                        &pol["PolicyDocument"],
                    );
                }
            }
            Some("AWS::IAM::ManagedPolicy" | "AWS::IAM::Policy") => {
                push(name.clone(), &p["PolicyDocument"]);
            }
            Some("AWS::Serverless::Function") => {
                // SAM policy templates would hide what is granted; roles are explicit.
                assert!(
                    p.get("Policies").is_none(),
                    "{name}: grant permissions in its explicit role, not with SAM Policies"
                );
            }
            _ => {}
        }
    }
    out
}

/// Whether IAM action pattern `pattern` (may hold `*` and `?`) covers `action`.
fn action_matches(pattern: &str, action: &str) -> bool {
    fn glob(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
            (Some(b'?'), Some(_)) => glob(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a.eq_ignore_ascii_case(b) => glob(&p[1..], &s[1..]),
            _ => false,
        }
    }
    glob(pattern.as_bytes(), action.as_bytes())
}

fn actions(statement: &Value) -> Vec<String> {
    as_list(&statement["Action"])
        .iter()
        .map(|a| a.as_str().expect("actions are plain strings").to_owned())
        .collect()
}

const MUTATIONS: [&str; 2] = [
    "elasticloadbalancing:RegisterTargets",
    "elasticloadbalancing:DeregisterTargets",
];

#[test]
fn target_group_changes_are_limited_to_this_clusters_groups() {
    let t = Template::load();
    let all = statements(&t);
    assert!(!all.is_empty());
    let mut granted = BTreeSet::new();
    let mut released = false;
    for (owner, s) in &all {
        assert!(
            s.get("NotAction").is_none() && s.get("NotResource").is_none(),
            "{owner}: NotAction/NotResource make the grant hard to bound"
        );
        if s["Effect"] != "Allow" {
            continue;
        }
        let acts = actions(s);
        for mutation in MUTATIONS {
            let Some(pattern) = acts.iter().find(|a| action_matches(a, mutation)) else {
                continue;
            };
            granted.insert(mutation);
            assert_eq!(
                pattern, mutation,
                "{owner}: {mutation} must be named exactly, not through `{pattern}`"
            );
            let untagged = json!({ "Null": { "aws:ResourceTag/tgsync/cluster": "true" } });
            if s["Sid"] == "ReleaseUntaggedTargetGroups" {
                // The way out: deregister only, on groups no deployment is bound to.
                assert_eq!(acts, ["elasticloadbalancing:DeregisterTargets"], "{owner}");
                assert_eq!(s["Condition"], untagged, "{owner}");
                released = true;
            } else {
                assert_eq!(
                    s["Condition"],
                    json!({ "StringEquals": { "aws:ResourceTag/tgsync/cluster": { "Ref": "ClusterName" } } }),
                    "{owner}: {mutation} only on target groups tagged tgsync/cluster=<ClusterName>"
                );
            }
            assert_eq!(
                s["Resource"],
                json!({ "Fn::Sub": "arn:${AWS::Partition}:elasticloadbalancing:${AWS::Region}:${AWS::AccountId}:targetgroup/*/*" }),
                "{owner}: {mutation} on target groups of this account and region only"
            );
        }
    }
    assert_eq!(
        granted,
        BTreeSet::from(MUTATIONS),
        "both mutations are granted"
    );
    assert!(
        released,
        "the release of untagged groups can be granted (ReleaseUntaggedGroups)"
    );
}

/// The release of untagged groups is off unless asked for, and then the resync role's
/// alone: pod-events never releases, so it may never deregister a target of a group no
/// deployment is bound to.
#[test]
fn release_of_untagged_groups_is_off_by_default_and_the_resync_roles_alone() {
    let t = Template::load();
    assert_eq!(
        t.parameter_default("ReleaseUntaggedGroups"),
        Some(&json!("false"))
    );
    for (given, granted) in [
        (vec![("ClusterName", "demo")], false),
        (
            vec![("ClusterName", "demo"), ("ReleaseUntaggedGroups", "true")],
            true,
        ),
    ] {
        let deployment = t.parameters(&given);
        // Statements as this deployment creates them, per role.
        let mut holders = BTreeSet::new();
        for (name, r) in t.resources() {
            let p = &r["Properties"];
            let (roles, docs): (Vec<String>, Vec<Value>) = match r["Type"].as_str() {
                Some("AWS::IAM::Role") => (
                    vec![name.clone()],
                    as_list(&p["Policies"])
                        .iter()
                        .map(|pol| pol["PolicyDocument"].clone())
                        .collect(),
                ),
                Some("AWS::IAM::ManagedPolicy") => (
                    t.of_type("AWS::IAM::Role")
                        .filter(|(_, role)| {
                            as_list(&resolve(
                                &role["Properties"]["ManagedPolicyArns"],
                                &deployment,
                                &BTreeMap::new(),
                            ))
                            .contains(&json!({ "Ref": name }))
                        })
                        .map(|(role, _)| role.clone())
                        .collect(),
                    vec![p["PolicyDocument"].clone()],
                ),
                Some("AWS::IAM::Policy") => (
                    as_list(&p["Roles"])
                        .iter()
                        .filter_map(|r| r["Ref"].as_str().map(str::to_owned))
                        .collect(),
                    vec![p["PolicyDocument"].clone()],
                ),
                _ => continue,
            };
            for doc in docs {
                let doc = resolve(&doc, &deployment, &BTreeMap::new());
                for s in as_list(&doc["Statement"]) {
                    let untagged =
                        s["Condition"]["Null"]["aws:ResourceTag/tgsync/cluster"] == "true";
                    if s["Effect"] == "Allow" && untagged {
                        assert_eq!(
                            actions(&s),
                            ["elasticloadbalancing:DeregisterTargets"],
                            "{name}"
                        );
                        holders.extend(roles.iter().cloned());
                    }
                }
            }
        }
        let want: BTreeSet<String> = if granted {
            BTreeSet::from(["ResyncRole".to_owned()])
        } else {
            BTreeSet::new()
        };
        assert_eq!(holders, want, "{given:?}");
    }
}

/// PermissionsBoundary, when given, bounds every role the stack creates (the functions
/// name their roles, so SAM creates none of its own).
#[test]
fn every_role_gets_the_permissions_boundary() {
    let t = Template::load();
    let roles: Vec<&String> = t.of_type("AWS::IAM::Role").map(|(n, _)| n).collect();
    assert!(roles.len() >= 2, "{roles:?}");
    for role in roles {
        assert_eq!(
            t.props(role)["PermissionsBoundary"],
            json!({ "Fn::If": ["HasPermissionsBoundary", { "Ref": "PermissionsBoundary" }, { "Ref": "AWS::NoValue" }] }),
            "{role}"
        );
    }
    for (name, f) in t.of_type("AWS::Serverless::Function") {
        assert!(
            f["Properties"].get("Role").is_some(),
            "{name}: without Role, SAM would create a role without the boundary"
        );
    }
    assert_eq!(t.parameter_default("PermissionsBoundary"), Some(&json!("")));
    let with = t.parameters(&[
        ("ClusterName", "demo"),
        (
            "PermissionsBoundary",
            "arn:aws:iam::123456789012:policy/boundary",
        ),
    ]);
    assert!(with.conditions["HasPermissionsBoundary"]);
    assert!(!t.parameters(&[("ClusterName", "demo")]).conditions["HasPermissionsBoundary"]);
}

#[test]
fn every_grant_is_what_the_functions_need() {
    let t = Template::load();
    let table = table_arn();
    let cluster_arn = json!({ "Fn::Sub": "arn:${AWS::Partition}:eks:${AWS::Region}:${AWS::AccountId}:cluster/${ClusterName}" });
    let describe = [
        "elasticloadbalancing:DescribeTargetGroups",
        "elasticloadbalancing:DescribeTags",
        "elasticloadbalancing:DescribeTargetHealth",
        // The rollout check's read of a group's attributes.
        "elasticloadbalancing:DescribeTargetGroupAttributes",
    ];
    let dynamo = tgsync::aws::DYNAMODB_IAM_ACTIONS;
    let mut seen = BTreeSet::new();
    for (owner, s) in statements(&t) {
        if s["Effect"] != "Allow" {
            continue;
        }
        for action in actions(&s) {
            assert!(!action.contains('*'), "{owner}: wildcard action {action}");
            assert!(
                !action.eq_ignore_ascii_case("sts:GetCallerIdentity"),
                "{owner}: the EKS token is a presigned URL; no STS call needs this grant"
            );
            let resource = &s["Resource"];
            if describe.contains(&action.as_str()) {
                assert_eq!(
                    resource, "*",
                    "{owner}: {action} has no resource-level permissions"
                );
            } else if MUTATIONS.contains(&action.as_str()) {
                // checked by target_group_changes_are_limited_to_this_clusters_groups
            } else if action == "eks:DescribeCluster" {
                assert_eq!(resource, &cluster_arn, "{owner}: this cluster only");
            } else if action == "ec2:DescribeAvailabilityZones" {
                // A zone named to another account's group; no resource-level permissions.
                assert_eq!(resource, "*", "{owner}");
                let resource_name = owner.split('/').next().unwrap_or_default();
                assert_eq!(
                    t.resource(resource_name)["Condition"],
                    "HasTargetAccounts",
                    "{owner}: only with target accounts"
                );
            } else if dynamo.contains(&action.as_str()) {
                assert_eq!(resource, &table, "{owner}: the state table only");
                assert_eq!(
                    s["Condition"],
                    json!({ "ForAllValues:StringLike": { "dynamodb:LeadingKeys": [
                        { "Fn::If": [
                            "HasTargetAccounts",
                            { "Fn::Sub": "tg#arn:${AWS::Partition}:elasticloadbalancing:${AWS::Region}:*:targetgroup/*" },
                            { "Fn::Sub": "tg#arn:${AWS::Partition}:elasticloadbalancing:${AWS::Region}:${AWS::AccountId}:targetgroup/*" },
                        ] },
                        { "Fn::Sub": "owners#${ClusterName}" },
                        { "Fn::Sub": "tg#${ClusterName}#*" },
                    ] } }),
                    "{owner}: only this deployment's partitions of a shared table"
                );
            } else if action.starts_with("logs:") {
                let r = resource.to_string();
                assert!(
                    r.contains("LogGroup"),
                    "{owner}: {action} on its own log group: {r}"
                );
            } else if action == "sqs:SendMessage" {
                assert_eq!(resource, &get_att("DeadLetterQueue", "Arn"), "{owner}");
            } else if action == "sts:AssumeRole" {
                // checked by target_account_roles_are_assumable_only_when_listed
                assert_eq!(
                    resource,
                    &json!({ "Ref": "TargetAccountRoleArns" }),
                    "{owner}"
                );
            } else {
                panic!("{owner}: unexpected grant {action}");
            }
            seen.insert(action);
        }
    }
    for needed in describe.iter().chain(&MUTATIONS).chain(&dynamo) {
        assert!(seen.contains(*needed), "{needed} is not granted");
    }
    assert!(seen.contains("eks:DescribeCluster"));
}

/// Cross-account: both functions may assume exactly the roles listed in
/// TargetAccountRoleArns, and nothing at all when the list is empty (the default); the
/// list and the external ID reach both functions as the settings read them.
#[test]
fn target_account_roles_are_assumable_only_when_listed() {
    let t = Template::load();
    let roles =
        "arn:aws:iam::222222222222:role/tgsync-demo,arn:aws:iam::333333333333:role/net/tgsync-demo";
    let refs = BTreeMap::from([("StateTable", "tgsync-StateTable-ABC123")]);
    for (given, listed) in [
        (vec![("ClusterName", "demo")], Vec::<&str>::new()),
        (
            vec![
                ("ClusterName", "demo"),
                ("TargetAccountRoleArns", roles),
                ("TargetAccountExternalId", "demo-7f3a"),
            ],
            roles.split(',').collect(),
        ),
    ] {
        let deployment = t.parameters(&given);
        // The grants this deployment creates: statements of resources whose condition
        // (if any) holds.
        let mut assumable: Vec<Value> = Vec::new();
        for (owner, s) in statements(&t) {
            let acts = actions(&s);
            if !acts.iter().any(|a| action_matches(a, "sts:AssumeRole")) {
                continue;
            }
            let resource_name = owner.split('/').next().unwrap_or_default();
            let condition = &t.resource(resource_name)["Condition"];
            assert_eq!(
                condition, "HasTargetAccounts",
                "{owner}: sts:AssumeRole only under HasTargetAccounts"
            );
            assert_eq!(acts, ["sts:AssumeRole"], "{owner}: nothing else from STS");
            assert!(s.get("Condition").is_none(), "{owner}");
            let attached = &t.props(resource_name)["Roles"];
            assert_eq!(
                attached,
                &json!([{ "Ref": "ResyncRole" }, { "Ref": "PodEventsRole" }]),
                "{owner}: both functions assume the roles"
            );
            if deployment.conditions["HasTargetAccounts"] {
                assumable.extend(as_list(&resolve(&s["Resource"], &deployment, &refs)));
            }
        }
        let want: Vec<Value> = listed.iter().map(|a| json!(a)).collect();
        assert_eq!(assumable, want, "{given:?}");
        assert_eq!(
            deployment.conditions["HasTargetAccounts"],
            !listed.is_empty(),
            "{given:?}"
        );
        for function in ["ResyncFunction", "PodEventsFunction"] {
            let vars = t.props(function)["Environment"]["Variables"]
                .as_object()
                .unwrap_or_else(|| panic!("{function}: Environment.Variables"));
            let env: BTreeMap<String, String> = vars
                .iter()
                .map(|(k, v)| {
                    let v = resolve(v, &deployment, &refs);
                    let v = v.as_str().unwrap_or_else(|| {
                        panic!("{function}: {k} does not resolve to a string: {v}")
                    });
                    (k.clone(), v.to_owned())
                })
                .collect();
            let settings = Settings::from_lookup(|k| env.get(k).cloned())
                .unwrap_or_else(|e| panic!("{function}: {e}"));
            let arns: Vec<&str> = settings
                .target_account_roles
                .iter()
                .map(|r| r.arn())
                .collect();
            assert_eq!(arns, listed, "{function} with {given:?}");
            assert_eq!(
                settings.target_account_external_id.is_some(),
                !listed.is_empty(),
                "{function} with {given:?}"
            );
        }
    }
}

/// infra/target-account-role.yaml, the role a target account creates: trusted by the
/// two function roles (with the external ID when given), allowed to read every group
/// and to change only the groups tagged for the cluster, as the stack's own policy.
#[test]
fn target_account_role_matches_the_stacks_own_limits() {
    let yaml: serde_norway::Value = serde_norway::from_str(&read("infra/target-account-role.yaml"))
        .expect("infra/target-account-role.yaml is YAML");
    let doc = to_json(yaml);
    let role = &doc["Resources"]["TargetAccountRole"]["Properties"];
    let trust = &as_list(&role["AssumeRolePolicyDocument"]["Statement"])[0];
    assert_eq!(trust["Action"], "sts:AssumeRole");
    assert_eq!(
        trust["Principal"]["AWS"],
        json!([{ "Ref": "ResyncRoleArn" }, { "Ref": "PodEventsRoleArn" }])
    );
    assert_eq!(
        trust["Condition"],
        json!({ "Fn::If": ["HasExternalId",
            { "StringEquals": { "sts:ExternalId": { "Ref": "ExternalId" } } },
            { "Ref": "AWS::NoValue" }] })
    );
    let t = Template::load();
    let own: Vec<Value> = statements(&t).into_iter().map(|(_, s)| s).collect();
    let statements: Vec<Value> = as_list(&role["Policies"])
        .iter()
        .flat_map(|p| as_list(&p["PolicyDocument"]["Statement"]))
        .collect();
    let mut seen = BTreeSet::new();
    let mut released = false;
    for s in &statements {
        // The release of untagged groups, under !If ReleaseUntagged: as the stack's.
        if let Some(branches) = s.get("Fn::If").and_then(Value::as_array) {
            assert_eq!(branches[0], "ReleaseUntagged");
            assert_eq!(branches[2], json!({ "Ref": "AWS::NoValue" }));
            let stack = own
                .iter()
                .find(|o| o["Sid"] == "ReleaseUntaggedTargetGroups")
                .expect("the stack grants the release");
            assert_eq!(&branches[1], stack, "the same statement as the stack's");
            released = true;
            continue;
        }
        assert_eq!(s["Effect"], "Allow");
        let acts = actions(s);
        seen.extend(acts.iter().cloned());
        if acts.iter().any(|a| MUTATIONS.contains(&a.as_str())) {
            assert_eq!(acts, MUTATIONS, "the two mutations, named exactly");
            let stack = own
                .iter()
                .find(|o| actions(o) == MUTATIONS)
                .expect("the stack grants the mutations");
            assert_eq!(
                s["Resource"], stack["Resource"],
                "target groups of the account and region"
            );
            let branches = s["Condition"]["Fn::If"].as_array().expect("Condition: !If");
            assert_eq!(branches[0], "SharedGroups");
            assert_eq!(branches[2], stack["Condition"], "exact match by default");
            assert_eq!(
                branches[1],
                json!({ "StringLike": { "aws:ResourceTag/tgsync/cluster": [
                    { "Ref": "ClusterName" },
                    { "Fn::Sub": "${ClusterName} *" },
                    { "Fn::Sub": "* ${ClusterName}" },
                    { "Fn::Sub": "* ${ClusterName} *" },
                ] } }),
                "the StringLike variant for groups shared by several clusters"
            );
        } else {
            let stack = own
                .iter()
                .find(|o| actions(o) == acts)
                .unwrap_or_else(|| panic!("the stack grants {acts:?} too"));
            assert_eq!(s["Resource"], stack["Resource"], "{acts:?}");
            assert!(
                acts.iter()
                    .all(|a| a.starts_with("elasticloadbalancing:Describe")
                        || a == "ec2:DescribeAvailabilityZones"),
                "{acts:?}"
            );
        }
    }
    let want: BTreeSet<String> = [
        "elasticloadbalancing:DescribeTargetGroups",
        "elasticloadbalancing:DescribeTags",
        "elasticloadbalancing:DescribeTargetHealth",
        "elasticloadbalancing:DescribeTargetGroupAttributes",
        "ec2:DescribeAvailabilityZones",
    ]
    .iter()
    .chain(&MUTATIONS)
    .map(|a| (*a).to_owned())
    .collect();
    assert_eq!(seen, want);
    assert!(
        released,
        "the target account role can release untagged groups too"
    );
}

#[test]
fn both_functions_get_the_reconcile_policy_and_vpc_access_only_with_a_vpc() {
    let t = Template::load();
    let vpc_policy = json!({ "Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole" });
    for function in ["ResyncFunction", "PodEventsFunction", "ManualFunction"] {
        let role_ref = &t.props(function)["Role"];
        let role = role_ref["Fn::GetAtt"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{function}: Role is !GetAtt <Role>.Arn, got {role_ref}"));
        assert_eq!(t.resource(role)["Type"], "AWS::IAM::Role");
        let arns = &t.props(role)["ManagedPolicyArns"];
        let branches = &arns["Fn::If"];
        assert_eq!(
            branches[0], "HasVpc",
            "{role}: VPC access under the HasVpc condition"
        );
        let with_vpc = as_list(&branches[1]);
        let without_vpc = as_list(&branches[2]);
        let reconcile = json!({ "Ref": "ReconcilePolicy" });
        assert!(
            with_vpc.contains(&reconcile) && without_vpc.contains(&reconcile),
            "{role}"
        );
        assert!(with_vpc.contains(&vpc_policy), "{role}");
        assert!(!without_vpc.contains(&vpc_policy), "{role}");
        let vpc_config = &t.props(function)["VpcConfig"]["Fn::If"];
        assert_eq!(
            vpc_config[0], "HasVpc",
            "{function}: VpcConfig only with HasVpc"
        );
        assert_eq!(vpc_config[2], json!({ "Ref": "AWS::NoValue" }));
    }
    let has_vpc = &t.doc["Conditions"]["HasVpc"]["Fn::And"];
    assert_eq!(
        has_vpc,
        &json!([{ "Condition": "HasSubnets" }, { "Condition": "HasSecurityGroups" }]),
        "a VPC configuration needs both subnets and security groups"
    );
}

// ------------------------------------------------------------------------------------
// The pod-events rule
// ------------------------------------------------------------------------------------

/// The subset of EventBridge pattern matching the template uses: nested objects, and
/// arrays of exact values (a match when the event's value, or any element of an array
/// value, equals one of them). A missing field never matches.
fn pattern_matches(pattern: &Value, event: &Value) -> bool {
    let (Value::Object(pattern), Value::Object(event)) = (pattern, event) else {
        return false;
    };
    pattern.iter().all(|(key, want)| {
        let Some(got) = event.get(key) else {
            return false;
        };
        match want {
            Value::Object(_) => pattern_matches(want, got),
            Value::Array(allowed) => {
                for a in allowed {
                    assert!(
                        !a.is_object() && !a.is_array(),
                        "content filter {a} in the rule: extend pattern_matches"
                    );
                }
                match got {
                    Value::Array(values) => values.iter().any(|v| allowed.contains(v)),
                    Value::Object(_) => false,
                    scalar => allowed.contains(scalar),
                }
            }
            other => panic!("pattern field {key} must be an object or an array, got {other}"),
        }
    })
}

fn pod_events_rule(t: &Template) -> (&String, &Value) {
    let target = get_att("PodEventsFunction", "Arn");
    let rules: Vec<_> = t
        .of_type("AWS::Events::Rule")
        .filter(|(_, r)| {
            as_list(&r["Properties"]["Targets"])
                .iter()
                .any(|tg| tg["Arn"] == target)
        })
        .collect();
    assert_eq!(rules.len(), 1, "exactly one rule targets pod-events");
    rules[0]
}

fn event(file: &str) -> Value {
    serde_json::from_str(&read(format!("events/{file}"))).expect("events are JSON")
}

#[test]
fn pod_events_rule_matches_the_exporters_events_for_this_cluster_only() {
    let t = Template::load();
    let (_, rule) = pod_events_rule(&t);
    let raw = &rule["Properties"]["EventPattern"];
    assert_eq!(
        raw,
        &json!({
            "source": [{ "Ref": "EventSource" }],
            "detail": {
                "involvedObject": { "kind": ["Pod"] },
                "clusterName": [{ "Ref": "ClusterName" }],
            },
        })
    );
    assert_eq!(
        t.parameter_default("EventSource"),
        Some(&json!("kubernetes-event-exporter"))
    );
    assert_eq!(t.parameter_default("EventBusName"), Some(&json!("default")));
    assert_eq!(
        rule["Properties"]["EventBusName"],
        json!({ "Ref": "EventBusName" })
    );
    assert!(
        t.parameter_default("ClusterName").is_none(),
        "ClusterName is required"
    );

    let demo = resolve(
        raw,
        &t.parameters(&[("ClusterName", "demo")]),
        &BTreeMap::new(),
    );
    assert!(pattern_matches(&demo, &event("pod-started.json")));
    assert!(!pattern_matches(&demo, &event("pod-foreign-cluster.json")));
    let other = resolve(
        raw,
        &t.parameters(&[("ClusterName", "other")]),
        &BTreeMap::new(),
    );
    assert!(pattern_matches(&other, &event("pod-foreign-cluster.json")));
    assert!(!pattern_matches(&other, &event("pod-started.json")));
    let elsewhere = resolve(
        raw,
        &t.parameters(&[("ClusterName", "demo"), ("EventSource", "pod-bridge")]),
        &BTreeMap::new(),
    );
    assert!(!pattern_matches(&elsewhere, &event("pod-started.json")));
}

/// What the rule delivers, the function acts on: every sample EventBridge event the rule
/// matches parses as a pod event, and the rule drops what the parser would ignore anyway
/// (another cluster, a malformed involvedObject).
/// infra/kubernetes-event-exporter.yaml sends what the stack's rule and pod-events
/// expect: the default `source` and bus, only Pod events, the reasons tgsync acts on,
/// and no option the released exporter does not have.
#[test]
fn exporter_config_agrees_with_the_stack() {
    let t = Template::load();
    let text = read("infra/kubernetes-event-exporter.yaml");
    let map: serde_norway::Value = serde_norway::from_str(&text).expect("YAML");
    let config = to_json(map)["data"]["config.yaml"]
        .as_str()
        .expect("ConfigMap data config.yaml")
        .to_owned();
    assert!(
        !config.contains("sentUpdateEvent"),
        "sentUpdateEvent is in no release of the exporter"
    );
    let config = to_json(serde_norway::from_str(&config).expect("config.yaml is YAML"));
    let receiver = as_list(&config["receivers"])
        .into_iter()
        .find(|r| r["eventbridge"].is_object())
        .expect("an eventbridge receiver");
    let eventbridge = &receiver["eventbridge"];
    assert_eq!(
        Some(&eventbridge["source"]),
        t.parameter_default("EventSource")
    );
    assert_eq!(
        Some(&eventbridge["eventBusName"]),
        t.parameter_default("EventBusName")
    );
    assert!(
        eventbridge.get("details").is_none(),
        "the whole Event is the detail"
    );
    let routes = as_list(&config["route"]["routes"]);
    let matches: Vec<Value> = routes.iter().flat_map(|r| as_list(&r["match"])).collect();
    let rule = matches
        .iter()
        .find(|m| m["receiver"] == receiver["name"])
        .expect("a route to the eventbridge receiver");
    assert_eq!(rule["kind"], "^Pod$");
    let reasons = rule["reason"].as_str().expect("reason regex");
    for reason in [
        "Started",
        "Killing",
        "Unhealthy",
        "Preempting",
        "Preempted",
        "Evicted",
        "NodeNotReady",
    ] {
        assert!(
            reasons.contains(&format!("|{reason}|"))
                || reasons.contains(&format!("({reason}|"))
                || reasons.contains(&format!("|{reason})")),
            "{reason} is not forwarded: {reasons}"
        );
    }
}

#[test]
fn pod_events_rule_and_parser_agree_on_the_sample_events() {
    let t = Template::load();
    let (_, rule) = pod_events_rule(&t);
    let pattern = resolve(
        &rule["Properties"]["EventPattern"],
        &t.parameters(&[("ClusterName", "demo")]),
        &BTreeMap::new(),
    );
    let mut matched = Vec::new();
    let mut dir: Vec<_> = std::fs::read_dir(root().join("events"))
        .expect("events/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    dir.sort();
    for path in dir {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let payload: Value = serde_json::from_str(&read(&path)).expect("JSON");
        if payload.get("detail-type").is_none() || payload["source"] == "aws.events" {
            continue; // direct invokes and the schedule's event
        }
        if pattern_matches(&pattern, &payload) {
            assert!(
                matches!(parse(&payload, "demo"), Parsed::Pod(_)),
                "{name}: the rule delivers it, so pod-events must act on it"
            );
            matched.push(name);
        }
    }
    for expected in ["pod-killing.json", "pod-started.json", "pod-unhealthy.json"] {
        assert!(
            matched.iter().any(|m| m == expected),
            "{expected} not matched: {matched:?}"
        );
    }
    for dropped in ["pod-foreign-cluster.json", "pod-malformed.json"] {
        assert!(
            !matched.iter().any(|m| m == dropped),
            "{dropped} must be dropped"
        );
    }
}

#[test]
fn failed_pod_events_end_in_the_one_dead_letter_queue() {
    let t = Template::load();
    let (rule_name, rule) = pod_events_rule(&t);
    let dlq = get_att("DeadLetterQueue", "Arn");
    let target = &as_list(&rule["Properties"]["Targets"])[0];
    assert_eq!(target["DeadLetterConfig"]["Arn"], dlq, "delivery failures");
    assert!(target["RetryPolicy"]["MaximumRetryAttempts"].is_u64());

    let invoke = &t.props("PodEventsFunction")["EventInvokeConfig"];
    assert_eq!(
        invoke["DestinationConfig"]["OnFailure"],
        json!({ "Type": "SQS", "Destination": dlq }),
        "invocations that failed after the async retries"
    );
    assert!(invoke["MaximumRetryAttempts"].is_u64());

    // EventBridge may write to the queue for this rule only.
    let policies: Vec<_> = t.of_type("AWS::SQS::QueuePolicy").collect();
    assert_eq!(policies.len(), 1);
    let policy = &policies[0].1["Properties"];
    assert_eq!(policy["Queues"], json!([{ "Ref": "DeadLetterQueue" }]));
    let statement = &as_list(&policy["PolicyDocument"]["Statement"])[0];
    assert_eq!(
        statement["Principal"],
        json!({ "Service": "events.amazonaws.com" })
    );
    assert_eq!(statement["Action"], "sqs:SendMessage");
    assert_eq!(
        statement["Condition"]["ArnEquals"]["aws:SourceArn"],
        get_att(rule_name, "Arn")
    );

    // And EventBridge may invoke pod-events for this rule only.
    let permissions: Vec<_> = t
        .of_type("AWS::Lambda::Permission")
        .filter(|(_, p)| p["Properties"]["FunctionName"] == json!({ "Ref": "PodEventsFunction" }))
        .collect();
    assert_eq!(permissions.len(), 1);
    assert_eq!(
        permissions[0].1["Properties"]["SourceArn"],
        get_att(rule_name, "Arn")
    );
}

// ------------------------------------------------------------------------------------
// Schedule, functions, environment, alarms, outputs
// ------------------------------------------------------------------------------------

#[test]
fn resync_runs_every_minute_by_default() {
    let t = Template::load();
    assert_eq!(t.parameter_default("ScheduleMinutes"), Some(&json!(1)));
    let events = t.props("ResyncFunction")["Events"]
        .as_object()
        .expect("ResyncFunction has Events");
    let schedules: Vec<_> = events
        .values()
        .filter(|e| e["Type"] == "Schedule")
        .collect();
    assert_eq!(schedules.len(), 1);
    let every_minute = t.parameters(&[("ClusterName", "demo")]);
    assert_eq!(
        resolve(
            &schedules[0]["Properties"]["Schedule"],
            &every_minute,
            &BTreeMap::new()
        ),
        json!("rate(1 minute)")
    );
    let slower = t.parameters(&[("ClusterName", "demo"), ("ScheduleMinutes", "3")]);
    assert_eq!(
        resolve(
            &schedules[0]["Properties"]["Schedule"],
            &slower,
            &BTreeMap::new()
        ),
        json!({ "Fn::Sub": "rate(${ScheduleMinutes} minutes)" })
    );
    assert_ne!(schedules[0]["Properties"]["State"], "DISABLED");
    // Watch mode hands over from one run to the next: by default it ends just before the
    // next tick, and at its longest it still ends (with the 10 s margin) before the
    // function's timeout.
    let watch = &t.doc["Parameters"]["WatchSeconds"];
    let default = watch["Default"].as_u64().expect("WatchSeconds default");
    assert!(
        (50..60).contains(&default),
        "WatchSeconds default {default}"
    );
    let longest = watch["MaxValue"].as_u64().expect("WatchSeconds MaxValue");
    let timeout = t.props("ResyncFunction")["Timeout"]
        .as_u64()
        .expect("Timeout");
    assert!(
        longest + 10 < timeout,
        "{longest} s of watch in a {timeout} s function"
    );
    assert!(
        t.props("PodEventsFunction").get("Events").is_none(),
        "pod-events is triggered by PodEventsRule only"
    );
}

/// The package name in a crate's Cargo.toml.
fn package_name(crate_dir: &str) -> String {
    let manifest = read(format!("{crate_dir}/Cargo.toml"));
    let package = manifest
        .split("[package]")
        .nth(1)
        .unwrap_or_else(|| panic!("{crate_dir}/Cargo.toml has no [package]"));
    package
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "name").then(|| v.trim().trim_matches('"').to_owned())
        })
        .expect("package name")
}

#[test]
fn functions_are_rust_on_al2023_arm64_built_by_cargo_lambda() {
    let t = Template::load();
    let functions: BTreeMap<_, _> = t.of_type("AWS::Serverless::Function").collect();
    assert_eq!(
        functions.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
        ["ManualFunction", "PodEventsFunction", "ResyncFunction"]
    );
    // The template's defaults, to resolve a `Ref` to a parameter.
    let defaults = t.parameters(&[("ClusterName", "demo")]);
    let refs = BTreeMap::new();
    for (name, dir, binary, timeout) in [
        ("ResyncFunction", "functions/resync", "tgsync-resync", 190),
        (
            "PodEventsFunction",
            "functions/pod-events",
            "tgsync-pod-events",
            60,
        ),
        ("ManualFunction", "functions/manual", "tgsync-manual", 300),
    ] {
        let f = t.resource(name);
        let p = &f["Properties"];
        assert_eq!(p["Runtime"], "provided.al2023", "{name}");
        assert_eq!(p["Architectures"], json!(["arm64"]), "{name}");
        assert_eq!(p["Handler"], "bootstrap", "{name}");
        assert_eq!(p["Timeout"], timeout, "{name}");
        // The two functions that list every watched pod take `ResyncMemorySize`
        // (256 by default); pod-events lists one namespace.
        let memory: u64 = scalar_string(&resolve(&p["MemorySize"], &defaults, &refs))
            .as_str()
            .and_then(|m| m.parse().ok())
            .expect("MemorySize");
        assert_eq!(memory, 256, "{name}: {memory} MB by default");
        assert_eq!(
            p["MemorySize"] == json!({"Ref": "ResyncMemorySize"}),
            name != "PodEventsFunction",
            "{name}: MemorySize"
        );
        assert_eq!(p["CodeUri"], dir, "{name}: CodeUri is the function's crate");
        assert_eq!(f["Metadata"]["BuildMethod"], "rust-cargolambda", "{name}");
        assert_eq!(f["Metadata"]["BuildProperties"]["Binary"], binary, "{name}");
        assert_eq!(
            package_name(dir),
            binary,
            "{dir}: the binary is the package's"
        );
        assert_eq!(p["LoggingConfig"]["LogFormat"], "JSON", "{name}");
        assert_eq!(
            p["LoggingConfig"]["ApplicationLogLevel"],
            json!({ "Ref": "LogLevel" }),
            "{name}"
        );
    }
}

/// Manual runs have a function of their own with its own slot (never the resync's, which
/// watches), and its release alias is the one the code serves releases through.
#[test]
fn manual_runs_have_their_own_slot_and_release_alias() {
    let t = Template::load();
    let p = t.props("ManualFunction");
    assert_eq!(
        p["AutoPublishAlias"],
        tgsync::handlers::manual::RELEASE_ALIAS,
        "the alias src/handlers/manual.rs serves releases through"
    );
    assert_eq!(
        served_as("functions/manual"),
        tgsync::handlers::manual::FUNCTION
    );
    assert!(p.get("Events").is_none(), "manual runs only");
    let reserved = p["ReservedConcurrentExecutions"].as_u64().unwrap_or(0);
    assert!(reserved >= 1, "a reserved slot of its own");
    assert_eq!(
        p["FunctionName"],
        json!({ "Fn::Sub": "${FunctionNamePrefix}-manual" })
    );
    // The same reconcile work as the resync: its role (access entry, target accounts).
    assert_eq!(p["Role"], get_att("ResyncRole", "Arn"));
    // Only the schedule invokes the resync function.
    let resync = read("functions/resync/src/main.rs");
    assert!(resync.contains("handlers::resync::handle_schedule"));
}

#[test]
fn environment_is_what_the_settings_read() {
    let t = Template::load();
    let known = config_variables();
    for required in ["TGSYNC_CLUSTER_NAME", "TGSYNC_TABLE_NAME"] {
        assert!(
            known.contains(required),
            "src/config.rs no longer reads {required}"
        );
    }
    let params = t.parameters(&[("ClusterName", "demo")]);
    let refs = BTreeMap::from([("StateTable", "tgsync-StateTable-ABC123")]);
    for function in ["ResyncFunction", "PodEventsFunction", "ManualFunction"] {
        let vars = t.props(function)["Environment"]["Variables"]
            .as_object()
            .unwrap_or_else(|| panic!("{function}: Environment.Variables"));
        for name in vars.keys() {
            assert!(
                known.contains(name),
                "{function}: {name} is not read by src/config.rs ({known:?})"
            );
        }
        assert_eq!(vars["TGSYNC_CLUSTER_NAME"], json!({ "Ref": "ClusterName" }));
        assert_eq!(vars["TGSYNC_TABLE_NAME"], table_name());

        // The deployed environment (defaults, ClusterName=demo) is valid for the code.
        let env: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| {
                let v = resolve(v, &params, &refs);
                let v = v
                    .as_str()
                    .unwrap_or_else(|| panic!("{function}: {k} does not resolve to a string: {v}"));
                (k.clone(), v.to_owned())
            })
            .collect();
        let settings = Settings::from_lookup(|k| env.get(k).cloned())
            .unwrap_or_else(|e| panic!("{function}: {e}"));
        assert_eq!(settings.cluster_name, "demo");
        assert_eq!(settings.table_name, "tgsync-StateTable-ABC123");
        // By default tags may name any namespace but not ask for exclusive mode.
        assert_eq!(
            settings.binding_policy(),
            tgsync::core::BindingPolicy::default(),
            "{function}"
        );

        // The binding limits reach both functions.
        let limited = t.parameters(&[
            ("ClusterName", "demo"),
            ("AllowedNamespaces", "shop kafka"),
            ("AllowExclusive", "true"),
        ]);
        let env: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| {
                let v = resolve(v, &limited, &refs);
                (k.clone(), v.as_str().unwrap_or_default().to_owned())
            })
            .collect();
        let settings = Settings::from_lookup(|k| env.get(k).cloned())
            .unwrap_or_else(|e| panic!("{function}: {e}"));
        assert_eq!(
            settings.binding_policy(),
            tgsync::core::BindingPolicy {
                allowed_namespaces: Some(BTreeSet::from(["kafka".to_owned(), "shop".to_owned()])),
                allow_exclusive: true,
            },
            "{function}"
        );
    }

    // pod-events' readiness wait stays well inside its timeout.
    let wait = &t.doc["Parameters"]["ReadyWaitSeconds"];
    let max_wait = wait["MaxValue"]
        .as_u64()
        .expect("ReadyWaitSeconds MaxValue");
    let timeout = t.props("PodEventsFunction")["Timeout"].as_u64().unwrap();
    assert!(
        max_wait < timeout,
        "ReadyWaitSeconds max {max_wait} >= timeout {timeout}"
    );
}

/// The function name a binary passes to `tgsync::app::serve`, which its reports (and the
/// EMF metrics of src/metrics.rs) carry as the `Function` dimension.
fn served_as(crate_dir: &str) -> String {
    let main = read(format!("{crate_dir}/src/main.rs"));
    let needle = "tgsync::app::serve";
    let call = main
        .find(needle)
        .unwrap_or_else(|| panic!("{crate_dir}/src/main.rs no longer calls tgsync::app::serve"));
    let start = call + main[call..].find("(\"").expect("a quoted function name") + 2;
    let len = main[start..].find('"').expect("closing quote");
    main[start..start + len].to_owned()
}

/// The crates of the functions the template deploys.
const FUNCTION_DIRS: [&str; 3] = [
    "functions/resync",
    "functions/pod-events",
    "functions/manual",
];

/// The alarms of the template, by logical id: their `Properties`.
fn alarms(t: &Template) -> BTreeMap<String, Value> {
    t.of_type("AWS::CloudWatch::Alarm")
        .map(|(name, a)| (name.clone(), a["Properties"].clone()))
        .collect()
}

/// The EMF lines src/metrics.rs writes for sample reports and passes of every function
/// (a run line, a changed group, a failing one, an idle one, a lease held, an opened
/// gate), parsed.
fn sample_emf_lines() -> Vec<Value> {
    use tgsync::core::UnixMillis;
    use tgsync::logging::LambdaLevel;
    use tgsync::metrics::{PassDone, emf_lines, gate_lines, pass_lines};
    use tgsync::report::{GroupReport, Outcome, Report};
    let mut out = Vec::new();
    let at = UnixMillis(1_800_000_000_500);
    for dir in FUNCTION_DIRS {
        let function: &'static str = Box::leak(served_as(dir).into_boxed_str());
        let mut r = Report::new(function, "demo", false, UnixMillis(1_800_000_000_000));
        r.watch = Some(Default::default());
        // A full resync's report also counts orphans.
        r.orphans = Some(Vec::new());
        let r = r.finish(at);
        let mut changed = GroupReport::new("arn:a", "web", Outcome::Changed);
        changed.registered_targets = Some(2);
        changed.healthy_targets = Some(1);
        // A pod whose address ELBv2 never takes.
        changed.pod_errors.push(tgsync::report::PodError {
            pod: "shop/web-9".into(),
            error: "address 169.254.1.1 is link-local".into(),
            unusable_address: Some("169.254.1.1".into()),
        });
        // Pods whose termination is too short for the group's NLB (the rollout check).
        let short = tgsync::core::PodFacts::from_pod(
            tgsync::testkit::PodBuilder::new("shop", "web-11")
                .ip("10.0.1.11")
                .build(),
        );
        changed.rollout = Some(tgsync::core::rollout::check(
            [&short],
            tgsync::core::rollout::Latency::watch(),
            Ok(&tgsync::core::rollout::GroupAttributes {
                protocol: Some("TCP".into()),
                ..Default::default()
            }),
            tgsync::core::rollout::Allowances::default(),
            false,
        ));
        // A registration waiting target by target (a refused address).
        changed.waiting.push(tgsync::report::WaitingTarget {
            target: "10.0.1.9:8080".parse().unwrap(),
            pod: "shop/web-10".into(),
            reason: "InvalidTarget: not in the VPC".into(),
            retry_at: tgsync::core::UnixMillis(5_000),
        });
        let groups = [
            changed,
            GroupReport::new("arn:b", "quiet", Outcome::InSync),
            GroupReport::with_error(
                "arn:c",
                "broken",
                Outcome::Failed,
                "reading target health failed",
            ),
            GroupReport::new("arn:d", "busy", Outcome::LeaseHeld),
        ];
        let mut lines = emf_lines(&r, LambdaLevel::Info);
        assert_eq!(lines.len(), 2, "{dir}: the run line and the orphans line");
        for g in &groups {
            lines.extend(pass_lines(
                &PassDone {
                    function,
                    cluster: "demo",
                    report: g,
                    dry_run: false,
                    reaction: Some(std::time::Duration::from_millis(300)),
                    at,
                },
                LambdaLevel::Info,
            ));
        }
        lines.extend(gate_lines(
            function,
            "demo",
            at,
            std::time::Duration::from_millis(900),
            LambdaLevel::Info,
        ));
        assert_eq!(
            lines.len(),
            2 + 4 + 1,
            "{dir}: run, orphans, four passes, a gate"
        );
        out.extend(
            lines
                .iter()
                .map(|l| serde_json::from_str::<Value>(l).expect("EMF line is JSON")),
        );
    }
    out
}

/// What src/metrics.rs emits (see [`sample_emf_lines`]): for each metric name, the
/// (namespace, dimension names) it is emitted under.
fn emitted_metrics() -> BTreeMap<String, BTreeSet<(String, Vec<String>)>> {
    let mut out: BTreeMap<String, BTreeSet<(String, Vec<String>)>> = BTreeMap::new();
    for v in sample_emf_lines() {
        for directive in as_list(&v["_aws"]["CloudWatchMetrics"]) {
            let namespace = directive["Namespace"].as_str().unwrap().to_owned();
            for dims in as_list(&directive["Dimensions"]) {
                let mut dims: Vec<String> = as_list(&dims)
                    .iter()
                    .map(|d| d.as_str().unwrap().to_owned())
                    .collect();
                dims.sort();
                for m in as_list(&directive["Metrics"]) {
                    out.entry(m["Name"].as_str().unwrap().to_owned())
                        .or_default()
                        .insert((namespace.clone(), dims.clone()));
                }
            }
        }
    }
    out
}

/// The unit each emitted metric is declared with (`Count`, `Milliseconds`).
fn metric_units() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for v in sample_emf_lines() {
        for directive in as_list(&v["_aws"]["CloudWatchMetrics"]) {
            for m in as_list(&directive["Metrics"]) {
                let (name, unit) = (m["Name"].as_str().unwrap(), m["Unit"].as_str().unwrap());
                let before = out.insert(name.to_owned(), unit.to_owned());
                assert!(
                    before.is_none_or(|b| b == unit),
                    "{name} is declared with two units"
                );
            }
        }
    }
    out
}

/// What the code emits: for each metric name, the (namespace, dimension names) it is
/// emitted under (what the dashboard and the alarms may rely on).
fn known_metrics() -> BTreeMap<String, BTreeSet<(String, Vec<String>)>> {
    let known = emitted_metrics();
    // The controller's metrics the dashboard and `WatchNotRunningAlarm` rely on.
    for (name, dims) in [
        ("ReactionLatency", &["Cluster", "Function"][..]),
        ("GateLatency", &["Cluster", "Function"]),
        ("ElbThrottles", &["Cluster", "Function"]),
        ("ElbRetries", &["Cluster", "Function"]),
        ("WatchRunning", &["Cluster", "Function"]),
        ("WatchedSeconds", &["Cluster", "Function"]),
        ("DesiredTargets", &["Cluster", "Function", "TargetGroup"]),
        ("RegisteredTargets", &["Cluster", "Function", "TargetGroup"]),
        ("HealthyTargets", &["Cluster", "Function", "TargetGroup"]),
    ] {
        let dims: Vec<String> = dims.iter().map(|d| (*d).to_owned()).collect();
        assert!(
            known
                .get(name)
                .is_some_and(|e| e.contains(&("tgsync".to_owned(), dims.clone()))),
            "{name} is not emitted under {dims:?}: {:?}",
            known.get(name)
        );
    }
    known
}

/// The metrics an alarm reads: `{Namespace, MetricName, Dimensions}` of an alarm on one
/// metric, or of each `MetricStat` of a metric math alarm.
fn alarm_metrics(a: &Value) -> Vec<Value> {
    match a.get("Metrics") {
        Some(list) => as_list(list)
            .iter()
            .filter_map(|m| m.get("MetricStat"))
            .map(|s| s["Metric"].clone())
            .collect(),
        None => vec![json!({
            "Namespace": a["Namespace"],
            "MetricName": a["MetricName"],
            "Dimensions": a["Dimensions"],
        })],
    }
}

/// Alarm `name`'s metric is one that exists: tgsync's own under the namespace and
/// dimensions the code emits it with, AWS metrics of this stack's own resources.
fn check_alarm_metric(
    t: &Template,
    name: &str,
    metric: &str,
    namespace: &str,
    dims: &[Value],
    emitted: &BTreeMap<String, BTreeSet<(String, Vec<String>)>>,
    functions: &BTreeSet<String>,
) {
    match namespace {
        "tgsync" => {
            let mut names: Vec<String> = dims
                .iter()
                .map(|d| d["Name"].as_str().unwrap().to_owned())
                .collect();
            names.sort();
            let known = emitted
                .get(metric)
                .unwrap_or_else(|| panic!("{name}: src/metrics.rs emits no {metric}"));
            assert!(
                known.contains(&(namespace.to_owned(), names.clone())),
                "{name}: {metric} is emitted under {known:?}, not {names:?}"
            );
            for d in dims {
                match d["Name"].as_str().unwrap() {
                    "Function" => assert!(
                        functions.contains(d["Value"].as_str().unwrap_or_default()),
                        "{name}: Function {} is not a served name ({functions:?})",
                        d["Value"]
                    ),
                    "Cluster" => {
                        assert_eq!(d["Value"], json!({ "Ref": "ClusterName" }), "{name}")
                    }
                    other => panic!("{name}: unexpected dimension {other}"),
                }
            }
        }
        "AWS/Lambda" => {
            assert_eq!(dims.len(), 1, "{name}");
            assert_eq!(dims[0]["Name"], "FunctionName", "{name}");
            let function = dims[0]["Value"]["Ref"].as_str().expect("Ref to a function");
            assert_eq!(
                t.resource(function)["Type"],
                "AWS::Serverless::Function",
                "{name}"
            );
        }
        "AWS/SQS" => {
            assert_eq!(
                dims,
                [json!({ "Name": "QueueName", "Value": get_att("DeadLetterQueue", "QueueName") })],
                "{name}"
            );
        }
        other => panic!("{name}: namespace {other} not checked"),
    }
}

/// Every alarm watches a metric that exists: tgsync's own metrics under the namespace
/// and dimensions src/metrics.rs emits them with (Function = a binary's served name,
/// Cluster = this stack's cluster); AWS metrics of this stack's own resources.
#[test]
fn every_alarm_watches_a_metric_that_is_emitted() {
    let t = Template::load();
    let emitted = known_metrics();
    assert_eq!(str_const("src/metrics.rs", "NAMESPACE"), "tgsync");
    let functions: BTreeSet<String> = FUNCTION_DIRS.into_iter().map(served_as).collect();
    let alarms = alarms(&t);
    assert!(alarms.len() >= 5, "{:?}", alarms.keys());
    for (name, a) in &alarms {
        for m in alarm_metrics(a) {
            let metric = m["MetricName"].as_str().expect("MetricName");
            let namespace = m["Namespace"].as_str().expect("Namespace");
            let dims = as_list(&m["Dimensions"]);
            check_alarm_metric(&t, name, metric, namespace, &dims, &emitted, &functions);
        }
        for key in ["AlarmActions", "OKActions"] {
            assert_eq!(
                a[key],
                json!({ "Fn::If": ["HasAlarmTopic", [{ "Ref": "AlarmTopicArn" }], { "Ref": "AWS::NoValue" }] }),
                "{name}: {key}"
            );
        }
        assert!(
            a["TreatMissingData"].is_string(),
            "{name}: decide TreatMissingData"
        );
    }
    assert!(
        alarms.values().any(|a| a["Namespace"] == "AWS/SQS"
            && a["MetricName"] == "ApproximateNumberOfMessagesVisible")
    );
}

/// The errors alarms count groups failing or backing off, and a failing group's errors
/// can come alone, one per retry, as far apart as the longest backoff delay plus one
/// schedule period. The alarm must neither clear in such a gap (flapping) nor fire on a
/// single failed run: every evaluation window holds at least `DatapointsToAlarm`
/// retries of a group that keeps failing, each in its own period.
#[test]
fn reconcile_error_alarms_outlast_the_backoff_gaps() {
    let t = Template::load();
    let longest_gap =
        tgsync::core::BackoffPolicy::default().max.as_secs() + 60 /* one schedule tick */;
    for dir in ["functions/resync", "functions/pod-events"] {
        let function = served_as(dir);
        let (name, a) = alarms(&t)
            .into_iter()
            .find(|(_, a)| {
                a["MetricName"] == "ReconcileErrors"
                    && as_list(&a["Dimensions"])
                        .contains(&json!({ "Name": "Function", "Value": function }))
            })
            .unwrap_or_else(|| panic!("no ReconcileErrors alarm for Function={function}"));
        let period = a["Period"].as_u64().unwrap();
        let periods = a["EvaluationPeriods"].as_u64().unwrap();
        let needed = a["DatapointsToAlarm"].as_u64().unwrap_or(periods);
        let window = period * periods;
        assert!(
            window >= 1800,
            "{name}: a window of {window} s is under 30 minutes"
        );
        assert!(
            longest_gap >= period,
            "{name}: retries {longest_gap} s apart must land in distinct periods"
        );
        assert!(
            window / longest_gap >= needed,
            "{name}: a window of {window} s holds only {} retries {longest_gap} s apart, fewer than the {needed} needed: the alarm would flap",
            window / longest_gap
        );
        assert!(needed >= 2, "{name}: one failed run must not fire it");
        assert_eq!(a["ComparisonOperator"], "GreaterThanThreshold", "{name}");
        assert_eq!(a["Threshold"], 0, "{name}");
        assert_eq!(
            a["TreatMissingData"], "notBreaching",
            "{name}: no run is the heartbeat's business"
        );
    }
}

// ------------------------------------------------------------------------------------
// The alarms across the parameter space: each allowed `ScheduleMinutes` and `WatchSeconds`
// the template accepts, a simulated stack's metric series (healthy, and each way it can
// fail), and every alarm evaluated over them as CloudWatch does.
// ------------------------------------------------------------------------------------

/// Which series a metric is: its namespace, its name, and whose it is (tgsync's
/// `Function` dimension; a Lambda function's served name; `dead-letter` for the queue).
type SeriesKey = (String, String, String);

/// Simulated metric data: each series' points (second, value).
type Series = BTreeMap<SeriesKey, Vec<(u64, f64)>>;

fn series_key(namespace: &str, metric: &str, of: &str) -> SeriesKey {
    (namespace.to_owned(), metric.to_owned(), of.to_owned())
}

/// A CloudWatch alarm as one deployment resolves it: on one metric, or on a metric math
/// expression over several (each `Metrics` entry with a `MetricStat`).
#[derive(Debug, Clone)]
struct Alarm {
    name: String,
    period: u64,
    evaluation_periods: usize,
    datapoints_to_alarm: usize,
    threshold: f64,
    comparison: String,
    /// `TreatMissingData`: `breaching` (true) or `notBreaching` (false).
    missing_breaches: bool,
    /// The metrics it reads: id (the metric's name for a plain alarm), series, statistic.
    metrics: Vec<(String, SeriesKey, String)>,
    /// The metric math expression it alarms on; None: the one metric.
    expression: Option<String>,
}

/// `Fn::Sub` strings with the deployment's parameters (and a `[string, variables]`
/// form's variables, already resolved) put in.
fn substitute(v: &Value, d: &Deployment) -> Value {
    match v {
        Value::Object(map) if map.len() == 1 && map.contains_key("Fn::Sub") => {
            let (mut text, vars) = match &map["Fn::Sub"] {
                Value::String(s) => (s.clone(), Map::new()),
                Value::Array(items) => (
                    items[0].as_str().expect("Fn::Sub string").to_owned(),
                    items[1].as_object().cloned().unwrap_or_default(),
                ),
                other => panic!("Fn::Sub {other}"),
            };
            for (name, value) in vars.iter().chain(d.params.iter()) {
                let value = match scalar_string(value) {
                    Value::String(s) => s,
                    other => panic!("${{{name}}} is not a scalar: {other}"),
                };
                text = text.replace(&format!("${{{name}}}"), &value);
            }
            Value::String(text)
        }
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| (k.clone(), substitute(v, d)))
            .collect::<Map<_, _>>()
            .into(),
        Value::Array(items) => items.iter().map(|i| substitute(i, d)).collect(),
        other => other.clone(),
    }
}

impl Alarm {
    /// `name` as deployment `d` creates it; None when its condition leaves it out.
    fn resolve(t: &Template, name: &str, d: &Deployment) -> Option<Self> {
        let a = t.resource(name);
        if let Some(c) = a.get("Condition")
            && !d.conditions[c.as_str().expect("a condition name")]
        {
            return None;
        }
        let p = substitute(&resolve(&a["Properties"], d, &BTreeMap::new()), d);
        let number = |v: &Value, what: &str| -> f64 {
            match scalar_string(v) {
                Value::String(s) => s
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: {what} = {s} is not a number")),
                other => panic!("{name}: {what} = {other}"),
            }
        };
        // Whose metric: the dimension that tells this stack's series apart.
        let of = |metric: &Value| -> String {
            let dims = as_list(&metric["Dimensions"]);
            let dim = |key: &str| dims.iter().find(|d| d["Name"] == key).map(|d| &d["Value"]);
            if let Some(f) = dim("Function") {
                f.as_str().expect("a Function value").to_owned()
            } else if let Some(f) = dim("FunctionName") {
                let id = f["Ref"]
                    .as_str()
                    .expect("FunctionName: a Ref to a function");
                served_as(t.props(id)["CodeUri"].as_str().expect("CodeUri"))
            } else if dim("QueueName").is_some() {
                "dead-letter".to_owned()
            } else {
                panic!("{name}: whose metric is {metric}?")
            }
        };
        let key = |metric: &Value| {
            series_key(
                metric["Namespace"].as_str().expect("Namespace"),
                metric["MetricName"].as_str().expect("MetricName"),
                &of(metric),
            )
        };
        let (period, metrics, expression) = if let Some(list) = p.get("Metrics") {
            let mut period = None;
            let mut metrics = Vec::new();
            let mut expression = None;
            for m in as_list(list) {
                let id = m["Id"].as_str().expect("Id").to_owned();
                let returned = m.get("ReturnData").is_none_or(|r| r == true);
                if let Some(stat) = m.get("MetricStat") {
                    let this = number(&stat["Period"], "MetricStat.Period") as u64;
                    assert!(
                        period.is_none_or(|p| p == this),
                        "{name}: one period for every metric"
                    );
                    period = Some(this);
                    let s = stat["Stat"].as_str().expect("Stat").to_owned();
                    if returned {
                        expression = Some(id.clone());
                    }
                    metrics.push((id, key(&stat["Metric"]), s));
                } else {
                    let e = m["Expression"].as_str().expect("Expression or MetricStat");
                    if returned {
                        expression = Some(e.to_owned());
                    }
                }
            }
            let period = period.unwrap_or_else(|| panic!("{name}: no MetricStat"));
            (period, metrics, expression)
        } else {
            let stat = p["Statistic"].as_str().expect("Statistic").to_owned();
            let id = p["MetricName"].as_str().expect("MetricName").to_owned();
            (
                number(&p["Period"], "Period") as u64,
                vec![(id, key(&p), stat)],
                None,
            )
        };
        assert!(
            period % 60 == 0 && period > 0,
            "{name}: CloudWatch takes periods of whole minutes here, not {period} s"
        );
        let evaluation_periods = number(&p["EvaluationPeriods"], "EvaluationPeriods") as usize;
        let datapoints_to_alarm = p.get("DatapointsToAlarm").map_or(evaluation_periods, |v| {
            number(v, "DatapointsToAlarm") as usize
        });
        let missing_breaches = match p["TreatMissingData"].as_str() {
            Some("breaching") => true,
            Some("notBreaching") => false,
            other => panic!("{name}: TreatMissingData {other:?} is not simulated here"),
        };
        Some(Self {
            name: name.to_owned(),
            period,
            evaluation_periods,
            datapoints_to_alarm,
            threshold: number(&p["Threshold"], "Threshold"),
            comparison: p["ComparisonOperator"]
                .as_str()
                .expect("ComparisonOperator")
                .to_owned(),
            missing_breaches,
            metrics,
            expression,
        })
    }

    /// The alarm's data points, one per period from 0 to `until` (None: no data).
    fn datapoints(&self, series: &Series, until: u64) -> Vec<Option<f64>> {
        let periods = (until / self.period) as usize;
        let mut values: BTreeMap<&str, Vec<Option<f64>>> = BTreeMap::new();
        for (id, key, stat) in &self.metrics {
            let mut buckets: Vec<Vec<f64>> = vec![Vec::new(); periods];
            for &(t, v) in series.get(key).map(Vec::as_slice).unwrap_or_default() {
                if let Some(b) = buckets.get_mut((t / self.period) as usize) {
                    b.push(v);
                }
            }
            let agg = buckets
                .iter()
                .map(|b| {
                    (!b.is_empty()).then(|| match stat.as_str() {
                        "Sum" => b.iter().sum(),
                        "Maximum" => b.iter().copied().fold(f64::MIN, f64::max),
                        "Minimum" => b.iter().copied().fold(f64::MAX, f64::min),
                        "Average" => b.iter().sum::<f64>() / b.len() as f64,
                        "SampleCount" => b.len() as f64,
                        other => panic!("{}: statistic {other} not simulated", self.name),
                    })
                })
                .collect();
            values.insert(id, agg);
        }
        (0..periods)
            .map(|i| match &self.expression {
                None => values[self.metrics[0].0.as_str()][i],
                Some(e) => {
                    let env: BTreeMap<&str, Option<f64>> =
                        values.iter().map(|(id, v)| (*id, v[i])).collect();
                    metric_math(e, &env)
                }
            })
            .collect()
    }

    /// The longest it may take to go off once its failure starts, at any setting: the
    /// evaluation periods and the one the failure starts in, and never more than
    /// [`FIRES_WITHIN_S`].
    fn fires_within(&self) -> u64 {
        ((self.evaluation_periods as u64 + 1) * self.period).min(FIRES_WITHIN_S)
    }

    fn breaching(&self, v: Option<f64>) -> bool {
        let Some(v) = v else {
            return self.missing_breaches;
        };
        match self.comparison.as_str() {
            "GreaterThanThreshold" => v > self.threshold,
            "GreaterThanOrEqualToThreshold" => v >= self.threshold,
            "LessThanThreshold" => v < self.threshold,
            "LessThanOrEqualToThreshold" => v <= self.threshold,
            other => panic!("{}: {other}", self.name),
        }
    }

    /// Whether the alarm is in ALARM as each period ends: `datapoints_to_alarm` of the
    /// last `evaluation_periods` data points breaching.
    fn states(&self, series: &Series, until: u64) -> Vec<bool> {
        let points = self.datapoints(series, until);
        (0..points.len())
            .map(|i| {
                i + 1 >= self.evaluation_periods
                    && points[i + 1 - self.evaluation_periods..=i]
                        .iter()
                        .filter(|v| self.breaching(**v))
                        .count()
                        >= self.datapoints_to_alarm
            })
            .collect()
    }
}

/// A CloudWatch metric math expression of numbers, metric ids, `+ - * /` and
/// parentheses, for one data point (None when a metric it reads has none, as CloudWatch
/// leaves such a time stamp out of the result).
fn metric_math(expression: &str, env: &BTreeMap<&str, Option<f64>>) -> Option<f64> {
    struct Parser<'a> {
        tokens: Vec<String>,
        at: usize,
        env: &'a BTreeMap<&'a str, Option<f64>>,
        expression: &'a str,
    }
    impl Parser<'_> {
        fn next(&mut self) -> Option<String> {
            let t = self.tokens.get(self.at).cloned();
            self.at += 1;
            t
        }
        fn peek(&self) -> Option<&str> {
            self.tokens.get(self.at).map(String::as_str)
        }
        fn sum(&mut self) -> Option<f64> {
            let mut v = self.product();
            while let Some(op @ ("+" | "-")) = self.peek() {
                let plus = op == "+";
                self.at += 1;
                let r = self.product();
                v = v.zip(r).map(|(a, b)| if plus { a + b } else { a - b });
            }
            v
        }
        fn product(&mut self) -> Option<f64> {
            let mut v = self.factor();
            while let Some(op @ ("*" | "/")) = self.peek() {
                let times = op == "*";
                self.at += 1;
                let r = self.factor();
                v = v.zip(r).map(|(a, b)| if times { a * b } else { a / b });
            }
            v
        }
        fn factor(&mut self) -> Option<f64> {
            let t = self
                .next()
                .unwrap_or_else(|| panic!("{}: ends early", self.expression));
            match t.as_str() {
                "(" => {
                    let v = self.sum();
                    assert_eq!(self.next().as_deref(), Some(")"), "{}", self.expression);
                    v
                }
                "-" => self.factor().map(|v| -v),
                _ if t.starts_with(|c: char| c.is_ascii_digit()) => {
                    Some(t.parse().expect("a number"))
                }
                _ => {
                    assert_ne!(
                        self.peek(),
                        Some("("),
                        "{}: function {t} not simulated",
                        self.expression
                    );
                    *self
                        .env
                        .get(t.as_str())
                        .unwrap_or_else(|| panic!("{}: unknown id {t}", self.expression))
                }
            }
        }
    }
    let mut tokens = Vec::new();
    let mut chars = expression.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                    word.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            tokens.push(word);
        } else {
            assert!("+-*/()".contains(c), "{expression}: {c} not simulated");
            tokens.push(c.to_string());
            chars.next();
        }
    }
    let mut p = Parser {
        tokens,
        at: 0,
        env,
        expression,
    };
    let v = p.sum();
    assert_eq!(p.peek(), None, "{expression}: trailing tokens");
    v
}

/// How a simulated stack behaves from the failure on (before it, every stack is healthy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// Every run completes; with watch mode on, each watches `WatchSeconds`.
    Healthy,
    /// One run fails (a crash), the others are healthy.
    OneFailedRun,
    /// Runs complete, but none watches (the watch does not start, or ends at once).
    WatchStopped,
    /// The schedule stops invoking the function.
    ScheduleStopped,
    /// Every run times out: Lambda counts an error, no metric line is written.
    TimesOut,
    /// Every run fails at once (a bad setting, a crash, out of memory).
    Fails,
    /// Runs complete, one group keeps failing: its retries, backing off, write errors.
    GroupsFailing,
}

const SCENARIOS: [Scenario; 7] = [
    Scenario::Healthy,
    Scenario::OneFailedRun,
    Scenario::WatchStopped,
    Scenario::ScheduleStopped,
    Scenario::TimesOut,
    Scenario::Fails,
    Scenario::GroupsFailing,
];

/// One deployment's resync as the simulation runs it.
#[derive(Debug, Clone, Copy)]
struct Stack {
    /// The schedule's period, s (`ScheduleMinutes` × 60).
    tick: u64,
    /// `WatchSeconds` (0: watch mode off).
    watch: u64,
    /// The resync function's `Timeout`, s.
    timeout: u64,
    /// Its `EventInvokeConfig` `MaximumEventAgeInSeconds`.
    max_event_age: u64,
}

impl Stack {
    fn of(t: &Template, d: &Deployment) -> Self {
        let p = t.props("ResyncFunction");
        let param = |k: &str| -> u64 { d.params[k].as_str().unwrap().parse().unwrap() };
        Self {
            tick: 60 * param("ScheduleMinutes"),
            watch: param("WatchSeconds"),
            timeout: p["Timeout"].as_u64().expect("Timeout"),
            max_event_age: p["EventInvokeConfig"]["MaximumEventAgeInSeconds"]
                .as_u64()
                .expect("MaximumEventAgeInSeconds"),
        }
    }
}

/// How the world treats the runs: the schedule's phase against CloudWatch's periods,
/// each tick's delivery delay, how long passes drain after the watch's end, and whether
/// Lambda's own metrics carry the invocation's start or its end.
#[derive(Clone, Copy)]
struct Jitter {
    phase: u64,
    delay: fn(u64) -> u64,
    drain: u64,
    lambda_at_end: bool,
}

/// Delivery delays of the scheduled events, by tick: none, always 15 s, alternating,
/// pseudo-random up to 15 s, and (last) a 45-s one every seventh tick. After a late tick,
/// or with every run draining for the whole `DRAIN`, Lambda may drop the next tick: the
/// alarms must ride that out too.
const DELAYS: [fn(u64) -> u64; 5] = [
    |_| 0,
    |_| 15,
    |k| if k % 2 == 0 { 0 } else { 15 },
    |k| (k.wrapping_mul(2_654_435_761) >> 7) % 16,
    |k| if k % 7 == 3 { 45 } else { 0 },
];

/// What a simulated stack wrote, and how its schedule fared.
struct Simulated {
    series: Series,
    /// Invocation attempts Lambda refused because the one slot was busy.
    throttled: usize,
    /// Scheduled events dropped after `MaximumEventAgeInSeconds` of refusals.
    dropped: usize,
    /// The longest stretch between the end of one run's watch and the start of the
    /// next one's.
    longest_unwatched: u64,
}

/// How long a run without a watch takes (a quiet run waiting for its Describe budget).
const QUIET_RUN_S: u64 = 20;

/// The controller's drain after the watch's end (src/controller/mod.rs `DRAIN`).
fn drain_seconds() -> u64 {
    let source = read("src/controller/mod.rs");
    let needle = "const DRAIN: Duration = Duration::from_secs(";
    let start = source
        .find(needle)
        .expect("src/controller/mod.rs defines DRAIN in seconds")
        + needle.len();
    let len = source[start..].find(')').expect("closing parenthesis");
    source[start..start + len].parse().expect("DRAIN seconds")
}

/// How long before the deadline the watch ends (src/handlers/resync.rs).
fn watch_end_margin() -> u64 {
    tgsync::handlers::resync::WATCH_END_MARGIN.as_secs()
}

/// Runs the resync of `stack` from 0 to `until`: one event per tick, delivered after
/// its delay; Lambda invokes it when the function's one slot (reserved concurrency 1)
/// is free, and otherwise retries it 1, 2, 4, ... s later, dropping it once it is older
/// than `MaximumEventAgeInSeconds`. Runs starting from `failure` on behave as `scenario`
/// says.
fn simulate(stack: Stack, scenario: Scenario, j: Jitter, failure: u64, until: u64) -> Simulated {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let resync = "resync";
    let mut series = Series::new();
    let mut put = |namespace: &str, metric: &str, t: u64, v: f64| {
        series
            .entry(series_key(namespace, metric, resync))
            .or_default()
            .push((t, v));
    };
    // (attempt at, delivered at, retries so far)
    let mut events = BinaryHeap::new();
    let mut k = 0;
    while j.phase + k * stack.tick < until {
        let tick = j.phase + k * stack.tick;
        if !(scenario == Scenario::ScheduleStopped && tick >= failure) {
            let at = tick + (j.delay)(k);
            events.push(Reverse((at, at, 0u32)));
        }
        k += 1;
    }
    let (mut busy_until, mut throttled, mut dropped) = (0, 0, 0);
    let mut failed_once = false;
    let mut watches: Vec<(u64, u64)> = Vec::new();
    while let Some(Reverse((at, delivered, retries))) = events.pop() {
        if at >= until {
            continue;
        }
        if at < busy_until {
            throttled += 1;
            let next = delivered + (1 << (retries + 1)) - 1;
            if next - delivered > stack.max_event_age {
                dropped += 1;
            } else {
                events.push(Reverse((next, delivered, retries + 1)));
            }
            continue;
        }
        let start = at;
        let failing = start >= failure;
        let crash = failing
            && (scenario == Scenario::Fails
                || (scenario == Scenario::OneFailedRun
                    && !std::mem::replace(&mut failed_once, true)));
        let end = if failing && scenario == Scenario::TimesOut {
            start + stack.timeout
        } else if crash {
            start + 2
        } else if stack.watch > 0 && !(failing && scenario == Scenario::WatchStopped) {
            let watched = stack.watch.min(stack.timeout - watch_end_margin());
            watches.push((start, start + watched));
            start + watched + j.drain
        } else {
            start + QUIET_RUN_S
        };
        busy_until = end;
        let error = failing && (crash || scenario == Scenario::TimesOut);
        // Lambda counts every invocation in Errors, 0 or 1.
        put(
            "AWS/Lambda",
            "Errors",
            if j.lambda_at_end { end } else { start },
            if error { 1.0 } else { 0.0 },
        );
        if error {
            continue;
        }
        // The run line (src/metrics.rs), when the run ends.
        put("tgsync", "RunsCompleted", end, 1.0);
        put("tgsync", "ReconcileErrors", end, 0.0);
        if watches.last().is_some_and(|(s, _)| *s == start) {
            // watched_ms: from the run's start to its report, the drain included.
            put("tgsync", "WatchRunning", end, 1.0);
            put("tgsync", "WatchedSeconds", end, (end - start) as f64);
        }
    }
    if scenario == Scenario::GroupsFailing {
        // A group failing from `failure` on: its retries back off (1 s doubling to
        // 1000 s), each at the first pass after its delay (up to a tick later).
        let max = tgsync::core::BackoffPolicy::default().max.as_secs();
        let (mut t, mut delay) = (failure, 1);
        while t < until {
            put("tgsync", "ReconcileErrors", t, 1.0);
            t += delay + stack.tick;
            delay = (delay * 2).min(max);
        }
    }
    // The queue stays empty; SQS writes its gauge every minute.
    let dlq = series
        .entry(series_key(
            "AWS/SQS",
            "ApproximateNumberOfMessagesVisible",
            "dead-letter",
        ))
        .or_default();
    dlq.extend((0..until).step_by(60).map(|t| (t, 0.0)));
    let longest_unwatched = watches
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].1))
        .max()
        .unwrap_or(0);
    Simulated {
        series,
        throttled,
        dropped,
        longest_unwatched,
    }
}

/// Whether the template's `Rules` accept deployment `d` (each assertion of each rule
/// whose condition holds), with the descriptions of the assertions that fail.
fn rules_refuse(t: &Template, d: &Deployment) -> Vec<String> {
    fn string(v: &Value, d: &Deployment) -> String {
        match v {
            Value::Object(m) if m.contains_key("Ref") => {
                match scalar_string(&d.params[m["Ref"].as_str().expect("Ref names a string")]) {
                    Value::String(s) => s,
                    other => panic!("a rule's Ref: {other}"),
                }
            }
            other => match scalar_string(other) {
                Value::String(s) => s,
                other => panic!("a rule operand not understood: {other}"),
            },
        }
    }
    fn holds(v: &Value, d: &Deployment) -> bool {
        let (op, args) = v
            .as_object()
            .and_then(|m| m.iter().next())
            .expect("a rule function is a one-key object");
        let list = || args.as_array().expect("rule function arguments are a list");
        match op.as_str() {
            "Fn::Equals" => string(&list()[0], d) == string(&list()[1], d),
            "Fn::Not" => !holds(&list()[0], d),
            "Fn::And" => list().iter().all(|c| holds(c, d)),
            "Fn::Or" => list().iter().any(|c| holds(c, d)),
            "Fn::Contains" => {
                let needle = string(&list()[1], d);
                as_list(&list()[0]).iter().any(|i| string(i, d) == needle)
            }
            other => panic!("rule function {other} not understood"),
        }
    }
    let mut refused = Vec::new();
    for (name, rule) in t.doc["Rules"].as_object().into_iter().flatten() {
        if rule.get("RuleCondition").is_some_and(|c| !holds(c, d)) {
            continue;
        }
        for a in as_list(&rule["Assertions"]) {
            if !holds(&a["Assert"], d) {
                refused.push(format!(
                    "{name}: {}",
                    a["AssertDescription"]
                        .as_str()
                        .unwrap_or("(no description)")
                ));
            }
        }
    }
    refused
}

/// The values of a Number parameter its own constraints allow (MinValue to MaxValue, or
/// AllowedValues).
fn number_parameter_values(t: &Template, name: &str) -> Vec<u64> {
    let p = &t.doc["Parameters"][name];
    if let Some(values) = p.get("AllowedValues") {
        return as_list(values)
            .iter()
            .map(|v| v.as_u64().expect("a whole number"))
            .collect();
    }
    let min = p["MinValue"].as_u64().expect("MinValue");
    let max = p["MaxValue"].as_u64().expect("MaxValue");
    (min..=max).collect()
}

/// The alarms that must be in ALARM in `scenario` (watch mode on or off), and none other.
fn expected_alarms(scenario: Scenario, watching: bool) -> BTreeSet<&'static str> {
    let mut e: BTreeSet<&str> = match scenario {
        Scenario::Healthy | Scenario::OneFailedRun => BTreeSet::new(),
        Scenario::WatchStopped => BTreeSet::from(["WatchNotRunningAlarm"]),
        Scenario::ScheduleStopped => BTreeSet::from(["ResyncHeartbeatAlarm"]),
        Scenario::TimesOut | Scenario::Fails => {
            BTreeSet::from(["ResyncInvocationErrorsAlarm", "ResyncHeartbeatAlarm"])
        }
        Scenario::GroupsFailing => BTreeSet::from(["ResyncErrorsAlarm"]),
    };
    if watching
        && matches!(
            scenario,
            Scenario::ScheduleStopped | Scenario::TimesOut | Scenario::Fails
        )
    {
        // No run completes, so none reports watched time.
        e.insert("WatchNotRunningAlarm");
    }
    e
}

/// The longest an alarm may take to go off after its failure starts, at any setting.
const FIRES_WITHIN_S: u64 = 30 * 60;

/// Every alarm, at every allowed `ScheduleMinutes` and the `WatchSeconds` the template
/// accepts with it (off, the shortest and longest watch, the default), over the series
/// a simulated stack writes: healthy (at every phase of the schedule against the
/// periods, with delivery delays, drains and either time stamp of Lambda's metrics), a
/// run failing once, a stopped watch, a stopped schedule, every run timing out, every
/// run failing, a group that keeps failing. Each failure must set off exactly its
/// alarms, within their evaluation periods and the one the failure starts in (and
/// within 30 minutes), and keep them in ALARM while it lasts; a healthy stack, and one
/// failed run, none.
#[test]
fn alarms_fire_for_their_failures_at_every_setting() {
    let t = Template::load();
    let drain = drain_seconds();
    let names: Vec<String> = alarms(&t).keys().cloned().collect();
    let (warm, failure, until) = (HOUR, 2 * HOUR, 3 * HOUR + HOUR / 2);
    let mut problems: BTreeSet<String> = BTreeSet::new();
    let mut settings = 0;
    for minutes in number_parameter_values(&t, "ScheduleMinutes") {
        let schedule = minutes.to_string();
        let deploy = |watch: u64| {
            t.parameters(&[
                ("ClusterName", "demo"),
                ("ScheduleMinutes", &schedule),
                ("WatchSeconds", &watch.to_string()),
            ])
        };
        let accepted: Vec<u64> = number_parameter_values(&t, "WatchSeconds")
            .into_iter()
            .filter(|&w| rules_refuse(&t, &deploy(w)).is_empty())
            .collect();
        let default: u64 = scalar_string(t.parameter_default("WatchSeconds").unwrap())
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let on: Vec<u64> = accepted.iter().copied().filter(|&w| w > 0).collect();
        let mut watches = BTreeSet::from([0]);
        watches.extend(on.first());
        watches.extend(on.last());
        if accepted.contains(&default) {
            watches.insert(default);
        }
        for watch in watches {
            settings += 1;
            let d = deploy(watch);
            let stack = Stack::of(&t, &d);
            let deployed: Vec<Alarm> = names
                .iter()
                .filter_map(|n| Alarm::resolve(&t, n, &d))
                .collect();
            let setting = format!("ScheduleMinutes={minutes} WatchSeconds={watch}");
            for scenario in SCENARIOS {
                if scenario == Scenario::WatchStopped && watch == 0 {
                    continue;
                }
                let expected = expected_alarms(scenario, watch > 0);
                for (p, delay) in DELAYS.into_iter().enumerate() {
                    let late = p == DELAYS.len() - 1;
                    for phase in (0..stack.tick).step_by(11) {
                        for (drain, lambda_at_end) in [(0, false), (drain, true), (drain, false)] {
                            let j = Jitter {
                                phase,
                                delay,
                                drain,
                                lambda_at_end,
                            };
                            let sim = simulate(stack, scenario, j, failure, until);
                            // Delivered within 15 s and drained at once, no
                            // healthy run loses a tick.
                            if scenario == Scenario::Healthy
                                && sim.dropped > 0
                                && !late
                                && drain == 0
                            {
                                problems.insert(format!(
                                    "{setting}: a healthy stack's runs overlap and Lambda drops scheduled events"
                                ));
                            }
                            for a in &deployed {
                                let states = a.states(&sim.series, until);
                                let end_of = |i: usize| (i as u64 + 1) * a.period;
                                let before: Vec<usize> = (0..states.len())
                                    .filter(|&i| {
                                        end_of(i) > warm && end_of(i) <= failure && states[i]
                                    })
                                    .collect();
                                if !before.is_empty() {
                                    problems.insert(format!(
                                        "{setting}: {} goes off on a healthy stack",
                                        a.name
                                    ));
                                    continue;
                                }
                                let after: Vec<usize> =
                                    (0..states.len()).filter(|&i| end_of(i) > failure).collect();
                                if expected.contains(a.name.as_str()) {
                                    // In ALARM from some period on, to the end.
                                    let first = after
                                        .iter()
                                        .copied()
                                        .find(|&i| states[i..].iter().all(|s| *s));
                                    match first {
                                        None if after.iter().any(|&i| states[i]) => {
                                            problems.insert(format!(
                                                "{setting}, {scenario:?}: {} goes off but does not stay in ALARM while the failure lasts",
                                                a.name
                                            ));
                                        }
                                        None => {
                                            problems.insert(format!(
                                                "{setting}, {scenario:?}: {} never goes off",
                                                a.name
                                            ));
                                        }
                                        Some(i) if end_of(i) - failure > a.fires_within() => {
                                            problems.insert(format!(
                                                "{setting}, {scenario:?}: {} takes {} min to go off, more than {} min",
                                                a.name,
                                                (end_of(i) - failure) / 60,
                                                a.fires_within() / 60
                                            ));
                                        }
                                        Some(_) => {}
                                    }
                                } else if after.iter().any(|&i| states[i]) {
                                    problems.insert(format!(
                                        "{setting}, {scenario:?}: {} goes off",
                                        a.name
                                    ));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(settings >= 3 * 3, "{settings} settings simulated");
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The template's `Rules` refuse exactly the watch settings that cannot work, and accept
/// the rest, for every allowed `ScheduleMinutes` and every `WatchSeconds` the parameter
/// allows: a watch that runs into the next tick (its run, drained, still holds the one
/// slot when the next tick comes: the tick waits, is retried, and after
/// `MaximumEventAgeInSeconds` dropped), and one that leaves more of each period
/// unwatched than the shortest schedule's whole period (pod changes then wait longer in
/// watch mode than on the 1-minute schedule without it). Off (0) is always accepted.
/// Both are measured on the simulated stack, not computed from the bounds the rules
/// state.
#[test]
fn template_rules_refuse_the_watch_settings_that_cannot_work() {
    let t = Template::load();
    let drain = drain_seconds();
    let schedules = number_parameter_values(&t, "ScheduleMinutes");
    let shortest = 60 * schedules.iter().min().expect("ScheduleMinutes values");
    let mut wrong = Vec::new();
    for &minutes in &schedules {
        for watch in number_parameter_values(&t, "WatchSeconds") {
            let d = t.parameters(&[
                ("ClusterName", "demo"),
                ("ScheduleMinutes", &minutes.to_string()),
                ("WatchSeconds", &watch.to_string()),
            ]);
            let stack = Stack::of(&t, &d);
            let nominal = |drain| Jitter {
                phase: 0,
                delay: DELAYS[0],
                drain,
                lambda_at_end: false,
            };
            let until = 2 * HOUR;
            let drained = simulate(stack, Scenario::Healthy, nominal(drain), until, until);
            let undrained = simulate(stack, Scenario::Healthy, nominal(0), until, until);
            let works = watch == 0
                || (drained.throttled == 0
                    && undrained.longest_unwatched <= shortest
                    && watch + watch_end_margin() <= stack.timeout);
            let refused = rules_refuse(&t, &d);
            for r in &refused {
                assert!(
                    r.contains(&format!("ScheduleMinutes {minutes}")) && r.contains("WatchSeconds"),
                    "a refusal says which WatchSeconds go with the schedule: {r}"
                );
            }
            if works == refused.is_empty() {
                continue;
            }
            wrong.push(format!(
                "ScheduleMinutes={minutes} WatchSeconds={watch}: {} (throttled ticks {}, dropped {}, longest unwatched {} s){}",
                if works { "refused" } else { "accepted" },
                drained.throttled,
                drained.dropped,
                undrained.longest_unwatched,
                if refused.is_empty() {
                    String::new()
                } else {
                    format!(": {refused:?}")
                }
            ));
        }
    }
    assert_eq!(
        rules_refuse(&t, &t.parameters(&[("ClusterName", "demo")])),
        Vec::<String>::new(),
        "the defaults deploy"
    );
    let shown: Vec<&String> = wrong.iter().take(12).collect();
    assert!(
        wrong.is_empty(),
        "{} settings the Rules get wrong, e.g.:\n{}",
        wrong.len(),
        shown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

const HOUR: u64 = 3600;

/// The heartbeat: a resync that is never invoked, or never finishes, writes no metric at
/// all, so no error alarm can see it; the heartbeat alarm is on the run line's
/// `RunsCompleted`, with no data breaching. (What it does at every setting:
/// [`alarms_fire_for_their_failures_at_every_setting`].)
#[test]
fn resync_heartbeat_is_on_completed_runs() {
    let t = Template::load();
    let resync = served_as("functions/resync");
    let (name, a) = alarms(&t)
        .into_iter()
        .find(|(_, a)| a["MetricName"] == "RunsCompleted")
        .expect("a heartbeat alarm on RunsCompleted");
    assert_eq!(a["Namespace"], "tgsync", "{name}");
    assert!(
        as_list(&a["Dimensions"]).contains(&json!({ "Name": "Function", "Value": resync })),
        "{name}"
    );
    assert_eq!(a["Threshold"], 1, "{name}");
    assert_eq!(
        a["TreatMissingData"], "breaching",
        "{name}: no data is the signal"
    );
}

/// The watch alarm: only with watch mode on; on the watched time the resync's run line
/// reports (`WatchedSeconds`, one point per watching run), in percent of what a period
/// should hold: `WatchSeconds` for each of the period's scheduled runs (the mapping's
/// `Runs`). (What it does at every setting:
/// [`alarms_fire_for_their_failures_at_every_setting`].)
#[test]
fn watch_alarm_is_on_watched_time_for_every_schedule() {
    use tgsync::core::UnixMillis;
    use tgsync::logging::LambdaLevel;
    use tgsync::metrics::emf_lines;
    use tgsync::report::{Report, WatchReport};
    let t = Template::load();
    let a = t.resource("WatchNotRunningAlarm");
    assert_eq!(a["Condition"], "WatchEnabled");
    for (watch, on) in [("55", true), ("1", true), ("0", false)] {
        let d = t.parameters(&[("ClusterName", "demo"), ("WatchSeconds", watch)]);
        assert_eq!(d.conditions["WatchEnabled"], on, "WatchSeconds={watch}");
    }
    let resync: &'static str = Box::leak(served_as("functions/resync").into_boxed_str());
    // The run line carries the run's watched_ms, in seconds.
    let mut r = Report::new(resync, "demo", false, UnixMillis(1_800_000_000_000));
    r.watch = Some(WatchReport {
        watched_ms: 55_250,
        ..Default::default()
    });
    let r = r.finish(UnixMillis(1_800_000_055_250));
    let run: Value = serde_json::from_str(&emf_lines(&r, LambdaLevel::Info)[0]).unwrap();
    assert_eq!(run["WatchedSeconds"], 55.25, "{run}");
    for minutes in number_parameter_values(&t, "ScheduleMinutes") {
        let tick = 60 * minutes;
        let watch = tick - 5;
        let d = t.parameters(&[
            ("ClusterName", "demo"),
            ("ScheduleMinutes", &minutes.to_string()),
            ("WatchSeconds", &watch.to_string()),
        ]);
        let alarm = Alarm::resolve(&t, "WatchNotRunningAlarm", &d).expect("watch mode on");
        assert_eq!(
            alarm
                .metrics
                .iter()
                .map(|m| (&m.1, m.2.as_str()))
                .collect::<Vec<_>>(),
            [(&series_key("tgsync", "WatchedSeconds", resync), "Sum")],
            "ScheduleMinutes={minutes}"
        );
        assert!(alarm.missing_breaches, "no run is no watch");
        let row = &d.mappings["WatchAlarm"][minutes.to_string()];
        assert_eq!(row["Minutes"].as_u64(), Some(alarm.period / 60), "{row}");
        let runs = row["Runs"].as_u64().expect("Runs");
        assert_eq!(runs, alarm.period / tick, "{row}: the runs of a period");
        // A period holding its runs, each watching WatchSeconds, is 100 %.
        let env = BTreeMap::from([("watched", Some((runs * watch) as f64))]);
        let full = metric_math(alarm.expression.as_deref().expect("metric math"), &env);
        assert_eq!(full, Some(100.0), "ScheduleMinutes={minutes}");
        assert_eq!(alarm.comparison, "LessThanThreshold");
    }
}

/// A fake ARN for each `{"Fn::GetAtt": [alarm, "Arn"]}` in `v`.
fn alarm_arns(v: &Value) -> Value {
    match v {
        Value::Object(map) if map.len() == 1 && map.contains_key("Fn::GetAtt") => {
            let args = as_list(&map["Fn::GetAtt"]);
            assert_eq!(args[1], "Arn", "{v}");
            json!(format!(
                "arn:aws:cloudwatch:eu-west-1:111122223333:alarm:{}",
                args[0].as_str().unwrap()
            ))
        }
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| (k.clone(), alarm_arns(v)))
            .collect::<Map<_, _>>()
            .into(),
        Value::Array(items) => items.iter().map(alarm_arns).collect(),
        other => other.clone(),
    }
}

/// The dashboard's body as CloudWatch gets it from one deployment (cluster `demo`,
/// region eu-west-1, `DashboardTargetGroupSearch` = `shop-web-8080`): the `!Sub`
/// string with its variables (a `!Sub [string, {var: value}]`'s, resolved for `d`),
/// parameters, pseudo-parameters and alarm ARNs substituted, parsed.
fn dashboard(t: &Template, d: &Deployment) -> Value {
    let sub = &t.props("Dashboard")["DashboardBody"]["Fn::Sub"];
    let (body, vars) = match sub {
        Value::String(s) => (s.clone(), Map::new()),
        Value::Array(items) => (
            items[0].as_str().expect("the body string").to_owned(),
            items[1].as_object().expect("the variables").clone(),
        ),
        other => panic!("DashboardBody is not a !Sub: {other}"),
    };
    let mut substituted = body;
    for (var, value) in &vars {
        let value = resolve(&alarm_arns(value), d, &BTreeMap::new());
        let value = value
            .as_str()
            .unwrap_or_else(|| panic!("${{{var}}} does not resolve to a string: {value}"));
        substituted = substituted.replace(&format!("${{{var}}}"), value);
    }
    for (var, value) in [
        ("${ClusterName}", "demo"),
        ("${AWS::Region}", "eu-west-1"),
        ("${DashboardTargetGroupSearch}", "shop-web-8080"),
    ] {
        substituted = substituted.replace(var, value);
    }
    for name in alarms(t).keys() {
        substituted = substituted.replace(
            &format!("${{{name}.Arn}}"),
            &format!("arn:aws:cloudwatch:eu-west-1:111122223333:alarm:{name}"),
        );
    }
    assert!(
        !substituted.contains("${"),
        "an unknown !Sub variable: {substituted}"
    );
    serde_json::from_str(&substituted).expect("the dashboard body is JSON")
}

/// The dashboard's alarm widget lists every alarm the deployment has, and none it lacks
/// (CloudWatch refuses a dashboard that names an alarm that does not exist): with watch
/// mode on and off.
#[test]
fn dashboard_lists_every_alarm_of_the_deployment() {
    let t = Template::load();
    let all = alarms(&t);
    for watch in ["55", "0"] {
        let d = t.parameters(&[("ClusterName", "demo"), ("WatchSeconds", watch)]);
        let doc = dashboard(&t, &d);
        let widgets: Vec<Value> = as_list(&doc["widgets"])
            .into_iter()
            .filter(|w| w["type"] == "alarm")
            .collect();
        assert_eq!(widgets.len(), 1, "one alarm widget");
        let listed: Vec<String> = as_list(&widgets[0]["properties"]["alarms"])
            .iter()
            .map(|a| a.as_str().unwrap().rsplit(':').next().unwrap().to_owned())
            .collect();
        let unique: BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(
            unique.len(),
            listed.len(),
            "an alarm listed twice: {listed:?}"
        );
        let existing: BTreeSet<String> = all
            .keys()
            .filter(|name| {
                t.resource(name)
                    .get("Condition")
                    .is_none_or(|c| d.conditions[c.as_str().unwrap()])
            })
            .cloned()
            .collect();
        assert_eq!(
            unique, existing,
            "WatchSeconds={watch}: the alarm widget and the deployment's alarms differ"
        );
        assert_eq!(
            existing.contains("WatchNotRunningAlarm"),
            watch != "0",
            "WatchSeconds={watch}"
        );
    }
}

/// The dashboard: valid JSON once CloudWatch substitutes it; every tgsync metric it
/// graphs (directly or in a SEARCH) is one the code emits (or is announced to), under
/// those dimensions, for this stack's cluster and a function that exists; the latencies
/// as percentiles; counts and milliseconds never on one axis; every function's runs,
/// duration, registrations, deregistrations and errors; the load balancers' own host
/// counts.
#[test]
fn dashboard_graphs_what_the_code_emits() {
    let t = Template::load();
    let known = known_metrics();
    let units = metric_units();
    let functions: BTreeSet<String> = FUNCTION_DIRS.into_iter().map(served_as).collect();
    let p = t.props("Dashboard");
    assert_eq!(
        p["DashboardName"],
        json!({ "Fn::Sub": "${FunctionNamePrefix}-${ClusterName}" })
    );
    let doc = dashboard(&t, &t.parameters(&[("ClusterName", "demo")]));
    let mut graphed: BTreeSet<String> = BTreeSet::new();
    let mut per_function: BTreeSet<(String, String)> = BTreeSet::new();
    let mut percentiles = BTreeSet::new();
    let mut load_balancer = BTreeSet::new();
    for w in as_list(&doc["widgets"]) {
        let props = &w["properties"];
        if w["type"] == "metric" {
            assert_eq!(props["region"], "eu-west-1", "{w}");
        }
        // The units on each axis of the widget.
        let mut axes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for row in as_list(&props["metrics"]) {
            let row = as_list(&row);
            if let Some(expr) = row.first().and_then(|e| e["expression"].as_str()) {
                // SEARCH('{Namespace,Dim,...} MetricName="X" ...', 'Stat', 60)
                let schema = expr
                    .split('{')
                    .nth(1)
                    .and_then(|r| r.split('}').next())
                    .expect("a SEARCH schema");
                let mut parts: Vec<&str> = schema.split(',').collect();
                let namespace = parts.remove(0);
                let mut dims: Vec<String> = parts.iter().map(|d| (*d).to_owned()).collect();
                dims.sort();
                let metric = expr
                    .split("MetricName=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .expect("a MetricName");
                let axis = row[0]["yAxis"].as_str().unwrap_or("left").to_owned();
                if namespace == "tgsync" {
                    assert!(
                        expr.contains("Cluster=\"demo\""),
                        "this cluster only: {expr}"
                    );
                    let ok = known
                        .get(metric)
                        .is_some_and(|k| k.contains(&("tgsync".to_owned(), dims.clone())));
                    assert!(ok, "{metric} under {dims:?} is not emitted: {expr}");
                    graphed.insert(metric.to_owned());
                    axes.entry(axis).or_default().insert(units[metric].clone());
                } else {
                    assert!(
                        ["AWS/NetworkELB", "AWS/ApplicationELB"].contains(&namespace),
                        "{expr}"
                    );
                    assert!(
                        expr.contains("shop-web-8080"),
                        "narrowed by the parameter: {expr}"
                    );
                    load_balancer.insert(format!("{namespace} {metric}"));
                    // Host counts.
                    axes.entry(axis).or_default().insert("Count".to_owned());
                }
                continue;
            }
            let namespace = row[0].as_str().expect("a namespace, not the `.` shorthand");
            let metric = row[1].as_str().unwrap().to_owned();
            let mut dims = Vec::new();
            let mut i = 2;
            while i + 1 < row.len() && row[i].is_string() {
                let (k, v) = (row[i].as_str().unwrap(), row[i + 1].as_str().unwrap());
                match k {
                    "Cluster" => assert_eq!(v, "demo", "{metric}"),
                    "Function" => {
                        assert!(functions.contains(v), "{metric}: Function {v}");
                        per_function.insert((metric.clone(), v.to_owned()));
                    }
                    _ => {}
                }
                dims.push(k.to_owned());
                i += 2;
            }
            dims.sort();
            assert_eq!(namespace, "tgsync", "{row:?}");
            let ok = known
                .get(&metric)
                .is_some_and(|k| k.contains(&("tgsync".to_owned(), dims.clone())));
            assert!(ok, "{metric} under {dims:?} is not emitted");
            let options = row.last().filter(|o| o.is_object());
            if let Some(stat) = options.and_then(|o| o["stat"].as_str())
                && stat.starts_with('p')
            {
                percentiles.insert(metric.clone());
            }
            let axis = options
                .and_then(|o| o["yAxis"].as_str())
                .unwrap_or("left")
                .to_owned();
            axes.entry(axis).or_default().insert(units[&metric].clone());
            graphed.insert(metric);
        }
        for (axis, on_it) in &axes {
            assert_eq!(
                on_it.len(),
                1,
                "{}: the {axis} axis mixes {on_it:?}",
                props["title"]
            );
        }
    }
    for m in [
        "ReactionLatency",
        "GateLatency",
        "ElbThrottles",
        "ElbRetries",
        "WatchRunning",
        "WatchedPods",
        "DesiredTargets",
        "RegisteredTargets",
        "HealthyTargets",
        "ReconcileErrors",
        "BackingOff",
        "LeaseHeld",
        "RunsCompleted",
        "Duration",
        "OrphanedGroups",
    ] {
        assert!(graphed.contains(m), "the dashboard shows {m}");
    }
    for f in &functions {
        for m in [
            "RunsCompleted",
            "Duration",
            "Registered",
            "Deregistered",
            "ReconcileErrors",
        ] {
            assert!(
                per_function.contains(&(m.to_owned(), f.clone())),
                "the dashboard shows {m} of the {f} function"
            );
        }
    }
    assert_eq!(
        percentiles,
        BTreeSet::from(["GateLatency".to_owned(), "ReactionLatency".to_owned()]),
        "latencies as percentiles"
    );
    for m in [
        "AWS/NetworkELB HealthyHostCount",
        "AWS/NetworkELB UnHealthyHostCount",
    ] {
        assert!(load_balancer.contains(m), "the dashboard shows {m}");
    }
}

/// docs/operations.md's alarm table lists exactly the template's alarms, each with the
/// metric and namespace it watches.
#[test]
fn docs_alarm_table_lists_every_alarm() {
    let t = Template::load();
    let doc = read("docs/operations.md");
    let section = doc
        .split("\n### Alarms\n")
        .nth(1)
        .expect("docs/operations.md has an `### Alarms` section");
    let rows: BTreeMap<String, String> = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            let first = l.split('|').nth(1).unwrap_or_default().trim();
            (first.trim_matches('`').to_owned(), l.to_owned())
        })
        .collect();
    let alarms = alarms(&t);
    assert_eq!(
        rows.keys().collect::<Vec<_>>(),
        alarms.keys().collect::<Vec<_>>(),
        "docs/operations.md's alarm table and template.yaml's alarms differ"
    );
    for (name, a) in &alarms {
        let row = &rows[name];
        for m in alarm_metrics(a) {
            for needle in [
                m["MetricName"].as_str().unwrap(),
                m["Namespace"].as_str().unwrap(),
            ] {
                assert!(
                    row.contains(needle),
                    "docs/operations.md's row of {name} does not name {needle}: {row}"
                );
            }
        }
    }
}

#[test]
fn outputs_name_what_operators_need() {
    let t = Template::load();
    let outputs = &t.doc["Outputs"];
    let want = [
        ("ResyncRoleArn", get_att("ResyncRole", "Arn")),
        ("PodEventsRoleArn", get_att("PodEventsRole", "Arn")),
        ("ResyncFunctionName", json!({ "Ref": "ResyncFunction" })),
        (
            "PodEventsFunctionName",
            json!({ "Ref": "PodEventsFunction" }),
        ),
        ("StateTableName", table_name()),
        ("DeadLetterQueueUrl", json!({ "Ref": "DeadLetterQueue" })),
        ("ManualFunctionName", json!({ "Ref": "ManualFunction" })),
    ];
    for (name, value) in want {
        assert_eq!(outputs[name]["Value"], value, "output {name}");
    }
}

#[test]
fn pattern_matching_subset_behaves_like_eventbridge() {
    let pattern = json!({ "source": ["a"], "detail": { "k": ["x", "y"] } });
    assert!(pattern_matches(
        &pattern,
        &json!({ "source": "a", "detail": { "k": "y", "z": 1 } })
    ));
    assert!(pattern_matches(
        &pattern,
        &json!({ "source": "a", "detail": { "k": ["q", "x"] } })
    ));
    assert!(!pattern_matches(
        &pattern,
        &json!({ "source": "a", "detail": { "k": "z" } })
    ));
    assert!(!pattern_matches(
        &pattern,
        &json!({ "source": "a", "detail": {} })
    ));
    assert!(!pattern_matches(
        &pattern,
        &json!({ "source": "a", "detail": { "k": { "x": 1 } } })
    ));
    assert!(!pattern_matches(
        &pattern,
        &json!({ "source": "b", "detail": { "k": "x" } })
    ));
    assert!(!pattern_matches(
        &pattern,
        &json!({ "source": "a", "detail": "k" })
    ));
    assert!(action_matches(
        "elasticloadbalancing:*",
        "elasticloadbalancing:RegisterTargets"
    ));
    assert!(action_matches(
        "*",
        "elasticloadbalancing:DeregisterTargets"
    ));
    assert!(action_matches(
        "ElasticLoadBalancing:register?argets",
        "elasticloadbalancing:RegisterTargets"
    ));
    assert!(!action_matches(
        "elasticloadbalancing:Describe*",
        "elasticloadbalancing:RegisterTargets"
    ));
}

/// The functions that share the deployment's ELBv2 budgets.
const BUDGETED: [&str; 3] = ["ResyncFunction", "PodEventsFunction", "ManualFunction"];

/// The ELBv2 budgets are the deployment's: each function has reserved concurrency, and
/// its containers are told how many there can be and which share they get, so that with
/// every container of every function busy (the watching resync, pod-events, a manual
/// run) the calls stay within the budgets over every window (the per-container pacing
/// is `MutationRate::container_shares`: mutations in any second, Describes in any 2 s).
/// Checked for every budget the parameters allow, with as many
/// pod-events containers as the documented rule admits (30 % of the smaller budget,
/// rounded to the nearest whole number).
#[test]
fn elbv2_budgets_are_divided_by_the_reserved_concurrency() {
    let t = Template::load();
    let rule = t.doc["Parameters"]["PodEventsConcurrency"]["Description"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        rule.contains("at most 30 %") && rule.contains("rounded to the nearest"),
        "PodEventsConcurrency states the rule checked here: {rule}"
    );
    let range = |name: &str| {
        let p = &t.doc["Parameters"][name];
        p["MinValue"].as_u64().unwrap()..=p["MaxValue"].as_u64().unwrap()
    };
    let mut deployments: Vec<Vec<(String, String)>> = vec![vec![]];
    for budget in range("ElbMutationsPerSecond") {
        let containers = ((budget as f64) * 0.3).round().max(1.0) as u64;
        assert!(range("PodEventsConcurrency").contains(&containers));
        deployments.push(vec![
            ("PodEventsConcurrency".into(), containers.to_string()),
            ("ElbMutationsPerSecond".into(), budget.to_string()),
            ("ElbDescribesPerSecond".into(), budget.max(3).to_string()),
        ]);
    }
    for given in deployments {
        let mut params: Vec<(&str, &str)> = vec![("ClusterName", "demo")];
        params.extend(given.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let d = t.parameters(&params);
        let refs = BTreeMap::from([("StateTable", "t")]);
        let env = |function: &str, name: &str| -> String {
            let v = resolve(
                &t.props(function)["Environment"]["Variables"][name],
                &d,
                &refs,
            );
            scalar_string(&v).as_str().unwrap_or_default().to_owned()
        };
        let reserved = |function: &str| -> u32 {
            let v = resolve(
                &t.props(function)["ReservedConcurrentExecutions"],
                &d,
                &refs,
            );
            scalar_string(&v)
                .as_str()
                .unwrap_or_default()
                .parse()
                .expect("a number")
        };
        let shares: f64 = BUDGETED
            .iter()
            .map(|f| env(f, "TGSYNC_BUDGET_SHARE").parse::<f64>().unwrap())
            .sum();
        assert!(
            shares <= 1.0 + 1e-9,
            "the shares add up to at most the whole: {shares}"
        );
        // A container's two shares, mutations then Describes: each budget picks its own.
        type Pick = fn((MutationRate, MutationRate)) -> MutationRate;
        let mutations: Pick = |(m, _)| m;
        let describes: Pick = |(_, d)| d;
        for (budget, pick) in [
            ("TGSYNC_ELB_MUTATIONS_PER_SECOND", mutations),
            ("TGSYNC_ELB_DESCRIBES_PER_SECOND", describes),
        ] {
            let mut worst = 0;
            let mut total = 0;
            let mut seconds = 0;
            for function in BUDGETED {
                let containers = reserved(function);
                assert_eq!(
                    env(function, "TGSYNC_MAX_CONTAINERS")
                        .parse::<u32>()
                        .unwrap(),
                    containers,
                    "{function}: TGSYNC_MAX_CONTAINERS is its reserved concurrency"
                );
                let share: f64 = env(function, "TGSYNC_BUDGET_SHARE").parse().unwrap();
                total = env(function, budget).parse::<u32>().unwrap();
                let rate =
                    pick(MutationRate::container_shares(total, total, share, containers).unwrap());
                worst += containers * rate.per_window();
                seconds = rate.window_seconds();
            }
            assert!(
                worst <= total * seconds,
                "{budget} {given:?}: {worst} calls in {seconds} s > {total} a second"
            );
        }
    }
    // At the defaults the resync keeps the Describe pace its cost figures assume.
    let d = t.parameters(&[("ClusterName", "demo")]);
    let share: f64 = resolve(
        &t.props("ResyncFunction")["Environment"]["Variables"]["TGSYNC_BUDGET_SHARE"],
        &d,
        &BTreeMap::new(),
    )
    .as_str()
    .unwrap()
    .parse()
    .unwrap();
    let (_, describes) = MutationRate::container_shares(5, 8, share, 1).unwrap();
    assert_eq!(
        (describes.per_window(), describes.window_seconds()),
        (8, 2),
        "8 Describe calls in any 2 s"
    );
}

// ------------------------------------------------------------------------------------
// Cluster access: access entries in the stack, RBAC only for the readiness gate
// ------------------------------------------------------------------------------------

/// With CreateAccessEntries (the default), both function roles get an access entry in
/// the Kubernetes group tgsync, with AmazonEKSViewPolicy (get/list/watch pods) scoped to
/// exactly the namespaces the functions may serve (the settings' AllowedNamespaces), or
/// to the cluster when any namespace is allowed.
#[test]
fn access_entries_scope_the_view_policy_to_the_allowed_namespaces() {
    let t = Template::load();
    assert_eq!(
        t.parameter_default("CreateAccessEntries"),
        Some(&json!("true"))
    );
    let entries: BTreeMap<_, _> = t.of_type("AWS::EKS::AccessEntry").collect();
    assert_eq!(
        entries.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
        ["PodEventsAccessEntry", "ResyncAccessEntry"]
    );
    let refs = BTreeMap::from([("StateTable", "t")]);
    let view = json!({ "Fn::Sub": "arn:${AWS::Partition}:eks::aws:cluster-access-policy/AmazonEKSViewPolicy" });
    for (namespaces, scope) in [
        ("", json!({ "Type": "cluster" })),
        (
            "shop",
            json!({ "Type": "namespace", "Namespaces": ["shop"] }),
        ),
        (
            "shop kafka",
            json!({ "Type": "namespace", "Namespaces": ["shop", "kafka"] }),
        ),
    ] {
        let d = t.parameters(&[("ClusterName", "demo"), ("AllowedNamespaces", namespaces)]);
        assert!(d.conditions["AccessEntries"]);
        for (name, role) in [
            ("ResyncAccessEntry", "ResyncRole"),
            ("PodEventsAccessEntry", "PodEventsRole"),
        ] {
            assert_eq!(entries[&name.to_owned()]["Condition"], "AccessEntries");
            let p = resolve(t.props(name), &d, &refs);
            assert_eq!(p["ClusterName"], "demo", "{name}");
            assert_eq!(p["PrincipalArn"], get_att(role, "Arn"), "{name}");
            assert_eq!(p["Type"], "STANDARD", "{name}");
            assert_eq!(p["KubernetesGroups"], json!([RBAC_GROUP]), "{name}");
            let policies = as_list(&p["AccessPolicies"]);
            assert_eq!(policies.len(), 1, "{name}: one access policy");
            assert_eq!(policies[0]["PolicyArn"], view, "{name}");
            assert_eq!(policies[0]["AccessScope"], scope, "{name} {namespaces:?}");
            // The scope is the set of namespaces the functions accept in tags.
            let env = BTreeMap::from([
                ("TGSYNC_CLUSTER_NAME", "demo".to_owned()),
                ("TGSYNC_TABLE_NAME", "t".to_owned()),
                (
                    "TGSYNC_ALLOWED_NAMESPACES",
                    resolve(
                        &t.props("ResyncFunction")["Environment"]["Variables"]
                            ["TGSYNC_ALLOWED_NAMESPACES"],
                        &d,
                        &refs,
                    )
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                ),
            ]);
            let settings = Settings::from_lookup(|k| env.get(k).cloned()).expect("settings");
            let allowed = settings.binding_policy().allowed_namespaces;
            let scoped: Option<BTreeSet<String>> = scope.get("Namespaces").map(|n| {
                as_list(n)
                    .iter()
                    .map(|v| v.as_str().unwrap_or_default().to_owned())
                    .collect()
            });
            assert_eq!(allowed, scoped, "{name}: access scope = allowed namespaces");
        }
    }
    let off = t.parameters(&[("ClusterName", "demo"), ("CreateAccessEntries", "false")]);
    assert!(!off.conditions["AccessEntries"], "false creates none");
    // Namespaces in the parameter are single-space separated: a split never yields "".
    let pattern = t.doc["Parameters"]["AllowedNamespaces"]["AllowedPattern"]
        .as_str()
        .expect("AllowedNamespaces has an AllowedPattern");
    assert!(pattern.contains("( [a-z0-9]"), "{pattern}");
}

/// The Kubernetes group the access entries name and infra/rbac.yaml binds.
const RBAC_GROUP: &str = "tgsync";

/// infra/rbac.yaml holds only what access policies cannot grant: `patch` on
/// `pods/status` (the readiness gate), bound to the group of the access entries.
#[test]
fn rbac_manifest_grants_only_what_access_policies_cannot() {
    let text = read("infra/rbac.yaml");
    let docs: Vec<Value> = serde_norway::Deserializer::from_str(&text)
        .map(|d| to_json(serde_norway::Value::deserialize(d).expect("infra/rbac.yaml is YAML")))
        .filter(|d| !d.is_null())
        .collect();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRole",
            "ClusterRoleBinding"
        ],
        "one manifest: the readiness gate's role and the nodes role, each bound"
    );
    // Reads of pods come from the access policy; this grants only what it cannot.
    let wanted = [
        json!([{ "apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"] }]),
        json!([{ "apiGroups": [""], "resources": ["nodes"], "verbs": ["get"] }]),
    ];
    for (pair, rules) in docs.chunks(2).zip(wanted) {
        let (role, binding) = (&pair[0], &pair[1]);
        assert_eq!(role["rules"], rules, "{role}");
        assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(
            binding["subjects"],
            json!([{ "apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": RBAC_GROUP }])
        );
    }
}

// ------------------------------------------------------------------------------------
// The release: version, license, Serverless Application Repository metadata
// ------------------------------------------------------------------------------------

/// The `key = "value"` of the workspace's `[workspace.package]` table.
fn workspace_package(key: &str) -> String {
    let manifest = read("Cargo.toml");
    let table = manifest
        .split("[workspace.package]")
        .nth(1)
        .and_then(|t| t.split("\n[").next())
        .expect("Cargo.toml has [workspace.package]");
    table
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| panic!("[workspace.package] has no {key}"))
}

#[test]
fn the_release_metadata_agrees_with_the_workspace() {
    let t = Template::load();
    let version = workspace_package("version");
    assert_eq!(
        version,
        env!("CARGO_PKG_VERSION"),
        "tgsync takes the workspace version"
    );
    let sar = &t.doc["Metadata"]["AWS::ServerlessRepo::Application"];
    assert_eq!(
        sar["SemanticVersion"].to_string().trim_matches('"'),
        version
    );
    assert_eq!(sar["SpdxLicenseId"], workspace_package("license"));
    for key in ["Name", "Description", "Author"] {
        assert!(sar[key].as_str().is_some_and(|s| !s.is_empty()), "{key}");
    }
    for key in ["LicenseUrl", "ReadmeUrl"] {
        let file = sar[key].as_str().unwrap_or_else(|| panic!("{key}"));
        assert!(root().join(file).is_file(), "{key}: {file} exists");
    }
    let license = read("LICENSE");
    assert!(
        license.contains("Apache License") && license.contains("Version 2.0, January 2004"),
        "LICENSE is the Apache-2.0 text"
    );
    let changelog = read("CHANGELOG.md");
    assert!(
        changelog.contains(&format!("## {version} "))
            || changelog.contains(&format!("## [{version}]")),
        "CHANGELOG.md has a section for {version}"
    );
    // Every member of the workspace takes the one version.
    let members = read("Cargo.toml");
    let members = members
        .split("members = [")
        .nth(1)
        .and_then(|m| m.split(']').next())
        .expect("workspace members");
    for member in members.split(',').map(|m| m.trim().trim_matches('"')) {
        if member.is_empty() || member == "." {
            continue;
        }
        let manifest = read(format!("{member}/Cargo.toml"));
        assert!(
            manifest.contains("version.workspace = true"),
            "{member}/Cargo.toml takes the workspace version"
        );
    }
}

// ------------------------------------------------------------------------------------
// The docs' tables against the template and the code
// ------------------------------------------------------------------------------------

/// The rows of the first table of `file` whose header row is exactly `header`: each
/// row's backticked names in the first cell, with the whole row.
fn docs_table(file: &str, header: &str) -> Vec<(Vec<String>, String)> {
    let text = read(file);
    let mut lines = text.lines().skip_while(|l| l.trim() != header);
    assert!(
        lines.next().is_some(),
        "{file} has no table with the header {header}"
    );
    lines
        .skip(1) // separator
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let first = l.split('|').nth(1).unwrap_or_default();
            let names = first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            (names, l.to_owned())
        })
        .collect()
}

/// docs/configuration.md's parameter table lists every parameter of template.yaml (and
/// no other), each with its default.
#[test]
fn docs_parameter_table_lists_every_template_parameter() {
    let t = Template::load();
    let rows = docs_table("docs/configuration.md", "| parameter | default | meaning |");
    let mut documented = BTreeMap::new();
    for (names, row) in &rows {
        assert!(!names.is_empty(), "a row without a `parameter`: {row}");
        for name in names {
            assert!(
                documented.insert(name.clone(), row.clone()).is_none(),
                "docs/configuration.md lists {name} twice"
            );
        }
    }
    let parameters: BTreeSet<String> = t.doc["Parameters"]
        .as_object()
        .expect("Parameters")
        .keys()
        .cloned()
        .collect();
    let listed: BTreeSet<String> = documented.keys().cloned().collect();
    let missing: Vec<_> = parameters.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&parameters).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/configuration.md's parameter table and template.yaml differ: not in the docs {missing:?}, not in template.yaml {unknown:?}"
    );
    for (name, row) in &documented {
        let default_cell = row.split('|').nth(2).unwrap_or_default();
        match t.parameter_default(name).map(scalar_string) {
            None => assert!(default_cell.contains("required"), "{name}: {row}"),
            Some(Value::String(d)) if d.is_empty() => {
                assert!(default_cell.contains("empty"), "{name}: {row}")
            }
            Some(Value::String(d)) => assert!(
                default_cell.contains(&format!("`{d}`")),
                "{name}: the docs' default is not `{d}`: {row}"
            ),
            Some(other) => panic!("{name}: default {other}"),
        }
    }
}

/// docs/configuration.md's environment table lists every TGSYNC_* variable src/config.rs
/// reads (and no other).
#[test]
fn docs_configuration_table_lists_every_variable() {
    let rows = docs_table("docs/configuration.md", "| variable | default | meaning |");
    let listed: BTreeSet<String> = rows
        .iter()
        .flat_map(|(names, _)| names.iter())
        .filter(|n| n.starts_with("TGSYNC_"))
        .cloned()
        .collect();
    let read_by_code = config_variables();
    let missing: Vec<_> = read_by_code.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&read_by_code).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/configuration.md's environment table and src/config.rs differ: not in the docs {missing:?}, not read by src/config.rs {unknown:?}"
    );
}

/// docs/configuration.md's outputs table lists every output of the stack, and no other.
#[test]
fn docs_outputs_table_lists_every_output() {
    let t = Template::load();
    let rows = docs_table("docs/configuration.md", "| output | what |");
    let listed: Vec<String> = rows.iter().flat_map(|(names, _)| names.clone()).collect();
    let unique: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(unique.len(), listed.len(), "an output listed twice");
    let outputs: BTreeSet<String> = t.doc["Outputs"]
        .as_object()
        .expect("Outputs")
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        unique, outputs,
        "docs/configuration.md's outputs and template.yaml's differ"
    );
}

/// docs/configuration.md's `TGSYNC_BUDGET_SHARE` row gives each function's share as the
/// template sets it.
#[test]
fn docs_budget_shares_are_the_templates() {
    let t = Template::load();
    let rows = docs_table("docs/configuration.md", "| variable | default | meaning |");
    let (_, row) = rows
        .iter()
        .find(|(names, _)| names.iter().any(|n| n == "TGSYNC_BUDGET_SHARE"))
        .expect("a TGSYNC_BUDGET_SHARE row");
    let meaning = row.split('|').nth(3).unwrap_or_default();
    for (function, name) in [
        ("ResyncFunction", "the resync"),
        ("PodEventsFunction", "pod-events"),
        ("ManualFunction", "the manual function"),
    ] {
        let share = t.props(function)["Environment"]["Variables"]["TGSYNC_BUDGET_SHARE"]
            .as_str()
            .expect("a constant share")
            .to_owned();
        assert!(
            meaning.contains(&format!("{name} `{share}`")),
            "{function}: the docs do not give {name} `{share}`: {meaning}"
        );
    }
}

/// The functions, as the template deploys them: `<prefix>-<name>`, one per crate under
/// functions/ (package `tgsync-<name>`), each with its own log group
/// `/aws/lambda/<prefix>-<name>`.
fn deployed_functions(t: &Template) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (id, f) in t.of_type("AWS::Serverless::Function") {
        let p = &f["Properties"];
        let name = p["FunctionName"]["Fn::Sub"]
            .as_str()
            .and_then(|s| s.strip_prefix("${FunctionNamePrefix}-"))
            .unwrap_or_else(|| panic!("{id}: FunctionName is not ${{FunctionNamePrefix}}-<name>"))
            .to_owned();
        assert_eq!(p["CodeUri"], format!("functions/{name}"), "{id}");
        assert_eq!(
            package_name(&format!("functions/{name}")),
            format!("tgsync-{name}"),
            "{id}"
        );
        let log_group = p["LoggingConfig"]["LogGroup"]["Ref"]
            .as_str()
            .unwrap_or_else(|| panic!("{id}: LoggingConfig.LogGroup is a Ref to its log group"));
        assert_eq!(
            t.props(log_group)["LogGroupName"],
            json!({ "Fn::Sub": format!("/aws/lambda/${{FunctionNamePrefix}}-{name}") }),
            "{id}: its log group"
        );
        names.insert(name);
    }
    let crates: BTreeSet<String> = std::fs::read_dir(root().join("functions"))
        .expect("functions/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names, crates,
        "the template's functions and functions/* differ"
    );
    assert_eq!(
        t.of_type("AWS::Logs::LogGroup").count(),
        names.len(),
        "one log group per function"
    );
    names
}

const NUMBER_WORDS: [(&str, usize); 6] = [
    ("one", 1),
    ("two", 2),
    ("both", 2),
    ("three", 3),
    ("four", 4),
    ("five", 5),
];

/// Every count of functions or log groups in `text` ("three Rust Lambda functions",
/// "both log groups", "the 3 functions"): (the count, the phrase).
fn counted(text: &str) -> Vec<(usize, String)> {
    let words: Vec<String> = text
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .collect();
    // Words that may stand between the count and what it counts.
    let between = ["rust", "lambda", "small", "thin", "aws", "tgsync"];
    let mut out = Vec::new();
    for i in 0..words.len() {
        let noun_start = match words[i].as_str() {
            "functions" => i,
            "groups" if i > 0 && words[i - 1] == "log" => i - 1,
            _ => continue,
        };
        let mut j = noun_start;
        while j > 0 && noun_start - j < 4 {
            j -= 1;
            let w = words[j].as_str();
            if let Some((_, n)) = NUMBER_WORDS.iter().find(|(word, _)| *word == w) {
                out.push((*n, words[j..=i].join(" ")));
                break;
            }
            if let Ok(n) = w.parse::<usize>() {
                out.push((n, words[j..=i].join(" ")));
                break;
            }
            if !between.contains(&w) {
                break;
            }
        }
    }
    out
}

/// The docs and the template's own descriptions name the functions the template deploys:
/// the count wherever one is stated ("three functions", "the three log groups"), and each
/// function by name where they are listed (the README's table, the architecture, the
/// log groups, `FunctionNamePrefix`, the stack's and the Serverless Application
/// Repository's descriptions).
#[test]
fn docs_name_the_functions_the_template_deploys() {
    let t = Template::load();
    let names = deployed_functions(&t);
    assert_eq!(names.len(), 3, "{names:?}");
    // Every stated count.
    let mut texts = vec![
        ("README.md".to_owned(), read("README.md")),
        ("template.yaml".to_owned(), read("template.yaml")),
        ("infra/README.md".to_owned(), read("infra/README.md")),
        ("samconfig.toml".to_owned(), read("samconfig.toml")),
    ];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let name = entry.expect("an entry").file_name().into_string().unwrap();
        if name.ends_with(".md") && name != "benchmarks-history.md" {
            texts.push((format!("docs/{name}"), read(format!("docs/{name}"))));
        }
    }
    let mut stated = 0;
    for (file, text) in &texts {
        for (n, phrase) in counted(text) {
            assert_eq!(
                n,
                names.len(),
                "{file} says \"{phrase}\": the template deploys {} functions, each with its log group",
                names.len()
            );
            stated += 1;
        }
    }
    assert!(
        stated >= 4,
        "only {stated} counts found: is the scan broken?"
    );
    assert!(
        counted("the two Rust Lambda functions and both log groups")
            == [
                (2, "two rust lambda functions".to_owned()),
                (2, "both log groups".to_owned())
            ],
        "the scan finds counts"
    );
    // The README's table of functions.
    let readme = read("README.md");
    let table: BTreeSet<String> = readme
        .lines()
        .skip_while(|l| l.trim() != "| function | started by | what it does |")
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cell = l.split('|').nth(1)?.trim().trim_matches('`');
            cell.strip_prefix("<prefix>-").map(str::to_owned)
        })
        .collect();
    assert_eq!(table, names, "README.md's table of functions");
    // Each function by name where they are listed.
    let arch = read("docs/architecture.md");
    let intro = arch.split("\n## ").next().unwrap();
    let operations = read("docs/operations.md");
    let params = &t.doc["Parameters"];
    let prefix = params["FunctionNamePrefix"]["Description"]
        .as_str()
        .unwrap();
    let retention = params["LogRetentionDays"]["Description"].as_str().unwrap();
    let description = t.doc["Description"].as_str().unwrap();
    let sar = t.doc["Metadata"]["AWS::ServerlessRepo::Application"]["Description"]
        .as_str()
        .unwrap();
    for name in &names {
        assert!(
            intro.contains(&format!("`<prefix>-{name}`")),
            "docs/architecture.md's introduction names {name}"
        );
        assert!(
            operations.contains(&format!("`/aws/lambda/<prefix>-{name}`")),
            "docs/operations.md names the log group of {name}"
        );
        assert!(
            prefix.contains(&format!("<prefix>-{name}")),
            "FunctionNamePrefix's description names {name}"
        );
        assert!(
            retention.contains(&format!("-{name}")),
            "LogRetentionDays' description names the log group of {name}"
        );
        for (what, text) in [("the stack's", description), ("the SAR", sar)] {
            assert!(
                text.contains(name.as_str()),
                "{what} description names {name}"
            );
        }
    }
}

/// The timings the docs derive from the template: the read timeout they give `aws lambda
/// invoke` outlasts the manual function's own (so the AWS CLI never retries a run that
/// is still going), the function timeout they quote is the template's, and "every minute
/// by default" is `ScheduleMinutes`' default.
#[test]
fn docs_timings_follow_the_template() {
    let t = Template::load();
    let timeout = t.props("ManualFunction")["Timeout"]
        .as_u64()
        .expect("ManualFunction's Timeout");
    let numbers_after = |text: &str, marker: &str| -> Vec<u64> {
        text.match_indices(marker)
            .filter_map(|(i, _)| {
                let digits: String = text[i + marker.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                digits.parse().ok()
            })
            .collect()
    };
    let (mut read_timeouts, mut quoted) = (0, 0);
    let mut files = vec!["README.md".to_owned()];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let name = entry.expect("an entry").file_name().into_string().unwrap();
        if name.ends_with(".md") && name != "benchmarks-history.md" {
            files.push(format!("docs/{name}"));
        }
    }
    for file in &files {
        let text = read(file).replace('\n', " ");
        for n in numbers_after(&text, "--cli-read-timeout ") {
            assert!(
                n > timeout,
                "{file}: --cli-read-timeout {n} gives up before the manual function's {timeout} s"
            );
            read_timeouts += 1;
        }
        for n in numbers_after(&text, "covers the function's ") {
            assert_eq!(n, timeout, "{file}: the manual function's timeout");
            quoted += 1;
        }
    }
    assert!(
        read_timeouts >= 1 && quoted >= 1,
        "the scan finds the docs' timings"
    );
    let readme = read("README.md");
    if readme.contains("every minute by default") {
        assert_eq!(
            scalar_string(t.parameter_default("ScheduleMinutes").expect("a default")),
            "1",
            "README.md says the resync runs every minute by default"
        );
    }
}

/// docs/operations.md's metrics table names every metric the code emits, and no other.
#[test]
fn docs_metrics_table_lists_every_metric() {
    let emitted: BTreeSet<String> = emitted_metrics().keys().cloned().collect();
    let rows = docs_table(
        "docs/operations.md",
        "| line | dimensions | metrics | extra properties |",
    );
    assert!(!rows.is_empty());
    let mut listed = BTreeSet::new();
    for (_, row) in &rows {
        let cell = row.split('|').nth(3).unwrap_or_default();
        for name in cell.split('`').skip(1).step_by(2) {
            // Metric names; the cell also names values such as `Function=resync`.
            if name.chars().next().is_some_and(char::is_uppercase)
                && name.chars().all(char::is_alphanumeric)
            {
                listed.insert(name.to_owned());
            }
        }
    }
    assert_eq!(
        listed, emitted,
        "docs/operations.md's metrics table and the metrics src/metrics.rs emits differ"
    );
}

/// docs/operations.md's table of the settings by ScheduleMinutes is the template's: the
/// `WatchSeconds` its Rules accept, `WatchNotRunningAlarm`'s period and runs, and
/// `ResyncInvocationErrorsAlarm`'s period (and each mapping's `Minutes`, which the alarm
/// descriptions give, is its `Period`).
#[test]
fn docs_settings_table_is_the_templates() {
    let t = Template::load();
    let rows = docs_table(
        "docs/operations.md",
        "| `ScheduleMinutes` | `WatchSeconds` the Rules accept | `WatchNotRunningAlarm` period | runs in a period | `ResyncInvocationErrorsAlarm` period |",
    );
    let minutes_of = |cell: &str, row: &str| -> u64 {
        cell.strip_suffix(" minutes")
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("{row}: a period in minutes"))
    };
    let mut documented = BTreeMap::new();
    for (_, row) in &rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let minutes = cells[1].to_owned();
        let mut accepted = BTreeSet::new();
        for part in cells[2].split(", ") {
            match part.split_once('–') {
                Some((lo, hi)) => accepted
                    .extend(lo.parse::<u64>().expect("a number")..=hi.parse().expect("a number")),
                None => {
                    accepted.insert(part.parse::<u64>().expect("a number"));
                }
            }
        }
        let period = minutes_of(cells[3], row);
        let runs: u64 = cells[4].parse().expect("runs");
        let errors = minutes_of(cells[5], row);
        documented.insert(minutes, (accepted, period, runs, errors));
    }
    let mut templated = BTreeMap::new();
    for minutes in number_parameter_values(&t, "ScheduleMinutes") {
        let key = minutes.to_string();
        let deploy = |watch: u64| {
            t.parameters(&[
                ("ClusterName", "demo"),
                ("ScheduleMinutes", &key),
                ("WatchSeconds", &watch.to_string()),
            ])
        };
        let accepted: BTreeSet<u64> = number_parameter_values(&t, "WatchSeconds")
            .into_iter()
            .filter(|&w| rules_refuse(&t, &deploy(w)).is_empty())
            .collect();
        let a = Alarm::resolve(&t, "WatchNotRunningAlarm", &deploy(60 * minutes - 5))
            .expect("watch mode on");
        let e = Alarm::resolve(&t, "ResyncInvocationErrorsAlarm", &deploy(0)).expect("always");
        let d = deploy(0);
        let runs = d.mappings["WatchAlarm"][&key]["Runs"].as_u64().unwrap();
        for (map, period) in [
            ("WatchAlarm", a.period),
            ("InvocationErrorsAlarm", e.period),
        ] {
            assert_eq!(
                d.mappings[map][&key]["Minutes"].as_u64(),
                Some(period / 60),
                "Mappings {map} {key}: Minutes is the Period"
            );
        }
        templated.insert(key, (accepted, a.period / 60, runs, e.period / 60));
    }
    assert_eq!(
        documented, templated,
        "docs/operations.md's settings table and the template differ"
    );
}

/// The number after `marker` in `text` (`"CloudWatch alarms ("` → 6).
fn number_after(text: &str, marker: &str) -> usize {
    let at = text.find(marker).unwrap_or_else(|| panic!("no {marker:?}"));
    let rest = &text[at + marker.len()..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("no number after {marker:?}: {}", &rest[..20]))
}

/// The cost table's counts are the template's and the code's: the alarms of a stack with
/// watch mode on and off, and the metrics of the resync's run lines with and without it.
#[test]
fn docs_cost_table_counts_the_alarms_and_metrics() {
    use tgsync::core::UnixMillis;
    use tgsync::logging::LambdaLevel;
    use tgsync::metrics::emf_lines;
    use tgsync::report::Report;
    let t = Template::load();
    let doc = read("docs/operations.md");
    let cost = doc
        .split("\n## Cost\n")
        .nth(1)
        .expect("docs/operations.md has a `## Cost` section");
    let alarms_of = |watch: &str| {
        let d = t.parameters(&[("ClusterName", "demo"), ("WatchSeconds", watch)]);
        alarms(&t)
            .keys()
            .filter(|name| {
                t.resource(name)
                    .get("Condition")
                    .is_none_or(|c| d.conditions[c.as_str().unwrap()])
            })
            .count()
    };
    assert_eq!(
        number_after(cost, "CloudWatch alarms ("),
        alarms_of("55"),
        "alarms with watch mode"
    );
    assert_eq!(
        number_after(cost, "with watch mode; "),
        alarms_of("0"),
        "alarms without watch mode"
    );
    let resync: &'static str = Box::leak(served_as("functions/resync").into_boxed_str());
    let run_metrics = |watch: bool| {
        let mut r = Report::new(resync, "demo", false, UnixMillis(1_800_000_000_000));
        if watch {
            r.watch = Some(Default::default());
        }
        r.orphans = Some(Vec::new());
        let r = r.finish(UnixMillis(1_800_000_000_500));
        let mut names = BTreeSet::new();
        for line in emf_lines(&r, LambdaLevel::Info) {
            let v: Value = serde_json::from_str(&line).unwrap();
            for directive in as_list(&v["_aws"]["CloudWatchMetrics"]) {
                for m in as_list(&directive["Metrics"]) {
                    names.insert(m["Name"].as_str().unwrap().to_owned());
                }
            }
        }
        names.len()
    };
    assert_eq!(
        number_after(cost, "the resync's run lines: "),
        run_metrics(true),
        "run-line metrics with watch mode"
    );
    assert_eq!(
        number_after(cost, "with watch mode, "),
        run_metrics(false),
        "run-line metrics without watch mode"
    );
}

/// The cargo-lambda recipe of docs/install.md deploys each function as the template
/// does at its defaults: the same timeout, memory and reserved concurrency, and the same
/// settings as the function reads them from its environment.
#[test]
fn cargo_lambda_recipe_matches_the_template() {
    let t = Template::load();
    let doc = read("docs/install.md");
    let section = doc
        .split("### With cargo-lambda only")
        .nth(1)
        .expect("docs/install.md has the cargo-lambda recipe");
    let block = section
        .split("```sh")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the recipe's commands");
    // One command per line: continuation lines joined.
    let commands: Vec<Vec<String>> = block
        .replace("\\\n", " ")
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|w| !w.is_empty() && !w[0].starts_with('#'))
        .collect();
    let flag = |words: &[String], name: &str| -> Option<String> {
        words
            .iter()
            .position(|w| w == name)
            .map(|i| words[i + 1].trim_matches('"').to_owned())
    };
    let d = t.parameters(&[("ClusterName", "prod")]);
    let refs = BTreeMap::from([("StateTable", "tgsync-state")]);
    let mut deployed = BTreeSet::new();
    for (id, f) in t.of_type("AWS::Serverless::Function") {
        let p = &f["Properties"];
        let binary = f["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap();
        let deploy = commands
            .iter()
            .find(|w| w.len() > 3 && w[..3] == ["cargo", "lambda", "deploy"] && w[3] == binary)
            .unwrap_or_else(|| panic!("{id}: no `cargo lambda deploy {binary}`"));
        let number = |v: &Value| -> String {
            match scalar_string(&resolve(v, &d, &refs)) {
                Value::String(s) => s,
                other => panic!("{id}: {other}"),
            }
        };
        assert_eq!(
            flag(deploy, "--timeout"),
            Some(number(&p["Timeout"])),
            "{id}: --timeout"
        );
        assert_eq!(
            flag(deploy, "--memory"),
            Some(number(&p["MemorySize"])),
            "{id}: --memory"
        );
        // The settings, as the function reads them.
        let recipe_env: BTreeMap<String, String> = flag(deploy, "--env-var")
            .unwrap_or_else(|| panic!("{id}: --env-var"))
            .split(',')
            .map(|kv| {
                let (k, v) = kv.split_once('=').expect("KEY=VALUE");
                (k.to_owned(), v.to_owned())
            })
            .collect();
        let template_env: BTreeMap<String, String> = p["Environment"]["Variables"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let v = resolve(v, &d, &refs);
                (k.clone(), v.as_str().unwrap_or_default().to_owned())
            })
            .collect();
        let from_recipe = Settings::from_lookup(|k| recipe_env.get(k).cloned())
            .unwrap_or_else(|e| panic!("{id}: the recipe's settings: {e}"));
        let from_template = Settings::from_lookup(|k| template_env.get(k).cloned())
            .unwrap_or_else(|e| panic!("{id}: the template's settings: {e}"));
        assert_eq!(
            from_recipe, from_template,
            "{id}: the recipe's environment reads differently from the template's"
        );
        let function = binary.to_owned();
        let reserved = commands
            .iter()
            .find(|w| {
                w.len() > 2
                    && w[..3] == ["aws", "lambda", "put-function-concurrency"]
                    && flag(w, "--function-name").as_deref() == Some(function.as_str())
            })
            .and_then(|w| flag(w, "--reserved-concurrent-executions"))
            .unwrap_or_else(|| panic!("{id}: no put-function-concurrency for {function}"));
        assert_eq!(
            reserved,
            number(&p["ReservedConcurrentExecutions"]),
            "{id}: reserved concurrency"
        );
        deployed.insert(function);
    }
    assert_eq!(deployed.len(), 3);
    // The manual function's release alias.
    assert!(
        commands.iter().any(|w| w.len() > 2
            && w[..3] == ["aws", "lambda", "create-alias"]
            && flag(w, "--name").as_deref() == Some(tgsync::handlers::manual::RELEASE_ALIAS)),
        "the recipe publishes the release alias"
    );
}

/// docs/install.md's table of what the template grants names exactly the actions the
/// template's policies allow (the first cell of each row: `service:Action`, then the same
/// service's further actions, up to the row's first parenthesis).
#[test]
fn docs_iam_table_is_the_templates_grants() {
    let t = Template::load();
    let granted: BTreeSet<String> = statements(&t)
        .into_iter()
        .filter(|(_, s)| s["Effect"] == "Allow")
        .flat_map(|(_, s)| actions(&s))
        .collect();
    let mut documented = BTreeSet::new();
    for (_, row) in docs_table("docs/install.md", "| permission | resource |") {
        let cell = row.split('|').nth(1).unwrap_or_default();
        let cell = cell.split('(').next().unwrap_or_default();
        let mut service = String::new();
        for name in cell.split('`').skip(1).step_by(2) {
            match name.split_once(':') {
                Some((s, _)) => {
                    service = s.to_owned();
                    documented.insert(name.to_owned());
                }
                None => {
                    assert!(!service.is_empty(), "{name}: no service before it in {row}");
                    documented.insert(format!("{service}:{name}"));
                }
            }
        }
    }
    assert_eq!(
        documented, granted,
        "docs/install.md's IAM table and template.yaml's grants differ"
    );
}
