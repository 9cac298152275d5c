//! `rekindle verify`, `checkpoints` and `report`: the commands that
//! look at a run directory and change nothing in it (a report writes only
//! its HTML). Together because verify and checkpoints resolve a PATH and list
//! its checkpoints, quarantined ones and strays the same way, and the report
//! is the other view of the same directory (`status.rs` the third).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::CliError;
use super::args::ReportArgs;
use crate::checkpoint::{
    CheckpointInfo, CheckpointStore, MANIFEST_FILE, QUARANTINE_DIR, VerifyLevel, parse_quarantine_name,
    parse_step_dir_name,
};
use crate::config;
use crate::exit::Outcome;
use crate::rundir;
use crate::units::human_bytes;

pub(super) fn report(args: &ReportArgs) -> Result<Outcome, CliError> {
    let path = crate::report::write_report(&args.dir.run_dir, args.out.as_deref())?;
    outln!("wrote {}", path.display());
    Ok(Outcome::Done)
}

/// What a verify/checkpoints PATH points at.
enum Target {
    One(PathBuf),
    Store(PathBuf),
}

fn resolve_target(path: &Path) -> Result<Target, CliError> {
    let is_step_dir = path.file_name().and_then(|n| parse_step_dir_name(&n.to_string_lossy())).is_some();
    if path.join(MANIFEST_FILE).exists() || (is_step_dir && path.is_dir()) {
        return Ok(Target::One(path.to_path_buf()));
    }
    let run_config = path.join(rundir::CONFIG_FILE);
    if run_config.is_file()
        && let Ok(loaded) = config::load_recorded(&run_config)
    {
        return Ok(Target::Store(rundir::checkpoints_dir(path, &loaded.config)));
    }
    if path.join(rundir::CHECKPOINTS_DIR).is_dir() {
        return Ok(Target::Store(path.join(rundir::CHECKPOINTS_DIR)));
    }
    if path.is_dir()
        && (path.join(QUARANTINE_DIR).is_dir()
            || std::fs::read_dir(path)
                .map(|rd| rd.flatten().any(|e| parse_step_dir_name(&e.file_name().to_string_lossy()).is_some()))
                .unwrap_or(false))
    {
        return Ok(Target::Store(path.to_path_buf()));
    }
    Err(CliError::NotACheckpointPath { path: path.to_path_buf() })
}

/// The checkpoints a verify/checkpoints PATH holds, and the quarantined ones
/// beside them (none when PATH is one checkpoint).
struct Listing {
    checkpoints: Vec<CheckpointInfo>,
    quarantined: Vec<CheckpointInfo>,
    /// Entries named like checkpoints that are not rekindle's (`CheckpointStore::strays`).
    strays: Vec<PathBuf>,
}

fn infos_for(path: &Path) -> Result<Listing, CliError> {
    Ok(match resolve_target(path)? {
        Target::One(dir) => {
            let step = dir
                .file_name()
                .and_then(|n| {
                    let name = n.to_string_lossy();
                    parse_step_dir_name(&name).or_else(|| parse_quarantine_name(&name))
                })
                .or_else(|| crate::checkpoint::read_manifest(&dir).ok().map(|m| m.step))
                .unwrap_or(0);
            let failures = crate::checkpoint::verify_checkpoint_dir(&dir, VerifyLevel::Full);
            let manifest = crate::checkpoint::read_manifest(&dir).ok();
            let info = CheckpointInfo {
                step,
                created_at: manifest.as_ref().map(|m| m.created_at.clone()),
                bytes: manifest.as_ref().map(|m| m.total_bytes()).unwrap_or(0),
                valid: failures.is_empty(),
                failures,
                dir,
            };
            Listing { checkpoints: vec![info], quarantined: Vec::new(), strays: Vec::new() }
        }
        Target::Store(dir) => {
            let store = CheckpointStore::open_read_only(dir);
            Listing {
                checkpoints: store.list(VerifyLevel::Full)?,
                quarantined: store.list_quarantined(VerifyLevel::Full)?,
                strays: store.strays()?,
            }
        }
    })
}

#[derive(Serialize)]
struct VerifyJson<'a> {
    path: &'a Path,
    /// Every checkpoint verifies (quarantined ones do not count: they are
    /// not checkpoints of the run any more).
    all_valid: bool,
    checkpoints: &'a [CheckpointInfo],
    quarantined: &'a [CheckpointInfo],
    /// Entries named like checkpoints that are not rekindle's, left alone.
    strays: &'a [PathBuf],
}

/// The reasons a checkpoint fails, in one line.
fn reasons(info: &CheckpointInfo) -> String {
    info.failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")
}

/// The lines that tell about entries named like checkpoints that rekindle
/// did not make (none when there are none).
fn print_strays(strays: &[PathBuf]) {
    if strays.is_empty() {
        return;
    }
    outln!(
        "{} entr{} named like checkpoints but not rekindle's (not a step-<10 digits> directory): never loaded, counted or rotated, left alone:",
        strays.len(),
        if strays.len() == 1 { "y" } else { "ies" }
    );
    for path in strays {
        outln!("      {}", path.display());
    }
}

/// The lines that tell about quarantined checkpoints (empty when there are none).
fn print_quarantined(quarantined: &[CheckpointInfo]) {
    if quarantined.is_empty() {
        return;
    }
    outln!(
        "{} quarantined checkpoint(s): they failed verification when a run resumed and were moved aside; never loaded or rotated, kept for inspection (delete them with `rm -r`, or move one back under its step- name once repaired):",
        quarantined.len()
    );
    for info in quarantined {
        let status = if info.valid { "verifies now".to_string() } else { reasons(info) };
        outln!("{:>10}  {}  {status}", info.step, info.dir.display());
    }
}

pub(super) fn verify(path: &Path, json: bool) -> Result<Outcome, CliError> {
    let Listing { checkpoints: infos, quarantined, strays } = infos_for(path)?;
    let all_valid = infos.iter().all(|i| i.valid);
    if json {
        let report = VerifyJson { path, all_valid, checkpoints: &infos, quarantined: &quarantined, strays: &strays };
        outln!("{}", serde_json::to_string_pretty(&report).expect("report serialises"));
    } else {
        if infos.is_empty() {
            outln!("{}: no checkpoints yet", path.display());
        }
        for info in &infos {
            if info.valid {
                outln!("OK    {}  ({})", info.dir.display(), human_bytes(info.bytes));
            } else {
                outln!("FAIL  {}", info.dir.display());
                for f in &info.failures {
                    outln!("      {f}");
                }
            }
        }
        let good = infos.iter().filter(|i| i.valid).count();
        if !infos.is_empty() {
            outln!("{good} of {} checkpoint(s) verify", infos.len());
        }
        print_quarantined(&quarantined);
        print_strays(&strays);
    }
    Ok(if all_valid { Outcome::Done } else { Outcome::Failure })
}

pub(super) fn checkpoints(path: &Path, json: bool) -> Result<Outcome, CliError> {
    let Listing { checkpoints: infos, quarantined, strays } = infos_for(path)?;
    let resume_step = infos.iter().find(|i| i.valid).map(|i| i.step);
    if json {
        #[derive(Serialize)]
        struct ListJson<'a> {
            resume_step: Option<u64>,
            checkpoints: &'a [CheckpointInfo],
            quarantined: &'a [CheckpointInfo],
            strays: &'a [PathBuf],
        }
        let list = ListJson { resume_step, checkpoints: &infos, quarantined: &quarantined, strays: &strays };
        outln!("{}", serde_json::to_string_pretty(&list).unwrap());
        return Ok(Outcome::Done);
    }
    if infos.is_empty() {
        outln!("no checkpoints in {}", path.display());
    } else {
        outln!("{:>10}  {:<24}  {:>10}  status", "step", "created", "size");
    }
    for info in &infos {
        let status = if info.valid {
            if Some(info.step) == resume_step { "valid (resume point)".to_string() } else { "valid".to_string() }
        } else {
            format!("INVALID: {}", reasons(info))
        };
        outln!(
            "{:>10}  {:<24}  {:>10}  {status}",
            info.step,
            info.created_at.as_deref().unwrap_or("-"),
            human_bytes(info.bytes)
        );
    }
    print_quarantined(&quarantined);
    print_strays(&strays);
    Ok(Outcome::Done)
}
