//! `rekindle gpus` and `rekindle doctor`: what this machine (or a described
//! one) offers a run before it is submitted. Together because both take the
//! same config and GPU inventory flags and plan from the same footprint.

use std::path::Path;

use super::CliError;
use super::args::{DoctorArgs, GpusArgs};
use super::output::emit;
use crate::config;
use crate::exit::Outcome;
use crate::train::Registry;

/// The config to plan for: the given file, or the defaults.
fn config_or_default(path: Option<&Path>, registry: &Registry) -> Result<config::Config, CliError> {
    Ok(match path {
        Some(p) => config::load_with(p, &[], registry)?.config,
        None => config::Config::default(),
    })
}

/// A config error as one line of the checklist: every problem with its
/// place, `; `-separated.
fn config_problems(error: &config::ConfigError) -> String {
    match error {
        config::ConfigError::Invalid { source_name, problems } => {
            problems.iter().map(|p| p.render(source_name)).collect::<Vec<_>>().join("; ")
        }
        config::ConfigError::Read { .. } => error.to_string(),
    }
}

pub(super) fn gpus(args: &GpusArgs, registry: &Registry) -> Result<Outcome, CliError> {
    let cfg = config_or_default(args.target.config.as_deref(), registry)?;
    let report =
        crate::gpu::gpus_report(args.target.inventory.as_deref(), &cfg, crate::train::footprint(&cfg, registry)?)?;
    emit(&report, args.output.json);
    Ok(Outcome::Done)
}

pub(super) fn doctor(args: &DoctorArgs, registry: &Registry) -> Result<Outcome, CliError> {
    // A config that does not load is the config check's failure, with every
    // problem it has: the checklist still runs (on the defaults) and says so,
    // and the exit is 1 as for any failed required check.
    let loaded = args.target.config.as_deref().map(|p| config::load_with(p, &args.set.overrides, registry));
    let (cfg, config_error) = match loaded {
        Some(Ok(l)) => (Some(l.config), None),
        Some(Err(e)) => (None, Some(config_problems(&e))),
        None if !args.set.overrides.is_empty() => {
            (None, Some("--set needs --config: there is no config to override".to_string()))
        }
        None => (None, None),
    };
    // The checks `rekindle run` makes before it starts (its model builds,
    // its data loads), on the trainer whose parameters the footprint counts.
    let checked = cfg.clone().unwrap_or_default();
    let trainer = registry.checked_workload(&checked).and_then(|w| crate::train::Trainer::with_workload(&checked, w));
    let (fp, workload_error) = match trainer {
        Ok(trainer) => (Some(crate::train::footprint_for(&checked, trainer.param_count())), None),
        // Without a config the defaults are only the backdrop of the checks.
        Err(e) => (None, cfg.as_ref().map(|_| e.to_string())),
    };
    let opts = crate::doctor::DoctorOptions {
        inventory: args.target.inventory.clone(),
        footprint: fp,
        expected_checkpoint_bytes: None,
        workload_error,
        config_error,
    };
    let list = crate::doctor::doctor(cfg.as_ref(), &opts);
    emit(&list, args.output.json);
    Ok(if list.any_required_failed() { Outcome::Failure } else { Outcome::Done })
}
