//! Compiles `proto/blockalloc/v1/allocator.proto` without a system `protoc`:
//! protox parses it into descriptors, tonic-prost-build generates the code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    let file = format!("{root}/blockalloc/v1/allocator.proto");
    println!("cargo:rerun-if-changed={file}");
    let fds = protox::compile([&file], [root])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
