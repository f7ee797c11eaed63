//! What the control socket reads of the management state: a copy taken
//! under the lock.

use arfs::table::TableConfig;

use super::{Mgmt, MgmtCounters};

impl Mgmt {
    /// What the control socket shows, copied out under the lock.
    /// `filters`: include every live filter with its hits.
    pub(crate) fn snapshot(&self, filters: bool) -> Snapshot {
        Snapshot {
            counters: self.c.clone(),
            table_counters: self.table.counters(),
            table: self.table.config().clone(),
            live: self.table.len(),
            capacity: self.table.capacity(),
            pending: self.table.pending(),
            expected_seq: self.expected,
            max_ops: self.max_ops,
            rogue: self.rogue,
            rogue_nonce: self.rogue_nonce,
            drop_acks: self.drop_acks,
            forge_acks: self.forge_acks,
            wrong_trace: self.wrong_trace,
            filters: if filters {
                self.table
                    .entries()
                    .into_iter()
                    .map(|e| {
                        let hits = self.hits(e.id);
                        (e, hits)
                    })
                    .collect()
            } else {
                Vec::new()
            },
            rss: *self.table.rss(),
            enabled_pairs: self.enabled_pairs(),
            rules: if filters {
                self.table
                    .rules()
                    .map(|r| (*r, self.rule_hits(r.loc)))
                    .collect()
            } else {
                Vec::new()
            },
        }
    }
}

/// The management state as the control socket shows it.
pub(crate) struct Snapshot {
    pub counters: MgmtCounters,
    pub table_counters: arfs::table::Counters,
    pub table: TableConfig,
    pub live: usize,
    pub capacity: u32,
    pub pending: usize,
    pub expected_seq: Option<u32>,
    pub max_ops: u16,
    pub rogue: bool,
    pub rogue_nonce: bool,
    pub drop_acks: u32,
    pub forge_acks: bool,
    pub wrong_trace: bool,
    /// Live filters and their hits (when asked for).
    pub filters: Vec<(arfs::table::Entry, u64)>,
    /// The rules and their hits (when filters are asked for).
    pub rules: Vec<(arfs::Rule, u64)>,
    /// What the driver's RSS_SET set (the defaults until one did).
    pub rss: arfs::RssConfig,
    /// The enabled pairs of the connection (0 without one).
    pub enabled_pairs: u16,
}
