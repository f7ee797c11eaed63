#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0

"""
Test accelerated RFS (aRFS): with RFS on and the device's ntuple-filters
feature on, the stack calls the driver's ndo_rx_flow_steer() so that the
device delivers a flow's packets to the rx queue whose interrupt serves the
CPU the flow's receiver runs on.

Receivers are threads of this process, each pinned to one CPU; the remote
sends, one flow at a time, and the per-queue rx-packets counters (netlink
qstats, else ethtool -S) must show the flow's packets on the rx queue of its
receiver's CPU. Then a receiver moves to another CPU and back, and its flow
must follow it both times (one of the two moves at least takes the flow off
its RSS queue). Before the flows, each CPU's XPS map is rotated to another
tx queue, so that a device that places TCP flows by the queue their ACKs
leave on (ATR, a tap's automq) does not pass for one that has aRFS.

Which rx queue serves a CPU is read the way the stack builds dev->rx_cpu_rmap
for a driver that reports its NAPIs' IRQs: the IRQ of the rx queue's NAPI
(netdev netlink) and its /proc/irq/N/smp_affinity_list. For a driver that
does not report NAPI IRQs the test assumes combined channels whose rx and tx
queues share one affinity mask, and reads the XPS map of the tx queue with
the rx queue's index (virtio_net sets both from one mask). Only CPUs that are
in exactly one rx queue's mask are used.

A device with ntuple-filters but no ndo_rx_flow_steer (ethtool -N only)
fails: the kernel does not tell user space which of the two it has.
"""

import errno
import gzip
import os
import re
import socket
import threading
import time
from lib.py import ksft_run, ksft_exit, ksft_pr
from lib.py import ksft_ge
from lib.py import EthtoolFamily, NetDrvEpEnv, NetdevFamily, NlError
from lib.py import KsftSkipEx
from lib.py import bkg, defer, ethtool, rand_port

# The sender's pace: one message every SEND_GAP seconds.
SEND_GAP = 0.02
# The longest a flow lasts (it ends when its receiver closes).
SEND_MAX = 60
# The longest wait for the stack to move a flow once its receiver has read
# from it on a new CPU (ndo_rx_flow_steer() and the device's filter update);
# polled, the check follows either way.
STEER_WAIT = 5
# How long each check counts a flow's packets.
WINDOW = 2
# At least this share of a flow's packets must reach the expected queue
# (the rest: the packets counted around the window's edges).
MIN_SHARE = 0.8
# A window in which the receiver got fewer packets than this proves nothing.
MIN_PKTS = 20
# CPUs (flows) tested per protocol, at most.
MAX_FLOWS = 4


def _cpulist(text):
    cpus = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _cpumask(text):
    val = int(text.strip().replace(",", "") or "0", 16)
    return {cpu for cpu in range(val.bit_length()) if val >> cpu & 1}


def _kconfig(name):
    """Value of a kernel config option, None if the config is not readable."""
    release = os.uname().release
    for path in ["/proc/config.gz", f"/boot/config-{release}"]:
        try:
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt") as fp:
                text = fp.read()
        except OSError:
            continue
        m = re.search(rf"^CONFIG_{name}=(\S+)$", text, re.MULTILINE)
        return m.group(1) if m else "n"
    return None


def _write(path, val):
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(str(val))


def _read(path):
    with open(path, encoding="utf-8") as fp:
        return fp.read().strip()


def _set_sysfs(path, val):
    old = _read(path)
    _write(path, val)
    defer(_write, path, old)


def _rx_queues(cfg):
    qdir = f"/sys/class/net/{cfg.ifname}/queues"
    return sorted(int(q[3:]) for q in os.listdir(qdir) if q.startswith("rx-"))


def _queue_cpus_irq(cfg):
    """rx queue -> CPUs of its NAPI's IRQ affinity; None if an IRQ is unknown."""
    napis = cfg.netnl.napi_get({"ifindex": cfg.ifindex}, dump=True)
    irqs = {n["id"]: n.get("irq") for n in napis}
    queues = cfg.netnl.queue_get({"ifindex": cfg.ifindex}, dump=True)
    res = {}
    for q in queues:
        if q["type"] != "rx":
            continue
        irq = irqs.get(q.get("napi-id"))
        if irq is None:
            return None
        res[q["id"]] = _cpulist(_read(f"/proc/irq/{irq}/smp_affinity_list"))
    return res


def _queue_cpus_xps(cfg):
    """rx queue -> CPUs of the XPS map of the tx queue with its index."""
    res = {}
    for qid in _rx_queues(cfg):
        path = f"/sys/class/net/{cfg.ifname}/queues/tx-{qid}/xps_cpus"
        try:
            res[qid] = _cpumask(_read(path))
        except OSError:
            return None
    return res


def _cpu_queues(cfg):
    """CPU -> the one rx queue that serves it, for CPUs this test may use."""
    queue_cpus = _queue_cpus_irq(cfg)
    src = "NAPI IRQ affinity"
    if queue_cpus is None:
        queue_cpus = _queue_cpus_xps(cfg)
        src = "XPS of the paired tx queue"
    if not queue_cpus:
        raise KsftSkipEx("Cannot tell which CPUs each rx queue serves")
    ksft_pr(f"rx queue CPUs ({src}): {queue_cpus}")

    res = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        qids = [qid for qid, cpus in queue_cpus.items() if cpu in cpus]
        if len(qids) == 1:
            res[cpu] = qids[0]
    return res


def _pick_cpus(cpu_queue):
    """One CPU per rx queue, each queue once."""
    picked = {}
    for cpu, qid in cpu_queue.items():
        if qid not in picked.values():
            picked[cpu] = qid
    return dict(list(picked.items())[:MAX_FLOWS])


def _rotate_xps(cfg):
    """Make each CPU transmit on another tx queue than before (XPS maps
       rotated by one queue, restored by defer), so not on the queue aRFS
       should pick for it: a device that places a TCP flow's packets by the
       queue its ACKs leave on (Intel's ATR, a tap's automq) then fails
       instead of passing for aRFS."""
    qdir = f"/sys/class/net/{cfg.ifname}/queues"
    txqs = sorted(int(q[3:]) for q in os.listdir(qdir) if q.startswith("tx-"))
    try:
        masks = [_read(f"{qdir}/tx-{q}/xps_cpus") for q in txqs]
        for i, q in enumerate(txqs):
            _set_sysfs(f"{qdir}/tx-{q}/xps_cpus", masks[(i + 1) % len(txqs)])
    except OSError as e:
        ksft_pr(f"XPS not rotated ({e}): TCP cases may pass on tx learning")


def _setup_arfs(cfg):
    """Turn on RFS and ntuple-filters (restored by defer), map CPUs to
       rx queues; skip where the device or the kernel has no aRFS."""
    cfg.require_cmd("socat", local=False, remote=True)
    sock_flow = "/proc/sys/net/core/rps_sock_flow_entries"
    if not os.path.exists(sock_flow):
        raise KsftSkipEx("Kernel has no RFS (CONFIG_RPS)")
    if _kconfig("RFS_ACCEL") not in (None, "y"):
        raise KsftSkipEx("Kernel has no aRFS (CONFIG_RFS_ACCEL)")

    features = ethtool(f"-k {cfg.ifname}", json=True)[0]
    if not features["ntuple-filters"]["active"]:
        if features["ntuple-filters"]["fixed"]:
            raise KsftSkipEx("Device does not support ntuple-filters")
        ethtool(f"-K {cfg.ifname} ntuple-filters on")
        defer(ethtool, f"-K {cfg.ifname} ntuple-filters off")

    qids = _rx_queues(cfg)
    if len(qids) < 2:
        raise KsftSkipEx(f"Need at least 2 rx queues, have {len(qids)}")

    _set_sysfs(sock_flow, 32768)
    for qid in qids:
        _set_sysfs(f"/sys/class/net/{cfg.ifname}/queues/rx-{qid}/rps_flow_cnt",
                   2048)

    cpus = _pick_cpus(_cpu_queues(cfg))
    if len(cpus) < 2:
        raise KsftSkipEx("Need 2 CPUs that each map to one rx queue, "
                         "and not the same one")
    _rotate_xps(cfg)
    return cpus


def _rx_packets(cfg):
    """rx-packets of each rx queue: netlink qstats, else ethtool -S."""
    try:
        stats = cfg.netnl.qstats_get({"ifindex": cfg.ifindex,
                                      "scope": ["queue"]}, dump=True)
    except NlError as e:
        if e.nl_msg.error != -errno.EOPNOTSUPP:
            raise
        stats = []
    res = {q["queue-id"]: q["rx-packets"] for q in stats
           if q["queue-type"] == "rx" and "rx-packets" in q}
    if res:
        return res

    # Per-queue names of some drivers: virtio_net, ice (rx_queue_N_packets),
    # i40e (rx-N.packets), mlx5 (rxN_packets), bnxt ([N]: rx_ucast_packets).
    pats = [r"rx_queue_(\d+)_packets", r"rx-(\d+)\.packets",
            r"rx(\d+)_packets", r"\[(\d+)\]: rx_ucast_packets"]
    out = ethtool(f"-S {cfg.ifname}").stdout
    for pat in pats:
        res = {int(m.group(1)): int(m.group(2)) for m in
               re.finditer(rf"^\s*{pat}: (\d+)$", out, re.MULTILINE)}
        if res:
            return res
    raise KsftSkipEx("Device reports no per-queue rx-packets")


def _settle(cfg):
    """Wait for the device's stats to be current (wait_hw_stats_settle(),
       through ethtool netlink: an older ethtool has no --json -c)."""
    if cfg.settle is None:
        try:
            coal = cfg.ethnl.coalesce_get({"header": {"dev-index": cfg.ifindex}})
        except NlError:
            coal = {}
        cfg.settle = 1.25 * coal.get("stats-block-usecs", 20000) / 1000000
    time.sleep(cfg.settle)


def _count(cfg, rcv, secs=WINDOW):
    """Count @rcv's flow for @secs: (packets the receiver read, per-queue
       rx-packets deltas); the counters' window holds the receiver's."""
    before = _rx_packets(cfg)
    got = rcv.pkts
    time.sleep(secs)
    got = rcv.pkts - got
    _settle(cfg)
    after = _rx_packets(cfg)
    return got, {q: after[q] - before.get(q, 0) for q in after}


class _Receiver(threading.Thread):
    """A TCP or UDP receiver pinned to one CPU, counting what it reads."""

    def __init__(self, cfg, proto, cpu):
        super().__init__(daemon=True)
        self.cpu = cpu
        self.proto = proto
        self.pkts = 0
        self.port = rand_port()
        self.sport = rand_port()
        self._done = threading.Event()
        self._ready = threading.Event()

        fam = socket.AF_INET6 if cfg.addr_ipver == "6" else socket.AF_INET
        styp = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        self.sock = socket.socket(fam, styp)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((cfg.addr, self.port))
        if proto == "tcp":
            self.sock.listen(1)
        else:
            # RFS records the flows of connected sockets only
            self.sock.connect((cfg.remote_addr, self.sport))
        self.sock.settimeout(0.2)

    def run(self):
        """Pin to the CPU, then count reads until stopped."""
        os.sched_setaffinity(0, {self.cpu})
        self._ready.set()
        sock = self.sock
        if self.proto == "tcp":
            while not self._done.is_set():
                try:
                    sock, _ = self.sock.accept()
                    sock.settimeout(0.2)
                    break
                except TimeoutError:
                    pass
        while not self._done.is_set():
            try:
                # one read is at most one packet: a lower bound for TCP
                if sock.recv(65536):
                    self.pkts += 1
                elif self.proto == "tcp":
                    break
            except TimeoutError:
                pass
        if sock is not self.sock:
            sock.close()

    def start(self):
        """Start the thread, return once it is pinned."""
        super().start()
        self._ready.wait()

    def move(self, cpu):
        """Pin the receiver to another CPU."""
        self.cpu = cpu
        os.sched_setaffinity(self.native_id, {cpu})

    def stop(self):
        """Stop reading, close the sockets (which ends the remote's flow)."""
        self._done.set()
        self.join()
        self.sock.close()


def _sender(cfg, rcv):
    """The remote's flow to @rcv, as a bkg() context. It ends when @rcv
       stops (socat fails on the reset or port unreachable), at the latest
       after SEND_MAX seconds."""
    cnt = int(SEND_MAX / SEND_GAP)
    if rcv.proto == "tcp":
        dst = f"TCP:{cfg.baddr}:{rcv.port},nodelay"
    else:
        dst = f"UDP:{cfg.baddr}:{rcv.port},sourceport={rcv.sport}"
    send = (f"for i in $(seq {cnt}); do echo msg; sleep {SEND_GAP}; done | "
            f"socat -{cfg.addr_ipver} -u - {dst}")
    return bkg(send, host=cfg.remote, exit_wait=True, fail=False)


def _wait_first(rcv, deadline=10):
    end = time.monotonic() + deadline
    while not rcv.pkts and time.monotonic() < end:
        time.sleep(0.05)
    if not rcv.pkts:
        raise TimeoutError(f"{rcv.proto} receiver on CPU {rcv.cpu} got nothing"
                           f" from the remote in {deadline} s")


def _wait_steered(cfg, rcv, qid):
    """Wait (STEER_WAIT at most) until @rcv's flow arrives on @qid."""
    end = time.monotonic() + STEER_WAIT
    while time.monotonic() < end:
        pkts, cnts = _count(cfg, rcv, 0.5)
        if pkts and cnts.get(qid, 0) >= pkts * MIN_SHARE:
            return


def _check_queue(cfg, rcv, qid):
    """@rcv's flow arrives on rx queue @qid."""
    pkts, cnts = _count(cfg, rcv)
    what = f"{rcv.proto} flow, receiver on CPU {rcv.cpu}, rx queue {qid}"
    ksft_pr(f"{what}: receiver read {pkts}, per-queue rx-packets {cnts}")
    ksft_ge(pkts, MIN_PKTS, f"{what}: too few packets to judge")
    ksft_ge(cnts.get(qid, 0), int(pkts * MIN_SHARE),
            f"{what}: the flow is not on its CPU's queue {cnts}")


def _run_flow(cfg, proto, path):
    """One flow from the remote, its receiver on each (CPU, rx queue) of
       @path in turn: the flow must arrive on that queue each time."""
    rcv = _Receiver(cfg, proto, path[0][0])
    rcv.start()
    with _sender(cfg, rcv):
        try:
            _wait_first(rcv)
            for cpu, qid in path:
                rcv.move(cpu)
                _wait_steered(cfg, rcv, qid)
                _check_queue(cfg, rcv, qid)
        finally:
            rcv.stop()


def _flows(cfg, proto):
    for cpu, qid in _setup_arfs(cfg).items():
        _run_flow(cfg, proto, [(cpu, qid)])


def _follow(cfg, proto):
    cpus = _setup_arfs(cfg)
    cpu_a, cpu_b, *_ = cpus
    # there and back: at least one of the two moves takes the flow off its
    # RSS queue, whichever that is
    _run_flow(cfg, proto, [(cpu_a, cpus[cpu_a]), (cpu_b, cpus[cpu_b]),
                           (cpu_a, cpus[cpu_a])])


def tcp_flows(cfg):
    """Each TCP flow arrives on the rx queue of its receiver's CPU."""
    _flows(cfg, "tcp")


def udp_flows(cfg):
    """Each connected UDP flow arrives on the rx queue of its receiver's CPU."""
    _flows(cfg, "udp")


def tcp_follow(cfg):
    """A TCP flow follows its receiver to another CPU's rx queue and back."""
    _follow(cfg, "tcp")


def udp_follow(cfg):
    """A connected UDP flow follows its receiver to another CPU and back."""
    _follow(cfg, "udp")


def main() -> None:
    """Ksft boilerplate main."""

    with NetDrvEpEnv(__file__, nsim_test=False) as cfg:
        cfg.ethnl = EthtoolFamily()
        cfg.netnl = NetdevFamily()
        cfg.settle = None
        ksft_run([tcp_flows, udp_flows, tcp_follow, udp_follow], args=(cfg,))
    ksft_exit()


if __name__ == "__main__":
    main()
