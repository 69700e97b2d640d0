package blockalloc

// Version is this module's version. Its releases are tagged
// clients/go/vVERSION (the module lives in a subdirectory of the
// repository), and it is the version of the Rust workspace whose schema
// the stubs in blockallocv1 were generated from: install-check.sh fails
// when it differs from Cargo.toml's workspace version.
const Version = "0.1.0"
