//! Frame parser: arbitrary Ethernet frames never panic; a parsed flow hashes
//! and steers without panicking and its key survives a serde-free round trip.
#![no_main]

use arfs::{parse_frame, FlowKey, Rss, L3};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let rss = Rss::new(4);
    if let Ok(p) = parse_frame(data) {
        assert!(p.l3_offset <= data.len());
        let q = rss.queue_for(&p);
        assert!(q < 4);
        if let L3::Flow(k) = p.l3 {
            let back = FlowKey::from_raw(k.family(), k.proto(), *k.src_bytes(), k.src_port(), *k.dst_bytes(), k.dst_port());
            assert_eq!(back, Some(k));
            assert_eq!(rss.queue_for_key(&k), q);
        }
    }
});
