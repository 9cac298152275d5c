//! Which checkpoints to keep and which to delete: a pure function of the
//! checkpoints on disk and their validity, kept apart from the I/O that
//! carries it out (burn-train's `strategy` idea) so every rule is tested
//! without a disk.
//!
//! Rules:
//! - keep the newest `keep` *valid* checkpoints; older valid ones are deleted;
//! - the newest valid checkpoint is never deleted, whatever `keep` says;
//! - invalid checkpoints never count toward `keep`; they are deleted only once
//!   `keep` valid checkpoints exist (until then they are left for inspection).

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

/// Plans rotation. The result has one action per candidate, newest first.
pub fn plan(candidates: &[Candidate], keep: usize) -> Vec<Action> {
    let mut sorted = candidates.to_vec();
    sorted.sort_by_key(|c| std::cmp::Reverse(c.step));
    let keep = keep.max(1);
    let valid_count = sorted.iter().filter(|c| c.valid).count();
    let mut valid_seen = 0;
    sorted
        .iter()
        .map(|c| {
            if c.valid {
                valid_seen += 1;
                if valid_seen <= keep {
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
        assert_eq!(deleted(&plan(&cs, 3)), vec![20, 10]);
    }

    #[test]
    fn nothing_deleted_while_fewer_than_keep() {
        assert!(deleted(&plan(&[c(1, true), c(2, true)], 3)).is_empty());
        assert!(deleted(&plan(&[], 3)).is_empty());
    }

    #[test]
    fn invalid_ones_do_not_count_toward_keep() {
        // Newest is corrupt: three valid ones below it stay.
        let cs = [c(50, false), c(40, true), c(30, true), c(20, true), c(10, true)];
        let actions = plan(&cs, 3);
        assert_eq!(deleted(&actions), vec![50, 10]);
        assert_eq!(actions[0], Action::Delete { step: 50, reason: DeleteReason::Invalid });
    }

    #[test]
    fn invalid_ones_are_kept_until_enough_valid_exist() {
        let cs = [c(30, false), c(20, true), c(10, false)];
        assert!(deleted(&plan(&cs, 3)).is_empty());
    }

    #[test]
    fn newest_valid_is_never_deleted_even_with_keep_zero() {
        let cs = [c(3, false), c(2, true), c(1, true)];
        let actions = plan(&cs, 0);
        assert!(actions.contains(&Action::Keep { step: 2 }));
        assert_eq!(deleted(&actions), vec![3, 1]);
    }

    #[test]
    fn order_of_input_does_not_matter() {
        let a = plan(&[c(1, true), c(3, true), c(2, true), c(4, true)], 2);
        let b = plan(&[c(4, true), c(2, true), c(3, true), c(1, true)], 2);
        assert_eq!(a, b);
        assert_eq!(deleted(&a), vec![2, 1]);
    }

    proptest::proptest! {
        #[test]
        fn invariants_hold_for_any_input(
            entries in proptest::collection::btree_map(0u64..1000, proptest::bool::ANY, 0..20),
            keep in 0usize..6,
        ) {
            let cs: Vec<_> = entries.iter().map(|(s, v)| c(*s, *v)).collect();
            let actions = plan(&cs, keep);
            let kept_valid: Vec<u64> = actions.iter().filter_map(|a| match a {
                Action::Keep { step } if entries[step] => Some(*step),
                _ => None,
            }).collect();
            let valid: Vec<u64> = cs.iter().filter(|c| c.valid).map(|c| c.step).rev().collect();
            let mut valid_desc = valid.clone();
            valid_desc.sort_unstable_by(|a, b| b.cmp(a));
            // Exactly the newest min(keep.max(1), #valid) valid ones are kept.
            let expect: Vec<u64> = valid_desc.iter().copied().take(keep.max(1)).collect();
            proptest::prop_assert_eq!(kept_valid, expect);
            proptest::prop_assert_eq!(actions.len(), cs.len());
        }
    }
}
