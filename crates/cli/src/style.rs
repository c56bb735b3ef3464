//! Colour, decided by `anstream` as most command-line tools decide it: on for a
//! terminal, off when the output is not one, with `NO_COLOR` set to a non-empty value
//! (https://no-color.org: an empty one is ignored), with `CLICOLOR=0` or `TERM=dumb`;
//! `CLICOLOR_FORCE` turns it on. Off with `--json`, or with `--color never`; `--color
//! always` forces it (a pager that shows colour). What is printed goes through
//! `anstream`'s streams, which turn the escapes into console calls on a Windows console
//! without ANSI support.

use anstream::stream::RawStream;
use anstyle::{AnsiColor, Effects};

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// Colour when the output is a terminal (and `NO_COLOR`, `CLICOLOR` and `TERM`
    /// allow it).
    Auto,
    /// Always colour (overrides `NO_COLOR`).
    Always,
    /// Never colour.
    Never,
}

impl ColorChoice {
    /// Makes this the choice of every `anstream` stream of the process.
    pub fn apply(self) {
        match self {
            Self::Auto => anstream::ColorChoice::Auto,
            Self::Always => anstream::ColorChoice::Always,
            Self::Never => anstream::ColorChoice::Never,
        }
        .write_global();
    }
}

/// Whether to paint, decided once per stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    on: bool,
}

impl Style {
    /// No colour (tests, JSON).
    pub const PLAIN: Self = Self { on: false };

    /// Colour (tests).
    #[cfg(test)]
    pub const PAINTED: Self = Self { on: true };

    /// For `stream`, under the process's choice (see [`ColorChoice::apply`]).
    fn of(stream: &impl RawStream) -> Self {
        Self {
            on: anstream::AutoStream::choice(stream) != anstream::ColorChoice::Never,
        }
    }

    /// For stdout; never with `--json` (machines read it).
    pub fn stdout(json: bool) -> Self {
        if json {
            return Self::PLAIN;
        }
        Self::of(&std::io::stdout())
    }

    /// For stderr (errors and progress).
    pub fn stderr() -> Self {
        Self::of(&std::io::stderr())
    }

    fn paint(self, style: anstyle::Style, text: &str) -> String {
        if self.on && !text.is_empty() {
            format!("{style}{text}{style:#}")
        } else {
            text.to_owned()
        }
    }

    fn colour(self, colour: AnsiColor, text: &str) -> String {
        self.paint(anstyle::Style::new().fg_color(Some(colour.into())), text)
    }

    /// Headers and totals.
    pub fn bold(self, text: &str) -> String {
        self.paint(anstyle::Style::new().effects(Effects::BOLD), text)
    }

    /// Errors and what is taken away (deregister).
    pub fn red(self, text: &str) -> String {
        self.colour(AnsiColor::Red, text)
    }

    /// What is added (register).
    pub fn green(self, text: &str) -> String {
        self.colour(AnsiColor::Green, text)
    }

    /// What waits or is adopted (backoff, pending, adopt).
    pub fn yellow(self, text: &str) -> String {
        self.colour(AnsiColor::Yellow, text)
    }

    /// What is left as it is (foreign targets kept, forgotten entries).
    pub fn dim(self, text: &str) -> String {
        self.paint(anstyle::Style::new().effects(Effects::DIMMED), text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paints_only_when_on() {
        assert_eq!(Style::PLAIN.red("x"), "x");
        assert_eq!(Style::PAINTED.red("x"), "\x1b[31mx\x1b[0m");
        assert_eq!(Style::PAINTED.bold("x"), "\x1b[1mx\x1b[0m");
        assert_eq!(Style::PAINTED.bold(""), "", "nothing to paint");
    }

    /// docs/cli.md says what `anstream` decides (the CLI's test `colour_only_on_a_terminal`
    /// runs it on a terminal with each).
    #[test]
    fn the_page_says_what_turns_colour_off() {
        let page = include_str!("../../../docs/cli.md");
        for rule in [
            "`NO_COLOR` set to a non-empty value",
            "`CLICOLOR=0` or `TERM=dumb`",
            "`CLICOLOR_FORCE=1`",
        ] {
            assert!(page.contains(rule), "docs/cli.md must say {rule}");
        }
    }
}
