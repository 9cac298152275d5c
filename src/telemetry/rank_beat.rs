//! The heartbeat of one rank of a data-parallel run (or of one task of an
//! `exec` job step of several), rewritten by that rank every tenth of
//! `[distributed] timeout` into its node's folder on node-local storage, and
//! carried by its node's writer into `ranks/node-<node>.json`
//! (`attempt::rank_watch`).

use serde::{Deserialize, Serialize};

/// One rank's heartbeat file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RankBeat {
    pub rank: usize,
    pub node: String,
    pub pid: u32,
    /// The launch this beat belongs to (chosen by rank 0, the same on every
    /// rank of one launch): a file left by an earlier launch is not a beat.
    pub session: String,
    /// Grows with every rewrite: a beat that changes is a rank alive.
    pub seq: u64,
    /// The last step this rank completed (`None`: none yet in this launch).
    pub step: Option<u64>,
    /// The rank ended its run normally: it will not beat again and is not lost.
    pub done: bool,
    /// When it was written (RFC 3339, UTC), for people; ranks compare `seq`.
    pub time: String,
}

/// The file name of rank `rank`'s heartbeat in its node's folder.
pub fn rank_beat_file(rank: usize) -> String {
    format!("rank-{rank}.json")
}
