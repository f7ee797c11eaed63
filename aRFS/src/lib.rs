//! The vnic flow-steering engine: flow keys, RSS, the filter table and the
//! management-frame protocol. No I/O, no threads.
