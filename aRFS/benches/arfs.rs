//! Criterion benchmarks of the packet-path and management-path primitives.
//!
//! Run: `cargo bench -p arfs -- --warm-up-time 1 --measurement-time 3`
//!
//! The clock is the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`)
//! by default, so time the thread spends descheduled on a shared, loaded
//! machine is not counted (cache pollution by other processes still is).
//! `ARFS_BENCH_CLOCK=wall` switches to criterion's wall clock.
//!
//! Lookup benches cycle through a shuffled array of keys, one lookup per
//! iteration; iterations are independent, so the figure is the per-lookup
//! cost in a stream of packets (cache misses of consecutive lookups overlap),
//! which is what a worker thread steering a burst of packets pays.

// Criterion idiom (c, g, b) plus short locals in setup code.
#![allow(clippy::many_single_char_names)]

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

use arfs::proto::{AddOp, DelOp, DelReason};
use arfs::rng::SplitMix64;
use arfs::{
    parse_frame, FilterTable, FlowIndex, FlowKey, L4Proto, Request, Rss, TableConfig, Toeplitz,
};
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput};

/// Criterion measurement: CPU time consumed by the calling thread.
struct ThreadCpu;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the
    // call, and CLOCK_THREAD_CPUTIME_ID is supported on Linux; the call
    // writes only into `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns() - start
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &NsFormatter
    }
}

/// Formats nanosecond values (criterion's own formatter is private).
struct NsFormatter;

impl ValueFormatter for NsFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = if typical < 1e3 {
            (1.0, "ns")
        } else if typical < 1e6 {
            (1e-3, "µs")
        } else if typical < 1e9 {
            (1e-6, "ms")
        } else {
            (1e-9, "s")
        };
        for v in values {
            *v *= factor;
        }
        unit
    }

    fn scale_throughputs(
        &self,
        typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let n = match *throughput {
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) | Throughput::Elements(n) => {
                n as f64
            }
        };
        let per_sec = n * 1e9 / typical;
        let (div, unit) = if per_sec < 1e3 {
            (1.0, " elem/s")
        } else if per_sec < 1e6 {
            (1e3, "Kelem/s")
        } else if per_sec < 1e9 {
            (1e6, "Melem/s")
        } else {
            (1e9, "Gelem/s")
        };
        for v in values {
            *v = n * 1e9 / *v / div;
        }
        unit
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn key(rng: &mut SplitMix64) -> FlowKey {
    let x = rng.next_u64();
    FlowKey::v4(
        L4Proto::Udp,
        Ipv4Addr::from((x >> 32) as u32),
        (x >> 16) as u16,
        Ipv4Addr::new(10, 0, 0, 1),
        x as u16,
    )
}

fn keys(n: usize, seed: u64) -> Vec<FlowKey> {
    let mut rng = SplitMix64::new(seed);
    let mut v: Vec<FlowKey> = (0..n).map(|_| key(&mut rng)).collect();
    v.sort_unstable();
    v.dedup();
    // shuffle (Fisher-Yates) so the access order is unrelated to insertion
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

fn bench_lookup<M: Measurement>(c: &mut Criterion<M>) {
    let mut g = c.benchmark_group("lookup");
    g.throughput(Throughput::Elements(1));
    for &n in &[1_000usize, 65_535] {
        let ks = keys(n, 1);
        let mut ix = FlowIndex::new(n);
        for (i, k) in ks.iter().enumerate() {
            ix.insert(*k, i as u16, (i % 4) as u16).unwrap();
        }
        let misses = keys(n, 2);
        let mut i = 0usize;
        g.bench_function(BenchmarkId::new("hit", n), |b| {
            b.iter(|| {
                i += 1;
                if i == ks.len() {
                    i = 0;
                }
                black_box(ix.lookup(black_box(&ks[i])))
            });
        });
        let mut i = 0usize;
        g.bench_function(BenchmarkId::new("miss", n), |b| {
            b.iter(|| {
                i += 1;
                if i == misses.len() {
                    i = 0;
                }
                black_box(ix.lookup(black_box(&misses[i])))
            });
        });
    }
    // 1M: beyond the protocol's 16-bit id space, so the same index code with u32 ids.
    let n = 1_000_000usize;
    let ks = keys(n, 3);
    let mut ix = FlowIndex::with_id_space(n, n as u32);
    for (i, k) in ks.iter().enumerate() {
        ix.insert(*k, i as u32, (i % 4) as u16).unwrap();
    }
    let misses = keys(n, 4);
    let mut i = 0usize;
    g.bench_function(BenchmarkId::new("hit", n), |b| {
        b.iter(|| {
            i += 1;
            if i == ks.len() {
                i = 0;
            }
            black_box(ix.lookup(black_box(&ks[i])))
        });
    });
    let mut i = 0usize;
    g.bench_function(BenchmarkId::new("miss", n), |b| {
        b.iter(|| {
            i += 1;
            if i == misses.len() {
                i = 0;
            }
            black_box(ix.lookup(black_box(&misses[i])))
        });
    });
    // The same 1M table looked up in bursts of 32 (a virtqueue batch).
    let mut out = [None; 32];
    let mut i = 0usize;
    g.throughput(Throughput::Elements(32));
    g.bench_function(BenchmarkId::new("hit_batch32", n), |b| {
        b.iter(|| {
            i += 32;
            if i + 32 > ks.len() {
                i = 0;
            }
            ix.lookup_batch(black_box(&ks[i..i + 32]), &mut out);
            black_box(&out);
        });
    });
    let mut i = 0usize;
    g.bench_function(BenchmarkId::new("miss_batch32", n), |b| {
        b.iter(|| {
            i += 32;
            if i + 32 > misses.len() {
                i = 0;
            }
            ix.lookup_batch(black_box(&misses[i..i + 32]), &mut out);
            black_box(&out);
        });
    });
    g.finish();
}

fn bench_add_del<M: Measurement>(c: &mut Criterion<M>) {
    let mut g = c.benchmark_group("add_del");
    // FlowIndex: one insert + one remove_by_id per iteration, table half full.
    let n = 32_768usize;
    let ks = keys(n + 4096, 5);
    let mut ix = FlowIndex::new(65_535);
    for (i, k) in ks[..n].iter().enumerate() {
        ix.insert(*k, i as u16, 0).unwrap();
    }
    let extra = &ks[n..];
    let mut i = 0usize;
    g.throughput(Throughput::Elements(1));
    g.bench_function("index_pair", |b| {
        b.iter(|| {
            i = (i + 1) % extra.len();
            let id = (n + i) as u16;
            ix.insert(extra[i], id, 1).unwrap();
            black_box(ix.remove_by_id(id));
        });
    });

    // FilterTable: a 33-op ADD request then a 33-op DEL request, applied
    // with events delivered to a counting closure, with the placement model
    // on; a small table (cache-resident) and a large one (1K / 32K live).
    let mut sink = 0u64;
    for (capacity, live) in [(2_048u32, 1_000usize), (65_535, 32_768)] {
        let mut t = FilterTable::new(TableConfig {
            capacity,
            buckets: Some((capacity / 4, 16)),
            ..TableConfig::default()
        })
        .unwrap();
        let base: Vec<AddOp> = ks[..live]
            .iter()
            .enumerate()
            .map(|(i, k)| AddOp::new(i as u16, 0, k))
            .collect();
        for chunk in base.chunks(33) {
            t.apply_now(0, 0, Request::Add(chunk.to_vec()), 4, &mut |_| sink += 1);
        }
        assert_eq!(t.len(), live);
        let adds: Vec<Vec<AddOp>> = extra
            .chunks(33)
            .enumerate()
            .map(|(c, ch)| {
                ch.iter()
                    .enumerate()
                    .map(|(j, k)| AddOp::new((live + c * 33 + j) as u16, 1, k))
                    .collect()
            })
            .collect();
        let mut c_i = 0usize;
        g.throughput(Throughput::Elements(33));
        g.bench_function(BenchmarkId::new("table_33_pairs", live), |b| {
            b.iter_batched(
                || {
                    c_i = (c_i + 1) % adds.len();
                    let a = adds[c_i].clone();
                    let d: Vec<DelOp> = a
                        .iter()
                        .map(|o| DelOp {
                            id: o.id,
                            reason: DelReason::Expired,
                        })
                        .collect();
                    (a, d)
                },
                |(a, d)| {
                    t.apply_now(1, 1, Request::Add(a), 4, &mut |_| sink += 1);
                    t.apply_now(2, 2, Request::Del(d), 4, &mut |_| sink += 1);
                },
                BatchSize::SmallInput,
            );
        });
        assert_eq!(t.len(), live);
        assert_eq!(
            t.counters().rejects.total(),
            0,
            "no op rejected: every iteration is a real add + delete"
        );
    }
    black_box(sink);
    g.finish();
}

fn bench_toeplitz<M: Measurement>(c: &mut Criterion<M>) {
    let mut g = c.benchmark_group("toeplitz");
    g.throughput(Throughput::Elements(1));
    let t = Toeplitz::default();
    let k4 = FlowKey::v4(
        L4Proto::Tcp,
        Ipv4Addr::new(66, 9, 149, 187),
        2794,
        Ipv4Addr::new(161, 142, 100, 80),
        1766,
    );
    let k6 = FlowKey::v6(
        L4Proto::Tcp,
        "3ffe:2501:200:1fff::7".parse::<Ipv6Addr>().unwrap(),
        2794,
        "3ffe:2501:200:3::1".parse::<Ipv6Addr>().unwrap(),
        1766,
    );
    g.bench_function("v4_4tuple", |b| {
        b.iter(|| black_box(t.hash_flow(black_box(&k4))));
    });
    g.bench_function("v4_2tuple", |b| {
        b.iter(|| black_box(t.hash_pair(&black_box(k4).ip_pair())));
    });
    g.bench_function("v6_4tuple", |b| {
        b.iter(|| black_box(t.hash_flow(black_box(&k6))));
    });
    g.bench_function("v4_4tuple_bitwise_reference", |b| {
        let mut input = [0u8; 12];
        input[..4].copy_from_slice(&k4.src_bytes()[..4]);
        input[4..8].copy_from_slice(&k4.dst_bytes()[..4]);
        input[8..10].copy_from_slice(&2794u16.to_be_bytes());
        input[10..12].copy_from_slice(&1766u16.to_be_bytes());
        b.iter(|| black_box(t.hash_slow(black_box(&input))));
    });
    g.finish();
}

fn frame_v4() -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 20 + 64];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((20 + 20 + 64) as u16).to_be_bytes());
    f[14 + 9] = 6;
    f[26..30].copy_from_slice(&[10, 0, 0, 2]);
    f[30..34].copy_from_slice(&[10, 0, 0, 1]);
    f[34..36].copy_from_slice(&5000u16.to_be_bytes());
    f[36..38].copy_from_slice(&80u16.to_be_bytes());
    f[34 + 12] = 0x50;
    f
}

fn frame_v6_ext() -> Vec<u8> {
    // IPv6 + hop-by-hop (8) + UDP (8) + 64 payload, with a VLAN tag
    let plen = 8 + 8 + 64;
    let mut f = vec![0u8; 18 + 40 + plen];
    f[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
    f[14..16].copy_from_slice(&5u16.to_be_bytes());
    f[16..18].copy_from_slice(&0x86DDu16.to_be_bytes());
    let ip = 18;
    f[ip] = 0x60;
    f[ip + 4..ip + 6].copy_from_slice(&(plen as u16).to_be_bytes());
    f[ip + 6] = 0;
    f[ip + 8..ip + 24].copy_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
    f[ip + 24..ip + 40].copy_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
    let e = ip + 40;
    f[e] = 17;
    let u = e + 8;
    f[u..u + 2].copy_from_slice(&53u16.to_be_bytes());
    f[u + 2..u + 4].copy_from_slice(&9999u16.to_be_bytes());
    f[u + 4..u + 6].copy_from_slice(&((8 + 64) as u16).to_be_bytes());
    f
}

fn bench_parse<M: Measurement>(c: &mut Criterion<M>) {
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(1));
    let f4 = frame_v4();
    let f6 = frame_v6_ext();
    assert!(parse_frame(&f4).unwrap().flow().is_some());
    assert!(parse_frame(&f6).unwrap().flow().is_some());
    g.bench_function("v4_tcp", |b| {
        b.iter(|| black_box(parse_frame(black_box(&f4))));
    });
    g.bench_function("v6_vlan_hbh_udp", |b| {
        b.iter(|| black_box(parse_frame(black_box(&f6))));
    });

    // The whole RX steering decision: parse, filter lookup, RSS fallback.
    let rss = Rss::new(4);
    let mut ix = FlowIndex::new(1024);
    let k = *parse_frame(&f4).unwrap().flow().unwrap();
    ix.insert(k, 1, 3).unwrap();
    g.bench_function("steer_v4_hit", |b| {
        b.iter(|| {
            let p = parse_frame(black_box(&f4)).unwrap();
            let q = p
                .flow()
                .and_then(|k| ix.lookup(k))
                .map_or_else(|| rss.queue_for(&p), |(_, q)| q);
            black_box(q)
        });
    });
    g.bench_function("steer_v6_miss_rss", |b| {
        b.iter(|| {
            let p = parse_frame(black_box(&f6)).unwrap();
            let q = p
                .flow()
                .and_then(|k| ix.lookup(k))
                .map_or_else(|| rss.queue_for(&p), |(_, q)| q);
            black_box(q)
        });
    });
    g.finish();
}

/// Context for the lookup figures: the machine's own cost of one random
/// 8-byte read from arrays the size of the 64K and 1M indexes' slot arrays
/// (6 MiB and 96 MiB), as a stream of independent reads (what a lookup
/// stream can at best overlap) and as a dependent chain (raw latency).
fn bench_memory_baseline<M: Measurement>(c: &mut Criterion<M>) {
    let mut g = c.benchmark_group("memory_baseline");
    g.throughput(Throughput::Elements(1));
    for (name, bytes) in [("6MiB", 6usize << 20), ("96MiB", 96usize << 20)] {
        let n = bytes / 8;
        // a single random cycle through all elements (Sattolo's algorithm)
        let mut next: Vec<u64> = (0..n as u64).collect();
        let mut rng = SplitMix64::new(9);
        for i in (1..n).rev() {
            let j = (rng.next_u64() % i as u64) as usize;
            next.swap(i, j);
        }
        let idx: Vec<u32> = (0..1 << 20)
            .map(|_| (rng.next_u64() % n as u64) as u32)
            .collect();
        let mut i = 0usize;
        g.bench_function(BenchmarkId::new("independent_reads", name), |b| {
            b.iter(|| {
                i = (i + 1) & ((1 << 20) - 1);
                black_box(next[idx[i] as usize])
            });
        });
        let mut p = 0usize;
        g.bench_function(BenchmarkId::new("dependent_chain", name), |b| {
            b.iter(|| {
                p = next[p] as usize;
                black_box(p)
            });
        });
    }
    g.finish();
}

fn run<M: Measurement>(mut c: Criterion<M>) {
    bench_memory_baseline(&mut c);
    bench_lookup(&mut c);
    bench_add_del(&mut c);
    bench_toeplitz(&mut c);
    bench_parse(&mut c);
    c.final_summary();
}

fn main() {
    if std::env::var("ARFS_BENCH_CLOCK").as_deref() == Ok("wall") {
        run(Criterion::default()
            .with_measurement(WallTime)
            .configure_from_args());
    } else {
        run(Criterion::default()
            .with_measurement(ThreadCpu)
            .configure_from_args());
    }
}
