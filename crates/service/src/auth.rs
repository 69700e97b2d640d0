//! Authentication: every call of an server with tenants carries
//! `authorization: Bearer TOKEN`; the interceptor finds the tenant and
//! attaches it to the request ([`Caller`]) before any handler runs.

use std::sync::Arc;

use tonic::{Request, Status};

use crate::tenants::{Tenant, Tenants};

/// The authenticated tenant of a request (absent on an open server).
#[derive(Clone, Debug)]
pub(crate) struct Caller(pub Arc<Tenant>);

/// The tonic interceptor: UNAUTHENTICATED without a known token; on an
/// open server it lets everything through.
#[derive(Clone, Debug)]
pub(crate) struct Authenticate {
    pub tenants: Arc<Tenants>,
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if self.tenants.is_empty() {
            return Ok(req);
        }
        let Some(v) = req.metadata().get("authorization") else {
            return Err(Status::unauthenticated(
                "no bearer token: send `authorization: Bearer TOKEN` with every call",
            ));
        };
        let token = v
            .to_str()
            .ok()
            .and_then(|s| s.strip_prefix("Bearer ").map(str::trim))
            .ok_or_else(|| {
                Status::unauthenticated("the authorization header is not `Bearer TOKEN`")
            })?;
        let tenant = self
            .tenants
            .authenticate(token)
            .ok_or_else(|| Status::unauthenticated("unknown bearer token"))?;
        req.extensions_mut().insert(Caller(tenant));
        Ok(req)
    }
}

/// The tenant of a request that went through [`Authenticate`].
pub(crate) fn caller<T>(req: &Request<T>) -> Option<Arc<Tenant>> {
    req.extensions().get::<Caller>().map(|c| Arc::clone(&c.0))
}
