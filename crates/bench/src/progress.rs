//! Progress for people: the displays that observe runs
//! ([`Observer`](crate::Observer)).
//!
//! * [`HumanProgress`] shows bench runs: an indicatif bar per engine and,
//!   with `verbose`, one line per round in the style of the original notes:
//!
//!   ```text
//!   segfit round 12: 100000 allocs in 0.052 s, 50123 frees in 0.011 s, utilisation 0.5123
//!   ```
//! * [`ReplayProgress`] shows trace replays: a bar per engine over the
//!   trace's requests and, with `verbose`, a line per round.
//!
//! Every progress bar of the tool is a [`Bar`]: one look, drawn on stderr,
//! hidden when stderr is not a terminal.

use std::io::Write;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::observer::{Observer, Position, RoundProgress};
use crate::replay::{ReplayError, ReplayReport};
use crate::report::{RunError, RunReport};

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

/// What a [`Bar`] measures, which sets its length and its labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meter {
    /// Utilisation of a device, from 0 to 1 ([`Bar::set_utilization`]).
    Utilization,
    /// Requests done out of a total, when known.
    Requests(Option<u64>),
    /// Bytes done out of a total, with the rate and the time left.
    Bytes(u64),
}

/// A progress bar on stderr, hidden when stderr is not a terminal. Lines
/// printed through [`Bar::println`] do not tear it.
#[derive(Debug)]
pub struct Bar(ProgressBar);

/// Utilisation is shown in steps of 0.1 %.
const UTILIZATION_STEPS: u64 = 1000;

impl Bar {
    /// A bar labelled `prefix` that starts ticking at once.
    pub fn new(prefix: &str, meter: Meter) -> Self {
        let (len, template) = match meter {
            Meter::Utilization => (
                Some(UTILIZATION_STEPS),
                "{prefix:>22} [{elapsed_precise}] {bar:30.cyan/blue} {percent:>3}% used  {msg}",
            ),
            Meter::Requests(total) => (
                total,
                "{prefix:>22} [{elapsed_precise}] {bar:30.cyan/blue} {percent:>3}% of ops  {msg}",
            ),
            Meter::Bytes(total) => (
                Some(total),
                "{prefix} [{elapsed_precise}] {bar:30.cyan/blue} {bytes}/{total_bytes} \
                 ({bytes_per_sec}, {eta} left)",
            ),
        };
        let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(template)
                .expect("constant template is valid")
                .progress_chars("=> "),
        );
        bar.set_prefix(prefix.to_string());
        bar.enable_steady_tick(Duration::from_millis(250));
        Bar(bar)
    }

    /// Moves a [`Meter::Utilization`] bar to `utilization` (0 to 1).
    pub fn set_utilization(&self, utilization: f64) {
        self.0
            .set_position((utilization * UTILIZATION_STEPS as f64).round() as u64);
    }

    /// Moves a [`Meter::Requests`] or [`Meter::Bytes`] bar to `done`.
    pub fn set_position(&self, done: u64) {
        self.0.set_position(done);
    }

    /// The text after the bar.
    pub fn set_message(&self, msg: impl Into<String>) {
        self.0.set_message(msg.into());
    }

    /// Prints a line to `stream` without tearing the bar.
    pub fn println(&self, stream: Stream, line: &str) {
        if self.0.is_hidden() {
            stream.line(line);
        } else {
            self.0.suspend(|| stream.line(line));
        }
    }

    /// Stops the bar where it is, with a last message (a full bar would
    /// claim a utilisation that was not reached).
    pub fn abandon(self, msg: impl Into<String>) {
        self.0.abandon_with_message(msg.into());
    }

    /// Removes the bar.
    pub fn clear(self) {
        self.0.finish_and_clear();
    }

    /// Ends an engine's bar as its run ended: when it ran, the bar stays,
    /// saying what the run got through (`done`), why it stopped and at what
    /// utilisation; a skipped engine's bar goes; a failed one says so.
    pub(crate) fn end_run<E>(
        self,
        outcome: Result<(String, &RunReport), &E>,
        is_skip: impl Fn(&E) -> bool,
    ) {
        match outcome {
            Ok((done, r)) => {
                let at = r
                    .utilization_at_first_failure
                    .map_or_else(String::new, |u| format!(" at utilisation {u:.4}"));
                self.abandon(format!("{done}, stopped: {}{at}", r.stopped));
            }
            Err(e) if is_skip(e) => self.clear(),
            Err(_) => self.abandon("failed"),
        }
    }
}

/// Prints a line to `stream`, through `bar` when there is one.
pub fn print_line(bar: Option<&Bar>, stream: Stream, line: &str) {
    match bar {
        Some(bar) => bar.println(stream, line),
        None => stream.line(line),
    }
}

/// An [`Observer`] that shows a progress bar and, optionally, per-round lines.
#[derive(Debug)]
pub struct HumanProgress {
    show_bar: bool,
    verbose: bool,
    stream: Stream,
    bar: Option<Bar>,
}

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

    fn set(&self, round: u64, utilization: f64) {
        if let Some(bar) = &self.bar {
            bar.set_utilization(utilization);
            bar.set_message(format!("round {round}, utilisation {utilization:.4}"));
        }
    }
}

impl Observer for HumanProgress {
    fn engine_started(&mut self, engine: &str, _total_requests: Option<u64>) {
        if !self.show_bar {
            return;
        }
        let bar = Bar::new(engine, Meter::Utilization);
        bar.set_message("building");
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
            print_line(
                self.bar.as_ref(),
                self.stream,
                &format!(
                "{} round {}{phase}: {} allocs in {:.3} s, {} frees in {:.3} s, utilisation {:.4}",
                p.engine,
                p.record.round,
                p.allocs,
                p.alloc_secs,
                p.frees,
                p.free_secs,
                p.record.utilization
                ),
            );
        }
    }

    fn engine_finished(&mut self, _engine: &str, outcome: Result<&RunReport, &RunError>) {
        if let Some(bar) = self.bar.take() {
            let outcome = outcome.map(|r| (format!("{} rounds", r.rounds), r));
            bar.end_run(outcome, RunError::is_skip);
        }
    }
}

/// An [`Observer`] of replays for people.
#[derive(Debug)]
pub struct ReplayProgress {
    show_bar: bool,
    verbose: bool,
    stream: Stream,
    bar: Option<Bar>,
}

impl ReplayProgress {
    /// `show_bar`: draw a bar (still hidden when stderr is no terminal);
    /// `verbose`: a line per round to `stream`.
    pub fn new(show_bar: bool, verbose: bool, stream: Stream) -> Self {
        ReplayProgress {
            show_bar,
            verbose,
            stream,
            bar: None,
        }
    }

    fn set(&self, done: u64, utilization: f64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            bar.set_message(format!("utilisation {utilization:.4}"));
        }
    }
}

impl Observer<ReplayReport, ReplayError> for ReplayProgress {
    fn engine_started(&mut self, engine: &str, total_requests: Option<u64>) {
        if !self.show_bar {
            return;
        }
        self.bar = Some(Bar::new(engine, Meter::Requests(total_requests)));
    }

    fn tick(&mut self, _engine: &str, at: Position, utilization: f64) {
        self.set(at.requests, utilization);
    }

    fn round_finished(&mut self, p: &RoundProgress<'_>) {
        let (engine, r, requests_done) = (p.engine, p.record, p.requests);
        self.set(requests_done, r.utilization);
        if self.verbose {
            print_line(
                self.bar.as_ref(),
                self.stream,
                &format!(
                    "{engine} round {}: {:.3} s in the engine, utilisation {:.4}, {requests_done} requests so far",
                    r.round, r.secs, r.utilization
                ),
            );
        }
    }

    fn engine_finished(&mut self, _engine: &str, outcome: Result<&ReplayReport, &ReplayError>) {
        if let Some(bar) = self.bar.take() {
            let outcome = outcome.map(|r| (format!("{} requests", r.requests_replayed), &r.run));
            bar.end_run(outcome, ReplayError::is_skip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_meter_makes_a_bar_of_its_own_length() {
        let u = Bar::new("segfit", Meter::Utilization);
        u.set_utilization(0.5123);
        assert_eq!((u.0.position(), u.0.length()), (512, Some(1000)));
        let r = Bar::new("segfit", Meter::Requests(None));
        r.set_position(7);
        assert_eq!((r.0.position(), r.0.length()), (7, None));
        let b = Bar::new("zeroing d.img", Meter::Bytes(1 << 20));
        assert_eq!(b.0.length(), Some(1 << 20));
        for bar in [u, r, b] {
            bar.clear();
        }
    }
}
