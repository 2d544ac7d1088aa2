//! hypercodec-trellis: bitshift trellis-coded quantization (the QTIP construction) of
//! sequences of approximately Gaussian values, at a fixed rate of `K` bits per value.
//!
//! Key design decision: the code is *computed*, not stored. The state is the last `L` bits of
//! the bit stream; each value shifts in `K` new bits, and its reconstruction is a cheap
//! pseudo-Gaussian function of the state ([`code_value`]: an affine map of the state modulo
//! 2^32, then the sum of its four bytes — QTIP's "1MAD"), so decoding a value is a shift, a
//! mask and a few integer operations, and any value decodes from the `L`-bit window that ends
//! at its bits. The encoder is a Viterbi search over the 2^L states whose cost per value is
//! O(2^L), not O(2^L·2^K): the states that share their predecessors (the same low `L − K`
//! bits) share one minimum. Sequences are *tail-biting* — the state before the first value is
//! made of the stream's last bits — so no start state is stored: a sequence of `n` values is
//! exactly `n·K` bits.
//!
//! ```
//! use hypercodec_trellis::{decode, encode, TrellisParams};
//! let x: Vec<f32> = (0..256).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 290.0).collect();
//! let p = TrellisParams { l: 10, k: 2, scale: TrellisParams::default_scale(10, 2) };
//! let bits = encode(&x, &p)?;
//! assert_eq!(bits.len(), 256 * 2 / 8);
//! let y = decode(&bits, x.len(), &p)?;
//! let snr = 10.0 * (x.iter().map(|v| v * v).sum::<f32>()
//!     / x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum::<f32>()).log10();
//! assert!(snr > 9.0, "{snr}");
//! # Ok::<(), hypercodec_trellis::TrellisError>(())
//! ```
#![deny(missing_docs)]

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TrellisError {
    /// `L` or `K` is out of range.
    #[error("trellis L = {l}, K = {k}: use 8 <= L <= 16 and 1 <= K <= 8 with K < L")]
    InvalidParams {
        /// State bits.
        l: u8,
        /// Bits per value.
        k: u8,
    },
    /// A sequence is shorter than the state (`n·K < L`), so it cannot bite its own tail.
    #[error("a sequence of {n} values at {k} bits is shorter than the {l}-bit state")]
    TooShort {
        /// Values.
        n: usize,
        /// Bits per value.
        k: u8,
        /// State bits.
        l: u8,
    },
    /// A value is NaN or infinite.
    #[error("value {index} is not finite")]
    NonFinite {
        /// Its position.
        index: usize,
    },
    /// The bit stream does not have `n·K` bits (rounded up to bytes).
    #[error("{n} values at {k} bits need {expected} bytes, got {actual}")]
    Length {
        /// Values.
        n: usize,
        /// Bits per value.
        k: u8,
        /// Bytes needed.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
}

/// Result alias of this crate.
pub type Result<T, E = TrellisError> = std::result::Result<T, E>;

/// The parameters of a trellis code.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrellisParams {
    /// State bits `L` (8..=16). The encoder's work per value grows as 2^L. By default, 12.
    pub l: u8,
    /// Bits per value `K` (1..=8, below `L`). By default, 2.
    pub k: u8,
    /// The reconstruction of state `s` is `scale · code_value(s)`, for unit-variance input. By
    /// default, [`TrellisParams::default_scale`] of `l` and `k`.
    pub scale: f32,
}

impl Default for TrellisParams {
    fn default() -> Self {
        TrellisParams {
            l: 12,
            k: 2,
            scale: Self::default_scale(12, 2),
        }
    }
}

impl TrellisParams {
    /// The scale that minimizes the squared error on unit Gaussian input, measured offline
    /// (`cargo run --release -p hypercodec-trellis --example scales 8 10 12`: a golden-section
    /// search on 4096 values in sequences of 256); for other `(l, k)`, 1.0.
    pub fn default_scale(l: u8, k: u8) -> f32 {
        SCALES
            .iter()
            .find(|&&(a, b, _)| a == l && b == k)
            .map_or(1.0, |&(_, _, s)| s)
    }

    fn check(&self, n: usize) -> Result<()> {
        if !(8..=16).contains(&self.l) || !(1..=8).contains(&self.k) || self.k >= self.l {
            return Err(TrellisError::InvalidParams {
                l: self.l,
                k: self.k,
            });
        }
        if n * (self.k as usize) < self.l as usize {
            return Err(TrellisError::TooShort {
                n,
                k: self.k,
                l: self.l,
            });
        }
        Ok(())
    }
}

/// Boundaries (low `L − K` bits) from the wrap-around lap tried as fixed starts, beside lap
/// 1's end and start: each costs one Viterbi pass.
const BOUNDARY_CANDIDATES: usize = 4;

/// Up to this many possible boundaries (2^(L−K)), every one is tried.
const EXHAUSTIVE_BOUNDARIES: usize = 64;

/// Measured best scales `(L, K, scale)` for unit Gaussian input.
const SCALES: &[(u8, u8, f32)] = &[
    (8, 1, 0.8790),
    (8, 2, 1.0619),
    (8, 3, 1.1632),
    (8, 4, 1.2007),
    (10, 1, 0.8835),
    (10, 2, 1.0375),
    (10, 3, 1.1441),
    (10, 4, 1.1941),
    (12, 1, 0.8566),
    (12, 2, 1.0087),
    (12, 3, 1.0993),
    (12, 4, 1.2145),
];

/// The pseudo-Gaussian value of a state: `x = 34038481·s + 76625530 (mod 2^32)`, then the sum
/// of the four bytes of `x` minus their mean (510), divided by their standard deviation
/// (√(4·(256²−1)/12) ≈ 147.8): approximately N(0, 1) over the states (QTIP's 1MAD code).
#[inline(always)]
pub fn code_value(state: u32) -> f32 {
    let x = state.wrapping_mul(34_038_481).wrapping_add(76_625_530);
    let s = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24);
    (s as f32 - 510.0) * (1.0 / 147.8019)
}

/// Encodes `x` (about unit variance) into `x.len()·K` bits, LSB-first, by a tail-biting
/// Viterbi search (two passes: the first finds the best path from any start, the second
/// fixes the start to the bits that path ends with).
pub fn encode(x: &[f32], p: &TrellisParams) -> Result<Vec<u8>> {
    p.check(x.len())?;
    if let Some(index) = x.iter().position(|v| !v.is_finite()) {
        return Err(TrellisError::NonFinite { index });
    }
    let (l, k) = (p.l as u32, p.k as u32);
    let states = 1usize << l;
    let low_bits = l - k;
    let low_mask = (1u32 << low_bits) - 1;
    let values: Vec<f32> = (0..states as u32)
        .map(|s| p.scale * code_value(s))
        .collect();
    let mut viterbi = Viterbi::new(states, 1usize << low_bits, x.len());
    // Lap 1: any start. Lap 2 (wrap-around Viterbi): the pre-states start with lap 1's final
    // metrics, so its survivors have seen the sequence's end before its start — its best end
    // is a good guess of where a circular path crosses the boundary. Then, for each candidate
    // boundary (lap 2's end, lap 1's end, lap 1's start), a pass with the start fixed and only
    // the agreeing ends allowed gives a true tail-biting path; the cheapest wins.
    let (end1, _) = viterbi.run(x, &values, k, low_bits, Start::Free);
    let (_, pre1) = viterbi.traceback(end1, k, low_bits);
    viterbi.run(x, &values, k, low_bits, Start::Carry);
    // Lap 2's cheapest ends, by distinct low bits (the boundary they imply).
    let mut ends: Vec<(f32, u32)> = viterbi
        .cost
        .iter()
        .enumerate()
        .map(|(s, &c)| (c, s as u32 & low_mask))
        .collect();
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut candidates: Vec<u32> = Vec::new();
    for (_, low) in ends {
        if !candidates.contains(&low) {
            candidates.push(low);
        }
        if candidates.len() == BOUNDARY_CANDIDATES {
            break;
        }
    }
    candidates.extend([end1 & low_mask, pre1 & low_mask]);
    if (low_mask as usize) < EXHAUSTIVE_BOUNDARIES {
        // Few boundaries: try them all (the exact tail-biting optimum).
        candidates = (0..=low_mask).collect();
    }
    let mut best: Option<(f32, Vec<u32>)> = None;
    let mut tried = Vec::new();
    for start in candidates {
        if tried.contains(&start) {
            continue;
        }
        tried.push(start);
        let (e, cost) = viterbi.run(x, &values, k, low_bits, Start::Fixed(start));
        if best.as_ref().is_none_or(|(c, _)| cost < *c) {
            best = Some((cost, viterbi.traceback(e, k, low_bits).0));
        }
    }
    let ks = best.map(|(_, ks)| ks).unwrap_or_default();
    Ok(pack(&ks, k))
}

/// Decodes `n` values from `bits` (what [`encode`] wrote for them).
pub fn decode(bits: &[u8], n: usize, p: &TrellisParams) -> Result<Vec<f32>> {
    let mut out = vec![0f32; n];
    decode_into(bits, p, &mut out)?;
    Ok(out)
}

/// [`decode`] into `out`: value `i` is `scale · code_value(state_i)`, `state_i` the `L` bits of
/// the (circular) stream that end with value `i`'s `K` bits.
pub fn decode_into(bits: &[u8], p: &TrellisParams, out: &mut [f32]) -> Result<()> {
    let n = out.len();
    p.check(n)?;
    let (l, k) = (p.l as usize, p.k as usize);
    let total = n * k;
    let expected = total.div_ceil(8);
    if bits.len() != expected {
        return Err(TrellisError::Length {
            n,
            k: p.k,
            expected,
            actual: bits.len(),
        });
    }
    let bit = |i: usize| -> u32 { ((bits[i / 8] >> (i % 8)) & 1) as u32 };
    // The state before value 0: the stream's last L − K bits, oldest first (tail-biting).
    let mask = (1u32 << l) - 1;
    let mut state = 0u32;
    for i in total - (l - k)..total {
        state = (state << 1) | bit(i);
    }
    for (i, o) in out.iter_mut().enumerate() {
        for b in 0..k {
            state = ((state << 1) | bit(i * k + b)) & mask;
        }
        *o = p.scale * code_value(state);
    }
    Ok(())
}

/// Value `i` alone of a sequence of `n` values: the `L`-bit window of the circular stream that
/// ends with its bits (random access; equals `decode(bits, n, p)[i]`).
pub fn value_at(bits: &[u8], n: usize, p: &TrellisParams, i: usize) -> Result<f32> {
    p.check(n)?;
    let (l, k) = (p.l as usize, p.k as usize);
    let total = n * k;
    if bits.len() != total.div_ceil(8) || i >= n {
        return Err(TrellisError::Length {
            n,
            k: p.k,
            expected: total.div_ceil(8),
            actual: bits.len(),
        });
    }
    let end = i * k + k; // one past value i's last bit
    let mut state = 0u32;
    for j in 0..l {
        let pos = (end + total * 2 - l + j) % total;
        state = (state << 1) | ((bits[pos / 8] >> (pos % 8)) & 1) as u32;
    }
    Ok(p.scale * code_value(state))
}

/// Packs the `K`-bit symbols, each most significant bit first, into an LSB-first stream (so
/// the stream read bit by bit shifts each symbol into the state in order).
fn pack(ks: &[u32], k: u32) -> Vec<u8> {
    let total = ks.len() * k as usize;
    let mut out = vec![0u8; total.div_ceil(8)];
    let mut pos = 0;
    for &v in ks {
        for b in (0..k).rev() {
            if (v >> b) & 1 == 1 {
                out[pos / 8] |= 1 << (pos % 8);
            }
            pos += 1;
        }
    }
    out
}

/// One Viterbi step: `best[j]` = the minimum over the 2^K predecessors `(t << (L−K)) | j`
/// of `cost` (their `t` in `back`), then `next[s'] = best[s' >> K] + (x − v(s'))²`. Compiled
/// for AVX2 too and chosen at run time on x86-64 (the loops are branch-free so they vectorize).
fn step(
    cost: &[f32],
    best: &mut [f32],
    back: &mut [u8],
    next: &mut [f32],
    values: &[f32],
    xi: f32,
    k: u32,
) {
    #[inline(always)]
    fn imp(
        cost: &[f32],
        best: &mut [f32],
        back: &mut [u8],
        next: &mut [f32],
        values: &[f32],
        xi: f32,
        k: u32,
    ) {
        let groups = best.len();
        let fan = 1usize << k;
        best.copy_from_slice(&cost[..groups]);
        back.iter_mut().for_each(|b| *b = 0);
        for t in 1..fan {
            let block = &cost[t * groups..(t + 1) * groups];
            for ((b, bk), &c) in best.iter_mut().zip(back.iter_mut()).zip(block) {
                let take = c < *b;
                *b = if take { c } else { *b };
                *bk = if take { t as u8 } else { *bk };
            }
        }
        // The squared errors over every state first (one flat loop), then each group's best.
        for (n, &v) in next.iter_mut().zip(values) {
            let d = xi - v;
            *n = d * d;
        }
        for (ns, &b) in next.chunks_exact_mut(fan).zip(best.iter()) {
            ns.iter_mut().for_each(|n| *n += b);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(
            cost: &[f32],
            best: &mut [f32],
            back: &mut [u8],
            next: &mut [f32],
            values: &[f32],
            xi: f32,
            k: u32,
        ) {
            imp(cost, best, back, next, values, xi, k)
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { avx2(cost, best, back, next, values, xi, k) };
        }
    }
    imp(cost, best, back, next, values, xi, k)
}

/// How a Viterbi pass starts.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// Every pre-state at cost 0.
    Free,
    /// The pre-states' costs are the previous pass's final costs (wrap-around).
    Carry,
    /// Only pre-states with these low `L − K` bits; only ends with them count.
    Fixed(u32),
}

/// The Viterbi search's buffers, reused across its passes.
struct Viterbi {
    cost: Vec<f32>,
    next: Vec<f32>,
    best: Vec<f32>,
    /// Per value, per group of predecessors (their common low bits): the top `K` bits of the
    /// cheapest one.
    back: Vec<u8>,
    groups: usize,
}

impl Viterbi {
    fn new(states: usize, groups: usize, n: usize) -> Self {
        Viterbi {
            cost: vec![0.0; states],
            next: vec![0.0; states],
            best: vec![0.0; groups],
            back: vec![0; groups * n],
            groups,
        }
    }

    /// One pass; returns the cheapest final state (among those whose low bits equal `start`
    /// when the start is fixed) and its cost.
    fn run(
        &mut self,
        x: &[f32],
        values: &[f32],
        k: u32,
        low_bits: u32,
        start: Start,
    ) -> (u32, f32) {
        let groups = self.groups;
        let fan = 1usize << k;
        // Before value 0: the pre-state's low bits are free, carried over from the last pass's
        // final metrics, or fixed.
        match start {
            Start::Free => self.cost.iter_mut().for_each(|c| *c = 0.0),
            Start::Carry => {
                let min = self.cost.iter().copied().fold(f32::INFINITY, f32::min);
                self.cost.iter_mut().for_each(|c| *c -= min);
            }
            Start::Fixed(s) => {
                self.cost.iter_mut().for_each(|c| *c = f32::INFINITY);
                // Any top bits: only the low L − K bits of the pre-state are in the window.
                for t in 0..fan {
                    self.cost[(t << low_bits) | s as usize] = 0.0;
                }
            }
        }
        for (i, &xi) in x.iter().enumerate() {
            let back = &mut self.back[i * groups..(i + 1) * groups];
            step(
                &self.cost,
                &mut self.best,
                back,
                &mut self.next,
                values,
                xi,
                k,
            );
            std::mem::swap(&mut self.cost, &mut self.next);
        }
        let low_mask = (1u32 << low_bits) - 1;
        let mut end = 0u32;
        let mut best = f32::INFINITY;
        for (s, &c) in self.cost.iter().enumerate() {
            let ok = match start {
                Start::Fixed(st) => (s as u32) & low_mask == st,
                _ => true,
            };
            if ok && c < best {
                best = c;
                end = s as u32;
            }
        }
        (end, best)
    }

    /// The `K`-bit symbols of the path that ends in `end`, and the pre-state it starts from.
    fn traceback(&self, end: u32, k: u32, low_bits: u32) -> (Vec<u32>, u32) {
        let n = self.back.len() / self.groups;
        let mut ks = vec![0u32; n];
        let mut s = end;
        for i in (0..n).rev() {
            ks[i] = s & ((1 << k) - 1);
            let j = s >> k;
            let t = self.back[i * self.groups + j as usize] as u32;
            s = (t << low_bits) | j;
        }
        (ks, s)
    }
}

#[cfg(test)]
mod tests;
