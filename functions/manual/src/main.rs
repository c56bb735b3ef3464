//! `tgsync-manual`: the operator's runs (a dry run, a resync of some or all groups, a
//! release through its `release` alias), one pass each, on slots of their own so they
//! never wait for the watching resync. Thin on purpose: everything lives in the library.

// The engine's nested futures are deeper than rustc's default layout query limit.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread: a Lambda container gets a fraction of a vCPU (0.15 at 256 MB), where a
// multi-threaded scheduler only adds wake-ups and contention; the I/O stays concurrent.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    tgsync::app::serve_invocations("manual", |app, payload, invocation| async move {
        tgsync::handlers::manual::handle(&app.engine, &payload, &invocation).await
    })
    .await
}
