//! The CUDA launches of the wheel: device pointers in (PyTorch's tensors' `data_ptr()`), the
//! kernels of `hypercodec-kernels-cuda` launched on the caller's stream. The buffers belong to
//! PyTorch; this module only validates shapes and launches.

use crate::{CudaError as PyCudaError, InvalidInputError};
use hypercodec_kernels_cuda::{
    AffineGemv, CudaError, Dtype, E8Gemv, E8PrefixGemv, E8RansGemv, Kernels, KvE8, KvE8Attend,
    QuantF8, QuantI8, RhtArgs, TrellisEncode, TrellisGemv, W8A8Out,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

thread_local! {
    /// The kernels [`gpu_trellis_rows`] encodes with on this thread (set by
    /// [`with_trellis_device`] around one encode).
    static ENCODER: std::cell::RefCell<Option<std::sync::Arc<Kernels>>> =
        const { std::cell::RefCell::new(None) };
}

/// A [`hypercodec_hwz::TrellisRowsEncoder`] that codes on the GPU the calling thread was given
/// by [`with_trellis_device`] (declining anywhere else: the CPU codes instead).
fn gpu_trellis_rows(
    values: &[f32],
    rows: usize,
    cols: usize,
    seq: usize,
    p: &hypercodec_trellis::TrellisParams,
    bits: &mut [u8],
) -> Result<(), String> {
    let k = ENCODER
        .with(|e| e.borrow().clone())
        .ok_or("no CUDA device on this thread")?;
    k.trellis_encode_host(values, rows, cols, seq, (p.l, p.k, p.v), p.affine(), bits)
        .map_err(|e| e.to_string())
}

/// Runs `f` with trellis rows coded on CUDA device `device` (when given) on this thread: the
/// encoder for [`hypercodec_hwz::EncodeOptions::trellis_rows`].
pub(crate) fn with_trellis_device<T>(
    device: Option<usize>,
    f: impl FnOnce(Option<hypercodec_hwz::TrellisRowsEncoder>) -> T,
) -> PyResult<T> {
    let Some(d) = device else {
        return Ok(f(None));
    };
    let k = Kernels::shared(d).map_err(cuda_err)?;
    /// Clears the thread's encoder however `f` ends (a panic included).
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            ENCODER.with(|e| *e.borrow_mut() = None);
        }
    }
    ENCODER.with(|e| *e.borrow_mut() = Some(k));
    let _reset = Reset;
    Ok(f(Some(hypercodec_hwz::TrellisRowsEncoder(
        gpu_trellis_rows,
    ))))
}

pub(crate) fn cuda_err(e: CudaError) -> PyErr {
    match e {
        CudaError::InvalidArgument(_) => InvalidInputError::new_err(e.to_string()),
        _ => PyCudaError::new_err(e.to_string()),
    }
}

/// Argument `$key` of dict `$d` ([`get_key`]), its name's Python string made once
/// (`intern!`): a launch reads 10–20 of them on every eager forward.
macro_rules! get {
    ($d:expr, $key:literal) => {
        get_key($d, pyo3::intern!($d.py(), $key), $key)
    };
}

/// An optional pointer argument: 0 when `key` is absent.
macro_rules! opt {
    ($d:expr, $key:literal) => {
        match $d.get_item(pyo3::intern!($d.py(), $key))? {
            Some(_) => get!($d, $key),
            None => Ok(0u64),
        }
    };
}

/// The value under `key` (named `name` in errors), extracted as `T`.
fn get_key<'py, T: FromPyObjectOwned<'py>>(
    d: &Bound<'py, PyDict>,
    key: &Bound<'py, pyo3::types::PyString>,
    name: &str,
) -> PyResult<T> {
    d.get_item(key)?
        .ok_or_else(|| InvalidInputError::new_err(format!("kernel argument `{name}` missing")))?
        .extract::<T>()
        .map_err(|e| {
            let e: PyErr = e.into();
            InvalidInputError::new_err(format!("kernel argument `{name}`: {e}"))
        })
}

fn dtype(code: i32) -> PyResult<Dtype> {
    Ok(match code {
        0 => Dtype::F32,
        1 => Dtype::F16,
        2 => Dtype::Bf16,
        _ => return Err(InvalidInputError::new_err(format!("dtype code {code}"))),
    })
}

fn affine(d: &Bound<'_, PyDict>) -> PyResult<AffineGemv> {
    Ok(AffineGemv {
        codes: get!(d, "codes")?,
        code_bytes: get!(d, "code_bytes")?,
        scales: get!(d, "scales")?,
        offsets: get!(d, "offsets")?,
        // The scales' type code (as `x_dtype`); f32 when absent.
        scale_dtype: match d.get_item(pyo3::intern!(d.py(), "scale_dtype"))? {
            Some(v) => dtype(v.extract()?)?,
            None => Dtype::F32,
        },
        x: get!(d, "x")?,
        x_dtype: dtype(get!(d, "x_dtype")?)?,
        y: get!(d, "y")?,
        y_dtype: dtype(get!(d, "y_dtype")?)?,
        bias: get!(d, "bias")?,
        batch: get!(d, "batch")?,
        rows: get!(d, "rows")?,
        cols: get!(d, "cols")?,
        bits: get!(d, "bits")?,
        group_len: get!(d, "group_len")?,
        scales_per_row: get!(d, "scales_per_row")?,
        qmul: get!(d, "qmul")?,
        qbias: get!(d, "qbias")?,
    })
}

fn e8(d: &Bound<'_, PyDict>) -> PyResult<E8Gemv> {
    Ok(E8Gemv {
        packed: get!(d, "packed")?,
        row_scales: get!(d, "row_scales")?,
        xr: get!(d, "xr")?,
        half: get!(d, "half")?,
        y: get!(d, "y")?,
        y_dtype: dtype(get!(d, "y_dtype")?)?,
        bias: get!(d, "bias")?,
        batch: get!(d, "batch")?,
        rows: get!(d, "rows")?,
        words: get!(d, "words")?,
        bits: get!(d, "bits")?,
    })
}

fn e8_rans(d: &Bound<'_, PyDict>) -> PyResult<E8RansGemv> {
    Ok(E8RansGemv {
        payload: get!(d, "payload")?,
        payload_bytes: get!(d, "payload_bytes")?,
        index: get!(d, "index")?,
        index_bytes: get!(d, "index_bytes")?,
        slots: get!(d, "slots")?,
        prob_bits: get!(d, "prob_bits")?,
        chunk: get!(d, "chunk")?,
        row_scales: get!(d, "row_scales")?,
        xr: get!(d, "xr")?,
        y: get!(d, "y")?,
        y_dtype: dtype(get!(d, "y_dtype")?)?,
        bias: get!(d, "bias")?,
        batch: get!(d, "batch")?,
        rows: get!(d, "rows")?,
        words: get!(d, "words")?,
    })
}

fn e8_prefix(d: &Bound<'_, PyDict>) -> PyResult<E8PrefixGemv> {
    Ok(E8PrefixGemv {
        words: get!(d, "words_ptr")?,
        payload_words: get!(d, "payload_words")?,
        index: get!(d, "index")?,
        table: get!(d, "table")?,
        limit: get!(d, "limit")?,
        pair_limit: get!(d, "pair_limit")?,
        segment: get!(d, "segment")?,
        span: get!(d, "span")?,
        row_scales: get!(d, "row_scales")?,
        xr: get!(d, "xr")?,
        xr16: get!(d, "xr16")?,
        y: get!(d, "y")?,
        y_dtype: dtype(get!(d, "y_dtype")?)?,
        bias: get!(d, "bias")?,
        batch: get!(d, "batch")?,
        rows: get!(d, "rows")?,
        cols: get!(d, "cols")?,
    })
}

fn trellis(d: &Bound<'_, PyDict>) -> PyResult<TrellisGemv> {
    Ok(TrellisGemv {
        bits: get!(d, "bits")?,
        bit_bytes: get!(d, "bit_bytes")?,
        row_bytes: get!(d, "row_bytes")?,
        row_scales: get!(d, "row_scales")?,
        xr: get!(d, "xr")?,
        y: get!(d, "y")?,
        y_dtype: dtype(get!(d, "y_dtype")?)?,
        bias: get!(d, "bias")?,
        batch: get!(d, "batch")?,
        rows: get!(d, "rows")?,
        cols: get!(d, "cols")?,
        l: get!(d, "l")?,
        k: get!(d, "k")?,
        seq: get!(d, "seq")?,
        c1: get!(d, "c1")?,
        c0: get!(d, "c0")?,
        v: get!(d, "v")?,
        xr16: opt!(d, "xr16")?,
    })
}

fn trellis_enc(d: &Bound<'_, PyDict>) -> PyResult<TrellisEncode> {
    Ok(TrellisEncode {
        x: get!(d, "x")?,
        bits: get!(d, "bits")?,
        scratch: get!(d, "scratch")?,
        max_scratch: get!(d, "max_scratch")?,
        bit_bytes: get!(d, "bit_bytes")?,
        row_bytes: get!(d, "row_bytes")?,
        rows: get!(d, "rows")?,
        cols: get!(d, "cols")?,
        seq: get!(d, "seq")?,
        l: get!(d, "l")?,
        k: get!(d, "k")?,
        v: get!(d, "v")?,
        c1: get!(d, "c1")?,
        c0: get!(d, "c0")?,
    })
}

fn kv(d: &Bound<'_, PyDict>) -> PyResult<KvE8> {
    Ok(KvE8 {
        x: get!(d, "x")?,
        out: get!(d, "out")?,
        dtype: dtype(get!(d, "dtype")?)?,
        codes: get!(d, "codes")?,
        scales: get!(d, "scales")?,
        out_row: get!(d, "out_row")?,
        codes_row: get!(d, "codes_row")?,
        scales_row: get!(d, "scales_row")?,
        rows: get!(d, "rows")?,
        toks: get!(d, "toks")?,
        dim: get!(d, "dim")?,
        bits: get!(d, "bits")?,
        tile: get!(d, "tile")?,
        alpha: get!(d, "alpha")?,
        seed: get!(d, "seed")?,
    })
}

/// The hypercodec CUDA kernels loaded on one device (in its primary context, the one PyTorch
/// uses). Methods take a dict of device pointers (`tensor.data_ptr()`), shapes and dtype codes
/// (0 f32, 1 f16, 2 bf16) and a raw stream (`torch.cuda.current_stream().cuda_stream`); they
/// launch without synchronizing. `hypercodec.cuda` builds these dicts from tensors; the
/// pointers must be device memory of the sizes stated, which this class cannot check.
#[pyclass(module = "hypercodec._native", frozen)]
pub(crate) struct CudaKernels {
    k: std::sync::Arc<Kernels>,
}

#[pymethods]
impl CudaKernels {
    /// The object itself: it is immutable, so `copy.copy` shares it (a deep copy of a model
    /// keeps one operator per stored form, as ties need).
    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// As `__copy__`.
    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
    }

    /// The kernels of device `device`, loaded once per process and shared with the trellis
    /// encoder (`Kernels::shared`); raises `CudaError` when this wheel or machine has no CUDA
    /// (no driver, no such device).
    #[new]
    fn new(device: usize) -> PyResult<Self> {
        Ok(CudaKernels {
            k: Kernels::shared(device).map_err(cuda_err)?,
        })
    }

    /// `out = RHT(x)` (keys: x, x_dtype, out, batch, cols, width, tile, seed, and optionally
    /// out16: an f16 copy).
    fn rht(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = RhtArgs {
            x: get!(args, "x")?,
            x_dtype: dtype(get!(args, "x_dtype")?)?,
            out: get!(args, "out")?,
            batch: get!(args, "batch")?,
            cols: get!(args, "cols")?,
            width: get!(args, "width")?,
            tile: get!(args, "tile")?,
            seed: get!(args, "seed")?,
            out16: opt!(args, "out16")?,
        };
        // SAFETY: the caller passes device tensors of the stated sizes (`hypercodec.cuda`).
        unsafe { self.k.rht(&a, stream) }.map_err(cuda_err)
    }

    /// The affine GEMV (keys: codes, code_bytes, scales, offsets, x, x_dtype, y, y_dtype, bias,
    /// batch, rows, cols, bits, group_len, scales_per_row, qmul, qbias; 0 for a null pointer).
    fn affine_gemv(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = affine(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.affine_gemv(&a, stream) }.map_err(cuda_err)
    }

    /// The affine GEMVs of up to `AFFINE_GROUP_MAX` layers that read one activation row, in
    /// one launch (a list of `affine_gemv`'s argument dicts); False, launching nothing, where
    /// they do not fit it (kernels-cuda `Kernels::affine_gemv_group`).
    fn affine_gemv_group(&self, layers: Vec<Bound<'_, PyDict>>, stream: u64) -> PyResult<bool> {
        let a = layers.iter().map(affine).collect::<PyResult<Vec<_>>>()?;
        // SAFETY: as in `rht`.
        unsafe { self.k.affine_gemv_group(&a, stream) }.map_err(cuda_err)
    }

    /// The most activation rows the routes hand the fused affine kernels (other than the
    /// Hopper GEMM) for these arguments on this device (kernels-cuda
    /// `Kernels::affine_fused_batch`: `MAX_GEMM_BATCH` where the tensor-core GEMM takes the
    /// layer and it has `GEMM_MIN_ROWS` rows or more, or on compute capability 9.0 splits it over
    /// clusters, 16 on the tensor-core GEMV, else 4 per pass). Pointers are checked for
    /// alignment, not read.
    fn affine_fused_batch(&self, args: &Bound<'_, PyDict>) -> PyResult<usize> {
        Ok(self.k.affine_fused_batch(&affine(args)?))
    }

    /// The tensor-core GEMM split over clusters that `affine_gemv` runs for these arguments at
    /// their batch, as (batch tiles of 8 a block, blocks a cluster); None where another kernel
    /// runs (kernels-cuda `Kernels::affine_gemm_split`; compute capability 9.0 only, on unless
    /// `HYPERCODEC_GEMM_SPLIT=0` turns it off).
    fn affine_gemm_split(&self, args: &Bound<'_, PyDict>) -> PyResult<Option<(usize, usize)>> {
        Ok(self.k.affine_gemm_split(&affine(args)?))
    }

    /// The same for a layer launched beside others that read one input (kernels-cuda
    /// `Kernels::affine_group_batch`: the GEMM's batch whatever the layer's height).
    fn affine_group_batch(&self, args: &Bound<'_, PyDict>) -> PyResult<usize> {
        Ok(self.k.affine_group_batch(&affine(args)?))
    }

    /// The activation rows the routes hand `affine_gemv`'s Hopper GEMM on this device, as
    /// inclusive ranges `(fewest, most)`, ascending and apart; empty where none (kernels-cuda
    /// `Kernels::affine_wgmma_batches`: above the other fused kernels' batches, up to 256 and
    /// 448–512, where its grid fills the device).
    fn affine_wgmma_batches(&self, args: &Bound<'_, PyDict>) -> PyResult<Vec<(usize, usize)>> {
        Ok(self.k.affine_wgmma_batches(&affine(args)?))
    }

    /// The same for the trellis kernels (kernels-cuda `TrellisGemv::fused_batch`: 16 on the
    /// tensor cores, for bf16/f16 outputs of the group layout, else 4 per pass).
    fn trellis_fused_batch(&self, args: &Bound<'_, PyDict>) -> PyResult<usize> {
        Ok(trellis(args)?.fused_batch())
    }

    /// The fewest activation rows for which the trellis GEMV runs its tensor-core kernel, or
    /// `None` where it never does (kernels-cuda `TrellisGemv::mma_min_batch`). Pointers are
    /// not read.
    fn trellis_mma_min_batch(&self, args: &Bound<'_, PyDict>) -> PyResult<Option<usize>> {
        Ok(trellis(args)?.mma_min_batch())
    }

    /// The affine weight decoded into `out` (`rows × cols` of dtype code `out_dtype`).
    fn affine_decode(
        &self,
        args: &Bound<'_, PyDict>,
        out: u64,
        out_dtype: i32,
        stream: u64,
    ) -> PyResult<()> {
        let a = affine(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.affine_decode(&a, out, dtype(out_dtype)?, stream) }.map_err(cuda_err)
    }

    /// The fixed-rate E8 GEMV (keys: packed, row_scales, xr, half (scratch, f32 batch × words),
    /// y, y_dtype, bias, batch, rows, words, bits).
    fn e8_gemv(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = e8(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.e8_gemv(&a, stream) }.map_err(cuda_err)
    }

    /// The rANS E8 GEMV (keys: payload, payload_bytes, index, index_bytes, slots, prob_bits,
    /// chunk, row_scales, xr, y, y_dtype, bias, batch, rows, words).
    fn e8_rans_gemv(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = e8_rans(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.e8_rans_gemv(&a, stream) }.map_err(cuda_err)
    }

    /// The scaled E8 points of rANS chunks (rotated domain) decoded into `out` (`rows ×
    /// 8·words`; the same keys, `xr`, `y`, `y_dtype` and `batch` unused).
    fn e8_rans_decode(
        &self,
        args: &Bound<'_, PyDict>,
        out: u64,
        out_dtype: i32,
        stream: u64,
    ) -> PyResult<()> {
        let a = e8_rans(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.e8_rans_decode(&a, out, dtype(out_dtype)?, stream) }.map_err(cuda_err)
    }

    /// Whether kernels for prefix codes of these limits are compiled and loaded on this device.
    fn e8_prefix_loaded(&self, limit: u8, pair_limit: u8) -> bool {
        self.k.e8_prefix_loaded(limit, pair_limit)
    }

    /// The prefix-coded E8 GEMV, f32 `y` (keys: words_ptr, payload_words, index, table,
    /// limit, pair_limit, segment, span, row_scales, xr (f32, one row), xr16 (f16, 2–16 rows), y,
    /// y_dtype (0 f32, 1 f16, 2 bf16), bias, batch, rows, cols).
    fn e8_prefix_gemv(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = e8_prefix(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.e8_prefix_gemv(&a, stream) }.map_err(cuda_err)
    }

    /// The scaled E8 points of prefix chunks (rotated domain) decoded into `out` (`rows ×
    /// cols` of `out_dtype`; the same keys, `xr`, `xr16`, `y` and `batch` unused).
    fn e8_prefix_decode(
        &self,
        args: &Bound<'_, PyDict>,
        out: u64,
        out_dtype: i32,
        stream: u64,
    ) -> PyResult<()> {
        let a = e8_prefix(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.e8_prefix_decode(&a, out, dtype(out_dtype)?, stream) }.map_err(cuda_err)
    }

    /// The W8A8 epilogue (keys: acc, step, scales, bias, y, y_dtype, rows, cols).
    fn w8a8_out(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = W8A8Out {
            acc: get!(args, "acc")?,
            step: get!(args, "step")?,
            scales: get!(args, "scales")?,
            bias: get!(args, "bias")?,
            y: get!(args, "y")?,
            y_dtype: dtype(get!(args, "y_dtype")?)?,
            rows: get!(args, "rows")?,
            cols: get!(args, "cols")?,
        };
        // SAFETY: as in `rht`.
        unsafe { self.k.w8a8_out(&a, stream) }.map_err(cuda_err)
    }

    /// Per-token int8 activations for W8A8 (keys: x, x_dtype, q, step, rows, cols).
    fn quant_i8(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = QuantI8 {
            x: get!(args, "x")?,
            x_dtype: dtype(get!(args, "x_dtype")?)?,
            q: get!(args, "q")?,
            step: get!(args, "step")?,
            rows: get!(args, "rows")?,
            cols: get!(args, "cols")?,
        };
        // SAFETY: as in `rht`.
        unsafe { self.k.quant_i8(&a, stream) }.map_err(cuda_err)
    }

    /// Per-token FP8 E4M3 activations for the FP8 GEMM (keys: x, x_dtype, q, step, rows,
    /// padded_rows, cols, and block: 0 or absent for a step per row, else a step per run of
    /// `block` columns, column-major, with sums: each run's sum, or absent; see
    /// `hypercodec_kernels_cuda::QuantF8`).
    fn quant_f8(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = QuantF8 {
            x: get!(args, "x")?,
            x_dtype: dtype(get!(args, "x_dtype")?)?,
            q: get!(args, "q")?,
            step: get!(args, "step")?,
            rows: get!(args, "rows")?,
            padded_rows: get!(args, "padded_rows")?,
            cols: get!(args, "cols")?,
            block: opt!(args, "block")? as usize,
            sums: opt!(args, "sums")?,
        };
        // SAFETY: as in `rht`.
        unsafe { self.k.quant_f8(&a, stream) }.map_err(cuda_err)
    }

    /// The trellis GEMV (keys: bits, bit_bytes, row_bytes, row_scales, xr, y, y_dtype, bias,
    /// batch, rows, cols, l, k, seq, c1, c0).
    fn trellis_gemv(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = trellis(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.trellis_gemv(&a, stream) }.map_err(cuda_err)
    }

    /// The scaled trellis values (rotated domain) decoded into `out` (`rows × cols`).
    fn trellis_decode(
        &self,
        args: &Bound<'_, PyDict>,
        out: u64,
        out_dtype: i32,
        stream: u64,
    ) -> PyResult<()> {
        let a = trellis(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.trellis_decode(&a, out, dtype(out_dtype)?, stream) }.map_err(cuda_err)
    }

    /// The trellis encoder (keys: x, bits, scratch, max_scratch, bit_bytes, row_bytes, rows,
    /// cols, seq, l, k, c1, c0; see `hypercodec_kernels_cuda::TrellisEncode`).
    fn trellis_encode(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = trellis_enc(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.trellis_encode(&a, stream) }.map_err(cuda_err)
    }

    /// The trellis encoder's launch shape on this device (`TrellisEncodePlan`'s fields).
    fn trellis_encode_plan<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let p = self
            .k
            .trellis_encode_plan(&trellis_enc(args)?)
            .map_err(cuda_err)?;
        let d = PyDict::new(py);
        d.set_item("threads", p.threads)?;
        d.set_item("runs_per_thread", p.runs_per_thread)?;
        d.set_item("ring", p.ring)?;
        d.set_item("w1", p.w1)?;
        d.set_item("w2", p.w2)?;
        d.set_item("shared", p.shared)?;
        d.set_item("blocks", p.blocks)?;
        d.set_item("scratch_bytes", p.scratch_bytes)?;
        d.set_item("back_pointers_in_scratch", p.back_pointers_in_scratch)?;
        Ok(d)
    }

    /// KV vectors encoded with the E8 codec (keys: x, out, dtype, codes, scales, out_row,
    /// codes_row, scales_row, rows, toks, dim, bits, tile, alpha, seed; see
    /// `hypercodec_kernels_cuda::KvE8`).
    fn kv_e8_encode(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = kv(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.kv_e8_encode(&a, stream) }.map_err(cuda_err)
    }

    /// Attention over compressed keys and values (`hypercodec_kernels_cuda::KvE8Attend`; keys:
    /// keys and values — dicts of `kv_e8_decode`'s keys —, q, queries, query_len, heads,
    /// exact_keys, exact_values, exact, exact_dtype, bias, bias_batch, bias_query, bias_first,
    /// scaling, chunk, part_o, part_ml, out, out_dtype).
    fn kv_e8_attend(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let sub = |key: &str| -> PyResult<KvE8> {
            let d = args.get_item(key)?.ok_or_else(|| {
                InvalidInputError::new_err(format!("kernel argument `{key}` missing"))
            })?;
            kv(d.cast::<PyDict>()?)
        };
        let a = KvE8Attend {
            keys: sub("keys")?,
            values: sub("values")?,
            q: get!(args, "q")?,
            queries: get!(args, "queries")?,
            query_len: get!(args, "query_len")?,
            heads: get!(args, "heads")?,
            bias: get!(args, "bias")?,
            bias_batch: get!(args, "bias_batch")?,
            bias_query: get!(args, "bias_query")?,
            bias_first: get!(args, "bias_first")?,
            scaling: get!(args, "scaling")?,
            chunk: get!(args, "chunk")?,
            part_o: get!(args, "part_o")?,
            part_ml: get!(args, "part_ml")?,
            exact_keys: get!(args, "exact_keys")?,
            exact_values: get!(args, "exact_values")?,
            exact: get!(args, "exact")?,
            exact_dtype: dtype(get!(args, "exact_dtype")?)?,
            out: get!(args, "out")?,
            out_dtype: dtype(get!(args, "out_dtype")?)?,
        };
        // SAFETY: as in `rht`.
        unsafe { self.k.kv_e8_attend(&a, stream) }.map_err(cuda_err)
    }

    /// The token chunk `kv_e8_attend` is best launched with for `rows` rows of `toks` tokens
    /// and `queries` queries (`KvE8Attend::chunk_for`).
    #[staticmethod]
    fn kv_attend_chunk(rows: usize, toks: usize, queries: usize) -> usize {
        KvE8Attend::chunk_for(rows, toks, queries)
    }

    /// KV vectors decoded (the same keys).
    fn kv_e8_decode(&self, args: &Bound<'_, PyDict>, stream: u64) -> PyResult<()> {
        let a = kv(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.kv_e8_decode(&a, stream) }.map_err(cuda_err)
    }

    /// The scaled E8 points (rotated domain) decoded into `out` (`rows × 8·words`).
    fn e8_decode(
        &self,
        args: &Bound<'_, PyDict>,
        out: u64,
        out_dtype: i32,
        stream: u64,
    ) -> PyResult<()> {
        let a = e8(args)?;
        // SAFETY: as in `rht`.
        unsafe { self.k.e8_decode(&a, out, dtype(out_dtype)?, stream) }.map_err(cuda_err)
    }
}
