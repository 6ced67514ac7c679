#!/usr/bin/env bash
# For an Atlas A2 (910B) machine with CANN and an NPU: build the Ascend path with the real
# bisheng, run the Ascend test suite on the NPU, and print the cost model's per-kernel
# predictions next to the device's per-kernel times.
#
#     source /usr/local/Ascend/cann/set_env.sh     # or the toolkit's own set_env.sh
#     scripts/ascend-verify.sh [OUT_DIR]
#
# Nothing here has been run on hardware yet (the project is developed without an NPU): each
# step stops with a message when its tool is missing, and what it produced is left in OUT_DIR
# (default target/ascend-verify) for the issue tracker.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/ascend-verify}
mkdir -p "$out"
say() { printf '\n== %s\n' "$*"; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "error: $1 not found: $2" >&2; exit 1; }; }

say "toolkit and device"
[ -n "${ASCEND_HOME_PATH:-}${ASCEND_TOOLKIT_HOME:-}" ] ||
  { echo "error: ASCEND_HOME_PATH is not set: source the CANN set_env.sh first" >&2; exit 1; }
case "${ASCEND_HOME_PATH:-$ASCEND_TOOLKIT_HOME}" in
  *ascend-sim*) echo "error: ASCEND_HOME_PATH points at the emulation; this script is for a real toolkit" >&2; exit 1 ;;
esac
need npu-smi "the NPU driver's tool (is this an Atlas machine?)"
npu-smi info | tee "$out/npu-smi.txt"
need cargo "the Rust toolchain"

say "build with the real bisheng (every graph of the repository, fused and unfused)"
cargo build --release --features ascend --all-targets 2>&1 | tee "$out/build.txt"

say "the Ascend test suite on the NPU (every layer graph, every opt level, each rule alone, random graphs)"
cargo test --release --features ascend --test ascend -- --nocapture 2>&1 | tee "$out/test-ascend.txt"
cargo test --release --features ascend -p autofusion-runtime -p autofusion-build --lib 2>&1 | tee "$out/test-lib.txt"

say "the cost model's per-kernel predictions for the seed layer on ascend910b"
for s in 128 2048; do
  cargo run --release --example plan -- --target ascend910b --opt-level 3 --seq "$s" 2>&1 |
    tee "$out/plan-S$s.txt"
done
cargo run --release --example traffic -- --d 4096 --heads 32 --seq 2048 --dtype f16 --target ascend910b 2>&1 |
  tee "$out/traffic.txt"

say "per-kernel device times (CANN's msprof over the Ascend test of the seed layer)"
if command -v msprof >/dev/null 2>&1; then
  exe=$(cargo test --release --features ascend --test ascend --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "ascend":
        print(m["executable"])' | tail -n 1)
  AUTOFUSION_TEST_GRAPH=seed_layer msprof --application="$exe every_layer_graph_matches_the_reference_on_ascend" \
    --output="$out/msprof" 2>&1 | tee "$out/msprof.txt"
  # The op summary lists each kernel launch with its device duration.
  find "$out/msprof" -name 'op_summary*.csv' -print -exec head -n 60 {} \; | tee "$out/op-summary.txt"
else
  echo "msprof not found (it ships with the CANN toolkit): per-kernel device times not collected"
fi

say "done: results in $out (attach them to the issue)"
