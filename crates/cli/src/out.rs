//! Standard output for every command's text and JSON.
//!
//! `println!` panics when stdout is a pipe whose reader went away
//! (`blockalloc trace info t.trace | head`); [`outln!`] returns the
//! `io::Error` instead, the command stops there, and `main` ends quietly
//! with status 0 on a closed pipe.

/// `println!` that returns `std::io::Result<()>` instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

pub(crate) use outln;

/// True when `err` comes from writing to a pipe (or socket) whose reader
/// has gone: not a failure of the command, so nothing is reported.
pub fn is_closed_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The message of `err` followed by each cause that adds something: a
/// cause whose text the message already contains (a library error that
/// formats its source into its own message) is not repeated.
pub fn error_message(err: &anyhow::Error) -> String {
    let mut message = err.to_string();
    for cause in err.chain().skip(1) {
        let text = cause.to_string();
        if !text.is_empty() && !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct Wraps {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let text = io.to_string();
        let err = anyhow::Error::new(Wraps {
            path: "/nonexistent",
            source: io,
        })
        .context("cannot open the trace");
        let message = error_message(&err);
        assert_eq!(message.matches(&text).count(), 1, "{message}");
        assert!(message.starts_with("cannot open the trace: /nonexistent: "));
    }

    #[test]
    fn causes_that_add_something_are_kept() {
        let err = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_message(&err), "outer: inner");
    }

    #[test]
    fn broken_pipes_are_recognised_through_context() {
        let err = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("cannot write the JSON output");
        assert!(is_closed_pipe(&err));
        assert!(!is_closed_pipe(&anyhow::anyhow!("Broken pipe")));
    }
}
