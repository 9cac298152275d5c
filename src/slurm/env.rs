//! The job's allocation as SLURM describes it in the environment. Read once at
//! start, recorded in `events.jsonl` and in every checkpoint's `state.json`.

use std::collections::BTreeMap;

use serde::Serialize;

/// What the environment says about the SLURM job (all optional: without SLURM
/// everything is `None` and rekindle behaves as on a workstation).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SlurmEnv {
    pub job_id: Option<String>,
    pub array_job_id: Option<String>,
    pub array_task_id: Option<String>,
    pub restart_count: u32,
    pub node: Option<String>,
    pub nodelist: Option<String>,
    pub cpus_per_task: Option<u32>,
    pub job_gpus: Option<String>,
    pub step_gpus: Option<String>,
    pub cuda_visible_devices: Option<String>,
    pub rocr_visible_devices: Option<String>,
    pub hip_visible_devices: Option<String>,
    /// Unix time at which the job's time limit ends, when SLURM exports it.
    pub end_time: Option<i64>,
    /// The job step this process runs in (`SLURM_STEP_ID`), when launched by
    /// `srun`; `None` in the batch shell or outside SLURM.
    pub step_id: Option<String>,
    /// Tasks of this job step (`SLURM_STEP_NUM_TASKS`): how many copies of
    /// this program `srun` started. `None` outside a step (the batch shell).
    pub tasks: Option<u32>,
    /// This task's rank in the step (`SLURM_PROCID`), inside a step.
    pub procid: Option<u32>,
    /// This task's rank on its node (`SLURM_LOCALID`).
    pub localid: Option<u32>,
    /// The index of this task's node in the step (`SLURM_NODEID`).
    pub nodeid: Option<u32>,
    /// Nodes of the step (`SLURM_STEP_NUM_NODES`, else `SLURM_NNODES`).
    pub nodes: Option<u32>,
    /// Tasks on each node of the step, compressed (`SLURM_STEP_TASKS_PER_NODE`,
    /// else `SLURM_TASKS_PER_NODE`): `2(x3),1`.
    pub tasks_per_node: Option<String>,
    /// The nodes of the step, compressed (`SLURM_STEP_NODELIST`): `n[1-2]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_nodelist: Option<String>,
    /// How the step's tasks were laid out on its nodes (`SLURM_DISTRIBUTION`:
    /// `block`, `cyclic`, `plane`, `arbitrary`, with options after a `:` or
    /// `,`); unset means block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distribution: Option<String>,
}

impl SlurmEnv {
    /// Reads the process environment.
    pub fn from_process() -> SlurmEnv {
        SlurmEnv::from_map(&crate::gpu::utf8_env())
    }

    /// Reads an explicit environment (for tests).
    pub fn from_map(env: &BTreeMap<String, String>) -> SlurmEnv {
        let get = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned();
        SlurmEnv {
            job_id: get("SLURM_JOB_ID").or_else(|| get("SLURM_JOBID")),
            array_job_id: get("SLURM_ARRAY_JOB_ID"),
            array_task_id: get("SLURM_ARRAY_TASK_ID"),
            restart_count: get("SLURM_RESTART_COUNT").and_then(|v| v.parse().ok()).unwrap_or(0),
            node: get("SLURMD_NODENAME"),
            nodelist: get("SLURM_JOB_NODELIST"),
            cpus_per_task: get("SLURM_CPUS_PER_TASK").and_then(|v| v.parse().ok()),
            job_gpus: get("SLURM_JOB_GPUS"),
            step_gpus: get("SLURM_STEP_GPUS"),
            cuda_visible_devices: env.get("CUDA_VISIBLE_DEVICES").cloned(),
            rocr_visible_devices: env.get("ROCR_VISIBLE_DEVICES").cloned(),
            hip_visible_devices: env.get("HIP_VISIBLE_DEVICES").cloned(),
            end_time: get("SLURM_JOB_END_TIME").and_then(|v| v.parse().ok()),
            step_id: get("SLURM_STEP_ID").or_else(|| get("SLURM_STEPID")),
            tasks: get("SLURM_STEP_NUM_TASKS").and_then(|v| v.parse().ok()),
            procid: get("SLURM_PROCID").and_then(|v| v.parse().ok()),
            localid: get("SLURM_LOCALID").and_then(|v| v.parse().ok()),
            nodeid: get("SLURM_NODEID").and_then(|v| v.parse().ok()),
            nodes: get("SLURM_STEP_NUM_NODES").or_else(|| get("SLURM_NNODES")).and_then(|v| v.parse().ok()),
            tasks_per_node: get("SLURM_STEP_TASKS_PER_NODE").or_else(|| get("SLURM_TASKS_PER_NODE")),
            step_nodelist: get("SLURM_STEP_NODELIST"),
            distribution: get("SLURM_DISTRIBUTION"),
        }
    }

    /// True inside a SLURM job.
    pub fn in_slurm(&self) -> bool {
        self.job_id.is_some()
    }

    /// The id `scontrol` needs: `<array job>_<task>` for array tasks, else the job id.
    pub fn control_id(&self) -> Option<String> {
        match (&self.array_job_id, &self.array_task_id) {
            (Some(array), Some(task)) => Some(format!("{array}_{task}")),
            _ => self.job_id.clone(),
        }
    }

    /// This node's name: SLURMD_NODENAME, else the host name.
    pub fn node_name(&self) -> String {
        self.node.clone().unwrap_or_else(hostname)
    }
}

/// The host name, or "unknown".
pub fn hostname() -> String {
    nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> SlurmEnv {
        SlurmEnv::from_map(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    #[test]
    fn workstation_has_no_job() {
        let e = env(&[]);
        assert!(!e.in_slurm());
        assert_eq!(e.control_id(), None);
        assert_eq!(e.restart_count, 0);
    }

    #[test]
    fn array_task_is_addressed_as_array_underscore_task() {
        let e = env(&[("SLURM_JOB_ID", "1234"), ("SLURM_ARRAY_JOB_ID", "1200"), ("SLURM_ARRAY_TASK_ID", "7")]);
        assert_eq!(e.control_id().as_deref(), Some("1200_7"));
    }

    #[test]
    fn a_step_records_its_id_and_task_count() {
        let two =
            env(&[("SLURM_JOB_ID", "5"), ("SLURM_STEP_ID", "0"), ("SLURM_STEP_NUM_TASKS", "2"), ("SLURM_NTASKS", "2")]);
        assert_eq!((two.step_id.as_deref(), two.tasks), (Some("0"), Some(2)));
        let batch = env(&[("SLURM_JOB_ID", "5"), ("SLURM_NTASKS", "2")]);
        assert_eq!(batch.tasks, None, "the batch shell of a 2-task job is not a step");
    }

    #[test]
    fn reads_restart_count_node_and_end_time() {
        let e = env(&[
            ("SLURM_JOB_ID", "42"),
            ("SLURM_RESTART_COUNT", "3"),
            ("SLURMD_NODENAME", "n2"),
            ("SLURM_JOB_END_TIME", "1790000000"),
            ("CUDA_VISIBLE_DEVICES", ""),
        ]);
        assert_eq!(e.restart_count, 3);
        assert_eq!(e.node_name(), "n2");
        assert_eq!(e.end_time, Some(1_790_000_000));
        // An empty CUDA_VISIBLE_DEVICES means "no GPUs", which differs from unset.
        assert_eq!(e.cuda_visible_devices.as_deref(), Some(""));
    }
}
