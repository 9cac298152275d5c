//! Data parallelism across ranks (`Trainer::join_world`), with ranks as
//! threads (`distributed::ThreadRank`, the same semantics as MPI's): N ranks
//! train bit for bit as one process with N replicas, every rank ends with
//! the same state, a resume of that state continues exactly, and what the
//! ranks cannot do together is refused.

use std::thread;

use super::tests::{assert_same, completed, never, tiny_gpt, tiny_mlp};
use super::*;
use crate::checkpoint::{Snapshot, TensorSet};
use crate::config::Config;
use crate::distributed::ThreadRank;

/// One process with `replicas` replicas: losses and final snapshot after `steps`.
fn one_process(cfg: &Config, replicas: usize, steps: u64) -> (Vec<f64>, Snapshot) {
    let mut t = Trainer::new(cfg).unwrap();
    let layout = Layout::fit(t.samples_per_step(), replicas, t.layout().micro_batch).unwrap();
    t.set_layout(layout).unwrap();
    let losses = (0..steps).map(|_| completed(t.train_step(&never).unwrap()).loss).collect();
    (losses, t.snapshot().unwrap())
}

/// `ranks` threads, each a trainer joined to the world, from `start` (a
/// snapshot to restore) or from scratch; every rank's losses and snapshot.
fn ranks(cfg: &Config, ranks: usize, steps: u64, start: Option<&Snapshot>) -> Vec<(Vec<f64>, Snapshot)> {
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

/// `ranks` threads with a sharded optimizer (ZeRO-1), from `start` or from
/// scratch: every rank's losses and snapshot (taken by all at once, as the
/// gather of the moments needs).
fn sharded_ranks(cfg: &Config, ranks: usize, steps: u64, start: Option<&Snapshot>) -> Vec<(Vec<f64>, Snapshot)> {
    sharded_ranks_with_parts(cfg, ranks, steps, start).into_iter().map(|(l, s, _)| (l, s)).collect()
}

/// [`sharded_ranks`], with each rank's part of a checkpoint written in parts.
fn sharded_ranks_with_parts(
    cfg: &Config,
    ranks: usize,
    steps: u64,
    start: Option<&Snapshot>,
) -> Vec<(Vec<f64>, Snapshot, TensorSet)> {
    let handles: Vec<_> = ThreadRank::world(ranks)
        .into_iter()
        .map(|rank| {
            let (cfg, start) = (cfg.clone(), start.cloned());
            thread::spawn(move || {
                let mut t = Trainer::new(&cfg).unwrap();
                t.join_world(Box::new(rank), cfg.model.dropout).unwrap();
                t.shard_optimizer().unwrap();
                // Restored after sharding, as the leader does: each rank keeps its slice.
                if let Some(s) = &start {
                    t.restore(&s.model, &s.optimizer, &s.state).unwrap();
                }
                let range = t.optimizer_shard().expect("sharded");
                let losses = (0..steps).map(|_| completed(t.train_step(&never).unwrap()).loss).collect();
                assert_eq!(t.optimizer_shard(), Some(range));
                let part = t.optimizer_part().unwrap().expect("a sharded optimizer has a part");
                (losses, t.snapshot().unwrap(), part)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn a_sharded_optimizer_trains_bit_for_bit_as_the_unsharded_one_at_the_same_world_size() {
    for cfg in [no_dropout(tiny_mlp()), no_dropout(tiny_gpt())] {
        for n in [2, 3] {
            let mut cfg = cfg.clone();
            cfg.train.batch_size = 12;
            let reference = ranks(&cfg, n, 5, None);
            for (rank, (losses, snap)) in sharded_ranks(&cfg, n, 5, None).iter().enumerate() {
                let bits = |l: &[f64]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(losses), bits(&reference[rank].0), "{:?} rank {rank} of {n}", cfg.model.kind);
                assert_same(snap, &reference[rank].1);
            }
        }
    }
}

#[test]
fn a_sharded_state_resumes_at_another_world_size_sharded_or_not() {
    let cfg = no_dropout(tiny_mlp());
    // 2 sharded ranks → 1 process, and 1 process → 2 sharded ranks, each
    // equal to the same world size unsharded from the same snapshot.
    let (_, half_two) = sharded_ranks(&cfg, 2, 3, None).remove(0);
    let (_, unsharded_two) = ranks(&cfg, 2, 3, None).remove(0);
    assert_same(&half_two, &unsharded_two);
    let mut one = Trainer::new(&cfg).unwrap();
    one.restore(&half_two.model, &half_two.optimizer, &half_two.state).unwrap();
    let mut alone = Trainer::new(&cfg).unwrap();
    alone.restore(&unsharded_two.model, &unsharded_two.optimizer, &unsharded_two.state).unwrap();
    for _ in 0..3 {
        completed(one.train_step(&never).unwrap());
        completed(alone.train_step(&never).unwrap());
    }
    assert_same(&one.snapshot().unwrap(), &alone.snapshot().unwrap());

    let (_, half_one) = one_process(&cfg, 2, 3);
    let sharded = sharded_ranks(&cfg, 2, 4, Some(&half_one));
    let unsharded = ranks(&cfg, 2, 4, Some(&half_one));
    for ((_, a), (_, b)) in sharded.iter().zip(&unsharded) {
        assert_same(a, b);
    }
}

#[test]
fn the_parts_of_sharded_ranks_saved_as_one_checkpoint_load_as_the_unsharded_state() {
    use crate::checkpoint::{CheckpointStore, Parts, Snapshot, load_dir};
    let mut cfg = no_dropout(tiny_gpt());
    cfg.train.batch_size = 12;
    let reference = ranks(&cfg, 3, 2, None).remove(0).1;
    let sharded = sharded_ranks_with_parts(&cfg, 3, 2, None);
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(tmp.path(), 3).unwrap();
    let staging = store.new_shared_staging(2, "test").unwrap();
    let staging = staging.as_str();
    let mut collect = || -> Result<Vec<_>, crate::checkpoint::PartsError> {
        let follower = CheckpointStore::open_read_only(tmp.path());
        (1..3)
            .map(|rank| {
                let (_, snap, part) = &sharded[rank];
                let share =
                    Snapshot { step: 2, model: snap.model.clone(), optimizer: part.clone(), state: snap.state.clone() };
                follower
                    .write_share(staging, rank, 3, &share, true)
                    .map_err(|e| crate::checkpoint::PartsError::RankFailed { rank, error: e.to_string() })
            })
            .collect::<Result<Vec<Vec<_>>, _>>()
            .map(|shares| shares.concat())
    };
    let (_, snap, part) = &sharded[0];
    let snapshot = Snapshot { step: 2, model: snap.model.clone(), optimizer: part.clone(), state: snap.state.clone() };
    store
        .save_with(
            &snapshot,
            Some(Parts { staging: staging.into(), world: 3, optimizer_in_parts: true, collect: &mut collect }),
        )
        .unwrap();
    let loaded = load_dir(&store.step_dir(2)).unwrap().snapshot;
    assert!(loaded.optimizer == reference.optimizer, "the parts reassemble into the unsharded moments");
    assert!(loaded.model == reference.model);
}
