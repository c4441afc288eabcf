#!/usr/bin/env bash
# BENCHMARKS.md "RoCEv2 over UDP": Portverbs' UDP-bound software devices in two processes
# over loopback, beside the raw UDP rates this machine reaches in the same run with the same
# datagram sizes (a plain sendmmsg/recvmmsg pair and a UDP GSO/GRO pair). Portverbs runs in
# both progress modes: auto (one progress thread per device) and manual (none: the perf
# processes' own polls and waits drive their devices).
#
#   benches/udp.sh [runs]      # default 3 runs of each; prints the best and every run
#
# Datagram sizes: a 64 KiB RDMA WRITE at the loopback's 4096-byte path MTU is 16 datagrams
# of 4112 bytes (BTH 12 + payload 4096 + ICRC 4; the first also carries a 16-byte RETH); a
# 64-byte SEND is one datagram of 80 bytes; a 2-byte SEND (send_lat) one of 20 bytes (BTH 12 +
# payload padded to 4 + ICRC 4), which the raw ping-pong sends each way.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
cargo build --release -q -p portverbs-cli
cargo build --release -q -p portverbs-udp --example udp_raw
RAW=target/release/examples/udp_raw
PV=target/release/portverbs
SECS=3
PORT=18700

raw() { # size gso(0/1) -> "gbps mpps" of what arrived
    local size=$1 gso=$2 flags=() sflags=()
    if [ "$gso" = 1 ]; then flags=(--gso); sflags=(--gro); fi
    "$RAW" sink 127.0.95.2:4791 "${sflags[@]}" --secs "$SECS" > /tmp/udp-bench-sink.txt &
    local pid=$!
    sleep 0.3
    "$RAW" blast 127.0.95.1:4791 127.0.95.2:4791 "$size" "${flags[@]}" --secs "$SECS" > /dev/null
    wait "$pid"
    sed -E 's/.*mpps=([0-9.]+) gbps=([0-9.]+).*/\2 \1/' /tmp/udp-bench-sink.txt
}

pv() { # test size iterations progress -> "gbps mpps" from the client's row
    local test=$1 size=$2 n=$3 mode=$4
    PORT=$((PORT + 1))
    PORTVERBS_UDP=127.0.96.1 timeout 120 "$PV" perf "$test" -d udp0 -s "$size" -n "$n" \
        -p "$PORT" --progress "$mode" > /tmp/udp-bench-server.txt 2>&1 &
    local pid=$!
    sleep 0.5
    PORTVERBS_UDP=127.0.96.2 timeout 120 "$PV" perf "$test" -d udp0 -s "$size" -n "$n" \
        -p "$PORT" --progress "$mode" 127.0.96.1 > /tmp/udp-bench-client.txt 2>&1
    wait "$pid"
    # Row: bytes iterations peak avg(MiB/s) rate(Mpps)
    awk -v s="$size" '$1 == s && NF == 5 { printf "%.3f %.3f\n", $4 * 1048576 * 8 / 1e9, $5 }' \
        /tmp/udp-bench-client.txt
}

best() { sort -g -k"$1" | tail -1; }

LAT_N=20000
rawlat() { # size -> "typical_us p999_us", both sides busy-polling
    "$RAW" pong 127.0.95.2:4791 --iters "$LAT_N" > /dev/null &
    local pid=$!
    sleep 0.3
    "$RAW" ping 127.0.95.1:4791 127.0.95.2:4791 "$1" --iters "$LAT_N" |
        sed -E 's/.*typical_us=([0-9.]+) p999_us=([0-9.]+).*/\1 \2/'
    wait "$pid"
}

pvlat() { # progress -> "typical_us p999_us" of send_lat -s 2, from the client's row
    local mode=$1
    PORT=$((PORT + 1))
    PORTVERBS_UDP=127.0.96.1 timeout 120 "$PV" perf send_lat -d udp0 -s 2 -n "$LAT_N" \
        -p "$PORT" --progress "$mode" > /tmp/udp-bench-server.txt 2>&1 &
    local pid=$!
    sleep 0.5
    PORTVERBS_UDP=127.0.96.2 timeout 120 "$PV" perf send_lat -d udp0 -s 2 -n "$LAT_N" \
        -p "$PORT" --progress "$mode" 127.0.96.1 > /tmp/udp-bench-client.txt 2>&1
    wait "$pid"
    # Row: bytes iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
    awk '$1 == 2 && NF == 9 { print $5, $9 }' /tmp/udp-bench-client.txt
}

lowest() { sort -g -k1 | head -1; }

declare -A runs
for r in $(seq "$RUNS"); do
    runs[raw4112]+="$(raw 4112 0)"$'\n'
    runs[gso4112]+="$(raw 4112 1)"$'\n'
    runs[raw80]+="$(raw 80 0)"$'\n'
    runs[gso80]+="$(raw 80 1)"$'\n'
    runs[rawlat]+="$(rawlat 20)"$'\n'
    for mode in auto manual; do
        runs[write_$mode]+="$(pv write_bw 65536 20000 $mode)"$'\n'
        runs[send_$mode]+="$(pv send_bw 64 300000 $mode)"$'\n'
        runs[lat_$mode]+="$(pvlat $mode)"$'\n'
    done
done

line() { # label key column(1=gbps,2=mpps)
    local b
    b=$(printf '%s' "${runs[$2]}" | grep . | best "$3")
    printf '%-44s %10s Gbit/s %8s Mpps   runs: %s\n' "$1" "${b% *}" "${b#* }" \
        "$(printf '%s' "${runs[$2]}" | grep . | awk -v c="$3" '{printf "%s ", $c}')"
}
echo "RoCEv2 over UDP, two processes over loopback, best of $RUNS ($(nproc) cores)"
line "raw UDP 4112 B, sendmmsg/recvmmsg" raw4112 1
line "raw UDP 4112 B, GSO/GRO" gso4112 1
line "Portverbs 64 KiB RDMA WRITE, auto" write_auto 1
line "Portverbs 64 KiB RDMA WRITE, manual" write_manual 1
line "raw UDP 80 B, sendmmsg/recvmmsg" raw80 2
line "raw UDP 80 B, GSO/GRO" gso80 2
line "Portverbs 64 B SEND, auto" send_auto 2
line "Portverbs 64 B SEND, manual" send_manual 2

latline() { # label key: the run with the lowest t_typical, and every run's
    local b
    b=$(printf '%s' "${runs[$2]}" | grep . | lowest)
    printf '%-44s %8s us typical %10s us 99.9%%   runs (typical): %s\n' "$1" "${b% *}" "${b#* }" \
        "$(printf '%s' "${runs[$2]}" | grep . | awk '{printf "%s ", $1}')"
}
echo "One-way latency, $LAT_N round trips, both sides busy-polling; lowest t_typical of $RUNS"
latline "raw UDP 20 B ping-pong" rawlat
latline "Portverbs send_lat 2 B, auto" lat_auto
latline "Portverbs send_lat 2 B, manual" lat_manual
