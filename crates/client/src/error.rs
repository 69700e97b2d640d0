//! [`ClientError`]: what a caller of the service can get back, and the one
//! mapping from gRPC status codes to it.

use blockalloc::{ErrorClass, Extent};
use blockalloc_proto::pb;
use tonic::transport::Error as TransportError;
use tonic::{Code, Status};

/// A device as it was when it refused an allocation for want of a free
/// run (see `NoSpaceDetails` in the schema), from
/// [`ClientError::no_space_details`].
pub type NoSpaceDetails = pb::NoSpaceDetails;

/// The quota a call would have exceeded (see `QuotaDetails` in the
/// schema), in [`ClientError::Quota`].
pub type QuotaDetails = pb::QuotaDetails;

/// Any error of the client.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server cannot be reached, is shutting down, or its device
    /// failed, and the call did not run: sending it again later (or
    /// elsewhere) is safe and may work.
    #[error("allocation service unavailable: {0}")]
    Unavailable(String),
    /// The call was sent and then cut off before its reply (the connection
    /// broke, the stream ended without it, or the server answered CANCELLED
    /// or UNKNOWN, e.g. past its request timeout): it may or may not have
    /// run. An Allocate may have allocated blocks nobody knows of (a
    /// `reconcile` finds them); a Free may have freed; a lease's Commit is
    /// resolved by sending it again with the same sequence number, which
    /// the server applies once.
    #[error("outcome unknown (the call was cut off after it was sent; it may have run): {0}")]
    OutcomeUnknown(String),
    /// No space of the requested shape on the device (or too little left
    /// under the server's limits: the reason says which).
    #[error("no space: {reason}")]
    NoSpace {
        /// The server's explanation.
        reason: String,
        /// The device when it refused, for a refusal because no free run
        /// could hold the object (none for limits, or from a server that
        /// does not send them).
        details: Option<NoSpaceDetails>,
    },
    /// The call would take the caller's tenant past its quota on the
    /// device; nothing was applied. Freeing the tenant's space (or
    /// releasing its leases) or a larger quota makes room; the device
    /// itself may have plenty.
    #[error("over quota: {reason}")]
    Quota {
        /// The server's explanation (it names tenant, device and bytes).
        reason: String,
        /// Which quota, and how far the call would have gone past it.
        details: QuotaDetails,
    },
    /// The server refused the request (a bad request, a conflict with the
    /// device's state, an unknown device or lease).
    #[error("refused ({code:?}): {reason}")]
    Refused {
        /// The gRPC status code (see the schema for their meaning).
        code: Code,
        /// The server's explanation.
        reason: String,
    },
    /// Allocations made inside a lease were never committed and the lease
    /// is gone (the server says it expired or does not know it, or its
    /// deadline passed before a commit could reach the server): their
    /// blocks are, or will be, free again on the server and must not be
    /// used.
    #[error("{} allocation(s) lost before they were committed (the lease ended: expired, unknown to the server, or past its deadline unreachable); first: {}", extents.len(), extents.first().map(|e| e.to_string()).unwrap_or_default())]
    Lost {
        /// The lost allocations.
        extents: Vec<Extent>,
    },
    /// The server sent something this client cannot use.
    #[error("bad reply from the server: {0}")]
    BadReply(String),
    /// The allocator was closed.
    #[error("the leasing allocator is closed")]
    Closed,
    /// The connection settings cannot be used (a bad address, unreadable
    /// TLS files, plaintext where TLS is required).
    #[error("connection settings: {0}")]
    Config(String),
    /// The reply came from a stale owner of the device: its epoch is older
    /// than one this client has already seen for the device (see
    /// "Fencing" in the schema). The call is retried like an unavailable
    /// one (with the same request id), so a caller sees this only when the
    /// retries ran out.
    #[error("fenced: a reply with epoch {got} from a stale owner of the device (epoch {seen} seen already)")]
    Fenced {
        /// The newest epoch of the device this client had seen.
        seen: u64,
        /// The epoch of the reply.
        got: u64,
    },
}

impl ClientError {
    /// The gRPC status code of a refusal, if this is one.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// What kind of failure this is, from the server's status code where
    /// there is one (the codes `allocator.proto` documents).
    pub fn class(&self) -> ErrorClass {
        match self {
            ClientError::Unavailable(_) | ClientError::Closed | ClientError::Fenced { .. } => {
                ErrorClass::Unavailable
            }
            ClientError::NoSpace { .. } | ClientError::Quota { .. } => ErrorClass::NoSpace,
            ClientError::Refused { code, .. } => match code {
                Code::InvalidArgument | Code::OutOfRange => ErrorClass::InvalidInput,
                Code::NotFound => ErrorClass::NotFound,
                Code::PermissionDenied | Code::Unauthenticated => ErrorClass::Denied,
                Code::AlreadyExists => ErrorClass::AlreadyExists,
                Code::FailedPrecondition | Code::Aborted => ErrorClass::Conflict,
                Code::Internal => ErrorClass::Bug,
                Code::DataLoss => ErrorClass::Corrupt,
                _ => ErrorClass::Io,
            },
            ClientError::Lost { .. } => ErrorClass::Conflict,
            ClientError::BadReply(_) | ClientError::OutcomeUnknown(_) => ErrorClass::Io,
            ClientError::Config(_) => ErrorClass::InvalidInput,
        }
    }

    /// The device as it was when it refused an allocation for want of a
    /// free run, if this is such a refusal and the server said.
    pub fn no_space_details(&self) -> Option<&NoSpaceDetails> {
        match self {
            ClientError::NoSpace { details, .. } => details.as_ref(),
            _ => None,
        }
    }

    /// The quota a refused call would have exceeded, if this is a quota
    /// refusal.
    pub fn quota_details(&self) -> Option<&QuotaDetails> {
        match self {
            ClientError::Quota { details, .. } => Some(details),
            _ => None,
        }
    }

    /// True when the request did not run and may succeed if sent again
    /// later.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, ClientError::Unavailable(_))
    }

    /// True when the call was cut off after it was sent: it may or may not
    /// have run ([`ClientError::OutcomeUnknown`]).
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, ClientError::OutcomeUnknown(_))
    }

    /// True for failures that sending the same request again may cure:
    /// the server unreachable or refusing for now (UNAVAILABLE, a broken
    /// connection), a call cut off after it was sent (DEADLINE_EXCEEDED,
    /// CANCELLED, a broken connection: resent with the same request id or
    /// sequence, which the server applies once), or a reply from a stale
    /// owner.
    pub(crate) fn retryable(&self) -> bool {
        matches!(
            self,
            ClientError::Unavailable(_)
                | ClientError::OutcomeUnknown(_)
                | ClientError::Fenced { .. }
        )
    }
}

/// The TLS alert the server ended the connection with, if `s` failed so.
fn tls_alert(s: &Status) -> Option<rustls::AlertDescription> {
    let alert = |e: &(dyn std::error::Error + 'static)| match e.downcast_ref::<rustls::Error>() {
        Some(rustls::Error::AlertReceived(a)) => Some(*a),
        _ => None,
    };
    let mut cur = std::error::Error::source(s);
    while let Some(e) = cur {
        // An I/O error's source skips the error it wraps.
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| alert(i));
        if let Some(a) = inner.or_else(|| alert(e)) {
            return Some(a);
        }
        cur = e.source();
    }
    None
}

/// The error for a server that refused the TLS connection for its client
/// certificate (mutual TLS) with `alert`, saying what to give; `None` for
/// other alerts.
pub(crate) fn refused_for_certificate(alert: rustls::AlertDescription) -> Option<ClientError> {
    use rustls::AlertDescription as A;
    let why = match alert {
        A::CertificateRequired => {
            "the server requires a client certificate (mutual TLS) and this connection \
             presented none: give a certificate and key"
        }
        A::UnknownCA | A::BadCertificate | A::CertificateUnknown | A::AccessDenied => {
            "the server refused this connection's client certificate (mutual TLS): give one"
        }
        _ => return None,
    };
    Some(ClientError::Config(format!(
        "{why} signed by the CA the server trusts for clients (TlsOptions::identity; \
         blockalloc: --tls-client-cert FILE --tls-client-key FILE) [TLS alert {alert:?}]"
    )))
}

impl From<Status> for ClientError {
    fn from(s: Status) -> Self {
        if let Some(e) = tls_alert(&s).and_then(refused_for_certificate) {
            return e;
        }
        // The connection failed under a sent call and the transport gave it
        // a code of its own (a stopping server's GOAWAY arrives as an h2
        // protocol error, INTERNAL): whether it ran is not known.
        let transport = std::error::Error::source(&s).is_some_and(|e| e.is::<TransportError>());
        if transport && s.code() != Code::Unavailable {
            return ClientError::OutcomeUnknown(s.message().to_string());
        }
        match s.code() {
            // The server's own refusal, or no connection: nothing ran.
            Code::Unavailable => ClientError::Unavailable(s.message().to_string()),
            // Cut off after it was sent (a broken connection, the server's
            // request timeout, a deadline): whether it ran is not known.
            Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                ClientError::OutcomeUnknown(s.message().to_string())
            }
            // A quota refusal is marked by its details: a server that does
            // not send them reports it as no space.
            Code::ResourceExhausted => match blockalloc_proto::details::quota(&s) {
                Some(details) => ClientError::Quota {
                    reason: s.message().to_string(),
                    details,
                },
                None => ClientError::NoSpace {
                    reason: s.message().to_string(),
                    details: blockalloc_proto::details::no_space(&s),
                },
            },
            code => ClientError::Refused {
                code,
                reason: s.message().to_string(),
            },
        }
    }
}

impl From<tonic::transport::Error> for ClientError {
    fn from(e: tonic::transport::Error) -> Self {
        ClientError::Unavailable(e.to_string())
    }
}

/// Result alias of this crate.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_code_gives_the_class_the_server_meant() {
        let cases = [
            (Code::InvalidArgument, ErrorClass::InvalidInput),
            (Code::NotFound, ErrorClass::NotFound),
            (Code::FailedPrecondition, ErrorClass::Conflict),
            (Code::ResourceExhausted, ErrorClass::NoSpace),
            (Code::Unavailable, ErrorClass::Unavailable),
            (Code::Internal, ErrorClass::Bug),
        ];
        for (code, class) in cases {
            let e = ClientError::from(Status::new(code, "x"));
            assert_eq!(e.class(), class, "{code:?}");
        }
        assert_eq!(ClientError::Closed.class(), ErrorClass::Unavailable);
    }

    #[test]
    fn a_call_cut_off_after_it_was_sent_is_outcome_unknown_not_unavailable() {
        for code in [Code::Cancelled, Code::Unknown, Code::DeadlineExceeded] {
            let e = ClientError::from(Status::new(code, "cut off"));
            assert!(
                e.is_outcome_unknown() && !e.is_unavailable(),
                "{code:?}: {e}"
            );
            assert!(e.to_string().contains("may have run"), "{e}");
        }
        let e = ClientError::from(Status::unavailable("stopping"));
        assert!(e.is_unavailable() && !e.is_outcome_unknown(), "{e}");
    }

    #[test]
    fn only_failures_a_resend_may_cure_are_retried() {
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Unknown,
        ] {
            assert!(
                ClientError::from(Status::new(code, "x")).retryable(),
                "{code:?}"
            );
        }
        let fenced = ClientError::Fenced { seen: 7, got: 6 };
        assert!(fenced.retryable());
        assert_eq!(fenced.class(), ErrorClass::Unavailable);
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::FailedPrecondition,
            Code::ResourceExhausted,
            Code::PermissionDenied,
            Code::Internal,
        ] {
            assert!(
                !ClientError::from(Status::new(code, "x")).retryable(),
                "{code:?}"
            );
        }
        assert!(!ClientError::Closed.retryable());
        assert!(!ClientError::BadReply("x".into()).retryable());
    }

    /// Regression: a call in flight when its server stopped (GOAWAY) came
    /// back as INTERNAL "h2 protocol error" and was not sent again.
    #[test]
    fn a_call_cut_by_the_transport_is_outcome_unknown_whatever_its_code() {
        let transport = tonic::transport::Endpoint::from_shared("http://[::1".to_owned())
            .expect_err("not a URI");
        let mut s = Status::new(Code::Internal, "h2 protocol error: http2 error");
        s.set_source(std::sync::Arc::new(transport));
        let e = ClientError::from(s);
        assert!(e.is_outcome_unknown() && e.retryable(), "{e}");
        // The server's own INTERNAL (no transport error under it) is a bug
        // report, not retried.
        assert!(!ClientError::from(Status::internal("a fault")).retryable());
    }
}
