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
# polled. The emulated HCA's own work behind the doorbells (the model BAR2's `UarDoorbells`
# calls, or its `Mmio` stores, which kick its engine) is subtracted: what remains is verbs-core
# plus the driver, including its stores to WQE memory and its doorbell calls.
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
# everything counted belongs to it. The queue objects are statically dispatched, so the driver's
# code is inlined into verbs-core's post/poll. To count the driver alone, a second build with
# `--cfg portverbs_split` keeps its entry points out of line (the send queue's `write_wqe` and
# `ring_doorbell`, the CQ's `poll_with`, and verbs-core's resolution closure called from it):
# the driver's share is their inclusive count less the emulated HCA's and, for the poll, less
# the closure's. Keeping them out of line costs calls and registers the normal build does not
# pay, so the split build's driver figure is an upper bound and its whole call a little higher.
split=$(RUSTFLAGS="${RUSTFLAGS:-} --cfg portverbs_split" CARGO_TARGET_DIR=target/split \
    cargo bench --bench figures --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="figures" and m.get("executable"):
        print(m["executable"])')
for path in post_bf post_db poll_mlx4; do
    for build in whole split; do
        exe=$bin
        [ "$build" = split ] && exe=$split
        valgrind --tool=callgrind --callgrind-out-file="$out/$path.$build.out" --toggle-collect="*figures::$path*" \
            "$exe" --profile-mlx4 "$n" >/dev/null 2>"$out/log4" || { cat "$out/log4" >&2; exit 1; }
        callgrind_annotate --inclusive=yes "$out/$path.$build.out" >"$out/$path.$build" 2>/dev/null
    done
done
N="$n" python3 - "$out" <<'PY'
import os, re, sys
n = int(os.environ["N"])
def lines(path, build):
    for line in open(os.path.join(sys.argv[1], f"{path}.{build}")):
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(?!=>)(.*)", line)
        if m:
            yield int(m.group(1).replace(",", "")), m.group(2)
def inclusive(path, build, pat):
    return max((ir for ir, name in lines(path, build) if re.search(pat, name)), default=0)
def total(path, build):
    for ir, name in lines(path, build):
        if name.startswith("PROGRAM TOTALS"):
            return ir
    sys.exit(f"callgrind.sh: no total for {path} ({build})")
model = (r"Bar2 as portverbs_(hal::mmio::Mmio>::(write_wc|write32|write64)"
         r"|mlx4_layout::pci::UarDoorbells>::(send|arm_cq|eq|blueflame))$")
sq = r"Mlx4Sq as portverbs_hal::queue::SendQueue>::(write_wqe|ring_doorbell)$"
def driver(path):
    if path == "poll_mlx4":
        poll = inclusive(path, "split", r"Mlx4Cq as portverbs_hal::queue::CompletionQueue>::poll_with$")
        return poll - inclusive(path, "split", r"portverbs_verbs::cq::Cq<D>::poll::\{\{closure\}\}$")
    entry = sum(max((ir for ir, name in lines(path, "split") if name.endswith(f"SendQueue>::{f}")), default=0)
                for f in ("write_wqe", "ring_doorbell"))
    return entry - inclusive(path, "split", model)
rows = []
for path, label, per in (("post_bf", "post_send, BlueFlame, per work request", n),
                         ("post_db", "post_send, UAR doorbell, per work request", n),
                         ("poll_mlx4", "poll_cq, per completion", 2 * n)):
    m = inclusive(path, "whole", model)
    if not driver(path) > 0:
        sys.exit(f"callgrind.sh: no driver entry points found for {path} in the split build")
    rows.append((label, (total(path, "whole") - m) / per, driver(path) / per,
                 (total(path, "split") - inclusive(path, "split", model)) / per, m / per))
print()
print(f"callgrind, mlx4 driver over the emulated HCA, {n} signalled 64-byte inline RDMA writes per path, one per post_send")
print("| path | whole call, instructions per operation | split build: mlx4 driver alone | split build: whole call | emulated HCA behind the BAR writes (excluded) |")
print("|---|---|---|---|---|")
for label, whole, drv, split_whole, model_cost in rows:
    print(f"| {label} | {whole:.0f} | {drv:.0f} | {split_whole:.0f} | {model_cost:.0f} |")
PY
