//! Compiles `proto/blockalloc/v1/allocator.proto` (in this package, so that
//! the published crate builds on its own) without a system `protoc`:
//! protox parses it into descriptors, tonic-prost-build generates the
//! messages, and the client and server stubs that the `client` and `server`
//! features ask for.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
    let file = format!("{root}/blockalloc/v1/allocator.proto");
    // A directory here means any file under it (a new import too); without
    // it cargo would rerun this script on a change to any file of the
    // package.
    println!("cargo:rerun-if-changed={root}");
    let fds = protox::compile([&file], [root])?;
    let client = std::env::var_os("CARGO_FEATURE_CLIENT").is_some();
    let server = std::env::var_os("CARGO_FEATURE_SERVER").is_some();
    tonic_prost_build::configure()
        .build_client(client)
        .build_transport(client)
        .build_server(server)
        .compile_fds(fds)?;
    Ok(())
}
