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

/// Compresses node names into SLURM's node-list form, as `scontrol show
/// hostlist` would (`n1,n2,n3,n5` → `n[1-3,5]`): the inverse of
/// [`expand_hostlist`] (a round trip gives the same set of names, sorted,
/// each once). Names are grouped by the text before their trailing digits;
/// zero-padded numbers (`gpu08`) are grouped by width, so the padding
/// survives. A name without trailing digits, or holding `[`, `]` or `,`,
/// is written as it is.
///
/// A partition of 10,000 numbered nodes is a few bytes per range, so the
/// whole exclusion list stays far below the 128 KiB a single argument may
/// hold on Linux ([`MAX_ARG_BYTES`]).
pub fn compress_hostlist(names: &[String]) -> String {
    use std::collections::{BTreeMap, BTreeSet};
    // (prefix, padded width or 0 for unpadded) → numbers; plain names apart.
    let mut groups: BTreeMap<(String, usize), BTreeSet<u64>> = BTreeMap::new();
    let mut plain: BTreeSet<String> = BTreeSet::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, number) = name.split_at(name.len() - digits);
        let parsed = number.parse::<u64>().ok().filter(|_| digits <= 18);
        match parsed {
            Some(n) if !name.contains(['[', ']', ',']) => {
                let width = if number.len() > 1 && number.starts_with('0') { number.len() } else { 0 };
                groups.entry((prefix.to_string(), width)).or_default().insert(n);
            }
            _ => {
                plain.insert(name.to_string());
            }
        }
    }
    let mut items: Vec<String> = Vec::new();
    for ((prefix, width), numbers) in groups {
        // A padded group may also hold numbers as wide as the padding with
        // no leading zero (`gpu10` beside `gpu08`): those were grouped
        // unpadded, which is also correct, only less compact.
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for n in numbers {
            match ranges.last_mut() {
                Some((_, hi)) if *hi + 1 == n => *hi = n,
                _ => ranges.push((n, n)),
            }
        }
        let num = |n: u64| format!("{n:0width$}");
        if ranges.len() == 1 && ranges[0].0 == ranges[0].1 {
            items.push(format!("{prefix}{}", num(ranges[0].0)));
            continue;
        }
        let body: Vec<String> = ranges
            .iter()
            .map(|&(lo, hi)| if lo == hi { num(lo) } else { format!("{}-{}", num(lo), num(hi)) })
            .collect();
        items.push(format!("{prefix}[{}]", body.join(",")));
    }
    items.extend(plain);
    items.join(",")
}

/// The most bytes one argument of a command may hold on Linux
/// (`MAX_ARG_STRLEN`, 32 pages of 4 KiB): a longer `ExcNodeList=…` fails
/// to start with E2BIG.
pub const MAX_ARG_BYTES: usize = 128 * 1024;

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
    fn hostlists_compress_as_scontrol_show_hostlist_does() {
        assert_eq!(compress_hostlist(&s(&["n1", "n2", "n3", "n5"])), "n[1-3,5]");
        assert_eq!(compress_hostlist(&s(&["gpu09", "gpu08", "login", "n7"])), "gpu[08-09],n7,login");
        assert_eq!(compress_hostlist(&s(&["n9", "n10", "n10"])), "n[9-10]");
        assert_eq!(compress_hostlist(&s(&["r1n2", "r1n1", "r2n1"])), "r1n[1-2],r2n1");
        assert_eq!(compress_hostlist(&s(&[])), "");
    }

    #[test]
    fn a_compressed_list_expands_to_the_same_nodes() {
        let names = s(&["gpu08", "gpu10", "gpu11", "a", "n0", "n00", "n007", "x1y", "r3n4", "n99", "n100"]);
        let mut want = names.clone();
        want.sort();
        want.dedup();
        let mut back = expand_hostlist(&compress_hostlist(&names));
        back.sort();
        assert_eq!(back, want);
    }

    #[test]
    fn ten_thousand_nodes_fit_one_argument_at_any_spread() {
        // Every node of a 20,000-node partition but one in two excluded:
        // the worst spread for ranges; and 10,000 contiguous nodes.
        let every_other: Vec<String> = (0..10_000).map(|i| format!("gpu-node-{:05}", 2 * i)).collect();
        let list = compress_hostlist(&every_other);
        assert!(list.len() < MAX_ARG_BYTES / 2, "{} bytes", list.len());
        let mut back = expand_hostlist(&list);
        back.sort();
        assert!(back == every_other, "{} names back of {}", back.len(), every_other.len());
        let contiguous: Vec<String> = (1..=10_000).map(|i| format!("gpu-nid{i:06}")).collect();
        assert_eq!(compress_hostlist(&contiguous), "gpu-nid[000001-010000]");
        // Joined with commas, as it was passed before #41: past one argument.
        let joined = contiguous.join(",");
        assert!(joined.len() > MAX_ARG_BYTES, "the uncompressed list is {} bytes", joined.len());
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
