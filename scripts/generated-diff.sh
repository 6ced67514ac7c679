#!/usr/bin/env bash
# Show that a change leaves every generated source as it was: dump every host and Ascend
# source, its metadata and plan (fused and unfused, every opt level and each rule alone, the
# layer graphs, the seed layer at d 4096, 24 random graphs, the ONNX fixtures and the Rust
# module Builder::onnx writes for them: autofusion-build/examples/dump_generated.rs) at a base
# revision and in the working tree, and diff the two trees.
#
#   scripts/generated-diff.sh [BASE_REV]     (default: HEAD)
#
# Exit status 0 and "identical" when nothing differs; otherwise the diff's summary and 1.
# The base revision must hold the dumper (it landed with this script).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
base=${1:-HEAD}
work=${AUTOFUSION_DIFF_DIR:-$root/target/generated-diff}
mkdir -p "$work"
rm -rf "$work/base-tree"
git worktree prune
git worktree add --detach "$work/base-tree" "$base" >/dev/null
trap 'git worktree remove --force "$work/base-tree" >/dev/null 2>&1 || true' EXIT
# A target dir each: cargo keys path crates by their place in the workspace, so two checkouts
# sharing one would take each other's artifacts. The base's is kept for the next run.
dump() {
  (cd "$1" && CARGO_TARGET_DIR="$3" cargo run -q --release -p autofusion-build \
    --example dump_generated -- "$2" | grep -v '^cargo:')
}
dump "$work/base-tree" "$work/base" "$work/target-base"
dump "$root" "$work/new" "${CARGO_TARGET_DIR:-$root/target}"
if diff -r -q "$work/base" "$work/new" >"$work/summary.txt"; then
  echo "identical: $(find "$work/new" -type f | wc -l) generated files at $base and in the working tree"
else
  echo "differences between $base and the working tree ($work/summary.txt; diff -r $work/base $work/new):"
  head -n 40 "$work/summary.txt"
  echo "$(wc -l <"$work/summary.txt") files differ"
  exit 1
fi
