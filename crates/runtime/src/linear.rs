//! [`CompressedLinear`]: `y = x·Wᵀ (+ b)` on the stored form of `W`.

use crate::kernels::{self, E8Activation};
use crate::{hwz, Result, RuntimeError};
use hwz::{AssignmentsRef, Coding, Encoding, Group, Parts, Symbols, TensorView};
use hypercodec_hdc::residual::Corrections;
use hypercodec_hdc::{pack, ScaleMode};
use hypercodec_lattice::{Lattice, Rht};
use hypercodec_scalar::{self as scalar, FloatDtype};
use rayon::prelude::*;
use std::ops::Range;

/// Values of `W` a batch > 1 decodes at a time per thread (1 MB of f32: an L2-sized tile).
const TILE_VALUES: usize = 1 << 20;
/// Values in a tile of a transposed weight ([`CompressedLinear::transposed`]) whose rows decode
/// on their own: 128 KiB of f32 at batch 1, doubled for 2, 4 and 8 rows and more.
const TRANSPOSED_TILE_VALUES: usize = 1 << 15;
/// Activation rows a transposed weight runs at a time (each task holds a sum of this many rows
/// of outputs).
const TRANSPOSED_BATCH: usize = 64;
/// Batches up to this size run the batch-1 path once per activation row (affine codes: every
/// row at once), larger ones decode tiles for a GEMM; by kind ([`small_batch`]), where the
/// crossover was measured on 4096² (`hypercodec benchmark --runtime --batches 2,4,8,16`).
const SMALL_BATCH: usize = 16;
/// Affine codes: unpacked once for up to this many activation rows
/// ([`kernels::affine_rows`]); at 16 the GEMM on decoded tiles is faster.
const AFFINE_ROWS_BATCH: usize = 8;
/// Trellis rows decode their codes once for up to four activation rows
/// ([`kernels::trellis_rows_dot`]), as do 4-bit E8 words ([`kernels::e8_fixed_dots`]); other
/// fixed-rate lattice words are decoded once per activation row; above
/// these batches decoding tiles once for the GEMM is faster (4096², `tcq4`: 0.79–0.84× dense
/// at 8 rows against the GEMM's 0.58–0.60×; at 16, 0.50× against 0.67×).
const TRELLIS_ROWS_BATCH: usize = 8;
const LATTICE_ROWS_BATCH: usize = 8;

/// Trellis rows shorter than this take the GEMM on decoded tiles above 4 activation rows: the
/// wrapped windows at each sequence's start (a scalar decode per value) weigh more in them
/// (256×256 at 5–8 rows: 111–121 µs against the GEMM's 81–84; 576×1536 at 8: 0.93× dense
/// against 0.84×).
const TRELLIS_SHORT_ROW: usize = 1024;

/// The largest batch that takes the batch-1 kernels (per row, or all rows at once for affine
/// codes) rather than decoded tiles and a GEMM, for a weight of `cols` columns.
fn small_batch(kind: Kind, cols: usize) -> usize {
    match kind {
        Kind::Affine { .. } => AFFINE_ROWS_BATCH,
        Kind::Trellis if cols < TRELLIS_SHORT_ROW => 4,
        Kind::Trellis => TRELLIS_ROWS_BATCH,
        Kind::E8Fixed | Kind::LatticeWords => LATTICE_ROWS_BATCH,
        _ => SMALL_BATCH,
    }
}
/// Work (values of `W`) below which rows are not split into another task.
const TASK_MIN_VALUES: usize = 1 << 15;

/// How a [`CompressedLinear`] is loaded. By default, nothing is converted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Convert an entropy-coded lattice tensor (rANS or Rice) at load into the fixed-rate form
    /// of this many bits per symbol (2..=8; E8, D4, Z1), for speed. This re-quantizes: points
    /// outside the fixed-rate box are clipped to its nearest point, so it is opt-in and the
    /// SNR of the converted weight against the stored one is measured
    /// ([`CompressedLinear::conversion_snr_db`]). By default, `None`.
    pub fixed_bits: Option<u8>,
}

impl LoadOptions {
    /// These options for one tensor of a whole model: `fixed_bits` is kept only where it
    /// applies (an entropy-coded lattice with a fixed-rate form), so that a model mixing
    /// encodings (a plan's, or a lattice rate's fallbacks) converts its entropy-coded tensors
    /// and loads the rest as they are, where [`CompressedLinear::new`] refuses the option for
    /// any other tensor.
    pub fn for_tensor(self, view: &TensorView<'_>) -> LoadOptions {
        let applies = match view.encoding() {
            Encoding::Lattice {
                lattice, coding, ..
            } => !matches!(coding, Coding::Fixed { .. }) && lattice.has_fixed(),
            _ => false,
        };
        LoadOptions {
            fixed_bits: self.fixed_bits.filter(|_| applies),
        }
    }
}

/// The batch-1 route an operator takes (larger batches always decode row tiles and run a GEMM,
/// except [`Path::Sparse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Path {
    /// Stored floats dotted as they are.
    Dense,
    /// Affine codes dotted in groups without unpacking them (every width; groups and rows of
    /// whole lane words that start on a byte).
    AffineFused {
        /// Bits per code.
        bits: u8,
    },
    /// Affine codes unpacked a row at a time (rows or groups that are not whole lane words).
    AffineUnpacked {
        /// Bits per code.
        bits: u8,
    },
    /// Fixed-rate E8 words rebuilt in registers against `RHT(x)`.
    E8Fixed {
        /// Bits per symbol.
        bits: u8,
    },
    /// Fixed-rate Z1/D4 words decoded a row at a time against `RHT(x)`.
    LatticeWords,
    /// Entropy-coded lattice symbols decoded a chunk at a time into a per-thread buffer and
    /// consumed at once against `RHT(x)`.
    LatticeResident {
        /// `rans` or `rice`.
        coding: &'static str,
    },
    /// Trellis bits decoded in registers (a window, a multiply, a byte sum per weight)
    /// against `RHT(x)`; pairs (`v = 2`) are decoded per sequence, then dotted.
    Trellis {
        /// State bits.
        l: u8,
        /// Bits per weight.
        k: u8,
        /// Values per state.
        v: u8,
    },
    /// Prototype·x dot products in a table, looked up per block.
    CodebookLut,
    /// `U·(Vᵀx)`.
    LowRank,
    /// The stored nonzeros only.
    Sparse,
    /// One operator per row block.
    Mixed,
    /// A base operator plus the stored exceptions' deltas.
    Exceptions,
    /// The fallback: row tiles decoded to f32, then dotted (no fast path for this form).
    DecodeTiles,
    /// A weight stored `[in, out]` ([`CompressedLinear::transposed`]): tiles of stored rows
    /// decoded to f32, each added into `y` scaled by its input (a GEMM).
    TransposedTiles,
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Dense => f.write_str("dense"),
            Path::AffineFused { bits } => write!(f, "affine-int{bits}-fused"),
            Path::AffineUnpacked { bits } => write!(f, "affine-int{bits}-unpacked"),
            Path::E8Fixed { bits } => write!(f, "e8-fixed{bits}"),
            Path::LatticeWords => f.write_str("lattice-words"),
            Path::LatticeResident { coding } => write!(f, "lattice-resident-{coding}"),
            Path::Trellis { l, k, v: 2 } => write!(f, "trellis-l{l}-k{k}-v2"),
            Path::Trellis { l, k, .. } => write!(f, "trellis-l{l}-k{k}"),
            Path::CodebookLut => f.write_str("codebook-lut"),
            Path::LowRank => f.write_str("lowrank"),
            Path::Sparse => f.write_str("sparse"),
            Path::Mixed => f.write_str("mixed"),
            Path::Exceptions => f.write_str("exceptions"),
            Path::DecodeTiles => f.write_str("decode-tiles"),
            Path::TransposedTiles => f.write_str("transposed-tiles"),
        }
    }
}

/// A weight's stored form as the GPU kernels read it ([`CompressedLinear::device_form`]): the
/// codes or words exactly as stored, side information decoded to f32.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum DeviceForm<'a> {
    /// Affine codes: `ŵ = s·(qmul·q − qbias) + lo` with the scale (and offset) of column `j`'s
    /// group `j / group_len`.
    Affine {
        /// `bits`-bit codes, LSB-first, row after row.
        codes: &'a [u8],
        /// `rows·scales_per_row` scales (1 when `scales_per_row` is 0).
        scales: Vec<f32>,
        /// Offsets like `scales`; empty when symmetric.
        offsets: Vec<f32>,
        /// The type the scales and offsets are stored in (each decoded value converts back
        /// to it exactly).
        scale_dtype: FloatDtype,
        /// Bits per code.
        bits: u8,
        /// Values per group.
        group_len: usize,
        /// Groups per row, or 0 for one tensor-wide scale.
        scales_per_row: usize,
        /// Code multiplier.
        qmul: f32,
        /// Code bias.
        qbias: f32,
    },
    /// Bitshift-trellis rows dotted against `RHT(x)` (see `hypercodec_trellis`): value
    /// `c1·sum + c0` of the 1MAD code's byte sum of each state, or of the pair code's two byte
    /// sums (`v` = 2), scaled per row.
    Trellis {
        /// `row_bytes` per row.
        bits: &'a [u8],
        /// Bytes per row.
        row_bytes: usize,
        /// Row scales.
        row_scales: Vec<f32>,
        /// State bits.
        l: u8,
        /// Bits per value.
        k: u8,
        /// Values per tail-biting sequence.
        seq: usize,
        /// The code's slope.
        c1: f32,
        /// The code's offset.
        c0: f32,
        /// Values per state (1, or 2 for pairs).
        v: u8,
        /// RHT tile.
        tile: usize,
        /// RHT seed.
        seed: u64,
    },
    /// E8 symbols in GPU-shaped rANS chunks ([`hwz::Coding::RANS_GPU`]: 32 lanes, whole rows
    /// per chunk), decoded by one warp per chunk inside the GEMV and dotted against `RHT(x)`.
    E8Rans {
        /// The payload's 16-bit words, little-endian.
        payload: &'a [u8],
        /// The chunk table as stored: per chunk a `u32` word offset, then 32 lane states
        /// (checked: offsets never decrease and stay inside the payload).
        index: &'a [u8],
        /// The three contexts' packed decode slots (`rice::rans::Decoder::warp_slots`), the top
        /// byte the signed coordinate: `2t + c` for a word's first symbol, `s` for the others.
        slots: Vec<u32>,
        /// Probability bits (≤ 12).
        prob_bits: u8,
        /// Symbols per chunk: a multiple of `8·words`.
        chunk: usize,
        /// Row scale divided by α, per row.
        row_scales: Vec<f32>,
        /// Words per row (`8·words ≥ cols`, a multiple of 4).
        words: usize,
        /// RHT tile.
        tile: usize,
        /// RHT seed.
        seed: u64,
    },
    /// E8 words in the format's prefix codes ([`hwz::Coding::Prefix`]: chunks of eight rows, or
    /// of `span` groups of eight rows where a row is one segment, a warp each, lane `4n + q`
    /// decoding word `q` of each 32-column block of row `n`), decoded inside the GEMV and
    /// dotted against `RHT(x)`.
    E8Prefix {
        /// The chunks' 32-bit words, little-endian, as stored.
        payload: &'a [u8],
        /// `chunks + 1` word offsets (checked: they never decrease and end at the payload's end).
        starts: Vec<u32>,
        /// The decode tables (`hypercodec_rice::prefix::Model::warp_table`).
        table: Vec<u32>,
        /// Longest single code.
        limit: u8,
        /// Longest pair code (0: singles).
        pair_limit: u8,
        /// 32-column blocks a chunk's rows hold.
        segment: usize,
        /// Groups of eight rows a chunk spans (above 1 only where a row is one segment).
        span: usize,
        /// Row scale divided by α, per row.
        row_scales: Vec<f32>,
        /// Words per row (a multiple of 4).
        words: usize,
        /// RHT tile.
        tile: usize,
        /// RHT seed.
        seed: u64,
    },
    /// Fixed-rate Z1 symbols (scalar integers in the RHT domain): value `j` of row `r` is
    /// `row_scales[r]·(sym − 2^(bits−1))` against `RHT(x)`; at 8 bits, the int8 weight of the
    /// W8A8 route (`hypercodec.nn.quantize_activations`).
    Z1Fixed {
        /// `bits`-bit symbols, LSB-first, row after row (`cols` per row).
        packed: &'a [u8],
        /// Row scale divided by α, per row.
        row_scales: Vec<f32>,
        /// Bits per symbol.
        bits: u8,
        /// RHT tile.
        tile: usize,
        /// RHT seed.
        seed: u64,
    },
    /// Fixed-rate E8 words dotted against `RHT(x)`.
    E8Fixed {
        /// `bits` bytes per word, `words` words per row.
        packed: &'a [u8],
        /// Row scale divided by α, per row.
        row_scales: Vec<f32>,
        /// Words per row (`8·words ≥ cols`).
        words: usize,
        /// Bits per symbol.
        bits: u8,
        /// RHT tile.
        tile: usize,
        /// RHT seed.
        seed: u64,
    },
}

impl DeviceForm<'_> {
    /// The form's name, as the front ends report it: `"affine"`, `"trellis"`, `"e8rans"`,
    /// `"e8prefix"`, `"z1"` or `"e8"`.
    pub fn kind(&self) -> &'static str {
        match self {
            DeviceForm::Affine { .. } => "affine",
            DeviceForm::Trellis { .. } => "trellis",
            DeviceForm::E8Rans { .. } => "e8rans",
            DeviceForm::E8Prefix { .. } => "e8prefix",
            DeviceForm::Z1Fixed { .. } => "z1",
            DeviceForm::E8Fixed { .. } => "e8",
        }
    }
}

/// A weight that is an int8 matrix times a scale per row, or per group of columns, plus an
/// offset per group where the codes are asymmetric, as stored: what an int8 or FP8 GEMM with
/// quantized activations multiplies ([`CompressedLinear::int8_weight`]). With
/// `i = r·⌈cols/group_len⌉ + j/group_len`, value `(r, j)` is
/// `scales[i]·values[r·cols + j] (+ offsets[i])`, in the RHT domain of `tile` and `seed` when
/// `tile` is not 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Int8Weight {
    /// `rows × cols` signed codes, row-major.
    pub values: Vec<i8>,
    /// `rows × ⌈cols/group_len⌉` scales, row-major: one per row when `group_len` is `cols`.
    pub scales: Vec<f32>,
    /// Columns one scale covers: `cols`, or the group length of group-scaled codes.
    pub group_len: usize,
    /// Offsets like `scales`, or empty (symmetric codes). Asymmetric codes `q` are held as
    /// `q − 2^(bits−1)` (centred, so that the offsets stay small), their offsets moved to match.
    pub offsets: Vec<f32>,
    /// RHT tile of the values' domain (0: the weight's own).
    pub tile: usize,
    /// RHT seed.
    pub seed: u64,
}

/// A linear layer whose weight stays compressed: `y = x·Wᵀ (+ b)` with `W` the `rows × cols`
/// matrix view of an hwz tensor (a convolution's `[out, in, kh, kw]` is `[out, in·kh·kw]`), or
/// of a 2-D tensor stored `[in, out]`, transposed ([`CompressedLinear::transposed`]).
#[derive(Debug)]
pub struct CompressedLinear {
    name: String,
    rows: usize,
    cols: usize,
    bias: Option<Vec<f32>>,
    op: Op,
    conversion_snr_db: Option<f64>,
    /// `W` is stored `[in, out]`: `rows` are the stored columns ([`CompressedLinear::transposed`]).
    transposed: bool,
}

#[derive(Debug)]
enum Op {
    Leaf {
        view: Box<TensorView<'static>>,
        kind: Kind,
    },
    Mixed {
        parts: Vec<(usize, Op)>,
    },
    Exceptions {
        base: Box<Op>,
        /// Exact value minus the base's value, at the stored positions.
        deltas: Box<Corrections>,
        cols: usize,
    },
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Dense,
    Affine {
        glen: usize,
        gpr: usize,
        fused: bool,
    },
    E8Fixed,
    LatticeWords,
    LatticeResident,
    Trellis,
    Codebook,
    LowRank,
    Sparse,
    Tiles,
}

impl CompressedLinear {
    /// The operator of `view`'s tensor (owning a copy of what the view borrows), with an
    /// optional bias of `rows` values.
    pub fn new(view: TensorView<'_>, bias: Option<&[f32]>, options: &LoadOptions) -> Result<Self> {
        Self::build(view, bias, options, false)
    }

    /// The operator `y = x·W (+ b)` of a weight stored `[in, out]`, as GPT-2's `Conv1D` and
    /// Keras or Flax `Dense` kernels hold it: `rows` (outputs) are the stored columns and
    /// `cols` (inputs) the stored rows, so it computes what [`CompressedLinear::new`] would on
    /// the weight transposed, without re-encoding it (groups and scales stay along the stored
    /// rows). It runs by decoding tiles of stored rows each call and adding each row into `y`
    /// scaled by its input (a GEMM): [`Path::TransposedTiles`] at every batch.
    /// It has no device form and no int8 form (front ends decode it). The tensor must be 2-D
    /// ([`RuntimeError::NotInOut`]).
    pub fn transposed(
        view: TensorView<'_>,
        bias: Option<&[f32]>,
        options: &LoadOptions,
    ) -> Result<Self> {
        Self::build(view, bias, options, true)
    }

    fn build(
        view: TensorView<'_>,
        bias: Option<&[f32]>,
        options: &LoadOptions,
        transposed: bool,
    ) -> Result<Self> {
        let name = view.name().to_string();
        if transposed && view.shape().len() != 2 {
            return Err(RuntimeError::NotInOut {
                tensor: name,
                shape: view.shape().to_vec(),
            });
        }
        if view.shape().len() < 2 {
            return Err(RuntimeError::NotAMatrix {
                tensor: name,
                shape: view.shape().to_vec(),
            });
        }
        let (rows, cols) = match operator_shape(&view) {
            (r, c) if transposed => (c, r),
            rc => rc,
        };
        if let Some(b) = bias {
            if b.len() != rows {
                return Err(RuntimeError::Length {
                    what: "bias",
                    expected: rows,
                    actual: b.len(),
                });
            }
        }
        let mut conversion_snr_db = None;
        let view = match options.fixed_bits {
            Some(bits) => {
                let (fixed, snr) = to_fixed(&view, bits)?;
                conversion_snr_db = Some(snr);
                fixed
            }
            None => view.into_owned(),
        };
        Ok(CompressedLinear {
            name,
            rows,
            cols,
            bias: bias.map(<[f32]>::to_vec),
            op: Op::build(view)?,
            conversion_snr_db,
            transposed,
        })
    }

    /// [`CompressedLinear::new`] from an encoder's output.
    pub fn from_encoded(
        name: &str,
        t: &hwz::EncodedTensor,
        shape: &[u64],
        bias: Option<&[f32]>,
        options: &LoadOptions,
    ) -> Result<Self> {
        let streams: Vec<(&str, &[u8])> = t.streams.iter().map(|(r, b)| (*r, &b[..])).collect();
        let view = TensorView::new(name, &t.encoding, shape, &streams)?;
        Self::new(view, bias, options)
    }

    /// The weight's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Output features (rows of `W`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (columns of `W`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The bias, when the layer has one.
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// Whether the weight is stored `[in, out]` ([`CompressedLinear::transposed`]).
    pub fn is_transposed(&self) -> bool {
        self.transposed
    }

    /// The batch-1 route.
    pub fn path(&self) -> Path {
        if self.transposed {
            return Path::TransposedTiles;
        }
        self.op.path()
    }

    /// The route with those of the parts of a mixed or exceptions tensor, e.g.
    /// `mixed[e8-fixed4, affine-int4-fused]`.
    pub fn path_detail(&self) -> String {
        if self.transposed {
            return Path::TransposedTiles.to_string();
        }
        self.op.detail()
    }

    /// The route at `batch` activation rows: the batch-1 path; for a few rows (up to 8 for
    /// affine codes, which are unpacked once for all of them, the trellis, decoded once for
    /// four, and fixed-rate lattice words, 16 for the rest) run once per row (entropy-coded
    /// lattice tensors excepted: their chunks are decoded once per call); otherwise tiles
    /// decoded to f32 (lattice and trellis: scaled points or codes against `RHT(X)`) and a GEMM.
    pub fn route(&self, batch: usize) -> String {
        let detail = self.path_detail();
        let path = self.path();
        let small = match &self.op {
            Op::Leaf { kind, view } => small_batch(*kind, view.cols() as usize),
            _ => SMALL_BATCH,
        };
        match (batch, path) {
            (0 | 1, _) => detail,
            (_, Path::TransposedTiles) => "transposed-tiles+gemm".into(),
            (b, Path::Sparse) => format!("{detail} (batch {b})"),
            (_, Path::DecodeTiles) => "decode-tiles+gemm".into(),
            (_, Path::LatticeResident { .. }) => "lattice-coded-points+gemm".into(),
            (b, Path::AffineFused { .. } | Path::AffineUnpacked { .. }) if b <= small => {
                format!("{detail} ({b} rows at once)")
            }
            (b, Path::Trellis { .. } | Path::E8Fixed { bits: 4 }) if b <= small => {
                format!("{detail} ({b} rows, up to 4 at once)")
            }
            (b, _) if b <= small => format!("{detail} ×{b}"),
            (_, Path::E8Fixed { .. } | Path::LatticeWords) => "lattice-points+gemm".into(),
            (_, Path::Trellis { .. }) => "trellis-codes+gemm".into(),
            _ => "decode-tiles+gemm".into(),
        }
    }

    /// Bytes the operator holds: the stored streams, the side information parsed from them
    /// and the bias. Per-call buffers (the prepared activation, one chunk or tile per thread,
    /// a transposed weight's sums of up to 64 rows of outputs per thread) are not included.
    pub fn held_bytes(&self) -> u64 {
        self.op.held_bytes() + 4 * self.bias.as_ref().map_or(0, Vec::len) as u64
    }

    /// When loaded with [`LoadOptions::fixed_bits`]: the SNR (dB) of the converted weight
    /// against the stored one (∞ when nothing was clipped).
    pub fn conversion_snr_db(&self) -> Option<f64> {
        self.conversion_snr_db
    }

    /// The stored form as a GPU kernel reads it (`hypercodec-kernels-cuda`), borrowing the
    /// codes and words as stored: affine codes, trellis bits, fixed-rate E8 words, GPU-shaped
    /// rANS E8 chunks, and fixed-rate Z1 symbols (no GEMV of their own: the W8A8 route reads
    /// them at 8 bits). `None` for the other forms (nested tensors, CPU-shaped entropy-coded
    /// or D4/A2 lattice symbols, codebook, ...), which a front end runs by decoding (the
    /// documented fallback), and trellis pairs (`v = 2`: the kernels decode one value a state).
    pub fn device_form(&self) -> Result<Option<DeviceForm<'_>>> {
        let Op::Leaf { view, kind } = &self.op else {
            return Ok(None);
        };
        // Nothing to run (and a 0-row tensor-scaled grid stores no scale to read); the kernels
        // read rows of `W`, which a transposed weight does not store.
        if self.cols == 0 || self.rows == 0 || self.transposed {
            return Ok(None);
        }
        let rows = self.rows;
        Ok(match (*kind, view.parts_ref()) {
            (
                Kind::Affine { glen, gpr, .. },
                Parts::Affine {
                    params,
                    codes,
                    scales,
                    offsets,
                },
            ) => {
                let tensor = matches!(params.group, Group::Tensor);
                let n = if tensor { 1 } else { rows * gpr };
                let sd = params.scale_dtype;
                let mut sc = vec![0f32; n];
                scales_into(scales, sd, 0, &mut sc)
                    .map_err(|e| corrupt(view, format!("affine scales: {e}")))?;
                let mut of = vec![0f32; if params.symmetric { 0 } else { n }];
                scales_into(offsets, sd, 0, &mut of)
                    .map_err(|e| corrupt(view, format!("affine offsets: {e}")))?;
                let (qmul, qbias) = if !params.symmetric {
                    (1.0, 0.0)
                } else if params.bits == 1 {
                    (2.0, 1.0)
                } else {
                    (1.0, (1u32 << (params.bits - 1)) as f32)
                };
                Some(DeviceForm::Affine {
                    codes,
                    scales: sc,
                    offsets: of,
                    scale_dtype: sd,
                    bits: params.bits,
                    group_len: glen,
                    scales_per_row: if tensor { 0 } else { gpr },
                    qmul,
                    qbias,
                })
            }
            (Kind::Trellis, Parts::Trellis(t)) => {
                let (c1, c0) = t.params.affine();
                Some(DeviceForm::Trellis {
                    bits: &t.bits,
                    row_bytes: t.row_bytes(self.cols),
                    row_scales: t.scales.clone(),
                    l: t.params.l,
                    k: t.params.k,
                    seq: t.seq,
                    c1,
                    c0,
                    v: t.params.v,
                    tile: t.tile,
                    seed: t.seed,
                })
            }
            (Kind::LatticeResident, Parts::Lattice(l))
                if l.params.lattice == Lattice::E8 && matches!(l.symbols, Symbols::Prefix(_)) =>
            {
                let Symbols::Prefix(d) = &l.symbols else {
                    return Ok(None);
                };
                let (p, layout) = (d.model().params(), d.layout());
                // The kernels' shape: whole 32-column blocks, at most 16 chunks a row (a
                // block's warps sum them). Which limits have kernels is the kernels' to say
                // (`hypercodec_kernels_cuda::E8PrefixGemv::compiled`).
                if layout.words == 0 || !layout.words.is_multiple_of(4) || layout.segments() > 16 {
                    return Ok(None);
                }
                Some(DeviceForm::E8Prefix {
                    payload: d.payload(),
                    starts: d.starts().to_vec(),
                    table: d.model().warp_table(),
                    limit: p.limit,
                    pair_limit: p.pair_limit,
                    segment: p.segment,
                    span: p.span,
                    row_scales: l.scales.iter().map(|s| s / l.params.alpha).collect(),
                    words: layout.words,
                    tile: l.params.tile,
                    seed: l.params.seed,
                })
            }
            (Kind::LatticeResident, Parts::Lattice(l)) if l.params.lattice == Lattice::E8 => {
                let Symbols::Rans(d) = &l.symbols else {
                    return Ok(None);
                };
                let (p, spr) = (d.params(), l.symbols_per_row);
                // The warp kernel's shape: a warp per chunk of whole rows, each step of 32
                // symbols inside one row, slots that pack into 32 bits; chunks of the GPU
                // shape's size (a row, or rows up to 2^14 symbols). A CPU-shaped chunk of 2^18
                // symbols would be one warp's serial work: such a tensor is decoded instead,
                // even where its model's few probability bits would pack.
                let gpu_chunk = spr.max(hwz::GPU_CHUNK_SYMBOLS);
                if p.lanes != 32
                    || spr == 0
                    || spr % 32 != 0
                    || p.chunk % spr != 0
                    || p.chunk > gpu_chunk
                {
                    return Ok(None);
                }
                // The slots carry each symbol's signed coordinate (E8's symbols, zigzagged:
                // `2·zz(t) + c` then `zz(s)`, see hypercodec_lattice): `2t + c` in context 0
                // (the coset bit stays the low bit), `s` in the others.
                let unzz = |z: u32| ((z >> 1) as i32) ^ -((z & 1) as i32);
                let byte = |ctx: usize, sym: u32| {
                    let v = if ctx == 0 {
                        2 * unzz(sym >> 1) + (sym & 1) as i32
                    } else {
                        unzz(sym)
                    };
                    i8::try_from(v).ok().map(|b| b as u8)
                };
                let Some(slots) = d.warp_slots(byte) else {
                    return Ok(None);
                };
                if slots.len() != 3 << d.prob_bits() {
                    return Ok(None);
                }
                d.check_chunk_table()
                    .map_err(|e| corrupt(view, format!("rans chunk table: {e}")))?;
                Some(DeviceForm::E8Rans {
                    payload: d.payload(),
                    index: d.index(),
                    slots,
                    prob_bits: d.prob_bits(),
                    chunk: p.chunk,
                    row_scales: l.scales.iter().map(|s| s / l.params.alpha).collect(),
                    words: spr / 8,
                    tile: l.params.tile,
                    seed: l.params.seed,
                })
            }
            (Kind::LatticeWords, Parts::Lattice(l)) if l.params.lattice == Lattice::Z1 => {
                match &l.symbols {
                    Symbols::Fixed { bits, packed } => Some(DeviceForm::Z1Fixed {
                        packed,
                        row_scales: l.scales.iter().map(|s| s / l.params.alpha).collect(),
                        bits: *bits,
                        tile: l.params.tile,
                        seed: l.params.seed,
                    }),
                    _ => None,
                }
            }
            (Kind::E8Fixed, Parts::Lattice(l)) => match &l.symbols {
                Symbols::Fixed { bits, packed } => Some(DeviceForm::E8Fixed {
                    packed,
                    row_scales: l.scales.iter().map(|s| s / l.params.alpha).collect(),
                    words: l.symbols_per_row / 8,
                    bits: *bits,
                    tile: l.params.tile,
                    seed: l.params.seed,
                }),
                _ => None,
            },
            _ => None,
        })
    }

    /// The stored weight as an int8 matrix and a scale per row or group ([`Int8Weight`]), when
    /// it is one: affine symmetric codes of 1 to 8 bits with a scale per row, per group or for
    /// the tensor (`int8-row`, `int4-row`, `int2-tensor`, …: `s·(q − 2^(bits−1))`,
    /// `s·(2q − 1)` at one bit), asymmetric ones with an offset too (`int4` in groups of 128:
    /// `s·q + o`, held as `s·(q − 2^(bits−1)) + (o + s·2^(bits−1))`), or the points of a Z1,
    /// D4 or E8 tensor, fixed-rate or entropy-coded, in the RHT domain (`z1-fixed4`,
    /// `e8-fixed4`, `e8@4`, …: `σ/α·p` with integer points `p`, E8's half-integer points
    /// held doubled with `σ/2α`) where every point fits in i8 and the rows are not padded
    /// past the weight's columns. `None` for every other form. Values of magnitude up to 16
    /// (codes of up to 5 bits, E8 points of up to 4 bits) are also exact in FP8 E4M3.
    pub fn int8_weight(&self) -> Result<Option<Int8Weight>> {
        let (rows, cols) = (self.rows, self.cols);
        // Codes `q` of `bits` bits as the integers `mul·q − bias`.
        let signed = |packed: &[u8], bits: u8, mul: i16, bias: i16| -> Result<Vec<i8>> {
            let mut codes = vec![0u8; rows * cols];
            scalar::unpack_bits_range_into(packed, bits, rows * cols, 0, &mut codes).map_err(
                |e| RuntimeError::Corrupt {
                    tensor: "int8 weight".into(),
                    message: format!("codes: {e}"),
                },
            )?;
            Ok(codes
                .iter()
                .map(|&q| (mul * q as i16 - bias) as i8)
                .collect())
        };
        // Whether `mul·q − bias` is an integer in i8 for every code of `bits` bits (symmetric
        // codes: `q − 2^(bits−1)`, or `2q − 1` at one bit).
        let integral = |bits: u8, mul: f32, bias: f32| {
            let top = mul * ((1u32 << bits) - 1) as f32 - bias;
            (1..=8).contains(&bits)
                && mul.fract() == 0.0
                && bias.fract() == 0.0
                && (1.0..=2.0).contains(&mul)
                && bias <= 128.0
                && top <= 127.0
        };
        if rows == 0 || cols == 0 || self.transposed {
            return Ok(None);
        }
        if let Op::Leaf {
            view,
            kind: Kind::E8Fixed | Kind::LatticeWords | Kind::LatticeResident,
        } = &self.op
        {
            if let Parts::Lattice(l) = view.parts_ref() {
                return lattice_int8(view, l, rows, cols);
            }
        }
        Ok(match self.device_form()? {
            Some(DeviceForm::Affine {
                codes,
                scales,
                offsets,
                bits,
                scales_per_row,
                qmul,
                qbias,
                group_len,
                ..
            }) if (offsets.is_empty() && integral(bits, qmul, qbias))
                || (!offsets.is_empty()
                    && qmul == 1.0
                    && qbias == 0.0
                    && (1..=8).contains(&bits)) =>
            {
                // Asymmetric codes: centred by `shift`, the offsets moved by `s·shift`.
                let shift = if offsets.is_empty() {
                    0
                } else {
                    1i16 << (bits - 1)
                };
                let per_row = |v: Vec<f32>| {
                    if scales_per_row == 0 {
                        vec![v[0]; rows]
                    } else {
                        v
                    }
                };
                let offsets = if offsets.is_empty() {
                    Vec::new()
                } else {
                    let s = per_row(scales.clone());
                    per_row(offsets)
                        .iter()
                        .zip(&s)
                        .map(|(o, s)| o + s * shift as f32)
                        .collect()
                };
                Some(Int8Weight {
                    values: signed(codes, bits, qmul as i16, qbias as i16 + shift)?,
                    scales: per_row(scales),
                    group_len: if scales_per_row <= 1 { cols } else { group_len },
                    offsets,
                    tile: 0,
                    seed: 0,
                })
            }
            _ => None,
        })
    }

    /// The weight decoded to f32 (`rows × cols`, row-major): what the operator computes with.
    pub fn decode_weight(&self) -> Result<Vec<f32>> {
        let mut w = vec![0f32; self.rows * self.cols];
        if w.is_empty() {
            return Ok(w);
        }
        if self.transposed {
            // Stored `cols × rows`, decoded then transposed a block at a time.
            let mut stored = vec![0f32; w.len()];
            self.op.decode_span(0, self.rows, &mut stored, false)?;
            transpose_into(&stored, self.cols, self.rows, &mut w);
        } else {
            self.op.decode_span(0, self.cols, &mut w, false)?;
        }
        Ok(w)
    }

    /// Rows `rows` of the weight decoded to f32 (`rows.len() × cols`): an embedding lookup on
    /// the stored form (each row decodes alone; entropy-coded rows decode their chunk; a
    /// transposed weight's rows are stored columns: it is decoded whole, once a call).
    pub fn decode_rows(&self, rows: &[usize], out: &mut [f32]) -> Result<()> {
        check_rows("rows out", rows.len(), self.cols, out.len())?;
        if let Some(&r) = rows.iter().find(|&&r| r >= self.rows) {
            return Err(RuntimeError::RowIndex {
                index: r,
                rows: self.rows,
            });
        }
        if self.transposed {
            // A row of `W` is a stored column: the weight is decoded once for all of them.
            let w = self.decode_weight()?;
            for (&r, o) in rows.iter().zip(out.chunks_exact_mut(self.cols.max(1))) {
                o.copy_from_slice(&w[r * self.cols..(r + 1) * self.cols]);
            }
            return Ok(());
        }
        for (&r, o) in rows.iter().zip(out.chunks_exact_mut(self.cols.max(1))) {
            self.op.decode_span(r, self.cols, o, false)?;
        }
        Ok(())
    }

    /// `y = x·Wᵀ (+ b)` for `batch` rows of f32 activations: `x` is `batch × cols`, `y`
    /// `batch × rows`, both row-major.
    pub fn forward(&self, x: &[f32], batch: usize, y: &mut [f32]) -> Result<()> {
        check_rows("x", batch, self.cols, x.len())?;
        check_rows("y", batch, self.rows, y.len())?;
        if self.cols == 0 {
            y.fill(0.0);
        } else if self.transposed {
            self.forward_transposed(x, batch, y)?;
        } else if batch == 1 {
            self.op.run(x, 1, y)?;
        } else {
            let mut yt = vec![0f32; batch * self.rows];
            self.op.run(x, batch, &mut yt)?;
            for (r, col) in yt.chunks_exact(batch.max(1)).enumerate() {
                for (b, &v) in col.iter().enumerate() {
                    y[b * self.rows + r] = v;
                }
            }
        }
        if let Some(bias) = &self.bias {
            for row in y.chunks_exact_mut(self.rows.max(1)) {
                row.iter_mut().zip(bias).for_each(|(o, b)| *o += b);
            }
        }
        Ok(())
    }

    /// `y = x·W` for a weight stored `[in, out]`: tiles of stored rows (inputs) decoded to f32
    /// and added into `y` scaled by their inputs (a GEMM, at batch 1 too). Lattice and trellis
    /// rows are summed in their RHT domain, as decoded, and each output row is rotated back
    /// once at the end (`Σ x_i·RHT⁻¹(q_i) = RHT⁻¹(Σ x_i·q_i)`); a task keeps its last
    /// entropy-coded chunk for its next tile. Each task walks a run of tiles into its own sum;
    /// the sums are added in task order. Batches run [`TRANSPOSED_BATCH`] rows at a time, so the
    /// sums stay that small (the weight is decoded once for each).
    fn forward_transposed(&self, x: &[f32], batch: usize, y: &mut [f32]) -> Result<()> {
        let (inputs, outputs) = (self.cols, self.rows);
        for b0 in (0..batch).step_by(TRANSPOSED_BATCH) {
            let b1 = (b0 + TRANSPOSED_BATCH).min(batch);
            let (xs, ys) = (
                &x[b0 * inputs..b1 * inputs],
                &mut y[b0 * outputs..b1 * outputs],
            );
            self.transposed_rows(xs, b1 - b0, ys, None)?;
        }
        Ok(())
    }

    /// [`CompressedLinear::forward_transposed`] for up to [`TRANSPOSED_BATCH`] rows, in tiles of
    /// about `tile_values` values (by default: L2-sized where the rows decode on their own, else
    /// [`TILE_VALUES`], for forms that decode from the tensor's start or by whole chunks).
    pub(crate) fn transposed_rows(
        &self,
        x: &[f32],
        batch: usize,
        y: &mut [f32],
        tile_values: Option<usize>,
    ) -> Result<()> {
        let (inputs, outputs) = (self.cols, self.rows);
        y.fill(0.0);
        if batch == 0 || outputs == 0 || inputs == 0 {
            return Ok(());
        }
        if let (1, Op::Leaf { view, .. }) = (batch, &self.op) {
            if let Some(rows) = AffineRows::new(view) {
                return transposed_affine_row(&rows, x, y);
            }
        }
        let rotated = self.op.rotated();
        let width = rotated.as_ref().map_or(outputs, Rotated::width);
        let local = rotated.is_some()
            || matches!(
                self.op,
                Op::Leaf {
                    kind: Kind::Dense | Kind::Affine { .. },
                    ..
                }
            );
        // Tiles that stay in L2 between their decode and their product (for a batch, deep
        // enough for the GEMM's inner dimension).
        let values = tile_values.unwrap_or(if local {
            TRANSPOSED_TILE_VALUES << batch.min(8).ilog2()
        } else {
            TILE_VALUES
        });
        let tile = (values / width).clamp(1, inputs);
        let tiles = inputs.div_ceil(tile);
        let per = tiles.div_ceil(rayon::current_num_threads().max(1));
        let tasks = tiles.div_ceil(per);
        let run = |task: usize, acc: &mut [f32]| -> Result<()> {
            let (mut w, mut scratch) = (Vec::new(), Points::default());
            for k in task * per..((task + 1) * per).min(tiles) {
                let r0 = k * tile;
                let n = tile.min(inputs - r0);
                w.resize(n * width, 0.0);
                match &rotated {
                    Some(r) => r.decode(r0, &mut w, &mut scratch)?,
                    None => self.op.decode_span(r0, outputs, &mut w, true)?,
                }
                gemm_xw_add(&x[r0..], inputs, batch, &w, n, width, acc);
            }
            Ok(())
        };
        let total = sum_in_order(
            (0..tasks)
                .into_par_iter()
                .map(|task| {
                    let mut acc = vec![0f32; batch * width];
                    run(task, &mut acc).map(|()| acc)
                })
                .collect::<Result<Vec<_>>>()?,
        );
        match &rotated {
            Some(r) => r.rotate_back(&total, y)?,
            None => y.copy_from_slice(&total),
        }
        Ok(())
    }

    /// [`CompressedLinear::forward`] for bfloat16 activations and outputs (computed in f32).
    pub fn forward_bf16(&self, x: &[half::bf16], batch: usize, y: &mut [half::bf16]) -> Result<()> {
        check_rows("x", batch, self.cols, x.len())?;
        check_rows("y", batch, self.rows, y.len())?;
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let mut yf = vec![0f32; y.len()];
        self.forward(&xf, batch, &mut yf)?;
        y.iter_mut()
            .zip(&yf)
            .for_each(|(o, &v)| *o = half::bf16::from_f32(v));
        Ok(())
    }
}

/// The operator's `(rows, cols)` for `view`: its matrix view, except that a matrix without
/// columns (`nn.Linear(0, n)`) has no values to count rows by, so hwz's view has none; the
/// shape's first dimension has them (every output is then the bias, or 0).
pub(crate) fn operator_shape(view: &TensorView<'_>) -> (usize, usize) {
    let (rows, cols) = (view.rows() as usize, view.cols() as usize);
    match view.shape() {
        [r, rest @ ..] if !rest.is_empty() && rest.contains(&0) => (*r as usize, cols),
        _ => (rows, cols),
    }
}

/// The length of a buffer of `rows` rows of `per_row` values; a product past `usize` is
/// [`RuntimeError::Overflow`] (wrapped, it could match a small buffer).
pub(crate) fn rows_len(what: &'static str, rows: usize, per_row: usize) -> Result<usize> {
    rows.checked_mul(per_row).ok_or(RuntimeError::Overflow {
        what,
        rows,
        per_row,
    })
}

/// [`check_len`] for a buffer of `rows` rows of `per_row` values ([`rows_len`]).
pub(crate) fn check_rows(
    what: &'static str,
    rows: usize,
    per_row: usize,
    actual: usize,
) -> Result<()> {
    check_len(what, rows_len(what, rows, per_row)?, actual)
}

fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected != actual {
        return Err(RuntimeError::Length {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}

fn corrupt(view: &TensorView<'_>, message: String) -> RuntimeError {
    RuntimeError::Corrupt {
        tensor: view.name().to_string(),
        message,
    }
}

/// Splits `y` (rows of `per_row` outputs, `cost` values of work each) over the pool and runs
/// `f(first_row, part)` on each part.
fn par_rows(
    y: &mut [f32],
    per_row: usize,
    cost: usize,
    f: impl Fn(usize, &mut [f32]) -> Result<()> + Sync,
) -> Result<()> {
    let rows = y.len() / per_row.max(1);
    let tasks = 4 * rayon::current_num_threads();
    let min_rows = (TASK_MIN_VALUES / cost.max(1)).max(1);
    let per = rows.div_ceil(tasks).max(min_rows);
    if per >= rows {
        return f(0, y);
    }
    y.par_chunks_mut(per * per_row)
        .enumerate()
        .try_for_each(|(i, part)| f(i * per, part))
}

impl Op {
    fn build(view: TensorView<'static>) -> Result<Op> {
        let cols = view.cols() as usize;
        let kind = match view.parts_ref() {
            Parts::Raw { .. } => Kind::Dense,
            Parts::Affine { params, .. } => {
                let glen = match params.group {
                    Group::Size(g) => (g as usize).min(cols).max(1),
                    Group::Row | Group::Tensor => cols.max(1),
                };
                Kind::Affine {
                    glen,
                    gpr: cols.div_ceil(glen),
                    fused: kernels::fused_shape(params.bits, cols, glen),
                }
            }
            Parts::Lattice(l) => match l.symbols {
                Symbols::Fixed { .. } if l.params.lattice == Lattice::E8 => Kind::E8Fixed,
                Symbols::Fixed { .. } => Kind::LatticeWords,
                Symbols::Rans(_) | Symbols::Rice(_) | Symbols::Prefix(_) => Kind::LatticeResident,
            },
            Parts::Codebook(c) => match c.assignments {
                AssignmentsRef::Packed { .. } => Kind::Codebook,
                AssignmentsRef::Rle(_) => Kind::Tiles,
            },
            Parts::Trellis(_) => Kind::Trellis,
            Parts::LowRank(_) => Kind::LowRank,
            Parts::Sparse { .. } => Kind::Sparse,
            Parts::Mixed { .. } | Parts::Exceptions { .. } => return Op::nested(view),
            _ => Kind::Tiles,
        };
        Ok(Op::Leaf {
            view: Box::new(view),
            kind,
        })
    }

    fn nested(view: TensorView<'static>) -> Result<Op> {
        let cols = view.cols() as usize;
        let name = view.name().to_string();
        match view.into_parts() {
            Parts::Mixed { parts, .. } => {
                let ops = parts
                    .into_iter()
                    .map(|p| Ok((p.rows() as usize, Op::build(p)?)))
                    .collect::<Result<_>>()?;
                Ok(Op::Mixed { parts: ops })
            }
            Parts::Exceptions { base, exceptions } => {
                // The base's values at the exceptions, decoded a row at a time.
                let mut deltas = exceptions;
                let mut row = vec![0f32; cols];
                let mut current = u64::MAX;
                for (p, v) in deltas.positions.iter().zip(deltas.values.iter_mut()) {
                    let r = p / cols.max(1) as u64;
                    if r != current {
                        base.decode_rows_into(r..r + 1, &mut row)?;
                        current = r;
                    }
                    *v -= row[(p % cols as u64) as usize];
                }
                Ok(Op::Exceptions {
                    base: Box::new(Op::build(*base)?),
                    deltas: Box::new(deltas),
                    cols,
                })
            }
            _ => Err(RuntimeError::Corrupt {
                tensor: name,
                message: "not a nested encoding".into(),
            }),
        }
    }

    fn path(&self) -> Path {
        match self {
            Op::Leaf { view, kind } => match (kind, view.parts_ref()) {
                (Kind::Dense, _) => Path::Dense,
                (Kind::Affine { fused, .. }, Parts::Affine { params, .. }) => {
                    if *fused {
                        Path::AffineFused { bits: params.bits }
                    } else {
                        Path::AffineUnpacked { bits: params.bits }
                    }
                }
                (Kind::E8Fixed, Parts::Lattice(l)) => match l.symbols {
                    Symbols::Fixed { bits, .. } => Path::E8Fixed { bits },
                    _ => Path::LatticeWords,
                },
                (Kind::LatticeWords, _) => Path::LatticeWords,
                (Kind::LatticeResident, Parts::Lattice(l)) => Path::LatticeResident {
                    coding: match l.symbols {
                        Symbols::Rice(_) => "rice",
                        Symbols::Prefix(_) => "prefix",
                        _ => "rans",
                    },
                },
                (Kind::Trellis, Parts::Trellis(t)) => Path::Trellis {
                    l: t.params.l,
                    k: t.params.k,
                    v: t.params.v,
                },
                (Kind::Codebook, _) => Path::CodebookLut,
                (Kind::LowRank, _) => Path::LowRank,
                (Kind::Sparse, _) => Path::Sparse,
                _ => Path::DecodeTiles,
            },
            Op::Mixed { .. } => Path::Mixed,
            Op::Exceptions { .. } => Path::Exceptions,
        }
    }

    fn detail(&self) -> String {
        match self {
            Op::Leaf { .. } => self.path().to_string(),
            Op::Mixed { parts } => {
                let inner: Vec<String> = parts.iter().map(|(_, p)| p.detail()).collect();
                format!("mixed[{}]", inner.join(", "))
            }
            Op::Exceptions { base, .. } => format!("exceptions[{}]", base.detail()),
        }
    }

    fn held_bytes(&self) -> u64 {
        match self {
            Op::Leaf { view, .. } => view.held_bytes(),
            Op::Mixed { parts } => parts.iter().map(|(_, p)| p.held_bytes()).sum(),
            Op::Exceptions { base, deltas, .. } => {
                base.held_bytes() + 12 * deltas.positions.len() as u64
            }
        }
    }

    /// The leaf's rows as their RHT-domain values, where it is a lattice or trellis tensor.
    fn rotated(&self) -> Option<Rotated<'_>> {
        let Op::Leaf { view, kind } = self else {
            return None;
        };
        match (kind, view.parts_ref()) {
            (Kind::E8Fixed | Kind::LatticeWords, Parts::Lattice(l)) => Some(Rotated::Fixed {
                view,
                l,
                blocked: e8_blocked(l),
            }),
            (Kind::LatticeResident, Parts::Lattice(l)) => {
                let (chunk, _) = l.symbols.chunking()?;
                Some(Rotated::Coded { view, l, chunk })
            }
            (Kind::Trellis, Parts::Trellis(t)) => Some(Rotated::Trellis { view, t }),
            _ => None,
        }
    }

    /// Decodes rows `r0..r0 + w.len() / cols` into `w`; `fast`: byte-aligned affine rows in
    /// AVX2 ([`affine_tile`]: its fused multiply-add may round a value differently from the
    /// format's decoder, which the weight and row lookups keep to).
    fn decode_span(&self, r0: usize, cols: usize, w: &mut [f32], fast: bool) -> Result<()> {
        let n = w.len() / cols.max(1);
        match self {
            Op::Leaf { view, .. } => {
                if !(fast && affine_tile(view, r0, w)) {
                    view.decode_rows_into(r0 as u64..(r0 + n) as u64, w)?;
                }
                Ok(())
            }
            Op::Mixed { parts } => {
                let mut first = 0;
                for (rows, op) in parts {
                    // This part's rows within `r0..r0 + n`.
                    let (lo, hi) = (r0.max(first), (r0 + n).min(first + rows));
                    if lo < hi {
                        let out = &mut w[(lo - r0) * cols..(hi - r0) * cols];
                        op.decode_span(lo - first, cols, out, fast)?;
                    }
                    first += rows;
                }
                Ok(())
            }
            Op::Exceptions { base, deltas, .. } => {
                base.decode_span(r0, cols, w, fast)?;
                deltas.apply((r0 * cols) as u64, w, false);
                Ok(())
            }
        }
    }

    /// `yt = W·xᵀ`: `yt` is `rows × batch` (for batch 1, simply `y`).
    fn run(&self, x: &[f32], batch: usize, yt: &mut [f32]) -> Result<()> {
        match self {
            Op::Leaf { view, kind } => {
                if batch == 1 {
                    leaf_gemv(view, *kind, x, yt)
                } else if let (Kind::Sparse, Parts::Sparse { entries }) = (kind, view.parts_ref()) {
                    yt.fill(0.0);
                    add_sparse(entries, view.cols() as usize, x, batch, yt);
                    Ok(())
                } else if let (true, Kind::Affine { glen, gpr, fused }) =
                    (batch <= small_batch(*kind, view.cols() as usize), kind)
                {
                    // A few activation rows: each code unpacked once for all of them.
                    affine_gemv(view, (*glen, *gpr, *fused), x, batch, yt)
                } else if let (true, Kind::Trellis, Parts::Trellis(t)) = (
                    batch <= small_batch(*kind, view.cols() as usize),
                    kind,
                    view.parts_ref(),
                ) {
                    // A few activation rows: each row's bits decoded once for four of them.
                    trellis_gemv(view, t, x, batch, yt)
                } else if let (
                    true,
                    Kind::E8Fixed,
                    Parts::Lattice(
                        l @ hwz::LatticeParts {
                            symbols: Symbols::Fixed { .. },
                            ..
                        },
                    ),
                ) = (
                    batch <= small_batch(*kind, view.cols() as usize),
                    kind,
                    view.parts_ref(),
                ) {
                    // A few activation rows: 4-bit words decoded once for four of them.
                    e8_fixed_rows(view, l, x, batch, yt)
                } else if batch <= small_batch(*kind, view.cols() as usize)
                    && !matches!(kind, Kind::Tiles | Kind::LatticeResident)
                {
                    // A few activation rows: the batch-1 fast path per row reads the stored
                    // form `batch` times, which costs less than decoding it once to f32.
                    let (rows, cols) = (view.rows() as usize, view.cols() as usize);
                    let mut y = vec![0f32; rows];
                    for b in 0..batch {
                        leaf_gemv(view, *kind, &x[b * cols..(b + 1) * cols], &mut y)?;
                        for (r, &v) in y.iter().enumerate() {
                            yt[r * batch + b] = v;
                        }
                    }
                    Ok(())
                } else if let (Kind::E8Fixed | Kind::LatticeWords, Parts::Lattice(l)) =
                    (kind, view.parts_ref())
                {
                    lattice_points_gemm(view, l, x, batch, yt)
                } else if let (Kind::LatticeResident, Parts::Lattice(l)) = (kind, view.parts_ref())
                {
                    lattice_coded_gemm(view, l, x, batch, yt)
                } else if let (Kind::Trellis, Parts::Trellis(t)) = (kind, view.parts_ref()) {
                    trellis_points_gemm(view, t, x, batch, yt)
                } else {
                    tiles(view, x, batch, yt)
                }
            }
            Op::Mixed { parts } => {
                let mut rest = yt;
                for (rows, op) in parts {
                    let (head, tail) = rest.split_at_mut(rows * batch);
                    op.run(x, batch, head)?;
                    rest = tail;
                }
                Ok(())
            }
            Op::Exceptions { base, deltas, cols } => {
                base.run(x, batch, yt)?;
                add_sparse(deltas, *cols, x, batch, yt);
                Ok(())
            }
        }
    }
}

/// `yt[r·batch + b] += v·x[b·cols + c]` for every stored `(r·cols + c, v)`.
fn add_sparse(entries: &Corrections, cols: usize, x: &[f32], batch: usize, yt: &mut [f32]) {
    let cols = cols.max(1) as u64;
    for (&p, &v) in entries.positions.iter().zip(&entries.values) {
        let (r, c) = ((p / cols) as usize, (p % cols) as usize);
        for b in 0..batch {
            yt[r * batch + b] += v * x[b * cols as usize + c];
        }
    }
}

/// Rows of `f32` tiles decoded through the view, then a GEMV (batch 1) or a GEMM per tile.
fn tiles(view: &TensorView<'_>, x: &[f32], batch: usize, yt: &mut [f32]) -> Result<()> {
    let cols = view.cols() as usize;
    let rows = view.rows() as usize;
    if rows == 0 {
        return Ok(());
    }
    if cols == 0 {
        yt.fill(0.0);
        return Ok(());
    }
    // Lattice tensors take their point GEMMs instead (tiles of them would be correct, slower).
    let tile_rows = tile_rows_for(rows, cols);
    let tasks = row_tiles(yt, tile_rows, batch);
    tasks
        .into_par_iter()
        .try_for_each_init(Vec::new, |w: &mut Vec<f32>, (r0, out)| -> Result<()> {
            let n = out.len() / batch;
            w.resize(n * cols, 0.0);
            if !affine_tile(view, r0, w) {
                view.decode_rows_into(r0 as u64..(r0 + n) as u64, w)?;
            }
            if batch == 1 {
                for (o, row) in out.iter_mut().zip(w.chunks_exact(cols)) {
                    *o = kernels::dot_f32(row, x);
                }
            } else {
                gemm_wxt(w, n, cols, x, batch, out);
            }
            Ok(())
        })
}

/// Rows `r0..` of a byte-aligned 4- or 8-bit affine tensor dequantized in AVX2 into `w`
/// (whole rows); `false` (nothing written) when another decoder must do it.
fn affine_tile(view: &TensorView<'_>, r0: usize, w: &mut [f32]) -> bool {
    let Some(rows) = AffineRows::new(view) else {
        return false;
    };
    let cols = view.cols() as usize;
    let (mut mul, mut add) = (vec![0f32; rows.gpr], vec![0f32; rows.gpr]);
    for (i, out) in w.chunks_exact_mut(cols).enumerate() {
        if !rows.terms(r0 + i, 1.0, &mut mul, &mut add) {
            return false;
        }
        rows.row::<false>(r0 + i, &mul, &add, out);
    }
    true
}

/// `y = x·W` at batch 1 for byte-aligned affine codes stored `[in, out]`: each stored row's
/// codes dequantized straight into the sum, its scales and offsets times its input (no tile of
/// f32 between), the rows split over the pool, each task into its own sum, added in task order.
/// As the `[out, in]` fused rows, an infinite input can give NaN (`∞ − ∞` between the scale and
/// offset terms) where a dense product gives ±∞.
fn transposed_affine_row(rows: &AffineRows<'_>, x: &[f32], y: &mut [f32]) -> Result<()> {
    let inputs = x.len();
    let per = inputs
        .div_ceil(rayon::current_num_threads().max(1))
        .max(TASK_MIN_VALUES / y.len().max(1))
        .max(1);
    let sums: Vec<Vec<f32>> = x
        .par_chunks(per)
        .enumerate()
        .map(|(t, xs)| {
            let mut acc = vec![0f32; y.len()];
            let (mut mul, mut add) = (vec![0f32; rows.gpr], vec![0f32; rows.gpr]);
            for (i, &xi) in xs.iter().enumerate() {
                let r = t * per + i;
                if !rows.terms(r, xi, &mut mul, &mut add) {
                    return Err(RuntimeError::Corrupt {
                        tensor: rows.name.to_string(),
                        message: format!("the scales or offsets of row {r} do not decode"),
                    });
                }
                rows.row::<true>(r, &mul, &add, &mut acc);
            }
            Ok(acc)
        })
        .collect::<Result<Vec<_>>>()?;
    y.copy_from_slice(&sum_in_order(sums));
    Ok(())
}

/// The element-wise sum of the tasks' partial sums (all of one length), added in task order so
/// that a result does not depend on which task finished first.
fn sum_in_order(parts: Vec<Vec<f32>>) -> Vec<f32> {
    let mut parts = parts.into_iter();
    let mut total = parts.next().unwrap_or_default();
    for part in parts {
        total.iter_mut().zip(&part).for_each(|(o, &v)| *o += v);
    }
    total
}

/// A byte-aligned 4- or 8-bit affine tensor (bits 8, or 4 with even rows and groups) on a CPU
/// with AVX2 and FMA: its rows dequantized by `avx2::affine_dequant`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct AffineRows<'a> {
    name: &'a str,
    params: &'a hwz::AffineParams,
    codes: &'a [u8],
    scales: &'a [u8],
    offsets: &'a [u8],
    glen: usize,
    /// Groups a row.
    gpr: usize,
    row_bytes: usize,
}

impl<'a> AffineRows<'a> {
    fn new(view: &'a TensorView<'_>) -> Option<AffineRows<'a>> {
        #[cfg(target_arch = "x86_64")]
        if let Parts::Affine {
            params,
            codes,
            scales,
            offsets,
        } = view.parts_ref()
        {
            let cols = view.cols() as usize;
            let bits = params.bits;
            let glen = match params.group {
                Group::Size(g) => (g as usize).min(cols).max(1),
                Group::Row | Group::Tensor => cols.max(1),
            };
            let aligned =
                bits == 4 && cols.is_multiple_of(2) && glen.is_multiple_of(2) || bits == 8;
            return (aligned && crate::simd::has_avx2()).then_some(AffineRows {
                name: view.name(),
                params,
                codes,
                scales,
                offsets,
                glen,
                gpr: cols.div_ceil(glen),
                row_bytes: cols * bits as usize / 8,
            });
        }
        let _ = view;
        None
    }

    /// Row `r`'s `mul` and `add` per group (`ŵ = q·mul + add`), times `k`; `false` where its
    /// scales do not decode.
    fn terms(&self, r: usize, k: f32, mul: &mut [f32], add: &mut [f32]) -> bool {
        let p = self.params;
        let tensor_scale = matches!(p.group, Group::Tensor);
        let n = if tensor_scale { 1 } else { self.gpr };
        let first = if tensor_scale { 0 } else { r * self.gpr };
        let (mut s, mut o) = ([0f32; 64], [0f32; 64]);
        let h = (1u32 << (p.bits - 1)) as f32;
        // Groups a batch of 64 at a time (no allocation a row).
        for j0 in (0..n).step_by(64) {
            let m = (n - j0).min(64);
            if scales_into(self.scales, p.scale_dtype, first + j0, &mut s[..m]).is_err()
                || !p.symmetric
                    && scales_into(self.offsets, p.scale_dtype, first + j0, &mut o[..m]).is_err()
            {
                return false;
            }
            for j in j0..j0 + m {
                let (sj, oj) = (
                    s[j - j0],
                    if p.symmetric {
                        -h * s[j - j0]
                    } else {
                        o[j - j0]
                    },
                );
                (mul[j], add[j]) = (k * sj, k * oj);
            }
        }
        if tensor_scale {
            let (m0, a0) = (mul[0], add[0]);
            mul.fill(m0);
            add.fill(a0);
        }
        true
    }

    /// Row `r` dequantized with `mul` and `add` ([`AffineRows::terms`]) into `out` (`ACC`:
    /// added into it).
    fn row<const ACC: bool>(&self, r: usize, mul: &[f32], add: &[f32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA are present (new); the row's codes are byte-aligned (bits 8, or
        // 4 with even rows and groups) and mul/add hold one value per group.
        unsafe {
            crate::avx2::affine_dequant::<ACC>(
                self.params.bits,
                &self.codes[r * self.row_bytes..(r + 1) * self.row_bytes],
                self.glen,
                mul,
                add,
                out,
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (r, mul, add, out);
    }
}

/// `out (n × batch) = w (n × cols) · xᵀ` with `x` `batch × cols`, on the calling thread.
pub(crate) fn gemm_wxt(w: &[f32], n: usize, cols: usize, x: &[f32], batch: usize, out: &mut [f32]) {
    debug_assert!(w.len() >= n * cols && x.len() >= batch * cols && out.len() >= n * batch);
    // SAFETY: the three buffers hold the values the strides address (checked above by the
    // callers' shapes): out is n × batch row-major, w is n × cols row-major and xᵀ is read as
    // cols × batch through x's row-major batch × cols layout.
    unsafe {
        gemm::gemm(
            n,
            batch,
            cols,
            out.as_mut_ptr(),
            1,
            batch as isize,
            false,
            w.as_ptr(),
            1,
            cols as isize,
            x.as_ptr(),
            cols as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// A lattice or trellis leaf read in its RHT domain (a transposed product sums its rows there):
/// a row's values before the inverse transform, `width` of them, the first `cols` the RHT of
/// the weight row.
enum Rotated<'a> {
    /// Fixed-rate lattice points scaled by `σ_r/α` ([`fixed_points`]).
    Fixed {
        view: &'a TensorView<'static>,
        l: &'a hwz::LatticeParts<'static>,
        /// Each row's points in [`blocked_index`] order ([`e8_blocked`]).
        blocked: bool,
    },
    /// Entropy-coded lattice points ([`coded_points`]).
    Coded {
        view: &'a TensorView<'static>,
        l: &'a hwz::LatticeParts<'static>,
        /// Symbols a chunk.
        chunk: usize,
    },
    /// Trellis values times the row scales ([`trellis_values`]).
    Trellis {
        view: &'a TensorView<'static>,
        t: &'a hwz::TrellisParts<'static>,
    },
}

impl Rotated<'_> {
    fn view(&self) -> &TensorView<'static> {
        match self {
            Rotated::Fixed { view, .. }
            | Rotated::Coded { view, .. }
            | Rotated::Trellis { view, .. } => view,
        }
    }

    /// Values a row decodes to (lattice rows: whole words).
    fn width(&self) -> usize {
        match self {
            Rotated::Fixed { l, .. } | Rotated::Coded { l, .. } => l.symbols_per_row,
            Rotated::Trellis { view, .. } => view.cols() as usize,
        }
    }

    /// Rows `r0..` into `w` (`w.len() / width` rows).
    fn decode(&self, r0: usize, w: &mut [f32], scratch: &mut Points) -> Result<()> {
        match self {
            Rotated::Fixed { view, l, blocked } => fixed_points(view, l, *blocked, r0, w),
            Rotated::Coded { view, l, chunk } => coded_points(view, l, *chunk, r0, w, scratch),
            Rotated::Trellis { view, t } => trellis_values(view, t, r0, w),
        }
    }

    /// Each row of `y` (`cols` values) = the inverse RHT of that row of `sums` (`width`
    /// values, put back in order first where they were decoded blocked).
    fn rotate_back(&self, sums: &[f32], y: &mut [f32]) -> Result<()> {
        let view = self.view();
        let (cols, width) = (view.cols() as usize, self.width());
        let (tile, seed) = match self {
            Rotated::Fixed { l, .. } | Rotated::Coded { l, .. } => (l.params.tile, l.params.seed),
            Rotated::Trellis { t, .. } => (t.tile, t.seed),
        };
        let rht =
            Rht::new(cols, tile, seed).map_err(|e| corrupt(view, format!("transform: {e}")))?;
        for (sum, out) in sums.chunks_exact(width).zip(y.chunks_exact_mut(cols)) {
            if let Rotated::Fixed { blocked: true, .. } = self {
                for (pos, o) in out.iter_mut().enumerate() {
                    *o = sum[blocked_index(width / 8, pos)];
                }
            } else {
                out.copy_from_slice(&sum[..cols]);
            }
            rht.inverse(out);
        }
        Ok(())
    }
}

/// `acc += X·W` for the `batch × n` block of activations at the start of each row of `x`
/// (rows `stride` apart) and `W` of `n × outputs` (row-major), `acc` `batch × outputs`.
fn gemm_xw_add(
    x: &[f32],
    stride: usize,
    batch: usize,
    w: &[f32],
    n: usize,
    outputs: usize,
    acc: &mut [f32],
) {
    if batch == 0 || n == 0 || outputs == 0 {
        return;
    }
    assert!(
        w.len() >= n * outputs
            && acc.len() >= batch * outputs
            && x.len() >= (batch - 1) * stride + n
            && n <= stride
    );
    // SAFETY: the asserts above: acc is batch × outputs row-major, w is n × outputs row-major,
    // and the activation block is batch rows of n values, `stride` apart, within x.
    unsafe {
        gemm::gemm(
            batch,
            outputs,
            n,
            acc.as_mut_ptr(),
            1,
            outputs as isize,
            true,
            x.as_ptr(),
            1,
            stride as isize,
            w.as_ptr(),
            1,
            outputs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `out` (`cols × rows`) = `w` (`rows × cols`) transposed, in blocks that stay in the cache.
fn transpose_into(w: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    const B: usize = 32;
    for r0 in (0..rows).step_by(B) {
        for c0 in (0..cols).step_by(B) {
            for r in r0..(r0 + B).min(rows) {
                for c in c0..(c0 + B).min(cols) {
                    out[c * rows + r] = w[r * cols + c];
                }
            }
        }
    }
}

/// `X' = RHT(X)` for `batch` activation rows, each zero-padded to whole lattice words:
/// `⟨RHT⁻¹(q), x⟩ = ⟨q, RHT(x)⟩` (the RHT is orthogonal), so a lattice row is dotted against
/// the rotated activation instead of being rotated back itself.
fn rotated(
    view: &TensorView<'_>,
    l: &hwz::LatticeParts<'_>,
    x: &[f32],
    batch: usize,
) -> Result<Vec<f32>> {
    rotate_rows(
        view,
        l.params.tile,
        l.params.seed,
        l.symbols_per_row,
        x,
        batch,
    )
}

/// `RHT(X)` (tile `tile`, seed `seed`) for `batch` rows of the view's columns, each written
/// into `width ≥ cols` values (zero-padded): the activations lattice and trellis rows are
/// dotted against.
fn rotate_rows(
    view: &TensorView<'_>,
    tile: usize,
    seed: u64,
    width: usize,
    x: &[f32],
    batch: usize,
) -> Result<Vec<f32>> {
    let cols = view.cols() as usize;
    let rht = Rht::new(cols, tile, seed).map_err(|e| corrupt(view, format!("transform: {e}")))?;
    let mut xr = vec![0f32; batch * width];
    for (src, dst) in x
        .chunks_exact(cols.max(1))
        .zip(xr.chunks_exact_mut(width.max(1)))
    {
        dst[..cols].copy_from_slice(src);
        rht.forward(&mut dst[..cols]);
    }
    Ok(xr)
}

/// `yt = W·X'ᵀ` by row tiles on the pool: `decode(r0, w)` writes the tile's rows from `r0`
/// (`w.len() / width` rows of `width` values, in the order `xr`'s rows use), then the GEMM.
fn gemm_decoded_tiles(
    yt: &mut [f32],
    rows: usize,
    width: usize,
    batch: usize,
    xr: &[f32],
    decode: impl Fn(usize, &mut [f32]) -> Result<()> + Sync,
) -> Result<()> {
    let tasks = row_tiles(yt, tile_rows_for(rows, width), batch);
    tasks
        .into_par_iter()
        .try_for_each_init(Vec::new, |w: &mut Vec<f32>, (r0, out)| -> Result<()> {
            let n = out.len() / batch;
            w.resize(n * width, 0.0);
            decode(r0, w)?;
            gemm_wxt(w, n, width, xr, batch, out);
            Ok(())
        })
}

/// `yt` (`rows × batch`) cut into tiles of `tile_rows` rows, each with its first row (none
/// for an empty batch).
fn row_tiles(yt: &mut [f32], tile_rows: usize, batch: usize) -> Vec<(usize, &mut [f32])> {
    yt.chunks_mut((tile_rows * batch).max(1))
        .enumerate()
        .map(|(i, c)| (i * tile_rows, c))
        .collect()
}

/// Rows per GEMM tile: at most [`TILE_VALUES`] values, and at least two tiles per thread when
/// the matrix has the rows for it (a small matrix is not left to one core).
fn tile_rows_for(rows: usize, cols: usize) -> usize {
    let per_thread = rows.div_ceil(2 * rayon::current_num_threads());
    (TILE_VALUES / cols.max(1)).min(per_thread).max(1)
}

/// Fixed-rate lattice rows above [`SMALL_BATCH`]: the activations are rotated once
/// (`X' = RHT(X)`), then tiles of lattice points scaled by `σ_r/α` — no inverse transform per
/// weight row — are decoded and multiplied with `X'ᵀ` by the GEMM.
fn lattice_points_gemm(
    view: &TensorView<'_>,
    l: &hwz::LatticeParts<'_>,
    x: &[f32],
    batch: usize,
    yt: &mut [f32],
) -> Result<()> {
    if !matches!(l.symbols, Symbols::Fixed { .. }) {
        return lattice_coded_gemm(view, l, x, batch, yt);
    }
    let (rows, cols) = (view.rows() as usize, view.cols() as usize);
    let spr = l.symbols_per_row;
    if rows == 0 || cols == 0 {
        yt.fill(0.0);
        return Ok(());
    }
    let mut xr = rotated(view, l, x, batch)?;
    // The GEMM's inner dimension may be in any order, so X' is put in the points' order once.
    let blocked = e8_blocked(l);
    if blocked {
        let mut row = vec![0f32; spr];
        for xrow in xr.chunks_exact_mut(spr) {
            row.copy_from_slice(xrow);
            for (pos, v) in row.iter().enumerate() {
                xrow[blocked_index(spr / 8, pos)] = *v;
            }
        }
    }
    gemm_decoded_tiles(yt, rows, spr, batch, &xr, |r0, w| {
        fixed_points(view, l, blocked, r0, w)
    })
}

/// Whether [`fixed_points`] writes `l`'s rows blocked: 4-bit E8 in AVX2 writes each row's
/// points field-major per block of 8 words ([`blocked_index`]; see `avx2::e8_points4`).
fn e8_blocked(l: &hwz::LatticeParts<'_>) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        l.params.lattice == Lattice::E8
            && matches!(l.symbols, Symbols::Fixed { bits: 4, .. })
            && crate::simd::has_avx2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = l;
        false
    }
}

/// Rows `r0..` of a fixed-rate lattice tensor as lattice points scaled by `σ_r/α` (`w.len() /
/// spr` rows of `spr` values: the rows' RHT, zero-padded to whole words); `blocked`: 4-bit E8
/// rows in AVX2 with each row's coordinates in [`blocked_index`] order.
fn fixed_points(
    view: &TensorView<'_>,
    l: &hwz::LatticeParts<'_>,
    blocked: bool,
    r0: usize,
    w: &mut [f32],
) -> Result<()> {
    let Symbols::Fixed { bits, packed } = &l.symbols else {
        return Err(corrupt(view, "fixed-rate points of coded symbols".into()));
    };
    let spr = l.symbols_per_row;
    let (p, lat) = (&l.params, l.params.lattice);
    let d = lat.dim();
    let n = w.len() / spr.max(1);
    if blocked {
        #[cfg(target_arch = "x86_64")]
        {
            let nw = spr / 8;
            for (i, wr) in w.chunks_exact_mut(spr).enumerate() {
                let r = r0 + i;
                let k = l.scales[r] / p.alpha;
                // SAFETY: AVX2 is present (blocked); the row holds nw 4-byte words.
                unsafe {
                    crate::avx2::e8_points4(&packed[r * nw * 4..(r + 1) * nw * 4], k, wr);
                }
            }
        }
        return Ok(());
    }
    let rows = view.rows() as usize;
    let mut codes = vec![0u8; n * spr];
    scalar::unpack_bits_range_into(packed, *bits, rows * spr, r0 * spr, &mut codes)
        .map_err(|e| corrupt(view, format!("lattice symbols: {e}")))?;
    let mut syms = [0u32; 8];
    for (i, (wr, cr)) in w
        .chunks_exact_mut(spr)
        .zip(codes.chunks_exact(spr))
        .enumerate()
    {
        let k = l.scales[r0 + i] / p.alpha;
        for (pw, cw) in wr.chunks_exact_mut(d).zip(cr.chunks_exact(d)) {
            syms[..d]
                .iter_mut()
                .zip(cw)
                .for_each(|(s, &c)| *s = c as u32);
            lat.decode_word_fixed(&syms[..d], *bits, pw);
            pw.iter_mut().for_each(|v| *v *= k);
        }
    }
    Ok(())
}

/// Entropy-coded lattice rows above [`SMALL_BATCH`]: `X' = RHT(X)` once, then per tile of
/// rows (whole chunks where rows and chunks align) the covering chunks are decoded, the
/// symbols become lattice points scaled by `σ_r/α` — no inverse transform per weight row —
/// and the GEMM multiplies them with `X'ᵀ`.
fn lattice_coded_gemm(
    view: &TensorView<'_>,
    l: &hwz::LatticeParts<'_>,
    x: &[f32],
    batch: usize,
    yt: &mut [f32],
) -> Result<()> {
    let (rows, cols) = (view.rows() as usize, view.cols() as usize);
    let spr = l.symbols_per_row;
    let Some((chunk, _)) = l.symbols.chunking() else {
        return lattice_points_gemm(view, l, x, batch, yt);
    };
    if rows == 0 || cols == 0 || spr == 0 {
        yt.fill(0.0);
        return Ok(());
    }
    let xr = rotated(view, l, x, batch)?;
    let tile_rows = tile_rows_for(rows, spr).max(chunk / spr);
    let tasks = row_tiles(yt, tile_rows, batch);
    tasks.into_par_iter().try_for_each_init(
        || (Vec::new(), Points::default()),
        |(w, scratch): &mut (Vec<f32>, Points), (r0, out)| -> Result<()> {
            let n = out.len() / batch;
            w.resize(n * spr, 0.0);
            coded_points(view, l, chunk, r0, w, scratch)?;
            gemm_wxt(w, n, spr, &xr, batch, out);
            Ok(())
        },
    )
}

/// Buffers of [`coded_points`]: the rows' symbols, and the last chunk decoded (tiles walked in
/// order share the chunk at their boundary: decoded once).
#[derive(Default)]
struct Points {
    symbols: Vec<u32>,
    chunk: Vec<u32>,
    /// The chunk `chunk` holds and the symbols it covers.
    held: Option<(usize, Range<usize>)>,
}

/// Rows `r0..` of an entropy-coded lattice tensor (chunks of `chunk` symbols) as lattice
/// points scaled by `σ_r/α` (`w.len() / spr` rows of `spr` values): the chunks that cover them
/// are decoded (the last one kept in `scratch` for the next tile).
fn coded_points(
    view: &TensorView<'_>,
    l: &hwz::LatticeParts<'_>,
    chunk: usize,
    r0: usize,
    w: &mut [f32],
    scratch: &mut Points,
) -> Result<()> {
    let spr = l.symbols_per_row;
    let lat = l.params.lattice;
    let d = lat.dim();
    let n = w.len() / spr.max(1);
    let (first, end) = (r0 * spr, (r0 + n) * spr);
    let Points {
        symbols: syms,
        chunk: buf,
        held,
    } = scratch;
    syms.clear();
    for c in first / chunk..end.div_ceil(chunk) {
        let have = match held {
            Some((k, have)) if *k == c => have.clone(),
            _ => {
                *held = None; // (until the chunk is whole in `buf`)
                let have = decode_chunk(view, &l.symbols, lat, c, buf)?;
                *held = Some((c, have.clone()));
                have
            }
        };
        let (a, b) = (have.start.max(first), have.end.min(end));
        if a < b {
            syms.extend_from_slice(&buf[a - have.start..b - have.start]);
        }
    }
    if syms.len() != n * spr {
        return Err(corrupt(view, "symbols end before the last row".into()));
    }
    for (i, (wr, sr)) in w
        .chunks_exact_mut(spr)
        .zip(syms.chunks_exact(spr))
        .enumerate()
    {
        let k = l.scales[r0 + i] / l.params.alpha;
        for (pw, sw) in wr.chunks_exact_mut(d).zip(sr.chunks_exact(d)) {
            lat.decode_word(sw, pw);
            pw.iter_mut().for_each(|v| *v *= k);
        }
    }
    Ok(())
}

/// Where coordinate `pos` (word `pos / 8`, coordinate `pos % 8`) of a row of `nw` E8 words
/// sits in the field-major blocked order: blocks of 8 words, within a block coordinate `i` of
/// its `m` words (8, or fewer in the last block) contiguous.
pub(crate) fn blocked_index(nw: usize, pos: usize) -> usize {
    let (w, i) = (pos / 8, pos % 8);
    let (blk, wi) = (w / 8, w % 8);
    let m = (nw - blk * 8).min(8);
    blk * 64 + i * m + wi
}

/// Batch-1 `y = W·x` of one stored tensor by its fast path.
fn leaf_gemv(view: &TensorView<'_>, kind: Kind, x: &[f32], y: &mut [f32]) -> Result<()> {
    let cols = view.cols() as usize;
    if y.is_empty() {
        return Ok(());
    }
    if cols == 0 {
        y.fill(0.0);
        return Ok(());
    }
    match (kind, view.parts_ref()) {
        (Kind::Dense, Parts::Raw { dtype, values }) => {
            let size = dtype.size();
            par_rows(y, 1, cols, |r0, out| {
                let mut buf = Vec::new();
                for (i, o) in out.iter_mut().enumerate() {
                    let row = &values[(r0 + i) * cols * size..(r0 + i + 1) * cols * size];
                    *o = match dtype {
                        FloatDtype::Bf16 => kernels::dot_bf16(row, x),
                        _ => {
                            buf.resize(cols, 0.0);
                            scalar::decode_floats_into(row, *dtype, &mut buf)
                                .map_err(|e| corrupt(view, format!("raw row: {e}")))?;
                            kernels::dot_f32(&buf, x)
                        }
                    };
                }
                Ok(())
            })
        }
        (Kind::Affine { glen, gpr, fused }, _) => affine_gemv(view, (glen, gpr, fused), x, 1, y),
        (Kind::E8Fixed | Kind::LatticeWords | Kind::LatticeResident, Parts::Lattice(l)) => {
            lattice_gemv(view, l, x, y)
        }
        (Kind::Trellis, Parts::Trellis(t)) => trellis_gemv(view, t, x, 1, y),
        (Kind::Codebook, Parts::Codebook(c)) => codebook_gemv(view, c, x, y),
        (Kind::LowRank, Parts::LowRank(l)) => {
            let r = l.rank;
            // z = diag(su)·diag(sv)·Vᵀx, then y = U·z.
            let mut z = vec![0f32; r];
            for (j, vrow) in l.v.chunks_exact(r.max(1)).enumerate() {
                for (k, &c) in vrow.iter().enumerate() {
                    z[k] += c as i8 as f32 * x[j];
                }
            }
            for (k, zk) in z.iter_mut().enumerate() {
                *zk *= l.v_scales[k] * l.u_scales[k];
            }
            for (o, urow) in y.iter_mut().zip(l.u.chunks_exact(r.max(1))) {
                *o = urow
                    .iter()
                    .zip(&z)
                    .map(|(&c, zk)| c as i8 as f32 * zk)
                    .sum();
            }
            Ok(())
        }
        (Kind::Sparse, Parts::Sparse { entries }) => {
            y.fill(0.0);
            add_sparse(entries, cols, x, 1, y);
            Ok(())
        }
        _ => tiles(view, x, 1, y),
    }
}

/// `yt = W·xᵀ` for `batch` rows of `x` (`yt` is `rows × batch`) on affine codes: one row at a
/// time ([`kernels::affine_row`]) or several at once ([`kernels::affine_rows`]).
fn affine_gemv(
    view: &TensorView<'_>,
    (glen, gpr, fused): (usize, usize, bool),
    x: &[f32],
    batch: usize,
    yt: &mut [f32],
) -> Result<()> {
    let Parts::Affine {
        params,
        codes,
        scales,
        offsets,
    } = view.parts_ref()
    else {
        return Err(corrupt(view, "not an affine tensor".into()));
    };
    let cols = view.cols() as usize;
    let rows = view.rows() as usize;
    if batch == 0 || rows == 0 || cols == 0 {
        yt.fill(0.0);
        return Ok(());
    }
    let bits = params.bits;
    let per = if fused { kernels::word_codes(bits) } else { 1 };
    // Each activation row permuted per group so each field of the codes meets a contiguous
    // run, and its sum over each group (what the offsets and the code bias multiply).
    let mut xp = vec![0f32; batch * cols];
    let mut gsum = vec![0f32; batch * gpr];
    for ((xm, pm), sm) in x
        .chunks_exact(cols)
        .zip(xp.chunks_exact_mut(cols))
        .zip(gsum.chunks_exact_mut(gpr))
        .take(batch)
    {
        for (j, g) in xm.chunks(glen).enumerate() {
            let n = g.len() / per;
            let out = &mut pm[j * glen..j * glen + g.len()];
            for (i, &v) in g.iter().enumerate() {
                out[(i % per) * n + i / per] = v;
            }
            sm[j] = g.iter().sum();
        }
    }
    let tensor_scale = matches!(params.group, Group::Tensor);
    let bias = if params.bits == 1 {
        -1.0
    } else {
        (1u32 << (bits - 1)) as f32
    };
    let sd = params.scale_dtype;
    let row_bytes = cols * bits as usize / 8;
    let per_row_scales = if tensor_scale { 1 } else { gpr };
    par_rows(yt, batch, cols, |r0, out| {
        let mut buf = vec![0u8; if fused { 0 } else { cols }];
        let mut sc = vec![0f32; per_row_scales];
        let mut of = vec![0f32; if params.symmetric { 0 } else { per_row_scales }];
        for (i, o) in out.chunks_exact_mut(batch).enumerate() {
            let r = r0 + i;
            let row: &[u8] = if fused {
                &codes[r * row_bytes..(r + 1) * row_bytes]
            } else {
                scalar::unpack_bits_range_into(codes, bits, rows * cols, r * cols, &mut buf)
                    .map_err(|e| corrupt(view, format!("affine codes: {e}")))?;
                &buf
            };
            let first = if tensor_scale { 0 } else { r * gpr };
            let bad = |e| corrupt(view, format!("affine scales: {e}"));
            scales_into(scales, sd, first, &mut sc).map_err(bad)?;
            scales_into(offsets, sd, first, &mut of).map_err(bad)?;
            let a = kernels::AffineRow {
                field_bits: if fused { bits } else { 8 },
                per,
                glen,
                codes: row,
                xp: &xp,
                gsum: &gsum,
                scales: &sc,
                offsets: &of,
                bias,
            };
            if batch == 1 {
                o[0] = kernels::affine_row(&a);
            } else {
                kernels::affine_rows(&a, cols, gpr, o);
            }
        }
        Ok(())
    })
}

/// `out.len()` values of a little-endian `dtype` array from index `first`, as f32.
fn scales_into(
    bytes: &[u8],
    dtype: FloatDtype,
    first: usize,
    out: &mut [f32],
) -> std::result::Result<(), scalar::ScalarError> {
    let size = dtype.size();
    let src = bytes
        .get(first * size..(first + out.len()) * size)
        .unwrap_or_default();
    scalar::decode_floats_into(src, dtype, out)
}

fn lattice_gemv(
    view: &TensorView<'_>,
    l: &hwz::LatticeParts<'_>,
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    let cols = view.cols() as usize;
    let spr = l.symbols_per_row;
    let p = &l.params;
    let xr = rotated(view, l, x, 1)?;
    let lat = p.lattice;
    let e8 = (lat == Lattice::E8).then(|| E8Activation::new(&xr));
    let scale = |r: usize| l.scales[r] / p.alpha;
    // The dot product of one row of fixed-rate symbols by decoding its words (entropy-coded
    // symbols: `Lattice::coded_dot`).
    let fixed_dot = |syms: &[u32], bits: u8| -> f32 {
        let d = lat.dim();
        let mut point = [0f32; 8];
        let mut acc = 0f32;
        for (s, xw) in syms.chunks_exact(d).zip(xr.chunks_exact(d)) {
            lat.decode_word_fixed(s, bits, &mut point[..d]);
            acc += point[..d].iter().zip(xw).map(|(a, b)| a * b).sum::<f32>();
        }
        acc
    };
    match &l.symbols {
        Symbols::Fixed { bits, packed } => {
            let bits = *bits;
            let rows = view.rows() as usize;
            par_rows(y, 1, cols, |r0, out| {
                let mut codes = vec![0u8; spr];
                let mut syms = vec![0u32; spr];
                for (i, o) in out.iter_mut().enumerate() {
                    let r = r0 + i;
                    let dot = match &e8 {
                        Some(a) => {
                            let wb = bits as usize;
                            let nw = spr / 8;
                            kernels::e8_fixed_dot(bits, &packed[r * nw * wb..(r + 1) * nw * wb], a)
                        }
                        None => {
                            scalar::unpack_bits_range_into(
                                packed,
                                bits,
                                rows * spr,
                                r * spr,
                                &mut codes,
                            )
                            .map_err(|e| corrupt(view, format!("lattice symbols: {e}")))?;
                            syms.iter_mut()
                                .zip(&codes)
                                .for_each(|(s, &c)| *s = c as u32);
                            fixed_dot(&syms, bits)
                        }
                    };
                    *o = scale(r) * dot;
                }
                Ok(())
            })
        }
        symbols => {
            let row_dot = |syms: &[u32]| match &e8 {
                Some(a) => kernels::e8_coded_dot(syms, a),
                None => lat.coded_dot(syms, &xr),
            };
            resident(view, symbols, spr, y, |r, syms| scale(r) * row_dot(syms))
        }
    }
}

/// Trellis rows above [`SMALL_BATCH`]: `X' = RHT(X)` once, then tiles of decoded codes times
/// the row scales (no inverse transform per weight row) multiplied with `X'ᵀ` by the GEMM.
fn trellis_points_gemm(
    view: &TensorView<'_>,
    t: &hwz::TrellisParts<'_>,
    x: &[f32],
    batch: usize,
    yt: &mut [f32],
) -> Result<()> {
    let (rows, cols) = (view.rows() as usize, view.cols() as usize);
    if rows == 0 || cols == 0 {
        yt.fill(0.0);
        return Ok(());
    }
    let xr = rotate_rows(view, t.tile, t.seed, cols, x, batch)?;
    gemm_decoded_tiles(yt, rows, cols, batch, &xr, |r0, w| {
        trellis_values(view, t, r0, w)
    })
}

/// Rows `r0..` of a trellis tensor as their values in the RHT domain times the row scales
/// (`w.len() / cols` rows).
fn trellis_values(
    view: &TensorView<'_>,
    t: &hwz::TrellisParts<'_>,
    r0: usize,
    w: &mut [f32],
) -> Result<()> {
    let cols = view.cols() as usize;
    let rb = t.row_bytes(cols);
    for (i, wr) in w.chunks_exact_mut(cols).enumerate() {
        let r = r0 + i;
        hypercodec_trellis::decode_row(&t.bits[r * rb..(r + 1) * rb], t.seq, &t.params, wr)
            .map_err(|e| corrupt(view, format!("trellis bits: {e}")))?;
        let s = t.scales[r];
        wr.iter_mut().for_each(|v| *v *= s);
    }
    Ok(())
}

/// Trellis rows at up to [`TRELLIS_ROWS_BATCH`] activation rows: `X' = RHT(X)` once, then each
/// row's bits decoded in registers and dotted with up to four rows of `X'` at once
/// ([`kernels::trellis_rows_dot`]), times the row scale. `yt` is `rows × batch`.
fn trellis_gemv(
    view: &TensorView<'_>,
    t: &hwz::TrellisParts<'_>,
    x: &[f32],
    batch: usize,
    yt: &mut [f32],
) -> Result<()> {
    let cols = view.cols() as usize;
    if batch == 0 {
        return Ok(());
    }
    let xr = rotate_rows(view, t.tile, t.seed, cols, x, batch)?;
    let rb = t.row_bytes(cols);
    let xs: Vec<&[f32]> = (0..batch).map(|b| &xr[b * cols..(b + 1) * cols]).collect();
    par_rows(yt, batch, cols * batch, |r0, out| {
        let mut buf = Vec::new();
        for (i, o) in out.chunks_exact_mut(batch).enumerate() {
            let r = r0 + i;
            for (part, xs) in o.chunks_mut(4).zip(xs.chunks(4)) {
                let dots = match xs.len() {
                    1 => trellis_dots::<1>,
                    2 => trellis_dots::<2>,
                    3 => trellis_dots::<3>,
                    _ => trellis_dots::<4>,
                };
                dots(t, r * rb, xs, &mut buf, part)
                    .map_err(|e| corrupt(view, format!("trellis bits: {e}")))?;
                part.iter_mut().for_each(|v| *v *= t.scales[r]);
            }
        }
        Ok(())
    })
}

/// The dots of the trellis row whose bits start at byte `start` with `M` activation rows
/// (`x.len()`), into `out`.
fn trellis_dots<const M: usize>(
    t: &hwz::TrellisParts<'_>,
    start: usize,
    x: &[&[f32]],
    buf: &mut Vec<f32>,
    out: &mut [f32],
) -> std::result::Result<(), hypercodec_trellis::TrellisError> {
    let x: [&[f32]; M] = std::array::from_fn(|i| x[i]);
    out.copy_from_slice(&kernels::trellis_rows_dot(
        &t.bits, start, &t.params, t.seq, x, buf,
    )?);
    Ok(())
}

/// Fixed-rate E8 rows at up to [`LATTICE_ROWS_BATCH`] activation rows: `X' = RHT(X)` once,
/// then each row's words dotted with up to four rows of `X'` at once
/// ([`kernels::e8_fixed_dots`]: 4-bit words decoded once for all of them), times the row
/// scale. `yt` is `rows × batch`.
fn e8_fixed_rows(
    view: &TensorView<'_>,
    l: &hwz::LatticeParts<'_>,
    x: &[f32],
    batch: usize,
    yt: &mut [f32],
) -> Result<()> {
    let Symbols::Fixed { bits, packed } = &l.symbols else {
        return tiles(view, x, batch, yt);
    };
    let spr = l.symbols_per_row;
    if batch == 0 || spr == 0 {
        yt.fill(0.0);
        return Ok(());
    }
    let xr = rotated(view, l, x, batch)?;
    let acts: Vec<E8Activation> = xr.chunks_exact(spr).map(E8Activation::new).collect();
    let (wb, nw) = (*bits as usize, spr / 8);
    par_rows(yt, batch, spr * batch, |r0, out| {
        for (i, o) in out.chunks_exact_mut(batch).enumerate() {
            let r = r0 + i;
            let bytes = &packed[r * nw * wb..(r + 1) * nw * wb];
            for (part, a) in o.chunks_mut(4).zip(acts.chunks(4)) {
                let dots = match a.len() {
                    1 => e8_dots::<1>,
                    2 => e8_dots::<2>,
                    3 => e8_dots::<3>,
                    _ => e8_dots::<4>,
                };
                dots(*bits, bytes, a, part);
                let s = l.scales[r] / l.params.alpha;
                part.iter_mut().for_each(|v| *v *= s);
            }
        }
        Ok(())
    })
}

/// The dots of a row of fixed-rate E8 words with `M` activations (`a.len()`), into `out`.
fn e8_dots<const M: usize>(bits: u8, bytes: &[u8], a: &[E8Activation], out: &mut [f32]) {
    let a: [&E8Activation; M] = std::array::from_fn(|i| &a[i]);
    out.copy_from_slice(&kernels::e8_fixed_dots(bits, bytes, a));
}

/// Decodes chunk `c` of entropy-coded lattice symbols into `buf`; returns its symbol range.
fn decode_chunk(
    view: &TensorView<'_>,
    symbols: &Symbols<'_>,
    lattice: Lattice,
    c: usize,
    buf: &mut Vec<u32>,
) -> Result<Range<usize>> {
    symbols
        .decode_chunk(lattice, c, buf)
        .map_err(|e| corrupt(view, format!("symbols: {e}")))
}

/// Entropy-coded rows: the chunks are split over the pool; each task decodes its chunks one at
/// a time into its own buffer and computes every row that starts in them as soon as the row is
/// complete (a row that runs into the next task's first chunk decodes that chunk too).
fn resident(
    view: &TensorView<'_>,
    symbols: &Symbols<'_>,
    spr: usize,
    y: &mut [f32],
    row_value: impl Fn(usize, &[u32]) -> f32 + Sync,
) -> Result<()> {
    let rows = y.len();
    let Some((chunk, chunks)) = symbols.chunking() else {
        return Err(corrupt(view, "fixed symbols are not resident".into()));
    };
    let lattice = match view.parts_ref() {
        Parts::Lattice(l) => l.params.lattice,
        _ => return Err(corrupt(view, "not a lattice tensor".into())),
    };
    let spr = spr.max(1);
    let decode = |c: usize, buf: &mut Vec<u32>| decode_chunk(view, symbols, lattice, c, buf);
    // Task k owns the rows whose first symbol lies in its chunks.
    let tasks = chunks.clamp(1, 2 * rayon::current_num_threads());
    let first_row = |c: usize| ((c * chunk).div_ceil(spr)).min(rows);
    let mut parts: Vec<(usize, &mut [f32])> = Vec::with_capacity(tasks);
    let mut rest = y;
    let mut r = 0;
    for k in 0..tasks {
        let end = if k + 1 == tasks {
            rows
        } else {
            first_row((k + 1) * chunks / tasks)
        };
        let (head, tail) = rest.split_at_mut(end - r);
        parts.push((r, head));
        rest = tail;
        r = end;
    }
    parts
        .into_par_iter()
        .try_for_each(|(r0, out)| -> Result<()> {
            if out.is_empty() {
                return Ok(());
            }
            let r1 = r0 + out.len();
            let (first, end) = (r0 * spr, r1 * spr);
            let mut buf = Vec::new();
            let mut pending: Vec<u32> = Vec::new();
            let mut row = r0;
            let mut c = first / chunk;
            while row < r1 {
                let have = decode(c, &mut buf)?;
                if have.is_empty() {
                    return Err(corrupt(view, "symbols end before the last row".into()));
                }
                let (a, b) = (have.start.max(first), have.end.min(end));
                let mut from = &buf[a - have.start..b - have.start];
                // Complete a row begun in the previous chunk, then rows wholly in this one.
                if !pending.is_empty() {
                    let take = (spr - pending.len()).min(from.len());
                    pending.extend_from_slice(&from[..take]);
                    from = &from[take..];
                    if pending.len() == spr {
                        out[row - r0] = row_value(row, &pending);
                        pending.clear();
                        row += 1;
                    }
                }
                let mut whole = from.chunks_exact(spr);
                for syms in whole.by_ref() {
                    out[row - r0] = row_value(row, syms);
                    row += 1;
                }
                pending.extend_from_slice(whole.remainder());
                c += 1;
            }
            Ok(())
        })
}

fn codebook_gemv(
    view: &TensorView<'_>,
    c: &hwz::CodebookParts<'_>,
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    let cols = view.cols() as usize;
    let rows = view.rows() as usize;
    let block = c.block.max(1);
    let k = c.protos.len() / block;
    let bpr = cols.div_ceil(block);
    let AssignmentsRef::Packed { bits, bytes } = &c.assignments else {
        return tiles(view, x, 1, y);
    };
    // table[b·k + p] = ⟨prototype p, block b of x⟩ (the last block may be shorter).
    let mut table = vec![0f32; bpr * k];
    for (b, xb) in x.chunks(block).enumerate() {
        for (p, t) in table[b * k..(b + 1) * k].iter_mut().enumerate() {
            *t = kernels::dot_f32(&c.protos[p * block..p * block + xb.len()], xb);
        }
    }
    let expected = c.scale_mode.count(rows, cols, block);
    if c.scales.len() != expected {
        return Err(corrupt(
            view,
            format!("{} scales, expected {expected}", c.scales.len()),
        ));
    }
    par_rows(y, 1, cols, |r0, out| {
        let mut idx = vec![0u32; bpr];
        for (i, o) in out.iter_mut().enumerate() {
            let r = r0 + i;
            pack::unpack_range_into(bytes, *bits, rows * bpr, r * bpr, &mut idx)
                .map_err(|e| corrupt(view, format!("assignments: {e}")))?;
            if let Some(bad) = idx.iter().find(|&&a| a as usize >= k) {
                return Err(corrupt(view, format!("prototype index {bad} >= {k}")));
            }
            let scales = match c.scale_mode {
                ScaleMode::Block => &c.scales[r * bpr..(r + 1) * bpr],
                ScaleMode::Tensor => &c.scales[..1],
                ScaleMode::Channel => &c.scales[r..r + 1],
            };
            let mut v = kernels::codebook_dot(&idx, k, &table, scales);
            let (s, e) = ((r * cols) as u64, ((r + 1) * cols) as u64);
            let res = &c.residual;
            let from = res.positions.partition_point(|&p| p < s);
            let to = res.positions.partition_point(|&p| p < e);
            for (&p, &d) in res.positions[from..to].iter().zip(&res.values[from..to]) {
                v += d * x[(p - s) as usize];
            }
            *o = v;
        }
        Ok(())
    })
}

/// The fixed-rate codes and row scales of an entropy-coded lattice tensor, row by row. With
/// `to_alpha = None` the stored points are kept as they are, and `None` is returned as soon as
/// one does not fit the box; with `Some(α')` every row is rescaled to `α'` times its own RMS.
#[allow(clippy::too_many_arguments)]
fn fixed_rows(
    view: &TensorView<'_>,
    l: &hwz::LatticeParts<'_>,
    lattice: Lattice,
    alpha: f32,
    bits: u8,
    scale_dtype: FloatDtype,
    to_alpha: Option<f32>,
) -> Result<Option<(Vec<u8>, Vec<f32>)>> {
    let (rows, spr) = (view.rows() as usize, l.symbols_per_row);
    let d = lattice.dim();
    let chunks = l.symbols.chunking().map_or(0, |(_, n)| n);
    let mut fixed = Vec::with_capacity(rows * spr);
    let mut scales = Vec::with_capacity(rows);
    let (mut out, mut back) = ([0u32; 8], [0f32; 8]);
    let mut points = vec![0f32; spr];
    let (mut buf, mut carry) = (Vec::new(), Vec::<u32>::new());
    for c in 0..chunks {
        decode_chunk(view, &l.symbols, lattice, c, &mut buf)?;
        carry.extend_from_slice(&buf);
        let mut row_syms = carry.chunks_exact(spr.max(1));
        for syms in row_syms.by_ref() {
            let Some(&stored) = l.scales.get(scales.len()) else {
                return Err(corrupt(view, "symbols beyond the tensor's rows".into()));
            };
            for (s, p) in syms.chunks_exact(d).zip(points.chunks_exact_mut(d)) {
                lattice.decode_word(s, p);
            }
            let (k, scale) = match to_alpha {
                None => (1.0, stored),
                Some(af) => {
                    let ms = points.iter().map(|&p| p as f64 * p as f64).sum::<f64>() / spr as f64;
                    // The row's own RMS in stored units, rounded as it will be stored.
                    let own = scale_dtype.round((stored as f64 * ms.sqrt() / alpha as f64) as f32);
                    if own > 0.0 && own.is_finite() {
                        (af * stored / (alpha * own), own)
                    } else {
                        (0.0, 0.0)
                    }
                }
            };
            for p in points.chunks_exact(d) {
                let w: [f32; 8] = std::array::from_fn(|i| p.get(i).map_or(0.0, |v| v * k));
                lattice.encode_word_fixed(&w[..d], bits, &mut out[..d]);
                if to_alpha.is_none() {
                    lattice.decode_word_fixed(&out[..d], bits, &mut back[..d]);
                    if back[..d] != w[..d] {
                        return Ok(None);
                    }
                }
                fixed.extend(out[..d].iter().map(|&o| o as u8));
            }
            scales.push(scale);
        }
        let rest = row_syms.remainder().len();
        carry.drain(..carry.len() - rest);
    }
    if fixed.len() != rows * spr || scales.len() != rows {
        return Err(corrupt(view, "symbols do not fill the tensor".into()));
    }
    Ok(Some((fixed, scales)))
}

/// [`CompressedLinear::int8_weight`] of a lattice tensor: every point, in the RHT domain,
/// as an integer (E8's doubled), or `None` where one is not (A2, a dithered tensor, a point
/// outside i8) or the rows are padded past the weight's columns. Entropy-coded symbols are
/// decoded a chunk at a time.
fn lattice_int8(
    view: &TensorView<'_>,
    l: &hwz::LatticeParts<'_>,
    rows: usize,
    cols: usize,
) -> Result<Option<Int8Weight>> {
    let p = &l.params;
    let lat = p.lattice;
    let mul = match lat {
        Lattice::Z1 | Lattice::D4 => 1.0,
        Lattice::E8 => 2.0,
        Lattice::A2 => return Ok(None),
    };
    if p.dither || l.symbols_per_row != cols || l.scales.len() != rows {
        return Ok(None);
    }
    let (d, n) = (lat.dim(), rows * cols);
    let mut values: Vec<i8> = Vec::new();
    let mut point = [0f32; 8];
    // One word's point written as integers; false where a coordinate is not one in i8.
    let put = |point: &[f32], dst: &mut [i8]| {
        point.iter().zip(dst).all(|(&v, o)| {
            let q = v * mul;
            *o = q as i8;
            q.fract() == 0.0 && (-128.0..=127.0).contains(&q)
        })
    };
    match &l.symbols {
        Symbols::Fixed { bits, packed } => {
            let mut codes = vec![0u8; n];
            scalar::unpack_bits_range_into(packed, *bits, n, 0, &mut codes)
                .map_err(|e| corrupt(view, format!("lattice symbols: {e}")))?;
            let mut syms = [0u32; 8];
            values.resize(n, 0);
            for (word, dst) in codes.chunks_exact(d).zip(values.chunks_exact_mut(d)) {
                syms[..d]
                    .iter_mut()
                    .zip(word)
                    .for_each(|(s, &c)| *s = c as u32);
                lat.decode_word_fixed(&syms[..d], *bits, &mut point[..d]);
                if !put(&point[..d], dst) {
                    return Ok(None);
                }
            }
        }
        coded => {
            let chunks = coded.chunking().map_or(0, |(_, n)| n);
            let range = |r: Range<usize>| coded.symbol_range(r);
            if range(0..chunks).len() != n {
                return Err(corrupt(view, "symbols do not fill the tensor".into()));
            }
            // Runs of chunks decoded in parallel, each starting on a word boundary (so every
            // word lies in one run) and writing its own stretch of `values`.
            let aligned: Vec<usize> = (0..chunks)
                .filter(|&c| range(c..c + 1).start % d == 0)
                .collect();
            let per = aligned
                .len()
                .div_ceil(4 * rayon::current_num_threads())
                .max(1);
            let firsts: Vec<usize> = aligned.iter().step_by(per).copied().collect();
            values.resize(n, 0);
            let mut tasks = Vec::with_capacity(firsts.len());
            let mut rest = &mut values[..];
            for (i, &c0) in firsts.iter().enumerate() {
                let c1 = firsts.get(i + 1).copied().unwrap_or(chunks);
                let (head, tail) = rest.split_at_mut(range(c0..c1).len().min(rest.len()));
                tasks.push((c0..c1, head));
                rest = tail;
            }
            let done: Vec<Result<bool>> = tasks
                .into_par_iter()
                .map(|(cs, out)| {
                    let (mut buf, mut carry, mut at) = (Vec::new(), Vec::<u32>::new(), 0usize);
                    let mut point = [0f32; 8];
                    for c in cs {
                        decode_chunk(view, &l.symbols, lat, c, &mut buf)?;
                        carry.extend_from_slice(&buf);
                        let whole = carry.len() / d * d;
                        if at + whole > out.len() {
                            return Err(corrupt(view, "symbols beyond the tensor's rows".into()));
                        }
                        for (word, dst) in carry[..whole]
                            .chunks_exact(d)
                            .zip(out[at..at + whole].chunks_exact_mut(d))
                        {
                            lat.decode_word(word, &mut point[..d]);
                            if !put(&point[..d], dst) {
                                return Ok(false);
                            }
                        }
                        at += whole;
                        carry.drain(..whole);
                    }
                    if at != out.len() {
                        return Err(corrupt(view, "symbols do not fill the tensor".into()));
                    }
                    Ok(true)
                })
                .collect();
            for r in done {
                if !r? {
                    return Ok(None);
                }
            }
        }
    }
    if values.len() != n {
        return Err(corrupt(view, "symbols do not fill the tensor".into()));
    }
    Ok(Some(Int8Weight {
        values,
        scales: l.scales.iter().map(|s| s / (p.alpha * mul)).collect(),
        group_len: cols,
        offsets: Vec::new(),
        tile: p.tile,
        seed: p.seed,
    }))
}

/// Re-quantizes an entropy-coded lattice tensor into its fixed-rate form of `bits` bits, and
/// measures the SNR of the result against the stored weight.
fn to_fixed(view: &TensorView<'_>, bits: u8) -> Result<(TensorView<'static>, f64)> {
    let option = |message: String| RuntimeError::Option {
        tensor: view.name().to_string(),
        message,
    };
    let Parts::Lattice(l) = view.parts_ref() else {
        return Err(option("fixed_bits applies to lattice tensors only".into()));
    };
    let Encoding::Lattice {
        lattice,
        alpha,
        tile,
        seed,
        scale_dtype,
        coding,
    } = view.encoding().clone()
    else {
        return Err(option("fixed_bits applies to lattice tensors only".into()));
    };
    if matches!(coding, Coding::Fixed { .. }) {
        return Err(option("the tensor is already fixed-rate".into()));
    }
    if !(2..=8).contains(&bits) || !lattice.has_fixed() {
        return Err(option(format!(
            "{lattice} has no fixed-rate form of {bits} bits"
        )));
    }
    // The stored points are kept, with their scales and α, when every one fits the fixed box
    // (no loss). Otherwise every row is re-quantized at the fixed form's calibrated α against
    // its own RMS, which is what the box is sized for: an entropy-coded row may be scaled by
    // its tensor's RMS (`LatticeScale::Tensor`) and its α is fitted to an entropy-coded rate.
    let exact = fixed_rows(view, l, lattice, alpha, bits, scale_dtype, None)?;
    let (alpha, (fixed, scales)) = match exact {
        Some(done) => (alpha, done),
        None => {
            let af =
                hypercodec_lattice::calibration::fixed_alpha(lattice, bits).map_or(alpha, |f| f.0);
            let done = fixed_rows(view, l, lattice, alpha, bits, scale_dtype, Some(af))?
                .ok_or_else(|| corrupt(view, "symbols do not fill the tensor".into()))?;
            (af, done)
        }
    };
    let packed = scalar::pack_bits(&fixed, bits).map_err(|e| option(format!("packing: {e}")))?;
    let scales = scalar::encode_floats(&scales, scale_dtype, false)
        .map_err(|e| option(format!("scales: {e}")))?;
    let encoding = Encoding::Lattice {
        lattice,
        alpha,
        tile,
        seed,
        scale_dtype,
        coding: Coding::Fixed { bits },
    };
    let streams = [
        (hwz::role::SCALES, &scales[..]),
        (hwz::role::SYMBOLS, &packed[..]),
    ];
    let fixed_view = TensorView::new(view.name(), &encoding, view.shape(), &streams)?.into_owned();
    let snr = crate::reference::snr_db(view, &fixed_view)?;
    Ok((fixed_view, snr))
}
