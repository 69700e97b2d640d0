//! [`ReplayProgress`]: a progress bar per engine over the trace's requests
//! and, with `verbose`, a line per round.
//!
//! The bar is the harness's [`Bar`].

use crate::progress::{print_line, Bar, Meter, Stream};
use crate::replay::{ReplayError, ReplayReport};
use crate::runner::{Observer, Position, RoundProgress};

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
