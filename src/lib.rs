//! tgsync keeps AWS Network Load Balancer IP target groups equal to the ready pods of an
//! EKS cluster, from outside the cluster.
//!
//! The crate is split the way kube-rs splits `kube-core` from its client: [`core`] holds
//! pure functions (binding tags, desired targets, the diff, backoff) with no AWS or
//! Kubernetes client in scope, so every decision tgsync makes can be tested from plain
//! data. The adapters that do I/O live beside it and only feed the core and apply its plan.
//!
//! Test scaffolding (in-memory fakes, pod builders, fault injection) is compiled only
//! for this crate's tests and with the `testing` feature, never into the functions.
//!
//! No `unwrap` or `expect` outside tests: an input tgsync did not foresee is an error
//! with context, never a panic (the test scaffolding is exempt).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod allocator;
pub mod app;
pub mod aws;
pub mod clock;
pub mod config;
pub mod controller;
pub mod core;
pub mod eks;
#[cfg(any(test, feature = "testing"))]
pub mod fakes;
pub mod faults;
pub mod groups;
pub mod handlers;
pub mod index;
pub mod input;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod pods;
pub mod reconcile;
pub mod report;
pub mod settings;
pub mod state;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testkit;

pub use controller::Engine;
