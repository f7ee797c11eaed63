//! Daemon-wide state: what lives as long as `vnic serve` (configuration,
//! counters, the management state behind its mutex, the generator's flow
//! sets, the trace writer, the tap queues; the current connection is the
//! management state's, [`Mgmt::conn`]).

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arfs::{TableConfig, TraceRecord, DEFAULT_KEY};

use crate::clock::{initial_generation, now_ns};
use crate::config::{rate_threshold, Config, PathFaults, PeerKind, RATE_ONE};
use crate::conn::Conn;
use crate::error::Error;
use crate::mgmt::Mgmt;
use crate::peer::flows::GenControl;
use crate::stats::Stats;
use crate::trace::Tracer;

pub(crate) struct Shared {
    pub cfg: Config,
    pub start: Instant,
    /// The device generation (moved by the management path only).
    pub generation: Arc<AtomicU32>,
    pub connected: AtomicBool,
    pub connections: AtomicU64,
    pub stats: Arc<Stats>,
    /// Faults of the packet path (`misroute`).
    pub faults: Arc<PathFaults>,
    pub mgmt: Mutex<Mgmt>,
    pub gen: Arc<GenControl>,
    pub tracer: Arc<Tracer>,
    /// Tap queues, one per pair (tap peer only).
    pub taps: Arc<[File]>,
}

impl Shared {
    /// Builds the state: opens the trace file and the tap, validates the
    /// table configuration.
    pub(crate) fn build(cfg: Config) -> Result<Arc<Self>, Error> {
        let _ = now_ns();
        let tracer = Arc::new(match &cfg.trace {
            Some(p) => Tracer::open(p).map_err(|source| Error::Trace {
                path: p.clone(),
                source,
            })?,
            None => Tracer::disabled(),
        });
        let taps: Arc<[File]> = match &cfg.peer {
            PeerKind::Gen => Arc::new([]),
            PeerKind::Tap(name) => crate::peer::tap::open_tap(name, usize::from(cfg.queues))
                .map_err(|source| Error::Tap {
                    name: name.clone(),
                    source,
                })?
                .into(),
        };
        let tcfg = TableConfig {
            capacity: cfg.table_capacity,
            buckets: cfg.buckets,
            latency_ns: cfg.program_latency.as_nanos() as u64,
            add_fail_rate: cfg.add_fail_rate,
            mgmt_loss_rate: cfg.mgmt_loss_rate,
            seed: cfg.seed,
            rss_key: DEFAULT_KEY,
            rules: cfg.rule_locations,
        };
        let gen = initial_generation();
        let generation = Arc::new(AtomicU32::new(gen));
        cfg.preload.check(cfg.table_capacity)?;
        let mut mgmt = Mgmt::new(tcfg, tracer.clone(), generation.clone(), cfg.queues)?;
        mgmt.set_preload(cfg.preload, cfg.gen_ip, cfg.guest_ip);
        let sh = Arc::new(Self {
            stats: Arc::new(Stats::new(usize::from(cfg.queues))),
            faults: Arc::new(PathFaults {
                misroute: AtomicU64::new(if cfg.misroute {
                    RATE_ONE
                } else {
                    rate_threshold(cfg.fault_rates[0])
                }),
                drop: AtomicU64::new(rate_threshold(cfg.fault_rates[1])),
                corrupt: AtomicU64::new(rate_threshold(cfg.fault_rates[2])),
                bad_csum: AtomicU64::new(rate_threshold(cfg.fault_rates[3])),
                truncate: AtomicU64::new(rate_threshold(cfg.fault_rates[4])),
                reorder: AtomicU64::new(rate_threshold(cfg.fault_rates[5])),
                delay_effect_ns: AtomicU64::new(0),
            }),
            generation,
            connected: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            start: Instant::now(),
            mgmt: Mutex::new(mgmt),
            gen: Arc::new(GenControl::default()),
            tracer,
            taps,
            cfg,
        });
        sh.tracer
            .emit(TraceRecord::gen_change(now_ns(), 0, gen, "start"));
        Ok(sh)
    }

    pub(crate) fn generation(&self) -> u32 {
        self.generation.load(Ordering::Relaxed)
    }

    pub(crate) fn pairs(&self) -> usize {
        usize::from(self.cfg.queues)
    }

    /// The current connection (its one owner is the management state).
    pub(crate) fn current_conn(&self) -> Option<Arc<Conn>> {
        self.lock_mgmt().conn()
    }

    pub(crate) fn lock_mgmt(&self) -> MutexGuard<'_, Mgmt> {
        self.mgmt
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
