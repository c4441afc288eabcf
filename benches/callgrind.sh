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

# One callgrind run per path, collecting only inside that path's never-inlined wrapper, so that
# everything counted belongs to it. Inclusive counts are read from callgrind_annotate's
# per-function lines (the same function can appear under several file names when inlined;
# the largest entry is the function's inclusive total).
for path in post_bf post_db poll_mlx4; do
    valgrind --tool=callgrind --callgrind-out-file="$out/$path.out" --toggle-collect="*figures::$path*" \
        "$bin" --profile-mlx4 "$n" >/dev/null 2>"$out/log4" || { cat "$out/log4" >&2; exit 1; }
    callgrind_annotate --inclusive=yes "$out/$path.out" >"$out/$path.annot" 2>/dev/null
done
N="$n" python3 - "$out" <<'PY'
import os, re, sys
n = int(os.environ["N"])
def inclusive(path, pat):
    best = 0
    for line in open(os.path.join(sys.argv[1], path + ".annot")):
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(?!=>)(.*)", line)
        if m and re.search(pat, m.group(2)):
            best = max(best, int(m.group(1).replace(",", "")))
    return best
def total(path):
    for line in open(os.path.join(sys.argv[1], path + ".annot")):
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+PROGRAM TOTALS", line)
        if m:
            return int(m.group(1).replace(",", ""))
    sys.exit(f"callgrind.sh: no total for {path}")
model = r"Bar2 as portverbs_hal::mmio::Mmio>::(write_wc|write32|write64)"
rows = []
for path, label in (("post_bf", "post_send, BlueFlame, per work request"),
                    ("post_db", "post_send, UAR doorbell, per work request")):
    m = inclusive(path, model)
    whole = (total(path) - m) / n
    driver = (inclusive(path, r"Mlx4Sq as portverbs_hal::queue::SendQueue>::write_wqe")
              + inclusive(path, r"Mlx4Sq as portverbs_hal::queue::SendQueue>::ring_doorbell") - m) / n
    rows.append((label, whole, driver, m / n))
polled = 2 * n
poll_whole = total("poll_mlx4") / polled
poll_driver = (inclusive("poll_mlx4", r"Mlx4Cq as portverbs_hal::queue::CompletionQueue>::poll_batch")
               + inclusive("poll_mlx4", r"Mlx4Cq as portverbs_hal::queue::CompletionQueue>::publish_ci")) / polled
print()
print(f"callgrind, mlx4 driver over the emulated HCA, {n} signalled 64-byte inline RDMA writes per path, one per post_send")
print("| path | whole call, instructions per operation | of which the mlx4 driver | emulated HCA behind the BAR writes (excluded) |")
print("|---|---|---|---|")
for label, whole, driver, model_cost in rows:
    print(f"| {label} | {whole:.0f} | {driver:.0f} | {model_cost:.0f} |")
print(f"| poll_cq, per completion | {poll_whole:.0f} | {poll_driver:.0f} | 0 |")
PY
