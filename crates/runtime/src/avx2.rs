//! AVX2 + FMA versions of the two hottest loops (affine code fields, fixed-rate E8 words),
//! written with intrinsics because the portable loops do not reach 256-bit vectors. Each is
//! checked against its portable twin in [`crate::kernels`]'s tests.
#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// How a code becomes the integer it stands for: `q` (asymmetric), `q − h` (symmetric,
/// `h = 2^(b−1)`) or `2q − 1` (1-bit signs), applied in the integer lanes before conversion.
#[derive(Clone, Copy)]
struct Signed {
    double: bool,
    off: i32,
}

impl Signed {
    fn of(a: &crate::kernels::AffineRow<'_>) -> Self {
        if !a.offsets.is_empty() {
            Signed {
                double: false,
                off: 0,
            }
        } else if a.bias < 0.0 {
            Signed {
                double: true,
                off: 1,
            }
        } else {
            Signed {
                double: false,
                off: a.bias as i32,
            }
        }
    }

    #[inline(always)]
    fn apply(self, q: u8) -> f32 {
        (q as i32 * (1 + self.double as i32) - self.off) as f32
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn apply256(self, q: __m256i) -> __m256 {
        let q = if self.double {
            _mm256_add_epi32(q, q)
        } else {
            q
        };
        _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(self.off)))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    fn apply512(self, q: __m512i) -> __m512 {
        let q = if self.double {
            _mm512_add_epi32(q, q)
        } else {
            q
        };
        _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(self.off)))
    }
}

/// `pshufb` controls that put 4 lane words of `l` bits (from the first of 16 loaded bytes,
/// `adj` bytes into the load) each into a 32-bit lane: the bytes lane word `j` starts in and
/// the ones its bits reach, the rest zero. A word that starts mid-byte is shifted into place
/// by [`lane_shifts`].
const fn lane_shuffle(l: usize, adj: usize) -> [i8; 16] {
    let mut t = [-1i8; 16];
    let mut j = 0;
    while j < 4 {
        let bit = l * j;
        let need = (bit % 8 + l).div_ceil(8);
        let mut k = 0;
        while k < need {
            t[4 * j + k] = (bit / 8 + adj + k) as i8;
            k += 1;
        }
        j += 1;
    }
    t
}

/// The right shift of each of 8 lanes of [`lane_shuffle`]'s words (their start within a byte).
const fn lane_shifts(l: usize) -> [i32; 8] {
    let mut s = [0i32; 8];
    let mut j = 0;
    while j < 8 {
        s[j] = ((l * (j % 4)) % 8) as i32;
        j += 1;
    }
    s
}

/// The controls of [`lane_shuffle`] and [`lane_shifts`] for lane words of `L` bits, as
/// constants (made literal vectors: loaded from an array in the loop, the 3-bit rows loop ran a
/// fifth slower).
struct Lanes<const L: usize>;

impl<const L: usize> Lanes<L> {
    const T0: [i8; 16] = lane_shuffle(L, 0);
    const T1: [i8; 16] = lane_shuffle(L, 16 - L / 2);
    const SHIFTS: [i32; 8] = lane_shifts(L);
}

/// A `pshufb` control from constant bytes (a literal vector: the constant is folded).
#[inline(always)]
fn control(t: [i8; 16]) -> __m128i {
    // SAFETY: SSE2 is part of x86_64.
    unsafe {
        _mm_setr_epi8(
            t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11], t[12], t[13],
            t[14], t[15],
        )
    }
}

/// Four lane words from the 16 bytes at `p` through the shuffle `t`.
///
/// # Safety
/// AVX2; `p` readable for 16 bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn lanes4(p: *const u8, t: __m128i) -> __m128i {
    // SAFETY: the caller's bounds.
    unsafe { _mm_shuffle_epi8(_mm_loadu_si128(p as *const __m128i), t) }
}

/// Eight lane words (two registers' worth of [`lanes4`]) shifted into place.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn placed<const L: usize>(lo: __m128i, hi: __m128i) -> __m256i {
    let v = _mm256_set_m128i(hi, lo);
    if L.is_multiple_of(8) {
        v
    } else {
        let s = Lanes::<L>::SHIFTS;
        _mm256_srlv_epi32(
            v,
            _mm256_setr_epi32(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
        )
    }
}

/// Lane words `i..i + 16` of `L` bits at `p` (byte codes for `L = 8`; 8 codes of 3 bits or 4
/// of 6 in 24; 4 codes of 5 bits in 20, of 7 in 28), each zero-extended into a 32-bit lane
/// (words `i..i + 8` in the first register). The last 4 come from a load that ends at the
/// 16th word, so nothing past `2·L` bytes is read.
///
/// # Safety
/// AVX2; `p` must be readable for `16·L / 8` bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn words16<const L: usize>(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's bounds.
    unsafe {
        if L == 8 {
            let c = _mm_loadu_si128(p as *const __m128i);
            (
                _mm256_cvtepu8_epi32(c),
                _mm256_cvtepu8_epi32(_mm_srli_si128(c, 8)),
            )
        } else {
            let (t0, t1) = (control(Lanes::<L>::T0), control(Lanes::<L>::T1));
            let q0 = lanes4(p, t0);
            let q1 = lanes4(p.add(L / 2), t0);
            let q2 = lanes4(p.add(L), t0);
            let q3 = lanes4(p.add(2 * L - 16), t1);
            (placed::<L>(q0, q1), placed::<L>(q2, q3))
        }
    }
}

/// [`words16`] in one 512-bit register.
///
/// # Safety
/// As [`words16`], with AVX-512F.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn words16_512<const L: usize>(p: *const u8) -> __m512i {
    // SAFETY: the caller's bounds.
    unsafe {
        if L == 8 {
            _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
        } else {
            let (lo, hi) = words16::<L>(p);
            _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
        }
    }
}

/// Lane words `i..i + 8` of `L` bits at `p`, as [`words16`]: the 8 words a group's end leaves
/// after the 16-word runs (a group of 64 3-bit codes is 8 words).
///
/// # Safety
/// AVX2; `p` must be readable for `8·L / 8` bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn words8<const L: usize>(p: *const u8) -> __m256i {
    // SAFETY: the caller's bounds.
    unsafe {
        if L == 8 {
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
        } else {
            let (t0, t1) = (control(Lanes::<L>::T0), control(Lanes::<L>::T1));
            placed::<L>(lanes4(p, t0), lanes4(p.add(L - 16), t1))
        }
    }
}

/// `Σ q·x` over every field of `B`-bit codes in lane words of `L` bits in one pass over the
/// words (each 16 words are loaded once for all `L/B` fields); the lane sums are left in a
/// register.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fields_pass<const B: u32, const L: usize>(
    codes: &[u8],
    xp: &[f32],
    sign: Signed,
) -> __m256 {
    let per = L / B as usize;
    let n = codes.len() * 8 / L;
    let mask = _mm256_set1_epi32(((1u32 << B) - 1) as i32);
    // Four chains of additions, so the FMA latency is hidden.
    let mut acc = [_mm256_setzero_ps(); 4];
    let full = n / 16 * 16;
    let mut tail = 0f32;
    // SAFETY: words i..i + 16 with i + 16 <= full lie in the codes; field m's run of xp is
    // xp[m·n..(m+1)·n].
    unsafe {
        let mut i = 0;
        while i < full {
            let (lo, hi) = words16::<L>(codes.as_ptr().add(L * i / 8));
            for m in 0..per {
                let shift = _mm_cvtsi32_si128((m as u32 * B) as i32);
                let xs = xp.as_ptr().add(m * n + i);
                let fl = sign.apply256(_mm256_and_si256(_mm256_srl_epi32(lo, shift), mask));
                let fh = sign.apply256(_mm256_and_si256(_mm256_srl_epi32(hi, shift), mask));
                let k = 2 * (m & 1);
                acc[k] = _mm256_fmadd_ps(fl, _mm256_loadu_ps(xs), acc[k]);
                acc[k + 1] = _mm256_fmadd_ps(fh, _mm256_loadu_ps(xs.add(8)), acc[k + 1]);
            }
            i += 16;
        }
    }
    // SAFETY: words full..full + 8 lie in the codes.
    let full = if n - full >= 8 {
        unsafe {
            let c = words8::<L>(codes.as_ptr().add(L * full / 8));
            for m in 0..per {
                let shift = _mm_cvtsi32_si128((m as u32 * B) as i32);
                let f = sign.apply256(_mm256_and_si256(_mm256_srl_epi32(c, shift), mask));
                let k = 2 * (m & 1);
                acc[k] = _mm256_fmadd_ps(f, _mm256_loadu_ps(xp.as_ptr().add(m * n + full)), acc[k]);
            }
        }
        full + 8
    } else {
        full
    };
    for j in full..n {
        let c = crate::kernels::word_at::<L>(codes, j);
        for m in 0..per {
            tail += sign.apply(((c >> (m as u32 * B)) & ((1u32 << B) - 1)) as u8) * xp[m * n + j];
        }
    }
    let mut t = [0f32; 8];
    t[0] = tail;
    // SAFETY: t holds 8 floats.
    let t = unsafe { _mm256_loadu_ps(t.as_ptr()) };
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    _mm256_add_ps(s, t)
}

/// `⟨ŵ_r, x⟩` of one affine row (see `kernels::affine_row`), the group loop and the field
/// loops in one AVX2 function.
///
/// # Safety
/// The CPU must have AVX2 and FMA; the row's parts must be consistent (`kernels::AffineRow`).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn affine_row(a: &crate::kernels::AffineRow<'_>) -> f32 {
    // SAFETY: the caller's (the field width picked once a row, not once a group).
    unsafe { crate::kernels::by_width!(a.field_bits, B, L => row256::<B, L>(a)) }
}

/// [`affine_row`] for `B`-bit fields in lane words of `L` bits.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn row256<const B: u32, const L: usize>(a: &crate::kernels::AffineRow<'_>) -> f32 {
    let cols = a.xp.len();
    let sign = Signed::of(a);
    // Σ_j s_j·(Σ q·x)_j accumulated in a register (one horizontal sum per row, not per
    // group); the offset and bias terms (per group, scalar) beside it.
    let mut row = _mm256_setzero_ps();
    let mut scalar = 0f32;
    for (j, &gs) in a.gsum.iter().enumerate() {
        let (lo, hi) = (j * a.glen, ((j + 1) * a.glen).min(cols));
        let codes = &a.codes[lo * B as usize / 8..hi * B as usize / 8];
        let xs = &a.xp[lo..hi];
        // SAFETY: xs holds a group's permuted activation: per values a code word.
        let d = unsafe { fields_pass::<B, L>(codes, xs, sign) };
        let si = j.min(a.scales.len() - 1);
        let s = a.scales[si];
        // The codes are signed in the vector loop (no cancellation against Σx); only the
        // asymmetric offset's term is left.
        let (mul, add) = if a.offsets.is_empty() {
            (s, 0.0)
        } else {
            (s, a.offsets[si] * gs)
        };
        row = _mm256_fmadd_ps(_mm256_set1_ps(mul), d, row);
        scalar += add;
    }
    hsum(row) + scalar
}

/// [`affine_row`] with 512-bit vectors (16 lanes per register; AVX-512F/BW), for CPUs that
/// have them: half the instructions per weight of the AVX2 loop. Kept apart from
/// [`affine_row`] on purpose: a group iterator shared by the two measured 15–20 % slower.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW; the row's parts must be consistent.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
pub(crate) unsafe fn affine_row512(a: &crate::kernels::AffineRow<'_>) -> f32 {
    // SAFETY: the caller's (the field width picked once a row, not once a group).
    unsafe { crate::kernels::by_width!(a.field_bits, B, L => row512::<B, L>(a)) }
}

/// [`affine_row512`] for `B`-bit fields in lane words of `L` bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn row512<const B: u32, const L: usize>(a: &crate::kernels::AffineRow<'_>) -> f32 {
    let cols = a.xp.len();
    let sign = Signed::of(a);
    let mut row = _mm512_setzero_ps();
    let mut scalar = 0f32;
    for (j, &gs) in a.gsum.iter().enumerate() {
        let (lo, hi) = (j * a.glen, ((j + 1) * a.glen).min(cols));
        let codes = &a.codes[lo * B as usize / 8..hi * B as usize / 8];
        let xs = &a.xp[lo..hi];
        // SAFETY: xs holds a group's permuted activation: per values a code word.
        let d = unsafe { fields_pass512::<B, L>(codes, xs, sign) };
        let si = j.min(a.scales.len() - 1);
        let s = a.scales[si];
        // The codes are signed in the vector loop (no cancellation against Σx); only the
        // asymmetric offset's term is left.
        let (mul, add) = if a.offsets.is_empty() {
            (s, 0.0)
        } else {
            (s, a.offsets[si] * gs)
        };
        row = _mm512_fmadd_ps(_mm512_set1_ps(mul), d, row);
        scalar += add;
    }
    _mm512_reduce_add_ps(row) + scalar
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn fields_pass512<const B: u32, const L: usize>(
    codes: &[u8],
    xp: &[f32],
    sign: Signed,
) -> __m512 {
    let per = L / B as usize;
    let n = codes.len() * 8 / L;
    let mask = _mm512_set1_epi32(((1u32 << B) - 1) as i32);
    let mut acc = [_mm512_setzero_ps(); 2];
    let full = n / 16 * 16;
    // SAFETY: as in fields_pass.
    unsafe {
        let mut i = 0;
        while i < full {
            let c = words16_512::<L>(codes.as_ptr().add(L * i / 8));
            for m in 0..per {
                let shift = _mm_cvtsi32_si128((m as u32 * B) as i32);
                let q = sign.apply512(_mm512_and_si512(_mm512_srl_epi32(c, shift), mask));
                let k = m & 1;
                acc[k] = _mm512_fmadd_ps(q, _mm512_loadu_ps(xp.as_ptr().add(m * n + i)), acc[k]);
            }
            i += 16;
        }
    }
    let s = _mm512_add_ps(acc[0], acc[1]);
    if full == n {
        return s;
    }
    // SAFETY: as above.
    _mm512_add_ps(s, unsafe { fields_rest512::<B, L>(codes, xp, full, sign) })
}

/// [`fields_pass512`]'s words from `full` on (fewer than 16): 8 in one vector step where there
/// are, the rest one by one. Out of line: most groups have none, and inlined it slowed the
/// 4-bit loop by a fifth.
///
/// # Safety
/// As [`fields_pass512`].
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn fields_rest512<const B: u32, const L: usize>(
    codes: &[u8],
    xp: &[f32],
    full: usize,
    sign: Signed,
) -> __m512 {
    let per = L / B as usize;
    let n = codes.len() * 8 / L;
    let mask = _mm512_set1_epi32(((1u32 << B) - 1) as i32);
    let mut acc = _mm512_setzero_ps();
    // SAFETY: words full..full + 8 lie in the codes; the upper lanes hold zero codes against
    // zero activations (a masked load reads 8 floats).
    let full = if n - full >= 8 {
        unsafe {
            let c = _mm512_zextsi256_si512(words8::<L>(codes.as_ptr().add(L * full / 8)));
            for m in 0..per {
                let shift = _mm_cvtsi32_si128((m as u32 * B) as i32);
                let q = sign.apply512(_mm512_and_si512(_mm512_srl_epi32(c, shift), mask));
                let xs = _mm512_maskz_loadu_ps(0x00FF, xp.as_ptr().add(m * n + full));
                acc = _mm512_fmadd_ps(q, xs, acc);
            }
        }
        full + 8
    } else {
        full
    };
    let mut tail = 0f32;
    for j in full..n {
        let c = crate::kernels::word_at::<L>(codes, j);
        for m in 0..per {
            tail += sign.apply(((c >> (m as u32 * B)) & ((1u32 << B) - 1)) as u8) * xp[m * n + j];
        }
    }
    let mut t = [0f32; 16];
    t[0] = tail;
    // SAFETY: t holds 16 floats.
    let t = unsafe { _mm512_loadu_ps(t.as_ptr()) };
    _mm512_add_ps(acc, t)
}

/// [`affine_row`] for `M` activation rows at once: `out[m]` for the permuted activation
/// `a.xp[m·x_stride..]` and group sums `a.gsum[m·g_stride..]` of a `cols`-value row. Each code
/// field is unpacked and converted once and feeds `M` FMAs, where `M` calls of [`affine_row`]
/// would unpack it `M` times (a small batch: prompts of a few tokens, beams, drafts).
///
/// # Safety
/// The CPU must have AVX2 and FMA; the row's parts must be consistent, and `a.xp` and
/// `a.gsum` must hold `M` rows at their strides.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn affine_rows<const M: usize>(
    a: &crate::kernels::AffineRow<'_>,
    cols: usize,
    (x_stride, g_stride): (usize, usize),
    out: &mut [f32],
) {
    // SAFETY: the caller's (the field width picked once a row, not once a group).
    unsafe {
        crate::kernels::by_width!(a.field_bits, B, L => rows256::<B, L, M>(a, cols, (x_stride, g_stride), out))
    }
}

/// [`affine_rows`] for `B`-bit fields in lane words of `L` bits.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows256<const B: u32, const L: usize, const M: usize>(
    a: &crate::kernels::AffineRow<'_>,
    cols: usize,
    (x_stride, g_stride): (usize, usize),
    out: &mut [f32],
) {
    let sign = Signed::of(a);
    let mut row = [_mm256_setzero_ps(); M];
    let mut scalar = [0f32; M];
    for j in 0..cols.div_ceil(a.glen.max(1)) {
        let (lo, hi) = (j * a.glen, ((j + 1) * a.glen).min(cols));
        let codes = &a.codes[lo * B as usize / 8..hi * B as usize / 8];
        // SAFETY: the caller's bounds: every row's group holds per values a code word.
        let d = unsafe { fields_pass_rows::<B, L, M>(codes, a.xp, lo, x_stride, sign) };
        let si = j.min(a.scales.len() - 1);
        let s = _mm256_set1_ps(a.scales[si]);
        for m in 0..M {
            row[m] = _mm256_fmadd_ps(s, d[m], row[m]);
            if !a.offsets.is_empty() {
                scalar[m] += a.offsets[si] * a.gsum[m * g_stride + j];
            }
        }
    }
    for m in 0..M {
        out[m] = hsum(row[m]) + scalar[m];
    }
}

/// [`fields_pass`] for `M` activation rows (`xp[m·stride + lo..]`): each 16 bytes of codes
/// loaded and each field unpacked once, two accumulators a row.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fields_pass_rows<const B: u32, const L: usize, const M: usize>(
    codes: &[u8],
    xp: &[f32],
    lo: usize,
    stride: usize,
    sign: Signed,
) -> [__m256; M] {
    let per = L / B as usize;
    let n = codes.len() * 8 / L;
    let mask = _mm256_set1_epi32(((1u32 << B) - 1) as i32);
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    let full = n / 16 * 16;
    // SAFETY: as in fields_pass; field k of row m reads xp[m·stride + lo + k·n..][..n], within
    // the caller's bounds.
    unsafe {
        let mut i = 0;
        while i < full {
            let (c_lo, c_hi) = words16::<L>(codes.as_ptr().add(L * i / 8));
            for k in 0..per {
                let shift = _mm_cvtsi32_si128((k as u32 * B) as i32);
                let fl = sign.apply256(_mm256_and_si256(_mm256_srl_epi32(c_lo, shift), mask));
                let fh = sign.apply256(_mm256_and_si256(_mm256_srl_epi32(c_hi, shift), mask));
                for (m, a) in acc.iter_mut().enumerate() {
                    let xs = xp.as_ptr().add(m * stride + lo + k * n + i);
                    a[0] = _mm256_fmadd_ps(fl, _mm256_loadu_ps(xs), a[0]);
                    a[1] = _mm256_fmadd_ps(fh, _mm256_loadu_ps(xs.add(8)), a[1]);
                }
            }
            i += 16;
        }
    }
    // SAFETY: words full..full + 8 lie in the codes; xp as above.
    let full = if n - full >= 8 {
        unsafe {
            let c = words8::<L>(codes.as_ptr().add(L * full / 8));
            for k in 0..per {
                let shift = _mm_cvtsi32_si128((k as u32 * B) as i32);
                let f = sign.apply256(_mm256_and_si256(_mm256_srl_epi32(c, shift), mask));
                for (m, a) in acc.iter_mut().enumerate() {
                    let xs = xp.as_ptr().add(m * stride + lo + k * n + full);
                    a[k & 1] = _mm256_fmadd_ps(f, _mm256_loadu_ps(xs), a[k & 1]);
                }
            }
        }
        full + 8
    } else {
        full
    };
    let mut d = [_mm256_setzero_ps(); M];
    for (m, (dm, a)) in d.iter_mut().zip(&acc).enumerate() {
        let mut tail = 0f32;
        for j in full..n {
            let c = crate::kernels::word_at::<L>(codes, j);
            for k in 0..per {
                let q = ((c >> (k as u32 * B)) & ((1u32 << B) - 1)) as u8;
                tail += sign.apply(q) * xp[m * stride + lo + k * n + j];
            }
        }
        *dm = _mm256_add_ps(
            _mm256_add_ps(a[0], a[1]),
            _mm256_setr_ps(tail, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        );
    }
    d
}

/// [`affine_rows`] with 512-bit vectors (up to 8 rows: 8 accumulators of 16 lanes).
///
/// # Safety
/// As [`affine_rows`], with AVX-512F/BW.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
pub(crate) unsafe fn affine_rows512<const M: usize>(
    a: &crate::kernels::AffineRow<'_>,
    cols: usize,
    (x_stride, g_stride): (usize, usize),
    out: &mut [f32],
) {
    // SAFETY: the caller's (the field width picked once a row, not once a group).
    unsafe {
        crate::kernels::by_width!(a.field_bits, B, L => rows512::<B, L, M>(a, cols, (x_stride, g_stride), out))
    }
}

/// [`affine_rows512`] for `B`-bit fields in lane words of `L` bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn rows512<const B: u32, const L: usize, const M: usize>(
    a: &crate::kernels::AffineRow<'_>,
    cols: usize,
    (x_stride, g_stride): (usize, usize),
    out: &mut [f32],
) {
    let sign = Signed::of(a);
    let mut row = [_mm512_setzero_ps(); M];
    let mut scalar = [0f32; M];
    for j in 0..cols.div_ceil(a.glen.max(1)) {
        let (lo, hi) = (j * a.glen, ((j + 1) * a.glen).min(cols));
        let codes = &a.codes[lo * B as usize / 8..hi * B as usize / 8];
        // SAFETY: as in affine_rows.
        let d = unsafe { fields_pass_rows512::<B, L, M>(codes, a.xp, lo, x_stride, sign) };
        let si = j.min(a.scales.len() - 1);
        let s = _mm512_set1_ps(a.scales[si]);
        for m in 0..M {
            row[m] = _mm512_fmadd_ps(s, d[m], row[m]);
            if !a.offsets.is_empty() {
                scalar[m] += a.offsets[si] * a.gsum[m * g_stride + j];
            }
        }
    }
    for m in 0..M {
        out[m] = _mm512_reduce_add_ps(row[m]) + scalar[m];
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn fields_pass_rows512<const B: u32, const L: usize, const M: usize>(
    codes: &[u8],
    xp: &[f32],
    lo: usize,
    stride: usize,
    sign: Signed,
) -> [__m512; M] {
    let per = L / B as usize;
    let n = codes.len() * 8 / L;
    let mask = _mm512_set1_epi32(((1u32 << B) - 1) as i32);
    let mut acc = [_mm512_setzero_ps(); M];
    let full = n / 16 * 16;
    // SAFETY: as in fields_pass_rows.
    unsafe {
        let mut i = 0;
        while i < full {
            let c = words16_512::<L>(codes.as_ptr().add(L * i / 8));
            for k in 0..per {
                let shift = _mm_cvtsi32_si128((k as u32 * B) as i32);
                let q = sign.apply512(_mm512_and_si512(_mm512_srl_epi32(c, shift), mask));
                for (m, a) in acc.iter_mut().enumerate() {
                    let xs = xp.as_ptr().add(m * stride + lo + k * n + i);
                    *a = _mm512_fmadd_ps(q, _mm512_loadu_ps(xs), *a);
                }
            }
            i += 16;
        }
    }
    if full < n {
        // SAFETY: as above.
        unsafe { rows_rest512::<B, L, M>(codes, xp, (lo, stride), full, sign, &mut acc) };
    }
    acc
}

/// [`fields_pass_rows512`]'s words from `full` on (fewer than 16), out of line as
/// [`fields_rest512`].
///
/// # Safety
/// As [`fields_pass_rows512`].
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn rows_rest512<const B: u32, const L: usize, const M: usize>(
    codes: &[u8],
    xp: &[f32],
    (lo, stride): (usize, usize),
    full: usize,
    sign: Signed,
    acc: &mut [__m512; M],
) {
    let per = L / B as usize;
    let n = codes.len() * 8 / L;
    let mask = _mm512_set1_epi32(((1u32 << B) - 1) as i32);
    // SAFETY: as in fields_pass512.
    let full = if n - full >= 8 {
        unsafe {
            let c = _mm512_zextsi256_si512(words8::<L>(codes.as_ptr().add(L * full / 8)));
            for k in 0..per {
                let shift = _mm_cvtsi32_si128((k as u32 * B) as i32);
                let q = sign.apply512(_mm512_and_si512(_mm512_srl_epi32(c, shift), mask));
                for (m, a) in acc.iter_mut().enumerate() {
                    let xs = _mm512_maskz_loadu_ps(
                        0x00FF,
                        xp.as_ptr().add(m * stride + lo + k * n + full),
                    );
                    *a = _mm512_fmadd_ps(q, xs, *a);
                }
            }
        }
        full + 8
    } else {
        full
    };
    for (m, a) in acc.iter_mut().enumerate() {
        let mut tail = 0f32;
        for j in full..n {
            let c = crate::kernels::word_at::<L>(codes, j);
            for k in 0..per {
                let q = ((c >> (k as u32 * B)) & ((1u32 << B) - 1)) as u8;
                tail += sign.apply(q) * xp[m * stride + lo + k * n + j];
            }
        }
        let mut t = [0f32; 16];
        t[0] = tail;
        // SAFETY: t holds 16 floats.
        *a = _mm512_add_ps(*a, unsafe { _mm512_loadu_ps(t.as_ptr()) });
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// `⟨p, x'⟩` of a row of 4-bit fixed-rate E8 words (see `kernels::e8_fields4`), eight words
/// (one `u32` each) per step.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `bytes.len() == 4·a.words`, `t.len() == 7·a.words`,
/// `half.len() == last.len() == a.words`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn e8_fixed4<const M: usize>(
    bytes: &[u8],
    t: [&[f32]; M],
    half: [&[f32]; M],
    last: [&[f32]; M],
) -> [f32; M] {
    // SAFETY: the caller guarantees the CPU features and the lengths (see above).
    unsafe {
        let nw = half[0].len();
        debug_assert!(bytes.len() == 4 * nw);
        debug_assert!((0..M).all(|r| t[r].len() == 7 * nw && last[r].len() == nw));
        let nib = _mm256_set1_epi32(15);
        let one = _mm256_set1_epi32(1);
        let even = _mm256_set1_epi32(14);
        let pbits = _mm256_set1_epi32(0x1111_1110);
        // Accumulator chains: four for one row, two a row for several (their rows are
        // independent chains already).
        let chains = if M == 1 { 4 } else { 2 };
        let mut acc = [[_mm256_setzero_ps(); M]; 4];
        let full = nw / 8 * 8;
        let mut w = 0;
        while w < full {
            // SAFETY (all loads): w + 8 <= nw words of bytes, half, last and of each t row.
            let v = _mm256_loadu_si256(bytes.as_ptr().add(4 * w) as *const __m256i);
            macro_rules! field {
                ($i:literal) => {
                    let q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 4 * $i), nib));
                    let k = ($i - 1) % chains;
                    for r in 0..M {
                        acc[k][r] = _mm256_fmadd_ps(
                            q,
                            _mm256_loadu_ps(t[r].as_ptr().add(($i - 1) * nw + w)),
                            acc[k][r],
                        );
                    }
                };
            }
            field!(1);
            field!(2);
            field!(3);
            field!(4);
            field!(5);
            field!(6);
            field!(7);
            let s0 = _mm256_and_si256(v, nib);
            let mut p = _mm256_and_si256(v, pbits);
            p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 16));
            p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 8));
            p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 4));
            let par = _mm256_and_si256(p, one);
            let c = _mm256_cvtepi32_ps(_mm256_and_si256(s0, one));
            let l = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_and_si256(s0, even), par));
            for r in 0..M {
                acc[chains - 1][r] = _mm256_fmadd_ps(
                    c,
                    _mm256_loadu_ps(half[r].as_ptr().add(w)),
                    acc[chains - 1][r],
                );
                acc[0][r] = _mm256_fmadd_ps(l, _mm256_loadu_ps(last[r].as_ptr().add(w)), acc[0][r]);
            }
            w += 8;
        }
        let mut out = [0f32; M];
        for w in full..nw {
            let c = &bytes[4 * w..4 * w + 4];
            let v = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let s0 = v & 15;
            let par = (v & 0x1111_1110).count_ones() & 1;
            for r in 0..M {
                for i in 1..8 {
                    out[r] += ((v >> (4 * i)) & 15) as f32 * t[r][(i - 1) * nw + w];
                }
                out[r] += (s0 & 1) as f32 * half[r][w] + ((s0 & 14) + par) as f32 * last[r][w];
            }
        }
        for r in 0..M {
            let s = _mm256_add_ps(
                _mm256_add_ps(acc[0][r], acc[1][r]),
                _mm256_add_ps(acc[2][r], acc[3][r]),
            );
            out[r] += hsum(s);
        }
        out
    }
}

/// `⟨p, x'⟩` of a row of fixed-rate E8 words of any `bits` (2..=8; see
/// `kernels::e8_fields`), eight words per step, each symbol field fetched for the eight
/// words by one 32-bit gather at its byte offset, then shifted and masked. The words whose
/// gathers would read past the row's end go the scalar way.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `bytes.len() == bits·a.words`, `t.len() == 7·a.words`,
/// `half.len() == last.len() == a.words`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn e8_fixed_any(
    bits: u32,
    bytes: &[u8],
    t: &[f32],
    half: &[f32],
    last: &[f32],
) -> f32 {
    let nw = half.len();
    let b = bits as usize;
    debug_assert!(bytes.len() == b * nw && t.len() == 7 * nw && last.len() == nw);
    let mask = _mm256_set1_epi32(((1u32 << bits) - 1) as i32);
    let one = _mm256_set1_epi32(1);
    // Words whose 8 gathers stay inside the row: the last field starts at byte ⌊7b/8⌋ of the
    // word and its 4-byte read must end within the row.
    let safe = if b * nw >= 4 + 7 * b / 8 {
        ((b * nw - 4 - 7 * b / 8) / b + 1).min(nw)
    } else {
        0
    };
    let full = safe / 8 * 8;
    let mut acc = [_mm256_setzero_ps(); 4];
    let lane = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(b as i32),
    );
    let mut w = 0;
    // SAFETY: for w + 8 <= full every gather reads 4 bytes ending inside `bytes` (see `safe`);
    // t, half and last hold nw values per row of 8 consecutive words.
    unsafe {
        while w < full {
            let base = _mm256_add_epi32(lane, _mm256_set1_epi32((w * b) as i32));
            let mut par = _mm256_setzero_si256();
            let mut s0 = _mm256_setzero_si256();
            for i in 0..8usize {
                let off = _mm256_add_epi32(base, _mm256_set1_epi32((i * b / 8) as i32));
                let g = _mm256_i32gather_epi32::<1>(bytes.as_ptr() as *const i32, off);
                let sh = _mm_cvtsi32_si128(((i * b) % 8) as i32);
                let q = _mm256_and_si256(_mm256_srl_epi32(g, sh), mask);
                if i == 0 {
                    s0 = q;
                } else {
                    par = _mm256_xor_si256(par, q);
                    let k = i % 4;
                    acc[k] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(q),
                        _mm256_loadu_ps(t.as_ptr().add((i - 1) * nw + w)),
                        acc[k],
                    );
                }
            }
            let c = _mm256_cvtepi32_ps(_mm256_and_si256(s0, one));
            let even = _mm256_andnot_si256(one, s0);
            let l = _mm256_cvtepi32_ps(_mm256_add_epi32(even, _mm256_and_si256(par, one)));
            acc[0] = _mm256_fmadd_ps(c, _mm256_loadu_ps(half.as_ptr().add(w)), acc[0]);
            acc[1] = _mm256_fmadd_ps(l, _mm256_loadu_ps(last.as_ptr().add(w)), acc[1]);
            w += 8;
        }
    }
    let mut tail = 0f32;
    let m = (1u64 << bits) - 1;
    for w in full..nw {
        let mut v = [0u8; 8];
        v[..b].copy_from_slice(&bytes[w * b..(w + 1) * b]);
        let v = u64::from_le_bytes(v);
        let mut par = 0u64;
        for i in 1..8u32 {
            let q = (v >> (i * bits)) & m;
            par ^= q;
            tail += q as f32 * t[(i as usize - 1) * nw + w];
        }
        let s0 = v & m;
        tail += (s0 & 1) as f32 * half[w] + ((s0 & !1) + (par & 1)) as f32 * last[w];
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    hsum(s) + tail
}

/// One affine row of 4- or 8-bit codes dequantized into `out` (`ACC`: added into it): per
/// group `j`, `ŵ = q·mul[j] + add[j]`; values in natural order.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `bits` is 4 or 8; `codes` holds `out.len()·bits/8` bytes;
/// `mul` and `add` one value per group of `glen` values (`glen` even for 4 bits).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn affine_dequant<const ACC: bool>(
    bits: u8,
    codes: &[u8],
    glen: usize,
    mul: &[f32],
    add: &[f32],
    out: &mut [f32],
) {
    let per = 8 / bits as usize;
    let low = _mm_set1_epi8(0x0F);
    for (j, o) in out.chunks_mut(glen).enumerate() {
        let c = &codes[j * glen / per..(j * glen + o.len()) / per];
        let (m, a) = (_mm256_set1_ps(mul[j]), _mm256_set1_ps(add[j]));
        let mut i = 0;
        // SAFETY: each step reads 16 (4-bit: 16 bytes = 32 values) or 8 code bytes and writes
        // the values they hold, both inside the group.
        unsafe {
            if bits == 4 {
                while i + 32 <= o.len() {
                    let v = _mm_loadu_si128(c.as_ptr().add(i / 2) as *const __m128i);
                    let lo = _mm_and_si128(v, low);
                    let hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
                    let a0 = _mm_unpacklo_epi8(lo, hi);
                    let a1 = _mm_unpackhi_epi8(lo, hi);
                    for (k, part) in [a0, _mm_srli_si128(a0, 8), a1, _mm_srli_si128(a1, 8)]
                        .into_iter()
                        .enumerate()
                    {
                        let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part));
                        let p = o.as_mut_ptr().add(i + 8 * k);
                        _mm256_storeu_ps(p, value::<ACC>(p, _mm256_fmadd_ps(q, m, a)));
                    }
                    i += 32;
                }
            } else {
                while i + 8 <= o.len() {
                    let v = _mm_loadl_epi64(c.as_ptr().add(i) as *const __m128i);
                    let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
                    let p = o.as_mut_ptr().add(i);
                    _mm256_storeu_ps(p, value::<ACC>(p, _mm256_fmadd_ps(q, m, a)));
                    i += 8;
                }
            }
        }
        for k in i..o.len() {
            let q = if bits == 4 {
                (c[k / 2] >> (4 * (k % 2))) & 15
            } else {
                c[k]
            };
            let v = q as f32 * mul[j] + add[j];
            o[k] = if ACC { o[k] + v } else { v };
        }
    }
}

/// `v`, or (`ACC`) `v` plus the 8 values at `p`.
///
/// # Safety
/// AVX2; with `ACC`, `p` addresses 8 readable values.
#[inline(always)]
unsafe fn value<const ACC: bool>(p: *const f32, v: __m256) -> __m256 {
    if ACC {
        // SAFETY: the caller's.
        unsafe { _mm256_add_ps(_mm256_loadu_ps(p), v) }
    } else {
        v
    }
}

/// The scaled points (`k·p`) of one row of 4-bit fixed-rate E8 words in the blocked order of
/// `linear::blocked_index`: per block of 8 words, coordinate `i` of the 8 words is one vector.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `bytes.len() == 4·nw`, `out.len() == 8·nw`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn e8_points4(bytes: &[u8], k: f32, out: &mut [f32]) {
    let nw = bytes.len() / 4;
    let full = nw / 8 * 8;
    let nib = _mm256_set1_epi32(15);
    let one = _mm256_set1_epi32(1);
    let h = _mm256_set1_epi32(8);
    let kv = _mm256_set1_ps(k);
    let halfk = _mm256_set1_ps(0.5 * k);
    let mut w = 0;
    // SAFETY: each step reads 8 words (32 bytes) and writes their 64 values, inside the row.
    unsafe {
        while w < full {
            let v = _mm256_loadu_si256(bytes.as_ptr().add(4 * w) as *const __m256i);
            let s0 = _mm256_and_si256(v, nib);
            let c = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(s0, one)), halfk);
            let mut par = _mm256_setzero_si256();
            let base = out.as_mut_ptr().add(8 * w);
            for i in 0..7 {
                let sh = _mm_cvtsi32_si128(4 * (i as i32 + 1));
                let q = _mm256_and_si256(_mm256_srl_epi32(v, sh), nib);
                par = _mm256_xor_si256(par, q);
                let val = _mm256_cvtepi32_ps(_mm256_sub_epi32(q, h));
                _mm256_storeu_ps(base.add(8 * i), _mm256_fmadd_ps(val, kv, c));
            }
            let last = _mm256_add_epi32(
                _mm256_sub_epi32(_mm256_andnot_si256(one, s0), h),
                _mm256_and_si256(par, one),
            );
            _mm256_storeu_ps(
                base.add(56),
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(last), kv, c),
            );
            w += 8;
        }
    }
    // The last block (fewer than 8 words): coordinate i of word wi at i·m + wi.
    let m = nw - full;
    for wi in 0..m {
        let w = full + wi;
        let c4 = &bytes[4 * w..4 * w + 4];
        let v = u32::from_le_bytes([c4[0], c4[1], c4[2], c4[3]]);
        let s0 = (v & 15) as i32;
        let c = 0.5 * (s0 & 1) as f32;
        let mut par = 0i32;
        for i in 0..7 {
            let q = ((v >> (4 * (i + 1))) & 15) as i32;
            par ^= q;
            out[8 * full + i * m + wi] = ((q - 8) as f32 + c) * k;
        }
        out[8 * full + 7 * m + wi] = (((s0 & !1) - 8 + (par & 1)) as f32 + c) * k;
    }
}

/// `⟨p, x'⟩` of one row of unbounded E8 symbols (see `kernels::e8_coded_dot`), one word per
/// vector: symbols 1..8 unzigzagged and multiplied by `x'` shifted by one (`xs[8w + i]` is
/// `x'[8w + i − 1]`, so `xs` starts with one zero), the first symbol's coset bit and its
/// parity-rebuilt last coordinate in scalar.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `syms.len() == 8·nw`, `xs.len() >= 8·nw`,
/// `half.len() == last.len() == nw`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn e8_coded_dot(syms: &[u32], xs: &[f32], half: &[f32], last: &[f32]) -> f32 {
    let nw = half.len();
    debug_assert!(syms.len() == 8 * nw && xs.len() >= 8 * nw && last.len() == nw);
    let one = _mm256_set1_epi32(1);
    let rest = _mm256_setr_epi32(0, -1, -1, -1, -1, -1, -1, -1);
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut tail = 0f32;
    // SAFETY: word w reads syms[8w..8w+8] and xs[8w..8w+8], inside both (see above).
    unsafe {
        for w in 0..nw {
            let v = _mm256_loadu_si256(syms.as_ptr().add(8 * w) as *const __m256i);
            let n = _mm256_xor_si256(
                _mm256_srli_epi32(v, 1),
                _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(v, one)),
            );
            let n = _mm256_and_si256(n, rest);
            let k = w & 1;
            acc[k] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(n),
                _mm256_loadu_ps(xs.as_ptr().add(8 * w)),
                acc[k],
            );
            let bits = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_slli_epi32(n, 31))) as u32;
            let par = (bits.count_ones() & 1) as i32;
            let s0 = *syms.get_unchecked(8 * w);
            let c = (s0 & 1) as f32;
            let z = s0 >> 1;
            let t = ((z >> 1) as i32) ^ -((z & 1) as i32);
            tail += c * half[w] + (2 * t + par) as f32 * last[w];
        }
    }
    hsum(_mm256_add_ps(acc[0], acc[1])) + tail
}

/// `Σ a·b` over f32 slices of the same length, four registers of accumulators.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: the caller guarantees the CPU features and the lengths (see above).
    unsafe {
        let n = a.len().min(b.len());
        let mut acc = [_mm256_setzero_ps(); 4];
        let full = n / 32 * 32;
        let mut i = 0;
        while i < full {
            // SAFETY: i + 32 <= n values of both slices.
            for (k, r) in acc.iter_mut().enumerate() {
                *r = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i + 8 * k)),
                    _mm256_loadu_ps(b.as_ptr().add(i + 8 * k)),
                    *r,
                );
            }
            i += 32;
        }
        let tail: f32 = a[full..n].iter().zip(&b[full..n]).map(|(x, y)| x * y).sum();
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        hsum(s) + tail
    }
}

/// `(Σ sum_i·x_i, Σ x_i)` over values `first..done` of one trellis sequence, `sum_i` the byte
/// sum of the 1MAD code of value `i`'s state (its `l`-bit window), `x` the sequence's
/// activations. Eight values span `8·k` bits, a whole number of bytes, so every group of eight
/// has the same layout: one 16-byte load, broadcast to both halves, a byte shuffle that gives
/// each lane the 4 bytes holding its window, a shift per lane and a mask. Returns `done`: the
/// values whose 16 bytes would pass the stream's end are left to the caller.
///
/// With `PAIRS` the code is the pair code (two values per state, `hypercodec_trellis::pair_sums`):
/// lanes `2i` and `2i + 1` read the same window — the one ending with value `2i + 1`'s bits — and
/// the odd lanes take the second hash.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `bits` holds the sequence's `x.len()·k` bits; `first·k +
/// k ≥ l` (with `PAIRS`: `first` even, `first·k + 2k ≥ l`); `k ≤ 8`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn trellis_sums_dot<const PAIRS: bool, const M: usize>(
    bits: &[u8],
    l: usize,
    k: usize,
    first: usize,
    x: [&[f32]; M],
) -> ([f32; M], [f32; M], usize) {
    let n = x[0].len();
    // Lane j's window starts at bit s0 + (j·k, or (j rounded down to even)·k for pairs).
    let s0 = if PAIRS {
        (first + 2) * k - l
    } else {
        (first + 1) * k - l
    };
    let (byte0, sh0) = (s0 / 8, s0 % 8);
    let mut ctrl = [0u8; 32];
    let mut shifts = [0i32; 8];
    for j in 0..8 {
        let bit = sh0 + if PAIRS { j & !1 } else { j } * k;
        for b in 0..4 {
            ctrl[4 * j + b] = (bit / 8 + b) as u8;
        }
        shifts[j] = (bit % 8) as i32;
    }
    // SAFETY: 32 and 8 lanes from arrays of that size.
    let (ctrl, shifts) = unsafe {
        (
            _mm256_loadu_si256(ctrl.as_ptr() as *const __m256i),
            _mm256_loadu_si256(shifts.as_ptr() as *const __m256i),
        )
    };
    let mask = _mm256_set1_epi32(((1u32 << l) - 1) as i32);
    let mul = _mm256_set1_epi32(hypercodec_trellis::CODE_MUL as i32);
    let add = _mm256_set1_epi32(hypercodec_trellis::CODE_ADD as i32);
    let mul2 = _mm256_set1_epi32(hypercodec_trellis::PAIR_MUL as i32);
    let add2 = _mm256_set1_epi32(hypercodec_trellis::PAIR_ADD as i32);
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    let sums = |g: usize| {
        // SAFETY: the caller's loop keeps the 16 bytes inside `bits`.
        let v = unsafe {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(
                bits.as_ptr().add(byte0 + g * k) as *const __m128i
            ))
        };
        let w = _mm256_shuffle_epi8(v, ctrl);
        let state = _mm256_and_si256(_mm256_srlv_epi32(w, shifts), mask);
        let mut h = _mm256_add_epi32(_mm256_mullo_epi32(state, mul), add);
        if PAIRS {
            // The second value of each pair: the second hash, in the odd lanes.
            let h2 = _mm256_add_epi32(_mm256_mullo_epi32(h, mul2), add2);
            h = _mm256_blend_epi32::<0b1010_1010>(h, h2);
        }
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(h, ones8), ones16))
    };
    // Group g covers values first + 8g .. first + 8g + 8.
    let fits = |g: usize| first + 8 * g + 8 <= n && byte0 + g * k + 16 <= bits.len();
    // One row: two accumulator chains; several rows are independent chains already.
    let (mut acc, mut acc2, mut xs) = (
        [_mm256_setzero_ps(); M],
        _mm256_setzero_ps(),
        [_mm256_setzero_ps(); M],
    );
    let mut g = 0;
    while fits(g + 1) {
        let i = first + 8 * g;
        let (s0, s1) = (sums(g), sums(g + 1));
        for r in 0..M {
            // SAFETY: i + 16 ≤ n, the length of every row of `x`.
            let (x0, x1) = unsafe {
                (
                    _mm256_loadu_ps(x[r].as_ptr().add(i)),
                    _mm256_loadu_ps(x[r].as_ptr().add(i + 8)),
                )
            };
            acc[r] = _mm256_fmadd_ps(s0, x0, acc[r]);
            if M == 1 {
                acc2 = _mm256_fmadd_ps(s1, x1, acc2);
            } else {
                acc[r] = _mm256_fmadd_ps(s1, x1, acc[r]);
            }
            xs[r] = _mm256_add_ps(xs[r], _mm256_add_ps(x0, x1));
        }
        g += 2;
    }
    while fits(g) {
        let s0 = sums(g);
        for r in 0..M {
            // SAFETY: first + 8g + 8 ≤ n.
            let x0 = unsafe { _mm256_loadu_ps(x[r].as_ptr().add(first + 8 * g)) };
            acc[r] = _mm256_fmadd_ps(s0, x0, acc[r]);
            xs[r] = _mm256_add_ps(xs[r], x0);
        }
        g += 1;
    }
    acc[0] = _mm256_add_ps(acc[0], acc2);
    (acc.map(|v| hsum(v)), xs.map(|v| hsum(v)), first + 8 * g)
}

/// `(Σ sum_i·x_i, Σ x_i)` over `x.len() / 16` whole tail-biting sequences of 16 values each
/// (calibrated trellis rows), their bits consecutive from `bits[0]` (`2·k` bytes each),
/// `sum_i` the byte sum of the 1MAD code of value `i`'s state. A sequence of `16·k` ≤ 64 bits
/// is loaded once and doubled (`S ‖ S`, at most 16 bytes), so every value's window — wrapped
/// or not — is the same byte shuffle, shift and mask of that register: the positions depend
/// only on `(l, k)`, so the controls are built once per call.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `bits` holds `x.len() / 16 · 2k` bytes; `1 ≤ k ≤ 4` and
/// `l ≤ 16·k`, `l ≤ 16`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn trellis_seq16_dot<const M: usize>(
    bits: &[u8],
    l: usize,
    k: usize,
    x: [&[f32]; M],
) -> ([f32; M], [f32; M]) {
    let nb = 16 * k; // bits per sequence
    let bytes = 2 * k;
    // Value i's window starts at bit nb + (i + 1)·k − l of the doubled stream (4k bytes); the
    // shuffle gives each lane the 3 bytes holding it (a fourth index past the register reads 0).
    let mut ctrl = [[0x80u8; 32]; 2];
    let mut shifts = [[0i32; 8]; 2];
    for (h, (c, sh)) in ctrl.iter_mut().zip(shifts.iter_mut()).enumerate() {
        for j in 0..8 {
            let start = nb + (8 * h + j + 1) * k - l;
            for b in 0..4 {
                let byte = start / 8 + b;
                if byte < 2 * bytes {
                    // Both 128-bit halves hold the doubled stream: lane j < 4 reads the low
                    // half, lane j ≥ 4 the high one, at the same byte indices.
                    c[4 * j + b] = byte as u8;
                }
            }
            sh[j] = (start % 8) as i32;
        }
    }
    // SAFETY: arrays of 32 bytes and 8 i32.
    let (c0, c1, s0, s1) = unsafe {
        (
            _mm256_loadu_si256(ctrl[0].as_ptr() as *const __m256i),
            _mm256_loadu_si256(ctrl[1].as_ptr() as *const __m256i),
            _mm256_loadu_si256(shifts[0].as_ptr() as *const __m256i),
            _mm256_loadu_si256(shifts[1].as_ptr() as *const __m256i),
        )
    };
    let mask = _mm256_set1_epi32(((1u32 << l) - 1) as i32);
    let mul = _mm256_set1_epi32(hypercodec_trellis::CODE_MUL as i32);
    let add = _mm256_set1_epi32(hypercodec_trellis::CODE_ADD as i32);
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    let sums = |d: __m256i, c: __m256i, sh: __m256i| {
        let w = _mm256_shuffle_epi8(d, c);
        let state = _mm256_and_si256(_mm256_srlv_epi32(w, sh), mask);
        let h = _mm256_add_epi32(_mm256_mullo_epi32(state, mul), add);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(h, ones8), ones16))
    };
    let (mut acc, mut acc2, mut xs) = (
        [_mm256_setzero_ps(); M],
        _mm256_setzero_ps(),
        [_mm256_setzero_ps(); M],
    );
    let keep = if nb == 64 { u64::MAX } else { (1u64 << nb) - 1 };
    for q in 0..x[0].len() / 16 {
        let at = q * bytes;
        let s = if at + 8 <= bits.len() {
            // SAFETY: 8 bytes from `at` are inside `bits`.
            u64::from_le(unsafe { (bits.as_ptr().add(at) as *const u64).read_unaligned() }) & keep
        } else {
            let mut b = [0u8; 8];
            b[..bytes].copy_from_slice(&bits[at..at + bytes]);
            u64::from_le_bytes(b)
        } as u128;
        let d = s | (s << nb);
        let d = _mm_set_epi64x((d >> 64) as u64 as i64, d as u64 as i64);
        let d = _mm256_broadcastsi128_si256(d);
        let (v0, v1) = (sums(d, c0, s0), sums(d, c1, s1));
        for r in 0..M {
            // SAFETY: q·16 + 16 ≤ the length of every row of `x`.
            let (x0, x1) = unsafe {
                (
                    _mm256_loadu_ps(x[r].as_ptr().add(16 * q)),
                    _mm256_loadu_ps(x[r].as_ptr().add(16 * q + 8)),
                )
            };
            acc[r] = _mm256_fmadd_ps(v0, x0, acc[r]);
            if M == 1 {
                acc2 = _mm256_fmadd_ps(v1, x1, acc2);
            } else {
                acc[r] = _mm256_fmadd_ps(v1, x1, acc[r]);
            }
            xs[r] = _mm256_add_ps(xs[r], _mm256_add_ps(x0, x1));
        }
    }
    acc[0] = _mm256_add_ps(acc[0], acc2);
    (acc.map(|v| hsum(v)), xs.map(|v| hsum(v)))
}

/// [`trellis_sums_dot`] sixteen values at a time in AVX-512: one 32-byte load, a byte
/// permutation (VBMI) that gives each lane the 4 bytes holding its window, a shift per lane,
/// a mask, the multiply-add of the hash and the byte sum in one VNNI dot product.
///
/// # Safety
/// As [`trellis_sums_dot`], and the CPU must have AVX-512 F, BW, VBMI and VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma")]
pub(crate) unsafe fn trellis_sums_dot512<const M: usize>(
    bits: &[u8],
    l: usize,
    k: usize,
    first: usize,
    x: [&[f32]; M],
) -> ([f32; M], [f32; M], usize) {
    let n = x[0].len();
    let s0 = (first + 1) * k - l;
    let (byte0, sh0) = (s0 / 8, s0 % 8);
    let mut ctrl = [0u8; 64];
    let mut shifts = [0i32; 16];
    for j in 0..16 {
        let bit = sh0 + j * k;
        for b in 0..4 {
            ctrl[4 * j + b] = (bit / 8 + b) as u8;
        }
        shifts[j] = (bit % 8) as i32;
    }
    // SAFETY: 64 bytes and 16 lanes from arrays of that size.
    let (ctrl, shifts) = unsafe {
        (
            _mm512_loadu_si512(ctrl.as_ptr() as *const _),
            _mm512_loadu_si512(shifts.as_ptr() as *const _),
        )
    };
    let mask = _mm512_set1_epi32(((1u32 << l) - 1) as i32);
    let mul = _mm512_set1_epi32(hypercodec_trellis::CODE_MUL as i32);
    let add = _mm512_set1_epi32(hypercodec_trellis::CODE_ADD as i32);
    let ones8 = _mm512_set1_epi8(1);
    let sums = |g: usize| {
        // SAFETY: the caller's loop keeps the 32 bytes inside `bits`.
        let v = unsafe {
            _mm512_castsi256_si512(_mm256_loadu_si256(
                bits.as_ptr().add(byte0 + 2 * g * k) as *const __m256i
            ))
        };
        let w = _mm512_permutexvar_epi8(ctrl, v);
        let state = _mm512_and_si512(_mm512_srlv_epi32(w, shifts), mask);
        let h = _mm512_add_epi32(_mm512_mullo_epi32(state, mul), add);
        _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), h, ones8))
    };
    // Group g covers values first + 16g .. first + 16g + 16.
    let fits = |g: usize| first + 16 * g + 16 <= n && byte0 + 2 * g * k + 32 <= bits.len();
    let (mut acc, mut acc2, mut xs) = (
        [_mm512_setzero_ps(); M],
        _mm512_setzero_ps(),
        [_mm512_setzero_ps(); M],
    );
    let mut g = 0;
    while fits(g + 1) {
        let i = first + 16 * g;
        let (s0, s1) = (sums(g), sums(g + 1));
        for r in 0..M {
            // SAFETY: i + 32 ≤ n, the length of every row of `x`.
            let (x0, x1) = unsafe {
                (
                    _mm512_loadu_ps(x[r].as_ptr().add(i)),
                    _mm512_loadu_ps(x[r].as_ptr().add(i + 16)),
                )
            };
            acc[r] = _mm512_fmadd_ps(s0, x0, acc[r]);
            if M == 1 {
                acc2 = _mm512_fmadd_ps(s1, x1, acc2);
            } else {
                acc[r] = _mm512_fmadd_ps(s1, x1, acc[r]);
            }
            xs[r] = _mm512_add_ps(xs[r], _mm512_add_ps(x0, x1));
        }
        g += 2;
    }
    while fits(g) {
        let s0 = sums(g);
        for r in 0..M {
            // SAFETY: first + 16g + 16 ≤ n.
            let x0 = unsafe { _mm512_loadu_ps(x[r].as_ptr().add(first + 16 * g)) };
            acc[r] = _mm512_fmadd_ps(s0, x0, acc[r]);
            xs[r] = _mm512_add_ps(xs[r], x0);
        }
        g += 1;
    }
    acc[0] = _mm512_add_ps(acc[0], acc2);
    let i = first + 16 * g;
    // The rest, eight at a time.
    // SAFETY: as the caller's (the same stream and activations, from value i).
    let (s, xr, done) = unsafe { trellis_sums_dot::<false, M>(bits, l, k, i, x) };
    let mut sum = [0f32; M];
    let mut xsum = [0f32; M];
    for r in 0..M {
        sum[r] = _mm512_reduce_add_ps(acc[r]) + s[r];
        xsum[r] = _mm512_reduce_add_ps(xs[r]) + xr[r];
    }
    (sum, xsum, done)
}
