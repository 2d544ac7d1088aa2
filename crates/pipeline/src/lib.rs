//! hypercodec-pipeline: what every hypercodec front end shares — tensor sources
//! (safetensors, GGUF, seeded synthetic tensors), the compress driver with progress and
//! cancellation, the planner's options and AUTO's candidate list, archive summaries and the
//! benchmark's rows.
//!
//! Key design decision: front ends hold no pipeline logic. The CLI, the Python wheel and the
//! browser inspector parse their arguments into the plain option structs of this crate
//! ([`CodebookOptions`], [`PlanOptions`], [`CompressOptions`], each with a `Default` that
//! states every default), call the same functions, and only print, draw a progress bar on
//! the [`Progress`] callback, or map [`PipelineError`] to an exit code or an exception. So
//! `compress --encoding auto`, `plan --mode auto` and the benchmark's auto rows choose from
//! one candidate list ([`auto_candidates`]), and `inspect --json` and the browser show one
//! [`ArchiveSummary`].
//!
//! # Features
//! - `fs` (default): files and memory maps, the planner, the compress driver, the benchmark.
//!   Without it only the pure part builds (summaries, error statistics, the error type),
//!   which is what the wasm32 browser inspector uses.
#![deny(missing_docs)]

mod error;
mod stats;
mod summary;
mod threads;

pub use error::{PipelineError, Result};
pub use stats::{gaussian_bound_db, ErrorAcc};
pub use summary::{
    legacy_summary, lossy_without_snr, summarize, ArchiveSummary, LossyTotals, StreamSummary,
    TensorSummary, Totals,
};
pub use threads::{init_threads, MAX_THREADS, THREADS_ENV};

/// The values of a tensor of `shape`, saturating at `u64::MAX` (a wrapped count could pass for a
/// small tensor; no buffer holds a saturated one, so every length check against it fails).
pub fn numel(shape: &[u64]) -> u64 {
    shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
}

#[cfg(feature = "fs")]
mod archive;
#[cfg(feature = "fs")]
pub mod bench;
#[cfg(feature = "fs")]
mod calibration;
#[cfg(feature = "fs")]
mod compress;
#[cfg(feature = "fs")]
pub mod gguf;
#[cfg(feature = "fs")]
mod output;
#[cfg(feature = "fs")]
mod plan;
#[cfg(feature = "fs")]
mod progress;
#[cfg(feature = "fs")]
pub mod rate;
#[cfg(feature = "fs")]
pub mod run;
#[cfg(feature = "fs")]
pub mod safetensors_out;
#[cfg(feature = "fs")]
pub mod shards;
#[cfg(feature = "fs")]
mod source;
#[cfg(feature = "fs")]
pub mod synth;

#[cfg(feature = "fs")]
pub use archive::{
    decompress, float_bytes, inspect_file, is_legacy, open_archive, open_legacy, write_synthetic,
    MIN_CAST_SNR_DB,
};
#[cfg(feature = "fs")]
pub use calibration::Calibration;
#[cfg(feature = "fs")]
pub use compress::{
    compress, compress_to_file, compress_to_shards, constant_instead, payload_bytes,
    prefix_fallback, prefix_unfit, raw_instead, CompressOptions, CompressReport, FileReport, Route,
    GENERATOR,
};
#[cfg(feature = "fs")]
pub use output::{check_output, write_text};
#[cfg(feature = "fs")]
pub use plan::{
    auto_candidates, plan_source, read_plan, read_sensitivity, sensitivity_arg, side_bytes,
    target_bps, unmatched_sensitivity, Chooser, CodebookOptions, LatticeOptions, LatticeRate,
    PlanOptions, Selection,
};
#[cfg(feature = "fs")]
pub use progress::{Cancel, Phase, Progress};
#[cfg(feature = "fs")]
pub use source::{
    SkippedTensor, SourceTensor, SourceType, SplitMix64, TensorSource, MAX_SYNTHETIC_VALUES,
};
