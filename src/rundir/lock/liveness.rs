//! Whether the process that holds a lock still runs on this host: its pid
//! exists, and it is the same process (its start time and the kernel's boot
//! id match what the lock recorded, so a reused pid is no holder).

use std::fs;

use super::LockInfo;

/// The kernel's boot id (Linux), if it can be read.
pub(super) fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`; the command name before it may hold spaces and
/// parentheses, so fields are counted after the last `)`).
pub(super) fn proc_start(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
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
    if !pid_alive(held.pid) {
        return false;
    }
    match (held.proc_start, proc_start(held.pid)) {
        (Some(recorded), Some(now)) => recorded == now,
        _ => true,
    }
}
