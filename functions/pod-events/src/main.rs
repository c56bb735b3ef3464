//! `tgsync-pod-events`: reconciles the target groups one pod touches, within seconds of
//! its lifecycle event. Thin on purpose: everything lives in the library.

// The engine's nested futures are deeper than rustc's default layout query limit.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread: a Lambda container gets a fraction of a vCPU (0.15 at 256 MB), where a
// multi-threaded scheduler only adds wake-ups and contention; the I/O stays concurrent.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    tgsync::app::serve("pod-events", |app, payload, deadline| async move {
        let wait = app.settings.ready_wait;
        tgsync::handlers::pod_events::handle(&app.engine, &payload, wait, Some(deadline)).await
    })
    .await
}
