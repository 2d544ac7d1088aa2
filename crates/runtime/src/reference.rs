//! The reference path every fast path is tested against: decode `W` to f32, multiply plainly
//! (in f64), add the bias. Obviously right, and slow.

use crate::linear::{check_rows, rows_len};
use crate::{hwz, Result};
use hwz::TensorView;

/// `y = x·Wᵀ (+ b)` with `W` decoded whole: `x` is `batch × cols`, the result `batch × rows`.
pub fn linear(
    view: &TensorView<'_>,
    x: &[f32],
    batch: usize,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>> {
    let (rows, cols) = crate::linear::operator_shape(view);
    check_rows("x", batch, cols, x.len())?;
    let y_len = rows_len("y", batch, rows)?;
    if let Some(b) = bias {
        check_rows("bias", 1, rows, b.len())?;
    }
    let mut w = vec![0f32; rows * cols];
    if cols > 0 {
        view.decode_rows_into(0..rows as u64, &mut w)?;
    }
    let mut y = vec![0f32; y_len];
    for b in 0..batch {
        let xb = &x[b * cols..(b + 1) * cols];
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let s: f64 = wr.iter().zip(xb).map(|(&a, &c)| a as f64 * c as f64).sum();
            y[b * rows + r] = s as f32 + bias.map_or(0.0, |v| v[r]);
        }
    }
    Ok(y)
}

/// `‖W_r‖·‖x_b‖` per output: the scale of an f32 dot product's rounding error, whichever
/// basis it is summed in (a lattice row is summed against `RHT(x)`, where a product that is
/// exactly zero in the weight's basis is a sum of rounded nonzero terms).
pub fn norm_products(view: &TensorView<'_>, x: &[f32], batch: usize) -> Result<Vec<f32>> {
    let (rows, cols) = (view.rows() as usize, view.cols() as usize);
    check_rows("x", batch, cols, x.len())?;
    let out_len = rows_len("outputs", batch, rows)?;
    let mut w = vec![0f32; rows * cols];
    view.decode_rows_into(0..rows as u64, &mut w)?;
    let norm = |v: &[f32]| v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
    let wn: Vec<f64> = w.chunks(cols.max(1)).map(norm).collect();
    let mut out = vec![0f32; out_len];
    for b in 0..batch {
        let xn = norm(&x[b * cols..(b + 1) * cols]);
        for r in 0..rows {
            out[b * rows + r] = (wn.get(r).copied().unwrap_or(0.0) * xn) as f32;
        }
    }
    Ok(out)
}

/// SNR (dB) of `b`'s decoded values against `a`'s (same shape), read in row blocks;
/// ∞ when they are equal.
pub fn snr_db(a: &TensorView<'_>, b: &TensorView<'_>) -> Result<f64> {
    let (rows, cols) = (a.rows(), a.cols() as usize);
    let step = ((1usize << 16) / cols.max(1)).max(1) as u64;
    let (mut signal, mut noise) = (0f64, 0f64);
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let mut r = 0;
    while r < rows {
        let e = (r + step).min(rows);
        let n = (e - r) as usize * cols;
        wa.resize(n, 0.0);
        wb.resize(n, 0.0);
        a.decode_rows_into(r..e, &mut wa)?;
        b.decode_rows_into(r..e, &mut wb)?;
        for (x, y) in wa.iter().zip(&wb) {
            signal += (*x as f64).powi(2);
            noise += (*x as f64 - *y as f64).powi(2);
        }
        r = e;
    }
    Ok(if noise == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (signal / noise).log10()
    })
}
