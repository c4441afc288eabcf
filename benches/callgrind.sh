#!/usr/bin/env bash
# Instructions per posted work request and per polled completion on the software device,
# counted by callgrind (valgrind). Builds the `figures` bench, runs its `--profile-calls N`
# scenario (N signalled 8-byte inline RDMA writes in post lists of 32, stepped fabric, one
# thread) under callgrind, and divides the inclusive instruction counts of the bench's
# never-inlined `post` and `poll` wrappers by N.
#
#   benches/callgrind.sh [N]        (needs valgrind; default N = 20000)
#
# `post` covers verbs-core's post_send and the soft device's WQE encoding and doorbell;
# `poll` covers verbs-core's poll and the soft device's CQE decoding. The transport engine
# (run_until_idle) is reported separately, per write.
#
# Then the mlx4 driver over the emulated HCA (`--profile-mlx4 N`): N signalled 64-byte inline
# RDMA writes one per post through BlueFlame, N through the UAR send doorbell, every completion
# polled. The emulated HCA's own work behind the BAR2 writes (the `Mmio` impl of the model's
# BAR2, which kicks its engine) is subtracted, as issue 3 asks: what remains is verbs-core plus
# the driver, including its stores to WQE memory and to the BAR.
set -euo pipefail
n=${1:-20000}
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 2; }
bin=$(cargo bench --bench figures --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="figures" and m.get("executable"):
        print(m["executable"])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out/cg.out" "$bin" --profile-calls "$n" >/dev/null 2>"$out/log" ||
    { cat "$out/log" >&2; exit 1; }
callgrind_annotate --inclusive=yes "$out/cg.out" >"$out/annot" 2>/dev/null
N="$n" python3 - "$out/annot" <<'PY'
import os, re, sys
n = int(os.environ["N"])
cost = {}
for line in open(sys.argv[1]):
    m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+\S*:?(.*)", line)
    if not m:
        continue
    ir, name = int(m.group(1).replace(",", "")), m.group(2)
    for key, pat in (("post", r"figures::post\b"), ("poll", r"figures::poll\b"),
                     ("engine", r"Fabric::run_until_idle\b")):
        if re.search(pat, name) and key not in cost:
            cost[key] = ir
missing = [k for k in ("post", "poll", "engine") if k not in cost]
if missing:
    sys.exit(f"callgrind.sh: no inclusive count for {missing} in the annotation")
print(f"callgrind, {n} signalled 8-byte inline RDMA writes, post lists of 32, polls of 64")
print("| path | instructions per operation |")
print("|---|---|")
print(f"| post_send, per work request | {cost['post'] / n:.0f} |")
print(f"| poll_cq, per completion | {cost['poll'] / n:.0f} |")
print(f"| soft transport engine, per write (both ends) | {cost['engine'] / n:.0f} |")
PY

valgrind --tool=callgrind --callgrind-out-file="$out/cg4.out" "$bin" --profile-mlx4 "$n" >/dev/null 2>"$out/log4" ||
    { cat "$out/log4" >&2; exit 1; }
callgrind_annotate --inclusive=yes "$out/cg4.out" >"$out/annot4" 2>/dev/null
N="$n" python3 - "$out/annot4" <<'PY'
import os, re, sys
n = int(os.environ["N"])
cost = {}
pats = (("bf", r"figures::post_bf\b"), ("db", r"figures::post_db\b"),
        ("poll", r"figures::poll_mlx4\b"),
        ("model_wc", r"portverbs_mlx4_model::bar2::Bar2 as portverbs_hal::mmio::Mmio>::write_wc"),
        ("model_w32", r"portverbs_mlx4_model::bar2::Bar2 as portverbs_hal::mmio::Mmio>::write32"))
for line in open(sys.argv[1]):
    m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+\S*:?(.*)", line)
    if not m:
        continue
    ir, name = int(m.group(1).replace(",", "")), m.group(2)
    for key, pat in pats:
        if re.search(pat, name) and key not in cost:
            cost[key] = ir
missing = [k for k in ("bf", "db", "poll") if k not in cost]
if missing:
    sys.exit(f"callgrind.sh: no inclusive count for {missing} in the mlx4 annotation")
bf = (cost["bf"] - cost.get("model_wc", 0)) / n
db = (cost["db"] - cost.get("model_w32", 0)) / n
print()
print(f"callgrind, mlx4 driver over the emulated HCA, {n} signalled 64-byte inline RDMA writes per path")
print("| path | instructions per operation (emulated HCA excluded) |")
print("|---|---|")
print(f"| post_send, BlueFlame, per work request | {bf:.0f} |")
print(f"| post_send, UAR doorbell, per work request | {db:.0f} |")
print(f"| poll_cq, per completion | {cost['poll'] / (2 * n):.0f} |")
print(f"| (emulated HCA behind the BAR writes: BlueFlame {cost.get('model_wc', 0) / n:.0f}, doorbell {cost.get('model_w32', 0) / n:.0f}) | |")
PY
