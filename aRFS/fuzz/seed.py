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
}
for name, f in valid.items():
    write("decode_frame", f"valid-{name}", f)
# table_ops: knob byte, then length-prefixed frames
ops = bytes([0x35])
for name in ["add2", "del2", "add2", "flush", "add2"]:
    f = valid[name]
    ops += bytes([len(f)]) + f
write("table_ops", "seq1", ops)

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
print("seeds written to", os.path.join(here, "corpus"))
