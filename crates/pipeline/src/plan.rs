//! Recipes from plain options: codebook and lattice settings, the planner, and AUTO's
//! candidate list (one function for `compress --encoding auto`, `plan --mode auto` and the
//! benchmark's auto rows).

use crate::error::{PipelineError, Result};
use crate::progress::{Cancel, Phase, Progress, Tracker};
use crate::source::TensorSource;
use hypercodec_hwz::{
    self as hwz, CodebookSettings, Coding, EncodedTensor, Encoding, FloatDtype, HdcParams, Lattice,
    ResidualDtype, ScaleMode,
};
use hypercodec_plan::{self as plan, Mode, Plan, Planner, Spec, Target, TensorPlan, Thresholds};
use std::collections::HashMap;
use std::path::Path;

/// Settings of the codebook family (named as Hyper Glyph names them) and of low-rank.
#[derive(Debug, Clone, PartialEq)]
pub struct CodebookOptions {
    /// Values per block (2..=64). By default, 8.
    pub block_size: u32,
    /// Number of prototypes (1..=65536). By default, 256.
    pub n_prototypes: u32,
    /// Residual corrections (largest errors) per block; fractions allowed. By default, 0.
    pub residual_k: f64,
    /// Storage of the residual corrections. By default, int8.
    pub residual_dtype: ResidualDtype,
    /// Cap on the residual's bytes as a fraction of the codebook's other bytes. By default, none.
    pub residual_budget: Option<f64>,
    /// What one scale covers. By default, one scale per row (channel).
    pub scale_mode: ScaleMode,
    /// Random projections the HDC index chooses its hyperplanes from; 0 = exhaustive search.
    /// By default, 32.
    pub hdc_dim: usize,
    /// HDC buckets (a power of two). By default, 16.
    pub n_buckets: usize,
    /// Lloyd iterations after k-means++. By default, 8.
    pub lloyd_iters: usize,
    /// Rank of the low-rank candidate. By default, 16.
    pub rank: u32,
    /// Seed of sampling, k-means++ and the HDC projections. By default, 0.
    pub seed: u64,
}

impl Default for CodebookOptions {
    fn default() -> Self {
        CodebookOptions {
            block_size: 8,
            n_prototypes: 256,
            residual_k: 0.0,
            residual_dtype: ResidualDtype::Int8,
            residual_budget: None,
            scale_mode: ScaleMode::Channel,
            hdc_dim: 32,
            n_buckets: 16,
            lloyd_iters: 8,
            rank: 16,
            seed: 0,
        }
    }
}

impl CodebookOptions {
    /// The codebook recipe; checks every setting before anything is read.
    pub fn spec(&self) -> Result<Spec> {
        let template = hwz::codebook_template(
            self.block_size,
            self.n_prototypes,
            self.scale_mode,
            self.residual_dtype,
        );
        let hdc = (self.hdc_dim > 0).then_some(HdcParams {
            dim: self.hdc_dim,
            buckets: self.n_buckets,
            seed: self.seed,
        });
        if let Some(h) = hdc {
            h.validate()
                .map_err(|e| PipelineError::option("--hdc-dim / --n-buckets", e.to_string()))?;
        }
        if self.residual_k < 0.0 || !self.residual_k.is_finite() {
            return Err(PipelineError::option("--residual-k", "must be >= 0"));
        }
        if let Some(b) = self
            .residual_budget
            .filter(|b| !(b.is_finite() && *b >= 0.0))
        {
            return Err(PipelineError::option(
                "--residual-budget",
                format!("{b} is not a fraction >= 0"),
            ));
        }
        // (Its own message: the error named the probe tensor, "tensor `check` has an invalid
        // encoding".)
        template.stream_lens("", &[1, 64]).map_err(|e| {
            let message = match e {
                hwz::HwzError::InvalidEncoding { message, .. } => message,
                e => e.to_string(),
            };
            PipelineError::option("--block-size / --n-prototypes", message)
        })?;
        Ok(Spec::Codebook {
            template,
            settings: CodebookSettings {
                iters: self.lloyd_iters,
                seed: self.seed,
                hdc,
                residual_k: Some(self.residual_k),
                residual_budget: self.residual_budget,
                pick_layout: true,
                ..CodebookSettings::default()
            },
        })
    }

    /// The low-rank recipe.
    pub fn lowrank(&self) -> Spec {
        Spec::fixed(Encoding::LowRank { rank: self.rank })
    }
}

/// How a lattice recipe gets its scale α.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatticeRate {
    /// Fitted to this many bits per value, all side information included.
    Bps(f64),
    /// From the calibration table for this SNR (dB) on Gaussian-like data; the rate follows.
    SnrDb(f32),
}

/// Settings of a lattice recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct LatticeOptions {
    /// The lattice. By default, E8.
    pub lattice: Lattice,
    /// The rate or the quality. By default, 4 bits per value.
    pub rate: LatticeRate,
    /// Symbol coding; `Fixed` takes its bits from the rate (rounded down, 2..=8). By default,
    /// [`Coding::RANS_DEFAULT`].
    pub coding: Coding,
    /// Largest RHT tile (a power of two up to 4096). By default, 4096.
    pub max_tile: u32,
    /// Seed of the RHT signs. By default, 0.
    pub seed: u64,
    /// Storage of the row scales. By default, f16.
    pub scale_dtype: FloatDtype,
}

impl Default for LatticeOptions {
    fn default() -> Self {
        LatticeOptions {
            lattice: Lattice::E8,
            rate: LatticeRate::Bps(4.0),
            coding: Coding::RANS_DEFAULT,
            max_tile: 4096,
            seed: 0,
            scale_dtype: FloatDtype::F16,
        }
    }
}

impl LatticeOptions {
    /// The lattice recipe.
    pub fn spec(&self) -> Result<Spec> {
        use hypercodec_lattice::calibration as cal;
        match self.rate {
            LatticeRate::Bps(b) if !(b.is_finite() && b > 0.0) => {
                return Err(PipelineError::option(
                    "bps",
                    format!("{b} is not a positive number of bits per value"),
                ))
            }
            LatticeRate::SnrDb(s) if !s.is_finite() => {
                return Err(PipelineError::option(
                    "snr-db",
                    format!("{s} is not a finite SNR in dB"),
                ))
            }
            _ => {}
        }
        let l = self.lattice;
        let bps = match self.rate {
            LatticeRate::Bps(b) => b,
            LatticeRate::SnrDb(_) => 4.0,
        };
        // Above the calibration rate control has no scale, and the grid fallback gave fewer
        // bits than asked (INT8 at 7.4 bits for --bps 9, below what --bps 8 gives).
        let most = cal::max_bps(l);
        if matches!(self.rate, LatticeRate::Bps(_))
            && !matches!(self.coding, Coding::Fixed { .. })
            && bps > most
        {
            return Err(PipelineError::option(
                "bps",
                format!(
                    "{bps} bits per value is above the {l} lattice's rates (up to {most:.2}): \
                     ask for --encoding affine --bits 8, or raw-f16 / raw-bf16"
                ),
            ));
        }
        let (coding, mut alpha) = match self.coding {
            Coding::Fixed { .. } => {
                if let LatticeRate::SnrDb(_) = self.rate {
                    return Err(PipelineError::option(
                        "coding",
                        "the fixed-rate form takes its width from --bps (2 to 8 whole bits per \
                         value), not from an SNR",
                    ));
                }
                if !(2.0..9.0).contains(&bps) {
                    return Err(PipelineError::option(
                        "bps",
                        format!(
                            "the fixed-rate form stores 2 to 8 whole bits per value, not {bps}; {}",
                            if bps < 2.0 {
                                "an entropy coding (rans, rice) reaches rates below 2"
                            } else {
                                "above 8 bits take affine INT8 or a float type"
                            }
                        ),
                    ));
                }
                let bits = bps.floor() as u8;
                let alpha = cal::fixed_alpha(l, bits)
                    .ok_or_else(|| {
                        PipelineError::option(
                            "lattice",
                            format!("{l} has no fixed-rate form; use z1, d4 or e8"),
                        )
                    })?
                    .0;
                (Coding::Fixed { bits }, alpha)
            }
            c => (c, cal::alpha_for_bps(l, bps as f32)),
        };
        if let LatticeRate::SnrDb(snr) = self.rate {
            // The calibration spans the lattice's useful range; outside it the step would be
            // clamped to an end, silently missing the target.
            let t = cal::table(l);
            let (lo, hi) = (
                t[0][1].min(t[t.len() - 1][1]),
                t[0][1].max(t[t.len() - 1][1]),
            );
            if !(lo..=hi).contains(&snr) {
                return Err(PipelineError::option(
                    "snr-db",
                    format!(
                        "{l} steps reach {lo:.1} to {hi:.1} dB on Gaussian data, not {snr} dB \
                         (use --bps for a rate instead)"
                    ),
                ));
            }
            alpha = cal::alpha_for_snr(l, snr);
        }
        if !self.max_tile.is_power_of_two() || self.max_tile > 4096 {
            return Err(PipelineError::option(
                "max tile",
                format!("{} must be a power of two up to 4096", self.max_tile),
            ));
        }
        let template = Encoding::Lattice {
            lattice: l,
            alpha,
            tile: 1,
            seed: self.seed,
            scale_dtype: self.scale_dtype,
            coding,
        };
        Ok(Spec::Rate {
            template,
            max_tile: self.max_tile,
            // A fixed α (from the SNR table or the fixed-rate form): the rate follows.
            bps: match (self.rate, coding) {
                (LatticeRate::SnrDb(_), _) | (_, Coding::Fixed { .. }) => None,
                (LatticeRate::Bps(b), _) => Some(b),
            },
        })
    }
}

/// The average bits per value a size target asks for (measured on a 2^20-value tensor).
pub fn target_bps(t: Target) -> f64 {
    t.bytes(1 << 20) as f64 * 8.0 / (1 << 20) as f64
}

/// Settings of the planner.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// The planner mode. By default, [`Mode::Best`].
    pub mode: Mode,
    /// Size target (BUDGET needs one; AUTO uses one). By default, none.
    pub target: Option<Target>,
    /// Candidate names (`f32`, `int4`, `e8@3`, `codebook`, `lowrank`, `sparse`, ...). By
    /// default, empty: the mode's own list, or [`auto_candidates`] for AUTO.
    pub candidates: Vec<String>,
    /// Acceptability thresholds. By default, [`Thresholds::default`].
    pub thresholds: Thresholds,
    /// Rows per block of the block modes. By default, 32.
    pub block_rows: u64,
    /// BUDGET: weight of each tensor's distortion by name. By default, empty (weight 1).
    pub sensitivity: HashMap<String, f64>,
    /// Settings of the `codebook` and `lowrank` candidates. By default, [`CodebookOptions::default`].
    pub codebook: CodebookOptions,
    /// Encoder choices for every candidate. By default, [`hwz::EncodeOptions::default`].
    pub encode_options: hwz::EncodeOptions,
    /// BUDGET: the target counts the archive's own bytes beside the streams
    /// ([`side_bytes`]). By default, true.
    pub side_bytes_in_target: bool,
    /// The compression of the archive the plan goes into: candidates' bytes are counted as its
    /// writer stores them, so that `LOWEST` or a budget never prefers an entropy-coded
    /// candidate that zstd leaves as it is over an integer grid that zstd shrinks below it. By
    /// default, [`hwz::Compression::Zstd`], as [`compress_to_file`](crate::compress_to_file)
    /// writes unless told not to.
    pub container: hwz::Compression,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            mode: Mode::Best,
            target: None,
            candidates: Vec::new(),
            thresholds: Thresholds::default(),
            block_rows: 32,
            sensitivity: HashMap::new(),
            codebook: CodebookOptions::default(),
            encode_options: hwz::EncodeOptions::default(),
            side_bytes_in_target: true,
            container: hwz::Compression::Zstd,
        }
    }
}

/// AUTO's candidates for a tensor of `shape` with `numel` values, `nnz` of them nonzero:
/// Hyper Glyph's kinds plus ours — [`plan::AUTO_CANDIDATES`] and a codebook; low-rank for
/// small matrices; sparse for mostly-zero tensors; E8 fitted to the target rate.
pub fn auto_candidates(shape: &[u64], numel: u64, nnz: u64, target: Option<Target>) -> Vec<String> {
    let mut v: Vec<String> = plan::AUTO_CANDIDATES
        .iter()
        .map(|s| s.to_string())
        .chain(std::iter::once("codebook".to_string()))
        .collect();
    if shape.len() >= 2 && numel <= 1 << 18 {
        v.push("lowrank".into());
    }
    if nnz * 5 <= numel {
        v.push("sparse".into());
    }
    if let Some(t) = target {
        let bps = t.bytes(numel.max(1)) as f64 * 8.0 / numel.max(1) as f64;
        if bps > 0.5 {
            v.push(format!("e8@{:.3}", bps.min(12.0)));
        }
        // One scale for the whole tensor: what fits the rate where per-row side information
        // cannot (3×3 depthwise kernels have 9 values per row).
        let bits = ((bps * numel as f64 - 16.0) / numel.max(1) as f64).floor();
        if bits >= 1.0 {
            v.push(format!("int{}-tensor", (bits as u8).min(8)));
        }
    }
    v
}

/// Chooses the recipe of every tensor from [`PlanOptions`]: one planner per run, or per
/// tensor for AUTO (whose candidates depend on the tensor).
#[derive(Debug, Clone)]
pub struct Chooser {
    options: PlanOptions,
}

impl Chooser {
    /// Checks the options (mode against target, candidate names) before anything is read.
    pub fn new(options: PlanOptions) -> Result<Self> {
        let mode = options.mode;
        if options.target.is_some() && !matches!(mode, Mode::Budget | Mode::Auto) {
            return Err(PipelineError::option(
                "target",
                format!("a size target means nothing to mode {mode:?}; use budget or auto"),
            ));
        }
        if !options.sensitivity.is_empty() && mode != Mode::Budget {
            return Err(PipelineError::option(
                "sensitivity",
                format!("weighs the tensors of mode budget's allocation; mode {mode:?} does not read it"),
            ));
        }
        if mode == Mode::Budget && options.target.is_none() {
            return Err(PipelineError::option(
                "target",
                "mode budget needs a target (bits per value or a ratio: --target-bps or --target-ratio)",
            ));
        }
        let th = &options.thresholds;
        if th.min_snr_db.is_nan() {
            return Err(PipelineError::option(
                "min-snr-db",
                "NaN is not an SNR; give a number of dB",
            ));
        }
        for (option, eps) in [("eps-fp16", th.eps_fp16), ("eps-bf16", th.eps_bf16)] {
            if eps.is_nan() || eps < 0.0 {
                return Err(PipelineError::option(
                    option,
                    format!("{eps} is not a relative error (0 or more)"),
                ));
            }
        }
        if options.block_rows == 0 {
            return Err(PipelineError::option(
                "block-rows",
                "a row block needs at least 1 row",
            ));
        }
        let c = Chooser { options };
        c.planner(&[], 0, 0)?; // reject bad candidate names before reading anything
        Ok(c)
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.options.mode
    }

    fn candidate(&self, name: &str) -> Result<Spec> {
        match name {
            "codebook" => self.options.codebook.spec(),
            "lowrank" => Ok(self.options.codebook.lowrank()),
            n => Ok(Spec::parse(n)?),
        }
    }

    /// The planner for a tensor of `shape` with `numel` values, `nnz` of them nonzero.
    fn planner(&self, shape: &[u64], numel: u64, nnz: u64) -> Result<Planner> {
        let o = &self.options;
        let mut p = Planner::new(o.mode);
        p.thresholds = o.thresholds;
        p.block_rows = o.block_rows.max(1);
        p.target = o.target;
        p.encode_options = o.encode_options;
        p.container = o.container;
        let names = if !o.candidates.is_empty() {
            o.candidates.clone()
        } else if o.mode == Mode::Auto {
            auto_candidates(shape, numel, nnz, o.target)
        } else {
            return Ok(p);
        };
        p.candidates = names
            .iter()
            .map(|n| self.candidate(n))
            .collect::<Result<_>>()?;
        Ok(p)
    }

    /// Plans one tensor; the encoding of the choice comes with it except under BUDGET.
    pub fn plan_tensor(
        &self,
        name: &str,
        values: &[f32],
        shape: &[u64],
    ) -> Result<(TensorPlan, Option<EncodedTensor>)> {
        let nnz = values.iter().filter(|v| **v != 0.0).count() as u64;
        let p = self.planner(shape, values.len() as u64, nnz)?;
        Ok(p.plan_tensor(name, values, shape)?)
    }

    /// An empty plan of this chooser's settings.
    pub fn empty_plan(&self) -> Plan {
        Plan {
            version: 1,
            mode: self.options.mode,
            thresholds: self.options.thresholds,
            target: self.options.target,
            block_rows: self.options.block_rows,
            tensors: Vec::new(),
        }
    }

    /// BUDGET: allocates across the measured tensors; returns the bytes used. The target is
    /// met all-in: the archive's own bytes beside the planned tensors' streams (the stored
    /// plan, the manifest entries and the stream alignment of these and of `other_tensors`
    /// tensors kept raw, [`side_bytes`]) come out of the budget first — unless that leaves
    /// less than the cheapest choices, when the target counts the streams alone.
    pub fn allocate(&self, plan: &mut Plan, others: Unplanned) -> Result<u64> {
        let target = self
            .options
            .target
            .ok_or_else(|| PipelineError::option("target", "budget needs a target"))?;
        let cheapest: u64 = plan
            .tensors
            .iter()
            .map(|t| t.candidates.iter().map(|c| c.bytes).min().unwrap_or(0))
            .sum();
        // All-in: the target is over every value the archive holds, and what it spends beside
        // the planned streams — the tensors kept raw, the manifest, the stored plan, the
        // alignment — comes out of it first. Where that leaves less than the cheapest choices
        // (a tiny model), the target counts the tensors' streams alone, as it did before.
        let streams = target.bytes(plan.total_elements());
        let budget = if self.options.side_bytes_in_target {
            let full = target.bytes(plan.total_elements() + others.values);
            match full.saturating_sub(side_bytes(plan, others.tensors) + others.bytes) {
                b if b >= cheapest => b,
                _ => streams,
            }
        } else {
            streams
        };
        Ok(plan::allocate(
            plan,
            Target::Bytes(budget),
            &self.options.sensitivity,
        )?)
    }
}

/// The tensors an archive keeps beside the planned ones (raw, in their source type).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unplanned {
    /// How many.
    pub tensors: usize,
    /// Their values.
    pub values: u64,
    /// Their bytes as stored raw.
    pub bytes: u64,
}

/// Manifest bytes per tensor entry once the manifest is compressed (measured: 33 on a
/// 262-tensor CNN), plus half an alignment gap per stream.
const SIDE_BYTES_PER_TENSOR: u64 = 40;
const SIDE_BYTES_PER_STREAM: u64 = hwz::ALIGN / 2;
const STREAMS_PER_PLANNED_TENSOR: u64 = 4;
/// A manifest entry as plain JSON (name, shape, encoding, streams, error figures; 667 measured
/// on a 6-tensor BUDGET archive, 844–851 for one E8 lattice tensor, whose four streams and
/// their alignment then took a 256×1024 layer 0.001 bit a value over `--bps` at 700): a
/// manifest of at most [`hwz::MANIFEST_COMPRESS_MIN`] bytes is stored so.
const PLAIN_BYTES_PER_TENSOR: u64 = 900;
/// A compressed manifest's cost beyond its entries (a small one compresses less well).
const COMPRESSED_MANIFEST_BASE: u64 = 2048;

/// An estimate of what an archive of `plan` spends beside the planned tensors' streams: the
/// stored plan (inline in the manifest, or a compressed stream when larger), each tensor's
/// manifest entry (plain JSON in a small manifest, compressed in a large one) and the
/// alignment of its streams — for the planned tensors and `other_tensors` stored raw (one
/// stream each; their data is not included). On a MobileNetV2-shaped CNN (53 planned, 209 raw
/// tensors, `--target-bps 2`) it estimates 42 KB where the archive spends 34 KB beside its
/// tensors' streams.
pub fn side_bytes(plan: &Plan, other_tensors: usize) -> u64 {
    let json = serde_json::to_vec(&plan.for_archive()).unwrap_or_default();
    archive_side_bytes(&json, plan.tensors.len(), other_tensors)
}

/// [`side_bytes`] of an archive that stores no plan (`--encoding lattice --bps`): `planned`
/// encoded tensors and `other_tensors` kept raw.
pub fn unplanned_side_bytes(planned: usize, other_tensors: usize) -> u64 {
    archive_side_bytes(&[], planned, other_tensors)
}

/// [`side_bytes`] for a plan serialized as `json` (empty: none stored).
fn archive_side_bytes(json: &[u8], planned: usize, other_tensors: usize) -> u64 {
    let zipped = || {
        if json.is_empty() {
            return 0;
        }
        hwz::zstd_codec::compress_at(json, hwz::zstd_codec::manifest_level(json.len())).len() as u64
    };
    let inline = json.len() <= hwz::PLAN_INLINE_MAX;
    let planned = planned as u64;
    let others = other_tensors as u64;
    let entries = planned + others;
    let plain = entries * PLAIN_BYTES_PER_TENSOR + if inline { json.len() as u64 } else { 0 };
    // Above the writer's limit the manifest is compressed, but an estimate just above it may
    // be a manifest stored plain just below it: at least the limit, at most the plain size.
    let limit = hwz::MANIFEST_COMPRESS_MIN as u64;
    let manifest = if plain <= limit {
        plain
    } else {
        (COMPRESSED_MANIFEST_BASE
            + entries * SIDE_BYTES_PER_TENSOR
            + if inline { zipped() } else { 0 })
        .clamp(limit, plain)
    };
    let plan_stream = if inline { 0 } else { zipped() };
    hwz::HEADER_LEN
        + hwz::TAIL_LEN
        + manifest
        + plan_stream
        + (planned * STREAMS_PER_PLANNED_TENSOR + others) * SIDE_BYTES_PER_STREAM
}

/// Which tensors are planned and encoded (the others are kept raw in their source type). A
/// tensor without values (a zero dimension) is always kept raw: it has nothing to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Selection {
    /// Plan 1-D tensors (biases, norms) too. By default, false.
    pub include_1d: bool,
    /// Tensors with fewer values are left out. By default, 0.
    pub min_tensor_size: u64,
}

impl Selection {
    /// Whether a tensor of `shape` is planned.
    pub fn planned(&self, shape: &[u64]) -> bool {
        let n = shape.iter().product::<u64>();
        (shape.len() >= 2 || self.include_1d) && n > 0 && n >= self.min_tensor_size
    }
}

/// Measures every selected tensor of `source` and chooses (BUDGET: allocates) — what
/// `hypercodec plan` prints.
pub fn plan_source(
    source: &TensorSource,
    chooser: &Chooser,
    selection: Selection,
    progress: &mut dyn FnMut(Progress<'_>),
    cancel: &Cancel,
) -> Result<Plan> {
    let mut plan = chooser.empty_plan();
    let mut bar = Tracker::new(Phase::Plan, source.total_elements(), progress);
    for (i, t) in source.tensors.iter().enumerate() {
        cancel.check()?;
        if selection.planned(&t.shape) {
            let values = source.read(i)?;
            plan.tensors
                .push(chooser.plan_tensor(&t.name, &values, &t.shape)?.0);
        }
        bar.step(&t.name, t.numel());
    }
    if chooser.mode() == Mode::Budget {
        let mut others = Unplanned::default();
        for t in source
            .tensors
            .iter()
            .filter(|t| !selection.planned(&t.shape))
        {
            others.tensors += 1;
            others.values += t.numel();
            others.bytes += t.numel() * t.ty.raw_dtype().size() as u64;
        }
        chooser.allocate(&mut plan, others)?;
    }
    Ok(plan)
}

/// Reads a plan written by `hypercodec plan`.
pub fn read_plan(path: &Path) -> Result<Plan> {
    let text = crate::output::read_json_input(path, "plan")?;
    serde_json::from_str(&text).map_err(|e| PipelineError::Json {
        what: format!("{}: not a plan", path.display()),
        message: e.to_string(),
    })
}

/// The names of `weights` (sensitivity weights) that name none of `tensors`, sorted: weights
/// of another model, or names spelt otherwise (`lm_head` for `lm_head.weight`); nothing reads
/// them.
pub fn unmatched_sensitivity<'a>(
    weights: &'a HashMap<String, f64>,
    tensors: &[&str],
) -> Vec<&'a str> {
    unmatched_names(weights.keys().map(String::as_str), tensors.iter().copied())
}

/// The `names` that are not among `have`, sorted (what [`unmatched_sensitivity`] and
/// [`crate::Calibration::unmatched`] report).
pub(crate) fn unmatched_names<'a, 'b>(
    names: impl Iterator<Item = &'a str>,
    have: impl Iterator<Item = &'b str>,
) -> Vec<&'a str> {
    let have: std::collections::HashSet<&str> = have.collect();
    let mut v: Vec<&str> = names.filter(|k| !have.contains(k)).collect();
    v.sort_unstable();
    v
}

/// Reads BUDGET's sensitivity weights: a JSON object `{tensor name: weight}`.
pub fn read_sensitivity(path: &Path) -> Result<HashMap<String, f64>> {
    let text = crate::output::read_json_input(path, "sensitivity file")?;
    parse_weights(&text, &path.display().to_string())
}

/// BUDGET's sensitivity weights from a command-line value: the JSON object itself when the
/// value starts with `{` (after spaces), else the path of a file holding it.
pub fn sensitivity_arg(value: &str) -> Result<HashMap<String, f64>> {
    if value.trim_start().starts_with('{') {
        parse_weights(value, "sensitivity")
    } else {
        read_sensitivity(Path::new(value))
    }
}

/// The largest sensitivity weight: the budget weighs each tensor's squared error by it, and a
/// squared error of f32 values over a billion of them stays below 1e87, so products stay finite
/// (a weight of 1e308 overflowed them to infinity, and the tensor it meant to protect got the
/// cheapest candidate instead).
pub const MAX_SENSITIVITY: f64 = 1e200;

fn parse_weights(text: &str, what: &str) -> Result<HashMap<String, f64>> {
    let weights: HashMap<String, f64> =
        serde_json::from_str(text).map_err(|e| PipelineError::Json {
            what: format!("{what}: not a {{name: weight}} object"),
            message: e.to_string(),
        })?;
    if let Some((name, w)) = weights
        .iter()
        .find(|(_, w)| !(0.0..=MAX_SENSITIVITY).contains(*w))
    {
        return Err(PipelineError::option(
            "sensitivity",
            format!("weight {w} of `{name}` is not a number in 0..={MAX_SENSITIVITY:e}"),
        ));
    }
    Ok(weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_adds_lowrank_for_small_matrices_and_sparse_for_mostly_zero() {
        let base = plan::AUTO_CANDIDATES.len() + 1;
        let big = auto_candidates(&[4096, 4096], 1 << 24, 1 << 24, None);
        assert_eq!(big.len(), base, "{big:?}");
        assert!(big.contains(&"codebook".to_string()));
        let small = auto_candidates(&[64, 64], 4096, 4096, None);
        assert!(small.contains(&"lowrank".to_string()), "{small:?}");
        assert!(!small.contains(&"sparse".to_string()));
        let zeros = auto_candidates(&[4096], 4096, 100, None);
        assert!(zeros.contains(&"sparse".to_string()), "{zeros:?}");
        assert!(!zeros.contains(&"lowrank".to_string()), "1-D: no low rank");
        let fitted = auto_candidates(&[1024, 1024], 1 << 20, 1 << 20, Some(Target::Bps(3.2)));
        assert!(fitted.contains(&"e8@3.200".to_string()), "{fitted:?}");
        // One scale per tensor at the most bits that fit: 3 for a 1024² tensor at 3.2 bps,
        // 3 (not 4) for a 3×3 depthwise kernel at exactly 4 bps (its scale costs 16 bits).
        assert_eq!(fitted.last().map(String::as_str), Some("int3-tensor"));
        let dw = auto_candidates(&[192, 1, 3, 3], 1728, 1728, Some(Target::Bps(4.0)));
        assert_eq!(dw.last().map(String::as_str), Some("int3-tensor"));
    }

    #[test]
    fn bad_combinations_are_rejected_before_reading() {
        let budget = PlanOptions {
            mode: Mode::Budget,
            ..PlanOptions::default()
        };
        assert!(matches!(
            Chooser::new(budget),
            Err(PipelineError::InvalidOption { .. })
        ));
        let bad = PlanOptions {
            candidates: vec!["int4".into(), "e9@3".into()],
            ..PlanOptions::default()
        };
        assert!(matches!(Chooser::new(bad), Err(PipelineError::Plan(_))));
        // Sensitivity weights outside BUDGET weighed nothing, silently.
        let weighed = PlanOptions {
            mode: Mode::Best,
            sensitivity: HashMap::from([("w".to_string(), 4.0)]),
            ..PlanOptions::default()
        };
        assert!(matches!(
            Chooser::new(weighed),
            Err(PipelineError::InvalidOption { option, .. }) if option == "sensitivity"
        ));
        let weights = HashMap::from([("w".to_string(), 4.0), ("b".to_string(), 1.0)]);
        assert_eq!(unmatched_sensitivity(&weights, &["w", "x"]), ["b"]);
        let mut nan = PlanOptions::default();
        nan.thresholds.min_snr_db = f64::NAN;
        let zero_rows = PlanOptions {
            block_rows: 0,
            ..PlanOptions::default()
        };
        for o in [nan, zero_rows] {
            assert!(matches!(
                Chooser::new(o),
                Err(PipelineError::InvalidOption { .. })
            ));
        }
        // (9 bits: above E8's calibrated 8.05, which the grid fallback served with 7.4.)
        for rate in [
            LatticeRate::SnrDb(f32::NAN),
            LatticeRate::Bps(f64::NAN),
            LatticeRate::Bps(9.0),
        ] {
            let o = LatticeOptions {
                rate,
                ..LatticeOptions::default()
            };
            assert!(matches!(o.spec(), Err(PipelineError::InvalidOption { .. })));
        }
        let top = LatticeOptions {
            rate: LatticeRate::Bps(8.0),
            ..LatticeOptions::default()
        };
        assert!(top.spec().is_ok());
        assert_eq!(
            sensitivity_arg(r#" {"a": 2}"#).expect("inline").get("a"),
            Some(&2.0)
        );
        // Negative, or so large that weighted errors overflow (1e308 gave the tensor the
        // cheapest candidate, as a weight of 0 would).
        for bad in [r#"{"a": -1}"#, r#"{"a": 1e308}"#, r#"{"a": 1e201}"#] {
            assert!(
                matches!(
                    sensitivity_arg(bad),
                    Err(PipelineError::InvalidOption { .. })
                ),
                "{bad}"
            );
        }
        assert!(sensitivity_arg(r#"{"a": 1e200}"#).is_ok());
        assert!(matches!(
            sensitivity_arg("/nonexistent/w.json"),
            Err(PipelineError::Io { .. })
        ));
    }
}
