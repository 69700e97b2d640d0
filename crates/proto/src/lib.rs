//! # blockalloc-proto
//!
//! The wire protocol of the blockalloc allocation service, shared by its
//! server (`blockalloc-service`) and its clients (`blockalloc-client`) so
//! that neither has to compile the other.
//!
//! * [`pb`] — the code generated from `proto/blockalloc/v1/allocator.proto`
//!   in this crate (package `blockalloc.v1`, the schema with every field and
//!   error case): the protobuf messages, and the gRPC stubs the features ask
//!   for.
//! * [`tls`] — the PEM files both ends read for TLS, checked when read so
//!   that an error names the file at fault.
//! * [`details`] — the typed details of a refusal (`NoSpaceDetails`), in a
//!   unary call's status and on the `Calls` stream.
//!
//! ## Features
//!
//! * `client` (default) — `pb::allocator_client::AllocatorClient`, with a
//!   `connect` over tonic's channel.
//! * `server` (default) — `pb::allocator_server::{Allocator,
//!   AllocatorServer}`: the trait a server implements and the tower service
//!   that serves it.
//!
//! A client application depends on this crate with `default-features =
//! false, features = ["client"]` and builds no server code.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use blockalloc_proto::pb::{self, allocator_client::AllocatorClient};
//!
//! let mut rpc = AllocatorClient::connect("http://127.0.0.1:7878").await?;
//! let status = rpc.status(pb::StatusRequest::default()).await?.into_inner();
//! for d in &status.devices {
//!     println!("{}: {} of {} blocks free", d.name, d.free_blocks, d.capacity_blocks);
//! }
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]

pub mod details;
pub mod tls;

/// The generated protobuf messages and gRPC stubs of `blockalloc.v1`
/// (`proto/blockalloc/v1/allocator.proto` in this crate): the client with
/// the `client` feature, the server with the `server` feature.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("blockalloc.v1");
}
