//! Nearest-point quantizers of Z1, A2, D4 and E8 on integer representations, with the bits
//! each lattice pins stripped losslessly.
//!
//! Lattices in real coordinates (the unit the scale α multiplies into):
//! - **Z1**: the integers.
//! - **A2**: `{(nₓ/2, n_y·√3/2) : nₓ ≡ n_y (mod 2)}`, minimum distance 1.
//! - **D4**: `{z ∈ Z⁴ : Σz even}`.
//! - **E8**: `{Y/2 : Y ∈ Z⁸ all even or all odd, ΣY ≡ 0 (mod 4)}` = D8 ∪ (D8 + ½).
//!
//! Each word of `dim` coordinates becomes `dim` unsigned symbols (zigzag `zz(n) = 2n` for
//! `n ≥ 0`, `−2n−1` otherwise), with the pinned bits removed:
//! - Z1: `[zz(q)]`.
//! - A2: `[zz(n_y), zz(m)]` with `nₓ = 2m + (n_y mod 2)`.
//! - D4: `[zz(t), zz(z₀), zz(z₁), zz(z₂)]` with `z₃ = 2t + ((z₀+z₁+z₂) mod 2)`.
//! - E8: `[2·zz(t) + c, zz(s₀), …, zz(s₆)]` where `c ∈ {0,1}` is the coset (`Y = 2s + c`),
//!   `s₇ = 2t + ((s₀+…+s₆) mod 2)`: one parity bit per word is never stored, and the coset bit
//!   rides in the first symbol, which is decoded first so it can select the model of the rest.
//!
//! Inputs are clamped to ±[`MAX_COORD`] first, so every integer fits an `i32` whatever the data.

use crate::{LatticeError, Result};

/// Largest magnitude of a scaled coordinate; beyond it values are clamped. Rows are normalized
/// by their own RMS, or by their tensor's, before scaling, so this is reached only by absurd
/// scales, corrupt input, or a row more than 2^21/α times its tensor's RMS.
pub const MAX_COORD: f32 = (1 << 21) as f32;

/// A lattice family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Lattice {
    /// The integers: scalar rounding.
    Z1,
    /// The hexagonal lattice.
    A2,
    /// The checkerboard lattice in four dimensions.
    D4,
    /// The Gosset lattice.
    E8,
}

const SQRT3: f32 = 1.732_050_8;

#[inline]
fn zz(n: i32) -> u32 {
    ((n << 1) ^ (n >> 31)) as u32
}

#[inline]
fn unzz(z: u32) -> i32 {
    ((z >> 1) as i32) ^ -((z & 1) as i32)
}

/// Round to nearest (ties to even) for |x| ≤ 2^22 without a libm call: adding and removing
/// 1.5·2^23 leaves no fraction bits. Inputs are clamped to ±[`MAX_COORD`] = 2^21 first.
#[inline(always)]
fn rnd(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

#[inline]
fn clampc(x: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(-MAX_COORD, MAX_COORD)
    }
}

/// Nearest point of D_n = {z ∈ Zⁿ : Σz even} (Conway & Sloane): round every coordinate, and if
/// the sum is odd, round the worst one the other way. Returns the point and its squared distance.
/// Written without data-dependent branches (selects compile to conditional moves): the parity
/// and the worst coordinate are coin flips on real data, and mispredictions would dominate.
#[inline(always)]
fn nearest_dn<const N: usize>(u: &[f32; N]) -> ([i32; N], f32) {
    let mut r = [0i32; N];
    let mut f = [0f32; N];
    let mut sum = 0i32;
    let mut worst = 0usize;
    let mut worst_err = -1.0f32;
    let mut d = 0.0f32;
    for i in 0..N {
        f[i] = rnd(u[i]);
        r[i] = f[i] as i32;
        sum = sum.wrapping_add(r[i]);
        let e = u[i] - f[i];
        d += e * e;
        let better = e.abs() > worst_err;
        worst = if better { i } else { worst };
        worst_err = if better { e.abs() } else { worst_err };
    }
    let odd = sum & 1;
    let e = u[worst] - f[worst];
    let dir = if e >= 0.0 { 1i32 } else { -1i32 };
    r[worst] += odd * dir;
    let e2 = e - dir as f32;
    d += odd as f32 * (e2 * e2 - e * e);
    (r, d)
}

/// The word, clamped, and the same shifted by −½: the inputs of E8's two D8 cosets.
#[inline(always)]
fn e8_cosets(u: &[f32]) -> ([f32; 8], [f32; 8]) {
    let a: [f32; 8] = std::array::from_fn(|i| clampc(u[i]));
    (a, a.map(|x| x - 0.5))
}

/// E8 from its two D8 cosets: the closer of `even` (the point `s`) and `odd` (the point
/// `s + ½`), as `(s, c, t)` with `c` the coset and `s₇ = 2t + ((s₀+…+s₆) mod 2)`.
#[inline(always)]
fn e8_strip(even: ([i32; 8], f32), odd: ([i32; 8], f32)) -> ([i32; 8], u32, i32) {
    let pick = odd.1 < even.1;
    let s: [i32; 8] = std::array::from_fn(|i| if pick { odd.0[i] } else { even.0[i] });
    let p = (s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6]) & 1;
    (s, pick as u32, (s[7] - p) >> 1)
}

impl Lattice {
    /// Every lattice.
    pub const ALL: [Lattice; 4] = [Lattice::Z1, Lattice::A2, Lattice::D4, Lattice::E8];

    /// Dimension (coordinates per word).
    pub const fn dim(self) -> usize {
        match self {
            Lattice::Z1 => 1,
            Lattice::A2 => 2,
            Lattice::D4 => 4,
            Lattice::E8 => 8,
        }
    }

    /// Lowercase name (`z1`, `a2`, `d4`, `e8`).
    pub const fn name(self) -> &'static str {
        match self {
            Lattice::Z1 => "z1",
            Lattice::A2 => "a2",
            Lattice::D4 => "d4",
            Lattice::E8 => "e8",
        }
    }

    /// Parses a name as written by [`Lattice::name`].
    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|l| l.name() == name)
            .ok_or_else(|| LatticeError::UnknownLattice {
                name: name.chars().take(32).collect(),
            })
    }

    /// The covering radius in real coordinates: no point of space is farther from the lattice.
    pub fn covering_radius(self) -> f32 {
        match self {
            Lattice::Z1 => 0.5,
            Lattice::A2 => 1.0 / SQRT3,
            Lattice::D4 | Lattice::E8 => 1.0,
        }
    }

    /// Number of entropy-model contexts the symbols of a word use.
    pub const fn contexts(self) -> usize {
        match self {
            Lattice::Z1 => 1,
            Lattice::A2 | Lattice::D4 => 2,
            Lattice::E8 => 3,
        }
    }

    /// The context of symbol `pos` of a word whose first symbol is `first`.
    #[inline]
    pub fn context(self, pos: usize, first: u32) -> usize {
        match self {
            Lattice::Z1 => 0,
            Lattice::A2 | Lattice::D4 => (pos > 0) as usize,
            Lattice::E8 => {
                if pos == 0 {
                    0
                } else {
                    1 + (first & 1) as usize
                }
            }
        }
    }

    /// Quantizes one word `u` (`dim` real coordinates) to its nearest lattice point and writes
    /// its `dim` symbols.
    #[inline]
    pub fn encode_word(self, u: &[f32], syms: &mut [u32]) {
        match self {
            Lattice::Z1 => syms[0] = zz(rnd(clampc(u[0])) as i32),
            Lattice::A2 => {
                let (x, y) = (clampc(u[0]), clampc(u[1]) / SQRT3);
                // Coset 0: (i, j√3); coset 1: (i + ½, (j + ½)√3). Distances in real units.
                let (i0, j0) = (rnd(x), rnd(y));
                let (i1, j1) = (rnd(x - 0.5), rnd(y - 0.5));
                let d0 = (x - i0).powi(2) + 3.0 * (y - j0).powi(2);
                let d1 = (x - i1 - 0.5).powi(2) + 3.0 * (y - j1 - 0.5).powi(2);
                let (nx, ny) = if d0 <= d1 {
                    (2 * i0 as i32, 2 * j0 as i32)
                } else {
                    (2 * i1 as i32 + 1, 2 * j1 as i32 + 1)
                };
                syms[0] = zz(ny);
                syms[1] = zz((nx - (ny & 1)) >> 1);
            }
            Lattice::D4 => {
                let w = [clampc(u[0]), clampc(u[1]), clampc(u[2]), clampc(u[3])];
                let (r, _) = nearest_dn(&w);
                let t = (r[3] - ((r[0] + r[1] + r[2]) & 1)) >> 1;
                syms[0] = zz(t);
                syms[1] = zz(r[0]);
                syms[2] = zz(r[1]);
                syms[3] = zz(r[2]);
            }
            Lattice::E8 => {
                let (a, b) = e8_cosets(u);
                let (s, c, t) = e8_strip(nearest_dn(&a), nearest_dn(&b));
                syms[0] = 2 * zz(t) + c;
                for i in 0..7 {
                    syms[1 + i] = zz(s[i]);
                }
            }
        }
    }

    /// The lattice point (real coordinates) of one word's symbols. Any symbols decode to a
    /// lattice point; nothing here can fail.
    #[inline]
    pub fn decode_word(self, syms: &[u32], out: &mut [f32]) {
        match self {
            Lattice::Z1 => out[0] = unzz(syms[0]) as f32,
            Lattice::A2 => {
                let ny = unzz(syms[0]);
                let nx = (unzz(syms[1]) as i64) * 2 + (ny & 1) as i64;
                out[0] = nx as f32 * 0.5;
                out[1] = ny as f32 * (SQRT3 * 0.5);
            }
            Lattice::D4 => {
                let t = unzz(syms[0]) as i64;
                let z: [i64; 3] = [
                    unzz(syms[1]) as i64,
                    unzz(syms[2]) as i64,
                    unzz(syms[3]) as i64,
                ];
                out[0] = z[0] as f32;
                out[1] = z[1] as f32;
                out[2] = z[2] as f32;
                out[3] = (2 * t + ((z[0] + z[1] + z[2]) & 1)) as f32;
            }
            Lattice::E8 => {
                let c = syms[0] & 1;
                let t = unzz(syms[0] >> 1) as i64;
                let mut p = 0i64;
                let h = 0.5 * c as f32;
                for i in 0..7 {
                    let s = unzz(syms[1 + i]) as i64;
                    p += s;
                    out[i] = s as f32 + h;
                }
                out[7] = (2 * t + (p & 1)) as f32 + h;
            }
        }
    }
}

impl Lattice {
    /// `Σ point · x` over the words that `syms` codes (unbounded symbols, read as
    /// [`Lattice::decode_word`] reads them) against `x`, word by word while both last: the
    /// decode and the dot product in one pass, with partial sums in independent lanes so that
    /// Z1, A2 and D4 vectorize (the CPU runtime's batch-1 product on entropy-coded symbols).
    pub fn coded_dot(self, syms: &[u32], x: &[f32]) -> f32 {
        let n = syms.len().min(x.len()) / self.dim() * self.dim();
        let (syms, x) = (&syms[..n], &x[..n]);
        match self {
            Lattice::Z1 => lane_dot::<1>(syms, x, |s, v| [unzz(s[0]) as f32 * v[0]])[0],
            Lattice::A2 => {
                let sum = lane_dot::<2>(syms, x, |s, v| {
                    let ny = unzz(s[0]) as i64;
                    let nx = unzz(s[1]) as i64 * 2 + (ny & 1);
                    [nx as f32 * v[0], ny as f32 * v[1]]
                });
                // lane_dot sums positions apart: even lanes hold nₓ·x, odd ones n_y·x.
                0.5 * sum[0] + SQRT3 * 0.5 * sum[1]
            }
            Lattice::D4 => lane_dot::<4>(syms, x, |s, v| {
                let z = [unzz(s[1]) as i64, unzz(s[2]) as i64, unzz(s[3]) as i64];
                let last = 2 * unzz(s[0]) as i64 + ((z[0] + z[1] + z[2]) & 1);
                [
                    z[0] as f32 * v[0],
                    z[1] as f32 * v[1],
                    z[2] as f32 * v[2],
                    last as f32 * v[3],
                ]
            })
            .iter()
            .sum(),
            Lattice::E8 => {
                let mut point = [0f32; 8];
                let mut acc = 0f32;
                for (s, v) in syms.chunks_exact(8).zip(x.chunks_exact(8)) {
                    self.decode_word(s, &mut point);
                    acc += point.iter().zip(v).map(|(a, b)| a * b).sum::<f32>();
                }
                acc
            }
        }
    }
}

/// Σ over words of `D` values of `word(symbols, x)`'s products, position by position: eight
/// partial sums (words of 8 / D a step) so that the loop vectorizes; `[Σ position 0, …]` summed
/// over the lanes of each position (Z1's one sum; A2 keeps its coordinates apart).
#[inline(always)]
fn lane_dot<const D: usize>(
    syms: &[u32],
    x: &[f32],
    word: impl Fn(&[u32], &[f32]) -> [f32; D],
) -> [f32; D] {
    let mut acc = [0f32; 8];
    let (s8, x8) = (syms.chunks_exact(8), x.chunks_exact(8));
    let mut out = [0f32; D];
    for (s, v) in s8
        .remainder()
        .chunks_exact(D)
        .zip(x8.remainder().chunks_exact(D))
    {
        for (o, p) in out.iter_mut().zip(word(s, v)) {
            *o += p;
        }
    }
    for (s, v) in s8.zip(x8) {
        for k in 0..8 / D {
            let p = word(&s[k * D..k * D + D], &v[k * D..k * D + D]);
            for (a, q) in acc[k * D..k * D + D].iter_mut().zip(p) {
                *a += q;
            }
        }
    }
    for (k, a) in acc.iter().enumerate() {
        out[k % D] += a;
    }
    out
}

/// Box-constrained nearest point of D_n-like sets: every coordinate in `[lo, hi]`, and (when
/// `parity`) an even sum. Exact: round and clamp each coordinate, and if the sum is odd move
/// the one coordinate whose move to its other in-range neighbour costs least.
#[inline]
fn nearest_box<const N: usize>(u: &[f32; N], lo: i32, hi: i32, parity: bool) -> ([i32; N], f32) {
    let mut r = [0i32; N];
    let mut sum = 0i32;
    for i in 0..N {
        r[i] = (rnd(u[i]) as i32).clamp(lo, hi);
        sum += r[i];
    }
    if parity && sum & 1 != 0 {
        let mut best = (f32::INFINITY, 0usize, 0i32);
        for i in 0..N {
            let base = (u[i] - r[i] as f32).powi(2);
            for alt in [r[i] - 1, r[i] + 1] {
                if (lo..=hi).contains(&alt) {
                    let cost = (u[i] - alt as f32).powi(2) - base;
                    if cost < best.0 {
                        best = (cost, i, alt);
                    }
                }
            }
        }
        r[best.1] = best.2;
    }
    let d = (0..N).map(|i| (u[i] - r[i] as f32).powi(2)).sum();
    (r, d)
}

impl Lattice {
    /// True when this lattice has a fixed-rate form ([`Lattice::encode_word_fixed`]).
    pub const fn has_fixed(self) -> bool {
        !matches!(self, Lattice::A2)
    }

    /// Fixed-rate quantization: the nearest lattice point whose integer coordinates all lie in
    /// `[−2^(bits−1), 2^(bits−1) − 1]` (points outside are replaced by the nearest such point),
    /// as `dim` symbols of `bits` bits each (offset binary; E8's first symbol is
    /// `2·(t + 2^(bits−2)) + c`). `bits` is 2..=8. A2 has no fixed-rate form.
    ///
    /// A word-level primitive of the hot loops, unchecked: `bits` outside 2..=8 gives
    /// meaningless symbols (the callers in this crate check it once per tensor).
    ///
    /// # Panics
    /// If `u` or `syms` holds fewer than the lattice's `dim` values.
    #[inline]
    pub fn encode_word_fixed(self, u: &[f32], bits: u8, syms: &mut [u32]) {
        let h = 1i32 << (bits - 1);
        let (lo, hi) = (-h, h - 1);
        match self {
            Lattice::Z1 | Lattice::A2 => {
                syms[0] = ((rnd(clampc(u[0])) as i32).clamp(lo, hi) + h) as u32
            }
            Lattice::D4 => {
                let w = [clampc(u[0]), clampc(u[1]), clampc(u[2]), clampc(u[3])];
                let (r, _) = nearest_box(&w, lo, hi, true);
                let t = (r[3] - ((r[0] + r[1] + r[2]) & 1)) >> 1;
                syms[0] = (t + h / 2) as u32;
                for i in 0..3 {
                    syms[1 + i] = (r[i] + h) as u32;
                }
            }
            Lattice::E8 => {
                let (a, b) = e8_cosets(u);
                let (s, c, t) =
                    e8_strip(nearest_box(&a, lo, hi, true), nearest_box(&b, lo, hi, true));
                syms[0] = 2 * (t + h / 2) as u32 + c;
                for i in 0..7 {
                    syms[1 + i] = (s[i] + h) as u32;
                }
            }
        }
    }

    /// The lattice point of fixed-rate symbols (see [`Lattice::encode_word_fixed`], unchecked
    /// as it is).
    ///
    /// # Panics
    /// If `syms` or `out` holds fewer than the lattice's `dim` values.
    #[inline]
    pub fn decode_word_fixed(self, syms: &[u32], bits: u8, out: &mut [f32]) {
        let h = 1i64 << (bits - 1);
        match self {
            Lattice::Z1 | Lattice::A2 => out[0] = (syms[0] as i64 - h) as f32,
            Lattice::D4 => {
                let t = syms[0] as i64 - h / 2;
                let z = [syms[1] as i64 - h, syms[2] as i64 - h, syms[3] as i64 - h];
                out[0] = z[0] as f32;
                out[1] = z[1] as f32;
                out[2] = z[2] as f32;
                out[3] = (2 * t + ((z[0] + z[1] + z[2]) & 1)) as f32;
            }
            Lattice::E8 => {
                let c = syms[0] & 1;
                let t = (syms[0] >> 1) as i64 - h / 2;
                let half = 0.5 * c as f32;
                let mut p = 0i64;
                for i in 0..7 {
                    let s = syms[1 + i] as i64 - h;
                    p += s;
                    out[i] = s as f32 + half;
                }
                out[7] = (2 * t + (p & 1)) as f32 + half;
            }
        }
    }
}

impl std::fmt::Display for Lattice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `coded_dot` against decoding word by word and summing in f64.
    fn dot_reference(l: Lattice, syms: &[u32], x: &[f32]) -> f64 {
        let d = l.dim();
        let mut p = vec![0f32; d];
        let mut acc = 0f64;
        for (s, v) in syms.chunks_exact(d).zip(x.chunks_exact(d)) {
            l.decode_word(s, &mut p);
            acc += p
                .iter()
                .zip(v)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>();
        }
        acc
    }

    proptest! {
        #[test]
        fn coded_dot_is_the_decoded_words_dot(words in 0usize..40, seed in any::<u64>(), wide in any::<bool>()) {
            for l in [Lattice::Z1, Lattice::A2, Lattice::D4, Lattice::E8] {
                let n = words * l.dim();
                let mut z = seed | 1;
                let mut next = || { z ^= z << 13; z ^= z >> 7; z ^= z << 17; z };
                // Small symbols as coded weights are, or any u32 (a hostile stream): no overflow.
                let syms: Vec<u32> = (0..n).map(|_| if wide { next() as u32 } else { (next() % 40) as u32 }).collect();
                let x: Vec<f32> = (0..n).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
                let got = l.coded_dot(&syms, &x) as f64;
                let want = dot_reference(l, &syms, &x);
                let mag: f64 = {
                    let d = l.dim();
                    let mut p = vec![0f32; d];
                    syms.chunks_exact(d).zip(x.chunks_exact(d)).map(|(s, v)| {
                        l.decode_word(s, &mut p);
                        p.iter().zip(v).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum::<f64>()
                    }).sum()
                };
                prop_assert!((got - want).abs() <= 1e-5 * mag + 1e-6, "{:?}: {} vs {}", l, got, want);
                // Word by word while both last: a longer x (or a partial last word) is ignored.
                let mut longer = x.clone();
                longer.extend([3.0; 11]);
                prop_assert_eq!(l.coded_dot(&syms, &longer), l.coded_dot(&syms, &x));
                if n > 0 {
                    prop_assert_eq!(l.coded_dot(&syms[..n - 1], &x), l.coded_dot(&syms[..n - l.dim()], &x[..n - l.dim()]));
                }
            }
        }
    }

    /// Squared distance from `u` to the decoded point of `u`'s symbols.
    fn dist2(l: Lattice, u: &[f32]) -> f32 {
        let mut s = vec![0u32; l.dim()];
        let mut p = vec![0f32; l.dim()];
        l.encode_word(u, &mut s);
        l.decode_word(&s, &mut p);
        u.iter().zip(&p).map(|(a, b)| (a - b) * (a - b)).sum()
    }

    /// Lattice points near `u`, by brute force over a box of integer representations.
    fn brute_nearest(l: Lattice, u: &[f32]) -> f32 {
        let n = l.dim();
        let mut best = f32::INFINITY;
        let mut base: Vec<i32> = u.iter().map(|x| (x * 2.0).round() as i32).collect();
        if l == Lattice::A2 {
            base[1] = (u[1] * 2.0 / SQRT3).round() as i32;
        }
        let span = if n == 8 { 2 } else { 3 };
        let total = (2 * span + 1usize).pow(n as u32);
        for k in 0..total {
            let mut rem = k;
            let mut y = vec![0i32; n];
            for i in 0..n {
                y[i] = base[i] + (rem % (2 * span + 1)) as i32 - span as i32;
                rem /= 2 * span + 1;
            }
            // y is twice the point (A2: (nx, ny) directly).
            let member = match l {
                Lattice::Z1 => y[0] % 2 == 0,
                Lattice::A2 => (y[0] - y[1]) % 2 == 0,
                Lattice::D4 => y.iter().all(|v| v % 2 == 0) && (y.iter().sum::<i32>() / 2) % 2 == 0,
                Lattice::E8 => {
                    let odd = y[0].rem_euclid(2);
                    y.iter().all(|v| v.rem_euclid(2) == odd)
                        && y.iter().sum::<i32>().rem_euclid(4) == 0
                }
            };
            if !member {
                continue;
            }
            let d: f32 = match l {
                Lattice::A2 => {
                    (u[0] - y[0] as f32 / 2.0).powi(2) + (u[1] - y[1] as f32 * SQRT3 / 2.0).powi(2)
                }
                _ => u
                    .iter()
                    .zip(&y)
                    .map(|(a, b)| (a - *b as f32 / 2.0).powi(2))
                    .sum(),
            };
            best = best.min(d);
        }
        best
    }

    #[test]
    fn symbols_roundtrip_through_known_points() {
        let mut s = [0u32; 8];
        let mut p = [0f32; 8];
        let pt = [0.5f32, 0.5, 0.5, 0.5, -0.5, -0.5, -0.5, -0.5];
        Lattice::E8.encode_word(&pt, &mut s);
        Lattice::E8.decode_word(&s, &mut p);
        assert_eq!(p, pt);
        assert_eq!(s[0] & 1, 1, "odd coset");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn nearest_point_is_optimal(l in prop::sample::select(Lattice::ALL.to_vec()), u in proptest::collection::vec(-4.0f32..4.0, 8)) {
            let u = &u[..l.dim()];
            let ours = dist2(l, u);
            let brute = brute_nearest(l, u);
            prop_assert!(ours <= brute + 1e-4, "{} {:?}: ours {} brute {}", l, u, ours, brute);
            // and within the covering radius
            prop_assert!(ours.sqrt() <= l.covering_radius() + 1e-4);
        }

        #[test]
        fn fixed_rate_stays_in_range_and_roundtrips(l in prop::sample::select(vec![Lattice::Z1, Lattice::D4, Lattice::E8]),
                                                   bits in 2u8..=8, u in proptest::collection::vec(-300.0f32..300.0, 8)) {
            let u = &u[..l.dim()];
            let mut s = vec![0u32; l.dim()];
            l.encode_word_fixed(u, bits, &mut s);
            prop_assert!(s.iter().all(|&x| x < 1 << bits), "{:?}", s);
            let mut p = vec![0f32; l.dim()];
            l.decode_word_fixed(&s, bits, &mut p);
            // a lattice point: the entropy-coded path maps it to itself
            let mut z = vec![0u32; l.dim()];
            let mut q = vec![0f32; l.dim()];
            l.encode_word(&p, &mut z);
            l.decode_word(&z, &mut q);
            prop_assert_eq!(&p, &q);
            // inside the box, fixed-rate equals the unconstrained nearest point
            let lim = (1i32 << (bits - 1)) as f32 - 2.5;
            if u.iter().all(|x| x.abs() < lim) && l != Lattice::Z1 {
                let mut e = vec![0u32; l.dim()];
                let mut pe = vec![0f32; l.dim()];
                l.encode_word(u, &mut e);
                l.decode_word(&e, &mut pe);
                prop_assert_eq!(p, pe);
            }
        }

        #[test]
        fn any_symbols_decode_to_lattice_points_that_encode_back(l in prop::sample::select(Lattice::ALL.to_vec()), syms in proptest::collection::vec(0u32..5000, 8)) {
            let syms = &syms[..l.dim()];
            let mut p = vec![0f32; l.dim()];
            l.decode_word(syms, &mut p);
            let mut back = vec![0u32; l.dim()];
            l.encode_word(&p, &mut back);
            prop_assert_eq!(back, syms.to_vec());
        }
    }
}
