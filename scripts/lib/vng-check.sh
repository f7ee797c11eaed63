#!/usr/bin/env bash
# The virtme-ng check of scripts/test (README "Booting your tree with
# virtme-ng"): the cached 7.3 vng kernel booted with scripts/vng on a vnic of
# this script's own, the host's tools used in the guest, one UDP flow steered.
#
# Usage: scripts/lib/vng-check.sh [--series S]   (default 7.3)
#
# Asserts, each from its own side:
#   - the guest ran the host's ethtool (ethtool -i: driver virtio_net) and
#     python3 (the receiver below);
#   - the guest's receiver, pinned to CPU 1 and connected to the gen peer,
#     got the flow's datagrams (its own count);
#   - the module loaded from the tree's build and added a filter (its
#     debugfs counters: add_ok >= 1, read in the guest);
#   - while the guest ran, vnic's table held a filter for exactly that flow
#     (UDP 10.0.2.1:10000 -> 10.0.2.15:5001) to rx queue 1 (the receiver's
#     CPU's) that steered frames (hits > 0), and the trace has its add.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=common.sh
. "$here/lib/common.sh"

series=7.3
while [ $# -gt 0 ]; do
    case "$1" in
    --series) series=${2:?--series needs a value}; shift ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) vnic_die "unknown argument: $1" ;;
    esac
    shift
done

vnic_bin=${CARGO_TARGET_DIR:-$root/target}/release/vnic
[ -x "$vnic_bin" ] || (cd "$root" && cargo build --release -q -p vnic) || vnic_die "building vnic failed"
run=$(mktemp -d "${TMPDIR:-/tmp}/vnic-vng-check.XXXXXX")
vnic_pid="" poll_pid=""
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local rc=$?
    [ -z "$poll_pid" ] || kill "$poll_pid" 2>/dev/null || true
    [ -z "$vnic_pid" ] || { kill "$vnic_pid" 2>/dev/null; wait "$vnic_pid" 2>/dev/null; } || true
    if [ "$rc" = 0 ]; then rm -rf "$run"; else vnic_log "kept for a look: $run"; fi
    exit "$rc"
}
trap cleanup EXIT

sock=$run/vnic.sock ctl=$run/vnic.ctl
"$vnic_bin" serve --socket "$sock" --ctl "$ctl" --queues 2 --peer gen \
    --trace "$run/trace.jsonl" >"$run/vnic.log" 2>&1 &
vnic_pid=$!
for _ in $(seq 100); do [ -S "$ctl" ] && break; sleep 0.1; done
[ -S "$ctl" ] || { cat "$run/vnic.log" >&2; vnic_die "vnic serve did not start"; }
# The flow runs from before the boot: the device drops its frames until the
# guest's NIC has buffers, then delivers them.
"$vnic_bin" ctl --ctl "$ctl" gen start --sport 10000 --dst 10.0.2.15 --dport 5001 --rate 200 >/dev/null

# While the guest runs: the table's best filter for the flow, as JSON.
(
    while sleep 0.5; do
        "$vnic_bin" ctl --ctl "$ctl" table 2>/dev/null | python3 -c '
import json, sys
t = json.load(sys.stdin)["table"]
f = [x for x in t["filters"] if x["flow"]["proto"] == "udp" and x["flow"]["sport"] == 10000
     and x["flow"]["dport"] == 5001 and x["flow"]["src"] == "10.0.2.1" and x["flow"]["dst"] == "10.0.2.15"]
if f:
    print(json.dumps(max(f, key=lambda x: x["hits"])))
' >"$run/filter.new" 2>/dev/null && [ -s "$run/filter.new" ] && mv "$run/filter.new" "$run/filter.json"
    done
) &
poll_pid=$!

# The guest side: plain POSIX sh, the host's tools.
# shellcheck disable=SC2016 # expanded in the guest
guest='set -e
ip addr add 10.0.2.15/24 dev $VNIC_IF
ip link set $VNIC_IF up
ethtool -i $VNIC_IF | grep "^driver:"
echo 32768 > /proc/sys/net/core/rps_sock_flow_entries
for q in /sys/class/net/$VNIC_IF/queues/rx-*; do echo 4096 > $q/rps_flow_cnt; done
insmod $VNIC_KO ifnames=$VNIC_IF
ethtool -K $VNIC_IF ntuple on
python3 - <<EOF
import os, socket, time
os.sched_setaffinity(0, {1})
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.0.2.15", 5001))
s.connect(("10.0.2.1", 10000))   # RFS records a connected UDP socket flow
s.settimeout(1.0)
n, end = 0, time.time() + 12
while time.time() < end:
    try:
        s.recv(2048)
        n += 1
    except socket.timeout:
        pass
print("received", n)
EOF
grep -E "^(add_ok|steer_calls) " /sys/kernel/debug/vnic_arfs/$VNIC_IF/counters'
# From a file: vng hands --exec to the guest on the kernel command line (2048
# bytes on x86), and the guest sees the host's /tmp (an overlay over it).
printf '%s\n' "$guest" >"$run/guest.sh"
vnic_log "virtme-ng check: booting the $series vng kernel (host root, TCG), one flow steered"
"$here/vng" --series "$series" --socket "$sock" --queues 2 --cpus 2 --module --timeout 300 \
    --exec "sh $run/guest.sh" >"$run/guest.out" 2>"$run/vng.err" || {
    cat "$run/guest.out" "$run/vng.err" >&2
    vnic_die "scripts/vng failed (above)"
}
kill "$poll_pid" 2>/dev/null || true
poll_pid=""
cat "$run/guest.out"
fail() { cat "$run/guest.out" >&2; vnic_die "virtme-ng check: $*"; }
grep -q '^driver: virtio_net' "$run/guest.out" || fail "the host's ethtool did not report virtio_net in the guest"
got=$(sed -n 's/^received \([0-9]*\)$/\1/p' "$run/guest.out")
[ "${got:-0}" -gt 0 ] || fail "the guest's receiver got no datagram"
adds=$(sed -n 's/^add_ok \([0-9]*\)$/\1/p' "$run/guest.out")
[ "${adds:-0}" -ge 1 ] || fail "the module added no filter (add_ok ${adds:-absent})"
[ -s "$run/filter.json" ] || fail "vnic's table never held a filter for 10.0.2.1:10000 -> 10.0.2.15:5001"
hits=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["hits"])' "$run/filter.json")
[ "$hits" -gt 0 ] || fail "the flow's filter steered no frame: $(cat "$run/filter.json")"
# 2 queues on 2 vCPUs: virtio_net gives rx queue i's interrupt to CPU i, so the
# filter of a receiver on CPU 1 must point at rx queue 1.
rxq=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rxq"])' "$run/filter.json")
[ "$rxq" = 1 ] || fail "the flow's filter points at rx queue $rxq, not 1 (the receiver's CPU)"
grep -q '"event":"add".*"dport":5001' "$run/trace.jsonl" || fail "the trace has no add for the flow"
echo "virtme-ng check: ethtool and python3 from the host ran in the guest; $got datagrams received; module add_ok $adds; device filter $(cat "$run/filter.json")"
