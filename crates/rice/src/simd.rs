//! AVX2 decoding of rANS symbols in vector lanes, chosen at run time (the scalar decoder is
//! the reference and the fallback). The interleaved format makes this possible: the words
//! that renormalize a group of lanes are stored in lane order, so a prefix count of the
//! lanes that need one tells each lane which word is its own.
#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// True when the CPU has AVX2 (checked once, then cached by std).
#[inline]
pub(crate) fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// For each 8-bit mask of lanes that read a word: lane k's word is the
/// `popcount(mask & ((1 << k) − 1))`-th of the words read.
const PREFIX: [[u32; 8]; 256] = {
    let mut t = [[0u32; 8]; 256];
    let mut m = 0;
    while m < 256 {
        let mut k = 0;
        while k < 8 {
            t[m][k] = (m & ((1 << k) - 1)).count_ones();
            k += 1;
        }
        m += 1;
    }
    t
};

/// Decodes lanes 1..8 of a group of 8 (lane 0, the word's first symbol, is already done) with
/// one table: `fb` (`freq << 16 | bias` per slot), `sy` (symbol per slot, one padding entry).
/// Returns `false`, having changed nothing, when a lane meets an escape or fewer than 16
/// bytes of stream are left: the caller then decodes those lanes one at a time.
///
/// # Safety
/// The CPU must have AVX2; `states.len() == out.len() == 8`; `fb.len() == 1 << pb` and
/// `sy.len() == fb.len() + 1`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn rans_step7(
    fb: &[u32],
    sy: &[u16],
    escape: bool,
    pb: u32,
    states: &mut [u32],
    stream: &[u8],
    pos: &mut usize,
    out: &mut [u32],
) -> bool {
    debug_assert!(states.len() == 8 && out.len() == 8 && sy.len() == fb.len() + 1);
    if *pos + 16 > stream.len() {
        return false;
    }
    // SAFETY: states and out hold 8 values; every slot index is below 2^pb = fb.len(), and a
    // 4-byte read at 2-byte stride from sy stays inside its fb.len() + 1 entries; 16 bytes of
    // stream are left from pos (checked above).
    unsafe {
        let x = _mm256_loadu_si256(states.as_ptr() as *const __m256i);
        let idx = _mm256_and_si256(x, _mm256_set1_epi32(((1u32 << pb) - 1) as i32));
        let f = _mm256_i32gather_epi32::<4>(fb.as_ptr() as *const i32, idx);
        let s = _mm256_and_si256(
            _mm256_i32gather_epi32::<2>(sy.as_ptr() as *const i32, idx),
            _mm256_set1_epi32(0xFFFF),
        );
        let rest = _mm256_setr_epi32(0, -1, -1, -1, -1, -1, -1, -1);
        if escape {
            let e = _mm256_and_si256(
                _mm256_cmpeq_epi32(s, _mm256_set1_epi32(crate::rans::MAX_DIRECT as i32)),
                rest,
            );
            if _mm256_movemask_epi8(e) != 0 {
                return false;
            }
        }
        let shift = _mm_cvtsi32_si128(pb as i32);
        let xn = _mm256_add_epi32(
            _mm256_mullo_epi32(_mm256_srli_epi32(f, 16), _mm256_srl_epi32(x, shift)),
            _mm256_and_si256(f, _mm256_set1_epi32(0xFFFF)),
        );
        let need = _mm256_and_si256(
            _mm256_cmpeq_epi32(_mm256_srli_epi32(xn, 16), _mm256_setzero_si256()),
            rest,
        );
        let m = _mm256_movemask_ps(_mm256_castsi256_ps(need)) as usize;
        let words =
            _mm256_cvtepu16_epi32(_mm_loadu_si128(stream.as_ptr().add(*pos) as *const __m128i));
        let perm = _mm256_loadu_si256(PREFIX[m].as_ptr() as *const __m256i);
        let mine = _mm256_permutevar8x32_epi32(words, perm);
        let renormed = _mm256_or_si256(_mm256_slli_epi32(xn, 16), mine);
        let updated = _mm256_blendv_epi8(xn, renormed, need);
        let result = _mm256_blendv_epi8(x, updated, rest);
        _mm256_storeu_si256(states.as_mut_ptr() as *mut __m256i, result);
        let mut syms = [0u32; 8];
        _mm256_storeu_si256(syms.as_mut_ptr() as *mut __m256i, s);
        out[1..].copy_from_slice(&syms[1..]);
        *pos += 2 * m.count_ones() as usize;
    }
    true
}

/// Decodes 32 symbols entirely in vector lanes: lane `i` reads the table at `bases[i]` (E8:
/// lane `8k`, word k's first symbol, its table 0; lanes `8k+1..8k+8` the table the caller chose
/// from that first symbol, which the slot alone determines; words of 1, 2 or 4 symbols: each
/// position's fixed table); then the lanes whose state fell below 2^16 take the next words of
/// the stream in lane order. Returns `false`, having changed nothing, when a lane meets an escape (if
/// `escape`) or fewer than 80 bytes of stream are left.
///
/// # Safety
/// The CPU must have AVX2; `states.len() == out.len() == 32`; each base is a table's first
/// slot in `fb` (`2^pb` slots per table) and `sy.len() == fb.len() + 1`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn rans_group32(
    fb: &[u32],
    sy: &[u16],
    escape: bool,
    bases: &[u32; 32],
    pb: u32,
    states: &mut [u32],
    stream: &[u8],
    pos: &mut usize,
    out: &mut [u32],
) -> bool {
    debug_assert!(states.len() == 32 && out.len() == 32 && sy.len() == fb.len() + 1);
    // 32 words at most, and the last 16-byte load may start at the 32nd.
    if *pos + 80 > stream.len() {
        return false;
    }
    // SAFETY: states and out hold 32 values; every index is a base plus a slot below 2^pb,
    // inside fb, and a 4-byte read at 2-byte stride from sy stays inside its padding; the
    // word loads start at most 62 bytes past pos and read 16 bytes (checked above).
    unsafe {
        let mask = _mm256_set1_epi32(((1u32 << pb) - 1) as i32);
        let shift = _mm_cvtsi32_si128(pb as i32);
        let low16 = _mm256_set1_epi32(0xFFFF);
        let mut xn = [_mm256_setzero_si256(); 4];
        let mut syms = [_mm256_setzero_si256(); 4];
        let mut need = [_mm256_setzero_si256(); 4];
        let mut masks = [0u32; 4];
        let mut any_escape = _mm256_setzero_si256();
        for k in 0..4 {
            let x = _mm256_loadu_si256(states.as_ptr().add(8 * k) as *const __m256i);
            let base = _mm256_loadu_si256(bases.as_ptr().add(8 * k) as *const __m256i);
            let idx = _mm256_add_epi32(base, _mm256_and_si256(x, mask));
            let f = _mm256_i32gather_epi32::<4>(fb.as_ptr() as *const i32, idx);
            let s = _mm256_and_si256(
                _mm256_i32gather_epi32::<2>(sy.as_ptr() as *const i32, idx),
                low16,
            );
            any_escape = _mm256_or_si256(
                any_escape,
                _mm256_cmpeq_epi32(s, _mm256_set1_epi32(crate::rans::MAX_DIRECT as i32)),
            );
            let v = _mm256_add_epi32(
                _mm256_mullo_epi32(_mm256_srli_epi32(f, 16), _mm256_srl_epi32(x, shift)),
                _mm256_and_si256(f, low16),
            );
            let nd = _mm256_cmpeq_epi32(_mm256_srli_epi32(v, 16), _mm256_setzero_si256());
            xn[k] = v;
            syms[k] = s;
            need[k] = nd;
            masks[k] = _mm256_movemask_ps(_mm256_castsi256_ps(nd)) as u32;
        }
        if escape && _mm256_movemask_epi8(any_escape) != 0 {
            return false;
        }
        let mut at = *pos;
        for k in 0..4 {
            let words =
                _mm256_cvtepu16_epi32(_mm_loadu_si128(stream.as_ptr().add(at) as *const __m128i));
            let perm = _mm256_loadu_si256(PREFIX[masks[k] as usize].as_ptr() as *const __m256i);
            let mine = _mm256_permutevar8x32_epi32(words, perm);
            let renormed = _mm256_or_si256(_mm256_slli_epi32(xn[k], 16), mine);
            let updated = _mm256_blendv_epi8(xn[k], renormed, need[k]);
            _mm256_storeu_si256(states.as_mut_ptr().add(8 * k) as *mut __m256i, updated);
            _mm256_storeu_si256(out.as_mut_ptr().add(8 * k) as *mut __m256i, syms[k]);
            at += 2 * masks[k].count_ones() as usize;
        }
        *pos = at;
    }
    true
}
