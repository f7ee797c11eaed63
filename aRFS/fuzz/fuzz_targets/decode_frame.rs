//! Management codec: decoding arbitrary frames on both sides never panics,
//! every accepted frame re-encodes to the same bytes, every error names a
//! field, and the NAK decision is consistent with PROTOCOL.md.
#![no_main]

use arfs::proto::{decode, encode, encode_nak, Direction, FrameMeta};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for dir in [Direction::ToDevice, Direction::ToDriver] {
        match decode(data, dir, u16::MAX) {
            Ok((h, m)) => {
                let mut out = Vec::new();
                let mut meta = FrameMeta { dst: [0; 6], src: [0; 6], seq: h.seq, generation: h.generation };
                meta.dst.copy_from_slice(&data[0..6]);
                meta.src.copy_from_slice(&data[6..12]);
                encode(&mut out, &meta, &m).expect("a decoded message encodes");
                assert_eq!(&out[..], &data[..out.len()], "codec is canonical");
                assert_eq!(m.msg_type().direction(), dir);
            }
            Err(e) => {
                assert!(!e.field.is_empty());
                let mut out = Vec::new();
                let sent = encode_nak(&mut out, [2; 6], 1, &e).expect("NAK encodes");
                assert_eq!(sent, !e.kind.is_silent() && e.header.is_some());
            }
        }
    }
});
