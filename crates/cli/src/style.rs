//! Colour: on for a terminal, off when the output is not one, with `NO_COLOR` set to a
//! non-empty value (https://no-color.org: an empty one is ignored), with `--json`, or
//! with `--color never`; `--color always` forces it (a pager that shows colour).

use std::io::IsTerminal;

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// Colour when the output is a terminal and `NO_COLOR` is unset or empty.
    Auto,
    /// Always colour (overrides `NO_COLOR`).
    Always,
    /// Never colour.
    Never,
}

/// Whether to paint, decided once per stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    on: bool,
}

impl Style {
    /// No colour (tests, JSON).
    pub const PLAIN: Self = Self { on: false };

    /// For a stream that `is_terminal` or not.
    pub fn new(choice: ColorChoice, is_terminal: bool) -> Self {
        Self::with_no_color(choice, is_terminal, std::env::var_os("NO_COLOR").as_deref())
    }

    /// For a stream that `is_terminal` or not, with `NO_COLOR` as given.
    fn with_no_color(
        choice: ColorChoice,
        is_terminal: bool,
        no_color: Option<&std::ffi::OsStr>,
    ) -> Self {
        let no_color = no_color.is_some_and(|v| !v.is_empty());
        Self {
            on: match choice {
                ColorChoice::Always => true,
                ColorChoice::Never => false,
                ColorChoice::Auto => is_terminal && !no_color,
            },
        }
    }

    /// For stdout; never with `--json` (machines read it).
    pub fn stdout(choice: ColorChoice, json: bool) -> Self {
        if json {
            return Self::PLAIN;
        }
        Self::new(choice, std::io::stdout().is_terminal())
    }

    /// For stderr (errors and progress).
    pub fn stderr(choice: ColorChoice) -> Self {
        Self::new(choice, std::io::stderr().is_terminal())
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.on && !text.is_empty() {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    /// Headers and totals.
    pub fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }

    /// Errors and what is taken away (deregister).
    pub fn red(self, text: &str) -> String {
        self.paint("31", text)
    }

    /// What is added (register).
    pub fn green(self, text: &str) -> String {
        self.paint("32", text)
    }

    /// What waits or is adopted (backoff, pending, adopt).
    pub fn yellow(self, text: &str) -> String {
        self.paint("33", text)
    }

    /// What is left as it is (foreign targets kept, forgotten entries).
    pub fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty `NO_COLOR` is ignored (https://no-color.org), as docs/cli.md says.
    #[test]
    fn only_a_non_empty_no_color_turns_colour_off() {
        use std::ffi::OsStr;
        let auto =
            |v: Option<&str>| Style::with_no_color(ColorChoice::Auto, true, v.map(OsStr::new));
        assert_eq!(auto(None), Style { on: true });
        assert_eq!(auto(Some("")), Style { on: true });
        assert_eq!(auto(Some("1")), Style::PLAIN);
        assert_eq!(
            Style::with_no_color(ColorChoice::Always, true, Some(OsStr::new("1"))),
            Style { on: true }
        );
        let page = include_str!("../../../docs/cli.md");
        assert!(
            page.contains("`NO_COLOR` set to a non-empty value"),
            "docs/cli.md must say that only a non-empty NO_COLOR turns colour off"
        );
    }

    #[test]
    fn paints_only_when_on() {
        assert_eq!(Style::PLAIN.red("x"), "x");
        let on = Style::new(ColorChoice::Always, false);
        assert_eq!(on.red("x"), "\x1b[31mx\x1b[0m");
        assert_eq!(on.bold(""), "", "nothing to paint");
        assert_eq!(Style::new(ColorChoice::Never, true), Style::PLAIN);
        assert_eq!(Style::new(ColorChoice::Auto, false), Style::PLAIN);
    }
}
