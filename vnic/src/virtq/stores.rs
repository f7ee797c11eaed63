//! The rx store choice: whether a worker's rx batches stream whole lines
//! into the driver's buffers or copy them plainly ([`StoreChoice`]),
//! judged by the frames delivered per second of wall time.

use std::time::Instant;

use crate::config::RxStores;

/// Clock reads in one mode before a probe of the other ([`StoreChoice`]).
const CHOICE_RUN: u32 = 240;
/// The clock is read at the end of one rx batch in this many.
const CHOICE_SAMPLE: u32 = 8;
/// Clock reads compared: the last ones of a run, and a probe's after its
/// first [`CHOICE_WARM`].
const CHOICE_WINDOW: usize = 16;
/// A probe's first clock reads, not compared: the driver is still taking
/// the frames written in the run's mode, and its refills set the pace.
const CHOICE_WARM: u32 = 4;
/// Clock reads of a probe.
const CHOICE_PROBE: u32 = CHOICE_WARM + CHOICE_WINDOW as u32;
/// How much more a second plain copies must deliver, in %, before the
/// worker leaves streaming (a margin over noise, towards the mode that
/// leaves the driver's CPU the lines in memory rather than in the
/// worker's cache).
const PLAIN_GAIN: u64 = 8;
/// A run or probe that delivered fewer frames than this a batch on
/// average says nothing (the traffic, not the stores, set its rate): after
/// such a run the worker runs again instead of probing, after such a probe
/// it goes back to the run's mode without comparing. So an idle or lightly
/// loaded worker never changes mode.
const CHOICE_MIN_FRAMES: u64 = 16;

/// Chooses, per worker, whether the rx stage streams whole lines
/// (`rx`'s `write_piece`) or copies them plainly, from the frames the worker
/// delivers per second of wall time. Neither is better everywhere:
/// streaming spares a driver on another CPU from taking each line from
/// the worker's cache, plain copies are cheaper when the driver runs on
/// the worker's CPU, where the line is in the worker's own cache
/// (vnic/BENCH.md, "Why 64 B RX with 2 pairs lost wall rate" and "The
/// store choice judged by delivered frames"). The worker's own time per
/// frame misled an earlier version: against DPDK's frontend it chose
/// plain copies in runs that went slower than streaming ones, since what
/// the driver pays for a line left in the worker's cache is not on the
/// worker's clock. Delivered frames per second are, whichever side is the
/// limit.
///
/// The worker reads the clock at the end of one rx batch in
/// [`CHOICE_SAMPLE`]; each read gives the frames a second delivered since
/// the one before. A run lasts [`CHOICE_RUN`] reads in one mode, then a
/// probe [`CHOICE_PROBE`] reads in the other. The median rate of the
/// probe's last [`CHOICE_WINDOW`] reads is compared with that of the run's
/// last as many, the reads just before it: like with like, next to each
/// other in time, and a few reads in which the worker or the driver was
/// descheduled move neither median (against the mean rate of the whole
/// run, as before, a stall anywhere in the run made the probed mode look
/// faster, and a host moving the two CPUs apart or together between the
/// run's start and the probe did the same; vnic/BENCH.md). The worker
/// keeps the probed mode if it delivered more: by at least [`PLAIN_GAIN`]
/// % to leave streaming, by anything to go back to it; then again. What
/// the guest sees is the same in both modes: the same bytes, before the
/// same used index. `--rx-stores stream|plain` fixes the mode: the clock is
/// never read.
pub(crate) struct StoreChoice {
    stream: bool,
    /// `--rx-stores stream|plain`: the mode never changes.
    fixed: bool,
    probing: bool,
    /// Clock reads left in this run or probe.
    left: u32,
    /// Frames delivered in rx batches so far (every batch, read or not).
    delivered: u64,
    /// The last read, and `delivered` then (`None` before the first).
    last: Option<(Instant, u64)>,
    /// Frames delivered in this run or probe so far.
    period: u64,
    /// Frames a millisecond of the reads compared, indexed by `left`.
    rates: [u32; CHOICE_WINDOW],
    /// The median rate of the last run's compared reads.
    run: u32,
    /// Rx batches opened: the clock is read at the end of one in
    /// [`CHOICE_SAMPLE`].
    opened: u32,
    /// Mode changes not yet taken by [`StoreChoice::take_switches`].
    switches: u64,
}

impl Default for StoreChoice {
    fn default() -> Self {
        Self::new(RxStores::Auto)
    }
}

impl StoreChoice {
    /// The choice `--rx-stores` asks for; `Auto` starts streaming.
    pub(crate) fn new(mode: RxStores) -> Self {
        Self {
            stream: mode != RxStores::Plain,
            fixed: mode != RxStores::Auto,
            probing: false,
            left: CHOICE_RUN,
            delivered: 0,
            last: None,
            period: 0,
            rates: [0; CHOICE_WINDOW],
            run: 0,
            opened: 0,
            switches: 0,
        }
    }

    /// Whether batches stream whole lines now.
    pub(crate) fn stream(&self) -> bool {
        self.stream
    }

    /// Whether the clock is to be read at the end of the batch being
    /// opened (never, when the mode is fixed).
    pub(super) fn sample(&mut self) -> bool {
        self.opened = self.opened.wrapping_add(1);
        !self.fixed && self.opened.is_multiple_of(CHOICE_SAMPLE)
    }

    /// The mode changes since the last call (probes and their ends
    /// included), for `ctl stats`' `rx_store_switches`.
    pub(crate) fn take_switches(&mut self) -> u64 {
        std::mem::take(&mut self.switches)
    }

    /// An rx batch ended having delivered `frames` (every batch).
    #[inline]
    pub(crate) fn delivered(&mut self, frames: u16) {
        self.delivered += u64::from(frames);
    }

    /// The median of the compared reads' rates.
    fn median(&self) -> u32 {
        let mut r = self.rates;
        r.sort_unstable();
        let mid = CHOICE_WINDOW / 2;
        // The mean of the two middle ones (CHOICE_WINDOW is even).
        r[mid - 1].midpoint(r[mid])
    }

    /// A clock read at the end of a sampled batch (after its
    /// [`StoreChoice::delivered`]).
    pub(crate) fn tick(&mut self, now: Instant) {
        let Some((t0, f0)) = self.last.replace((now, self.delivered)) else {
            return;
        };
        let frames = self.delivered - f0;
        self.period += frames;
        self.left -= 1;
        if let Some(slot) = self.rates.get_mut(self.left as usize) {
            let ns = now.saturating_duration_since(t0).as_nanos().max(1);
            *slot = u32::try_from(u128::from(frames) * 1_000_000 / ns).unwrap_or(u32::MAX);
        }
        if self.left > 0 {
            return;
        }
        let per_read = CHOICE_MIN_FRAMES * u64::from(CHOICE_SAMPLE);
        let period = std::mem::take(&mut self.period);
        if self.probing {
            // (A probe follows only a run with traffic enough.)
            let (run, probe) = (self.run, self.median());
            let measured = period >= per_read * u64::from(CHOICE_PROBE);
            // Keep probed plain copies only if they delivered at least
            // PLAIN_GAIN % more a second, probed streaming if it delivered
            // more at all.
            let k = if self.stream { 100 } else { 100 + PLAIN_GAIN };
            let better = measured && u64::from(probe) * 100 > u64::from(run) * k;
            log::debug!(
                "rx stores: {} probed at {probe} frames/ms against {run} (medians of {CHOICE_WINDOW} reads){}: {}",
                if self.stream { "streaming" } else { "plain copies" },
                if measured { "" } else { ", too few frames to compare" },
                if better { "kept" } else { "dropped" }
            );
            if !better {
                self.stream = !self.stream;
                self.switches += 1;
            }
            self.probing = false;
            self.left = CHOICE_RUN;
        } else if period < per_read * u64::from(CHOICE_RUN) {
            // Too little traffic to compare a probe with: another run.
            self.left = CHOICE_RUN;
        } else {
            self.run = self.median();
            self.stream = !self.stream;
            self.switches += 1;
            self.probing = true;
            self.left = CHOICE_PROBE;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A choice and its clock, as a worker drives them: each read comes
    /// after [`CHOICE_SAMPLE`] batches.
    struct Driven {
        c: StoreChoice,
        now: Instant,
        /// The rate a read sees is that of the mode `lag` reads before it
        /// (the driver still taking frames written before a switch).
        lag: usize,
        /// Modes of the reads so far, the newest last.
        modes: Vec<bool>,
        /// One read in `.0` takes `.1` times as long (the worker or the
        /// driver descheduled).
        stall: Option<(usize, u64)>,
    }

    impl Driven {
        fn new(mode: RxStores) -> Self {
            let mut d = Self {
                c: StoreChoice::new(mode),
                now: Instant::now(),
                lag: 0,
                modes: Vec::new(),
                stall: None,
            };
            // The first read only starts the first run.
            d.c.tick(d.now);
            d
        }

        /// `reads` clock reads, each after CHOICE_SAMPLE batches of
        /// `frames` frames delivered at `stream_ns` or `plain_ns` of wall
        /// time a frame (by the mode the choice is in, `lag` reads
        /// before); returns how many of them streamed.
        fn run(&mut self, reads: u32, frames: u16, stream_ns: u64, plain_ns: u64) -> u32 {
            let mut streamed = 0;
            for _ in 0..reads {
                self.modes.push(self.c.stream());
                let seen = self.modes[self.modes.len().saturating_sub(1 + self.lag)];
                let mut per = if seen { stream_ns } else { plain_ns };
                if let Some((every, times)) = self.stall {
                    if self.modes.len().is_multiple_of(every) {
                        per *= times;
                    }
                }
                streamed += u32::from(self.c.stream());
                for _ in 0..CHOICE_SAMPLE {
                    self.c.delivered(frames);
                }
                let n = u64::from(frames) * u64::from(CHOICE_SAMPLE);
                // An idle period still takes time.
                self.now += std::time::Duration::from_nanos(per * n.max(1));
                self.c.tick(self.now);
            }
            streamed
        }

        /// [`Driven::run`] with 64 frames a batch.
        fn drive(&mut self, reads: u32, stream_ns: u64, plain_ns: u64) -> u32 {
            self.run(reads, 64, stream_ns, plain_ns)
        }
    }

    #[test]
    fn the_store_choice_settles_on_the_faster_mode_and_keeps_probing() {
        let cycle = CHOICE_RUN + CHOICE_PROBE;
        let auto = || Driven::new(RxStores::Auto);
        // Streaming delivers more a second: it streams but for the probes
        // of plain copies.
        let mut d = auto();
        assert!(d.c.stream(), "streams until measured");
        assert_eq!(d.drive(10 * cycle, 50, 60), 10 * CHOICE_RUN);
        // Plain copies deliver more: after the first run it copies plainly
        // but for the probes of streaming.
        let mut d = auto();
        assert_eq!(d.drive(10 * cycle, 60, 50), CHOICE_RUN + 9 * CHOICE_PROBE);
        assert!(!d.c.stream());
        // The rates change sides: it follows within two cycles.
        let mut d = auto();
        d.drive(3 * cycle, 60, 50);
        d.drive(2 * cycle, 50, 60);
        assert_eq!(d.drive(4 * cycle, 50, 60), 4 * CHOICE_RUN);
        // Biased to streaming: plain copies 5 % faster do not make it
        // leave streaming (it takes PLAIN_GAIN = 8 %)...
        let mut d = auto();
        assert_eq!(d.drive(10 * cycle, 100, 95), 10 * CHOICE_RUN);
        // ... and streaming 3 % faster takes it back from plain copies at
        // the next probe.
        let mut d = auto();
        d.drive(cycle, 60, 50);
        assert!(!d.c.stream());
        d.drive(cycle, 97, 100);
        assert_eq!(d.drive(4 * cycle, 97, 100), 4 * CHOICE_RUN);
        // The clock is read at the end of one batch in CHOICE_SAMPLE.
        let mut c = StoreChoice::default();
        let reads = (0..10 * CHOICE_SAMPLE).filter(|_| c.sample()).count();
        assert_eq!(reads, 10);
    }

    /// What the choice compares is robust to what a shared host does to a
    /// worker: reads in which it or the driver was descheduled (here one
    /// in 23, taking 20 times as long: the mean rate of a run falls by
    /// ~45 %, a probe's mostly not) and the reads just after a switch, in
    /// which the driver still takes frames written in the run's mode.
    #[test]
    fn the_store_choice_is_not_moved_by_stalls_or_a_switchs_wake() {
        let cycle = CHOICE_RUN + CHOICE_PROBE;
        // Stalls: streaming 4 % faster stays streaming; plain copies 20 %
        // faster are chosen all the same.
        let mut d = Driven::new(RxStores::Auto);
        d.stall = Some((23, 20));
        assert_eq!(d.drive(10 * cycle, 50, 52), 10 * CHOICE_RUN);
        let mut d = Driven::new(RxStores::Auto);
        d.stall = Some((23, 20));
        assert_eq!(d.drive(10 * cycle, 60, 50), CHOICE_RUN + 9 * CHOICE_PROBE);
        // A wake of 8 reads after each switch: the same choices, plain
        // copies 10 % faster included.
        for (stream_ns, plain_ns, streamed) in [
            (50, 60, 10 * CHOICE_RUN),
            (55, 50, CHOICE_RUN + 9 * CHOICE_PROBE),
        ] {
            let mut d = Driven::new(RxStores::Auto);
            d.lag = 8;
            assert_eq!(d.drive(10 * cycle, stream_ns, plain_ns), streamed);
        }
    }

    /// Periods the traffic set the pace of say nothing: a run with too few
    /// frames is followed by another run, not a probe; a probe with too
    /// few goes back to the run's mode however fast it looked.
    #[test]
    fn the_store_choice_ignores_periods_without_traffic() {
        let cycle = CHOICE_RUN + CHOICE_PROBE;
        // Traffic falls off as plain copies are probed (too few frames,
        // however fast): still streaming after.
        let mut d = Driven::new(RxStores::Auto);
        d.drive(CHOICE_RUN, 60, 50);
        assert!(!d.c.stream(), "probing");
        d.run(CHOICE_PROBE, (CHOICE_MIN_FRAMES - 1) as u16, 60, 1);
        assert!(d.c.stream());
        // Runs with too little traffic probe nothing: no mode change in
        // ten of them; then traffic, and every cycle decides as usual.
        let mut d = Driven::new(RxStores::Auto);
        let light = (CHOICE_MIN_FRAMES - 1) as u16;
        assert_eq!(d.run(10 * CHOICE_RUN, light, 1_000, 1), 10 * CHOICE_RUN);
        assert_eq!(d.c.take_switches(), 0);
        assert_eq!(d.drive(4 * cycle, 50, 60), 4 * CHOICE_RUN);
        assert_eq!(d.c.take_switches(), 8);
    }

    /// `ctl stats`' rx_store_switches: every mode change, a probe's start
    /// and (when the probed mode lost) its end; `--rx-stores stream|plain`:
    /// the clock is never read, the mode never changes.
    #[test]
    fn store_switches_are_counted_and_a_fixed_mode_never_changes() {
        let cycle = CHOICE_RUN + CHOICE_PROBE;
        // Streaming faster: each cycle probes plain copies and comes back.
        let mut d = Driven::new(RxStores::Auto);
        d.drive(3 * cycle, 50, 60);
        assert_eq!(d.c.take_switches(), 6);
        assert_eq!(d.c.take_switches(), 0, "taken");
        // Plain faster: one switch to it, then each probe of streaming
        // starts (1) and ends (1) with no change kept.
        let mut d = Driven::new(RxStores::Auto);
        d.drive(3 * cycle, 60, 50);
        assert_eq!(d.c.take_switches(), 1 + 2 * 2);
        for (mode, stream) in [(RxStores::Stream, true), (RxStores::Plain, false)] {
            let mut c = StoreChoice::new(mode);
            assert_eq!(c.stream(), stream, "{mode:?}");
            assert_eq!(
                (0..10 * CHOICE_SAMPLE).filter(|_| c.sample()).count(),
                0,
                "{mode:?}: clock read"
            );
            assert_eq!(c.stream(), stream, "{mode:?}");
            assert_eq!(c.take_switches(), 0, "{mode:?}");
        }
    }
}
