#!/usr/bin/env bash
# CI of the published crates: `cargo package` of blockalloc (crates/core),
# blockalloc-proto and blockalloc-client, then each .crate unpacked into a
# directory outside the workspace and built there on its own, as a user
# of crates.io would get it. That catches what only the workspace provides:
# a file outside the package (the schema), a path dependency without a
# version, a feature another member turns on.
#
# The crates depend on each other before any is published, so the
# unpacked copies point at one another with [patch.crates-io]; everything
# else comes from crates.io at the versions of the packaged Cargo.lock.
#
#   CARGO_TARGET_DIR   where `cargo package` writes (as cargo reads it)
#   PACKAGE_CHECK_DIR  the scratch directory (default: a new temp dir,
#                      removed at the end); its target/ is shared by the
#                      three builds
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
crates=(blockalloc blockalloc-proto blockalloc-client)

target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target=$root/$target ;; esac

if [ -n "${PACKAGE_CHECK_DIR:-}" ]; then
    work=$PACKAGE_CHECK_DIR
    mkdir -p "$work"
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi

echo "== cargo package ${crates[*]}"
# One command for the three: cargo resolves each one's dependencies on the
# others against the packages it has just made. --no-verify: the builds
# below are the verification, with a target directory of their own.
args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done
cargo package "${args[@]}" --no-verify --allow-dirty

# Unpack every .crate (NAME-VERSION/ each), then point each at the others.
declare -A dir
for c in "${crates[@]}"; do
    id=$(cargo pkgid -p "$c")
    version=${id##*@}
    dir[$c]=$work/$c-$version
    rm -rf "${dir[$c]}"
    tar -xzf "$target/package/$c-$version.crate" -C "$work"
done
for c in "${crates[@]}"; do
    {
        echo
        echo "[patch.crates-io]"
        for other in "${crates[@]}"; do
            [ "$other" = "$c" ] || echo "$other = { path = \"${dir[$other]}\" }"
        done
    } >>"${dir[$c]}/Cargo.toml"
done

# blockalloc-proto with both of its features (the client and the server
# stubs); the others as a dependent gets them.
for c in "${crates[@]}"; do
    echo "== build $c on its own (${dir[$c]})"
    features=()
    [ "$c" = blockalloc-proto ] && features=(--all-features)
    (cd "${dir[$c]}" && CARGO_TARGET_DIR=$work/target cargo build --quiet "${features[@]}")
done
echo "package-check: ${crates[*]} package and build on their own"
