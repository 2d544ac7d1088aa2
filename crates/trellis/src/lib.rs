//! hypercodec-trellis: bitshift trellis-coded quantization (the QTIP construction) of
//! sequences of approximately Gaussian values, at a fixed rate of `K` bits per value.
//!
//! Key design decision: the code is *computed*, not stored. The state is the last `L` bits of
//! the bit stream; each value shifts in `K` new bits, and its reconstruction is a cheap
//! pseudo-Gaussian function of the state ([`code_value`]: an affine map of the state modulo
//! 2^32, then the sum of its four bytes — QTIP's "1MAD"), so decoding a value is a shift, a
//! mask and a few integer operations, and any value decodes from the `L`-bit window that ends
//! at its bits (a value's state is the stream's `L`-bit window ending at its bits, read
//! little-endian). The encoder is a Viterbi search over the 2^L states whose cost per value is
//! O(2^L), not O(2^L·2^K): the states that share their predecessors (the same low `L − K`
//! bits) share one minimum, and its argmin rides in the low bits of the costs (AVX2/AVX-512,
//! bit-identical to the portable loops). Sequences are *tail-biting* — the state before the
//! first value is made of the stream's last bits — so no start state is stored: a sequence of
//! `n` values is exactly `n·K` bits. The default `L` is 16 ([`DEFAULT_L`]); the scale of each
//! `(L, K)` is calibrated on Gaussian data ([`TrellisParams::default_scale`]).
//!
//! A second code reconstructs a *pair* of values per state (`V = 2`, [`TrellisParams::pairs`]):
//! each step shifts in `2K` bits and the state's two values are the byte sums of two hashes
//! ([`pair_sums`]). A GPU decoder then spends one state extraction and two hashes per two
//! weights instead of two of each (about 22 % fewer integer instructions per weight), at
//! 0.05 dB below the 1MAD code at 2 bits and 0.3 dB at 4 (L = 16; `docs/eval/cuda_trellis_codes.md`).
//! Archives store it as a trellis encoding's `"v": 2` (`hypercodec-hwz`).
//!
//! ```
//! use hypercodec_trellis::{decode, encode, TrellisParams};
//! let x: Vec<f32> = (0..256).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 290.0).collect();
//! let p = TrellisParams::new(10, 2);
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
    /// The reconstruction scale an encoder was given is not a finite positive number.
    #[error("trellis scale must be finite and positive")]
    InvalidScale,
    /// `L` or `K` is out of range.
    #[error("trellis L = {l}, K = {k}: use 8 <= L <= 16 and 1 <= K <= 8 with K < L")]
    InvalidParams {
        /// State bits.
        l: u8,
        /// Bits per value.
        k: u8,
    },
    /// Values per state other than 1, or pairs (`V = 2`) with `K > 4` or `2K ≥ L`.
    #[error("trellis V = {v} at K = {k}, L = {l}: use V = 1, or V = 2 with K <= 4 and 2K < L")]
    InvalidValuesPerState {
        /// Values per state.
        v: u8,
        /// Bits per value.
        k: u8,
        /// State bits.
        l: u8,
    },
    /// A sequence of pairs (`V = 2`) with an odd number of values.
    #[error("a sequence of {n} values does not split into pairs (V = 2)")]
    OddLength {
        /// Values.
        n: usize,
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
    #[error("value at index {index} is not finite")]
    NonFinite {
        /// Its position.
        index: usize,
    },
    /// A value index past the sequence's end.
    #[error("value {index} of a sequence of {n}")]
    Index {
        /// The index asked for.
        index: usize,
        /// Values in the sequence.
        n: usize,
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
    /// State bits `L` (8..=16). The encoder's work per value grows as 2^L. By default, 16.
    pub l: u8,
    /// Bits per value `K` (1..=8, below `L`). By default, 2.
    pub k: u8,
    /// The reconstruction of state `s` is `scale · code_value(s)`, for unit-variance input. By
    /// default, [`TrellisParams::default_scale`] of `l` and `k`.
    pub scale: f32,
    /// Values per state (QTIP's `V`): 1, the 1MAD code ([`code_sum`]); or 2, a pair of values
    /// per state from two hashes ([`pair_sums`]), each step shifting in `2K` bits (`K ≤ 4`,
    /// sequences of an even length). A pair costs a GPU decoder one state extraction and two
    /// hashes where two 1MAD values cost two of each: about 22 % fewer integer instructions
    /// per weight, for 0.05 dB at 2 bits and 0.3 dB at 4 on Gaussian data (L = 16; the
    /// calibration table; `docs/eval/cuda_trellis_codes.md`). By default, 1.
    pub v: u8,
}

/// The default state bits: the smallest `L` whose calibrated SNR is within 0.5 dB of the
/// Gaussian bound at 2 to 4 bits (11.62 / 17.57 / 23.43 dB against 12.04 / 18.06 / 24.08).
pub const DEFAULT_L: u8 = 16;

impl Default for TrellisParams {
    fn default() -> Self {
        TrellisParams::new(DEFAULT_L, 2)
    }
}

impl TrellisParams {
    /// The reconstruction scale of `(l, k)` for unit-variance input: the fixed point of
    /// encode-then-refit on Gaussian data (`src/scale_table.rs`, written by `cargo run
    /// --release -p hypercodec-trellis --example scale_table`, checked in CI); 1.0 outside the
    /// ranges.
    pub fn default_scale(l: u8, k: u8) -> f32 {
        calibrated(SCALES, l, k).map_or(1.0, |(s, _)| s)
    }

    /// The SNR (dB) of `(l, k)` at its default scale on unit Gaussian data, as calibrated.
    pub fn calibrated_snr_db(l: u8, k: u8) -> Option<f32> {
        calibrated(SCALES, l, k).map(|(_, snr)| snr)
    }

    /// The parameters of `(l, k)` at the calibrated scale.
    pub fn new(l: u8, k: u8) -> Self {
        TrellisParams {
            l,
            k,
            scale: Self::default_scale(l, k),
            v: 1,
        }
    }

    /// The pair code (`V = 2`) of `(l, k)` at its calibrated scale ([`TrellisParams::pair_scale`]).
    pub fn pairs(l: u8, k: u8) -> Self {
        TrellisParams {
            l,
            k,
            scale: Self::pair_scale(l, k),
            v: 2,
        }
    }

    /// [`TrellisParams::default_scale`] of the pair code (`V = 2`; `K ≤ 4`, `2K < L`).
    pub fn pair_scale(l: u8, k: u8) -> f32 {
        calibrated(PAIR_SCALES, l, k).map_or(1.0, |(s, _)| s)
    }

    /// [`TrellisParams::calibrated_snr_db`] of the pair code.
    pub fn pair_snr_db(l: u8, k: u8) -> Option<f32> {
        calibrated(PAIR_SCALES, l, k).map(|(_, snr)| snr)
    }

    /// The reconstruction of `state`: `scale · code_value(state)`, computed as `sum·c1 + c0`
    /// from the code's byte sum (the form every decoder, scalar or vector, rounds alike).
    #[inline(always)]
    pub fn value(&self, state: u32) -> f32 {
        let (c1, c0) = self.affine();
        code_sum(state) as f32 * c1 + c0
    }

    /// The two reconstructions of `state` under the pair code: `sum·c1 + c0` of each of its
    /// [`pair_sums`].
    #[inline(always)]
    pub fn pair(&self, state: u32) -> [f32; 2] {
        let (c1, c0) = self.affine();
        pair_sums(state).map(|s| s as f32 * c1 + c0)
    }

    /// Bits per trellis step: `V·K`.
    #[inline(always)]
    pub fn step_bits(&self) -> usize {
        self.v as usize * self.k as usize
    }

    /// `(c1, c0)` of [`TrellisParams::value`]: `c1 = scale / 147.8`, `c0 = −510·c1`.
    #[inline(always)]
    pub fn affine(&self) -> (f32, f32) {
        let c1 = self.scale * CODE_SCALE;
        (c1, -CODE_MEAN * c1)
    }

    fn check(&self, n: usize) -> Result<()> {
        if !(8..=16).contains(&self.l) || !(1..=8).contains(&self.k) || self.k >= self.l {
            return Err(TrellisError::InvalidParams {
                l: self.l,
                k: self.k,
            });
        }
        if self.v != 1 && (self.v != 2 || self.k > 4 || 2 * self.k >= self.l) {
            return Err(TrellisError::InvalidValuesPerState {
                v: self.v,
                k: self.k,
                l: self.l,
            });
        }
        if !n.is_multiple_of(self.v as usize) {
            return Err(TrellisError::OddLength { n });
        }
        if n.saturating_mul(self.k as usize) < self.l as usize {
            return Err(TrellisError::TooShort {
                n,
                k: self.k,
                l: self.l,
            });
        }
        Ok(())
    }
}

/// Values on each side of a sequence's boundary that the first (free) pass of the tail-biting
/// search sees: survivor paths merge within a few `L/K` values, so the boundary it picks is
/// the one a pass over the whole rotated sequence would pick, at a fraction of the cost.
const BOUNDARY_WINDOW: usize = 64;

/// Sequences of up to this many values try every boundary when there are few (below, the
/// exact optimum costs at most 64 passes of a short sequence; a long one takes the two passes).
const EXHAUSTIVE_VALUES: usize = 128;

/// Up to this many possible boundaries (2^(L−K)), every one is tried.
const EXHAUSTIVE_BOUNDARIES: usize = 64;

mod scale_table;
use scale_table::{PAIR_SCALES, SCALES};

/// `(scale, SNR dB)` of `(l, k)` in a calibration table.
fn calibrated(table: &[(u8, u8, f32, f32)], l: u8, k: u8) -> Option<(f32, f32)> {
    table
        .iter()
        .find(|&&(a, b, _, _)| a == l && b == k)
        .map(|&(_, _, s, snr)| (s, snr))
}

/// The pseudo-Gaussian value of a state: `x = 34038481·s + 76625530 (mod 2^32)`, then the sum
/// of the four bytes of `x` minus their mean (510), divided by their standard deviation
/// (√(4·(256²−1)/12) ≈ 147.8): approximately N(0, 1) over the states (QTIP's 1MAD code).
#[inline(always)]
pub fn code_value(state: u32) -> f32 {
    (code_sum(state) as f32 - CODE_MEAN) * CODE_SCALE
}

/// The 1MAD code's hash of a state, `CODE_MUL·state + CODE_ADD` (mod 2^32), whose byte sum
/// is the code ([`code_sum`]); SIMD and GPU decoders use the same constants.
pub const CODE_MUL: u32 = 34_038_481;
/// See [`CODE_MUL`].
pub const CODE_ADD: u32 = 76_625_530;
/// The pair code's second hash, `PAIR_MUL·x + PAIR_ADD` (mod 2^32) of the first hash `x`
/// ([`pair_sums`]).
pub const PAIR_MUL: u32 = 0x9E37_79B9;
/// See [`PAIR_MUL`].
pub const PAIR_ADD: u32 = 0x7F4A_7C15;

/// The byte sum (0..=1020) behind [`code_value`].
#[inline(always)]
pub fn code_sum(state: u32) -> u32 {
    let x = state.wrapping_mul(CODE_MUL).wrapping_add(CODE_ADD);
    (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24)
}

/// The byte sums (each 0..=1020) behind a state's pair of values (`V = 2`): of `x`, the 1MAD
/// hash `34038481·s + 76625530`, and of `y = 0x9E3779B9·x + 0x7F4A7C15` (mod 2^32). Each is
/// approximately N(510, 147.8²) over the states, the two nearly independent.
#[inline(always)]
pub fn pair_sums(state: u32) -> [u32; 2] {
    let x = state.wrapping_mul(CODE_MUL).wrapping_add(CODE_ADD);
    let y = x.wrapping_mul(PAIR_MUL).wrapping_add(PAIR_ADD);
    [x, y].map(|z| (z & 0xFF) + ((z >> 8) & 0xFF) + ((z >> 16) & 0xFF) + (z >> 24))
}

/// The mean of [`code_sum`] over uniform states.
const CODE_MEAN: f32 = 510.0;
/// One over the standard deviation of [`code_sum`] over uniform states.
const CODE_SCALE: f32 = 1.0 / 147.8019;

/// Encodes `x` (about unit variance) into `x.len()·K` bits, LSB-first, by a tail-biting
/// Viterbi search in two passes (QTIP's approximation): the first, from any start, runs over
/// `x` rotated by half its length, so the path it finds crosses the sequence's boundary in
/// its middle; the second fixes the start of `x` to the `L − VK` bits that path holds at the
/// boundary and keeps only the ends that agree. When there are at most 64 possible boundaries
/// (`L − VK ≤ 6`) and at most 128 values, every one is tried instead (the exact tail-biting
/// optimum). With pairs (`V = 2`) a step codes two values: `2K` bits, both values' squared
/// errors.
pub fn encode(x: &[f32], p: &TrellisParams) -> Result<Vec<u8>> {
    let mut encoder = Encoder::new(p)?;
    let mut out = vec![0u8; (x.len() * p.k as usize).div_ceil(8)];
    encoder.encode_into(x, &mut out)?;
    Ok(out)
}

/// A reusable encoder: the code table of `(L, K, scale)` and the Viterbi buffers, kept across
/// sequences (building the table costs 2^L code evaluations).
pub struct Encoder {
    p: TrellisParams,
    /// `code_sum(reverse_L(s))`: the Viterbi indexes states with the newest bits lowest. With
    /// pairs, the first sums of [`pair_sums`] for every state, then the second ones.
    sums: Vec<u16>,
    viterbi: Viterbi,
    step: StepFn,
}

impl Encoder {
    /// The encoder of `p`.
    ///
    /// # Errors
    /// [`TrellisError::InvalidScale`] unless `p.scale` is finite and positive (its Viterbi
    /// costs would be NaN), and what [`encode`] lists for `L`, `K` and `V`.
    pub fn new(p: &TrellisParams) -> Result<Self> {
        if !(p.scale.is_finite() && p.scale > 0.0) {
            return Err(TrellisError::InvalidScale);
        }
        let v = p.v.max(1) as usize;
        p.check(
            (p.l as usize)
                .div_ceil(p.k.max(1) as usize)
                .next_multiple_of(v),
        )?;
        let (l, k) = (p.l as u32, p.step_bits() as u32);
        let states = 1usize << l;
        let groups = 1usize << (l - k);
        let reversed = move |s: u32| s.reverse_bits() >> (32 - l);
        let sums = if p.v == 2 {
            let pairs: Vec<[u32; 2]> = (0..states as u32).map(|s| pair_sums(reversed(s))).collect();
            (0..2)
                .flat_map(|j| pairs.iter().map(move |q| q[j] as u16))
                .collect()
        } else {
            (0..states as u32)
                .map(|s| code_sum(reversed(s)) as u16)
                .collect()
        };
        Ok(Encoder {
            p: *p,
            sums,
            viterbi: Viterbi::new(states, groups, 0),
            step: step_fn(groups, p.v == 2),
        })
    }

    /// Encodes `x` into `out`, which must hold exactly `ceil(x.len()·K / 8)` bytes (spare bits
    /// of the last byte are zero).
    pub fn encode_into(&mut self, x: &[f32], out: &mut [u8]) -> Result<()> {
        let p = self.p;
        p.check(x.len())?;
        let expected = (x.len() * p.k as usize).div_ceil(8);
        if out.len() != expected {
            return Err(TrellisError::Length {
                n: x.len(),
                k: p.k,
                expected,
                actual: out.len(),
            });
        }
        if let Some(index) = x.iter().position(|v| !v.is_finite()) {
            return Err(TrellisError::NonFinite { index });
        }
        // `k`: bits per step; `v` values a step.
        let (l, k, v) = (p.l as u32, p.step_bits() as u32, p.v as usize);
        let low_bits = l - k;
        let low_mask = (1u32 << low_bits) - 1;
        let n = x.len();
        let vt = &mut self.viterbi;
        let ks = if (low_mask as usize) < EXHAUSTIVE_BOUNDARIES && n <= EXHAUSTIVE_VALUES {
            let mut best: Option<(f64, Vec<u32>)> = None;
            for start in 0..=low_mask {
                let (e, cost) = vt.run(
                    x,
                    v,
                    &self.sums,
                    p.scale,
                    k,
                    low_bits,
                    Start::Fixed(start),
                    self.step,
                );
                if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                    best = Some((cost, vt.traceback(e, k, low_bits).0));
                }
            }
            best.map(|(_, ks)| ks).unwrap_or_default()
        } else {
            // The values around the boundary, x's end then its start (all of x, rotated by
            // half — whole steps —, when it is short).
            let w = BOUNDARY_WINDOW;
            let (rotated, before): (Vec<f32>, usize) = if n > 2 * w {
                (x[n - w..].iter().chain(&x[..w]).copied().collect(), w)
            } else {
                let h = n / 2 / v * v;
                (x[h..].iter().chain(&x[..h]).copied().collect(), n - h)
            };
            let (e, _) = vt.run(
                &rotated,
                v,
                &self.sums,
                p.scale,
                k,
                low_bits,
                Start::Free,
                self.step,
            );
            let (ks, pre) = vt.traceback(e, k, low_bits);
            // The state after x's last value.
            let mask = (1u32 << l) - 1;
            let boundary = ks[..before / v]
                .iter()
                .fold(pre, |s, &sym| ((s << k) | sym) & mask)
                & low_mask;
            let (e, _) = vt.run(
                x,
                v,
                &self.sums,
                p.scale,
                k,
                low_bits,
                Start::Fixed(boundary),
                self.step,
            );
            vt.traceback(e, k, low_bits).0
        };
        pack_into(&ks, k, out);
        Ok(())
    }
}

/// The tail-biting sequences of a row of `cols` values cut every `seq` values: `max(1,
/// cols / seq)` sequences, all of `seq` values but the last, which takes the rest (`seq` to
/// `2·seq − 1` values; the whole row when it is shorter than `seq`). With `seq` a multiple of
/// 8, every sequence starts on a byte of the row's `cols·K` bits.
pub fn row_sequences(cols: usize, seq: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let seq = seq.max(1);
    let m = (cols / seq).max(1);
    (0..m).map(move |j| j * seq..if j + 1 == m { cols } else { (j + 1) * seq })
}

/// Decodes a row of `out.len()` values whose bits are `row` (`ceil(cols·K/8)` bytes), cut into
/// the tail-biting sequences of [`row_sequences`] with `seq` values each.
pub fn decode_row(row: &[u8], seq: usize, p: &TrellisParams, out: &mut [f32]) -> Result<()> {
    let k = p.k as usize;
    for q in row_sequences(out.len(), seq) {
        let end = (q.end * k).div_ceil(8);
        let src = row.get(q.start * k / 8..end).ok_or(TrellisError::Length {
            n: out.len(),
            k: p.k,
            expected: (out.len() * k).div_ceil(8),
            actual: row.len(),
        })?;
        decode_into(src, p, &mut out[q])?;
    }
    Ok(())
}

/// Decodes `n` values from `bits` (what [`encode`] wrote for them).
pub fn decode(bits: &[u8], n: usize, p: &TrellisParams) -> Result<Vec<f32>> {
    check_stream(bits, n, p)?; // (before `n` values are allocated: `n` is the caller's)
    let mut out = vec![0f32; n];
    decode_into(bits, p, &mut out)?;
    Ok(out)
}

/// The state of value `i` of a stream of `total` bits whose first `l` bits' window would start
/// before bit 0: the `L` bits of the circular stream that end with value `i`'s bits, read as
/// a little-endian integer (the oldest bit lowest).
/// (`end` < `l` ≤ `total`: the stream's last `l − end` bits, then its first `end`.)
#[inline]
fn wrapped_state(bits: &[u8], total: usize, l: usize, end: usize) -> u32 {
    let tail = l - end;
    window(bits, total - tail, tail as u32) | (window(bits, 0, end as u32) << tail)
}

/// The `L`-bit window of `bits` that starts at bit `start` (the stream holds bits up to
/// `start + L`), as a little-endian integer: the state of the value whose bits end at
/// `start + L` (when its window does not wrap). Bits past the stream read as 0; `L` up to 24
/// (the 4 bytes read hold `start % 8 + L` bits).
#[inline(always)]
pub fn window(bits: &[u8], start: usize, l: u32) -> u32 {
    let byte = start / 8;
    let mut w = [0u8; 4];
    let avail = bits.len().saturating_sub(byte).min(4);
    if let Some(src) = bits.get(byte..byte + avail) {
        w[..avail].copy_from_slice(src);
    }
    let mask = 1u32.checked_shl(l).map_or(u32::MAX, |m| m - 1);
    (u32::from_le_bytes(w) >> (start % 8)) & mask
}

/// [`decode`] into `out`: value `i` is `scale · code_value(state_i)`, `state_i` the `L` bits of
/// the (circular) stream that end with value `i`'s `K` bits, read as a little-endian integer.
/// With pairs (`V = 2`), values `2j` and `2j + 1` are [`TrellisParams::pair`] of the state that
/// ends with step `j`'s `2K` bits.
pub fn decode_into(bits: &[u8], p: &TrellisParams, out: &mut [f32]) -> Result<()> {
    let n = out.len();
    check_stream(bits, n, p)?;
    if p.v == 2 {
        decode_pairs_into(bits, p, out);
        return Ok(());
    }
    let (l, k) = (p.l as usize, p.k as usize);
    let total = n * k;
    if total <= 64 {
        // A short sequence (calibrated rows: 16 values): the stream doubled in one integer
        // (`S ‖ S`), so every window, wrapped or not, is a shift and a mask.
        let mut b = [0u8; 8];
        b[..bits.len()].copy_from_slice(bits);
        // Only the stream's own bits (a last byte may carry others).
        let s = u64::from_le_bytes(b) as u128 & ((1u128 << total) - 1);
        let d = s | (s << total);
        let mask = (1u128 << l) - 1;
        for (i, o) in out.iter_mut().enumerate() {
            *o = p.value(((d >> (total + (i + 1) * k - l)) & mask) as u32);
        }
        return Ok(());
    }
    // Values whose window wraps around the stream's start.
    let first = (l - k).div_ceil(k).min(n);
    for (i, o) in out[..first].iter_mut().enumerate() {
        *o = p.value(wrapped_state(bits, total, l, i * k + k));
    }
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut i = first;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA; `bits` holds `n·K` bits and `first` is past the
        // wrapped windows (checked above).
        i = unsafe { x86::decode_windows(bits, p, first, out) };
    }
    for (i, o) in out.iter_mut().enumerate().skip(i) {
        *o = p.value(window(bits, i * k + k - l, l as u32));
    }
    Ok(())
}

/// [`decode_into`] for pairs (the stream checked).
fn decode_pairs_into(bits: &[u8], p: &TrellisParams, out: &mut [f32]) {
    let (l, sb) = (p.l as usize, p.step_bits());
    let total = out.len() * p.k as usize;
    // Steps whose windows wrap, then (AVX2) eight steps at a time, then the rest.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    let first = (l - sb).div_ceil(sb).min(out.len() / 2);
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut simd_from = out.len() / 2;
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut simd_to = simd_from;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA; `bits` holds the stream's bits (checked by the
        // caller) and steps from `first` on do not wrap.
        simd_to = unsafe { x86::decode_pair_windows(bits, p, first, out) };
        simd_from = first;
    }
    for (j, o) in out.chunks_exact_mut(2).enumerate() {
        if (simd_from..simd_to).contains(&j) {
            continue;
        }
        let end = j * sb + sb;
        let state = if end >= l {
            window(bits, end - l, l as u32)
        } else {
            wrapped_state(bits, total, l, end)
        };
        o.copy_from_slice(&p.pair(state));
    }
}

fn check_stream(bits: &[u8], n: usize, p: &TrellisParams) -> Result<()> {
    p.check(n)?;
    // (Saturated: an `n` whose bits pass usize needs more bytes than any stream holds.)
    let expected = n.saturating_mul(p.k as usize).div_ceil(8);
    if bits.len() != expected {
        return Err(TrellisError::Length {
            n,
            k: p.k,
            expected,
            actual: bits.len(),
        });
    }
    Ok(())
}

/// Value `i` alone of a sequence of `n` values: the `L`-bit window of the circular stream that
/// ends with its bits (random access; equals `decode(bits, n, p)[i]`).
pub fn value_at(bits: &[u8], n: usize, p: &TrellisParams, i: usize) -> Result<f32> {
    check_stream(bits, n, p)?;
    if i >= n {
        return Err(TrellisError::Index { index: i, n });
    }
    let (l, k, v) = (p.l as usize, p.k as usize, p.v as usize);
    // The end of the step that holds value i.
    let end = (i / v + 1) * v * k;
    let state = if end >= l {
        window(bits, end - l, l as u32)
    } else {
        wrapped_state(bits, n * k, l, end)
    };
    Ok(if v == 2 {
        p.pair(state)[i % 2]
    } else {
        p.value(state)
    })
}

/// Packs the `K`-bit symbols of the Viterbi (whose state keeps the newest bits lowest), each
/// most significant bit first, into an LSB-first stream: so the stream's `L`-bit window read
/// little-endian is the bit reversal of the Viterbi's state.
fn pack_into(ks: &[u32], k: u32, out: &mut [u8]) {
    out.iter_mut().for_each(|b| *b = 0);
    let mut pos = 0;
    for &v in ks {
        for b in (0..k).rev() {
            if (v >> b) & 1 == 1 {
                out[pos / 8] |= 1 << (pos % 8);
            }
            pos += 1;
        }
    }
}

/// One Viterbi step over tagged costs (with pairs, `K` here is a step's `2K` bits). A cost is the bit pattern of a non-negative `f32` whose
/// low `K` bits are replaced by a *tag*: the top `K` bits of its state, i.e. which of the 2^K
/// predecessors of its successors it is. The minimum over a group of predecessors
/// `(t << (L−K)) | j`, taken on the bit patterns (which order like the floats), so carries its
/// argmin in its low bits: `back[j]` = that `t`. Then `next[s'] = tag(best[s' >> K] − sub +
/// (x − v(s'))²)`; the return value is the smallest `best` (tagged). `next` is at least that,
/// less `sub`: the caller subtracts the difference, less one, in the following step, so the
/// costs stay small (≥ 1) and their lost `K` bits of precision far below one value's squared
/// error.
type StepFn = unsafe fn(&[u32], &mut [u8], &mut [u32], &[u16], Point, u32, f32) -> u32;

/// The value being coded, as the step sees it: the squared error of state `s` is
/// `(xc − sum(s)·c1)²` (one fused multiply-add), `sum(s)` its code's byte sum ([`code_sum`]),
/// `c1 = scale / 147.8`, `xc = x + 510·c1`. With pairs, `xc2` is the second value's, and the
/// second squared error is added by a second fused multiply-add.
#[derive(Debug, Clone, Copy)]
struct Point {
    xc: f32,
    c1: f32,
    xc2: f32,
}

/// A finite stand-in for an infinite cost (tagging the bits of infinity would make a NaN).
const FORBIDDEN: f32 = 1e30;

/// The fastest step this CPU runs for `groups` predecessor groups (of one value per state,
/// or of `pairs`): AVX-512 (16 groups at a time), AVX2 (8), or the portable loops.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn step_fn(groups: usize, pairs: bool) -> StepFn {
    #[cfg(target_arch = "x86_64")]
    {
        if groups >= 16
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::env::var_os("HYPERCODEC_NO_AVX512").is_none()
        {
            return if pairs {
                x86::step512::<2>
            } else {
                x86::step512::<1>
            };
        }
        if groups >= 8
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
        {
            return if pairs {
                x86::step_avx2::<2>
            } else {
                x86::step_avx2::<1>
            };
        }
    }
    if pairs {
        step_portable::<2>
    } else {
        step_portable::<1>
    }
}

/// The tag of state `s` (its top `K` bits) on the cost `c`.
#[inline(always)]
fn tagged(c: f32, s: usize, k: u32, top: u32) -> u32 {
    (c.to_bits() & !((1u32 << k) - 1)) | (s >> top) as u32
}

/// The portable step (also the reference the SIMD steps are tested against); `V` values a
/// state (`sums` holds `V` sums a state, the first of every state first).
///
/// # Safety
/// None needed; `unsafe` only to share [`StepFn`]'s type.
unsafe fn step_portable<const V: usize>(
    cost: &[u32],
    back: &mut [u8],
    next: &mut [u32],
    sums: &[u16],
    x: Point,
    k: u32,
    sub: f32,
) -> u32 {
    let groups = back.len();
    let states = cost.len();
    let fan = 1usize << k;
    let tm = (fan - 1) as u32;
    let top = (groups * fan).trailing_zeros() - k;
    let mut low = u32::MAX;
    for j in 0..groups {
        let m = (0..fan)
            .map(|t| cost[t * groups + j])
            .min()
            .unwrap_or(u32::MAX);
        back[j] = (m & tm) as u8;
        low = low.min(m);
        let b = f32::from_bits(m & !tm) - sub;
        for q in 0..fan {
            let s = j * fan + q;
            let d = (-(sums[s] as f32)).mul_add(x.c1, x.xc);
            let mut c = d.mul_add(d, b);
            if V == 2 {
                let d2 = (-(sums[states + s] as f32)).mul_add(x.c1, x.xc2);
                c = d2.mul_add(d2, c);
            }
            next[s] = tagged(c, s, k, top);
        }
    }
    low
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The Viterbi step in AVX2 and AVX-512: per block of 8 (16) predecessor groups, the
    //! unsigned minimum over the 2^K slabs of tagged costs (the argmin rides in the tag), then
    //! the block's 8·2^K (16·2^K) successor costs, each vector's group minima spread by a lane
    //! permutation, tagged and stored.
    use std::arch::x86_64::*;

    /// Decodes values `first..` of a sequence (their windows do not wrap) eight at a time:
    /// each lane gathers the 4 bytes that hold its window, shifts and masks it, and computes
    /// the 1MAD code (a multiply, then the byte sum by two multiply-adds). Returns where it
    /// stopped (the last values, whose 4 bytes would pass the stream's end, are left).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `bits` holds at least `out.len()·K` bits and
    /// `first·K + K ≥ L`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn decode_windows(
        bits: &[u8],
        p: &super::TrellisParams,
        first: usize,
        out: &mut [f32],
    ) -> usize {
        let (l, k) = (p.l as usize, p.k as usize);
        let n = out.len();
        let mul = _mm256_set1_epi32(super::CODE_MUL as i32);
        let add = _mm256_set1_epi32(super::CODE_ADD as i32);
        let (c1, c0) = p.affine();
        let (c1, c0) = (_mm256_set1_ps(c1), _mm256_set1_ps(c0));
        let mut i = first;
        // Value i's window starts at bit (i + 1)·K − L; lane j's 4 bytes end before
        // ((i + j + 1)·K − L) / 8 + 4, which must be ≤ bits.len().
        while i + 8 <= n && ((i + 8) * k - l) / 8 + 4 <= bits.len() {
            // SAFETY: every lane's 4 bytes lie in `bits` (the loop condition).
            let state = unsafe { states8(bits, (i + 1) * k - l, k, l) };
            let x = _mm256_add_epi32(_mm256_mullo_epi32(state, mul), add);
            let sum = byte_sums(x);
            // Multiply, then add: the rounding of TrellisParams::value.
            let v = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), c1), c0);
            // SAFETY: i + 8 ≤ n.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(i), v) };
            i += 8;
        }
        i
    }

    /// The `l`-bit windows that start at bits `start + q·stride` of `bits` (q = 0..8), read
    /// little-endian, one a lane.
    ///
    /// # Safety
    /// The CPU must have AVX2; every lane's 4 bytes from `(start + q·stride) / 8` lie in `bits`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn states8(bits: &[u8], start: usize, stride: usize, l: usize) -> __m256i {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let start = _mm256_add_epi32(
            _mm256_set1_epi32(start as i32),
            _mm256_mullo_epi32(lanes, _mm256_set1_epi32(stride as i32)),
        );
        let byte = _mm256_srli_epi32::<3>(start);
        // SAFETY: the caller's bound.
        let w = unsafe { _mm256_i32gather_epi32::<1>(bits.as_ptr() as *const i32, byte) };
        let shift = _mm256_and_si256(start, _mm256_set1_epi32(7));
        let mask = _mm256_set1_epi32(((1u32 << l) - 1) as i32);
        _mm256_and_si256(_mm256_srlv_epi32(w, shift), mask)
    }

    /// Each lane's four bytes summed (0..=1020): the 1MAD code's byte sum.
    #[target_feature(enable = "avx2,fma")]
    fn byte_sums(x: __m256i) -> __m256i {
        _mm256_madd_epi16(
            _mm256_maddubs_epi16(x, _mm256_set1_epi8(1)),
            _mm256_set1_epi16(1),
        )
    }

    /// Decodes pairs (`V = 2`) from step `first` on (their windows do not wrap) eight steps at
    /// a time, as [`decode_windows`] does values: each lane gathers its window, hashes it
    /// twice, sums the bytes of both hashes, and the two values are interleaved into `out`.
    /// Returns the step where it stopped.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `bits` holds at least `out.len()·K` bits and
    /// `(first + 1)·2K ≥ L`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn decode_pair_windows(
        bits: &[u8],
        p: &super::TrellisParams,
        first: usize,
        out: &mut [f32],
    ) -> usize {
        let (l, sb) = (p.l as usize, p.step_bits());
        let steps = out.len() / 2;
        let m1 = _mm256_set1_epi32(super::CODE_MUL as i32);
        let a1 = _mm256_set1_epi32(super::CODE_ADD as i32);
        let m2 = _mm256_set1_epi32(super::PAIR_MUL as i32);
        let a2 = _mm256_set1_epi32(super::PAIR_ADD as i32);
        let (c1, c0) = p.affine();
        let (c1, c0) = (_mm256_set1_ps(c1), _mm256_set1_ps(c0));
        let mut j = first;
        // Step j's window starts at bit (j + 1)·2K − L; lane q's 4 bytes end before
        // ((j + q + 1)·2K − L) / 8 + 4, which must be ≤ bits.len().
        while j + 8 <= steps && ((j + 8) * sb - l) / 8 + 4 <= bits.len() {
            // SAFETY: every lane's 4 bytes lie in `bits` (the loop condition).
            let state = unsafe { states8(bits, (j + 1) * sb - l, sb, l) };
            let x = _mm256_add_epi32(_mm256_mullo_epi32(state, m1), a1);
            let y = _mm256_add_epi32(_mm256_mullo_epi32(x, m2), a2);
            // Multiply, then add: the rounding of TrellisParams::pair.
            let value = |s| _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), c1), c0);
            let (v0, v1) = (value(byte_sums(x)), value(byte_sums(y)));
            // [a0 b0 a1 b1 | a4 b4 a5 b5] and [a2 b2 a3 b3 | a6 b6 a7 b7] → steps in order.
            let (lo, hi) = (_mm256_unpacklo_ps(v0, v1), _mm256_unpackhi_ps(v0, v1));
            let first_four = _mm256_permute2f128_ps::<0x20>(lo, hi);
            let last_four = _mm256_permute2f128_ps::<0x31>(lo, hi);
            // SAFETY: j + 8 ≤ steps, so values 2j..2j + 16 lie in `out`.
            unsafe {
                _mm256_storeu_ps(out.as_mut_ptr().add(2 * j), first_four);
                _mm256_storeu_ps(out.as_mut_ptr().add(2 * j + 8), last_four);
            }
            j += 8;
        }
        j
    }

    /// Lane permutations kept in registers (every one up to K = 4).
    const SELS: usize = 16;

    /// # Safety
    /// The CPU must have AVX2 and FMA; `back.len()` (the groups) ≥ 8 and a power of two;
    /// `cost`, `next` of `groups << k` values, `sums` of `V` times that.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn step_avx2<const V: usize>(
        cost: &[u32],
        back: &mut [u8],
        next: &mut [u32],
        sums: &[u16],
        x: super::Point,
        k: u32,
        sub: f32,
    ) -> u32 {
        let groups = back.len();
        let fan = 1usize << k;
        assert!(groups >= 8 && cost.len() == groups * fan && next.len() == cost.len());
        assert!(sums.len() == V * cost.len());
        let states = cost.len();
        let top = (groups * fan).trailing_zeros() - k;
        let xv = _mm256_set1_ps(x.xc);
        let xv2 = _mm256_set1_ps(x.xc2);
        let c1 = _mm256_set1_ps(x.c1);
        let subv = _mm256_set1_ps(sub);
        let tm = _mm256_set1_epi32((fan - 1) as i32);
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let shift = _mm_cvtsi32_si128(k as i32);
        let c = cost.as_ptr() as *const __m256i;
        let v = sums.as_ptr();
        let nx = next.as_mut_ptr() as *mut __m256i;
        let mut low = _mm256_set1_epi32(-1);
        // The lane permutations of the first vectors of a block, and whether a block's
        // successors share one tag (8·2^K states within one slab of 2^(L−K)).
        let mut sels = [_mm256_setzero_si256(); SELS];
        for (q, sel) in sels.iter_mut().enumerate().take(fan) {
            *sel = _mm256_srl_epi32(
                _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * q as i32)),
                shift,
            );
        }
        let one_tag = 8 * fan <= groups;
        // SAFETY (all loads and stores): j0 + 8 ≤ groups, t < fan, q < fan, so every index is
        // below groups·fan, the length of cost, values and next (asserted above).
        unsafe {
            for j0 in (0..groups).step_by(8) {
                let mut m = _mm256_loadu_si256(c.byte_add(4 * j0));
                for t in 1..fan {
                    m = _mm256_min_epu32(m, _mm256_loadu_si256(c.byte_add(4 * (t * groups + j0))));
                }
                let idx = _mm256_and_si256(m, tm);
                let p = _mm256_packus_epi32(idx, idx);
                let p = _mm256_packus_epi16(p, p);
                let lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(p)) as u32 as u64;
                let hi = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(p)) as u32 as u64;
                back[j0..j0 + 8].copy_from_slice(&(lo | hi << 32).to_le_bytes());
                low = _mm256_min_epu32(low, m);
                let b = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_andnot_si256(tm, m)), subv);
                let base = j0 * fan;
                let block_tag = _mm256_set1_epi32((base >> top) as i32);
                #[allow(clippy::needless_range_loop)] // q also offsets the states
                for q in 0..fan {
                    let sel = if q < SELS {
                        sels[q]
                    } else {
                        _mm256_srl_epi32(
                            _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * q as i32)),
                            shift,
                        )
                    };
                    let bq = _mm256_permutevar8x32_ps(b, sel);
                    let sum =
                        _mm256_cvtepu16_epi32(_mm_loadu_si128(v.add(base + 8 * q) as *const _));
                    let d = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(sum), c1, xv);
                    let mut n = _mm256_fmadd_ps(d, d, bq);
                    if V == 2 {
                        let sum2 = _mm256_cvtepu16_epi32(_mm_loadu_si128(
                            v.add(states + base + 8 * q) as *const _,
                        ));
                        let d2 = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(sum2), c1, xv2);
                        n = _mm256_fmadd_ps(d2, d2, n);
                    }
                    let n = _mm256_castps_si256(n);
                    let tag = if one_tag {
                        block_tag
                    } else {
                        _mm256_set1_epi32(((base + 8 * q) >> top) as i32)
                    };
                    let n = _mm256_or_si256(_mm256_andnot_si256(tm, n), tag);
                    _mm256_storeu_si256(nx.byte_add(4 * (base + 8 * q)), n);
                }
            }
        }
        let mut lanes_out = [0u32; 8];
        // SAFETY: 8 lanes into 8 u32.
        unsafe { _mm256_storeu_si256(lanes_out.as_mut_ptr() as *mut __m256i, low) };
        lanes_out.into_iter().min().unwrap_or(u32::MAX)
    }

    /// # Safety
    /// As [`step_avx2`], with AVX-512 F and BW and at least 16 groups.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    pub(super) unsafe fn step512<const V: usize>(
        cost: &[u32],
        back: &mut [u8],
        next: &mut [u32],
        sums: &[u16],
        x: super::Point,
        k: u32,
        sub: f32,
    ) -> u32 {
        let groups = back.len();
        let fan = 1usize << k;
        assert!(groups >= 16 && cost.len() == groups * fan && next.len() == cost.len());
        assert!(sums.len() == V * cost.len());
        let states = cost.len();
        let top = (groups * fan).trailing_zeros() - k;
        let xv = _mm512_set1_ps(x.xc);
        let xv2 = _mm512_set1_ps(x.xc2);
        let c1 = _mm512_set1_ps(x.c1);
        let subv = _mm512_set1_ps(sub);
        let tm = _mm512_set1_epi32((fan - 1) as i32);
        let keep = _mm512_set1_epi32(!((fan - 1) as u32) as i32);
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let shift = _mm_cvtsi32_si128(k as i32);
        let c = cost.as_ptr();
        let v = sums.as_ptr();
        let nx = next.as_mut_ptr();
        let mut low = _mm512_set1_epi32(-1);
        let mut sels = [_mm512_setzero_si512(); SELS];
        for (q, sel) in sels.iter_mut().enumerate().take(fan) {
            *sel = _mm512_srl_epi32(
                _mm512_add_epi32(lanes, _mm512_set1_epi32(16 * q as i32)),
                shift,
            );
        }
        let one_tag = 16 * fan <= groups;
        // SAFETY: as in step_avx2, with blocks of 16 groups.
        unsafe {
            for j0 in (0..groups).step_by(16) {
                let mut m = _mm512_loadu_si512(c.add(j0) as *const _);
                for t in 1..fan {
                    m = _mm512_min_epu32(m, _mm512_loadu_si512(c.add(t * groups + j0) as *const _));
                }
                _mm_storeu_si128(
                    back.as_mut_ptr().add(j0) as *mut __m128i,
                    _mm512_cvtepi32_epi8(_mm512_and_si512(m, tm)),
                );
                low = _mm512_min_epu32(low, m);
                let b = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_and_si512(m, keep)), subv);
                let base = j0 * fan;
                let block_tag = _mm512_set1_epi32((base >> top) as i32);
                #[allow(clippy::needless_range_loop)] // q also offsets the states
                for q in 0..fan {
                    let sel = if q < SELS {
                        sels[q]
                    } else {
                        _mm512_srl_epi32(
                            _mm512_add_epi32(lanes, _mm512_set1_epi32(16 * q as i32)),
                            shift,
                        )
                    };
                    let bq = _mm512_permutexvar_ps(sel, b);
                    let sum =
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256(v.add(base + 16 * q) as *const _));
                    let d = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(sum), c1, xv);
                    let mut n = _mm512_fmadd_ps(d, d, bq);
                    if V == 2 {
                        let sum2 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                            v.add(states + base + 16 * q) as *const _,
                        ));
                        let d2 = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(sum2), c1, xv2);
                        n = _mm512_fmadd_ps(d2, d2, n);
                    }
                    let n = _mm512_castps_si512(n);
                    let tag = if one_tag {
                        block_tag
                    } else {
                        _mm512_set1_epi32(((base + 16 * q) >> top) as i32)
                    };
                    // (n & keep) | tag
                    let n = _mm512_ternarylogic_epi32::<0xEA>(n, keep, tag);
                    _mm512_storeu_si512(nx.add(base + 16 * q) as *mut _, n);
                }
            }
        }
        _mm512_reduce_min_epu32(low)
    }
}

/// How a Viterbi pass starts.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// Every pre-state at cost 0.
    Free,
    /// Only pre-states with these low `L − K` bits; only ends with them count.
    Fixed(u32),
}

/// The Viterbi search's buffers, reused across its passes.
struct Viterbi {
    /// Tagged costs of the states (see [`StepFn`]).
    cost: Vec<u32>,
    next: Vec<u32>,
    /// Per value, per group of predecessors (their common low bits): the top `K` bits of the
    /// cheapest one.
    back: Vec<u8>,
    groups: usize,
    /// The tagged start costs of every state, allowed (1) and forbidden: a run copies them
    /// instead of tagging 2^L states again (with calibrated sequences of 16 values that loop
    /// cost as much as the 16 steps).
    start_allowed: Vec<u32>,
    start_forbidden: Vec<u32>,
}

impl Viterbi {
    /// For 2^L `states` in 2^(L−K) `groups` (both powers of two), sequences of up to `n`.
    fn new(states: usize, groups: usize, n: usize) -> Self {
        let (k, top) = ((states / groups).trailing_zeros(), groups.trailing_zeros());
        let tag = |c: f32| {
            (0..states)
                .map(|s| tagged(c, s, k, top))
                .collect::<Vec<u32>>()
        };
        Viterbi {
            cost: vec![0; states],
            next: vec![0; states],
            back: vec![0; groups * n],
            groups,
            start_allowed: tag(1.0),
            start_forbidden: tag(FORBIDDEN),
        }
    }

    #[allow(clippy::too_many_arguments)]
    /// One pass over `x`, `v` values a step; returns the cheapest final state (among those
    /// whose low bits equal `start` when the start is fixed) and its cost (to the precision of
    /// the tags).
    fn run(
        &mut self,
        x: &[f32],
        v: usize,
        sums: &[u16],
        scale: f32,
        k: u32,
        low_bits: u32,
        start: Start,
        step: StepFn,
    ) -> (u32, f64) {
        let groups = self.groups;
        // Before value 0: every pre-state at cost 1 (the floor the renormalization keeps), or
        // only those whose low L − K bits are fixed (the top bits are outside the window).
        match start {
            Start::Free => self.cost.copy_from_slice(&self.start_allowed),
            Start::Fixed(b) => {
                self.cost.copy_from_slice(&self.start_forbidden);
                for s in (b as usize..self.cost.len()).step_by(1 << low_bits) {
                    self.cost[s] = self.start_allowed[s];
                }
            }
        }
        let keep = !((1u32 << k) - 1);
        let mut sub = 0f32;
        let mut offset = 0f64;
        self.back.resize(groups * (x.len() / v), 0);
        for (i, xi) in x.chunks_exact(v).enumerate() {
            let back = &mut self.back[i * groups..(i + 1) * groups];
            // SAFETY: `step` was chosen for this CPU, this many groups and `v` (`step_fn`);
            // the buffers have the lengths it needs (2^L states, 2^(L−K) groups, `v` sums a
            // state).
            let c1 = scale * CODE_SCALE;
            let point = Point {
                xc: xi[0] + CODE_MEAN * c1,
                c1,
                xc2: xi.get(1).map_or(0.0, |x2| x2 + CODE_MEAN * c1),
            };
            let low = unsafe { step(&self.cost, back, &mut self.next, sums, point, k, sub) };
            offset += sub as f64;
            // Every new cost is at least `low − sub`: the next step lowers them to ≥ 1.
            sub = (f32::from_bits(low & keep) - sub) - 1.0;
            std::mem::swap(&mut self.cost, &mut self.next);
        }
        // The cheapest end state (the first one on ties): among all, or among the 2^K whose
        // low bits close the tail-biting loop.
        let (mut end, mut best) = (0u32, u32::MAX);
        match start {
            Start::Free => {
                best = self.cost.iter().copied().min().unwrap_or(u32::MAX);
                end = self.cost.iter().position(|&c| c == best).unwrap_or(0) as u32;
            }
            Start::Fixed(st) => {
                for s in (st as usize..self.cost.len()).step_by(1 << low_bits) {
                    if self.cost[s] < best {
                        best = self.cost[s];
                        end = s as u32;
                    }
                }
            }
        }
        (end, f32::from_bits(best & keep) as f64 + offset)
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
