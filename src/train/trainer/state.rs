//! The trainer's state in a checkpoint: the JSON part of a snapshot
//! ([`TrainState`]: position, RNG streams, loss scale, schedule, counters)
//! and the host copies of parameters and optimizer moments, taken
//! ([`Trainer::snapshot`]) and given back ([`Trainer::restore`]).

use super::*;

/// RNG streams in the state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RngStates {
    init: RngState,
    dropout: RngState,
}

/// The learning-rate schedule's position (the step) and, for readers, the
/// rate the next step will use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleState {
    step: u64,
    next_lr: f64,
}

/// The JSON part of a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrainState {
    format: u32,
    workload: String,
    seed: u64,
    step: u64,
    epoch: u64,
    cursor: DataCursor,
    train_samples: u64,
    optimizer_step: u64,
    rng: RngStates,
    scaler: ScalerState,
    schedule: ScheduleState,
    counters: Counters,
    compute_dtype: String,
    param_count: u64,
}

impl Trainer {
    /// Host copies of the parameters, the optimizer state and the JSON state.
    pub fn snapshot(&self) -> Result<Snapshot, TrainError> {
        self.snapshot_reusing(None)
    }

    /// [`snapshot`](Self::snapshot) for a periodic checkpoint, which
    /// pauses training only for this call: tensors that nothing writes into
    /// any more are shared, not copied (`train::snapshot_tensors`), and
    /// what must be copied goes into the host buffers of an earlier
    /// snapshot (handed back once it was persisted), without allocating.
    /// A sharded optimizer's moments are gathered: every rank must
    /// snapshot at the same time.
    pub fn snapshot_reusing(&self, reuse: Option<(TensorSet, TensorSet)>) -> Result<Snapshot, TrainError> {
        self.snapshot_with(reuse, true)
    }

    /// [`snapshot_reusing`](Self::snapshot_reusing) for a checkpoint that
    /// every rank writes its part of (`checkpoint::parts`): with a sharded
    /// optimizer, `optimizer` holds this rank's pieces of the moments
    /// ([`optimizer_shard`](Self::optimizer_shard)), shared, and no
    /// collective is made; otherwise the whole state.
    pub fn snapshot_part(&self, reuse: Option<(TensorSet, TensorSet)>) -> Result<Snapshot, TrainError> {
        self.snapshot_with(reuse, false)
    }

    fn snapshot_with(&self, reuse: Option<(TensorSet, TensorSet)>, gather: bool) -> Result<Snapshot, TrainError> {
        let world = self.world.as_ref().filter(|_| gather);
        let gather = world.map(|world| move |mine: Vec<f32>| all_gather_f32(&**world, mine));
        let gather = gather.as_ref().map(|g| g as GatherF32<'_>);
        let (model, optimizer, optimizer_step) = snapshot_tensors(&self.params, &self.optimizer, gather, reuse)?;
        let state = TrainState {
            format: STATE_FORMAT,
            workload: self.workload.name().to_string(),
            seed: self.seed,
            step: self.step,
            epoch: self.cursor.epoch,
            cursor: self.cursor,
            train_samples: self.train_samples as u64,
            optimizer_step,
            rng: RngStates { init: self.init_rng.state(), dropout: self.dropout_rng.state() },
            scaler: self.scaler.state(),
            schedule: ScheduleState { step: self.step, next_lr: self.next_lr() },
            counters: self.counters,
            compute_dtype: dtype_name(self.dtype),
            param_count: self.param_count() as u64,
        };
        let state = serde_json::to_value(&state).map_err(|e| TrainError::state("state", e.to_string()))?;
        Ok(Snapshot { step: self.step, model, optimizer, state })
    }

    /// Replaces the trainer's state with a snapshot's. Everything is checked
    /// before anything changes: a tensor missing, unexpected, or of the wrong
    /// shape or dtype, or a state of another workload or data set, is an
    /// error naming it, and the trainer is left as it was.
    pub fn restore(
        &mut self,
        model: &TensorSet,
        optimizer: &TensorSet,
        state: &serde_json::Value,
    ) -> Result<(), TrainError> {
        let st: TrainState = serde_json::from_value(state.clone())
            .map_err(|e| TrainError::state("state", format!("cannot be read: {e}")))?;
        if st.format != STATE_FORMAT {
            return Err(TrainError::state(
                "format",
                format!("version {} is not supported (expected {STATE_FORMAT})", st.format),
            ));
        }
        if st.workload != self.workload.name() {
            return Err(TrainError::state(
                "workload",
                format!("the checkpoint is of workload `{}`, this run trains `{}`", st.workload, self.workload.name()),
            ));
        }
        if st.train_samples != self.train_samples as u64 {
            return Err(TrainError::state(
                "train_samples",
                format!(
                    "the checkpoint was taken with {} training samples, the data now has {}: the data changed, so its order cannot be resumed",
                    st.train_samples, self.train_samples
                ),
            ));
        }
        check_counts(&st)?;
        if st.epoch != st.cursor.epoch || st.schedule.step != st.step {
            return Err(TrainError::state("step", "epoch/step fields disagree with the cursor/schedule"));
        }
        if st.cursor.position >= st.train_samples && st.train_samples > 0 {
            return Err(TrainError::state(
                "cursor.position",
                format!("{} is past the {} training samples", st.cursor.position, st.train_samples),
            ));
        }

        let mut values = Vec::with_capacity(self.params.len());
        for (name, var) in &self.params {
            check_host("model", name, var.dims(), model.get(name))?;
            // A trainer built from this checkpoint's parameters
            // (`from_registry_resuming`) already holds them: nothing to copy.
            if holds_host_values(var.as_tensor(), &model[name]) {
                continue;
            }
            values.push((name.clone(), from_host(name, &model[name], &self.device)?));
        }
        if let Some(extra) = model.keys().find(|k| !self.params.contains_key(*k)) {
            return Err(TrainError::UnexpectedTensor { set: "model", name: extra.clone() });
        }
        let init_rng = StreamRng::from_state(&st.rng.init)?;
        let dropout_rng = StreamRng::from_state(&st.rng.dropout)?;
        let mut scaler = self.scaler.clone();
        scaler.load_state(st.scaler)?;
        if st.compute_dtype != dtype_name(self.dtype) {
            tracing::warn!(checkpoint = %st.compute_dtype, now = %dtype_name(self.dtype), "compute dtype changed since the checkpoint; the run will not match an uninterrupted one");
        }
        if st.seed != self.seed {
            tracing::warn!(
                checkpoint = st.seed,
                config = self.seed,
                "seed changed since the checkpoint; keeping the checkpoint's data order"
            );
        }

        // Checks done; the optimizer validates and applies atomically, then the rest.
        self.optimizer.load_whole_state(&self.params, optimizer, st.optimizer_step, &self.device)?;
        for (name, value) in values {
            self.params[&name]
                .set(&value)
                .map_err(|e| TrainError::Tensor { name: name.clone(), message: candle_message(&e) })?;
        }
        self.init_rng = init_rng;
        self.dropout_rng = dropout_rng;
        self.scaler = scaler;
        self.seed = st.seed;
        self.sampler = Sampler::new(st.seed, self.train_samples);
        self.cursor = st.cursor;
        self.step = st.step;
        self.counters = st.counters;
        tracing::debug!(step = self.step, cursor = ?self.cursor, "trainer restored");
        Ok(())
    }
}

/// Largest count `state.json` may hold: 2^53, the largest integer every
/// JSON reader (Python's, JavaScript's) keeps exact. No run counts that far;
/// a larger count is damage, and training on from it would overflow the
/// counters (a panic in debug builds, a wrap in release).
const MAX_COUNT: u64 = 1 << 53;

/// Refuses a `state.json` whose steps or counters no run could reach.
fn check_counts(st: &TrainState) -> Result<(), TrainError> {
    let c = &st.counters;
    let counts = [
        ("step", st.step),
        ("epoch", st.epoch),
        ("optimizer_step", st.optimizer_step),
        ("cursor.epoch", st.cursor.epoch),
        ("cursor.position", st.cursor.position),
        ("schedule.step", st.schedule.step),
        ("scaler.growth_tracker", st.scaler.growth_tracker),
        ("counters.batches", c.batches),
        ("counters.samples", c.samples),
        ("counters.tokens", c.tokens),
        ("counters.nonfinite_skipped", c.nonfinite_skipped),
        ("counters.scaler_skipped", c.scaler_skipped),
        ("counters.batches_skipped", c.batches_skipped),
        ("counters.clipped", c.clipped),
    ];
    match counts.into_iter().find(|(_, n)| *n > MAX_COUNT) {
        Some((field, n)) => {
            Err(TrainError::state(field, format!("{n} is beyond 2^53, which no run reaches: the file is damaged")))
        }
        None => Ok(()),
    }
}
