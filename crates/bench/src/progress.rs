//! Progress for people: an indicatif bar per engine and, with `verbose`, one
//! line per round in the style of the original notes:
//!
//! ```text
//! segfit round 12: 100000 allocs in 0.052 s, 50123 frees in 0.011 s, utilisation 0.5123
//! ```
//!
//! The bar draws on stderr and hides itself when stderr is not a terminal.

use std::io::Write;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::report::RunReport;
use crate::runner::{Observer, Position, RoundProgress, RunError};

/// Where per-round lines go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    /// Writes one line, ignoring I/O errors (a closed pipe must not stop a
    /// bench; the JSON output reports its own errors).
    pub fn line(self, s: &str) {
        let _ = match self {
            Stream::Stdout => writeln!(std::io::stdout(), "{s}"),
            Stream::Stderr => writeln!(std::io::stderr(), "{s}"),
        };
    }
}

/// An [`Observer`] that shows a progress bar and, optionally, per-round lines.
#[derive(Debug)]
pub struct HumanProgress {
    show_bar: bool,
    verbose: bool,
    stream: Stream,
    bar: Option<ProgressBar>,
}

const TEMPLATE: &str =
    "{prefix:>22} [{elapsed_precise}] {bar:30.cyan/blue} {percent:>3}% used  {msg}";

impl HumanProgress {
    /// `show_bar`: draw a bar (still hidden when stderr is no terminal);
    /// `verbose`: print a line per round to `stream`.
    pub fn new(show_bar: bool, verbose: bool, stream: Stream) -> Self {
        HumanProgress {
            show_bar,
            verbose,
            stream,
            bar: None,
        }
    }

    /// Prints a line without tearing the bar.
    fn println(&self, s: &str) {
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.suspend(|| self.stream.line(s)),
            _ => self.stream.line(s),
        }
    }

    fn set(&self, round: u64, utilization: f64) {
        if let Some(bar) = &self.bar {
            bar.set_position((utilization * 1000.0).round() as u64);
            bar.set_message(format!("round {round}, utilisation {utilization:.4}"));
        }
    }
}

impl Observer for HumanProgress {
    fn engine_started(&mut self, engine: &str, _total_requests: Option<u64>) {
        if !self.show_bar {
            return;
        }
        let bar = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(TEMPLATE)
                .expect("constant template is valid")
                .progress_chars("=> "),
        );
        bar.set_prefix(engine.to_string());
        bar.set_message("building");
        bar.enable_steady_tick(Duration::from_millis(250));
        self.bar = Some(bar);
    }

    fn tick(&mut self, _engine: &str, at: Position, utilization: f64) {
        self.set(at.round, utilization);
    }

    fn round_finished(&mut self, p: &RoundProgress<'_>) {
        self.set(p.record.round, p.record.utilization);
        if self.verbose {
            let phase = p
                .record
                .phase
                .map_or_else(String::new, |ph| format!(" (phase {ph})"));
            self.println(&format!(
                "{} round {}{phase}: {} allocs in {:.3} s, {} frees in {:.3} s, utilisation {:.4}",
                p.engine,
                p.record.round,
                p.allocs,
                p.alloc_secs,
                p.frees,
                p.free_secs,
                p.record.utilization
            ));
        }
    }

    fn engine_finished(&mut self, _engine: &str, outcome: Result<&RunReport, &RunError>) {
        if let Some(bar) = self.bar.take() {
            match outcome {
                Ok(r) => {
                    let at = r
                        .utilization_at_first_failure
                        .map_or_else(String::new, |u| format!(" at utilisation {u:.4}"));
                    // `abandon` keeps the position (utilisation); `finish`
                    // would fill the bar.
                    bar.abandon_with_message(format!(
                        "{} rounds, stopped: {}{at}",
                        r.rounds, r.stopped
                    ));
                }
                Err(e) if e.is_skip() => bar.finish_and_clear(),
                Err(_) => bar.abandon_with_message("failed"),
            }
        }
    }
}
