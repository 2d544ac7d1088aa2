//! Command-line arguments and their conversion into the pipeline's option structs.

use clap::{Args, ValueEnum};
use hypercodec_hwz::{self as hwz, AffineParams, Coding, Encoding, FloatDtype, Group};
use hypercodec_pipeline::{
    sensitivity_arg, target_bps, CodebookOptions, LatticeOptions, LatticeRate, PipelineError,
    PlanOptions, Result,
};
use hypercodec_plan::{Mode, Spec, Target, Thresholds};

/// What a BUDGET target counts.
#[derive(Clone, Copy, ValueEnum)]
pub enum TargetScope {
    /// The archive's own bytes too.
    AllIn,
    /// The planned tensors' streams alone.
    Streams,
}

/// The step of entropy-coded lattice rows.
#[derive(Clone, Copy, ValueEnum)]
pub enum LatticeScaleArg {
    /// Each row's own RMS.
    Row,
    /// One step for every row of a tensor.
    Tensor,
}

impl From<LatticeScaleArg> for hypercodec_hwz::LatticeScale {
    fn from(s: LatticeScaleArg) -> Self {
        match s {
            LatticeScaleArg::Row => hypercodec_hwz::LatticeScale::Row,
            LatticeScaleArg::Tensor => hypercodec_hwz::LatticeScale::Tensor,
        }
    }
}

/// A float type.
#[derive(Clone, Copy, ValueEnum)]
pub enum DtypeArg {
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
pub enum EncodingKind {
    RawF32,
    RawF16,
    RawBf16,
    Affine,
    Lattice,
    /// Bitshift trellis after an RHT: a fixed --bits per value (1..=8), near the Gaussian bound.
    Trellis,
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
pub enum LatticeArg {
    Z1,
    A2,
    D4,
    E8,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum CodingArg {
    /// Interleaved rANS, within a few thousandths of a bit of the symbols' entropy.
    Rans,
    /// rANS shaped for the CUDA GEMV that decodes it: chunks of whole rows (about 2^14
    /// symbols), 12-bit probabilities; about 0.07 bit per value larger.
    RansGpu,
    /// E8 only: lane-interleaved prefix codes (8-bit singles, 12-bit pairs) in chunks of eight
    /// rows, the form a GPU warp decodes a word a lane; about 0.1 bit per value larger than
    /// rans-gpu at 4 bits. A tensor whose symbols its tables cannot hold, or too small to carry
    /// its code lengths (about a kilobyte) at the rate, gets rans-gpu.
    PrefixGpu,
    /// Rice codes with one parameter per chunk: simpler, about 0.1 bit per value larger.
    Rice,
    /// Fixed-rate symbols (the execution form): `--bps` rounds down to whole bits per value.
    Fixed,
}

/// Codebook: what one scale covers.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ScaleArg {
    /// One scale per block.
    Block,
    /// One scale for the tensor.
    Tensor,
    /// One scale per row (output channel).
    Channel,
}

/// Codebook: residual value storage.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ResidualArg {
    /// int8 codes with one f32 scale.
    Int8,
    /// Exact f32.
    F32,
}

/// Arguments of the codebook family (named as Hyper Glyph names them).
#[derive(Args, Clone)]
pub struct CodebookArgs {
    /// Codebook: values per block (2..=64).
    #[arg(long, default_value_t = 8)]
    pub block_size: u32,
    /// Codebook: number of prototypes (1..=65536).
    #[arg(long, default_value_t = 256)]
    pub n_prototypes: u32,
    /// Codebook: residual corrections (largest errors) per block; fractions allowed (0.25 = one per four blocks).
    #[arg(long, default_value_t = 0.0)]
    pub residual_k: f64,
    /// Codebook: storage of the residual corrections.
    #[arg(long, value_enum, default_value = "int8")]
    pub residual_dtype: ResidualArg,
    /// Codebook: cap on the residual's bytes as a fraction of the codebook's other bytes (e.g. 0.03).
    #[arg(long)]
    pub residual_budget: Option<f64>,
    /// Codebook: what one scale covers.
    #[arg(long, value_enum, default_value = "channel")]
    pub scale_mode: ScaleArg,
    /// Codebook: random projections the HDC index chooses its bucket hyperplanes from; 0 = exhaustive search.
    #[arg(long, default_value_t = 32)]
    pub hdc_dim: usize,
    /// Codebook: HDC buckets (a power of two; more = faster, slightly less exact).
    #[arg(long, default_value_t = 16)]
    pub n_buckets: usize,
    /// Codebook: Lloyd iterations after k-means++.
    #[arg(long, default_value_t = 8)]
    pub lloyd_iters: usize,
    /// Low-rank: rank of the factors.
    #[arg(long, default_value_t = 16)]
    pub rank: u32,
}

impl CodebookArgs {
    /// The library's options, with `seed`.
    pub fn options(&self, seed: u64) -> CodebookOptions {
        CodebookOptions {
            block_size: self.block_size,
            n_prototypes: self.n_prototypes,
            residual_k: self.residual_k,
            residual_dtype: match self.residual_dtype {
                ResidualArg::Int8 => hwz::ResidualDtype::Int8,
                ResidualArg::F32 => hwz::ResidualDtype::F32,
            },
            residual_budget: self.residual_budget,
            scale_mode: match self.scale_mode {
                ScaleArg::Block => hwz::ScaleMode::Block,
                ScaleArg::Tensor => hwz::ScaleMode::Tensor,
                ScaleArg::Channel => hwz::ScaleMode::Channel,
            },
            hdc_dim: self.hdc_dim,
            n_buckets: self.n_buckets,
            lloyd_iters: self.lloyd_iters,
            rank: self.rank,
            seed,
        }
    }
}

/// Arguments of the planner.
#[derive(Args, Clone)]
pub struct PlanArgs {
    /// Planner mode: lowest | highest | allow | closest | average | best | per_block | per_weight |
    /// budget | auto (`plan` defaults to best). LOWEST: fewest bytes. HIGHEST: lowest error. BEST: cheapest acceptable.
    /// ALLOW: cheapest acceptable on 70 % of row blocks. CLOSEST: median of the blocks' picks.
    /// AVERAGE: their majority (over 60 %), else the one nearest their mean bps. PER_BLOCK: one
    /// pick per row block (hwz `mixed`). PER_WEIGHT: a base plus its worst values exact.
    /// BUDGET: convex-hull allocation under --target-bps or --target-ratio. AUTO: Hyper Glyph's
    /// rule. Acceptable: a lossy SNR of at least --min-snr-db; f16 and bf16 when their
    /// element-wise relative error is at most --eps-fp16 / --eps-bf16.
    #[arg(long)]
    pub mode: Option<String>,
    /// Target average bits per value, all side information included (BUDGET, AUTO).
    #[arg(long)]
    pub target_bps: Option<f64>,
    /// Target compression ratio versus f32 (BUDGET, AUTO; for --encoding lattice the rate 32/ratio).
    #[arg(long, conflicts_with = "target_bps")]
    pub target_ratio: Option<f64>,
    /// What a BUDGET target counts: `all-in` (the whole file over every value it holds: the
    /// tensors kept raw, the stored plan, manifest entries and stream alignment come out of
    /// the budget first) or `streams` (the planned tensors' streams alone: for layers taken
    /// out of the archive, as `hypercodec.nn.quantize_budget`).
    #[arg(long, value_enum, default_value = "all-in")]
    pub target_scope: TargetScope,
    /// Candidates, comma separated: f32, bf16, f16, intN (g128 asym), intN-gG (groups of G, asym),
    /// intN-gG-sym, intN-row, intN-tensor,
    /// e8@B, d4@B, a2@B, z1@B, codebook, lowrank, sparse. Default: f32,bf16,f16,int8-row,int4,e8@4;
    /// for BUDGET bf16,int8-row,int4,int3,int2,e8@2,e8@2.5,e8@3,e8@3.5,e8@4,e8@5,e8@6,
    /// int4-tensor,int2-tensor,int1-tensor; for AUTO bf16,int8-row,int4-row,int4,e8@3,e8@4,codebook
    /// (+ lowrank, sparse, and with a target a fitted e8 and intN-tensor, where they apply).
    #[arg(long, value_delimiter = ',')]
    pub candidates: Vec<String>,
    /// Lossy candidates are acceptable at this SNR (dB) or above.
    #[arg(long, default_value_t = 30.0)]
    pub min_snr_db: f64,
    /// f16 is acceptable when its element-wise relative error is at most this (0 = exact only).
    #[arg(long, default_value_t = 0.0)]
    pub eps_fp16: f64,
    /// bf16 is acceptable when its element-wise relative error is at most this (0 = exact only).
    #[arg(long, default_value_t = 0.0)]
    pub eps_bf16: f64,
    /// Between equally sized f16 and bf16, take bf16.
    #[arg(long)]
    pub prefer_bf16: bool,
    /// Rows per block of the block modes.
    #[arg(long, default_value_t = 32)]
    pub block_rows: u64,
    /// BUDGET: weights {tensor name: weight} scaling each tensor's distortion: the JSON object
    /// itself (`'{"lm_head.weight": 4}'`) or the path of a file holding it.
    #[arg(long)]
    pub sensitivity: Option<String>,
}

impl PlanArgs {
    /// The mode, if one was given; also rejects values no mode can use (NaN thresholds, row
    /// blocks of 0 rows), whether or not a mode was given.
    pub fn mode(&self) -> Result<Option<Mode>> {
        if self.min_snr_db.is_nan() {
            return Err(PipelineError::option(
                "--min-snr-db",
                "must be a number of dB",
            ));
        }
        if self.block_rows == 0 {
            return Err(PipelineError::option("--block-rows", "must be at least 1"));
        }
        Ok(self.mode.as_deref().map(str::parse).transpose()?)
    }

    /// The size target, if any.
    pub fn target(&self) -> Result<Option<Target>> {
        match (self.target_bps, self.target_ratio) {
            (Some(b), _) if !(b > 0.0 && b.is_finite()) => {
                Err(PipelineError::option("--target-bps", "must be positive"))
            }
            (_, Some(r)) if !(r > 0.0 && r.is_finite()) => {
                Err(PipelineError::option("--target-ratio", "must be positive"))
            }
            (Some(b), _) => Ok(Some(Target::Bps(b))),
            (_, Some(r)) => Ok(Some(Target::Ratio(r))),
            _ => Ok(None),
        }
    }

    /// The library's options for `mode`.
    pub fn options(&self, mode: Mode, codebook: CodebookOptions) -> Result<PlanOptions> {
        Ok(PlanOptions {
            mode,
            target: self.target()?,
            // (" int4 , e8@3 " named no candidate " int4 "; --encodings trims its names too.)
            candidates: self
                .candidates
                .iter()
                .map(|c| c.trim().to_string())
                .collect(),
            thresholds: Thresholds {
                min_snr_db: self.min_snr_db,
                eps_fp16: self.eps_fp16,
                eps_bf16: self.eps_bf16,
                prefer_bf16: self.prefer_bf16,
                ..Thresholds::default()
            },
            block_rows: self.block_rows,
            sensitivity: match &self.sensitivity {
                Some(v) => sensitivity_arg(v)?,
                None => Default::default(),
            },
            codebook,
            // `compress` sets them from its own flags (`--lattice-scale`, `--no-zstd`).
            encode_options: Default::default(),
            container: hypercodec_hwz::Compression::Zstd,
            side_bytes_in_target: matches!(self.target_scope, TargetScope::AllIn),
        })
    }
}

#[derive(Args, Clone)]
pub struct EncodingArgs {
    /// How to store each tensor. By default, affine.
    #[arg(long, value_enum)]
    pub encoding: Option<EncodingKind>,
    /// Affine: bits per code, 1..=8; trellis: bits per value, 1..=8.
    #[arg(long, default_value_t = 4)]
    pub bits: u8,
    /// Trellis: state bits L, 8..=16 (the encoder's work per value grows as 2^L; 16 is within
    /// 0.4–0.6 dB of the Gaussian bound at 2–4 bits, 12 about 0.3 dB further and 16× faster).
    #[arg(long, default_value_t = hypercodec_trellis::DEFAULT_L)]
    pub trellis_l: u8,
    /// Trellis: a pair of values per state (V = 2; bits 1..=4), experimental: the code a GPU
    /// decoder needs about 22 % fewer integer instructions per weight for, 0.05 dB lower SNR at
    /// 2 bits and 0.3 at 4; the CUDA kernels read it, the GPU encoder does not yet (the CPU
    /// codes it). Rows of an odd length keep one value per state.
    #[arg(long)]
    pub trellis_pairs: bool,
    /// Affine: scale group: `tensor`, `row` or a number of values along the input dimension.
    #[arg(long, default_value = "128")]
    pub group: String,
    /// Affine: symmetric around zero (scales only) instead of scale + offset.
    #[arg(long)]
    pub symmetric: bool,
    /// Affine: storage type of scales and offsets; lattice and trellis: of the row scales.
    #[arg(long, value_enum, default_value = "f16")]
    pub scale_dtype: DtypeArg,
    /// Lattice: which lattice.
    #[arg(long, value_enum, default_value = "e8")]
    pub lattice: LatticeArg,
    /// Lattice: target bits per value, all side information included (the scale is fitted);
    /// 4 unless given. `--target-bps` and `--target-ratio` set it too: give one of them.
    #[arg(long, conflicts_with = "snr_db")]
    pub bps: Option<f64>,
    /// Lattice: target SNR in dB on Gaussian-like data instead of a rate (scale from the calibration table).
    #[arg(long)]
    pub snr_db: Option<f32>,
    /// Lattice: symbol coding.
    #[arg(long, value_enum, default_value = "rans")]
    pub coding: CodingArg,
    /// Lattice: symbols per chunk (independently decodable unit). By default 2^18 for rANS, 2048 for Rice; prefix-gpu: chunks of eight rows (of several groups of eight where a row is shorter) of about this many symbols (by default 2^13 or 2^14, by the matrix: more chunks where a mid-sized matrix would leave a GPU idle).
    #[arg(long)]
    pub chunk: Option<u32>,
    /// Lattice: largest RHT tile (a power of two up to 4096); the tile is the largest power of two dividing the row length.
    #[arg(long, default_value_t = 4096)]
    pub max_tile: u32,
    /// Seed: lattice RHT signs; codebook sampling, k-means++ and HDC projections.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub codebook: CodebookArgs,
}

impl EncodingArgs {
    /// The encoding asked for, affine by default.
    pub fn kind(&self) -> EncodingKind {
        self.encoding.unwrap_or(EncodingKind::Affine)
    }

    /// The recipe for every tensor; `target` (a size target) replaces `--bps` of the lattice.
    pub fn spec(&self, target: Option<Target>) -> Result<Spec> {
        if let Some(snr) = self.snr_db.filter(|s| !s.is_finite()) {
            return Err(PipelineError::option(
                "--snr-db",
                format!("{snr} is not a finite number of dB"),
            ));
        }
        let raw = |dtype| Ok(Spec::fixed(Encoding::Raw { dtype }));
        match self.kind() {
            EncodingKind::Codebook => self.codebook.options(self.seed).spec(),
            EncodingKind::Lowrank => Ok(self.codebook.options(self.seed).lowrank()),
            EncodingKind::Sparse => Ok(Spec::parse("sparse")?),
            EncodingKind::RawF32 | EncodingKind::Auto => raw(FloatDtype::F32),
            EncodingKind::RawF16 => raw(FloatDtype::F16),
            EncodingKind::RawBf16 => raw(FloatDtype::Bf16),
            EncodingKind::Affine => {
                let params = AffineParams {
                    bits: self.bits,
                    group: parse_group(&self.group)?,
                    symmetric: self.symmetric,
                    scale_dtype: self.scale_dtype.into(),
                };
                params
                    .validate()
                    .map_err(|e| PipelineError::option("affine", e.to_string()))?;
                Ok(Spec::fixed(Encoding::affine(params)))
            }
            EncodingKind::Trellis => {
                let make = if self.trellis_pairs {
                    Spec::trellis_pairs
                } else {
                    Spec::trellis
                };
                let mut spec = make(self.trellis_l, self.bits, self.max_tile, self.seed)
                    .map_err(|e| PipelineError::option("trellis", e.to_string()))?;
                if let Spec::Rate {
                    template: Encoding::Trellis { scale_dtype, .. },
                    ..
                } = &mut spec
                {
                    *scale_dtype = self.scale_dtype.into();
                }
                Ok(spec)
            }
            EncodingKind::Lattice => {
                if self.coding == CodingArg::RansGpu && self.chunk.is_some() {
                    return Err(PipelineError::option(
                        "chunk",
                        "rans-gpu chunks are whole rows of about 2^14 symbols (what the CUDA \
                         kernel decodes); --chunk does not apply",
                    ));
                }
                if self.coding == CodingArg::PrefixGpu && self.lattice != LatticeArg::E8 {
                    return Err(PipelineError::option(
                        "coding",
                        "prefix-gpu codes E8 words; use --lattice e8",
                    ));
                }
                if let (Some(_), Some(_)) = (self.snr_db, target) {
                    return Err(PipelineError::option(
                        "snr-db",
                        "--target-bps and --target-ratio set a rate; give one of them or --snr-db",
                    ));
                }
                if let (CodingArg::Fixed, Some(_)) = (self.coding, target) {
                    return Err(PipelineError::option(
                        "coding",
                        "the fixed-rate form takes its width from --bps (2 to 8 whole bits per \
                         value), not from --target-bps or --target-ratio",
                    ));
                }
                if let (Some(_), Some(t)) = (self.bps, target) {
                    let flag = match t {
                        Target::Bps(_) => "--target-bps",
                        _ => "--target-ratio",
                    };
                    return Err(PipelineError::option(
                        "bps",
                        format!("{flag} sets the lattice's rate too; give one of --bps and {flag}"),
                    ));
                }
                let (coding, bps) = match self.coding {
                    CodingArg::PrefixGpu => (Coding::PREFIX_GPU, target.map(target_bps)),
                    CodingArg::Rans => (Coding::RANS_DEFAULT, target.map(target_bps)),
                    CodingArg::RansGpu => (Coding::RANS_GPU, target.map(target_bps)),
                    CodingArg::Rice => (Coding::RICE_DEFAULT, target.map(target_bps)),
                    // The fixed-rate form takes its bits from --bps alone.
                    CodingArg::Fixed => (Coding::Fixed { bits: 0 }, None),
                };
                LatticeOptions {
                    lattice: match self.lattice {
                        LatticeArg::Z1 => hwz::Lattice::Z1,
                        LatticeArg::A2 => hwz::Lattice::A2,
                        LatticeArg::D4 => hwz::Lattice::D4,
                        LatticeArg::E8 => hwz::Lattice::E8,
                    },
                    rate: match self.snr_db {
                        Some(snr) => LatticeRate::SnrDb(snr),
                        None => LatticeRate::Bps(bps.or(self.bps).unwrap_or(4.0)),
                    },
                    coding: self.chunk.map_or(coding, |c| coding.with_chunk(c)),
                    max_tile: self.max_tile,
                    seed: self.seed,
                    scale_dtype: self.scale_dtype.into(),
                }
                .spec()
            }
        }
    }
}

fn parse_group(s: &str) -> Result<Group> {
    match s {
        "tensor" => Ok(Group::Tensor),
        "row" => Ok(Group::Row),
        n => match n.parse::<u32>() {
            Ok(g) if g >= 1 => Ok(Group::Size(g)),
            _ => Err(PipelineError::option(
                "--group",
                format!("must be `tensor`, `row` or a size >= 1, not `{s}`"),
            )),
        },
    }
}
