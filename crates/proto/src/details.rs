//! Typed details of a refusal, in both places the schema puts them: the
//! `grpc-status-details-bin` trailer of a unary call (a `google.rpc.Status`
//! whose `details` hold `google.protobuf.Any` messages, the gRPC
//! convention other languages' clients read), and `CallError` on the
//! `Calls` stream.
//!
//! ```
//! use blockalloc_proto::{details, pb};
//!
//! let at = pb::NoSpaceDetails { requested_blocks: 9, free_blocks: 4, ..Default::default() };
//! let s = details::with_no_space(tonic::Status::resource_exhausted("no space"), &at);
//! assert_eq!(details::no_space(&s), Some(at));
//! assert_eq!(details::no_space(&tonic::Status::resource_exhausted("quota")), None);
//! assert_eq!(details::quota(&s), None);
//! ```

use prost::Message;
use tonic::Status;

use crate::pb;

/// The `Any` type URL of [`pb::NoSpaceDetails`].
pub const NO_SPACE_TYPE_URL: &str = "type.googleapis.com/blockalloc.v1.NoSpaceDetails";

/// The `Any` type URL of [`pb::QuotaDetails`].
pub const QUOTA_TYPE_URL: &str = "type.googleapis.com/blockalloc.v1.QuotaDetails";

/// `status` (its code and message) with `at` in its details.
pub fn with_no_space(status: Status, at: &pb::NoSpaceDetails) -> Status {
    with_detail(status, NO_SPACE_TYPE_URL, at)
}

/// `status` (its code and message) with `quota` in its details: the mark
/// of a refusal for a tenant's quota.
pub fn with_quota(status: Status, quota: &pb::QuotaDetails) -> Status {
    with_detail(status, QUOTA_TYPE_URL, quota)
}

fn with_detail(status: Status, type_url: &str, m: &impl Message) -> Status {
    let rich = tonic_types::Status {
        code: status.code() as i32,
        message: status.message().to_string(),
        details: vec![prost_types::Any {
            type_url: type_url.to_string(),
            value: m.encode_to_vec(),
        }],
    };
    Status::with_details(status.code(), status.message(), rich.encode_to_vec().into())
}

/// The [`pb::NoSpaceDetails`] in `status`'s details, if it carries one (a
/// refusal of an allocation for want of a free run). Details that do not
/// decode are ignored: the code and message still say what happened.
pub fn no_space(status: &Status) -> Option<pb::NoSpaceDetails> {
    detail(status, NO_SPACE_TYPE_URL)
}

/// The [`pb::QuotaDetails`] in `status`'s details, if it carries one (a
/// refusal because the call would take the tenant past its quota).
pub fn quota(status: &Status) -> Option<pb::QuotaDetails> {
    detail(status, QUOTA_TYPE_URL)
}

fn detail<M: Message + Default>(status: &Status, type_url: &str) -> Option<M> {
    if status.details().is_empty() {
        return None;
    }
    let rich = tonic_types::Status::decode(status.details()).ok()?;
    rich.details
        .iter()
        .find(|a| a.type_url == type_url)
        .and_then(|a| M::decode(a.value.as_slice()).ok())
}

/// The `CallError` a `Calls` stream replies with for a call that ended with
/// `status`: its code, message, and no-space or quota details.
pub fn call_error(status: &Status) -> pb::CallError {
    pb::CallError {
        code: status.code() as i32,
        message: status.message().to_string(),
        no_space: no_space(status),
        quota: quota(status),
    }
}

/// The status a unary call would have ended with, from a `Calls` stream's
/// `CallError` (its no-space or quota details included).
pub fn status_of(e: &pb::CallError) -> Status {
    let s = Status::new(tonic::Code::from_i32(e.code), e.message.clone());
    match (&e.no_space, &e.quota) {
        (Some(at), _) => with_no_space(s, at),
        (None, Some(q)) => with_quota(s, q),
        (None, None) => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> pb::NoSpaceDetails {
        pb::NoSpaceDetails {
            requested_blocks: 1024,
            free_blocks: 30_000,
            largest_free_extent: 1003,
            used_blocks: 4_000_000,
            leased_unused_blocks: 0,
            capacity_blocks: 4_194_304,
        }
    }

    #[test]
    fn the_details_survive_the_unary_trailer_and_the_stream() {
        let s = with_no_space(Status::resource_exhausted("no space: 1024 blocks"), &at());
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert_eq!(s.message(), "no space: 1024 blocks");
        assert_eq!(no_space(&s), Some(at()));
        let e = call_error(&s);
        assert_eq!(e.code, tonic::Code::ResourceExhausted as i32);
        assert_eq!(e.no_space, Some(at()));
        let back = status_of(&e);
        assert_eq!((back.code(), back.message()), (s.code(), s.message()));
        assert_eq!(no_space(&back), Some(at()));
    }

    #[test]
    fn a_quota_refusal_keeps_its_mark_in_the_trailer_and_the_stream() {
        let q = pb::QuotaDetails {
            tenant: "a".into(),
            device: "dev0".into(),
            quota_bytes: 10 << 20,
            held_bytes: 9 << 20,
            asked_bytes: 2 << 20,
        };
        let s = with_quota(Status::resource_exhausted("quota of tenant a"), &q);
        assert_eq!(quota(&s), Some(q.clone()));
        assert_eq!(no_space(&s), None);
        let e = call_error(&s);
        assert_eq!((e.quota.as_ref(), e.no_space.as_ref()), (Some(&q), None));
        let back = status_of(&e);
        assert_eq!((back.code(), back.message()), (s.code(), s.message()));
        assert_eq!(quota(&back), Some(q));
        assert_eq!(quota(&with_no_space(s, &at())), None);
    }

    #[test]
    fn statuses_without_the_details_have_none() {
        assert_eq!(no_space(&Status::resource_exhausted("quota")), None);
        // Garbage, or another detail type, is ignored.
        let garbage =
            Status::with_details(tonic::Code::ResourceExhausted, "x", vec![7u8; 9].into());
        assert_eq!(no_space(&garbage), None);
        let other = tonic_types::Status {
            code: 8,
            message: "x".into(),
            details: vec![prost_types::Any {
                type_url: "type.googleapis.com/google.rpc.QuotaFailure".into(),
                value: vec![],
            }],
        };
        let s = Status::with_details(
            tonic::Code::ResourceExhausted,
            "x",
            other.encode_to_vec().into(),
        );
        assert_eq!(no_space(&s), None);
        assert_eq!(quota(&s), None);
        assert_eq!(call_error(&s).no_space, None);
    }
}
