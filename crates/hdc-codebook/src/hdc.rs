//! Hyperdimensional bucketing: an index that makes nearest-prototype search fast.
//!
//! `dim` seeded Gaussian random projections form the hypervector space; of them, the
//! `b = log2(buckets)` that spread the prototypes widest (largest variance of the projected
//! prototypes) are kept, each thresholded at the prototypes' median so that buckets are
//! balanced. A vector's bucket key is its `b` sign bits (a SimHash: vectors with the same key
//! lie on the same side of `b` hyperplanes).
//!
//! Probing is done once, when the index is built: every prototype is copied into its own
//! bucket and into each bucket whose key differs in one bit. A query then computes `b`
//! projections and searches one contiguous bucket *exactly* (Euclidean distance), about
//! `k·(b+1)/2^b` prototypes instead of `k`. A query whose bucket is empty falls back to the
//! exhaustive search, so the index never returns a prototype that was not compared exactly.
//! A larger `dim` gives better hyperplanes to choose from; more buckets give faster and
//! slightly less exact search (`examples/hdc_speed.rs` measures both).

use crate::kmeans::nearest_brute;
use crate::rng::Rng;
use crate::{par, HdcError, Result};

/// Largest hypervector, in bits.
pub const MAX_HDC_DIM: usize = 256;

/// Parameters of the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HdcParams {
    /// Bits per hypervector (1..=256).
    pub dim: usize,
    /// Number of buckets: a power of two, at most `2^dim` and at most 65536.
    pub buckets: usize,
    /// Seed of the random projections.
    pub seed: u64,
}

impl HdcParams {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<()> {
        if self.dim == 0 || self.dim > MAX_HDC_DIM {
            return Err(HdcError::InvalidParams {
                message: format!("hdc dim {} must be in 1..={MAX_HDC_DIM}", self.dim),
            });
        }
        if !self.buckets.is_power_of_two()
            || self.buckets > 1 << 16
            || self.buckets.trailing_zeros() as usize > self.dim
        {
            return Err(HdcError::InvalidParams {
                message: format!(
                    "hdc buckets {} must be a power of two <= min(2^dim, 65536)",
                    self.buckets
                ),
            });
        }
        Ok(())
    }
}

/// The bucketed index over a fixed set of prototypes.
#[derive(Debug, Clone)]
pub struct HdcIndex<'a> {
    protos: &'a [f32],
    block: usize,
    planes: Vec<f32>,
    thresholds: Vec<f32>,
    bucket_start: Vec<u32>,
    bucket_ids: Vec<u32>,
    bucket_protos: Vec<f32>,
}

impl<'a> HdcIndex<'a> {
    /// Builds the index of `protos` (rows of `block` values).
    pub fn new(protos: &'a [f32], block: usize, params: HdcParams) -> Result<Self> {
        params.validate()?;
        if block == 0 {
            return Err(HdcError::InvalidParams {
                message: "an index of prototypes of 0 values".into(),
            });
        }
        let mut rng = Rng::new(params.seed ^ 0x4844_4331);
        let k = protos.len() / block;
        let key_bits = params.buckets.trailing_zeros();
        // Draw `dim` projections, keep the `key_bits` with the widest spread of prototypes.
        let mut scored: Vec<(f64, Vec<f32>, Vec<f32>)> = (0..params.dim)
            .map(|_| {
                let plane: Vec<f32> = (0..block).map(|_| rng.normal()).collect();
                let proj: Vec<f32> = protos.chunks_exact(block).map(|p| dot(&plane, p)).collect();
                let mean = proj.iter().map(|&v| v as f64).sum::<f64>() / k.max(1) as f64;
                let var = proj.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>()
                    / plane.iter().map(|&v| (v as f64).powi(2)).sum::<f64>();
                (var, plane, proj)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut planes = Vec::with_capacity(key_bits as usize * block);
        let mut thresholds = Vec::with_capacity(key_bits as usize);
        let mut keys = vec![0usize; k];
        for (bit, (_, plane, mut proj)) in scored.into_iter().take(key_bits as usize).enumerate() {
            for (key, &v) in keys.iter_mut().zip(&proj) {
                *key |= usize::from(v >= 0.0) << bit;
            }
            let t = if k > 0 {
                let mid = k / 2;
                *proj.select_nth_unstable_by(mid, f32::total_cmp).1
            } else {
                0.0
            };
            // Re-key against the median threshold.
            for (j, p) in protos.chunks_exact(block).enumerate() {
                let on = dot(&plane, p) >= t;
                keys[j] = (keys[j] & !(1 << bit)) | (usize::from(on) << bit);
            }
            planes.extend_from_slice(&plane);
            thresholds.push(t);
        }
        // Each prototype goes into its bucket and the `key_bits` buckets one bit away.
        let buckets = params.buckets;
        let mut bucket_start = vec![0u32; buckets + 1];
        let probes =
            |key: usize| std::iter::once(key).chain((0..key_bits).map(move |b| key ^ (1 << b)));
        for &key in &keys {
            for b in probes(key) {
                bucket_start[b + 1] += 1;
            }
        }
        for b in 0..buckets {
            bucket_start[b + 1] += bucket_start[b];
        }
        let total = bucket_start[buckets] as usize;
        let mut bucket_ids = vec![0u32; total];
        let mut bucket_protos = vec![0f32; total * block];
        let mut fill = bucket_start.clone();
        for (j, &key) in keys.iter().enumerate() {
            for b in probes(key) {
                let slot = fill[b] as usize;
                bucket_ids[slot] = j as u32;
                bucket_protos[slot * block..(slot + 1) * block]
                    .copy_from_slice(&protos[j * block..(j + 1) * block]);
                fill[b] += 1;
            }
        }
        Ok(HdcIndex {
            protos,
            block,
            planes,
            thresholds,
            bucket_start,
            bucket_ids,
            bucket_protos,
        })
    }

    /// The bucket key of `q`.
    pub fn key(&self, q: &[f32]) -> usize {
        self.planes
            .chunks_exact(self.block)
            .zip(&self.thresholds)
            .enumerate()
            .fold(0, |key, (bit, (plane, &t))| {
                key | (usize::from(dot(plane, q) >= t) << bit)
            })
    }

    /// The index of the nearest prototype in `q`'s bucket, with its squared distance.
    pub fn nearest(&self, q: &[f32]) -> (u32, f32) {
        let b = self.key(q);
        let (s, e) = (
            self.bucket_start[b] as usize,
            self.bucket_start[b + 1] as usize,
        );
        if s == e {
            return nearest_brute(self.protos, self.block, q);
        }
        let (i, d) = nearest_brute(
            &self.bucket_protos[s * self.block..e * self.block],
            self.block,
            q,
        );
        (self.bucket_ids[s + i as usize], d)
    }

    /// Assigns every block of `blocks` (parallel over blocks); entries of `out` past the
    /// blocks `blocks` holds are left as they are.
    pub fn assign(&self, blocks: &[f32], out: &mut [u32]) {
        let block = self.block;
        par::for_chunks(out, 1, |start, chunk| {
            for (j, a) in chunk.iter_mut().enumerate() {
                if let Some(q) = crate::kmeans::held_block(blocks, block, start + j) {
                    *a = self.nearest(q).0;
                }
            }
        });
    }

    /// Average prototypes searched per query, over the buckets (each weighted equally).
    pub fn mean_bucket_len(&self) -> f64 {
        self.bucket_ids.len() as f64 / (self.bucket_start.len() - 1) as f64
    }
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
