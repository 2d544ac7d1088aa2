//! Prototype learning: k-means++ seeding and Lloyd iterations on a sample of blocks, and the
//! brute-force nearest-prototype search everything else is measured against.

use crate::par;
use crate::rng::Rng;
use crate::{HdcError, Result};

/// Squared Euclidean distance.
#[inline]
pub(crate) fn dist2(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// Index and squared distance of the prototype nearest to `q` (exhaustive search).
#[inline]
pub fn nearest_brute(protos: &[f32], block: usize, q: &[f32]) -> (u32, f32) {
    let mut best = (0u32, f32::INFINITY);
    if block == 0 {
        return best; // (no prototype of 0 values)
    }
    for (i, p) in protos.chunks_exact(block).enumerate() {
        let d = dist2(p, q);
        if d < best.1 {
            best = (i as u32, d);
        }
    }
    best
}

/// Exhaustive assignment of every block (parallel over blocks); entries of `out` past the
/// blocks `blocks` holds are left as they are.
pub fn assign_brute(protos: &[f32], block: usize, blocks: &[f32], out: &mut [u32]) {
    par::for_chunks(out, 1, |start, chunk| {
        for (j, a) in chunk.iter_mut().enumerate() {
            if let Some(q) = held_block(blocks, block, start + j) {
                *a = nearest_brute(protos, block, q).0;
            }
        }
    });
}

/// Block `b` of `blocks` (rows of `block` values), when it holds one.
pub(crate) fn held_block(blocks: &[f32], block: usize, b: usize) -> Option<&[f32]> {
    let start = b.checked_mul(block)?;
    blocks.get(start..start.checked_add(block)?)
}

/// Picks up to `max` blocks spread evenly over `blocks` (a deterministic sample).
pub(crate) fn sample(blocks: &[f32], block: usize, max: usize, rng: &mut Rng) -> Vec<f32> {
    let n = blocks.len() / block;
    if n <= max {
        return blocks.to_vec();
    }
    let mut out = Vec::with_capacity(max * block);
    let step = n as f64 / max as f64;
    for i in 0..max {
        // Jittered systematic sample: one block from each stratum.
        let b = ((i as f64 + rng.uniform()) * step) as usize;
        let b = b.min(n - 1);
        out.extend_from_slice(&blocks[b * block..(b + 1) * block]);
    }
    out
}

/// Learns `k` prototypes of `block` values from `data` (a sample of blocks): k-means++ seeding,
/// then `iters` Lloyd iterations. Fewer distinct blocks than `k` leaves the extra prototypes as
/// copies of existing ones (harmless: never closer than the original).
///
/// # Errors
/// [`HdcError::InvalidParams`] unless `block` is 1..=[`MAX_BLOCK`](crate::codebook::MAX_BLOCK)
/// and `k` 1..=[`MAX_PROTOTYPES`](crate::codebook::MAX_PROTOTYPES).
pub fn train(data: &[f32], block: usize, k: usize, iters: usize, seed: u64) -> Result<Vec<f32>> {
    use crate::codebook::{MAX_BLOCK, MAX_PROTOTYPES};
    if !(1..=MAX_BLOCK).contains(&block) || !(1..=MAX_PROTOTYPES).contains(&k) {
        return Err(HdcError::InvalidParams {
            message: format!(
                "k-means of {k} prototypes of {block} values: use 1..={MAX_PROTOTYPES} of 1..={MAX_BLOCK}"
            ),
        });
    }
    let n = data.len() / block;
    let mut rng = Rng::new(seed);
    if n == 0 {
        return Ok(vec![0.0; k * block]);
    }
    let mut protos = Vec::with_capacity(k * block);
    // k-means++ on a strided subsample of at most 8k blocks (seeding is O(k · n)): each new
    // seed drawn with probability proportional to D².
    let stride = n.div_ceil(8 * k.max(1)).max(1);
    let seeding: Vec<f32> = data
        .chunks_exact(block)
        .step_by(stride)
        .flatten()
        .copied()
        .collect();
    let data_all = data;
    let data = &seeding[..];
    let n = data.len() / block;
    let first = rng.below(n);
    protos.extend_from_slice(&data[first * block..(first + 1) * block]);
    let mut d2: Vec<f32> = data
        .chunks_exact(block)
        .map(|b| dist2(b, &protos[..block]))
        .collect();
    for _ in 1..k {
        let total: f64 = d2.iter().map(|&d| d as f64).sum();
        let pick = if total > 0.0 {
            let mut target = rng.uniform() * total;
            let mut pick = n - 1;
            for (i, &d) in d2.iter().enumerate() {
                target -= d as f64;
                if target <= 0.0 {
                    pick = i;
                    break;
                }
            }
            pick
        } else {
            rng.below(n)
        };
        let start = protos.len();
        protos.extend_from_slice(&data[pick * block..(pick + 1) * block]);
        let p = protos[start..].to_vec();
        for (d, b) in d2.iter_mut().zip(data.chunks_exact(block)) {
            *d = d.min(dist2(b, &p));
        }
    }
    let data = data_all;
    let n = data.len() / block;
    let mut assign = vec![0u32; n];
    for _ in 0..iters {
        assign_brute(&protos, block, data, &mut assign);
        let mut sums = vec![0f64; k * block];
        let mut counts = vec![0u32; k];
        for (b, &a) in data.chunks_exact(block).zip(&assign) {
            counts[a as usize] += 1;
            for (s, &x) in sums[a as usize * block..][..block].iter_mut().zip(b) {
                *s += x as f64;
            }
        }
        for c in 0..k {
            let p = &mut protos[c * block..(c + 1) * block];
            if counts[c] == 0 {
                // Empty cluster: reseed at a random sample block.
                let r = rng.below(n);
                p.copy_from_slice(&data[r * block..(r + 1) * block]);
            } else {
                for (x, s) in p.iter_mut().zip(&sums[c * block..(c + 1) * block]) {
                    *x = (*s / counts[c] as f64) as f32;
                }
            }
        }
    }
    Ok(protos)
}
