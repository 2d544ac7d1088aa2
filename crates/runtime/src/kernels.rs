//! The inner loops of the batch-1 paths: dot products of one stored row with a prepared
//! activation. Each is plain Rust over lane arrays (`LANES` independent accumulators, so the
//! compiler may vectorize a float sum without reassociating it), compiled for the baseline and
//! for AVX2 ([`crate::simd`]).

use crate::simd::multiversion;

/// Independent accumulators per loop: one AVX2 register of f32.
const LANES: usize = 8;

#[inline(always)]
fn hsum(acc: [f32; LANES]) -> f32 {
    let a = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (a[0] + a[2]) + (a[1] + a[3])
}

/// `Σ a·b` over f32 slices of the same length.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: AVX2 and FMA are present; the slices have the same length.
        return unsafe { crate::avx2::dot_f32(a, b) };
    }
    dot_f32_portable(a, b)
}

multiversion! {
    fn dot_f32_portable(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0f32; LANES];
        let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for l in 0..LANES {
                acc[l] += x[l] * y[l];
            }
        }
        let mut s = hsum(acc);
        for (x, y) in ra.iter().zip(rb) {
            s += x * y;
        }
        s
    }
}

multiversion! {
    /// `Σ w·x` where `w` is little-endian bfloat16 (`2·x.len()` bytes).
    pub(crate) fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
        let mut acc = [0f32; LANES];
        let (cw, cx) = (w.chunks_exact(2 * LANES), x.chunks_exact(LANES));
        let (rw, rx) = (cw.remainder(), cx.remainder());
        for (a, b) in cw.zip(cx) {
            for l in 0..LANES {
                let v = f32::from_bits((u16::from_le_bytes([a[2 * l], a[2 * l + 1]]) as u32) << 16);
                acc[l] += v * b[l];
            }
        }
        let mut s = hsum(acc);
        for (a, b) in rw.chunks_exact(2).zip(rx) {
            s += f32::from_bits((u16::from_le_bytes([a[0], a[1]]) as u32) << 16) * b;
        }
        s
    }
}

/// Bits of one lane word on the fused affine paths, the codes a 32-bit lane unpacks at once: a
/// byte of `8/bits` codes for 1, 2, 4 and 8 bits; 24 bits (8 codes of 3 bits, 4 of 6); 20 (4
/// codes of 5 bits) and 28 (4 of 7), every other such word starting mid-byte. 0 for no width.
pub(crate) const fn lane_bits(bits: u8) -> usize {
    match bits {
        1 | 2 | 4 | 8 => 8,
        3 | 6 => 24,
        5 => 20,
        7 => 28,
        _ => 0,
    }
}

/// Codes per lane word of [`lane_bits`] (0 without a fused form).
pub(crate) const fn word_codes(bits: u8) -> usize {
    match lane_bits(bits) {
        0 => 0,
        l => l / bits as usize,
    }
}

/// Whether rows of `cols` affine codes of `bits` bits in groups of `glen` run on the fused
/// loops: every group (and row) whole lane words, starting on a byte.
pub(crate) fn fused_shape(bits: u8, cols: usize, glen: usize) -> bool {
    let per = word_codes(bits);
    let bytes = |n: usize| (n * bits as usize).is_multiple_of(8);
    per > 0 && cols.is_multiple_of(per) && glen.is_multiple_of(per) && bytes(cols) && bytes(glen)
}

/// Lane word `i` of `L`-bit lane words (LSB-first) in its low bits (those above `L` are the
/// next word's or zero).
#[inline(always)]
pub(crate) fn word_at<const L: usize>(codes: &[u8], i: usize) -> u32 {
    if L == 8 {
        u32::from(codes[i])
    } else {
        let bit = L * i;
        let (b, s) = (bit / 8, bit % 8);
        let mut v = 0u32;
        for k in 0..(s + L).div_ceil(8) {
            v |= u32::from(codes[b + k]) << (8 * k);
        }
        v >> s
    }
}

/// `Σ q·x` for `B`-bit codes packed LSB-first in lane words of `L` bits ([`lane_bits`]), `L/B`
/// per word, against `xp`, the activation permuted so that the `m`-th field of every word meets
/// a contiguous run: `xp[m·n + i]` is the value under field `m` of word `i` (`n` words).
#[inline(always)]
fn dot_fields<const B: u32, const L: usize>(codes: &[u8], xp: &[f32]) -> f32 {
    let per = L / B as usize;
    let n = codes.len() * 8 / L;
    let mask = (1u32 << B) - 1;
    // Two registers of accumulators: an add's latency is hidden behind the other's.
    let (mut a0, mut a1) = ([0f32; LANES], [0f32; LANES]);
    let mut tail = 0f32;
    if L == 8 {
        let mask = mask as u8;
        for m in 0..per {
            let xs = &xp[m * n..(m + 1) * n];
            let shift = m as u32 * B;
            let (cc, cx) = (codes.chunks_exact(2 * LANES), xs.chunks_exact(2 * LANES));
            let (rc, rx) = (cc.remainder(), cx.remainder());
            for (c, x) in cc.zip(cx) {
                for l in 0..LANES {
                    a0[l] += ((c[l] >> shift) & mask) as f32 * x[l];
                    a1[l] += ((c[LANES + l] >> shift) & mask) as f32 * x[LANES + l];
                }
            }
            for (c, x) in rc.iter().zip(rx) {
                tail += ((c >> shift) & mask) as f32 * x;
            }
        }
        return hsum(a0) + hsum(a1) + tail;
    }
    // Wider lane words: runs of 2·LANES, each word gathered into a u32 once for all its fields.
    let full = n / (2 * LANES) * (2 * LANES);
    let mut w = [0u32; 2 * LANES];
    for i0 in (0..full).step_by(2 * LANES) {
        for (l, v) in w.iter_mut().enumerate() {
            *v = word_at::<L>(codes, i0 + l);
        }
        for m in 0..per {
            let x = &xp[m * n + i0..m * n + i0 + 2 * LANES];
            let shift = m as u32 * B;
            for l in 0..LANES {
                a0[l] += ((w[l] >> shift) & mask) as f32 * x[l];
                a1[l] += ((w[LANES + l] >> shift) & mask) as f32 * x[LANES + l];
            }
        }
    }
    for i in full..n {
        let c = word_at::<L>(codes, i);
        for m in 0..per {
            tail += ((c >> (m as u32 * B)) & mask) as f32 * xp[m * n + i];
        }
    }
    hsum(a0) + hsum(a1) + tail
}

/// Runs `$body` with `$b` and `$l` the constants of a row's field width `$bits`: its bits and
/// the bits of its lane words ([`lane_bits`]; 8 for any width without lane words of its own,
/// which is 8, the unpacked bytes). Every affine row kernel dispatches on the width with it, once
/// a row.
macro_rules! by_width {
    ($bits:expr, $b:ident, $l:ident => $body:expr) => {
        match $bits {
            1 => $crate::kernels::by_width!(@ 1, 8, $b, $l, $body),
            2 => $crate::kernels::by_width!(@ 2, 8, $b, $l, $body),
            3 => $crate::kernels::by_width!(@ 3, 24, $b, $l, $body),
            4 => $crate::kernels::by_width!(@ 4, 8, $b, $l, $body),
            5 => $crate::kernels::by_width!(@ 5, 20, $b, $l, $body),
            6 => $crate::kernels::by_width!(@ 6, 24, $b, $l, $body),
            7 => $crate::kernels::by_width!(@ 7, 28, $b, $l, $body),
            _ => $crate::kernels::by_width!(@ 8, 8, $b, $l, $body),
        }
    };
    (@ $bv:literal, $lv:literal, $b:ident, $l:ident, $body:expr) => {{
        const $b: u32 = $bv;
        const $l: usize = $lv;
        $body
    }};
}
pub(crate) use by_width;

/// [`dot_fields`] for a row's field width: its codes' bits on the fused path, 8 on bytes.
fn dot_fields_of(bits: u8, codes: &[u8], xs: &[f32]) -> f32 {
    by_width!(bits, B, L => dot_fields::<B, L>(codes, xs))
}

/// One row of affine codes: everything [`affine_row`] reads.
#[derive(Clone, Copy)]
pub(crate) struct AffineRow<'r> {
    /// Bits of the dot product's fields (the codes' bits, or 8 when unpacked to bytes).
    pub(crate) field_bits: u8,
    /// Values per lane word ([`word_codes`]; 1 when unpacked).
    pub(crate) per: usize,
    /// Values per group and groups per row.
    pub(crate) glen: usize,
    /// The row's codes.
    pub(crate) codes: &'r [u8],
    /// The activation permuted per group ([`dot_fields`]).
    pub(crate) xp: &'r [f32],
    /// Σx per group.
    pub(crate) gsum: &'r [f32],
    /// The row's scales and offsets (one per group, or one for a tensor-wide group).
    pub(crate) scales: &'r [f32],
    /// Empty when symmetric.
    pub(crate) offsets: &'r [f32],
    /// The code bias `2^(bits−1)` (symmetric), or −1 for the 1-bit sign code.
    pub(crate) bias: f32,
}

impl AffineRow<'_> {
    /// The codes of columns `lo..hi` (a group: whole words).
    #[inline(always)]
    pub(crate) fn group_codes(&self, lo: usize, hi: usize) -> &[u8] {
        let b = self.field_bits as usize;
        &self.codes[lo * b / 8..hi * b / 8]
    }
}

/// `⟨ŵ_r, x⟩` of one affine row: per group `s·Σq·x + lo·Σx` (asymmetric), `s·(Σq·x − h·Σx)`
/// (symmetric) or `s·(2·Σq·x − Σx)` (1-bit sign codes). A sum that overflows f32 where the
/// row's terms cancel (weights within a few powers of two of f32's range) is taken again in
/// f64 ([`affine_row_f64`]); it costs nothing when the f32 one is finite.
pub(crate) fn affine_row(a: &AffineRow<'_>) -> f32 {
    let y = affine_row_f32(a);
    if y.is_finite() {
        y
    } else {
        affine_row_f64(a)
    }
}

/// [`affine_row`] in f64, each group's terms combined before they are added: for a row whose
/// f32 sums overflowed. Its result is infinite or NaN only where the true one is (or the
/// activations hold such values).
#[cold]
fn affine_row_f64(a: &AffineRow<'_>) -> f32 {
    let cols = a.xp.len();
    let bits = u32::from(a.field_bits);
    let mask = (1u32 << bits) - 1;
    let mut acc = 0f64;
    for (j, &gs) in a.gsum.iter().enumerate() {
        let (lo, hi) = (j * a.glen, ((j + 1) * a.glen).min(cols));
        let codes = a.group_codes(lo, hi);
        let xs = &a.xp[lo..hi];
        let n = (hi - lo) / a.per;
        let mut d = 0f64;
        for i in 0..n {
            let c = by_width!(a.field_bits, _B, L => word_at::<L>(codes, i));
            for m in 0..a.per {
                let q = (c >> (m as u32 * bits)) & mask;
                d += f64::from(q) * f64::from(xs[m * n + i]);
            }
        }
        let si = j.min(a.scales.len() - 1);
        let (s, gs) = (f64::from(a.scales[si]), f64::from(gs));
        acc += if !a.offsets.is_empty() {
            s * d + f64::from(a.offsets[si]) * gs
        } else if a.bias < 0.0 {
            s * (2.0 * d - gs)
        } else {
            s * (d - f64::from(a.bias) * gs)
        };
    }
    acc as f32
}

/// [`affine_row`]'s f32 sums (SIMD where the CPU has it).
fn affine_row_f32(a: &AffineRow<'_>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512() {
        // SAFETY: AVX-512F/BW, AVX2 and FMA are present (checked just above).
        return unsafe { crate::avx2::affine_row512(a) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: AVX2 and FMA are present (checked just above); the row is consistent.
        return unsafe { crate::avx2::affine_row(a) };
    }
    affine_row_with(a, dot_fields_of)
}

/// [`affine_row`] for `out.len()` activation rows: `a.xp` holds each row's permuted
/// activation (`cols` values a row) and `a.gsum` its group sums (`groups` a row), one after
/// the other; the codes are unpacked once for up to 8 rows (AVX-512) or 4 (AVX2).
fn affine_rows_f32(a: &AffineRow<'_>, cols: usize, groups: usize, out: &mut [f32]) {
    let part = |m: usize| AffineRow {
        xp: &a.xp[m * cols..],
        gsum: &a.gsum[m * groups..],
        ..*a
    };
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512() {
        for (k, o) in out.chunks_mut(8).enumerate() {
            let p = part(8 * k);
            let s = (cols, groups);
            // SAFETY: AVX-512F/BW, AVX2 and FMA are present; p's activation and group sums
            // hold o.len() rows at these strides.
            unsafe {
                use crate::avx2::affine_rows512 as f;
                match o.len() {
                    8 => f::<8>(&p, cols, s, o),
                    7 => f::<7>(&p, cols, s, o),
                    6 => f::<6>(&p, cols, s, o),
                    5 => f::<5>(&p, cols, s, o),
                    4 => f::<4>(&p, cols, s, o),
                    3 => f::<3>(&p, cols, s, o),
                    2 => f::<2>(&p, cols, s, o),
                    _ => f::<1>(&p, cols, s, o),
                }
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        for (k, o) in out.chunks_mut(4).enumerate() {
            let p = part(4 * k);
            let s = (cols, groups);
            // SAFETY: AVX2 and FMA are present; as above.
            unsafe {
                use crate::avx2::affine_rows as f;
                match o.len() {
                    4 => f::<4>(&p, cols, s, o),
                    3 => f::<3>(&p, cols, s, o),
                    2 => f::<2>(&p, cols, s, o),
                    _ => f::<1>(&p, cols, s, o),
                }
            }
        }
        return;
    }
    for (m, o) in out.iter_mut().enumerate() {
        let p = AffineRow {
            xp: &a.xp[m * cols..(m + 1) * cols],
            gsum: &a.gsum[m * groups..(m + 1) * groups],
            ..*a
        };
        *o = affine_row_f32(&p);
    }
}

/// [`affine_rows`]: the rows' f32 sums, each that overflowed taken again in f64 (as
/// [`affine_row`] does).
pub(crate) fn affine_rows(a: &AffineRow<'_>, cols: usize, groups: usize, out: &mut [f32]) {
    affine_rows_f32(a, cols, groups, out);
    for (m, o) in out.iter_mut().enumerate() {
        if !o.is_finite() {
            *o = affine_row_f64(&AffineRow {
                xp: &a.xp[m * cols..(m + 1) * cols],
                gsum: &a.gsum[m * groups..(m + 1) * groups],
                ..*a
            });
        }
    }
}

#[inline(always)]
fn affine_row_with(a: &AffineRow<'_>, dot: impl Fn(u8, &[u8], &[f32]) -> f32) -> f32 {
    {
        let cols = a.xp.len();
        let mut acc = 0f32;
        for (j, &gs) in a.gsum.iter().enumerate() {
            let (lo, hi) = (j * a.glen, ((j + 1) * a.glen).min(cols));
            let codes = a.group_codes(lo, hi);
            let xs = &a.xp[lo..hi];
            let d = dot(a.field_bits, codes, xs);
            let si = j.min(a.scales.len() - 1);
            let s = a.scales[si];
            acc += if !a.offsets.is_empty() {
                s * d + a.offsets[si] * gs
            } else if a.bias < 0.0 {
                s * (2.0 * d - gs)
            } else {
                s * (d - a.bias * gs)
            };
        }
        acc
    }
}

/// The activation of a fixed-rate E8 row, rearranged once per call so that a row's dot product
/// runs over words in lanes: for word `w` (8 coordinates of `x' = RHT(x)`, zero-padded),
/// `t[(i−1)·nw + w] = x'[8w + i − 1]` for `i` in 1..8 (the coordinates symbols 1..7 carry),
/// `half[w] = ½·Σ x'[8w..8w+8]` (what the coset bit adds), `last[w] = x'[8w + 7]` (the
/// coordinate rebuilt from the first symbol and the parity), and `sum = Σ x'`.
#[derive(Debug, Default)]
pub(crate) struct E8Activation {
    pub(crate) words: usize,
    /// `x'` shifted by one (`shifted[8w + i] = x'[8w + i − 1]`, a zero first): the operand of
    /// the AVX2 entropy-coded row, which multiplies a word's symbols 1..8 in place.
    pub(crate) shifted: Vec<f32>,
    pub(crate) t: Vec<f32>,
    pub(crate) half: Vec<f32>,
    pub(crate) last: Vec<f32>,
    pub(crate) sum: f32,
}

impl E8Activation {
    /// Rearranges `xr` (`8·words` values).
    pub(crate) fn new(xr: &[f32]) -> Self {
        let nw = xr.len() / 8;
        let mut t = vec![0f32; 7 * nw];
        let mut half = vec![0f32; nw];
        let mut last = vec![0f32; nw];
        for (w, word) in xr.chunks_exact(8).enumerate() {
            for i in 0..7 {
                t[i * nw + w] = word[i];
            }
            half[w] = 0.5 * word.iter().sum::<f32>();
            last[w] = word[7];
        }
        let mut shifted = vec![0f32; 8 * nw + 1];
        shifted[1..].copy_from_slice(&xr[..8 * nw]);
        E8Activation {
            words: nw,
            shifted,
            t,
            half,
            last,
            sum: xr.iter().sum(),
        }
    }
}

/// `⟨p, x'⟩` for one row of fixed-rate E8 words of `B` bits per symbol (`B` bytes per word,
/// LSB-first): the seven stored coordinates are `sym − h (+ ½ c)`, the last
/// `(s₀ & !1) − h + parity(sym₁..₇) (+ ½ c)` with `h = 2^(B−1)` (see
/// `hypercodec_lattice::Lattice::decode_word_fixed`), so the row's sum is
/// `Σ_w [Σ_i sym_i·t_i + c·half + ((s₀ & !1) + parity)·last] − h·Σ x'`.
#[inline(always)]
fn e8_fields<const B: u32>(bytes: &[u8], a: &E8Activation) -> f32 {
    let nw = a.words;
    let mask = (1u64 << B) - 1;
    let parity_bits: u64 = (1..8).fold(0, |m, i| m | (1u64 << (i * B)));
    let word = |w: usize| -> u64 {
        let mut v = [0u8; 8];
        v[..B as usize].copy_from_slice(&bytes[w * B as usize..(w + 1) * B as usize]);
        u64::from_le_bytes(v)
    };
    let mut acc = [0f32; LANES];
    let full = nw / LANES * LANES;
    let mut w0 = 0;
    while w0 < full {
        for (l, lane) in acc.iter_mut().enumerate() {
            let w = w0 + l;
            let v = word(w);
            let mut s = 0f32;
            for i in 1..8u32 {
                s += ((v >> (i * B)) & mask) as f32 * a.t[(i as usize - 1) * nw + w];
            }
            let s0 = v & mask;
            let par = (v & parity_bits).count_ones() as u64 & 1;
            s += (s0 & 1) as f32 * a.half[w] + ((s0 & !1) + par) as f32 * a.last[w];
            *lane += s;
        }
        w0 += LANES;
    }
    let mut tail = 0f32;
    for w in full..nw {
        let v = word(w);
        for i in 1..8u32 {
            tail += ((v >> (i * B)) & mask) as f32 * a.t[(i as usize - 1) * nw + w];
        }
        let s0 = v & mask;
        let par = (v & parity_bits).count_ones() as u64 & 1;
        tail += (s0 & 1) as f32 * a.half[w] + ((s0 & !1) + par) as f32 * a.last[w];
    }
    hsum(acc) + tail - (1u64 << (B - 1)) as f32 * a.sum
}

/// The same for 4-bit symbols, a word being one little-endian `u32`.
#[inline(always)]
fn e8_fields4(bytes: &[u8], a: &E8Activation) -> f32 {
    let nw = a.words;
    let mut acc = [0f32; LANES];
    let words = bytes.chunks_exact(4 * LANES);
    let mut w0 = 0;
    for chunk in words {
        for l in 0..LANES {
            let w = w0 + l;
            let c = &chunk[4 * l..4 * l + 4];
            let v = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let mut s = 0f32;
            for i in 1..8u32 {
                s += ((v >> (4 * i)) & 15) as f32 * a.t[(i as usize - 1) * nw + w];
            }
            let s0 = v & 15;
            let mut p = v & 0x1111_1110;
            p ^= p >> 16;
            p ^= p >> 8;
            p ^= p >> 4;
            s += (s0 & 1) as f32 * a.half[w] + ((s0 & 14) + (p & 1)) as f32 * a.last[w];
            acc[l] += s;
        }
        w0 += LANES;
    }
    let mut tail = 0f32;
    for w in w0..nw {
        let c = &bytes[4 * w..4 * w + 4];
        let v = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        for i in 1..8u32 {
            tail += ((v >> (4 * i)) & 15) as f32 * a.t[(i as usize - 1) * nw + w];
        }
        let s0 = v & 15;
        let par = (v & 0x1111_1110).count_ones() & 1;
        tail += (s0 & 1) as f32 * a.half[w] + ((s0 & 14) + par) as f32 * a.last[w];
    }
    hsum(acc) + tail - 8.0 * a.sum
}

/// `⟨p, x'⟩` of one fixed-rate E8 row of `bits` (2..=8) bits per symbol.
pub(crate) fn e8_fixed_dot(bits: u8, bytes: &[u8], a: &E8Activation) -> f32 {
    e8_fixed_dots(bits, bytes, [a])[0]
}

/// [`e8_fixed_dot`] against `M` activations at once: 4-bit words (the common width) are
/// decoded once for all of them; other widths row by row.
pub(crate) fn e8_fixed_dots<const M: usize>(
    bits: u8,
    bytes: &[u8],
    a: [&E8Activation; M],
) -> [f32; M] {
    #[cfg(target_arch = "x86_64")]
    if bits == 4 && crate::simd::has_avx2() {
        // SAFETY: AVX2 and FMA are present; the row holds 4 bytes per word and each
        // activation 7 + 1 + 1 values per word (E8Activation::new, the same words).
        let dots = unsafe {
            crate::avx2::e8_fixed4(
                bytes,
                a.map(|a| &a.t[..]),
                a.map(|a| &a.half[..]),
                a.map(|a| &a.last[..]),
            )
        };
        let mut out = [0f32; M];
        for r in 0..M {
            out[r] = dots[r] - 8.0 * a[r].sum;
        }
        return out;
    }
    a.map(|a| e8_fixed_dot_one(bits, bytes, a))
}

/// [`e8_fixed_dot`] of one activation, at any width.
fn e8_fixed_dot_one(bits: u8, bytes: &[u8], a: &E8Activation) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if (2..=8).contains(&bits) && crate::simd::has_avx2() {
        // SAFETY: AVX2 and FMA are present; the row holds `bits` bytes per word and the
        // activation 7 + 1 + 1 values per word (E8Activation::new).
        let dot = unsafe { crate::avx2::e8_fixed_any(bits as u32, bytes, &a.t, &a.half, &a.last) };
        return dot - (1u32 << (bits - 1)) as f32 * a.sum;
    }
    e8_fixed_dot_portable(bits, bytes, a)
}

multiversion! {
    fn e8_fixed_dot_portable(bits: u8, bytes: &[u8], a: &E8Activation) -> f32 {
        match bits {
            2 => e8_fields::<2>(bytes, a),
            3 => e8_fields::<3>(bytes, a),
            4 => e8_fields4(bytes, a),
            5 => e8_fields::<5>(bytes, a),
            6 => e8_fields::<6>(bytes, a),
            7 => e8_fields::<7>(bytes, a),
            _ => e8_fields::<8>(bytes, a),
        }
    }
}

#[inline(always)]
fn unzz(z: u32) -> i32 {
    ((z >> 1) as i32) ^ -((z & 1) as i32)
}

/// `⟨p, x'⟩` of one row of unbounded (entropy-coded) E8 symbols (`8·nw` of them): per word,
/// coordinates `unzz(s_i) (+ ½c)` for i in 1..8 and `2t + parity (+ ½c)` with
/// `c = s₀ & 1`, `t = unzz(s₀ >> 1)`.
pub(crate) fn e8_coded_dot(syms: &[u32], a: &E8Activation) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() && syms.len() >= 8 * a.words {
        // SAFETY: AVX2 and FMA are present; the row holds 8·words symbols and the shifted
        // activation 8·words + 1 values.
        return unsafe {
            crate::avx2::e8_coded_dot(&syms[..8 * a.words], &a.shifted, &a.half, &a.last)
        };
    }
    e8_coded_dot_portable(syms, a)
}

multiversion! {
    fn e8_coded_dot_portable(syms: &[u32], a: &E8Activation) -> f32 {
        let nw = a.words;
        let mut acc = [0f32; LANES];
        for (w, s) in syms.chunks_exact(8).enumerate().take(nw) {
            let mut v = [0f32; LANES];
            let mut par = 0i32;
            for i in 1..8 {
                let n = unzz(s[i]);
                par ^= n;
                v[i] = n as f32 * a.t[(i - 1) * nw + w];
            }
            let c = s[0] & 1;
            let t = unzz(s[0] >> 1);
            v[0] = c as f32 * a.half[w] + (2 * t + (par & 1)) as f32 * a.last[w];
            for l in 0..LANES {
                acc[l] += v[l];
            }
        }
        hsum(acc)
    }
}

multiversion! {
    /// `Σ_b scale_b · table[b·k + idx_b]` over a codebook row (`idx.len()` blocks); `scales`
    /// holds one scale per block, or one for the row when its length is 1.
    pub(crate) fn codebook_dot(idx: &[u32], k: usize, table: &[f32], scales: &[f32]) -> f32 {
        let mut acc = [0f32; LANES];
        if scales.len() == 1 {
            for (b, &i) in idx.iter().enumerate() {
                acc[b % LANES] += table[b * k + i as usize];
            }
            return hsum(acc) * scales[0];
        }
        for (b, (&i, &s)) in idx.iter().zip(scales).enumerate() {
            acc[b % LANES] += s * table[b * k + i as usize];
        }
        hsum(acc)
    }
}

/// `⟨decoded trellis row, xr⟩` (before the row scale) for each of `M` activation rows of the
/// same length, of the row whose bits start at byte `start` of `bits` (the tensor's): per
/// tail-biting sequence, AVX2 computes the code sums of the values whose windows do not wrap
/// (`c1·Σ sum·x + c0·Σ x`, reading up to 16 bytes ahead, into the next rows where there are
/// any; the 1MAD code or pairs), once for all `M` rows (one call per activation row paid the
/// decode `M` times); the first few (wrapped) values go through the trellis crate's
/// reference decoder, the last few through a scalar window read; without AVX2 every sequence
/// is decoded by the reference decoder, then dotted.
pub(crate) fn trellis_rows_dot<const M: usize>(
    bits: &[u8],
    start: usize,
    p: &hypercodec_trellis::TrellisParams,
    seq: usize,
    xr: [&[f32]; M],
    buf: &mut Vec<f32>,
) -> Result<[f32; M], hypercodec_trellis::TrellisError> {
    let (l, k) = (p.l as usize, p.k as usize);
    let (c1, c0) = p.affine();
    let mut acc = [0f32; M];
    let n_row = xr[0].len();
    // Calibrated rows: sequences of 16 values at once (all but a longer last one).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut done = 0;
    // Sequences of 16 (calibrated rows) fused for the 1MAD code; pairs take the loop below.
    let pairs = p.v == 2;
    if !pairs && seq == 16 && k <= 4 && l <= 16 * k && crate::simd::has_avx2() {
        #[cfg(target_arch = "x86_64")]
        {
            // The last sequence takes the rest: whole when the row is a multiple of 16.
            let whole = if n_row.is_multiple_of(16) {
                n_row
            } else {
                (n_row / 16).saturating_sub(1) * 16
            };
            // SAFETY: AVX2 and FMA are present; the row's first `whole / 16` sequences are
            // `2k` bytes each from `start`.
            let (s, xs) = unsafe {
                crate::avx2::trellis_seq16_dot(
                    &bits[start..start + whole / 8 * k],
                    l,
                    k,
                    xr.map(|x| &x[..whole]),
                )
            };
            for r in 0..M {
                acc[r] += c1 * s[r] + c0 * xs[r];
            }
            done = whole;
        }
    }
    for q in hypercodec_trellis::row_sequences(n_row, seq) {
        if q.end <= done {
            continue;
        }
        let from = start + q.start * k / 8;
        let src = &bits[from..start + (q.end * k).div_ceil(8)];
        let x = xr.map(|x| &x[q.clone()]);
        let n = q.len();
        // The first value whose window does not wrap (with pairs: the first pair's first value).
        let first = if pairs {
            2 * l.saturating_sub(2 * k).div_ceil(2 * k)
        } else {
            (l - k).div_ceil(k)
        }
        .min(n);
        if crate::simd::has_avx2() && n > first {
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: AVX2 and FMA are present; `bits[from..]` holds the sequence's n·K
                // bits (and whatever follows); value `first` is past the wrapped windows (and
                // even for pairs).
                let (s, xs, done) = unsafe {
                    if pairs {
                        crate::avx2::trellis_sums_dot::<true, M>(&bits[from..], l, k, first, x)
                    } else if crate::simd::has_avx512_vnni() {
                        crate::avx2::trellis_sums_dot512(&bits[from..], l, k, first, x)
                    } else {
                        crate::avx2::trellis_sums_dot::<false, M>(&bits[from..], l, k, first, x)
                    }
                };
                for r in 0..M {
                    acc[r] += c1 * s[r] + c0 * xs[r];
                }
                for i in (0..first).chain(done..n) {
                    let v = if i < first || pairs {
                        hypercodec_trellis::value_at(src, n, p, i)?
                    } else {
                        p.value(hypercodec_trellis::window(src, (i + 1) * k - l, l as u32))
                    };
                    for r in 0..M {
                        acc[r] += v * x[r][i];
                    }
                }
                continue;
            }
        }
        buf.resize(n, 0.0);
        hypercodec_trellis::decode_into(src, p, buf)?;
        for r in 0..M {
            acc[r] += dot_f32(buf, x[r]);
        }
    }
    Ok(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of the pair code (two values per state) takes the decode-then-dot path: the same
    /// sum as its decoded values dotted, for whole and ragged sequences, calibrated (16) or not.
    #[test]
    fn pair_coded_rows_dot_as_their_decoded_values() {
        use hypercodec_trellis::{decode_row, encode, row_sequences, TrellisParams};
        for (l, k, cols, seq) in [
            (12u8, 2u8, 96usize, 32usize),
            (16, 4, 200, 16),
            (14, 3, 64, 64),
        ] {
            let p = TrellisParams::pairs(l, k);
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
                .collect();
            let w: Vec<f32> = (0..cols)
                .map(|i| ((i * 53) % 89) as f32 / 40.0 - 1.1)
                .collect();
            let mut bits = vec![0u8; (cols * k as usize).div_ceil(8)];
            for q in row_sequences(cols, seq) {
                let b = encode(&w[q.clone()], &p).unwrap();
                // Every sequence starts on a byte (seq a multiple of 8).
                let at = q.start * k as usize / 8;
                for (i, v) in b.iter().enumerate() {
                    bits[at + i] |= v;
                }
            }
            let mut dec = vec![0f32; cols];
            decode_row(&bits, seq, &p, &mut dec).unwrap();
            let want: f32 = dec.iter().zip(&x).map(|(a, b)| a * b).sum();
            let [got] = trellis_rows_dot(&bits, 0, &p, seq, [&x], &mut Vec::new()).unwrap();
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                "L {l} K {k}: {got} vs {want}"
            );
            // And the decoded row is a good approximation of w (the code works through rows).
            let err: f32 = dec
                .iter()
                .zip(&w)
                .map(|(a, b)| (a - b).powi(2))
                .sum::<f32>()
                / cols as f32;
            let sig: f32 = w.iter().map(|v| v * v).sum::<f32>() / cols as f32;
            assert!(err < 0.2 * sig, "L {l} K {k}: error {err} of {sig}");
        }
    }

    /// The trellis code-sum dots (AVX2 shuffles, AVX-512 permutes) against the reference
    /// decoder, for every K, several L, windows starting at every bit offset.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn trellis_sums_dots_match_the_reference_decoder() {
        use hypercodec_trellis::{decode, TrellisParams};
        if !crate::simd::has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        for (l, k) in [
            (8u8, 1u8),
            (9, 2),
            (12, 3),
            (12, 4),
            (16, 2),
            (16, 5),
            (14, 8),
        ] {
            // The 1MAD code, and pairs where they exist (K <= 4, 2K < L).
            for pairs in [false, true] {
                if pairs && (k > 4 || 2 * k >= l) {
                    continue;
                }
                let p = if pairs {
                    TrellisParams::pairs(l, k)
                } else {
                    TrellisParams::new(l, k)
                };
                let n = 204;
                let bits: Vec<u8> = (0..(n * k as usize).div_ceil(8) + 40)
                    .map(|i| (i as u32).wrapping_mul(2654435761).rotate_left(7) as u8)
                    .collect();
                let stream = &bits[..(n * k as usize).div_ceil(8)];
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
                    .collect();
                let want = decode(stream, n, &p).unwrap();
                let (c1, c0) = p.affine();
                let first = if pairs {
                    2 * (l as usize)
                        .saturating_sub(2 * k as usize)
                        .div_ceil(2 * k as usize)
                } else {
                    (l - k).div_ceil(k) as usize
                };
                // Three more activation rows for the multi-row forms.
                let x2: Vec<f32> = x.iter().rev().copied().collect();
                let x3: Vec<f32> = x.iter().map(|v| v * v - 0.3).collect();
                let x4: Vec<f32> = x
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v * (i % 3) as f32)
                    .collect();
                let check = |x: &[f32], s: f32, xs: f32, done: usize, what: &str| {
                    let ours = c1 * s + c0 * xs;
                    let reference: f32 = (first..done).map(|i| want[i] * x[i]).sum();
                    let tol = 1e-4 * (first..done).map(|i| (want[i] * x[i]).abs()).sum::<f32>();
                    assert!(
                        (ours - reference).abs() <= tol.max(1e-5) && done + 40 >= n,
                        "{what} L {l} K {k} pairs {pairs}: {ours} vs {reference} ({done} of {n})"
                    );
                };
                let one = |(s, xs, done): ([f32; 1], [f32; 1], usize), what: &str| {
                    check(&x, s[0], xs[0], done, what)
                };
                let four = |(s, xs, done): ([f32; 4], [f32; 4], usize), what: &str| {
                    for (r, x) in [&x, &x2, &x3, &x4].into_iter().enumerate() {
                        check(x, s[r], xs[r], done, &format!("{what}, row {r} of 4"));
                    }
                };
                let rows = [&x[..], &x2, &x3, &x4];
                let (l, k) = (l as usize, k as usize);
                // SAFETY: AVX2 checked above; `bits` holds the stream and 40 bytes beyond.
                unsafe {
                    use crate::avx2::{trellis_sums_dot, trellis_sums_dot512};
                    if pairs {
                        one(
                            trellis_sums_dot::<true, 1>(&bits, l, k, first, [&x]),
                            "avx2",
                        );
                        four(
                            trellis_sums_dot::<true, 4>(&bits, l, k, first, rows),
                            "avx2",
                        );
                        continue;
                    }
                    one(
                        trellis_sums_dot::<false, 1>(&bits, l, k, first, [&x]),
                        "avx2",
                    );
                    four(
                        trellis_sums_dot::<false, 4>(&bits, l, k, first, rows),
                        "avx2",
                    );
                    if crate::simd::has_avx512_vnni() {
                        // AVX-512 VBMI and VNNI checked.
                        one(trellis_sums_dot512::<1>(&bits, l, k, first, [&x]), "avx512");
                        four(trellis_sums_dot512::<4>(&bits, l, k, first, rows), "avx512");
                    }
                }
            }
        }
    }

    /// The dispatched kernels (AVX2 where the CPU has it) against their portable twins.
    #[test]
    fn dispatched_kernels_match_the_portable_ones() {
        let rnd = |n: usize, k: u64| -> Vec<f32> {
            (0..n)
                .map(|i| ((i as u64 * 2654435761 + k) % 1000) as f32 / 500.0 - 1.0)
                .collect()
        };
        for cols in [8usize, 40, 128, 1000, 4096] {
            let x = rnd(cols, 1);
            let y = rnd(cols, 2);
            let (a, b) = (dot_f32(&x, &y), dot_f32_portable(&x, &y));
            assert!(
                (a - b).abs() <= 1e-4 * x.iter().zip(&y).map(|(p, q)| (p * q).abs()).sum::<f32>()
            );
            for bits in 1..=8u8 {
                let per = word_codes(bits);
                let glen = 128.min(cols / 8 * 8).max(8);
                let cols = cols / glen * glen;
                if cols == 0 {
                    continue;
                }
                let codes: Vec<u8> = (0..cols * bits as usize / 8)
                    .map(|i| (i * 37 + 11) as u8)
                    .collect();
                let gpr = cols / glen;
                let row = AffineRow {
                    field_bits: bits,
                    per,
                    glen,
                    codes: &codes,
                    xp: &x[..cols],
                    gsum: &rnd(gpr, 3),
                    scales: &rnd(gpr, 4),
                    offsets: &rnd(gpr, 5),
                    bias: 0.0,
                };
                let portable = affine_row_with(&row, dot_fields_of);
                // The f64 path (rows whose f32 sums overflow) reads the same words.
                let wide = affine_row_f64(&row);
                assert!(
                    (wide - portable).abs() <= 1e-4 * (1.0 + cols as f32 * 0.01),
                    "{bits} {cols}: f64 {wide} vs {portable}"
                );
                let got = affine_row(&row);
                let tol = 1e-4 * (1.0 + cols as f32 * 0.01);
                assert!(
                    (got - portable).abs() <= tol,
                    "{bits} {cols}: {got} vs {portable}"
                );
                #[cfg(target_arch = "x86_64")]
                if crate::simd::has_avx2() {
                    // The AVX2 kernel too, when the dispatch above chose AVX-512.
                    // SAFETY: AVX2 and FMA are present.
                    let avx2 = unsafe { crate::avx2::affine_row(&row) };
                    assert!(
                        (avx2 - portable).abs() <= tol,
                        "{bits} {cols}: {avx2} vs {portable}"
                    );
                }
            }
            let words = cols / 8;
            for bits in 2..=8u8 {
                if words == 0 {
                    break;
                }
                let act = E8Activation::new(&x[..8 * words]);
                let n = bits as usize * words;
                let bytes: Vec<u8> = (0..n).map(|i| (i * 101 + 7) as u8).collect();
                let a = e8_fixed_dot(bits, &bytes, &act);
                let b = e8_fixed_dot_portable(bits, &bytes, &act);
                assert!(
                    (a - b).abs() <= 1e-3 * (1.0 + b.abs()),
                    "{bits} bits, {cols}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn coded_e8_dot_matches_the_portable_one() {
        for words in [1usize, 3, 64] {
            let x: Vec<f32> = (0..8 * words)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                .collect();
            let act = E8Activation::new(&x);
            let syms: Vec<u32> = (0..8 * words as u32)
                .map(|i| i.wrapping_mul(2654435761) >> 27)
                .collect();
            let (a, b) = (
                e8_coded_dot(&syms, &act),
                e8_coded_dot_portable(&syms, &act),
            );
            assert!(
                (a - b).abs() <= 1e-3 * (1.0 + b.abs()),
                "{words}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn field_dot_matches_the_plain_sum() {
        // Word counts below, at and past the vector loops' 16-word runs and their 8-word step.
        for (bits, n) in (1..=8u8).flat_map(|b| [1usize, 8, 16, 17, 24, 31, 37, 64].map(|n| (b, n)))
        {
            let per = word_codes(bits);
            // (a group of 5- or 7-bit lane words starts and ends on a byte: an even count)
            let n = if lane_bits(bits).is_multiple_of(8) {
                n
            } else {
                n + n % 2
            };
            let codes: Vec<u8> = (0..n * per * bits as usize / 8)
                .map(|i| (i * 97 + 13) as u8)
                .collect();
            let x: Vec<f32> = (0..n * per).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut xp = vec![0f32; n * per];
            let mut want = 0f64;
            for i in 0..n {
                for m in 0..per {
                    // Code i·per + m: its bits, LSB-first across the bytes.
                    let bit = (i * per + m) * bits as usize;
                    let q = (0..bits as usize).fold(0u32, |v, k| {
                        v | ((codes[(bit + k) / 8] as u32 >> ((bit + k) % 8)) & 1) << k
                    });
                    xp[m * n + i] = x[i * per + m];
                    want += q as f64 * x[i * per + m] as f64;
                }
            }
            let got = dot_fields_of(bits, &codes, &xp) as f64;
            assert!((got - want).abs() < 1e-3, "{bits}, {n}: {got} vs {want}");
            #[cfg(target_arch = "x86_64")]
            if crate::simd::has_avx2() {
                // The AVX2 rows kernel on the same words, its tail and its 16-word runs.
                let row = AffineRow {
                    field_bits: bits,
                    per,
                    glen: n * per,
                    codes: &codes,
                    xp: &xp,
                    gsum: &[0.0],
                    scales: &[1.0],
                    offsets: &[0.0],
                    bias: 0.0,
                };
                let mut out = [0f32; 2];
                let xp2 = [xp.clone(), xp.clone()].concat();
                let two = AffineRow {
                    xp: &xp2,
                    gsum: &[0.0, 0.0],
                    ..row
                };
                // SAFETY: AVX2 and FMA are present; two rows of n·per values and one group each.
                unsafe { crate::avx2::affine_rows::<2>(&two, n * per, (n * per, 1), &mut out) };
                // SAFETY: as above.
                let one = unsafe { crate::avx2::affine_row(&row) } as f64;
                // And the dispatched ones (AVX-512 where the CPU has it).
                let mut out2 = [0f32; 2];
                affine_rows(&two, n * per, 1, &mut out2);
                let dispatched = [affine_row(&row), out2[0], out2[1]].map(f64::from);
                for got in [one, out[0] as f64, out[1] as f64]
                    .into_iter()
                    .chain(dispatched)
                {
                    assert!(
                        (got - want).abs() < 1e-3,
                        "avx2 {bits}, {n}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
