#!/usr/bin/env bash
# Congestion through a real bottleneck: Portverbs' UDP-bound device (RoCEv2 on UDP port 4791)
# between two network namespaces joined by a veth pair, one direction of which is shaped to
# 1 Gbit/s by a tail-drop token bucket (tc-tbf). Many RC QPs sending at once into that queue
# overflow it; without congestion control in the transport engine (a window per destination
# path shared by its RC QPs, backends/transport/src/congestion.rs) the losses ended such runs
# with "transport retry counter exceeded".
#
#   sudo tests/veth-bottleneck/run.sh      (root: it makes network namespaces and a veth pair)
#
# 1. Builds the CLI in release mode if $CARGO_TARGET_DIR/release/portverbs (default target/)
#    is absent.
# 2. Makes namespaces A (10.77.0.1/24) and B (10.77.0.2/24) joined by a veth pair, lo up in
#    each. Only A's end is shaped: everything A sends to B queues there. B's direction is free.
# 3. Runs `portverbs perf write_bw` as server in one namespace and client in the other
#    (PORTVERBS_UDP=<its address>, device udp0, perftest's TCP exchange on port 18515; the
#    client starts once the server listens), each run behind a fresh qdisc on A's end (its
#    counters at zero):
#    - deep: `tc qdisc add dev <A's veth> root tbf rate 1gbit burst 64kb latency 5ms` (a queue
#      of about 690 KB, tail drop): -q 32 -s 4096 -n 2000, -q 128 -s 4096 -n 500 and -a -n 20
#      (every size from 2 B to 8 MiB, 20 iterations each), each both ways: the client in A
#      (the data through the bottleneck, "fwd") and the client in B (the data the free way,
#      the acknowledgements through the bottleneck, "rev");
#    - shallow: the same token bucket with `limit 20kb` instead of `latency 5ms` (some 18
#      packets of the 1024-byte path MTU, a shallow switch buffer), fwd: -q 32 -s 4096 -n
#      2000, -q 128 -s 4096 -n 500, one QP -s 65536 -n 2000, and -a -n 20;
#    - ecn: `tc qdisc add dev <A's veth> root handle 1: tbf rate 1gbit burst 64kb latency
#      20ms` with a child that marks instead of dropping, `tc qdisc add dev <A's veth> parent
#      1:1 handle 10: red limit 400000 min 30000 max 90000 avpkt 1500 burst 40 bandwidth 1gbit
#      probability 0.1 ecn` (fq_codel ecn if the kernel has no RED), fwd, -q 32 -s 4096 -n
#      2000; the row also checks that `tc -s qdisc show` counts marked packets (RED's
#      `marked`, fq_codel's `ecn_mark`): the device's RC requests leave ECN-capable (ECT(0)),
#      so the queue marks them CE instead of dropping them, and the receiver answers with
#      CNPs. The CLI prints no congestion counters (the engine counts CNPs in
#      Engine::cc_stats), so the marks are what this row checks. A kernel with neither qdisc
#      (CONFIG_NET_SCH_RED, CONFIG_NET_SCH_FQ_CODEL) skips the row with a line saying so;
#      VETH_BOTTLENECK_ECN=require makes that a failure.
#    Every run has a 300 s limit; both sides must exit 0 and print the result row(s) of the
#    size(s) and iterations asked for (with -q N perftest counts N x -n iterations). One line
#    per run gives the average bandwidth the client reported (MiB/sec, as perf prints it) and
#    the bottleneck's drops; a failed run's outputs and qdisc counters are printed.
# 4. Removes the namespaces (and with them the veth pair) on exit, also on failure.
#
# Needs root and iproute2 (ip, tc, ss). Output goes to $CARGO_TARGET_DIR/veth-bottleneck
# (default target/): <run>-server.out, <run>-client.out, tc-<run>.txt. Environment:
# VETH_BOTTLENECK_PROGRESS (the progress modes to run every row in, default "auto manual":
# each row with the CLI's default auto progress, then again with PORTVERBS_PROGRESS=manual,
# named <run>-manual), VETH_BOTTLENECK_ROWS (an extended regular expression: only the runs
# whose names match, e.g. '^q32-'), VETH_BOTTLENECK_ECN (skip, try (the default) or
# require).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
target_dir=${CARGO_TARGET_DIR:-$repo/target}
work=$target_dir/veth-bottleneck
cli=$target_dir/release/portverbs
modes=${VETH_BOTTLENECK_PROGRESS:-auto manual}
only=${VETH_BOTTLENECK_ROWS:-}
ecn_mode=${VETH_BOTTLENECK_ECN:-try}
run_limit=300
port=18515
ip_a=10.77.0.1
ip_b=10.77.0.2
ns_a=portverbs-veth-a-$$
ns_b=portverbs-veth-b-$$
# Interface names are at most 15 characters.
veth_a=pvva$$
veth_b=pvvb$$

now_ms() { date +%s%3N; }
t_start=$(now_ms)
die() { echo "veth-bottleneck: $*" >&2; exit 1; }

((EUID == 0)) || die "needs root (network namespaces and a veth pair)"
for tool in ip tc ss timeout; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install iproute2 coreutils)"
done
case $ecn_mode in skip | try | require) ;; *) die "VETH_BOTTLENECK_ECN must be skip, try or require" ;; esac
for mode in $modes; do
    [[ $mode == auto || $mode == manual ]] || die "VETH_BOTTLENECK_PROGRESS: unknown mode $mode"
done
mkdir -p "$work"
rm -f "$work"/*.out "$work"/tc-*.txt

if [[ ! -x $cli ]]; then
    echo "==> building the CLI (cargo build --release -p portverbs-cli)"
    cargo build --release -p portverbs-cli
fi
[[ -x $cli ]] || die "$cli is missing after the build"

# --- namespaces and the veth pair -----------------------------------------------------------
server_pid=
cleanup() {
    [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null
    local ns
    for ns in "$ns_a" "$ns_b"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    return 0
}
trap cleanup EXIT
ip netns add "$ns_a"
ip netns add "$ns_b"
ip link add "$veth_a" netns "$ns_a" type veth peer name "$veth_b" netns "$ns_b"
ip -n "$ns_a" link set lo up
ip -n "$ns_b" link set lo up
ip -n "$ns_a" addr add "$ip_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$ip_b/24" dev "$veth_b"
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up

# A fresh qdisc (counters at zero) on A's way out, of the kind $1: deep (tail drop at
# 1 Gbit/s behind a queue of 5 ms, about 690 KB with the burst), shallow (the same with a
# 20 KB queue, some 18 packets of the 1024-byte path MTU) or ecn (a marking child queue; prints the
# child's kind, fails when the kernel has neither RED nor fq_codel).
shape() {
    ip netns exec "$ns_a" tc qdisc del dev "$veth_a" root 2>/dev/null || true
    case $1 in
    deep) ip netns exec "$ns_a" tc qdisc add dev "$veth_a" root tbf rate 1gbit burst 64kb latency 5ms ;;
    shallow) ip netns exec "$ns_a" tc qdisc add dev "$veth_a" root tbf rate 1gbit burst 64kb limit 20kb ;;
    ecn)
        ip netns exec "$ns_a" tc qdisc add dev "$veth_a" root handle 1: tbf rate 1gbit burst 64kb latency 20ms
        if ip netns exec "$ns_a" tc qdisc add dev "$veth_a" parent 1:1 handle 10: red limit 400000 \
            min 30000 max 90000 avpkt 1500 burst 40 bandwidth 1gbit probability 0.1 ecn 2>"$work/tc-red.err"; then
            echo red
        elif ip netns exec "$ns_a" tc qdisc add dev "$veth_a" parent 1:1 handle 10: fq_codel ecn \
            2>"$work/tc-fq_codel.err"; then
            echo fq_codel
        else
            return 1
        fi
        ;;
    esac
}
echo "==> namespaces $ns_a ($veth_a $ip_a) and $ns_b ($veth_b $ip_b); $veth_a's egress shaped to 1 Gbit/s"

# --- the runs -------------------------------------------------------------------------------
# name | client's namespace (a: the data goes through the bottleneck; b: the acknowledgements
# do) | A's queue (see shape) | perf write_bw flags (both sides)
runs=(
    "q32-fwd|a|deep|-q 32 -s 4096 -n 2000"
    "q32-rev|b|deep|-q 32 -s 4096 -n 2000"
    "q128-fwd|a|deep|-q 128 -s 4096 -n 500"
    "q128-rev|b|deep|-q 128 -s 4096 -n 500"
    "all-fwd|a|deep|-a -n 20"
    "all-rev|b|deep|-a -n 20"
    "q32-fwd-shallow|a|shallow|-q 32 -s 4096 -n 2000"
    "q128-fwd-shallow|a|shallow|-q 128 -s 4096 -n 500"
    "s64k-fwd-shallow|a|shallow|-s 65536 -n 2000"
    "all-fwd-shallow|a|shallow|-a -n 20"
    "ecn-q32-fwd|a|ecn|-q 32 -s 4096 -n 2000"
)

failures=()
results=()
fail() {
    echo "veth-bottleneck: FAIL $1: $2" >&2
    [[ " ${failures[*]} " == *" $1 "* ]] || failures+=("$1")
}

# True when the output file $1 of side $3 (client or server) holds write_bw's result rows for
# the flags $2: one row of the size and (QPs x -n) iterations, or with -a on the client one
# row per size from 2 B to 8 MiB (the server waits for the client's row of the last size
# only and prints that: tools/src/perf/remote.rs).
rows_ok() {
    local out=$1 flags=" $2 " side=$3 qps=1 iters size n first=1 figure='[0-9]+(\.[0-9]+)?'
    [[ $flags =~ \ -q\ ([0-9]+)\  ]] && qps=${BASH_REMATCH[1]}
    [[ $flags =~ \ -n\ ([0-9]+)\  ]] || return 1
    iters=$((BASH_REMATCH[1] * qps))
    if [[ $flags == *" -a "* ]]; then
        [[ $side == server ]] && first=23
        for ((n = first; n <= 23; n++)); do
            size=$((1 << n))
            grep -qE "^[[:space:]]*${size}[[:space:]]+${iters}([[:space:]]+$figure){3}[[:space:]]*\$" "$out" || return 1
        done
        return 0
    fi
    [[ $flags =~ \ -s\ ([0-9]+)\  ]] || return 1
    size=${BASH_REMATCH[1]}
    grep -qE "^[[:space:]]*${size}[[:space:]]+${iters}([[:space:]]+$figure){3}[[:space:]]*\$" "$out"
}

# The BW average column (MiB/sec, as perf labels it) of the client's result rows in $1: the one row, or with -a
# the smallest and largest sizes'.
bw_of() {
    awk '$1 ~ /^[0-9]+$/ && NF == 5 && $3 ~ /^[0-9.]+$/ { rows[++n] = $1 " B: " $4 " MiB/sec" }
        END { if (n == 1) print rows[1]; else if (n > 1) print rows[1] " ... " rows[n] " (" n " sizes)" }' "$1"
}

# Runs write_bw with the flags $4 behind a fresh queue of kind $3 (see shape), the client in
# namespace $2 (a or b) and the server in the other, in the progress mode $5; names the
# outputs after $1.
run_one() {
    local name=$1 side=$2 queue=$3 flags=$4 mode=$5
    local ns_c ip_c ns_s ip_s kind=
    if [[ $side == a ]]; then
        ns_c=$ns_a ip_c=$ip_a ns_s=$ns_b ip_s=$ip_b
    else
        ns_c=$ns_b ip_c=$ip_b ns_s=$ns_a ip_s=$ip_a
    fi
    if [[ $queue == ecn ]]; then
        [[ $ecn_mode == skip ]] && return 0
        if ! kind=$(shape ecn); then
            if [[ $ecn_mode == require ]]; then
                cat "$work"/tc-*.err >&2 || true
                fail "$name" "this kernel has neither sch_red nor sch_fq_codel"
                results+=("FAIL $name: no marking qdisc (CONFIG_NET_SCH_RED, CONFIG_NET_SCH_FQ_CODEL)")
            else
                results+=("SKIP $name: this kernel has no marking qdisc, neither sch_red nor sch_fq_codel ($(head -n1 "$work/tc-red.err"))")
            fi
            echo "${results[-1]}"
            return 0
        fi
    else
        shape "$queue"
    fi
    local sout=$work/$name-server.out cout=$work/$name-client.out tc_out=$work/tc-$name.txt
    local -a args
    read -r -a args <<<"$flags"
    echo "==> $name: server $ip_s, client $ip_c (data $ip_c -> $ip_s), queue $queue${kind:+ ($kind)}, progress $mode: perf write_bw -d udp0 $flags"
    local t1 server_rc=0 client_rc=0 ok=1
    t1=$(now_ms)
    local -a cap_s=() cap_c=()
    if [[ -n ${VETH_BOTTLENECK_PCAP:-} ]]; then
        mkdir -p "$VETH_BOTTLENECK_PCAP"
        cap_s=("PORTVERBS_PCAP=$VETH_BOTTLENECK_PCAP/$name-server.pcap")
        cap_c=("PORTVERBS_PCAP=$VETH_BOTTLENECK_PCAP/$name-client.pcap")
    fi
    ip netns exec "$ns_s" env PORTVERBS_UDP="$ip_s" PORTVERBS_PROGRESS="$mode" "${cap_s[@]}" \
        timeout -k 5 "$run_limit" "$cli" perf write_bw -d udp0 "${args[@]}" </dev/null >"$sout" 2>&1 &
    server_pid=$!
    # The server listens on TCP port 18515 once its device is up.
    local deadline=$((SECONDS + 30))
    while [[ -z $(ip netns exec "$ns_s" ss -Hltn "sport = :$port") ]]; do
        if ! kill -0 "$server_pid" 2>/dev/null || ((SECONDS >= deadline)); then
            break
        fi
        sleep 0.1
    done
    if [[ -z $(ip netns exec "$ns_s" ss -Hltn "sport = :$port") ]]; then
        fail "$name" "the server never listened on port $port"
        ok=0
        kill "$server_pid" 2>/dev/null || true
    else
        ip netns exec "$ns_c" env PORTVERBS_UDP="$ip_c" PORTVERBS_PROGRESS="$mode" "${cap_c[@]}" \
            timeout -k 5 "$run_limit" "$cli" perf write_bw -d udp0 "${args[@]}" "$ip_s" \
            </dev/null >"$cout" 2>&1 || client_rc=$?
    fi
    wait "$server_pid" || server_rc=$?
    server_pid=
    local ms=$(($(now_ms) - t1))
    if ((ok)); then
        if ((client_rc == 124 || client_rc == 137)); then
            fail "$name" "the client hit the ${run_limit}s limit"
            ok=0
        elif ((client_rc != 0)); then
            fail "$name" "the client exited with status $client_rc"
            ok=0
        fi
        if ((server_rc == 124 || server_rc == 137)); then
            fail "$name" "the server hit the ${run_limit}s limit"
            ok=0
        elif ((server_rc != 0)); then
            fail "$name" "the server exited with status $server_rc"
            ok=0
        fi
        rows_ok "$cout" "$flags" client || { fail "$name" "the client printed no result row for $flags"; ok=0; }
        rows_ok "$sout" "$flags" server || { fail "$name" "the server printed no result row for $flags"; ok=0; }
    fi
    ip netns exec "$ns_a" tc -s qdisc show dev "$veth_a" >"$tc_out"
    local bw drops extra=
    bw=$(bw_of "$cout")
    # The root's counters (tbf's: its child's drops included).
    drops=$(awk '/dropped/ { gsub(/[(),]/, ""); for (i = 1; i < NF; i++) if ($i == "dropped") { print $(i + 1); exit } }' "$tc_out")
    if [[ $queue == ecn ]]; then
        # RED: "marked N early N pdrop N other N"; fq_codel: "ecn_mark N".
        local marks
        marks=$(awk '{ for (i = 1; i < NF; i++) if ($i == "marked" || $i == "ecn_mark") m += $(i + 1) }
            END { print m + 0 }' "$tc_out")
        extra="; $kind marked $marks packets CE (CNPs: the CLI prints no congestion counters)"
        if ((marks == 0)); then
            fail "$name" "$kind marked no packet: were the device's packets ECN-capable?"
            ok=0
        fi
    fi
    local verdict=PASS
    ((ok)) || verdict=FAIL
    results+=("$verdict $name: ${bw:-no result row} (${ms} ms, client rc $client_rc, server rc $server_rc; bottleneck drops: ${drops:-?}$extra)")
    if ((!ok)); then
        local f
        for f in "$cout" "$sout"; do
            echo "--- $f (last 20 lines but the address lines):"
            grep -vE '^ (local|remote) address:|^ GID:' "$f" 2>/dev/null | tail -n 20 || true
        done
        echo "--- $tc_out:"
        cat "$tc_out"
    fi
    echo "${results[-1]}"
    return 0
}

for mode in $modes; do
    suffix=
    [[ $mode == manual ]] && suffix=-manual
    for r in "${runs[@]}"; do
        IFS='|' read -r name side queue flags <<<"$r"
        name=$name$suffix
        [[ -z $only || $name =~ $only ]] || continue
        run_one "$name" "$side" "$queue" "$flags" "$mode"
    done
done

echo
echo "==> results"
printf '%s\n' "${results[@]}"
t_total=$(($(now_ms) - t_start))
echo "veth-bottleneck: total $t_total ms; outputs in $work"
if ((${#failures[@]})); then
    echo "veth-bottleneck: FAILED (${failures[*]})" >&2
    exit 1
fi
echo "veth-bottleneck: PASSED"
