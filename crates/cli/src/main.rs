//! `hypercodec`: compress, decompress, inspect and benchmark neural-network weights.
//!
//! The binary is the only part of the workspace (with the Python and web front ends) that
//! touches files: it reads safetensors and GGUF inputs through a memory map one tensor at a
//! time, encodes with `hypercodec-hwz`, and streams the archive to a temporary file that is
//! renamed when complete.

mod bench;
mod error;
mod gguf;
mod input;
mod legacy;
mod planning;
mod safetensors_out;
mod stats;

use clap::{Args, Parser, Subcommand, ValueEnum};
use error::{CliError, Result};
use hypercodec_hwz::{
    self as hwz, AffineParams, Archive, Compression, EncodeOptions, Encoding, FileWriter,
    FloatDtype, Group, WriterOptions,
};
use hypercodec_plan::{Mode, Spec};
use indicatif::{ProgressBar, ProgressStyle};
use input::Input;
use planning::{Chooser, CodebookArgs, PlanArgs};
use serde_json::{json, Value};
use stats::ErrorAcc;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "hypercodec",
    version,
    about = "Compress neural-network weights into .hwz archives, inspect and benchmark them"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compress a .safetensors (f32/f16/bf16) or .gguf file into a .hwz archive.
    Compress(CompressArgs),
    /// Restore a .hwz archive to a .safetensors file.
    Decompress {
        /// The .hwz archive.
        input: PathBuf,
        /// The .safetensors file to write.
        output: PathBuf,
        /// Type of the restored tensors. By default, each tensor's source type (f32 for GGUF block types).
        #[arg(long, value_enum)]
        dtype: Option<DtypeArg>,
    },
    /// List the tensors of a .hwz archive: shapes, encodings, bits per scalar, bytes per stream role.
    Inspect {
        /// The .hwz archive.
        input: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measure every candidate on every tensor and choose by a planner mode; print the Plan as JSON
    /// (feed it to `compress --plan`).
    Plan {
        /// Input: .safetensors, .gguf, or `gaussian:ROWSxCOLS[:SEED]`.
        input: String,
        #[command(flatten)]
        planning: PlanArgs,
        #[command(flatten)]
        codebook: CodebookArgs,
        /// Seed of codebook training.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Plan 1-D tensors (biases, norms) too.
        #[arg(long, visible_alias = "compress-bias")]
        include_1d: bool,
        /// Tensors with fewer values are left out of the plan.
        #[arg(long, default_value_t = 0)]
        min_tensor_size: u64,
    },
    /// Measure every representation (FP32, FP16, BF16, affine INT1..INT8 per row and g128) on a
    /// file's tensors: bytes, bits per scalar, error, gap to the Gaussian bound, speed.
    Benchmark(bench::BenchArgs),
    /// Write a seeded i.i.d. Gaussian .safetensors file (test and demo data).
    Synth {
        /// The .safetensors file to write.
        output: PathBuf,
        /// Shape of each tensor, e.g. 4096x4096.
        #[arg(long, default_value = "4096x4096")]
        shape: String,
        /// Number of tensors (`layers.N.weight`).
        #[arg(long, default_value_t = 1)]
        tensors: usize,
        /// Seed; tensor i uses seed + i.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// The built-in default job: a seeded Gaussian 4096x4096 tensor, compressed, inspected and benchmarked.
    Demo {
        /// Folder for the demo's files.
        #[arg(long, default_value = "target/demo")]
        dir: PathBuf,
        /// Shape of the demo tensor.
        #[arg(long, default_value = "4096x4096")]
        shape: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum DtypeArg {
    F32,
    F16,
    Bf16,
}

impl From<DtypeArg> for FloatDtype {
    fn from(d: DtypeArg) -> Self {
        match d {
            DtypeArg::F32 => FloatDtype::F32,
            DtypeArg::F16 => FloatDtype::F16,
            DtypeArg::Bf16 => FloatDtype::Bf16,
        }
    }
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum EncodingKind {
    RawF32,
    RawF16,
    RawBf16,
    Affine,
    Lattice,
    /// Blocks mapped to learned prototypes (see the codebook flags).
    Codebook,
    /// Low-rank factors (--rank).
    Lowrank,
    /// The nonzero values only.
    Sparse,
    /// Per tensor, the candidate Hyper Glyph's rule picks (same as --mode auto).
    Auto,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum LatticeArg {
    Z1,
    A2,
    D4,
    E8,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum CodingArg {
    /// Interleaved rANS, within a few thousandths of a bit of the symbols' entropy.
    Rans,
    /// Rice codes with one parameter per chunk: simpler, about 0.1 bit per value larger.
    Rice,
    /// Fixed-rate symbols (the execution form): `--bps` rounds down to whole bits per value.
    Fixed,
}

#[derive(Args, Clone)]
struct EncodingArgs {
    /// How to store each tensor.
    #[arg(long, value_enum, default_value = "affine")]
    encoding: EncodingKind,
    /// Affine: bits per code, 1..=8.
    #[arg(long, default_value_t = 4)]
    bits: u8,
    /// Affine: scale group: `tensor`, `row` or a number of values along the input dimension.
    #[arg(long, default_value = "128")]
    group: String,
    /// Affine: symmetric around zero (scales only) instead of scale + offset.
    #[arg(long)]
    symmetric: bool,
    /// Affine: storage type of scales and offsets; lattice: of the row scales.
    #[arg(long, value_enum, default_value = "f16")]
    scale_dtype: DtypeArg,
    /// Lattice: which lattice.
    #[arg(long, value_enum, default_value = "e8")]
    lattice: LatticeArg,
    /// Lattice: target bits per value, all side information included (the scale is fitted).
    #[arg(long, default_value_t = 4.0, conflicts_with = "snr_db")]
    bps: f64,
    /// Lattice: target SNR in dB on Gaussian-like data instead of a rate (scale from the calibration table).
    #[arg(long)]
    snr_db: Option<f32>,
    /// Lattice: symbol coding.
    #[arg(long, value_enum, default_value = "rans")]
    coding: CodingArg,
    /// Lattice: symbols per chunk (independently decodable unit). By default 2^18 for rANS, 2048 for Rice.
    #[arg(long)]
    chunk: Option<u32>,
    /// Lattice: largest RHT tile (a power of two up to 4096); the tile is the largest power of two dividing the row length.
    #[arg(long, default_value_t = 4096)]
    max_tile: u32,
    /// Seed: lattice RHT signs; codebook sampling, k-means++ and HDC projections.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    codebook: CodebookArgs,
}

impl EncodingArgs {
    /// The recipe for every tensor (`bps` replaces `--bps` when a target ratio was given).
    fn spec(&self, bps: Option<f64>) -> Result<Spec> {
        match self.encoding {
            EncodingKind::Codebook => return self.codebook.spec(self.seed),
            EncodingKind::Lowrank => return Ok(self.codebook.lowrank()),
            EncodingKind::Sparse => {
                return Spec::parse("sparse").map_err(|e| CliError::Usage(e.to_string()))
            }
            _ => {}
        }
        let enc = self.encoding()?;
        if self.encoding != EncodingKind::Lattice {
            return Ok(Spec::fixed(enc));
        }
        Ok(Spec::Rate {
            template: enc,
            max_tile: self.max_tile,
            // A fixed α (from the SNR table or the fixed-rate form): the rate follows.
            bps: match (self.snr_db, self.coding) {
                (Some(_), _) | (_, CodingArg::Fixed) => None,
                (None, _) => Some(bps.unwrap_or(self.bps)),
            },
        })
    }

    fn encoding(&self) -> Result<Encoding> {
        Ok(match self.encoding {
            EncodingKind::RawF32 => Encoding::Raw {
                dtype: FloatDtype::F32,
            },
            EncodingKind::RawF16 => Encoding::Raw {
                dtype: FloatDtype::F16,
            },
            EncodingKind::RawBf16 => Encoding::Raw {
                dtype: FloatDtype::Bf16,
            },
            EncodingKind::Affine => {
                let group = parse_group(&self.group)?;
                let params = AffineParams {
                    bits: self.bits,
                    group,
                    symmetric: self.symmetric,
                    scale_dtype: self.scale_dtype.into(),
                };
                params
                    .validate()
                    .map_err(|e| CliError::Usage(e.to_string()))?;
                Encoding::affine(params)
            }
            EncodingKind::Codebook
            | EncodingKind::Lowrank
            | EncodingKind::Sparse
            | EncodingKind::Auto => Encoding::Raw {
                dtype: FloatDtype::F32,
            },
            EncodingKind::Lattice => {
                let lattice = match self.lattice {
                    LatticeArg::Z1 => hwz::Lattice::Z1,
                    LatticeArg::A2 => hwz::Lattice::A2,
                    LatticeArg::D4 => hwz::Lattice::D4,
                    LatticeArg::E8 => hwz::Lattice::E8,
                };
                let cal = hypercodec_lattice::calibration::alpha_for_bps(lattice, self.bps as f32);
                let (coding, alpha) = match self.coding {
                    CodingArg::Rans => {
                        let chunk = self.chunk.unwrap_or(1 << 18);
                        (
                            hwz::Coding::Rans {
                                chunk,
                                lanes: 32,
                                prob_bits: 14,
                            },
                            cal,
                        )
                    }
                    CodingArg::Rice => (
                        hwz::Coding::Rice {
                            chunk: self.chunk.unwrap_or(2048),
                        },
                        cal,
                    ),
                    CodingArg::Fixed => {
                        let bits = (self.bps.floor() as u8).clamp(2, 8);
                        let alpha = hypercodec_lattice::calibration::fixed_alpha(lattice, bits)
                            .ok_or_else(|| {
                                CliError::Usage(format!(
                                    "{lattice} has no fixed-rate form; use z1, d4 or e8"
                                ))
                            })?
                            .0;
                        (hwz::Coding::Fixed { bits }, alpha)
                    }
                };
                let alpha = self.snr_db.map_or(alpha, |snr| {
                    hypercodec_lattice::calibration::alpha_for_snr(lattice, snr)
                });
                if !self.max_tile.is_power_of_two() || self.max_tile > 4096 {
                    return Err(CliError::Usage(format!(
                        "--max-tile {} must be a power of two up to 4096",
                        self.max_tile
                    )));
                }
                Encoding::Lattice {
                    lattice,
                    alpha,
                    tile: 1,
                    seed: self.seed,
                    scale_dtype: self.scale_dtype.into(),
                    coding,
                }
            }
        })
    }
}

fn parse_group(s: &str) -> Result<Group> {
    match s {
        "tensor" => Ok(Group::Tensor),
        "row" => Ok(Group::Row),
        n => match n.parse::<u32>() {
            Ok(g) if g >= 1 => Ok(Group::Size(g)),
            _ => Err(CliError::Usage(format!(
                "--group must be `tensor`, `row` or a size >= 1, not `{s}`"
            ))),
        },
    }
}

#[derive(Args)]
struct CompressArgs {
    /// Input: .safetensors, .gguf, or `gaussian:ROWSxCOLS[:SEED]`.
    input: String,
    /// The .hwz archive to write.
    output: PathBuf,
    #[command(flatten)]
    encoding: EncodingArgs,
    #[command(flatten)]
    planning: PlanArgs,
    /// Encode with the recipes of a plan written by `hypercodec plan` (stored in the archive).
    #[arg(long, conflicts_with = "mode")]
    plan: Option<PathBuf>,
    /// Encode 1-D tensors (biases, norms) too; by default they are kept raw in their source type.
    #[arg(long, visible_alias = "compress-bias")]
    include_1d: bool,
    /// Tensors with fewer values are kept raw in their source type.
    #[arg(long, default_value_t = 0)]
    min_tensor_size: u64,
    /// Store NaN/Inf found in raw-encoded tensors instead of failing.
    #[arg(long)]
    allow_non_finite: bool,
    /// Do not try zstd on each stream.
    #[arg(long)]
    no_zstd: bool,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
}

/// A progress bar on a terminal, nothing otherwise.
pub fn progress(total: u64, what: &str) -> ProgressBar {
    if !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style =
        ProgressStyle::with_template("{msg} [{bar:40}] {percent}% {elapsed_precise} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

fn compress(args: &CompressArgs) -> Result<()> {
    // Reject bad arguments before reading anything.
    let mode = match (args.planning.mode()?, args.encoding.encoding) {
        (Some(m), _) => Some(m),
        (None, EncodingKind::Auto) => Some(Mode::Auto),
        _ => None,
    };
    let target_used = matches!(mode, Some(Mode::Auto | Mode::Budget))
        || (mode.is_none() && args.encoding.encoding == EncodingKind::Lattice);
    if args.planning.target()?.is_some() && !target_used {
        return Err(CliError::Usage(
            "--target-bps / --target-ratio apply to --encoding lattice or auto and to --mode budget or auto".into(),
        ));
    }
    let chooser = mode
        .map(|m| {
            Chooser::new(
                m,
                &args.planning,
                &args.encoding.codebook,
                args.encoding.seed,
            )
        })
        .transpose()?;
    let file_plan: Option<hypercodec_plan::Plan> = match &args.plan {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(CliError::io(path))?;
            Some(
                serde_json::from_str(&text)
                    .map_err(|e| CliError::Usage(format!("{}: not a plan: {e}", path.display())))?,
            )
        }
        None => None,
    };
    let lattice_bps = args
        .planning
        .target()?
        .map(|t| t.bytes(1 << 20) as f64 * 8.0 / (1 << 20) as f64);
    let fixed = args.encoding.spec(lattice_bps)?;
    let input = Input::open(&args.input)?;
    for (name, dtype) in &input.skipped {
        eprintln!("warning: skipping tensor `{name}` of type {dtype} (not a float tensor)");
    }
    let total: u64 = input.tensors.iter().map(|t| t.numel()).sum();
    let options = WriterOptions {
        compression: if args.no_zstd {
            Compression::None
        } else {
            Compression::Zstd
        },
        generator: concat!("hypercodec ", env!("CARGO_PKG_VERSION")).into(),
    };
    let planned = |shape: &[u64]| planning::planned(shape, args.include_1d, args.min_tensor_size);
    // BUDGET decides across tensors: measure every tensor first, then encode the choices.
    let mut plan = chooser.as_ref().map(|c| c.empty_plan());
    if let (Some(c), Some(p)) = (&chooser, &mut plan) {
        if c.mode == Mode::Budget {
            let bar = progress(total, "measure");
            for (i, t) in input.tensors.iter().enumerate() {
                if planned(&t.shape) {
                    p.tensors
                        .push(c.plan_tensor(&t.name, &input.read(i)?, &t.shape)?.0);
                }
                bar.inc(t.numel());
            }
            bar.finish_and_clear();
            c.allocate(p)?;
        }
    }
    let bar = progress(total, "compress");
    let mut writer = FileWriter::create(&args.output, options)?;
    for (k, v) in &input.metadata {
        writer.insert_metadata(k, v.clone());
    }
    if !input.skipped.is_empty() {
        let skipped: Vec<Value> = input
            .skipped
            .iter()
            .map(|(n, d)| json!({"name": n, "dtype": d}))
            .collect();
        writer.insert_metadata("skipped_tensors", Value::Array(skipped));
    }
    let started = Instant::now();
    let mut acc = ErrorAcc::default();
    let mut decoded = Vec::new();
    let encode_options = EncodeOptions {
        allow_non_finite: args.allow_non_finite,
    };
    for (i, t) in input.tensors.iter().enumerate() {
        let values = input.read(i)?;
        // The planner measured its choice on this very encoding: its sums replace a decode.
        let mut measured: Option<hypercodec_plan::Sums> = None;
        let encoded = if !planned(&t.shape) {
            let raw = Encoding::Raw {
                dtype: t.ty.raw_dtype(),
            };
            hwz::encode(&t.name, &values, &t.shape, &raw, encode_options)?
        } else if let Some(p) = &file_plan {
            let tp = p.tensor(&t.name).ok_or_else(|| {
                CliError::Usage(format!("tensor `{}` is not in the plan", t.name))
            })?;
            tp.spec.encode(&t.name, &values, &t.shape, encode_options)?
        } else if let (Some(c), Some(p)) = (&chooser, &mut plan) {
            if c.mode == Mode::Budget {
                let tp = p.tensor(&t.name).ok_or_else(|| {
                    CliError::Input(format!("tensor `{}` was not measured", t.name))
                })?;
                tp.spec.encode(&t.name, &values, &t.shape, encode_options)?
            } else {
                let (tp, enc) = c.plan_tensor(&t.name, &values, &t.shape)?;
                let enc = match enc {
                    Some(e) => {
                        measured = tp.sums;
                        e
                    }
                    None => tp.spec.encode(&t.name, &values, &t.shape, encode_options)?,
                };
                p.tensors.push(tp);
                enc
            }
        } else {
            fixed.encode(&t.name, &values, &t.shape, encode_options)?
        };
        let one = match measured {
            Some(s) => ErrorAcc {
                n: s.n,
                signal: s.signal,
                noise: s.noise,
                recon: s.recon,
                dot: s.dot,
                max_abs: s.max_abs,
            },
            None => {
                decoded.resize(values.len(), 0.0);
                let refs: Vec<(&str, &[u8])> = encoded
                    .streams
                    .iter()
                    .map(|(r, b)| (*r, b.as_slice()))
                    .collect();
                hwz::decode_into(&t.name, &encoded.encoding, &t.shape, &refs, &mut decoded)?;
                let mut one = ErrorAcc::default();
                one.add(&values, &decoded);
                one
            }
        };
        acc.merge(&one);
        writer.add_tensor(
            &t.name,
            &t.shape,
            t.ty.label(),
            &encoded,
            Some(one.to_stats()),
        )?;
        bar.inc(t.numel());
    }
    if let Some(p) = plan.as_ref().or(file_plan.as_ref()) {
        writer.set_plan(serde_json::to_value(p).map_err(|e| CliError::Input(e.to_string()))?);
    }
    let file_pos = writer.position();
    let manifest = writer.finish()?;
    bar.finish_and_clear();
    let file_bytes = std::fs::metadata(&args.output)
        .map_err(CliError::io(&args.output))?
        .len();
    let payload: u64 = manifest.streams.iter().map(|s| s.length).sum();
    let summary = json!({
        "output": args.output,
        "tensors": manifest.tensors.len(),
        "skipped": input.skipped.len(),
        "elements": total,
        "payload_bytes": payload,
        "file_bytes": file_bytes,
        "bps": payload as f64 * 8.0 / total.max(1) as f64,
        "snr_db": finite(acc.snr_db()),
        "seconds": started.elapsed().as_secs_f64(),
    });
    debug_assert!(file_pos <= file_bytes);
    if args.json {
        println!("{summary:#}");
    } else {
        println!(
            "wrote {} ({} tensors, {} values): {} bytes, {:.3} bits/value in streams, SNR {}, {:.1} s",
            args.output.display(),
            manifest.tensors.len(),
            total,
            file_bytes,
            summary["bps"].as_f64().unwrap_or(0.0),
            if acc.snr_db().is_finite() { format!("{:.2} dB", acc.snr_db()) } else { "exact".to_string() },
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn finite(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// `4096x4096` from a JSON shape.
pub fn shape_text(shape: &Value) -> String {
    shape
        .as_array()
        .map(|s| {
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("x")
        })
        .unwrap_or_default()
}

fn open_archive(path: &Path) -> Result<Archive<memmap2::Mmap>> {
    Archive::open_path(path).map_err(|e| match e {
        hwz::HwzError::Io(source) => CliError::Io {
            path: path.into(),
            source,
        },
        e => CliError::Hwz(e),
    })
}

/// Little-endian `dtype` bytes of decoded values. Non-finite values an archive holds are
/// restored as they are; finite values that overflow the type are an error, not an infinity.
pub fn float_bytes(name: &str, values: &[f32], dtype: FloatDtype) -> Result<Vec<u8>> {
    let keep = values.iter().any(|v| !v.is_finite());
    hypercodec_scalar::encode_floats(values, dtype, keep).map_err(|source| {
        CliError::Hwz(hwz::HwzError::Scalar {
            tensor: name.to_string(),
            source,
        })
    })
}

fn decompress(input: &Path, output: &Path, dtype: Option<DtypeArg>) -> Result<()> {
    if legacy::is_legacy(input)? {
        return legacy::decompress(input, output, dtype.map(FloatDtype::from));
    }
    let archive = open_archive(input)?;
    let tensors: Vec<_> = archive
        .tensors()
        .iter()
        .map(|t| safetensors_out::OutTensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            dtype: dtype
                .map(FloatDtype::from)
                .or_else(|| FloatDtype::from_name(&t.source_dtype))
                .unwrap_or(FloatDtype::F32),
        })
        .collect();
    let total: u64 = archive.tensors().iter().map(|t| t.numel()).sum();
    let bar = progress(total, "decompress");
    let mut values = Vec::new();
    safetensors_out::write_safetensors(output, &tensors, None, |i, out| {
        let entry = &archive.tensors()[i];
        values.resize(entry.numel() as usize, 0.0);
        archive.decode_entry_into(entry, &mut values)?;
        out.extend_from_slice(&float_bytes(&entry.name, &values, tensors[i].dtype)?);
        bar.inc(entry.numel());
        Ok(())
    })?;
    bar.finish_and_clear();
    Ok(())
}

fn inspect(input: &Path, as_json: bool) -> Result<()> {
    if legacy::is_legacy(input)? {
        return legacy::inspect(input, as_json);
    }
    let archive = open_archive(input)?;
    let m = archive.manifest();
    let mut rows = Vec::new();
    let (mut elements, mut payload) = (0u64, 0u64);
    for t in archive.tensors() {
        let stored = archive.stored_bytes(t);
        let n = t.numel();
        elements += n;
        payload += stored;
        let streams: serde_json::Map<String, Value> = t
            .streams
            .iter()
            .map(|(role, &i)| {
                let s = &m.streams[i as usize];
                (
                    role.clone(),
                    json!({"stored": s.length, "raw": s.raw_length, "compression": s.compression}),
                )
            })
            .collect();
        rows.push(json!({
            "name": t.name, "shape": t.shape, "source_dtype": t.source_dtype, "encoding": t.encoding,
            "label": t.encoding.label(), "elements": n, "stored_bytes": stored,
            "bps": if n == 0 { 0.0 } else { stored as f64 * 8.0 / n as f64 },
            "streams": streams, "stats": t.stats,
        }));
    }
    let file_bytes = archive.size();
    let totals = json!({
        "tensors": rows.len(), "elements": elements, "payload_bytes": payload,
        "manifest_bytes": archive.tail().manifest_len, "file_bytes": file_bytes,
        "bps_payload": if elements == 0 { 0.0 } else { payload as f64 * 8.0 / elements as f64 },
        "bps_file": if elements == 0 { 0.0 } else { file_bytes as f64 * 8.0 / elements as f64 },
        "ratio_vs_f32": if file_bytes == 0 { 0.0 } else { elements as f64 * 4.0 / file_bytes as f64 },
    });
    if as_json {
        let out = json!({"file": input, "version": m.version, "generator": m.generator, "tensors": rows, "totals": totals, "metadata_keys": m.metadata.keys().collect::<Vec<_>>(), "plan": m.plan});
        println!("{out:#}");
        return Ok(());
    }
    println!(
        "{} — hwz v{}, written by {}",
        input.display(),
        m.version,
        m.generator
    );
    if let Some(plan) = &m.plan {
        println!(
            "plan: mode {}, {} tensors planned (inspect --json shows every candidate measured)",
            plan["mode"].as_str().unwrap_or("?"),
            plan["tensors"].as_array().map_or(0, Vec::len)
        );
    }
    println!(
        "{:<48} {:<16} {:<32} {:>7} {:>12} {:>9}  streams",
        "tensor", "shape", "encoding", "bps", "bytes", "SNR dB"
    );
    for r in &rows {
        let shape = shape_text(&r["shape"]);
        let snr = r["stats"]["snr_db"]
            .as_f64()
            .map_or("exact".to_string(), |v| format!("{v:.2}"));
        let streams = r["streams"]
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| format!("{k}={}", v["stored"]))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        println!(
            "{:<48} {:<16} {:<32} {:>7.3} {:>12} {:>9}  {}",
            r["name"].as_str().unwrap_or(""),
            shape,
            r["label"].as_str().unwrap_or(""),
            r["bps"].as_f64().unwrap_or(0.0),
            r["stored_bytes"],
            snr,
            streams
        );
    }
    println!(
        "{} tensors, {} values; payload {} B ({:.3} bps), manifest {} B, file {} B ({:.3} bps all-in, {:.2}x vs f32)",
        totals["tensors"], elements, payload, totals["bps_payload"].as_f64().unwrap_or(0.0), totals["manifest_bytes"], file_bytes,
        totals["bps_file"].as_f64().unwrap_or(0.0), totals["ratio_vs_f32"].as_f64().unwrap_or(0.0)
    );
    Ok(())
}

fn synth(output: &Path, shape: &str, count: usize, seed: u64) -> Result<()> {
    let (dims, _) = shape.split_once(':').unwrap_or((shape, ""));
    let shape: Vec<u64> = dims
        .split('x')
        .map(|d| {
            d.parse()
                .map_err(|_| CliError::Usage(format!("bad shape `{shape}`: use e.g. 4096x4096")))
        })
        .collect::<Result<_>>()?;
    let tensors: Vec<_> = (0..count)
        .map(|i| safetensors_out::OutTensor {
            name: format!("layers.{i}.weight"),
            shape: shape.clone(),
            dtype: FloatDtype::F32,
        })
        .collect();
    let spec = |i: usize| format!("gaussian:{dims}:{}", seed + i as u64);
    safetensors_out::write_safetensors(output, &tensors, None, |i, out| {
        let input = Input::open(&spec(i))?;
        for v in input.read(0)? {
            out.extend_from_slice(&v.to_le_bytes());
        }
        Ok(())
    })
}

fn demo(dir: &Path, shape: &str) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(CliError::io(dir))?;
    let st = dir.join("gaussian.safetensors");
    println!("== 1. a seeded Gaussian {shape} tensor -> {}", st.display());
    synth(&st, shape, 1, 0)?;
    let input = st.display().to_string();
    for (step, file, extra) in [
        (
            "2. compress with affine INT4, groups of 128, f16 scales",
            "gaussian-int4-g128.hwz",
            vec!["--encoding", "affine"],
        ),
        (
            "3. compress with E8 lattice + rANS at 4.0 bits per value, all-in",
            "gaussian-e8-4bps.hwz",
            vec!["--encoding", "lattice", "--bps", "4"],
        ),
        (
            "4. compress with the measured AUTO choice at ratio 10 (3.2 bits per value): affine, codebook, lattice candidates",
            "gaussian-auto-r10.hwz",
            vec!["--encoding", "auto", "--target-ratio", "10"],
        ),
    ] {
        println!("== {step}");
        let out = dir.join(file);
        let out_str = out.display().to_string();
        let mut argv = vec!["hypercodec", "compress", input.as_str(), out_str.as_str()];
        argv.extend(extra);
        if let Command::Compress(args) = Cli::try_parse_from(argv)
            .map_err(|e| CliError::Usage(e.to_string()))?
            .command
        {
            compress(&args)?;
        }
        inspect(&out, false)?;
    }
    println!("== 5. benchmark every representation on the same tensor");
    bench::run(&bench::BenchArgs::for_input(st.display().to_string()))
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Compress(args) => compress(&args),
        Command::Decompress {
            input,
            output,
            dtype,
        } => decompress(&input, &output, dtype),
        Command::Inspect { input, json } => inspect(&input, json),
        Command::Benchmark(args) => bench::run(&args),
        Command::Plan {
            input,
            planning,
            codebook,
            seed,
            include_1d,
            min_tensor_size,
        } => planning::plan_command(
            &input,
            &planning,
            &codebook,
            seed,
            include_1d,
            min_tensor_size,
        ),
        Command::Synth {
            output,
            shape,
            tensors,
            seed,
        } => synth(&output, &shape, tensors, seed),
        Command::Demo { dir, shape } => demo(&dir, &shape),
    }
}

/// Peak resident memory of this process (Linux `VmHWM`), if the platform tells.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

fn main() -> std::process::ExitCode {
    let result = run(Cli::parse());
    // Benchmarks (`cargo xtask rss`) read the peak memory of a run from here.
    if std::env::var_os("HYPERCODEC_REPORT_RSS").is_some() {
        if let Some(b) = peak_rss_bytes() {
            eprintln!("peak_rss_bytes: {b}");
        }
    }
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
