//! cargo-fuzz entry point; the body is arfs_fuzz::decode_frame (aRFS/fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| arfs_fuzz::decode_frame(data));
