//! [`ErrorClass`]: what kind of failure an error is, independent of the
//! crate that raised it. Every library error of the workspace has a
//! `class()`; the binary maps classes to exit codes and the service maps
//! them to gRPC status codes, each in one function, so neither sorts
//! variants of other crates' errors.

use std::fmt;

/// The kind of a failure: what the caller can do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The request or its input is malformed or impossible (zero blocks, an
    /// extent past the device, bad options or sizes, an unknown name): ask
    /// differently.
    InvalidInput,
    /// Something the request names does not exist (a device or lease
    /// unknown to a server).
    NotFound,
    /// The device holds no blockalloc store (it was never formatted).
    NotFormatted,
    /// Creating would destroy what is there: a store, or other data.
    AlreadyExists,
    /// The device is shorter than its own metadata says it is.
    Truncated,
    /// Another writer holds the device or the store.
    Busy,
    /// A write was asked of something opened read-only.
    ReadOnly,
    /// Data read back (device metadata, a trace) is damaged or invalid, or
    /// two records of the same space disagree.
    Corrupt,
    /// The request contradicts the current state (a double free, a free of
    /// blocks another transaction holds, an ended lease): a caller bug or a
    /// race, not bad syntax.
    Conflict,
    /// The caller is not who it must be, or may not touch what it names
    /// (another tenant's space, a device outside its rights).
    Denied,
    /// Not enough free space of the requested shape.
    NoSpace,
    /// The service or store cannot serve now: shutting down, the journal is
    /// full, or an earlier failure left it unusable until reopened.
    Unavailable,
    /// The device, a file or the network failed an I/O request.
    Io,
    /// An invariant broke: a bug in an engine, never bad input.
    Bug,
}

impl ErrorClass {
    /// Every class, in declaration order.
    pub const ALL: [ErrorClass; 14] = [
        ErrorClass::InvalidInput,
        ErrorClass::NotFound,
        ErrorClass::NotFormatted,
        ErrorClass::AlreadyExists,
        ErrorClass::Truncated,
        ErrorClass::Busy,
        ErrorClass::ReadOnly,
        ErrorClass::Corrupt,
        ErrorClass::Conflict,
        ErrorClass::Denied,
        ErrorClass::NoSpace,
        ErrorClass::Unavailable,
        ErrorClass::Io,
        ErrorClass::Bug,
    ];

    /// A stable snake_case name, for logs and machine-readable output.
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::InvalidInput => "invalid_input",
            ErrorClass::NotFound => "not_found",
            ErrorClass::NotFormatted => "not_formatted",
            ErrorClass::AlreadyExists => "already_exists",
            ErrorClass::Truncated => "truncated",
            ErrorClass::Busy => "busy",
            ErrorClass::ReadOnly => "read_only",
            ErrorClass::Corrupt => "corrupt",
            ErrorClass::Conflict => "conflict",
            ErrorClass::Denied => "denied",
            ErrorClass::NoSpace => "no_space",
            ErrorClass::Unavailable => "unavailable",
            ErrorClass::Io => "io",
            ErrorClass::Bug => "bug",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Gives each listed error type a `class()` that is always
/// [`ErrorClass::InvalidInput`]: the errors of parsing and checking a
/// caller's input, which have no other kind of failure.
///
/// ```
/// #[derive(Debug)]
/// pub struct BadName;
/// blockalloc::invalid_input_errors!(BadName);
/// assert_eq!(BadName.class(), blockalloc::ErrorClass::InvalidInput);
/// ```
#[macro_export]
macro_rules! invalid_input_errors {
    ($($t:ty),+ $(,)?) => {
        $(
            impl $t {
                /// What kind of failure this is: always
                /// [`ErrorClass::InvalidInput`]($crate::ErrorClass::InvalidInput).
                pub fn class(&self) -> $crate::ErrorClass {
                    $crate::ErrorClass::InvalidInput
                }
            }
        )+
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_is_listed_once_with_its_own_name() {
        let names: std::collections::HashSet<_> =
            ErrorClass::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), ErrorClass::ALL.len());
        // `ALL` is complete: a class missing from it would not compile here.
        for c in ErrorClass::ALL {
            match c {
                ErrorClass::InvalidInput
                | ErrorClass::NotFound
                | ErrorClass::NotFormatted
                | ErrorClass::AlreadyExists
                | ErrorClass::Truncated
                | ErrorClass::Busy
                | ErrorClass::ReadOnly
                | ErrorClass::Corrupt
                | ErrorClass::Conflict
                | ErrorClass::Denied
                | ErrorClass::NoSpace
                | ErrorClass::Unavailable
                | ErrorClass::Io
                | ErrorClass::Bug => {}
            }
        }
    }
}
