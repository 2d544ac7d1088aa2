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
pub fn fwht(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
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
    pub fn forward(&self, row: &mut [f32]) {
        debug_assert_eq!(row.len(), self.cols);
        self.signs.apply(row);
        for t in row.chunks_exact_mut(self.tile) {
            fwht(t);
            t.iter_mut().for_each(|v| *v *= self.scale);
        }
    }

    /// `x = D·H·y/√T` per tile, in place, on one row.
    pub fn inverse(&self, row: &mut [f32]) {
        debug_assert_eq!(row.len(), self.cols);
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
