//! Layouts at work: data-parallel CPU replicas and micro-batch sizes give
//! the same training as one replica with accumulation (within float
//! summation order), resume stays bit-exact with replicas, and the
//! out-of-memory back-off retries a step with a smaller micro-batch and
//! ends exactly where a run with that micro-batch from the start does.

use candle_core::{Device, Tensor};
use candle_nn::VarBuilder;

use super::tests::{assert_same, completed, never, tiny_gpt, tiny_mlp, train_to};
use super::*;
use crate::checkpoint::Snapshot;
use crate::config::Config;

/// Relative tolerance for runs whose only difference is float summation
/// order (f32 gradients summed in another grouping), after a few AdamW steps.
const LOSS_TOLERANCE: f64 = 1e-5;
/// Absolute tolerance on parameters after the same steps (lr 1e-2).
const PARAM_TOLERANCE: f32 = 1e-5;

fn with_layout(cfg: &Config, layout: Layout) -> Trainer {
    let mut trainer = Trainer::new(cfg).unwrap();
    trainer.set_layout(layout).unwrap();
    trainer
}

/// The losses of `steps` steps and the final snapshot.
fn train(cfg: &Config, layout: Layout, steps: u64) -> (Vec<f64>, Snapshot) {
    let mut trainer = with_layout(cfg, layout);
    let losses = (0..steps).map(|_| completed(trainer.train_step(&never).unwrap()).loss).collect();
    (losses, trainer.snapshot().unwrap())
}

/// Asserts losses within [`LOSS_TOLERANCE`] and parameters within
/// [`PARAM_TOLERANCE`], and that the data position and counters agree
/// exactly (same samples consumed). Measured here: parameters differ by
/// about 1e-7 after 8 steps.
fn assert_close(what: &str, (losses, snap): &(Vec<f64>, Snapshot), (ref_losses, ref_snap): &(Vec<f64>, Snapshot)) {
    for (step, (a, b)) in losses.iter().zip(ref_losses).enumerate() {
        assert!((a - b).abs() <= LOSS_TOLERANCE * b.abs(), "{what}: loss of step {} is {a}, reference {b}", step + 1);
    }
    let mut worst = 0.0f32;
    for (name, t) in &snap.model {
        for (x, y) in t.to_f32().unwrap().iter().zip(ref_snap.model[name].to_f32().unwrap()) {
            worst = worst.max((x - y).abs());
        }
    }
    assert!(worst <= PARAM_TOLERANCE, "{what}: parameters differ by up to {worst}");
    for key in ["cursor", "counters", "step", "optimizer_step"] {
        assert_eq!(snap.state[key], ref_snap.state[key], "{what}: `{key}` differs");
    }
}

#[test]
fn two_and_four_cpu_replicas_match_one_replica_with_accumulation() {
    let mut cfg = tiny_mlp();
    cfg.model.dropout = 0.0;
    cfg.train.batch_size = 4;
    cfg.train.grad_accum = 8;
    let steps = 8;
    let reference = train(&cfg, Layout::single(4, 8), steps);
    for layout in [
        Layout { replicas: 2, micro_batch: 4, grad_accum: 4 },
        Layout { replicas: 4, micro_batch: 4, grad_accum: 2 },
        Layout { replicas: 4, micro_batch: 8, grad_accum: 1 },
    ] {
        let run = train(&cfg, layout, steps);
        assert_close(&layout.to_string(), &run, &reference);
    }
    let mut gpt = tiny_gpt();
    gpt.model.dropout = 0.0;
    gpt.train.grad_accum = 2;
    let reference = train(&gpt, Layout::single(4, 2), 4);
    let run = train(&gpt, Layout { replicas: 2, micro_batch: 2, grad_accum: 2 }, 4);
    assert_close("gpt, 2 replicas", &run, &reference);
}

#[test]
fn micro_batch_size_changes_only_summation_order() {
    let mut cfg = tiny_mlp();
    cfg.model.dropout = 0.0;
    cfg.train.batch_size = 32;
    let reference = train(&cfg, Layout::single(32, 1), 6);
    for micro in [16, 8, 1] {
        let layout = Layout::fit(32, 1, micro).unwrap();
        assert_close(&layout.to_string(), &train(&cfg, layout, 6), &reference);
    }
}

#[test]
fn the_single_layout_is_the_config_as_written_bit_for_bit() {
    let mut cfg = tiny_mlp();
    cfg.train.batch_size = 8;
    cfg.train.grad_accum = 2;
    let mut plain = Trainer::new(&cfg).unwrap();
    assert_eq!(plain.layout(), Layout::single(8, 2));
    let mut set = with_layout(&cfg, Layout::single(8, 2));
    assert_eq!(train_to(&mut plain, 5), train_to(&mut set, 5));
    assert_same(&plain.snapshot().unwrap(), &set.snapshot().unwrap());
}

#[test]
fn resume_with_replicas_is_bit_exact() {
    for (cfg, layout, k, n) in [
        (tiny_mlp(), Layout { replicas: 2, micro_batch: 4, grad_accum: 2 }, 3, 7),
        (tiny_mlp(), Layout { replicas: 4, micro_batch: 2, grad_accum: 2 }, 2, 5),
        (tiny_gpt(), Layout { replicas: 2, micro_batch: 2, grad_accum: 1 }, 2, 4),
    ] {
        // Dropout is on in both configs: its stream is drawn replica by
        // replica, micro-batch by micro-batch, and must resume exactly.
        assert!(cfg.model.dropout > 0.0);
        let mut straight = with_layout(&cfg, layout);
        let straight_losses = train_to(&mut straight, n);

        let mut first = with_layout(&cfg, layout);
        let mut losses = train_to(&mut first, k);
        let snap = first.snapshot().unwrap();
        drop(first);
        let mut resumed = with_layout(&cfg, layout);
        resumed.restore(&snap.model, &snap.optimizer, &snap.state).unwrap();
        losses.extend(train_to(&mut resumed, n));
        assert_eq!(losses, straight_losses, "{layout}: losses differ after resume");
        assert_same(&resumed.snapshot().unwrap(), &straight.snapshot().unwrap());
    }
}

#[test]
fn layouts_that_change_the_effective_batch_are_refused() {
    let mut cfg = tiny_mlp();
    cfg.train.batch_size = 8;
    let mut trainer = Trainer::new(&cfg).unwrap();
    for bad in [
        Layout { replicas: 2, micro_batch: 8, grad_accum: 1 },
        Layout { replicas: 1, micro_batch: 3, grad_accum: 2 },
        Layout { replicas: 0, micro_batch: 8, grad_accum: 1 },
    ] {
        let err = trainer.set_layout(bad).unwrap_err();
        assert!(matches!(&err, TrainError::Config { key, .. } if key == "train.micro_batch"), "{bad:?}: {err}");
    }
    assert_eq!(trainer.layout(), Layout::single(8, 1));
}

/// Out of memory as candle's CUDA backend reports it.
const CUDA_OOM: &str = "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")";

/// The built-in mlp, except that a training micro-batch of more than
/// `limit` samples fails with `message` (by default, out of memory).
struct RunsOutOfMemory {
    inner: Box<dyn Workload>,
    limit: usize,
    message: &'static str,
}

impl Workload for RunsOutOfMemory {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn build(&mut self, vb: VarBuilder<'_>) -> candle_core::Result<()> {
        self.inner.build(vb)
    }

    fn num_samples(&self, split: Split) -> usize {
        self.inner.num_samples(split)
    }

    fn batch(&self, split: Split, indices: &[usize], device: &Device) -> candle_core::Result<Batch> {
        self.inner.batch(split, indices, device)
    }

    fn loss(&self, batch: &Batch, ctx: &mut ForwardCtx<'_>) -> candle_core::Result<Tensor> {
        if ctx.is_training() && batch.inputs.dim(0)? > self.limit {
            candle_core::bail!("{}", self.message);
        }
        self.inner.loss(batch, ctx)
    }
}

fn limited(cfg: &Config, limit: usize) -> Trainer {
    failing(cfg, limit, CUDA_OOM)
}

fn failing(cfg: &Config, limit: usize, message: &'static str) -> Trainer {
    let inner = builtin_workload(cfg).unwrap();
    Trainer::with_workload(cfg, Box::new(RunsOutOfMemory { inner, limit, message })).unwrap()
}

#[test]
fn out_of_memory_halves_the_micro_batch_and_retries_the_same_step() {
    let mut cfg = tiny_mlp();
    cfg.train.batch_size = 32;
    let mut trainer = limited(&cfg, 5);
    let mut retries = Vec::new();
    for _ in 0..4 {
        completed(trainer.train_step_with_backoff(&never, &mut |r| retries.push(r.clone())).unwrap());
    }
    // 32 → 16 → 8 → 4 on the first step; later steps keep micro-batch 4.
    let micro: Vec<(usize, usize)> = retries.iter().map(|r| (r.from.micro_batch, r.to.micro_batch)).collect();
    assert_eq!(micro, [(32, 16), (16, 8), (8, 4)]);
    assert!(retries.iter().all(|r| r.step == 1 && r.to.samples_per_step() == 32));
    assert_eq!(retries.iter().map(|r| r.retry).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(retries[0].error.contains("out of memory"), "{}", retries[0].error);
    assert_eq!(trainer.layout(), Layout { replicas: 1, micro_batch: 4, grad_accum: 8 });
    assert_eq!(trainer.samples_per_step(), 32, "the effective batch is unchanged");

    // Exactly the run that used micro-batch 4 from the start: the failed
    // attempts left nothing behind.
    let mut reference = with_layout(&cfg, Layout { replicas: 1, micro_batch: 4, grad_accum: 8 });
    train_to(&mut reference, 4);
    assert_same(&trainer.snapshot().unwrap(), &reference.snapshot().unwrap());
}

#[test]
fn out_of_memory_gives_up_after_five_retries_and_leaves_the_state_as_it_was() {
    let mut cfg = tiny_mlp();
    cfg.train.batch_size = 128;
    cfg.data.synthetic_samples = 400;
    let mut trainer = limited(&cfg, 0);
    let before = trainer.snapshot().unwrap();
    let mut retries = Vec::new();
    let err = trainer.train_step_with_backoff(&never, &mut |r| retries.push(r.clone())).unwrap_err();
    assert_eq!(retries.len() as u32, MAX_OOM_RETRIES);
    match &err {
        TrainError::OutOfMemoryRetriesExhausted { step: 1, attempts: 6, retries: 5, micro_batch: 4, .. } => {}
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("ran out of memory 6 time(s)"), "{err}");
    assert_same(&trainer.snapshot().unwrap(), &before);

    // At one sample per micro-batch there is nothing left to halve.
    cfg.train.batch_size = 1;
    let mut one = limited(&cfg, 0);
    let err = one.train_step_with_backoff(&never, &mut |_| panic!("no retry possible")).unwrap_err();
    assert!(matches!(err, TrainError::OutOfMemoryRetriesExhausted { attempts: 1, retries: 0, .. }), "{err}");
}

#[test]
fn errors_other_than_out_of_memory_are_not_retried() {
    let mut trainer = failing(&tiny_mlp(), 0, "matmul: shape mismatch");
    let before = trainer.snapshot().unwrap();
    let err = trainer.train_step_with_backoff(&never, &mut |_| panic!("no retry")).unwrap_err();
    assert!(
        matches!(&err, TrainError::Step { step: 1, during: "the forward pass", message } if message.contains("shape mismatch")),
        "{err}"
    );
    assert_eq!(trainer.layout(), Layout::single(16, 1));
    assert_same(&trainer.snapshot().unwrap(), &before);
}

#[test]
fn replicas_on_their_own_devices_train_bit_for_bit_as_replicas_sharing_one() {
    // `Trainer::new` can make more instances of its workload: replica r ≥ 1
    // runs on its own instance on `devices[r]` (here the CPU, as every CPU
    // run's plan gives), with the master parameters copied in before each
    // step and its gradient copied back. A trainer given one instance runs
    // every replica on it. Same arithmetic, so the same bits, dropout on.
    for cfg in [tiny_mlp(), tiny_gpt()] {
        let layout = Layout { replicas: 2, micro_batch: cfg.train.batch_size / 2, grad_accum: cfg.train.grad_accum };
        let mut placed = with_layout(&cfg, layout);
        placed.place_replicas(vec![Device::Cpu, Device::Cpu]).unwrap();
        assert_eq!(placed.replica_devices().len(), 2);
        let mut shared = Trainer::with_workload(&cfg, builtin_workload(&cfg).unwrap()).unwrap();
        shared.set_layout(layout).unwrap();
        let losses = train_to(&mut placed, 4);
        assert_eq!(losses, train_to(&mut shared, 4));
        assert_same(&placed.snapshot().unwrap(), &shared.snapshot().unwrap());

        // A restore reaches the replicas too: their parameters come from
        // the master ones at every step.
        let snap = placed.snapshot().unwrap();
        train_to(&mut placed, 6);
        placed.restore(&snap.model, &snap.optimizer, &snap.state).unwrap();
        train_to(&mut placed, 6);
        train_to(&mut shared, 6);
        assert_same(&placed.snapshot().unwrap(), &shared.snapshot().unwrap());
    }
}

#[test]
fn replica_devices_must_start_with_the_trainers_and_need_a_workload_factory() {
    let cfg = tiny_mlp();
    let mut trainer = Trainer::new(&cfg).unwrap();
    let err = trainer.place_replicas(Vec::new()).unwrap_err();
    assert!(err.to_string().contains("replica 0 must run on the trainer's device"), "{err}");
    let mut single = Trainer::with_workload(&cfg, builtin_workload(&cfg).unwrap()).unwrap();
    single.place_replicas(vec![Device::Cpu]).unwrap();
    let err = single.place_replicas(vec![Device::Cpu, Device::Cpu]).unwrap_err();
    assert!(err.to_string().contains("cannot be replicated onto 2 devices"), "{err}");
    assert!(err.to_string().contains("Trainer::from_registry_on"), "{err}");
}
