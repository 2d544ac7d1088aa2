//! `hypercodec benchmark`: every representation the build knows, measured on the same tensors
//! in the same run, beside the Gaussian bound and a lossless peer (zstd of the f32 bytes).

use crate::error::{CliError, Result};
use crate::input::Input;
use crate::stats::{gaussian_bound_db, ErrorAcc};
use clap::Args;
use hypercodec_hwz::{
    self as hwz, AffineParams, Coding, EncodeOptions, Encoding, FloatDtype, Group, Lattice,
};
use hypercodec_plan::Spec;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `benchmark`.
#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Input: .safetensors, .gguf, or `gaussian:ROWSxCOLS[:SEED]`.
    pub input: String,
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
            input,
            markdown: None,
            json: false,
            include_1d: false,
            filter: None,
            no_peer: true,
            budget_at: Vec::new(),
        }
    }
}

/// One representation of the benchmark.
#[derive(Clone)]
pub enum Rep {
    /// The same recipe for every tensor.
    Spec(Spec),
    /// Low-rank with the rank that fits `bps` for each tensor's shape.
    LowRank(f64),
    /// The planner's AUTO rule per tensor, with an optional target rate.
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
    fn encode(&self, name: &str, values: &[f32], shape: &[u64]) -> Result<hwz::EncodedTensor> {
        let spec = match self {
            Rep::Spec(s) => s.clone(),
            Rep::LowRank(bps) => {
                let n: u64 = shape.iter().product();
                let cols = shape.last().copied().unwrap_or(1).max(1);
                let rows = n / cols;
                // rows + cols int8 codes and two f32 scales per rank.
                let rank = (bps * n as f64 / 8.0 / (rows + cols + 8) as f64)
                    .floor()
                    .max(1.0);
                if rank > 256.0 {
                    return Err(CliError::Input(format!(
                        "rank {rank} for {rows}x{cols}; the benchmark stops at 256 (subspace iteration costs rows·cols·rank)"
                    )));
                }
                Spec::fixed(Encoding::LowRank { rank: rank as u32 })
            }
            Rep::Auto(target) => {
                let mut p = hypercodec_plan::Planner::new(hypercodec_plan::Mode::Auto);
                let mut names = hypercodec_plan::AUTO_CANDIDATES.to_vec();
                let t = target.map(|b| format!("e8@{b}"));
                if let Some(t) = &t {
                    names.push(t);
                }
                p.candidates = names
                    .iter()
                    .map(|n| Spec::parse(n))
                    .chain(std::iter::once(Ok(codebook(4, 256, 0.0))))
                    .collect::<Result<_, _>>()?;
                p.target = target.map(hypercodec_plan::Target::Bps);
                let (tp, enc) = p.plan_tensor(name, values, shape)?;
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

/// Every representation measured: raw floats; affine INT1..INT8 per row and in groups of 128
/// (asymmetric), and in groups of 128 symmetric; each lattice with rANS at 2, 3, 4 and 5 bits
/// per value; E8 with Rice at 3 and 4; E8 fixed-rate at 2..5 bits.
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
    let rans = Coding::Rans {
        chunk: 1 << 18,
        lanes: 32,
        prob_bits: 14,
    };
    for l in [Lattice::E8, Lattice::D4, Lattice::A2, Lattice::Z1] {
        for bps in [5.0, 4.0, 3.0, 2.0] {
            v.push(rate(lattice(l, rans), Some(bps)));
        }
    }
    for bps in [4.0, 3.0] {
        v.push(rate(
            lattice(Lattice::E8, Coding::Rice { chunk: 2048 }),
            Some(bps),
        ));
    }
    for bits in (2..=5).rev() {
        v.push(rate(lattice(Lattice::E8, Coding::Fixed { bits }), None));
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

fn rate(template: Encoding, bps: Option<f64>) -> Rep {
    Rep::Spec(Spec::Rate {
        template,
        bps,
        max_tile: 4096,
    })
}

#[derive(Default, Clone)]
struct Row {
    label: String,
    bytes: u64,
    acc: ErrorAcc,
    encode_s: f64,
    decode_s: f64,
    failed: Option<String>,
    /// Only bytes, MSE and SNR are known (a peer measured out of process).
    summary_only: bool,
}

impl Row {
    fn to_json(&self, n: u64) -> Value {
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
            "representation": self.label, "bytes": self.bytes, "bps": bps,
            "ratio_vs_f32": n as f64 * 4.0 / self.bytes.max(1) as f64,
            "mse": self.acc.mse(), "snr_db": fin(snr), "bound_db": bound, "gap_db": fin(bound - snr),
            "cosine": known(self.acc.cosine()), "max_abs_err": known(self.acc.max_abs),
            "encode_mvals_per_s": n as f64 / self.encode_s.max(1e-9) / 1e6,
            "decode_mvals_per_s": if self.decode_s > 0.0 { json!(n as f64 / self.decode_s / 1e6) } else { Value::Null },
        })
    }
}

/// Runs the benchmark and prints the table.
pub fn run(args: &BenchArgs) -> Result<()> {
    let input = Input::open(&args.input)?;
    let reps = representations();
    let mut rows: Vec<Row> = reps
        .iter()
        .map(|e| Row {
            label: e.label(),
            ..Row::default()
        })
        .collect();
    let mut peer = Row {
        label: "zstd-3(f32), lossless peer".into(),
        ..Row::default()
    };
    let chosen: Vec<usize> = (0..input.tensors.len())
        .filter(|&i| {
            let t = &input.tensors[i];
            (args.include_1d || t.shape.len() >= 2)
                && args
                    .filter
                    .as_ref()
                    .is_none_or(|f| t.name.contains(f.as_str()))
        })
        .collect();
    if chosen.is_empty() {
        return Err(CliError::Input(
            "no tensor to benchmark (1-D tensors need --include-1d)".into(),
        ));
    }
    let total: u64 = chosen.iter().map(|&i| input.tensors[i].numel()).sum();
    if !args.budget_at.is_empty() {
        return budget_table(args, &input, &chosen, total);
    }
    let bar = crate::progress(total * (reps.len() as u64 + 1), "benchmark");
    let mut out = Vec::new();
    for &i in &chosen {
        let t = &input.tensors[i];
        let values = input.read(i)?;
        out.resize(values.len(), 0.0);
        for (rep, row) in reps.iter().zip(rows.iter_mut()) {
            let start = Instant::now();
            let encoded = match rep.encode(&t.name, &values, &t.shape) {
                Ok(e) => e,
                Err(e) => {
                    row.failed.get_or_insert(e.to_string());
                    bar.inc(t.numel());
                    continue;
                }
            };
            let enc = &encoded.encoding;
            row.encode_s += start.elapsed().as_secs_f64();
            let refs: Vec<(&str, &[u8])> = encoded
                .streams
                .iter()
                .map(|(r, b)| (*r, b.as_slice()))
                .collect();
            let start = Instant::now();
            hwz::decode_into(&t.name, enc, &t.shape, &refs, &mut out)?;
            row.decode_s += start.elapsed().as_secs_f64();
            row.bytes += encoded.payload_bytes();
            row.acc.add(&values, &out);
            bar.inc(t.numel());
        }
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let start = Instant::now();
        let z = hwz::zstd_codec::compress(&raw);
        peer.encode_s += start.elapsed().as_secs_f64();
        peer.bytes += z.len().min(raw.len()) as u64;
        peer.acc.add(&values, &values);
        bar.inc(t.numel());
    }
    bar.finish_and_clear();
    rows.push(peer);
    if !args.no_peer {
        if let Some(row) = hyperglyph_peer(&input, &chosen)? {
            rows.push(row);
        }
    }
    // A representation that cannot encode every tensor (a rank above a dimension, a codebook
    // below the 1/8-bit floor) is left out of the totals and named here.
    for r in rows.iter().filter(|r| r.failed.is_some()) {
        eprintln!(
            "not in the table: {} ({})",
            r.label,
            r.failed.as_deref().unwrap_or("")
        );
    }
    rows.retain(|r| r.failed.is_none());
    let table: Vec<Value> = rows.iter().map(|r| r.to_json(total)).collect();
    if args.json {
        println!(
            "{:#}",
            json!({"input": args.input, "tensors": chosen.len(), "elements": total, "rows": table})
        );
    } else {
        println!(
            "{} — {} tensors, {} values; bound = 6.02·bps dB (i.i.d. Gaussian), gap = bound − SNR",
            args.input,
            chosen.len(),
            total
        );
        print!("{}", markdown(&table));
    }
    if let Some(path) = &args.markdown {
        let text = format!(
            "# hypercodec benchmark: {}\n\n{} tensors, {} values.\n\n{}",
            args.input,
            chosen.len(),
            total,
            markdown(&table)
        );
        std::fs::write(path, text).map_err(CliError::io(path))?;
    }
    Ok(())
}

/// The peer Hyper Glyph (hyperglyph-codec 0.7.0, default configuration) on the same tensors,
/// when the Python named by `$HYPERCODEC_PYTHON` (default `python3`) can import it. Bytes are
/// its archive file's; cosine and max error are not reported by the script (left at 0).
fn hyperglyph_peer(input: &Input, chosen: &[usize]) -> Result<Option<Row>> {
    let python = std::env::var("HYPERCODEC_PYTHON").unwrap_or_else(|_| "python3".into());
    let importable = std::process::Command::new(&python)
        .args(["-c", "import hyperglyph.compact_codec"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !importable {
        eprintln!(
            "peer Hyper Glyph not run: `{python}` cannot import hyperglyph (set HYPERCODEC_PYTHON)"
        );
        return Ok(None);
    }
    let dir = tempfile::tempdir().map_err(CliError::io(std::env::temp_dir()))?;
    let st = dir.path().join("peer.safetensors");
    let tensors: Vec<crate::safetensors_out::OutTensor> = chosen
        .iter()
        .map(|&i| crate::safetensors_out::OutTensor {
            name: input.tensors[i].name.clone(),
            shape: input.tensors[i].shape.clone(),
            dtype: FloatDtype::F32,
        })
        .collect();
    crate::safetensors_out::write_safetensors(&st, &tensors, None, |k, out| {
        let v = input.read(chosen[k])?;
        out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        Ok(())
    })?;
    let script = dir.path().join("hyperglyph_peer.py");
    std::fs::write(&script, include_str!("../../../scripts/hyperglyph_peer.py"))
        .map_err(CliError::io(&script))?;
    eprintln!("running the peer Hyper Glyph (hyperglyph-codec, default configuration) ...");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg(&st)
        .output()
        .map_err(CliError::io(&python))?;
    if !out.status.success() {
        eprintln!(
            "peer Hyper Glyph failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return Ok(None);
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| CliError::Input(format!("peer output: {e}")))?;
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let seconds = f("seconds");
    eprintln!(
        "peer Hyper Glyph: {:.1} s, peak RSS {:.0} MB",
        seconds,
        f("peak_rss_bytes") / 1e6
    );
    Ok(Some(Row {
        label: "hyperglyph-codec 0.7.0 default (peer, file bytes)".into(),
        bytes: f("bytes") as u64,
        acc: ErrorAcc {
            n: f("elements") as u64,
            signal: f("energy"),
            noise: f("sse"),
            ..ErrorAcc::default()
        },
        encode_s: seconds,
        decode_s: 0.0,
        failed: None,
        summary_only: true,
    }))
}

fn markdown(rows: &[Value]) -> String {
    let mut s = String::from(
        "| representation | bytes | bps | ratio vs f32 | MSE | SNR dB | bound dB | gap dB | cosine | max abs err | encode Mval/s | decode Mval/s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let f = |v: &Value, p: usize| {
        v.as_f64()
            .map_or("exact".to_string(), |x| format!("{x:.p$}"))
    };
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
            r["gap_db"]
                .as_f64()
                .map_or("-".to_string(), |x| format!("{x:.2}")),
            f(&r["cosine"], 6).replace("exact", "-"),
            r["max_abs_err"]
                .as_f64()
                .map_or("-".to_string(), |x| format!("{x:.3e}")),
            f(&r["encode_mvals_per_s"], 0),
            r["decode_mvals_per_s"]
                .as_f64()
                .map_or("-".to_string(), |x| format!("{x:.0}")),
        );
    }
    s
}

/// BUDGET against uniform encodings at equal total bytes (see [`BenchArgs::budget_at`]).
fn budget_table(args: &BenchArgs, input: &Input, chosen: &[usize], total: u64) -> Result<()> {
    use hypercodec_plan::{allocate, Mode, Plan, Planner, Target};
    let mut names: Vec<String> = hypercodec_plan::BUDGET_CANDIDATES
        .iter()
        .map(|s| s.to_string())
        .collect();
    for b in &args.budget_at {
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
    let bar = crate::progress(total, "measure");
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
        let t = &input.tensors[i];
        let values = input.read(i)?;
        energy += values.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
        plan.tensors
            .push(planner.plan_tensor(&t.name, &values, &t.shape)?.0);
        bar.inc(t.numel());
    }
    bar.finish_and_clear();
    let measure_s = started.elapsed().as_secs_f64();
    // Uniform choice of one candidate label for every tensor: (bytes, SSE).
    let uniform = |label_start: &str| -> (u64, f64) {
        plan.tensors.iter().fold((0, 0.0), |(b, d), t| {
            let c = t
                .candidates
                .iter()
                .find(|c| c.label.starts_with(label_start))
                .expect("measured");
            (b + c.bytes, d + c.sse)
        })
    };
    let snr = |sse: f64| 10.0 * (energy / sse.max(1e-300)).log10();
    let line = |what: String, bytes: u64, sse: f64, vs: Option<f64>| {
        let bps = bytes as f64 * 8.0 / total as f64;
        format!(
            "| {what} | {bytes} | {bps:.3} | {sse:.4e} | {:.2} | {} |",
            snr(sse),
            vs.map_or("".into(), |u| format!("{:.1} %", 100.0 * (1.0 - sse / u)))
        )
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
    let mut refs: Vec<(String, String)> = args
        .budget_at
        .iter()
        .map(|b| (format!("lattice-e8-rans@{b}"), format!("E8 + rANS @{b}")))
        .collect();
    refs.push(("affine-int4-g128-asym".into(), "INT4 g128 asym".into()));
    for (label, name) in refs {
        let (bytes, sse) = uniform(&label);
        rows.push(line(format!("uniform {name}"), bytes, sse, None));
        let (used, bsse) = budget(bytes)?;
        rows.push(line(
            format!("BUDGET at the same bytes (vs {name})"),
            used,
            bsse,
            Some(sse),
        ));
    }
    println!(
        "{} — {} tensors, {} values; {} candidates per tensor measured in {:.1} s; distortion = total SSE",
        args.input,
        chosen.len(),
        total,
        names.len(),
        measure_s
    );
    println!("| allocation | bytes | bps | total SSE | SNR dB | SSE saved vs uniform |\n|---|---:|---:|---:|---:|---:|");
    for r in rows {
        println!("{r}");
    }
    Ok(())
}
