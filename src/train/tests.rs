//! Behaviour of the whole engine: bit-exact resume (mlp, gpt, gradient
//! accumulation, f16), learning, interruption, non-finite handling,
//! evaluation isolation and restore errors. Models are tiny so the module
//! runs in seconds in a debug build.

use std::cell::Cell;

use candle_core::{Device, Tensor};
use candle_nn::{Linear, Module, VarBuilder};

use super::*;
use crate::checkpoint::{Snapshot, TensorSet};
use crate::config::{Config, DataKind, ModelKind, OnNonFinite, Precision};

pub(super) fn tiny_mlp() -> Config {
    let mut cfg = Config::default();
    cfg.run.seed = 11;
    cfg.run.max_steps = 200;
    cfg.model.kind = ModelKind::Mlp;
    cfg.model.input_dim = 8;
    cfg.model.hidden = vec![16, 16];
    cfg.model.classes = 4;
    cfg.model.dropout = 0.1;
    cfg.data.synthetic_samples = 120;
    cfg.data.val_fraction = 0.2;
    cfg.train.batch_size = 16;
    cfg.optimizer.lr = 1e-2;
    cfg.optimizer.min_lr = 1e-3;
    cfg.optimizer.warmup_steps = 3;
    cfg
}

pub(super) fn tiny_gpt() -> Config {
    let mut cfg = Config::default();
    cfg.run.seed = 5;
    cfg.run.max_steps = 50;
    cfg.model.kind = ModelKind::Gpt;
    cfg.model.layers = 2;
    cfg.model.width = 16;
    cfg.model.heads = 2;
    cfg.model.context = 8;
    cfg.model.dropout = 0.1;
    cfg.data.synthetic_samples = 24;
    cfg.data.val_fraction = 0.25;
    cfg.train.batch_size = 4;
    cfg.optimizer.lr = 3e-3;
    cfg.optimizer.warmup_steps = 2;
    cfg
}

pub(super) fn completed(result: StepResult) -> StepMetrics {
    match result {
        StepResult::Completed(m) => m,
        other => panic!("expected a completed step, got {other:?}"),
    }
}

pub(super) fn never() -> bool {
    false
}

/// Trains until `trainer.step() == until`, returning each step's loss bits.
pub(super) fn train_to(trainer: &mut Trainer, until: u64) -> Vec<u64> {
    let mut losses = Vec::new();
    while trainer.step() < until {
        losses.push(completed(trainer.train_step(&never).unwrap()).loss.to_bits());
    }
    losses
}

/// Asserts two snapshots are identical, naming the first difference.
pub(super) fn assert_same(a: &Snapshot, b: &Snapshot) {
    assert_eq!(a.step, b.step);
    for (set, x, y) in [("model", &a.model, &b.model), ("optimizer", &a.optimizer, &b.optimizer)] {
        assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>(), "{set} tensor names");
        for (name, t) in x {
            assert!(t == &y[name], "{set} tensor `{name}` differs");
        }
    }
    assert_eq!(a.state, b.state, "JSON state differs");
}

/// Trains `n` steps straight, and separately `k` steps, a snapshot through
/// JSON and cloned tensors, a fresh trainer, a restore and the rest; both
/// must agree bit for bit.
fn check_bit_exact_resume(cfg: &Config, k: u64, n: u64) -> Snapshot {
    let mut straight = Trainer::new(cfg).unwrap();
    let straight_losses = train_to(&mut straight, n);
    let straight_end = straight.snapshot().unwrap();

    let mut first = Trainer::new(cfg).unwrap();
    let mut losses = train_to(&mut first, k);
    let snap = first.snapshot().unwrap();
    drop(first);
    let state: serde_json::Value = serde_json::from_str(&serde_json::to_string(&snap.state).unwrap()).unwrap();
    let (model, optimizer) = (snap.model.clone(), snap.optimizer.clone());
    drop(snap);

    let mut resumed = Trainer::new(cfg).unwrap();
    resumed.restore(&model, &optimizer, &state).unwrap();
    assert_eq!(resumed.step(), k);
    losses.extend(train_to(&mut resumed, n));
    assert_eq!(losses, straight_losses, "per-step losses differ after resume");
    let resumed_end = resumed.snapshot().unwrap();
    assert_same(&resumed_end, &straight_end);
    resumed_end
}

#[test]
fn mlp_resume_is_bit_exact() {
    let end = check_bit_exact_resume(&tiny_mlp(), 4, 10);
    // 120 samples, ~96 for training, 16 per step: the run crossed an epoch boundary.
    assert!(end.state["cursor"]["epoch"].as_u64().unwrap() >= 1, "{}", end.state);
}

#[test]
fn gpt_resume_is_bit_exact() {
    let end = check_bit_exact_resume(&tiny_gpt(), 3, 7);
    assert!(end.model.contains_key("blocks.1.attn.qkv.weight"));
    assert!(end.state["counters"]["tokens"].as_u64().unwrap() == 7 * 4 * 8);
}

#[test]
fn grad_accum_resume_is_bit_exact() {
    let mut cfg = tiny_mlp();
    cfg.train.grad_accum = 2;
    cfg.train.batch_size = 8;
    check_bit_exact_resume(&cfg, 5, 9);
    let mut cfg = tiny_gpt();
    cfg.train.grad_accum = 2;
    check_bit_exact_resume(&cfg, 2, 4);
}

#[test]
fn f16_resume_with_loss_scaling_is_bit_exact() {
    let mut cfg = tiny_mlp();
    cfg.precision.dtype = Precision::F16;
    cfg.precision.initial_scale = 1024.0;
    cfg.precision.growth_interval = 3;
    let end = check_bit_exact_resume(&cfg, 4, 8);
    assert_ne!(end.state["scaler"]["scale"], "1024.0", "the scale grew: {}", end.state["scaler"]);
}

#[test]
fn mlp_loss_falls_by_more_than_half_in_200_steps() {
    let mut cfg = tiny_mlp();
    cfg.model.dropout = 0.0;
    let mut trainer = Trainer::new(&cfg).unwrap();
    let initial_val = trainer.evaluate().unwrap();
    let mut losses = Vec::new();
    while trainer.step() < 200 {
        losses.push(completed(trainer.train_step(&never).unwrap()).loss);
    }
    let first: f64 = losses[..10].iter().sum::<f64>() / 10.0;
    let last: f64 = losses[190..].iter().sum::<f64>() / 10.0;
    assert!(last < 0.5 * first, "training loss {first} -> {last}");
    let final_val = trainer.evaluate().unwrap();
    assert!(final_val < 0.5 * initial_val, "validation loss {initial_val} -> {final_val}");
}

#[test]
fn gpt_loss_falls_on_the_synthetic_corpus() {
    let mut cfg = tiny_gpt();
    cfg.model.dropout = 0.0;
    cfg.optimizer.lr = 1e-2;
    let mut trainer = Trainer::new(&cfg).unwrap();
    let before = trainer.evaluate().unwrap();
    train_to(&mut trainer, 30);
    let after = trainer.evaluate().unwrap();
    // ln(256) ~ 5.5 at the start; the corpus has far fewer distinct bytes.
    assert!(before > 5.0 && after < before - 1.5, "validation loss {before} -> {after}");
}

#[test]
fn interrupted_step_leaves_state_untouched_and_resumes_identically() {
    let mut cfg = tiny_mlp();
    cfg.train.grad_accum = 3;
    cfg.train.batch_size = 8;
    let mut trainer = Trainer::new(&cfg).unwrap();
    train_to(&mut trainer, 2);
    let before = trainer.snapshot().unwrap();
    for stop_at_poll in 1..=3 {
        let polls = Cell::new(0);
        let stop = || {
            polls.set(polls.get() + 1);
            polls.get() >= stop_at_poll
        };
        assert_eq!(trainer.train_step(&stop).unwrap(), StepResult::Interrupted);
        assert_eq!(polls.get(), stop_at_poll, "polled once per micro-batch");
        assert_same(&trainer.snapshot().unwrap(), &before);
    }
    let losses = train_to(&mut trainer, 4);
    let mut straight = Trainer::new(&cfg).unwrap();
    let straight_losses = train_to(&mut straight, 4);
    assert_eq!(losses, straight_losses[2..]);
    assert_same(&trainer.snapshot().unwrap(), &straight.snapshot().unwrap());
}

#[test]
fn evaluation_does_not_disturb_training() {
    let cfg = tiny_gpt();
    let mut with_eval = Trainer::new(&cfg).unwrap();
    let mut without = Trainer::new(&cfg).unwrap();
    for _ in 0..3 {
        let a = with_eval.evaluate().unwrap();
        assert_eq!(a.to_bits(), with_eval.evaluate().unwrap().to_bits(), "evaluation is deterministic");
        completed(with_eval.train_step(&never).unwrap());
        completed(without.train_step(&never).unwrap());
    }
    assert_same(&with_eval.snapshot().unwrap(), &without.snapshot().unwrap());
}

#[test]
fn snapshot_state_holds_every_piece_of_training_state() {
    let mut trainer = Trainer::new(&tiny_gpt()).unwrap();
    train_to(&mut trainer, 2);
    let snap = trainer.snapshot().unwrap();
    for key in [
        "format",
        "workload",
        "seed",
        "step",
        "epoch",
        "cursor",
        "optimizer_step",
        "rng",
        "scaler",
        "schedule",
        "counters",
    ] {
        assert!(snap.state.get(key).is_some(), "state lacks `{key}`: {}", snap.state);
    }
    assert_eq!(snap.state["workload"], "gpt");
    assert_eq!(snap.state["step"], 2);
    assert_eq!(snap.state["optimizer_step"], 2);
    assert!(snap.state["rng"]["dropout"]["word_pos"].as_u64().unwrap() > 0);
    assert_eq!(snap.model.len(), trainer.param_shapes().len());
    assert_eq!(snap.optimizer.len(), 2 * snap.model.len());
    let params: usize = snap.model.values().map(|t| t.shape.iter().product::<usize>()).sum();
    assert_eq!(params, trainer.param_count());
    assert_eq!(trainer.samples_per_step(), 4);
}

#[test]
fn a_trainer_built_from_the_checkpoint_it_resumes_draws_nothing_and_resumes_bit_exact() {
    for cfg in [tiny_mlp(), tiny_gpt()] {
        let registry = Registry::builtin();
        let mut straight = Trainer::new(&cfg).unwrap();
        let straight_losses = train_to(&mut straight, 6);
        let mut first = Trainer::new(&cfg).unwrap();
        let mut losses = train_to(&mut first, 3);
        let snap = first.snapshot().unwrap();
        let model = std::sync::Arc::new(snap.model.clone());

        let mut resumed = Trainer::from_registry_resuming(&cfg, &registry, std::sync::Arc::clone(&model)).unwrap();
        // Built from the checkpoint: the parameters already hold its values
        // (nothing was drawn for them) before the restore.
        let built = resumed.snapshot().unwrap();
        assert!(built.model == snap.model, "a parameter was drawn instead of taken from the checkpoint");
        let untouched = serde_json::to_value(StreamRng::new(cfg.run.seed, Stream::Init).state()).unwrap();
        assert_eq!(built.state["rng"]["init"], untouched, "the init stream was drawn from");
        resumed.restore(&model, &snap.optimizer, &snap.state).unwrap();
        assert_same(&resumed.snapshot().unwrap(), &snap);
        losses.extend(train_to(&mut resumed, 6));
        assert_eq!(losses, straight_losses, "per-step losses differ after a resume built from the checkpoint");
        assert_same(&resumed.snapshot().unwrap(), &straight.snapshot().unwrap());
    }
}

#[test]
fn a_trainer_built_from_a_checkpoint_of_another_shape_still_refuses_it_on_restore() {
    let cfg = tiny_mlp();
    let mut source = Trainer::new(&cfg).unwrap();
    train_to(&mut source, 2);
    let snap = source.snapshot().unwrap();
    let mut model = snap.model.clone();
    model.insert("head.weight".into(), crate::checkpoint::HostTensor::from_f32(vec![2, 2], &[0.0; 4]));
    model.remove("head.bias");
    let mut target =
        Trainer::from_registry_resuming(&cfg, &Registry::builtin(), std::sync::Arc::new(model.clone())).unwrap();
    let err = target.restore(&model, &snap.optimizer, &snap.state).unwrap_err();
    assert!(err.to_string().contains("head.bias"), "{err}");
    target.restore(&snap.model, &snap.optimizer, &snap.state).unwrap();
    assert_same(&target.snapshot().unwrap(), &snap);
}

#[test]
fn restore_names_missing_and_mismatched_tensors_and_changes_nothing() {
    let cfg = tiny_mlp();
    let mut source = Trainer::new(&cfg).unwrap();
    train_to(&mut source, 2);
    let snap = source.snapshot().unwrap();
    let mut target = Trainer::new(&cfg).unwrap();
    let pristine = target.snapshot().unwrap();

    let mut model = snap.model.clone();
    model.remove("head.bias");
    let err = target.restore(&model, &snap.optimizer, &snap.state).unwrap_err();
    assert!(matches!(&err, TrainError::MissingTensor { set: "model", name, .. } if name == "head.bias"), "{err}");

    let mut model = snap.model.clone();
    model.insert("head.weight".into(), crate::checkpoint::HostTensor::from_f32(vec![2, 2], &[0.0; 4]));
    let err = target.restore(&model, &snap.optimizer, &snap.state).unwrap_err();
    assert!(err.to_string().contains("head.weight") && err.to_string().contains("[4, 16]"), "{err}");

    let mut model = snap.model.clone();
    model.insert("extra".into(), crate::checkpoint::HostTensor::from_f32(vec![1], &[0.0]));
    let err = target.restore(&model, &snap.optimizer, &snap.state).unwrap_err();
    assert!(matches!(&err, TrainError::UnexpectedTensor { name, .. } if name == "extra"), "{err}");

    let mut optimizer = snap.optimizer.clone();
    optimizer.remove("exp_avg.layers.0.weight");
    let err = target.restore(&snap.model, &optimizer, &snap.state).unwrap_err();
    assert!(err.to_string().contains("exp_avg.layers.0.weight"), "{err}");

    let mut state = snap.state.clone();
    state["workload"] = "gpt".into();
    let err = target.restore(&snap.model, &snap.optimizer, &state).unwrap_err();
    assert!(matches!(&err, TrainError::State { key, .. } if key == "workload"), "{err}");

    let err = target.restore(&snap.model, &snap.optimizer, &serde_json::json!({"step": 2})).unwrap_err();
    assert!(matches!(err, TrainError::State { .. }), "{err}");

    assert_same(&target.snapshot().unwrap(), &pristine);
    target.restore(&snap.model, &snap.optimizer, &snap.state).unwrap();
    assert_same(&target.snapshot().unwrap(), &snap);
}

#[test]
fn bf16_and_f16_compute_train_with_f32_master_weights() {
    for dtype in [Precision::Bf16, Precision::F16] {
        let mut cfg = tiny_gpt();
        cfg.precision.dtype = dtype;
        let mut trainer = Trainer::new(&cfg).unwrap();
        let m = completed(trainer.train_step(&never).unwrap());
        assert!(m.loss.is_finite() && !m.skipped_nonfinite, "{dtype:?}: {m:?}");
        assert_eq!(m.loss_scale.is_some(), dtype == Precision::F16);
        let snap = trainer.snapshot().unwrap();
        assert!(snap.model.values().all(|t| t.dtype == crate::checkpoint::DType::F32));
    }
}

#[test]
fn f16_gradient_overflow_skips_the_step_and_backs_off_the_scale() {
    let mut cfg = tiny_mlp();
    cfg.model.dropout = 0.0;
    cfg.precision.dtype = Precision::F16;
    cfg.precision.initial_scale = 2f64.powi(40);
    let mut trainer = Trainer::new(&cfg).unwrap();
    let before = trainer.snapshot().unwrap();
    let first = completed(trainer.train_step(&never).unwrap());
    assert!(first.skipped_nonfinite, "{first:?}");
    assert_eq!(first.loss_scale, Some(2f64.powi(39)));
    assert_eq!(trainer.snapshot().unwrap().model, before.model, "no update on overflow");
    let mut steps = 1;
    while completed(trainer.train_step(&never).unwrap()).skipped_nonfinite {
        steps += 1;
        assert!(steps < 40, "the scale never came down far enough");
    }
    assert_eq!(trainer.counters().scaler_skipped, steps);
    assert_eq!(trainer.counters().nonfinite_skipped, 0);
    assert_ne!(trainer.snapshot().unwrap().model, before.model);
}

/// A linear regression whose training sample `poison` has a NaN input.
struct Poisoned {
    poison: usize,
    model: Option<Linear>,
}

impl Workload for Poisoned {
    fn name(&self) -> &str {
        "poisoned"
    }

    fn build(&mut self, vb: VarBuilder<'_>) -> candle_core::Result<()> {
        self.model = Some(candle_nn::linear(1, 1, vb.pp("fc"))?);
        Ok(())
    }

    fn num_samples(&self, split: Split) -> usize {
        if split == Split::Train { 16 } else { 4 }
    }

    fn batch(&self, _split: Split, indices: &[usize], device: &Device) -> candle_core::Result<Batch> {
        let xs: Vec<f32> = indices.iter().map(|&i| if i == self.poison { f32::NAN } else { i as f32 / 16.0 }).collect();
        let ys: Vec<f32> = xs.iter().map(|x| 2.0 * x + 1.0).collect();
        let n = indices.len();
        Ok(Batch {
            inputs: Tensor::from_vec(xs, (n, 1), device)?,
            targets: Tensor::from_vec(ys, (n, 1), device)?,
            tokens: None,
        })
    }

    fn loss(&self, batch: &Batch, _ctx: &mut ForwardCtx<'_>) -> candle_core::Result<Tensor> {
        let model = self.model.as_ref().expect("built");
        candle_nn::loss::mse(&model.forward(&batch.inputs)?, &batch.targets)
    }
}

fn poisoned(policy: OnNonFinite) -> Trainer {
    let mut cfg = Config::default();
    cfg.train.batch_size = 4;
    cfg.train.on_nonfinite = policy;
    Trainer::with_workload(&cfg, Box::new(Poisoned { poison: 5, model: None })).unwrap()
}

#[test]
fn non_finite_skip_moves_on_without_updating() {
    let mut trainer = poisoned(OnNonFinite::Skip);
    let mut skipped = 0;
    for _ in 0..4 {
        let before = trainer.snapshot().unwrap();
        let m = completed(trainer.train_step(&never).unwrap());
        if m.skipped_nonfinite {
            skipped += 1;
            assert!(m.loss.is_nan());
            assert_eq!(trainer.snapshot().unwrap().model, before.model);
            assert_ne!(trainer.cursor(), DataCursor::default());
        }
    }
    assert_eq!(skipped, 1, "sample 5 is in exactly one batch of the epoch");
    assert_eq!(trainer.counters().nonfinite_skipped, 1);
    assert_eq!(trainer.step(), 4);
    assert_eq!(trainer.cursor(), DataCursor { epoch: 1, position: 0 });
}

#[test]
fn non_finite_stop_returns_the_event_and_leaves_state_untouched() {
    let mut trainer = poisoned(OnNonFinite::Stop);
    loop {
        let before = trainer.snapshot().unwrap();
        match trainer.train_step(&never).unwrap() {
            StepResult::Completed(_) => continue,
            StepResult::NonFiniteStop(event) => {
                assert_eq!(event.step, before.step + 1);
                assert_same(&trainer.snapshot().unwrap(), &before);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn non_finite_rollback_reloads_and_skips_past_the_offending_batch() {
    let mut trainer = poisoned(OnNonFinite::Rollback);
    let checkpoint = trainer.snapshot().unwrap();
    let event = loop {
        match trainer.train_step(&never).unwrap() {
            StepResult::Completed(_) => continue,
            StepResult::NonFiniteRollback(event) => break event,
            other => panic!("unexpected {other:?}"),
        }
    };
    trainer.restore(&checkpoint.model, &checkpoint.optimizer, &checkpoint.state).unwrap();
    let skipped = trainer.skip_past(&event).unwrap();
    assert_eq!(skipped, event.batches_end);
    assert_eq!(trainer.counters().batches_skipped, skipped);
    assert_eq!(trainer.step(), 0, "skipping data does not count as training");
    // The rest of the epoch trains without meeting the poisoned sample again.
    while trainer.epoch() == 0 {
        let m = completed(trainer.train_step(&never).unwrap());
        assert!(!m.skipped_nonfinite && m.loss.is_finite());
    }
    // A state newer than the event cannot skip backwards.
    let mut ahead = poisoned(OnNonFinite::Rollback);
    ahead.skip_batches(event.batches_end + 1);
    assert!(ahead.skip_past(&event).is_err());
}

#[test]
fn jsonl_gpt_trains_and_refuses_invalid_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corpus.jsonl");
    let lines: Vec<String> =
        (0..40).map(|i| format!("{{\"text\": \"line {i}: the quick brown fox jumps over the lazy dog\"}}")).collect();
    std::fs::write(&path, lines.join("\n") + "\n{\"text\": 3}\n").unwrap();
    let mut cfg = tiny_gpt();
    cfg.data.kind = DataKind::Jsonl;
    cfg.data.path = Some(path.clone());
    let err = Trainer::new(&cfg).unwrap_err();
    assert!(matches!(err, TrainError::InvalidDataset { invalid: 1, .. }), "{err}");
    cfg.data.on_invalid = crate::config::OnInvalid::Skip;
    let mut trainer = Trainer::new(&cfg).unwrap();
    let m = completed(trainer.train_step(&never).unwrap());
    assert_eq!(m.tokens, Some(32));
    assert!(m.tokens_per_s.is_some());
    assert!(trainer.evaluate().unwrap().is_finite());
}

#[test]
fn text_gpt_trains_on_a_text_file_and_refuses_one_that_is_not_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("verse.txt");
    std::fs::write(&path, "Shall I compare thee to a summer's day?\n".repeat(20)).unwrap();
    let mut cfg = tiny_gpt();
    cfg.data.kind = DataKind::Text;
    cfg.data.path = Some(path.clone());
    let mut trainer = Trainer::new(&cfg).unwrap();
    let m = completed(trainer.train_step(&never).unwrap());
    assert_eq!(m.tokens, Some(32));
    assert!(trainer.evaluate().unwrap().is_finite());

    std::fs::write(&path, b"PK\x03\x04\x14\0\0\0\x08\0").unwrap();
    let err = Trainer::new(&cfg).unwrap_err();
    assert!(matches!(&err, TrainError::Config { key, .. } if key == "data.path"), "{err}");
    assert!(err.to_string().contains("is not a UTF-8 text file: a NUL character at line 1, column 6"), "{err}");
    std::fs::remove_file(&path).unwrap();
    let err = Trainer::new(&cfg).unwrap_err();
    assert!(
        matches!(&err, TrainError::Config { key, reason } if key == "data.path" && reason.starts_with("cannot read "))
    );
}

#[test]
fn bad_configs_are_reported_with_their_key() {
    let mut cfg = tiny_gpt();
    cfg.model.heads = 3;
    assert!(matches!(Trainer::new(&cfg).unwrap_err(), TrainError::Config { key, .. } if key == "model.heads"));
    let mut cfg = tiny_mlp();
    cfg.train.grad_accum = 0;
    assert!(matches!(Trainer::new(&cfg).unwrap_err(), TrainError::Config { key, .. } if key == "train.grad_accum"));
    let mut cfg = tiny_mlp();
    cfg.data.kind = DataKind::Jsonl;
    assert!(matches!(Trainer::new(&cfg).unwrap_err(), TrainError::Config { key, .. } if key == "data.kind"));
}

#[test]
fn trainer_can_move_to_its_own_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<Trainer>();
    assert_send::<Snapshot>();
}

/// Found by the fuzz test below: a `state.json` whose step or counters sat
/// at u64::MAX restored, and the next step panicked (`attempt to add with
/// overflow` in `commit` and in the optimizer) in debug builds.
#[test]
fn a_state_json_with_counters_no_run_reaches_is_refused_on_restore() {
    let cfg = tiny_mlp();
    let mut source = Trainer::new(&cfg).unwrap();
    completed(source.train_step(&never).unwrap());
    let snap = source.snapshot().unwrap();
    for (path, value) in [
        ("/counters/samples", serde_json::json!(u64::MAX)),
        ("/optimizer_step", serde_json::json!(u64::MAX)),
        ("/counters/tokens", serde_json::json!((1u64 << 53) + 1)),
    ] {
        let mut state = snap.state.clone();
        *state.pointer_mut(path).unwrap_or_else(|| panic!("{path} in {}", snap.state)) = value;
        let mut target = Trainer::new(&cfg).unwrap();
        let err = target.restore(&snap.model, &snap.optimizer, &state).unwrap_err().to_string();
        assert!(err.contains("beyond 2^53"), "{path}: {err}");
        assert_eq!(target.step(), 0, "{path}: a refused restore changed the trainer");
    }
}

/// `state.json` as resume reads it, fuzzed (see `crate::fuzz`): a mutated
/// file restores or is refused with a named error, never a panic; and a
/// trainer that accepted it takes a step (or fails one) without panicking.
#[test]
fn mutated_state_json_restores_or_is_refused_never_a_panic() {
    use proptest::test_runner::{TestCaseError, TestRunner};
    let cfg = tiny_mlp();
    let mut source = Trainer::new(&cfg).unwrap();
    for _ in 0..3 {
        completed(source.train_step(&never).unwrap());
    }
    let snap = source.snapshot().unwrap();
    let valid = serde_json::to_vec_pretty(&snap.state).unwrap();
    let target = std::cell::RefCell::new(Trainer::new(&cfg).unwrap());
    let mut runner = TestRunner::new(crate::fuzz::config());
    runner
        .run(&crate::fuzz::mutated(valid), |bytes| {
            let Ok(state) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return Ok(()) };
            let mut target = target.borrow_mut();
            if target.restore(&snap.model, &snap.optimizer, &state).is_ok() {
                let _ = target.train_step(&never);
                let _ = target.snapshot().map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Ok(())
        })
        .unwrap();
}

/// A snapshot between two steps shares the tensors nothing writes into any
/// more (the parameter values the last update computed, the moments) rather
/// than copying them: training that goes on must not change what it holds,
/// a restore must not leave stale values to share, and buffers it copied
/// into are reused.
#[test]
fn a_snapshot_shares_what_no_step_writes_into_and_stays_that_of_its_step() {
    for cfg in [tiny_mlp(), tiny_gpt()] {
        let owned = |s: &Snapshot| s.model.values().chain(s.optimizer.values()).filter(|t| t.data.is_owned()).count();
        let mut trainer = Trainer::new(&cfg).unwrap();
        // Nothing updated yet: the parameters are copied, the moments shared.
        let first = trainer.snapshot().unwrap();
        assert_eq!(owned(&first), first.model.len(), "step 0 copies the parameters only");

        train_to(&mut trainer, 3);
        let shared = trainer.snapshot().unwrap();
        assert_eq!(owned(&shared), 0, "between two steps nothing is copied");
        let copied = Snapshot {
            step: shared.step,
            model: shared.model.iter().map(|(n, t)| (n.clone(), owned_copy(t))).collect(),
            optimizer: shared.optimizer.iter().map(|(n, t)| (n.clone(), owned_copy(t))).collect(),
            state: shared.state.clone(),
        };
        train_to(&mut trainer, 5);
        assert_same(&shared, &copied);

        // Restored to step 3 from step 5, the values the last update kept
        // are stale: the parameters are copied from the restored `Var`s.
        trainer.restore(&copied.model, &copied.optimizer, &copied.state).unwrap();
        let buffer = first.model.values().next().unwrap().data.as_ptr();
        let restored = trainer.snapshot_reusing(Some((first.model, TensorSet::new()))).unwrap();
        assert_same(&restored, &copied);
        assert_eq!(restored.model.values().next().unwrap().data.as_ptr(), buffer, "copied into the reused buffer");
    }
}

/// A host tensor with a buffer of its own holding the same bytes.
fn owned_copy(t: &crate::checkpoint::HostTensor) -> crate::checkpoint::HostTensor {
    crate::checkpoint::HostTensor::new(t.dtype, t.shape.clone(), t.data.to_vec()).unwrap()
}
