//! Semantic checks on a deserialized [`Config`]: ranges, relations between
//! keys, and keys required by other keys. Every check runs; every failure is
//! reported, naming the key and what is allowed. Places (line and column)
//! are added by the loader, which knows where each key came from.

use std::time::Duration;

use super::error::Problem;
use super::schema::*;

/// One failed check: the key it is reported against, other keys whose
/// values it also depends on, and the message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Finding {
    pub key: &'static str,
    pub depends_on: &'static [&'static str],
    pub message: String,
}

/// Runs every semantic check on `config` and returns the failures, without
/// places (see [`load`](super::load) for located problems). Empty means valid.
pub fn validate(config: &Config) -> Vec<Problem> {
    findings(config).into_iter().map(|f| Problem::new(f.key, f.message)).collect()
}

#[derive(Default)]
struct Findings(Vec<Finding>);

impl Findings {
    fn require(&mut self, ok: bool, key: &'static str, message: impl FnOnce() -> String) {
        self.require_with(ok, key, &[], message);
    }

    fn require_with(
        &mut self,
        ok: bool,
        key: &'static str,
        depends_on: &'static [&'static str],
        message: impl FnOnce() -> String,
    ) {
        if !ok {
            self.0.push(Finding { key, depends_on, message: message() });
        }
    }

    fn at_least<T: PartialOrd + Copy + std::fmt::Display>(&mut self, key: &'static str, value: T, min: T) {
        self.require(value >= min, key, || format!("must be at least {min} (got {value})"));
    }

    /// `value` in `[0, 1)`; NaN fails.
    fn unit_fraction(&mut self, key: &'static str, value: f64) {
        self.require((0.0..1.0).contains(&value), key, || format!("must be at least 0 and below 1 (got {value})"));
    }

    /// `value` finite and strictly positive.
    fn positive(&mut self, key: &'static str, value: f64) {
        self.require(value.is_finite() && value > 0.0, key, || {
            format!("must be a number greater than 0 (got {value})")
        });
    }

    /// `value` finite and at least 0.
    fn non_negative(&mut self, key: &'static str, value: f64) {
        self.require(value.is_finite() && value >= 0.0, key, || format!("must be a number at least 0 (got {value})"));
    }
}

/// Every check, in schema order.
pub(crate) fn findings(config: &Config) -> Vec<Finding> {
    let mut f = Findings::default();
    run(&mut f, &config.run);
    model(&mut f, &config.model);
    data(&mut f, &config.data, &config.model.kind);
    train(&mut f, &config.train, &config.data);
    optimizer(&mut f, &config.optimizer, config.run.max_steps);
    precision(&mut f, &config.precision);
    checkpoint(&mut f, &config.checkpoint);
    signals(&mut f, &config.signals);
    publish(&mut f, &config.publish);
    gpu(&mut f, &config.gpu);
    watchdog(&mut f, &config.watchdog);
    lock(&mut f, &config.lock);
    distributed(&mut f, &config.distributed);
    recovery(&mut f, &config.recovery, config.distributed.shard_optimizer);
    health(&mut f, &config.health);
    telemetry(&mut f, &config.telemetry);
    f.0
}

fn run(f: &mut Findings, run: &RunSection) {
    let name = run.name.as_str();
    // The name is a directory name (`runs/<name>`) and appears in commit messages.
    let usable = !name.trim().is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control);
    f.require(usable, "run.name", || {
        format!("must be a non-empty name without `/`, `\\` or control characters (got {name:?})")
    });
    f.at_least("run.max_steps", run.max_steps, 1);
}

fn model(f: &mut Findings, model: &ModelSection) {
    match model.kind {
        // Its settings are checked by the loader against its own type, and
        // by its builder when the workload is built.
        ModelKind::Registered(_) => {}
        ModelKind::Mlp => {
            f.at_least("model.input_dim", model.input_dim, 1);
            f.require(!model.hidden.is_empty(), "model.hidden", || {
                "must list at least one hidden layer width, e.g. [64]".to_string()
            });
            let zero = model.hidden.iter().position(|&w| w == 0);
            f.require(zero.is_none(), "model.hidden", || {
                format!(
                    "every hidden layer width must be at least 1 (entry {} of {:?} is 0)",
                    zero.unwrap_or_default() + 1,
                    model.hidden
                )
            });
            f.at_least("model.classes", model.classes, 2);
        }
        ModelKind::Gpt => {
            f.at_least("model.layers", model.layers, 1);
            f.at_least("model.width", model.width, 1);
            f.at_least("model.heads", model.heads, 1);
            f.at_least("model.context", model.context, 1);
            if model.width >= 1 && model.heads >= 1 {
                let (width, heads) = (model.width, model.heads);
                f.require_with(width % heads == 0, "model.width", &["model.heads"], || {
                    format!("must be divisible by model.heads = {heads} (got {width})")
                });
            }
        }
    }
    f.unit_fraction("model.dropout", model.dropout);
}

fn data(f: &mut Findings, data: &DataSection, model: &ModelKind) {
    // The mlp classifies feature vectors: text has none to give it.
    f.require_with(*model != ModelKind::Mlp || data.kind == DataKind::Synthetic, "data.kind", &["model.kind"], || {
        "the mlp model trains on synthetic data only: use kind = \"synthetic\", or model.kind = \"gpt\" for text \
         (kind = \"jsonl\" or \"text\")"
            .to_string()
    });
    match data.kind {
        DataKind::Jsonl => {
            f.require_with(data.path.is_some(), "data.path", &["data.kind"], || {
                "is required when data.kind = \"jsonl\"".to_string()
            });
            f.require(!data.field.is_empty(), "data.field", || {
                "must name the text field of each JSONL record (got \"\")".to_string()
            });
        }
        DataKind::Text => {
            f.require_with(data.path.is_some(), "data.path", &["data.kind"], || {
                "is required when data.kind = \"text\"".to_string()
            });
        }
        DataKind::Synthetic => f.at_least("data.synthetic_samples", data.synthetic_samples, 1),
    }
    f.unit_fraction("data.val_fraction", data.val_fraction);
}

fn train(f: &mut Findings, train: &TrainSection, data: &DataSection) {
    f.at_least("train.batch_size", train.batch_size, 1);
    f.at_least("train.grad_accum", train.grad_accum, 1);
    f.non_negative("train.grad_clip", train.grad_clip);
    if let Some(MicroBatch::Samples(m)) = train.micro_batch {
        let effective = train.batch_size.saturating_mul(train.grad_accum);
        f.require_with(
            m >= 1 && effective >= 1 && effective.is_multiple_of(m),
            "train.micro_batch",
            &["train.batch_size", "train.grad_accum"],
            || {
                format!(
                    "must be \"auto\" or a number of samples that divides the effective batch \
                     train.batch_size × train.grad_accum = {effective} (got {m})"
                )
            },
        );
    }
    f.at_least("train.log_every", train.log_every, 1);
    if train.eval_every > 0 {
        f.at_least("train.eval_batches", train.eval_batches, 1);
        let fraction = data.val_fraction;
        f.require_with(fraction > 0.0, "train.eval_every", &["data.val_fraction"], || {
            format!(
                "evaluation needs a validation split: set data.val_fraction above 0 \
                 (got {fraction}) or train.eval_every = 0"
            )
        });
    }
}

fn optimizer(f: &mut Findings, opt: &OptimizerSection, max_steps: u64) {
    f.positive("optimizer.lr", opt.lr);
    f.non_negative("optimizer.min_lr", opt.min_lr);
    if opt.lr.is_finite() && opt.min_lr.is_finite() {
        let (lr, min_lr) = (opt.lr, opt.min_lr);
        f.require_with(min_lr <= lr, "optimizer.min_lr", &["optimizer.lr"], || {
            format!("must not exceed optimizer.lr = {lr} (got {min_lr})")
        });
    }
    f.unit_fraction("optimizer.beta1", opt.beta1);
    f.unit_fraction("optimizer.beta2", opt.beta2);
    f.positive("optimizer.eps", opt.eps);
    f.non_negative("optimizer.weight_decay", opt.weight_decay);
    let warmup = opt.warmup_steps;
    match opt.decay_steps {
        Some(decay) => {
            f.at_least("optimizer.decay_steps", decay, 1);
            f.require_with(warmup <= decay, "optimizer.warmup_steps", &["optimizer.decay_steps"], || {
                format!("must not exceed optimizer.decay_steps = {decay} (got {warmup})")
            });
        }
        None => f.require_with(warmup <= max_steps, "optimizer.warmup_steps", &["run.max_steps"], || {
            format!(
                "must not exceed the decay length, run.max_steps = {max_steps} \
                     (got {warmup})"
            )
        }),
    }
}

fn precision(f: &mut Findings, p: &PrecisionSection) {
    f.positive("precision.initial_scale", p.initial_scale);
    let growth = p.growth_factor;
    f.require(growth.is_finite() && growth > 1.0, "precision.growth_factor", || {
        format!("must be a number greater than 1 (got {growth})")
    });
    let backoff = p.backoff_factor;
    f.require(backoff > 0.0 && backoff < 1.0, "precision.backoff_factor", || {
        format!("must be greater than 0 and below 1 (got {backoff})")
    });
    f.at_least("precision.growth_interval", p.growth_interval, 1);
}

fn checkpoint(f: &mut Findings, c: &CheckpointSection) {
    f.require(c.interval != CheckpointInterval::Fixed(Duration::ZERO), "checkpoint.interval", || {
        "must be \"auto\" or longer than 0, e.g. \"5m\"".to_string()
    });
    f.require(c.mtbf != Some(Duration::ZERO), "checkpoint.mtbf", || {
        "must be longer than 0, e.g. \"6h\", or left out to estimate it from the run's earlier attempts".to_string()
    });
    f.require_with(
        c.mtbf.is_none() || c.interval == CheckpointInterval::Auto,
        "checkpoint.mtbf",
        &["checkpoint.interval"],
        || "is only used with checkpoint.interval = \"auto\"; set that, or remove mtbf".to_string(),
    );
    f.at_least("checkpoint.keep", c.keep, 1);
    f.at_least("checkpoint.max_consecutive_failures", c.max_consecutive_failures, 1);
    if let AutoSize::Fixed(block) = c.write_block {
        f.require(block % 4096 == 0 && (64 << 10..=256 << 20).contains(&block), "checkpoint.write_block", || {
            format!("must be \"auto\" or a multiple of 4 KiB from 64 KiB to 256 MiB, e.g. \"8MiB\" (got {block} bytes)")
        });
    }
    f.require(c.write_queue_depth <= 64, "checkpoint.write_queue_depth", || {
        format!("must be 0 (automatic) or 1 to 64 (got {})", c.write_queue_depth)
    });
    if let AutoSize::Fixed(shard) = c.shard_size {
        f.require(shard >= 4096, "checkpoint.shard_size", || {
            format!("must be \"auto\" or at least 4 KiB, e.g. \"2GiB\" (got {shard} bytes)")
        });
    }
}

fn signals(f: &mut Findings, s: &SignalsSection) {
    let (grace, margin) = (s.grace, s.safety_margin);
    f.require_with(grace > margin, "signals.grace", &["signals.safety_margin"], || {
        format!(
            "must be longer than signals.safety_margin = {} (got {})",
            humantime::format_duration(margin),
            humantime::format_duration(grace)
        )
    });
}

fn watchdog(f: &mut Findings, w: &WatchdogSection) {
    f.require(w.floor > Duration::ZERO, "watchdog.floor", || "must be longer than 0, e.g. \"10m\"".to_string());
    for (key, limit) in [
        ("watchdog.step", w.step),
        ("watchdog.eval", w.eval),
        ("watchdog.save", w.save),
        ("watchdog.publish", w.publish),
    ] {
        f.require(limit != Limit::Fixed(Duration::ZERO), key, || {
            "must be \"auto\" or longer than 0 (use watchdog.enabled = false to turn the watchdog off)".to_string()
        });
    }
}

fn gpu(f: &mut Findings, g: &GpuSection) {
    f.unit_fraction("gpu.headroom", g.headroom);
    f.require_with(!(g.require && g.backend == GpuBackend::Cpu), "gpu.require", &["gpu.backend"], || {
        "cannot be true with gpu.backend = \"cpu\" (a GPU is required but the CPU is selected)".to_string()
    });
    f.require(g.monitor_interval > Duration::ZERO, "gpu.monitor_interval", || {
        "must be longer than 0, e.g. \"10s\"".to_string()
    });
}

/// The shortest `[lock] stale_after`: the holder rewrites its heartbeat every
/// sixth of it, so 2 s leaves a third of a second between heartbeats; any
/// filesystem stall longer than the timeout would make a live run look dead
/// to another node, which would take its run directory over.
const MIN_LOCK_STALE_AFTER: Duration = Duration::from_secs(2);

fn lock(f: &mut Findings, l: &LockSection) {
    let stale = l.stale_after;
    f.require(stale >= MIN_LOCK_STALE_AFTER, "lock.stale_after", || {
        format!(
            "must be at least {} (got {}): the holder rewrites its heartbeat every sixth of it (at most every 10 s), \
             and a shorter timeout would let a filesystem stall make a live run look dead to another node",
            humantime::format_duration(MIN_LOCK_STALE_AFTER),
            humantime::format_duration(stale)
        )
    });
}

/// The shortest `[distributed] timeout`: every rank rewrites its heartbeat
/// every tenth of it (at least every 100 ms), and a shorter timeout would
/// make a filesystem hiccup look like a lost rank and abort a healthy world.
const MIN_DISTRIBUTED_TIMEOUT: Duration = Duration::from_secs(1);

fn recovery(f: &mut Findings, r: &RecoverySection, shard_optimizer: bool) {
    f.require(r.local_interval != AutoDuration::Fixed(Duration::ZERO), "recovery.local_interval", || {
        "must be \"auto\" or longer than 0, e.g. \"30s\"".to_string()
    });
    f.require((1..=2).contains(&r.local_keep), "recovery.local_keep", || {
        format!("must be 1 or 2 (got {}): older local checkpoints only take a node's memory or disk", r.local_keep)
    });
    let share = r.local_max_share;
    f.require(share > 0.0 && share <= 1.0, "recovery.local_max_share", || {
        format!("must be greater than 0 and at most 1 (got {share})")
    });
    if let Some(dir) = &r.local_dir {
        f.require(!dir.trim().is_empty(), "recovery.local_dir", || {
            "is empty; leave it out for $SLURM_TMPDIR, $TMPDIR or /dev/shm, or name a node-local directory".into()
        });
    }
    f.require_with(!(r.local && shard_optimizer), "recovery.local", &["distributed.shard_optimizer"], || {
        "cannot be used with distributed.shard_optimizer = true: each rank then holds only its slice of the \
         optimizer, so no node has a whole copy to write; turn one of them off"
            .to_string()
    });
}

fn health(f: &mut Findings, h: &HealthSection) {
    let factor = h.straggler_factor;
    f.require(factor.is_finite() && factor > 1.0, "health.straggler_factor", || {
        format!(
            "must be a number above 1 (got {factor}): a rank is a straggler when its step takes more than this many \
             times the median of the others', e.g. 1.5"
        )
    });
    if let Some(command) = &h.command {
        f.require(!command.trim().is_empty(), "health.command", || {
            "is empty; leave it out for no site check, or give a command for `sh -c`".into()
        });
    }
    f.require(!h.timeout.is_zero(), "health.timeout", || "must be longer than 0, e.g. \"60s\"".into());
    f.require(h.timeout <= MAX_HEALTH_TIMEOUT, "health.timeout", || {
        format!(
            "must be at most {} (got {}): the site command runs before every attempt on every node, and a check \
             that needs longer holds the whole allocation idle",
            humantime::format_duration(MAX_HEALTH_TIMEOUT),
            humantime::format_duration(h.timeout)
        )
    });
    let share = h.min_free_device_memory;
    f.require((0.0..=1.0).contains(&share), "health.min_free_device_memory", || {
        format!("must be a share from 0 to 1 (got {share}); 0 checks nothing")
    });
    f.require(!h.max_clock_skew.is_zero(), "health.max_clock_skew", || {
        "must be longer than 0, e.g. \"60s\" (clocks never agree exactly)".into()
    });
}

fn distributed(f: &mut Findings, d: &DistributedSection) {
    f.require(d.timeout >= MIN_DISTRIBUTED_TIMEOUT, "distributed.timeout", || {
        format!(
            "must be at least {} (got {}): every rank rewrites its heartbeat every tenth of it, and a shorter \
             timeout would make a filesystem stall look like a lost rank and abort a healthy run",
            humantime::format_duration(MIN_DISTRIBUTED_TIMEOUT),
            humantime::format_duration(d.timeout)
        )
    });
}

/// Whether `pattern` may be a `[publish] include` pattern: a glob relative
/// to the run directory that cannot leave it (no absolute path, no `..`
/// component), each of its `/`-separated components a valid glob (`**` only
/// as a whole component). `Err` says why not. Publishing matches patterns
/// component by component (`publish/select.rs`).
pub fn check_include_pattern(pattern: &str) -> Result<(), String> {
    if pattern.trim().is_empty() {
        return Err("is empty; write a pattern relative to the run directory, e.g. \"samples/*.txt\"".into());
    }
    if pattern.starts_with('/') {
        return Err(format!(
            "`{pattern}` is an absolute path; patterns are relative to the run directory, e.g. \"samples/*.txt\""
        ));
    }
    if pattern.split('/').any(|c| c == "..") {
        return Err(format!(
            "`{pattern}` leaves the run directory (`..`); only files inside the run directory are published"
        ));
    }
    let invalid = |e: glob::PatternError| format!("`{pattern}` is not a valid glob pattern: {e}");
    glob::Pattern::new(pattern).map_err(invalid)?;
    for component in pattern.split('/').filter(|c| !c.is_empty() && *c != "**") {
        glob::Pattern::new(component).map_err(invalid)?;
    }
    Ok(())
}

fn publish(f: &mut Findings, p: &PublishSection) {
    // Checked even when publishing is off: a `--set publish.enabled=true`
    // later must not find a bad pattern at the end of a run.
    for (i, pattern) in p.include.iter().enumerate() {
        let problem = check_include_pattern(pattern).err();
        f.require(problem.is_none(), "publish.include", || {
            format!("entry {}: {}", i + 1, problem.clone().unwrap_or_default())
        });
    }
    if !p.enabled {
        return;
    }
    f.require_with(p.repo.is_some(), "publish.repo", &["publish.enabled"], || {
        "is required when publish.enabled = true (path of a local clone)".to_string()
    });
    f.require(!p.remote.is_empty(), "publish.remote", || {
        "must name a git remote when publishing (got \"\")".to_string()
    });
    f.require(!p.branch.is_empty(), "publish.branch", || "must name a branch when publishing (got \"\")".to_string());
    f.require(p.max_attempts >= 1, "publish.max_attempts", || "must be at least 1".to_string());
    f.require(p.retry_initial <= p.retry_max, "publish.retry_initial", || {
        "must not exceed publish.retry_max".to_string()
    });
}

fn telemetry(f: &mut Findings, t: &TelemetrySection) {
    if let TensorBoardSetting::Dir(dir) = &t.tensorboard {
        f.require(!dir.trim().is_empty(), "telemetry.tensorboard", || {
            "must be true, false or a directory, not an empty string".to_string()
        });
        if let Err(why) = check_placeholders(dir) {
            f.require(false, "telemetry.tensorboard", || why);
        }
    }
    if let Some(path) = &t.prometheus_textfile {
        f.require(path.ends_with(".prom") && path.len() > ".prom".len(), "telemetry.prometheus_textfile", || {
            format!(
                "{path:?} must end in `.prom`: node_exporter's textfile collector reads only *.prom files (e.g. \
                 \"/var/lib/prometheus/node-exporter/rekindle-{{run}}.prom\")"
            )
        });
        if let Err(why) = check_placeholders(path) {
            f.require(false, "telemetry.prometheus_textfile", || why);
        }
    }
    for (i, word) in t.secret_words.iter().enumerate() {
        f.require(
            !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric()),
            "telemetry.secret_words",
            || {
                format!(
                    "entry {} ({word:?}) must be ASCII letters and digits only: names are split at `_`, `-` and `.` \
                 before a part is matched, so write e.g. \"key\" rather than \"api_key\"",
                    i + 1
                )
            },
        );
    }
}

/// The `{…}` of a telemetry path must be `{run}` or `{job}`.
fn check_placeholders(path: &str) -> Result<(), String> {
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err(format!("{path:?} has a `{{` without its `}}`: the placeholders are {{run}} and {{job}}"));
        };
        let name = &after[..close];
        if name != "run" && name != "job" {
            return Err(format!(
                "{path:?} has an unknown placeholder {{{name}}}: the placeholders are {{run}} and {{job}}"
            ));
        }
        rest = &after[close + 1..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(config: &Config) -> Vec<&'static str> {
        findings(config).into_iter().map(|f| f.key).collect()
    }

    #[test]
    fn default_config_is_valid() {
        assert_eq!(validate(&Config::default()), vec![]);
    }

    #[test]
    fn reports_every_failed_check_at_once() {
        let mut c = Config::default();
        c.checkpoint.keep = 0;
        c.run.max_steps = 0;
        c.train.batch_size = 0;
        c.gpu.headroom = 1.0;
        assert_eq!(keys(&c), ["run.max_steps", "train.batch_size", "checkpoint.keep", "gpu.headroom"]);
    }

    #[test]
    fn messages_say_what_is_allowed() {
        let mut c = Config::default();
        c.checkpoint.keep = 0;
        assert_eq!(validate(&c)[0].message, "must be at least 1 (got 0)");
    }

    #[test]
    fn a_straggler_factor_must_be_above_one_and_zero_steps_is_allowed() {
        for (factor, ok) in
            [(1.5, true), (1.01, true), (1.0, false), (0.5, false), (f64::NAN, false), (f64::INFINITY, false)]
        {
            let mut c = Config::default();
            c.health.straggler_factor = factor;
            c.health.straggler_steps = 0;
            let found = validate(&c);
            assert_eq!(found.is_empty(), ok, "{factor}: {found:?}");
            if !ok {
                assert_eq!(found[0].key, "health.straggler_factor");
                assert!(found[0].message.starts_with("must be a number above 1"), "{}", found[0].message);
            }
        }
    }

    #[test]
    fn gpt_width_must_divide_by_heads() {
        let mut c = Config::default();
        c.model.kind = ModelKind::Gpt;
        c.model.width = 64;
        c.model.heads = 3;
        let found = findings(&c);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].key, "model.width");
        assert_eq!(found[0].depends_on, ["model.heads"]);
        assert!(found[0].message.contains("divisible by model.heads = 3"));
    }

    #[test]
    fn only_the_selected_model_kind_is_checked() {
        let mut c = Config::default();
        c.model.heads = 0; // a gpt key, irrelevant to the default mlp
        assert!(keys(&c).is_empty());
        c.model.kind = ModelKind::Gpt;
        c.model.hidden = vec![]; // an mlp key, irrelevant to gpt
        assert_eq!(keys(&c), ["model.heads"]);
    }

    #[test]
    fn mlp_hidden_needs_positive_widths() {
        let mut c = Config::default();
        c.model.hidden = vec![];
        c.model.classes = 1;
        assert_eq!(keys(&c), ["model.hidden", "model.classes"]);
        c.model.hidden = vec![32, 0];
        c.model.classes = 2;
        assert_eq!(keys(&c), ["model.hidden"]);
        assert!(findings(&c)[0].message.contains("entry 2"));
    }

    #[test]
    fn jsonl_data_requires_a_path() {
        let mut c = Config::default();
        c.model.kind = ModelKind::Gpt;
        c.data.kind = DataKind::Jsonl;
        assert_eq!(keys(&c), ["data.path"]);
        c.data.path = Some("data/x.jsonl".into());
        assert!(keys(&c).is_empty());
    }

    #[test]
    fn text_data_requires_a_path_and_no_jsonl_field() {
        let mut c = Config::default();
        c.model.kind = ModelKind::Gpt;
        c.data.kind = DataKind::Text;
        assert_eq!(keys(&c), ["data.path"]);
        assert!(findings(&c)[0].message.contains("data.kind = \"text\""));
        c.data.path = Some("configs/sonnets.txt".into());
        // `field` names a JSONL record's field: a text file has none.
        c.data.field = String::new();
        assert!(keys(&c).is_empty());
        c.model.kind = ModelKind::Mlp;
        assert_eq!(keys(&c), ["data.kind"]);
    }

    #[test]
    fn the_mlp_model_refuses_jsonl_data() {
        let mut c = Config::default();
        c.data.kind = DataKind::Jsonl;
        c.data.path = Some("data/x.jsonl".into());
        assert_eq!(keys(&c), ["data.kind"]);
        assert_eq!(findings(&c)[0].depends_on, ["model.kind"]);
        assert!(findings(&c)[0].message.contains("synthetic data only"));
        // A registered model decides for itself what data it takes.
        c.model.kind = ModelKind::Registered("conv".into());
        assert!(keys(&c).is_empty());
    }

    #[test]
    fn fractions_reject_one_and_nan() {
        let mut c = Config::default();
        c.data.val_fraction = 1.0;
        c.model.dropout = f64::NAN;
        c.optimizer.beta2 = 1.0;
        assert_eq!(keys(&c), ["model.dropout", "data.val_fraction", "optimizer.beta2"]);
    }

    #[test]
    fn watchdog_limits_and_floor_must_be_longer_than_zero() {
        let mut c = Config::default();
        c.watchdog.step = Limit::Fixed(Duration::ZERO);
        c.watchdog.save = Limit::Fixed(Duration::from_secs(5));
        c.watchdog.floor = Duration::ZERO;
        assert_eq!(keys(&c), ["watchdog.floor", "watchdog.step"]);
    }

    #[test]
    fn optimizer_schedule_relations() {
        let mut c = Config::default();
        c.optimizer.min_lr = 0.1;
        c.optimizer.warmup_steps = c.run.max_steps + 1;
        assert_eq!(keys(&c), ["optimizer.min_lr", "optimizer.warmup_steps"]);
        c.optimizer.min_lr = 0.0;
        c.optimizer.decay_steps = Some(c.run.max_steps + 10);
        assert!(keys(&c).is_empty(), "warm-up fits in an explicit decay length");
        c.optimizer.lr = 0.0;
        assert_eq!(keys(&c), ["optimizer.lr"]);
    }

    #[test]
    fn loss_scaler_factors_must_grow_and_back_off() {
        let mut c = Config::default();
        c.precision.growth_factor = 1.0;
        c.precision.backoff_factor = 1.0;
        assert_eq!(keys(&c), ["precision.growth_factor", "precision.backoff_factor"]);
    }

    #[test]
    fn grace_must_exceed_safety_margin() {
        let mut c = Config::default();
        c.signals.grace = Duration::from_secs(10);
        let found = findings(&c);
        assert_eq!(found[0].key, "signals.grace");
        assert_eq!(found[0].message, "must be longer than signals.safety_margin = 10s (got 10s)");
    }

    #[test]
    fn zero_checkpoint_interval_is_rejected() {
        let mut c = Config::default();
        c.checkpoint.interval = CheckpointInterval::Fixed(Duration::ZERO);
        assert_eq!(keys(&c), ["checkpoint.interval"]);
    }

    #[test]
    fn mtbf_must_be_positive_and_needs_the_auto_interval() {
        let mut c = Config::default();
        c.checkpoint.interval = CheckpointInterval::Auto;
        c.checkpoint.mtbf = Some(Duration::ZERO);
        assert_eq!(keys(&c), ["checkpoint.mtbf"]);
        c.checkpoint.mtbf = Some(Duration::from_secs(3600));
        assert!(keys(&c).is_empty());
        c.checkpoint.interval = CheckpointInterval::Fixed(Duration::from_secs(300));
        assert_eq!(keys(&c), ["checkpoint.mtbf"]);
        c.checkpoint.mtbf = None;
        assert!(keys(&c).is_empty());
    }

    #[test]
    fn requiring_a_gpu_contradicts_the_cpu_backend() {
        let mut c = Config::default();
        c.gpu.require = true;
        assert!(keys(&c).is_empty());
        c.gpu.backend = GpuBackend::Cpu;
        let found = findings(&c);
        assert_eq!(found[0].key, "gpu.require");
        assert_eq!(found[0].depends_on, ["gpu.backend"]);
    }

    #[test]
    fn zero_monitor_interval_is_rejected() {
        let mut c = Config::default();
        c.gpu.monitor_interval = Duration::ZERO;
        assert_eq!(keys(&c), ["gpu.monitor_interval"]);
    }

    #[test]
    fn a_lock_stale_timeout_under_two_seconds_is_rejected_saying_why() {
        let mut c = Config::default();
        c.lock.stale_after = Duration::from_millis(1500);
        let found = findings(&c);
        assert_eq!(found.iter().map(|f| f.key).collect::<Vec<_>>(), ["lock.stale_after"]);
        assert!(found[0].message.contains("heartbeat every sixth of it"), "{}", found[0].message);
        c.lock.stale_after = Duration::from_secs(2);
        assert_eq!(keys(&c), Vec::<&str>::new());
    }

    #[test]
    fn micro_batch_must_divide_the_effective_batch() {
        let mut c = Config::default();
        c.train.batch_size = 16;
        c.train.grad_accum = 2;
        for ok in [MicroBatch::Auto, MicroBatch::Samples(1), MicroBatch::Samples(8), MicroBatch::Samples(32)] {
            c.train.micro_batch = Some(ok);
            assert!(keys(&c).is_empty(), "{ok:?}");
        }
        for bad in [0, 3, 64] {
            c.train.micro_batch = Some(MicroBatch::Samples(bad));
            let found = findings(&c);
            assert_eq!(found.len(), 1, "{bad}");
            assert_eq!(found[0].key, "train.micro_batch");
            assert_eq!(found[0].depends_on, ["train.batch_size", "train.grad_accum"]);
            assert!(found[0].message.contains("divides the effective batch"), "{}", found[0].message);
            assert!(found[0].message.contains("= 32 (got"), "{}", found[0].message);
        }
    }

    #[test]
    fn publishing_requires_a_repo() {
        let mut c = Config::default();
        c.publish.enabled = true;
        assert_eq!(keys(&c), ["publish.repo"]);
    }

    #[test]
    fn include_patterns_stay_inside_the_run_directory_and_are_valid_globs() {
        for ok in ["samples/*.txt", "**/*.png", "plots/**", "eval.csv", "./notes.md", "a/[bc]?.json", "*"] {
            assert_eq!(check_include_pattern(ok), Ok(()), "{ok}");
        }
        let why = |p: &str| check_include_pattern(p).unwrap_err();
        assert!(why("../secrets/*").contains("leaves the run directory"), "{}", why("../secrets/*"));
        assert!(why("samples/../../x").contains("leaves the run directory"));
        assert!(why("..").contains("leaves the run directory"));
        assert!(why("/etc/passwd").contains("absolute path"));
        assert!(why("").contains("is empty") && why("  ").contains("is empty"));
        assert!(why("a/**b").contains("not a valid glob pattern"), "{}", why("a/**b"));
        assert!(why("[ab").contains("not a valid glob pattern"));
        assert!(why("[a/b]").contains("not a valid glob pattern"), "a bracket may not span components");
        assert_eq!(check_include_pattern("a..b/x..y"), Ok(()), "dots inside a name are fine");
    }

    #[test]
    fn every_bad_include_pattern_is_reported_even_with_publishing_off() {
        let mut c = Config::default();
        c.publish.include = vec!["ok/*.txt".into(), "../x".into(), "/abs".into()];
        let found = findings(&c);
        assert_eq!(found.iter().map(|f| f.key).collect::<Vec<_>>(), ["publish.include", "publish.include"]);
        assert!(found[0].message.starts_with("entry 2: `../x` leaves the run directory"), "{}", found[0].message);
        assert!(found[1].message.starts_with("entry 3: `/abs` is an absolute path"), "{}", found[1].message);
    }

    #[test]
    fn secret_words_are_plain_words() {
        let mut c = Config::default();
        c.telemetry.secret_words = vec!["wandb".into(), "api_key".into(), "".into()];
        let found = findings(&c);
        assert_eq!(found.iter().map(|f| f.key).collect::<Vec<_>>(), ["telemetry.secret_words"; 2]);
        assert!(found[0].message.starts_with("entry 2 (\"api_key\")"), "{}", found[0].message);
        c.telemetry.secret_words.clear();
        assert!(keys(&c).is_empty(), "no words: only URL credentials and bearer tokens are redacted");
    }

    #[test]
    fn telemetry_paths_name_known_placeholders_and_a_prom_file() {
        let mut c = Config::default();
        c.telemetry.tensorboard = TensorBoardSetting::Dir("/scratch/tb/{run}-{job}".into());
        c.telemetry.prometheus_textfile = Some("/var/lib/node-exporter/{run}.prom".into());
        assert!(keys(&c).is_empty());
        for (tb, prom, wrong) in [
            ("", "x.prom", vec!["telemetry.tensorboard"]),
            ("tb/{name}", "x.prom", vec!["telemetry.tensorboard"]),
            ("tb/{run", "x.txt", vec!["telemetry.tensorboard", "telemetry.prometheus_textfile"]),
            ("tb", ".prom", vec!["telemetry.prometheus_textfile"]),
            ("tb", "{node}.prom", vec!["telemetry.prometheus_textfile"]),
        ] {
            c.telemetry.tensorboard = TensorBoardSetting::Dir(tb.into());
            c.telemetry.prometheus_textfile = Some(prom.into());
            assert_eq!(keys(&c), wrong, "{tb:?} {prom:?}");
        }
        let found = findings(&c);
        assert!(found[0].message.contains("unknown placeholder {node}"), "{}", found[0].message);
    }

    #[test]
    fn evaluation_needs_a_validation_split() {
        let mut c = Config::default();
        c.train.eval_every = 100;
        c.data.val_fraction = 0.0;
        assert_eq!(keys(&c), ["train.eval_every"]);
    }

    #[test]
    fn run_name_must_be_a_directory_name() {
        let mut c = Config::default();
        for bad in ["", "a/b", "..", " "] {
            c.run.name = bad.into();
            assert_eq!(keys(&c), ["run.name"], "{bad:?}");
        }
    }
}
