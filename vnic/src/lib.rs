//! vnic: a multi-queue vhost-user virtio-net device whose receive side holds an
//! aRFS flow filter table programmed by the guest through in-band management
//! frames (see `aRFS/PROTOCOL.md`).

pub mod frontend;
