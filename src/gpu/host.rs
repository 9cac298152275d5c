//! Host statistics next to the GPU ones: CPU use and RAM through `sysinfo`,
//! free disk on the checkpoint filesystem through `statvfs`.
//!
//! Free disk is read with `statvfs` on the directory itself rather than from
//! `sysinfo`'s disk list: that list leaves out tmpfs and NFS/CIFS mounts (the
//! usual home of a cluster's checkpoints), so matching a directory to it
//! would report the root filesystem instead.

use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sysinfo::{MemoryRefreshKind, RefreshKind, System};

const MIB: u64 = 1 << 20;

/// One host sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostStats {
    /// Mean use over all CPUs since the previous sample, 0–100.
    pub cpu_pct: f32,
    pub ram_used_mib: u64,
    pub ram_total_mib: u64,
    /// Free space (for an unprivileged user) on the filesystem of the watched
    /// directory; `None` when it cannot be read.
    pub disk_free_mib: Option<u64>,
}

/// Samples the host; injectable for tests.
pub trait HostProbe: Send {
    fn sample(&mut self) -> HostStats;
}

/// The real host: `sysinfo` for CPU and RAM, `statvfs` for `disk_dir`.
pub struct SysinfoHost {
    system: Option<System>,
    disk_dir: PathBuf,
}

impl SysinfoHost {
    /// Watches the filesystem holding `disk_dir` (or its nearest existing
    /// ancestor, for a directory not created yet).
    pub fn new(disk_dir: impl Into<PathBuf>) -> SysinfoHost {
        let refresh = RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram());
        let system = System::new_with_specifics(refresh).ok().map(|mut system| {
            // CPU use is a difference between two refreshes: take the first now.
            system.refresh_cpu_usage();
            system
        });
        SysinfoHost { system, disk_dir: disk_dir.into() }
    }
}

impl HostProbe for SysinfoHost {
    fn sample(&mut self) -> HostStats {
        let disk_free_mib = free_disk_bytes(&self.disk_dir).ok().map(|b| b / MIB);
        let Some(system) = self.system.as_mut() else {
            return HostStats { cpu_pct: 0.0, ram_used_mib: 0, ram_total_mib: 0, disk_free_mib };
        };
        system.refresh_cpu_usage();
        system.refresh_memory();
        HostStats {
            cpu_pct: system.global_cpu_usage(),
            ram_used_mib: system.used_memory() / MIB,
            ram_total_mib: system.total_memory() / MIB,
            disk_free_mib,
        }
    }
}

/// Bytes available to an unprivileged user on the filesystem holding `dir`
/// (or its nearest existing ancestor).
pub fn free_disk_bytes(dir: &Path) -> io::Result<u64> {
    let existing = nearest_existing(dir)?;
    let st = nix::sys::statvfs::statvfs(&existing).map_err(io::Error::from)?;
    Ok((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
}

/// `dir` itself if it exists, else its closest existing ancestor.
pub(crate) fn nearest_existing(dir: &Path) -> io::Result<PathBuf> {
    let absolute = if dir.is_absolute() { dir.to_path_buf() } else { std::env::current_dir()?.join(dir) };
    absolute
        .ancestors()
        .find(|p| p.exists())
        .map(Path::to_path_buf)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no existing ancestor of {}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_disk_of_a_directory_not_created_yet_is_its_ancestors() {
        let dir = tempfile::tempdir().unwrap();
        let here = free_disk_bytes(dir.path()).unwrap();
        let later = free_disk_bytes(&dir.path().join("run/checkpoints")).unwrap();
        assert!(here > 0);
        // Same filesystem; other tests may write meanwhile, so allow some drift.
        assert!(here.abs_diff(later) < 1 << 30, "{here} vs {later}");
    }

    #[test]
    fn sysinfo_host_reports_memory_and_disk() {
        let dir = tempfile::tempdir().unwrap();
        let stats = SysinfoHost::new(dir.path()).sample();
        assert!(stats.ram_total_mib > 0);
        assert!(stats.ram_used_mib <= stats.ram_total_mib);
        assert!((0.0..=100.0).contains(&stats.cpu_pct));
        assert!(stats.disk_free_mib.is_some());
    }
}
