//! The hits a filter or a rule counted since it was installed: the
//! workers' counters ([`crate::stats::Hits`]) only grow, so each id and
//! each rule location keeps the count it had then.

use super::{Mgmt, ID_SPACE};

impl Mgmt {
    /// Hits of filter `id` since it was (re)installed.
    pub(crate) fn hits(&self, id: u16) -> u64 {
        let h = self.hits.as_ref().map_or(0, |h| h.sum(id));
        h.saturating_sub(self.hits_base[usize::from(id)])
    }

    /// Frames the rule at `loc` decided since it was set there.
    pub(crate) fn rule_hits(&self, loc: u32) -> u64 {
        let h = self.hits.as_ref().map_or(0, |h| h.rule_sum(loc));
        h.saturating_sub(
            self.rule_hits_base
                .get(loc as usize)
                .copied()
                .unwrap_or_default(),
        )
    }

    pub(super) fn rebase(&mut self, id: u16) {
        let cur = self.hits.as_ref().map_or(0, |h| h.sum(id));
        self.hits_base[usize::from(id)] = cur;
    }

    pub(super) fn rebase_rule(&mut self, loc: u32) {
        let cur = self.hits.as_ref().map_or(0, |h| h.rule_sum(loc));
        if let Some(b) = self.rule_hits_base.get_mut(loc as usize) {
            *b = cur;
        }
    }

    /// Every id and location from now (a reset: the counters of the
    /// connection that steers next).
    pub(super) fn rebase_all(&mut self) {
        self.hits_base.fill(0);
        self.rule_hits_base.fill(0);
        if let Some(h) = &self.hits {
            for i in 0..ID_SPACE {
                self.hits_base[i] = h.sum(i as u16);
            }
            for (loc, b) in self.rule_hits_base.iter_mut().enumerate() {
                *b = h.rule_sum(loc as u32);
            }
        }
    }
}
