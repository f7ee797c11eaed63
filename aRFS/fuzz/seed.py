#!/usr/bin/env python3
"""Writes seed inputs for the fuzz targets into corpus/<target>/ (git-ignored):
the malformed-frame corpus of the tests plus valid frames of every kind."""
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "corpus"))
import io, contextlib  # noqa: E401
with contextlib.redirect_stdout(io.StringIO()):
    import gen_malformed as g  # noqa: E402


def write(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


for i, c in enumerate(g.cases):
    write("decode_frame", f"malformed-{i:03}", bytes.fromhex(c[5]))
valid = {
    "hello": g.frame(1, 0, g.HELLO),
    "caps": g.frame(2, 0, g.CAPS),
    "add2": g.frame(3, 2, g.add_op() + g.add_op(id=2, family=6, proto=17, src=bytes(range(16)), dst=bytes(range(16, 32)))),
    "del2": g.frame(4, 2, g.del_op() + g.del_op(id=2, reason=5)),
    "flush": g.frame(5, 0, b"\x04\0\0\0"),
    "ack": g.frame(6, 2, b"\x03\0\0\0\0\x02"),
    "caps32": g.frame(2, 0, g.CAPS32),
    "rss_set": g.frame(9, 1, g.rss_op()),
    "rss_set-defaults": g.frame(9, 1, g.rss_op(flags=3, key=bytes(40), table=[0] * 128)),
}
for name, f in valid.items():
    write("decode_frame", f"valid-{name}", f)
# table_ops: knob byte, then length-prefixed frames
ops = bytes([0x35])
for name in ["add2", "del2", "add2", "flush", "add2"]:
    f = valid[name]
    ops += bytes([len(f)]) + f
write("table_ops", "seq1", ops)
# more table_ops sequences: every knob shape (capacity 1..16, buckets,
# latency), filters filling the table, replacing (same flow, new id),
# moving (same id, new rxq), an rxq out of range, unknown deletes, flushes
adds = [g.frame(3, 1, g.add_op(id=i, rxq=i % 4, sport=1000 + i)) for i in range(1, 20)]
same_flow = g.frame(3, 1, g.add_op(id=40, rxq=1, sport=1001))
move = g.frame(3, 1, g.add_op(id=1, rxq=2, sport=1001))
dels = [g.frame(4, 1, g.del_op(id=i, reason=1 + i % 5)) for i in range(1, 20, 3)]
unknown_del = g.frame(4, 1, g.del_op(id=999))
v6 = g.frame(3, 1, g.add_op(id=77, family=6, proto=17, src=bytes(range(16)), dst=bytes(range(16, 32))))
seqs = {
    "fill": adds,
    "fill-replace-move": adds[:8] + [same_flow, move, unknown_del, v6] + dels,
    "churn": [x for pair in zip(adds, dels + adds) for x in pair] + [valid["flush"]] + adds[:4],
}
for knob in [0x00, 0x0f, 0x13, 0x35, 0x7f, 0xc3, 0xff]:
    for name, frames in seqs.items():
        data = bytes([knob])
        for f in frames:
            data += bytes([len(f)]) + f
        write("table_ops", f"{name}-knobs{knob:02x}", data)

eth = lambda et, p: bytes(6 * [0xff]) + bytes(6) + struct.pack(">H", et) + p  # noqa: E731
tcp = struct.pack(">HHIIBBHHH", 5000, 80, 0, 0, 0x50, 0x10, 0, 0, 0)
udp = struct.pack(">HHHH", 53, 9999, 8, 0)
ip4 = lambda proto, l4, frag=0: struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), 0, frag, 64, proto, 0, bytes([10, 0, 0, 2]), bytes([10, 0, 0, 1])) + l4  # noqa: E731
ip6 = lambda nh, pl: struct.pack(">IHBB16s16s", 0x60000000, len(pl), nh, 64, bytes(15) + b"\1", bytes(15) + b"\2") + pl  # noqa: E731
write("parse_frame", "v4-tcp", eth(0x0800, ip4(6, tcp)))
write("parse_frame", "v4-udp-frag", eth(0x0800, ip4(17, udp, 0x2000)))
write("parse_frame", "vlan-v4-udp", bytes(12) + b"\x81\x00\x00\x05" + b"\x08\x00" + ip4(17, udp))
write("parse_frame", "v6-hbh-udp", eth(0x86DD, ip6(0, bytes([17, 0]) + bytes(6) + udp)))
write("parse_frame", "v6-frag", eth(0x86DD, ip6(44, bytes([6, 0, 0, 1]) + bytes(4) + tcp)))
write("parse_frame", "arp", eth(0x0806, bytes(28)))

# ctl_request: control-socket request lines (vnic/CTL.md), one per file,
# and a few lines together as a client sends them.
ctl = [
    '{"cmd":"stats"}', '{"cmd":"table"}', '{"cmd":"knobs"}', '{"cmd":"trace_flush"}',
    '{"cmd":"set","key":"add_fail_rate","value":0.25}',
    '{"cmd":"set","key":"mgmt_loss_rate","value":"0.1"}',
    '{"cmd":"set","key":"program_latency","value":"250us"}',
    '{"cmd":"set","key":"misroute","value":"on"}',
    '{"cmd":"gen","op":"list"}', '{"cmd":"gen","op":"stop"}', '{"cmd":"gen","op":"stop","id":3}',
    '{"cmd":"gen","op":"start","flow":{"flows":100,"sport":"10000-10099","rate":5000}}',
    '{"cmd":"gen","op":"start","flow":{"flows":4,"src":"10.0.3.1-10.0.3.4","dport":"5001-5002","count":10,"size":128}}',
    '{"cmd":"gen","op":"start","flow":{"flows":2,"src":"fd00:2::1-fd00:2::2","dst":"fd00:2::15","stamp":true,"size":200}}',
    '{"cmd":"gen","op":"set","id":1,"flow":{"rate":0}}',
    '{"cmd":"nope"}', '{"cmd":"set","key":"x"}', '{"cmd":"gen","op":"start","flow":{"flows":0}}',
]
for i, line in enumerate(ctl):
    write("ctl_request", f"line-{i:02}", line.encode())
write("ctl_request", "session", "\n".join(ctl[:6] + ctl[11:13]).encode() + b"\n")

# agent_request: the guest agent's request lines (guest-tests/agent/src/proto.rs)
# and a few replies.
agent = [
    '{"id":1,"cmd":"hello"}',
    '{"id":2,"cmd":"net_setup","ifname":"eth0","addr":"10.0.2.15","prefix":24,"addr6":"fd00:2::15","prefix6":64}',
    '{"id":3,"cmd":"write_file","path":"/proc/sys/net/core/rps_sock_flow_entries","value":"32768"}',
    '{"id":4,"cmd":"read_file","path":"/proc/interrupts"}',
    '{"id":5,"cmd":"read_dir","path":"/sys/kernel/debug/vnic_arfs"}',
    '{"id":6,"cmd":"rfs","ifname":"eth0","sock_flow_entries":32768,"flow_cnt":256,"rps_cpus":"f"}',
    '{"id":7,"cmd":"set_feature","ifname":"eth0","feature":"rx-ntuple-filter","on":true}',
    '{"id":8,"cmd":"set_channels","ifname":"eth0","combined":4}',
    '{"id":9,"cmd":"rx_queue_napi","ifname":"eth0"}',
    '{"id":10,"cmd":"module_load","path":"/vnic_arfs.ko","params":"debug=1"}',
    '{"id":11,"cmd":"module_unload","name":"vnic_arfs"}',
    '{"id":12,"cmd":"probed_unload","name":"vnic_arfs","ifname":"eth0","every_ms":5,"toggle_ntuple":true}',
    '{"id":13,"cmd":"ping","addr":"10.0.2.1","count":3,"timeout_ms":1000}',
    '{"id":14,"cmd":"udp_start","peer":"10.0.2.1","flows":[{"local_port":5001,"peer_port":10000,"cpu":0},{"local_port":5002,"peer_port":10001,"cpu":1,"peer":"fd00:2::1"}],"echo":true,"echo_every":4}',
    '{"id":15,"cmd":"udp_migrate","moves":[[0,1],[1,0]]}',
    '{"id":16,"cmd":"udp_stats"}', '{"id":17,"cmd":"udp_stop"}',
    '{"id":18,"cmd":"tcp_start","port":5201,"cpus":[0,1,2,3],"echo":true}',
    '{"id":19,"cmd":"tcp_stats"}', '{"id":20,"cmd":"tcp_stop"}', '{"id":21,"cmd":"dmesg","since":10}',
    '{"id":22,"cmd":"exec","argv":["ip","-s","link"],"timeout_ms":2000}',
    '{"id":23,"cmd":"raw_tx_start","ifname":"eth0","frames":["ffffffffffff0000000000'
    '0188b5"],"rounds":2,"pps":100,"cpu":1,"capture_ethertype":35001,"linger_ms":50}',
    '{"id":24,"cmd":"raw_tx_wait","timeout_ms":500}', '{"id":25,"cmd":"sleep","ms":10}',
    '{"id":26,"cmd":"poweroff"}',
    '{"id":27,"result":{"protocol":1}}', '{"id":28,"error":"bad request"}',
]
for i, line in enumerate(agent):
    write("agent_request", f"line-{i:02}", line.encode())
write("agent_request", "session", "\n".join(agent[:5]).encode() + b"\n")
print("seeds written to", os.path.join(here, "corpus"))
