//! Processes a test or bench starts (a function binary, `cargo lambda`, an emulator):
//! killed and reaped when it ends, pass or fail.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Child;

/// Kills and reaps a started process when dropped.
pub struct Reaper(pub Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The repository's root (where `template.yaml` is), from any crate of the workspace.
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|d| d.join("template.yaml").is_file())
        .unwrap_or(manifest)
        .to_path_buf()
}
