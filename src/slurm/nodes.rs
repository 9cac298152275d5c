//! SLURM's node lists: the compressed form `scontrol` prints (`n[1-3,5]`),
//! and a partition's nodes as `sinfo` lists them.

/// One node of the partition, as `sinfo -N -h -o "%N %t"` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionNode {
    pub name: String,
    /// The short state (`idle`, `alloc`, `mix`, `down*`, `drain`, …).
    pub state: String,
}

impl PartitionNode {
    /// Whether SLURM could start a job on it (not down, drained, failed, …).
    pub fn usable(&self) -> bool {
        let base = self.state.trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-', '+']);
        !["down", "drain", "drng", "fail", "maint", "unk", "inval", "npc", "pow_dn", "powered"]
            .iter()
            .any(|bad| base.starts_with(bad))
    }
}

/// Parses `sinfo -h -N -o "%N %t"` output: a node and its short state a line.
pub fn parse_sinfo_nodes(output: &str) -> Vec<PartitionNode> {
    let mut nodes: Vec<PartitionNode> = output
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            Some(PartitionNode { name: words.next()?.to_string(), state: words.next()?.to_string() })
        })
        .collect();
    // A node in several partitions is listed once per partition.
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes.dedup_by(|a, b| a.name == b.name);
    nodes
}

/// Expands a SLURM node list (`n[1-3,5],gpu[01-02]x,login`) into names;
/// `(null)` and the empty string are no nodes. Text it cannot read is kept
/// as one name, as written.
pub fn expand_hostlist(list: &str) -> Vec<String> {
    let list = list.trim();
    if list.is_empty() || list == "(null)" {
        return Vec::new();
    }
    split_top(list).into_iter().flat_map(|item| expand_one(&item)).collect()
}

/// Splits at the commas outside brackets.
fn split_top(list: &str) -> Vec<String> {
    let (mut items, mut depth, mut current) = (Vec::new(), 0usize, String::new());
    for c in list.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    items.push(current);
    items.into_iter().map(|i| i.trim().to_string()).filter(|i| !i.is_empty()).collect()
}

fn expand_one(item: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (item.find('['), item.find(']')) else { return vec![item.to_string()] };
    if close < open {
        return vec![item.to_string()];
    }
    let (prefix, ranges, rest) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    let mut out = Vec::new();
    for range in ranges.split(',').map(str::trim) {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let (Ok(a), Ok(b)) = (lo.parse::<u64>(), hi.parse::<u64>()) else { return vec![item.to_string()] };
        if b < a || b - a > 100_000 {
            return vec![item.to_string()];
        }
        let width = lo.len();
        for n in a..=b {
            for tail in expand_one(rest) {
                out.push(format!("{prefix}{n:0width$}{tail}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn hostlists_expand_as_slurm_writes_them() {
        assert_eq!(expand_hostlist("n[1-3,5]"), s(&["n1", "n2", "n3", "n5"]));
        assert_eq!(expand_hostlist("gpu[08-10],login"), s(&["gpu08", "gpu09", "gpu10", "login"]));
        assert_eq!(expand_hostlist("r[1-2]n[1-2]"), s(&["r1n1", "r1n2", "r2n1", "r2n2"]));
        assert_eq!(expand_hostlist("(null)"), s(&[]));
        assert_eq!(expand_hostlist(""), s(&[]));
        assert_eq!(expand_hostlist("odd[x-y]"), s(&["odd[x-y]"]));
    }

    #[test]
    fn node_states_that_cannot_run_a_job_are_not_usable() {
        for (state, usable) in
            [("idle", true), ("mix", true), ("alloc", true), ("idle~", true), ("down*", false), ("drain", false)]
        {
            assert_eq!(PartitionNode { name: "n".into(), state: state.into() }.usable(), usable, "{state}");
        }
    }

    #[test]
    fn sinfo_lines_become_nodes_once_each() {
        let nodes = parse_sinfo_nodes("n1 idle\nn2 down*\nn1 idle\n\n");
        assert_eq!(nodes.len(), 2);
        assert_eq!((nodes[1].name.as_str(), nodes[1].usable()), ("n2", false));
    }
}
