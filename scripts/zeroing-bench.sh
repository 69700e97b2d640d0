#!/usr/bin/env bash
# Background zeroing on real file systems: runs the store's `zero_bench`
# example (crates/store/examples/zero_bench.rs) on a fresh ext4 and a fresh
# XFS, each made on a loop device over a backing file. It measures
# object writes (4 KiB – 4 MiB, fdatasync per object or per 16, with and
# without the store's commit) into fallocated-but-unwritten space vs. space
# the store zeroed in the background, the zeroer's own rate, and what a
# zeroer at a given share costs a concurrent workload of synced overwrites.
# Prints Markdown tables (and keeps them in $ZB_OUT/zeroing-<fs>.md).
#
# Needs root (losetup, mkfs, mount). Installs xfsprogs with apt-get when
# mkfs.xfs is missing. Defaults: about 3.5 minutes for both file systems
# on a 2-core VM (10 s of it writing the backing file); `--quick` is a
# smoke run of about 30 s for both. Anything else running meanwhile
# (a build, tests) skews the numbers badly on a small machine: the load
# average is printed before and after.
#
# Usage:
#   sudo scripts/zeroing-bench.sh [EXAMPLE ARGS...]      e.g. --quick, --share 0.2
# Every argument goes to the example (see its header: --size, --c-size,
# --work, --share, --reps, --seconds, --cap, --parts, --quick); --dir is
# set here.
# Environment:
#   ZB_BACKING_DIR   where the backing file goes (default /var/tmp; /dev/shm
#                    puts it in memory: flushes then cost nothing, leaving
#                    the file systems' own CPU cost)
#   ZB_BACKING_GIB   its size in GiB (default 10; the example needs twice
#                    --size at once, then --c-size: 8 GiB by default)
#   ZB_BACKING_FILL  "zeros" (default): write zeros over the backing file
#                    once (O_DIRECT, ~10 s), so that no write inside the
#                    loop device makes the host's file system allocate
#                    blocks or convert extents of its own, which would add
#                    the host's metadata syncs to the guest's; "sparse":
#                    leave it sparse (first writes then cost host
#                    allocation too). Reused for every file system: mkfs
#                    runs without discard, so it stays written.
#   ZB_FS            file systems to test, in order (default "ext4 xfs")
#   ZB_LOOP_DIRECT   "on" (default): the loop device reads and writes its
#                    backing file O_DIRECT (losetup --direct-io=on), so the
#                    file system's writes and flushes reach the disk as on
#                    a real device; "off": buffered, through the page cache
#                    of the backing file (each flush then writes back what
#                    the file system wrote since: noisier, and it hides
#                    much of the difference being measured)
#   ZB_BIN           a built zero_bench binary (default: build it with
#                    cargo into ${CARGO_TARGET_DIR:-target})
#   ZB_OUT           where the Markdown output is kept (default bench-out)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "zeroing-bench.sh: needs root (losetup, mkfs, mount)" >&2
  exit 1
fi
for a in "$@"; do
  if [ "$a" = "--dir" ]; then
    echo "zeroing-bench.sh: --dir is set by the script" >&2
    exit 2
  fi
done

BACKING_DIR=${ZB_BACKING_DIR:-/var/tmp}
BACKING_GIB=${ZB_BACKING_GIB:-10}
BACKING_FILL=${ZB_BACKING_FILL:-zeros}
FILESYSTEMS=${ZB_FS:-ext4 xfs}
LOOP_DIRECT=${ZB_LOOP_DIRECT:-on}
OUT=${ZB_OUT:-bench-out}

if [ -z "${ZB_BIN:-}" ]; then
  command -v cargo >/dev/null || {
    echo "zeroing-bench.sh: no cargo here (sudo?): build the example, pass ZB_BIN" >&2
    exit 1
  }
  cargo build --release -p blockalloc-store --example zero_bench
  ZB_BIN=${CARGO_TARGET_DIR:-target}/release/examples/zero_bench
fi
[ -x "$ZB_BIN" ] || { echo "zeroing-bench.sh: no binary at $ZB_BIN" >&2; exit 1; }

case " $FILESYSTEMS " in
  *" xfs "*)
    if ! command -v mkfs.xfs >/dev/null; then
      echo "mkfs.xfs missing: installing xfsprogs" >&2
      apt-get install -y xfsprogs >&2 || { apt-get update >&2 && apt-get install -y xfsprogs >&2; }
    fi ;;
esac

BACKING="" LOOP="" MNT=""
cleanup() {
  set +e
  if [ -n "$MNT" ]; then
    mountpoint -q "$MNT" && umount "$MNT"
    rmdir "$MNT"
  fi
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  [ -n "$BACKING" ] && rm -f "$BACKING"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$OUT"
BACKING=$(mktemp "$BACKING_DIR/zeroing-bench.XXXXXX.img")
case $BACKING_FILL in
  zeros)
    echo "writing zeros over $BACKING ($BACKING_GIB GiB)" >&2
    dd if=/dev/zero of="$BACKING" bs=16M count=$((BACKING_GIB * 64)) \
      oflag=direct conv=fsync status=none ;;
  sparse) truncate -s "${BACKING_GIB}G" "$BACKING" ;;
  *) echo "zeroing-bench.sh: ZB_BACKING_FILL is zeros or sparse" >&2; exit 2 ;;
esac
for fs in $FILESYSTEMS; do
  LOOP=$(losetup --find --show --direct-io="$LOOP_DIRECT" "$BACKING")
  # No discard: it would punch holes in the backing file.
  case $fs in
    ext4) mkfs.ext4 -q -F -m 0 -E nodiscard "$LOOP" ;;
    xfs) mkfs.xfs -q -f -K "$LOOP" ;;
    *) echo "zeroing-bench.sh: unknown file system $fs" >&2; exit 2 ;;
  esac
  MNT=$(mktemp -d /tmp/zeroing-bench.mnt.XXXXXX)
  mount "$LOOP" "$MNT"
  {
    echo "## Background zeroing on $fs"
    echo
    echo '```sh'
    echo "sudo scripts/zeroing-bench.sh $*"
    echo '```'
    echo
    echo "$fs on $LOOP (loop device, direct-io=$LOOP_DIRECT) over a $BACKING_GIB GiB" \
      "backing file ($BACKING_FILL) in $BACKING_DIR" \
      "($(findmnt -n -o FSTYPE,SOURCE --target "$BACKING_DIR" | head -1 | sed 's/ \+/ on /'));" \
      "$(nproc) CPUs, $(date -u +%F)."
    echo "Load average before: $(cut -d' ' -f1-3 /proc/loadavg) (anything else running skews this)."
    echo
    "$ZB_BIN" --dir "$MNT" "$@"
    echo
    echo "Load average after: $(cut -d' ' -f1-3 /proc/loadavg)."
  } 2>&1 | tee "$OUT/zeroing-$fs.md"
  umount "$MNT"
  rmdir "$MNT"
  MNT=""
  losetup -d "$LOOP"
  LOOP=""
done
