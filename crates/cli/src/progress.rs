//! Progress on stderr while a long call runs, and the release's question.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

/// A progress line for one operation. On a terminal it ticks with the elapsed time;
/// otherwise it says once what started and once how long it took.
pub struct Progress {
    what: String,
    started: Instant,
    ticker: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts showing `what` (e.g. `tgsync-manual: planning`).
    pub fn start(what: impl Into<String>) -> Self {
        let what = what.into();
        let started = Instant::now();
        let ticker = if std::io::stderr().is_terminal() {
            let line = what.clone();
            Some(tokio::spawn(async move {
                const FRAMES: [char; 4] = ['|', '/', '-', '\\'];
                let mut i = 0;
                loop {
                    eprint!(
                        "\r{} {line} {:.1} s ",
                        FRAMES[i % FRAMES.len()],
                        started.elapsed().as_secs_f64()
                    );
                    let _ = std::io::stderr().flush();
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }))
        } else {
            eprintln!("tgsync: {what} ...");
            None
        };
        Self {
            what,
            started,
            ticker,
        }
    }

    /// A line about the operation (e.g. a retry), without ending it.
    pub fn note(&self, message: &str) {
        if self.ticker.is_some() {
            eprint!("\r\x1b[2K");
        }
        eprintln!("tgsync: {message}");
    }

    /// Ends the operation: how long it took.
    pub fn done(mut self) {
        let took = self.started.elapsed().as_secs_f64();
        if let Some(t) = self.ticker.take() {
            t.abort();
            eprint!("\r\x1b[2K");
        }
        eprintln!("tgsync: {}: {took:.1} s", self.what);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(t) = self.ticker.take() {
            t.abort();
            eprint!("\r\x1b[2K");
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
