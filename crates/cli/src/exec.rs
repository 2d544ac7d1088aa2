//! Execution on the compressed form: `hypercodec run` and `hypercodec benchmark --runtime`.

use crate::print::BenchArgs;
use crate::sink::outln;
use clap::Args;
use hypercodec_pipeline::run::{self, RunOptions};
use hypercodec_pipeline::{PipelineError, Result};
use hypercodec_runtime::bench::{self, RuntimeBenchOptions};
use hypercodec_runtime::LoadOptions;
use std::path::PathBuf;

/// `hypercodec run`.
#[derive(Args)]
pub struct RunArgs {
    /// The .hwz archive (or a shard index `*.hwz.index.json`).
    pub archive: PathBuf,
    /// The uncompressed model (same tensor names) for the dense baseline; by default the
    /// decompressed weights.
    #[arg(long)]
    pub original: Option<String>,
    /// Rows of activations per call (1 to 65536).
    #[arg(long, default_value_t = 1, value_parser = batch_size)]
    pub batch: usize,
    /// Only weights whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
    /// Convert entropy-coded lattice weights to fixed-rate symbols of this many bits at load
    /// (re-quantizes; the SNR of each conversion is printed).
    #[arg(long)]
    pub fixed_bits: Option<u8>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Loads the archive's matrices as compressed operators and times a pass against dense f32.
pub fn run(args: &RunArgs) -> Result<()> {
    let options = RunOptions {
        batch: args.batch,
        filter: args.filter.clone(),
        load: LoadOptions {
            fixed_bits: args.fixed_bits,
        },
        ..RunOptions::default()
    };
    let r = run::run(&args.archive, args.original.as_deref(), &options)?;
    if args.json {
        return print_json("run report", &r);
    }
    outln!("| layer | shape | input | path | held MB |\n|---|---|---|---|---:|");
    for l in &r.layers {
        let input = if l.chained { "previous" } else { "fresh" };
        outln!(
            "| {} | {}x{} | {input} | {} | {:.2} |",
            l.name,
            l.shape[0],
            l.shape[1],
            l.path,
            l.held_bytes as f64 / 1e6
        );
    }
    let against = if r.against_original {
        "the original f32 weights"
    } else {
        "the decompressed weights in f32"
    };
    outln!(
        "{} layers, batch {}, {} threads ({}): compressed {:.1} µs per pass, dense f32 ({against}) {:.1} µs: {:.2}× ; held {:.1} MB vs {:.1} MB dense; output SNR vs dense {}",
        r.layers.len(),
        r.batch,
        r.threads,
        r.simd,
        r.ours_us,
        r.dense_us,
        r.speedup,
        r.held_bytes as f64 / 1e6,
        r.dense_bytes as f64 / 1e6,
        match r.output_snr_db {
            s if s.is_finite() => format!("{s:.1} dB"),
            s if s > 0.0 => "exact".into(),
            _ => "undefined (the outputs are not finite)".into(),
        }
    );
    Ok(())
}

fn parse_shape(text: &str) -> Result<(usize, usize)> {
    let bad = || PipelineError::option("--shapes", format!("`{text}`: use ROWSxCOLS"));
    let (a, b) = text.split_once('x').ok_or_else(bad)?;
    match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
        (Ok(r), Ok(c)) if r > 0 && c > 0 && r.checked_mul(c).is_some_and(|n| n <= 1 << 28) => {
            Ok((r, c))
        }
        _ => Err(bad()),
    }
}

/// `hypercodec benchmark --runtime`.
pub fn runtime_benchmark(args: &BenchArgs) -> Result<()> {
    let mut options = RuntimeBenchOptions {
        shapes: args
            .shapes
            .iter()
            .map(|s| parse_shape(s))
            .collect::<Result<_>>()?,
        batches: args.batches.clone(),
        ..RuntimeBenchOptions::default()
    };
    if !args.encodings.is_empty() {
        // The labels, from the benchmark's own list.
        let labels: Vec<String> = options.encodings.iter().map(|e| e.label.clone()).collect();
        // Filters as typed in a list ("int4, e8"): spaces around them and case do not count.
        let filters: Vec<String> = args
            .encodings
            .iter()
            .map(|f| f.trim().to_lowercase())
            .filter(|f| !f.is_empty())
            .collect();
        let matches = |label: &str, f: &str| label.to_lowercase().contains(f);
        // Every filter has to match a label: a misspelt one would silently time less.
        let unknown: Vec<&String> = filters
            .iter()
            .filter(|f| !labels.iter().any(|l| matches(l, f)))
            .collect();
        if filters.is_empty() || !unknown.is_empty() {
            let what = if filters.is_empty() {
                "names no encoding".to_string()
            } else {
                let names: Vec<String> = unknown.iter().map(|f| format!("`{f}`")).collect();
                format!("{} match no encoding", names.join(", "))
            };
            return Err(PipelineError::option(
                "--encodings",
                format!("{what}; labels: {}", labels.join(", ")),
            ));
        }
        options
            .encodings
            .retain(|e| filters.iter().any(|f| matches(&e.label, f)));
    }
    if !args.json {
        outln!(
            "runtime: {} threads, kernels {}; dense = f32 GEMM/GEMV of the decompressed weight (gemm crate, same pool); medians",
            rayon::current_num_threads(),
            hypercodec_runtime::simd_level()
        );
        outln!("| shape | batch | encoding | path | ours µs | dense µs | speedup | held MB | stored MB | GB/s | SNR dB |\n|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|");
    }
    let mut failed = None;
    let rows = bench::run(&options, |r| {
        if args.json || failed.is_some() {
            return;
        }
        let conv = r
            .conversion_snr_db
            .map_or(String::new(), |c| format!(" (conv {c:.1})"));
        let line = format!(
            "| {}x{} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}{conv} |",
            r.shape[0],
            r.shape[1],
            r.batch,
            r.encoding,
            r.path,
            r.ours_us,
            r.dense_us,
            r.speedup,
            r.held_bytes as f64 / 1e6,
            r.stored_bytes as f64 / 1e6,
            r.weight_gbps,
            r.snr_db
        );
        if let Err(e) = crate::sink::write_out(format_args!("{line}\n")) {
            failed = Some(e);
        }
    })?;
    if let Some(e) = failed {
        return Err(crate::stdout_error(e));
    }
    if args.json {
        return print_json("runtime rows", &rows);
    }
    Ok(())
}

/// `value` as pretty JSON on stdout.
fn print_json(what: &str, value: &impl serde::Serialize) -> Result<()> {
    let v = serde_json::to_value(value).map_err(|e| PipelineError::Json {
        what: what.into(),
        message: e.to_string(),
    })?;
    outln!("{v:#}");
    Ok(())
}

/// The most activation rows `run` and `benchmark --runtime` take a call: their buffers are
/// sized by it (2^64 - 1 overflowed an allocation; 2^32 asked for terabytes).
pub(crate) const MAX_BATCH: usize = 1 << 16;

/// A batch size from 1 to [`MAX_BATCH`] (clap's parser for `--batch` and `--batches`).
pub(crate) fn batch_size(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=MAX_BATCH).contains(&n) => Ok(n),
        Ok(_) => Err(format!("must be from 1 to {MAX_BATCH}")),
        Err(e) => Err(e.to_string()),
    }
}
