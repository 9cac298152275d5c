//! Data parallelism across ranks (`Trainer::join_world`), with ranks as
//! threads (`distributed::ThreadRank`, the same semantics as MPI's): N ranks
//! train bit for bit as one process with N replicas, every rank ends with
//! the same state, a resume of that state continues exactly, and what the
//! ranks cannot do together is refused.

use std::thread;

use super::tests::{assert_same, completed, never, tiny_gpt, tiny_mlp};
use super::*;
use crate::config::Config;
use crate::distributed::ThreadRank;

/// One process with `replicas` replicas: losses and final snapshot after `steps`.
fn one_process(cfg: &Config, replicas: usize, steps: u64) -> (Vec<f64>, TrainSnapshot) {
    let mut t = Trainer::new(cfg).unwrap();
    let layout = Layout::fit(t.samples_per_step(), replicas, t.layout().micro_batch).unwrap();
    t.set_layout(layout).unwrap();
    let losses = (0..steps).map(|_| completed(t.train_step(&never).unwrap()).loss).collect();
    (losses, t.snapshot().unwrap())
}

/// `ranks` threads, each a trainer joined to the world, from `start` (a
/// snapshot to restore) or from scratch; every rank's losses and snapshot.
fn ranks(cfg: &Config, ranks: usize, steps: u64, start: Option<&TrainSnapshot>) -> Vec<(Vec<f64>, TrainSnapshot)> {
    let handles: Vec<_> = ThreadRank::world(ranks)
        .into_iter()
        .map(|rank| {
            let (cfg, start) = (cfg.clone(), start.cloned());
            thread::spawn(move || {
                let mut t = Trainer::new(&cfg).unwrap();
                if let Some(s) = &start {
                    t.restore(&s.model, &s.optimizer, &s.state).unwrap();
                }
                t.join_world(Box::new(rank), cfg.model.dropout).unwrap();
                let losses = (0..steps).map(|_| completed(t.train_step(&never).unwrap()).loss).collect();
                (losses, t.snapshot().unwrap())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn no_dropout(mut cfg: Config) -> Config {
    cfg.model.dropout = 0.0;
    cfg
}

#[test]
fn two_and_four_ranks_train_bit_for_bit_as_one_process_with_as_many_replicas() {
    for cfg in [no_dropout(tiny_mlp()), no_dropout(tiny_gpt())] {
        for n in [2, 4] {
            let (ref_losses, ref_snap) = one_process(&cfg, n, 6);
            for (rank, (losses, snap)) in ranks(&cfg, n, 6, None).iter().enumerate() {
                let bits = |l: &[f64]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(losses), bits(&ref_losses), "{:?} rank {rank} of {n}: losses", cfg.model.kind);
                assert_same(snap, &ref_snap);
            }
        }
    }
}

#[test]
fn ranks_resumed_from_a_snapshot_continue_exactly() {
    let cfg = no_dropout(tiny_mlp());
    let (_, straight) = one_process(&cfg, 2, 8);
    let (_, half) = one_process(&cfg, 2, 3);
    for (_, snap) in ranks(&cfg, 2, 5, Some(&half)) {
        assert_same(&snap, &straight);
    }
}

#[test]
fn what_ranks_cannot_do_together_is_refused_with_the_key() {
    let mut cfg = tiny_mlp();
    cfg.model.dropout = 0.1;
    let mut world = ThreadRank::world(2).into_iter();
    let err = Trainer::new(&cfg).unwrap().join_world(Box::new(world.next().unwrap()), 0.1).unwrap_err();
    assert!(err.to_string().contains("model.dropout"), "{err}");

    let mut cfg = no_dropout(tiny_mlp());
    cfg.train.batch_size = 3;
    cfg.train.grad_accum = 1;
    let err = Trainer::new(&cfg).unwrap().join_world(Box::new(ThreadRank::world(2).remove(0)), 0.0).unwrap_err();
    assert!(err.to_string().contains("multiple of 2"), "{err}");

    let mut cfg = no_dropout(tiny_mlp());
    cfg.train.on_nonfinite = crate::config::OnNonFinite::Rollback;
    let err = Trainer::new(&cfg).unwrap().join_world(Box::new(ThreadRank::world(2).remove(0)), 0.0).unwrap_err();
    assert!(err.to_string().contains("train.on_nonfinite"), "{err}");

    // A world of one changes nothing.
    let cfg = no_dropout(tiny_mlp());
    let mut t = Trainer::new(&cfg).unwrap();
    t.join_world(Box::new(ThreadRank::world(1).remove(0)), 0.0).unwrap();
    assert_eq!(t.rank_and_size(), (0, 1));
}
