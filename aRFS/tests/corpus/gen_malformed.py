#!/usr/bin/env python3
"""Regenerates malformed.txt, the corpus of malformed management frames.

Each line: side, expected error name, field, op index (- for none), name, hex.
Run: python3 aRFS/tests/corpus/gen_malformed.py > aRFS/tests/corpus/malformed.txt
"""
import struct

SEQ = 0x01020304
DST = bytes([0xff] * 6)
SRC = bytes([0x52, 0x54, 0x00, 0x12, 0x34, 0x56])


def frame(typ, count, body, body_len=None, magic=0x7641, version=1, ethertype=0x88B5, gen=9):
    if body_len is None:
        body_len = len(body)
    hdr = struct.pack(">HBBIIHH", magic, version, typ, SEQ, gen, count, body_len)
    return DST + SRC + struct.pack(">H", ethertype) + hdr + body


def add_op(id=1, rxq=0, family=4, proto=6, sport=1, dport=2, reserved=0, src=None, dst=None):
    src = src or bytes([10, 0, 0, 2] + [0] * 12)
    dst = dst or bytes([10, 0, 0, 1] + [0] * 12)
    return struct.pack(">HHBBHHH", id, rxq, family, proto, sport, dport, reserved) + src + dst


def del_op(id=1, reason=1, reserved=0):
    return struct.pack(">HBB", id, reason, reserved)


def rss_op(context=0, flags=0, hfunc=1, reserved=0, key=None, table=None):
    key = key if key is not None else bytes(range(40))
    table = table if table is not None else [i % 4 for i in range(128)]
    return struct.pack(">IBBH", context, flags, hfunc, reserved) + key + struct.pack(">128H", *table)


HELLO = struct.pack(">II", 1, 0) + SRC + b"\0\0"
CAPS = struct.pack(">HHIIHHII", 4, 4, 1024, 0, 0, 33, 0, 0)
CAPS32 = CAPS + struct.pack(">IHH", 3, 128, 0)

cases = []


def case(side, err, field, op, name, f):
    cases.append((side, err, field, "-" if op is None else str(op), name, f.hex()))


# silent errors (no reply)
case("device", "too_short", "frame", None, "empty frame", b"")
case("device", "too_short", "frame", None, "ethernet header only", frame(1, 0, HELLO)[:14])
case("device", "too_short", "frame", None, "header cut at 29 bytes", frame(1, 0, HELLO)[:29])
case("device", "too_short", "body", None, "hello body cut", frame(1, 0, HELLO)[:40])
case("device", "too_short", "body", None, "add body cut by one byte", frame(3, 2, add_op() + add_op(id=2))[:-1])
case("device", "bad_magic", "ethertype", None, "ipv4 ethertype", frame(1, 0, HELLO, ethertype=0x0800))
case("device", "bad_magic", "magic", None, "magic 0x4176 (byte-swapped)", frame(1, 0, HELLO, magic=0x4176))
case("device", "bad_magic", "magic", None, "magic zero", frame(3, 1, add_op(), magic=0))
case("device", "bad_version", "version", None, "version 2", frame(1, 0, HELLO, version=2))
case("device", "bad_version", "version", None, "version 0", frame(3, 1, add_op(), version=0))
# NAKed errors
case("device", "unknown_type", "type", None, "type 0", frame(0, 0, b""))
case("device", "unknown_type", "type", None, "type 10", frame(10, 0, b""))
case("device", "unknown_type", "type", None, "type 255", frame(255, 1, add_op()))
case("device", "wrong_direction", "type", None, "caps sent to the device", frame(2, 0, CAPS))
case("device", "wrong_direction", "type", None, "ack sent to the device", frame(6, 0, b"\x03\0\0\0"))
case("driver", "wrong_direction", "type", None, "hello sent to the driver", frame(1, 0, HELLO))
case("driver", "wrong_direction", "type", None, "add sent to the driver", frame(3, 1, add_op()))
case("device", "bad_count", "count", None, "hello with count 1", frame(1, 1, HELLO))
case("device", "bad_count", "count", None, "flush with count 2", frame(5, 2, b"\x04\0\0\0"))
case("device", "bad_count", "count", None, "add with count 0", frame(3, 0, b""))
case("device", "bad_count", "count", None, "del with count 0", frame(4, 0, b""))
case("driver", "bad_count", "count", None, "caps with count 1", frame(2, 1, CAPS))
case("device", "bad_count", "count", None, "rss_set with count 0", frame(9, 0, rss_op()))
case("device", "bad_count", "count", None, "rss_set with count 0 and no body", frame(9, 0, b""))
case("device", "too_many_ops", "count", None, "rss_set with count 2", frame(9, 2, rss_op() * 2))
case("device", "too_many_ops", "count", None, "rss_set with count 2 and one op", frame(9, 2, rss_op()))
case("driver", "wrong_direction", "type", None, "rss_set sent to the driver", frame(9, 1, rss_op()))
case("device", "too_many_ops", "count", None, "add with 34 ops", frame(3, 34, add_op() * 34))
case("device", "too_many_ops", "count", None, "add count 34 without body", frame(3, 34, b""))
case("device", "too_many_ops", "count", None, "del with 34 ops (default max_ops 33)", frame(4, 34, del_op() * 34))
case("device", "too_many_ops", "count", None, "del with 372 ops", frame(4, 372, del_op() * 372))
case("driver", "too_many_ops", "count", None, "ack with 372 statuses", frame(6, 372, b"\x04\0\0\0" + b"\0" * 372))
case("device", "bad_length", "body_len", None, "hello body_len 15", frame(1, 0, HELLO, body_len=15))
case("device", "bad_length", "body_len", None, "hello body_len 17", frame(1, 0, HELLO + b"\0", body_len=17))
case("device", "bad_length", "body_len", None, "add 2 ops body_len 44", frame(3, 2, add_op() + add_op(id=2), body_len=44))
case("device", "bad_length", "body_len", None, "del 1 op body_len 8", frame(4, 1, del_op() * 2, body_len=8))
case("device", "bad_length", "body_len", None, "flush body_len 0", frame(5, 0, b"", body_len=0))
case("device", "bad_length", "body_len", None, "body_len 65535", frame(5, 0, b"\x04\0\0\0", body_len=65535))
case("driver", "bad_length", "body_len", None, "ack 2 statuses body_len 5", frame(6, 2, b"\x03\0\0\0\0\0", body_len=5))
case("driver", "bad_length", "body_len", None, "caps body_len 20", frame(2, 0, CAPS[:20]))
case("driver", "bad_length", "body_len", None, "caps body_len 28", frame(2, 0, CAPS32[:28]))
case("device", "bad_length", "body_len", None, "rss_set body_len 303", frame(9, 1, rss_op()[:303]))
case("device", "bad_length", "body_len", None, "rss_set body_len 305", frame(9, 1, rss_op() + b"\0"))
case("device", "bad_length", "body_len", None, "rss_set body_len 88 (a rule op)", frame(9, 1, bytes(88)))
case("device", "too_short", "body", None, "rss_set body cut by one byte", frame(9, 1, rss_op())[:-1])
case("device", "bad_reason", "ops[].reason", 0, "del reason 0", frame(4, 1, del_op(reason=0)))
case("device", "bad_reason", "ops[].reason", 2, "del reason 7 in op 2", frame(4, 3, del_op() + del_op(id=2) + del_op(id=3, reason=7)))
case("device", "bad_reason", "reason", None, "flush reason 0", frame(5, 0, b"\0\0\0\0"))
case("device", "bad_reason", "reason", None, "flush reason 255", frame(5, 0, b"\xff\0\0\0"))
case("device", "reserved_nonzero", "reserved", None, "hello trailing reserved", frame(1, 0, struct.pack(">II", 1, 0) + SRC + b"\0\x01"))
case("device", "reserved_nonzero", "ops[].reserved", 1, "add op 1 reserved", frame(3, 2, add_op() + add_op(id=2, reserved=0x100)))
case("device", "reserved_nonzero", "ops[].reserved", 0, "del op reserved", frame(4, 1, del_op(reserved=1)))
case("device", "reserved_nonzero", "reserved", None, "flush reserved byte 3", frame(5, 0, b"\x04\0\0\x01"))
case("driver", "reserved_nonzero", "reserved", None, "ack reserved", frame(6, 1, b"\x03\0\x01\0\0"))
case("driver", "reserved_nonzero", "features", None, "caps features 2 (rss without rules)", frame(2, 0, CAPS + struct.pack(">IHH", 2, 128, 0)))
case("driver", "reserved_nonzero", "features", None, "caps features 7", frame(2, 0, CAPS + struct.pack(">IHH", 7, 128, 0)))
case("driver", "reserved_nonzero", "features", None, "caps features 0", frame(2, 0, CAPS + struct.pack(">IHH", 0, 128, 0)))
case("driver", "reserved_nonzero", "reserved", None, "caps32 reserved", frame(2, 0, CAPS + struct.pack(">IHH", 3, 128, 1)))
case("device", "reserved_nonzero", "ops[].flags", 0, "rss_set flag bit 2", frame(9, 1, rss_op(flags=4)))
case("device", "reserved_nonzero", "ops[].flags", 0, "rss_set flag bit 7 with both defaults", frame(9, 1, rss_op(flags=0x83, key=bytes(40), table=[0] * 128)))
case("device", "reserved_nonzero", "ops[].flags", 0, "rss_set flags before reserved", frame(9, 1, rss_op(flags=8, reserved=1)))
case("device", "reserved_nonzero", "ops[].reserved", 0, "rss_set reserved byte 7", frame(9, 1, rss_op(reserved=1)))
case("device", "reserved_nonzero", "ops[].reserved", 0, "rss_set reserved byte 6", frame(9, 1, rss_op(reserved=0x100)))

print("# Malformed management frames: the decoder must return exactly this error.")
print("# Generated by gen_malformed.py (same directory); all frames use seq 0x01020304.")
print("# side\terror\tfield\top\tname\thex")
for c in cases:
    print("\t".join(c))
