//! Realistic pod JSON (as `kubectl get pod -o json` prints it) shared by the core's tests.

use k8s_openapi::api::core::v1::Pod;

use super::binding::{Binding, Mode, PortSpec};
use super::selector::Selector;
use super::target::AddressFamily;

/// Every fixture name, so tests can sweep them all.
pub const ALL: [&str; 12] = [
    "running",
    "pending",
    "terminating",
    "not-ready",
    "gated",
    "gated-starting",
    "excluded",
    "dual-stack",
    "host-network",
    "missing-ip",
    "succeeded",
    "native-sidecar",
];

macro_rules! pod_json {
    ($name:literal) => {
        include_str!(concat!("../../tests/fixtures/pods/", $name, ".json"))
    };
}

pub fn fixture(name: &str) -> Pod {
    let json = match name {
        "running" => pod_json!("running"),
        "pending" => pod_json!("pending"),
        "terminating" => pod_json!("terminating"),
        "not-ready" => pod_json!("not-ready"),
        "gated" => pod_json!("gated"),
        "gated-starting" => pod_json!("gated-starting"),
        "excluded" => pod_json!("excluded"),
        "dual-stack" => pod_json!("dual-stack"),
        "host-network" => pod_json!("host-network"),
        "missing-ip" => pod_json!("missing-ip"),
        "succeeded" => pod_json!("succeeded"),
        "native-sidecar" => pod_json!("native-sidecar"),
        "graceful" => pod_json!("graceful"),
        other => panic!("no fixture {other}"),
    };
    serde_json::from_str(json).expect("fixture is a valid Pod")
}

pub fn binding(namespace: &str, selector: &str, port: PortSpec) -> Binding {
    Binding {
        clusters: vec!["demo".into()],
        namespace: namespace.into(),
        selector: Selector::parse(selector).expect("valid selector"),
        port,
        mode: Mode::Shared,
        family: AddressFamily::Ipv4,
        quic: false,
    }
}

pub fn shop_web(port: u16) -> Binding {
    binding("shop", "app=web", PortSpec::Number(port))
}
