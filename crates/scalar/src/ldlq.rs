//! Error feedback for rounding with a layer's input statistics (LDLQ, the rule of GPTQ and
//! QuIP#): the columns of a weight row are rounded left to right, and each atom's rounding
//! error is fed forward into the columns not yet rounded, weighted by the layer's input second
//! moment `H = E[x·xᵀ]`, so that the *output* error `Δ·H·Δᵀ` — not the weight error — is what
//! rounding minimizes greedily.
//!
//! With `H + λI = (UᵀU)⁻¹`, `U` upper triangular, an atom of columns `a` rounded with error `Δ`
//! moves the later columns by `−(Δ·U_aa⁻¹)·U_a,rest` (one column at a time this is GPTQ's
//! update; a whole atom at once is the block LDL form vector quantizers need). `U` is found
//! without inverting `H`: the Cholesky factor of `H` with its rows and columns reversed is
//! `P·U⁻¹·P`, and one triangular inversion gives `U`.

use crate::{Result, ScalarError};

/// From this many rows, [`Ldlq::atoms_of_rows`] feeds their errors forward on the thread pool.
const PARALLEL_ROWS: usize = 32;

/// The feedback factor of one layer's statistics, shared by all of its rows.
#[derive(Debug, Clone)]
pub struct Ldlq {
    n: usize,
    /// `U`, upper triangular, row-major `n × n`.
    u: Vec<f32>,
}

impl Ldlq {
    /// The factor of `h` (`n × n`, row-major, symmetric positive semi-definite) damped by
    /// `damp` times its mean diagonal (0.01 is GPTQ's default); more damping is tried, up to a
    /// hundred times, when the matrix is not positive definite.
    pub fn new(h: &[f32], n: usize, damp: f64) -> Result<Self> {
        if h.len() != n.saturating_mul(n) || n == 0 {
            return Err(ScalarError::ShapeMismatch {
                rows: n,
                cols: n,
                len: h.len(),
            });
        }
        if !(damp.is_finite() && damp >= 0.0) {
            return Err(ScalarError::InvalidDamp { damp });
        }
        crate::check_finite(h).map_err(|e| match e {
            ScalarError::NonFinite { index, value } => {
                ScalarError::NonFiniteStatistics { index, value }
            }
            e => e,
        })?;
        let mean_diag = (0..n).map(|i| h[i * n + i].max(0.0) as f64).sum::<f64>() / n as f64;
        let base = if mean_diag > 0.0 { mean_diag } else { 1.0 };
        let mut lambda = damp.max(1e-6) * base;
        for _ in 0..3 {
            // The reversed matrix P·H·P (+ λI), whose Cholesky factor is P·U⁻¹·P: entry
            // (i, j) is H's (n−1−i, n−1−j), which in row-major order is H read backwards.
            let mut a: Vec<f64> = h.iter().rev().map(|&v| v as f64).collect();
            for i in 0..n {
                a[i * n + i] += lambda;
            }
            if cholesky_lower(&mut a, n) {
                // a = L (lower) with L = P·V·P, V = U⁻¹ upper: V[i][j] = L[n−1−i][n−1−j], L
                // read backwards again (in place: one n×n float64 matrix fewer).
                a.reverse();
                let u = invert_upper(&a, n);
                drop(a);
                return Ok(Ldlq {
                    n,
                    u: u.into_iter().map(|x| x as f32).collect(),
                });
            }
            lambda *= 10.0;
        }
        Err(ScalarError::NotPositiveDefinite { n })
    }

    /// Columns of the rows this factor serves.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Rounds one row `w` (`n` values, replaced by their reconstruction) in atoms of `atom`
    /// columns, left to right: `quant(j0, upcoming)` gets the row from column `j0` on, as
    /// feedback has moved it (a group's parameters may be fitted from it), and rounds its first
    /// `atom` values in place (recording their codes); their error is then fed into the later
    /// columns.
    pub fn row(&self, w: &mut [f32], atom: usize, quant: impl FnMut(usize, &mut [f32])) {
        let atom = atom.max(1);
        let n = self.n;
        self.row_ranges(
            w,
            (0..n).step_by(atom).map(|j0| j0..(j0 + atom).min(n)),
            quant,
        );
    }

    /// [`Ldlq::row`] over atoms given as consecutive column ranges covering the row (e.g. a
    /// trellis row's tail-biting sequences, the last one longer): `quant(j0, upcoming)` rounds
    /// the first `range.len()` values of `upcoming`.
    pub fn row_ranges(
        &self,
        w: &mut [f32],
        ranges: impl IntoIterator<Item = std::ops::Range<usize>>,
        mut quant: impl FnMut(usize, &mut [f32]),
    ) {
        self.rows_ranges(w, 1, ranges, |_, j0, upcoming| quant(j0, upcoming));
    }

    /// [`Ldlq::row_ranges`] for `k` rows at once, held back to back in `w` (`k·n` values):
    /// `quant(i, j0, upcoming)` rounds row `i`'s atom. Each row gets exactly the arithmetic of
    /// [`Ldlq::row_ranges`] (the same results, bit for bit), but every atom's rows of `U` are
    /// read once for the `k` rows instead of once per row: a wide layer's factor is several MB,
    /// so one sweep of it per row made rounding memory-bound.
    pub fn rows_ranges(
        &self,
        w: &mut [f32],
        k: usize,
        ranges: impl IntoIterator<Item = std::ops::Range<usize>>,
        mut quant: impl FnMut(usize, usize, &mut [f32]),
    ) {
        let n = self.n;
        self.atoms_of_rows(w, k, ranges, |j0, _, w| {
            for (i, wi) in w.chunks_exact_mut(n).enumerate().take(k) {
                quant(i, j0, &mut wi[j0..]);
            }
        });
    }

    /// [`Ldlq::rows_ranges`] with each atom rounded for every row in one call:
    /// `quant_all(j0, a, w)` rounds `w[i·n + j0 .. i·n + j0 + a]` for each of the `k` rows (a
    /// batch encoder: a GPU's). The same arithmetic per row as [`Ldlq::row_ranges`], bit for
    /// bit, when `quant_all` rounds each row as `quant` would.
    pub fn atoms_of_rows(
        &self,
        w: &mut [f32],
        k: usize,
        ranges: impl IntoIterator<Item = std::ops::Range<usize>>,
        mut quant_all: impl FnMut(usize, usize, &mut [f32]),
    ) {
        let n = self.n;
        // (The rows `w` holds: a shorter `w` than `k·n` values rounds fewer rows.)
        let k = w.len().checked_div(n).map_or(0, |held| k.min(held));
        let mut before = Vec::new();
        let mut e = Vec::new();
        let u = &self.u;
        for range in ranges {
            let (j0, a) = (range.start, range.len().min(n.saturating_sub(range.start)));
            if a == 0 {
                continue;
            }
            before.resize(k * a, 0f32);
            e.resize(k * a, 0f32);
            for (b, wi) in before.chunks_exact_mut(a).zip(w.chunks_exact(n)) {
                b.copy_from_slice(&wi[j0..j0 + a]);
            }
            quant_all(j0, a, w);
            // Each row's error, then its feedback: rows are independent, so many rows (a
            // batch encoder's whole tensor) go over the thread pool, the arithmetic per row
            // unchanged.
            let row = |((wi, ei), bi): ((&mut [f32], &mut [f32]), &[f32])| {
                // e·U_aa = Δ, by forward substitution.
                for t in 0..a {
                    let mut d = bi[t] - wi[j0 + t];
                    for s in 0..t {
                        d -= ei[s] * u[(j0 + s) * n + j0 + t];
                    }
                    let piv = u[(j0 + t) * n + j0 + t];
                    ei[t] = if piv != 0.0 { d / piv } else { 0.0 };
                }
                let rest = &mut wi[j0 + a..];
                for (t, &et) in ei.iter().enumerate() {
                    if et == 0.0 {
                        continue;
                    }
                    let ur = &u[(j0 + t) * n + j0 + a..(j0 + t + 1) * n];
                    // (x + (−e)·c is x − e·c exactly)
                    simd::axpy_f32(rest, -et, ur);
                }
            };
            let (w, e, before) = (&mut w[..k * n], &mut e[..k * a], &before[..k * a]);
            if k >= PARALLEL_ROWS {
                use rayon::prelude::*;
                w.par_chunks_exact_mut(n)
                    .zip(e.par_chunks_exact_mut(a))
                    .zip(before.par_chunks_exact(a))
                    .for_each(row);
            } else {
                w.chunks_exact_mut(n)
                    .zip(e.chunks_exact_mut(a))
                    .zip(before.chunks_exact(a))
                    .for_each(row);
            }
        }
    }
}

impl Ldlq {
    /// The scale `c` that minimizes the output error `(y − c·p)ᵀ·H·(y − c·p)` of reconstructing
    /// the row `target` (`y`) by `c` times the rounded `point` (`p`), under the damped
    /// statistics this factor was built from: `pᵀHy / pᵀHp` (None when `pᵀHp` is 0). With
    /// `H = U⁻¹·U⁻ᵀ`, `aᵀHb = (U⁻ᵀa)·(U⁻ᵀb)`: two triangular solves over `U`'s rows, no copy
    /// of `H`. Rounding with feedback leaves each row's stored scale a little off this optimum.
    pub fn fit(&self, target: &[f32], point: &[f32]) -> Option<f64> {
        self.fit_rows(target, point, 1).into_iter().next().flatten()
    }

    /// [`Ldlq::fit`] for `k` rows held back to back in `target` and `point` (`k·n` values
    /// each), with each row's arithmetic unchanged and `U` read once for all of them. One
    /// entry per row that both hold (of shorter slices, fewer than `k`).
    pub fn fit_rows(&self, target: &[f32], point: &[f32], k: usize) -> Vec<Option<f64>> {
        let n = self.n;
        let held = target.len().min(point.len()).checked_div(n);
        let k = held.map_or(0, |held| k.min(held));
        // Uᵀ·z = v, column by column: z_j = (v_j − acc_j) / U_jj, then row j of U (its entries
        // right of the diagonal) feeds acc. The solves run in float32 (the scale is stored as
        // a 16-bit float), the two sums in float64.
        let (mut ay, mut ap) = (vec![0f32; n * k], vec![0f32; n * k]);
        let (mut py, mut pp) = (vec![0f64; k], vec![0f64; k]);
        for j in 0..n {
            let d = self.u[j * n + j];
            if d == 0.0 {
                continue;
            }
            let row = &self.u[j * n + j + 1..(j + 1) * n];
            for i in 0..k {
                let (ay, ap) = (&mut ay[i * n..(i + 1) * n], &mut ap[i * n..(i + 1) * n]);
                let (y, p) = (
                    (target[i * n + j] - ay[j]) / d,
                    (point[i * n + j] - ap[j]) / d,
                );
                py[i] += y as f64 * p as f64;
                pp[i] += p as f64 * p as f64;
                simd::axpy2_f32(&mut ay[j + 1..], y, &mut ap[j + 1..], p, row);
            }
        }
        py.iter()
            .zip(&pp)
            .map(|(&py, &pp)| (pp > 0.0).then(|| py / pp))
            .collect()
    }
}

/// Columns of the Cholesky factor handled together: each row below a block is read once for
/// all of them (any size gives the same factor).
const FACTOR_BLOCK: usize = 64;

/// Rows of the inverse handled together: the finished rows below a block are streamed once
/// into all of them (the size fixes the order of each value's sums: it is part of the result).
const BLOCK: usize = 32;

/// From this many columns, the factor and its inverse run on the thread pool (the same results,
/// bit for bit: every value is computed by the same operations in the same order).
const PARALLEL_N: usize = 256;

/// In-place lower Cholesky factor of `a` (`n × n`, row-major); false when not positive definite.
///
/// `L[i][j] = (A[i][j] − Σ_k L[i][k]·L[j][k]) / L[j][j]`, each sum one [`simd::dot8_f64`], in
/// blocks of [`FACTOR_BLOCK`] columns: the block's own rows first, then every row below it, all of
/// the block's columns of a row at once (its finished part is read once per block instead of
/// once per column: one column at a time, a 4096-wide factor streamed ~90 GB), the rows in
/// parallel. Each entry is the same expression as column by column, so the factor does not
/// depend on the blocking or the threads.
fn cholesky_lower(a: &mut [f64], n: usize) -> bool {
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + FACTOR_BLOCK).min(n);
        for j in j0..j1 {
            let (upper, below) = a.split_at_mut((j + 1) * n);
            let row_j = &mut upper[j * n..];
            let d = row_j[j] - simd::dot8_f64(&row_j[..j], &row_j[..j]);
            if d.is_nan() || d <= 0.0 || !d.is_finite() {
                return false;
            }
            let d = d.sqrt();
            row_j[j] = d;
            let row_j = &row_j[..j];
            for ri in below[..(j1 - j - 1) * n].chunks_exact_mut(n) {
                let s = simd::dot8_f64(&ri[..j], row_j);
                ri[j] = (ri[j] - s) / d;
            }
        }
        let (top, below) = a.split_at_mut(j1 * n);
        let diag = &top[j0 * n..];
        let row = |ri: &mut [f64]| {
            // The sums over the columns before the block (a multiple of eight), four of the
            // block's columns per read of the row; then each column's own part, in order.
            let mut partial = [[0f64; 8]; FACTOR_BLOCK];
            for (q, p) in partial[..j1 - j0].chunks_mut(4).enumerate() {
                let d = |t: usize| {
                    let r = (4 * q + t).min(j1 - j0 - 1);
                    &diag[r * n..r * n + j0]
                };
                let acc = simd::dot8x4_partial_f64(&ri[..j0], [d(0), d(1), d(2), d(3)]);
                p.copy_from_slice(&acc[..p.len()]);
            }
            for ((j, dj), p) in (j0..j1).zip(diag.chunks_exact(n)).zip(partial) {
                let s = simd::dot8_from_f64(p, &ri[j0..j], &dj[j0..j]);
                ri[j] = (ri[j] - s) / dj[j];
            }
        };
        if n >= PARALLEL_N {
            use rayon::prelude::*;
            below.par_chunks_exact_mut(n).for_each(row);
        } else {
            below.chunks_exact_mut(n).for_each(row);
        }
        j0 = j1;
    }
    // Zero the strict upper triangle.
    for i in 0..n {
        for j in i + 1..n {
            a[i * n + j] = 0.0;
        }
    }
    true
}

/// The inverse of the upper-triangular `v` (non-zero diagonal), upper triangular: row `i` is
/// `(e_i − Σ_{k>i} V[i][k]·X[k]) / V_ii`, a combination of the rows below it. Rows are found
/// bottom-up in blocks of [`BLOCK`]: the finished rows below a block are streamed once into all
/// of its rows (one row at a time re-read the whole lower part of `X` per row: the inverse of a
/// 1536-wide layer's factor was memory-bound for seconds), then the block's own rows follow in
/// order. Every step is element-wise along a row, so a block splits into strips of columns
/// that the thread pool finishes independently, each value by the same operations in the same
/// order.
fn invert_upper(v: &[f64], n: usize) -> Vec<f64> {
    /// Columns per strip.
    const STRIP: usize = 128;
    let mut x = vec![0f64; n * n];
    let mut i1 = n;
    while i1 > 0 {
        let i0 = i1.saturating_sub(BLOCK);
        let (head, below) = x.split_at_mut(i1 * n);
        let block = Rows::new(&mut head[i0 * n..]);
        let below = &*below;
        // The block's rows over columns c0..c1 (columns ≥ i0: the rest stay zero).
        let strip = |c0: usize| {
            let c1 = (c0 + STRIP).min(n);
            // SAFETY: the block holds rows i0..i1 of `n` values; strips are disjoint column
            // ranges, so no two calls touch the same value.
            let row = |i: usize| unsafe { block.row(i - i0, n, c0, c1) };
            // S_i = Σ_{k ≥ i1} V[i][k]·X[k], row k read once for the whole block: four rows
            // at a time while they all cover the strip (each value's sum in the order of k).
            let x = |k: usize, from: usize| &below[(k - i1) * n + from..(k - i1) * n + c1];
            let whole = c0.min(c1).max(i1);
            let mut k = i1;
            while k + 4 <= whole {
                let xs = [x(k, c0), x(k + 1, c0), x(k + 2, c0), x(k + 3, c0)];
                for i in i0..i1 {
                    let a = [0, 1, 2, 3].map(|t| v[i * n + k + t]);
                    if a.iter().all(|&c| c != 0.0) {
                        simd::axpy4_f64(row(i), a, xs);
                    } else {
                        for (&c, xk) in a.iter().zip(xs) {
                            if c != 0.0 {
                                simd::axpy_f64(row(i), c, xk);
                            }
                        }
                    }
                }
                k += 4;
            }
            for k in k..c1 {
                let from = k.max(c0);
                let xk = x(k, from);
                for i in i0..i1 {
                    let c = v[i * n + k];
                    if c != 0.0 {
                        simd::axpy_f64(&mut row(i)[from - c0..], c, xk);
                    }
                }
            }
            // Then the block's rows below i (finished first, bottom-up), and the scaling.
            for i in (i0..i1).rev() {
                for k in i + 1..i1.min(c1) {
                    let c = v[i * n + k];
                    if c != 0.0 {
                        let from = k.max(c0);
                        // Rows i and k are distinct rows of the block.
                        simd::axpy_f64(&mut row(i)[from - c0..], c, &row(k)[from - c0..]);
                    }
                }
                let d = 1.0 / v[i * n + i];
                let r = row(i);
                for (c, value) in (c0..c1).zip(r.iter_mut()) {
                    if c > i {
                        *value *= -d;
                    } else if c == i {
                        *value = d;
                    }
                }
            }
        };
        let strips = (i0 / STRIP * STRIP..n).step_by(STRIP);
        if n >= PARALLEL_N {
            use rayon::prelude::*;
            strips.collect::<Vec<_>>().into_par_iter().for_each(strip);
        } else {
            strips.for_each(strip);
        }
        i1 = i0;
    }
    x
}

/// The rows of a block of the inverse, shared by the threads that fill its strips.
#[derive(Clone, Copy)]
struct Rows<'a>(*mut f64, std::marker::PhantomData<&'a mut [f64]>);

// SAFETY: the threads write disjoint column strips of the rows (see `invert_upper`).
unsafe impl Send for Rows<'_> {}
// SAFETY: as above.
unsafe impl Sync for Rows<'_> {}

impl<'a> Rows<'a> {
    /// The rows of `block`.
    fn new(block: &'a mut [f64]) -> Self {
        Rows(block.as_mut_ptr(), std::marker::PhantomData)
    }

    /// Columns `c0..c1` of row `r` of the block.
    ///
    /// # Safety
    /// The block holds row `r` of `n` values, `c0 ≤ c1 ≤ n`, and no other live reference
    /// covers those values.
    #[allow(clippy::mut_from_ref)]
    unsafe fn row(&self, r: usize, n: usize, c0: usize, c1: usize) -> &'a mut [f64] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(r * n + c0), c1 - c0) }
    }
}

/// The hot loops of the factor and of rounding, compiled twice: for the baseline target and
/// for AVX2, chosen at run time. Each is element-wise (or, for the dot product, eight fixed
/// partial sums), so both builds give the same results bit for bit.
mod simd {
    macro_rules! dispatch {
        ($body:ident, $avx2:ident, ($($arg:ident),*)) => {{
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2, checked just above.
                return unsafe { $avx2($($arg),*) };
            }
            $body($($arg),*)
        }};
    }

    /// `y += a·x`.
    pub(super) fn axpy_f32(y: &mut [f32], a: f32, x: &[f32]) {
        dispatch!(axpy_f32_body, axpy_f32_avx2, (y, a, x))
    }

    /// `y += a·u` and `z += b·u` in one pass over `u`.
    pub(super) fn axpy2_f32(y: &mut [f32], a: f32, z: &mut [f32], b: f32, u: &[f32]) {
        dispatch!(axpy2_f32_body, axpy2_f32_avx2, (y, a, z, b, u))
    }

    /// `y += a·x`.
    pub(super) fn axpy_f64(y: &mut [f64], a: f64, x: &[f64]) {
        dispatch!(axpy_f64_body, axpy_f64_avx2, (y, a, x))
    }

    /// `Σ a_k·b_k` in eight interleaved partial sums, combined pairwise: independent chains
    /// the compiler keeps in vector registers (one running sum is a chain of dependent
    /// additions, and made the Cholesky factor of a 1536-wide layer take seconds).
    pub(super) fn dot8_f64(a: &[f64], b: &[f64]) -> f64 {
        dispatch!(dot8_f64_body, dot8_f64_avx2, (a, b))
    }

    /// [`dot8_f64`] continued from the partial sums `acc` of the products before `a` and `b`
    /// (whole chunks of eight): the same value as `dot8_f64` over the whole slices.
    pub(super) fn dot8_from_f64(acc: [f64; 8], a: &[f64], b: &[f64]) -> f64 {
        dispatch!(dot8_from_f64_body, dot8_from_f64_avx2, (acc, a, b))
    }

    /// The eight partial sums of [`dot8_f64`] of `a` (a whole number of chunks of eight) with
    /// each of `b`, `a` read once for the four.
    pub(super) fn dot8x4_partial_f64(a: &[f64], b: [&[f64]; 4]) -> [[f64; 8]; 4] {
        dispatch!(dot8x4_partial_f64_body, dot8x4_partial_f64_avx2, (a, b))
    }

    /// `y += a_0·x_0`, then `+= a_1·x_1`, … (each value's sums in that order, as four
    /// [`axpy_f64`] calls), `y` read and written once.
    pub(super) fn axpy4_f64(y: &mut [f64], a: [f64; 4], x: [&[f64]; 4]) {
        dispatch!(axpy4_f64_body, axpy4_f64_avx2, (y, a, x))
    }

    #[inline(always)]
    fn axpy_f32_body(y: &mut [f32], a: f32, x: &[f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    }

    #[inline(always)]
    fn axpy2_f32_body(y: &mut [f32], a: f32, z: &mut [f32], b: f32, u: &[f32]) {
        for ((y, z), &u) in y.iter_mut().zip(z.iter_mut()).zip(u) {
            *y += u * a;
            *z += u * b;
        }
    }

    #[inline(always)]
    fn axpy_f64_body(y: &mut [f64], a: f64, x: &[f64]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    }

    #[inline(always)]
    fn dot8_f64_body(a: &[f64], b: &[f64]) -> f64 {
        dot8_from_f64_body([0f64; 8], a, b)
    }

    #[inline(always)]
    fn dot8_from_f64_body(mut acc: [f64; 8], a: &[f64], b: &[f64]) -> f64 {
        let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
        let tail: f64 = ca
            .remainder()
            .iter()
            .zip(cb.remainder())
            .map(|(x, y)| x * y)
            .sum();
        for (x, y) in ca.zip(cb) {
            for t in 0..8 {
                acc[t] += x[t] * y[t];
            }
        }
        ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
    }

    #[inline(always)]
    fn dot8x4_partial_f64_body(a: &[f64], b: [&[f64]; 4]) -> [[f64; 8]; 4] {
        let mut acc = [[0f64; 8]; 4];
        let n = a.len() / 8 * 8;
        let b = b.map(|b| &b[..n]);
        for c in (0..n).step_by(8) {
            let x = &a[c..c + 8];
            for (acc, b) in acc.iter_mut().zip(b) {
                let y = &b[c..c + 8];
                for t in 0..8 {
                    acc[t] += x[t] * y[t];
                }
            }
        }
        acc
    }

    #[inline(always)]
    fn axpy4_f64_body(y: &mut [f64], a: [f64; 4], x: [&[f64]; 4]) {
        let n = y.len();
        let [x0, x1, x2, x3] = x.map(|x| &x[..n]);
        for (c, y) in y.iter_mut().enumerate() {
            *y += a[0] * x0[c];
            *y += a[1] * x1[c];
            *y += a[2] * x2[c];
            *y += a[3] * x3[c];
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn axpy_f32_avx2(y: &mut [f32], a: f32, x: &[f32]) {
        axpy_f32_body(y, a, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn axpy2_f32_avx2(y: &mut [f32], a: f32, z: &mut [f32], b: f32, u: &[f32]) {
        axpy2_f32_body(y, a, z, b, u)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn axpy_f64_avx2(y: &mut [f64], a: f64, x: &[f64]) {
        axpy_f64_body(y, a, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn dot8_f64_avx2(a: &[f64], b: &[f64]) -> f64 {
        dot8_f64_body(a, b)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn dot8_from_f64_avx2(acc: [f64; 8], a: &[f64], b: &[f64]) -> f64 {
        dot8_from_f64_body(acc, a, b)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn dot8x4_partial_f64_avx2(a: &[f64], b: [&[f64]; 4]) -> [[f64; 8]; 4] {
        dot8x4_partial_f64_body(a, b)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn axpy4_f64_avx2(y: &mut [f64], a: [f64; 4], x: [&[f64]; 4]) {
        axpy4_f64_body(y, a, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_rows_and_huge_counts_round_or_fit_only_the_rows_held() {
        let n = 8;
        let mut h = vec![0f32; n * n];
        (0..n).for_each(|i| h[i * n + i] = 1.0);
        let f = Ldlq::new(&h, n, 0.01).unwrap();
        let row: Vec<f32> = (0..n).map(|i| i as f32 - 3.5).collect();
        assert!(f.fit(&row, &row).is_some_and(|c| (c - 1.0).abs() < 1e-6));
        // Shorter than a row, and 2^40 rows asked of one: no panic, no 16 TiB of sums.
        assert_eq!(f.fit(&row[..3], &row), None);
        assert_eq!(f.fit_rows(&row, &row, 1 << 40).len(), 1);
        let mut w = row[..5].to_vec();
        f.row(&mut w, 1, |_, v| v[0] = v[0].round());
        assert_eq!(w, &row[..5]);
        let mut w = row.clone();
        f.rows_ranges(&mut w, 1 << 40, (0..n).map(|j| j..j + 1), |_, _, v| {
            v[0] = v[0].round()
        });
        assert!(w.iter().all(|v| v.fract() == 0.0), "{w:?}");
    }

    /// The factor one column at a time, every row below it in turn (the unblocked loop).
    fn cholesky_by_columns(a: &mut [f64], n: usize) -> bool {
        for j in 0..n {
            let (upper, below) = a.split_at_mut((j + 1) * n);
            let row_j = &mut upper[j * n..];
            let d = row_j[j] - simd::dot8_f64(&row_j[..j], &row_j[..j]);
            if d.is_nan() || d <= 0.0 || !d.is_finite() {
                return false;
            }
            let d = d.sqrt();
            row_j[j] = d;
            for ri in below.chunks_exact_mut(n) {
                let s = simd::dot8_f64(&ri[..j], &row_j[..j]);
                ri[j] = (ri[j] - s) / d;
            }
        }
        for i in 0..n {
            for j in i + 1..n {
                a[i * n + j] = 0.0;
            }
        }
        true
    }

    /// The inverse by blocks of rows on one thread: the rows below a block streamed into all
    /// of its rows, then the block's own rows in order (each value summed in the same order as
    /// by strips).
    fn invert_one_thread(v: &[f64], n: usize) -> Vec<f64> {
        let mut x = vec![0f64; n * n];
        let mut i1 = n;
        while i1 > 0 {
            let i0 = i1.saturating_sub(BLOCK);
            let (head, below) = x.split_at_mut(i1 * n);
            let block = &mut head[i0 * n..];
            for k in i1..n {
                let xk = &below[(k - i1) * n + k..(k - i1 + 1) * n];
                for (i, row) in (i0..i1).zip(block.chunks_exact_mut(n)) {
                    let c = v[i * n + k];
                    if c != 0.0 {
                        simd::axpy_f64(&mut row[k..], c, xk);
                    }
                }
            }
            for i in (i0..i1).rev() {
                let (mid, done) = block.split_at_mut((i - i0 + 1) * n);
                let row = &mut mid[(i - i0) * n..];
                for k in i + 1..i1 {
                    let c = v[i * n + k];
                    if c != 0.0 {
                        let xk = &done[(k - i - 1) * n + k..(k - i) * n];
                        simd::axpy_f64(&mut row[k..], c, xk);
                    }
                }
                let d = 1.0 / v[i * n + i];
                row[i + 1..].iter_mut().for_each(|r| *r *= -d);
                row[i] = d;
            }
            i1 = i0;
        }
        x
    }

    #[test]
    fn blocked_parallel_factor_and_inverse_equal_the_plain_loops_bit_for_bit() {
        // Sizes around the block, the strip and the parallel threshold.
        for n in [1, 2, 31, 32, 33, 127, 129, 255, 256, 300, 517] {
            let h = matrix(n, n as u64 + 5);
            let mut a: Vec<f64> = h.iter().map(|&v| v as f64).collect();
            for i in 0..n {
                a[i * n + i] += 0.01;
            }
            let mut b = a.clone();
            assert!(cholesky_lower(&mut a, n), "n = {n}");
            assert!(cholesky_by_columns(&mut b, n), "n = {n}");
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "factor differs at n = {n}"
            );
            // V = Lᵀ (upper), its inverse both ways.
            let mut v = vec![0f64; n * n];
            for i in 0..n {
                for j in i..n {
                    v[i * n + j] = a[j * n + i];
                }
            }
            let (x, y) = (invert_upper(&v, n), invert_one_thread(&v, n));
            assert!(
                x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "inverse differs at n = {n}"
            );
            // And it is the inverse: V·X = I.
            for i in (0..n).step_by(n.div_ceil(7)) {
                for j in 0..n {
                    let e: f64 = (0..n).map(|k| v[i * n + k] * x[k * n + j]).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((e - want).abs() < 1e-8, "n = {n}: (V·X)[{i}][{j}] = {e}");
                }
            }
        }
    }

    #[test]
    fn the_factor_reads_the_statistics_backwards_as_the_index_loops_did() {
        for n in [1, 37, 300] {
            let h = matrix(n, 4);
            let f = Ldlq::new(&h, n, 0.01).unwrap();
            let lambda =
                0.01 * ((0..n).map(|i| h[i * n + i].max(0.0) as f64).sum::<f64>() / n as f64);
            let mut a = vec![0f64; n * n];
            for i in 0..n {
                for j in 0..n {
                    a[i * n + j] = h[(n - 1 - i) * n + (n - 1 - j)] as f64;
                }
                a[i * n + i] += lambda;
            }
            assert!(cholesky_by_columns(&mut a, n));
            let mut v = vec![0f64; n * n];
            for i in 0..n {
                for j in i..n {
                    v[i * n + j] = a[(n - 1 - i) * n + (n - 1 - j)];
                }
            }
            let u: Vec<f32> = invert_one_thread(&v, n).iter().map(|&x| x as f32).collect();
            assert!(
                f.u.iter().zip(&u).all(|(p, q)| p.to_bits() == q.to_bits()),
                "n = {n}"
            );
        }
    }

    #[test]
    fn a_matrix_that_is_not_positive_definite_fails_in_any_block() {
        // A negative pivot in the first block, then in a later one.
        for (n, bad) in [(70, 40), (300, FACTOR_BLOCK + 36)] {
            let mut a = vec![0f64; n * n];
            for i in 0..n {
                a[i * n + i] = if i == bad { -1.0 } else { 1.0 };
            }
            assert!(!cholesky_lower(&mut a, n), "n = {n}");
        }
    }

    fn matrix(n: usize, seed: u64) -> Vec<f32> {
        // H = AᵀA/m + a little: symmetric positive definite.
        let m = 2 * n;
        let mut s = seed | 1;
        let a: Vec<f64> = (0..m * n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
            })
            .collect();
        let mut h = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..n {
                h[i * n + j] =
                    (0..m).map(|k| a[k * n + i] * a[k * n + j]).sum::<f64>() as f32 / m as f32;
            }
        }
        h
    }

    #[test]
    fn rows_in_a_block_round_exactly_as_one_at_a_time() {
        let n = 37;
        let h = matrix(n, 9);
        let f = Ldlq::new(&h, n, 0.01).unwrap();
        let k = 5;
        let w0: Vec<f32> = matrix(k.max(n), 3)[..k * n]
            .iter()
            .map(|v| v * 40.0)
            .collect();
        // A rounding whose result depends on the row and the atom (so a mixed-up row shows).
        let quant = |i: usize, j0: usize, up: &mut [f32]| {
            let a = 4.min(up.len());
            let step = 0.25 + 0.125 * i as f32 + 0.01 * j0 as f32;
            up[..a]
                .iter_mut()
                .for_each(|v| *v = (*v / step).round() * step);
        };
        let atoms = || (0..n).step_by(4).map(|j0| j0..(j0 + 4).min(n));
        let mut block = w0.clone();
        let mut seen = Vec::new();
        f.rows_ranges(&mut block, k, atoms(), |i, j0, up| {
            seen.push((i, j0));
            quant(i, j0, up)
        });
        // Every row's atoms in order, atom by atom across the rows.
        assert_eq!(seen.len(), k * n.div_ceil(4));
        assert!(seen
            .windows(2)
            .all(|p| p[0].1 < p[1].1 || (p[0].1 == p[1].1 && p[0].0 + 1 == p[1].0)));
        for i in 0..k {
            let mut row = w0[i * n..(i + 1) * n].to_vec();
            f.row_ranges(&mut row, atoms(), |j0, up| quant(i, j0, up));
            assert_eq!(row, block[i * n..(i + 1) * n], "row {i}");
            assert_ne!(row, w0[i * n..(i + 1) * n]);
        }
        let fits = f.fit_rows(&w0, &block, k);
        for i in 0..k {
            let one = f.fit(&w0[i * n..(i + 1) * n], &block[i * n..(i + 1) * n]);
            assert_eq!(fits[i], one);
            assert!(one.is_some_and(|c| (c - 1.0).abs() < 0.2), "{one:?}");
        }
    }

    #[test]
    fn fit_is_the_least_output_error_scale_under_the_damped_statistics() {
        let n = 21;
        let h = matrix(n, 5);
        let f = Ldlq::new(&h, n, 0.01).unwrap();
        let mean = (0..n).map(|i| h[i * n + i] as f64).sum::<f64>() / n as f64;
        let hd = |i: usize, j: usize| h[i * n + j] as f64 + if i == j { 0.01 * mean } else { 0.0 };
        let y: Vec<f32> = (0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3).collect();
        let p: Vec<f32> = y
            .iter()
            .enumerate()
            .map(|(i, v)| (v * 1.7).round() / 1.6 + 0.01 * i as f32)
            .collect();
        let q = |a: &[f32], b: &[f32]| -> f64 {
            (0..n)
                .map(|i| {
                    (0..n)
                        .map(|j| a[i] as f64 * hd(i, j) * b[j] as f64)
                        .sum::<f64>()
                })
                .sum()
        };
        let want = q(&p, &y) / q(&p, &p);
        let got = f.fit(&y, &p).unwrap();
        assert!((got - want).abs() < 1e-4 * want.abs(), "{got} vs {want}");
        // The fitted scale's output error is no larger than at any nearby scale.
        let err = |c: f64| {
            let d: Vec<f32> = y
                .iter()
                .zip(&p)
                .map(|(&a, &b)| (a as f64 - c * b as f64) as f32)
                .collect();
            q(&d, &d)
        };
        assert!(err(got) <= err(got * 1.01) && err(got) <= err(got * 0.99) && err(got) < err(1.0));
        assert_eq!(f.fit(&y, &vec![0.0; n]), None);
    }

    #[test]
    fn the_factor_inverts_the_damped_matrix() {
        let n = 13;
        let h = matrix(n, 3);
        let f = Ldlq::new(&h, n, 0.0).unwrap();
        // UᵀU·(H + λI) ≈ I with λ tiny.
        let u = &f.u;
        for i in 0..n {
            for j in 0..n {
                let mut s = 0f64;
                for k in 0..n {
                    let hinv_ik: f64 = (0..n)
                        .map(|t| u[t * n + i] as f64 * u[t * n + k] as f64)
                        .sum();
                    s += hinv_ik * h[k * n + j] as f64;
                }
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((s - want).abs() < 1e-3, "{i} {j}: {s}");
            }
        }
    }

    #[test]
    fn feedback_lowers_the_output_error_of_rounding() {
        // Rounding to a coarse grid: the output error Δ·H·Δᵀ with feedback is below plain
        // rounding's, for correlated inputs.
        // Strongly correlated inputs (an AR(1) process, ρ = 0.95) and pseudo-random weights.
        let n = 48;
        let mut h = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..n {
                h[i * n + j] = 0.95f32.powi((i as i32 - j as i32).abs());
            }
        }
        let f = Ldlq::new(&h, n, 0.01).unwrap();
        let err = |d: &[f32]| -> f64 {
            (0..n)
                .map(|i| {
                    (0..n)
                        .map(|j| d[i] as f64 * h[i * n + j] as f64 * d[j] as f64)
                        .sum::<f64>()
                })
                .sum()
        };
        let (mut plain, mut fed) = (0f64, 0f64);
        for r in 0..20 {
            let w: Vec<f32> = (0..n)
                .map(|j| (((j * 2654435761 + r * 40503) >> 7) % 1000) as f32 / 1000.0 - 0.5)
                .collect();
            let q: Vec<f32> = w.iter().map(|x| (x * 4.0).round() / 4.0).collect();
            let d: Vec<f32> = w.iter().zip(&q).map(|(a, b)| a - b).collect();
            plain += err(&d);
            let mut v = w.clone();
            for atom in [1usize, 4] {
                v.copy_from_slice(&w);
                f.row(&mut v, atom, |_, a| {
                    let k = atom.min(a.len());
                    a[..k]
                        .iter_mut()
                        .for_each(|x| *x = (*x * 4.0).round() / 4.0)
                });
                assert!(v.iter().all(|x| (x * 4.0).fract() == 0.0));
                let d: Vec<f32> = w.iter().zip(&v).map(|(a, b)| a - b).collect();
                if atom == 1 {
                    fed += err(&d);
                }
            }
        }
        assert!(fed < 0.5 * plain, "{fed} vs {plain}");
    }

    #[test]
    fn bad_statistics_are_typed_errors() {
        assert!(Ldlq::new(&[1.0, 2.0, 3.0], 2, 0.01).is_err());
        assert!(Ldlq::new(&[f32::NAN, 0.0, 0.0, 1.0], 2, 0.01).is_err());
        // A damping that is negative or not a number is refused (it acted as none).
        for damp in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(
                    Ldlq::new(&[1.0, 0.0, 0.0, 1.0], 2, damp),
                    Err(ScalarError::InvalidDamp { .. })
                ),
                "{damp}"
            );
        }
        // A zero matrix is damped into the identity: plain rounding.
        let f = Ldlq::new(&[0.0; 4], 2, 0.01).unwrap();
        let mut w = [0.3f32, 0.6];
        f.row(&mut w, 1, |_, a| a[0] = a[0].round());
        assert_eq!(w, [0.0, 1.0]);
    }

    #[test]
    fn affine_rows_rounded_sixteen_at_a_time_equal_one_at_a_time() {
        use crate::{affine_ldlq_codes, AffineParams, FloatDtype, Group, GroupQuant};
        // 37 rows: two full blocks of 16 and a partial one; correlated inputs.
        let (rows, cols) = (37, 48);
        let h = matrix(cols, 21);
        let f = Ldlq::new(&h, cols, 0.01).unwrap();
        let mut w: Vec<f32> = matrix(rows.max(cols), 8)[..rows * cols]
            .iter()
            .map(|v| v * 30.0)
            .collect();
        w[5 * cols..6 * cols].iter_mut().for_each(|v| *v = 0.0);
        for (group, symmetric, bits) in [
            (Group::Size(16), false, 3u8),
            (Group::Row, true, 4),
            (Group::Tensor, false, 2),
        ] {
            let p = AffineParams {
                bits,
                group,
                symmetric,
                scale_dtype: FloatDtype::F16,
            };
            let (codes, groups) = affine_ldlq_codes(&w, rows, cols, &p, &f).unwrap();
            // One row at a time, each group fitted when rounding reaches it.
            let tensor = (group == Group::Tensor).then(|| GroupQuant::fit_clipped(&w, &p).unwrap());
            let glen = match group {
                Group::Size(n) => n as usize,
                _ => cols,
            };
            let (mut want_codes, mut want_groups) = (vec![0u8; rows * cols], Vec::new());
            for (row, out) in w.chunks(cols).zip(want_codes.chunks_mut(cols)) {
                let mut x = row.to_vec();
                let mut current = tensor;
                f.row(&mut x, 1, |j, up| {
                    if tensor.is_none() && j % glen == 0 {
                        let q = GroupQuant::fit_clipped(&up[..glen.min(up.len())], &p).unwrap();
                        want_groups.push(q);
                        current = Some(q);
                    }
                    let q = current.unwrap();
                    let c = q.code(up[0]);
                    out[j] = c as u8;
                    up[0] = q.value(c);
                });
            }
            want_groups.extend(tensor);
            assert_eq!(codes, want_codes, "{group:?}");
            assert_eq!(groups.len(), want_groups.len(), "{group:?}");
            for (a, b) in groups.iter().zip(&want_groups) {
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "{group:?}");
            }
        }
        // A group whose range no f16 scale holds: the first such group, row-major, is named
        // (row 20's second group, in the second block of rows).
        let mut big = w.clone();
        big[20 * cols + 17] = 1e30;
        big[33 * cols + 2] = 1e30;
        let p = AffineParams {
            bits: 4,
            group: Group::Size(16),
            symmetric: true,
            scale_dtype: FloatDtype::F16,
        };
        match affine_ldlq_codes(&big, rows, cols, &p, &f) {
            Err(crate::ScalarError::ScaleOverflow { group, .. }) => {
                assert_eq!(group, 20 * 3 + 1)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn affine_with_uncorrelated_inputs_rounds_to_nearest_and_feedback_helps_otherwise() {
        use crate::{
            affine_encode, affine_ldlq_codes, affine_pack, AffineParams, FloatDtype, Group,
            GroupQuant,
        };
        let (rows, cols) = (6, 40);
        let w: Vec<f32> = (0..rows * cols)
            .map(|j| (((j * 2654435761) >> 9) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let mut eye = vec![0f32; cols * cols];
        (0..cols).for_each(|i| eye[i * cols + i] = 1.0);
        for (group, symmetric, bits) in [
            (Group::Size(16), false, 3u8),
            (Group::Row, true, 4),
            (Group::Tensor, true, 2),
            (Group::Size(8), true, 1),
        ] {
            let p = AffineParams {
                bits,
                group,
                symmetric,
                scale_dtype: FloatDtype::F16,
            };
            let f = Ldlq::new(&eye, cols, 0.01).unwrap();
            let (codes, groups) = affine_ldlq_codes(&w, rows, cols, &p, &f).unwrap();
            // Nothing feeds back: each value rounds to nearest in its group, fitted with the
            // clipping search the calibrated path uses (1 bit: `fit`'s, as round to nearest).
            let tensor = (group == Group::Tensor).then(|| GroupQuant::fit_clipped(&w, &p).unwrap());
            let glen = match group {
                Group::Size(n) => n as usize,
                _ => cols,
            };
            let expected: Vec<u8> = w
                .chunks(cols)
                .flat_map(|row| row.chunks(glen))
                .flat_map(|g| {
                    let q = tensor.unwrap_or_else(|| GroupQuant::fit_clipped(g, &p).unwrap());
                    g.iter().map(move |&x| q.code(x) as u8)
                })
                .collect();
            assert_eq!(codes, expected, "{p:?}");
            if bits == 1 {
                let ours = affine_pack(&codes, &groups, rows, cols, &p).unwrap();
                assert_eq!(ours, affine_encode(&w, rows, cols, &p).unwrap(), "{p:?}");
            }
        }
        // Correlated inputs: lower output error than round-to-nearest at the same format.
        let mut h = vec![0f32; cols * cols];
        for i in 0..cols {
            for j in 0..cols {
                h[i * cols + j] = 0.9f32.powi((i as i32 - j as i32).abs());
            }
        }
        let p = AffineParams {
            bits: 3,
            group: Group::Size(20),
            symmetric: false,
            scale_dtype: FloatDtype::F16,
        };
        let out_err = |enc: &crate::AffineEncoded| -> f64 {
            let mut back = vec![0f32; rows * cols];
            crate::affine_decode_into(
                &enc.codes,
                &enc.scales,
                &enc.offsets,
                rows,
                cols,
                &p,
                &mut back,
            )
            .unwrap();
            let d: Vec<f64> = w.iter().zip(&back).map(|(a, b)| (a - b) as f64).collect();
            (0..rows)
                .map(|r| {
                    let d = &d[r * cols..(r + 1) * cols];
                    (0..cols)
                        .map(|i| {
                            (0..cols)
                                .map(|j| d[i] * h[i * cols + j] as f64 * d[j])
                                .sum::<f64>()
                        })
                        .sum::<f64>()
                })
                .sum()
        };
        let f = Ldlq::new(&h, cols, 0.01).unwrap();
        let (codes, groups) = affine_ldlq_codes(&w, rows, cols, &p, &f).unwrap();
        let fed = out_err(&affine_pack(&codes, &groups, rows, cols, &p).unwrap());
        let plain = out_err(&affine_encode(&w, rows, cols, &p).unwrap());
        assert!(fed < 0.9 * plain, "{fed} vs {plain}");
    }
}
