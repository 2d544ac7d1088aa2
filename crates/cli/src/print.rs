//! What the commands print: compress and plan summaries, the inspect table, the benchmark.

use crate::sink::{errln, out, outln};
use crate::{cancel_flag, with_bar};
use clap::Args;
use hypercodec_pipeline::bench::{self, BenchOptions, PeerOutcome};
use hypercodec_pipeline::{FileReport, PipelineError, Result, TensorSource};
use hypercodec_plan::Plan;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn finite(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// The line (or JSON) `compress` prints. Quality is over the lossy tensors only (an exactly
/// stored norm never inflates it): their SNR, the min and median per tensor, their bits per
/// value; the file's bits per value are over every value, all-in.
pub fn compress_summary(output: &Path, r: &FileReport, as_json: bool) -> Result<()> {
    let rep = &r.report;
    // As the archive stores them (after container zstd): the figures `inspect` shows.
    let (snr, min, median, lossy_bps, lossy_n, lossy_tensors) = match &r.lossy {
        Some(l) => (
            l.snr_db,
            Some(l.min_snr_db),
            Some(l.median_snr_db),
            l.bps,
            l.elements,
            l.tensors,
        ),
        None => (f64::INFINITY, None, None, 0.0, 0, 0),
    };
    // No rate for an archive of no values (its manifest over "one" value read 3688 bits).
    let all_in = (rep.elements > 0).then(|| r.file_bytes as f64 * 8.0 / rep.elements as f64);
    if as_json {
        let summary = json!({
            "output": output, "tensors": rep.tensors, "skipped": rep.skipped,
            "elements": rep.elements, "payload_bytes": r.payload_bytes,
            "file_bytes": r.file_bytes, "bps": r.bps(), "bps_file": all_in,
            "lossy_tensors": lossy_tensors, "lossy_elements": lossy_n, "lossy_bps": lossy_bps,
            "lossy_without_snr": r.lossy_without_snr,
            "snr_db": finite(snr), "min_snr_db": min.map(finite), "median_snr_db": median.map(finite),
            "fallbacks": rep.fallbacks.iter().map(|(t, e)| json!({"tensor": t, "encoding": e})).collect::<Vec<_>>(),
            "seconds": r.seconds,
        });
        outln!("{summary:#}");
        return Ok(());
    }
    let mut quality = match (min, median) {
        (Some(lo), Some(med)) => format!(
            "{lossy_tensors} lossy tensors ({lossy_n} values): {lossy_bps:.3} bits/value stored, SNR {snr:.2} dB (per tensor min {lo:.2}, median {med:.2})"
        ),
        _ if r.lossy_without_snr > 0 => String::new(),
        _ => "every tensor exact".to_string(),
    };
    if r.lossy_without_snr > 0 {
        // (Their SNR is NaN or their error infinite: not exact, and not in the figures above.)
        let sep = if quality.is_empty() { "" } else { "; " };
        quality += &format!(
            "{sep}{} lossy tensors without a finite SNR (non-finite values)",
            r.lossy_without_snr
        );
    }
    let rate = all_in.map_or(String::new(), |b| format!(", {b:.3} bits/value all-in"));
    outln!(
        "wrote {} ({} tensors, {} values, {} bytes{rate}); {quality}; {:.1} s",
        output.display(),
        rep.tensors,
        rep.elements,
        r.file_bytes,
        r.seconds
    );
    if !rep.fallbacks.is_empty() {
        outln!(
            "{} tensors fell back to another encoding (each with its reason): {}",
            rep.fallbacks.len(),
            rep.fallbacks
                .iter()
                .take(4)
                .map(|(t, e)| format!("{t} → {e}"))
                .chain((rep.fallbacks.len() > 4).then(|| format!(
                    "and {} more (compress --json lists them)",
                    rep.fallbacks.len() - 4
                )))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// `plan`: a line on stderr, the Plan as JSON on stdout.
pub fn plan(plan: &Plan, seconds: f64) -> Result<()> {
    let elements = plan.total_elements();
    errln!(
        "planned {} tensors ({} values) in {:.1} s: {} bytes, {:.3} bits/value",
        plan.tensors.len(),
        elements,
        seconds,
        plan.total_bytes(),
        plan.total_bytes() as f64 * 8.0 / elements.max(1) as f64
    );
    let text = serde_json::to_string_pretty(plan).map_err(|e| PipelineError::Json {
        what: "plan".into(),
        message: e.to_string(),
    })?;
    outln!("{text}");
    Ok(())
}

/// `4096x4096` from a JSON shape.
fn shape_text(shape: &Value) -> String {
    let dims = shape.as_array().map(|s| s.iter().map(|d| d.to_string()));
    dims.map(|d| d.collect::<Vec<_>>().join("x"))
        .unwrap_or_default()
}

/// `inspect`: the summary as JSON, or as a table.
pub fn inspect(input: &Path, as_json: bool) -> Result<()> {
    let v = hypercodec_pipeline::inspect_file(input)?;
    if as_json {
        outln!("{v:#}");
        return Ok(());
    }
    let rows = v["tensors"].as_array().cloned().unwrap_or_default();
    let num = |x: &Value| x.as_f64().unwrap_or(0.0);
    // An archive of no values has no rate: its figures read "–".
    let opt = |x: &Value, digits: usize| -> String {
        x.as_f64().map_or("–".into(), |x| format!("{x:.digits$}"))
    };
    let s = |x: &Value| x.as_str().unwrap_or("").to_string();
    if v["format"].is_string() {
        let version = v["format_version"].as_str().unwrap_or("?");
        outln!(
            "{} — legacy Hyper Glyph archive (zip, format {version}), read-only",
            input.display()
        );
        outln!(
            "{:<48} {:<16} {:<24} {:>7} {:>12}",
            "tensor",
            "shape",
            "codec",
            "bps*",
            "bytes*"
        );
        for r in &rows {
            outln!(
                "{:<48} {:<16} {:<24} {:>7.3} {:>12}",
                s(&r["name"]),
                shape_text(&r["shape"]),
                s(&r["codec"]),
                num(&r["bps"]),
                r["payload_bytes"]
            );
        }
        outln!(
            "{} tensors, {} values, file {} B ({} bps all-in); * = stream bytes before zstd; metadata skipped_tensors: {}",
            rows.len(), v["elements"], v["file_bytes"], opt(&v["bps_file"], 3), v["skipped_tensors"]
        );
        return Ok(());
    }
    outln!(
        "{} — hwz v{}, written by {}",
        input.display(),
        v["version"],
        s(&v["generator"])
    );
    if v["plan"].is_object() {
        outln!(
            "plan: mode {}, {} tensors planned (inspect --json shows every candidate's measurement)",
            v["plan"]["mode"].as_str().unwrap_or("?"),
            v["plan"]["tensors"].as_array().map_or(0, Vec::len)
        );
    }
    outln!(
        "{:<48} {:<16} {:<32} {:>7} {:>12} {:>9}  streams",
        "tensor",
        "shape",
        "encoding",
        "bps",
        "bytes",
        "SNR dB"
    );
    for r in &rows {
        let stats: Option<hypercodec_hwz::TensorStats> =
            serde_json::from_value(r["stats"].clone()).ok();
        let snr = match r["stats"]["snr_db"].as_f64() {
            Some(v) => format!("{v:.2}"),
            // (A NaN SNR or an infinite error: stored values differ, by no finite measure.)
            None if hypercodec_pipeline::lossy_without_snr(stats.as_ref()) => "lossy".to_string(),
            None => "exact".to_string(),
        };
        let streams = r["streams"].as_object().map(|o| {
            let parts: Vec<String> = o
                .iter()
                .map(|(k, v)| format!("{k}={}", v["stored"]))
                .collect();
            parts.join(" ")
        });
        outln!(
            "{:<48} {:<16} {:<32} {:>7.3} {:>12} {:>9}  {}",
            s(&r["name"]),
            shape_text(&r["shape"]),
            s(&r["label"]),
            num(&r["bps"]),
            r["stored_bytes"],
            snr,
            streams.unwrap_or_default()
        );
    }
    let t = &v["totals"];
    outln!(
        "{} tensors, {} values; payload {} B ({} bps), manifest {} B, file {} B ({} bps all-in, {}x vs f32)",
        t["tensors"], t["elements"], t["payload_bytes"], opt(&t["bps_payload"], 3), t["manifest_bytes"],
        t["file_bytes"], opt(&t["bps_file"], 3), opt(&t["ratio_vs_f32"], 2)
    );
    if let Some(skipped) = v["skipped_tensors"].as_array().filter(|s| !s.is_empty()) {
        let names: Vec<String> = skipped
            .iter()
            .map(|s| {
                format!(
                    "{} ({})",
                    s["name"].as_str().unwrap_or("?"),
                    s["dtype"].as_str().unwrap_or("?")
                )
            })
            .collect();
        outln!(
            "not stored: {} source tensors of types compress does not read (decompress does not restore them): {}",
            names.len(),
            names.join(", ")
        );
    }
    let l = &t["lossy"];
    if l.is_object() {
        outln!(
            "lossy: {} tensors, {} values at {:.3} bps, SNR {:.2} dB (per tensor min {:.2}, median {:.2}); exactly stored tensors are not in these figures",
            l["tensors"], l["elements"], num(&l["bps"]), num(&l["snr_db"]), num(&l["min_snr_db"]), num(&l["median_snr_db"])
        );
    }
    Ok(())
}

/// Arguments of `benchmark`.
#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Input: .safetensors, .gguf, a sharded model (`*.safetensors.index.json`, its folder, or
    /// any part of a split `NAME-0000K-of-0000N.gguf`), or `gaussian:ROWSxCOLS[:SEED]`.
    /// (Not with `--runtime`, which measures seeded weights of `--shapes` instead.)
    #[arg(required_unless_present = "runtime", conflicts_with = "runtime")]
    pub input: Option<String>,
    /// Instead of the representation table: the compressed linear operator of each encoding
    /// against a dense f32 GEMV/GEMM of the decompressed weight (same GEMM library, same run),
    /// on seeded Gaussian weights of `--shapes` at `--batches`.
    #[arg(long)]
    pub runtime: bool,
    /// `--runtime`: weight shapes ROWSxCOLS, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "4096x4096,11008x4096,4096x11008,576x1536"
    )]
    pub shapes: Vec<String>,
    /// `--runtime`: batch sizes (1 to 65536), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64", value_parser = crate::exec::batch_size)]
    pub batches: Vec<usize>,
    /// `--runtime`: only encodings whose label contains one of these (a filter matching none
    /// lists the labels).
    #[arg(long, value_delimiter = ',')]
    pub encodings: Vec<String>,
    /// Also write the table as Markdown to this file.
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Include 1-D tensors (biases, norms); by default only tensors of rank >= 2 are measured.
    #[arg(long)]
    pub include_1d: bool,
    /// Only tensors whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
    /// Do not run the peer Hyper Glyph even when `$HYPERCODEC_PYTHON` (default `python3`)
    /// can import it.
    #[arg(long)]
    pub no_peer: bool,
    /// Instead of the representation table: the planner's BUDGET at each of these average
    /// bps (comma separated) against uniform E8 at the same bps and uniform INT4 g128, at
    /// equal total bytes.
    #[arg(long, value_delimiter = ',')]
    pub budget_at: Vec<f64>,
}

impl BenchArgs {
    /// Default arguments for an input.
    pub fn for_input(input: String) -> Self {
        BenchArgs {
            input: Some(input),
            runtime: false,
            shapes: Vec::new(),
            batches: Vec::new(),
            encodings: Vec::new(),
            markdown: None,
            json: false,
            include_1d: false,
            filter: None,
            no_peer: true,
            budget_at: Vec::new(),
        }
    }
}

/// `benchmark`: measures, then prints the table (or the budget table).
pub fn benchmark(args: &BenchArgs) -> Result<()> {
    if args.runtime {
        return crate::exec::runtime_benchmark(args);
    }
    let input = args.input.as_deref().unwrap_or_default();
    let source = TensorSource::open(input)?;
    if let Some(md) = &args.markdown {
        // Refused before the measuring, not after it: the table's path, and its folder.
        hypercodec_pipeline::check_output(md, source.files())?;
        let folder = md.parent().filter(|f| !f.as_os_str().is_empty());
        if folder.is_some_and(|f| !f.is_dir()) {
            return Err(PipelineError::io(md)(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no folder to write the table in",
            )));
        }
    }
    let options = BenchOptions {
        include_1d: args.include_1d,
        filter: args.filter.clone(),
    };
    let chosen = bench::select(&source, &options)?;
    let total: u64 = chosen.iter().map(|&i| source.tensors[i].numel()).sum();
    if !args.budget_at.is_empty() {
        return budget_table(args, input, &source, &chosen);
    }
    let reps = bench::representations();
    let mut rows =
        with_bar(|progress| bench::measure(&source, &chosen, &reps, progress, &cancel_flag()))?;
    if !args.no_peer {
        match bench::hyperglyph_peer(&source, &chosen)? {
            PeerOutcome::NotInstalled { python } => errln!(
                "peer Hyper Glyph not run: `{python}` cannot import hyperglyph (set HYPERCODEC_PYTHON)"
            ),
            PeerOutcome::Failed { stderr } => errln!("peer Hyper Glyph failed: {stderr}"),
            PeerOutcome::Ran {
                row,
                peak_rss_bytes,
            } => {
                errln!(
                    "peer Hyper Glyph: {:.1} s, peak RSS {:.0} MB",
                    row.encode_s,
                    peak_rss_bytes / 1e6
                );
                rows.push(row);
            }
        }
    }
    // A representation that cannot encode every tensor (a rank above a dimension, a codebook
    // below the 1/8-bit floor) is left out of the totals and named here.
    for r in rows.iter().filter(|r| r.failed.is_some()) {
        let why = r.failed.as_deref().unwrap_or("");
        errln!("not in the table: {} ({why})", r.label);
    }
    rows.retain(|r| r.failed.is_none());
    let table: Vec<Value> = rows.iter().map(|r| r.to_json(total)).collect();
    let n = chosen.len();
    if args.json {
        let out = json!({"input": input, "tensors": n, "elements": total, "rows": table});
        outln!("{out:#}");
    } else {
        outln!(
            "{input} — {n} tensors, {total} values; bound = 6.02·bps dB (i.i.d. Gaussian), gap = bound − SNR"
        );
        out!("{}", bench::markdown(&table));
    }
    if let Some(path) = &args.markdown {
        let text = format!(
            "# hypercodec benchmark: {input}\n\n{n} tensors, {total} values.\n\n{}",
            bench::markdown(&table)
        );
        hypercodec_pipeline::write_text(path, &text, source.files())?;
    }
    Ok(())
}

fn budget_table(
    args: &BenchArgs,
    input: &str,
    source: &TensorSource,
    chosen: &[usize],
) -> Result<()> {
    let t = with_bar(|progress| {
        bench::budget_table(source, chosen, &args.budget_at, progress, &cancel_flag())
    })?;
    outln!(
        "{} — {} tensors, {} values; {} candidates per tensor measured in {:.1} s; distortion = total SSE",
        input,
        chosen.len(),
        t.elements,
        t.candidates,
        t.measure_s
    );
    outln!("| allocation | bytes | bps | total SSE | SNR dB | SSE saved vs uniform |\n|---|---:|---:|---:|---:|---:|");
    for (what, why) in &t.left_out {
        errln!("not in the table: {what} ({why})");
    }
    for r in &t.rows {
        let saved = r
            .saved_vs_uniform
            .map_or(String::new(), |s| format!("{:.1} %", 100.0 * s));
        outln!(
            "| {} | {} | {:.3} | {:.4e} | {:.2} | {saved} |",
            r.what,
            r.bytes,
            r.bps,
            r.sse,
            r.snr_db
        );
    }
    Ok(())
}
