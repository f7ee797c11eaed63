#!/usr/bin/env bash
# The kernel's own NIC driver selftests (tools/testing/selftests/drivers/net
# and drivers/net/hw, the Python ones) run in a virtme-ng guest against vnic's
# NIC, from the guest kernel's own source (issue 27, item 3). As root.
#
# Usage: scripts/lib/netdrv-selftests.sh [options]
#   --series S       the cached kernel to boot and whose selftests run
#                    (default 7.3; images/build-kernel --series S
#                    must have built it: this script builds no kernel)
#   --tests LIST     comma-separated tests, as paths under drivers/net
#                    (ping.py,stats.py,hw/rss_ctx.py); default: every Python
#                    test of TEST_PROGS in drivers/net/Makefile and
#                    drivers/net/hw/Makefile, then the project's own
#                    (guest-tests/selftests/drivers/net: hw/arfs.py)
#   --module         build aRFS/kmod's vnic_arfs.ko against the kernel (scripts/vng
#                    --module) and load it in the guest before the tests
#                    (ifnames=NETIF; set-up fails unless ntuple-filters turns
#                    on): the NIC then has aRFS (ndo_rx_flow_steer, ntuple),
#                    which hw/arfs.py needs; without it hw/arfs.py skips.
#                    hw/ntuple.py then fails (ethtool -N) instead of skipping
#   --list           print the default test list and exit
#   --timeout SECS   per test (default 360, drivers/net/settings' value);
#                    a test past it counts as FAIL (timeout)
#   --queues N       vnic's queue pairs (default 2, with 2 vCPUs)
#   --vnic BIN       the daemon (default target/release/vnic under
#                    $CARGO_TARGET_DIR or the repository; built when missing)
#   --vnic-arg ARG   one more argument to `vnic serve` (repeatable), e.g.
#                    --vnic-arg --steer=none: a device that takes filters and
#                    steers nothing, on which hw/arfs.py must fail
#   --keep           keep the run dir (logs, per-test KTAP output) even on success
#   --ethtool E      the guest's ethtool: `fetched` (default: Debian's newest
#                    package, images/fetch-ethtool, first in the guest's PATH),
#                    `host` (the host's /usr/sbin/ethtool, 6.1 on Debian 12),
#                    or a path to a binary
#
# Topology (the guest kernel has no CONFIG_NET_NS, so the remote end cannot be
# a netns inside the guest; it is a network namespace on the host instead):
#
#   guest: NETIF = vnic's NIC 192.0.2.1/24 2001:db8:1::1/64
#            | vhost-user
#   host netns vnicsftN: vnic serve --peer tap:vnictap0; the tap is the remote
#            end, 192.0.2.2/24 2001:db8:1::2/64 (REMOTE_TYPE=ssh)
#   control: a second guest NIC from QEMU (user-mode net, scripts/vng
#            --extra-nic user) to a dropbear ssh server on 127.0.0.1:2222 in
#            that netns, so that the remote's commands never cross the NIC
#            under test. QEMU, vnic and dropbear all run in the netns.
#
# dropbear gets a throw-away host key and one throw-away client key made for the
# run; it reads root's authorized_keys from a private mount namespace where the
# run's own directory is bind-mounted over ~root/.ssh (the host's own is never
# read nor changed). The guest's ssh/scp are wrappers that use only the run's
# key and config (-F). Everything is removed at exit (netns, daemons, keys).
#
# The selftests run from a copy of the tree's drivers/net, net/lib,
# tools/net/ynl and Documentation/netlink/specs (in $VNIC_CACHE/netdrv-sft/),
# with the project's own tests (guest-tests/selftests/drivers/net, written for
# upstream: guest-tests/selftests/README.md) copied in at every run,
# where the C helpers that need only gcc are built (napi_id_helper, so_txtime,
# net/lib's gro, csum, xdp_helper); the BPF objects (clang) and the YNL C
# programs (psp_responder, toeplitz) are not built: those tests fail or skip.
#
# Output: one line per test, PASS (at least one case passed, none failed) /
# SKIP (the test's own reason, from its KTAP output; also a test that exits 0
# with every case skipped) / FAIL (the first lines of the failure: exit status
# not 0 or 4, or a timeout), then a summary.
# Exit status: 1 if a test of the expected-to-pass list below did not pass,
# 2 on a set-up error, 0 otherwise. Host tools come from scripts/setup-host
# (iperf3, iputils-ping, socat, dropbear-bin). Runs niced (19). About
# 20-30 minutes for the whole list under TCG on 2 busy cores.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=common.sh
. "$here/lib/common.sh"

# Tests that passed in two full runs on 7.3 (see
# guest-tests/docs/results/netdrv-selftests-7.3.md); a FAIL or SKIP of one of
# them makes the exit status 1. Only tests with a passing case count: one whose
# cases all skip shows nothing. (ping.py's v4/v6 cases pass over vnic, but
# its XDP cases fail on this kernel: no BPF syscall.)
# hw/arfs.py counts with --module only (without the module it skips).
expected_pass=(napi_id.py stats.py)

series=7.3 tests="" list_only=0 per_test=360 queues=2 vnic_bin="" keep=0 module=0 ethtool=fetched
vnic_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --series) series=${2:?--series needs a value}; shift ;;
    --tests) tests=${2:?--tests needs a list}; shift ;;
    --list) list_only=1 ;;
    --timeout) per_test=${2:?--timeout needs seconds}; shift ;;
    --queues) queues=${2:?--queues needs a number}; shift ;;
    --vnic) vnic_bin=${2:?--vnic needs a path}; shift ;;
    --keep) keep=1 ;;
    --module) module=1 ;;
    --ethtool) ethtool=${2:?--ethtool needs fetched, host or a path}; shift ;;
    --vnic-arg) vnic_args+=("${2:?--vnic-arg needs an argument}"); shift ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "netdrv-selftests: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
die() { vnic_log "error: $*"; exit 2; }
[[ "$per_test" =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive number of seconds"
[[ "$queues" =~ ^[1-9][0-9]*$ ]] && [ "$queues" -le 16 ] || die "--queues must be 1..16"

cache=$(vnic_cache)
kdir=$cache/kernels/$series-default
[ -e "$kdir/done" ] && [ -f "$kdir/build/.config" ] ||
    die "no cached $series kernel in $kdir; build it first: images/build-kernel --series $series"
ktree=$(cd "$kdir/build" && pwd -P)
release=$(cat "$ktree/include/config/kernel.release")
sft=$ktree/tools/testing/selftests/drivers/net
[ -f "$sft/Makefile" ] && [ -f "$sft/hw/Makefile" ] || die "$ktree has no tools/testing/selftests/drivers/net{,/hw}/Makefile"
own=$root/guest-tests/selftests/drivers/net
[ "$module" = 0 ] || expected_pass+=(hw/arfs.py)

# TEST_PROGS of a selftests Makefile, the Python ones.
test_progs() {
    awk '/^TEST_PROGS[ :]*=/ {on=1; sub(/^[^=]*=/, "")} on {
        for (i = 1; i <= NF; i++) if ($i ~ /\.py$/) print $i
        if ($0 !~ /\\$/) on = 0 }' "$1"
}
default_tests=$( {
    test_progs "$sft/Makefile"
    test_progs "$sft/hw/Makefile" | sed 's|^|hw/|'
    (cd "$own" && find . -name '*.py' -perm -u+x | sed 's|^\./||' | sort)
} | tr '\n' ' ')
if [ "$list_only" = 1 ]; then
    printf '%s\n' $default_tests
    exit 0
fi
if [ -z "$tests" ]; then
    tests=$default_tests
else
    tests=$(printf '%s' "$tests" | tr ',' ' ')
    for t in $tests; do
        [[ "$t" =~ ^(hw/)?[A-Za-z0-9_.-]+\.py$ ]] || die "--tests: $t is not a test name (name.py or hw/name.py)"
        [ -f "$sft/$t" ] || [ -f "$own/$t" ] || die "--tests: no test $t in $sft or $own"
    done
fi
ntests=$(printf '%s\n' $tests | wc -l)

# --- host checks -------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "run as root (network namespace, tap device, dropbear)"
missing=()
for c in ip socat iperf3 ping dropbear dropbearkey ssh ssh-keygen scp gcc unshare rsync timeout; do
    command -v "$c" >/dev/null || missing+=("$c")
done
[ ${#missing[@]} -eq 0 ] || die "missing on the host: ${missing[*]}; run scripts/setup-host (iperf3, iputils-ping, dropbear-bin, socat are in its list)"
/usr/bin/python3 -c 'import yaml' 2>/dev/null || die "/usr/bin/python3 has no yaml module (python3-yaml): the YNL library needs it"
roothome=$(getent passwd root | cut -d: -f6)
if ! [ -d "$roothome/.ssh" ]; then
    # dropbear reads root's ~/.ssh/authorized_keys; the run's own is bind-mounted
    # over that directory in a private mount namespace, so it has to exist.
    mkdir -m 700 "$roothome/.ssh" || die "cannot create $roothome/.ssh (dropbear's authorized_keys are bind-mounted over it)"
    vnic_log "created an empty $roothome/.ssh (a mount point for the run's authorized_keys; it stays empty)"
fi
renice -n 19 -p $$ >/dev/null # everything below, the guest included, runs niced
# virtme-ng into its venv now: scripts/vng runs in the netns below, which has
# no route to PyPI (on a fresh machine its own install would fail there).
"$here/vng" --setup >&2 || die "scripts/vng --setup failed (virtme-ng from PyPI, host packages)"

if [ -z "$vnic_bin" ]; then
    vnic_bin=${CARGO_TARGET_DIR:-$root/target}/release/vnic
    [ -x "$vnic_bin" ] || (cd "$root" && cargo build --release -q -p vnic) || die "building vnic failed"
fi
[ -x "$vnic_bin" ] || die "--vnic $vnic_bin: not an executable"

# --- the selftests' copy and its helpers -------------------------------------------
work=$cache/netdrv-sft
src=$work/src-$release
if ! [ -e "$src/.done" ] || [ "$src/.done" -ot "$ktree/Makefile" ]; then
    vnic_log "copying drivers/net selftests, net/lib, YNL and the netlink specs from $ktree"
    rm -rf "$src"
    mkdir -p "$src/tools/testing/selftests/net" "$src/tools/net" "$src/Documentation/netlink"
    rsync -a --exclude '*.o' "$ktree/tools/testing/selftests/drivers" "$src/tools/testing/selftests/"
    rsync -a --exclude '*.o' "$ktree/tools/testing/selftests/net/lib" "$ktree/tools/testing/selftests/net/lib.sh" "$src/tools/testing/selftests/net/"
    rsync -a "$ktree/tools/testing/selftests/lib.mk" "$ktree"/tools/testing/selftests/*.h "$src/tools/testing/selftests/"
    rsync -a --exclude '*.o' "$ktree/tools/net/ynl" "$src/tools/net/"
    rsync -a "$ktree/Documentation/netlink/specs" "$src/Documentation/netlink/"
    : >"$src/.built"
    for h in drivers/net/napi_id_helper drivers/net/so_txtime net/lib/gro net/lib/csum net/lib/xdp_helper; do
        d=$src/tools/testing/selftests/$h
        # (older kernels lack some: 6.12 has only net/lib/csum.c)
        if ! [ -f "$d.c" ]; then
            echo "no $h in this kernel's selftests" >>"$src/.built"
        elif nice -n 19 gcc -O2 -Wall -I"$src/tools/testing/selftests" -o "$d" "$d.c" >"$d.build.log" 2>&1; then
            echo "built $h" >>"$src/.built"
        else
            echo "NOT built $h: $(grep -m1 error "$d.build.log")" >>"$src/.built"
        fi
    done
    touch "$src/.done"
fi
sed 's/^/  helper: /' "$src/.built" >&2
tsrc=$src/tools/testing/selftests/drivers/net
# The project's own tests, over the copy (a kernel that gains one of the same
# name runs ours: the one this repository keeps and posts).
rsync -a "$own/" "$tsrc/"

# --- the run -------------------------------------------------------------------------
mkdir -p "$work"
run=$(mktemp -d "$work/run.XXXXXX")
out=$run/out
mkdir -p "$out" "$run/bin" "$run/dotssh"
case "$ethtool" in
host) ;;
fetched) ln -s "$("$root/images/fetch-ethtool")" "$run/bin/ethtool" ;;
*) [ -x "$ethtool" ] || die "--ethtool $ethtool: not an executable"
   ln -s "$(cd "$(dirname "$ethtool")" && pwd)/$(basename "$ethtool")" "$run/bin/ethtool" ;;
esac
vnic_log "guest ethtool: $("${run}/bin/ethtool" --version 2>/dev/null || ethtool --version)"
ns=vnicsft$$
vnic_pid="" db_pid=""
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local rc=$?
    [ -z "$db_pid" ] || kill "$db_pid" 2>/dev/null || true
    [ -z "$vnic_pid" ] || kill "$vnic_pid" 2>/dev/null || true
    [ -z "$db_pid" ] || wait "$db_pid" 2>/dev/null || true
    [ -z "$vnic_pid" ] || wait "$vnic_pid" 2>/dev/null || true
    # everything still in the namespace is ours: vng, QEMU, virtiofsd, vnic, dropbear
    local left
    left=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$left" ]; then
        # shellcheck disable=SC2086
        kill $left 2>/dev/null || true
        sleep 2
        left=$(ip netns pids "$ns" 2>/dev/null || true)
        # shellcheck disable=SC2086
        [ -z "$left" ] || { kill -CONT $left; kill -KILL $left; } 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
    rm -f "$run/id" "$run/id.pub" "$run/hostkey" "$run/dotssh/authorized_keys"
    if [ "$keep" = 1 ] || [ "$rc" != 0 ]; then
        vnic_log "run dir kept: $run (out/*.log: each test's output; vnic.log, dropbear.log, vng.err)"
    else
        rm -rf "$run"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$ns" || die "ip netns add $ns failed"
ip -n "$ns" link set lo up

# vnic, its tap peer in the namespace: the remote end.
ip netns exec "$ns" "$vnic_bin" serve --socket "$run/vnic.sock" --ctl "$run/vnic.ctl" \
    --queues "$queues" --peer tap:vnictap0 --trace "$run/trace.jsonl" "${vnic_args[@]}" >"$run/vnic.log" 2>&1 &
vnic_pid=$!
for _ in $(seq 100); do
    [ -S "$run/vnic.sock" ] && ip -n "$ns" link show vnictap0 >/dev/null 2>&1 && break
    kill -0 "$vnic_pid" 2>/dev/null || { cat "$run/vnic.log" >&2; vnic_pid=""; die "vnic serve exited at start (log above)"; }
    sleep 0.1
done
ip -n "$ns" link show vnictap0 >/dev/null 2>&1 || die "vnic serve made no tap vnictap0 within 10 s (log: $run/vnic.log)"
ip -n "$ns" addr add 192.0.2.2/24 dev vnictap0
ip -n "$ns" -6 addr add 2001:db8:1::2/64 dev vnictap0 nodad
ip -n "$ns" link set vnictap0 up

# ssh: a throw-away host key and client key; dropbear sees the run's
# authorized_keys as ~root/.ssh in a mount namespace of its own.
dropbearkey -t ed25519 -f "$run/hostkey" >/dev/null 2>&1 || die "dropbearkey failed"
ssh-keygen -q -t ed25519 -N '' -C netdrv-selftests -f "$run/id" || die "ssh-keygen failed"
chmod 700 "$run/dotssh"
install -m 600 "$run/id.pub" "$run/dotssh/authorized_keys"
ip netns exec "$ns" unshare -m --propagation private sh -c \
    'mount --bind "$1" "$2" && shift 2 && exec "$@"' sh "$run/dotssh" "$roothome/.ssh" \
    dropbear -F -E -e -s -j -k -m -p 127.0.0.1:2222 -r "$run/hostkey" -P "$run/dropbear.pid" \
    >"$run/dropbear.log" 2>&1 &
db_pid=$!
cat >"$run/ssh_config" <<EOF
Host *
    Port 2222
    User root
    IdentityFile $run/id
    IdentitiesOnly yes
    BatchMode yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    GlobalKnownHostsFile /dev/null
    LogLevel ERROR
    ControlMaster auto
    ControlPath /tmp/netdrv-sft-%C
    ControlPersist 900
    ServerAliveInterval 10
EOF
# dropbear refuses a command over 9000 bytes (its MAX_CMD_LEN); the tests send
# longer ones (ping.py: 64 KiB of data in a command line). Those go through
# stdin into a file on the remote, which bash then runs (stdin /dev/null).
cat >"$run/bin/ssh" <<EOF
#!/bin/sh
if [ \$# = 3 ] && [ "\$1" = -q ] && [ \${#3} -gt 8000 ]; then
    printf '%s\\n' "\$3" | /usr/bin/ssh -F $run/ssh_config -q "\$2" \\
        'f=\$(mktemp /tmp/netdrv-sft-cmd.XXXXXX) && cat >"\$f" && bash "\$f" </dev/null; rc=\$?; rm -f "\$f"; exit \$rc'
    exit \$?
fi
exec /usr/bin/ssh -F $run/ssh_config "\$@"
EOF
printf '#!/bin/sh\nexec /usr/bin/scp -O -F %s "$@"\n' "$run/ssh_config" >"$run/bin/scp"
chmod +x "$run/bin/ssh" "$run/bin/scp"
sleep 0.5
kill -0 "$db_pid" 2>/dev/null || { cat "$run/dropbear.log" >&2; db_pid=""; die "dropbear exited at start (log above)"; }

# The guest's side: plain POSIX sh with the host's tools.
printf '%s\n' $tests >"$run/tests"
cat >"$run/guest.sh" <<'EOF'
run=$1 tsrc=$2 per_test=$3
out=$run/out
export PATH=$run/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec 2>"$out/guest.err"
[ -n "$VNIC_IF" ] && [ -n "$VNIC_XIF" ] || { echo "setup: the NICs are missing (VNIC_IF=$VNIC_IF VNIC_XIF=$VNIC_XIF)" >"$out/setup.log"; exit 3; }
ip link set lo up
# A test that takes the NIC down must not take its IPv6 address with it (the
# kernel's default flushes it): the next tests would find no LOCAL_V6.
sysctl -qw net.ipv6.conf.all.keep_addr_on_down=1 net.ipv6.conf.default.keep_addr_on_down=1
sysctl -qw "net.ipv6.conf.$VNIC_IF.keep_addr_on_down=1"
ip addr add 10.0.2.15/24 dev "$VNIC_XIF"
ip link set "$VNIC_XIF" up
ip addr add 192.0.2.1/24 dev "$VNIC_IF"
ip -6 addr add 2001:db8:1::1/64 dev "$VNIC_IF" nodad
ip link set "$VNIC_IF" up
{
    uname -r
    ethtool -i "$VNIC_IF" | head -2
    ip -br addr
} >"$out/setup.log" 2>&1
ok=0
for i in $(seq 30); do ping -q -c 1 -W 1 192.0.2.2 >/dev/null 2>&1 && { ok=1; break; }; sleep 1; done
[ $ok = 1 ] || { echo "setup: 192.0.2.2 (the tap in the host's netns) does not answer ping through vnic" >>"$out/setup.log"; exit 3; }
ssh root@10.0.2.2 'ip -br addr show dev vnictap0' >>"$out/setup.log" 2>&1 ||
    { echo "setup: ssh to the host netns (10.0.2.2:2222) failed" >>"$out/setup.log"; exit 3; }
if [ -n "$VNIC_KO" ]; then
    # --module: aRFS on the NIC; the module attaches once vnic answers its HELLO
    insmod "$VNIC_KO" ifnames="$VNIC_IF" || { echo "setup: insmod $VNIC_KO failed" >>"$out/setup.log"; exit 3; }
    on=0
    for i in $(seq 50); do
        ethtool -k "$VNIC_IF" | grep -q '^ntuple-filters: on' && { on=1; break; }
        sleep 0.2
    done
    [ $on = 1 ] || { echo "setup: vnic_arfs.ko loaded but ntuple-filters is not on after 10 s (no CAPS from vnic?)" >>"$out/setup.log"; exit 3; }
    echo "module: vnic_arfs.ko loaded, ntuple-filters on" >>"$out/setup.log"
fi
echo "setup: ok" >>"$out/setup.log"
export NETIF="$VNIC_IF" LOCAL_V4=192.0.2.1 REMOTE_V4=192.0.2.2 LOCAL_V6=2001:db8:1::1 REMOTE_V6=2001:db8:1::2
export REMOTE_TYPE=ssh REMOTE_ARGS=root@10.0.2.2
for t in $(cat "$run/tests"); do
    name=$(echo "$t" | tr / _)
    start=$(date +%s)
    (cd "$tsrc/$(dirname "$t")" && timeout -k 10 "$per_test" /usr/bin/python3 "./$(basename "$t")") >"$out/$name.log" 2>&1
    rc=$?
    echo "$rc $(( $(date +%s) - start ))" >"$out/$name.rc"
    # what a test may have left behind: the link down, an address gone
    ip link set "$VNIC_IF" up 2>/dev/null
    ip addr replace 192.0.2.1/24 dev "$VNIC_IF" 2>/dev/null
    ip -6 addr replace 2001:db8:1::1/64 dev "$VNIC_IF" nodad 2>/dev/null
done
echo done >"$out/guest.done"
EOF

total=$(( ntests * (per_test + 20) + 300 ))
modarg=()
[ "$module" = 0 ] || modarg=(--module)
vnic_log "netdrv selftests: $ntests tests, kernel $release, netns $ns, run dir $run$([ "$module" = 0 ] || echo ", vnic_arfs.ko loaded")"
t0=$(date +%s)
set +e
# In the background, so that INT/TERM reach the trap at once (bash runs a
# trap only after its foreground command ends).
ip netns exec "$ns" "$here/vng" --series "$series" --socket "$run/vnic.sock" --queues "$queues" --cpus 2 \
    "${modarg[@]}" --extra-nic user --timeout "$total" --exec "sh $run/guest.sh $run $tsrc $per_test" \
    -- --rwdir "$out" </dev/null >"$run/vng.out" 2>"$run/vng.err" &
wait $!
vrc=$?
set -e
elapsed=$(( $(date +%s) - t0 ))
if ! grep -q '^setup: ok' "$out/setup.log" 2>/dev/null; then
    cat "$out/setup.log" "$out/guest.err" "$run/vng.out" 2>/dev/null | tail -20 >&2
    tail -20 "$run/vng.err" >&2
    die "the guest's set-up failed (scripts/vng exit $vrc; above)"
fi
[ -e "$out/guest.done" ] || vnic_log "warning: the guest did not finish the list (scripts/vng exit $vrc after ${elapsed}s)"

# --- results ---------------------------------------------------------------------------
# result <log> <rc>: "RESULT<TAB>detail"
summarize() {
    /usr/bin/python3 - "$1" "$2" <<'PY'
import re, sys
log, rc = sys.argv[1], sys.argv[2]
try:
    lines = open(log, errors="replace").read().splitlines()
except OSError:
    lines = []
tot = ""
for l in lines:
    m = re.match(r"# Totals: (.*)", l)
    if m:
        t = dict(kv.split(":") for kv in m.group(1).split())
        tot = " ".join(f"{k}:{v}" for k, v in t.items() if v != "0")
skips = [m.group(2) + ": " + m.group(3) for l in lines
         for m in [re.match(r"ok \d+ (\S+\.)?(\S+) # SKIP ?(.*)", l)] if m]
fails = [m.group(2) for l in lines for m in [re.match(r"not ok \d+ (\S+\.)?(\S+)", l)] if m]
def first_failure():
    # the first failing case's block: its check or exception, and the last
    # command with its exit status and first stderr line
    start = 0
    for i, l in enumerate(lines):
        if re.match(r"(ok|not ok) \d+ ", l):
            if l.startswith("not ok"):
                blk = [x[2:] if x.startswith("# ") else x for x in lines[start:i]]
                keep = []
                for x in blk:
                    x = x.strip()
                    if x.startswith("Check|") or re.match(r"Exception\| [\w.]+(Error|Ex|Exception|Failure|Exit)\w*:", x) \
                       or re.match(r"Exception\| (CMD|\s*EXIT|\s*STDERR)", x):
                        x = re.sub(r"^Exception\|\s*", "", x)
                        keep.append(x[:110])
                if not keep:
                    keep = [x.strip()[:160] for x in blk if x.strip()][-3:]
                seen = []
                for x in keep:
                    if x not in seen:
                        seen.append(x)
                return l.split(" ", 3)[-1] + ": " + " | ".join(seen[-6:])
            start = i + 1
    return " | ".join(x for x in lines[-3:])[:400]
if rc in ("124", "137"):
    res, det = "FAIL", "timeout (killed); " + (("failed: " + ",".join(fails) + "; ") if fails else "") + first_failure()
elif rc == "0" and re.search(r"\bpass:[1-9]", tot):
    res = "PASS"
    det = tot + (("; skipped: " + " / ".join(skips)) if skips else "")
elif rc == "0":
    # exit 0 with every case skipped (or xfail): nothing was shown to work
    res, det = "SKIP", "all cases skipped (exit 0): " + (" / ".join(skips) or tot)
elif rc == "4":
    res, det = "SKIP", " / ".join(skips) or first_failure()
elif rc == "missing":
    res, det = "FAIL", "not run (the guest stopped before it)"
else:
    res = "FAIL"
    det = f"exit {rc}; {tot}; failed: {','.join(fails)}; {first_failure()}"
print(res + "\t" + det.replace("\t", " "))
PY
}
npass=0 nskip=0 nfail=0 bad=()
: >"$run/results.tsv"
for t in $tests; do
    name=$(echo "$t" | tr / _)
    if [ -f "$out/$name.rc" ]; then read -r rc secs <"$out/$name.rc"; else rc=missing secs=-; fi
    line=$(summarize "$out/$name.log" "$rc")
    res=${line%%$'\t'*} det=${line#*$'\t'}
    case "$res" in PASS) npass=$((npass + 1)) ;; SKIP) nskip=$((nskip + 1)) ;; *) nfail=$((nfail + 1)) ;; esac
    printf '%-4s %-26s %4ss  %s\n' "$res" "$t" "$secs" "$det"
    printf '%s\t%s\t%s\t%s\n' "$t" "$res" "$secs" "$det" >>"$run/results.tsv"
    for e in "${expected_pass[@]}"; do
        [ "$e" != "$t" ] || [ "$res" = PASS ] || bad+=("$t")
    done
done
echo "summary: $npass pass, $nskip skip, $nfail fail of $ntests; kernel $release$([ "$module" = 0 ] || echo ", vnic_arfs.ko loaded"); ${elapsed}s in the guest run"
if [ ${#bad[@]} -gt 0 ]; then
    keep=1
    echo "expected to pass but did not: ${bad[*]}"
    exit 1
fi
