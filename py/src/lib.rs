//! `hypercodec._native`: the Python wheel's native module.
//!
//! Key design decision: the binding sees buffers (numpy arrays: pointer, length, dtype,
//! shape) and paths, never torch; it releases the GIL for every heavy call; everything it does
//! is a call into the same library the command line uses (`hypercodec::main_with_args` for
//! the command line itself, the pipeline for archives, the runtime for compressed layers).
//! Each error kind of the library is its own Python exception class under
//! `hypercodec.HypercodecError`.

mod cuda;

use hypercodec_hwz::legacy::LegacyArchive;
use hypercodec_hwz::{
    EncodeOptions, EncodedTensor, Encoding, FloatDtype, HwzError, LatticeScale, Writer,
    WriterOptions,
};
use hypercodec_pipeline::shards::ArchiveSet;
use hypercodec_pipeline::{prefix_fallback, prefix_unfit, rate, PipelineError};
use hypercodec_plan::Spec;
use hypercodec_runtime::{CompressedLinear, LoadOptions, RuntimeError};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::path::PathBuf;

/// Numpy arrays read in their logical (row-major) order: a C-contiguous array borrowed, any
/// other layout (Fortran order, a strided view such as `a.T` or `a[:, ::2]`) copied.
/// rust-numpy's `as_slice` also accepts Fortran-ordered arrays, whose memory holds the values
/// in the other order: read as they lie, they would give wrong results without an error.
trait RowMajor<T: Clone> {
    /// The values in row-major order.
    fn row_major(&self) -> PyResult<std::borrow::Cow<'_, [T]>>;
}

impl<T: numpy::Element + Clone, D: numpy::ndarray::Dimension> RowMajor<T>
    for numpy::PyReadonlyArray<'_, T, D>
{
    fn row_major(&self) -> PyResult<std::borrow::Cow<'_, [T]>> {
        if self.is_c_contiguous() {
            return Ok(std::borrow::Cow::Borrowed(self.as_slice()?));
        }
        let mut v = Vec::new();
        v.try_reserve_exact(self.len()).map_err(|_| {
            pyo3::exceptions::PyMemoryError::new_err(format!(
                "a row-major copy of {} values does not fit in memory",
                self.len()
            ))
        })?;
        v.extend(self.as_array().iter().cloned());
        Ok(std::borrow::Cow::Owned(v))
    }
}

/// `n` zeroed f32 values (`what` names them), or `MemoryError` where they do not fit: an
/// output sized by the caller's shapes (a broadcast input of 2^40 rows) must not abort the
/// process.
fn zeroed(n: Option<usize>, what: &str) -> PyResult<Vec<f32>> {
    let too_big = || {
        pyo3::exceptions::PyMemoryError::new_err(format!(
            "{what}: {} float32 values do not fit in memory",
            n.map_or("more than 2^64".to_string(), |n| n.to_string())
        ))
    };
    let n = n.ok_or_else(too_big)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| too_big())?;
    v.resize(n, 0.0);
    Ok(v)
}

/// A float32 input array: any array-like (float64, float16, integer arrays, nested lists) is
/// converted by numpy first, as `np.asarray(x, dtype=np.float32)` would (numpy's default float64
/// was refused with "type mismatch").
type F32Like<'py> = numpy::PyArrayLikeDyn<'py, f32, numpy::AllowTypeChange>;

/// An output array as a row-major slice: a C-contiguous one only (results written into any
/// other layout would land in the wrong places).
fn row_major_mut<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &'a mut numpy::PyReadwriteArray<'_, T, D>,
    name: &str,
) -> PyResult<&'a mut [T]> {
    if !a.is_c_contiguous() {
        return Err(InvalidInputError::new_err(format!(
            "{name} must be a C-contiguous array (np.ascontiguousarray)"
        )));
    }
    Ok(a.as_slice_mut()?)
}

create_exception!(
    _native,
    HypercodecError,
    PyException,
    "Base of every hypercodec error."
);
create_exception!(
    _native,
    FormatError,
    HypercodecError,
    "An archive or stream is malformed, truncated or of an unknown encoding."
);
create_exception!(
    _native,
    InvalidInputError,
    HypercodecError,
    "An argument, shape, option or value (e.g. NaN weights) is not acceptable."
);
create_exception!(
    _native,
    HypercodecIOError,
    HypercodecError,
    "Reading or writing a file failed."
);
create_exception!(
    _native,
    CudaError,
    HypercodecError,
    "CUDA is not available to hypercodec (no driver or device), or a CUDA call failed."
);
create_exception!(
    _native,
    CancelledError,
    HypercodecError,
    "The operation was cancelled."
);

fn hwz_err(e: HwzError) -> PyErr {
    match e {
        HwzError::Io(_) => HypercodecIOError::new_err(e.to_string()),
        HwzError::ElementCount { .. }
        | HwzError::RowRange { .. }
        | HwzError::InvalidName { .. }
        | HwzError::RateUnreachable { .. } => InvalidInputError::new_err(e.to_string()),
        // What the values given to an encoder hold (NaN, a value a scale cannot carry): the
        // input's fault, not an archive's.
        HwzError::Scalar {
            source:
                hypercodec_hwz::ScalarError::NonFinite { .. }
                | hypercodec_hwz::ScalarError::NonFiniteStatistics { .. }
                | hypercodec_hwz::ScalarError::OutOfRange { .. }
                | hypercodec_hwz::ScalarError::ScaleOverflow { .. }
                | hypercodec_hwz::ScalarError::NotPositiveDefinite { .. }
                | hypercodec_hwz::ScalarError::InvalidDamp { .. }
                | hypercodec_hwz::ScalarError::ValuesUnderflow { .. },
            ..
        } => InvalidInputError::new_err(e.to_string()),
        HwzError::TensorNotFound { .. } => pyo3::exceptions::PyKeyError::new_err(e.to_string()),
        _ => FormatError::new_err(e.to_string()),
    }
}

fn pipeline_err(e: PipelineError) -> PyErr {
    match e {
        PipelineError::Hwz(h) => hwz_err(h),
        // The archive layer's kind of error, its message naming the file.
        PipelineError::Archive { path, source } => {
            let message = format!("{}: {source}", path.display());
            let kind = hwz_err(source);
            Python::attach(|py| PyErr::from_type(kind.get_type(py), message))
        }
        PipelineError::Runtime(r) => runtime_err(r),
        PipelineError::Io { .. } => HypercodecIOError::new_err(e.to_string()),
        PipelineError::Cancelled => CancelledError::new_err(e.to_string()),
        PipelineError::SafeTensors { .. }
        | PipelineError::Gguf { .. }
        | PipelineError::UnknownFormat { .. }
        | PipelineError::Shards { .. } => FormatError::new_err(e.to_string()),
        _ => InvalidInputError::new_err(e.to_string()),
    }
}

fn runtime_err(e: RuntimeError) -> PyErr {
    match e {
        RuntimeError::Hwz(h) => hwz_err(h),
        RuntimeError::Corrupt { .. } => FormatError::new_err(e.to_string()),
        _ => InvalidInputError::new_err(e.to_string()),
    }
}

/// The name a layer archive ([`layer_archive`]) gives a weight stored `[in, out]` (GPT-2's
/// `Conv1D`, run by [`CompressedLinear::transposed`]) in place of `weight`: a reader that does
/// not know the layout finds no `weight` and refuses the layer, where a mark beside it could be
/// overlooked and a square weight run the wrong way round.
const WEIGHT_IN_OUT: &str = "weight_in_out";

/// The serialized form of a compressed layer: a one-tensor `.hwz` archive in memory holding
/// `weight` (its stored form, as is; [`WEIGHT_IN_OUT`] when `transposed`) and, when given,
/// `bias` (raw float32).
fn layer_archive(
    shape: &[u64],
    source_dtype: &str,
    weight: &EncodedTensor,
    bias: Option<&[f32]>,
    transposed: bool,
) -> Result<Vec<u8>, HwzError> {
    let mut w = Writer::new(Vec::new(), WriterOptions::default())?;
    let name = if transposed { WEIGHT_IN_OUT } else { "weight" };
    w.add_tensor(name, shape, source_dtype, weight, None)?;
    if let Some(b) = bias {
        let shape = [b.len() as u64];
        let raw = Encoding::Raw {
            dtype: FloatDtype::F32,
        };
        let t = hypercodec_hwz::encode("bias", b, &shape, &raw, EncodeOptions::default())?;
        w.add_tensor("bias", &shape, "f32", &t, None)?;
    }
    Ok(w.finish()?.0)
}

/// Runs the command line on `argv` and returns its exit code; an interrupt cancels the run
/// (see [`interruptible`]) and is raised.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<String>) -> PyResult<u8> {
    interruptible(py, move |cancel| {
        let args = std::iter::once("hypercodec".to_string()).chain(argv);
        hypercodec::main_with_args_cancellable(args, cancel)
    })
}

/// `(input, output, the input's place after "compress": 1 for the next argument)` where `argv`
/// parses as a `compress` command (the CLI's parser: an option's value is never taken for a
/// path), else None.
#[pyfunction]
fn compress_paths(argv: Vec<String>) -> Option<(String, String, usize)> {
    let args = std::iter::once("hypercodec".to_string()).chain(argv);
    hypercodec::compress_paths(args).map(|(i, o, at)| (i, o.display().to_string(), at))
}

/// Runs the command line on `argv` and raises its error (a subclass of `HypercodecError`)
/// instead of printing it. What the command prints is returned as `(stdout, stderr)` text for
/// Python to write through `sys.stdout` and `sys.stderr` (a notebook shows it; a redirect
/// catches it), not written to the process's descriptors.
#[pyfunction]
fn run(py: Python<'_>, argv: Vec<String>) -> PyResult<(String, String)> {
    let (result, text) = interruptible(py, move |cancel| {
        let args = std::iter::once("hypercodec".to_string()).chain(argv);
        hypercodec::run_args_cancellable(args, cancel)
    })?;
    match result {
        Ok(()) => Ok((text.stdout, text.stderr)),
        Err(e) => {
            // What the run printed before the error is not lost (nor does a missing stream,
            // as under pythonw, hide the error).
            if let Ok(sys) = py.import("sys") {
                for (stream, text) in [("stdout", text.stdout), ("stderr", text.stderr)] {
                    if !text.is_empty() {
                        let _ = sys
                            .getattr(stream)
                            .and_then(|s| s.call_method1("write", (text,)));
                    }
                }
            }
            Err(pipeline_err(e))
        }
    }
}

/// Checks a candidate name (`Linear.quantize`'s `spec`: `int4`, `e8@4`, `e8@4:tensor`, ...)
/// without data, raising `InvalidInputError` for one the planner does not know: what a
/// quantization config checks when it is made, before any weight loads.
#[pyfunction]
fn check_spec(spec: &str) -> PyResult<()> {
    parse_spec(spec).map(|_| ())
}

/// A candidate name as `Linear.quantize` takes it: `NAME:tensor` is an entropy-coded lattice
/// with one step for every row.
fn parse_spec(spec: &str) -> PyResult<(Spec, LatticeScale)> {
    let (name, scale) = match spec.strip_suffix(":tensor") {
        Some(name) => (name, LatticeScale::Tensor),
        None => (spec, LatticeScale::Row),
    };
    let spec = Spec::parse(name).map_err(|e| InvalidInputError::new_err(e.to_string()))?;
    Ok((spec, scale))
}

/// The summary `hypercodec inspect --json` prints (native and legacy archives), as JSON text.
#[pyfunction]
fn inspect_json(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let v = detach(py, || hypercodec_pipeline::inspect_file(&path)).map_err(pipeline_err)?;
    Ok(v.to_string())
}

/// Writes a safetensors file through the library's writer (names checked, sizes checked,
/// written under a temporary name then renamed): `tensors` are `(name, dtype, shape, bytes)`
/// with dtype `F32`, `F16` or `BF16` and little-endian bytes; `metadata` goes to
/// `__metadata__`. This is how Python stages a state dict for the pipeline.
#[pyfunction]
#[pyo3(signature = (path, tensors, metadata=None))]
fn write_safetensors(
    py: Python<'_>,
    path: PathBuf,
    tensors: Vec<(String, String, Vec<u64>, pyo3::pybacked::PyBackedBytes)>,
    metadata: Option<std::collections::BTreeMap<String, String>>,
) -> PyResult<()> {
    use hypercodec_hwz::FloatDtype;
    use hypercodec_pipeline::safetensors_out::{self as st, OutTensor};
    let out: Vec<OutTensor> = tensors
        .iter()
        .map(|(name, dtype, shape, _)| {
            let dtype = match dtype.as_str() {
                "F32" => Ok(FloatDtype::F32),
                "F16" => Ok(FloatDtype::F16),
                "BF16" => Ok(FloatDtype::Bf16),
                other => Err(InvalidInputError::new_err(format!(
                    "tensor `{name}`: dtype {other} is not F32, F16 or BF16"
                ))),
            }?;
            Ok(OutTensor {
                name: name.clone(),
                shape: shape.clone(),
                dtype,
            })
        })
        .collect::<PyResult<_>>()?;
    let meta = metadata.map(|m| {
        m.into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect()
    });
    detach(py, || {
        st::write_safetensors(&path, &out, meta, |i, buf| {
            buf.extend_from_slice(&tensors[i].3);
            Ok(())
        })
    })
    .map_err(pipeline_err)
}

/// The instruction set the runtime's kernels use on this CPU (`avx512+avx2+fma`,
/// `avx2+fma` or `portable`).
#[pyfunction]
fn simd_level() -> &'static str {
    hypercodec_runtime::simd_level()
}

/// Set in a `fork()`ed child (`pthread_atfork`, registered when the module loads).
static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// A `fork()`ed child's own pool, with the child's process id.
static CHILD_POOL: std::sync::Mutex<Option<(u32, std::sync::Arc<rayon::ThreadPool>)>> =
    std::sync::Mutex::new(None);

#[cfg(unix)]
extern "C" fn after_fork_in_child() {
    FORKED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// A `fixed_bits` argument as the loader takes it: a Python integer outside a byte's range is
/// a typed error (it raised a bare OverflowError); the loader checks the rest.
fn fixed_bits_arg(v: Option<i64>) -> PyResult<Option<u8>> {
    v.map(|b| match u8::try_from(b) {
        Ok(b) if (2..=8).contains(&b) => Ok(b),
        // (refused here for every tensor: the runtime only checks it where it applies)
        _ => Err(InvalidInputError::new_err(format!(
            "fixed_bits {b}: bits per symbol, from 2 to 8"
        ))),
    })
    .transpose()
}

/// `f` without the GIL, on the process's thread pool. A process `fork()`ed after its parent ran
/// work on rayon's global pool inherits that pool without its threads, and any parallel work
/// there waited forever (a torch DataLoader worker calling `load` after the parent's `inspect`);
/// a forked child runs on a pool of its own, of the parent's size, made at its first call. The
/// process that was never forked pays one relaxed load.
fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    py.detach(|| on_pool(f))
}

/// `f` on the process's thread pool (a forked child's own: see [`detach`]).
fn on_pool<T, F>(f: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    {
        if !FORKED.load(std::sync::atomic::Ordering::Relaxed) {
            return f();
        }
        let pid = std::process::id();
        let pool = {
            let mut child = CHILD_POOL.lock().unwrap_or_else(|e| e.into_inner());
            match child.as_ref() {
                Some((p, pool)) if *p == pid => pool.clone(),
                _ => {
                    let built = rayon::ThreadPoolBuilder::new()
                        .num_threads(rayon::current_num_threads())
                        .build();
                    match built {
                        Ok(pool) => {
                            let pool = std::sync::Arc::new(pool);
                            // A grandchild's inherited pool has no threads here: not dropped
                            // (its drop would signal workers of another process), forgotten.
                            if let Some(old) = child.replace((pid, pool.clone())) {
                                std::mem::forget(old);
                            }
                            pool
                        }
                        // No thread could be started: the caller's thread runs it, as before.
                        Err(_) => {
                            drop(child);
                            return f();
                        }
                    }
                }
            }
        };
        pool.install(f)
    }
}

/// A command-line run `f` (given its own cancel flag) on a thread of its own while this one
/// waits without the GIL and looks at Python's signals every 50 ms: an interrupt (Ctrl-C, a
/// notebook's "interrupt kernel") sets the run's flag, the run stops before its next tensor and
/// removes its temporary file, and the interrupt is raised once the run has ended (further
/// interrupts while it stops are taken, not left pending). A run on the calling thread could
/// not see it before it finished: `save` of a large model wrote the archive, then raised.
fn interruptible<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: FnOnce(std::sync::Arc<hypercodec_pipeline::Cancel>) -> T + Send,
    T: Send,
{
    let cancel = std::sync::Arc::new(hypercodec_pipeline::Cancel::new());
    let flag = cancel.clone();
    let waiting = std::thread::current();
    std::thread::scope(|s| {
        let worker = s.spawn(move || {
            let out = on_pool(move || f(flag));
            waiting.unpark();
            out
        });
        let mut interrupt = None;
        while !worker.is_finished() {
            py.detach(|| std::thread::park_timeout(std::time::Duration::from_millis(50)));
            if let Err(e) = py.check_signals() {
                cancel.cancel();
                interrupt.get_or_insert(e);
            }
        }
        let out = worker
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match interrupt {
            Some(e) => Err(e),
            None => Ok(out),
        }
    })
}

/// Sets the size of the one thread pool (call before any heavy work; `None`: one per core,
/// or `$HYPERCODEC_THREADS`); returns the number of threads.
#[pyfunction]
#[pyo3(signature = (threads=None))]
fn init_threads(threads: Option<usize>) -> PyResult<usize> {
    hypercodec_pipeline::init_threads(threads).map_err(pipeline_err)
}

/// A `.hwz` archive (or a shard index, or a legacy Hyper Glyph zip archive) opened for
/// reading tensor by tensor.
#[pyclass(module = "hypercodec._native", frozen)]
struct Archive {
    inner: Inner,
    names: Vec<String>,
    shapes: Vec<Vec<u64>>,
}

enum Inner {
    Native(ArchiveSet),
    Legacy(LegacyArchive<memmap2::Mmap>),
}

impl Archive {
    fn set(&self, name: &str) -> PyResult<&ArchiveSet> {
        match &self.inner {
            Inner::Native(s) => Ok(s),
            Inner::Legacy(_) => Err(InvalidInputError::new_err(format!(
                "`{name}` is in a legacy Hyper Glyph archive, which can be decoded but not run \
                 compressed; recompress it with `hypercodec compress`"
            ))),
        }
    }
}

#[pymethods]
impl Archive {
    /// The object itself: it is immutable, so `copy.copy` shares it (a deep copy of a model
    /// keeps one operator per stored form, as ties need).
    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// As `__copy__`.
    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
    }

    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let legacy = hypercodec_pipeline::is_legacy(&path).map_err(pipeline_err)?;
        let inner = detach(py, || -> Result<Inner, PipelineError> {
            Ok(if legacy {
                Inner::Legacy(hypercodec_pipeline::open_legacy(&path)?)
            } else {
                Inner::Native(ArchiveSet::open(&path)?)
            })
        })
        .map_err(pipeline_err)?;
        let (names, shapes) = match &inner {
            Inner::Native(s) => s
                .tensors()
                .map(|t| (t.name.clone(), t.shape.clone()))
                .unzip(),
            Inner::Legacy(a) => a
                .tensors()
                .iter()
                .map(|t| (t.name.clone(), t.shape.clone()))
                .unzip(),
        };
        Ok(Archive {
            inner,
            names,
            shapes,
        })
    }

    /// The archive's free metadata (a JSON object as text; the first shard's for a sharded
    /// archive): e.g. `safetensors` (the source's `__metadata__`), `skipped_tensors`.
    fn metadata_json(&self) -> String {
        match &self.inner {
            Inner::Native(s) => s
                .parts
                .first()
                .map(|(_, a)| serde_json::to_string(&a.manifest().metadata).unwrap_or_default())
                .unwrap_or_else(|| "{}".into()),
            Inner::Legacy(a) => a.metadata().to_string(),
        }
    }

    /// Whether this is a legacy Hyper Glyph zip archive (decoded only).
    #[getter]
    fn legacy(&self) -> bool {
        matches!(self.inner, Inner::Legacy(_))
    }

    /// The tensor names, in archive order.
    fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    fn __len__(&self) -> usize {
        self.names.len()
    }

    /// The position of `name` in [`Archive::names`].
    fn index(&self, name: &str) -> PyResult<usize> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(name.to_string()))
    }

    /// The tensor's shape.
    fn shape<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyTuple>> {
        let k = self.index(name)?;
        PyTuple::new(py, self.shapes[k].iter().copied())
    }

    /// The tensor's type in the source file (`f32`, `bf16`, ...; `f32` for legacy archives).
    fn source_dtype(&self, name: &str) -> PyResult<String> {
        let k = self.index(name)?;
        Ok(match &self.inner {
            Inner::Native(s) => s
                .tensors()
                .nth(k)
                .map(|t| t.source_dtype.clone())
                .unwrap_or_default(),
            Inner::Legacy(_) => "f32".into(),
        })
    }

    /// The tensor's encoding, as JSON text (a legacy tensor: its Hyper Glyph codec name).
    fn encoding_json(&self, name: &str) -> PyResult<String> {
        let k = self.index(name)?;
        match &self.inner {
            Inner::Native(s) => {
                let t = s
                    .tensors()
                    .nth(k)
                    .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(name.to_string()))?;
                serde_json::to_string(&t.encoding).map_err(|e| FormatError::new_err(e.to_string()))
            }
            Inner::Legacy(a) => {
                Ok(serde_json::json!({ "legacy": a.tensors()[k].codec }).to_string())
            }
        }
    }

    /// The tensor decoded to float32, in its shape.
    fn read<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let k = self.index(name)?;
        let shape: Vec<usize> = self.shapes[k].iter().map(|&d| d as usize).collect();
        let n: usize = shape.iter().product();
        let values = detach(py, || -> Result<Vec<f32>, PyErr> {
            match &self.inner {
                Inner::Native(s) => {
                    let mut out = vec![0f32; n];
                    s.decode_into(k, &mut out).map_err(pipeline_err)?;
                    Ok(out)
                }
                Inner::Legacy(a) => a.decode_tensor(name).map_err(hwz_err),
            }
        })?;
        if values.len() != n {
            return Err(FormatError::new_err(format!(
                "`{name}` decoded to {} values, not {n}",
                values.len()
            )));
        }
        PyArray1::from_vec(py, values).reshape(shape)
    }

    /// The tensor as a compressed linear operator (its matrix view), with an optional bias;
    /// `fixed_bits` converts an entropy-coded lattice tensor to fixed-rate symbols at load
    /// (other tensors load as they are). `transposed`: the tensor is stored `[in, out]`
    /// (GPT-2's `Conv1D`) and the operator computes `y = x·W (+ b)` on it as stored
    /// (`rows` are its columns).
    #[pyo3(signature = (name, bias=None, fixed_bits=None, transposed=false))]
    fn linear(
        &self,
        py: Python<'_>,
        name: &str,
        bias: Option<F32Like<'_>>,
        fixed_bits: Option<i64>,
        transposed: bool,
    ) -> PyResult<Linear> {
        let fixed_bits = fixed_bits_arg(fixed_bits)?;
        let k = self.index(name)?;
        let set = self.set(name)?;
        let bias = bias
            .map(|b| b.row_major().map(std::borrow::Cow::into_owned))
            .transpose()?;
        let op = detach(py, || -> Result<CompressedLinear, PyErr> {
            let view = set.view(k).map_err(pipeline_err)?;
            // Where it applies: a model's affine fallbacks load as they are.
            let load = LoadOptions { fixed_bits }.for_tensor(&view);
            if transposed {
                CompressedLinear::transposed(view, bias.as_deref(), &load)
            } else {
                CompressedLinear::new(view, bias.as_deref(), &load)
            }
            .map_err(runtime_err)
        })?;
        let stored = set.stored_bytes(k).map_err(pipeline_err)?;
        Ok(Linear {
            op,
            stored,
            hwz: None,
            shape: self.shapes[k].clone(),
        })
    }

    /// Tensor `name` as the serialized form of a layer (see [`Linear::from_hwz`]): a one-tensor
    /// `.hwz` archive with its stored streams copied as they are (nothing re-encoded) and, when
    /// `bias` names a tensor, that tensor decoded to float32. `transposed`: the weight is stored
    /// `[in, out]` (see [`Archive::linear`]; 2-D) and is saved as `weight_in_out`, which
    /// `from_hwz` runs as such.
    #[pyo3(signature = (name, bias=None, transposed=false))]
    fn tensor_hwz<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        bias: Option<&str>,
        transposed: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let k = self.index(name)?;
        if transposed && self.shapes[k].len() != 2 {
            return Err(InvalidInputError::new_err(format!(
                "`{name}` of shape {:?} cannot be read as [in, out] (2-D needed)",
                self.shapes[k]
            )));
        }
        let b = match bias {
            Some(b) => Some((self.index(b)?, b)),
            None => None,
        };
        if let Some((j, b)) = b {
            // A bias of another length made a blob that `from_hwz` refused later.
            let shape = &self.shapes[k];
            let (rows, cols) = hypercodec_hwz::matrix_view(shape, shape.iter().product());
            let (outputs, what) = if transposed {
                (cols, "columns")
            } else {
                (rows, "rows")
            };
            let len: u64 = self.shapes[j].iter().product();
            if len != outputs {
                return Err(InvalidInputError::new_err(format!(
                    "`{b}` holds {len} values; `{name}` has {outputs} {what}"
                )));
            }
        }
        let set = self.set(name)?;
        let bytes = detach(py, || -> Result<Vec<u8>, PyErr> {
            let bias = match b {
                Some((j, _)) => {
                    let len = set
                        .tensors()
                        .nth(j)
                        .map_or(0, |t| t.shape.iter().product::<u64>());
                    let mut v = vec![0f32; len as usize];
                    set.decode_into(j, &mut v).map_err(pipeline_err)?;
                    Some(v)
                }
                None => None,
            };
            let (t, encoded) = set.encoded(k).map_err(pipeline_err)?;
            layer_archive(
                &t.shape,
                &t.source_dtype,
                &encoded,
                bias.as_deref(),
                transposed,
            )
            .map_err(hwz_err)
        })?;
        Ok(PyBytes::new(py, &bytes))
    }
}

/// A linear layer whose weight stays compressed: `y = x·Wᵀ (+ b)` on the CPU runtime.
#[pyclass(module = "hypercodec._native", frozen)]
struct Linear {
    op: CompressedLinear,
    /// The encoded tensor's stored bytes, all streams (for a layer read from an archive, its
    /// streams' bytes in the file).
    stored: u64,
    /// The layer's serialized form ([`layer_archive`]) when it was quantized here: the only
    /// copy of its encoded streams besides the operator (a layer read from an archive is
    /// serialized from the archive instead).
    hwz: Option<Vec<u8>>,
    /// The stored tensor's own shape (a convolution's four dimensions; `rows × cols` is its
    /// matrix view).
    shape: Vec<u64>,
}

#[pymethods]
impl Linear {
    /// The stored weight's own shape, e.g. `(out, in / groups, kh, kw)` for a convolution
    /// (`rows`, `cols` are its matrix view; for a weight stored `[in, out]`, that view
    /// transposed: see `transposed`).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.shape.iter().copied())
    }

    /// The object itself: it is immutable, so `copy.copy` shares it (a deep copy of a model
    /// keeps one operator per stored form, as ties need).
    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// As `__copy__`.
    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
    }

    /// Quantizes `weight` (float32, rank >= 2; a convolution runs on its matrix view
    /// `[out, in·kh·kw]`) with the candidate `spec` (`int4`, `int8-row`, `e8@4`, `e8-fixed4`,
    /// `lowrank@16`, `bf16`, ...; see `hypercodec plan --help`). A lattice rate the tensor
    /// cannot serve falls back to a per-tensor integer grid, as `compress` does. An entropy-coded
    /// lattice spec scales each row by its own RMS; `e8@3:tensor` takes one step for every row
    /// instead (`LatticeScale::Tensor`: lower squared error, higher perplexity on SmolLM2).
    ///
    /// `hessian` (float32, `cols × cols`: the second moment `E[x·xᵀ]` of the layer's inputs,
    /// e.g. from calibration text) turns on error-feedback rounding (GPTQ's rule; affine groups
    /// fitted with a clipping search) for affine,
    /// lattice and trellis specs (the trellis in sequences of 16 values), damped by `damp`
    /// times its mean diagonal; the stored format is the same. Other specs ignore it.
    ///
    /// `device` (a CUDA ordinal) codes trellis specs on that GPU (the same bits as the CPU's,
    /// tens of times faster; error-feedback rounding stays on the CPU); where CUDA is missing
    /// it raises `CudaError`.
    #[staticmethod]
    #[pyo3(signature = (weight, spec, bias=None, hessian=None, damp=0.01, device=None))]
    fn quantize(
        py: Python<'_>,
        weight: F32Like<'_>,
        spec: &str,
        bias: Option<F32Like<'_>>,
        hessian: Option<F32Like<'_>>,
        damp: f64,
        device: Option<usize>,
    ) -> PyResult<Linear> {
        let shape: Vec<u64> = weight.shape().iter().map(|&d| d as u64).collect();
        let values = &*weight.row_major()?;
        let hessian = hessian
            .map(|h| h.row_major().map(std::borrow::Cow::into_owned))
            .transpose()?;
        let bias = bias
            .map(|b| b.row_major().map(std::borrow::Cow::into_owned))
            .transpose()?;
        let (mut spec, lattice_scale) = parse_spec(spec)?;
        let opts = EncodeOptions {
            lattice_scale,
            ..EncodeOptions::default()
        };
        // A lattice rate the tensor cannot serve (its side information alone would eat the
        // budget: small layers; or below the lattice's least rate) falls back as in the
        // pipeline: prefix codes to GPU-shaped rANS, then a per-tensor integer grid
        // (`rate::alone_fallback`: two extra bits for a small layer, within the rate otherwise).
        if let Some((e, _)) = rate::narrow_fallback(&spec, "weight", &shape) {
            // Rows a fixed-rate recipe serves badly (a trellis state longer than a row, or a
            // scale and padding of a bit per value or more): the pipeline's per-tensor grid.
            spec = Spec::fixed(e);
        } else if let Spec::Rate {
            template,
            bps: Some(bps),
            max_tile,
        } = &spec
        {
            // Above the lattice's calibrated rates: its rate control has no scale there, and the
            // grid fallback would give 8 bits for the 12 asked (silently less than asked).
            if let Encoding::Lattice { lattice, .. } = template {
                let most = hypercodec_lattice::calibration::max_bps(*lattice);
                if *bps > most {
                    return Err(InvalidInputError::new_err(format!(
                        "{bps} bits per value is above the {lattice:?} lattice's rates (up to \
                         {most:.2}): ask for int8 (8 bits per value) or f16/bf16 (16)"
                    )));
                }
            }
            spec = match rate::serving_template("weight", &shape, template, *max_tile, *bps) {
                // Prefix codes whose code lengths the rate cannot carry: their rANS rung.
                Some(template) => Spec::Rate {
                    template,
                    max_tile: *max_tile,
                    bps: Some(*bps),
                },
                // Quantized alone: no model budget takes back a large layer's extra bits.
                None => match rate::alone_fallback("weight", &shape, *bps).map_err(pipeline_err)? {
                    Some(e) => Spec::fixed(e),
                    None => {
                        return Err(InvalidInputError::new_err(format!(
                            "the lattice cannot reach {bps} bits per value on a {shape:?} weight, \
                             and no integer grid fits that rate: ask for at least 1 bit per value"
                        )))
                    }
                },
            };
        }
        let (op, stored, hwz) =
            detach(py, || -> Result<(CompressedLinear, u64, Vec<u8>), PyErr> {
                let encode = |spec: &Spec| {
                    cuda::with_trellis_device(device, |trellis_rows| {
                        let opts = EncodeOptions {
                            trellis_rows,
                            ..opts
                        };
                        match &hessian {
                            Some(h) => spec
                                .encode_calibrated("weight", values, &shape, opts, h, damp)
                                .map(|(t, _)| t),
                            None => spec.encode("weight", values, &shape, opts),
                        }
                    })
                };
                // Prefix codes whose tables cannot hold the symbols (about 5 bits a value and
                // above): GPU-shaped rANS, as the pipeline does.
                let cols = hypercodec_hwz::matrix_view(&shape, values.len() as u64).1;
                let encoded = match (encode(&spec)?, prefix_fallback(&spec, cols)) {
                    (Err(e), Some(fallback)) if prefix_unfit(&e) => encode(&fallback)?,
                    (other, _) => other,
                };
                let t = encoded.map_err(|e| InvalidInputError::new_err(e.to_string()))?;
                // A constant weight (a zeroed adapter) that a lattice or trellis stores with
                // loss or in more bytes: its exact form, as the pipeline stores it.
                let t = match hypercodec_pipeline::constant_instead(
                    "weight", values, &shape, &t, None, opts,
                )
                .map_err(pipeline_err)?
                {
                    Some((exact, _)) => exact,
                    None => t,
                };
                // A weight the spec stores no better than zeros (values below what its scales
                // can hold: subnormals, say): raw f32, as the pipeline stores it (`path` and
                // `encoding` say so), measured where that can happen.
                let t = match hypercodec_pipeline::raw_instead(
                    "weight",
                    values,
                    &shape,
                    &t,
                    hypercodec_hwz::FloatDtype::F32,
                    None,
                    opts,
                )
                .map_err(pipeline_err)?
                {
                    Some((raw, _)) => raw,
                    None => t,
                };
                let op = CompressedLinear::from_encoded(
                    "weight",
                    &t,
                    &shape,
                    bias.as_deref(),
                    &LoadOptions::default(),
                )
                .map_err(runtime_err)?;
                let hwz = layer_archive(&shape, "f32", &t, bias.as_deref(), false)
                    .map_err(hwz_err)?;
                Ok((op, t.payload_bytes(), hwz))
            })?;
        Ok(Linear {
            op,
            stored,
            hwz: Some(hwz),
            shape,
        })
    }

    /// The layer saved by [`Linear::to_hwz`] or [`Archive::tensor_hwz`] (a one-tensor `.hwz`
    /// archive as bytes or a uint8 array: `weight`, or `weight_in_out` for a weight stored
    /// `[in, out]`, and `bias` when present), running on its stored form; `fixed_bits` as in
    /// [`Archive::linear`].
    #[staticmethod]
    #[pyo3(signature = (data, fixed_bits=None))]
    fn from_hwz(
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        fixed_bits: Option<i64>,
    ) -> PyResult<Linear> {
        let fixed_bits = fixed_bits_arg(fixed_bits)?;
        let owned;
        let array;
        let bytes: &[u8] = if let Ok(b) = data.cast::<PyBytes>() {
            b.as_bytes()
        } else {
            array = data
                .extract::<numpy::PyReadonlyArray1<'_, u8>>()
                .map_err(|_| {
                    InvalidInputError::new_err("from_hwz takes bytes or a 1-D uint8 array")
                })?;
            match array.is_c_contiguous().then(|| array.as_slice()) {
                Some(Ok(s)) => s,
                _ => {
                    owned = array.as_array().to_vec();
                    &owned
                }
            }
        };
        let (op, stored, source_shape) = detach(
            py,
            || -> Result<(CompressedLinear, u64, Vec<u64>), PyErr> {
                let a = hypercodec_hwz::Archive::open(bytes).map_err(hwz_err)?;
                let bias = match a.tensor("bias") {
                    Ok(_) => Some(a.decode_tensor("bias").map_err(hwz_err)?),
                    Err(_) => None,
                };
                let (t, transposed) = match (a.tensor("weight"), a.tensor(WEIGHT_IN_OUT)) {
                    (Ok(_), Ok(_)) => {
                        return Err(FormatError::new_err(format!(
                            "the layer holds both `weight` and `{WEIGHT_IN_OUT}`"
                        )))
                    }
                    (Err(_), Ok(t)) => (t, true),
                    (w, _) => (w.map_err(hwz_err)?, false),
                };
                let streams = a.tensor_streams(t).map_err(hwz_err)?;
                let refs: Vec<(&str, &[u8])> = streams
                    .iter()
                    .map(|(r, b)| (r.as_str(), b.as_ref()))
                    .collect();
                let shape = a.manifest().coded_shape(t);
                let view = hypercodec_hwz::TensorView::new(&t.name, &t.encoding, &shape, &refs)
                    .map_err(hwz_err)?;
                let load = LoadOptions { fixed_bits }.for_tensor(&view);
                let op = if transposed {
                    CompressedLinear::transposed(view, bias.as_deref(), &load)
                } else {
                    CompressedLinear::new(view, bias.as_deref(), &load)
                }
                .map_err(runtime_err)?;
                Ok((op, a.stored_bytes(t), t.shape.clone()))
            },
        )?;
        Ok(Linear {
            op,
            stored,
            hwz: None,
            shape: source_shape,
        })
    }

    /// The layer's serialized form (a one-tensor `.hwz` archive: `weight` as stored, `bias` as
    /// float32), or None for a layer read from an archive or from bytes (serialize those from
    /// their source: [`Archive::tensor_hwz`], or the bytes themselves).
    fn to_hwz<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.hwz.as_deref().map(|b| PyBytes::new(py, b))
    }

    /// `y = x·Wᵀ (+ b)` for `x` of shape `(..., cols)` (float32; other arrays are converted);
    /// returns `(..., rows)` float32.
    fn forward<'py>(
        &self,
        py: Python<'py>,
        x: F32Like<'py>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let shape = x.shape().to_vec();
        let cols = self.op.cols();
        if shape.last().copied() != Some(cols) {
            return Err(InvalidInputError::new_err(format!(
                "x has shape {shape:?}; its last dimension must be {cols}"
            )));
        }
        let batch: usize = shape[..shape.len() - 1].iter().product();
        let rows = self.op.rows();
        let mut y = zeroed(batch.checked_mul(rows), "the output")?;
        let xs = &*x.row_major()?;
        let y =
            detach(py, || self.op.forward(xs, batch, &mut y).map(|()| y)).map_err(runtime_err)?;
        let mut out_shape = shape;
        if let Some(last) = out_shape.last_mut() {
            *last = rows;
        }
        PyArray1::from_vec(py, y).reshape(out_shape)
    }

    /// Rows `ids` of the weight decoded to float32 (`len(ids) × cols`): an embedding lookup
    /// on the stored form.
    fn rows_of<'py>(
        &self,
        py: Python<'py>,
        ids: numpy::PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let rows = self.op.rows();
        let ids: Vec<usize> = ids
            .row_major()?
            .iter()
            .map(|&i| match usize::try_from(i) {
                Ok(r) if r < rows => Ok(r),
                // Named as given (a negative id too).
                _ => Err(InvalidInputError::new_err(format!(
                    "id {i} is out of range for an embedding of {rows} rows"
                ))),
            })
            .collect::<PyResult<_>>()?;
        let cols = self.op.cols();
        let mut out = zeroed(ids.len().checked_mul(cols), "the rows")?;
        let out = detach(py, || self.op.decode_rows(&ids, &mut out).map(|()| out))
            .map_err(runtime_err)?;
        PyArray1::from_vec(py, out).reshape(vec![ids.len(), cols])
    }

    /// The stored weight as an int8 matrix and a scale per row or group, when it is one
    /// (affine codes with a scale per row, per group or for the tensor: `int8-row`,
    /// `int4-row`, `int4`, …; the points of Z1, D4 and E8 tensors in their RHT domain,
    /// E8's doubled: `z1-fixed4`, `e8-fixed4`, `e8@4`, …;
    /// `hypercodec_runtime::Int8Weight`): a dict of `values` (int8, `rows × cols`), `scales`
    /// (float32, `rows`, or `rows × groups` for group scales), `offsets` (like `scales`, only
    /// for asymmetric codes, which `values` then holds centred: `q − 2^(bits−1)`), `group_len`
    /// (the columns a scale covers: `cols` for a scale per row), `tile` (the RHT domain's tile,
    /// 0 for none) and `seed`; None otherwise. What the quantized-activation routes multiply.
    fn int8_weight<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        let Some(w) = detach(py, || self.op.int8_weight()).map_err(runtime_err)? else {
            return Ok(None);
        };
        let d = pyo3::types::PyDict::new(py);
        let shape = vec![self.op.rows(), self.op.cols()];
        d.set_item("values", PyArray1::from_vec(py, w.values).reshape(shape)?)?;
        let groups = self.op.cols().div_ceil(w.group_len.max(1));
        let shaped = |v: Vec<f32>| {
            let a = PyArray1::from_vec(py, v);
            if groups == 1 {
                a.reshape(vec![self.op.rows()])
            } else {
                a.reshape(vec![self.op.rows(), groups])
            }
        };
        d.set_item("scales", shaped(w.scales)?)?;
        if !w.offsets.is_empty() {
            d.set_item("offsets", shaped(w.offsets)?)?;
        }
        d.set_item("group_len", w.group_len)?;
        d.set_item("tile", w.tile)?;
        d.set_item("seed", w.seed)?;
        Ok(Some(d))
    }

    /// The kind of [`Linear::device_form`] (`"affine"`, `"e8"`, `"e8rans"`, `"e8prefix"`,
    /// `"z1"` or `"trellis"`), or None: which CUDA kernels run the stored form. It builds the form to
    /// answer (the scales' copy, a GPU-shaped rANS slot table and its chunk-table check), so a
    /// corrupt tensor fails here as it would on the device.
    fn device_kind(&self) -> PyResult<Option<&'static str>> {
        Ok(self
            .op
            .device_form()
            .map_err(runtime_err)?
            .map(|f| f.kind()))
    }

    /// The stored form as the CUDA kernels read it (`"z1"`: read by the W8A8 route only), or
    /// None for forms without a device kernel (decoded instead). A dict: `kind` (`"affine"`,
    /// `"e8"`, `"e8rans"`, `"e8prefix"`, `"z1"` or `"trellis"`), the stored codes, words or bits as a uint8
    /// array, f32 side information, and the kernels' parameters; affine scales and offsets in
    /// the kernels' tiled layout (`⌈rows/16⌉·16·scales_per_row` values, see
    /// `hypercodec_kernels_cuda::tiled_scales`), and `fusable`: whether the fused affine kernels'
    /// f32 sums hold the layer (`hypercodec_kernels_cuda::affine_fusable`).
    fn device_form<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        use hypercodec_runtime::DeviceForm;
        let Some(form) = self.op.device_form().map_err(runtime_err)? else {
            return Ok(None);
        };
        let d = pyo3::types::PyDict::new(py);
        d.set_item("kind", form.kind())?;
        match form {
            DeviceForm::Affine {
                codes,
                scales,
                offsets,
                scale_dtype,
                bits,
                group_len,
                scales_per_row,
                qmul,
                qbias,
            } => {
                // Scales and offsets in the kernels' tiled layout (16 rows a tile; see
                // `hypercodec_kernels_cuda::tiled_scales`), f16/bf16 ones as stored (uint16
                // bits: every decoded value converts back exactly).
                let rows = self.op.rows();
                // The type's name, and how a decoded value turns back into its stored bits.
                type Stored = (&'static str, Option<fn(f32) -> u16>);
                let (name, to16): Stored = match scale_dtype {
                    hypercodec_hwz::FloatDtype::F16 => {
                        ("f16", Some(|x| half::f16::from_f32(x).to_bits()))
                    }
                    hypercodec_hwz::FloatDtype::Bf16 => {
                        ("bf16", Some(|x| half::bf16::from_f32(x).to_bits()))
                    }
                    _ => ("f32", None),
                };
                let tile = |v: &[f32]| -> PyResult<Bound<'py, pyo3::PyAny>> {
                    use hypercodec_kernels_cuda::tiled_scales;
                    Ok(match to16 {
                        Some(f) => {
                            let b: Vec<u16> = v.iter().map(|&x| f(x)).collect();
                            let t =
                                tiled_scales(&b, rows, scales_per_row).map_err(cuda::cuda_err)?;
                            PyArray1::from_vec(py, t).into_any()
                        }
                        None => {
                            let t =
                                tiled_scales(v, rows, scales_per_row).map_err(cuda::cuda_err)?;
                            PyArray1::from_vec(py, t).into_any()
                        }
                    })
                };
                d.set_item("codes", PyArray1::from_slice(py, codes))?;
                d.set_item("scales", tile(&scales)?)?;
                if offsets.is_empty() {
                    d.set_item("offsets", PyArray1::<f32>::zeros(py, 0, false))?;
                } else {
                    d.set_item("offsets", tile(&offsets)?)?;
                }
                d.set_item("scale_dtype", name)?;
                d.set_item("bits", bits)?;
                d.set_item("group_len", group_len)?;
                d.set_item("scales_per_row", scales_per_row)?;
                d.set_item("qmul", qmul)?;
                d.set_item("qbias", qbias)?;
                // Whether the fused kernels' f32 sums hold it (else: decode, then F.linear).
                d.set_item(
                    "fusable",
                    hypercodec_kernels_cuda::affine_fusable(&scales, &offsets, qmul, qbias),
                )?;
            }
            DeviceForm::Z1Fixed {
                packed,
                row_scales,
                bits,
                tile,
                seed,
            } => {
                d.set_item("packed", PyArray1::from_slice(py, packed))?;
                d.set_item("row_scales", PyArray1::from_vec(py, row_scales))?;
                d.set_item("bits", bits)?;
                d.set_item("tile", tile)?;
                d.set_item("seed", seed)?;
            }
            DeviceForm::E8Fixed {
                packed,
                row_scales,
                words,
                bits,
                tile,
                seed,
            } => {
                d.set_item("packed", PyArray1::from_slice(py, packed))?;
                d.set_item("row_scales", PyArray1::from_vec(py, row_scales))?;
                d.set_item("words", words)?;
                d.set_item("bits", bits)?;
                d.set_item("tile", tile)?;
                d.set_item("seed", seed)?;
            }
            DeviceForm::E8Rans {
                payload,
                index,
                slots,
                prob_bits,
                chunk,
                row_scales,
                words,
                tile,
                seed,
            } => {
                d.set_item("payload", PyArray1::from_slice(py, payload))?;
                d.set_item("index", PyArray1::from_slice(py, index))?;
                d.set_item("slots", PyArray1::from_vec(py, slots))?;
                d.set_item("prob_bits", prob_bits)?;
                d.set_item("chunk", chunk)?;
                d.set_item("row_scales", PyArray1::from_vec(py, row_scales))?;
                d.set_item("words", words)?;
                d.set_item("tile", tile)?;
                d.set_item("seed", seed)?;
            }
            DeviceForm::E8Prefix {
                payload,
                starts,
                table,
                limit,
                pair_limit,
                segment,
                span,
                row_scales,
                words,
                tile,
                seed,
            } => {
                d.set_item("payload", PyArray1::from_slice(py, payload))?;
                d.set_item("starts", PyArray1::from_vec(py, starts))?;
                d.set_item("table", PyArray1::from_vec(py, table))?;
                d.set_item("limit", limit)?;
                d.set_item("pair_limit", pair_limit)?;
                d.set_item("segment", segment)?;
                d.set_item("span", span)?;
                d.set_item("row_scales", PyArray1::from_vec(py, row_scales))?;
                d.set_item("words", words)?;
                d.set_item("tile", tile)?;
                d.set_item("seed", seed)?;
            }
            DeviceForm::Trellis {
                bits,
                row_bytes,
                row_scales,
                l,
                k,
                seq,
                c1,
                c0,
                v,
                tile,
                seed,
            } => {
                d.set_item("bits", PyArray1::from_slice(py, bits))?;
                d.set_item("row_bytes", row_bytes)?;
                d.set_item("row_scales", PyArray1::from_vec(py, row_scales))?;
                d.set_item("l", l)?;
                d.set_item("k", k)?;
                d.set_item("seq", seq)?;
                d.set_item("c1", c1)?;
                d.set_item("c0", c0)?;
                d.set_item("v", v)?;
                d.set_item("tile", tile)?;
                d.set_item("seed", seed)?;
            }
            _ => return Ok(None),
        }
        Ok(Some(d))
    }

    /// The weight decoded to float32 (`rows × cols`).
    fn weight<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let (rows, cols) = (self.op.rows(), self.op.cols());
        let w = detach(py, || self.op.decode_weight()).map_err(runtime_err)?;
        PyArray1::from_vec(py, w).reshape(vec![rows, cols])
    }

    /// The bias the operator adds (float32, `rows`), or None.
    #[getter]
    fn bias<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<f32>>> {
        self.op.bias().map(|b| PyArray1::from_slice(py, b))
    }

    /// Output features.
    #[getter]
    fn rows(&self) -> usize {
        self.op.rows()
    }

    /// Input features.
    #[getter]
    fn cols(&self) -> usize {
        self.op.cols()
    }

    /// Whether the weight is stored `[in, out]` and run as such (GPT-2's `Conv1D`, read with
    /// `Archive.linear(..., transposed=True)`): `rows` are its stored columns.
    #[getter]
    fn transposed(&self) -> bool {
        self.op.is_transposed()
    }

    /// The batch-1 route (e.g. `affine-int4-fused`, `e8-fixed4`, `lattice-resident-rans`).
    #[getter]
    fn path(&self) -> String {
        self.op.path_detail()
    }

    /// The route at `batch` activation rows.
    fn route(&self, batch: usize) -> String {
        self.op.route(batch)
    }

    /// The weight's stored bytes, every stream and all side information (as written to an
    /// archive); for a layer read from an archive, the bytes the operator holds.
    #[getter]
    fn stored_bytes(&self) -> u64 {
        self.stored
    }

    /// Bytes the operator holds (stored streams, parsed side information, bias).
    #[getter]
    fn held_bytes(&self) -> u64 {
        self.op.held_bytes()
    }

    fn __repr__(&self) -> String {
        format!(
            "Linear(rows={}, cols={}, path='{}', held_bytes={})",
            self.op.rows(),
            self.op.cols(),
            self.op.path_detail(),
            self.op.held_bytes()
        )
    }
}

/// The KV-cache vector codec (`hypercodec_lattice::kv`): rotate, normalize, fixed-rate
/// lattice or trellis codes plus one scale per vector. Vectors are rows of a float32
/// array whose last dimension is `dim`; codes are `uint8` (`code_bytes` per vector), scales
/// `uint16`, `scale_len(m)` entries for each row of `m` vectors (the array's second-to-last
/// axis): bf16 bits, one per vector; with `scale="log8"` none (one byte at the end of each
/// vector's codes: every scales array's last axis has length 0); with `scale="log4"` four
/// bits per vector, four vectors to an entry (vector `t` of a row: entry `t // 4`, bits
/// `4·(t % 4)`).
#[pyclass(module = "hypercodec._native", frozen)]
struct KvCodec {
    codec: hypercodec_lattice::kv::KvCodec,
    /// The constructor's arguments, for pickling (`__reduce__`).
    args: KvCodecArgs,
}

/// `KvCodec(dim, bits, quantizer, rotation, seed, dither, trellis_l, scale)`.
type KvCodecArgs = (usize, u8, String, String, u64, bool, u8, String);

fn lattice_err(e: hypercodec_lattice::LatticeError) -> PyErr {
    InvalidInputError::new_err(e.to_string())
}

/// One dither key per vector, when keys are given.
/// Dither keys as given: an array of unsigned or non-negative signed integers of any shape (one
/// per vector, in the vectors' order, e.g. `(batch, heads)` for `(batch, heads, dim)`
/// vectors), read flat.
fn dither_keys(keys: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<u64>>> {
    let Some(k) = keys else {
        return Ok(None);
    };
    if let Ok(a) = k.extract::<PyReadonlyArrayDyn<'_, u64>>() {
        return Ok(Some(a.row_major()?.into_owned()));
    }
    if let Ok(a) = k.extract::<PyReadonlyArrayDyn<'_, i64>>() {
        return a
            .row_major()?
            .iter()
            .map(|&v| {
                u64::try_from(v)
                    .map_err(|_| InvalidInputError::new_err(format!("dither key {v} is negative")))
            })
            .collect::<PyResult<Vec<u64>>>()
            .map(Some);
    }
    Err(pyo3::exceptions::PyTypeError::new_err(
        "dither keys must be a uint64 or int64 array, one key per vector",
    ))
}

fn check_keys(keys: Option<&[u64]>, n: usize) -> PyResult<()> {
    match keys {
        Some(k) if k.len() != n => Err(InvalidInputError::new_err(format!(
            "{} dither keys for {n} vectors",
            k.len()
        ))),
        _ => Ok(()),
    }
}

/// Vectors at or above this many are split over the thread pool.
const KV_PARALLEL_ROWS: usize = 4096;

/// `(row, first vector, vectors)` pieces of `rows` rows of `m` vectors (`n` in all), in
/// memory order: whole rows, or above [`KV_PARALLEL_ROWS`] vectors, pieces of about
/// `n / threads` that start at a multiple of 4 (a whole entry of log4 scales).
fn kv_pieces(rows: usize, m: usize, n: usize) -> Vec<(usize, usize, usize)> {
    let per = if n >= KV_PARALLEL_ROWS {
        n.div_ceil(rayon::current_num_threads()).next_multiple_of(4)
    } else {
        m.max(1)
    };
    (0..rows)
        .flat_map(|r| (0..m).step_by(per).map(move |t0| (r, t0, per.min(m - t0))))
        .collect()
}

#[pymethods]
impl KvCodec {
    /// The object itself: it is immutable, so `copy.copy` shares it (a deep copy of a model
    /// keeps one operator per stored form, as ties need).
    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// As `__copy__`.
    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
    }

    /// `quantizer`: `e8`, `d4` or `z1` (fixed-rate lattice forms) or `trellis` (bitshift
    /// trellis, `trellis_l` state bits); `rotation`: `rht`, `haar` or `none`; `dither` (lattice
    /// only) is keyed on one integer per vector given to `encode` / `decode`; `scale`: `bf16`
    /// (16 bits per vector), `log8` (8 bits: steps of 2^(1/8), ±4.4 %, from about 1.7e-5 to
    /// 5.9e4) or `log4` (4 bits: steps of 2^(1/4), ±9 %, from about 0.30 to 3.4, for vectors
    /// whose RMS sits near 1).
    #[new]
    #[pyo3(signature = (dim, bits, quantizer="e8", rotation="rht", seed=0, dither=false, trellis_l=10, scale="bf16"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dim: usize,
        bits: u8,
        quantizer: &str,
        rotation: &str,
        seed: u64,
        dither: bool,
        trellis_l: u8,
        scale: &str,
    ) -> PyResult<Self> {
        use hypercodec_lattice::kv::{KvQuantizer, Rotation, ScaleFormat};
        let format = match scale {
            "bf16" => ScaleFormat::Bf16,
            "log8" => ScaleFormat::Log8,
            "log4" => ScaleFormat::Log4,
            other => {
                return Err(InvalidInputError::new_err(format!(
                    "unknown scale format `{other}`; use bf16, log8 or log4"
                )))
            }
        };
        let q = KvQuantizer::named(quantizer, trellis_l).map_err(lattice_err)?;
        let r = match rotation {
            "rht" => Rotation::Rht,
            "haar" => Rotation::Haar,
            "none" => Rotation::None,
            other => {
                return Err(InvalidInputError::new_err(format!(
                    "unknown rotation `{other}`; use rht, haar or none"
                )))
            }
        };
        // Without the GIL: a Haar rotation of 2048 values takes seconds to build.
        let codec = detach(py, || {
            hypercodec_lattice::kv::KvCodec::new(dim, bits, q, r, seed, dither)
        })
        .map_err(lattice_err)?
        .with_scale_format(format);
        let args = (
            dim,
            bits,
            quantizer.to_string(),
            rotation.to_string(),
            seed,
            dither,
            trellis_l,
            scale.to_string(),
        );
        Ok(KvCodec { codec, args })
    }

    /// Pickles as its constructor's call (the codec is rebuilt, bit for bit the same).
    fn __reduce__<'py>(slf: Bound<'py, Self>) -> (Bound<'py, pyo3::types::PyType>, KvCodecArgs) {
        let args = slf.get().args.clone();
        (slf.get_type(), args)
    }

    /// What the CUDA kernels need to encode and decode this codec's vectors on the GPU, or None
    /// where they cannot (only the E8 lattice without dither, with bf16 scales, rotated by the
    /// RHT in tiles of at least 8 values or not at all, vectors of 8..=256 values in whole
    /// words, have a kernel).
    fn device_params<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        use hypercodec_lattice::kv::{KvQuantizer, Rotation, ScaleFormat};
        use hypercodec_lattice::Lattice;
        let c = &self.codec;
        let d = c.dim();
        let tile = match c.rotation() {
            Rotation::Rht => c.rht_tile().unwrap_or(0),
            Rotation::None => 0,
            Rotation::Haar => return Ok(None),
        };
        if c.quantizer() != KvQuantizer::Lattice(Lattice::E8)
            || c.dithers()
            || c.scale_format() != ScaleFormat::Bf16
        {
            return Ok(None);
        }
        // The shapes the kernels take are theirs to say: no vectors, so no pointers checked.
        let shape = hypercodec_kernels_cuda::KvE8 {
            x: 0,
            out: 0,
            dtype: hypercodec_kernels_cuda::Dtype::F32,
            codes: 0,
            scales: 0,
            out_row: 0,
            codes_row: 0,
            scales_row: 0,
            rows: 0,
            toks: 0,
            dim: d,
            bits: c.bits(),
            tile,
            alpha: c.alpha(),
            seed: c.seed(),
        };
        if shape.validate(false).is_err() || shape.code_bytes() != c.code_bytes() {
            return Ok(None);
        }
        let out = pyo3::types::PyDict::new(py);
        out.set_item("dim", d)?;
        out.set_item("bits", c.bits())?;
        out.set_item("alpha", c.alpha())?;
        out.set_item("tile", tile)?;
        out.set_item("seed", c.seed())?;
        out.set_item("code_bytes", c.code_bytes())?;
        Ok(Some(out))
    }

    /// Values per vector.
    #[getter]
    fn dim(&self) -> usize {
        self.codec.dim()
    }

    /// Bytes of codes per vector (with `scale="log8"`, the scale byte included).
    #[getter]
    fn code_bytes(&self) -> usize {
        self.codec.code_bytes()
    }

    /// uint16 scale entries that a row of `n` vectors takes: `n` (bf16), 0 (log8: in the
    /// codes) or `⌈n/4⌉` (log4).
    fn scale_len(&self, n: usize) -> usize {
        self.codec.scale_len(n)
    }

    /// Stored bits per value, codes and scale.
    #[getter]
    fn bits_per_value(&self) -> f64 {
        self.codec.bits_per_value()
    }

    /// Codes (`(..., m, code_bytes)` uint8) and scales (`(..., scale_len(m))` uint16: `(..., m)`
    /// bf16, `(..., 0)` with `scale="log8"`, `(..., ⌈m/4⌉)` with `scale="log4"`; a single
    /// vector's scales are `()`, `(0,)` and `(1,)`) of `x` (`(..., m, dim)` float32); `keys`
    /// (uint64, one per vector) when the codec dithers.
    #[pyo3(signature = (x, keys=None))]
    #[allow(clippy::type_complexity)]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        x: F32Like<'py>,
        keys: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyArrayDyn<u8>>, Bound<'py, PyArrayDyn<u16>>)> {
        let shape = x.shape().to_vec();
        let d = self.codec.dim();
        if shape.last() != Some(&d) {
            return Err(InvalidInputError::new_err(format!(
                "x has shape {shape:?}; its last dimension must be {d}"
            )));
        }
        let xs = &*x.row_major()?;
        let keys = dither_keys(keys.as_ref())?;
        let keys = keys.as_deref();
        let n = xs.len() / d.max(1);
        check_keys(keys, n)?;
        let cb = self.codec.code_bytes();
        let m = if shape.len() >= 2 {
            shape[shape.len() - 2]
        } else {
            1
        };
        let rows = n.checked_div(m).unwrap_or(0);
        let pieces = kv_pieces(rows, m, n);
        let (codes, scales) = detach(py, || -> PyResult<(Vec<u8>, Vec<u16>)> {
            let mut codes = vec![0u8; n * cb];
            let mut scales = vec![0u16; rows * self.codec.scale_len(m)];
            // Disjoint (codes, scales) slices of the pieces, in memory order.
            let mut work = Vec::with_capacity(pieces.len());
            let (mut crest, mut srest) = (&mut codes[..], &mut scales[..]);
            for &(r, t0, len) in &pieces {
                let (c, cr) = std::mem::take(&mut crest).split_at_mut(len * cb);
                let (s, sr) = std::mem::take(&mut srest).split_at_mut(self.codec.scale_len(len));
                (crest, srest) = (cr, sr);
                work.push((r * m + t0, c, s));
            }
            let run = |(v0, c, s): (usize, &mut [u8], &mut [u16])| {
                let len = c.len() / cb;
                let k = keys.map(|k| &k[v0..v0 + len]);
                self.codec.encode_into(&xs[v0 * d..(v0 + len) * d], k, c, s)
            };
            // The pool only for large inputs: a cache's blocks stay on the calling thread
            // (the pool's threads contend with torch's OpenMP threads).
            use rayon::prelude::*;
            if n >= KV_PARALLEL_ROWS {
                work.into_par_iter().try_for_each(run)
            } else {
                work.into_iter().try_for_each(run)
            }
            .map_err(lattice_err)?;
            Ok((codes, scales))
        })?;
        let mut cshape = shape.clone();
        *cshape.last_mut().expect("rank >= 1") = cb;
        let mut sshape = shape[..shape.len() - 1].to_vec();
        match sshape.last_mut() {
            Some(last) => *last = self.codec.scale_len(m),
            None if self.codec.scale_format() == hypercodec_lattice::kv::ScaleFormat::Bf16 => {}
            None => sshape.push(self.codec.scale_len(1)),
        }
        Ok((
            PyArray1::from_vec(py, codes).reshape(cshape)?,
            PyArray1::from_vec(py, scales).reshape(sshape)?,
        ))
    }

    /// Decodes the first `n` vectors of each row of `codes` (`(rows, capacity, code_bytes)`
    /// uint8, e.g. rows = batch · heads) and `scales` (`(rows, scale_len(capacity))` uint16) into
    /// `out[row, offset : offset + n]` (`out`: writable float32 `(rows, tokens, dim)`, e.g. the
    /// attention's key tensor, whose other tokens the caller fills). With a dithering codec,
    /// vector `t` of row `r` is keyed `(offset + t) · heads + r % heads`, as `encode` was.
    /// `parallel` spreads the rows over the thread pool; off by default, because inside a
    /// torch process the pool's threads contend with torch's spinning OpenMP threads (measured:
    /// 300 M values/s on two threads against 470 on one).
    #[pyo3(signature = (codes, scales, n, out, offset=0, heads=1, parallel=false))]
    #[allow(clippy::too_many_arguments)]
    fn decode_rows_into<'py>(
        &self,
        py: Python<'py>,
        codes: numpy::PyReadonlyArray3<'py, u8>,
        scales: numpy::PyReadonlyArray2<'py, u16>,
        n: usize,
        mut out: numpy::PyReadwriteArray3<'py, f32>,
        offset: usize,
        heads: usize,
        parallel: bool,
    ) -> PyResult<()> {
        let [rows, cap, cb]: [usize; 3] = codes.shape().try_into().expect("rank 3");
        let (d, want_cb) = (self.codec.dim(), self.codec.code_bytes());
        let sl = self.codec.scale_len(cap);
        let [orows, tokens, od]: [usize; 3] = out.shape().try_into().expect("rank 3");
        let heads = heads.max(1);
        if cb != want_cb
            || scales.shape() != [rows, sl]
            || n > cap
            || (orows, od) != (rows, d)
            || offset.checked_add(n).is_none_or(|e| e > tokens)
        {
            return Err(InvalidInputError::new_err(format!(
                "decode_rows_into: codes {:?}, scales {:?}, n {n}, out {:?}, offset {offset} do not fit \
                 (code_bytes {want_cb}, dim {d})",
                codes.shape(),
                scales.shape(),
                out.shape()
            )));
        }
        if n == 0 || rows == 0 || tokens == 0 {
            return Ok(());
        }
        let cs = &*codes.row_major()?;
        let ss = &*scales.row_major()?;
        let os = row_major_mut(&mut out, "out")?;
        let codec = &self.codec;
        let dither = codec.dithers();
        detach(py, || -> PyResult<()> {
            use rayon::prelude::*;
            // (row, first token, output slice) pieces of 256 vectors, for the thread pool.
            let per = 256;
            let mut pieces = Vec::new();
            for (r, orow) in os.chunks_mut(tokens * d).enumerate() {
                let dst = &mut orow[offset * d..(offset + n) * d];
                for (j, piece) in dst.chunks_mut(per * d).enumerate() {
                    pieces.push((r, j * per, piece));
                }
            }
            let run = |(r, t0, piece): (usize, usize, &mut [f32])| {
                let m = piece.len() / d;
                let c = &cs[(r * cap + t0) * cb..(r * cap + t0 + m) * cb];
                let s0 = r * sl + codec.scale_len(t0);
                let s = &ss[s0..s0 + codec.scale_len(m)];
                let keys: Option<Vec<u64>> = dither.then(|| {
                    (0..m)
                        .map(|t| ((offset + t0 + t) * heads + r % heads) as u64)
                        .collect()
                });
                codec.decode_into(c, s, keys.as_deref(), piece)
            };
            if parallel {
                pieces.into_par_iter().try_for_each(run)
            } else {
                pieces.into_iter().try_for_each(run)
            }
            .map_err(lattice_err)
        })
    }

    /// Softmax attention over the first `n` compressed tokens of each row, decoding a block of
    /// tokens at a time in the rotated domain (no decoded history is ever held). This codec
    /// coded the keys (`kcodes` `(rows, capacity, code_bytes)` uint8, `kscales` `(rows,
    /// scale_len(capacity))` uint16), `values` the values (`vcodes`, `vscales`, the same rows). `q`:
    /// float32 `(rows, g, dim)`, the queries of each row (e.g. rows = batch · key/value heads,
    /// g = the query heads sharing one, times the new tokens); scores are `scale·⟨q, k⟩` plus
    /// `bias` (optional float32 `(batch, b, ≥ n + m)` over every token, `m` exact ones included:
    /// row `r` reads batch `r // (rows / batch)`,
    /// query `j` its bias row `j % b`; `-inf` masks). Writes each query's output normalized
    /// over these tokens into `out` (float32 `(rows, g, value dim)`) and its log-sum-exp into
    /// `lse` (float32 `(rows, g)`), which merge with attention over other tokens. Exact tokens
    /// join the same softmax: `exact_keys` / `exact_values` (float32 `(rows, m, dim)`), the
    /// first `sinks` of them before the history; the bias columns then follow the tokens'
    /// order (sinks, history, the rest). Dither keys are `(offset + t) · heads + r % heads`, as
    /// in `decode_rows_into`; `parallel` spreads the rows over the thread pool (off by default,
    /// for the reason `decode_rows_into` gives: measured inside SmolLM2's decode step, 65 ms
    /// per step with it against 59 without). `kmean` / `vmean` (float32 `(heads, dim)`): the
    /// vectors taken out of row `r`'s keys / values (row `r % heads`) before they were encoded,
    /// added back to every decoded one. `kmix` / `vmix` (float32 `(heads, dim, dim)`): each
    /// head's matrix `W` back to the original domain, where a vector was encoded as
    /// `W⁻¹·x − mean` and reads as `W·(x̂ + mean)` (the mean then in the coded domain).
    #[pyo3(signature = (values, q, kcodes, kscales, vcodes, vscales, n, scale, bias, out, lse, exact_keys=None, exact_values=None, sinks=0, offset=0, heads=1, parallel=false, kmean=None, vmean=None, kmix=None, vmix=None))]
    #[allow(clippy::too_many_arguments)]
    fn attend<'py>(
        &self,
        py: Python<'py>,
        values: PyRef<'py, KvCodec>,
        q: numpy::PyReadonlyArray3<'py, f32>,
        kcodes: numpy::PyReadonlyArray3<'py, u8>,
        kscales: numpy::PyReadonlyArray2<'py, u16>,
        vcodes: numpy::PyReadonlyArray3<'py, u8>,
        vscales: numpy::PyReadonlyArray2<'py, u16>,
        n: usize,
        scale: f32,
        bias: Option<numpy::PyReadonlyArray3<'py, f32>>,
        mut out: numpy::PyReadwriteArray3<'py, f32>,
        mut lse: numpy::PyReadwriteArray2<'py, f32>,
        exact_keys: Option<numpy::PyReadonlyArray3<'py, f32>>,
        exact_values: Option<numpy::PyReadonlyArray3<'py, f32>>,
        sinks: usize,
        offset: usize,
        heads: usize,
        parallel: bool,
        kmean: Option<numpy::PyReadonlyArray2<'py, f32>>,
        vmean: Option<numpy::PyReadonlyArray2<'py, f32>>,
        kmix: Option<numpy::PyReadonlyArray3<'py, f32>>,
        vmix: Option<numpy::PyReadonlyArray3<'py, f32>>,
    ) -> PyResult<()> {
        let (kc, vc) = (&self.codec, &values.codec);
        let m = exact_keys.as_ref().map_or(0, |e| e.shape()[1]);
        let exact_fits = match (&exact_keys, &exact_values) {
            (Some(k), Some(v)) => {
                k.shape() == [q.shape()[0], m, kc.dim()]
                    && v.shape() == [q.shape()[0], m, vc.dim()]
                    && sinks <= m
            }
            (None, None) => sinks == 0,
            _ => false,
        };
        let heads = heads.max(1);
        for (what, mean, d) in [("kmean", &kmean, kc.dim()), ("vmean", &vmean, vc.dim())] {
            if let Some(a) = mean {
                if a.shape() != [heads, d] {
                    return Err(InvalidInputError::new_err(format!(
                        "attend: {what} has shape {:?}; it must be [{heads}, {d}] (heads, dim)",
                        a.shape()
                    )));
                }
            }
        }
        for (what, mix, d) in [("kmix", &kmix, kc.dim()), ("vmix", &vmix, vc.dim())] {
            if let Some(a) = mix {
                if a.shape() != [heads, d, d] {
                    return Err(InvalidInputError::new_err(format!(
                        "attend: {what} has shape {:?}; it must be [{heads}, {d}, {d}] (heads, dim, dim)",
                        a.shape()
                    )));
                }
            }
        }
        let kms = kmean.as_ref().map(|a| a.row_major()).transpose()?;
        let kms = kms.as_deref();
        let vms = vmean.as_ref().map(|a| a.row_major()).transpose()?;
        let vms = vms.as_deref();
        let kws = kmix.as_ref().map(|a| a.row_major()).transpose()?;
        let kws = kws.as_deref();
        let vws = vmix.as_ref().map(|a| a.row_major()).transpose()?;
        let vws = vws.as_deref();
        let [rows, g, dk]: [usize; 3] = q.shape().try_into().expect("rank 3");
        let [_, kcap, kcb]: [usize; 3] = kcodes.shape().try_into().expect("rank 3");
        let [_, vcap, vcb]: [usize; 3] = vcodes.shape().try_into().expect("rank 3");
        let dv = vc.dim();
        let bshape = bias.as_ref().map(|b| b.shape().to_vec());
        let fits = dk == kc.dim()
            && kcb == kc.code_bytes()
            && vcb == vc.code_bytes()
            && kcodes.shape()[0] == rows
            && vcodes.shape()[0] == rows
            && kscales.shape() == [rows, kc.scale_len(kcap)]
            && vscales.shape() == [rows, vc.scale_len(vcap)]
            && n <= kcap.min(vcap)
            && out.shape() == [rows, g, dv]
            && lse.shape() == [rows, g]
            && bshape.as_ref().is_none_or(|b| {
                b[0] > 0
                    && rows.is_multiple_of(b[0])
                    && b[1] > 0
                    && g.is_multiple_of(b[1])
                    && b[2] >= n + m
            })
            && exact_fits;
        if !fits {
            return Err(InvalidInputError::new_err(format!(
                "attend: q {:?}, kcodes {:?}, kscales {:?}, vcodes {:?}, vscales {:?}, n {n}, bias {bshape:?}, \
                 out {:?}, lse {:?}, exact {:?} / {:?} (sinks {sinks}) do not fit (key dim {} code_bytes {}, \
                 value dim {dv} code_bytes {})",
                q.shape(),
                kcodes.shape(),
                kscales.shape(),
                vcodes.shape(),
                vscales.shape(),
                out.shape(),
                lse.shape(),
                exact_keys.as_ref().map(|e| e.shape().to_vec()),
                exact_values.as_ref().map(|e| e.shape().to_vec()),
                kc.dim(),
                kc.code_bytes(),
                vc.code_bytes()
            )));
        }
        if rows == 0 || g == 0 {
            return Ok(());
        }
        let (qs, kcs, kss) = (q.row_major()?, kcodes.row_major()?, kscales.row_major()?);
        let (qs, kcs, kss) = (&*qs, &*kcs, &*kss);
        let eks = exact_keys.as_ref().map(|e| e.row_major()).transpose()?;
        let eks = eks.as_deref();
        let evs = exact_values.as_ref().map(|e| e.row_major()).transpose()?;
        let evs = evs.as_deref();
        let (vcs, vss) = (vcodes.row_major()?, vscales.row_major()?);
        let (vcs, vss) = (&*vcs, &*vss);
        let bs = bias.as_ref().map(|b| b.row_major()).transpose()?;
        let bs = bs.as_deref();
        let os = row_major_mut(&mut out, "out")?;
        let ls = row_major_mut(&mut lse, "lse")?;
        let dither = kc.dithers() || vc.dithers();
        let (ksl, vsl) = (kc.scale_len(kcap), vc.scale_len(vcap));
        detach(py, || -> PyResult<()> {
            use rayon::prelude::*;
            let run = |(r, (o, l)): (usize, (&mut [f32], &mut [f32]))| -> PyResult<()> {
                let keys: Option<Vec<u64>> = dither.then(|| {
                    (0..n)
                        .map(|t| ((offset + t) * heads + r % heads) as u64)
                        .collect()
                });
                let ks = hypercodec_lattice::kv::Side {
                    codec: kc,
                    codes: &kcs[r * kcap * kcb..(r * kcap + n) * kcb],
                    scales: &kss[r * ksl..r * ksl + kc.scale_len(n)],
                    mean: kms.map(|m| &m[(r % heads) * kc.dim()..(r % heads + 1) * kc.dim()]),
                    mix: kws.map(|w| {
                        let dd = kc.dim() * kc.dim();
                        &w[(r % heads) * dd..(r % heads + 1) * dd]
                    }),
                };
                let vs = hypercodec_lattice::kv::Side {
                    codec: vc,
                    codes: &vcs[r * vcap * vcb..(r * vcap + n) * vcb],
                    scales: &vss[r * vsl..r * vsl + vc.scale_len(n)],
                    mean: vms.map(|m| &m[(r % heads) * vc.dim()..(r % heads + 1) * vc.dim()]),
                    mix: vws.map(|w| {
                        let dd = vc.dim() * vc.dim();
                        &w[(r % heads) * dd..(r % heads + 1) * dd]
                    }),
                };
                let b = match (bs, &bshape) {
                    (Some(v), Some(sh)) => {
                        let per = sh[1] * sh[2];
                        let batch = r / (rows / sh[0]);
                        Some(hypercodec_lattice::kv::Bias {
                            values: &v[batch * per..(batch + 1) * per],
                            stride: sh[2],
                            rows: sh[1],
                        })
                    }
                    _ => None,
                };
                let exact = eks.zip(evs).map(|(ek, ev)| hypercodec_lattice::kv::Exact {
                    keys: &ek[r * m * dk..(r + 1) * m * dk],
                    values: &ev[r * m * dv..(r + 1) * m * dv],
                    sinks,
                });
                hypercodec_lattice::kv::attend_into(
                    ks,
                    vs,
                    exact,
                    keys.as_deref(),
                    &qs[r * g * dk..(r + 1) * g * dk],
                    scale,
                    b,
                    o,
                    l,
                )
                .map_err(lattice_err)
            };
            if parallel {
                os.par_chunks_mut(g * dv)
                    .zip(ls.par_chunks_mut(g))
                    .enumerate()
                    .try_for_each(run)
            } else {
                os.chunks_mut(g * dv)
                    .zip(ls.chunks_mut(g))
                    .enumerate()
                    .try_for_each(run)
            }
        })
    }

    /// The vectors of `codes` (`(..., code_bytes)` uint8) and `scales` (as `encode` gave them),
    /// as float32 `(..., dim)`; the same `keys` as `encode`.
    #[pyo3(signature = (codes, scales, keys=None))]
    fn decode<'py>(
        &self,
        py: Python<'py>,
        codes: PyReadonlyArrayDyn<'py, u8>,
        scales: PyReadonlyArrayDyn<'py, u16>,
        keys: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let (d, cb) = (self.codec.dim(), self.codec.code_bytes());
        let mut shape = codes.shape().to_vec();
        if shape.pop() != Some(cb) {
            return Err(InvalidInputError::new_err(format!(
                "codes have shape {:?}; their last dimension must be {cb}",
                codes.shape()
            )));
        }
        let cs = &*codes.row_major()?;
        let ss = &*scales.row_major()?;
        let keys = dither_keys(keys.as_ref())?;
        let keys = keys.as_deref();
        let n = cs.len() / cb;
        check_keys(keys, n)?;
        let m = shape.last().copied().unwrap_or(1);
        let rows = n.checked_div(m).unwrap_or(0);
        let mut want = shape.clone();
        match want.last_mut() {
            Some(last) => *last = self.codec.scale_len(m),
            None if self.codec.scale_format() == hypercodec_lattice::kv::ScaleFormat::Bf16 => {}
            None => want.push(self.codec.scale_len(1)),
        }
        if scales.shape() != want.as_slice() {
            return Err(InvalidInputError::new_err(format!(
                "scales have shape {:?}; codes of shape {:?} need {}{want:?}",
                scales.shape(),
                codes.shape(),
                match self.codec.scale_format() {
                    hypercodec_lattice::kv::ScaleFormat::Log8 => "an empty array ",
                    _ => "",
                }
            )));
        }
        let sl = self.codec.scale_len(m);
        let pieces = kv_pieces(rows, m, n);
        let mut out = zeroed(n.checked_mul(d), "the vectors")?;
        let out = detach(py, || -> PyResult<Vec<f32>> {
            let mut work = Vec::with_capacity(pieces.len());
            let mut rest = &mut out[..];
            for &(r, t0, len) in &pieces {
                let (o, tail) = std::mem::take(&mut rest).split_at_mut(len * d);
                rest = tail;
                work.push((r, t0, o));
            }
            let run = |(r, t0, o): (usize, usize, &mut [f32])| {
                let (len, v0) = (o.len() / d, r * m + t0);
                let s0 = r * sl + self.codec.scale_len(t0);
                self.codec.decode_into(
                    &cs[v0 * cb..(v0 + len) * cb],
                    &ss[s0..s0 + self.codec.scale_len(len)],
                    keys.map(|k| &k[v0..v0 + len]),
                    o,
                )
            };
            use rayon::prelude::*;
            if n >= KV_PARALLEL_ROWS {
                work.into_par_iter().try_for_each(run)
            } else {
                work.into_iter().try_for_each(run)
            }
            .map_err(lattice_err)?;
            Ok(out)
        })?;
        shape.push(d);
        PyArray1::from_vec(py, out).reshape(shape)
    }
}
fn lattice_named(name: &str) -> PyResult<hypercodec_hwz::Lattice> {
    hypercodec_hwz::Lattice::from_name(name).map_err(|e| InvalidInputError::new_err(e.to_string()))
}

/// The randomized Hadamard transform's signs of positions `0..n` under `seed`, as ±1.0
/// (float32; `hypercodec_lattice::rht::Signs`, the format's rule): what a transposed RHT on
/// another device applies after its Walsh–Hadamard stages.
#[pyfunction]
fn rht_signs<'py>(py: Python<'py>, seed: u64, n: usize) -> Bound<'py, PyArray1<f32>> {
    let signs = hypercodec_lattice::rht::Signs::new(seed, n);
    let v: Vec<f32> = (0..n)
        .map(|j| if signs.neg(j) { -1.0 } else { 1.0 })
        .collect();
    PyArray1::from_vec(py, v)
}

/// The lattice scale α whose rate on Gaussian data is `bps` bits per value (the shipped
/// calibration table; no calibration runs at import).
#[pyfunction]
#[pyo3(signature = (bps, lattice="e8"))]
fn lattice_alpha(bps: f32, lattice: &str) -> PyResult<f32> {
    let lat = lattice_named(lattice)?;
    let table = hypercodec_lattice::calibration::table(lat);
    let (min, max) = table.iter().fold((f32::MAX, 0f32), |(lo, hi), row| {
        (lo.min(row[2]), hi.max(row[2]))
    });
    if !(bps >= min && bps <= max) {
        return Err(InvalidInputError::new_err(format!(
            "bps {bps}: the {lattice} calibration covers rates in [{min:.2}, {max:.2}]"
        )));
    }
    Ok(hypercodec_lattice::calibration::alpha_for_bps(lat, bps))
}

/// `(snr_db, bps)` the lattice reaches at scale `alpha` on Gaussian data (shipped table).
#[pyfunction]
#[pyo3(signature = (alpha, lattice="e8"))]
fn lattice_predict(alpha: f32, lattice: &str) -> PyResult<(f32, f32)> {
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(InvalidInputError::new_err(format!(
            "alpha {alpha}: a finite scale above 0"
        )));
    }
    Ok(hypercodec_lattice::calibration::predict(
        lattice_named(lattice)?,
        alpha,
    ))
}

/// The code `(l, k)` with `v` values per state (1: 1MAD, 2: pairs) at its calibrated scale
/// unless `scale` is given.
fn trellis_params(
    l: u8,
    k: u8,
    scale: Option<f32>,
    v: u8,
) -> PyResult<hypercodec_trellis::TrellisParams> {
    let mut p = match v {
        1 => hypercodec_trellis::TrellisParams::new(l, k),
        2 => hypercodec_trellis::TrellisParams::pairs(l, k),
        _ => {
            return Err(InvalidInputError::new_err(format!(
                "{v} values per trellis state (1, or 2 for pairs)"
            )))
        }
    };
    if let Some(s) = scale {
        p.scale = s;
    }
    // Checks (L, K) the way every encoder does.
    hypercodec_trellis::Encoder::new(&p).map_err(|e| InvalidInputError::new_err(e.to_string()))?;
    Ok(p)
}

/// `(scale, c1, c0)` of the trellis code `(l, k)` with `v` values per state (2: pairs): the
/// calibrated scale unless `scale` is given, and the affine map `value = c1·sum + c0` every
/// decoder and encoder uses.
#[pyfunction]
#[pyo3(signature = (l, k, scale=None, v=1))]
fn trellis_code(l: u8, k: u8, scale: Option<f32>, v: u8) -> PyResult<(f32, f32, f32)> {
    let p = trellis_params(l, k, scale, v)?;
    let (c1, c0) = p.affine();
    Ok((p.scale, c1, c0))
}

/// Encodes the rows of `values` (f32, `rows × cols`) with the bitshift trellis on the CPU
/// (`hypercodec_trellis::Encoder`, rows across threads), each row cut into tail-biting
/// sequences of `seq` values (the last takes the rest): `rows · ceil(cols·k/8)` bytes; `v`
/// values per state (2: the pair code).
#[pyfunction]
#[pyo3(signature = (values, l, k, seq, scale=None, v=1))]
fn trellis_encode<'py>(
    py: Python<'py>,
    values: F32Like<'py>,
    l: u8,
    k: u8,
    seq: usize,
    scale: Option<f32>,
    v: u8,
) -> PyResult<Bound<'py, PyBytes>> {
    let p = trellis_params(l, k, scale, v)?;
    let shape = values.shape().to_vec();
    let [rows, cols] = shape[..] else {
        return Err(InvalidInputError::new_err(format!(
            "values of shape {shape:?}; expected rows × cols"
        )));
    };
    if seq == 0 || !seq.is_multiple_of(8) {
        return Err(InvalidInputError::new_err(format!(
            "sequences of {seq} values (use a multiple of 8)"
        )));
    }
    let x = values.row_major()?.into_owned();
    let rb = (cols * k as usize).div_ceil(8);
    let bits = detach(
        py,
        || -> Result<Vec<u8>, hypercodec_trellis::TrellisError> {
            use rayon::prelude::*;
            let mut bits = vec![0u8; rows * rb];
            if cols == 0 {
                return Ok(bits);
            }
            bits.par_chunks_mut(rb)
                .zip(x.par_chunks(cols))
                .try_for_each_init(
                    || hypercodec_trellis::Encoder::new(&p),
                    |enc, (b, row)| {
                        let enc = enc.as_mut().map_err(|e| e.clone())?;
                        for r in hypercodec_trellis::row_sequences(cols, seq) {
                            let kk = k as usize;
                            enc.encode_into(
                                &row[r.clone()],
                                &mut b[r.start * kk / 8..(r.end * kk).div_ceil(8)],
                            )?;
                        }
                        Ok(())
                    },
                )?;
            Ok(bits)
        },
    );
    let bits = bits.map_err(|e| InvalidInputError::new_err(e.to_string()))?;
    Ok(PyBytes::new(py, &bits))
}

/// Decodes `rows` rows of `cols` trellis values from `bits` (as [`trellis_encode`] wrote them).
#[pyfunction]
#[pyo3(signature = (bits, rows, cols, l, k, seq, scale=None, v=1))]
#[allow(clippy::too_many_arguments)]
fn trellis_decode<'py>(
    py: Python<'py>,
    bits: &[u8],
    rows: usize,
    cols: usize,
    l: u8,
    k: u8,
    seq: usize,
    scale: Option<f32>,
    v: u8,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let p = trellis_params(l, k, scale, v)?;
    let rb = (cols * k as usize).div_ceil(8);
    if bits.len() != rows * rb || seq == 0 {
        return Err(InvalidInputError::new_err(format!(
            "{} bytes for {rows} rows of {rb} bytes (sequences of {seq})",
            bits.len()
        )));
    }
    let mut out = vec![0f32; rows * cols];
    if cols > 0 {
        for (b, o) in bits.chunks_exact(rb).zip(out.chunks_exact_mut(cols)) {
            hypercodec_trellis::decode_row(b, seq, &p, o)
                .map_err(|e| InvalidInputError::new_err(e.to_string()))?;
        }
    }
    let arr = PyArray1::from_vec(py, out);
    arr.reshape(vec![rows, cols])
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // SAFETY: the handler only stores to an atomic (async-signal-safe, as a forked child of a
    // threaded process requires); registering it has no other effect.
    #[cfg(unix)]
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_in_child));
    }
    m.add(
        "KV_QUANTIZERS",
        hypercodec_lattice::kv::KvQuantizer::NAMES.to_vec(),
    )?;
    m.add("GEMM_MIN_ROWS", hypercodec_kernels_cuda::GEMM_MIN_ROWS)?;
    m.add("HypercodecError", py.get_type::<HypercodecError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("HypercodecIOError", py.get_type::<HypercodecIOError>())?;
    m.add("CancelledError", py.get_type::<CancelledError>())?;
    m.add("CudaError", py.get_type::<CudaError>())?;
    m.add_class::<cuda::CudaKernels>()?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(compress_paths, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_json, m)?)?;
    m.add_function(wrap_pyfunction!(check_spec, m)?)?;
    m.add_function(wrap_pyfunction!(write_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(init_threads, m)?)?;
    m.add_function(wrap_pyfunction!(simd_level, m)?)?;
    m.add_function(wrap_pyfunction!(lattice_alpha, m)?)?;
    m.add_function(wrap_pyfunction!(rht_signs, m)?)?;
    m.add_function(wrap_pyfunction!(lattice_predict, m)?)?;
    m.add_function(wrap_pyfunction!(trellis_code, m)?)?;
    m.add_function(wrap_pyfunction!(trellis_encode, m)?)?;
    m.add_function(wrap_pyfunction!(trellis_decode, m)?)?;
    m.add_class::<Archive>()?;
    m.add_class::<Linear>()?;
    m.add_class::<KvCodec>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
