//! Which blamed nodes a job leaves behind: a pure plan from the blamed
//! nodes, the job's exclusions now (the user's own and earlier ones), what
//! rekindle excluded before, `[health] max_excluded_nodes`, and the
//! partition as `sinfo` sees it. The plan never excludes so many nodes that
//! the partition could no longer run the job (it says so instead), never
//! more than the bound, and never drops an exclusion already there.

use crate::slurm::PartitionNode;

/// What the plan needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExclusionInput<'a> {
    /// `[health] exclude`.
    pub enabled: bool,
    /// The nodes the attempt's end blames (`blame`).
    pub blamed: &'a [String],
    /// The job's `ExcNodeList` now, expanded.
    pub current: &'a [String],
    /// Nodes rekindle excluded from this job before (its records).
    pub added_before: &'a [String],
    /// `[health] max_excluded_nodes`.
    pub max_added: usize,
    /// The job's partition and its nodes, when `sinfo` answered.
    pub partition: Option<(&'a str, &'a [PartitionNode])>,
    /// Why the partition is unknown, when it is.
    pub partition_error: Option<&'a str>,
    /// How many nodes the job needs.
    pub nodes_needed: u32,
}

/// The plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExclusionPlan {
    /// Set the job's `ExcNodeList` to `list` (the current exclusions and
    /// `added`); `note` says what was left out, if anything.
    Exclude { list: Vec<String>, added: Vec<String>, note: Option<String> },
    /// Change nothing, because `reason`.
    Skip { reason: String },
}

/// Decides the exclusion (module docs).
pub fn plan_exclusion(input: &ExclusionInput<'_>) -> ExclusionPlan {
    let skip = |reason: String| ExclusionPlan::Skip { reason };
    if !input.enabled {
        return skip("[health] exclude = false".into());
    }
    if input.blamed.is_empty() {
        return skip("no node is blamed for how the attempt ended".into());
    }
    let mut new: Vec<String> = input.blamed.iter().filter(|n| !input.current.contains(n)).cloned().collect();
    new.sort();
    new.dedup();
    if new.is_empty() {
        return skip(format!("{} already excluded", input.blamed.join(", ")));
    }
    let mut before: Vec<&String> = input.added_before.iter().collect();
    before.sort();
    before.dedup();
    let room = input.max_added.saturating_sub(before.len());
    let mut notes = Vec::new();
    if room == 0 {
        return skip(format!(
            "[health] max_excluded_nodes = {} reached ({} excluded before): not excluding {}",
            input.max_added,
            if before.is_empty() { "none".to_string() } else { join(&before) },
            new.join(", ")
        ));
    }
    if new.len() > room {
        let left: Vec<String> = new.split_off(room);
        notes.push(format!("not {} ([health] max_excluded_nodes = {})", left.join(", "), input.max_added));
    }
    let mut list: Vec<String> = input.current.iter().chain(&new).cloned().collect();
    list.sort();
    list.dedup();
    match input.partition {
        Some((name, nodes)) => {
            let usable = nodes.iter().filter(|n| n.usable() && !list.contains(&n.name)).count();
            if usable < input.nodes_needed as usize {
                return skip(format!(
                    "excluding {} would leave {usable} usable node(s) in partition {name} for a job of {} node(s): \
                     not excluding, or the job could never start",
                    new.join(", "),
                    input.nodes_needed
                ));
            }
        }
        None => notes.push(format!(
            "the partition could not be asked ({}): bounded by [health] max_excluded_nodes only",
            input.partition_error.unwrap_or("no answer")
        )),
    }
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    ExclusionPlan::Exclude { list, added: new, note }
}

fn join(names: &[&String]) -> String {
    names.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn nodes(spec: &[(&str, &str)]) -> Vec<PartitionNode> {
        spec.iter().map(|(n, st)| PartitionNode { name: n.to_string(), state: st.to_string() }).collect()
    }

    fn base<'a>(blamed: &'a [String], current: &'a [String], part: &'a [PartitionNode]) -> ExclusionInput<'a> {
        ExclusionInput {
            enabled: true,
            blamed,
            current,
            added_before: &[],
            max_added: 2,
            partition: Some(("debug", part)),
            partition_error: None,
            nodes_needed: 1,
        }
    }

    #[test]
    fn a_blamed_node_is_added_to_the_users_own_exclusions() {
        let (blamed, current) = (s(&["n1"]), s(&["n9"]));
        let part = nodes(&[("n1", "mix"), ("n2", "idle"), ("n3", "idle"), ("n9", "idle")]);
        assert_eq!(
            plan_exclusion(&base(&blamed, &current, &part)),
            ExclusionPlan::Exclude { list: s(&["n1", "n9"]), added: s(&["n1"]), note: None }
        );
    }

    #[test]
    fn nothing_is_excluded_when_turned_off_nothing_is_blamed_or_it_already_is() {
        let part = nodes(&[("n1", "idle"), ("n2", "idle")]);
        let (n1, none) = (s(&["n1"]), s(&[]));
        let off = ExclusionInput { enabled: false, ..base(&n1, &none, &part) };
        assert!(matches!(plan_exclusion(&off), ExclusionPlan::Skip { reason } if reason.contains("exclude = false")));
        assert!(
            matches!(plan_exclusion(&base(&none, &none, &part)), ExclusionPlan::Skip { reason } if reason.contains("no node is blamed"))
        );
        assert!(
            matches!(plan_exclusion(&base(&n1, &n1, &part)), ExclusionPlan::Skip { reason } if reason.contains("already excluded"))
        );
    }

    #[test]
    fn the_bound_counts_what_rekindle_excluded_before() {
        let part = nodes(&[("n1", "idle"), ("n2", "idle"), ("n3", "idle"), ("n4", "idle"), ("n5", "idle")]);
        let (blamed, current, before) = (s(&["n3", "n4"]), s(&["n1"]), s(&["n1"]));
        let input = ExclusionInput { added_before: &before, ..base(&blamed, &current, &part) };
        match plan_exclusion(&input) {
            ExclusionPlan::Exclude { list, added, note } => {
                assert_eq!((list, added), (s(&["n1", "n3"]), s(&["n3"])));
                assert!(note.unwrap().contains("not n4 ([health] max_excluded_nodes = 2)"));
            }
            other => panic!("{other:?}"),
        }
        let full = s(&["n1", "n2"]);
        let input = ExclusionInput { added_before: &full, ..base(&blamed, &full, &part) };
        assert!(
            matches!(plan_exclusion(&input), ExclusionPlan::Skip { reason } if reason.contains("max_excluded_nodes = 2 reached (n1, n2"))
        );
    }

    #[test]
    fn never_so_many_that_the_partition_cannot_run_the_job() {
        let (blamed, none) = (s(&["n1"]), s(&[]));
        // n2 is down: excluding n1 would leave nothing for a one-node job.
        let part = nodes(&[("n1", "idle"), ("n2", "down*")]);
        match plan_exclusion(&base(&blamed, &none, &part)) {
            ExclusionPlan::Skip { reason } => {
                assert!(reason.contains("leave 0 usable node(s) in partition debug for a job of 1 node(s)"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let part = nodes(&[("n1", "idle"), ("n2", "idle"), ("n3", "idle")]);
        let two = ExclusionInput { nodes_needed: 3, ..base(&blamed, &none, &part) };
        assert!(matches!(plan_exclusion(&two), ExclusionPlan::Skip { .. }));
    }

    #[test]
    fn an_unknown_partition_excludes_within_the_bound_and_says_so() {
        let (blamed, none) = (s(&["n1"]), s(&[]));
        let input =
            ExclusionInput { partition: None, partition_error: Some("sinfo not found"), ..base(&blamed, &none, &[]) };
        match plan_exclusion(&input) {
            ExclusionPlan::Exclude { added, note, .. } => {
                assert_eq!(added, s(&["n1"]));
                assert!(note.unwrap().contains("sinfo not found"));
            }
            other => panic!("{other:?}"),
        }
    }
}
