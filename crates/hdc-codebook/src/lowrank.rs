//! Low-rank candidate: `W ≈ U·Vᵀ` from subspace (power) iteration, factors stored as int8 with
//! one f32 scale per factor column.

use crate::rng::Rng;
use crate::{par, HdcError, Result};

/// Rank limit.
pub const MAX_RANK: usize = 1024;

/// The factors of a rank-`rank` approximation, quantized.
#[derive(Debug, Clone, PartialEq)]
pub struct LowRank {
    /// `rows × rank` int8 codes, row-major.
    pub u: Vec<i8>,
    /// `rank` scales of U's columns.
    pub u_scales: Vec<f32>,
    /// `cols × rank` int8 codes, row-major.
    pub v: Vec<i8>,
    /// `rank` scales of V's columns.
    pub v_scales: Vec<f32>,
}

fn orthonormalize(m: &mut [f32], n: usize, r: usize) {
    // Modified Gram–Schmidt on the r columns of an n × r row-major matrix, applied twice
    // ("twice is enough"); a column that is numerically inside the span of the previous ones
    // becomes zero instead of amplified round-off.
    let norm = |m: &[f32], k: usize| {
        (0..n)
            .map(|i| (m[i * r + k] as f64).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    for k in 0..r {
        let before = norm(m, k);
        for _ in 0..2 {
            for j in 0..k {
                let dot: f64 = (0..n)
                    .map(|i| m[i * r + k] as f64 * m[i * r + j] as f64)
                    .sum();
                for i in 0..n {
                    m[i * r + k] -= (dot as f32) * m[i * r + j];
                }
            }
        }
        let after = norm(m, k);
        let keep = after > 1e-5 * before && after > 0.0;
        for i in 0..n {
            m[i * r + k] = if keep {
                (m[i * r + k] as f64 / after) as f32
            } else {
                0.0
            };
        }
    }
}

/// `A (rows × cols) · V (cols × r)` → `rows × r`.
fn a_times(a: &[f32], rows: usize, cols: usize, v: &[f32], r: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * r];
    par::for_chunks(&mut out, r, |start, chunk| {
        for (i, o) in chunk.chunks_exact_mut(r).enumerate() {
            let row = &a[(start + i) * cols..(start + i + 1) * cols];
            for (x, vr) in row.iter().zip(v.chunks_exact(r)) {
                for (acc, &y) in o.iter_mut().zip(vr) {
                    *acc += x * y;
                }
            }
        }
    });
    out
}

/// `Aᵀ (cols × rows) · U (rows × r)` → `cols × r`.
fn at_times(a: &[f32], rows: usize, cols: usize, u: &[f32], r: usize) -> Vec<f32> {
    let mut out = vec![0f32; cols * r];
    par::for_chunks(&mut out, r, |start, chunk| {
        let width = chunk.len() / r;
        for i in 0..rows {
            let row = &a[i * cols + start..i * cols + start + width];
            let ur = &u[i * r..(i + 1) * r];
            for (x, o) in row.iter().zip(chunk.chunks_exact_mut(r)) {
                for (acc, &y) in o.iter_mut().zip(ur) {
                    *acc += x * y;
                }
            }
        }
    });
    out
}

fn quantize_columns(m: &[f32], r: usize) -> (Vec<i8>, Vec<f32>) {
    let mut scales = vec![0f32; r];
    for row in m.chunks_exact(r) {
        for (s, &x) in scales.iter_mut().zip(row) {
            *s = s.max(x.abs());
        }
    }
    for s in &mut scales {
        *s /= 127.0;
    }
    let codes = m
        .chunks_exact(r)
        .flat_map(|row| {
            row.iter().zip(&scales).map(|(&x, &s)| {
                if s > 0.0 {
                    (x / s).round().clamp(-127.0, 127.0) as i8
                } else {
                    0
                }
            })
        })
        .collect();
    (codes, scales)
}

/// Fits a rank-`rank` approximation of the row-major `rows × cols` matrix `a` with `iters`
/// rounds of subspace iteration, and quantizes the factors.
pub fn fit(
    a: &[f32],
    rows: usize,
    cols: usize,
    rank: usize,
    iters: usize,
    seed: u64,
) -> Result<LowRank> {
    if rank == 0 || rank > MAX_RANK || rank > rows.min(cols).max(1) {
        return Err(HdcError::InvalidParams {
            message: format!("rank {rank} must be in 1..=min({rows}, {cols}, {MAX_RANK})"),
        });
    }
    if a.len() != crate::numel(rows, cols)? {
        return Err(HdcError::Shape {
            message: format!("{} values for {rows}×{cols}", a.len()),
        });
    }
    if let Some(i) = a.iter().position(|v| !v.is_finite()) {
        return Err(HdcError::NonFinite { index: i as u64 });
    }
    // Magnitudes far from 1 (subnormal weights, or near f32's largest) are fitted scaled to a
    // largest value of 1, each factor's scales taking back the square root: the iteration's
    // norms and the balance's ratios would otherwise under- or overflow (infinite scales).
    let amax = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax > 0.0 && !(1e-18..=1e18).contains(&amax) {
        let unit: Vec<f32> = a
            .iter()
            .map(|&v| (f64::from(v) / f64::from(amax)) as f32)
            .collect();
        let mut lr = fit(&unit, rows, cols, rank, iters, seed)?;
        let root = f64::from(amax).sqrt();
        for s in lr.u_scales.iter_mut().chain(&mut lr.v_scales) {
            *s = (f64::from(*s) * root) as f32;
        }
        return Ok(lr);
    }
    let r = rank;
    let mut rng = Rng::new(seed ^ 0x4c52);
    let mut v: Vec<f32> = (0..cols * r).map(|_| rng.normal()).collect();
    orthonormalize(&mut v, cols, r);
    for _ in 0..iters {
        let mut u = a_times(a, rows, cols, &v, r);
        orthonormalize(&mut u, rows, r);
        v = at_times(a, rows, cols, &u, r);
        orthonormalize(&mut v, cols, r);
    }
    // U = A·V carries the singular values; V stays orthonormal.
    let u = a_times(a, rows, cols, &v, r);
    // Balance the two factors' ranges so both use int8 well.
    let (u, v) = balance(u, v, r);
    let (u, u_scales) = quantize_columns(&u, r);
    let (v, v_scales) = quantize_columns(&v, r);
    Ok(LowRank {
        u,
        u_scales,
        v,
        v_scales,
    })
}

fn balance(mut u: Vec<f32>, mut v: Vec<f32>, r: usize) -> (Vec<f32>, Vec<f32>) {
    for k in 0..r {
        let nu = u.chunks_exact(r).map(|x| x[k].abs()).fold(0f32, f32::max);
        let nv = v.chunks_exact(r).map(|x| x[k].abs()).fold(0f32, f32::max);
        if nu > 0.0 && nv > 0.0 {
            let g = (nv / nu).sqrt();
            u.chunks_exact_mut(r).for_each(|x| x[k] *= g);
            v.chunks_exact_mut(r).for_each(|x| x[k] /= g);
        }
    }
    (u, v)
}

/// Decodes `U·Vᵀ` into `out` (`rows × cols`).
pub fn decode_into(lr: &LowRank, rows: usize, cols: usize, out: &mut [f32]) -> Result<()> {
    let r = lr.u_scales.len();
    if r == 0
        || lr.v_scales.len() != r
        || lr.u.len() != crate::numel(rows, r)?
        || lr.v.len() != crate::numel(cols, r)?
        || out.len() != crate::numel(rows, cols)?
    {
        return Err(HdcError::Shape {
            message: format!("low-rank parts do not match {rows}×{cols}"),
        });
    }
    if lr
        .u_scales
        .iter()
        .chain(&lr.v_scales)
        .any(|s| !s.is_finite())
    {
        return Err(HdcError::Corrupt {
            message: "non-finite low-rank scale".into(),
        });
    }
    let us: Vec<f32> =
        lr.u.chunks_exact(r)
            .flat_map(|x| x.iter().zip(&lr.u_scales).map(|(&c, &s)| c as f32 * s))
            .collect();
    let vs: Vec<f32> =
        lr.v.chunks_exact(r)
            .flat_map(|x| x.iter().zip(&lr.v_scales).map(|(&c, &s)| c as f32 * s))
            .collect();
    par::for_chunks(out, cols, |start, chunk| {
        for (i, row) in chunk.chunks_exact_mut(cols).enumerate() {
            let ur = &us[(start + i) * r..(start + i + 1) * r];
            for (o, vr) in row.iter_mut().zip(vs.chunks_exact(r)) {
                *o = ur.iter().zip(vr).map(|(a, b)| a * b).sum();
            }
        }
    });
    Ok(())
}
