//! The runtime benchmark (`hypercodec benchmark --runtime`): for each shape, encoding and
//! batch, the compressed operator against a dense f32 GEMM of the *decompressed* weight with
//! the same GEMM library ([`gemm`], on the same thread pool), in the same run; medians of
//! repeated calls. A ratio, not a time, is the figure: the machines are shared and noisy.

use crate::{hwz, CompressedLinear, LoadOptions, Result};
use hwz::{Coding, EncodeOptions, Encoding, FloatDtype, Group, Lattice};
use hypercodec_lattice::calibration;
use std::time::Instant;

/// What to measure. By default, the shapes (4096×4096, 11008×4096, 4096×11008,
/// 576×1536) at batches 1, 8 and 64, every encoding of [`default_encodings`].
#[derive(Debug, Clone)]
pub struct RuntimeBenchOptions {
    /// `(rows, cols)` of each weight.
    pub shapes: Vec<(usize, usize)>,
    /// Batch sizes.
    pub batches: Vec<usize>,
    /// Encodings by label.
    pub encodings: Vec<BenchEncoding>,
    /// Minimum measured time per figure, in seconds (at least 3 calls, at most 200). By
    /// default, 0.3.
    pub min_seconds: f64,
}

impl Default for RuntimeBenchOptions {
    fn default() -> Self {
        RuntimeBenchOptions {
            shapes: vec![(4096, 4096), (11008, 4096), (4096, 11008), (576, 1536)],
            batches: vec![1, 8, 64],
            encodings: default_encodings(),
            min_seconds: 0.3,
        }
    }
}

/// One encoding of the benchmark.
#[derive(Debug, Clone)]
pub struct BenchEncoding {
    /// Its label in the table.
    pub label: String,
    /// The encoding (lattice α is set for the shape's columns at run time).
    pub encoding: Encoding,
    /// How the operator is loaded.
    pub load: LoadOptions,
}

/// INT4 g128, INT8 per row, E8 fixed-rate 4 bits, the trellis at 4 bits (L = 12), E8 + rANS
/// at 4 bits per value (resident), and the same converted to fixed-rate 6 bits at load.
pub fn default_encodings() -> Vec<BenchEncoding> {
    let affine = |bits, group, symmetric| Encoding::Affine {
        bits,
        group,
        symmetric,
        scale_dtype: FloatDtype::F16,
    };
    let e8 = |alpha, coding| Encoding::Lattice {
        lattice: Lattice::E8,
        alpha,
        tile: 0,
        seed: 0,
        scale_dtype: FloatDtype::Bf16,
        coding,
    };
    let fixed4 = calibration::fixed_alpha(Lattice::E8, 4).map_or(4.0, |(a, _)| a);
    let rate4 = calibration::alpha_for_bps(Lattice::E8, 4.0);
    let b = |label: &str, encoding, load| BenchEncoding {
        label: label.into(),
        encoding,
        load,
    };
    vec![
        b(
            "int4-g128",
            affine(4, Group::Size(128), false),
            LoadOptions::default(),
        ),
        // (3 bits: the planner's BUDGET candidates hold it; its codes straddle bytes and are
        // dotted in 3-byte words of 8.)
        b(
            "int3-g128",
            affine(3, Group::Size(128), false),
            LoadOptions::default(),
        ),
        b(
            "int8-row",
            affine(8, Group::Row, true),
            LoadOptions::default(),
        ),
        b(
            "e8-fixed4",
            e8(fixed4, Coding::Fixed { bits: 4 }),
            LoadOptions::default(),
        ),
        // The trellis at L = 12 (its decode is the same work at any L; its encode, 16× less
        // than at the default L = 16, keeps the benchmark's setup short).
        b(
            "tcq4-l12",
            Encoding::trellis(12, 4, 0, 0),
            LoadOptions::default(),
        ),
        b(
            "e8-rans@4",
            e8(rate4, Coding::RANS_DEFAULT),
            LoadOptions::default(),
        ),
        // The GPU shape's prefix codes at the same lattice scale (about 0.2 bits a value more
        // than rANS there), decoded on the CPU.
        b(
            "e8-prefix",
            e8(rate4, Coding::PREFIX_GPU),
            LoadOptions::default(),
        ),
        b(
            "e8-rans@4→fixed6",
            e8(rate4, Coding::RANS_DEFAULT),
            LoadOptions {
                fixed_bits: Some(6),
            },
        ),
    ]
}

/// One measured figure.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RuntimeRow {
    /// `[rows, cols]`.
    pub shape: [usize; 2],
    /// Batch size.
    pub batch: usize,
    /// The encoding's label.
    pub encoding: String,
    /// The operator's route at this batch ([`CompressedLinear::route`]).
    pub path: String,
    /// Median µs per call of the compressed operator.
    pub ours_us: f64,
    /// Median µs per call of dense f32 GEMM/GEMV on the decompressed weight.
    pub dense_us: f64,
    /// `dense_us / ours_us`.
    pub speedup: f64,
    /// Bytes the operator holds.
    pub held_bytes: u64,
    /// Stored bytes of the tensor (all streams).
    pub stored_bytes: u64,
    /// Stored bytes per microsecond of the operator ÷ 1000: GB/s of weight bytes read.
    pub weight_gbps: f64,
    /// SNR (dB) of the stored weight against the original.
    pub snr_db: f64,
    /// SNR of a load-time conversion against the stored weight, when one was made.
    pub conversion_snr_db: Option<f64>,
}

/// Seeded standard-normal values (Box–Muller over a xorshift).
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (next(), next());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect()
}

/// Median µs of `f` over enough calls to fill `min_seconds` (3..=200 calls), after one warm-up.
pub fn time_us(min_seconds: f64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || (start.elapsed().as_secs_f64() < min_seconds && times.len() < 200) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// `y = x·Wᵀ` (`x` batch × cols, `w` rows × cols, `y` batch × rows) with a dense f32 weight, by
/// the GEMM library the operator uses for tiles, on the whole pool: the baseline.
///
/// # Errors
/// [`RuntimeError::Length`](crate::RuntimeError::Length) or
/// [`RuntimeError::Overflow`](crate::RuntimeError::Overflow) when a
/// buffer's length is not what the shapes give.
pub fn dense(
    w: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    batch: usize,
    y: &mut [f32],
) -> Result<()> {
    use crate::linear::check_rows;
    check_rows("w", rows, cols, w.len())?;
    check_rows("x", batch, cols, x.len())?;
    check_rows("y", batch, rows, y.len())?;
    let threads = rayon::current_num_threads();
    // SAFETY: y is batch × rows, x batch × cols, w rows × cols (lengths checked above), all
    // row-major; the strides below address exactly those elements.
    unsafe {
        gemm::gemm(
            batch,
            rows,
            cols,
            y.as_mut_ptr(),
            1,
            rows as isize,
            false,
            x.as_ptr(),
            1,
            cols as isize,
            w.as_ptr(),
            cols as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            if threads > 1 {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            },
        );
    }
    Ok(())
}

/// Runs the benchmark, calling `row` on each figure as it is measured.
pub fn run(
    options: &RuntimeBenchOptions,
    mut row: impl FnMut(&RuntimeRow),
) -> Result<Vec<RuntimeRow>> {
    let mut rows_out = Vec::new();
    for (si, &(rows, cols)) in options.shapes.iter().enumerate() {
        let w = gaussian(rows * cols, 1 + si as u64);
        let shape = [rows as u64, cols as u64];
        for be in &options.encodings {
            // Tiles for the row length, and GPU-shaped chunks (prefix codes) for the matrix.
            let encoding = be.encoding.for_matrix(rows as u64, cols as u64, 4096);
            let t = hwz::encode(&be.label, &w, &shape, &encoding, EncodeOptions::default())?;
            let op = CompressedLinear::from_encoded(&be.label, &t, &shape, None, &be.load)?;
            // The decompressed weight the dense baseline multiplies.
            let view = {
                let refs: Vec<(&str, &[u8])> =
                    t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
                hwz::TensorView::new(&be.label, &t.encoding, &shape, &refs)?.into_owned()
            };
            let mut wd = vec![0f32; rows * cols];
            view.decode_rows_into(0..rows as u64, &mut wd)?;
            let (signal, noise) = w.iter().zip(&wd).fold((0f64, 0f64), |(s, n), (&a, &b)| {
                (s + (a as f64).powi(2), n + (a as f64 - b as f64).powi(2))
            });
            let snr_db = 10.0 * (signal / noise.max(f64::MIN_POSITIVE)).log10();
            let stored = t.payload_bytes();
            for &batch in &options.batches {
                let x = gaussian(batch * cols, 99 + batch as u64);
                let mut y = vec![0f32; batch * rows];
                let ours = time_us(options.min_seconds, || op.forward(&x, batch, &mut y))?;
                let mut yd = vec![0f32; batch * rows];
                let dense_us = time_us(options.min_seconds, || {
                    dense(&wd, rows, cols, &x, batch, &mut yd)
                })?;
                let r = RuntimeRow {
                    shape: [rows, cols],
                    batch,
                    encoding: be.label.clone(),
                    path: op.route(batch),
                    ours_us: ours,
                    dense_us,
                    speedup: dense_us / ours,
                    held_bytes: op.held_bytes(),
                    stored_bytes: stored,
                    weight_gbps: stored as f64 / ours / 1e3,
                    snr_db,
                    conversion_snr_db: op.conversion_snr_db(),
                };
                row(&r);
                rows_out.push(r);
            }
        }
    }
    Ok(rows_out)
}
