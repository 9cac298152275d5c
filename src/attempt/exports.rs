//! The exports of an attempt (`[telemetry] tensorboard`,
//! `prometheus_textfile`), as both drivers start them: where they go for
//! this run and job, and the step the attempt resumed from. The exporter
//! itself (`telemetry::Exporter`) follows the run's records; this file
//! only turns the config and the allocation into its options.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{Config, TensorBoardSetting};
use crate::gpu::STATS_FILE;
use crate::rundir::{EVENTS_FILE, METRICS_FILE, RunDir, TENSORBOARD_DIR, TENSORBOARD_RECORD};
use crate::slurm::SlurmEnv;
use crate::telemetry::{ExportOptions, Exporter, PromLabels, TensorBoardTarget};

/// How often the exports read the run's records.
pub const EXPORT_INTERVAL: Duration = Duration::from_secs(1);

/// What `{job}` stands for outside SLURM.
pub const NO_JOB: &str = "local";

/// `path` with `{run}` and `{job}` replaced (the config checked that no
/// other placeholder is there).
fn expand(path: &str, cfg: &Config, slurm: &SlurmEnv) -> PathBuf {
    let job = slurm.control_id().unwrap_or_else(|| NO_JOB.to_string());
    PathBuf::from(path.replace("{run}", &cfg.run.name).replace("{job}", &job))
}

/// The options of an attempt that resumed from `resume_step` (0: fresh).
pub fn options(cfg: &Config, dir: &RunDir, slurm: &SlurmEnv, resume_step: u64) -> ExportOptions {
    let tensorboard = match &cfg.telemetry.tensorboard {
        TensorBoardSetting::Enabled(true) => Some(dir.path(TENSORBOARD_DIR)),
        TensorBoardSetting::Enabled(false) => None,
        TensorBoardSetting::Dir(path) => Some(expand(path, cfg, slurm)),
    };
    let tensorboard = tensorboard.map(|tb| TensorBoardTarget { dir: tb, record: dir.path(TENSORBOARD_RECORD) });
    ExportOptions {
        metrics: dir.path(METRICS_FILE),
        events: dir.path(EVENTS_FILE),
        gpu_stats: dir.path(STATS_FILE),
        tensorboard,
        prometheus_textfile: cfg.telemetry.prometheus_textfile.as_deref().map(|p| expand(p, cfg, slurm)),
        labels: PromLabels {
            run: cfg.run.name.clone(),
            job: slurm.control_id().unwrap_or_default(),
            node: slurm.node_name(),
        },
        resume_step,
        interval: EXPORT_INTERVAL,
    }
}

/// Starts the exports of an attempt once `metrics.jsonl` is trimmed to
/// `resume_step`; dropping the result ends them (after the attempt's last
/// records).
pub fn start(cfg: &Config, dir: &RunDir, slurm: &SlurmEnv, resume_step: u64) -> Exporter {
    Exporter::start(options(cfg, dir, slurm, resume_step))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn paths_name_the_run_and_the_job() {
        let mut cfg = Config::default();
        cfg.run.name = "lr-3e-4".into();
        let dir = RunDir { root: "runs/x".into(), checkpoints: "runs/x/checkpoints".into() };
        let env = |pairs: &[(&str, &str)]| {
            SlurmEnv::from_map(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>())
        };
        let array = env(&[("SLURM_JOB_ID", "101"), ("SLURM_ARRAY_JOB_ID", "100"), ("SLURM_ARRAY_TASK_ID", "3")]);
        let o = options(&cfg, &dir, &array, 7);
        let tb = o.tensorboard.unwrap();
        assert_eq!((tb.dir, tb.record), ("runs/x/tensorboard".into(), "runs/x/tensorboard.files".into()));
        assert_eq!((o.prometheus_textfile, o.resume_step, o.labels.job.as_str()), (None, 7, "100_3"));
        cfg.telemetry.tensorboard = TensorBoardSetting::Dir("/tb/{run}/{job}".into());
        cfg.telemetry.prometheus_textfile = Some("/prom/rekindle-{run}-{job}.prom".into());
        let o = options(&cfg, &dir, &env(&[]), 0);
        assert_eq!(o.tensorboard.map(|tb| tb.dir), Some(PathBuf::from("/tb/lr-3e-4/local")));
        assert_eq!(o.prometheus_textfile, Some(PathBuf::from("/prom/rekindle-lr-3e-4-local.prom")));
        assert_eq!(o.labels.job, "");
        cfg.telemetry.tensorboard = TensorBoardSetting::Enabled(false);
        assert_eq!(options(&cfg, &dir, &array, 0).tensorboard, None);
    }
}
