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

use crate::handoff::Router;
use crate::virtq::rx::RxBatch;

pub mod flows;
pub mod gen;
pub mod rtt;
pub mod tap;

/// The peer a worker runs: every kind, dispatched statically (the TX path
/// calls it once per frame).
pub enum AnyPeer {
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
    fn guest_frame(&mut self, pkt: &mut [u8], r: &mut Router, rx: &mut RxBatch<'_>) {
        match self {
            Self::Gen(p) => p.guest_frame(pkt, r, rx),
            Self::Tap(p) => p.guest_frame(pkt, r, rx),
        }
    }

    fn frames_for_guest(&mut self, r: &mut Router, rx: &mut RxBatch<'_>, fd_event: bool) {
        match self {
            Self::Gen(p) => p.frames_for_guest(r, rx, fd_event),
            Self::Tap(p) => p.frames_for_guest(r, rx, fd_event),
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
pub trait Peer: Send {
    /// A descriptor to watch in the worker's epoll (a tap queue, the
    /// generator's pacing timer); its events call [`Peer::frames_for_guest`] with
    /// `fd_event` set.
    fn fd(&self) -> Option<RawFd>;

    /// A frame the guest sent on this pair (`pkt`: virtio-net header space
    /// followed by the frame; never a management frame). Answers go to
    /// the guest through `r.route(rx, ...)`.
    fn guest_frame(&mut self, pkt: &mut [u8], r: &mut Router, rx: &mut RxBatch<'_>);

    /// Frames for the guest: called on every batch of rx work of the
    /// worker, `fd_event` when the peer's own descriptor fired.
    fn frames_for_guest(&mut self, r: &mut Router, rx: &mut RxBatch<'_>, fd_event: bool);

    /// The end of a batch of [`Peer::guest_frame`] calls: counts kept per
    /// batch are published here (the worker calls it after every tx
    /// batch, so a counter lags by one batch at most).
    fn tx_batch_end(&mut self) {}
}
