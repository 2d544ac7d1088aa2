//! The seeded randomized Hadamard transform (RHT), per tile of a row.
//!
//! For a row split into tiles of `T` values (a power of two), each tile is multiplied by a
//! diagonal of random signs `D` and then by the orthonormal Walsh–Hadamard matrix `H/√T`:
//! `y = H·D·x / √T`. The inverse is `x = D·H·y / √T` (`H` is symmetric and `H² = T·I`).
//! The transform is orthonormal, so errors and SNR are the same in both domains.
//!
//! Signs depend on the seed and on the position inside the row only, so every row of a
//! matrix uses the same transform and a matrix–vector product can rotate the activation once:
//! `W·x = (W·Rᵀ)·(R·x)`.
//!
//! Sign of position `j`: bit `j mod 64` of `mix64(seed + (j div 64 + 1)·0x9E3779B97F4A7C15)`,
//! `1` meaning −1, where `mix64` is the splitmix64 finalizer. This is part of the format.

use crate::{LatticeError, Result};

/// Smallest tile used when the row allows it.
pub const MIN_TILE: usize = 64;
/// Largest tile.
pub const MAX_TILE: usize = 4096;

/// The splitmix64 output function.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The tile for rows of `cols` values: the largest power of two that divides `cols`, at most
/// `max_tile`. Rows whose largest power-of-two divisor is below [`MIN_TILE`] (odd lengths,
/// for example) still get that divisor — down to 1, which is signs only: the transform stays
/// exact and orthonormal, it only spreads outliers less.
pub fn tile_for(cols: usize, max_tile: usize) -> usize {
    if cols == 0 {
        return 1;
    }
    let pow2 = 1usize << cols.trailing_zeros();
    let cap = 1usize << (usize::BITS - 1 - max_tile.clamp(1, MAX_TILE).leading_zeros());
    pow2.min(cap)
}

/// Random signs of one row, as XOR masks of the f32 sign bit (branch-free application).
#[derive(Debug, Clone)]
pub struct Signs {
    masks: Vec<u32>,
}

impl Signs {
    /// Signs for rows of `cols` values under `seed`.
    pub fn new(seed: u64, cols: usize) -> Self {
        let masks = (0..cols)
            .map(|j| {
                let w = mix64(
                    seed.wrapping_add((j as u64 / 64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                );
                (((w >> (j % 64)) & 1) as u32) << 31
            })
            .collect();
        Signs { masks }
    }

    /// True when position `j` is negated.
    #[inline]
    pub fn neg(&self, j: usize) -> bool {
        self.masks[j] != 0
    }

    /// Applies the signs to a row (or a prefix of one) in place.
    #[inline]
    pub fn apply(&self, row: &mut [f32]) {
        for (v, &m) in row.iter_mut().zip(&self.masks) {
            *v = f32::from_bits(v.to_bits() ^ m);
        }
    }
}

/// In-place fast Walsh–Hadamard transform (unnormalized) of a power-of-two slice.
///
/// # Panics
/// If `x.len()` is not a power of two (or 0): the vector path's butterflies would reach past
/// the slice.
pub fn fwht(x: &mut [f32]) {
    let n = x.len();
    assert!(
        n.is_power_of_two(),
        "fwht of {n} values: the length must be a power of two"
    );
    #[cfg(target_arch = "x86_64")]
    if n >= 8 && std::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX; `n` is a power of two of at least 8.
        unsafe { x86::fwht(x) };
        return;
    }
    let mut h = 1;
    if n >= 8 {
        // The first three stages within each block of 8, unrolled on registers (the same
        // butterflies in the same order as the loop below: bit-identical results).
        for b in x.chunks_exact_mut(8) {
            let mut v = [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
            for h in [1, 2, 4] {
                for i in 0..8 {
                    if i & h == 0 {
                        let (s, d) = (v[i] + v[i + h], v[i] - v[i + h]);
                        v[i] = s;
                        v[i + h] = d;
                    }
                }
            }
            b.copy_from_slice(&v);
        }
        h = 8;
    }
    while h < n {
        for block in x.chunks_exact_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (u, v) in a.iter_mut().zip(b.iter_mut()) {
                let (s, d) = (*u + *v, *u - *v);
                *u = s;
                *v = d;
            }
        }
        h *= 2;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::fwht`] in AVX: the butterflies of stages 1, 2 and 4 inside each register of 8
    /// (a lane meets its partner through a permute; the sum goes to the lower lane, the
    /// difference lower − upper to the upper one), then whole registers — the same float
    /// operations on the same operands as the portable loop, so the same bits.
    ///
    /// # Safety
    /// The CPU must have AVX; `x.len()` must be a power of two of at least 8.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn fwht(x: &mut [f32]) {
        let n = x.len();
        let p = x.as_mut_ptr();
        for b in (0..n).step_by(8) {
            // SAFETY: `b + 8 <= n`.
            let mut v = unsafe { _mm256_loadu_ps(p.add(b)) };
            // h = 1: partners are neighbours.
            let w = _mm256_permute_ps::<0b10_11_00_01>(v);
            v = _mm256_blend_ps::<0b1010_1010>(_mm256_add_ps(v, w), _mm256_sub_ps(w, v));
            // h = 2: partners two lanes apart.
            let w = _mm256_permute_ps::<0b01_00_11_10>(v);
            v = _mm256_blend_ps::<0b1100_1100>(_mm256_add_ps(v, w), _mm256_sub_ps(w, v));
            // h = 4: the two halves.
            let w = _mm256_permute2f128_ps::<0x01>(v, v);
            v = _mm256_blend_ps::<0b1111_0000>(_mm256_add_ps(v, w), _mm256_sub_ps(w, v));
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(p.add(b), v) };
        }
        let mut h = 8;
        while h < n {
            for blk in (0..n).step_by(2 * h) {
                for i in (blk..blk + h).step_by(8) {
                    // SAFETY: `i + h + 8 <= blk + 2h <= n`.
                    unsafe {
                        let a = _mm256_loadu_ps(p.add(i));
                        let c = _mm256_loadu_ps(p.add(i + h));
                        _mm256_storeu_ps(p.add(i), _mm256_add_ps(a, c));
                        _mm256_storeu_ps(p.add(i + h), _mm256_sub_ps(a, c));
                    }
                }
            }
            h *= 2;
        }
    }
}

/// A randomized Hadamard transform for rows of a fixed length.
#[derive(Debug, Clone)]
pub struct Rht {
    cols: usize,
    tile: usize,
    signs: Signs,
    scale: f32,
}

impl Rht {
    /// The transform of rows of `cols` values with tiles of `tile` (a power of two dividing `cols`).
    pub fn new(cols: usize, tile: usize, seed: u64) -> Result<Self> {
        if tile == 0
            || !tile.is_power_of_two()
            || tile > MAX_TILE
            || (cols > 0 && !cols.is_multiple_of(tile))
        {
            return Err(LatticeError::InvalidTile { tile, cols });
        }
        Ok(Rht {
            cols,
            tile,
            signs: Signs::new(seed, cols),
            scale: 1.0 / (tile as f32).sqrt(),
        })
    }

    /// Row length.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Tile size.
    pub fn tile(&self) -> usize {
        self.tile
    }

    /// `y = H·D·x/√T` per tile, in place, on one row.
    ///
    /// # Panics
    /// If `row` does not hold [`Rht::cols`] values (a shorter row's last partial tile, or a
    /// longer row's tail, would pass through untransformed).
    pub fn forward(&self, row: &mut [f32]) {
        assert_eq!(row.len(), self.cols, "RHT of a row of the wrong length");
        self.signs.apply(row);
        for t in row.chunks_exact_mut(self.tile) {
            fwht(t);
            t.iter_mut().for_each(|v| *v *= self.scale);
        }
    }

    /// `x = D·H·y/√T` per tile, in place, on one row.
    ///
    /// # Panics
    /// As [`Rht::forward`].
    pub fn inverse(&self, row: &mut [f32]) {
        assert_eq!(
            row.len(),
            self.cols,
            "inverse RHT of a row of the wrong length"
        );
        for t in row.chunks_exact_mut(self.tile) {
            fwht(t);
            t.iter_mut().for_each(|v| *v *= self.scale);
        }
        self.signs.apply(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 rounding through log2(T) butterfly levels: a few ulps per level, relative to the
    /// row's norm.
    const RHT_REL_TOL: f32 = 1e-5;

    #[test]
    fn tiles() {
        assert_eq!(tile_for(4096, 4096), 4096);
        assert_eq!(tile_for(11008, 4096), 256);
        assert_eq!(tile_for(384, 4096), 128);
        assert_eq!(tile_for(8192, 1024), 1024);
        assert_eq!(tile_for(100, 4096), 4);
        assert_eq!(tile_for(7, 4096), 1);
        assert_eq!(tile_for(4096, 1000), 512);
    }

    #[test]
    fn inverse_is_exact_within_tolerance_and_norm_is_kept() {
        for (cols, tile) in [(4096, 4096), (768, 256), (100, 4), (7, 1), (384, 64)] {
            let rht = Rht::new(cols, tile, 42).unwrap();
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 100.0)
                .collect();
            let mut y = x.clone();
            rht.forward(&mut y);
            let n0: f32 = x.iter().map(|v| v * v).sum::<f32>().sqrt();
            let n1: f32 = y.iter().map(|v| v * v).sum::<f32>().sqrt();
            assert!((n0 - n1).abs() <= RHT_REL_TOL * n0 * 4.0);
            rht.inverse(&mut y);
            let err: f32 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                .sqrt();
            assert!(err <= RHT_REL_TOL * n0, "cols {cols}: {err}");
        }
    }

    #[test]
    fn the_vector_transform_equals_the_portable_one_bit_for_bit() {
        for n in [8usize, 16, 64, 256, 4096] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 37.0)
                .collect();
            let mut a = x.clone();
            fwht(&mut a);
            // The portable loop, written out.
            let mut b = x.clone();
            let mut h = 1;
            while h < n {
                for block in b.chunks_exact_mut(2 * h) {
                    let (l, r) = block.split_at_mut(h);
                    for (u, v) in l.iter_mut().zip(r.iter_mut()) {
                        let (s, d) = (*u + *v, *u - *v);
                        *u = s;
                        *v = d;
                    }
                }
                h *= 2;
            }
            assert!(
                a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                "n = {n}"
            );
        }
    }

    #[test]
    fn spike_is_spread() {
        let rht = Rht::new(1024, 1024, 7).unwrap();
        let mut x = vec![0.0f32; 1024];
        x[5] = 32.0;
        rht.forward(&mut x);
        assert!(x.iter().all(|v| (v.abs() - 1.0).abs() < 1e-5));
    }

    #[test]
    fn bad_tiles() {
        assert!(Rht::new(100, 8, 0).is_err());
        assert!(Rht::new(128, 3, 0).is_err());
        assert!(Rht::new(8192, 8192, 0).is_err());
    }
}
