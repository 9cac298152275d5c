//! Ranks of a data-parallel world, launched for real: `mpirun -n N
//! rekindle …` (OpenMPI, no SLURM). The collective sum every data-parallel
//! step uses must be exact (each rank checks it against the sum it computes
//! alone, bit for bit) and deterministic; a binary built without the `mpi`
//! feature must refuse to be one of several ranks, naming the feature.

use crate::support;

use std::process::{Command, Output};

use serde_json::Value;

use support::requires;
use support::runs::rekindle;

/// `mpirun -n ranks rekindle ARGS…` as root on a 2-vCPU machine: no core
/// binding (both ranks pinned to one core are ~25× slower, FACTS.md), and
/// more ranks than cores allowed.
fn mpirun(ranks: usize, args: &[&str]) -> Output {
    let exe = rekindle().get_program().to_owned();
    Command::new("mpirun")
        .args(["-n", &ranks.to_string(), "--bind-to", "none", "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .arg(exe)
        .args(args)
        .output()
        .expect("run mpirun")
}

fn json_of(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("one JSON report from rank 0 ({e}):\n{stdout}"))
}

#[test]
fn the_rank_order_sum_over_two_and_three_ranks_is_exact_and_deterministic() {
    let Some(()) = requires::mpi() else { return };
    for ranks in [2, 3] {
        // An odd length: chunks of different sizes.
        let report =
            json_of(&mpirun(ranks, &["bench", "collective", "--bytes", "400012", "--iterations", "3", "--json"]));
        assert_eq!(report["world_size"], ranks, "{report}");
        assert_eq!(report["engine"], "mpi", "{report}");
        assert_eq!(report["launcher"], "mpirun", "{report}");
        assert_eq!(report["exact_and_deterministic"], true, "{report}");
        assert!(report["library"].as_str().is_some_and(|l| l.contains("Open MPI")), "{report}");
    }
}

#[test]
fn one_process_needs_no_mpi() {
    let out =
        rekindle().args(["bench", "collective", "--bytes", "4096", "--iterations", "2", "--json"]).output().unwrap();
    let report = json_of(&out);
    assert_eq!((report["world_size"].as_u64(), report["engine"].as_str()), (Some(1), Some("solo")), "{report}");
}

#[test]
fn a_rank_of_a_bigger_world_is_refused_without_the_mpi_feature_and_named_with_it() {
    // What mpirun tells each rank, without mpirun: a build without the
    // feature must refuse at once; a build with it must not pretend to be
    // alone (MPI_Init finds no world of 2 and the mismatch is named).
    let out = rekindle()
        .args(["bench", "collective", "--bytes", "4096"])
        .env("SLURM_STEP_NUM_TASKS", "2")
        .env("SLURM_PROCID", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    if cfg!(feature = "mpi") {
        assert!(stderr.contains("srun --mpi=pmix"), "{stderr}");
    } else {
        assert!(stderr.contains("without the `mpi` feature") && stderr.contains("--features mpi"), "{stderr}");
    }
}
