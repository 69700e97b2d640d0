//! The configuration file the README shows parses, with the values it
//! claims: the example stays true as the file format changes.

use blockalloc_service::ConfigFile;

#[test]
fn the_readme_configuration_example_parses() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md at the workspace root");
    let start = readme
        .find("```toml\n# serve.toml\n")
        .expect("the README has a serve.toml example");
    let body = &readme[start + "```toml\n".len()..];
    let body = &body[..body.find("```").expect("the example block ends")];
    // The example leaves the token's digest out.
    let body = body.replace('…', &"ab".repeat(32));
    let f = ConfigFile::parse(&body, "README.md".as_ref()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(f.devices.len(), 1);
    assert!(f.server.require_tls);
    assert!(f.server.tls.is_some());
    assert_eq!(
        f.server.metrics_addr,
        Some("127.0.0.1:9187".parse().unwrap())
    );
    assert_eq!(f.server.limits.max_leases_per_client, 64);
    assert_eq!(f.tenants.len(), 1);
    assert_eq!(f.tenants[0].quota_bytes, Some(1 << 40));
}
