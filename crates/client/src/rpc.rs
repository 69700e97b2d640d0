//! [`Rpc`], the generated gRPC client as this crate makes its calls, and
//! [`BearerToken`], the token it sends with each. Apart from the
//! [`Client`](crate::Client), so that the `Calls` stream, which the client
//! owns, can make calls without depending on it.

use blockalloc_proto::pb::allocator_client::AllocatorClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::error::{ClientError, Result};

/// Adds `authorization: Bearer TOKEN` to every call when a token is set
/// (a server with tenants requires it). Checked when made, so a token that
/// cannot travel in a header is an error there and nowhere later. Its
/// `Debug` does not show the token.
#[derive(Clone, Default)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl BearerToken {
    /// The header for `token`.
    ///
    /// # Errors
    /// [`ClientError::Refused`] with `InvalidArgument` for a token with
    /// characters a header cannot carry (control characters, non-ASCII).
    pub fn new(token: &str) -> Result<BearerToken> {
        let refused = || ClientError::Refused {
            code: tonic::Code::InvalidArgument,
            reason: "the token has characters not allowed in a header".into(),
        };
        // A header may carry other bytes than ASCII, but the server reads
        // the token as ASCII text only.
        if !token.is_ascii() {
            return Err(refused());
        }
        format!("Bearer {token}")
            .parse()
            .map(|v| BearerToken(Some(v)))
            .map_err(|_| refused())
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = if self.0.is_some() { "set" } else { "none" };
        f.debug_tuple("BearerToken").field(&shown).finish()
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(
        &mut self,
        mut req: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// The generated gRPC client as [`Client::rpc`](crate::Client::rpc) returns it: it sends the
/// client's token with every call.
pub type Rpc = AllocatorClient<InterceptedService<Channel, BearerToken>>;
