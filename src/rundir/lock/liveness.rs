//! Whether the process that holds a lock still runs on this host: its pid
//! exists, and it is the same process (its start time and the kernel's boot
//! id match what the lock recorded, so a reused pid is no holder).

use std::fs;

use super::LockInfo;

/// The kernel's boot id (Linux), if it can be read.
pub(super) fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The fields of `/proc/<pid>/stat` after the command name (which may hold
/// spaces and parentheses, so fields are counted after the last `)`):
/// field 3, the state, comes first.
fn proc_stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_string).collect())
}

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`).
pub(super) fn proc_start(pid: u32) -> Option<u64> {
    proc_stat_fields(pid)?.get(19)?.parse().ok()
}

/// Whether process `pid` has exited and waits only to be reaped (a zombie,
/// state `Z`, or dead, `X`): it exists for `kill(pid, 0)` but will never
/// write again. A holder killed with its parent (mpirun SIGKILLed while its
/// ranks ran) stays a zombie until something reaps it, which in a container
/// without a reaping init may be never.
fn exited(pid: u32) -> bool {
    proc_stat_fields(pid).is_some_and(|f| matches!(f.first().map(String::as_str), Some("Z" | "X")))
}

pub(super) fn pid_alive(pid: u32) -> bool {
    // Pid 0 (and what does not fit a pid_t) would signal a process group.
    let Ok(raw) = i32::try_from(pid) else { return false };
    if raw <= 0 {
        return false;
    }
    // Signal 0 checks existence; EPERM means it exists but is not ours.
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    }
}

/// Whether the process that wrote `held` still runs on this host.
pub(crate) fn holder_alive(held: &LockInfo) -> bool {
    if let (Some(theirs), Some(ours)) = (&held.boot_id, boot_id())
        && *theirs != ours
    {
        return false;
    }
    if !pid_alive(held.pid) || exited(held.pid) {
        return false;
    }
    match (held.proc_start, proc_start(held.pid)) {
        (Some(recorded), Some(now)) => recorded == now,
        _ => true,
    }
}
