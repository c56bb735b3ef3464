//! Progress on stderr while a long call runs (`indicatif`'s spinner), and the release's
//! question.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// A progress line for one operation. On a terminal it ticks with the elapsed time;
/// otherwise it says once what started and once how long it took.
pub struct Progress {
    what: String,
    started: Instant,
    spinner: Option<ProgressBar>,
}

impl Progress {
    /// Starts showing `what` (e.g. `tgsync-manual: planning`).
    pub fn start(what: impl Into<String>) -> Self {
        let what = what.into();
        let spinner = if std::io::stderr().is_terminal() {
            let style = ProgressStyle::with_template("{spinner} {msg} {seconds}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner())
                .with_key(
                    "seconds",
                    |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = write!(w, "{:.1} s", state.elapsed().as_secs_f64());
                    },
                );
            let spinner = ProgressBar::new_spinner()
                .with_style(style)
                .with_message(what.clone());
            spinner.enable_steady_tick(Duration::from_millis(100));
            Some(spinner)
        } else {
            eprintln!("tgsync: {what} ...");
            None
        };
        Self {
            what,
            started: Instant::now(),
            spinner,
        }
    }

    /// A line about the operation (e.g. a retry), without ending it.
    pub fn note(&self, message: &str) {
        match &self.spinner {
            Some(s) => s.suspend(|| eprintln!("tgsync: {message}")),
            None => eprintln!("tgsync: {message}"),
        }
    }

    /// Ends the operation: how long it took.
    pub fn done(mut self) {
        let took = self.started.elapsed().as_secs_f64();
        if let Some(s) = self.spinner.take() {
            s.finish_and_clear();
        }
        eprintln!("tgsync: {}: {took:.1} s", self.what);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(s) = self.spinner.take() {
            s.finish_and_clear();
        }
    }
}

/// Whether there is a person to ask: stdin and stderr are terminals.
pub fn interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// Asks `question` on the terminal; true only for `yes`. Without a terminal there is
/// nobody to ask, and the answer is no.
pub fn confirm(question: &str) -> std::io::Result<bool> {
    if !interactive() {
        return Ok(false);
    }
    eprint!("{question} Type yes to go on: ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer.trim() == "yes")
}
