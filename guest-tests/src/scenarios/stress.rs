//! Scenarios of the stress group (see the module docs of `scenarios`).

use super::{Checks, Session};
use crate::harness::Result;

/// Scenario names of this group, in canonical order.
pub(super) const NAMES: &[&str] = &[];

/// Run scenario `name` if it belongs to this group.
pub(super) fn run(_s: &mut Session, _name: &str, _c: &mut Checks) -> Option<Result<String>> {
    // No scenario yet: every name belongs to another group.
    None
}
