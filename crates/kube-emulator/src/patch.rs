//! The three PATCH formats the apiserver applies to built-in types:
//! JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge
//! patch, the latter with the pod's `patchMergeKey`/`patchStrategy` tags
//! (e.g. `status.conditions` merged by `type`) and the `$patch`,
//! `$setElementOrder`, `$retainKeys` and `$deleteFromPrimitiveList`
//! directives.

use serde_json::{Map, Value};

/// How a list field is patched by a strategic merge patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListStrategy {
    /// Elements are maps merged by this key.
    MergeByKey(&'static str),
    /// Elements are primitives; the patch adds to the set.
    MergePrimitives,
    /// No patch strategy: the patch's list replaces the list.
    Replace,
}

/// The list fields of a Pod with a merge strategy (from the Go struct tags
/// of `k8s.io/api/core/v1`). Container paths are normalized to
/// `spec.containers[]`.
fn list_strategy(path: &str) -> ListStrategy {
    use ListStrategy::{MergeByKey, MergePrimitives, Replace};
    let normalized = path
        .replace("spec.initContainers", "spec.containers")
        .replace("spec.ephemeralContainers", "spec.containers");
    match normalized.as_str() {
        "metadata.finalizers" => MergePrimitives,
        "metadata.ownerReferences" => MergeByKey("uid"),
        "spec.containers"
        | "spec.volumes"
        | "spec.imagePullSecrets"
        | "spec.resourceClaims"
        | "spec.schedulingGates"
        | "spec.containers[].env"
        | "spec.containers[].resizePolicy" => MergeByKey("name"),
        "spec.containers[].ports" => MergeByKey("containerPort"),
        "spec.containers[].volumeMounts" => MergeByKey("mountPath"),
        "spec.containers[].volumeDevices" => MergeByKey("devicePath"),
        "spec.hostAliases" | "status.podIPs" | "status.hostIPs" => MergeByKey("ip"),
        "spec.topologySpreadConstraints" => MergeByKey("topologyKey"),
        "status.conditions" => MergeByKey("type"),
        "status.resourceClaimStatuses" => MergeByKey("name"),
        _ => Replace,
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Applies an RFC 7386 JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(patch) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(map) = target {
                for (key, value) in patch {
                    if value.is_null() {
                        map.remove(key);
                    } else {
                        merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Applies a strategic merge patch to a Pod (as JSON).
pub(crate) fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(patch) = patch else {
        return Err("a strategic merge patch must be a JSON object".to_owned());
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    match merge_map(target, patch, "")? {
        MapOutcome::Keep => Ok(()),
        MapOutcome::Delete => Err("$patch: delete of the whole object is not allowed".to_owned()),
    }
}

enum MapOutcome {
    Keep,
    Delete,
}

/// Removes directive keys from a value that is inserted as new.
fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn merge_map(
    target: &mut Value,
    patch: &Map<String, Value>,
    path: &str,
) -> Result<MapOutcome, String> {
    match patch.get("$patch").map(|v| v.as_str()) {
        None | Some(Some("merge")) => {}
        Some(Some("delete")) => return Ok(MapOutcome::Delete),
        Some(Some("replace")) => {
            *target = strip_directives(&Value::Object(patch.clone()));
            return Ok(MapOutcome::Keep);
        }
        Some(other) => return Err(format!("unknown patch type: {other:?} at {path:?}")),
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(map) = target else {
        return Ok(MapOutcome::Keep);
    };

    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        let field = join(path, key);
        match value {
            Value::Null => {
                map.remove(key);
            }
            Value::Object(sub) => {
                let slot = map.entry(key.clone()).or_insert(Value::Null);
                if let MapOutcome::Delete = merge_map(slot, sub, &field)? {
                    map.remove(key);
                }
            }
            Value::Array(items) => {
                let slot = map.entry(key.clone()).or_insert(Value::Null);
                merge_list(slot, items, &field)?;
            }
            other => {
                map.insert(key.clone(), other.clone());
            }
        }
    }

    // `$deleteFromPrimitiveList/<field>`: remove values from a primitive list.
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let Value::Array(remove) = value else {
                return Err(format!("{key} must be a list"));
            };
            if let Some(Value::Array(list)) = map.get_mut(field) {
                list.retain(|v| !remove.contains(v));
            }
        }
    }
    // `$setElementOrder/<field>`: order a merged list like the patch author's.
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$setElementOrder/") {
            let Value::Array(order) = value else {
                return Err(format!("{key} must be a list"));
            };
            if let Some(Value::Array(list)) = map.get_mut(field) {
                apply_element_order(list, order, list_strategy(&join(path, field)));
            }
        }
    }
    // `$retainKeys`: drop every field not listed.
    if let Some(retain) = patch.get("$retainKeys") {
        let Value::Array(keep) = retain else {
            return Err("$retainKeys must be a list".to_owned());
        };
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        map.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(MapOutcome::Keep)
}

fn apply_element_order(list: &mut [Value], order: &[Value], strategy: ListStrategy) {
    let position = |item: &Value| -> usize {
        let found = match strategy {
            ListStrategy::MergeByKey(key) => order
                .iter()
                .position(|o| o.get(key).is_some() && o.get(key) == item.get(key)),
            _ => order.iter().position(|o| o == item),
        };
        found.unwrap_or(usize::MAX)
    };
    // Stable: elements missing from the order keep their relative order, last.
    list.sort_by_key(position);
}

/// A list element that only carries directives, like `{"$patch": "replace"}`.
fn is_directive_only(value: &Value) -> bool {
    matches!(value, Value::Object(m) if !m.is_empty() && m.keys().all(|k| k.starts_with('$')))
}

fn merge_list(target: &mut Value, patch: &[Value], path: &str) -> Result<(), String> {
    let strategy = list_strategy(path);
    let replace_directive = patch
        .iter()
        .any(|v| v.get("$patch").and_then(Value::as_str) == Some("replace"));
    if strategy == ListStrategy::Replace || replace_directive || !target.is_array() {
        let items = patch
            .iter()
            .filter(|v| !is_directive_only(v))
            .filter(|v| v.get("$patch").and_then(Value::as_str) != Some("delete"))
            .map(strip_directives)
            .collect();
        *target = Value::Array(items);
        return Ok(());
    }
    let Value::Array(list) = target else {
        return Ok(());
    };
    match strategy {
        ListStrategy::MergePrimitives => {
            for item in patch {
                if !list.contains(item) {
                    list.push(item.clone());
                }
            }
        }
        ListStrategy::MergeByKey(key) => {
            for item in patch {
                let Value::Object(item_map) = item else {
                    return Err(format!("{path}: list elements must be objects"));
                };
                let Some(key_value) = item_map.get(key) else {
                    return Err(format!("{path}: element has no merge key {key:?}"));
                };
                let existing = list.iter().position(|v| v.get(key) == Some(key_value));
                let delete = item_map.get("$patch").and_then(Value::as_str) == Some("delete");
                match (existing, delete) {
                    (Some(i), true) => {
                        list.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => {
                        if let MapOutcome::Delete =
                            merge_map(&mut list[i], item_map, &format!("{path}[]"))?
                        {
                            list.remove(i);
                        }
                    }
                    (None, false) => list.push(strip_directives(item)),
                }
            }
        }
        ListStrategy::Replace => {}
    }
    Ok(())
}

/// Applies an RFC 6902 JSON patch.
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Array(ops) = patch else {
        return Err("a JSON patch must be a list of operations".to_owned());
    };
    for op in ops {
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or("operation has no \"op\"")?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or("operation has no \"path\"")?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| format!("{name} needs a \"value\""))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{name} needs a \"from\""))
        };
        match name {
            "add" => pointer_add(target, path, value()?)?,
            "remove" => {
                pointer_remove(target, path)?;
            }
            "replace" => {
                pointer_remove(target, path)?;
                pointer_add(target, path, value()?)?;
            }
            "move" => {
                let moved = pointer_remove(target, from()?)?;
                pointer_add(target, path, moved)?;
            }
            "copy" => {
                let copied = target
                    .pointer(from()?)
                    .cloned()
                    .ok_or_else(|| format!("copy: no value at {:?}", from().unwrap_or_default()))?;
                pointer_add(target, path, copied)?;
            }
            "test" => {
                if target.pointer(path) != Some(&value()?) {
                    return Err(format!("testing value {path} failed"));
                }
            }
            other => return Err(format!("unknown JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

fn split_pointer(path: &str) -> Result<(String, String), String> {
    if !path.starts_with('/') {
        return Err(format!("invalid JSON pointer {path:?}"));
    }
    let (parent, last) = path.rsplit_once('/').unwrap_or(("", path));
    let last = last.replace("~1", "/").replace("~0", "~");
    Ok((parent.to_owned(), last))
}

fn pointer_add(target: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *target = value;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    match target.pointer_mut(&parent) {
        Some(Value::Object(map)) => {
            map.insert(last, value);
            Ok(())
        }
        Some(Value::Array(list)) => {
            let index = if last == "-" {
                list.len()
            } else {
                last.parse::<usize>()
                    .ok()
                    .filter(|i| *i <= list.len())
                    .ok_or_else(|| format!("invalid array index in {path:?}"))?
            };
            list.insert(index, value);
            Ok(())
        }
        _ => Err(format!(
            "add operation does not apply: doc is missing path: {path:?}"
        )),
    }
}

fn pointer_remove(target: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    let missing = || format!("doc is missing path: {path:?}");
    match target.pointer_mut(&parent) {
        Some(Value::Object(map)) => map.remove(&last).ok_or_else(missing),
        Some(Value::Array(list)) => {
            let index = last
                .parse::<usize>()
                .ok()
                .filter(|i| *i < list.len())
                .ok_or_else(missing)?;
            Ok(list.remove(index))
        }
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_with_conditions() -> Value {
        json!({
            "metadata": {"name": "web-1", "labels": {"app": "web", "tier": "front"}, "finalizers": ["a"]},
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z"},
                    {"type": "Ready", "status": "False", "lastTransitionTime": "2024-01-01T00:00:00Z"},
                    {"type": "ContainersReady", "status": "False"}
                ],
                "containerStatuses": [{"name": "a", "ready": false}, {"name": "b", "ready": false}]
            }
        })
    }

    #[test]
    fn strategic_merge_merges_conditions_by_type() {
        let mut pod = pod_with_conditions();
        let patch = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "example.com/gate", "status": "True"}
        ]}});
        strategic_merge_patch(&mut pod, &patch).unwrap();
        let conditions = pod["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 4);
        assert_eq!(conditions[0]["type"], "PodScheduled");
        assert_eq!(
            conditions[1],
            json!({"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z"})
        );
        assert_eq!(conditions[3]["type"], "example.com/gate");
        assert_eq!(pod["status"]["phase"], "Running");
    }

    #[test]
    fn merge_patch_replaces_conditions() {
        let mut pod = pod_with_conditions();
        merge_patch(
            &mut pod,
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}, "metadata": {"labels": {"tier": null}}}),
        );
        assert_eq!(
            pod["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}])
        );
        assert_eq!(pod["metadata"]["labels"], json!({"app": "web"}));
    }

    #[test]
    fn strategic_merge_directives() {
        let mut pod = pod_with_conditions();
        let patch = json!({"status": {
            "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}, {"type": "ContainersReady"}],
            "conditions": [{"type": "ContainersReady", "$patch": "delete"}]
        }});
        strategic_merge_patch(&mut pod, &patch).unwrap();
        let types: Vec<&str> = pod["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Ready", "PodScheduled"]);

        // Lists without a strategy are replaced; primitive merge lists are unions.
        strategic_merge_patch(
            &mut pod,
            &json!({
                "metadata": {"finalizers": ["b"], "labels": {"$patch": "replace", "only": "this"}},
                "status": {"containerStatuses": [{"name": "b", "ready": true}]}
            }),
        )
        .unwrap();
        assert_eq!(pod["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(pod["metadata"]["labels"], json!({"only": "this"}));
        assert_eq!(
            pod["status"]["containerStatuses"],
            json!([{"name": "b", "ready": true}])
        );

        strategic_merge_patch(
            &mut pod,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(pod["metadata"]["finalizers"], json!(["b"]));

        strategic_merge_patch(&mut pod, &json!({"status": {"conditions": [{"$patch": "replace"}, {"type": "X", "status": "True"}]}})).unwrap();
        assert_eq!(
            pod["status"]["conditions"],
            json!([{"type": "X", "status": "True"}])
        );

        assert!(
            strategic_merge_patch(
                &mut pod,
                &json!({"status": {"conditions": [{"status": "True"}]}})
            )
            .is_err()
        );
        assert!(strategic_merge_patch(&mut pod, &json!([1])).is_err());
        assert!(strategic_merge_patch(&mut pod, &json!({"$patch": "delete"})).is_err());
    }

    #[test]
    fn json_patch_operations() {
        let mut doc = json!({"metadata": {"labels": {"a/b": "1"}}, "list": [1, 2]});
        json_patch(
            &mut doc,
            &json!([
                {"op": "test", "path": "/metadata/labels/a~1b", "value": "1"},
                {"op": "add", "path": "/metadata/labels/c", "value": "2"},
                {"op": "remove", "path": "/metadata/labels/a~1b"},
                {"op": "add", "path": "/list/-", "value": 3},
                {"op": "replace", "path": "/list/0", "value": 0},
                {"op": "copy", "from": "/list/0", "path": "/zero"},
                {"op": "move", "from": "/zero", "path": "/moved"}
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"labels": {"c": "2"}}, "list": [0, 2, 3], "moved": 0})
        );
        assert!(
            json_patch(
                &mut doc,
                &json!([{"op": "test", "path": "/moved", "value": 1}])
            )
            .is_err()
        );
        assert!(json_patch(&mut doc, &json!([{"op": "remove", "path": "/nope"}])).is_err());
        assert!(json_patch(&mut doc, &json!({"op": "add"})).is_err());
    }
}
