//! `rekindle data validate`: checks a JSONL dataset line by line and, when
//! asked, writes a cleaned copy.

use super::CliError;
use super::args::ValidateArgs;
use super::output::emit;
use crate::exit::Outcome;

pub(super) fn validate(args: &ValidateArgs) -> Result<Outcome, CliError> {
    use crate::train::{CleanMode, ValidateOptions, validate_file, write_clean};
    let opts = ValidateOptions { field: args.field.clone(), max_len: args.max_len, ..ValidateOptions::default() };
    let report = validate_file(&args.file, &opts)?;
    emit(&report, args.output.json);
    if let Some(out) = &args.out {
        let mode = if args.truncate { CleanMode::Truncate } else { CleanMode::Drop };
        let summary = write_clean(&args.file, out, &opts, mode)?;
        errln!(
            "wrote {}: {} lines kept, {} truncated, {} dropped",
            out.display(),
            summary.kept,
            summary.truncated,
            summary.dropped
        );
    }
    Ok(if report.is_clean() { Outcome::Done } else { Outcome::Failure })
}
