//! hypercodec-lattice: the randomized Hadamard transform (RHT) and nearest-point quantizers of
//! the Z1, A2, D4 and E8 lattices, with lossless bit-stripping and the α ↔ SNR ↔ rate
//! calibration.
//!
//! Key design decision: quantizers work on *integer representations* of lattice points (E8 as
//! 2·E8: all-even or all-odd, sum ≡ 0 mod 4), so the bits a lattice pins are stripped before
//! entropy coding and every symbol is a plain unsigned integer; and the calibration table is
//! generated offline (`cargo run --release -p hypercodec-lattice --example calibrate`) and
//! committed, so nothing calibrates at run time.
//!
//! The tensor pipeline ([`quantize_rows`] / [`dequantize_rows`]): per row, RHT in tiles,
//! normalize by the row's RMS `σ` (rounded by the caller to its storage type), scale by α,
//! quantize words of `dim` values (a row's tail is zero-padded to whole words), emit symbols.
//! Reconstruction: `x̂ = RHT⁻¹(σ · Q / α)`.
//!
//! ```
//! use hypercodec_lattice::{dequantize_rows, quantize_rows, Lattice, LatticeParams};
//! let w: Vec<f32> = (0..2 * 256).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0).collect();
//! let p = LatticeParams { lattice: Lattice::E8, alpha: 4.0, tile: 256, seed: 1, fixed_bits: None, dither: false };
//! let q = quantize_rows(&w, 2, 256, &p, |s| s)?;
//! let back = dequantize_rows(&q.symbols, &q.scales, 2, 256, &p)?;
//! let snr = 10.0 * (w.iter().map(|x| x * x).sum::<f32>()
//!     / w.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum::<f32>()).log10();
//! assert!(snr > 20.0);
//! # Ok::<(), hypercodec_lattice::LatticeError>(())
//! ```
#![deny(missing_docs)]

pub mod calibration;
#[cfg(test)]
mod dither_tests;
pub mod kv;
mod quant;
pub mod rht;

pub use quant::{Lattice, MAX_COORD};
pub use rht::{tile_for, Rht, MAX_TILE, MIN_TILE};

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LatticeError {
    /// The RHT tile is not a power of two in 1..=4096 dividing the row length.
    #[error(
        "RHT tile {tile} must be a power of two up to 4096 that divides the row length {cols}"
    )]
    InvalidTile {
        /// The tile.
        tile: usize,
        /// The row length.
        cols: usize,
    },
    /// A lattice name is unknown.
    #[error("unknown lattice `{name}`; use z1, a2, d4 or e8")]
    UnknownLattice {
        /// The name given.
        name: String,
    },
    /// A KV quantizer name is unknown ([`kv::KvQuantizer::named`]).
    #[error("unknown KV quantizer `{name}`; use e8, d4, z1 or trellis")]
    UnknownKvQuantizer {
        /// The name given.
        name: String,
    },
    /// α is not a finite positive number.
    #[error("scale alpha must be finite and positive")]
    InvalidAlpha,
    /// A value is NaN or infinite.
    #[error("value at index {index} is not finite")]
    NonFinite {
        /// Position of the first offending value.
        index: usize,
    },
    /// The fixed-rate form asked for does not exist.
    #[error("lattice {lattice} has no fixed-rate form with {bits} bits (use z1, d4 or e8 with 2..=8 bits)")]
    InvalidFixed {
        /// The lattice.
        lattice: &'static str,
        /// The bits asked for.
        bits: u8,
    },
    /// The trellis quantizer refused its parameters or input.
    #[error("trellis: {0}")]
    Trellis(String),
    /// A vector of finite values near f32's largest that overflows in the rotation.
    #[error(
        "vector {vector}: its values (near f32's largest) overflow the rotation; scale them down"
    )]
    RotationOverflow {
        /// Which vector (of the values given).
        vector: usize,
    },
    /// A size outside the range this code takes.
    #[error("{what} must be {min} to {max}, not {actual}")]
    OutOfRange {
        /// What was given.
        what: &'static str,
        /// The least it may be.
        min: usize,
        /// The most it may be.
        max: usize,
        /// What it was.
        actual: usize,
    },
    /// Sizes do not match the shape.
    #[error("{what}: expected {expected}, got {actual}")]
    Length {
        /// What was counted.
        what: &'static str,
        /// Expected count.
        expected: usize,
        /// Actual count.
        actual: usize,
    },
}

/// Result alias of this crate.
pub type Result<T, E = LatticeError> = std::result::Result<T, E>;

/// Parameters of the lattice pipeline for one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatticeParams {
    /// The lattice. By default, E8.
    pub lattice: Lattice,
    /// Scale applied to unit-RMS rows before quantization. By default, 8.0 (about 4.1 bps on E8).
    pub alpha: f32,
    /// RHT tile (power of two dividing the row length; 1 = signs only). By default, 256.
    pub tile: usize,
    /// RHT seed. By default, 0.
    pub seed: u64,
    /// `None`: unbounded symbols for entropy coding; `Some(b)`: fixed-rate symbols of `b` bits
    /// (2..=8; points outside the range are replaced by the nearest representable one).
    /// By default, `None`.
    pub fixed_bits: Option<u8>,
    /// Subtractive dither: a pseudo-random vector `d`, uniform over the lattice's Voronoi cell
    /// and regenerated from the seed by the decoder, is added before quantization and
    /// subtracted after: the error becomes independent of the input (uniform over the cell),
    /// at a small cost in rate. By default, `false`.
    pub dither: bool,
}

impl Default for LatticeParams {
    fn default() -> Self {
        LatticeParams {
            lattice: Lattice::E8,
            alpha: 8.0,
            tile: 256,
            seed: 0,
            fixed_bits: None,
            dither: false,
        }
    }
}

/// The dither of word `word` of row `row`: `d = v − Q(v)` for `v` uniform in `[−4, 4)^dim`
/// from the seed, which is uniform over the Voronoi cell because the lattice tiles space.
/// Coordinate `i` of `v`: `mix64(seed ^ 0xD17E_D17E_D17E_D17E + (row·2³² + word·dim + i + 1)·0x9E3779B97F4A7C15)`,
/// top 24 bits scaled to `[−4, 4)`.
pub fn dither_word(l: Lattice, seed: u64, row: usize, word: usize, d: &mut [f32]) {
    let n = l.dim();
    let mut v = [0f32; 8];
    for (i, x) in v[..n].iter_mut().enumerate() {
        let key = ((row as u64) << 32).wrapping_add((word * n + i + 1) as u64);
        let z = rht::mix64(
            (seed ^ 0xD17E_D17E_D17E_D17E).wrapping_add(key.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        );
        *x = (z >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0;
    }
    let mut s = [0u32; 8];
    let mut p = [0f32; 8];
    l.encode_word(&v[..n], &mut s[..n]);
    l.decode_word(&s[..n], &mut p[..n]);
    for i in 0..n {
        d[i] = v[i] - p[i];
    }
}

/// Symbols per row: the row length rounded up to whole words.
pub fn symbols_per_row(lattice: Lattice, cols: usize) -> usize {
    cols.div_ceil(lattice.dim()) * lattice.dim()
}

/// A quantized tensor: symbols row by row, and one scale per row.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantized {
    /// `rows × symbols_per_row` symbols.
    pub symbols: Vec<u32>,
    /// Row scales σ as used (after the caller's rounding).
    pub scales: Vec<f32>,
}

/// Checks `params` for rows of `cols` values without allocating anything.
fn check_params(params: &LatticeParams, cols: usize) -> Result<()> {
    let tile = params.tile;
    if tile == 0
        || !tile.is_power_of_two()
        || tile > MAX_TILE
        || (cols > 0 && !cols.is_multiple_of(tile))
    {
        return Err(LatticeError::InvalidTile { tile, cols });
    }
    if !(params.alpha.is_finite() && params.alpha > 0.0) {
        return Err(LatticeError::InvalidAlpha);
    }
    if let Some(b) = params.fixed_bits {
        if !(2..=8).contains(&b) || !params.lattice.has_fixed() {
            return Err(LatticeError::InvalidFixed {
                lattice: params.lattice.name(),
                bits: b,
            });
        }
    }
    Ok(())
}

/// [`check_params`], then the transform of rows of `cols` values (its signs take `cols`
/// words: call it only with at least one row, so the allocation is backed by the values).
fn check(params: &LatticeParams, cols: usize) -> Result<Rht> {
    check_params(params, cols)?;
    Rht::new(cols, params.tile, params.seed)
}

/// Quantizes a `rows × cols` tensor. `round_scale` maps each row's RMS to the value that will
/// be stored (e.g. rounded to bf16); quantization uses that value, so decoding is consistent.
pub fn quantize_rows(
    values: &[f32],
    rows: usize,
    cols: usize,
    params: &LatticeParams,
    round_scale: impl Fn(f32) -> f32,
) -> Result<Quantized> {
    if rows.checked_mul(cols) != Some(values.len()) {
        return Err(LatticeError::Length {
            what: "values",
            expected: rows.saturating_mul(cols),
            actual: values.len(),
        });
    }
    if rows == 0 {
        // No values: nothing to allocate, whatever the row length claims.
        check_params(params, cols)?;
        return Ok(Quantized {
            symbols: Vec::new(),
            scales: Vec::new(),
        });
    }
    let mut symbols = vec![0u32; rows * symbols_per_row(params.lattice, cols)];
    let mut scales = vec![0f32; rows];
    quantize_rows_into(
        values,
        rows,
        cols,
        params,
        round_scale,
        0,
        QuantizedMut {
            symbols: &mut symbols,
            scales: &mut scales,
        },
    )?;
    Ok(Quantized { symbols, scales })
}

/// Where [`quantize_rows_into`] writes: `rows × symbols_per_row` symbols and `rows` scales.
#[derive(Debug)]
pub struct QuantizedMut<'a> {
    /// The symbols, row by row.
    pub symbols: &'a mut [u32],
    /// The row scales.
    pub scales: &'a mut [f32],
}

/// [`quantize_rows`] into caller-owned buffers (no allocation beyond one row), for rows that
/// start at row `first_row` of a larger tensor (the dither, when on, is keyed on the global
/// row index, so a tensor quantized in parts equals the tensor quantized at once).
pub fn quantize_rows_into(
    values: &[f32],
    rows: usize,
    cols: usize,
    params: &LatticeParams,
    round_scale: impl Fn(f32) -> f32,
    first_row: usize,
    out: QuantizedMut<'_>,
) -> Result<()> {
    quantize_rows_impl(
        values,
        rows,
        cols,
        params,
        round_scale,
        first_row,
        out,
        None,
    )
}

/// [`quantize_rows_into`] with error feedback: each row's words are rounded left to right
/// and their errors fed into the words not yet rounded ([`hypercodec_scalar::ldlq`]), with the
/// factor `f` of the layer's input statistics *in the rotated coordinates* ([`rotate_hessian`]),
/// and each row's scale is then refitted to the least output error of its points
/// ([`hypercodec_scalar::ldlq::Ldlq::fit`]). The symbols are the same format; only which points
/// are chosen, and the scales, change. No dither.
#[allow(clippy::too_many_arguments)]
pub fn quantize_rows_ldlq_into(
    values: &[f32],
    rows: usize,
    cols: usize,
    params: &LatticeParams,
    round_scale: impl Fn(f32) -> f32,
    first_row: usize,
    out: QuantizedMut<'_>,
    f: &hypercodec_scalar::ldlq::Ldlq,
) -> Result<()> {
    if f.n() != cols || params.dither {
        return Err(LatticeError::Length {
            what: "input statistics (columns; no dither)",
            expected: cols,
            actual: f.n(),
        });
    }
    quantize_rows_impl(
        values,
        rows,
        cols,
        params,
        round_scale,
        first_row,
        out,
        Some(f),
    )
}

/// `R·H·Rᵀ` for the input statistics `h` (`cols × cols`) of a layer whose rows are rotated
/// by the RHT of `params` (`W·x = (W·Rᵀ)·(R·x)`): the statistics of the rotated inputs.
pub fn rotate_hessian(h: &[f32], cols: usize, params: &LatticeParams) -> Result<Vec<f32>> {
    // (Saturated: a wrapped `cols²` matched an empty `h`.)
    let expected = cols.saturating_mul(cols);
    if h.len() != expected {
        return Err(LatticeError::Length {
            what: "input statistics",
            expected,
            actual: h.len(),
        });
    }
    let rht = check(params, cols)?;
    let mut m = h.to_vec();
    m.chunks_exact_mut(cols.max(1)).for_each(|r| rht.forward(r));
    let mut t = vec![0f32; cols * cols];
    for i in 0..cols {
        for j in 0..cols {
            t[j * cols + i] = m[i * cols + j];
        }
    }
    t.chunks_exact_mut(cols.max(1)).for_each(|r| rht.forward(r));
    Ok(t)
}

#[allow(clippy::too_many_arguments)]
fn quantize_rows_impl(
    values: &[f32],
    rows: usize,
    cols: usize,
    params: &LatticeParams,
    round_scale: impl Fn(f32) -> f32,
    first_row: usize,
    out: QuantizedMut<'_>,
    ldlq: Option<&hypercodec_scalar::ldlq::Ldlq>,
) -> Result<()> {
    let QuantizedMut { symbols, scales } = out;
    if rows.checked_mul(cols) != Some(values.len()) {
        return Err(LatticeError::Length {
            what: "values",
            expected: rows.saturating_mul(cols),
            actual: values.len(),
        });
    }
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(LatticeError::NonFinite { index });
    }
    if rows == 0 {
        return check_params(params, cols);
    }
    let rht = check(params, cols)?;
    let l = params.lattice;
    let spr = symbols_per_row(l, cols);
    for (what, expected, actual) in [
        ("symbols", rows * spr, symbols.len()),
        ("scales", rows, scales.len()),
    ] {
        if expected != actual {
            return Err(LatticeError::Length {
                what,
                expected,
                actual,
            });
        }
    }
    let d = l.dim();
    // A row rotated, its scale found, scaled to the lattice (and dithered) in `buf` (`spr`
    // values, zero past `cols`); returns the scale.
    let prepare = |r: usize, row: &[f32], buf: &mut [f32]| -> f32 {
        buf[..cols].copy_from_slice(row);
        buf[cols..].iter_mut().for_each(|v| *v = 0.0);
        rht.forward(&mut buf[..cols]);
        let ms = buf[..cols]
            .iter()
            .map(|&v| v as f64 * v as f64)
            .sum::<f64>()
            / cols.max(1) as f64;
        let sigma = round_scale(ms.sqrt() as f32);
        if sigma > 0.0 && sigma.is_finite() {
            let k = params.alpha / sigma;
            buf.iter_mut().for_each(|v| *v *= k);
        } else {
            buf.iter_mut().for_each(|v| *v = 0.0);
        }
        if params.dither {
            let mut dv = vec![0f32; d];
            for (k, w) in buf.chunks_exact_mut(d).enumerate() {
                dither_word(l, params.seed, first_row + r, k, &mut dv);
                w.iter_mut().zip(&dv).for_each(|(v, e)| *v += e);
            }
        }
        sigma
    };
    let encode = |w: &[f32], s: &mut [u32]| match params.fixed_bits {
        None => l.encode_word(w, s),
        Some(b) => l.encode_word_fixed(w, b, s),
    };
    let Some(f) = ldlq else {
        let mut buf = vec![0f32; spr];
        for (r, row) in values.chunks_exact(cols.max(1)).take(rows).enumerate() {
            scales[r] = prepare(r, row, &mut buf);
            let out = &mut symbols[r * spr..(r + 1) * spr];
            for (w, s) in buf.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
                encode(w, s);
            }
        }
        return Ok(());
    };
    // With feedback, rows go through in blocks that share each sweep of the factor
    // (`Ldlq::rows_ranges`), word by word: round, write the point back, feed its error forward.
    let mut buf = vec![0f32; spr];
    let mut block = Vec::with_capacity(LDLQ_BLOCK * cols);
    let mut target = Vec::with_capacity(LDLQ_BLOCK * cols);
    for r0 in (0..rows).step_by(LDLQ_BLOCK) {
        let k = LDLQ_BLOCK.min(rows - r0);
        block.clear();
        for r in r0..r0 + k {
            scales[r] = prepare(r, &values[r * cols..(r + 1) * cols], &mut buf);
            block.extend_from_slice(&buf[..cols]);
        }
        target.clear();
        target.extend_from_slice(&block);
        let out = &mut symbols[r0 * spr..(r0 + k) * spr];
        let (mut word, mut point) = ([0f32; 8], [0f32; 8]);
        let atoms = (0..cols).step_by(d).map(|j0| j0..(j0 + d).min(cols));
        f.rows_ranges(&mut block, k, atoms, |i, j0, upcoming| {
            let a = d.min(upcoming.len());
            word[..a].copy_from_slice(&upcoming[..a]);
            word[a..d].iter_mut().for_each(|v| *v = 0.0);
            let s = &mut out[i * spr + j0..i * spr + j0 + d];
            encode(&word[..d], s);
            match params.fixed_bits {
                None => l.decode_word(s, &mut point[..d]),
                Some(b) => l.decode_word_fixed(s, b, &mut point[..d]),
            }
            upcoming[..a].copy_from_slice(&point[..a]);
        });
        // The stored scale that gives the chosen points the least output error under the
        // statistics (not the row's RMS; `round_scale` may pin it to a step).
        for (i, fit) in f.fit_rows(&target, &block, k).into_iter().enumerate() {
            let sigma = scales[r0 + i];
            if let Some(fit) = fit {
                let refit = round_scale((sigma as f64 * fit) as f32);
                if fit > 0.0 && refit.is_finite() && refit > 0.0 {
                    scales[r0 + i] = refit;
                }
            }
        }
    }
    Ok(())
}

/// Rows rounded together with error feedback: each sweep of the factor serves this many.
const LDLQ_BLOCK: usize = 16;

/// Reconstructs a `rows × cols` tensor from symbols and row scales.
pub fn dequantize_rows(
    symbols: &[u32],
    scales: &[f32],
    rows: usize,
    cols: usize,
    params: &LatticeParams,
) -> Result<Vec<f32>> {
    let mut out = vec![
        0f32;
        rows.checked_mul(cols).ok_or(LatticeError::Length {
            what: "values",
            expected: usize::MAX,
            actual: 0
        })?
    ];
    dequantize_rows_into(symbols, scales, rows, cols, params, &mut out)?;
    Ok(out)
}

/// Reconstructs into `out` (`rows × cols` values).
pub fn dequantize_rows_into(
    symbols: &[u32],
    scales: &[f32],
    rows: usize,
    cols: usize,
    params: &LatticeParams,
    out: &mut [f32],
) -> Result<()> {
    check_params(params, cols)?;
    let l = params.lattice;
    let spr = symbols_per_row(l, cols);
    for (what, expected, actual) in [
        ("symbols", rows.saturating_mul(spr), symbols.len()),
        ("scales", rows, scales.len()),
        ("values", rows.saturating_mul(cols), out.len()),
    ] {
        if expected != actual {
            return Err(LatticeError::Length {
                what,
                expected,
                actual,
            });
        }
    }
    if rows == 0 {
        return Ok(());
    }
    // At least one row of `symbols` backs the transform's and the buffer's allocations.
    let rht = Rht::new(cols, params.tile, params.seed)?;
    let mut buf = vec![0f32; spr];
    for r in 0..rows {
        for (w, s) in buf
            .chunks_exact_mut(l.dim())
            .zip(symbols[r * spr..(r + 1) * spr].chunks_exact(l.dim()))
        {
            match params.fixed_bits {
                None => l.decode_word(s, w),
                Some(b) => l.decode_word_fixed(s, b, w),
            }
        }
        if params.dither {
            let mut d = vec![0f32; l.dim()];
            for (k, w) in buf.chunks_exact_mut(l.dim()).enumerate() {
                dither_word(l, params.seed, r, k, &mut d);
                w.iter_mut().zip(&d).for_each(|(v, e)| *v -= e);
            }
        }
        let k = scales[r] / params.alpha;
        let row = &mut out[r * cols..(r + 1) * cols];
        for (o, v) in row.iter_mut().zip(&buf) {
            *o = v * k;
        }
        rht.inverse(row);
    }
    Ok(())
}
