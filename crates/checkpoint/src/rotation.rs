//! Which checkpoints to keep and which to delete: a pure function of the
//! checkpoints on disk and their validity, kept apart from the I/O that
//! carries it out (burn-train's `strategy` idea) so every rule is tested
//! without a disk.
//!
//! Rules:
//! - the checkpoint just committed is never deleted, whatever else is on
//!   disk: it is the one the run is about to report as durable (a stop exits
//!   75 naming it), so no mistake in judging the others may cost it;
//! - keep the newest `keep` *valid* checkpoints; older valid ones are deleted;
//! - the newest valid checkpoint is never deleted, whatever `keep` says;
//! - invalid checkpoints never count toward `keep`; they are deleted only once
//!   `keep` valid checkpoints exist (until then they are left for inspection).
//!
//! The planner trusts the validity it is given; the store decides it (see
//! `store.rs`, `rotate`). A checkpoint *newer* than the one just committed
//! exists only when a resumed run fell back past it, that is when it failed
//! full verification, so the store verifies those fully before they may count
//! toward `keep`; and checkpoints that failed at resume are quarantined
//! (moved out of the checkpoints directory, `quarantine.rs`), so the planner
//! never sees them at all, or, when one cannot be moved, the store remembers
//! it and hands it to the planner as invalid.

/// A checkpoint as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub step: u64,
    pub valid: bool,
}

/// What to do with one checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Keep { step: u64 },
    Delete { step: u64, reason: DeleteReason },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    /// A valid checkpoint older than the newest `keep` valid ones.
    Rotated,
    /// An invalid checkpoint, removed because enough valid ones exist.
    Invalid,
}

/// Plans rotation right after the checkpoint of step `committed` was
/// committed. The result has one action per candidate, newest first; the
/// candidate of step `committed` (if listed) is always kept, and counts as
/// valid whatever its flag says (it verified as it was written).
pub fn plan(candidates: &[Candidate], keep: usize, committed: u64) -> Vec<Action> {
    let mut sorted: Vec<Candidate> =
        candidates.iter().map(|c| Candidate { step: c.step, valid: c.valid || c.step == committed }).collect();
    sorted.sort_by_key(|c| std::cmp::Reverse(c.step));
    let keep = keep.max(1);
    let valid_count = sorted.iter().filter(|c| c.valid).count();
    let mut valid_seen = 0;
    sorted
        .iter()
        .map(|c| {
            if c.valid {
                valid_seen += 1;
                if valid_seen <= keep || c.step == committed {
                    Action::Keep { step: c.step }
                } else {
                    Action::Delete { step: c.step, reason: DeleteReason::Rotated }
                }
            } else if valid_count >= keep {
                Action::Delete { step: c.step, reason: DeleteReason::Invalid }
            } else {
                Action::Keep { step: c.step }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(step: u64, valid: bool) -> Candidate {
        Candidate { step, valid }
    }

    fn deleted(actions: &[Action]) -> Vec<u64> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { step, .. } => Some(*step),
                Action::Keep { .. } => None,
            })
            .collect()
    }

    #[test]
    fn keeps_newest_three_valid_and_deletes_older() {
        let cs: Vec<_> = (1..=5).map(|s| c(s * 10, true)).collect();
        assert_eq!(deleted(&plan(&cs, 3, 50)), vec![20, 10]);
    }

    #[test]
    fn nothing_deleted_while_fewer_than_keep() {
        assert!(deleted(&plan(&[c(1, true), c(2, true)], 3, 2)).is_empty());
        assert!(deleted(&plan(&[], 3, 0)).is_empty());
    }

    #[test]
    fn invalid_ones_do_not_count_toward_keep() {
        // Newest is corrupt: three valid ones below it stay.
        let cs = [c(50, false), c(40, true), c(30, true), c(20, true), c(10, true)];
        let actions = plan(&cs, 3, 40);
        assert_eq!(deleted(&actions), vec![50, 10]);
        assert_eq!(actions[0], Action::Delete { step: 50, reason: DeleteReason::Invalid });
    }

    #[test]
    fn invalid_ones_are_kept_until_enough_valid_exist() {
        let cs = [c(30, false), c(20, true), c(10, false)];
        assert!(deleted(&plan(&cs, 3, 20)).is_empty());
    }

    #[test]
    fn newest_valid_is_never_deleted_even_with_keep_zero() {
        let cs = [c(3, false), c(2, true), c(1, true)];
        let actions = plan(&cs, 0, 2);
        assert!(actions.contains(&Action::Keep { step: 2 }));
        assert_eq!(deleted(&actions), vec![3, 1]);
    }

    #[test]
    fn order_of_input_does_not_matter() {
        let a = plan(&[c(1, true), c(3, true), c(2, true), c(4, true)], 2, 4);
        let b = plan(&[c(4, true), c(2, true), c(3, true), c(1, true)], 2, 4);
        assert_eq!(a, b);
        assert_eq!(deleted(&a), vec![2, 1]);
    }

    #[test]
    fn the_just_committed_checkpoint_survives_newer_ones_that_fill_keep() {
        // Issue 15: a resumed run fell back past step 30, which keeps its size
        // but not its hashes; the quick check calls it valid. With keep = 1 the
        // checkpoint just committed (10) must not be the one rotated out.
        let actions = plan(&[c(30, true), c(10, true)], 1, 10);
        assert!(actions.contains(&Action::Keep { step: 10 }), "{actions:?}");
        assert!(deleted(&actions).is_empty(), "{actions:?}");
        // Two newer ones and keep = 2: older valid ones go, the committed one stays.
        let cs = [c(50, true), c(40, true), c(30, true), c(20, true), c(10, true)];
        let actions = plan(&cs, 2, 20);
        assert_eq!(deleted(&actions), vec![30, 10]);
        assert!(actions.contains(&Action::Keep { step: 20 }));
    }

    #[test]
    fn the_just_committed_checkpoint_counts_as_valid_whatever_its_flag() {
        // It verified as it was written; a flag saying otherwise (a listing
        // that raced the commit) neither deletes it nor keeps invalid ones.
        let actions = plan(&[c(20, false), c(10, false)], 1, 20);
        assert_eq!(
            actions,
            vec![Action::Keep { step: 20 }, Action::Delete { step: 10, reason: DeleteReason::Invalid }]
        );
    }

    #[test]
    fn newer_invalid_ones_are_deleted_once_the_committed_one_makes_keep() {
        // Newer checkpoints the store verified fully and found damaged.
        let actions = plan(&[c(50, false), c(40, false), c(10, true)], 1, 10);
        assert_eq!(deleted(&actions), vec![50, 40]);
    }

    proptest::proptest! {
        #[test]
        fn invariants_hold_for_any_input(
            entries in proptest::collection::btree_map(0u64..1000, proptest::bool::ANY, 0..20),
            keep in 0usize..6,
            committed in 0u64..1000,
        ) {
            let cs: Vec<_> = entries.iter().map(|(s, v)| c(*s, *v)).collect();
            let actions = plan(&cs, keep, committed);
            proptest::prop_assert_eq!(actions.len(), cs.len());
            // The committed one is never deleted.
            if entries.contains_key(&committed) {
                let kept = Action::Keep { step: committed };
                proptest::prop_assert!(actions.contains(&kept), "{:?}", actions);
            }
            // Apart from it, exactly the newest min(keep.max(1), #valid) valid
            // ones are kept (the committed one counts as valid).
            let is_valid = |s: u64| entries[&s] || s == committed;
            let kept_valid: Vec<u64> = actions.iter().filter_map(|a| match a {
                Action::Keep { step } if is_valid(*step) => Some(*step),
                _ => None,
            }).collect();
            let mut expect: Vec<u64> =
                cs.iter().map(|c| c.step).filter(|&s| is_valid(s)).rev().take(keep.max(1)).collect();
            if entries.contains_key(&committed) && !expect.contains(&committed) {
                expect.push(committed);
                expect.sort_unstable_by(|a, b| b.cmp(a));
            }
            proptest::prop_assert_eq!(kept_valid, expect);
        }
    }
}
