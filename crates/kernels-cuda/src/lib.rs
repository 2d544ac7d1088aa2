//! hypercodec-kernels-cuda: the CUDA kernels of hypercodec — GEMV on the stored form of a
//! weight (affine codes, fixed-rate, rANS- and prefix-coded E8 words, bitshift-trellis bits), the
//! activation RHT, decoders to a dense weight for large batches, the KV cache's codec and
//! attention, and the trellis encoder (the CPU's Viterbi search and bits) — built to PTX from
//! `kernels/` by `cargo xtask ptx` (for sm_80; a Hopper-only GEMM for sm_90a, loaded on compute
//! capability 9.0 unless [`WGMMA_ENV`] turns it off), embedded with `include_str!` and
//! launched through the CUDA driver API.
//!
//! Key design decision: this crate takes **device pointers and parameter structs** and knows
//! nothing of `hwz` or of any framework. Buffers are allocated by the caller (PyTorch, in the
//! wheel: its memory counters see every byte) and launches go on the caller's stream, so a
//! forward never synchronizes the device. The kernels read the `.hwz` streams as stored
//! (codes, words), so nothing is re-encoded at load. CUDA sits behind the `cuda` feature and
//! cudarc loads the driver at run time, so `cargo build` never needs nvcc or a GPU; without
//! the feature (or without a driver) the API stays the same and returns a typed error.
//!
//! ```
//! use hypercodec_kernels_cuda::{CudaError, Kernels};
//! // On a machine without a GPU (or without the `cuda` feature) this is a typed error.
//! match Kernels::new(0) {
//!     Ok(k) => println!("{} functions loaded", k.functions()),
//!     Err(CudaError::NotCompiled | CudaError::NoDevice(_)) => println!("no CUDA here"),
//!     Err(e) => println!("{e}"),
//! }
//! ```
#![deny(missing_docs)]

mod args;
#[cfg(feature = "cuda")]
mod driver;

/// Without the `cuda` feature: a module that never loads (so no launch is ever reached).
#[cfg(not(feature = "cuda"))]
mod driver {
    use crate::{CudaError, Result};

    pub(crate) struct Module;

    impl Module {
        pub(crate) fn load(_ordinal: usize, _arch_modules: bool) -> Result<Self> {
            Err(CudaError::NotCompiled)
        }

        pub(crate) fn max_shared(&self) -> u32 {
            48 * 1024
        }

        pub(crate) fn sms(&self) -> u32 {
            1
        }

        pub(crate) fn has(&self, _f: usize) -> bool {
            false
        }

        pub(crate) fn resident_blocks(&self, _f: usize, _t: u32, _s: u32) -> Result<u32> {
            Err(CudaError::NotCompiled)
        }

        pub(crate) fn alloc(&self, _bytes: usize) -> Result<DeviceBuffer> {
            Err(CudaError::NotCompiled)
        }

        pub(crate) fn upload(&self, _dst: &DeviceBuffer, _src: &[u8]) -> Result<()> {
            Err(CudaError::NotCompiled)
        }

        pub(crate) fn download(&self, _dst: &mut [u8], _src: &DeviceBuffer) -> Result<()> {
            Err(CudaError::NotCompiled)
        }

        pub(crate) unsafe fn launch(
            &self,
            _f: usize,
            _grid: (u32, u32),
            _block: u32,
            _shared: u32,
            _stream: u64,
            _params: &mut [*mut std::ffi::c_void],
        ) -> Result<()> {
            Err(CudaError::NotCompiled)
        }
    }

    pub(crate) struct DeviceBuffer;

    pub(crate) struct TensorMap;

    pub(crate) fn tensor_map_2d(
        _ptr: u64,
        _f16: bool,
        _rows: usize,
        _cols: usize,
        _box_rows: u32,
    ) -> Result<TensorMap> {
        Err(CudaError::NotCompiled)
    }

    impl DeviceBuffer {
        pub(crate) fn ptr(&self) -> u64 {
            0
        }
    }
}

/// Everything that can go wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// This build has no CUDA support (the `cuda` feature is off).
    NotCompiled,
    /// No usable driver or device: the driver library is missing or reports no such device.
    NoDevice(String),
    /// A driver call failed.
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its `CUresult`.
        code: i32,
    },
    /// Arguments the kernels cannot take (a bad shape, an unsupported width, a null pointer).
    InvalidArgument(String),
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaError::NotCompiled => {
                f.write_str("hypercodec was built without CUDA support (feature `cuda`)")
            }
            CudaError::NoDevice(why) => write!(f, "no CUDA device: {why}"),
            CudaError::Driver { call, code } => {
                write!(f, "CUDA driver call {call} failed ({code})")
            }
            CudaError::InvalidArgument(why) => write!(f, "invalid kernel arguments: {why}"),
        }
    }
}

impl std::error::Error for CudaError {}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, CudaError>;

/// Element types of activations and outputs (the kernels' dtype codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Dtype {
    /// 32-bit float.
    F32 = 0,
    /// IEEE half.
    F16 = 1,
    /// bfloat16.
    Bf16 = 2,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }
}

/// Activation rows a GEMV launch holds in registers; larger batches run in passes (the
/// kernels' `HC_MAX_M`).
pub const MAX_GEMV_BATCH: usize = 4;

/// Warps per block of the tensor-core kernel (`HC_MMA_WARPS`).
const MMA_WARPS: u32 = 8;

/// Activation rows the tensor-core affine kernel takes in one launch (two mma tiles of 8);
/// see [`AffineGemv::tensor_core_words`].
pub const MAX_MMA_BATCH: usize = 16;

/// Activation rows up to which the routes send a layer the tensor-core GEMM takes (see
/// [`AffineGemv::gemm_ok`]; [`AffineGemv::lone_batch`]: one of [`GEMM_MIN_ROWS`] rows or
/// more) to it, above [`MAX_MMA_BATCH`]; larger batches decode the weight and run cuBLAS. Measured on an H200 (`py/benches/cuda_gemm.py`,
/// `py/benches/cuda_linear.py`): at 17–64 rows the GEMM is 1.6–3.2× faster than decode +
/// cuBLAS on 8192² and 28672×8192 (level on 4096²); from 128 rows cuBLAS's tensor-core rate
/// wins on some shapes and at 256 on all (the GEMM runs its `mma.sync` loop at about a third
/// of cuBLAS's rate). [`Kernels::affine_gemv`] itself runs any batch.
pub const MAX_GEMM_BATCH: usize = 64;

/// Weight rows below which a layer run on its own takes decode + cuBLAS rather than the
/// tensor-core GEMM above [`MAX_MMA_BATCH`] rows ([`AffineGemv::lone_batch`]). Each of the
/// GEMM's blocks holds 64–128 weight rows and walks the whole row, so a short layer fills few
/// of the device's multiprocessors and costs one block's walk whatever its height: on an H100
/// (4096 columns, 17–64 activation rows) 22–24 µs from 1024 to 4096 rows, where decode + cuBLAS
/// took 13–14 µs at 1024, 16–18 at 2048, 20–23 at 3072 and 25–27 at 4096
/// (`docs/eval/cuda_gemm.md`, session 75). Beside other layers of one input
/// ([`Kernels::affine_group_batch`]) the blocks of several layers fill the device together:
/// there the GEMMs side by side ran 1.3–1.7× faster than decoding.
/// On compute capability 9.0 such a layer takes the GEMM split over clusters instead, where
/// that fills the device ([`GEMM_SPLIT_DEFAULT`]).
pub const GEMM_MIN_ROWS: usize = 3584;

/// The environment variable that turns the Hopper GEMM's route on (`1`) or off (`0`) for the
/// kernels loaded after it is set (its module is loaded only where the route is on); unset or
/// any other value, [`WGMMA_DEFAULT`] holds.
pub const WGMMA_ENV: &str = "HYPERCODEC_WGMMA";

/// Whether the routes take the Hopper GEMM (`kernels/gemm_sm90a.cu`) by default. On: its form
/// scheduled by chunk (split over clusters of 2 blocks where a layer is too short to fill the
/// device) matched the CPU runtime on an H100 (`py/tests/test_cuda.py -k hopper`) and, at the
/// batches [`Kernels::affine_wgmma_batches`] gives, ran 0.59–0.69× bf16 where decode + cuBLAS
/// ran 0.40–0.45× (8192², 14336×4096 and 28672×8192 at 128 and 256 rows); with its scale words
/// converted only where used and its activations copied by the tensor memory accelerator, it
/// passed every CUDA test on an H100 (a wheel built before the route took blocks of 128 rows
/// above 128) and ran 1.01–1.13× at 128 rows and 0.75–0.79× at 256 (`docs/eval/cuda_gemm.md`).
/// `HYPERCODEC_WGMMA=0` turns it off.
pub const WGMMA_DEFAULT: bool = true;

/// The environment variable that sets how the routes use the tensor-core GEMM split over
/// clusters of 2–8 blocks (`kernels/gemm_mma.cuh`, built into the sm_90a module: compute
/// capability 9.0 only) for the kernels loaded after it is set: `1` where a layer is too short
/// to fill the device unsplit (`args::gemm_split`; such layers then take the GEMM at 17–64 rows
/// on their own instead of decoding), `0` never; for measurement, `ks=K[,from=B]` runs K blocks
/// a cluster (1, 2, 4 or 8) on every layer the GEMM takes, and gives it batches from B rows
/// (2 to 17; 9–16 rows then run it with two batch tiles, where the tensor-core GEMV takes them
/// otherwise; the rule gives it 9–16 rows of short layers only). Unset or any other value,
/// [`GEMM_SPLIT_DEFAULT`] holds.
pub const GEMM_SPLIT_ENV: &str = "HYPERCODEC_GEMM_SPLIT";

/// Whether the routes take the split GEMM by default: on. Measured on an H100 (2026-12-08,
/// `py/benches/cuda_gemm_rows.py`, int4 g128, 4096 columns; each at its best cluster size,
/// which the rule now picks): layers of 1024 and 2048 rows at 17–64 rows ran 8.2–10.7 and
/// 10.1–16.2 µs against 12.8–13.7 and 16.3–17.0 decoded then cuBLAS (their route before) and
/// bf16's 8.0–9.6 and 11.4–13.8; 4096 rows 15.1–20.4 against the unsplit GEMM's 22.8–22.9
/// (bf16 15.6–17.4); 1024 rows at 9–16 rows 7.3 against the tensor-core GEMV's 8.6–8.9
/// (`args::split_beats_gemv`). Taller layers fill the device unsplit and keep their kernels.
pub const GEMM_SPLIT_DEFAULT: bool = true;

/// Layers one launch of [`Kernels::affine_gemv_group`] takes (the kernels' `HC_GROUP_MAX`).
pub const AFFINE_GROUP_MAX: usize = 4;

/// Columns of one chunk of the tensor-core GEMM (`HC_GEMM_BK`).
pub const GEMM_CHUNK: usize = 128;

/// `y = x·Wᵀ (+ b)` for affine codes, as stored in `.hwz`: `bits`-bit codes LSB-first, row
/// after row; `ŵ = s·(qmul·q − qbias) + lo` with the scale and offset of column `j`'s group
/// `j / group_len` (`scales_per_row` of them per row, or 0 for one scale for the tensor).
/// Symmetric codes: `qmul = 1`, `qbias = 2^(bits−1)`, no offsets; 1-bit sign codes:
/// `qmul = 2`, `qbias = 1`; asymmetric: `qmul = 1`, `qbias = 0` and offsets.
#[derive(Debug, Clone, Copy)]
pub struct AffineGemv {
    /// The codes (`ceil(rows·cols·bits / 8)` bytes).
    pub codes: u64,
    /// Bytes of `codes`.
    pub code_bytes: u64,
    /// Scales of `scale_dtype` in the device layout of [`tiled_scales`]
    /// (`⌈rows/16⌉·16·scales_per_row` values), or 1 value.
    pub scales: u64,
    /// Offsets like `scales`, or 0 (symmetric).
    pub offsets: u64,
    /// The type of `scales` and `offsets`: f32, or f16/bf16 held as stored (4.25 bits per
    /// weight at 4 bits in groups of 128, where f32 makes 4.5).
    pub scale_dtype: Dtype,
    /// Activations, `batch × cols` of `x_dtype`, contiguous.
    pub x: u64,
    /// Their type.
    pub x_dtype: Dtype,
    /// Output, `batch × rows` of `y_dtype`.
    pub y: u64,
    /// Its type.
    pub y_dtype: Dtype,
    /// f32 bias of `rows` values, or 0.
    pub bias: u64,
    /// Activation rows.
    pub batch: usize,
    /// Weight rows (outputs).
    pub rows: usize,
    /// Weight columns (inputs).
    pub cols: usize,
    /// Bits per code, 1..=8.
    pub bits: u8,
    /// Values per scale group along a row.
    pub group_len: usize,
    /// Scale groups per row, or 0 for one tensor-wide scale.
    pub scales_per_row: usize,
    /// Code multiplier.
    pub qmul: f32,
    /// Code bias.
    pub qbias: f32,
}

/// The largest affine term ([`affine_fusable`]) the fused affine kernels take: their f32
/// partial sums then stay finite for activations below about 2^20 (a tensor-core step's sum of
/// up to 256 products of magic-biased codes, below 2^11, times a scale).
pub const FUSED_TERMS_MAX: f64 = 1.2676506002282294e30; // 2^100

/// Whether the fused affine kernels ([`Kernels::affine_gemv`] and its grouped and GEMM forms)
/// compute `ŵ = s·(qmul·q − qbias) + lo` within f32 for these decoded scales and offsets:
/// `max|s|·(2048·|qmul| + |qbias|) + max|lo| ≤` [`FUSED_TERMS_MAX`]. A step's scaled code sum
/// and its offset term can each pass f32's range for weights near it while their sum does not
/// (std 1e36 gave ±inf and NaN on an H100); such a layer is decoded and multiplied instead.
/// Non-finite side information is not fusable.
pub fn affine_fusable(scales: &[f32], offsets: &[f32], qmul: f32, qbias: f32) -> bool {
    let amax = |v: &[f32]| v.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
    let terms =
        amax(scales) * (2048.0 * (qmul as f64).abs() + (qbias as f64).abs()) + amax(offsets);
    terms <= FUSED_TERMS_MAX && scales.iter().chain(offsets).all(|v| v.is_finite())
}

/// Rows of a tile in [`tiled_scales`]: the tensor-core kernel's mma tile.
pub const SCALE_TILE: usize = 16;

/// Per-group affine scales (or offsets; f32, or the stored 16-bit values), `rows × per_row`
/// row after row, in the layout the kernels read them ([`AffineGemv::scales`]):
/// `[⌈rows/16⌉][per_row][8][2]`, the scales of rows `16t + g` and `16t + g + 8` side by side,
/// rows past the last `T::default()` (zero). A warp of the tensor-core
/// kernel computes rows `g` and `g + 8` of a tile of 16 for one group at a time, so it reads
/// one contiguous run of 64 bytes per step; read row after row, those 16 scattered words held
/// the batch-1 kernel near 2× bf16 on an H200 (`docs/eval/cuda_int4_variants.md`). One
/// tensor-wide scale (`per_row` 0) stays as it is.
///
/// # Errors
/// [`CudaError::InvalidArgument`] when `values` does not hold `rows·per_row` values (1 when
/// `per_row` is 0).
pub fn tiled_scales<T: Copy + Default>(
    values: &[T],
    rows: usize,
    per_row: usize,
) -> Result<Vec<T>> {
    let want = if per_row == 0 {
        1
    } else {
        rows.checked_mul(per_row)
            .ok_or_else(|| CudaError::InvalidArgument(format!("{rows} rows of {per_row} scales")))?
    };
    if values.len() != want {
        return Err(CudaError::InvalidArgument(format!(
            "{} scales for {rows} rows of {per_row}",
            values.len()
        )));
    }
    if per_row == 0 {
        return Ok(values.to_vec());
    }
    let tiles = rows.div_ceil(SCALE_TILE);
    let mut out = vec![T::default(); tiles * SCALE_TILE * per_row];
    for (r, row) in values.chunks_exact(per_row).enumerate() {
        let (t, g, h) = (r / SCALE_TILE, r % 8, (r / 8) % 2);
        for (grp, &v) in row.iter().enumerate() {
            out[((t * per_row + grp) * 8 + g) * 2 + h] = v;
        }
    }
    Ok(out)
}

/// `y = s_r·⟨p_r, x'⟩ (+ b)` for fixed-rate E8 words, as stored in `.hwz` (`bits` bytes per
/// word, `words` per row), `x' = RHT(x)` from [`Kernels::rht`] (f32, `batch × 8·words`) and
/// `s_r` the row scale divided by α.
#[derive(Debug, Clone, Copy)]
pub struct E8Gemv {
    /// The packed words (`rows·words·bits` bytes).
    pub packed: u64,
    /// f32 row scales (already divided by α), `rows` values.
    pub row_scales: u64,
    /// The rotated activations, f32, `batch × 8·words`.
    pub xr: u64,
    /// Scratch for the words' half sums of `xr`, f32, `batch × words` (written by the launch).
    pub half: u64,
    /// Output, `batch × rows` of `y_dtype`.
    pub y: u64,
    /// Its type.
    pub y_dtype: Dtype,
    /// f32 bias, or 0.
    pub bias: u64,
    /// Activation rows.
    pub batch: usize,
    /// Weight rows.
    pub rows: usize,
    /// Words per row.
    pub words: usize,
    /// Bits per symbol, 2..=8 (= bytes per word).
    pub bits: u8,
}

/// `y = s_r·⟨p_r, x'⟩ (+ b)` for E8 symbols in GPU-shaped rANS chunks, as stored in `.hwz`
/// (`hypercodec_rice::rans` with 32 lanes; `hwz::Coding::RANS_GPU`): one warp decodes each
/// chunk of whole rows inside the GEMV. `x' = RHT(x)` from [`Kernels::rht`] (f32, `batch ×
/// 8·words`), `s_r` the row scale divided by α.
#[derive(Debug, Clone, Copy)]
pub struct E8RansGemv {
    /// The payload's 16-bit words (`payload_bytes` bytes).
    pub payload: u64,
    /// Bytes of `payload`.
    pub payload_bytes: usize,
    /// The chunk table: per chunk a `u32` word offset, then 32 `u32` lane states. Offsets that
    /// decrease or pass the payload's end (`rans::Decoder::check_chunk_table` refuses both)
    /// give wrong values, but the kernel clamps them: its reads stay inside the payload.
    pub index: u64,
    /// Bytes of `index` (`chunks · 132`).
    pub index_bytes: usize,
    /// The three contexts' packed decode slots, `3 << prob_bits` `u32`
    /// (`rans::Decoder::warp_slots`).
    pub slots: u64,
    /// Probability bits, 8..=12.
    pub prob_bits: u8,
    /// Symbols per chunk: a multiple of `8·words`.
    pub chunk: usize,
    /// f32 row scales (already divided by α), `rows` values.
    pub row_scales: u64,
    /// The rotated activations, f32, `batch × 8·words` (unused by the decoder).
    pub xr: u64,
    /// Output, `batch × rows` of `y_dtype`.
    pub y: u64,
    /// Its type.
    pub y_dtype: Dtype,
    /// f32 bias, or 0.
    pub bias: u64,
    /// Activation rows.
    pub batch: usize,
    /// Weight rows.
    pub rows: usize,
    /// Words of 8 symbols per row (a multiple of 4: a warp's step of 32 symbols is one row's).
    pub words: usize,
}

impl E8RansGemv {
    /// Chunks of the tensor.
    pub fn chunks(&self) -> usize {
        (self.rows * 8 * self.words).div_ceil(self.chunk.max(1))
    }

    /// Checks what the kernels rely on.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(CudaError::InvalidArgument(why));
        let spr = 8 * self.words;
        if !(8..=12).contains(&self.prob_bits) {
            return bad(format!("rANS slots of {} probability bits", self.prob_bits));
        }
        if self.rows > i32::MAX as usize
            || spr > (i32::MAX / 4) as usize
            || self.chunk > i32::MAX as usize
            || self.payload_bytes / 2 > i32::MAX as usize
            || self.rows.saturating_mul(spr) > i64::MAX as usize
        {
            return bad(format!(
                "{} rows × {} words is too large",
                self.rows, self.words
            ));
        }
        if spr == 0 || !spr.is_multiple_of(32) || self.chunk == 0 || !self.chunk.is_multiple_of(spr)
        {
            return bad(format!(
                "rANS chunks of {} symbols over rows of {spr}: the kernel needs rows of a \
                 multiple of 32 symbols and chunks of whole rows",
                self.chunk
            ));
        }
        if self.index_bytes != self.chunks() * 4 * 33 || !self.payload_bytes.is_multiple_of(2) {
            return bad(format!(
                "a chunk table of {} bytes for {} chunks of 32 lanes, a payload of {} bytes",
                self.index_bytes,
                self.chunks(),
                self.payload_bytes
            ));
        }
        // An empty payload (every context a single symbol: a constant weight) may be null.
        if (self.payload == 0 && self.payload_bytes > 0)
            || self.index == 0
            || self.slots == 0
            || self.row_scales == 0
            || self.y == 0
            || (self.batch > 0 && self.xr == 0)
        {
            return bad("a null pointer".into());
        }
        if !self.index.is_multiple_of(4)
            || !self.slots.is_multiple_of(4)
            || !self.payload.is_multiple_of(2)
            || !self.xr.is_multiple_of(4)
        {
            return bad("misaligned rANS streams or activations".into());
        }
        Ok(())
    }
}

/// `y = ½·s_r·⟨2p_r, x'⟩ (+ b)` for E8 words in the format's prefix codes, as stored in `.hwz`
/// (`hwz::Coding::Prefix`, `hypercodec_rice::prefix`): chunks of eight rows (or of `span`
/// groups of eight rows where a row is one segment), one warp each, lane
/// `4n + q` decoding word `q` of each 32-column block of row `n` inside the GEMV. `2p_r` are
/// the doubled lattice coordinates, `x' = RHT(x)` from [`Kernels::rht`], `s_r` the row scale
/// divided by α. One activation row runs on FFMA (`xr`, f32), 2–16 on the tensor cores (`xr16`,
/// f16); larger batches decode the weight ([`Kernels::e8_prefix_decode`]) for a GEMM.
#[derive(Debug, Clone, Copy)]
pub struct E8PrefixGemv {
    /// The chunks' 32-bit words, end to end (`payload_words` of them; may be null when 0).
    pub words: u64,
    /// Words of `words`.
    pub payload_words: usize,
    /// `chunks + 1` `u32` word offsets, the last `payload_words`. Offsets that decrease or pass
    /// the payload give wrong values, but the kernels clamp them: reads stay in the payload.
    pub index: u64,
    /// The decode tables, `u32` entries, 16-byte aligned
    /// (`hypercodec_rice::prefix::Model::warp_table`): [`E8PrefixGemv::table_entries`].
    pub table: u64,
    /// Longest single code: 8, 10 or 12 ([`E8PrefixGemv::compiled`]).
    pub limit: u8,
    /// Longest pair code: 0 (singles), 11 or 12 (with `limit` 8).
    pub pair_limit: u8,
    /// 32-column blocks a chunk's rows hold (at most 16 chunks a row).
    pub segment: usize,
    /// Groups of eight rows a chunk spans: 1, or more where a row is one segment.
    pub span: usize,
    /// f32 row scales (already divided by α), `rows` values.
    pub row_scales: u64,
    /// `RHT(x)`, f32, `batch × cols`, 16-byte aligned: read at one activation row.
    pub xr: u64,
    /// Its f16 copy, `batch × cols`, 16-byte aligned: read at 2–16 rows.
    pub xr16: u64,
    /// Output, `batch × rows` of `y_dtype`.
    pub y: u64,
    /// The output's type (the sums are f32; f16 and bf16 round to nearest even).
    pub y_dtype: Dtype,
    /// f32 bias, or 0.
    pub bias: u64,
    /// Activation rows, 1..=16.
    pub batch: usize,
    /// Weight rows.
    pub rows: usize,
    /// Columns of the rotated domain (8 × words a row), a multiple of 32.
    pub cols: usize,
}

impl E8PrefixGemv {
    /// Whether kernels are compiled for prefix codes of these limits.
    pub fn compiled(limit: u8, pair_limit: u8) -> bool {
        args::e8_prefix(limit, pair_limit, 0).is_some()
    }

    /// Segments (chunks) a row.
    pub fn segments(&self) -> usize {
        (self.cols / 32).div_ceil(self.segment.max(1))
    }

    /// Groups of eight rows.
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(8)
    }

    /// Chunks of the tensor: spans of `span` groups × segments.
    pub fn chunks(&self) -> usize {
        self.groups().div_ceil(self.span.max(1)) * self.segments()
    }

    /// Entries of the decode tables: `3 << limit` for singles, `3·256 + 4 << pair_limit` with
    /// pairs (two `u32` a pair).
    pub fn table_entries(&self) -> usize {
        if self.pair_limit > 0 {
            (3 << 8) + (4 << self.pair_limit)
        } else {
            3 << self.limit
        }
    }

    /// Dynamic shared memory of a block of `warps` warps with `rings` word rings each (1 KiB
    /// a ring), then the tables.
    fn shared(&self, warps: usize, rings: usize) -> u32 {
        (1024 * rings * warps + 4 * self.table_entries()) as u32
    }

    /// Checks what the kernels rely on.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(CudaError::InvalidArgument(why));
        if !Self::compiled(self.limit, self.pair_limit) {
            return bad(format!(
                "no kernel for prefix codes of {} / {} bits (compiled: 8, 10, 12; pairs 11, 12                  with 8)",
                self.limit, self.pair_limit
            ));
        }
        if self.cols == 0 || !self.cols.is_multiple_of(32) || self.cols > i32::MAX as usize {
            return bad(format!(
                "{} columns: the kernels need a multiple of 32",
                self.cols
            ));
        }
        if self.span == 0
            || (self.span > 1 && (self.segments() > 1 || self.span * self.cols / 32 > 1 << 16))
        {
            return bad(format!(
                "chunks of {} row groups: above 1 only where a row is one segment ({} here), \
                 at most 2^16 blocks a chunk",
                self.span,
                self.segments()
            ));
        }
        if self.rows > i32::MAX as usize
            || self.segment == 0
            || self.segments() > 16
            || self.chunks() > i32::MAX as usize
            || self.payload_words > i64::MAX as usize
        {
            return bad(format!(
                "{} rows in segments of {} blocks ({} a row; the kernels sum at most 16)",
                self.rows,
                self.segment,
                self.segments()
            ));
        }
        if self.batch > MAX_MMA_BATCH {
            return bad(format!(
                "{} activation rows: the GEMV takes up to {MAX_MMA_BATCH} (decode above)",
                self.batch
            ));
        }
        if (self.words == 0 && self.payload_words > 0)
            || self.index == 0
            || self.table == 0
            || self.row_scales == 0
            || self.y == 0
            || (self.batch == 1 && self.xr == 0)
            || (self.batch > 1 && self.xr16 == 0)
        {
            return bad("a null pointer".into());
        }
        if !self.words.is_multiple_of(4)
            || !self.index.is_multiple_of(4)
            || !self.table.is_multiple_of(16)
            || !self.xr.is_multiple_of(16)
            || !self.xr16.is_multiple_of(16)
        {
            return bad("misaligned prefix streams, tables or activations".into());
        }
        Ok(())
    }
}

/// Per-token int8 activations for W8A8: for each row `r` of `x` (`rows × cols`),
/// `step[r] = max(max_j |x[r, j]|, 1e-30) / 127` and `q[r, j] = round(x[r, j] / step[r])`
/// (half to even, clamped to ±127), as PyTorch computes it on the host.
#[derive(Debug, Clone, Copy)]
pub struct QuantI8 {
    /// The activations, `rows × cols` of `x_dtype`.
    pub x: u64,
    /// Their type.
    pub x_dtype: Dtype,
    /// Output codes, int8, `rows × cols`.
    pub q: u64,
    /// Output steps, f32, `rows`.
    pub step: u64,
    /// Rows (tokens).
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
}

impl QuantI8 {
    /// Checks what the kernel relies on.
    pub fn validate(&self) -> Result<()> {
        if self.rows > (1 << 31) - 1 || self.cols > i32::MAX as usize {
            return Err(CudaError::InvalidArgument(format!(
                "{} × {} activations are too many",
                self.rows, self.cols
            )));
        }
        if self.rows > 0 && self.cols > 0 && (self.x == 0 || self.q == 0 || self.step == 0) {
            return Err(CudaError::InvalidArgument("a null pointer".into()));
        }
        if !self.x.is_multiple_of(self.x_dtype.size() as u64) || !self.step.is_multiple_of(4) {
            return Err(CudaError::InvalidArgument(
                "misaligned activations or steps".into(),
            ));
        }
        Ok(())
    }
}

/// Per-token FP8 E4M3 activations for an FP8 GEMM (`hc_quant_f8`): each of `rows` rows scaled
/// by its absolute maximum to ±448 and rounded to E4M3 (round to nearest even), its step
/// (max / 448) written out; rows `rows..padded_rows` become zeros with step 1 (FP8 GEMMs take
/// rows in multiples of 16). A row holding NaN gets a NaN step.
///
/// With `block` > 0 (`hc_quant_f8_blocks`) each run of `block` columns of a row is scaled by its
/// own absolute maximum: the 1×128 activation scales of a block-scaled FP8 GEMM (weights with a
/// scale per group of 128), written column-major as cuBLASLt reads them, the step of row `r`,
/// run `b` at `step[b·padded_rows + r]`; and where `sums` is not 0 each run's sum of the
/// activations as given (f32, row-major `padded_rows × cols/block`, zeros past `rows`): the
/// term that asymmetric weights' offsets multiply.
#[derive(Debug, Clone, Copy)]
pub struct QuantF8 {
    /// The activations, `rows × cols` of `x_dtype`.
    pub x: u64,
    /// Their type.
    pub x_dtype: Dtype,
    /// Output codes, E4M3 bytes, `padded_rows × cols`.
    pub q: u64,
    /// Output steps, f32: `padded_rows`, or `padded_rows × cols / block` (column-major).
    pub step: u64,
    /// Rows (tokens).
    pub rows: usize,
    /// Rows of `q` and `step` (at least `rows`).
    pub padded_rows: usize,
    /// Values per row.
    pub cols: usize,
    /// Columns per step: 0 for one step per row, else a divisor of `cols`.
    pub block: usize,
    /// Output sums of each run (f32, `padded_rows × cols / block`), or 0 for none; only with
    /// `block` > 0.
    pub sums: u64,
}

impl QuantF8 {
    /// Checks what the kernel relies on.
    pub fn validate(&self) -> Result<()> {
        if self.padded_rows < self.rows {
            return Err(CudaError::InvalidArgument(format!(
                "{} padded rows for {} rows",
                self.padded_rows, self.rows
            )));
        }
        if self.block > 0
            && (!self.cols.is_multiple_of(self.block) || self.block > i32::MAX as usize)
        {
            return Err(CudaError::InvalidArgument(format!(
                "runs of {} columns do not tile rows of {}",
                self.block, self.cols
            )));
        }
        if !self.sums.is_multiple_of(4) {
            return Err(CudaError::InvalidArgument("misaligned sums".into()));
        }
        if self.block == 0 && self.sums != 0 {
            return Err(CudaError::InvalidArgument(
                "sums of runs need a run length (block)".into(),
            ));
        }
        if self.block > 0
            && (self.cols / self.block).div_ceil(8 * args::QF8_RUNS) > args::MAX_GRID_Y
        {
            return Err(CudaError::InvalidArgument(format!(
                "{} runs a row: more than the grid holds",
                self.cols / self.block
            )));
        }
        QuantI8 {
            x: self.x,
            x_dtype: self.x_dtype,
            q: self.q,
            step: self.step,
            rows: self.padded_rows,
            cols: self.cols,
        }
        .validate()
    }
}

/// The W8A8 epilogue: `y[r, n] = acc[r, n]·step[r]·scales[n] (+ bias[n])` in `y_dtype`, from
/// the int8 GEMM's int32 sums (`rows × cols`), in one pass.
#[derive(Debug, Clone, Copy)]
pub struct W8A8Out {
    /// int32 sums, `rows × cols`.
    pub acc: u64,
    /// f32 activation steps, `rows` ([`QuantI8`]'s).
    pub step: u64,
    /// f32 weight scales, `cols`.
    pub scales: u64,
    /// f32 bias, `cols`, or 0.
    pub bias: u64,
    /// Output, `rows × cols` of `y_dtype`.
    pub y: u64,
    /// Its type.
    pub y_dtype: Dtype,
    /// Rows (tokens).
    pub rows: usize,
    /// Outputs per row.
    pub cols: usize,
}

impl W8A8Out {
    /// Checks what the kernel relies on.
    pub fn validate(&self) -> Result<()> {
        if self.cols > i32::MAX as usize || self.rows.saturating_mul(self.cols) > i64::MAX as usize
        {
            return Err(CudaError::InvalidArgument(format!(
                "{} × {} outputs are too many",
                self.rows, self.cols
            )));
        }
        if self.rows > 0
            && self.cols > 0
            && (self.acc == 0 || self.step == 0 || self.scales == 0 || self.y == 0)
        {
            return Err(CudaError::InvalidArgument("a null pointer".into()));
        }
        Ok(())
    }
}

/// `y = s_r·⟨w_r, x'⟩ (+ b)` for bitshift-trellis rows, as stored in `.hwz` (`row_bytes` per
/// row, tail-biting sequences of `seq` values, value `c1·sum(state) + c0` with QTIP's 1MAD
/// byte sum, or two values per state from the pair code's two byte sums; see
/// `hypercodec_trellis`), `x' = RHT(x)` (f32, `batch × cols`).
#[derive(Debug, Clone, Copy)]
pub struct TrellisGemv {
    /// The packed bits, `rows·row_bytes` bytes.
    pub bits: u64,
    /// Bytes of `bits`.
    pub bit_bytes: u64,
    /// Bytes per row (`ceil(cols·k / 8)`).
    pub row_bytes: usize,
    /// f32 row scales, `rows`.
    pub row_scales: u64,
    /// The rotated activations, f32, `batch × cols`.
    pub xr: u64,
    /// Output, `batch × rows` of `y_dtype`.
    pub y: u64,
    /// Its type.
    pub y_dtype: Dtype,
    /// f32 bias, or 0.
    pub bias: u64,
    /// Activation rows.
    pub batch: usize,
    /// Weight rows.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// State bits `L` (8..=16).
    pub l: u8,
    /// Bits per value `K` (1..=8, below `L`).
    pub k: u8,
    /// Values per tail-biting sequence (a multiple of 8).
    pub seq: usize,
    /// The code's slope: value = `c1·sum + c0`.
    pub c1: f32,
    /// The code's offset.
    pub c0: f32,
    /// Values per state: 1 (the 1MAD code) or 2 (pairs: `K ≤ 4`, `2K < L`, even `cols`;
    /// `hypercodec_trellis::pair_sums`).
    pub v: u8,
    /// The rotated activations in f16 (`batch × cols`, [`RhtArgs::out16`]), which the
    /// tensor-core kernel reads in place of converting `xr` (half the bytes); 0 for none. Only
    /// used 16-byte aligned.
    pub xr16: u64,
}

impl TrellisGemv {
    /// Whether the group path runs (GEMV and decoder): rows of whole groups of 32 values
    /// (`cols` a multiple of 32) cut into sequences of whole groups (`seq` a multiple of 32,
    /// or one sequence per row) or of 16 values (`seq` = 16, calibrated rows), `K` ≤ 4, and
    /// rows on `4·K`-byte boundaries of a 16-byte aligned buffer (the GEMV also needs `xr`
    /// 16-byte aligned: it reads 16 bytes at a time). A group's bits are then `K`
    /// whole words and every value's bit position is a compile-time constant of the kernel;
    /// other layouts take the per-chunk kernels.
    pub fn whole_groups(&self) -> bool {
        let k = self.k as usize;
        (1..=4).contains(&k)
            && self.cols.is_multiple_of(32)
            && (self.seq.is_multiple_of(32) || self.seq == 16 || self.seq >= self.cols)
            && self.row_bytes.is_multiple_of(4 * k)
            && self.bits.is_multiple_of(16)
    }

    /// Whether the tensor-core kernel runs (`hc_trellis_mma_*`, batches up to
    /// [`MAX_MMA_BATCH`] in one pass): the group path's layout and bf16 or f16 outputs. It
    /// feeds the activations to the mma as f16 (rotated activations below 2^-14 keep f16's
    /// subnormal precision; an output that overflows f16 is recomputed in f32), so f32 outputs
    /// keep the f32 kernels.
    pub fn tensor_core(&self) -> bool {
        self.whole_groups() && self.y_dtype != Dtype::F32
    }

    /// The fewest activation rows for which [`Kernels::trellis_gemv`] runs the tensor-core
    /// kernel, or `None` where it never does ([`TrellisGemv::tensor_core`] is false): 1 for the
    /// pair code, 2 for the 1MAD code (one row of it runs 5–10 % faster on the f32 group
    /// kernel). The routes ask this rather than restate it.
    pub fn mma_min_batch(&self) -> Option<usize> {
        self.tensor_core()
            .then_some(if self.v == 2 { 1 } else { 2 })
    }

    /// Activation rows up to which the fused kernels are the better route (above: decode, then
    /// a GEMM): [`MAX_MMA_BATCH`] on the tensor cores, else [`MAX_GEMV_BATCH`].
    pub fn fused_batch(&self) -> usize {
        if self.tensor_core() {
            MAX_MMA_BATCH
        } else {
            MAX_GEMV_BATCH
        }
    }

    /// Checks what the kernels rely on.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(CudaError::InvalidArgument(why));
        if !(8..=16).contains(&self.l) || !(1..=8).contains(&self.k) || self.k >= self.l {
            return bad(format!("trellis L = {}, K = {}", self.l, self.k));
        }
        if self.v != 1
            && (self.v != 2 || self.k > 4 || 2 * self.k >= self.l || !self.cols.is_multiple_of(2))
        {
            return bad(format!(
                "trellis code of {} values per state at L = {}, K = {} over rows of {}",
                self.v, self.l, self.k, self.cols
            ));
        }
        if self.rows > i32::MAX as usize || self.cols > i32::MAX as usize {
            return bad(format!(
                "{} × {} exceeds the kernels' i32 indices",
                self.rows, self.cols
            ));
        }
        trellis_rows_fit(
            (self.l, self.k),
            self.seq,
            (self.rows, self.cols),
            self.row_bytes,
            self.bit_bytes,
        )?;
        if self.bits == 0
            || self.row_scales == 0
            || (self.batch > 0 && (self.xr == 0 || self.y == 0))
        {
            return bad("a null pointer".into());
        }
        Ok(())
    }
}

/// Checks that `rows × cols` trellis values in sequences of `seq` (a multiple of 8) fit their
/// bits: every sequence holds the `l`-bit state (the format's rule: the shortest is the whole
/// row when the row is shorter than `seq`, else `seq`), and `bit_bytes` holds the rows of
/// `row_bytes`.
fn trellis_rows_fit(
    (l, k): (u8, u8),
    seq: usize,
    (rows, cols): (usize, usize),
    row_bytes: usize,
    bit_bytes: u64,
) -> Result<()> {
    if seq == 0 || !seq.is_multiple_of(8) {
        return Err(CudaError::InvalidArgument(format!(
            "trellis sequences of {seq} values"
        )));
    }
    if cols > 0 && cols.min(seq) * (k as usize) < l as usize {
        return Err(CudaError::InvalidArgument(format!(
            "trellis rows of {cols} values cannot hold a {l}-bit state"
        )));
    }
    if row_bytes < (cols * k as usize).div_ceil(8)
        || (bit_bytes as u128) < rows as u128 * row_bytes as u128
    {
        return Err(CudaError::InvalidArgument(format!(
            "{bit_bytes} bytes for {rows} rows of {row_bytes} bytes"
        )));
    }
    Ok(())
}

/// Encodes rows of values with the bitshift trellis (`hypercodec_trellis::Encoder`'s Viterbi
/// search): `rows × cols` f32 values (about unit variance; the caller's RHT and row scale
/// applied) into `rows · row_bytes` bytes of packed bits, each row cut into the tail-biting
/// sequences of `hypercodec_trellis::row_sequences` (`seq` values, the last taking the rest),
/// one block of threads per sequence.
///
/// The search is the CPU's, operation for operation, so the bits are the CPU's. The back
/// pointers of [`TrellisEncodePlan::ring`] values stay in shared memory: a sequence that fits
/// is searched once; a longer one three times (a forward pass storing checkpoints of its
/// costs in `scratch`, a pass per stretch storing finer ones, a pass per finer stretch keeping
/// its back pointers), so its traffic is a few checkpoints instead of `2^(L−K)·K` bits of back
/// pointers per value.
#[derive(Debug, Clone, Copy)]
pub struct TrellisEncode {
    /// The values, f32, `rows × cols`, row after row; at most [`MAX_ENCODE_VALUE`] in
    /// magnitude (the caller's contract: the search's ordering of costs, and so its bits,
    /// assume it).
    pub x: u64,
    /// The output bits, `rows · row_bytes` bytes.
    pub bits: u64,
    /// Scratch (16-byte aligned) of `max_scratch` bytes, or 0 when the plan needs none.
    pub scratch: u64,
    /// Bytes of `scratch`: the plan asks for at most this much (0, when only planning: up to
    /// [`DEFAULT_ENCODE_SCRATCH`]); a launch that needs scratch checks it against this.
    pub max_scratch: u64,
    /// Bytes of `bits`.
    pub bit_bytes: u64,
    /// Bytes per row (at least `ceil(cols·k / 8)`).
    pub row_bytes: usize,
    /// Rows.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// Values per tail-biting sequence (a multiple of 8).
    pub seq: usize,
    /// State bits `L` (8..=16).
    pub l: u8,
    /// Bits per value `K` (1..=4, below `L`).
    pub k: u8,
    /// Values per state: 1 (the 1MAD code) or 2 (the pair code, `K` ≤ 2 and `2K < L`, rows of
    /// an even length: a step codes two values in `2K` bits).
    pub v: u8,
    /// The code's slope (`hypercodec_trellis::TrellisParams::affine`).
    pub c1: f32,
    /// The code's offset (the same).
    pub c0: f32,
}

/// The largest magnitude [`Kernels::trellis_encode_host`] encodes (rows are meant to be about
/// unit variance): squared errors stay far from f32's overflow, where the search's ordering
/// of costs (and so its bits) would stop being the CPU's.
pub const MAX_ENCODE_VALUE: f32 = 1e15;

/// The scratch a trellis encode asks for at most by default: 2 GiB (every back pointer of a
/// 4096-column layer's sequences of 1024 at `L = 16`, `K = 2` takes 4 MiB per block).
pub const DEFAULT_ENCODE_SCRATCH: u64 = 2 << 30;

/// How [`Kernels::trellis_encode`] runs a [`TrellisEncode`] on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrellisEncodePlan {
    /// Threads per block (a power of two, 32..=512).
    pub threads: usize,
    /// Runs of `2^K` groups of states per thread.
    pub runs_per_thread: usize,
    /// Values whose back pointers shared memory holds.
    pub ring: usize,
    /// Values between the forward pass's checkpoints.
    pub w1: usize,
    /// Values between the second passes' checkpoints (a multiple of 8, below `ring`).
    pub w2: usize,
    /// Dynamic shared memory per block, bytes.
    pub shared: usize,
    /// Blocks launched (each takes every `blocks`-th sequence).
    pub blocks: usize,
    /// Scratch the launch needs (for sequences longer than the ring), bytes.
    pub scratch_bytes: usize,
    /// Whether sequences longer than the ring keep every back pointer in scratch (one search);
    /// else (when that would pass `max_scratch`) checkpoints (three searches).
    pub back_pointers_in_scratch: bool,
}

impl TrellisEncode {
    /// Sequences (blocks) of the launch.
    pub fn sequences(&self) -> usize {
        self.rows * (self.cols / self.seq.max(1)).max(1)
    }

    /// The longest sequence (the last of a row takes the rest).
    fn longest(&self) -> usize {
        let m = (self.cols / self.seq.max(1)).max(1);
        self.cols - (m - 1) * self.seq
    }

    /// Values a step of the search codes (`v`, at least 1).
    fn per_step(&self) -> usize {
        self.v.max(1) as usize
    }

    /// The launch shape for a device with `max_shared` bytes of shared memory per block that
    /// runs `resident(threads, shared)` such blocks at once: the ring takes what the group
    /// costs leave (up to 256 steps; blocks of fewer than 1024 threads leave room for a second
    /// block per multiprocessor); short sequences with few boundaries (every boundary tried,
    /// as on the CPU) need a ring that holds them whole; longer sequences keep every back
    /// pointer in scratch, or, where that passes `max_scratch`, checkpoints every
    /// `w1 ≈ √(n·w2)` steps. A step codes one value, or a pair (`v = 2`) in `2K` bits: the
    /// plan's `K` and lengths are the steps'.
    pub fn plan(
        &self,
        max_shared: usize,
        resident: impl Fn(usize, usize) -> Result<usize>,
    ) -> Result<TrellisEncodePlan> {
        let (l, k) = (self.l as usize, self.k as usize * self.per_step());
        let groups = 1usize << (l - k);
        let runs = groups >> k;
        // Up to 512 threads, each with at most 64 bits of back pointers a value (the kernel's
        // `RMAX` runs).
        let rmax = [32, 8, 2, 1][k - 1];
        let threads = (runs / rmax).clamp(32, 512);
        // The kernel's static shared memory, and the group costs (two buffers).
        let fixed = 1024 + groups * 8;
        let step = threads * 8 + 1;
        // Two blocks a multiprocessor where that still leaves a ring of 64 values.
        let ring_of = |budget: usize| (budget.saturating_sub(fixed) / step).min(256);
        let ring = match ring_of(max_shared / 2) {
            r if r >= 64 => r,
            _ => ring_of(max_shared),
        };
        let need = if groups <= 64 { 130 } else { 17 };
        if ring < need {
            return Err(CudaError::InvalidArgument(format!(
                "the trellis encoder at L = {l}, K = {k} needs {} bytes of shared memory per \
                 block; this device has {max_shared}",
                fixed + need * step
            )));
        }
        let shared = groups * 8 + ring * step;
        let w2 = (ring - 1) / 8 * 8;
        // The longest pass (the boundary pass takes at most the sequence's length), in steps.
        let n = self.longest() / self.per_step();
        let resident = self.sequences().min(resident(threads, shared)?).max(1);
        let cap = match self.max_scratch {
            0 => DEFAULT_ENCODE_SCRATCH,
            c => c,
        } as usize;
        // Per block: every back pointer of the longest sequence (and the one before value 0);
        // or checkpoints every w1 ≈ √(n·w2) values and every w2 of a stretch of w1.
        let all = (n + 1) * threads * 8;
        let m = ((n as f64 / w2 as f64).sqrt().ceil() as usize).max(2);
        let checkpoints = ((n.max(1) - 1) / (m * w2) + m - 1) * (groups + 4) * 4;
        // Back pointers in scratch search once, checkpoints three times: the former wins
        // while the cap leaves it a third of the blocks.
        let (w1, per_block, in_scratch) = if n < ring {
            (w2, 0, false)
        } else if cap / all >= resident.div_ceil(3) {
            (w2, all, true)
        } else {
            (m * w2, checkpoints, false)
        };
        let blocks = match per_block {
            0 => resident,
            b if b > cap => {
                return Err(CudaError::InvalidArgument(format!(
                    "the trellis encoder needs {b} bytes of scratch per block for sequences \
                     of {n} values; the cap is {cap}"
                )))
            }
            b => resident.min(cap / b),
        };
        let scratch_bytes = blocks * per_block;
        Ok(TrellisEncodePlan {
            threads,
            runs_per_thread: (runs / threads).max(1),
            ring,
            w1,
            w2,
            shared,
            blocks,
            scratch_bytes,
            back_pointers_in_scratch: in_scratch,
        })
    }

    /// Checks what the kernels rely on.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(CudaError::InvalidArgument(why));
        if !(8..=16).contains(&self.l) || !(1..=4).contains(&self.k) || self.k >= self.l {
            return bad(format!(
                "the trellis encoder takes 8 <= L <= 16 and 1 <= K <= 4, got L = {}, K = {}",
                self.l, self.k
            ));
        }
        match self.v {
            1 => {}
            2 if self.k as usize <= args::PAIR_ENCODE_KS && 2 * self.k < self.l => {
                if !self.cols.is_multiple_of(2) {
                    return bad(format!(
                        "pairs (V = 2) split rows of an even length, not {}",
                        self.cols
                    ));
                }
            }
            v => {
                return bad(format!(
                    "the GPU trellis encoder codes one value per state, or pairs at K <= {} \
                     with 2K < L; got V = {v}, K = {}, L = {}",
                    args::PAIR_ENCODE_KS,
                    self.k,
                    self.l
                ))
            }
        }
        if self.cols > i32::MAX as usize || self.sequences() > i32::MAX as usize {
            return bad(format!(
                "{} × {} exceeds the encoder's i32 indices",
                self.rows, self.cols
            ));
        }
        trellis_rows_fit(
            (self.l, self.k),
            self.seq,
            (self.rows, self.cols),
            self.row_bytes,
            self.bit_bytes,
        )?;
        if self.rows * self.cols > 0 && (self.x == 0 || self.bits == 0) {
            return bad("a null pointer".into());
        }
        if !(self.c1.is_finite() && self.c0.is_finite()) {
            return bad(format!("trellis code c1 = {}, c0 = {}", self.c1, self.c0));
        }
        if !self.scratch.is_multiple_of(16) {
            return bad("the trellis encoder's scratch must be 16-byte aligned".into());
        }
        Ok(())
    }
}

/// KV-cache vectors with the E8 codec of `hypercodec_lattice::kv` (no dither): `rows × toks`
/// vectors of `dim` values (8..=256, a multiple of 8), rotated by the RHT in tiles of `tile`
/// (0: no rotation), `bits` bits per symbol, one bf16 scale each. Vector `(row, t)`'s codes
/// are at `codes + row·codes_row + t·code_bytes`, its scale at `scales + row·scales_row + t`
/// (u16 elements); encoding reads `x` (vector `row·toks + t` at `x + (row·toks + t)·dim`),
/// decoding writes `out + row·out_row + t·dim` (elements of `dtype`).
#[derive(Debug, Clone, Copy)]
pub struct KvE8 {
    /// Encode: the vectors.
    pub x: u64,
    /// Decode: the output.
    pub out: u64,
    /// Element type of `x` or `out`.
    pub dtype: Dtype,
    /// The codes.
    pub codes: u64,
    /// The scales (bf16 bits).
    pub scales: u64,
    /// Elements between rows of `out`.
    pub out_row: usize,
    /// Bytes between rows of `codes`.
    pub codes_row: usize,
    /// Elements between rows of `scales`.
    pub scales_row: usize,
    /// Rows (batch × heads).
    pub rows: usize,
    /// Vectors per row (tokens).
    pub toks: usize,
    /// Values per vector.
    pub dim: usize,
    /// Bits per symbol (2..=8).
    pub bits: u8,
    /// RHT tile, or 0 for no rotation.
    pub tile: usize,
    /// The codec's α.
    pub alpha: f32,
    /// The RHT's seed.
    pub seed: u64,
}

impl KvE8 {
    /// Bytes of codes per vector: `dim / 8` words of `bits` bytes.
    pub fn code_bytes(&self) -> usize {
        self.dim / 8 * self.bits as usize
    }

    /// Checks what the kernels rely on (`encode`: `x`, `codes` and `scales`; decode: `out`
    /// too).
    pub fn validate(&self, encode: bool) -> Result<()> {
        self.check(encode, true)
    }

    /// [`KvE8::validate`]; `data`: whether `x` or `out` is read or written (not by
    /// [`Kernels::kv_e8_attend`]).
    fn check(&self, encode: bool, data: bool) -> Result<()> {
        let bad = |why: String| Err(CudaError::InvalidArgument(why));
        if !(2..=8).contains(&self.bits) {
            return bad(format!("KV codes of {} bits", self.bits));
        }
        if !(8..=256).contains(&self.dim) || !self.dim.is_multiple_of(8) {
            return bad(format!(
                "KV vectors of {} values (use 8..=256, whole words of 8)",
                self.dim
            ));
        }
        if self.tile != 0
            && (!self.tile.is_power_of_two()
                || self.tile < 8
                || !self.dim.is_multiple_of(self.tile))
        {
            return bad(format!(
                "RHT tile {} for vectors of {}",
                self.tile, self.dim
            ));
        }
        if (self.rows as u128) * (self.toks as u128) > i32::MAX as u128 * 32 {
            return bad(format!("{} × {} vectors", self.rows, self.toks));
        }
        if self.rows * self.toks > 0 && (self.codes == 0 || self.scales == 0) {
            return bad("a null pointer".into());
        }
        if !data {
            return Ok(());
        }
        let data = if encode { self.x } else { self.out };
        if self.rows * self.toks > 0 && data == 0 {
            return bad("a null pointer".into());
        }
        if encode && !self.x.is_multiple_of(16) {
            return bad("KV vectors to encode must be 16-byte aligned".into());
        }
        Ok(())
    }
}

/// Attention of queries over compressed keys and values (both [`KvE8`] codecs of the same
/// rows, tokens and dimension; their `x`, `out` and `dtype` unused) and `exact` uncompressed
/// tokens per row (the sinks, then the window), without decoding the history to memory.
///
/// - Row `r` (batch × KV head) has `queries` f32 queries of `dim` values at
///   `q + (r·queries + g)·dim·4`: its query heads × `query_len` positions, query `g` being
///   position `g % query_len` of head `g / query_len`.
/// - Scores are `scaling·⟨q, k⟩ + bias`, with the bias (f32, or 0 for none) at
///   `bias + ((r / heads)·bias_batch + (g % query_len)·bias_query + column)·4`. The columns:
///   the `bias_first` sinks (exact tokens `0..bias_first`), the history, the rest of the exact
///   tokens (the window).
/// - Tokens (the history, then the exact ones) are cut into chunks of `chunk`. The first
///   kernel writes, per chunk, `part_o[r][c][g]` (`dim` f32: `Σ e^{s−m}·v`, in the original
///   domain) and `part_ml[r][c][g]` (`m`, `Σ e^{s−m}`; `−∞, 0` where every token is masked).
/// - The second merges them into `out[b][position][query head][:]` (`out_dtype`: transformers'
///   attention output layout).
#[derive(Debug, Clone, Copy)]
pub struct KvE8Attend {
    /// The keys' codec and codes (`toks` tokens per row).
    pub keys: KvE8,
    /// The values' codec and codes.
    pub values: KvE8,
    /// The queries, f32, 16-byte aligned.
    pub q: u64,
    /// Queries per row (query heads per KV head × query positions).
    pub queries: usize,
    /// Query positions (`queries` is a multiple of it).
    pub query_len: usize,
    /// KV heads: rows per batch row of `bias`.
    pub heads: usize,
    /// Exact tokens per row: `rows × exact × dim` of `exact_dtype`, 16-byte aligned.
    pub exact_keys: u64,
    /// Exact values, the same layout.
    pub exact_values: u64,
    /// Exact tokens per row (sinks and window).
    pub exact: usize,
    /// Their element type.
    pub exact_dtype: Dtype,
    /// Additive f32 bias, or 0.
    pub bias: u64,
    /// Elements between batch rows of `bias` (0: one row for every batch row).
    pub bias_batch: usize,
    /// Elements between query positions of `bias`.
    pub bias_query: usize,
    /// Sinks: the exact tokens before the history in the bias's columns.
    pub bias_first: usize,
    /// The score's factor (usually `dim^-½`).
    pub scaling: f32,
    /// Tokens per block.
    pub chunk: usize,
    /// Scratch: `rows × chunks × queries × dim` f32, 16-byte aligned.
    pub part_o: u64,
    /// Scratch: `rows × chunks × queries × 2` f32.
    pub part_ml: u64,
    /// Output: `batch × query_len × (heads · queries / query_len) × dim` of `out_dtype`.
    pub out: u64,
    /// Its type.
    pub out_dtype: Dtype,
}

impl KvE8Attend {
    /// Chunks of tokens: `ceil((toks + exact) / chunk)`.
    pub fn chunks(&self) -> usize {
        (self.keys.toks + self.exact).div_ceil(self.chunk.max(1))
    }

    /// A chunk size that gives about two blocks per SM of a 132-SM device for `rows` rows of
    /// `toks` tokens and `queries` queries: at least 64 tokens, a multiple of 16.
    pub fn chunk_for(rows: usize, toks: usize, queries: usize) -> usize {
        let blocks = rows.max(1) * queries.div_ceil(args::KV_ATTEND_QUERIES).max(1);
        let chunks = (264 / blocks).max(1);
        toks.div_ceil(chunks).next_multiple_of(16).max(64)
    }

    /// Checks what the kernel relies on.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(CudaError::InvalidArgument(why));
        self.keys.check(false, false)?;
        self.values.check(false, false)?;
        let (k, v) = (&self.keys, &self.values);
        if (k.rows, k.toks, k.dim) != (v.rows, v.toks, v.dim) {
            return bad(format!(
                "keys of {} × {} × {} against values of {} × {} × {}",
                k.rows, k.toks, k.dim, v.rows, v.toks, v.dim
            ));
        }
        if self.queries == 0
            || self.query_len == 0
            || !self.queries.is_multiple_of(self.query_len)
            || self.heads == 0
            || !k.rows.is_multiple_of(self.heads)
            || self.chunk == 0
            || self.bias_first > self.exact
        {
            return bad(format!(
                "{} queries of {} positions, {} heads for {} rows, chunks of {}",
                self.queries, self.query_len, self.heads, k.rows, self.chunk
            ));
        }
        let n = k.rows as u128 * self.chunks() as u128 * self.queries as u128 * k.dim as u128;
        if n > i64::MAX as u128 / 8
            || self.queries > i32::MAX as usize
            || self.chunk > i32::MAX as usize
        {
            return bad(format!("{n} partial outputs"));
        }
        if k.rows * (k.toks + self.exact) > 0
            && (self.q == 0 || self.part_o == 0 || self.part_ml == 0 || self.out == 0)
            || self.exact > 0 && (self.exact_keys == 0 || self.exact_values == 0)
        {
            return bad("a null pointer".into());
        }
        if ![self.q, self.part_o, self.exact_keys, self.exact_values]
            .iter()
            .all(|p| p.is_multiple_of(16))
        {
            return bad("queries, exact tokens and partial outputs must be 16-byte aligned".into());
        }
        if (k.toks + self.exact) as u128 > i32::MAX as u128 {
            return bad(format!("{} tokens", k.toks + self.exact));
        }
        Ok(())
    }
}

/// `out = RHT(x)` per activation row: the seeded randomized Hadamard transform of
/// `hypercodec_lattice::Rht` (tiles of `tile` values), in f32, zero-padded to `width`.
#[derive(Debug, Clone, Copy)]
pub struct RhtArgs {
    /// Activations, `batch × cols` of `x_dtype`.
    pub x: u64,
    /// Their type.
    pub x_dtype: Dtype,
    /// Output, f32, `batch × width`.
    pub out: u64,
    /// Activation rows.
    pub batch: usize,
    /// Values per row (a multiple of `tile`).
    pub cols: usize,
    /// Output row length (≥ `cols`).
    pub width: usize,
    /// Tile (a power of two, at most 4096).
    pub tile: usize,
    /// The transform's seed.
    pub seed: u64,
    /// A second output in f16 (`batch × width`, for [`TrellisGemv::xr16`]; 16-byte aligned,
    /// `width` a multiple of 8), or 0 for none. Values beyond f16's range become ±inf there
    /// (the tensor-core trellis kernel recomputes such outputs from the f32 `out`).
    pub out16: u64,
}

impl AffineGemv {
    /// Checks what the kernels rely on (shapes, bits, groups); pointers are the caller's.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(CudaError::InvalidArgument(why));
        if !(1..=8).contains(&self.bits) {
            return bad(format!("affine codes of {} bits", self.bits));
        }
        if self.rows > i32::MAX as usize || self.cols > i32::MAX as usize {
            return bad(format!(
                "{} × {} exceeds the kernels' i32 indices",
                self.rows, self.cols
            ));
        }
        let need = (self.rows as u128 * self.cols as u128 * self.bits as u128).div_ceil(8);
        if (self.code_bytes as u128) < need {
            return bad(format!("{} code bytes for {need}", self.code_bytes));
        }
        if (self.rows as u128) * (self.scales_per_row as u128) > i32::MAX as u128 {
            return bad(format!(
                "{} rows of {} scales",
                self.rows, self.scales_per_row
            ));
        }
        if self.scales_per_row > 0 && self.group_len == 0 {
            return bad("group length 0".into());
        }
        if self.scales_per_row > 0
            && self.scales_per_row < self.cols.div_ceil(self.group_len.max(1))
        {
            return bad(format!(
                "{} scales per row for {} columns in groups of {}",
                self.scales_per_row, self.cols, self.group_len
            ));
        }
        if self.codes == 0 || self.scales == 0 || (self.batch > 0 && (self.x == 0 || self.y == 0)) {
            return bad("a null pointer".into());
        }
        // The kernels read the tiled pairs (rows g, g + 8) as one load.
        let pair = 2 * self.scale_dtype.size() as u64;
        if self.scales_per_row > 0
            && !(self.scales.is_multiple_of(pair) && self.offsets.is_multiple_of(pair))
        {
            return bad(format!(
                "scales or offsets not aligned to pairs of {} bytes",
                pair
            ));
        }
        Ok(())
    }

    /// Whether the tensor-core kernel takes this weight and activation type, as its code words
    /// per lane and step (1, 2 or 4), or 0: bf16 activations with 2- or 4-bit codes, f16 with
    /// 2, 4 or 8 bits, rows of whole steps (`4·words·32/bits` columns) and groups of whole
    /// steps. Pointers are checked at launch (16-byte aligned codes and activations, else the
    /// CUDA-core kernels run).
    pub fn tensor_core_words(&self) -> usize {
        let bits = self.bits as usize;
        let ok = match self.x_dtype {
            Dtype::Bf16 => matches!(bits, 2 | 4),
            Dtype::F16 => matches!(bits, 2 | 4 | 8),
            Dtype::F32 => false,
        };
        if !ok || self.cols == 0 {
            return 0;
        }
        let per = 32 / bits;
        for words in [4, 2, 1] {
            let step = 4 * words * per;
            let groups = self.scales_per_row <= 1 || self.group_len.is_multiple_of(step);
            if self.cols.is_multiple_of(step) && groups {
                return words;
            }
        }
        0
    }

    /// Whether the batch-1 cp.async kernel's shape fits (where one is compiled for the bits and
    /// activation type, [`Kernels::affine_gemv`] and [`Kernels::affine_gemv_group`] run it): one
    /// activation row, 4 code words per lane and step, 16-byte aligned codes and activations.
    fn cpa_shaped(&self) -> bool {
        self.cpa_row() && self.tensor_core_words() == 4
    }

    /// One activation row and 16-byte aligned codes and activations: what every batch-1
    /// cp.async kernel needs besides its groups.
    fn cpa_row(&self) -> bool {
        self.batch == 1 && self.codes.is_multiple_of(16) && self.x.is_multiple_of(16)
    }

    /// Whether the batch-1 cp.async kernel for groups of half its step fits (`int4-g64`,
    /// `int4-g64-sym`; [`Kernels::affine_gemv`] runs it where one is compiled, at 4 bits): as
    /// [`AffineGemv::cpa_shaped`], with groups of 64 columns in rows of whole steps of 128.
    fn cpa_halves_shaped(&self) -> bool {
        self.cpa_row()
            && self.bits == 4
            && self.scales_per_row > 1
            && self.group_len == 64
            && self.cols.is_multiple_of(128)
    }

    /// Whether the tensor-core GEMM takes this layer for batches above [`MAX_MMA_BATCH`]: 2- or
    /// 4-bit codes under bf16 or f16 activations, rows of whole chunks of [`GEMM_CHUNK`]
    /// columns, and groups of whole chunks (or one scale per row or for the tensor).
    pub fn gemm_ok(&self) -> bool {
        matches!(self.x_dtype, Dtype::Bf16 | Dtype::F16)
            && matches!(self.bits, 2 | 4)
            && self.cols > 0
            && self.cols.is_multiple_of(GEMM_CHUNK)
            && (self.scales_per_row <= 1 || self.group_len.is_multiple_of(GEMM_CHUNK))
    }

    /// Whether the Hopper GEMM (`kernels/gemm_sm90a.cu`, loaded on compute capability 9.0
    /// only) takes this layer at batches above [`AffineGemv::fused_batch`]: 4-bit codes under
    /// bf16 or f16 activations, rows of whole chunks of 128 columns, a scale per row or per
    /// group of a multiple of 64 columns (not one for the tensor), the codes and activations
    /// 16-byte aligned and the scale arrays 8-byte aligned. See [`Kernels::affine_wgmma_batches`].
    pub fn wgmma_ok(&self) -> bool {
        matches!(self.x_dtype, Dtype::Bf16 | Dtype::F16)
            && self.bits == 4
            && self.cols > 0
            && self.cols.is_multiple_of(GEMM_CHUNK)
            && self.scales_per_row >= 1
            && self.group_len.is_multiple_of(64)
            && self.codes.is_multiple_of(16)
            && self.x.is_multiple_of(16)
            && self.scales.is_multiple_of(8)
            && self.offsets.is_multiple_of(8)
    }

    /// The largest batch the fused kernels other than the Hopper GEMM are built for:
    /// [`MAX_GEMM_BATCH`] where the tensor-core GEMM takes the layer
    /// ([`AffineGemv::gemm_ok`]), [`MAX_MMA_BATCH`] on the tensor-core GEMV (see
    /// [`AffineGemv::tensor_core_words`]), else [`MAX_GEMV_BATCH`] per pass. The routes hand
    /// them up to [`AffineGemv::lone_batch`] rows for a layer on its own, up to this one beside
    /// other layers of one input ([`Kernels::affine_group_batch`]).
    pub fn fused_batch(&self) -> usize {
        if self.gemm_ok() {
            MAX_GEMM_BATCH
        } else {
            self.gemv_batch()
        }
    }

    /// The largest batch the routes hand to the fused kernels other than the Hopper GEMM:
    /// [`AffineGemv::fused_batch`], but the GEMV's batch for layers shorter than
    /// [`GEMM_MIN_ROWS`], whose GEMM leaves most of the device idle.
    pub fn lone_batch(&self) -> usize {
        if self.rows < GEMM_MIN_ROWS {
            self.gemv_batch()
        } else {
            self.fused_batch()
        }
    }

    /// The most rows of the GEMVs: [`MAX_MMA_BATCH`] on the tensor cores, else
    /// [`MAX_GEMV_BATCH`] per pass.
    fn gemv_batch(&self) -> usize {
        if self.tensor_core_words() > 0 {
            MAX_MMA_BATCH
        } else {
            MAX_GEMV_BATCH
        }
    }

    /// The aligned kernel's width (1 to 8 bits whose rows and groups hold whole chunks of
    /// 32 values, codes and activations 16-byte aligned), or 0 for the generic one.
    pub fn path(&self) -> i32 {
        let bits = self.bits as usize;
        if !(1..=8).contains(&bits) {
            return 0;
        }
        let groups_ok = self.scales_per_row == 0 || self.group_len.is_multiple_of(32);
        if self.cols.is_multiple_of(32)
            && groups_ok
            && self.codes.is_multiple_of(16)
            && self.x.is_multiple_of(16)
        {
            bits as i32
        } else {
            0
        }
    }
}

impl E8Gemv {
    /// Checks what the kernels rely on.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(CudaError::InvalidArgument(why));
        if !(2..=8).contains(&self.bits) {
            return bad(format!("E8 words of {} bits per symbol", self.bits));
        }
        if self.rows > i32::MAX as usize || self.words > (i32::MAX as usize) / 8 {
            return bad(format!(
                "{} rows × {} words is too large",
                self.rows, self.words
            ));
        }
        if self.packed == 0
            || self.row_scales == 0
            || (self.batch > 0 && (self.xr == 0 || self.y == 0))
            || (self.batch > 0 && self.words > 0 && self.half == 0)
        {
            return bad("a null pointer".into());
        }
        if !self.xr.is_multiple_of(16)
            || !self.packed.is_multiple_of(8)
            || !self.half.is_multiple_of(16)
        {
            return bad(
                "the rotated activations and half sums must be 16-byte aligned, the words 8-byte"
                    .into(),
            );
        }
        Ok(())
    }
}

impl RhtArgs {
    /// Checks what the kernel relies on.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(CudaError::InvalidArgument(why));
        if self.tile == 0 || !self.tile.is_power_of_two() || self.tile > 4096 {
            return bad(format!("RHT tile {}", self.tile));
        }
        if !self.cols.is_multiple_of(self.tile) || self.width < self.cols {
            return bad(format!(
                "RHT of {} columns in tiles of {} into rows of {}",
                self.cols, self.tile, self.width
            ));
        }
        if self.width > i32::MAX as usize {
            return bad(format!("RHT rows of {}", self.width));
        }
        if self.batch > 0 && (self.x == 0 || self.out == 0) {
            return bad("a null pointer".into());
        }
        // The f16 copy is stored 8 values (16 bytes) at a time: every row must start aligned.
        if self.out16 != 0 && (!self.out16.is_multiple_of(16) || !self.width.is_multiple_of(8)) {
            return bad(format!(
                "the RHT's f16 copy needs a 16-byte aligned buffer and rows of a multiple of 8, \
                 got {:#x} and {}",
                self.out16, self.width
            ));
        }
        Ok(())
    }
}

/// The loaded kernels of one device, in its primary context (the one the CUDA runtime, and so
/// PyTorch, uses). Every launch takes a raw `CUstream` (0: the legacy default stream) and
/// returns without synchronizing.
pub struct Kernels {
    inner: driver::Module,
    /// Whether the routes take the Hopper GEMM where it loaded ([`WGMMA_ENV`]).
    wgmma: bool,
    /// The split GEMM's setting ([`GEMM_SPLIT_ENV`]).
    split: GemmSplit,
}

/// How the routes use the tensor-core GEMM split over clusters ([`GEMM_SPLIT_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GemmSplit {
    /// Never (layers too short to fill the device unsplit decode alone at 17–64 rows).
    Off,
    /// Where `args::gemm_split` splits a layer.
    Rule,
    /// Measurement: `ks` blocks a cluster for every layer the GEMM takes (1: unsplit), and the
    /// GEMM from `from` activation rows (9–16 rows then take it with two batch tiles).
    Forced {
        /// Blocks a cluster (1, 2, 4 or 8).
        ks: usize,
        /// The fewest activation rows given to the GEMM.
        from: usize,
    },
}

impl GemmSplit {
    /// Reads a value of [`GEMM_SPLIT_ENV`]: `0` off, `1` on, `ks=K[,from=B]` forced; anything
    /// else (or unset) the default, [`GEMM_SPLIT_DEFAULT`].
    fn parse(v: Option<&str>) -> GemmSplit {
        let default = if GEMM_SPLIT_DEFAULT {
            GemmSplit::Rule
        } else {
            GemmSplit::Off
        };
        match v {
            Some("0") => GemmSplit::Off,
            Some("1") => GemmSplit::Rule,
            Some(v) => {
                let (mut ks, mut from) = (None, MAX_MMA_BATCH + 1);
                for part in v.split(',') {
                    match part.split_once('=') {
                        Some(("ks", k)) => ks = k.parse().ok().filter(|k| [1, 2, 4, 8].contains(k)),
                        Some(("from", b)) => match b.parse() {
                            Ok(b) if (2..=MAX_MMA_BATCH + 1).contains(&b) => from = b,
                            _ => return default,
                        },
                        _ => return default,
                    }
                }
                ks.map_or(default, |ks| GemmSplit::Forced { ks, from })
            }
            None => default,
        }
    }

    /// The fewest activation rows the GEMM takes (by the rule, a short layer's from 9:
    /// [`args::split_beats_gemv`]).
    fn first_batch(self) -> usize {
        match self {
            GemmSplit::Forced { from, .. } => from,
            GemmSplit::Rule => 9,
            GemmSplit::Off => MAX_MMA_BATCH + 1,
        }
    }
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels").finish_non_exhaustive()
    }
}

impl Kernels {
    /// Loads the kernels on device `ordinal` (needs the `cuda` feature and a driver).
    pub fn new(ordinal: usize) -> Result<Self> {
        let wgmma = match std::env::var(WGMMA_ENV).as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => WGMMA_DEFAULT,
        };
        let split = GemmSplit::parse(std::env::var(GEMM_SPLIT_ENV).ok().as_deref());
        Ok(Kernels {
            // (the sm_90a module holds the split GEMM too)
            inner: driver::Module::load(ordinal, wgmma || split != GemmSplit::Off)?,
            wgmma,
            split,
        })
    }

    /// The kernels of device `ordinal`, loaded on first use and shared for the rest of the
    /// process (the front ends' trellis encoders reach them from any thread).
    pub fn shared(ordinal: usize) -> Result<std::sync::Arc<Kernels>> {
        static LOADED: std::sync::Mutex<Vec<(usize, std::sync::Arc<Kernels>)>> =
            std::sync::Mutex::new(Vec::new());
        // A list that only grows is whole even if a holder panicked.
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, k)) = loaded.iter().find(|(i, _)| *i == ordinal) {
            return Ok(k.clone());
        }
        let k = std::sync::Arc::new(Kernels::new(ordinal)?);
        loaded.push((ordinal, k.clone()));
        Ok(k)
    }

    /// Kernel functions loaded.
    pub fn functions(&self) -> usize {
        args::function_names().len()
    }

    /// Launches the activation RHT.
    ///
    /// # Safety
    /// The pointers are device allocations of this device holding the sizes the struct states.
    pub unsafe fn rht(&self, a: &RhtArgs, stream: u64) -> Result<()> {
        a.validate()?;
        if a.batch == 0 || a.cols == 0 {
            return Ok(());
        }
        // Tiles of 256..4096 over aligned activations: 8 values per thread in registers.
        let fast = a.tile >= 256
            && a.x.is_multiple_of(16)
            && a.out.is_multiple_of(16)
            && a.width.is_multiple_of(4);
        let (f, threads) = if fast {
            (args::RHT_FAST, (a.tile / 8) as u32)
        } else {
            (args::RHT, a.tile.min(1024) as u32)
        };
        // Rows go on the grid's y axis (at most 65535 a launch).
        for m0 in (0..a.batch).step_by(65535) {
            let m = (a.batch - m0).min(65535);
            let mut p = (
                a.x + (m0 * a.cols * a.x_dtype.size()) as u64,
                a.x_dtype as i32,
                a.out + (m0 * a.width * 4) as u64,
                a.cols as i32,
                a.width as i32,
                a.tile as i32,
                a.seed,
                if a.out16 == 0 {
                    0
                } else {
                    a.out16 + (m0 * a.width * 2) as u64
                },
            );
            let mut params = [
                &mut p.0 as *mut _ as *mut std::ffi::c_void,
                &mut p.1 as *mut _ as *mut _,
                &mut p.2 as *mut _ as *mut _,
                &mut p.3 as *mut _ as *mut _,
                &mut p.4 as *mut _ as *mut _,
                &mut p.5 as *mut _ as *mut _,
                &mut p.6 as *mut _ as *mut _,
                &mut p.7 as *mut _ as *mut _,
            ];
            // SAFETY: the arguments were validated; the pointers are the caller's contract.
            unsafe {
                self.inner.launch(
                    f,
                    ((a.cols / a.tile) as u32, m as u32),
                    threads,
                    (a.tile * 4) as u32,
                    stream,
                    &mut params,
                )?;
            }
        }
        Ok(())
    }

    /// Launches `y_l = x·W_lᵀ (+ b_l)` for 1 to [`AFFINE_GROUP_MAX`] affine layers that read one
    /// activation row `x`, as one launch of the batch-1 cp.async kernel over the layers' row
    /// tiles end to end: each layer's outputs are those [`Kernels::affine_gemv`] computes, bit
    /// for bit. At batch 1 a launch costs a few µs beyond its bytes, so a block's q, k and v
    /// projections (or gate and up) run faster as one.
    ///
    /// Returns `Ok(false)` and launches nothing where the layers do not fit that kernel: more
    /// than [`AFFINE_GROUP_MAX`] or none, a batch other than 1, another `x`, column count,
    /// code width or activation type than the first layer's, or a layer the batch-1 kernel does
    /// not take (see [`AffineGemv::tensor_core_words`]); the caller then launches them one by one.
    ///
    /// # Safety
    /// As [`Kernels::rht`], for every layer.
    pub unsafe fn affine_gemv_group(&self, layers: &[AffineGemv], stream: u64) -> Result<bool> {
        let Some(a0) = layers.first() else {
            return Ok(false);
        };
        for a in layers {
            a.validate()?;
        }
        let fits = |a: &AffineGemv| {
            a.cpa_shaped()
                && a.rows > 0
                && a.rows <= i32::MAX as usize / 2
                && (a.x, a.cols, a.bits, a.x_dtype) == (a0.x, a0.cols, a0.bits, a0.x_dtype)
        };
        let f = args::affine_cpa_group(a0.bits as usize, a0.x_dtype);
        let tiles: usize = layers.iter().map(|a| a.rows.div_ceil(16)).sum();
        let Some(f) = f.filter(|_| {
            layers.len() <= AFFINE_GROUP_MAX
                && tiles <= i32::MAX as usize
                && layers.iter().all(fits)
        }) else {
            return Ok(false);
        };
        let mut k = args::AffineGroupArgs::new(layers);
        let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe {
            self.inner.launch(
                f,
                (k.tiles(), 1),
                32 * args::CPA_WARPS,
                args::affine_cpa_shared(a0.bits as usize, 1),
                stream,
                &mut params,
            )?;
        }
        Ok(true)
    }

    /// The tensor-core GEMM split over clusters that [`Kernels::affine_gemv`] runs for this
    /// layer at its batch (given 16-byte aligned pointers), as (batch tiles of 8 a block, blocks
    /// a cluster); None where it runs another kernel ([`GEMM_SPLIT_ENV`]).
    pub fn affine_gemm_split(&self, a: &AffineGemv) -> Option<(usize, usize)> {
        (a.gemm_ok() && a.batch >= self.split.first_batch() && a.batch > 1)
            .then(|| self.gemm_split_for(a))
            .flatten()
            .map(|(_, nt, ks)| (nt, ks))
    }

    /// The tensor-core GEMM split over clusters for this layer at its batch, where the sm_90a
    /// module loaded it and the layer is too short to fill the device unsplit
    /// ([`args::gemm_split`]): its function, batch tiles of 8 a block and blocks a cluster.
    fn gemm_split_for(&self, a: &AffineGemv) -> Option<(usize, usize, usize)> {
        let sms = self.inner.sms();
        let (nt, ks) = args::gemm_split(a.rows, a.cols, a.batch, sms);
        let ks = match self.split {
            GemmSplit::Off => return None,
            // 9-16 rows: only where the tensor-core GEMV leaves the device idle.
            GemmSplit::Rule
                if a.batch <= MAX_MMA_BATCH && !args::split_beats_gemv(a.rows, ks, sms) =>
            {
                return None
            }
            GemmSplit::Rule => ks,
            GemmSplit::Forced { ks, .. } => ks,
        };
        if ks == 1 && nt > 2 {
            return None;
        }
        args::affine_gemm_split(a.bits as usize, a.x_dtype, nt, ks)
            .filter(|&f| self.inner.has(f) && a.batch.div_ceil(8 * nt) <= args::MAX_GRID_Y)
            .map(|f| (f, nt, ks))
    }

    /// Launches the split GEMM `f` ([`Kernels::gemm_split_for`]): a cluster of `ks` blocks for
    /// each 64 rows along x, batch tiles of `8·nt` rows along y.
    ///
    /// # Safety
    /// As [`Kernels::affine_gemv`], whose checks it relies on.
    unsafe fn launch_gemm_split(
        &self,
        a: &AffineGemv,
        f: usize,
        nt: usize,
        ks: usize,
        stream: u64,
    ) -> Result<()> {
        let mut k = args::AffineArgs::new(a);
        let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
        // SAFETY: the caller's.
        unsafe {
            self.inner.launch(
                f,
                (
                    (a.rows.div_ceil(args::gemm_rows_per_block(1)) * ks) as u32,
                    a.batch.div_ceil(8 * nt) as u32,
                ),
                32 * args::GEMM_WARPS,
                args::affine_gemm_split_shared(a.bits as usize, nt),
                stream,
                &mut params,
            )
        }
    }

    /// The Hopper GEMM for this layer at its batch and its shape ([`args::wgmma_shape`]), where
    /// the layer fits it ([`AffineGemv::wgmma_ok`]) and this device loaded it (compute
    /// capability 9.0 with the route on: [`WGMMA_ENV`]).
    fn wgmma_for(&self, a: &AffineGemv) -> Option<(usize, usize)> {
        if !self.wgmma || !a.wgmma_ok() {
            return None;
        }
        let shape = args::wgmma_shape(a.group_len, a.rows, a.cols, a.batch, self.inner.sms());
        // The kernel takes a group as whole chunks (a.glen / BK of them).
        debug_assert!(a.group_len.is_multiple_of(args::WGMMA_SHAPES[shape].2));
        args::wgmma(a.x_dtype, shape)
            .filter(|&f| self.inner.has(f))
            .map(|f| (f, shape))
    }

    /// The activation rows for which the routes should hand this layer to
    /// [`Kernels::affine_gemv`]'s Hopper GEMM rather than decode it and run cuBLAS, as inclusive
    /// ranges `(fewest, most)`, ascending and apart: the batches above
    /// [`AffineGemv::fused_batch`] at which its grid fills the device, up to 256 rows, and 448–512
    /// where its blocks of 256 rows do (`args::wgmma_route`; an H100: `docs/eval/cuda_gemm.md`).
    /// Empty where that is none of them: on 132 multiprocessors, a layer of fewer than 3073 rows
    /// (25 blocks of 128 for each of 2 blocks of activation rows, split in 2), or below 6273 rows
    /// too few columns to split (fewer than 4 chunks of the shape's 128 or 64; from 6273 to
    /// 12 544 rows such a layer is taken from 129 rows), one the GEMM does not take, or a device
    /// that did not load it.
    pub fn affine_wgmma_batches(&self, a: &AffineGemv) -> Vec<(usize, usize)> {
        let sms = self.inner.sms();
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for batch in a.fused_batch() + 1..=args::WGMMA_ROUTE_MAX {
            if self.wgmma_for(&AffineGemv { batch, ..*a }).is_none()
                || !args::wgmma_route(a.group_len, a.rows, a.cols, batch, sms)
            {
                continue;
            }
            match ranges.last_mut() {
                Some((_, most)) if *most + 1 == batch => *most = batch,
                _ => ranges.push((batch, batch)),
            }
        }
        ranges
    }

    /// The most activation rows for which the routes should hand this layer, run on its own,
    /// to [`Kernels::affine_gemv`]'s other fused kernels rather than decode it and run a GEMM:
    /// [`AffineGemv::lone_batch`] (the Hopper GEMM's batches beyond
    /// [`AffineGemv::fused_batch`]: [`Kernels::affine_wgmma_batches`]).
    pub fn affine_fused_batch(&self, a: &AffineGemv) -> usize {
        // Split over clusters, the GEMM fills the device with a short layer's blocks too.
        let split = |batch| {
            self.gemm_split_for(&AffineGemv { batch, ..*a })
                .is_some_and(|(_, _, ks)| ks > 1)
        };
        if a.rows < GEMM_MIN_ROWS && a.gemm_ok() && split(MAX_MMA_BATCH + 1) {
            a.fused_batch()
        } else {
            a.lone_batch()
        }
    }

    /// The same for a layer launched beside others that read one input, each on a stream of
    /// its own: [`AffineGemv::fused_batch`] (the GEMM whatever the layer's height).
    pub fn affine_group_batch(&self, a: &AffineGemv) -> usize {
        a.fused_batch()
    }

    /// Launches `y = x·Wᵀ (+ b)` on the affine codes, any batch: the cp.async kernel at batch 1
    /// (for groups of its step, or at 4 bits of half of it: `AffineGemv::cpa_halves_shaped`)
    /// and the tensor-core kernel up to [`MAX_MMA_BATCH`] rows where
    /// [`AffineGemv::tensor_core_words`] allows, the tensor-core GEMM above that where
    /// [`AffineGemv::gemm_ok`] does, the Hopper GEMM above [`AffineGemv::fused_batch`] where
    /// it is loaded and takes the layer (any batch its grid holds: 128 or 256 activation rows a
    /// block, [`Kernels::affine_wgmma_batches`] says where the routes prefer it), else the
    /// CUDA-core GEMV in passes of [`MAX_GEMV_BATCH`].
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn affine_gemv(&self, a: &AffineGemv, stream: u64) -> Result<()> {
        if a.rows == 0 || a.batch == 0 {
            return Ok(());
        }
        a.validate()?;
        let words = a.tensor_core_words();
        let aligned = a.codes.is_multiple_of(16) && a.x.is_multiple_of(16);
        // The GEMM stages the scale and offset pairs by 16-byte copies (the device layouts
        // hold them at allocations' alignment; others take the passes below).
        let staged = |p: u64| a.scales_per_row == 0 || p.is_multiple_of(16);
        let gemm = aligned && staged(a.scales) && staged(a.offsets) && a.gemm_ok();
        if gemm && a.batch >= self.split.first_batch() && a.batch <= MAX_MMA_BATCH {
            if let Some((f, nt, ks)) = self.gemm_split_for(a) {
                // SAFETY: validated; the pointers are the caller's contract.
                return unsafe { self.launch_gemm_split(a, f, nt, ks, stream) };
            }
        }
        // Batch 1 with 4 code words per lane: the cp.async kernel (for groups of one step or
        // of half of one).
        let cpa = if a.cpa_shaped() {
            args::affine_cpa(a.bits as usize, a.x_dtype).map(|f| (f, 1))
        } else if a.cpa_halves_shaped() {
            args::affine_cpa_halves(a.bits as usize, a.x_dtype).map(|f| (f, 2))
        } else {
            None
        };
        if let Some((f, groups)) = cpa {
            let mut k = args::AffineArgs::new(a);
            let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
            // SAFETY: validated; the pointers are the caller's contract.
            return unsafe {
                self.inner.launch(
                    f,
                    (a.rows.div_ceil(16) as u32, 1),
                    32 * args::CPA_WARPS,
                    args::affine_cpa_shared(a.bits as usize, groups),
                    stream,
                    &mut params,
                )
            };
        }
        if words > 0 && a.batch <= MAX_MMA_BATCH && aligned {
            if let Some(f) = args::affine_mma(a.bits as usize, a.x_dtype, words, a.batch) {
                let mut k = args::AffineArgs::new(a);
                let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
                // SAFETY: validated; the pointers are the caller's contract.
                return unsafe {
                    self.inner.launch(
                        f,
                        (a.rows.div_ceil(args::mma_rows_per_block(a.batch)) as u32, 1),
                        32 * MMA_WARPS,
                        0,
                        stream,
                        &mut params,
                    )
                };
            }
        }
        // Above the other fused kernels' batches, the Hopper GEMM where it is loaded.
        if a.batch > a.fused_batch() {
            if let Some((f, shape)) = self.wgmma_for(a) {
                let (_, bn, _, ks) = args::WGMMA_SHAPES[shape];
                // grid.x: KS blocks (a cluster) for each 128 rows; grid.y: batch tiles.
                if a.batch.div_ceil(bn) <= args::MAX_GRID_Y {
                    let mut k = args::AffineArgs::new(a);
                    // The activations, read by the tensor memory accelerator.
                    let mut map = driver::tensor_map_2d(
                        a.x,
                        a.x_dtype == Dtype::F16,
                        a.batch,
                        a.cols,
                        bn as u32,
                    )?;
                    let mut params = [
                        &mut k as *mut _ as *mut std::ffi::c_void,
                        &mut map as *mut _ as *mut std::ffi::c_void,
                    ];
                    // SAFETY: validated; the pointers are the caller's contract.
                    return unsafe {
                        self.inner.launch(
                            f,
                            (
                                (a.rows.div_ceil(args::WGMMA_ROWS) * ks) as u32,
                                a.batch.div_ceil(bn) as u32,
                            ),
                            args::WGMMA_THREADS,
                            args::wgmma_shared(shape),
                            stream,
                            &mut params,
                        )
                    };
                }
            }
        }
        if a.batch > MAX_MMA_BATCH && gemm {
            if let Some((f, nt, ks)) = self.gemm_split_for(a) {
                // SAFETY: validated; the pointers are the caller's contract.
                return unsafe { self.launch_gemm_split(a, f, nt, ks, stream) };
            }
            let (r, nt) = args::gemm_shape(a.rows, a.batch);
            let f = args::affine_gemm(a.bits as usize, a.x_dtype, r, nt);
            // grid.y: batch tiles (at most 65535, about half a million rows).
            if let Some(f) = f.filter(|_| a.batch.div_ceil(8 * nt) <= args::MAX_GRID_Y) {
                let mut k = args::AffineArgs::new(a);
                let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
                // SAFETY: validated; the pointers are the caller's contract.
                return unsafe {
                    self.inner.launch(
                        f,
                        (
                            a.rows.div_ceil(args::gemm_rows_per_block(r)) as u32,
                            a.batch.div_ceil(8 * nt) as u32,
                        ),
                        32 * args::GEMM_WARPS,
                        args::affine_gemm_shared(a.bits as usize, r, nt),
                        stream,
                        &mut params,
                    )
                };
            }
        }
        let path = a.path();
        for m0 in (0..a.batch).step_by(MAX_GEMV_BATCH) {
            let m = (a.batch - m0).min(MAX_GEMV_BATCH);
            let pass = AffineGemv {
                x: a.x + (m0 * a.cols * a.x_dtype.size()) as u64,
                y: a.y + (m0 * a.rows * a.y_dtype.size()) as u64,
                batch: m,
                ..*a
            };
            let mut k = args::AffineArgs::new(&pass);
            let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
            let (f, blocks, threads) = if path == 0 {
                (args::AFFINE_GENERIC, a.rows, block_for(a.cols))
            } else {
                let blocks = a.rows.div_ceil(args::rows_per_block(m));
                (
                    args::affine_gemv(path as usize, m),
                    blocks,
                    gemv_block(a.cols / 32, blocks),
                )
            };
            // SAFETY: the arguments were validated; the pointers are the caller's contract.
            unsafe {
                self.inner
                    .launch(f, (blocks as u32, 1), threads, 0, stream, &mut params)
            }?;
        }
        Ok(())
    }

    /// Decodes the affine weight into `out` (`rows × cols` of `dtype`).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn affine_decode(
        &self,
        a: &AffineGemv,
        out: u64,
        dtype: Dtype,
        stream: u64,
    ) -> Result<()> {
        a.validate()?;
        if a.rows == 0 || a.cols == 0 {
            return Ok(());
        }
        // The GEMV's aligned layouts decode pieces of 8 values, `DECODE_PIECES` per thread
        // (the output too must be 16-byte aligned), the rest 8 values per thread.
        let path = a.path() as usize;
        let (f, n) = if path > 0 && out.is_multiple_of(16) {
            (
                args::affine_decode_chunks(path),
                (a.rows * (a.cols / 8)).div_ceil(args::DECODE_PIECES),
            )
        } else {
            (args::AFFINE_DECODE, a.rows * a.cols.div_ceil(8))
        };
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe { self.decode_launch(f, args::AffineArgs::new(a), out, dtype, n, stream) }
    }

    /// Launches the fixed-rate E8 GEMV (batches above [`MAX_GEMV_BATCH`] in passes).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn e8_gemv(&self, a: &E8Gemv, stream: u64) -> Result<()> {
        if a.rows == 0 || a.batch == 0 {
            return Ok(());
        }
        a.validate()?;
        if a.batch > 0 && a.words > 0 {
            let n = a.batch * a.words;
            let (mut xr, mut half, mut n64) = (a.xr, a.half, n as i64);
            let mut params = [
                &mut xr as *mut _ as *mut std::ffi::c_void,
                &mut half as *mut _ as *mut _,
                &mut n64 as *mut _ as *mut _,
            ];
            // SAFETY: `xr` holds `8·n` and `half` `n` f32 (the struct's contract).
            unsafe {
                self.inner.launch(
                    args::E8_HALVES,
                    (grid_for(n), 1),
                    256,
                    0,
                    stream,
                    &mut params,
                )?;
            }
        }
        for m0 in (0..a.batch).step_by(MAX_GEMV_BATCH) {
            let m = (a.batch - m0).min(MAX_GEMV_BATCH);
            let pass = E8Gemv {
                xr: a.xr + (m0 * 8 * a.words * 4) as u64,
                half: a.half + (m0 * a.words * 4) as u64,
                y: a.y + (m0 * a.rows * a.y_dtype.size()) as u64,
                batch: m,
                ..*a
            };
            let mut k = args::E8Args::new(&pass);
            let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
            // Rows of whole groups of 4 words take the templated kernels, others one block per
            // row.
            let (f, blocks, threads) = if a.words.is_multiple_of(4) && a.packed.is_multiple_of(16) {
                let blocks = a.rows.div_ceil(args::e8_rows_per_block(m));
                (
                    args::e8_gemv(a.bits as usize, m),
                    blocks,
                    gemv_block(a.words / 4, blocks),
                )
            } else {
                (args::E8_ANY, a.rows, block_for(a.words))
            };
            // SAFETY: the arguments were validated; the pointers are the caller's contract.
            unsafe {
                self.inner
                    .launch(f, (blocks as u32, 1), threads, 0, stream, &mut params)
            }?;
        }
        Ok(())
    }

    /// Decodes the scaled E8 points (rotated domain) into `out` (`rows × 8·words`).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn e8_decode(&self, a: &E8Gemv, out: u64, dtype: Dtype, stream: u64) -> Result<()> {
        a.validate()?;
        let n = (a.rows * a.words).div_ceil(args::DECODE_PIECES);
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe { self.decode_launch(args::E8_DECODE, args::E8Args::new(a), out, dtype, n, stream) }
    }
}

impl Kernels {
    /// Launches the rANS E8 GEMV (batches above [`MAX_GEMV_BATCH`] in passes, each decoding
    /// the whole weight again).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn e8_rans_gemv(&self, a: &E8RansGemv, stream: u64) -> Result<()> {
        if a.rows == 0 || a.batch == 0 {
            return Ok(());
        }
        a.validate()?;
        for m0 in (0..a.batch).step_by(MAX_GEMV_BATCH) {
            let m = (a.batch - m0).min(MAX_GEMV_BATCH);
            let pass = E8RansGemv {
                xr: a.xr + (m0 * 8 * a.words * 4) as u64,
                y: a.y + (m0 * a.rows * a.y_dtype.size()) as u64,
                batch: m,
                ..*a
            };
            // SAFETY: validated; the pointers are the caller's contract.
            unsafe { self.rans_launch(args::e8_rans_gemv(m), &pass, stream) }?;
        }
        Ok(())
    }

    /// Decodes the scaled E8 points of rANS chunks (rotated domain) into `out` (`rows ×
    /// 8·words` of `dtype`).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn e8_rans_decode(
        &self,
        a: &E8RansGemv,
        out: u64,
        dtype: Dtype,
        stream: u64,
    ) -> Result<()> {
        let a = E8RansGemv {
            y: out,
            y_dtype: dtype,
            batch: 0,
            ..*a
        };
        if a.rows == 0 {
            return Ok(());
        }
        a.validate()?;
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe { self.rans_launch(args::E8_RANS_DECODE, &a, stream) }
    }

    /// Whether kernels for prefix codes of these limits are compiled and loaded (their module
    /// may fail its JIT alone); where not, the caller decodes such layers instead.
    pub fn e8_prefix_loaded(&self, limit: u8, pair_limit: u8) -> bool {
        args::e8_prefix(limit, pair_limit, args::E8P_GEMV).is_some_and(|f| self.inner.has(f))
    }

    /// Launches the prefix-coded E8 GEMV: FFMA at one activation row, the tensor cores at
    /// 2–16 ([`E8PrefixGemv`]). Blocks take whole row groups (`segments` warps each, at most
    /// 16 warps, fewer where the groups would not fill the SMs; chunks of several groups a warp
    /// each) on a persistent grid, so each block loads the tables once. The pair forms' chunks of
    /// one group go two a warp (groups g and g + 1: `hc_e8p_{gemv2,mma2}_*`), so many pairs a
    /// block as spreads them most evenly over the SMs.
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn e8_prefix_gemv(&self, a: &E8PrefixGemv, stream: u64) -> Result<()> {
        if a.rows == 0 || a.batch == 0 {
            return Ok(());
        }
        a.validate()?;
        let mma = a.batch > 1;
        let kind = if mma { args::E8P_MMA } else { args::E8P_GEMV };
        let f = args::e8_prefix(a.limit, a.pair_limit, kind).expect("validated");
        let (segs, groups) = (a.segments(), a.groups());
        let sms = self.inner.sms() as usize;
        let pass = E8PrefixGemv {
            xr: if mma { a.xr16 } else { a.xr },
            ..*a
        };
        if a.span > 1 {
            // Chunks of several groups: a warp each, no shared sums (as the decoder).
            let chunks = a.chunks();
            let warps = (chunks / sms.max(1)).clamp(1, 16);
            // SAFETY: validated; the pointers are the caller's contract.
            return unsafe {
                self.prefix_launch(f, &pass, warps, chunks.div_ceil(warps), 1, stream)
            };
        }
        if groups >= 2 {
            // Pair forms: two chunks a warp (row groups g and g + 1 of a segment), two
            // independent bit strings a lane.
            if let Some(f2) = args::e8_prefix_two(a.pair_limit, mma).filter(|&f| self.inner.has(f))
            {
                let resident = |p: usize| {
                    let (threads, shared) = (32 * (segs * p) as u32, a.shared(segs * p, 2));
                    self.inner.resident_blocks(f2, threads, shared).unwrap_or(0) as usize
                };
                let pairs = e8_prefix_pairs(groups, segs, sms, resident);
                let need = groups.div_ceil(2 * pairs);
                // SAFETY: validated; the pointers are the caller's contract.
                return unsafe { self.prefix_launch(f2, &pass, segs * pairs, need, 2, stream) };
            }
        }
        let gpb = (16 / segs).min(groups / sms.max(1)).max(1);
        let warps = segs * gpb;
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe { self.prefix_launch(f, &pass, warps, groups.div_ceil(gpb), 1, stream) }
    }

    /// Decodes the scaled E8 points of prefix chunks (rotated domain) into `out` (`rows ×
    /// cols` of `dtype`), a warp per chunk.
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn e8_prefix_decode(
        &self,
        a: &E8PrefixGemv,
        out: u64,
        dtype: Dtype,
        stream: u64,
    ) -> Result<()> {
        let a = E8PrefixGemv {
            y: out,
            batch: 0,
            ..*a
        };
        if a.rows == 0 {
            return Ok(());
        }
        a.validate()?;
        if !out.is_multiple_of(16) {
            return Err(CudaError::InvalidArgument(
                "the decoded weight must be 16-byte aligned".into(),
            ));
        }
        let kind = match dtype {
            Dtype::Bf16 => args::E8P_DECODE_BF16,
            Dtype::F16 => args::E8P_DECODE_BF16 + 1,
            Dtype::F32 => args::E8P_DECODE_BF16 + 2,
        };
        let f = args::e8_prefix(a.limit, a.pair_limit, kind).expect("validated");
        let chunks = a.chunks();
        let sms = self.inner.sms() as usize;
        let warps = (chunks / sms.max(1)).clamp(1, 16);
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe { self.prefix_launch(f, &a, warps, chunks.div_ceil(warps), 1, stream) }
    }

    /// One launch of a prefix kernel: `warps` a block with `rings` word rings each, at most
    /// `need` blocks (fewer where they would not all be resident: the kernels stride).
    unsafe fn prefix_launch(
        &self,
        f: usize,
        a: &E8PrefixGemv,
        warps: usize,
        need: usize,
        rings: usize,
        stream: u64,
    ) -> Result<()> {
        let (threads, shared) = (32 * warps as u32, a.shared(warps, rings));
        if shared > self.inner.max_shared() {
            return Err(CudaError::InvalidArgument(format!(
                "{shared} bytes of shared memory a block; the device has {}",
                self.inner.max_shared()
            )));
        }
        let resident = self.inner.resident_blocks(f, threads, shared)? as usize;
        let grid = need.min(resident).clamp(1, 1 << 20) as u32;
        let mut k = args::E8PrefixArgs::new(a);
        let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
        // SAFETY: the caller validated `a`; the pointers are its contract.
        unsafe {
            self.inner
                .launch(f, (grid, 1), threads, shared, stream, &mut params)
        }
    }

    /// Quantizes activations per row to int8 for W8A8 (a block per row).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn quant_i8(&self, a: &QuantI8, stream: u64) -> Result<()> {
        a.validate()?;
        if a.rows == 0 || a.cols == 0 {
            return Ok(());
        }
        let (mut x, mut q, mut step, mut cols) = (a.x, a.q, a.step, a.cols as i32);
        let mut xd = a.x_dtype as i32;
        let mut params = [
            &mut x as *mut _ as *mut std::ffi::c_void,
            &mut xd as *mut _ as *mut _,
            &mut q as *mut _ as *mut _,
            &mut step as *mut _ as *mut _,
            &mut cols as *mut _ as *mut _,
        ];
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe {
            self.inner.launch(
                args::QUANT_I8,
                (a.rows as u32, 1),
                256,
                0,
                stream,
                &mut params,
            )
        }
    }

    /// Quantizes activations per row, or per run of `block` columns, to FP8 E4M3 (see
    /// [`QuantF8`]; a block per padded row, or a warp per 4 runs).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn quant_f8(&self, a: &QuantF8, stream: u64) -> Result<()> {
        a.validate()?;
        if a.padded_rows == 0 || a.cols == 0 {
            return Ok(());
        }
        let (mut x, mut q, mut step) = (a.x, a.q, a.step);
        let (mut rows, mut cols, mut xd) = (a.rows as i32, a.cols as i32, a.x_dtype as i32);
        let mut block = a.block as i32;
        let mut sums = a.sums;
        let mut params = [
            &mut x as *mut _ as *mut std::ffi::c_void,
            &mut xd as *mut _ as *mut _,
            &mut q as *mut _ as *mut _,
            &mut step as *mut _ as *mut _,
            &mut rows as *mut _ as *mut _,
            &mut cols as *mut _ as *mut _,
            &mut block as *mut _ as *mut _,
            &mut sums as *mut _ as *mut _,
        ];
        let (f, grid, n) = match a.cols.checked_div(a.block) {
            None => (args::quant_f8(), (a.padded_rows as u32, 1), 6),
            Some(runs) => (
                args::quant_f8_blocks(),
                (
                    a.padded_rows as u32,
                    runs.div_ceil(8 * args::QF8_RUNS) as u32,
                ),
                8,
            ),
        };
        // SAFETY: validated; the pointers are the caller's contract (`hc_quant_f8` takes the
        // first six parameters).
        unsafe { self.inner.launch(f, grid, 256, 0, stream, &mut params[..n]) }
    }

    /// The W8A8 epilogue (see [`W8A8Out`]).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn w8a8_out(&self, a: &W8A8Out, stream: u64) -> Result<()> {
        a.validate()?;
        let n = a.rows * a.cols;
        if n == 0 {
            return Ok(());
        }
        let (mut acc, mut step, mut scales, mut bias, mut y) =
            (a.acc, a.step, a.scales, a.bias, a.y);
        let (mut yd, mut rows, mut cols) = (a.y_dtype as i32, a.rows as i64, a.cols as i32);
        let mut params = [
            &mut acc as *mut _ as *mut std::ffi::c_void,
            &mut step as *mut _ as *mut _,
            &mut scales as *mut _ as *mut _,
            &mut bias as *mut _ as *mut _,
            &mut y as *mut _ as *mut _,
            &mut yd as *mut _ as *mut _,
            &mut rows as *mut _ as *mut _,
            &mut cols as *mut _ as *mut _,
        ];
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe {
            self.inner.launch(
                args::W8A8_OUT,
                (grid_for(n), 1),
                256,
                0,
                stream,
                &mut params,
            )
        }
    }

    /// One launch of a rANS kernel: a warp per chunk, 8 warps per block.
    unsafe fn rans_launch(&self, f: usize, a: &E8RansGemv, stream: u64) -> Result<()> {
        let mut k = args::E8RansArgs::new(a);
        let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
        let blocks = a.chunks().div_ceil(8).clamp(1, 1 << 20) as u32;
        // SAFETY: the caller validated `a`; the pointers are its contract.
        unsafe {
            self.inner
                .launch(f, (blocks, 1), 256, 0, stream, &mut params)
        }
    }

    /// Launches the trellis GEMV (batches above [`MAX_GEMV_BATCH`] in passes, or above
    /// [`MAX_MMA_BATCH`] on the tensor cores: [`TrellisGemv::tensor_core`], except for one
    /// activation row of the 1MAD code, which the f32 group kernel computes faster).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn trellis_gemv(&self, a: &TrellisGemv, stream: u64) -> Result<()> {
        if a.rows == 0 || a.batch == 0 {
            return Ok(());
        }
        a.validate()?;
        if a.mma_min_batch().is_some_and(|b| a.batch >= b) && a.xr.is_multiple_of(16) {
            // Passes of up to 16 activation rows, one or two batch tiles of 8 each.
            for m0 in (0..a.batch).step_by(MAX_MMA_BATCH) {
                let m = (a.batch - m0).min(MAX_MMA_BATCH);
                let pass = TrellisGemv {
                    xr: a.xr + (m0 * a.cols * 4) as u64,
                    xr16: if a.xr16.is_multiple_of(16) && a.xr16 != 0 {
                        a.xr16 + (m0 * a.cols * 2) as u64
                    } else {
                        0
                    },
                    y: a.y + (m0 * a.rows * a.y_dtype.size()) as u64,
                    batch: m,
                    ..*a
                };
                let mut k = args::TrellisArgs::new(&pass);
                let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
                let f = args::trellis_mma(a.k as usize, a.v, m.div_ceil(8));
                // SAFETY: the arguments were validated; the pointers are the caller's contract.
                unsafe {
                    self.inner.launch(
                        f,
                        (a.rows.div_ceil(args::TRELLIS_MMA_ROWS) as u32, 1),
                        32 * args::TRELLIS_MMA_WARPS,
                        0,
                        stream,
                        &mut params,
                    )?;
                }
            }
            return Ok(());
        }
        for m0 in (0..a.batch).step_by(MAX_GEMV_BATCH) {
            let m = (a.batch - m0).min(MAX_GEMV_BATCH);
            let pass = TrellisGemv {
                xr: a.xr + (m0 * a.cols * 4) as u64,
                // Only the tensor-core kernel reads the f16 copy.
                xr16: 0,
                y: a.y + (m0 * a.rows * a.y_dtype.size()) as u64,
                batch: m,
                ..*a
            };
            let mut k = args::TrellisArgs::new(&pass);
            let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
            // A thread per two groups of 32 values (up to 256 threads), or per chunk of 8 values
            // (up to 4 each).
            let (f, rows, block) = if a.whole_groups() && pass.xr.is_multiple_of(16) {
                let threads = (a.cols / 64).next_multiple_of(32).clamp(32, 256);
                (
                    args::trellis_groups(m, a.k as usize, a.v),
                    args::trellis_group_rows(m),
                    threads as u32,
                )
            } else {
                (
                    args::trellis_gemv(m, a.k as usize),
                    args::rows_per_block(m),
                    block_for(a.cols.div_ceil(8)),
                )
            };
            // SAFETY: the arguments were validated; the pointers are the caller's contract.
            unsafe {
                self.inner.launch(
                    f,
                    (a.rows.div_ceil(rows) as u32, 1),
                    block,
                    0,
                    stream,
                    &mut params,
                )?;
            }
        }
        Ok(())
    }

    /// Decodes the scaled trellis values (rotated domain) into `out` (`rows × cols`).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn trellis_decode(
        &self,
        a: &TrellisGemv,
        out: u64,
        dtype: Dtype,
        stream: u64,
    ) -> Result<()> {
        a.validate()?;
        // A thread per group of 32 values, or per chunk of 8.
        let (f, n) = if a.whole_groups() {
            (
                args::trellis_decode_groups(a.k as usize, a.v),
                a.rows * (a.cols / 32),
            )
        } else {
            (args::TRELLIS_DECODE, a.rows * a.cols.div_ceil(8))
        };
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe { self.decode_launch(f, args::TrellisArgs::new(a), out, dtype, n, stream) }
    }
}

impl Kernels {
    /// Encodes KV vectors (see [`KvE8`]).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn kv_e8_encode(&self, a: &KvE8, stream: u64) -> Result<()> {
        a.validate(true)?;
        // SAFETY: as the caller vouches.
        unsafe { self.kv_launch(a, args::KV_E8_ENCODE, stream) }
    }

    /// Decodes KV vectors (see [`KvE8`]).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn kv_e8_decode(&self, a: &KvE8, stream: u64) -> Result<()> {
        a.validate(false)?;
        // SAFETY: as the caller vouches.
        unsafe { self.kv_launch(a, args::KV_E8_DECODE, stream) }
    }

    /// The launch shape of `a` on this device ([`TrellisEncode::plan`]).
    pub fn trellis_encode_plan(&self, a: &TrellisEncode) -> Result<TrellisEncodePlan> {
        a.validate()?;
        let f = args::trellis_encode(a.k as usize, a.v);
        a.plan(self.inner.max_shared() as usize, |threads, shared| {
            Ok(self
                .inner
                .resident_blocks(f, threads as u32, shared as u32)? as usize)
        })
    }

    /// Encodes host rows with the trellis encoder ([`TrellisEncode`]'s layout: `values` of
    /// `rows × cols`, `bits` of `rows · ceil(cols·k/8)` bytes), synchronously: the rows go to
    /// device memory this call allocates (up to about 256 MiB of values at a time, plus the
    /// plan's scratch) and frees, on the legacy default stream. For offline compression,
    /// where no framework owns the buffers; [`Kernels::trellis_encode`] takes device pointers.
    /// `(l, k, v)`: state bits, bits per value and values per state: the 1MAD code (`v` = 1),
    /// or pairs (`v` = 2) at `k` up to 2; pairs at larger `k` are refused (the caller codes
    /// them on the CPU).
    #[allow(clippy::too_many_arguments)]
    pub fn trellis_encode_host(
        &self,
        values: &[f32],
        rows: usize,
        cols: usize,
        seq: usize,
        (l, k, v): (u8, u8, u8),
        (c1, c0): (f32, f32),
        bits: &mut [u8],
    ) -> Result<()> {
        encode_host_inputs(values, rows, cols, (l, k, v), bits)?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let rb = (cols * k as usize).div_ceil(8);
        let per = ((256usize << 20) / (cols * 4)).clamp(1, rows);
        let shape = |n: usize, x: u64, b: u64, scratch: u64, max_scratch: u64| TrellisEncode {
            x,
            bits: b,
            scratch,
            max_scratch,
            bit_bytes: (n * rb) as u64,
            row_bytes: rb,
            rows: n,
            cols,
            seq,
            l,
            k,
            v,
            c1,
            c0,
        };
        let plan = self.trellis_encode_plan(&shape(per, 16, 16, 0, 0))?;
        let dx = self.inner.alloc(per * cols * 4)?;
        let db = self.inner.alloc(per * rb)?;
        let ds = self.inner.alloc(plan.scratch_bytes)?;
        for r0 in (0..rows).step_by(per) {
            let n = per.min(rows - r0);
            let src = &values[r0 * cols..(r0 + n) * cols];
            // SAFETY: f32 has no invalid bit patterns; the byte view covers the same memory.
            let bytes = unsafe {
                std::slice::from_raw_parts(src.as_ptr() as *const u8, std::mem::size_of_val(src))
            };
            self.inner.upload(&dx, bytes)?;
            // SAFETY: the buffers hold what the shape states; a chunk's plan asks for at most
            // the scratch allocated (its cap), and the launch checks that.
            let chunk = shape(n, dx.ptr(), db.ptr(), ds.ptr(), plan.scratch_bytes as u64);
            unsafe { self.trellis_encode(&chunk, 0)? };
            self.inner
                .download(&mut bits[r0 * rb..(r0 + n) * rb], &db)?;
        }
        Ok(())
    }

    /// Launches the trellis encoder: every sequence's bits written, nothing else.
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn trellis_encode(&self, a: &TrellisEncode, stream: u64) -> Result<()> {
        if a.rows == 0 || a.cols == 0 {
            return a.validate();
        }
        let plan = self.trellis_encode_plan(a)?;
        if plan.scratch_bytes > 0 && (a.scratch == 0 || a.max_scratch < plan.scratch_bytes as u64) {
            return Err(CudaError::InvalidArgument(format!(
                "the trellis encoder needs {} bytes of scratch (given {} at {:#x})",
                plan.scratch_bytes, a.max_scratch, a.scratch
            )));
        }
        let mut k = args::TrellisEncodeArgs {
            x: a.x,
            bits: a.bits,
            scratch: a.scratch,
            row_bytes: a.row_bytes as i64,
            scratch_stride: (plan.scratch_bytes / plan.blocks / 4) as i64,
            rows: a.rows as i32,
            cols: a.cols as i32,
            seq: a.seq as i32,
            per_row: (a.cols / a.seq).max(1) as i32,
            l: a.l as i32,
            ring: plan.ring as i32,
            w1: plan.w1 as i32,
            w2: plan.w2 as i32,
            rpt: plan.runs_per_thread as i32,
            global_bp: i32::from(plan.back_pointers_in_scratch),
            c1: a.c1,
            c0: a.c0,
        };
        let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe {
            self.inner.launch(
                args::trellis_encode(a.k as usize, a.v),
                (plan.blocks as u32, 1),
                plan.threads as u32,
                plan.shared as u32,
                stream,
                &mut params,
            )
        }
    }

    /// Attention over compressed keys and values (see [`KvE8Attend`]): blocks of 4 warps,
    /// one per chunk, row and 8 queries, then a warp per row and query to merge the chunks
    /// (rows up to 65535).
    ///
    /// # Safety
    /// As [`Kernels::rht`].
    pub unsafe fn kv_e8_attend(&self, a: &KvE8Attend, stream: u64) -> Result<()> {
        a.validate()?;
        if a.keys.rows == 0 || a.keys.toks + a.exact == 0 {
            return Ok(());
        }
        let mut k = args::KvAttendArgs::new(a);
        let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
        // x: chunks × query tiles (up to 2^31 − 1); y: rows (up to 65535).
        let x = a.chunks() * a.queries.div_ceil(args::KV_ATTEND_QUERIES);
        if x > i32::MAX as usize || a.keys.rows > 65535 {
            return Err(CudaError::InvalidArgument(format!(
                "a grid of {x} × {} blocks",
                a.keys.rows
            )));
        }
        let mut m = args::KvMergeArgs::new(a);
        let mut merge = [&mut m as *mut _ as *mut std::ffi::c_void];
        let warps = a.keys.rows * a.queries;
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe {
            self.inner.launch(
                args::KV_E8_ATTEND,
                (x as u32, a.keys.rows as u32),
                128,
                0,
                stream,
                &mut params,
            )?;
            self.inner.launch(
                args::KV_ATTEND_MERGE,
                (warps.div_ceil(4) as u32, 1),
                128,
                0,
                stream,
                &mut merge,
            )
        }
    }

    /// Launches decoder `f` (its parameters: the argument struct, then the output pointer and
    /// dtype code) on `n` threads, 256 a block, grid-stride.
    ///
    /// # Safety
    /// `k` is the kernel's argument struct, validated; the pointers are the caller's contract.
    unsafe fn decode_launch<A>(
        &self,
        f: usize,
        mut k: A,
        out: u64,
        dtype: Dtype,
        n: usize,
        stream: u64,
    ) -> Result<()> {
        if out == 0 {
            return Err(CudaError::InvalidArgument("a null pointer".into()));
        }
        if n == 0 {
            return Ok(());
        }
        let (mut out, mut dt) = (out, dtype as i32);
        let mut params = [
            &mut k as *mut A as *mut std::ffi::c_void,
            &mut out as *mut _ as *mut _,
            &mut dt as *mut _ as *mut _,
        ];
        // SAFETY: as the caller vouches.
        unsafe {
            self.inner
                .launch(f, (grid_for(n), 1), 256, 0, stream, &mut params)
        }
    }

    /// One warp per vector, 4 vectors per block.
    unsafe fn kv_launch(&self, a: &KvE8, f: usize, stream: u64) -> Result<()> {
        let n = a.rows * a.toks;
        if n == 0 {
            return Ok(());
        }
        let mut k = args::KvArgs::new(a);
        let mut params = [&mut k as *mut _ as *mut std::ffi::c_void];
        // SAFETY: validated; the pointers are the caller's contract.
        unsafe {
            self.inner
                .launch(f, (n.div_ceil(4) as u32, 1), 128, 0, stream, &mut params)
        }
    }
}

/// Threads of a GEMV block whose threads split `work` items of a row: about 4 items per
/// thread (so the block's final reduction stays small against the work), whole warps,
/// 32..=256.
fn block_for(work: usize) -> u32 {
    (work.div_ceil(4 * 32) * 32).clamp(32, 256) as u32
}

/// Threads a block of the aligned CUDA-core GEMVs (affine chunks of 32 values, E8 groups of 4
/// words) takes for `work` items a row over a grid of `blocks`: one item a thread where the grid
/// is small (up to 512 blocks, about four a multiprocessor), else two; up to 256. Four items a
/// thread (as [`block_for`]) left a 4096-wide layer one warp a block: on an H200 the E8 GEMV of
/// 1024×4096 took 13.6 µs at batch 1 and 34.8 at 4 so, 8.3 and 13.8 with a thread an item, and
/// INT8 of 14336×4096 23.4 µs so against 21.9 with two (`docs/eval/cuda_gemv.md`).
fn gemv_block(work: usize, blocks: usize) -> u32 {
    let per = if blocks <= 512 { 1 } else { 2 };
    (work.div_ceil(per * 32) * 32).clamp(32, 256) as u32
}

/// Blocks of 256 threads for a grid-stride loop over `n` items.
fn grid_for(n: usize) -> u32 {
    n.div_ceil(256).clamp(1, 1 << 20) as u32
}

/// What [`Kernels::trellis_encode_host`] checks before it touches the device: one value per
/// state, or pairs at `k` up to [`args::PAIR_ENCODE_KS`] with `2k < l` (the GPU encoder has
/// no wider pair step), `values` and `bits` sized for `rows × cols` at `k` bits (sizes that
/// overflow are refused), and every value finite and within [`MAX_ENCODE_VALUE`].
fn encode_host_inputs(
    values: &[f32],
    rows: usize,
    cols: usize,
    (l, k, v): (u8, u8, u8),
    bits: &[u8],
) -> Result<()> {
    let pairs = v == 2 && k as usize <= args::PAIR_ENCODE_KS && 2 * k < l;
    if v != 1 && !pairs {
        return Err(CudaError::InvalidArgument(format!(
            "the GPU trellis encoder codes one value per state, or pairs at K <= {}; not V = \
             {v} at K = {k}, L = {l}",
            args::PAIR_ENCODE_KS
        )));
    }
    let rb = cols.checked_mul(k as usize).map(|b| b.div_ceil(8));
    let sizes = rows
        .checked_mul(cols)
        .zip(rb.and_then(|rb| rows.checked_mul(rb)));
    if sizes != Some((values.len(), bits.len())) {
        return Err(CudaError::InvalidArgument(format!(
            "{} values and {} bytes for {rows} rows of {cols} at {k} bits",
            values.len(),
            bits.len()
        )));
    }
    if let Some(i) = values
        .iter()
        .position(|v| !v.is_finite() || v.abs() > MAX_ENCODE_VALUE)
    {
        return Err(CudaError::InvalidArgument(format!(
            "value {i} to encode is {} (finite values up to {MAX_ENCODE_VALUE:e} in \
             magnitude: rows about unit variance)",
            values[i]
        )));
    }
    Ok(())
}

/// Pairs of row groups a block of the two-chunks-a-warp kernels (`hc_e8p_gemv2_*`,
/// `hc_e8p_mma2_*`; `segs` warps a pair, at most 16 warps): the count that leaves the busiest multiprocessor the fewest pairs to decode, the
/// larger count where two tie. `resident(p)` is how many blocks of `p` pairs the device holds at
/// once; the grid strides where the blocks are more. Measured on an H100 (8192², 14336×4096,
/// 4096×14336), the time followed that load: 4 pairs a block on 14336×4096 (a load of 8) ran
/// 44.0 µs, 6 pairs (150 blocks, so some multiprocessors hold two: 12) 61.5 µs.
fn e8_prefix_pairs(
    groups: usize,
    segs: usize,
    sms: usize,
    resident: impl Fn(usize) -> usize,
) -> usize {
    let (most, sms) = ((16 / segs.max(1)).max(1), sms.max(1));
    let load = |p: usize| {
        let need = groups.div_ceil(2 * p);
        let grid = need.min(resident(p).max(1));
        need.div_ceil(grid) * grid.div_ceil(sms) * p
    };
    (1..=most)
        .min_by_key(|&p| (load(p), usize::MAX - p))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_chunk_gemv_blocks_spread_the_load_evenly() {
        // An H100's residency for the pair tables of 12 bits (64 registers, 2 KiB of rings a
        // warp): 32 warps a multiprocessor, 228 KiB of shared memory.
        let sms = 132;
        let resident = |segs: usize| {
            move |p: usize| {
                let warps = segs * p;
                let shared = 2048 * warps + 4 * ((3 << 8) + (4 << 12));
                sms * (32 / warps).min(228 * 1024 / shared)
            }
        };
        // 8192²: 1024 groups of 4 segments. One pair a block would need a second wave.
        assert_eq!(e8_prefix_pairs(1024, 4, sms, resident(4)), 4);
        // 14336×4096: 6 pairs (150 blocks: some multiprocessors take two) measured 1.4× slower
        // than 4; 7 leaves each multiprocessor one block.
        assert_eq!(e8_prefix_pairs(1792, 2, sms, resident(2)), 7);
        // 4096×14336: 7 segments, so at most 2 pairs.
        assert_eq!(e8_prefix_pairs(512, 7, sms, resident(7)), 2);
        // The tensor cores' kernel holds 85 registers a thread: one block of 16 warps an SM.
        let mma = |segs: usize| {
            move |p: usize| {
                let warps = segs * p;
                let shared = 2048 * warps + 4 * ((3 << 8) + (4 << 12));
                sms * (65536 / (85 * 32 * warps)).min(228 * 1024 / shared)
            }
        };
        assert_eq!(e8_prefix_pairs(1024, 4, sms, mma(4)), 4);
        // Few groups: a pair a block, a block a pair.
        assert_eq!(e8_prefix_pairs(2, 16, sms, resident(16)), 1);
        assert_eq!(e8_prefix_pairs(9, 1, sms, |_| 0), 5);
    }

    #[test]
    fn fp8_quantization_checks_its_runs_and_sums() {
        let ok = QuantF8 {
            x: 0x1000,
            x_dtype: Dtype::Bf16,
            q: 0x2000,
            step: 0x3000,
            rows: 5,
            padded_rows: 16,
            cols: 1024,
            block: 0,
            sums: 0,
        };
        ok.validate().unwrap();
        QuantF8 {
            block: 128,
            sums: 0x4000,
            ..ok
        }
        .validate()
        .unwrap();
        QuantF8 { block: 64, ..ok }.validate().unwrap();
        for (bad, why) in [
            (QuantF8 { block: 100, ..ok }, "runs"),
            (QuantF8 { sums: 0x4000, ..ok }, "block"),
            (
                QuantF8 {
                    block: 128,
                    sums: 0x4002,
                    ..ok
                },
                "misaligned sums",
            ),
            (
                QuantF8 {
                    padded_rows: 4,
                    ..ok
                },
                "padded rows",
            ),
            (
                QuantF8 {
                    block: 1,
                    cols: 8 * args::QF8_RUNS * 65_536,
                    ..ok
                },
                "grid",
            ),
        ] {
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(why), "{why}: {e}");
        }
    }

    #[test]
    fn affine_layers_near_the_f32_range_are_not_fusable() {
        // std 1e25 (scales near 1e24) fuses; 1e36 does not; neither do non-finite scales.
        assert!(affine_fusable(&[1e24, -3e24], &[5e24], 1.0, 0.0));
        assert!(affine_fusable(&[1e20], &[], 1.0, 8.0));
        assert!(!affine_fusable(&[1e35], &[], 1.0, 8.0));
        assert!(!affine_fusable(&[1.0], &[2e30], 1.0, 0.0));
        assert!(!affine_fusable(&[f32::NAN], &[], 1.0, 0.0));
        assert!(!affine_fusable(&[1.0], &[f32::INFINITY], 1.0, 0.0));
        assert!(affine_fusable(&[], &[], 1.0, 0.0));
        // The bound: 2048·s at s = 2^100 / 2048 is the largest that fuses.
        let s = (FUSED_TERMS_MAX / 2048.0) as f32;
        assert!(affine_fusable(&[s], &[], 1.0, 0.0));
        assert!(!affine_fusable(&[s * 1.001], &[], 1.0, 0.0));
        assert_eq!(FUSED_TERMS_MAX, 2f64.powi(100));
    }

    #[test]
    fn tiled_scales_put_rows_g_and_g_plus_8_of_a_tile_side_by_side() {
        // 37 rows (a partial last tile) of 3 groups: value 100·row + group.
        let (rows, per_row) = (37, 3);
        let v: Vec<f32> = (0..rows * per_row)
            .map(|i| (100 * (i / per_row) + i % per_row) as f32)
            .collect();
        let t = tiled_scales(&v, rows, per_row).unwrap();
        assert_eq!(t.len(), 48 * per_row);
        for tile in 0..3 {
            for grp in 0..per_row {
                for g in 0..8 {
                    for h in 0..2 {
                        let r = 16 * tile + g + 8 * h;
                        let want = if r < rows {
                            (100 * r + grp) as f32
                        } else {
                            0.0
                        };
                        assert_eq!(
                            t[((tile * per_row + grp) * 8 + g) * 2 + h],
                            want,
                            "row {r} group {grp}"
                        );
                    }
                }
            }
        }
        // One tensor-wide scale stays; a wrong count is a typed error.
        assert_eq!(tiled_scales(&[2.5], 10, 0).unwrap(), vec![2.5]);
        assert!(matches!(
            tiled_scales(&v[1..], rows, per_row),
            Err(CudaError::InvalidArgument(_))
        ));
        assert!(matches!(
            tiled_scales::<f32>(&[], 4, 0),
            Err(CudaError::InvalidArgument(_))
        ));
        assert!(tiled_scales::<f32>(&[], 0, 5).unwrap().is_empty());
        // 16-bit scales (held as stored) tile the same way.
        let h: Vec<u16> = (0..6).collect();
        assert_eq!(
            &tiled_scales(&h, 3, 2).unwrap()[..8],
            &[0, 0, 2, 0, 4, 0, 0, 0]
        );
    }

    fn affine() -> AffineGemv {
        AffineGemv {
            codes: 256,
            code_bytes: 64 * 128 / 2,
            scales: 512,
            offsets: 0,
            scale_dtype: Dtype::F32,
            x: 1024,
            x_dtype: Dtype::Bf16,
            y: 2048,
            y_dtype: Dtype::Bf16,
            bias: 0,
            batch: 1,
            rows: 64,
            cols: 128,
            bits: 4,
            group_len: 128,
            scales_per_row: 1,
            qmul: 1.0,
            qbias: 8.0,
        }
    }

    #[test]
    fn gemv_blocks_spread_their_threads_over_small_grids() {
        // A 4096-wide INT8 layer (128 chunks a row): a thread a chunk on 256 blocks, two on more.
        assert_eq!(gemv_block(128, 256), 128);
        assert_eq!(gemv_block(128, 512), 128);
        assert_eq!(gemv_block(128, 513), 64);
        // Whole warps, at most 256 threads.
        assert_eq!(gemv_block(1, 1), 32);
        assert_eq!(gemv_block(33, 1), 64);
        assert_eq!(gemv_block(10_000, 1), 256);
        assert_eq!(gemv_block(10_000, 100_000), 256);
    }

    #[test]
    fn arguments_are_checked_before_any_launch() {
        assert!(affine().validate().is_ok());
        assert_eq!(affine().path(), 4);
        // Codes that straddle words take the aligned kernels too.
        let three = AffineGemv {
            bits: 3,
            ..affine()
        };
        assert_eq!(three.path(), 3);
        let short = AffineGemv {
            code_bytes: 100,
            ..affine()
        };
        assert!(matches!(
            short.validate(),
            Err(CudaError::InvalidArgument(_))
        ));
        let bits = AffineGemv {
            bits: 9,
            ..affine()
        };
        assert!(bits.validate().is_err());
        let groups = AffineGemv {
            group_len: 32,
            ..affine()
        };
        assert!(
            groups.validate().is_err(),
            "4 groups of 32 need 4 scales per row"
        );
        // The tiled pairs are read as one load: f32 pairs 8-byte aligned, 16-bit ones 4-byte.
        let odd_scales = AffineGemv {
            scales: 516,
            ..affine()
        };
        assert!(odd_scales.validate().is_err());
        let half = AffineGemv {
            scale_dtype: Dtype::F16,
            ..odd_scales
        };
        assert!(half.validate().is_ok());
        let odd_offsets = AffineGemv {
            offsets: 1030,
            ..half
        };
        assert!(odd_offsets.validate().is_err());
        let tensor = AffineGemv {
            scales_per_row: 0,
            ..odd_scales
        };
        assert!(
            tensor.validate().is_ok(),
            "one tensor-wide scale is read alone"
        );
        // Columns that are not whole 16-byte chunks take the generic kernel.
        let odd = AffineGemv {
            cols: 100,
            group_len: 100,
            code_bytes: 64 * 50,
            ..affine()
        };
        assert_eq!(odd.path(), 0);
        let e8 = E8Gemv {
            packed: 256,
            row_scales: 512,
            xr: 1024,
            half: 4096,
            y: 2048,
            y_dtype: Dtype::F32,
            bias: 0,
            batch: 3,
            rows: 4,
            words: 16,
            bits: 1,
        };
        assert!(e8.validate().is_err());
        assert!(E8Gemv { bits: 4, ..e8 }.validate().is_ok());
        let rht = RhtArgs {
            x: 16,
            x_dtype: Dtype::F32,
            out: 32,
            batch: 1,
            cols: 96,
            width: 96,
            tile: 64,
            seed: 1,
            out16: 0,
        };
        assert!(
            rht.validate().is_err(),
            "96 columns are not whole tiles of 64"
        );
        assert!(RhtArgs { tile: 32, ..rht }.validate().is_ok());
        // The f16 copy: aligned, rows of whole 8-value stores (96 is; 100 or an odd buffer not).
        let copy = RhtArgs {
            tile: 32,
            out16: 1 << 20,
            ..rht
        };
        assert!(copy.validate().is_ok());
        assert!(RhtArgs { width: 100, ..copy }.validate().is_err());
        assert!(RhtArgs {
            out16: (1 << 20) + 8,
            ..copy
        }
        .validate()
        .is_err());
        // 4 rows of 256 symbols in chunks of 2 rows: 2 chunks of 33 words of table.
        let rans = E8RansGemv {
            payload: 64,
            payload_bytes: 1000,
            index: 128,
            index_bytes: 2 * 132,
            slots: 256,
            prob_bits: 12,
            chunk: 512,
            row_scales: 512,
            xr: 1024,
            y: 2048,
            y_dtype: Dtype::F32,
            bias: 0,
            batch: 1,
            rows: 4,
            words: 32,
        };
        assert!(rans.validate().is_ok());
        let prefix = E8PrefixGemv {
            words: 256,
            payload_words: 100,
            index: 512,
            table: 1024,
            limit: 8,
            pair_limit: 12,
            segment: 64,
            span: 1,
            row_scales: 2048,
            xr: 4096,
            xr16: 8192,
            y: 16384,
            y_dtype: Dtype::Bf16,
            bias: 0,
            batch: 1,
            rows: 40,
            cols: 4096,
        };
        assert!(prefix.validate().is_ok());
        assert_eq!((prefix.segments(), prefix.chunks()), (2, 10));
        // Spans of 3 row groups where a row is one segment: 5 groups make 2 chunks.
        let spans = E8PrefixGemv {
            span: 3,
            cols: 576,
            segment: 18,
            ..prefix
        };
        assert!(spans.validate().is_ok());
        assert_eq!((spans.segments(), spans.chunks()), (1, 2));
        assert_eq!(prefix.table_entries(), 768 + (4 << 12));
        assert!(E8PrefixGemv {
            batch: 16,
            ..prefix
        }
        .validate()
        .is_ok());
        for bad in [
            E8PrefixGemv {
                limit: 10,
                ..prefix
            }, // pairs need 8-bit singles
            E8PrefixGemv {
                pair_limit: 9,
                ..prefix
            }, // not compiled
            E8PrefixGemv {
                cols: 4104,
                ..prefix
            }, // not whole blocks
            E8PrefixGemv {
                segment: 7,
                ..prefix
            }, // 19 segments a row
            E8PrefixGemv { span: 2, ..prefix }, // spans need a row in one segment
            E8PrefixGemv { span: 0, ..prefix },
            E8PrefixGemv {
                segment: 0,
                ..prefix
            },
            E8PrefixGemv {
                batch: 17,
                ..prefix
            },
            E8PrefixGemv {
                table: 1028,
                ..prefix
            }, // the tables are read 16 bytes at a time
            E8PrefixGemv { xr: 0, ..prefix },
            E8PrefixGemv {
                batch: 2,
                xr16: 0,
                ..prefix
            },
            E8PrefixGemv { words: 0, ..prefix },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert!(E8PrefixGemv {
            words: 0,
            payload_words: 0,
            ..prefix
        }
        .validate()
        .is_ok());
        // An empty payload (a constant weight) may be null; a non-empty one may not.
        assert!(E8RansGemv {
            payload: 0,
            payload_bytes: 0,
            ..rans
        }
        .validate()
        .is_ok());
        for bad in [
            E8RansGemv { chunk: 384, ..rans },
            E8RansGemv { words: 31, ..rans },
            E8RansGemv {
                index_bytes: 132,
                ..rans
            },
            E8RansGemv {
                prob_bits: 14,
                ..rans
            },
            E8RansGemv { payload: 0, ..rans },
            E8RansGemv { slots: 258, ..rans },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn trellis_encoder_plans_fit_the_device_and_checkpoint_long_sequences() {
        let enc = |l: u8, k: u8, cols: usize, seq: usize| TrellisEncode {
            x: 16,
            bits: 16,
            scratch: 0,
            max_scratch: 0,
            bit_bytes: (4096 * (cols * k as usize).div_ceil(8)) as u64,
            row_bytes: (cols * k as usize).div_ceil(8),
            rows: 4096,
            cols,
            seq,
            l,
            k,
            v: 1,
            c1: 0.007,
            c0: -3.6,
        };
        let h200 = 227 * 1024;
        let resident = |_: usize, _: usize| Ok(132);
        // L = 16, K = 2: two buffers of 16384 groups' 4-byte costs, a ring of 4 KiB a value.
        let p = enc(16, 2, 4096, 1024).plan(h200, resident).unwrap();
        assert_eq!((p.threads, p.runs_per_thread), (512, 8));
        assert!(p.shared <= h200 && p.ring >= 17, "{p:?}");
        assert!(p.w2.is_multiple_of(8) && p.w2 < p.ring, "{p:?}");
        // Every back pointer of 1024 values (and the start's) per block, in scratch.
        assert!(p.back_pointers_in_scratch);
        assert_eq!(p.scratch_bytes, 132 * 1025 * 512 * 8);
        // Under a smaller cap: checkpoints every w1 of the 1024 values, and every w2 of a
        // stretch of w1, for as many blocks as the cap holds.
        let capped = |cap: u64| TrellisEncode {
            max_scratch: cap,
            ..enc(16, 2, 4096, 1024)
        };
        let c = capped(64 << 20).plan(h200, resident).unwrap();
        assert!(
            !c.back_pointers_in_scratch && c.w1.is_multiple_of(c.w2),
            "{c:?}"
        );
        let per_block = (1023 / c.w1 + c.w1 / c.w2 - 1) * (16384 + 4) * 4;
        assert_eq!(c.blocks, (64 << 20) / per_block);
        assert_eq!(c.scratch_bytes, c.blocks * per_block);
        // A cap that holds back pointers for a third of the blocks keeps them (one search).
        let third = capped(44 * 1025 * 512 * 8).plan(h200, resident).unwrap();
        assert!(
            third.back_pointers_in_scratch && third.blocks == 44,
            "{third:?}"
        );
        // A cap below one block's checkpoints is an error; the plan never passes its cap.
        assert!(capped(1 << 19).plan(h200, resident).is_err());
        for cap in [0u64, 1 << 26, 1 << 28, 1 << 30, 3 << 30] {
            let p = capped(cap).plan(h200, resident).unwrap();
            let limit = if cap == 0 {
                DEFAULT_ENCODE_SCRATCH
            } else {
                cap
            };
            assert!(p.scratch_bytes as u64 <= limit, "{cap}: {p:?}");
        }
        // Calibrated rows (16 values) fit the ring: no scratch.
        let q = enc(16, 2, 4096, 16).plan(h200, resident).unwrap();
        assert_eq!(q.scratch_bytes, 0);
        // Few boundaries: the ring holds a whole 128-value sequence.
        let e = enc(8, 2, 4096, 128).plan(h200, resident).unwrap();
        assert!(e.ring >= 130 && e.scratch_bytes == 0, "{e:?}");
        // Fewer blocks than the device holds when there are fewer sequences.
        let few = TrellisEncode {
            rows: 3,
            ..enc(12, 4, 4096, 1024)
        };
        assert_eq!(few.plan(h200, resident).unwrap().blocks, 12);
        // K = 1 at L = 16 needs two buffers of 128 KiB of costs: more than a block has.
        assert!(matches!(
            enc(16, 1, 4096, 1024).plan(h200, resident),
            Err(CudaError::InvalidArgument(_))
        ));
        assert!(enc(15, 1, 4096, 1024).plan(h200, resident).is_ok());
        assert!(enc(16, 5, 4096, 1024).validate().is_err());
        assert!(enc(16, 2, 4096, 12).validate().is_err());
        // Pairs: the plan of K = 2 pairs is the plan of a 4-bit step over half the values
        // (rows of 4096 in sequences of 1024 hold 512 steps).
        let pairs = |l: u8, k: u8, cols: usize, seq: usize| TrellisEncode {
            v: 2,
            ..enc(l, k, cols, seq)
        };
        let p2 = pairs(16, 2, 4096, 1024).plan(h200, resident).unwrap();
        let one = enc(16, 4, 2048, 512).plan(h200, resident).unwrap();
        assert_eq!(p2, one);
        assert_eq!(p2.scratch_bytes, 132 * 513 * 256 * 8);
        // Pairs of 1 bit at L = 16 fit where the 1MAD code's K = 1 does not.
        assert!(pairs(16, 1, 4096, 1024).plan(h200, resident).is_ok());
        // The K = 2 pair kernel is compiled for blocks of at most 256 threads.
        for l in 8..=16 {
            let p = pairs(l, 2, 4096, 1024).plan(h200, resident).unwrap();
            assert!(p.threads <= 256, "L = {l}: {p:?}");
        }
        assert!(pairs(12, 2, 4096, 16).validate().is_ok());
        for bad in [
            pairs(12, 3, 4096, 16), // a 6-bit step: past the ring's words
            pairs(8, 4, 4096, 16),  // 2K = L
            pairs(12, 2, 4095, 16), // an odd row
            TrellisEncode {
                v: 3,
                ..enc(12, 2, 4096, 16)
            },
            TrellisEncode {
                v: 0,
                ..enc(12, 2, 4096, 16)
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_kernels_hash_states_with_the_trellis_crates_constants() {
        use hypercodec_trellis::{CODE_ADD, CODE_MUL, PAIR_ADD, PAIR_MUL};
        // nvcc writes the immediates of `mad.lo.s32` as signed decimals.
        let code = format!(", {}, {};", CODE_MUL as i32, CODE_ADD as i32);
        let pair = format!(", {}, {};", PAIR_MUL as i32, PAIR_ADD as i32);
        let gemv = include_str!("../ptx/gemv.ptx");
        assert!(
            gemv.contains(&code),
            "the 1MAD hash {code} is not in gemv.ptx"
        );
        assert!(
            gemv.contains(&pair),
            "the pair hash {pair} is not in gemv.ptx"
        );
        let encode = include_str!("../ptx/trellis_encode.ptx");
        assert!(encode.contains(&format!(", {};", CODE_MUL as i32)));
        assert!(encode.contains(&format!(", {};", CODE_ADD as i32)));
        // The pair encoder's second hash.
        assert!(encode.contains(&format!(", {};", PAIR_MUL as i32)));
        assert!(encode.contains(&format!(", {};", PAIR_ADD as i32)));
    }

    #[test]
    fn the_gpu_encoder_refuses_bad_host_inputs_before_the_device() {
        let (rows, cols, k) = (3, 40, 2u8);
        let values = vec![0.5f32; rows * cols];
        let bits = vec![0u8; rows * 10];
        let l = 12;
        assert!(encode_host_inputs(&values, rows, cols, (l, k, 1), &bits).is_ok());
        // Pairs at K <= 2 (a step of 2K bits below L) run on the GPU.
        assert!(encode_host_inputs(&values, rows, cols, (l, k, 2), &bits).is_ok());
        let bits3 = vec![0u8; rows * 15];
        for (why, r) in [
            (
                "pairs at K = 3",
                encode_host_inputs(&values, rows, cols, (l, 3, 2), &bits3),
            ),
            (
                "pairs with 2K = L",
                encode_host_inputs(&values, rows, cols, (4, k, 2), &bits),
            ),
            (
                "three values a state",
                encode_host_inputs(&values, rows, cols, (l, k, 3), &bits),
            ),
            (
                "short values",
                encode_host_inputs(&values[1..], rows, cols, (l, k, 1), &bits),
            ),
            (
                "short bits",
                encode_host_inputs(&values, rows, cols, (l, k, 1), &bits[1..]),
            ),
            (
                "overflowing rows",
                encode_host_inputs(&values, usize::MAX, cols, (l, k, 1), &bits),
            ),
            (
                "overflowing cols",
                encode_host_inputs(&[], 0, usize::MAX, (l, k, 1), &[]),
            ),
        ] {
            assert!(
                matches!(r, Err(CudaError::InvalidArgument(_))),
                "{why}: {r:?}"
            );
        }
        for bad in [f32::NAN, f32::INFINITY, 2.0 * MAX_ENCODE_VALUE] {
            let mut v = values.clone();
            v[77] = bad;
            let r = encode_host_inputs(&v, rows, cols, (l, k, 1), &bits);
            assert!(
                matches!(&r, Err(CudaError::InvalidArgument(m)) if m.contains("value 77")),
                "{bad}: {r:?}"
            );
        }
        // Nothing to code is no error.
        assert!(encode_host_inputs(&[], 0, cols, (l, k, 1), &[]).is_ok());
    }

    #[test]
    fn every_kernel_the_host_launches_is_in_the_ptx_at_its_index() {
        let ptx: String = args::PTX.iter().map(|m| m.0).collect();
        assert_eq!(
            args::PTX.map(|m| (m.1, m.2)),
            [
                (true, None),
                (true, None),
                (false, None),
                (false, Some((9, 0)))
            ]
        );
        let names = args::function_names();
        for n in &names {
            assert!(
                ptx.contains(&format!(".entry {n}(")),
                "{n} missing from the PTX"
            );
        }
        // The driver looks each kernel up in its own module, so that the kernels of a module
        // not loaded (the sm_90a one off its device or route) stay missing and no others.
        let homes = args::kernel_modules(&names).expect("every kernel in a module");
        for (n, &home) in names.iter().zip(&homes) {
            let ok = match home {
                3 => {
                    n.starts_with("hc_wgmma_")
                        || (n.starts_with("hc_affine_gemm_") && n.contains("_x"))
                }
                2 => n.starts_with("hc_e8p_"),
                _ => !n.starts_with("hc_wgmma_") && !n.starts_with("hc_e8p_"),
            };
            assert!(ok, "{n} in module {home}");
            assert!(args::PTX[home].0.contains(&format!(".entry {n}(")));
        }
        assert!(homes.contains(&0) && homes.contains(&1));
        assert_eq!(
            args::kernel_modules(&["hc_no_such_kernel".to_string()]),
            Err("hc_no_such_kernel".to_string())
        );
        assert_eq!(names[args::affine_gemv(4, 1)], "hc_affine_gemv_b4_m1");
        assert_eq!(
            names[args::affine_gemm_split(2, Dtype::Bf16, 2, 1).unwrap()],
            "hc_affine_gemm_b2_r1_n2_x1_bf16"
        );
        assert_eq!(
            names[args::affine_gemm_split(4, Dtype::F16, 8, 8).unwrap()],
            "hc_affine_gemm_b4_r1_n8_x8_f16"
        );
        assert_eq!(
            names[args::affine_gemm_split(4, Dtype::Bf16, 4, 2).unwrap()],
            "hc_affine_gemm_b4_r1_n4_x2_bf16"
        );
        assert_eq!(args::affine_gemm_split(4, Dtype::Bf16, 4, 1), None);
        // The split rule on 132 SMs and 4096 columns, as measured on an H100: 17-32 rows aim for
        // 1.5 blocks an SM, 64 rows (8 batch tiles) for one; tall layers stay unsplit; 9-16 rows
        // take the split only for layers of up to 1024 rows.
        let rule = |rows, batch| args::gemm_split(rows, 4096, batch, 132);
        assert_eq!(
            [
                rule(1024, 17),
                rule(2048, 32),
                rule(4096, 17),
                rule(14336, 17)
            ],
            [(4, 8), (4, 8), (4, 4), (4, 1)]
        );
        assert_eq!(rule(1024, 64), (8, 8));
        assert_eq!([rule(1024, 16), rule(4096, 9)], [(2, 8), (2, 4)]);
        assert_eq!(args::gemm_split(1024, 512, 17, 132), (4, 1)); // (4 chunks: none to split)
        assert!(args::split_beats_gemv(1024, 8, 132) && args::split_beats_gemv(100, 8, 132));
        assert!(!args::split_beats_gemv(1088, 8, 132) && !args::split_beats_gemv(512, 4, 132));
        assert_eq!(
            names.len(),
            args::affine_gemm_split(4, Dtype::F16, 8, 8).unwrap() + 1
        );
        assert_eq!(names[args::affine_gemv(8, 3)], "hc_affine_gemv_b8_m4");
        for b in [1, 3, 5, 6, 7] {
            assert_eq!(
                names[args::affine_gemv(b, 1)],
                format!("hc_affine_gemv_b{b}_m1")
            );
            assert_eq!(
                names[args::affine_gemv(b, 4)],
                format!("hc_affine_gemv_b{b}_m4")
            );
        }
        for b in 1..=8 {
            assert_eq!(
                names[args::affine_decode_chunks(b)],
                format!("hc_affine_decode_b{b}")
            );
        }
        assert_eq!(names[args::e8_gemv(2, 1)], "hc_e8_gemv_b2_m1");
        assert_eq!(names[args::e8_gemv(7, 4)], "hc_e8_gemv_b7_m4");
        assert_eq!(names[args::e8_gemv(8, 2)], "hc_e8_gemv_b8_m2");
        assert_eq!(names[args::e8_gemv(5, 3)], "hc_e8_gemv_b5_m4");
        assert_eq!(
            (args::e8_rows_per_block(2), args::e8_rows_per_block(3)),
            (4, 8)
        );
        assert_eq!(names[args::trellis_gemv(1, 2)], "hc_trellis_gemv_m1_k2");
        assert_eq!(names[args::trellis_gemv(3, 7)], "hc_trellis_gemv_m4_k0");
        assert_eq!(names[args::trellis_gemv(4, 4)], "hc_trellis_gemv_m4_k4");
        // The trellis kernels by (batch, K, V) and the tensor-core ones by (K, V, batch tiles).
        for (i, want) in [
            (args::trellis_groups(1, 1, 1), "hc_trellis_groups_m1_k1"),
            (args::trellis_groups(2, 3, 1), "hc_trellis_groups_m2_k3"),
            (args::trellis_groups(3, 2, 1), "hc_trellis_groups_m4_k2"),
            (args::trellis_groups(4, 4, 1), "hc_trellis_groups_m4_k4"),
            (
                args::trellis_decode_groups(1, 1),
                "hc_trellis_decode_groups_k1",
            ),
            (
                args::trellis_decode_groups(4, 1),
                "hc_trellis_decode_groups_k4",
            ),
            (args::trellis_groups(1, 1, 2), "hc_trellis_groups_m1_k1_v2"),
            (args::trellis_groups(3, 4, 2), "hc_trellis_groups_m4_k4_v2"),
            (
                args::trellis_decode_groups(2, 2),
                "hc_trellis_decode_groups_k2_v2",
            ),
            (
                args::trellis_decode_groups(4, 2),
                "hc_trellis_decode_groups_k4_v2",
            ),
            (args::trellis_mma(1, 1, 1), "hc_trellis_mma_k1_v1_n1"),
            (args::trellis_mma(3, 1, 2), "hc_trellis_mma_k3_v1_n2"),
            (args::trellis_mma(2, 2, 1), "hc_trellis_mma_k2_v2_n1"),
            (args::trellis_mma(4, 2, 2), "hc_trellis_mma_k4_v2_n2"),
        ] {
            assert_eq!(names[i], want);
        }
        assert_eq!(names[args::quant_f8()], "hc_quant_f8");
        assert_eq!(names[args::quant_f8_blocks()], "hc_quant_f8_blocks");
        assert_eq!(
            names[args::affine_cpa_group(4, Dtype::Bf16).unwrap()],
            "hc_affine_cpa_group_b4_bf16"
        );
        assert_eq!(
            names[args::affine_cpa_group(2, Dtype::F16).unwrap()],
            "hc_affine_cpa_group_b2_f16"
        );
        assert_eq!(
            args::e8_prefix(8, 0, args::E8P_GEMV).unwrap(),
            args::affine_cpa_group(4, Dtype::F16).unwrap() + 1
        );
        assert_eq!(args::affine_cpa_group(8, Dtype::F16), None);
        assert_eq!(names[args::trellis_encode(1, 1)], "hc_trellis_encode_k1");
        assert_eq!(names[args::trellis_encode(4, 1)], "hc_trellis_encode_k4");
        assert_eq!(names[args::trellis_encode(1, 2)], "hc_trellis_encode_k1_v2");
        assert_eq!(names[args::trellis_encode(2, 2)], "hc_trellis_encode_k2_v2");
        assert_eq!(
            names[args::affine_cpa(2, Dtype::Bf16).unwrap()],
            "hc_affine_cpa_b2_bf16"
        );
        assert_eq!(
            names[args::affine_cpa(4, Dtype::F16).unwrap()],
            "hc_affine_cpa_b4_f16"
        );
        assert_eq!(args::affine_cpa(8, Dtype::F16), None);
        assert_eq!(args::affine_cpa(4, Dtype::F32), None);
        // The cp.async kernel's stages as the kernel lays them out (HcCpaStage).
        assert_eq!(
            (args::affine_cpa_shared(4, 1), args::affine_cpa_shared(2, 1)),
            (8 * (3 * 1408 + 64), 8 * (3 * 1664 + 64))
        );
        assert_eq!(args::affine_cpa_shared(4, 2), 8 * (3 * 1536 + 64));
        assert_eq!(
            names[args::affine_cpa_halves(4, Dtype::Bf16).unwrap()],
            "hc_affine_cpa_halves_b4_bf16"
        );
        assert_eq!(args::affine_cpa_halves(2, Dtype::Bf16), None);
        assert_eq!(
            names[args::affine_cpa_halves(4, Dtype::F16).unwrap()],
            "hc_affine_cpa_halves_b4_f16"
        );
        assert_eq!(args::affine_cpa_halves(8, Dtype::F16), None);
        assert_eq!(
            args::wgmma(Dtype::Bf16, 0).unwrap(),
            args::affine_cpa_halves(4, Dtype::F16).unwrap() + 1
        );
        assert_eq!(names[args::E8_RANS_DECODE], "hc_e8_rans_decode");
        assert_eq!(names[args::QUANT_I8], "hc_quant_i8");
        assert_eq!(names[args::W8A8_OUT], "hc_w8a8_out");
        assert_eq!(names[args::e8_rans_gemv(1)], "hc_e8_rans_gemv_m1");
        assert_eq!(names[args::e8_rans_gemv(2)], "hc_e8_rans_gemv_m2");
        assert_eq!(names[args::e8_rans_gemv(3)], "hc_e8_rans_gemv_m3");
        assert_eq!(names[args::e8_rans_gemv(4)], "hc_e8_rans_gemv_m4");
        assert_eq!(names[args::affine_decode_chunks(2)], "hc_affine_decode_b2");
        assert_eq!(names[args::RHT_FAST], "hc_rht_fast");
        assert_eq!(names[args::E8_ANY], "hc_e8_gemv_any");
        // The argument structs have the size nvcc gave the kernels' parameter (in the PTX).
        let param = |kernel: &str| -> usize {
            let key = format!("{kernel}_param_0[");
            let at = ptx.find(&key).expect("the kernel's first parameter") + key.len();
            ptx[at..at + ptx[at..].find(']').unwrap()].parse().unwrap()
        };
        assert_eq!(
            std::mem::size_of::<args::AffineArgs>(),
            param("hc_affine_gemv_b4_m1")
        );
        assert_eq!(
            std::mem::size_of::<args::AffineGroupArgs>(),
            param("hc_affine_cpa_group_b4_bf16")
        );
        assert_eq!(
            std::mem::size_of::<args::E8Args>(),
            param("hc_e8_gemv_b4_m1")
        );
        assert_eq!(
            std::mem::size_of::<args::TrellisArgs>(),
            param("hc_trellis_gemv_m1_k2")
        );
        assert_eq!(
            std::mem::size_of::<args::KvArgs>(),
            param("hc_kv_e8_encode")
        );
        assert_eq!(
            std::mem::size_of::<args::TrellisEncodeArgs>(),
            param("hc_trellis_encode_k2")
        );
        assert_eq!(
            std::mem::size_of::<args::E8PrefixArgs>(),
            param("hc_e8p_gemv_p12")
        );
        let e8p = |l, p, k| names[args::e8_prefix(l, p, k).unwrap()].as_str();
        assert_eq!(e8p(8, 0, args::E8P_GEMV), "hc_e8p_gemv_l8");
        assert_eq!(e8p(12, 0, args::E8P_MMA), "hc_e8p_mma_l12");
        assert_eq!(e8p(8, 12, args::E8P_DECODE_BF16), "hc_e8p_decode_bf16_p12");
        assert_eq!(
            e8p(8, 11, args::E8P_DECODE_BF16 + 1),
            "hc_e8p_decode_f16_p11"
        );
        assert!(args::e8_prefix(10, 11, 0).is_none() && args::e8_prefix(9, 0, 0).is_none());
        assert_eq!(
            e8p(10, 0, args::E8P_DECODE_BF16 + 2),
            "hc_e8p_decode_f32_l10"
        );
        assert_eq!(
            names[args::e8_prefix_two(11, false).unwrap()],
            "hc_e8p_gemv2_p11"
        );
        assert_eq!(
            names[args::e8_prefix_two(12, false).unwrap()],
            "hc_e8p_gemv2_p12"
        );
        assert_eq!(
            names[args::e8_prefix_two(11, true).unwrap()],
            "hc_e8p_mma2_p11"
        );
        assert!(args::e8_prefix_two(0, false).is_none() && args::e8_prefix_two(10, true).is_none());
        assert_eq!(
            args::affine_cpa_halves(4, Dtype::Bf16).unwrap(),
            args::e8_prefix_two(12, true).unwrap() + 1
        );
        assert_eq!(names[args::KV_E8_DECODE], "hc_kv_e8_decode");
        assert_eq!(names[args::KV_E8_ATTEND], "hc_kv_e8_attend");
        assert_eq!(names[args::KV_ATTEND_MERGE], "hc_kv_attend_merge");
        assert_eq!(
            std::mem::size_of::<args::KvMergeArgs>(),
            param("hc_kv_attend_merge")
        );
        assert_eq!(
            std::mem::size_of::<args::KvAttendArgs>(),
            param("hc_kv_e8_attend")
        );
        let mma = |b, d, w, m| names[args::affine_mma(b, d, w, m).unwrap()].as_str();
        assert_eq!(mma(2, Dtype::Bf16, 1, 1), "hc_affine_mma_b2_w1_n1_bf16");
        assert_eq!(mma(4, Dtype::Bf16, 4, 9), "hc_affine_mma_b4_w4_n2_bf16");
        assert_eq!(mma(4, Dtype::F16, 2, 8), "hc_affine_mma_b4_w2_n1_f16");
        assert_eq!(mma(8, Dtype::F16, 4, 16), "hc_affine_mma_b8_w4_n2_f16");
        assert!(args::affine_mma(8, Dtype::Bf16, 4, 1).is_none());
        assert!(args::affine_mma(4, Dtype::F32, 4, 1).is_none());
        assert!(args::affine_mma(4, Dtype::Bf16, 4, 17).is_none());
        let gemm = |b, d, r, n| names[args::affine_gemm(b, d, r, n).unwrap()].as_str();
        assert_eq!(gemm(2, Dtype::Bf16, 1, 4), "hc_affine_gemm_b2_r1_n4_bf16");
        assert_eq!(gemm(4, Dtype::Bf16, 2, 8), "hc_affine_gemm_b4_r2_n8_bf16");
        assert_eq!(gemm(4, Dtype::F16, 1, 8), "hc_affine_gemm_b4_r1_n8_f16");
        assert_eq!(
            names[args::affine_gemm(4, Dtype::F16, 2, 8).unwrap() + 1],
            "hc_trellis_groups_m1_k1_v2"
        );
        assert!(args::affine_gemm(8, Dtype::F16, 1, 4).is_none());
        assert!(args::affine_gemm(4, Dtype::F32, 1, 4).is_none());
        assert!(args::affine_gemm(4, Dtype::Bf16, 3, 4).is_none());
        // The split GEMM: the fewest batch tiles that hold the batch, and clusters that make
        // three quarters of two blocks an SM (132 SMs; one an SM at 8 batch tiles) while each
        // block walks 4 chunks or more.
        assert_eq!(args::gemm_split(1024, 4096, 17, 132), (4, 8)); // 16 blocks: 128
        assert_eq!(args::gemm_split(4096, 4096, 32, 132), (4, 4)); // 64 blocks: 256, 8 chunks each
        assert_eq!(args::gemm_split(4096, 4096, 64, 132), (8, 2)); // 64 blocks: 128
        assert_eq!(args::gemm_split(2048, 4096, 40, 132), (8, 4)); // 32 blocks: 128
        assert_eq!(args::gemm_split(14336, 4096, 64, 132), (8, 1)); // 224 blocks unsplit
        assert_eq!(args::gemm_split(1024, 1024, 17, 132), (4, 2)); // 8 chunks: 2 blocks of 4
        assert_eq!(args::gemm_split(1024, 896, 17, 132), (4, 1));
        assert_eq!(args::gemm_split(100, 4096, 9, 132), (2, 8));
        assert_eq!(args::gemm_split(100, 4096, 200, 132), (8, 8));
        assert_eq!(
            args::affine_gemm_split_shared(4, 4),
            4 * (8192 + 4096 + 512)
        );
        assert_eq!(
            args::affine_gemm_split_shared(2, 2),
            4 * (4096 + 2048 + 512)
        );
        // The switch: off by default, on, and the measurement's forced forms.
        let off = if GEMM_SPLIT_DEFAULT {
            GemmSplit::Rule
        } else {
            GemmSplit::Off
        };
        assert_eq!(GemmSplit::parse(None), off);
        assert_eq!(GemmSplit::parse(Some("0")), GemmSplit::Off);
        assert_eq!(GemmSplit::parse(Some("1")), GemmSplit::Rule);
        assert_eq!(
            GemmSplit::parse(Some("ks=4")),
            GemmSplit::Forced { ks: 4, from: 17 }
        );
        assert_eq!(
            GemmSplit::parse(Some("ks=1,from=9")),
            GemmSplit::Forced { ks: 1, from: 9 }
        );
        assert_eq!(GemmSplit::parse(Some("ks=4,from=9")).first_batch(), 9);
        assert_eq!(GemmSplit::parse(Some("1")).first_batch(), 9);
        assert_eq!(GemmSplit::parse(Some("0")).first_batch(), 17);
        for bad in [
            "ks=3",
            "ks=16",
            "from=9",
            "ks=2,from=1",
            "ks=2,from=65",
            "ks=2,x=1",
            "on",
            "",
        ] {
            assert_eq!(GemmSplit::parse(Some(bad)), off, "{bad}");
        }
        // The largest tiles that still make 200 blocks (the measured best on an H200).
        assert_eq!(args::gemm_shape(4096, 17), (1, 4));
        assert_eq!(args::gemm_shape(28672, 32), (2, 4));
        assert_eq!(args::gemm_shape(28672, 64), (2, 8));
        assert_eq!(args::gemm_shape(8192, 64), (1, 4));
        assert_eq!(args::gemm_shape(8192, 1024), (2, 8));
        // Stages of activations, codes and scale pairs (kernels/gemv.cu's STAGE).
        assert_eq!(args::affine_gemm_shared(4, 1, 4), 4 * (8192 + 4096 + 512));
        assert_eq!(args::affine_gemm_shared(2, 2, 8), 3 * (16384 + 4096 + 1024));
        // The Hopper GEMMs come next to last, bf16 then f16, in WGMMA_SHAPES' order, then the
        // affine GEMVs and decoders of 1, 3, 5, 6 and 7 bits.
        let wg = |d, shape| names[args::wgmma(d, shape).unwrap()].as_str();
        assert_eq!(wg(Dtype::Bf16, 0), "hc_wgmma_b4_s4_n128_k128_bf16");
        assert_eq!(wg(Dtype::Bf16, 2), "hc_wgmma_b4_s5_n256_k64_bf16");
        assert_eq!(wg(Dtype::F16, 1), "hc_wgmma_b4_s6_n128_k64_f16");
        assert_eq!(wg(Dtype::Bf16, 3), "hc_wgmma_b4_s4_n128_k128_x2_bf16");
        assert_eq!(wg(Dtype::F16, 4), "hc_wgmma_b4_s6_n128_k64_x2_f16");
        assert_eq!(
            args::wgmma(Dtype::F16, 5).unwrap(),
            args::affine_gemv(1, 1) - 1
        );
        assert_eq!(wg(Dtype::F16, 5), "hc_wgmma_b4_s5_n256_k64_x2_f16");
        assert_eq!(
            args::affine_decode_chunks(7) + 1,
            args::affine_gemm_split(2, Dtype::Bf16, 2, 1).unwrap()
        );
        assert!(args::wgmma(Dtype::F32, 0).is_none() && args::wgmma(Dtype::Bf16, 6).is_none());
        // Stages of 1024-byte multiples (WgStage), 1024 bytes to align them, all within the
        // 227 KB a Hopper block may opt in to.
        assert_eq!(args::wgmma_shared(0), 4 * (32768 + 128 * 80) + 1024);
        assert_eq!(args::wgmma_shared(2), 5 * (32768 + 128 * 48) + 1024);
        for shape in 0..args::WGMMA_SHAPES.len() {
            assert!(args::wgmma_shared(shape) <= 227 * 1024, "{shape}");
        }
    }

    #[test]
    fn the_gemm_bench_times_the_hopper_shapes_this_crate_launches() {
        // py/benches/cuda_gemm.py runs without the wheel, so it restates args::WGMMA_SHAPES
        // and the shared memory of a shape; this keeps its copy from drifting.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../py/benches/cuda_gemm.py");
        let bench = std::fs::read_to_string(path).expect("py/benches/cuda_gemm.py");
        let line = bench
            .lines()
            .find(|l| l.starts_with("WG_SHAPES = "))
            .expect("WG_SHAPES in the bench");
        assert_eq!(line, format!("WG_SHAPES = {:?}", args::WGMMA_SHAPES));
        // Its formula, sm = st * (bn * bk * 2 + 128 * (bk // 2 + 16)) + 1024, for each shape.
        assert!(bench.contains("sm = st * (bn * bk * 2 + 128 * (bk // 2 + 16)) + 1024"));
        for (shape, &(st, bn, bk, _)) in args::WGMMA_SHAPES.iter().enumerate() {
            assert_eq!(
                args::wgmma_shared(shape) as usize,
                st * (bn * bk * 2 + 128 * (bk / 2 + 16)) + 1024
            );
        }
    }

    #[test]
    fn the_hopper_gemm_takes_4_bit_rows_of_whole_chunks_and_aligned_pointers() {
        let a = AffineGemv {
            scale_dtype: Dtype::F16,
            scales_per_row: 2,
            cols: 256,
            code_bytes: 64 * 128,
            batch: 256,
            ..affine()
        };
        assert!(a.wgmma_ok());
        // Blocks of 256 activation rows above 128, else of 128 in chunks of 128 columns where
        // the groups hold whole ones (a scale per row is one group as long as the row), else
        // of 64; unsplit where that fills three quarters of the device (99 blocks of 132),
        // else split in 2 where that does (at least 2 chunks a block), else the most blocks.
        let shape = |glen, rows, cols, batch| {
            args::WGMMA_SHAPES[args::wgmma_shape(glen, rows, cols, batch, 132)]
        };
        assert_eq!(shape(128, 28672, 8192, 128), (4, 128, 128, 1));
        assert_eq!(shape(64, 28672, 8192, 100), (6, 128, 64, 1));
        assert_eq!(shape(128, 28672, 8192, 129), (5, 256, 64, 1));
        assert_eq!(shape(128, 98 * 128 + 1, 4096, 1024), (5, 256, 64, 1));
        assert_eq!(shape(128, 8192, 8192, 128), (4, 128, 128, 2));
        assert_eq!(shape(128, 8192, 8192, 256), (5, 256, 64, 2));
        assert_eq!(shape(192, 8192, 8192, 256), (5, 256, 64, 2));
        assert_eq!(shape(4096, 4096, 4096, 128), (4, 128, 128, 2));
        assert_eq!(shape(64, 4096, 4096, 128), (6, 128, 64, 2));
        // (128 blocks of 128 activation rows, split: the first that fills.)
        assert_eq!(shape(128, 4096, 4096, 256), (4, 128, 128, 2));
        // Too few chunks to split (2 of 128 columns), none filling: the most blocks.
        assert_eq!(shape(128, 4096, 256, 128), (4, 128, 128, 1));
        assert_eq!(shape(128, 200, 384, 520), (5, 256, 64, 2));
        for cols in [128, 256, 384, 512, 640, 1024] {
            for (glen, rows, batch) in [(64, 200, 65), (128, 4100, 300), (cols, 13_000, 129)] {
                let (_, _, k, ks) = shape(glen, rows, cols, batch);
                assert!(
                    ks == 1 || 2 * ks <= cols / k,
                    "{cols} {glen} {rows} {batch}"
                );
            }
        }
        assert_eq!(args::wgmma_blocks(4100, 300, 5), 33 * 2 * 2);
        assert!(args::wgmma_fills(98 * 128 + 1, 65, 0, 132));
        assert!(!args::wgmma_fills(98 * 128, 128, 0, 132));
        assert!(args::wgmma_fills(50 * 128, 65, 3, 132));
        assert!(!args::wgmma_fills(49 * 128, 65, 3, 132));
        // The routes: up to 256 activation rows where the grid fills the device (blocks of 256
        // rows above 128 where they fill it, else of 128), and 448-512 where blocks of 256 rows
        // fill it (Kernels::affine_wgmma_batches).
        for (rows, cols, want, wide) in [
            (200, 8192, None, false),
            // (At 448 rows 24 blocks of 128 split in 2 fill it only in blocks of 128 rows.)
            (3072, 8192, None, false),
            (3073, 8192, Some(129), true),
            // (Too few columns to split in chunks of 128; in 2 chunks of 64 at 448 rows.)
            (4096, 256, None, true),
            (8192, 128, Some(129), true),
            (4096, 4096, Some(129), true),
            (6272, 8192, Some(129), true),
            (6273, 8192, Some(65), true),
            (8192, 8192, Some(65), true),
            (8192, 256, Some(129), true),
            (28_672, 8192, Some(65), true),
            (28_672, 128, Some(65), true),
        ] {
            let routed = |b| args::wgmma_route(128, rows, cols, b, 132);
            let first = (65..=256).find(|&b| routed(b));
            assert_eq!(first, want, "{rows} {cols}");
            assert!((first.unwrap_or(257)..=256).all(routed), "{rows} {cols}");
            assert!(
                (257..448).chain(513..=1024).all(|b| !routed(b)),
                "{rows} {cols}"
            );
            assert!((448..=512).all(|b| routed(b) == wide), "{rows} {cols}");
        }
        for ok in [
            AffineGemv {
                group_len: 64,
                scales_per_row: 4,
                ..a
            },
            AffineGemv {
                group_len: 256,
                scales_per_row: 1,
                ..a
            },
            AffineGemv {
                x_dtype: Dtype::F16,
                offsets: 4096,
                ..a
            },
            AffineGemv {
                scale_dtype: Dtype::F32,
                ..a
            },
        ] {
            assert!(ok.wgmma_ok(), "{ok:?}");
        }
        for other in [
            AffineGemv { bits: 2, ..a },
            AffineGemv { bits: 8, ..a },
            AffineGemv {
                x_dtype: Dtype::F32,
                ..a
            },
            AffineGemv {
                cols: 192,
                group_len: 64,
                scales_per_row: 3,
                ..a
            },
            AffineGemv {
                group_len: 32,
                scales_per_row: 8,
                ..a
            },
            AffineGemv {
                scales_per_row: 0,
                ..a
            },
            AffineGemv { codes: 264, ..a },
            AffineGemv { x: 1032, ..a },
            AffineGemv { scales: 516, ..a },
            AffineGemv { offsets: 4100, ..a },
        ] {
            assert!(!other.wgmma_ok(), "{other:?}");
        }
    }

    #[test]
    fn the_tensor_core_kernel_takes_whole_steps_of_bf16_or_f16_rows() {
        // 4-bit, bf16: steps of 4·4·8 = 128 columns; groups of 128 hold whole steps.
        let a = AffineGemv {
            scales_per_row: 2,
            cols: 256,
            code_bytes: 64 * 128,
            ..affine()
        };
        assert_eq!(a.tensor_core_words(), 4);
        // ... and the GEMM takes it above MAX_MMA_BATCH (chunks of 128 columns).
        assert!(a.gemm_ok());
        assert_eq!(a.fused_batch(), MAX_GEMM_BATCH);
        // The routes keep a short layer to the GEMV's batch (decoded above it); from
        // GEMM_MIN_ROWS rows they give it the GEMM.
        assert_eq!(a.lone_batch(), MAX_MMA_BATCH);
        for (rows, lone) in [
            (GEMM_MIN_ROWS - 1, MAX_MMA_BATCH),
            (GEMM_MIN_ROWS, MAX_GEMM_BATCH),
        ] {
            let tall = AffineGemv { rows, ..a };
            assert_eq!(
                (tall.lone_batch(), tall.fused_batch()),
                (lone, MAX_GEMM_BATCH)
            );
        }
        // Groups of 64 need steps of 64 columns (2 words per lane), and split the GEMM's chunks.
        let g64 = AffineGemv {
            group_len: 64,
            scales_per_row: 4,
            ..a
        };
        assert_eq!(g64.tensor_core_words(), 2);
        assert!(!g64.gemm_ok());
        assert_eq!(g64.fused_batch(), MAX_MMA_BATCH);
        assert_eq!(g64.lone_batch(), MAX_MMA_BATCH);
        // At batch 1 they take the half-step cp.async kernel (4 bits only), not the
        // one-group kernel; groups of 128 the one-group kernel.
        assert!(g64.cpa_halves_shaped() && !g64.cpa_shaped());
        assert!(a.cpa_shaped() && !a.cpa_halves_shaped());
        for other in [
            AffineGemv { batch: 2, ..g64 },
            AffineGemv { bits: 2, ..g64 },
            AffineGemv {
                cols: 192,
                scales_per_row: 3,
                ..g64
            },
            AffineGemv {
                group_len: 32,
                ..g64
            },
            AffineGemv { codes: 8, ..g64 },
        ] {
            assert!(!other.cpa_halves_shaped(), "{other:?}");
        }
        // One scale per row, or for the tensor, whatever the row's length in chunks.
        for (per_row, group_len) in [(1, 256), (0, 256)] {
            let one = AffineGemv {
                scales_per_row: per_row,
                group_len,
                ..a
            };
            assert!(one.gemm_ok());
        }
        // 96 columns per row: steps of 32 (1 word per lane).
        let c96 = AffineGemv {
            cols: 96,
            group_len: 96,
            scales_per_row: 1,
            code_bytes: 64 * 48,
            ..affine()
        };
        assert_eq!(c96.tensor_core_words(), 1);
        // f32 activations, 8-bit codes with bf16, or 100 columns: the CUDA-core kernels.
        assert_eq!(
            AffineGemv {
                x_dtype: Dtype::F32,
                ..a
            }
            .fused_batch(),
            MAX_GEMV_BATCH
        );
        assert_eq!(
            AffineGemv {
                bits: 8,
                code_bytes: 64 * 256,
                ..a
            }
            .tensor_core_words(),
            0
        );
        assert_eq!(
            AffineGemv {
                bits: 8,
                code_bytes: 64 * 256,
                x_dtype: Dtype::F16,
                ..a
            }
            .tensor_core_words(),
            4
        );
        assert_eq!(
            AffineGemv {
                cols: 100,
                group_len: 100,
                code_bytes: 64 * 50,
                ..affine()
            }
            .tensor_core_words(),
            0
        );
    }

    #[test]
    fn the_trellis_group_path_needs_whole_word_groups() {
        let t = TrellisGemv {
            bits: 1 << 20,
            bit_bytes: 64 * 512,
            row_bytes: 512,
            row_scales: 1 << 21,
            xr: 1 << 22,
            y: 1 << 23,
            y_dtype: Dtype::F32,
            bias: 0,
            batch: 1,
            rows: 64,
            cols: 2048,
            l: 12,
            k: 2,
            seq: 1024,
            c1: 1.0,
            c0: 0.0,
            v: 1,
            xr16: 0,
        };
        assert!(t.validate().is_ok() && t.whole_groups());
        // bf16 and f16 outputs take the tensor cores, up to 16 activation rows a pass.
        assert!(!t.tensor_core() && t.fused_batch() == MAX_GEMV_BATCH);
        for y_dtype in [Dtype::Bf16, Dtype::F16] {
            let b = TrellisGemv { y_dtype, ..t };
            assert!(b.tensor_core() && b.fused_batch() == MAX_MMA_BATCH);
            assert!(!TrellisGemv { seq: 48, ..b }.tensor_core());
            // One row of the 1MAD code keeps the f32 group kernel; the pair code's does not.
            assert_eq!(b.mma_min_batch(), Some(2));
            assert_eq!(TrellisGemv { v: 2, ..b }.mma_min_batch(), Some(1));
            assert_eq!(TrellisGemv { seq: 48, ..b }.mma_min_batch(), None);
        }
        assert_eq!(t.mma_min_batch(), None);
        // Pairs take it too; the pair code's limits are checked.
        assert!(TrellisGemv { v: 2, ..t }.validate().is_ok());
        assert!(TrellisGemv { v: 3, ..t }.validate().is_err());
        assert!(TrellisGemv {
            v: 2,
            l: 8,
            k: 4,
            ..t
        }
        .validate()
        .is_err());
        let odd = TrellisGemv {
            cols: 2047,
            row_bytes: 512,
            ..t
        };
        assert!(odd.validate().is_ok());
        assert!(TrellisGemv { v: 2, ..odd }.validate().is_err());
        // Calibrated rows (sequences of 16) and one sequence per row also take it.
        assert!(TrellisGemv { seq: 16, ..t }.whole_groups());
        assert!(TrellisGemv { seq: 2056, ..t }.whole_groups());
        // Sequences of 48 or 8, a partial group, K above 4, an unaligned buffer do not.
        assert!(!TrellisGemv { seq: 48, ..t }.whole_groups());
        assert!(!TrellisGemv { seq: 8, ..t }.whole_groups());
        assert!(!TrellisGemv {
            cols: 2040,
            row_bytes: 510,
            ..t
        }
        .whole_groups());
        assert!(!TrellisGemv {
            k: 5,
            row_bytes: 1280,
            bit_bytes: 64 * 1280,
            ..t
        }
        .whole_groups());
        assert!(!TrellisGemv {
            bits: (1 << 20) + 4,
            ..t
        }
        .whole_groups());

        // K = 3: rows of 12-byte groups.
        assert!(TrellisGemv {
            k: 3,
            row_bytes: 768,
            bit_bytes: 64 * 768,
            ..t
        }
        .whole_groups());
    }

    #[test]
    fn kv_attention_checks_its_codecs_and_outputs() {
        let codec = KvE8 {
            x: 0,
            out: 0,
            dtype: Dtype::Bf16,
            codes: 1 << 20,
            scales: 1 << 21,
            out_row: 0,
            codes_row: 64 * 64,
            scales_row: 64,
            rows: 8,
            toks: 40,
            dim: 128,
            bits: 4,
            tile: 128,
            alpha: 1.0,
            seed: 7,
        };
        let a = KvE8Attend {
            keys: codec,
            values: KvE8 { bits: 3, ..codec },
            q: 1 << 22,
            queries: 6,
            query_len: 2,
            heads: 4,
            bias: 0,
            bias_batch: 0,
            bias_query: 0,
            bias_first: 0,
            exact_keys: 1 << 25,
            exact_values: 1 << 26,
            exact: 8,
            exact_dtype: Dtype::Bf16,
            scaling: 0.09,
            chunk: 16,
            part_o: 1 << 23,
            part_ml: 1 << 24,
            out: 1 << 27,
            out_dtype: Dtype::Bf16,
        };
        // The codecs' `out` is not needed; their codes, the queries and outputs are.
        assert!(a.validate().is_ok());
        assert_eq!(a.chunks(), 3); // 40 compressed and 8 exact tokens
        let bad = [
            KvE8Attend { q: 0, ..a },
            KvE8Attend {
                part_o: (1 << 23) + 4,
                ..a
            },
            KvE8Attend {
                values: KvE8 { toks: 41, ..codec },
                ..a
            },
            KvE8Attend {
                keys: KvE8 { codes: 0, ..codec },
                ..a
            },
            KvE8Attend { queries: 5, ..a },
            KvE8Attend { heads: 3, ..a },
            KvE8Attend { chunk: 0, ..a },
            KvE8Attend {
                exact_values: 0,
                ..a
            },
            KvE8Attend { out: 0, ..a },
            KvE8Attend { bias_first: 9, ..a },
        ];
        for b in bad {
            assert!(
                matches!(b.validate(), Err(CudaError::InvalidArgument(_))),
                "{b:?}"
            );
        }
        // About two blocks per SM: 4 rows of 8 queries over 2048 tokens → 66 chunks of 32 → 64.
        assert_eq!(KvE8Attend::chunk_for(4, 2048, 8), 64);
        assert_eq!(
            KvE8Attend::chunk_for(64, 2048, 8),
            2048usize.div_ceil(4).next_multiple_of(16)
        );
    }

    #[test]
    fn without_a_device_loading_is_a_typed_error() {
        match Kernels::new(0) {
            Ok(k) => assert!(k.functions() > 0),
            Err(e) => {
                assert!(
                    matches!(e, CudaError::NotCompiled | CudaError::NoDevice(_)),
                    "{e}"
                );
                eprintln!("kernels-cuda: skipped the device part: {e}");
            }
        }
    }
}
