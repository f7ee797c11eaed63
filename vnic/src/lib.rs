//! vnic: a multi-queue vhost-user virtio-net device whose receive side holds an
//! aRFS flow filter table programmed by the guest through in-band management
//! frames (see `aRFS/PROTOCOL.md`). Architecture: `vnic/README.md`.

pub mod cli;
pub mod config;
pub mod ctl;
pub mod device;
pub mod gen;
pub mod mgmt;
pub mod relay;
pub mod rxbuf;
pub mod serve;
pub mod shared;
pub mod stats;
pub mod tap;
pub mod trace;
