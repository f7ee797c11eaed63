//! The peer: where the guest's frames go and where frames for the guest
//! come from. Each worker runs its own [`Peer`] for its pair.
//!
//! - [`gen`]: the built-in generator (ARP/ICMP responder, sink, UDP flow
//!   sets from [`flows`]; round trips of stamped frames in [`rtt`]);
//! - [`tap`]: a multi-queue tap device, one queue per pair.
//!
//! Adding a peer: implement [`Peer`] in a new file here, add a
//! `config::PeerKind` variant and its `--peer` syntax, an [`AnyPeer`]
//! variant, and build it in `worker::Worker::new`.

use std::os::fd::RawFd;

pub(crate) mod flows;
pub(crate) mod gen;
pub(crate) mod rtt;
pub(crate) mod tap;

/// The peer a worker runs: every kind, dispatched statically (the TX path
/// calls it once per frame).
pub(crate) enum AnyPeer {
    Gen(gen::GenPeer),
    Tap(tap::TapPeer),
}

impl Peer for AnyPeer {
    fn fd(&self) -> Option<RawFd> {
        match self {
            Self::Gen(p) => p.fd(),
            Self::Tap(p) => p.fd(),
        }
    }

    #[inline]
    fn guest_frame(&mut self, pkt: &mut [u8], to_guest: &mut impl Sink) {
        match self {
            Self::Gen(p) => p.guest_frame(pkt, to_guest),
            Self::Tap(p) => p.guest_frame(pkt, to_guest),
        }
    }

    fn frames_for_guest(&mut self, to_guest: &mut impl Sink, fd_event: bool) {
        match self {
            Self::Gen(p) => p.frames_for_guest(to_guest, fd_event),
            Self::Tap(p) => p.frames_for_guest(to_guest, fd_event),
        }
    }

    fn tx_batch_end(&mut self) {
        match self {
            Self::Gen(p) => p.tx_batch_end(),
            Self::Tap(p) => p.tx_batch_end(),
        }
    }
}

/// One worker's end of the peer.
pub(crate) trait Peer: Send {
    /// A descriptor to watch in the worker's epoll (a tap queue, the
    /// generator's pacing timer); its events call [`Peer::frames_for_guest`] with
    /// `fd_event` set.
    fn fd(&self) -> Option<RawFd>;

    /// A frame the guest sent on this pair (`pkt`: virtio-net header space
    /// followed by the frame; never a management frame). Answers go to
    /// the guest through `to_guest.frame(...)`.
    fn guest_frame(&mut self, pkt: &mut [u8], to_guest: &mut impl Sink);

    /// Frames for the guest: called on every batch of rx work of the
    /// worker, `fd_event` when the peer's own descriptor fired.
    fn frames_for_guest(&mut self, to_guest: &mut impl Sink, fd_event: bool);

    /// The end of a batch of [`Peer::guest_frame`] calls: counts kept per
    /// batch are published here (the worker calls it after every tx
    /// batch, so a counter lags by one batch at most).
    fn tx_batch_end(&mut self) {}
}

/// Where a peer hands the frames it has for the guest: its worker, which
/// steers each one and delivers it to an rx queue (its own, or another
/// pair's through that pair's inbox). A peer knows nothing of either.
pub(crate) trait Sink {
    /// The pair (worker) this is.
    fn pair(&self) -> usize;

    /// One frame for the guest: virtio-net header space, then the frame.
    fn frame(&mut self, pkt: &mut [u8]);

    /// Whether an rx queue (this pair's or another's) refused frames since
    /// the last [`Sink::clear_congestion`]: an unlimited generator stops.
    fn congested(&self) -> bool;

    /// Forgets that another pair's queue refused frames (the start of a
    /// generator run; this pair's own state is reset by the worker).
    fn clear_congestion(&mut self);

    /// Wakes this pair's worker again (an unlimited generator that is not
    /// held back comes back at once).
    fn wake_self(&self);

    /// Wakes every worker of the connection.
    fn wake_all(&self);

    /// When the steering replica that routes this pair's frames was last
    /// brought up to date (`crate::clock::now_ns`, taken before it took the
    /// table's events): the send time the generator stamps on its frames.
    /// A frame so stamped was routed with every table event published
    /// before its stamp applied: an event it was routed without was
    /// published after it.
    fn table_ns(&self) -> u64;
}
