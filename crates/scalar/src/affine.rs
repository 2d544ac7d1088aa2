//! Affine integer quantization with one scale per group.
//!
//! The tensor is viewed as `rows × cols`, `cols` being the last (input) dimension. Groups never
//! cross a row, except in [`Group::Tensor`] where the whole tensor is one group.
//!
//! Per group, with `b` bits and `L = 2^b − 1`:
//! - **asymmetric** (`symmetric = false`): `lo = min`, `s = (max − lo) / L`, both rounded to the
//!   scale type first; `q = clamp(round((x − lo') / s'), 0, L)`; `x̂ = lo' + q·s'`.
//!   Streams: `scales` and `offsets` (the `lo'`), one value each per group.
//! - **symmetric**, `b ≥ 2`: `m` is the value of largest magnitude (with its sign),
//!   `d = m / −2^(b−1)` rounded to the scale type; `q = clamp(round(x / d'), −2^(b−1), 2^(b−1) − 1)`;
//!   `x̂ = q·d'`; the code stored is `q + 2^(b−1)`. Using the sign of `m` puts the extreme value
//!   exactly on the grid and uses all `2^b` levels (llama.cpp's Q4_0 does the same).
//!   Stream: `scales` only.
//! - **symmetric**, `b = 1`: `s = mean |x|` (the scale that minimizes the MSE of a sign code);
//!   code `1` is `+s'`, code `0` is `−s'`.
//!
//! Codes are packed LSB-first ([`crate::pack_bits`]) in row-major element order; scales and
//! offsets are little-endian arrays of the scale type in group order (row by row).

use crate::{FloatDtype, Result, ScalarError};

/// The widest affine code.
pub const MAX_BITS: u8 = 8;

/// How values are grouped for scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    /// One scale for the whole tensor.
    Tensor,
    /// One scale per row (per output channel).
    Row,
    /// One scale per `n` consecutive values of a row; the last group of a row may be shorter.
    Size(u32),
}

#[cfg(feature = "serde")]
impl serde::Serialize for Group {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Group::Tensor => s.serialize_str("tensor"),
            Group::Row => s.serialize_str("row"),
            Group::Size(n) => s.serialize_u32(*n),
        }
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Group {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Group;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"tensor\", \"row\" or a group size >= 1")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Group, E> {
                match v {
                    "tensor" => Ok(Group::Tensor),
                    "row" => Ok(Group::Row),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Group, E> {
                match u32::try_from(v) {
                    Ok(n) if n >= 1 => Ok(Group::Size(n)),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Unsigned(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Group::Tensor => f.write_str("tensor"),
            Group::Row => f.write_str("row"),
            Group::Size(n) => write!(f, "g{n}"),
        }
    }
}

/// Parameters of an affine format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AffineParams {
    /// Bits per code, 1..=8. By default, 4.
    pub bits: u8,
    /// Grouping of scales. By default, groups of 128 values.
    pub group: Group,
    /// Symmetric around zero (scales only) or asymmetric (scales and offsets). By default, asymmetric.
    pub symmetric: bool,
    /// Storage type of scales and offsets. By default, `f16`.
    pub scale_dtype: FloatDtype,
}

impl Default for AffineParams {
    fn default() -> Self {
        AffineParams {
            bits: 4,
            group: Group::Size(128),
            symmetric: false,
            scale_dtype: FloatDtype::F16,
        }
    }
}

/// The group geometry of a `rows × cols` tensor under a [`Group`] choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLayout {
    /// Rows of the grouping view (1 for [`Group::Tensor`]).
    pub rows: usize,
    /// Values per row of the grouping view.
    pub cols: usize,
    /// Values per full group.
    pub group_len: usize,
    /// Groups per row.
    pub groups_per_row: usize,
}

impl GroupLayout {
    /// Computes the layout; fails on a zero group size or when `rows * cols` overflows.
    pub fn new(rows: usize, cols: usize, group: Group) -> Result<Self> {
        let n = rows.checked_mul(cols).ok_or(ScalarError::ShapeMismatch {
            rows,
            cols,
            len: usize::MAX,
        })?;
        let (rows, cols, group_len) = match group {
            Group::Tensor => (1, n, n),
            Group::Row => (rows, cols, cols),
            Group::Size(0) => return Err(ScalarError::InvalidGroup),
            Group::Size(g) => (rows, cols, (g as usize).min(cols)),
        };
        let groups_per_row = if cols == 0 {
            0
        } else {
            cols.div_ceil(group_len.max(1))
        };
        Ok(GroupLayout {
            rows,
            cols,
            group_len,
            groups_per_row,
        })
    }

    /// Number of groups in the tensor.
    pub fn groups(&self) -> usize {
        self.rows * self.groups_per_row
    }
}

/// Exact byte lengths of the streams of an affine tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLens {
    /// Packed codes.
    pub codes: usize,
    /// One scale per group.
    pub scales: usize,
    /// One offset per group (0 when symmetric).
    pub offsets: usize,
}

impl AffineParams {
    /// Checks the parameters alone.
    pub fn validate(&self) -> Result<()> {
        if self.bits == 0 || self.bits > MAX_BITS {
            return Err(ScalarError::InvalidBits { bits: self.bits });
        }
        if self.group == Group::Size(0) {
            return Err(ScalarError::InvalidGroup);
        }
        Ok(())
    }

    /// The exact stream lengths for a `rows × cols` tensor: what a reader checks before it
    /// allocates, and what a writer produces.
    pub fn stream_lens(&self, rows: usize, cols: usize) -> Result<StreamLens> {
        self.validate()?;
        let layout = GroupLayout::new(rows, cols, self.group)?;
        let overflow = ScalarError::ShapeMismatch {
            rows,
            cols,
            len: usize::MAX,
        };
        let codes = crate::packed_len(rows * cols, self.bits).ok_or(overflow.clone())?;
        let scales = layout
            .groups()
            .checked_mul(self.scale_dtype.size())
            .ok_or(overflow)?;
        let offsets = if self.symmetric { 0 } else { scales };
        Ok(StreamLens {
            codes,
            scales,
            offsets,
        })
    }
}

/// The streams of an affine tensor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AffineEncoded {
    /// Codes, packed LSB-first.
    pub codes: Vec<u8>,
    /// One scale per group, little-endian scale type.
    pub scales: Vec<u8>,
    /// One offset per group (asymmetric only; empty when symmetric).
    pub offsets: Vec<u8>,
}

/// Appends codes LSB-first with a 64-bit accumulator.
struct BitPacker {
    out: Vec<u8>,
    acc: u64,
    filled: u32,
    bits: u32,
}

impl BitPacker {
    fn new(bits: u8, capacity: usize) -> Self {
        BitPacker {
            out: Vec::with_capacity(capacity),
            acc: 0,
            filled: 0,
            bits: bits as u32,
        }
    }
    #[inline]
    fn push(&mut self, code: u32) {
        self.acc |= (code as u64) << self.filled;
        self.filled += self.bits;
        if self.filled >= 32 {
            self.out.extend_from_slice(&(self.acc as u32).to_le_bytes());
            self.acc >>= 32;
            self.filled -= 32;
        }
    }
    fn finish(mut self) -> Vec<u8> {
        while self.filled > 0 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.filled = self.filled.saturating_sub(8);
        }
        self.out
    }
}

/// Reads codes LSB-first; the caller guarantees the stream is long enough.
struct BitUnpacker<'a> {
    src: &'a [u8],
    pos: usize,
    acc: u64,
    avail: u32,
    bits: u32,
    mask: u64,
}

impl<'a> BitUnpacker<'a> {
    /// An unpacker whose first code is code number `first` of the stream.
    fn at(src: &'a [u8], bits: u8, first: usize) -> Self {
        let bit = first * bits as usize;
        let mut u = BitUnpacker {
            src,
            pos: bit / 8,
            acc: 0,
            avail: 0,
            bits: bits as u32,
            mask: (1u64 << bits) - 1,
        };
        let skip = (bit % 8) as u32;
        if skip > 0 {
            if let Some(&b) = src.get(u.pos) {
                u.acc = (b as u64) >> skip;
                u.avail = 8 - skip;
                u.pos += 1;
            }
        }
        u
    }
    #[inline]
    fn next(&mut self) -> u32 {
        if self.avail < self.bits {
            if let Some(w) = self.src.get(self.pos..self.pos + 4) {
                self.acc |= (u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as u64) << self.avail;
                self.pos += 4;
                self.avail += 32;
            } else {
                while self.avail <= 56 && self.pos < self.src.len() {
                    self.acc |= (self.src[self.pos] as u64) << self.avail;
                    self.pos += 1;
                    self.avail += 8;
                }
            }
        }
        let c = (self.acc & self.mask) as u32;
        self.acc >>= self.bits;
        self.avail = self.avail.saturating_sub(self.bits);
        c
    }
}

fn check_shape(len: usize, rows: usize, cols: usize) -> Result<()> {
    if rows.checked_mul(cols) != Some(len) {
        return Err(ScalarError::ShapeMismatch { rows, cols, len });
    }
    Ok(())
}

/// Quantizes a `rows × cols` tensor, each group's range its values' own ([`GroupQuant::fit`]:
/// no clipping, which raises the weights' SNR but lowered SmolLM2's perplexity at 3 and 4 bits,
/// `examples/clip_probe.rs`). Non-finite input is [`ScalarError::NonFinite`]; a scale that
/// overflows the scale type is [`ScalarError::ScaleOverflow`], a nonzero scale below f16's
/// normal range [`ScalarError::ScaleUnderflow`], an asymmetric group spanning more than f32's
/// range [`ScalarError::SpanOverflow`].
pub fn affine_encode(
    values: &[f32],
    rows: usize,
    cols: usize,
    params: &AffineParams,
) -> Result<AffineEncoded> {
    check_shape(values.len(), rows, cols)?;
    let lens = params.stream_lens(rows, cols)?;
    crate::check_finite(values)?;
    let layout = GroupLayout::new(rows, cols, params.group)?;
    let dt = params.scale_dtype;
    let bits = params.bits;
    let mut packer = BitPacker::new(bits, lens.codes);
    let mut scales = Vec::with_capacity(lens.scales);
    let mut offsets = Vec::with_capacity(lens.offsets);
    let overflow = |group: usize, e: FitError| e.error(group, dt);
    for (group_index, g) in values
        .chunks(layout.cols.max(1))
        .take(layout.rows)
        .flat_map(|row| row.chunks(layout.group_len.max(1)))
        .enumerate()
    {
        let q = GroupQuant::fit(g, params).map_err(|e| overflow(group_index, e))?;
        q.push_params(dt, &mut scales, &mut offsets);
        g.iter().for_each(|&x| packer.push(q.code(x)));
    }
    let codes = packer.finish();
    debug_assert_eq!(codes.len(), lens.codes);
    Ok(AffineEncoded {
        codes,
        scales,
        offsets,
    })
}

/// The codes (one byte each, row-major) and the groups (row by row) of `values` rounded with
/// error feedback ([`crate::ldlq::Ldlq`], built from the layer's input statistics, `cols`
/// wide): each group of a row is fitted when rounding reaches its first column, from the
/// values as feedback has moved them. With [`Group::Tensor`] the one group is fitted on
/// `values` first. [`affine_pack`] turns the result into the streams.
pub fn affine_ldlq_codes(
    values: &[f32],
    rows: usize,
    cols: usize,
    params: &AffineParams,
    f: &crate::ldlq::Ldlq,
) -> Result<(Vec<u8>, Vec<GroupQuant>)> {
    check_shape(values.len(), rows, cols)?;
    params.stream_lens(rows, cols)?;
    crate::check_finite(values)?;
    if f.n() != cols {
        return Err(ScalarError::ShapeMismatch {
            rows: f.n(),
            cols: f.n(),
            len: cols,
        });
    }
    let layout = GroupLayout::new(rows, cols, params.group)?;
    let overflow = |group: usize, e: FitError| e.error(group, params.scale_dtype);
    let tensor = match params.group {
        Group::Tensor => Some(GroupQuant::fit_clipped(values, params).map_err(|e| overflow(0, e))?),
        _ => None,
    };
    let glen = match params.group {
        Group::Tensor => cols.max(1),
        _ => layout.group_len.max(1),
    };
    /// Rows rounded together: each column's row of the factor is read once for all of them
    /// (one row at a time streamed the whole factor per row: 32 MB for a 4096-wide layer).
    const ROWS: usize = 16;
    let per_row = if tensor.is_some() {
        0
    } else {
        cols.div_ceil(glen)
    };
    let mut codes = vec![0u8; values.len()];
    let mut groups = Vec::with_capacity(if tensor.is_some() { 1 } else { rows * per_row });
    let mut w = vec![0f32; ROWS * cols];
    let cols1 = cols.max(1);
    for (b, (block, out)) in values
        .chunks(ROWS * cols1)
        .zip(codes.chunks_mut(ROWS * cols1))
        .enumerate()
        .take(rows.div_ceil(ROWS))
    {
        let k = block.len() / cols1;
        let w = &mut w[..k * cols];
        w.copy_from_slice(&block[..k * cols]);
        let mut current = vec![tensor; k];
        let mut fitted: Vec<Vec<GroupQuant>> =
            (0..k).map(|_| Vec::with_capacity(per_row)).collect();
        // The first group (row-major) that could not be fitted.
        let mut failed: Option<(usize, FitError)> = None;
        f.rows_ranges(w, k, (0..cols).map(|j| j..j + 1), |i, j, upcoming| {
            let r = b * ROWS + i;
            if tensor.is_none() && j % glen == 0 {
                let g = &upcoming[..glen.min(upcoming.len())];
                match GroupQuant::fit_clipped(g, params) {
                    Ok(q) => {
                        fitted[i].push(q);
                        current[i] = Some(q);
                    }
                    Err(e) => {
                        let at = r * per_row + j / glen;
                        if failed.is_none_or(|(g, _)| at < g) {
                            failed = Some((at, e));
                        }
                        current[i] = None;
                    }
                }
            }
            let Some(q) = current[i] else {
                return;
            };
            let c = q.code(upcoming[0]);
            out[i * cols + j] = c as u8;
            upcoming[0] = q.value(c);
        });
        if let Some((g, e)) = failed {
            return Err(overflow(g, e));
        }
        groups.extend(fitted.into_iter().flatten());
    }
    if let Some(q) = tensor {
        groups.push(q);
    }
    Ok((codes, groups))
}

/// The streams of codes (one byte each, row-major) and their groups (in stream order), as
/// [`affine_encode`] writes them.
pub fn affine_pack(
    codes: &[u8],
    groups: &[GroupQuant],
    rows: usize,
    cols: usize,
    params: &AffineParams,
) -> Result<AffineEncoded> {
    check_shape(codes.len(), rows, cols)?;
    let lens = params.stream_lens(rows, cols)?;
    let dt = params.scale_dtype;
    let mut scales = Vec::with_capacity(lens.scales);
    let mut offsets = Vec::with_capacity(lens.offsets);
    groups
        .iter()
        .for_each(|q| q.push_params(dt, &mut scales, &mut offsets));
    let mut packer = BitPacker::new(params.bits, lens.codes);
    codes.iter().for_each(|&c| packer.push(c as u32));
    let codes = packer.finish();
    for (what, expected, actual) in [
        ("codes", lens.codes, codes.len()),
        ("scales", lens.scales, scales.len()),
        ("offsets", lens.offsets, offsets.len()),
    ] {
        if expected != actual {
            return Err(ScalarError::StreamLength {
                stream: what,
                expected,
                actual,
            });
        }
    }
    Ok(AffineEncoded {
        codes,
        scales,
        offsets,
    })
}

/// The quantizer of one group: its stored parameters (already rounded to the scale type) and
/// the code and value of any number under them — what [`affine_encode`] writes and
/// [`affine_decode_into`] reads, shared with the error-feedback encoder.
#[derive(Debug, Clone, Copy)]
pub struct GroupQuant {
    kind: QuantKind,
    /// Scale (`s`, or `d` when symmetric).
    scale: f32,
    /// Offset (asymmetric only).
    offset: f32,
    bits: u8,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum QuantKind {
    Asymmetric,
    Sign,
    Symmetric,
}

/// The two levels of a 1-bit asymmetric group: the means of the values below and above a
/// threshold, which moves to their midpoint (Lloyd's rule, from the group's mean) until it
/// settles. Min and max instead would put both levels at the tails: on Gaussian values an
/// error larger than the values themselves (−5.5 dB), where these give about 4.4 dB, the
/// 2-level optimum. An empty side (a constant group) gives one level twice.
fn two_centroids(g: &[f32]) -> (f32, f32) {
    let n = g.len().max(1) as f64;
    let mut t = g.iter().map(|&x| x as f64).sum::<f64>() / n;
    let (mut a, mut b) = (t, t);
    for _ in 0..16 {
        let (mut sa, mut na, mut sb, mut nb) = (0f64, 0usize, 0f64, 0usize);
        for &x in g {
            let x = x as f64;
            if x < t {
                (sa, na) = (sa + x, na + 1);
            } else {
                (sb, nb) = (sb + x, nb + 1);
            }
        }
        let mean = |s: f64, k: usize, other: f64| if k > 0 { s / k as f64 } else { other };
        (a, b) = (
            mean(sa, na, sb / nb.max(1) as f64),
            mean(sb, nb, sa / na.max(1) as f64),
        );
        let next = 0.5 * (a + b);
        if next == t {
            break;
        }
        t = next;
    }
    (a as f32, b as f32)
}

/// `scale` (of `dt`) stepped towards zero until the grid's extreme level, `base + levels·scale`,
/// and `levels·scale` itself are f32 values: a group reaching f32's largest value with a scale
/// rounded up would otherwise decode its top codes to infinity. Values past the stepped-down
/// top clamp to it (a relative error of at most a step of `dt`, 2^-8 for bf16).
fn within_f32(scale: f32, base: f32, levels: f32, dt: FloatDtype) -> f32 {
    let fits = |s: f32| {
        let span = levels as f64 * s.abs() as f64;
        span <= f32::MAX as f64 && (base as f64 + span).abs() <= f32::MAX as f64
    };
    let mut s = scale;
    // A step down of a bf16 unit or more per turn: a few turns at most.
    for _ in 0..16 {
        if fits(s) {
            break;
        }
        s = dt.round(s * (1.0 - 1.0 / 128.0));
    }
    s
}

/// Why [`GroupQuant::fit`] found no parameters for a group.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum FitError {
    /// Bits per code outside 1..=8 ([`AffineParams::validate`]).
    Bits(u8),
    /// A scale or offset the scale type cannot hold: infinite when it overflows, finite when it
    /// underflows ([`ScalarError::scale_range`]).
    Scale(f32),
    /// An asymmetric group whose values span more than f32's largest value.
    Span {
        /// Its smallest value.
        low: f32,
        /// Its largest value.
        high: f32,
    },
}

impl FitError {
    /// The crate's error for group `group` under scales of `dtype`.
    pub fn error(self, group: usize, dtype: FloatDtype) -> ScalarError {
        match self {
            FitError::Bits(bits) => ScalarError::InvalidBits { bits },
            FitError::Scale(v) => ScalarError::scale_range(group, v, dtype),
            FitError::Span { low, high } => ScalarError::SpanOverflow { group, low, high },
        }
    }
}

impl GroupQuant {
    /// The parameters of the group `g` under `params` (asymmetric: min and range, at 1 bit the
    /// two levels of a Lloyd split: the means below and above its threshold; symmetric: the value of largest
    /// magnitude; 1-bit symmetric: the mean magnitude). Err ([`FitError`]): the parameter
    /// that overflowed the scale type (infinite), or the scale that underflows f16
    /// ([`crate::FloatDtype::underflows`]; finite): a symmetric group's step below f16's normal
    /// range, an asymmetric group's when its values are (a larger offset hides the step's
    /// rounding); or an asymmetric group wider than f32's largest value (its top level,
    /// `offset + q·scale`, would overflow every decoder's arithmetic).
    pub fn fit(g: &[f32], params: &AffineParams) -> std::result::Result<Self, FitError> {
        let dt = params.scale_dtype;
        let bits = params.bits;
        if bits == 0 || bits > MAX_BITS {
            return Err(FitError::Bits(bits));
        }
        if !params.symmetric {
            let (lo, hi) = if bits == 1 {
                two_centroids(g)
            } else {
                g.iter()
                    .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
                        (a.min(x), b.max(x))
                    })
            };
            let levels = ((1u32 << bits) - 1) as f32;
            // Computed in f64: (hi - lo) can overflow f32 for extreme but finite values.
            let span = hi as f64 - lo as f64;
            if span > f32::MAX as f64 {
                return Err(FitError::Span { low: lo, high: hi });
            }
            let u = (span / levels as f64) as f32;
            let s = dt.round(u);
            if !s.is_finite() {
                return Err(FitError::Scale(s));
            }
            // A step below f16's normal range matters where the values are that small too:
            // beside a larger offset (a narrow group away from zero) its rounding is noise
            // under the values' own precision.
            let m = lo.abs().max(hi.abs());
            let lo = dt.round(lo);
            if !lo.is_finite() {
                return Err(FitError::Scale(lo));
            }
            if dt.underflows(m) {
                return Err(FitError::Scale(u));
            }
            Ok(GroupQuant {
                kind: QuantKind::Asymmetric,
                scale: within_f32(s, lo, levels, dt),
                offset: lo,
                bits,
            })
        } else if bits == 1 {
            let mean_abs =
                (g.iter().map(|x| x.abs() as f64).sum::<f64>() / g.len().max(1) as f64) as f32;
            let s = dt.round(mean_abs);
            if !dt.holds_scale(mean_abs) {
                return Err(FitError::Scale(if s.is_finite() { mean_abs } else { s }));
            }
            Ok(GroupQuant {
                kind: QuantKind::Sign,
                scale: s,
                offset: 0.0,
                bits,
            })
        } else {
            let half = 1i32 << (bits - 1);
            let m = g
                .iter()
                .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
            let u = m / -(half as f32);
            let d = dt.round(u);
            if !d.is_finite() {
                return Err(FitError::Scale(d));
            }
            // No offset hides a symmetric step's rounding: a subnormal one is an underflow.
            if dt.underflows(u) {
                return Err(FitError::Scale(u));
            }
            Ok(GroupQuant {
                kind: QuantKind::Symmetric,
                scale: within_f32(d, 0.0, half as f32, dt),
                offset: 0.0,
                bits,
            })
        }
    }

    /// [`GroupQuant::fit`], then the range shrunk towards zero by 5 % steps down to half
    /// (GPTQ's `mse` grid) when that lowers the group's squared rounding error: clipping a few
    /// large values buys a finer step for the rest. The calibrated encoders fit each group this
    /// way as the rounding reaches it. On N(0, 1) groups of 128 INT2 gains 3.4 dB of weight SNR,
    /// INT3 1.3, INT4 0.5 (`examples/clip_probe.rs`); without calibration it cost SmolLM2's
    /// perplexity at 3 and 4 bits (the clipped values matter more than their share of the
    /// error), so [`affine_encode`] does not clip. A 1-bit symmetric group keeps its mean
    /// magnitude. Err: as `fit`.
    pub fn fit_clipped(g: &[f32], params: &AffineParams) -> std::result::Result<Self, FitError> {
        let full = Self::fit(g, params)?;
        if full.kind == QuantKind::Sign || g.is_empty() {
            return Ok(full);
        }
        let (lo, hi) = g
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        let peak = if hi.abs() >= lo.abs() { hi } else { lo };
        let (mut best, mut err) = (full, full.sse(g));
        for step in 1..=10 {
            let p = 1.0 - 0.05 * step as f32;
            // The shrunk range as a two-value (or one-value) group: `fit`'s own rules and checks.
            let candidate = match full.kind {
                QuantKind::Asymmetric => Self::fit(&[p * lo, p * hi], params),
                _ => Self::fit(&[p * peak], params),
            };
            if let Ok(q) = candidate {
                let e = q.sse(g);
                if e < err {
                    (best, err) = (q, e);
                }
            }
        }
        Ok(best)
    }

    /// The squared rounding error of `g` under these parameters, for the clipping search: the
    /// codes [`GroupQuant::code`] gives (up to how exact halves round), in a loop of eight lanes
    /// the compiler vectorizes. The search runs it 11 times a group; through `code` and `value`
    /// the search cost 0.07 s per million values, 0.014 s so (`examples/clip_probe.rs`).
    fn sse(&self, g: &[f32]) -> f64 {
        let levels = ((1u32 << self.bits) - 1) as f32;
        let half = (1u32 << self.bits.saturating_sub(1)) as f32;
        let (first, last, offset) = match self.kind {
            QuantKind::Asymmetric => (0.0, levels, self.offset),
            QuantKind::Symmetric => (-half, half - 1.0, 0.0),
            QuantKind::Sign => (f32::NAN, f32::NAN, 0.0),
        };
        let inv = 1.0 / self.scale;
        if first.is_nan() || self.scale == 0.0 || !inv.is_finite() {
            return g
                .iter()
                .map(|&x| {
                    let d = (x - self.value(self.code(x))) as f64;
                    d * d
                })
                .sum();
        }
        // Adding and subtracting 1.5·2^23 rounds a value of magnitude below 2^22 to an integer
        // (halves to even); clamping first keeps it there and gives the same integer as
        // rounding first, the bounds being integers. The error is summed in steps and scaled
        // once, so that tiny groups (values of 1e-30: squares below f32's range) compare too.
        const ROUND: f32 = 12_582_912.0;
        let one = |x: f32| {
            let y = (x - offset) * inv;
            let d = y - ((y.clamp(first, last) + ROUND) - ROUND);
            d * d
        };
        let mut lanes = [0f32; 8];
        let mut chunks = g.chunks_exact(8);
        for c in &mut chunks {
            for (acc, &x) in lanes.iter_mut().zip(c) {
                *acc += one(x);
            }
        }
        let tail: f32 = chunks.remainder().iter().map(|&x| one(x)).sum();
        let steps = lanes.iter().map(|&v| v as f64).sum::<f64>() + tail as f64;
        steps * (self.scale as f64).powi(2)
    }

    fn push_params(&self, dt: crate::FloatDtype, scales: &mut Vec<u8>, offsets: &mut Vec<u8>) {
        dt.push(scales, self.scale);
        if self.kind == QuantKind::Asymmetric {
            dt.push(offsets, self.offset);
        }
    }

    /// The code of `x` (nearest level, clamped).
    #[inline]
    pub fn code(&self, x: f32) -> u32 {
        match self.kind {
            QuantKind::Asymmetric => {
                if self.scale > 0.0 {
                    let levels = ((1u32 << self.bits) - 1) as f32;
                    over(x - self.offset, self.scale).round().clamp(0.0, levels) as u32
                } else {
                    0
                }
            }
            QuantKind::Sign => (x >= 0.0) as u32,
            QuantKind::Symmetric => {
                let half = 1i32 << (self.bits - 1);
                if self.scale != 0.0 {
                    let (qmin, qmax) = (-half as f32, (half - 1) as f32);
                    let q = over(x, self.scale).round().clamp(qmin, qmax) as i32;
                    (q + half) as u32
                } else {
                    half as u32
                }
            }
        }
    }

    /// The value code `q` decodes to.
    #[inline]
    pub fn value(&self, q: u32) -> f32 {
        match self.kind {
            QuantKind::Asymmetric => self.offset + q as f32 * self.scale,
            QuantKind::Sign => {
                if q == 1 {
                    self.scale
                } else {
                    -self.scale
                }
            }
            QuantKind::Symmetric => (q as i32 - (1i32 << (self.bits - 1))) as f32 * self.scale,
        }
    }
}

/// `x / s`, through the reciprocal where it is finite (a multiply per value), else by division:
/// a step below 2.9e-39 (values of about 1e-37 at 8 bits) has no f32 reciprocal, and
/// multiplying by infinity would clamp every code to an end of the grid.
#[inline]
fn over(x: f32, s: f32) -> f32 {
    let inv = 1.0 / s;
    if inv.is_finite() {
        x * inv
    } else {
        x / s
    }
}

/// Dequantizes into `out` (`rows * cols` values). Every stream must have exactly the length
/// [`AffineParams::stream_lens`] gives, else [`ScalarError::StreamLength`].
pub fn affine_decode_into(
    codes: &[u8],
    scales: &[u8],
    offsets: &[u8],
    rows: usize,
    cols: usize,
    params: &AffineParams,
    out: &mut [f32],
) -> Result<()> {
    check_shape(out.len(), rows, cols)?;
    let streams = AffineStreams {
        codes,
        scales,
        offsets,
    };
    affine_decode_rows_into(streams, rows, cols, params, 0, out)
}

/// The three streams of an affine tensor, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct AffineStreams<'a> {
    /// Packed codes.
    pub codes: &'a [u8],
    /// Group scales.
    pub scales: &'a [u8],
    /// Group offsets (empty when symmetric).
    pub offsets: &'a [u8],
}

/// Dequantizes rows `first .. first + out.len() / cols` of a `rows × cols` tensor into `out`,
/// reading only the codes, scales and offsets of those rows. The streams must have exactly
/// the lengths of the whole tensor ([`AffineParams::stream_lens`]); the result is bit for bit
/// the same as those rows of [`affine_decode_into`].
pub fn affine_decode_rows_into(
    streams: AffineStreams<'_>,
    rows: usize,
    cols: usize,
    params: &AffineParams,
    first: usize,
    out: &mut [f32],
) -> Result<()> {
    let AffineStreams {
        codes,
        scales,
        offsets,
    } = streams;
    let lens = params.stream_lens(rows, cols)?;
    for (stream, expected, actual) in [
        ("codes", lens.codes, codes.len()),
        ("scales", lens.scales, scales.len()),
        ("offsets", lens.offsets, offsets.len()),
    ] {
        if expected != actual {
            return Err(ScalarError::StreamLength {
                stream,
                expected,
                actual,
            });
        }
    }
    let count = out.len().checked_div(cols).unwrap_or(0);
    if count * cols != out.len() || first.checked_add(count).is_none_or(|end| end > rows) {
        return Err(ScalarError::ShapeMismatch {
            rows,
            cols,
            len: out.len(),
        });
    }
    let layout = GroupLayout::new(rows, cols, params.group)?;
    let dt = params.scale_dtype;
    let bits = params.bits;
    let mut unpacker = BitUnpacker::at(codes, bits, first * cols);
    // A tensor-wide group is one group: every row reads group 0.
    let (row_len, mut group_index) = match params.group {
        Group::Tensor => (cols, 0),
        _ => (layout.cols, first * layout.groups_per_row),
    };
    let group_len = match params.group {
        Group::Tensor => cols,
        _ => layout.group_len,
    };
    for row in out.chunks_mut(row_len.max(1)) {
        if params.group == Group::Tensor {
            group_index = 0;
        }
        for g in row.chunks_mut(group_len.max(1)) {
            let s = dt.get(scales, group_index);
            if !params.symmetric {
                let lo = dt.get(offsets, group_index);
                for o in g.iter_mut() {
                    *o = lo + unpacker.next() as f32 * s;
                }
            } else if bits == 1 {
                for o in g.iter_mut() {
                    *o = if unpacker.next() == 1 { s } else { -s };
                }
            } else {
                let half = 1i32 << (bits - 1);
                for o in g.iter_mut() {
                    *o = (unpacker.next() as i32 - half) as f32 * s;
                }
            }
            group_index += 1;
        }
    }
    Ok(())
}

/// Dequantizes a `rows × cols` tensor; see [`affine_decode_into`].
pub fn affine_decode(
    enc: &AffineEncoded,
    rows: usize,
    cols: usize,
    params: &AffineParams,
) -> Result<Vec<f32>> {
    let n = rows.checked_mul(cols).ok_or(ScalarError::ShapeMismatch {
        rows,
        cols,
        len: usize::MAX,
    })?;
    // The codes stream justifies the allocation: it holds n * bits / 8 bytes.
    let lens = params.stream_lens(rows, cols)?;
    if enc.codes.len() != lens.codes {
        return Err(ScalarError::StreamLength {
            stream: "codes",
            expected: lens.codes,
            actual: enc.codes.len(),
        });
    }
    let mut out = vec![0.0; n];
    affine_decode_into(
        &enc.codes,
        &enc.scales,
        &enc.offsets,
        rows,
        cols,
        params,
        &mut out,
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_group_fit_refuses_bits_outside_the_range() {
        for bits in [0u8, 9, 40] {
            let p = AffineParams {
                bits,
                ..AffineParams::default()
            };
            assert!(
                matches!(GroupQuant::fit(&[1.0, -2.0], &p), Err(FitError::Bits(b)) if b == bits)
            );
            assert!(matches!(
                FitError::Bits(bits).error(0, p.scale_dtype),
                ScalarError::InvalidBits { .. }
            ));
        }
    }

    /// The SNR (dB) of `got` against `want`, in f64.
    fn snr_db(want: &[f32], got: &[f32]) -> f64 {
        let (sig, err) = want.iter().zip(got).fold((0f64, 0f64), |(s, e), (&x, &y)| {
            (s + (x as f64).powi(2), e + (x as f64 - y as f64).powi(2))
        });
        10.0 * (sig / err).log10()
    }

    /// `n` Gaussian-like values (sums of four uniforms from a 64-bit LCG seeded by `seed`).
    fn gaussianish(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed;
        let mut uniform = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        (0..n)
            .map(|_| uniform() + uniform() + uniform() + uniform())
            .collect()
    }

    fn roundtrip(values: &[f32], rows: usize, cols: usize, p: &AffineParams) -> Vec<f32> {
        let enc = affine_encode(values, rows, cols, p).unwrap();
        affine_decode(&enc, rows, cols, p).unwrap()
    }

    /// Largest error of a group for a rounding quantizer: half a step, plus the rounding of the
    /// scale and offset to the scale type (relative 2^-8 for bf16, 2^-11 for f16) over up to
    /// 2^b steps.
    fn bound(range: f32, p: &AffineParams) -> f32 {
        let levels = ((1u32 << p.bits) - 1) as f32;
        let step = range / levels;
        let rel = match p.scale_dtype {
            FloatDtype::F32 => 1e-6,
            FloatDtype::F16 => 1.0 / 2048.0,
            FloatDtype::Bf16 => 1.0 / 256.0,
        };
        0.5 * step + rel * (range + levels * step) + 1e-6
    }

    #[test]
    fn small_integers_are_exact_in_int4_symmetric() {
        let v: Vec<f32> = (-8..8).map(|i| i as f32).collect();
        let p = AffineParams {
            bits: 4,
            group: Group::Tensor,
            symmetric: true,
            scale_dtype: FloatDtype::F32,
        };
        assert_eq!(roundtrip(&v, 1, 16, &p), v);
    }

    #[test]
    fn clipped_fits_never_raise_the_error_and_clip_gaussian_tails() {
        let sse = |g: &[f32], q: &GroupQuant| -> f64 {
            g.iter()
                .map(|&x| ((x - q.value(q.code(x))) as f64).powi(2))
                .sum()
        };
        // A deterministic spread of values, then the same with one value 8x the rest.
        let mut g: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 128) as f32 / 64.0 - 1.0) * (1.0 + (i % 7) as f32 / 7.0))
            .collect();
        let mut outlier = g.clone();
        outlier[5] = 16.0;
        // (plain fit, clipped fit) of v at `bits`, f16 scales.
        let fits = |v: &[f32], bits: u8, symmetric: bool| {
            let p = AffineParams {
                bits,
                group: Group::Size(128),
                symmetric,
                scale_dtype: FloatDtype::F16,
            };
            (
                GroupQuant::fit(v, &p).unwrap(),
                GroupQuant::fit_clipped(v, &p).unwrap(),
            )
        };
        for symmetric in [false, true] {
            for bits in 1..=8 {
                for v in [&g, &outlier] {
                    let (full, clipped) = fits(v, bits, symmetric);
                    assert!(sse(v, &clipped) <= sse(v, &full), "{bits} bits");
                }
            }
        }
        // Gaussian-like values (a sum of four uniforms): at 2 and 3 bits clipping the tails
        // pays, the other values getting a finer step.
        let gauss = gaussianish(128, 12345);
        for symmetric in [false, true] {
            for bits in 2..=3 {
                let (full, clipped) = fits(&gauss, bits, symmetric);
                assert!(sse(&gauss, &clipped) < sse(&gauss, &full), "{bits} bits");
                assert!(clipped.scale.abs() < full.scale.abs());
            }
        }
        // Tiny groups take the same path (bf16 or typed errors as `fit`).
        g.truncate(1);
        let p = AffineParams {
            bits: 4,
            group: Group::Size(128),
            symmetric: true,
            scale_dtype: FloatDtype::F16,
        };
        assert!(GroupQuant::fit_clipped(&g, &p).is_ok());
        assert!(GroupQuant::fit_clipped(&[], &p).is_ok());
        assert!(GroupQuant::fit_clipped(&[1e-7], &p).is_err());
    }

    #[test]
    fn groups_wider_than_f32_are_span_errors_not_infinities() {
        let p = |bits, symmetric| AffineParams {
            bits,
            group: Group::Size(4),
            symmetric,
            scale_dtype: FloatDtype::Bf16,
        };
        // ±3e38: the top level (offset + 15·scale) is past f32's largest value.
        let wide = [-3e38f32, -1e38, 1e38, 3e38];
        for bits in [1, 4, 8] {
            match affine_encode(&wide, 1, 4, &p(bits, false)) {
                Err(ScalarError::SpanOverflow {
                    group: 0,
                    low,
                    high,
                }) => {
                    assert!(low < 0.0 && high > 0.0, "{low} {high}");
                    let msg = ScalarError::SpanOverflow {
                        group: 0,
                        low,
                        high,
                    }
                    .to_string();
                    assert!(msg.contains("symmetric"), "{msg}");
                }
                other => panic!("{bits} bits: {other:?}"),
            }
            // Symmetric codes step from zero: they hold it.
            let back = roundtrip(&wide, 1, 4, &p(bits.max(2), true));
            assert!(back.iter().all(|v| v.is_finite()), "{back:?}");
        }
        // Groups at the end of the range (the largest value f32's, or a scale rounded up past
        // it): the scale steps down so that every level is finite; the top values clamp by at
        // most a bf16 step.
        let top = [3.0e38f32, 3.1e38, 3.3e38, f32::MAX];
        let near = [-3.3e38f32, 1.0, 2.0e38, 3.39e38];
        for (g, symmetric, bits) in [
            (top, false, 4),
            (top, true, 4),
            (top, true, 8),
            (near, true, 2),
            ([-3.3e38, -3.0e38, -3.1e38, -3.2e38], false, 8),
        ] {
            let back = roundtrip(&g, 1, 4, &p(bits, symmetric));
            assert!(
                back.iter().all(|v| v.is_finite()),
                "{g:?} {symmetric} {bits}: {back:?}"
            );
            // (2-bit symmetric codes reach only -1 step on the negative side.)
            let db = snr_db(&g, &back);
            let want = if bits == 2 { 5.0 } else { 10.0 };
            assert!(db > want, "{g:?} {symmetric} {bits}: {db:.1} dB, {back:?}");
        }
    }

    #[test]
    fn clipped_fits_compare_at_any_magnitude() {
        // Gaussian-like groups of 128 (sums of four uniforms) at INT2 asymmetric: the search
        // clips the same way at 1e-30 (squared errors below f32's range) and 1e30 as at 1.
        let unit = gaussianish(128, 99);
        let p = AffineParams {
            bits: 2,
            group: Group::Size(128),
            symmetric: false,
            scale_dtype: FloatDtype::Bf16,
        };
        let snr = |scale: f32| {
            let v: Vec<f32> = unit.iter().map(|x| x * scale).collect();
            let q = GroupQuant::fit_clipped(&v, &p).unwrap();
            let got: Vec<f32> = v.iter().map(|&x| q.value(q.code(x))).collect();
            snr_db(&v, &got)
        };
        let base = snr(1.0);
        let plain = {
            let q = GroupQuant::fit(&unit, &p).unwrap();
            let got: Vec<f32> = unit.iter().map(|&x| q.value(q.code(x))).collect();
            snr_db(&unit, &got)
        };
        assert!(base > plain + 1.0, "{base:.2} dB against {plain:.2}");
        for scale in [1e-30f32, 1e30] {
            let db = snr(scale);
            assert!(
                (db - base).abs() < 0.1,
                "×{scale}: {db:.2} dB against {base:.2}"
            );
        }
    }

    #[test]
    fn constant_groups_decode_exactly() {
        let v = vec![0.25f32; 64];
        for symmetric in [false, true] {
            for bits in 1..=8 {
                let p = AffineParams {
                    bits,
                    group: Group::Size(16),
                    symmetric,
                    scale_dtype: FloatDtype::F16,
                };
                let back = roundtrip(&v, 2, 32, &p);
                assert!(
                    back.iter().all(|&b| b == 0.25),
                    "bits {bits} symmetric {symmetric}: {back:?}"
                );
            }
        }
    }

    #[test]
    fn sign_code_uses_mean_magnitude() {
        let v = [1.0, -3.0, 2.0, -2.0];
        let p = AffineParams {
            bits: 1,
            group: Group::Row,
            symmetric: true,
            scale_dtype: FloatDtype::F32,
        };
        assert_eq!(roundtrip(&v, 1, 4, &p), vec![2.0, -2.0, 2.0, -2.0]);
    }

    #[test]
    fn one_bit_asymmetric_groups_take_the_two_centroids() {
        // Two clusters: the levels are their means, not the extremes.
        let v = [1.0, 1.2, 0.8, 5.0, 5.5, 4.5, 1.0, 5.0];
        let p = AffineParams {
            bits: 1,
            group: Group::Row,
            symmetric: false,
            scale_dtype: FloatDtype::F32,
        };
        let got = roundtrip(&v, 1, 8, &p);
        assert_eq!(got, vec![1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 1.0, 5.0]);
        // Gaussian-like groups of 128 (a sum of four uniforms, unit variance): near the 2-level
        // optimum (4.4 dB on Gaussian values, 4.7 here) with f16 scales; min and max gave −5.
        let g: Vec<f32> = gaussianish(128 * 64, 7)
            .into_iter()
            .map(|v| v * 3f32.sqrt())
            .collect();
        let p = AffineParams {
            group: Group::Size(128),
            scale_dtype: FloatDtype::F16,
            ..p
        };
        let snr = snr_db(&g, &roundtrip(&g, 64, 128, &p));
        assert!(snr > 4.0 && snr < 5.0, "{snr} dB");
    }

    #[test]
    fn groups_of_tiny_values_keep_their_codes() {
        // Steps near 1e-40 (subnormal: no f32 reciprocal) for every grid.
        let v: Vec<f32> = (0..128).map(|i| (i as f32 - 63.5) * 1e-39).collect();
        for (bits, symmetric) in [(8, false), (8, true), (4, false), (4, true)] {
            let p = AffineParams {
                bits,
                group: Group::Size(128),
                symmetric,
                scale_dtype: FloatDtype::F32,
            };
            let snr = snr_db(&v, &roundtrip(&v, 1, 128, &p));
            assert!(
                snr > 6.0 * bits as f64 - 8.0,
                "{bits} bits, symmetric {symmetric}: {snr} dB"
            );
        }
    }

    #[test]
    fn partial_last_group_and_stream_lengths() {
        let p = AffineParams {
            bits: 3,
            group: Group::Size(4),
            symmetric: false,
            scale_dtype: FloatDtype::Bf16,
        };
        let lens = p.stream_lens(3, 10).unwrap();
        assert_eq!(
            lens,
            StreamLens {
                codes: 12,
                scales: 18,
                offsets: 18
            }
        );
        let v: Vec<f32> = (0..30).map(|i| (i as f32 * 0.37).sin()).collect();
        let enc = affine_encode(&v, 3, 10, &p).unwrap();
        assert_eq!(
            (enc.codes.len(), enc.scales.len(), enc.offsets.len()),
            (12, 18, 18)
        );
    }

    #[test]
    fn bad_input_is_typed() {
        let p = AffineParams::default();
        assert!(matches!(
            affine_encode(&[1.0, f32::NAN], 1, 2, &p),
            Err(ScalarError::NonFinite { index: 1, .. })
        ));
        assert!(matches!(
            affine_encode(&[1.0; 3], 1, 2, &p),
            Err(ScalarError::ShapeMismatch { .. })
        ));
        let bad = AffineParams { bits: 0, ..p };
        assert!(matches!(
            affine_encode(&[1.0], 1, 1, &bad),
            Err(ScalarError::InvalidBits { bits: 0 })
        ));
        let f16 = AffineParams {
            scale_dtype: FloatDtype::F16,
            ..p
        };
        assert!(matches!(
            affine_encode(&[-1e9, 1e9], 1, 2, &f16),
            Err(ScalarError::ScaleOverflow { group: 0, .. })
        ));
        let enc = affine_encode(&[1.0, 2.0], 1, 2, &p).unwrap();
        assert!(matches!(
            affine_decode_into(
                &enc.codes,
                &enc.scales[..1],
                &enc.offsets,
                1,
                2,
                &p,
                &mut [0.0; 2]
            ),
            Err(ScalarError::StreamLength {
                stream: "scales",
                ..
            })
        ));
    }

    fn group_strategy() -> impl Strategy<Value = Group> {
        prop_oneof![
            Just(Group::Tensor),
            Just(Group::Row),
            (1u32..70).prop_map(Group::Size)
        ]
    }

    fn dtype_strategy() -> impl Strategy<Value = FloatDtype> {
        prop_oneof![
            Just(FloatDtype::F32),
            Just(FloatDtype::F16),
            Just(FloatDtype::Bf16)
        ]
    }

    proptest! {
        #[test]
        fn row_range_decode_equals_rows_of_whole(
            bits in 1u8..=8, group in group_strategy(), symmetric in any::<bool>(),
            scale_dtype in dtype_strategy(), rows in 1usize..7, cols in 1usize..70,
            a in 0usize..7, b in 0usize..7, seed in any::<u64>(),
        ) {
            let p = AffineParams { bits, group, symmetric: symmetric && bits >= 1, scale_dtype };
            let mut s = seed | 1;
            let v: Vec<f32> = (0..rows * cols).map(|_| {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0) as f32
            }).collect();
            // Steps below f16's normal range are ScaleUnderflow (tested apart): groups of
            // values at least 0.01 from zero keep every step (≥ 0.01/128) normal.
            let v: Vec<f32> = v.iter().map(|x| x.signum() * x.abs().max(0.01)).collect();
            let enc = affine_encode(&v, rows, cols, &p).unwrap();
            let whole = affine_decode(&enc, rows, cols, &p).unwrap();
            let (a, b) = (a.min(b).min(rows), a.max(b).min(rows));
            let mut part = vec![0f32; (b - a) * cols];
            let streams = AffineStreams { codes: &enc.codes, scales: &enc.scales, offsets: &enc.offsets };
            affine_decode_rows_into(streams, rows, cols, &p, a, &mut part).unwrap();
            let same = part.iter().zip(&whole[a * cols..b * cols]).all(|(x, y)| x.to_bits() == y.to_bits());
            prop_assert!(same);
            let mut over = vec![0f32; cols];
            let outside = affine_decode_rows_into(streams, rows, cols, &p, rows, &mut over);
            prop_assert!(outside.is_err());
        }

        #[test]
        fn asymmetric_error_within_half_step(
            bits in 2u8..=8, group in group_strategy(), scale_dtype in dtype_strategy(),
            rows in 1usize..5, cols in 1usize..90, seed in any::<u64>(),
        ) {
            let p = AffineParams { bits, group, symmetric: false, scale_dtype };
            let mut s = seed | 1;
            let v: Vec<f32> = (0..rows * cols).map(|_| {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0) as f32
            }).collect();
            let v: Vec<f32> = v.iter().map(|x| x.signum() * x.abs().max(0.01)).collect();
            let back = roundtrip(&v, rows, cols, &p);
            let layout = GroupLayout::new(rows, cols, group).unwrap();
            for (gi, (gv, gb)) in v.chunks(layout.cols).flat_map(|r| r.chunks(layout.group_len))
                .zip(back.chunks(layout.cols).flat_map(|r| r.chunks(layout.group_len))).enumerate() {
                let (lo, hi) = gv.iter().fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
                let tol = bound(hi - lo, &p) + lo.abs() * 1.0 / 256.0;
                for (a, b) in gv.iter().zip(gb) {
                    prop_assert!((a - b).abs() <= tol, "group {} value {} decoded {} tol {}", gi, a, b, tol);
                }
            }
        }

        #[test]
        fn symmetric_error_within_half_step(
            bits in 2u8..=8, group in group_strategy(), rows in 1usize..4, cols in 1usize..80,
            v in proptest::collection::vec(-3.0f32..3.0, 320),
        ) {
            let p = AffineParams { bits, group, symmetric: true, scale_dtype: FloatDtype::F32 };
            let v = &v[..rows * cols];
            let back = roundtrip(v, rows, cols, &p);
            let amax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            // The step is amax / 2^(b-1); the worst case is the clamped +amax side: one step.
            let step = amax / (1u32 << (bits - 1)) as f32;
            for (a, b) in v.iter().zip(&back) {
                prop_assert!((a - b).abs() <= step * 1.0001 + 1e-6);
            }
        }
    }
}
