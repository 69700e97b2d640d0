//! Fails early, with the reason, when the protoc that `scripts/protoc`
//! hands to etcd-client's build script is missing.
fn main() {
    if let Err(e) = protoc_bin_vendored::protoc_bin_path() {
        panic!("no vendored protoc for this platform: {e}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
