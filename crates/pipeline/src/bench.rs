//! The benchmark: every representation the build knows, measured on the same tensors in the
//! same run, beside the Gaussian bound and lossless peers (zstd of the f32 bytes, and Hyper
//! Glyph when its Python package is importable).

use crate::error::{PipelineError, Result};
use crate::plan::{Chooser, PlanOptions};
use crate::progress::{Cancel, Phase, Progress, Tracker};
use crate::safetensors_out::{write_safetensors, OutTensor};
use crate::source::TensorSource;
use crate::stats::{gaussian_bound_db, ErrorAcc};
use hypercodec_hwz::{
    self as hwz, AffineParams, Coding, EncodeOptions, Encoding, FloatDtype, Group, Lattice,
};
use hypercodec_plan::{allocate, Mode, Plan, Planner, Spec, Target};
use serde_json::{json, Value};
use std::time::Instant;

/// Which tensors of a source are measured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BenchOptions {
    /// Include 1-D tensors (biases, norms). By default, only tensors of rank ≥ 2.
    pub include_1d: bool,
    /// Only tensors whose name contains this. By default, every tensor.
    pub filter: Option<String>,
}

/// Indices of the tensors of `source` the benchmark measures.
pub fn select(source: &TensorSource, options: &BenchOptions) -> Result<Vec<usize>> {
    let chosen: Vec<usize> = (0..source.tensors.len())
        .filter(|&i| {
            let t = &source.tensors[i];
            // A tensor without values (a zero dimension) has nothing to measure.
            t.numel() > 0
                && (options.include_1d || t.shape.len() >= 2)
                && options
                    .filter
                    .as_ref()
                    .is_none_or(|f| t.name.contains(f.as_str()))
        })
        .collect();
    if chosen.is_empty() {
        return Err(PipelineError::NoTensors {
            message: "no tensor to benchmark (1-D tensors need --include-1d; tensors without values are left out)".into(),
        });
    }
    Ok(chosen)
}

/// One representation of the benchmark.
#[derive(Debug, Clone)]
pub enum Rep {
    /// The same recipe for every tensor.
    Spec(Spec),
    /// Low-rank with the rank that fits `bps` for each tensor's shape.
    LowRank(f64),
    /// Exactly what `compress --encoding auto` does (with `--target-bps` when given).
    Auto(Option<f64>),
}

impl Rep {
    /// The table's label.
    pub fn label(&self) -> String {
        match self {
            Rep::Spec(s) => s.label(),
            Rep::LowRank(b) => format!("lowrank-int8@{b}"),
            Rep::Auto(None) => "auto (Hyper Glyph rule, measured)".into(),
            Rep::Auto(Some(b)) => format!("auto @{b}bps"),
        }
    }

    /// Encodes one tensor.
    pub fn encode(&self, name: &str, values: &[f32], shape: &[u64]) -> Result<hwz::EncodedTensor> {
        let spec = match self {
            Rep::Spec(s) => s.clone(),
            Rep::LowRank(bps) => {
                let n = crate::numel(shape);
                let (rows, cols) = hwz::matrix_view(shape, n);
                let cols = cols.max(1);
                // rows + cols int8 codes and two f32 scales per rank.
                let rank = (bps * n as f64 / 8.0 / (rows + cols + 8) as f64)
                    .floor()
                    .max(1.0);
                if rank > 256.0 {
                    return Err(PipelineError::option(
                        "rank",
                        format!("rank {rank} for {rows}x{cols}; the benchmark stops at 256 (subspace iteration costs rows·cols·rank)"),
                    ));
                }
                Spec::fixed(Encoding::LowRank { rank: rank as u32 })
            }
            Rep::Auto(target) => {
                let chooser = Chooser::new(PlanOptions {
                    mode: Mode::Auto,
                    target: target.map(Target::Bps),
                    // The benchmark's rows count streams' own bytes: so does its choice.
                    container: hwz::Compression::None,
                    ..PlanOptions::default()
                })?;
                let (tp, enc) = chooser.plan_tensor(name, values, shape)?;
                return match enc {
                    Some(e) => Ok(e),
                    None => Ok(tp
                        .spec
                        .encode(name, values, shape, EncodeOptions::default())?),
                };
            }
        };
        Ok(spec.encode(name, values, shape, EncodeOptions::default())?)
    }
}

/// A codebook recipe: blocks of `block`, `k` prototypes, per-row scales, HDC search,
/// `residual_k` int8 corrections per block.
pub fn codebook(block: u32, k: u32, residual_k: f64) -> Spec {
    Spec::Codebook {
        template: hwz::codebook_template(
            block,
            k,
            hwz::ScaleMode::Channel,
            hwz::ResidualDtype::Int8,
        ),
        settings: hwz::CodebookSettings {
            residual_k: Some(residual_k),
            pick_layout: true,
            ..Default::default()
        },
    }
}

fn lattice(l: Lattice, coding: Coding) -> Encoding {
    let alpha = match coding {
        Coding::Fixed { bits } => {
            hypercodec_lattice::calibration::fixed_alpha(l, bits).map_or(1.0, |f| f.0)
        }
        _ => 1.0,
    };
    Encoding::Lattice {
        lattice: l,
        alpha,
        tile: 1,
        seed: 0,
        scale_dtype: FloatDtype::F16,
        coding,
    }
}

fn rate(template: Encoding, bps: Option<f64>) -> Rep {
    Rep::Spec(Spec::Rate {
        template,
        bps,
        max_tile: 4096,
    })
}

/// Every representation measured: raw floats; affine INT1..INT8 per row and in groups of 128
/// (asymmetric), and in groups of 128 symmetric; each lattice with rANS at 2, 3, 4 and 5 bits
/// per value; E8 with Rice at 3 and 4, with GPU-shaped rANS and prefix codes at 2, 3 and 4;
/// E8 fixed-rate at 2..5 bits; the trellis (L = 12) at 2..4
/// bits; codebooks; low-rank; AUTO.
pub fn representations() -> Vec<Rep> {
    let mut v: Vec<Rep> = FloatDtype::ALL
        .iter()
        .map(|&dtype| Rep::Spec(Spec::fixed(Encoding::Raw { dtype })))
        .collect();
    for (group, symmetric) in [
        (Group::Row, false),
        (Group::Size(128), false),
        (Group::Size(128), true),
    ] {
        for bits in (1..=8).rev() {
            v.push(Rep::Spec(Spec::fixed(Encoding::affine(AffineParams {
                bits,
                group,
                symmetric,
                scale_dtype: FloatDtype::F16,
            }))));
        }
    }
    for l in [Lattice::E8, Lattice::D4, Lattice::A2, Lattice::Z1] {
        for bps in [5.0, 4.0, 3.0, 2.0] {
            v.push(rate(lattice(l, Coding::RANS_DEFAULT), Some(bps)));
        }
    }
    for bps in [4.0, 3.0] {
        v.push(rate(lattice(Lattice::E8, Coding::RICE_DEFAULT), Some(bps)));
    }
    // The GPU-shaped entropy codings of E8: rANS in chunks of whole rows, and prefix codes in
    // chunks of eight rows or more (what a warp decodes inside the GEMV; 8-bit singles, 12-bit
    // pairs).
    for coding in [Coding::RANS_GPU, Coding::PREFIX_GPU] {
        for bps in [4.0, 3.0, 2.0] {
            v.push(rate(lattice(Lattice::E8, coding), Some(bps)));
        }
    }
    for bits in (2..=5).rev() {
        v.push(rate(lattice(Lattice::E8, Coding::Fixed { bits }), None));
    }
    // The trellis at L = 12 (16× less encoding work than the default L = 16, about 0.3 dB
    // lower; `compress --encoding trellis` measures L = 16).
    for k in (2..=4).rev() {
        v.push(rate(Encoding::trellis(12, k, 1, 0), None));
    }
    // Codebook family: 1, 2 and 4 bits of index per value, and 2 with residual repair.
    for (block, k, res) in [(8, 256, 0.0), (4, 256, 0.0), (4, 256, 0.125), (2, 256, 0.0)] {
        v.push(Rep::Spec(codebook(block, k, res)));
    }
    for bps in [4.0, 2.0] {
        v.push(Rep::LowRank(bps));
    }
    v.push(Rep::Auto(None));
    v.push(Rep::Auto(Some(3.2)));
    v
}

/// One row of the table: a representation's totals over the measured tensors.
#[derive(Debug, Default, Clone)]
pub struct BenchRow {
    /// The representation.
    pub label: String,
    /// Stored bytes.
    pub bytes: u64,
    /// Error sums.
    pub acc: ErrorAcc,
    /// Seconds encoding.
    pub encode_s: f64,
    /// Seconds decoding (0: not measured).
    pub decode_s: f64,
    /// Why it could not encode some tensor (such a row is not in the totals).
    pub failed: Option<String>,
    /// Tensors a lattice rate could not serve, stored with `compress`'s fallback instead.
    pub fallbacks: usize,
    /// Only bytes, MSE and SNR are known (a peer measured out of process).
    pub summary_only: bool,
}

impl BenchRow {
    /// The row as JSON, over `n` values.
    pub fn to_json(&self, n: u64) -> Value {
        let bps = self.bytes as f64 * 8.0 / n.max(1) as f64;
        let snr = self.acc.snr_db();
        let bound = gaussian_bound_db(bps);
        let fin = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
        let known = |x: f64| {
            if self.summary_only {
                Value::Null
            } else {
                json!(x)
            }
        };
        json!({
            "representation": if self.fallbacks > 0 {
                format!("{} ({} tensors fell back)", self.label, self.fallbacks)
            } else {
                self.label.clone()
            },
            "bytes": self.bytes, "bps": bps, "fallbacks": self.fallbacks,
            "ratio_vs_f32": n as f64 * 4.0 / self.bytes.max(1) as f64,
            "mse": self.acc.mse(), "snr_db": fin(snr), "bound_db": bound, "gap_db": fin(bound - snr),
            "cosine": known(self.acc.cosine()), "max_abs_err": known(self.acc.max_abs),
            "encode_mvals_per_s": n as f64 / self.encode_s.max(1e-9) / 1e6,
            "decode_mvals_per_s": if self.decode_s > 0.0 { json!(n as f64 / self.decode_s / 1e6) } else { Value::Null },
        })
    }
}

/// Measures every representation of `reps` on the `chosen` tensors of `source`, then the
/// lossless peer zstd-3 of the f32 bytes (the last row).
pub fn measure(
    source: &TensorSource,
    chosen: &[usize],
    reps: &[Rep],
    progress: &mut dyn FnMut(Progress<'_>),
    cancel: &Cancel,
) -> Result<Vec<BenchRow>> {
    let mut rows: Vec<BenchRow> = reps
        .iter()
        .map(|e| BenchRow {
            label: e.label(),
            ..BenchRow::default()
        })
        .collect();
    let mut peer = BenchRow {
        label: "zstd-3(f32), lossless peer".into(),
        ..BenchRow::default()
    };
    let total: u64 = chosen.iter().map(|&i| source.tensors[i].numel()).sum();
    let mut bar = Tracker::new(Phase::Benchmark, total * (reps.len() as u64 + 1), progress);
    let mut out = Vec::new();
    for &i in chosen {
        let t = &source.tensors[i];
        let values = source.read(i)?;
        out.resize(values.len(), 0.0);
        for (rep, row) in reps.iter().zip(rows.iter_mut()) {
            cancel.check()?;
            let start = Instant::now();
            // A lattice rate gets the rule `compress` applies: a tensor the lattice cannot serve
            // at it (see `rate::lattice_serves`), or whose rate control finds no scale, takes
            // the same fallback, counted in the row.
            let rate = match rep {
                Rep::Spec(Spec::Rate {
                    template,
                    max_tile,
                    bps: Some(b),
                }) => Some((template, *max_tile, *b)),
                _ => None,
            };
            let fallback = |row: &mut BenchRow, b: f64| {
                row.fallbacks += 1;
                let e = crate::rate::fallback_encoding(b, &t.shape);
                hwz::encode(&t.name, &values, &t.shape, &e, EncodeOptions::default())
            };
            // Prefix codes that do not serve the tensor: their rANS rung, counted in the row.
            let rung;
            let rep = match rate {
                Some((template, max_tile, b)) => {
                    match crate::rate::serving_template(&t.name, &t.shape, template, max_tile, b) {
                        Some(e) if &e != template => {
                            row.fallbacks += 1;
                            rung = Rep::Spec(Spec::Rate {
                                template: e,
                                max_tile,
                                bps: Some(b),
                            });
                            Some(&rung)
                        }
                        Some(_) => Some(rep),
                        None => None,
                    }
                }
                None => Some(rep),
            };
            let encoded = match rep {
                None => fallback(row, rate.expect("a rate").2)?,
                Some(rep) => match (rep.encode(&t.name, &values, &t.shape), rate) {
                    (Ok(e), _) => e,
                    (
                        Err(PipelineError::Plan(hypercodec_plan::PlanError::Hwz(
                            hwz::HwzError::RateUnreachable { .. },
                        ))),
                        Some((_, _, b)),
                    ) => fallback(row, b)?,
                    (Err(e), _) => {
                        row.failed.get_or_insert(e.to_string());
                        bar.step(&t.name, t.numel());
                        continue;
                    }
                },
            };
            row.encode_s += start.elapsed().as_secs_f64();
            let refs: Vec<(&str, &[u8])> = encoded
                .streams
                .iter()
                .map(|(r, b)| (*r, b.as_slice()))
                .collect();
            let start = Instant::now();
            hwz::decode_into(&t.name, &encoded.encoding, &t.shape, &refs, &mut out)?;
            row.decode_s += start.elapsed().as_secs_f64();
            row.bytes += encoded.payload_bytes();
            row.acc.add(&values, &out);
            bar.step(&t.name, t.numel());
        }
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let start = Instant::now();
        let z = hwz::zstd_codec::compress(&raw);
        peer.encode_s += start.elapsed().as_secs_f64();
        peer.bytes += z.len().min(raw.len()) as u64;
        peer.acc.add(&values, &values);
        bar.step(&t.name, t.numel());
    }
    rows.push(peer);
    Ok(rows)
}

/// What became of the peer Hyper Glyph.
#[derive(Debug, Clone)]
pub enum PeerOutcome {
    /// The Python named cannot import `hyperglyph`.
    NotInstalled {
        /// The Python tried.
        python: String,
    },
    /// The peer ran and failed.
    Failed {
        /// Its standard error.
        stderr: String,
    },
    /// The peer's row.
    Ran {
        /// The row (bytes, MSE, SNR).
        row: BenchRow,
        /// Its peak memory.
        peak_rss_bytes: f64,
    },
}

/// The peer Hyper Glyph (hyperglyph-codec 0.7.0, default configuration) on the same tensors,
/// when the Python named by `$HYPERCODEC_PYTHON` (default `python3`) can import it. Bytes are
/// its archive file's; cosine and max error are not reported by the script.
pub fn hyperglyph_peer(source: &TensorSource, chosen: &[usize]) -> Result<PeerOutcome> {
    let python = std::env::var("HYPERCODEC_PYTHON").unwrap_or_else(|_| "python3".into());
    let importable = std::process::Command::new(&python)
        .args(["-c", "import hyperglyph.compact_codec"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !importable {
        return Ok(PeerOutcome::NotInstalled { python });
    }
    let dir = tempfile::tempdir().map_err(PipelineError::io(std::env::temp_dir()))?;
    let st = dir.path().join("peer.safetensors");
    let tensors: Vec<OutTensor> = chosen
        .iter()
        .map(|&i| OutTensor {
            name: source.tensors[i].name.clone(),
            shape: source.tensors[i].shape.clone(),
            dtype: FloatDtype::F32,
        })
        .collect();
    write_safetensors(&st, &tensors, None, |k, out| {
        let v = source.read(chosen[k])?;
        out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        Ok(())
    })?;
    let script = dir.path().join("hyperglyph_peer.py");
    std::fs::write(&script, include_str!("../../../scripts/hyperglyph_peer.py"))
        .map_err(PipelineError::io(&script))?;
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg(&st)
        .output()
        .map_err(PipelineError::io(&python))?;
    if !out.status.success() {
        return Ok(PeerOutcome::Failed {
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| PipelineError::Json {
        what: "peer output".into(),
        message: e.to_string(),
    })?;
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    Ok(PeerOutcome::Ran {
        row: BenchRow {
            label: "hyperglyph-codec 0.7.0 default (peer, file bytes)".into(),
            bytes: f("bytes") as u64,
            acc: ErrorAcc {
                n: f("elements") as u64,
                signal: f("energy"),
                noise: f("sse"),
                ..ErrorAcc::default()
            },
            encode_s: f("seconds"),
            decode_s: 0.0,
            failed: None,
            fallbacks: 0,
            summary_only: true,
        },
        peak_rss_bytes: f("peak_rss_bytes"),
    })
}

/// The table as Markdown.
pub fn markdown(rows: &[Value]) -> String {
    let mut s = String::from(
        "| representation | bytes | bps | ratio vs f32 | MSE | SNR dB | bound dB | gap dB | cosine | max abs err | encode Mval/s | decode Mval/s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let f = |v: &Value, p: usize| {
        v.as_f64()
            .map_or("exact".to_string(), |x| format!("{x:.p$}"))
    };
    let dash = |v: &Value, fmt: fn(f64) -> String| v.as_f64().map_or("-".to_string(), fmt);
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {} | {:.3e} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["representation"].as_str().unwrap_or(""),
            r["bytes"],
            f(&r["bps"], 3),
            f(&r["ratio_vs_f32"], 2),
            r["mse"].as_f64().unwrap_or(0.0),
            f(&r["snr_db"], 2),
            f(&r["bound_db"], 2),
            dash(&r["gap_db"], |x| format!("{x:.2}")),
            f(&r["cosine"], 6).replace("exact", "-"),
            dash(&r["max_abs_err"], |x| format!("{x:.3e}")),
            f(&r["encode_mvals_per_s"], 0),
            dash(&r["decode_mvals_per_s"], |x| format!("{x:.0}")),
        );
    }
    s
}

/// One line of the budget table.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetRow {
    /// What was allocated.
    pub what: String,
    /// Total bytes.
    pub bytes: u64,
    /// Bits per value.
    pub bps: f64,
    /// Total squared error.
    pub sse: f64,
    /// SNR over the measured tensors.
    pub snr_db: f64,
    /// Share of the uniform choice's SSE saved (BUDGET rows).
    pub saved_vs_uniform: Option<f64>,
}

/// BUDGET against uniform encodings at equal total bytes.
#[derive(Debug, Clone)]
pub struct BudgetTable {
    /// Candidates measured per tensor.
    pub candidates: usize,
    /// Seconds measuring.
    pub measure_s: f64,
    /// Values measured.
    pub elements: u64,
    /// Pairs of rows: a uniform choice, then BUDGET at its bytes.
    pub rows: Vec<BudgetRow>,
    /// Uniform choices left out of the table, with why (e.g. a rate that a small tensor's
    /// side information alone exceeds, so the candidate could not encode every tensor).
    pub left_out: Vec<(String, String)>,
}

/// The planner's BUDGET at each of `budget_at` average bps against uniform E8 at the same bps
/// and uniform INT4 g128, at equal total bytes.
pub fn budget_table(
    source: &TensorSource,
    chosen: &[usize],
    budget_at: &[f64],
    progress: &mut dyn FnMut(Progress<'_>),
    cancel: &Cancel,
) -> Result<BudgetTable> {
    let mut names: Vec<String> = hypercodec_plan::BUDGET_CANDIDATES
        .iter()
        .map(|s| s.to_string())
        .collect();
    for b in budget_at {
        let n = format!("e8@{b}");
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let mut planner = Planner::new(Mode::Budget);
    planner.candidates = names
        .iter()
        .map(|n| Spec::parse(n))
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    let total: u64 = chosen.iter().map(|&i| source.tensors[i].numel()).sum();
    let mut bar = Tracker::new(Phase::Measure, total, progress);
    let mut plan = Plan {
        version: 1,
        mode: Mode::Budget,
        thresholds: planner.thresholds,
        target: None,
        block_rows: planner.block_rows,
        tensors: Vec::new(),
    };
    let mut energy = 0f64;
    for &i in chosen {
        cancel.check()?;
        let t = &source.tensors[i];
        let values = source.read(i)?;
        energy += values.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
        plan.tensors
            .push(planner.plan_tensor(&t.name, &values, &t.shape)?.0);
        bar.step(&t.name, t.numel());
    }
    let measure_s = started.elapsed().as_secs_f64();
    // Uniform choice of one candidate label for every tensor: (bytes, SSE), or the first
    // tensor it could not encode.
    let uniform = |label_start: &str| -> Result<(u64, f64), String> {
        plan.tensors.iter().try_fold((0, 0.0), |(b, d), t| {
            let c = t
                .candidates
                .iter()
                .find(|c| c.label.starts_with(label_start));
            c.map(|c| (b + c.bytes, d + c.sse))
                .ok_or_else(|| format!("it could not encode tensor `{}`", t.name))
        })
    };
    let line = |what: String, bytes: u64, sse: f64, vs: Option<f64>| BudgetRow {
        what,
        bytes,
        bps: bytes as f64 * 8.0 / total as f64,
        sse,
        snr_db: 10.0 * (energy / sse.max(1e-300)).log10(),
        saved_vs_uniform: vs.map(|u| 1.0 - sse / u),
    };
    let budget = |target_bytes: u64| -> Result<(u64, f64)> {
        let mut p = plan.clone();
        let used = allocate(&mut p, Target::Bytes(target_bytes), &Default::default())?;
        let sse = p
            .tensors
            .iter()
            .map(|t| {
                t.candidates
                    .iter()
                    .find(|c| c.label == t.label)
                    .map_or(0.0, |c| c.sse)
            })
            .sum();
        Ok((used, sse))
    };
    let mut rows = Vec::new();
    let mut refs: Vec<(String, String)> = budget_at
        .iter()
        .map(|b| (format!("lattice-e8-rans@{b}"), format!("E8 + rANS @{b}")))
        .collect();
    refs.push(("affine-int4-g128-asym".into(), "INT4 g128 asym".into()));
    let mut left_out = Vec::new();
    for (label, name) in refs {
        let (bytes, sse) = match uniform(&label) {
            Ok(u) => u,
            Err(why) => {
                left_out.push((format!("uniform {name}"), why));
                continue;
            }
        };
        rows.push(line(format!("uniform {name}"), bytes, sse, None));
        let (used, bsse) = budget(bytes)?;
        rows.push(line(
            format!("BUDGET at the same bytes (vs {name})"),
            used,
            bsse,
            Some(sse),
        ));
    }
    Ok(BudgetTable {
        candidates: names.len(),
        measure_s,
        elements: total,
        rows,
        left_out,
    })
}
