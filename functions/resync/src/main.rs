//! `tgsync-resync`: the scheduled full diff of every bound target group, then the watch
//! (manual runs go to `tgsync-manual`).
//! Thin on purpose: configuration, the engine and the handler live in the library.

// The engine's nested futures are deeper than rustc's default layout query limit.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread: a Lambda container gets a fraction of a vCPU (0.15 at 256 MB), where a
// multi-threaded scheduler only adds wake-ups and contention; the I/O stays concurrent.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    tgsync::app::serve("resync", |app, payload, deadline| async move {
        let watch = app.settings.watch;
        tgsync::handlers::resync::handle_schedule(&app.engine, &payload, Some(deadline), watch)
            .await
    })
    .await
}
