//! The `Encoding` vocabulary and the encode/decode of one tensor.

use crate::{HwzError, Result};
use hypercodec_lattice::Lattice;
use hypercodec_scalar::{self as scalar, AffineParams, FloatDtype};
use serde::{Deserialize, Serialize};

/// How one tensor is stored. Serialized in the manifest as an object with a `type` tag.
///
/// Encodings are added, never changed: a changed meaning gets a new tag. A reader meets an
/// unknown tag with [`HwzError::UnknownEncoding`] and unknown fields with
/// [`HwzError::InvalidEncoding`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Encoding {
    /// Plain floats, little-endian. Stream `values`.
    Raw {
        /// Storage type.
        dtype: FloatDtype,
    },
    /// Affine integers with group scales ([`hypercodec_scalar`]). Streams `codes`, `scales`,
    /// and `offsets` when asymmetric.
    Affine {
        /// Bits per code, 1..=8.
        bits: u8,
        /// `"tensor"`, `"row"` or a group size.
        group: scalar::Group,
        /// Symmetric (no offsets) or asymmetric.
        symmetric: bool,
        /// Storage type of scales and offsets.
        scale_dtype: FloatDtype,
    },
    /// Randomized Hadamard transform, per-row RMS scale, nearest lattice point, entropy-coded
    /// or fixed-rate symbols ([`hypercodec_lattice`], [`hypercodec_rice`]). Streams `scales`
    /// and, by coding, `symbols` with `params` + `offsets` (Rice) or `model` + `index` (rANS).
    Lattice {
        /// `z1`, `a2`, `d4` or `e8`.
        lattice: Lattice,
        /// Scale applied to unit-RMS rows before quantization.
        alpha: f32,
        /// RHT tile (power of two dividing the last dimension, ≤ 4096).
        tile: u32,
        /// RHT seed.
        seed: u64,
        /// Storage type of the row scales.
        scale_dtype: FloatDtype,
        /// How the symbols are coded.
        coding: Coding,
    },
    /// Randomized Hadamard transform and per-row scale (as `lattice`), then a bitshift trellis
    /// code at `k` bits per value ([`hypercodec_trellis`]): each row is cut into tail-biting
    /// sequences of `seq` values (the last takes the rest) whose bits are packed LSB-first;
    /// every row starts on a byte. Value `i` of a sequence is `scale · code(state_i)`, `state_i`
    /// the sequence's `l`-bit window that ends with value `i`'s bits (circular). Streams
    /// `scales` (one per row) and `symbols` (`rows · ceil(cols·k / 8)` bytes).
    Trellis {
        /// State bits, 8..=16.
        l: u8,
        /// Bits per value, 1..=8, below `l`.
        k: u8,
        /// Reconstruction scale of the unit code.
        scale: f32,
        /// RHT tile (power of two dividing the last dimension, ≤ 4096).
        tile: u32,
        /// RHT seed.
        seed: u64,
        /// Values per tail-biting sequence (a multiple of 8).
        seq: u32,
        /// Storage type of the row scales.
        scale_dtype: FloatDtype,
        /// Values per trellis state (QTIP's V): 1, the 1MAD code; or 2, a pair of values per
        /// state from two hashes ([`hypercodec_trellis::pair_sums`]), a step of `2k` bits
        /// (`k ≤ 4`, `2k < l`, rows of an even length). Left out of the manifest when 1, so
        /// archives written before it read as 1.
        #[serde(default = "one_value", skip_serializing_if = "is_one_value")]
        v: u8,
    },
    /// Blocks of `block` values along rows mapped to learned prototypes, times a scale per
    /// block, row or tensor, plus an optional sparse residual ([`hypercodec_hdc`]). Streams
    /// `prototypes`, `assignments`, `scales`, and `residual_index` + `residual_values` when the
    /// residual holds entries.
    Codebook {
        /// Values per block, 2..=64.
        block: u32,
        /// Number of prototypes, 1..=65536.
        prototypes: u32,
        /// What one scale covers.
        scale_mode: hypercodec_hdc::ScaleMode,
        /// Storage type of the scales.
        scale_dtype: FloatDtype,
        /// Storage type of the prototypes.
        proto_dtype: FloatDtype,
        /// Layout of the prototype indices.
        assignments: Assignments,
        /// Sparse residual repair.
        residual: Residual,
    },
    /// `U·Vᵀ` with int8 factors and one f32 scale per factor column. Streams `u`
    /// (`rows × rank` i8), `u_scales`, `v` (`cols × rank` i8), `v_scales`.
    #[serde(rename = "lowrank")]
    LowRank {
        /// Rank, 1..=min(rows, cols, 1024).
        rank: u32,
    },
    /// Zeros except `count` stored values. Streams `indices` (delta varints) and `values`.
    Sparse {
        /// Stored entries.
        count: u64,
        /// Storage type of the values.
        dtype: FloatDtype,
    },
    /// Row blocks of `block_rows` rows (the last may be shorter), each a tensor of its own
    /// with its own encoding (`parts`, one per block). Streams `index` (per part, per stream of
    /// the part's encoding in order, its decoded length as u64) and `payload` (those streams
    /// concatenated).
    Mixed {
        /// Rows per block.
        block_rows: u64,
        /// One encoding per block, top to bottom.
        parts: Vec<Encoding>,
    },
    /// A dense `base` encoding with `count` values replaced by exact exceptions (per-weight
    /// precision). Streams `index` + `payload` for the base as in `mixed`, and `indices` +
    /// `values` as in `sparse`.
    Exceptions {
        /// The dense low-precision encoding.
        base: Box<Encoding>,
        /// Number of exceptions.
        count: u64,
        /// Storage type of the exception values.
        dtype: FloatDtype,
    },
}

/// Layout of codebook prototype indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Assignments {
    /// `ceil(log2 prototypes)` bits each, LSB-first.
    Packed,
    /// `(index, run − 1)` varint pairs.
    Rle,
}

/// Sparse residual of a codebook encoding: the `count` largest errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Residual {
    /// Stored corrections.
    pub count: u64,
    /// `int8` (with one f32 scale) or `f32`.
    pub dtype: hypercodec_hdc::ResidualDtype,
}

/// How lattice symbols are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Coding {
    /// Rice codes, one `k` per chunk of `chunk` symbols.
    Rice {
        /// Symbols per chunk.
        chunk: u32,
    },
    /// Interleaved rANS with a static per-tensor model.
    Rans {
        /// Symbols per chunk (a multiple of the lattice dimension).
        chunk: u32,
        /// Interleaved states per chunk.
        lanes: u8,
        /// Probability precision in bits.
        prob_bits: u8,
    },
    /// Every symbol in `bits` bits, packed LSB-first (the execution form).
    Fixed {
        /// Bits per symbol, 2..=8.
        bits: u8,
    },
    /// E8 only: lane-interleaved canonical prefix codes in chunks of eight rows, or of `span`
    /// groups of eight rows where a row is one segment (`hypercodec_rice::prefix`), what a GPU
    /// warp decodes a word a lane inside the GEMV.
    Prefix {
        /// Longest single code, 8..=12 bits.
        limit: u8,
        /// Longest code of a pair of symbols, or 0 for singles only.
        pair_limit: u8,
        /// 32-column blocks a chunk holds of each of its eight rows.
        segment: u32,
        /// Groups of eight rows a chunk spans, where a row is one segment (absent: 1).
        #[serde(default = "one_u32", skip_serializing_if = "is_one_u32")]
        span: u32,
    },
}

impl Coding {
    /// rANS with the workspace defaults: chunks of 2^18 symbols (about 64 chunks for a 4096²
    /// tensor, enough for every core), 32 lanes (a GPU warp), 14-bit probabilities.
    pub const RANS_DEFAULT: Coding = Coding::Rans {
        chunk: 1 << 18,
        lanes: 32,
        prob_bits: 14,
    };
    /// Rice with the workspace default of 2048 symbols per chunk.
    pub const RICE_DEFAULT: Coding = Coding::Rice { chunk: 2048 };
    /// rANS shaped for the CUDA GEMV that decodes it (`hypercodec-kernels-cuda`): 32 lanes (a
    /// warp), 12-bit probabilities (a context's decode slots fit 16 KB of shared memory), and
    /// chunks of whole rows of about [`GPU_CHUNK_SYMBOLS`] symbols, thousands of chunks for a
    /// large matrix, one warp each (the chunk table costs about 0.065 bits per value). In a
    /// template the chunk is 0: [`Encoding::for_matrix`] sets it from the row length.
    pub const RANS_GPU: Coding = Coding::Rans {
        chunk: 0,
        lanes: 32,
        prob_bits: 12,
    };

    /// Prefix codes shaped for the GPU ([`Coding::Prefix`]): singles of at most 8 bits and
    /// pairs of at most 12 (five table lookups a word), chunks of eight rows of about
    /// [`prefix_gpu_chunk`] symbols (2^13 or 2^14, by the matrix; of several groups of eight
    /// rows where a row is shorter).
    /// In a template the segment and span are 0: [`Encoding::for_matrix`] sets them from the
    /// row length.
    pub const PREFIX_GPU: Coding = Coding::Prefix {
        limit: 8,
        pair_limit: 12,
        segment: 0,
        span: 0,
    };

    /// The same coding with `chunk` symbols per chunk (fixed-rate coding has no chunks; prefix
    /// codes take chunks of eight rows of `chunk / 8` symbols rounded down to whole 32-column
    /// blocks, or longer where a row would hold more than 16 such segments (the GPU kernels sum
    /// at most 16), and where a row is shorter, of as many groups of eight rows as fit those
    /// `256·⌊chunk/256⌋` symbols: span 0 here, set by [`Encoding::for_matrix`]).
    pub fn with_chunk(self, chunk: u32) -> Coding {
        match self {
            Coding::Rice { .. } => Coding::Rice { chunk },
            Coding::Rans {
                lanes, prob_bits, ..
            } => Coding::Rans {
                chunk,
                lanes,
                prob_bits,
            },
            f @ Coding::Fixed { .. } => f,
            Coding::Prefix {
                limit, pair_limit, ..
            } => Coding::Prefix {
                limit,
                pair_limit,
                segment: (chunk / 256).max(1),
                // Set by `Encoding::for_matrix` from the row length.
                span: 0,
            },
        }
    }

    /// The prefix coder's parameters, for a [`Coding::Prefix`].
    pub fn prefix_params(&self) -> Option<hypercodec_rice::prefix::PrefixParams> {
        match *self {
            Coding::Prefix {
                limit,
                pair_limit,
                segment,
                span,
            } => Some(hypercodec_rice::prefix::PrefixParams {
                limit,
                pair_limit,
                segment: segment as usize,
                span: span as usize,
            }),
            _ => None,
        }
    }

    /// Short name: `rice`, `rans`, `rans-gpu` ([`Coding::RANS_GPU`]'s shape), `fixed4`,
    /// `prefix-gpu` ([`Coding::PREFIX_GPU`]'s codes), `prefix10` (singles of 10 bits),
    /// `prefix8p11` (pairs of 11), ...
    pub fn label(&self) -> String {
        match self {
            Coding::Rice { .. } => "rice".into(),
            Coding::Rans {
                lanes: 32,
                prob_bits: 12,
                ..
            } => "rans-gpu".into(),
            Coding::Rans { .. } => "rans".into(),
            Coding::Fixed { bits } => format!("fixed{bits}"),
            Coding::Prefix {
                limit: 8,
                pair_limit: 12,
                ..
            } => "prefix-gpu".into(),
            Coding::Prefix {
                limit, pair_limit, ..
            } => match pair_limit {
                0 => format!("prefix{limit}"),
                p => format!("prefix{limit}p{p}"),
            },
        }
    }
}

/// The symbols a GPU-shaped rANS chunk aims at ([`Coding::RANS_GPU`]), and the most that a
/// chunk of [`Coding::PREFIX_GPU`] aims at ([`prefix_gpu_chunk`]).
pub const GPU_CHUNK_SYMBOLS: usize = 1 << 14;

/// The fewest symbols a chunk of [`Coding::PREFIX_GPU`] aims at: 2^13, where each lane's last,
/// partly read words cost about 0.04 bits a value more than at 2^14 (2^12 would cost 0.12: 0.5–0.9
/// dB of a 4096 × 4096 layer's output error at 4 bits in two H100 runs, for 1.8× the speed there
/// instead of 1.5×).
pub const PREFIX_GPU_MIN_CHUNK: usize = 1 << 13;

/// The chunks a matrix coded as [`Coding::PREFIX_GPU`] should have at least, where chunks of
/// [`PREFIX_GPU_MIN_CHUNK`] symbols or more allow: about 23 an SM of a 132-SM GPU, one warp's
/// serial decode each. Fewer leave the SMs waiting on each lane's chain of table lookups.
pub const PREFIX_GPU_CHUNKS: usize = 3072;

/// Matrices of fewer values than this (2^22: 1024 × 4096) keep chunks of [`GPU_CHUNK_SYMBOLS`]
/// in [`Coding::PREFIX_GPU`]: no chunk size makes a GPU busy on them, and in a small model their
/// bits weigh more.
pub const PREFIX_GPU_SMALL: u64 = 1 << 22;

/// The symbols a chunk of [`Coding::PREFIX_GPU`] aims at in a `rows × cols` matrix:
/// [`GPU_CHUNK_SYMBOLS`] (2^14), halved down to [`PREFIX_GPU_MIN_CHUNK`] (2^13) while the
/// matrix would have fewer than [`PREFIX_GPU_CHUNKS`] chunks, if it has [`PREFIX_GPU_SMALL`]
/// values or more and its rows hold the halved chunk's share of a row (`cols ≥ chunk / 16`: 1024
/// columns). The GEMV decodes a chunk a warp, each lane a chain of dependent lookups as long as
/// the chunk, so a matrix of few long chunks waits on that chain: 4096 × 4096 ran 1.5× faster in
/// chunks of 2^13 than of 2^14 (H200, 27.5 against 18.4–20.6 µs), 8192 × 8192 no faster
/// (docs/eval/cuda_rans.md). So 8192 × 8192 and 14336 × 4096 keep 2^14; 11008 × 4096,
/// 4096 × 4096 and 1024 × 4096 take 2^13. Shorter rows keep their chunks spanning several
/// groups of eight rows, which cost them the least bits: halved, 576-value rows would go from
/// spans of 3 groups to 1 (1536 × 576 at 4 bits: 22.29 dB against 21.75), so a 49152 × 576
/// embedding keeps 2^14.
pub fn prefix_gpu_chunk(rows: u64, cols: u64) -> usize {
    let values = rows.saturating_mul(cols);
    let mut chunk = GPU_CHUNK_SYMBOLS;
    while chunk > PREFIX_GPU_MIN_CHUNK
        && values >= PREFIX_GPU_SMALL
        && values < (PREFIX_GPU_CHUNKS * chunk) as u64
        && cols >= (chunk / 16) as u64
    {
        chunk /= 2;
    }
    chunk
}

/// Highest tensor rank (PyTorch's own limit is 25; weights use at most 5).
pub const MAX_RANK: usize = 8;
/// Most elements in one tensor: 2^40 (4 TiB of f32), beyond any single weight today.
pub const MAX_ELEMENTS: u64 = 1 << 40;

fn one_u32() -> u32 {
    1
}

fn is_one_u32(v: &u32) -> bool {
    *v == 1
}

fn one_value() -> u8 {
    1
}

fn is_one_value(v: &u8) -> bool {
    *v == 1
}

/// The `type` tags this build knows.
pub const KNOWN_ENCODINGS: &[&str] = &[
    "raw",
    "affine",
    "lattice",
    "trellis",
    "codebook",
    "lowrank",
    "sparse",
    "mixed",
    "exceptions",
];

/// The fewest probability bits [`Encoding::sized_for`] gives CPU-shaped rANS: 2048 slots a
/// context, for alphabets of up to 257 symbols.
pub const MIN_SIZED_PROB_BITS: u8 = 11;

/// An entropy-coded `symbols` stream holds at least one byte per this many symbols; writers pad
/// shorter ones (only near-constant tensors are that compressible). It bounds what a reader
/// allocates per stored byte, like [`crate::MAX_ZSTD_EXPANSION`] does for zstd.
pub const MAX_SYMBOLS_PER_BYTE: u64 = 32;
/// Largest rANS model stream: 16 contexts of 257 frequencies in 3-byte varints, rounded up.
pub const MAX_MODEL_LEN: u64 = 16 << 10;

/// The decoded length a stream must have: exactly `min` when `min == max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLen {
    /// Fewest bytes.
    pub min: u64,
    /// Most bytes.
    pub max: u64,
}

impl StreamLen {
    /// Exactly `n` bytes.
    pub const fn exact(n: u64) -> Self {
        StreamLen { min: n, max: n }
    }

    /// Whether `n` bytes are allowed.
    pub fn allows(&self, n: u64) -> bool {
        (self.min..=self.max).contains(&n)
    }
}

/// Stream roles.
pub mod role {
    /// Raw float values.
    pub const VALUES: &str = "values";
    /// Packed integer codes.
    pub const CODES: &str = "codes";
    /// Group scales.
    pub const SCALES: &str = "scales";
    /// Group offsets (asymmetric affine), chunk offsets (Rice).
    pub const OFFSETS: &str = "offsets";
    /// Coded lattice symbols.
    pub const SYMBOLS: &str = "symbols";
    /// Per-chunk Rice parameters.
    pub const PARAMS: &str = "params";
    /// The rANS model.
    pub const MODEL: &str = "model";
    /// The rANS chunk table.
    pub const INDEX: &str = "index";
    /// Codebook prototypes.
    pub const PROTOTYPES: &str = "prototypes";
    /// Codebook prototype indices.
    pub const ASSIGNMENTS: &str = "assignments";
    /// Positions of residual corrections.
    pub const RESIDUAL_INDEX: &str = "residual_index";
    /// Values of residual corrections.
    pub const RESIDUAL_VALUES: &str = "residual_values";
    /// Low-rank left factor.
    pub const U: &str = "u";
    /// Scales of the left factor's columns.
    pub const U_SCALES: &str = "u_scales";
    /// Low-rank right factor.
    pub const V: &str = "v";
    /// Scales of the right factor's columns.
    pub const V_SCALES: &str = "v_scales";
    /// Positions of sparse values.
    pub const INDICES: &str = "indices";
    /// Concatenated inner streams of a nested encoding.
    pub const PAYLOAD: &str = "payload";
}

impl Encoding {
    /// The encoding's `type` tag.
    pub fn tag(&self) -> &'static str {
        match self {
            Encoding::Raw { .. } => "raw",
            Encoding::Affine { .. } => "affine",
            Encoding::Lattice { .. } => "lattice",
            Encoding::Trellis { .. } => "trellis",
            Encoding::Codebook { .. } => "codebook",
            Encoding::LowRank { .. } => "lowrank",
            Encoding::Sparse { .. } => "sparse",
            Encoding::Mixed { .. } => "mixed",
            Encoding::Exceptions { .. } => "exceptions",
        }
    }

    /// A short human label, e.g. `raw-bf16` or `affine-int4-g128-asym-f16`.
    pub fn label(&self) -> String {
        match self {
            Encoding::Raw { dtype } => format!("raw-{dtype}"),
            Encoding::Affine {
                bits,
                group,
                symmetric,
                scale_dtype,
            } => format!(
                "affine-int{bits}-{group}-{}-{scale_dtype}",
                if *symmetric { "sym" } else { "asym" }
            ),
            Encoding::Lattice {
                lattice, coding, ..
            } => format!("lattice-{lattice}-{}", coding.label()),
            Encoding::Codebook {
                block,
                prototypes,
                scale_mode,
                residual,
                ..
            } => format!(
                "codebook-b{block}-k{prototypes}-{}{}",
                scale_mode.name(),
                if residual.count > 0 {
                    format!("-r{}", residual.dtype.name())
                } else {
                    String::new()
                }
            ),
            Encoding::Trellis { l, k, v: 2, .. } => format!("trellis-l{l}-k{k}-v2"),
            Encoding::Trellis { l, k, .. } => format!("trellis-l{l}-k{k}"),
            Encoding::LowRank { rank } => format!("lowrank-r{rank}"),
            Encoding::Sparse { dtype, .. } => format!("sparse-{dtype}"),
            Encoding::Mixed { parts, .. } => format!("mixed-{}", parts.len()),
            Encoding::Exceptions { base, .. } => format!("{}+exceptions", base.label()),
        }
    }

    /// The affine parameters of an affine encoding.
    pub fn affine_params(&self) -> Option<AffineParams> {
        match *self {
            Encoding::Affine {
                bits,
                group,
                symmetric,
                scale_dtype,
            } => Some(AffineParams {
                bits,
                group,
                symmetric,
                scale_dtype,
            }),
            _ => None,
        }
    }

    /// The affine encoding of `params`.
    pub fn affine(params: AffineParams) -> Self {
        Encoding::Affine {
            bits: params.bits,
            group: params.group,
            symmetric: params.symmetric,
            scale_dtype: params.scale_dtype,
        }
    }

    /// This encoding with its lattice scale α replaced (other encodings are returned as they are).
    pub fn with_alpha(&self, alpha: f32) -> Self {
        let mut e = self.clone();
        e.set_alpha(alpha);
        e
    }

    fn set_alpha(&mut self, alpha: f32) {
        if let Encoding::Lattice { alpha: a, .. } = self {
            *a = alpha;
        }
    }

    /// The storage type of the scales of an affine, lattice, trellis or codebook encoding.
    pub fn scale_dtype(&self) -> Option<FloatDtype> {
        match self {
            Encoding::Affine { scale_dtype, .. }
            | Encoding::Lattice { scale_dtype, .. }
            | Encoding::Trellis { scale_dtype, .. }
            | Encoding::Codebook { scale_dtype, .. } => Some(*scale_dtype),
            _ => None,
        }
    }

    /// This affine, lattice, trellis or codebook encoding with its scales stored as `dtype` (other
    /// encodings are returned as they are).
    pub fn with_scale_dtype(&self, dtype: FloatDtype) -> Self {
        let mut e = self.clone();
        if let Encoding::Affine { scale_dtype, .. }
        | Encoding::Lattice { scale_dtype, .. }
        | Encoding::Trellis { scale_dtype, .. }
        | Encoding::Codebook { scale_dtype, .. } = &mut e
        {
            *scale_dtype = dtype;
        }
        e
    }

    /// This lattice encoding with entropy-coded chunks of exactly `block_rows` rows of a
    /// tensor whose rows hold `cols` values, so that every block of `block_rows` rows decodes
    /// alone ([`crate::TensorView::decode_rows_into`] then reads only its own chunk). The chunk
    /// is capped at the coders' largest (2^24 symbols); fixed-rate and non-lattice encodings
    /// are returned as they are. Each chunk costs its table entry (rANS: 4·(1 + lanes) bytes,
    /// Rice: 5 bytes), so blocks of 32 rows of 4096 values add about 0.004 bps to rANS.
    pub fn with_row_aligned_chunks(&self, cols: u64, block_rows: u64) -> Self {
        let mut e = self.clone();
        if let Encoding::Lattice {
            lattice, coding, ..
        } = &mut e
        {
            let spr = hypercodec_lattice::symbols_per_row(*lattice, cols as usize) as u64;
            let rows_cap = ((1u64 << 24) / spr.max(1)).max(1);
            let chunk = (spr * block_rows.clamp(1, rows_cap)).clamp(lattice.dim() as u64, 1 << 24);
            *coding = coding.with_chunk(chunk as u32);
        }
        e
    }

    /// The encoding as the codec writes a tensor of `rows × cols`: rANS of the CPU's shape
    /// (asked at more than the GPU shape's 12 probability bits) with at most ⌈log₂(symbols /
    /// 64)⌉ bits, at least [`MIN_SIZED_PROB_BITS`], and never the GPU shape's 12 with its 32
    /// lanes (11 instead: the label `rans-gpu` stays the GPU shape's). A model finer than its
    /// symbols can fill decodes through `2^prob_bits` slots a context, held by the runtime: at
    /// 14 bits a 256×256 E8 layer held 330 KB for 256 KB of f32 weights. Measured
    /// (`hypercodec compress gaussian:R×C:1 o.hwz --encoding lattice --bps B`), 11 bits where
    /// the old rule (⌈log₂(symbols / 4)⌉, 13 for 12) gave 13 or 14 cost nothing: 128² at 4 bits
    /// 21.75 → 21.79 dB, 256² at 2 / 4 / 6 / 8 bits 9.10 → 9.11, 21.79 → 21.80, 33.65 → 33.70,
    /// 44.59 → 44.66 dB (a smaller model stream), 512² at 4 bits 22.72 → 22.71 dB;
    /// EfficientNet-Lite0 at 3 bits 16.03 → 16.04 dB.
    pub fn sized_for(&self, rows: u64, cols: u64) -> Self {
        let mut e = self.clone();
        if let Encoding::Lattice {
            lattice,
            coding: Coding::Rans {
                lanes, prob_bits, ..
            },
            ..
        } = &mut e
        {
            if *prob_bits > 12 {
                let spr = hypercodec_lattice::symbols_per_row(*lattice, cols as usize) as u64;
                let symbols = rows.saturating_mul(spr);
                let fit = (symbols / 64).max(1).next_power_of_two().trailing_zeros() as u8;
                let mut p = fit.clamp(MIN_SIZED_PROB_BITS, *prob_bits);
                if p == 12 && *lanes == 32 {
                    p = 11;
                }
                *prob_bits = p;
            }
        }
        e
    }

    /// The encoding of a template for a matrix of `rows × cols`: the RHT tile
    /// ([`tile_for`](crate::tile_for) of `cols` up to `max_tile`); for
    /// [`Coding::RANS_GPU`]'s chunk 0, chunks of whole rows (as many as fit [`GPU_CHUNK_SYMBOLS`], at least one);
    /// for a [`Coding::Prefix`] of segment 0, chunks of about [`prefix_gpu_chunk`] symbols (eight rows,
    /// or where a row is one segment, as many groups of eight rows as fit); of span 0 (what
    /// [`Coding::with_chunk`] leaves), as many groups as fit the chunk where a row is one segment;
    /// for trellis pairs (`v = 2`) on rows of an odd length, one value per state at its own
    /// calibrated scale (pairs need an even length).
    pub fn for_matrix(&self, rows: u64, cols: u64, max_tile: u32) -> Self {
        let e = self.with_tile(crate::tile_for(cols as usize, max_tile as usize) as u32);
        match &e {
            Encoding::Trellis { l, k, v: 2, .. } if cols % 2 == 1 => {
                let (l, k) = (*l, *k);
                let mut one = e;
                if let Encoding::Trellis { v, scale, .. } = &mut one {
                    *v = 1;
                    *scale = hypercodec_trellis::TrellisParams::default_scale(l, k);
                }
                one
            }
            Encoding::Lattice {
                lattice,
                coding: c @ Coding::Rans { .. },
                ..
            } if *c == Coding::RANS_GPU => {
                let spr = hypercodec_lattice::symbols_per_row(*lattice, cols as usize);
                e.with_row_aligned_chunks(cols, (GPU_CHUNK_SYMBOLS / spr.max(1)).max(1) as u64)
            }
            Encoding::Lattice {
                coding:
                    Coding::Prefix {
                        limit,
                        pair_limit,
                        segment,
                        span,
                    },
                ..
            } if *segment == 0 || *span == 0 => {
                use hypercodec_rice::prefix::{PrefixParams, BLOCK_WORDS, GROUP_ROWS, WORD};
                let words = cols.div_ceil(8) as usize;
                // Chunks of the size the matrix's values call for, or of what the segment
                // given holds.
                let (segment, aim) = match *segment as usize {
                    0 => {
                        let aim = prefix_gpu_chunk(rows, cols);
                        (PrefixParams::segment_for(words, aim), aim)
                    }
                    // At most 16 segments a row: the kernels sum no more.
                    s => (
                        PrefixParams::segment_taking(words, s),
                        s * GROUP_ROWS * BLOCK_WORDS * WORD,
                    ),
                };
                let span = match *span {
                    0 => PrefixParams::span_for(words, segment, aim) as u32,
                    n => n,
                };
                let mut e = e.clone();
                if let Encoding::Lattice { coding, .. } = &mut e {
                    *coding = Coding::Prefix {
                        limit: *limit,
                        pair_limit: *pair_limit,
                        segment: segment as u32,
                        span,
                    };
                }
                e
            }
            _ => e,
        }
    }

    /// This encoding with its RHT tile replaced (other encodings are returned as they are).
    pub fn with_tile(&self, tile: u32) -> Self {
        let mut e = self.clone();
        e.set_tile(tile);
        e
    }

    fn set_tile(&mut self, tile: u32) {
        if let Encoding::Lattice { tile: t, .. } | Encoding::Trellis { tile: t, .. } = self {
            *t = tile;
        }
    }

    /// The trellis encoding of `k` bits per value at state bits `l` with the calibrated scale,
    /// RHT tiles of `tile` and `seed`, sequences of 1024 values and f16 row scales.
    pub fn trellis(l: u8, k: u8, tile: u32, seed: u64) -> Self {
        Encoding::Trellis {
            l,
            k,
            scale: hypercodec_trellis::TrellisParams::default_scale(l, k),
            tile,
            seed,
            seq: 1024,
            scale_dtype: FloatDtype::F16,
            v: 1,
        }
    }

    /// [`Encoding::trellis`] with a pair of values per state (`v = 2`) at its calibrated scale.
    pub fn trellis_pairs(l: u8, k: u8, tile: u32, seed: u64) -> Self {
        Encoding::Trellis {
            l,
            k,
            scale: hypercodec_trellis::TrellisParams::pair_scale(l, k),
            tile,
            seed,
            seq: 1024,
            scale_dtype: FloatDtype::F16,
            v: 2,
        }
    }

    /// The lattice pipeline parameters of a lattice encoding.
    pub fn lattice_params(&self) -> Option<hypercodec_lattice::LatticeParams> {
        match *self {
            Encoding::Lattice {
                lattice,
                alpha,
                tile,
                seed,
                coding,
                ..
            } => Some(hypercodec_lattice::LatticeParams {
                lattice,
                alpha,
                tile: tile as usize,
                seed,
                fixed_bits: match coding {
                    Coding::Fixed { bits } => Some(bits),
                    _ => None,
                },
                dither: false,
            }),
            _ => None,
        }
    }
}

pub(crate) fn rans_params(
    chunk: u32,
    lanes: u8,
    prob_bits: u8,
) -> hypercodec_rice::rans::RansParams {
    hypercodec_rice::rans::RansParams {
        chunk: chunk as usize,
        lanes: lanes as usize,
        prob_bits,
    }
}

/// The number of elements of `shape`, checked against [`MAX_RANK`] and [`MAX_ELEMENTS`].
pub fn element_count(tensor: &str, shape: &[u64]) -> Result<u64> {
    if shape.len() > MAX_RANK {
        return Err(HwzError::LimitExceeded {
            what: "tensor rank",
            value: shape.len() as u64,
            max: MAX_RANK as u64,
        });
    }
    let overflow = || HwzError::ShapeOverflow {
        tensor: tensor.to_string(),
        shape: shape.to_vec(),
        max: MAX_ELEMENTS,
    };
    let n = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    if n > MAX_ELEMENTS {
        return Err(overflow());
    }
    Ok(n)
}

/// The `rows × cols` matrix view of a tensor: `rows` is the first dimension (a linear layer's
/// or a convolution's output channels), `cols` everything after it, so a conv kernel
/// `[Cout, Cin, kh, kw]` is `Cout` rows of `Cin·kh·kw` values (the convention of GPTQ/AWQ-style
/// tools). A 1-D tensor is one row; a scalar is `1 × 1`. Rows, scale groups, RHT tiles and row
/// blocks all run along this view. (Archives of format version 1 viewed a tensor of rank ≥ 3
/// by its last dimension instead; [`legacy_matrix_shape`] gives that view.)
pub fn matrix_view(shape: &[u64], n: u64) -> (u64, u64) {
    match shape.len() {
        0 => (1, 1),
        1 => n
            .checked_div(shape[0])
            .map_or((0, 0), |rows| (rows, shape[0])),
        _ => {
            let cols = shape[1..].iter().fold(1u64, |a, &d| a.saturating_mul(d));
            n.checked_div(cols).map_or((0, 0), |rows| (rows, cols))
        }
    }
}

/// The 2-D shape under which a format-version-1 archive coded a tensor of rank ≥ 3:
/// `[prod(shape[..−1]), shape[−1]]` (rows along every dimension but the last). Other ranks
/// are returned as they are.
pub fn legacy_matrix_shape(shape: &[u64]) -> Vec<u64> {
    match shape.split_last() {
        Some((&last, rest)) if rest.len() >= 2 => {
            vec![rest.iter().fold(1u64, |a, &d| a.saturating_mul(d)), last]
        }
        _ => shape.to_vec(),
    }
}

/// A trellis encoder of whole rows that stands in for the CPU's (`hypercodec_trellis::Encoder`;
/// a GPU's, in the Python wheel): given `rows × cols` values (each row after its RHT and
/// divided by its RMS), the sequence length and the code, it writes the bits the CPU encoder
/// would (`rows · ceil(cols·K/8)` bytes, each row cut by `hypercodec_trellis::row_sequences`),
/// or says why it cannot (then the CPU encodes; the CUDA encoders decline pairs, `v = 2`). With error-feedback rounding (calibrated
/// trellis) it is called once per sequence position, with every row's sequence (`cols` and
/// `seq` the sequence's length), the error fed forward on the CPU in between.
#[derive(Clone, Copy)]
pub struct TrellisRowsEncoder(pub TrellisRowsFn);

/// The function of a [`TrellisRowsEncoder`]: `(values, rows, cols, seq, params, bits)`.
pub type TrellisRowsFn = fn(
    &[f32],
    usize,
    usize,
    usize,
    &hypercodec_trellis::TrellisParams,
    &mut [u8],
) -> std::result::Result<(), String>;

impl std::fmt::Debug for TrellisRowsEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TrellisRowsEncoder(..)")
    }
}

impl PartialEq for TrellisRowsEncoder {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::fn_addr_eq(self.0, other.0)
    }
}

impl Eq for TrellisRowsEncoder {}

/// Options of [`crate::encode`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Store NaN and infinities in raw encodings instead of failing. By default, `false`:
    /// non-finite input is an error.
    pub allow_non_finite: bool,
    /// Which RMS sets an entropy-coded lattice row's step (an encoder choice: the format and
    /// the decoder are the same either way).
    pub lattice_scale: LatticeScale,
    /// Trellis rows coded by this encoder instead of the CPU's (the same bits). By default,
    /// none.
    pub trellis_rows: Option<TrellisRowsEncoder>,
}

/// The RMS that sets the step of an entropy-coded lattice row, `step = scale / α`.
///
/// Only the encoder chooses: each row still stores its scale, so decoding is unchanged.
/// Fixed-rate lattice codes always use [`LatticeScale::Row`] (their codes have a fixed range).
/// Measured (`hypercodec compress IN out.hwz --encoding lattice --bps 3 [--lattice-scale
/// tensor]`, E8 + rANS; `python -m hypercodec eval --ablation`): `Tensor` lowers the weights'
/// total squared error — EfficientNet-Lite0 2.969 → 2.921 bits per value at 16.14 → 16.19 dB,
/// SmolLM2-135M 2.993 → 2.980 at 16.88 → 16.91 dB — yet raises SmolLM2's perplexity (50.2
/// unquantized) from 153 to 197 at 3 bits and from 61.4 to 63.8 at 4: small rows matter to a
/// language model more than their squared error says. Hence `Row` by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LatticeScale {
    /// Each row's own RMS: every row gets the same SNR (the default).
    #[default]
    Row,
    /// The RMS of all the values encoded (the tensor, or a `mixed` part; rate control's row
    /// sample uses its own) for every nonzero row: every row gets the same squared error,
    /// which minimizes the total squared error at an entropy-coded rate (the classic result
    /// for entropy-coded quantizers: one step for all components), as the entropy coder
    /// spends fewer bits on small rows.
    Tensor,
}

/// One tensor encoded: its encoding and its streams by role, ready for the writer.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedTensor {
    /// The encoding.
    pub encoding: Encoding,
    /// `(role, bytes)` in the order of [`Encoding::stream_lens`].
    pub streams: Vec<(&'static str, Vec<u8>)>,
}

impl EncodedTensor {
    /// Stored bytes of all streams before any container-level compression.
    pub fn payload_bytes(&self) -> u64 {
        self.streams.iter().map(|(_, b)| b.len() as u64).sum()
    }

    /// Bytes of all streams of this tensor of `numel` values as a writer with `compression`
    /// stores them (the writer's rule: each stream's zstd form where that is smaller, and the
    /// tensor's floor of a byte per 64 values kept by storing its smallest streams as they
    /// are). This is what a planner compares: zstd shrinks integer codes whose values cluster
    /// (a three-level tensor's INT8 codes to under half) and leaves entropy-coded streams as
    /// they are. A tensor the writer would refuse counts its streams' own bytes.
    pub fn stored_bytes(&self, numel: u64, compression: crate::Compression) -> u64 {
        match crate::write::stored_forms(self, numel, compression) {
            Ok(forms) => crate::write::stored_len(self, &forms),
            Err(_) => self.payload_bytes(),
        }
    }
}

pub(crate) fn scalar_err(tensor: &str) -> impl Fn(scalar::ScalarError) -> HwzError + '_ {
    move |source| HwzError::Scalar {
        tensor: tensor.to_string(),
        source,
    }
}
