//! Filter table: arbitrary device-side request frames applied to a small
//! table never panic and keep the invariants (size <= capacity, the index and
//! the entries agree, a replica fed the events equals the table).
#![no_main]

use arfs::proto::{decode_frame, Message};
use arfs::{FilterTable, FlowIndex, Request, TableConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, mut rest)) = data.split_first() else { return };
    let cfg = TableConfig {
        capacity: u32::from(knobs & 0x0f) + 1,
        buckets: (knobs & 0x30 != 0).then_some((u32::from((knobs >> 4) & 3) + 1, 2)),
        latency_ns: u64::from(knobs >> 6) * 100,
        ..TableConfig::default()
    };
    let mut t = FilterTable::new(cfg.clone()).expect("valid config");
    let mut replica = FlowIndex::new(cfg.capacity as usize);
    let mut now = 0u64;
    let mut seq = 0u32;
    // frames are length-prefixed by one byte
    while let Some((&len, tail)) = rest.split_first() {
        let n = usize::from(len).min(tail.len());
        let (frame, next) = tail.split_at(n);
        rest = next;
        now += 150;
        if let Ok((_, msg)) = decode_frame(frame) {
            let req = match msg {
                Message::Add(ops) => Request::Add(ops),
                Message::Del(ops) => Request::Del(ops),
                Message::Flush(r) => Request::Flush(r),
                _ => continue,
            };
            seq += 1;
            t.submit(now, seq, req);
        }
        t.advance(now, 3, &mut |e| {
            replica.apply(&e);
        });
        assert!(t.len() <= cfg.capacity as usize);
        assert_eq!(replica.len(), t.len());
        for e in t.entries() {
            assert_eq!(t.lookup(&e.flow), Some((e.id, e.rxq)));
            assert_eq!(replica.lookup(&e.flow), Some((e.id, e.rxq)));
            assert!(e.rxq < 3);
        }
    }
});
