//! What a client application compiles: the generated client and tonic's
//! channel, never the server crate, the server stubs or tonic's server.
//! Asked of `cargo tree` for this package alone, so that features other
//! workspace members turn on do not count.

use std::process::Command;

/// `(package name, its enabled features)` for every package a build of
/// `blockalloc-client` compiles for its library (normal dependencies).
fn client_packages() -> Vec<(String, Vec<String>)> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            "blockalloc-client",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}|{f}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| {
            // A package printed before is marked " (*)" after its features.
            let (package, features) = line.trim_end_matches(" (*)").split_once('|')?;
            let name = package.split_whitespace().next()?.to_string();
            let features = features
                .split(',')
                .filter(|f| !f.is_empty())
                .map(str::to_string)
                .collect();
            Some((name, features))
        })
        .collect()
}

fn features_of<'a>(packages: &'a [(String, Vec<String>)], name: &str) -> &'a [String] {
    &packages
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{name} is not a dependency of blockalloc-client"))
        .1
}

#[test]
fn client_does_not_build_the_server() {
    let packages = client_packages();
    for server_side in ["blockalloc-service", "blockalloc-store", "axum"] {
        assert!(
            packages.iter().all(|(n, _)| n != server_side),
            "blockalloc-client depends on {server_side}"
        );
    }
    let proto = features_of(&packages, "blockalloc-proto");
    assert!(proto.iter().any(|f| f == "client"), "features: {proto:?}");
    assert!(proto.iter().all(|f| f != "server"), "features: {proto:?}");
    let tonic = features_of(&packages, "tonic");
    assert!(tonic.iter().any(|f| f == "channel"), "features: {tonic:?}");
    for server_side in ["server", "router", "transport"] {
        assert!(
            tonic.iter().all(|f| f != server_side),
            "features: {tonic:?}"
        );
    }
}
