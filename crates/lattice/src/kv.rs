//! KV-cache vectors: one key or value head vector at a time, as it arrives.
//!
//! Per vector `x` of `dim` values: rotate (`y = R·x`: the seeded RHT of [`Rht`], a seeded
//! Haar-random orthogonal matrix as QJL uses, or none), normalize by the vector's RMS σ,
//! quantize at `bits` bits per value with a fixed-rate quantizer ([`KvQuantizer`]: the
//! box-constrained lattice form at its best-SNR α from the shipped calibration, or the
//! bitshift trellis of `hypercodec-trellis` at its calibrated scale, which sits about 3 dB
//! higher at the same bits), and store one scale `c` per vector (bf16) refitted by least
//! squares, `c = ⟨y, p⟩ / ⟨p, p⟩` for the decoded point `p`, so `ŷ = c·p` and `x̂ = Rᵀ·ŷ`. A
//! vector costs `bits·dim` bits of codes (whole lattice words) plus 16 bits of scale:
//! `bits + 16/dim` bits per value, every overhead included. With [`ScaleFormat::Log8`] the
//! scale is one byte after the vector's codes instead (steps of 2^(1/8), about ±4.4 %; see
//! [`ScaleFormat`]): `bits + 8/dim` bits per value, for low rates where 16 bits of scale are a
//! large share (0.25 bits per value of 64); with [`ScaleFormat::Log4`] 4 bits in the `scales`
//! arrays, four vectors to an entry, for vectors brought near unit RMS: `bits + 4/dim`.
//!
//! Key design decision: codes are fixed-rate and per vector, so a cache encodes each new token
//! on its own (no re-encoding of the history), any token's vector decodes alone, and the
//! byte size of a cache is known in advance. An optional subtractive dither is keyed on a
//! per-vector `u64` the caller derives from the token's global position (and head), so an
//! incremental encoder regenerates it; with the fixed-rate form, points outside the box are
//! clamped, so far outliers see an error that is not uniform over the cell.

use crate::calibration::fixed_alpha;
use crate::quant::Lattice;
use crate::rht::{mix64, Rht};
use crate::{dither_word, symbols_per_row, LatticeError, Result};
use half::bf16;

/// How vectors are rotated before quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// No rotation (outlier channels stay where they are).
    None,
    /// The seeded randomized Hadamard transform over the whole vector (`dim` a power of two
    /// up to 4096), or over its largest power-of-two tiles otherwise.
    Rht,
    /// A seeded Haar-random orthogonal matrix (Gram–Schmidt of a Gaussian matrix), `dim²`
    /// multiply-adds per vector, as QJL rotates.
    Haar,
}

/// The fixed-rate quantizer of rotated, normalized vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvQuantizer {
    /// The box-constrained fixed-rate form of a lattice (Z1, D4 or E8).
    Lattice(Lattice),
    /// The bitshift trellis with `l` state bits (8..=16; encoding costs 2^l per value): at
    /// 2 / 3 / 4 bits, about 11.1 / 16.8 / 22.6 dB at `l = 10` against E8's fixed form at
    /// 9.7 / 14.9 / 20.0 (Gaussian data). No dither.
    Trellis {
        /// State bits.
        l: u8,
    },
}

impl KvQuantizer {
    /// The names [`KvQuantizer::named`] takes, in the order its error lists them.
    pub const NAMES: [&'static str; 4] = ["e8", "d4", "z1", "trellis"];

    /// The quantizer of this name: `e8`, `d4` or `z1` (the lattice's fixed-rate form), or
    /// `trellis` with `l` state bits.
    ///
    /// # Errors
    /// [`LatticeError::UnknownKvQuantizer`] for any other name (`a2`, a lattice of the weight
    /// codecs, has no fixed-rate form).
    pub fn named(name: &str, l: u8) -> Result<Self> {
        Ok(match name {
            "e8" => KvQuantizer::Lattice(Lattice::E8),
            "d4" => KvQuantizer::Lattice(Lattice::D4),
            "z1" => KvQuantizer::Lattice(Lattice::Z1),
            "trellis" => KvQuantizer::Trellis { l },
            _ => {
                return Err(LatticeError::UnknownKvQuantizer {
                    name: name.to_string(),
                })
            }
        })
    }
}

/// How each vector's scale is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScaleFormat {
    /// bf16 bits, one `u16` per vector in the `scales` arrays.
    #[default]
    Bf16,
    /// One byte after each vector's codes (the `scales` arrays are empty): 0 for a scale of 0
    /// (a zero vector), else `k` in 1..=255 for `2^((k − 128)/8)`, rounded to the nearer grid
    /// value (the least squared error for the decoded point), so scales from about 1.7e-5 to
    /// 5.9e4 keep a relative error of at most 4.4 % (about −32 dB beside the signal); larger
    /// scales clamp to its top, and scales below half its least value are 0 (the vector
    /// decodes to zeros rather than amplified).
    Log8,
    /// Four bits per vector in the `scales` arrays, four vectors to a `u16` entry (vector `i`
    /// of a call or a [`Side`]: entry `i / 4`, bits `4·(i % 4)`): 0 for a scale of 0, else `k`
    /// in 1..=15 for `2^((k − 8)/4)`, the nearer of 0 and the grid values to the scale times
    /// the codec's α (so the grid is one of vector RMS for every quantizer). Vectors of RMS
    /// about 0.30 to 3.4 keep a scale error of at most 9 % (about −26 dB beside the signal on
    /// average, −21 dB at worst: far below a 1- or 2-bit code's own −5 to −11 dB, but it
    /// costs about 1.7 dB at 4 bits); others clamp to its ends or, below 0.15, to 0. For
    /// vectors brought near unit RMS, e.g. by a transform chosen so (Python's `kv_calibrate`
    /// scales each head's so), at low rates: `bits + 4/dim` bits per value.
    Log4,
}

impl ScaleFormat {
    /// The stored byte of scale `c` (`c` below half the grid's least value, NaN: 0, a zero
    /// vector: nearer than the least value, which would amplify it up to 2^16 times).
    pub fn log8(c: f32) -> u8 {
        if c.is_nan() || c < 0.5 * Self::unlog8(1) {
            return 0;
        }
        Self::nearer(c, c.log2() * 8.0 + 128.0, 255.0, Self::unlog8)
    }

    /// The nearer to `c` of the two codes around `t`, its place on a grid of codes
    /// `1..=last` whose values `value` gives (clamped to the grid's ends).
    fn nearer(c: f32, t: f32, last: f32, value: fn(u8) -> f32) -> u8 {
        let t = t.clamp(1.0, last);
        let (lo, hi) = (t.floor() as u8, t.ceil() as u8);
        if (value(hi) - c).abs() < (c - value(lo)).abs() {
            hi
        } else {
            lo
        }
    }

    /// The scale of stored byte `k` (see [`ScaleFormat::Log8`]).
    pub fn unlog8(k: u8) -> f32 {
        if k == 0 {
            0.0
        } else {
            ((k as f32 - 128.0) / 8.0).exp2()
        }
    }

    /// The stored 4 bits of scale `c` (see [`ScaleFormat::Log4`]; `c` below half the grid's
    /// least value, NaN: 0).
    pub fn log4(c: f32) -> u8 {
        if c.is_nan() || c < 0.5 * Self::unlog4(1) {
            return 0;
        }
        Self::nearer(c, c.log2() * 4.0 + 8.0, 15.0, Self::unlog4)
    }

    /// The scale of stored value `k` (its low 4 bits; see [`ScaleFormat::Log4`]).
    pub fn unlog4(k: u8) -> f32 {
        match k & 15 {
            0 => 0.0,
            k => ((k as f32 - 8.0) / 4.0).exp2(),
        }
    }

    /// `u16` entries of the `scales` arrays that `n` vectors take: `n` (bf16), 0 (log8: in the
    /// codes) or `⌈n/4⌉` (log4).
    pub fn scale_len(self, n: usize) -> usize {
        match self {
            ScaleFormat::Bf16 => n,
            ScaleFormat::Log8 => 0,
            ScaleFormat::Log4 => n.div_ceil(4),
        }
    }

    /// Bits of scale per vector.
    pub fn bits(self) -> u32 {
        match self {
            ScaleFormat::Bf16 => 16,
            ScaleFormat::Log8 => 8,
            ScaleFormat::Log4 => 4,
        }
    }
}

/// The quantizer of `dim`-value KV vectors (see the module docs).
#[derive(Debug, Clone)]
pub struct KvCodec {
    dim: usize,
    scale_format: ScaleFormat,
    bits: u8,
    quantizer: KvQuantizer,
    lattice: Lattice,
    trellis: Option<hypercodec_trellis::TrellisParams>,
    alpha: f32,
    seed: u64,
    dither: bool,
    rotation: Rotation,
    rht: Option<Rht>,
    /// Row-major `dim × dim` orthogonal matrix for [`Rotation::Haar`].
    haar: Vec<f32>,
    /// E8 words of 2 to 4 bits decode in AVX2 (bit-identical to the portable path).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    avx2: bool,
    /// The trellis' reconstruction of every state (`2^l` values), for vectors whose code bits
    /// fill whole bytes: each value is one window read and one lookup.
    states: Vec<f32>,
}

impl KvCodec {
    /// The codec of `dim`-value vectors at `bits` bits per value (2..=8; a trellis also 1) with
    /// `quantizer` (a lattice's tail shorter than a word is zero-padded; a trellis needs
    /// `dim·bits ≥ l`).
    pub fn new(
        dim: usize,
        bits: u8,
        quantizer: KvQuantizer,
        rotation: Rotation,
        seed: u64,
        dither: bool,
    ) -> Result<Self> {
        if dim == 0 || dim > crate::MAX_TILE {
            return Err(LatticeError::OutOfRange {
                what: "the vector length",
                min: 1,
                max: crate::MAX_TILE,
                actual: dim,
            });
        }
        let (lattice, alpha, trellis) = match quantizer {
            KvQuantizer::Lattice(l) => {
                let (alpha, _) = fixed_alpha(l, bits).ok_or(LatticeError::InvalidFixed {
                    lattice: l.name(),
                    bits,
                })?;
                (l, alpha, None)
            }
            KvQuantizer::Trellis { l } => {
                let p = hypercodec_trellis::TrellisParams::new(l, bits);
                // The encoder checks (L, K) and the sequence length; fail here, not per call.
                hypercodec_trellis::encode(&vec![0f32; dim], &p)
                    .map_err(|e| LatticeError::Trellis(e.to_string()))?;
                if dither {
                    return Err(LatticeError::Trellis(
                        "the trellis has no dithered form; dither is for the lattices".into(),
                    ));
                }
                if !(1..=8).contains(&bits) {
                    return Err(LatticeError::Trellis(format!(
                        "{bits} bits per value: the KV trellis codes 1..=8"
                    )));
                }
                (Lattice::Z1, 1.0, Some(p))
            }
        };
        let rht = match rotation {
            Rotation::Rht => Some(Rht::new(dim, crate::tile_for(dim, crate::MAX_TILE), seed)?),
            _ => None,
        };
        let haar = match rotation {
            Rotation::Haar => haar_matrix(dim, seed),
            _ => Vec::new(),
        };
        Ok(KvCodec {
            dim,
            scale_format: ScaleFormat::Bf16,
            bits,
            quantizer,
            lattice,
            trellis,
            alpha,
            seed,
            dither,
            rotation,
            rht,
            haar,
            states: match &trellis {
                Some(p) if (dim * bits as usize).is_multiple_of(8) => {
                    (0..1u32 << p.l).map(|s| p.value(s)).collect()
                }
                _ => Vec::new(),
            },
            avx2: lattice == Lattice::E8 && trellis.is_none() && (2..=4).contains(&bits) && {
                #[cfg(target_arch = "x86_64")]
                {
                    std::is_x86_feature_detected!("avx2")
                }
                #[cfg(not(target_arch = "x86_64"))]
                {
                    false
                }
            },
        })
    }

    /// The codec with its scales stored as `format` (bf16 by default).
    pub fn with_scale_format(mut self, format: ScaleFormat) -> Self {
        self.scale_format = format;
        self
    }

    /// How scales are stored.
    pub fn scale_format(&self) -> ScaleFormat {
        self.scale_format
    }

    /// Values per vector.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bits per code.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Whether the codec dithers (its calls then take one key per vector).
    pub fn dithers(&self) -> bool {
        self.dither
    }

    /// The quantizer.
    pub fn quantizer(&self) -> KvQuantizer {
        self.quantizer
    }

    /// The rotation.
    pub fn rotation(&self) -> Rotation {
        self.rotation
    }

    /// The seed of the rotation (and of the dither).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The lattice's α (the normalized vector is scaled by `α / RMS` before rounding; 1 for
    /// the trellis).
    pub fn alpha(&self) -> f32 {
        self.alpha
    }

    /// The RHT's tile, when the rotation is the RHT.
    pub fn rht_tile(&self) -> Option<usize> {
        self.rht.as_ref().map(Rht::tile)
    }

    /// Bytes per vector in the `codes` arrays: its codes (whole lattice words of `bits`-bit
    /// symbols, or `dim` trellis values, rounded up to a byte), then with
    /// [`ScaleFormat::Log8`] its scale byte.
    pub fn code_bytes(&self) -> usize {
        self.payload_bytes() + usize::from(self.scale_format == ScaleFormat::Log8)
    }

    /// Bytes of codes alone per vector.
    fn payload_bytes(&self) -> usize {
        let n = match self.trellis {
            Some(_) => self.dim,
            None => symbols_per_row(self.lattice, self.dim),
        };
        (n * self.bits as usize).div_ceil(8)
    }

    /// `u16` entries of the `scales` arrays that `n` vectors take (see
    /// [`ScaleFormat::scale_len`]).
    pub fn scale_len(&self, n: usize) -> usize {
        self.scale_format.scale_len(n)
    }

    /// Stored bits per value, codes and scale: `8·code_bytes / dim` plus 16 (bf16) or 4
    /// (log4) bits of scale per vector over `dim` (log8: the scale byte is a code byte).
    pub fn bits_per_value(&self) -> f64 {
        let scale = match self.scale_format {
            ScaleFormat::Log8 => 0,
            f => f.bits() as usize,
        };
        (8 * self.code_bytes() + scale) as f64 / self.dim as f64
    }

    /// Stores scale `c` of vector `i` (its code bytes `out`); a log4 entry's other nibbles
    /// are cleared when its first vector is written.
    fn put_scale(&self, c: f32, out: &mut [u8], scales: &mut [u16], i: usize) {
        match self.scale_format {
            ScaleFormat::Bf16 => scales[i] = bf16::from_f32(c).to_bits(),
            ScaleFormat::Log8 => out[out.len() - 1] = ScaleFormat::log8(c),
            ScaleFormat::Log4 => {
                let (e, s) = (i / 4, 4 * (i % 4));
                let keep = if s == 0 { 0 } else { scales[e] & !(15 << s) };
                scales[e] = keep | (u16::from(ScaleFormat::log4(c * self.alpha)) << s);
            }
        }
    }

    /// Vector `i`'s codes alone and its scale, from its code bytes `src` and `scales`.
    #[inline(always)]
    fn vector<'a>(&self, src: &'a [u8], scales: &[u16], i: usize) -> (&'a [u8], f32) {
        match self.scale_format {
            ScaleFormat::Bf16 => (src, bf16::from_bits(scales[i]).to_f32()),
            ScaleFormat::Log8 => {
                let (codes, k) = src.split_at(src.len() - 1);
                (codes, ScaleFormat::unlog8(k[0]))
            }
            ScaleFormat::Log4 => (
                src,
                ScaleFormat::unlog4((scales[i / 4] >> (4 * (i % 4))) as u8) / self.alpha,
            ),
        }
    }

    fn rotate(&self, x: &[f32], y: &mut [f32]) {
        match self.rotation {
            Rotation::None => y.copy_from_slice(x),
            Rotation::Rht => {
                y.copy_from_slice(x);
                if let Some(r) = &self.rht {
                    r.forward(y);
                }
            }
            Rotation::Haar => {
                for (yi, row) in y.iter_mut().zip(self.haar.chunks_exact(self.dim)) {
                    *yi = row.iter().zip(x).map(|(a, b)| a * b).sum();
                }
            }
        }
    }

    /// `x` = the inverse rotation of `y`, finite where `y`'s values are finite or just past
    /// f32's largest (a value within a rounding of it can decode past it: finite in, finite out).
    fn unrotate(&self, y: &mut [f32], x: &mut [f32]) {
        let finite = |v: f32| v.clamp(-f32::MAX, f32::MAX);
        match self.rotation {
            Rotation::None => x
                .iter_mut()
                .zip(y.iter())
                .for_each(|(o, &v)| *o = finite(v)),
            Rotation::Rht => {
                if let Some(r) = &self.rht {
                    // The inverse's butterflies sum up to `dim` values: a vector near f32's
                    // range is transformed scaled down by a power of two (exact) and back
                    // (its sums overflowed to inf − inf = NaN).
                    let big = y.iter().fold(0f32, |m, v| m.max(v.abs()));
                    if big > f32::MAX / y.len() as f32 {
                        let k = (y.len() as f32).log2().ceil() as i32;
                        let down = 2f32.powi(-k);
                        y.iter_mut().for_each(|v| *v = finite(*v) * down);
                        r.inverse(y);
                        let up = 2f32.powi(k);
                        y.iter_mut().for_each(|v| *v = finite(*v * up));
                    } else {
                        // (Sums of values at most f32's largest over the length, normalized:
                        // finite.)
                        r.inverse(y);
                    }
                }
                x.copy_from_slice(y);
            }
            Rotation::Haar => {
                x.iter_mut().for_each(|v| *v = 0.0);
                for (yi, row) in y.iter().zip(self.haar.chunks_exact(self.dim)) {
                    x.iter_mut().zip(row).for_each(|(v, a)| *v += a * yi);
                }
                x.iter_mut().for_each(|v| *v = finite(*v));
            }
        }
    }

    /// Value `i` of a tail-biting trellis vector is the state of the `l` bits ending with its
    /// own `k` (circularly): read from the code bytes followed by a copy of their first four
    /// (and four more bytes of padding: `ext` holds `src.len() + 8`),
    /// looked up in `states`, times `c` — what `hypercodec_trellis::decode_into` computes.
    fn trellis_values(&self, src: &[u8], l: usize, c: f32, ext: &mut [u8], y: &mut [f32]) {
        let k = self.bits as usize;
        let total = src.len() * 8;
        ext[..src.len()].copy_from_slice(src);
        for j in 0..4 {
            ext[src.len() + j] = src[j % src.len()];
        }
        let mask = (1u32 << l) - 1;
        let window = |start: usize| -> f32 {
            let b = start / 8;
            let w = u32::from_le_bytes(ext[b..b + 4].try_into().expect("4 bytes"));
            self.states[((w >> (start % 8)) & mask) as usize] * c
        };
        // The first values' windows wrap around to the sequence's last bits; from value
        // `wrap` on they start `l` bits before their end, `k` bits further each time (no
        // branch in the loop that decodes nearly every value).
        let wrap = l.div_ceil(k).saturating_sub(1).min(y.len());
        for (i, v) in y[..wrap].iter_mut().enumerate() {
            let end = (i + 1) * k;
            *v = window(if end >= l { end - l } else { end + total - l });
        }
        // Then one 64-bit read serves every window that fits in it (27 of them at K = 2,
        // L = 10); `ext` holds 8 bytes past the code bytes.
        let mut i = wrap;
        while i < y.len() {
            let start = (i + 1) * k - l;
            let b = start / 8;
            let w = u64::from_le_bytes(ext[b..b + 8].try_into().expect("8 bytes"));
            let mut off = start % 8;
            while i < y.len() && off + l <= 64 {
                y[i] = self.states[((w >> off) as u32 & mask) as usize] * c;
                off += k;
                i += 1;
            }
        }
    }

    fn check(&self, n: usize, codes: usize, scales: usize, keys: Option<usize>) -> Result<()> {
        for (what, expected, actual) in [
            ("codes", n * self.code_bytes(), codes),
            ("scales", self.scale_len(n), scales),
        ] {
            if expected != actual {
                return Err(LatticeError::Length {
                    what,
                    expected,
                    actual,
                });
            }
        }
        match keys {
            Some(k) if !self.dither => Err(LatticeError::Length {
                what: "dither keys (the codec does not dither)",
                expected: 0,
                actual: k,
            }),
            Some(k) if k != n => Err(LatticeError::Length {
                what: "dither keys",
                expected: n,
                actual: k,
            }),
            None if self.dither => Err(LatticeError::Length {
                what: "dither keys (the codec dithers)",
                expected: n,
                actual: 0,
            }),
            _ => Ok(()),
        }
    }

    /// Encodes `x.len() / dim` vectors into `codes` (`code_bytes` each) and `scales` (bf16
    /// bits, [`KvCodec::scale_len`] entries in all: none with [`ScaleFormat::Log8`], packed
    /// nibbles with [`ScaleFormat::Log4`]). `keys` (one per vector, e.g. `position·heads + head`) seed the dither
    /// and are required exactly when the codec dithers. Allocates nothing.
    pub fn encode_into(
        &self,
        x: &[f32],
        keys: Option<&[u64]>,
        codes: &mut [u8],
        scales: &mut [u16],
    ) -> Result<()> {
        let d = self.dim;
        if !x.len().is_multiple_of(d) {
            return Err(LatticeError::Length {
                what: "values (a multiple of the vector length)",
                expected: x.len().div_ceil(d) * d,
                actual: x.len(),
            });
        }
        let n = x.len() / d;
        self.check(n, codes.len(), scales.len(), keys.map(<[u64]>::len))?;
        if let Some(index) = x.iter().position(|v| !v.is_finite()) {
            return Err(LatticeError::NonFinite { index });
        }
        if let Some(p) = &self.trellis {
            return self.encode_trellis(p, x, codes, scales);
        }
        let l = self.lattice;
        let w = l.dim();
        let mut y = [0f32; crate::MAX_TILE];
        let mut u = [0f32; crate::MAX_TILE];
        let spr = symbols_per_row(l, d);
        let cb = self.code_bytes();
        for (i, v) in x.chunks_exact(d).enumerate() {
            let y = &mut y[..d];
            self.rotate(v, y);
            let ms = y.iter().map(|&a| a as f64 * a as f64).sum::<f64>() / d as f64;
            if !y.iter().all(|v| v.is_finite()) {
                // Finite values near f32's limit can overflow in the rotation.
                return Err(LatticeError::RotationOverflow { vector: i });
            }
            let out = &mut codes[i * cb..(i + 1) * cb];
            out.iter_mut().for_each(|b| *b = 0);
            if ms == 0.0 {
                // Zero vector: any point, scale 0.
                self.put_scale(0.0, out, scales, i);
                continue;
            }
            let k = self.alpha / ms.sqrt() as f32;
            let u = &mut u[..spr];
            u.iter_mut().for_each(|a| *a = 0.0);
            u[..d]
                .iter_mut()
                .zip(y.iter())
                .for_each(|(a, &b)| *a = b * k);
            let key = keys.map(|k| k[i]);
            let (mut dot, mut pp) = (0f64, 0f64);
            let mut bitpos = 0usize;
            for (j, word) in u.chunks_exact_mut(w).enumerate() {
                let mut dz = [0f32; 8];
                if let Some(key) = key {
                    dither_word(l, self.seed, key as usize, j, &mut dz[..w]);
                    word.iter_mut().zip(&dz).for_each(|(a, e)| *a += e);
                }
                let mut s = [0u32; 8];
                let mut p = [0f32; 8];
                l.encode_word_fixed(word, self.bits, &mut s[..w]);
                l.decode_word_fixed(&s[..w], self.bits, &mut p[..w]);
                for t in 0..w {
                    let c = j * w + t;
                    let pt = p[t] - dz[t];
                    if c < d {
                        dot += y[c] as f64 * pt as f64;
                        pp += pt as f64 * pt as f64;
                    }
                    put_bits(out, bitpos, self.bits, s[t]);
                    bitpos += self.bits as usize;
                }
            }
            let c = if pp > 0.0 { (dot / pp) as f32 } else { 0.0 };
            self.put_scale(c, out, scales, i);
        }
        Ok(())
    }

    fn encode_trellis(
        &self,
        p: &hypercodec_trellis::TrellisParams,
        x: &[f32],
        codes: &mut [u8],
        scales: &mut [u16],
    ) -> Result<()> {
        let d = self.dim;
        let cb = self.code_bytes();
        let err = |e: hypercodec_trellis::TrellisError| LatticeError::Trellis(e.to_string());
        let mut enc = hypercodec_trellis::Encoder::new(p).map_err(err)?;
        let (mut y, mut u) = ([0f32; crate::MAX_TILE], [0f32; crate::MAX_TILE]);
        for (i, v) in x.chunks_exact(d).enumerate() {
            let y = &mut y[..d];
            self.rotate(v, y);
            let ms = y.iter().map(|&a| a as f64 * a as f64).sum::<f64>() / d as f64;
            if !y.iter().all(|v| v.is_finite()) {
                // Finite values near f32's limit can overflow in the rotation.
                return Err(LatticeError::RotationOverflow { vector: i });
            }
            let out = &mut codes[i * cb..(i + 1) * cb];
            if ms == 0.0 {
                out.iter_mut().for_each(|b| *b = 0);
                self.put_scale(0.0, out, scales, i);
                continue;
            }
            // In f64: a vector of subnormal values has no f32 reciprocal RMS.
            let rms = ms.sqrt();
            let u = &mut u[..d];
            u.iter_mut()
                .zip(y.iter())
                .for_each(|(a, &b)| *a = (b as f64 / rms) as f32);
            let pb = self.payload_bytes();
            enc.encode_into(u, &mut out[..pb]).map_err(err)?;
            hypercodec_trellis::decode_into(&out[..pb], p, u).map_err(err)?;
            let dot: f64 = y
                .iter()
                .zip(u.iter())
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
            let pp: f64 = u.iter().map(|&b| b as f64 * b as f64).sum();
            let c = if pp > 0.0 { (dot / pp) as f32 } else { 0.0 };
            self.put_scale(c, out, scales, i);
        }
        Ok(())
    }

    /// Decodes vectors from `codes` and `scales` (as written by [`KvCodec::encode_into`], with
    /// the same `keys`) into `out` (`dim` values each). Allocates nothing.
    pub fn decode_into(
        &self,
        codes: &[u8],
        scales: &[u16],
        keys: Option<&[u64]>,
        out: &mut [f32],
    ) -> Result<()> {
        let d = self.dim;
        let n = codes.len() / self.code_bytes();
        if out.len() != n * d {
            return Err(LatticeError::Length {
                what: "output values",
                expected: n * d,
                actual: out.len(),
            });
        }
        self.check(n, codes.len(), scales.len(), keys.map(<[u64]>::len))?;
        let cb = self.code_bytes();
        let mut scratch = Scratch::new();
        let mut y = [0f32; crate::MAX_TILE + 8];
        for (i, o) in out.chunks_exact_mut(d).enumerate() {
            let (src, c) = self.vector(&codes[i * cb..(i + 1) * cb], scales, i);
            let key = keys.map(|k| k[i]);
            self.rotated_into(src, c, key, &mut y, &mut scratch)?;
            self.unrotate(&mut y[..d], o);
        }
        Ok(())
    }

    /// Vector `src` (its codes alone, its scale `c`, its dither key `key`) in the rotated domain, `ŷ = c·p`,
    /// into `y[..dim]` (`y` holds at least `dim` rounded up to 8 values; those past `dim` are
    /// overwritten).
    #[inline(always)]
    fn rotated_into(
        &self,
        src: &[u8],
        c: f32,
        key: Option<u64>,
        y: &mut [f32],
        s: &mut Scratch,
    ) -> Result<()> {
        let d = self.dim;
        if let Some(p) = &self.trellis {
            if self.states.is_empty() {
                hypercodec_trellis::decode_into(src, p, &mut y[..d])
                    .map_err(|e| LatticeError::Trellis(e.to_string()))?;
                y[..d].iter_mut().for_each(|v| *v *= c);
            } else {
                self.trellis_values(src, p.l as usize, c, &mut s.ext, &mut y[..d]);
            }
            return Ok(());
        }
        let l = self.lattice;
        let w = l.dim();
        let spr = symbols_per_row(l, d);
        #[cfg(target_arch = "x86_64")]
        if self.avx2 && !self.dither {
            // SAFETY: `avx2` is set only where the CPU has AVX2; `src` holds `spr / 8`
            // words of `bits` bytes and `y` at least `spr` values.
            unsafe { x86::e8_words(src, self.bits, spr / 8, c, &mut y[..spr]) };
            return Ok(());
        }
        unpack(src, self.bits, &mut s.syms[..spr]);
        for (j, sy) in s.syms[..spr].chunks_exact(w).enumerate() {
            let mut p = [0f32; 8];
            l.decode_word_fixed(sy, self.bits, &mut p[..w]);
            if let (true, Some(k)) = (self.dither, key) {
                let mut dz = [0f32; 8];
                dither_word(l, self.seed, k as usize, j, &mut dz[..w]);
                p.iter_mut().zip(&dz).for_each(|(a, e)| *a -= e);
            }
            y[j * w..(j + 1) * w]
                .iter_mut()
                .zip(&p[..w])
                .for_each(|(y, &v)| *y = v * c);
        }
        Ok(())
    }
}

/// Per-call scratch of the decoders (one vector, on the stack).
struct Scratch {
    syms: [u32; crate::MAX_TILE + 8],
    ext: [u8; crate::MAX_TILE + 8],
}

impl Scratch {
    fn new() -> Self {
        Scratch {
            syms: [0; crate::MAX_TILE + 8],
            ext: [0; crate::MAX_TILE + 8],
        }
    }
}

/// One side (keys or values) of a compressed history: `n` vectors of `codec`, as
/// [`KvCodec::encode_into`] wrote them.
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    /// The codec the vectors were encoded with.
    pub codec: &'a KvCodec,
    /// `n · code_bytes` bytes.
    pub codes: &'a [u8],
    /// `scale_len(n)` scale entries (see [`ScaleFormat`]).
    pub scales: &'a [u16],
    /// A vector (`dim` values, the original domain) subtracted from every vector before it was
    /// encoded, added back here (e.g. a head's mean key: attention scores move by a constant
    /// per query, and the codes carry only what varies). With [`Side::mix`], in the coded domain.
    pub mean: Option<&'a [f32]>,
    /// A `dim × dim` row-major matrix `W` back to the original domain: a vector `x` was encoded
    /// as `T·x − mean` with `T = W⁻¹` and is read as `W·(x̂ + mean)`. A `T` chosen from the
    /// model (e.g. `T² ∝ C^{-½}(C^{½}·F·C^{½})^{½}C^{-½}` for the vectors' covariance `C` and
    /// the loss' Fisher information `F` about them) spends the codes' error where the model is
    /// least sensitive to it; attention applies `W` to the queries (`⟨q, W·x̂⟩ = ⟨Wᵀ·q, x̂⟩`) and
    /// to the values' weighted sum, once per query, never per token.
    pub mix: Option<&'a [f32]>,
}

impl Side<'_> {
    /// Vectors held (`codes.len() / code_bytes`).
    pub fn len(&self) -> usize {
        self.codes.len() / self.codec.code_bytes()
    }

    /// Whether it holds no vector.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }
}

/// An additive bias on the attention scores (`−∞` masks a token): query `j` over token `t`
/// adds `values[(j % rows) · stride + t]`, so one row can serve a whole group of queries
/// (the heads that share a key/value head see the same mask).
#[derive(Debug, Clone, Copy)]
pub struct Bias<'a> {
    /// Row-major bias rows.
    pub values: &'a [f32],
    /// Distance between rows (≥ the number of tokens).
    pub stride: usize,
    /// Number of rows (≥ 1; divides the number of queries).
    pub rows: usize,
}

/// Exact (uncompressed, unrotated) tokens attended with a compressed history: `m` key and
/// value vectors, the first `sinks` of them before the history (attention sinks), the rest
/// after it (the residual window).
#[derive(Debug, Clone, Copy)]
pub struct Exact<'a> {
    /// `m × key dim` values.
    pub keys: &'a [f32],
    /// `m × value dim` values.
    pub values: &'a [f32],
    /// How many of the `m` tokens come before the history (≤ `m`).
    pub sinks: usize,
}

/// Tokens decoded at a time by [`attend_into`] (the block stays in L1).
const ATTEND_BLOCK: usize = 32;

/// Softmax attention of `queries` (`g × key dim`, row-major) over a compressed history and,
/// optionally, exact tokens around it, decoding only a block of tokens at a time and never
/// leaving the rotated domain: a key `x̂ = Rᵀ·ŷ` scores `⟨R·q, ŷ⟩` (each query is rotated
/// once), and the values' weighted sum is accumulated as `Σ p·ŷ` and rotated back once per
/// query. Scores are `scale·⟨q, k⟩ + bias`; the bias columns follow the tokens' order:
/// `exact.sinks` exact tokens, the `n` compressed ones, the other exact tokens.
///
/// Writes each query's output normalized over these tokens (`g × value dim`) into `out` and
/// the log of its softmax denominator (including the running maximum) into `lse`, so partial
/// results over disjoint token ranges merge as `Σ out_i·exp(lse_i − L)` with
/// `L = log Σ exp(lse_i)`. A query whose every score is `−∞` gets zeros and `lse = −∞`.
/// `dither` holds the compressed tokens' dither keys when the codecs dither (the same keys for
/// keys and values). Scratch: a few vectors per query and one block of tokens.
#[allow(clippy::too_many_arguments)]
pub fn attend_into(
    keys: Side<'_>,
    values: Side<'_>,
    exact: Option<Exact<'_>>,
    dither: Option<&[u64]>,
    queries: &[f32],
    scale: f32,
    bias: Option<Bias<'_>>,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    let (kc, vc) = (keys.codec, values.codec);
    let (dk, dv) = (kc.dim, vc.dim);
    let n = keys.len();
    let g = lse.len();
    let m = exact.map_or(0, |e| e.keys.len() / dk);
    let mut checks = vec![
        ("queries", g * dk, queries.len()),
        ("outputs", g * dv, out.len()),
        ("value codes", n * vc.code_bytes(), values.codes.len()),
    ];
    for (what, side, d) in [("key mean", keys, dk), ("value mean", values, dv)] {
        if let Some(mean) = side.mean {
            checks.push((what, d, mean.len()));
        }
    }
    for (what, side, d) in [("key mix", keys, dk), ("value mix", values, dv)] {
        if let Some(mix) = side.mix {
            checks.push((what, d * d, mix.len()));
        }
    }
    if let Some(e) = exact {
        checks.push(("exact keys", m * dk, e.keys.len()));
        checks.push(("exact values", m * dv, e.values.len()));
        checks.push(("exact sinks (at most the exact tokens)", m, e.sinks.max(m)));
    }
    for (what, expected, actual) in checks {
        if expected != actual {
            return Err(LatticeError::Length {
                what,
                expected,
                actual,
            });
        }
    }
    kc.check(
        n,
        keys.codes.len(),
        keys.scales.len(),
        dither.map(<[u64]>::len),
    )?;
    vc.check(
        n,
        values.codes.len(),
        values.scales.len(),
        dither.map(<[u64]>::len),
    )?;
    if g == 0 {
        return Ok(()); // no query: nothing to attend (and no query length to split by)
    }
    if let Some(b) = bias {
        let cols = n + m;
        // (Saturated: a wrapped need let a stride of usize::MAX pass.)
        let need = if cols == 0 {
            0
        } else {
            (b.rows.max(1) - 1)
                .saturating_mul(b.stride)
                .saturating_add(cols)
        };
        if b.rows == 0 || !g.is_multiple_of(b.rows) || b.stride < cols || b.values.len() < need {
            return Err(LatticeError::Length {
                what: "bias (rows dividing the queries, a stride of at least the tokens)",
                expected: need.max(g),
                actual: b.values.len(),
            });
        }
    }
    let args = Attend {
        keys,
        values,
        exact,
        dither,
        queries,
        scale,
        bias,
    };
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { attend_avx2(args, out, lse) };
    }
    attend_blocks(args, out, lse)
}

/// The inputs of [`attend_into`], checked.
#[derive(Clone, Copy)]
struct Attend<'a> {
    keys: Side<'a>,
    values: Side<'a>,
    exact: Option<Exact<'a>>,
    dither: Option<&'a [u64]>,
    queries: &'a [f32],
    scale: f32,
    bias: Option<Bias<'a>>,
}

/// [`attend_blocks`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(args: Attend<'_>, out: &mut [f32], lse: &mut [f32]) -> Result<()> {
    attend_blocks(args, out, lse)
}

/// The online softmax of [`attend_into`]: per query the running maximum `m`, denominator `l`,
/// and the weighted sums of rotated (`acc`) and exact (`plain`) values.
struct Online {
    g: usize,
    dv: usize,
    m: Vec<f32>,
    l: Vec<f32>,
    acc: Vec<f32>,
    plain: Vec<f32>,
    /// Scores, then weights, of one block: `g` rows of [`ATTEND_BLOCK`].
    p: Vec<f32>,
}

impl Online {
    #[inline(always)]
    fn new(g: usize, dv: usize) -> Self {
        Online {
            g,
            dv,
            m: vec![f32::NEG_INFINITY; g],
            l: vec![0.0; g],
            acc: vec![0.0; g * dv],
            plain: vec![0.0; g * dv],
            p: vec![0.0; g * ATTEND_BLOCK],
        }
    }

    /// Scores of the block's `nt` keys (`key(t)`) against `queries` (already scaled), plus
    /// the bias columns from `col`, turned into weights with the running maxima updated.
    #[inline(always)]
    fn absorb<'k>(
        &mut self,
        queries: &[f32],
        nt: usize,
        key: impl Fn(usize) -> &'k [f32],
        bias: Option<Bias<'_>>,
        col: usize,
    ) {
        let (g, dv) = (self.g, self.dv);
        let dk = queries.len() / g;
        for j in 0..g {
            let q = &queries[j * dk..(j + 1) * dk];
            let pj = &mut self.p[j * ATTEND_BLOCK..j * ATTEND_BLOCK + nt];
            for (t, s) in pj.iter_mut().enumerate() {
                *s = dot(q, key(t));
            }
            if let Some(b) = bias {
                let row = &b.values[(j % b.rows) * b.stride + col..][..nt];
                pj.iter_mut().zip(row).for_each(|(s, &a)| *s += a);
            }
            // A NaN score (a NaN query) propagates to the output, as SDPA's would.
            let bmax = pj.iter().fold(f32::NEG_INFINITY, |a, &b| {
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else {
                    a.max(b)
                }
            });
            if bmax == f32::NEG_INFINITY {
                pj.iter_mut().for_each(|s| *s = 0.0);
                continue;
            }
            let mn = if bmax.is_nan() {
                bmax
            } else {
                self.m[j].max(bmax)
            };
            let f = (self.m[j] - mn).exp();
            if f != 1.0 {
                self.l[j] *= f;
                self.acc[j * dv..(j + 1) * dv]
                    .iter_mut()
                    .for_each(|a| *a *= f);
                self.plain[j * dv..(j + 1) * dv]
                    .iter_mut()
                    .for_each(|a| *a *= f);
            }
            self.m[j] = mn;
            let mut sum = 0f32;
            pj.iter_mut().for_each(|s| {
                *s = (*s - mn).exp();
                sum += *s;
            });
            self.l[j] += sum;
        }
    }

    /// Adds the block's weighted values (`value(t)`) to the rotated or the exact sums.
    #[inline(always)]
    fn accumulate<'v>(&mut self, nt: usize, value: impl Fn(usize) -> &'v [f32], rotated: bool) {
        let dv = self.dv;
        let sums = if rotated {
            &mut self.acc
        } else {
            &mut self.plain
        };
        for j in 0..self.g {
            let a = &mut sums[j * dv..(j + 1) * dv];
            for (t, &w) in self.p[j * ATTEND_BLOCK..j * ATTEND_BLOCK + nt]
                .iter()
                .enumerate()
            {
                if w != 0.0 {
                    a.iter_mut().zip(value(t)).for_each(|(x, &v)| *x += w * v);
                }
            }
        }
    }
}

/// The body of [`attend_into`], its arguments checked.
#[inline(always)]
fn attend_blocks(args: Attend<'_>, out: &mut [f32], lse: &mut [f32]) -> Result<()> {
    let Attend {
        keys,
        values,
        exact,
        dither,
        queries,
        scale,
        bias,
    } = args;
    let (kc, vc) = (keys.codec, values.codec);
    let (dk, dv) = (kc.dim, vc.dim);
    let n = keys.len();
    let g = lse.len();
    // The queries scaled, and rotated as the keys were (⟨q, Rᵀŷ⟩ = ⟨R·q, ŷ⟩); with a mix `W`,
    // first mapped into the coded domain (⟨q, W·x̂⟩ = ⟨Wᵀ·q, x̂⟩).
    let scaled: Vec<f32> = queries.iter().map(|&v| v * scale).collect();
    let mut rotated = vec![0f32; g * dk];
    let mut mixed = vec![0f32; dk.max(dv)];
    for (q, r) in scaled.chunks_exact(dk).zip(rotated.chunks_exact_mut(dk)) {
        match keys.mix {
            Some(w) => {
                transposed_times(w, q, &mut mixed[..dk]);
                kc.rotate(&mixed[..dk], r);
            }
            None => kc.rotate(q, r),
        }
    }
    let mut st = Online::new(g, dv);
    // Exact tokens `range`, their bias columns from `col`.
    let exact_part = |st: &mut Online, e: Exact<'_>, range: std::ops::Range<usize>, col: usize| {
        for t0 in range.clone().step_by(ATTEND_BLOCK) {
            let nt = ATTEND_BLOCK.min(range.end - t0);
            st.absorb(
                &scaled,
                nt,
                |t| &e.keys[(t0 + t) * dk..(t0 + t + 1) * dk],
                bias,
                col + t0 - range.start,
            );
            st.accumulate(nt, |t| &e.values[(t0 + t) * dv..(t0 + t + 1) * dv], false);
        }
    };
    if let Some(e) = exact {
        exact_part(&mut st, e, 0..e.sinks, 0);
    }
    let sinks = exact.map_or(0, |e| e.sinks);
    // Decoded blocks, one vector per `ks` / `vs` values (a lattice decodes whole words).
    let (ks, vs) = (dk.next_multiple_of(8), dv.next_multiple_of(8));
    let (mut kb, mut vb) = (vec![0f32; ATTEND_BLOCK * ks], vec![0f32; ATTEND_BLOCK * vs]);
    // The sides' means in the rotated domain, added to every decoded vector.
    let rotated_mean = |side: Side<'_>| {
        side.mean.map(|m| {
            let mut r = vec![0f32; side.codec.dim];
            side.codec.rotate(m, &mut r);
            r
        })
    };
    let (kmean, vmean) = (rotated_mean(keys), rotated_mean(values));
    let add = |y: &mut [f32], mean: &Option<Vec<f32>>| {
        if let Some(m) = mean {
            y.iter_mut().zip(m).for_each(|(a, &b)| *a += b);
        }
    };
    let mut scratch = Scratch::new();
    let (kcb, vcb) = (kc.code_bytes(), vc.code_bytes());
    for t0 in (0..n).step_by(ATTEND_BLOCK) {
        let nt = ATTEND_BLOCK.min(n - t0);
        for (t, y) in kb.chunks_exact_mut(ks).take(nt).enumerate() {
            let i = t0 + t;
            let (src, c) = kc.vector(&keys.codes[i * kcb..(i + 1) * kcb], keys.scales, i);
            kc.rotated_into(src, c, dither.map(|k| k[i]), y, &mut scratch)?;
            add(&mut y[..dk], &kmean);
        }
        st.absorb(&rotated, nt, |t| &kb[t * ks..t * ks + dk], bias, sinks + t0);
        for (t, y) in vb.chunks_exact_mut(vs).take(nt).enumerate() {
            let i = t0 + t;
            let (src, c) = vc.vector(&values.codes[i * vcb..(i + 1) * vcb], values.scales, i);
            vc.rotated_into(src, c, dither.map(|k| k[i]), y, &mut scratch)?;
            add(&mut y[..dv], &vmean);
        }
        st.accumulate(nt, |t| &vb[t * vs..t * vs + dv], true);
    }
    if let Some(e) = exact {
        exact_part(&mut st, e, e.sinks..e.keys.len() / dk, sinks + n);
    }
    for j in 0..g {
        let o = &mut out[j * dv..(j + 1) * dv];
        if st.l[j] == 0.0 {
            o.iter_mut().for_each(|v| *v = 0.0);
            lse[j] = f32::NEG_INFINITY;
            continue;
        }
        let inv = 1.0 / st.l[j];
        let a = &mut st.acc[j * dv..(j + 1) * dv];
        a.iter_mut().for_each(|v| *v *= inv);
        match values.mix {
            Some(w) => {
                vc.unrotate(a, &mut mixed[..dv]);
                for (row, v) in w.chunks_exact(dv).zip(o.iter_mut()) {
                    *v = dot(row, &mixed[..dv]);
                }
            }
            None => vc.unrotate(a, o),
        }
        o.iter_mut()
            .zip(&st.plain[j * dv..(j + 1) * dv])
            .for_each(|(v, &e)| *v += e * inv);
        lse[j] = st.m[j] + st.l[j].ln();
    }
    Ok(())
}

/// `out = Wᵀ·x` for a row-major square `w`.
fn transposed_times(w: &[f32], x: &[f32], out: &mut [f32]) {
    out.iter_mut().for_each(|v| *v = 0.0);
    for (row, &xi) in w.chunks_exact(out.len()).zip(x) {
        out.iter_mut().zip(row).for_each(|(o, &wij)| *o += wij * xi);
    }
}

/// `⟨a, b⟩` in eight independent lanes (so the compiler vectorizes it).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for k in 0..8 {
            s[k] += x[k] * y[k];
        }
    }
    s.iter().sum::<f32>() + tail
}

fn put_bits(out: &mut [u8], pos: usize, bits: u8, v: u32) {
    // `bits` ≤ 8 and `pos % 8` ≤ 7: the value spans at most two bytes.
    let (byte, shift) = (pos / 8, pos % 8);
    let w = (v & ((1 << bits) - 1)) << shift;
    out[byte] |= w as u8;
    if shift + bits as usize > 8 {
        out[byte + 1] |= (w >> 8) as u8;
    }
}

/// Symbols of `bits` bits, LSB-first, from `src` (which holds at least `out.len()·bits` bits).
fn unpack(src: &[u8], bits: u8, out: &mut [u32]) {
    let mask = (1u32 << bits) - 1;
    if 8 % bits == 0 {
        // 2, 4 or 8 bits: whole symbols per byte.
        let per = (8 / bits) as usize;
        for (chunk, &b) in out.chunks_mut(per).zip(src) {
            for (k, o) in chunk.iter_mut().enumerate() {
                *o = (b as u32 >> (k * bits as usize)) & mask;
            }
        }
        return;
    }
    for (i, o) in out.iter_mut().enumerate() {
        let pos = i * bits as usize;
        let (byte, shift) = (pos / 8, pos % 8);
        let lo = src[byte] as u32;
        let hi = if shift + bits as usize > 8 {
            src[byte + 1] as u32
        } else {
            0
        };
        *o = ((lo | hi << 8) >> shift) & mask;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `words` E8 fixed-rate words of `bits` (2..=4) bits per symbol from `src` (each word
    /// `bits` bytes, symbols LSB-first), decoded as [`crate::Lattice::decode_word_fixed`] does
    /// and multiplied by `c`, into `y` (`8·words` values): the same float operations in the
    /// same order, so the same bits.
    ///
    /// # Safety
    /// The CPU must have AVX2; `src` must hold `words·bits` bytes and `y` `8·words` values.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn e8_words(src: &[u8], bits: u8, words: usize, c: f32, y: &mut [f32]) {
        debug_assert!((2..=4).contains(&bits) && src.len() >= words * bits as usize);
        debug_assert!(y.len() >= 8 * words);
        let b = bits as i32;
        let h = 1i32 << (b - 1);
        let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
        let mask = _mm256_set1_epi32((1 << b) - 1);
        // Lanes 0..6 take symbols 1..7; lane 7 is rebuilt from symbol 0 and the parity.
        let rot = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 0);
        let hv = _mm256_set1_epi32(h);
        let cv = _mm256_set1_ps(c);
        let nb = bits as usize;
        for j in 0..words {
            let o = j * nb;
            let x = match nb {
                2 => u16::from_le_bytes([src[o], src[o + 1]]) as i32,
                3 => (src[o] as u32 | (src[o + 1] as u32) << 8 | (src[o + 2] as u32) << 16) as i32,
                _ => u32::from_le_bytes([src[o], src[o + 1], src[o + 2], src[o + 3]]) as i32,
            };
            let s = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x), shifts), mask);
            let s0 = (x & ((1 << b) - 1)) as u32;
            let coset = s0 & 1;
            let t = (s0 >> 1) as i32 - h / 2;
            // Parity of symbols 1..7 (h is even, so it is that of the coordinates).
            let lows = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_slli_epi32(s, 31))) as u32;
            let parity = ((lows >> 1).count_ones() & 1) as i32;
            let z = _mm256_sub_epi32(_mm256_permutevar8x32_epi32(s, rot), hv);
            let z = _mm256_blend_epi32::<0b1000_0000>(z, _mm256_set1_epi32(2 * t + parity));
            let half = _mm256_set1_ps(0.5 * coset as f32);
            let p = _mm256_add_ps(_mm256_cvtepi32_ps(z), half);
            // SAFETY: `y` holds `8·words` values (the caller's contract).
            unsafe { _mm256_storeu_ps(y.as_mut_ptr().add(8 * j), _mm256_mul_ps(p, cv)) };
        }
    }
}

/// A `dim × dim` orthogonal matrix from the seed: Gram–Schmidt (twice, for orthogonality in
/// f64) of a matrix of Box–Muller Gaussians from splitmix64 — Haar-distributed.
fn haar_matrix(dim: usize, seed: u64) -> Vec<f32> {
    let mut state = seed ^ 0x4A55_5F48_4141_5221;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        (mix64(state) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut m: Vec<f64> = (0..dim * dim)
        .map(|_| {
            let (a, b) = (next().max(1e-300), next());
            (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
        })
        .collect();
    for i in 0..dim {
        for _ in 0..2 {
            for j in 0..i {
                let dot: f64 = (0..dim).map(|k| m[i * dim + k] * m[j * dim + k]).sum();
                for k in 0..dim {
                    m[i * dim + k] -= dot * m[j * dim + k];
                }
            }
        }
        let norm = (0..dim).map(|k| m[i * dim + k].powi(2)).sum::<f64>().sqrt();
        for k in 0..dim {
            m[i * dim + k] /= norm;
        }
    }
    m.into_iter().map(|v| v as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauss(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let a = ((mix64(s) >> 11) as f64 / (1u64 << 53) as f64).max(1e-300);
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let b = (mix64(s) >> 11) as f64 / (1u64 << 53) as f64;
                ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
            })
            .collect()
    }

    /// The E8 codec of `dim`-value vectors (the tests' usual one).
    /// The side of `codes` and `scales` under `c`, without a mean or a mix.
    fn plain_side<'a>(c: &'a KvCodec, codes: &'a [u8], scales: &'a [u16]) -> Side<'a> {
        Side {
            codec: c,
            codes,
            scales,
            mean: None,
            mix: None,
        }
    }

    fn e8(dim: usize, bits: u8, rot: Rotation, seed: u64, dither: bool) -> KvCodec {
        KvCodec::new(
            dim,
            bits,
            KvQuantizer::Lattice(Lattice::E8),
            rot,
            seed,
            dither,
        )
        .unwrap()
    }

    fn snr(x: &[f32], y: &[f32]) -> f64 {
        let s: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
        let e: f64 = x
            .iter()
            .zip(y)
            .map(|(&a, &b)| ((a - b) as f64).powi(2))
            .sum();
        10.0 * (s / e).log10()
    }

    fn roundtrip(c: &KvCodec, x: &[f32], keys: Option<&[u64]>) -> Vec<f32> {
        let n = x.len() / c.dim();
        let mut codes = vec![0u8; n * c.code_bytes()];
        let mut scales = vec![0u16; c.scale_len(n)];
        c.encode_into(x, keys, &mut codes, &mut scales).unwrap();
        let mut out = vec![0f32; x.len()];
        c.decode_into(&codes, &scales, keys, &mut out).unwrap();
        out
    }

    /// Softmax attention in f64 over decoded vectors: (outputs, log-sum-exp) per query.
    fn reference_attention(
        k: &[f32],
        v: &[f32],
        q: &[f32],
        (dk, dv): (usize, usize),
        scale: f32,
        bias: &dyn Fn(usize, usize) -> f32,
    ) -> (Vec<f32>, Vec<f32>) {
        let n = k.len() / dk;
        let (mut out, mut lse) = (Vec::new(), Vec::new());
        for (j, qj) in q.chunks_exact(dk).enumerate() {
            let s: Vec<f64> = (0..n)
                .map(|t| {
                    let d: f64 = (0..dk).map(|c| qj[c] as f64 * k[t * dk + c] as f64).sum();
                    d * scale as f64 + bias(j, t) as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = w.iter().sum();
            for c in 0..dv {
                let a: f64 = (0..n).map(|t| w[t] * v[t * dv + c] as f64).sum();
                out.push((a / l) as f32);
            }
            lse.push((m + l.ln()) as f32);
        }
        (out, lse)
    }

    #[test]
    fn attention_over_codes_equals_attention_over_decoded_vectors() {
        let n = 77; // two whole blocks and a part
        let formats = [ScaleFormat::Bf16, ScaleFormat::Log8, ScaleFormat::Log4];
        for ((qk, qv, rot, dither, dk), fmt) in [
            (
                KvQuantizer::Lattice(Lattice::E8),
                KvQuantizer::Lattice(Lattice::E8),
                Rotation::Rht,
                false,
                64,
            ),
            (
                KvQuantizer::Lattice(Lattice::E8),
                KvQuantizer::Lattice(Lattice::D4),
                Rotation::Haar,
                false,
                40,
            ),
            (
                KvQuantizer::Lattice(Lattice::E8),
                KvQuantizer::Lattice(Lattice::E8),
                Rotation::None,
                true,
                64,
            ),
            (
                KvQuantizer::Trellis { l: 10 },
                KvQuantizer::Trellis { l: 10 },
                Rotation::Rht,
                false,
                80,
            ),
        ]
        .into_iter()
        .flat_map(|c| formats.map(|f| (c, f)))
        {
            let kc = KvCodec::new(dk, 4, qk, rot, 3, dither)
                .unwrap()
                .with_scale_format(fmt);
            let vc = KvCodec::new(dk, 3, qv, rot, 4, dither)
                .unwrap()
                .with_scale_format(fmt);
            let keys: Vec<u64> = (0..n as u64).map(|t| t * 3 + 1).collect();
            let dkeys = dither.then_some(&keys[..]);
            let enc = |c: &KvCodec, seed: u64| {
                let x = gauss(n * dk, seed);
                let mut codes = vec![0u8; n * c.code_bytes()];
                let mut scales = vec![0u16; c.scale_len(n)];
                c.encode_into(&x, dkeys, &mut codes, &mut scales).unwrap();
                let mut dec = vec![0f32; n * dk];
                c.decode_into(&codes, &scales, dkeys, &mut dec).unwrap();
                (codes, scales, dec)
            };
            let (kcodes, kscales, kdec) = enc(&kc, 5);
            let (vcodes, vscales, vdec) = enc(&vc, 6);
            let g = 6;
            let q = gauss(g * dk, 7);
            // Two bias rows (queries 0, 2, 4 / 1, 3, 5): row 1 masks the first 40 tokens and
            // an odd one; row 0 adds a ramp.
            let stride = n + 3;
            let mut b = vec![0f32; 2 * stride];
            (0..n).for_each(|t| b[t] = 0.01 * t as f32);
            (0..40)
                .chain([60])
                .for_each(|t| b[stride + t] = f32::NEG_INFINITY);
            let bias = Bias {
                values: &b,
                stride,
                rows: 2,
            };
            let scale = 0.125;
            let (mut out, mut lse) = (vec![f32::NAN; g * dk], vec![f32::NAN; g]);
            let (ks, vs) = (
                Side {
                    codec: &kc,
                    codes: &kcodes,
                    scales: &kscales,
                    mean: None,
                    mix: None,
                },
                Side {
                    codec: &vc,
                    codes: &vcodes,
                    scales: &vscales,
                    mean: None,
                    mix: None,
                },
            );
            attend_into(
                ks,
                vs,
                None,
                dkeys,
                &q,
                scale,
                Some(bias),
                &mut out,
                &mut lse,
            )
            .unwrap();
            let (want, wlse) = reference_attention(&kdec, &vdec, &q, (dk, dk), scale, &|j, t| {
                b[(j % 2) * stride + t]
            });
            let err = out
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 1e-4, "{qk:?} {rot:?} {fmt:?}: max error {err}");
            for (a, w) in lse.iter().zip(&wlse) {
                assert!((a - w).abs() < 1e-4, "lse {a} vs {w}");
            }
            // Exact tokens around the history: 3 sinks before it, 5 window tokens after, their
            // bias columns in that order.
            let (ek, ev) = (gauss(8 * dk, 8), gauss(8 * dk, 9));
            let cols = n + 8;
            let mut eb = vec![0f32; 2 * cols];
            (0..cols).for_each(|t| eb[t] = 0.02 * (t % 7) as f32);
            [0, 5, 50, cols - 1]
                .iter()
                .for_each(|&t| eb[cols + t] = f32::NEG_INFINITY);
            let ebias = Bias {
                values: &eb,
                stride: cols,
                rows: 2,
            };
            let ex = Exact {
                keys: &ek,
                values: &ev,
                sinks: 3,
            };
            attend_into(
                ks,
                vs,
                Some(ex),
                dkeys,
                &q,
                scale,
                Some(ebias),
                &mut out,
                &mut lse,
            )
            .unwrap();
            let cat = |e: &[f32], d: &[f32]| [&e[..3 * dk], d, &e[3 * dk..]].concat();
            let (want, wlse) = reference_attention(
                &cat(&ek, &kdec),
                &cat(&ev, &vdec),
                &q,
                (dk, dk),
                scale,
                &|j, t| eb[(j % 2) * cols + t],
            );
            let err = out
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                err < 1e-4,
                "{qk:?} {rot:?} with exact tokens: max error {err}"
            );
            assert!(lse.iter().zip(&wlse).all(|(a, w)| (a - w).abs() < 1e-4));
            attend_into(
                ks,
                vs,
                None,
                dkeys,
                &q,
                scale,
                Some(bias),
                &mut out,
                &mut lse,
            )
            .unwrap();
            // Two disjoint token ranges merge to the whole.
            // A cut inside a log4 entry would split a `u16`: there, the whole entries before it.
            let cut = if fmt == ScaleFormat::Log4 { 44 } else { 45 };
            let (mut o1, mut l1, mut o2, mut l2) = (
                vec![0f32; g * dk],
                vec![0f32; g],
                vec![0f32; g * dk],
                vec![0f32; g],
            );
            let kb = kc.code_bytes();
            let vb = vc.code_bytes();
            let part = |lo: usize, hi: usize, o: &mut [f32], l: &mut [f32]| {
                let ks = Side {
                    codec: &kc,
                    codes: &kcodes[lo * kb..hi * kb],
                    scales: &kscales[kc.scale_len(lo)..kc.scale_len(hi)],
                    mean: None,
                    mix: None,
                };
                let vs = Side {
                    codec: &vc,
                    codes: &vcodes[lo * vb..hi * vb],
                    scales: &vscales[vc.scale_len(lo)..vc.scale_len(hi)],
                    mean: None,
                    mix: None,
                };
                let bias = Bias {
                    values: &b[lo..],
                    stride,
                    rows: 2,
                };
                attend_into(
                    ks,
                    vs,
                    None,
                    dkeys.map(|k| &k[lo..hi]),
                    &q,
                    scale,
                    Some(bias),
                    o,
                    l,
                )
                .unwrap();
            };
            part(0, cut, &mut o1, &mut l1);
            part(cut, n, &mut o2, &mut l2);
            // (Row 1's queries see only tokens 40..45 of the first part.)
            for j in 0..g {
                let top = l1[j].max(l2[j]);
                let (w1, w2) = ((l1[j] - top).exp(), (l2[j] - top).exp());
                for c in 0..dk {
                    let m = (o1[j * dk + c] * w1 + o2[j * dk + c] * w2) / (w1 + w2);
                    assert!((m - out[j * dk + c]).abs() < 1e-4);
                }
            }
        }
    }

    #[test]
    fn a_query_that_sees_no_token_gets_zeros_and_minus_infinity() {
        let c = e8(64, 4, Rotation::Rht, 1, false);
        let n = 5;
        let x = gauss(n * 64, 2);
        let mut codes = vec![0u8; n * c.code_bytes()];
        let mut scales = vec![0u16; n];
        c.encode_into(&x, None, &mut codes, &mut scales).unwrap();
        let side = plain_side(&c, &codes, &scales);
        let b = vec![f32::NEG_INFINITY; n];
        let bias = Bias {
            values: &b,
            stride: n,
            rows: 1,
        };
        let (mut out, mut lse) = (vec![f32::NAN; 64], vec![0f32; 1]);
        attend_into(
            side,
            side,
            None,
            None,
            &gauss(64, 3),
            1.0,
            Some(bias),
            &mut out,
            &mut lse,
        )
        .unwrap();
        assert!(out.iter().all(|&v| v == 0.0) && lse[0] == f32::NEG_INFINITY);
        // A NaN query gives NaN, not a silently masked row.
        let mut nan_q = gauss(64, 3);
        nan_q[5] = f32::NAN;
        attend_into(
            side, side, None, None, &nan_q, 1.0, None, &mut out, &mut lse,
        )
        .unwrap();
        assert!(out.iter().all(|v| v.is_nan()));
        // Wrong lengths are typed errors.
        let short = Bias {
            values: &b[..3],
            stride: n,
            rows: 1,
        };
        assert!(attend_into(
            side,
            side,
            None,
            None,
            &gauss(64, 3),
            1.0,
            Some(short),
            &mut out,
            &mut lse
        )
        .is_err());
        assert!(attend_into(
            side,
            side,
            None,
            None,
            &gauss(60, 3),
            1.0,
            None,
            &mut out,
            &mut lse
        )
        .is_err());
    }

    #[test]
    fn gaussian_vectors_reach_their_quantizers_calibrated_snr() {
        // Bound 6.02·bits dB; each fixed-rate quantizer's calibrated SNR (long Gaussian
        // sequences) minus a little for 64-value vectors and bf16 scales.
        let x = gauss(64 * 512, 1);
        for bits in [2u8, 3, 4] {
            for rot in [Rotation::None, Rotation::Rht, Rotation::Haar] {
                let q = KvQuantizer::Lattice(Lattice::E8);
                let c = KvCodec::new(64, bits, q, rot, 9, false).unwrap();
                let s = snr(&x, &roundtrip(&c, &x, None));
                let cal = fixed_alpha(Lattice::E8, bits).unwrap().1 as f64;
                assert!(
                    s > cal - 0.5 && s < 6.02 * bits as f64,
                    "{bits} bits {rot:?}: {s:.2} dB"
                );
            }
            let c = KvCodec::new(
                64,
                bits,
                KvQuantizer::Trellis { l: 10 },
                Rotation::Rht,
                9,
                false,
            )
            .unwrap();
            let s = snr(&x, &roundtrip(&c, &x, None));
            let cal =
                hypercodec_trellis::TrellisParams::calibrated_snr_db(10, bits).unwrap() as f64;
            assert!(
                s > cal - 1.0 && s < 6.02 * bits as f64,
                "trellis {bits} bits: {s:.2} dB"
            );
            let e8 = fixed_alpha(Lattice::E8, bits).unwrap().1 as f64;
            assert!(
                s > e8 + 1.0,
                "trellis {bits} bits: {s:.2} dB vs E8 fixed {e8:.2}"
            );
        }
    }

    #[test]
    fn rotation_spreads_an_outlier_channel() {
        // Keys have a few huge channels: unrotated, the per-vector scale serves them and
        // crushes the rest; rotated, the error is spread.
        let mut x = gauss(64 * 256, 2);
        x.chunks_exact_mut(64).for_each(|v| v[3] *= 30.0);
        let c0 = e8(64, 3, Rotation::None, 0, false);
        let c1 = e8(64, 3, Rotation::Rht, 0, false);
        let (s0, s1) = (
            snr(&x, &roundtrip(&c0, &x, None)),
            snr(&x, &roundtrip(&c1, &x, None)),
        );
        assert!(s1 > s0 + 3.0, "none {s0:.2} dB, rht {s1:.2} dB");
    }

    #[test]
    fn sizes_zero_vectors_and_odd_lengths() {
        let c = e8(64, 4, Rotation::Rht, 0, false);
        assert_eq!(c.code_bytes(), 32);
        assert!((c.bits_per_value() - 4.25).abs() < 1e-12);
        let z = vec![0f32; 128];
        assert_eq!(roundtrip(&c, &z, None), z);
        // 80 values: tiles of 16, words of 8; 20 values: a zero-padded last word.
        for dim in [80usize, 20] {
            let c = e8(dim, 4, Rotation::Rht, 3, false);
            let x = gauss(dim * 64, 4);
            assert!(snr(&x, &roundtrip(&c, &x, None)) > 19.0);
        }
    }

    #[test]
    fn dither_is_regenerated_from_the_keys() {
        let c = e8(64, 3, Rotation::Rht, 5, true);
        let x = gauss(64 * 64, 6);
        let keys: Vec<u64> = (0..64).map(|i| 1000 + i * 7).collect();
        let y = roundtrip(&c, &x, Some(&keys));
        let s = snr(&x, &y);
        assert!(s > 12.0, "{s}");
        // Encoding one vector alone with its key gives the same bytes as within the batch.
        let mut a = vec![0u8; 64 * c.code_bytes()];
        let mut sa = vec![0u16; 64];
        c.encode_into(&x, Some(&keys), &mut a, &mut sa).unwrap();
        let mut b = vec![0u8; c.code_bytes()];
        let mut sb = vec![0u16; 1];
        c.encode_into(&x[64 * 10..64 * 11], Some(&keys[10..11]), &mut b, &mut sb)
            .unwrap();
        assert_eq!(&a[10 * c.code_bytes()..11 * c.code_bytes()], &b[..]);
        assert_eq!(sa[10], sb[0]);
        // Keys are required when dithering, and must match the vectors.
        let mut s1 = vec![0u16; 64];
        assert!(c.encode_into(&x, None, &mut a, &mut s1).is_err());
        assert!(c
            .encode_into(&x, Some(&keys[..3]), &mut a, &mut s1)
            .is_err());
    }

    #[test]
    fn trellis_vectors_roundtrip_and_refuse_what_they_cannot_do() {
        let q = KvQuantizer::Trellis { l: 12 };
        let c = KvCodec::new(128, 3, q, Rotation::Haar, 1, false).unwrap();
        assert_eq!(c.code_bytes(), 48);
        let x = gauss(128 * 16, 8);
        assert!(snr(&x, &roundtrip(&c, &x, None)) > 15.5);
        assert_eq!(roundtrip(&c, &[0f32; 128], None), vec![0f32; 128]);
        // One bit per value: 8 bytes per 64-value vector, within 1.5 dB of the 6.02 dB bound.
        let one = KvCodec::new(64, 1, q, Rotation::Rht, 1, false).unwrap();
        assert_eq!(one.code_bytes(), 8);
        let s1 = snr(&x, &roundtrip(&one, &x, None));
        assert!(s1 > 4.5 && s1 < 6.03, "{s1}");
        // Dither, a state longer than the vector's bits, and unknown (L, K) are refused.
        assert!(KvCodec::new(64, 3, q, Rotation::Rht, 0, true).is_err());
        assert!(KvCodec::new(4, 2, q, Rotation::Rht, 0, false).is_err());
        assert!(KvCodec::new(
            64,
            3,
            KvQuantizer::Trellis { l: 30 },
            Rotation::Rht,
            0,
            false
        )
        .is_err());
    }

    /// Vectors coded as `T·x − mean` and read as `W·(x̂ + mean)`: attention over the codes
    /// equals attention over the vectors read back, with and without exact tokens around them.
    #[test]
    fn a_mean_and_a_mix_around_the_codes_are_undone_by_attention() {
        let (n, d, g) = (50, 64, 3);
        for rot in [Rotation::Rht, Rotation::Haar] {
            let kc = KvCodec::new(d, 2, KvQuantizer::Trellis { l: 10 }, rot, 1, false).unwrap();
            let vc = e8(d, 3, rot, 2, false).with_scale_format(ScaleFormat::Log8);
            let km: Vec<f32> = (0..d).map(|i| 3.0 * ((i % 5) as f32 - 2.0)).collect();
            let vm: Vec<f32> = (0..d).map(|i| 0.5 * (i % 3) as f32).collect();
            // Vectors around the means, coded without them, decoded with them.
            let side = |c: &KvCodec, m: &[f32], seed: u64| {
                let x = gauss(n * d, seed);
                let mut codes = vec![0u8; n * c.code_bytes()];
                let mut scales = vec![0u16; c.scale_len(n)];
                c.encode_into(&x, None, &mut codes, &mut scales).unwrap();
                let mut dec = vec![0f32; n * d];
                c.decode_into(&codes, &scales, None, &mut dec).unwrap();
                dec.chunks_exact_mut(d)
                    .for_each(|v| v.iter_mut().zip(m).for_each(|(a, b)| *a += b));
                (codes, scales, dec)
            };
            let (kcodes, kscales, kdec) = side(&kc, &km, 3);
            let (vcodes, vscales, vdec) = side(&vc, &vm, 4);
            let q = gauss(g * d, 5);
            let scale = 0.125;
            let run5 = |kmean: Option<&[f32]>,
                        vmean: Option<&[f32]>,
                        kmix: Option<&[f32]>,
                        vmix: Option<&[f32]>,
                        exact: Option<Exact<'_>>| {
                let (mut out, mut lse) = (vec![f32::NAN; g * d], vec![f32::NAN; g]);
                let r = attend_into(
                    Side {
                        codec: &kc,
                        codes: &kcodes,
                        scales: &kscales,
                        mean: kmean,
                        mix: kmix,
                    },
                    Side {
                        codec: &vc,
                        codes: &vcodes,
                        scales: &vscales,
                        mean: vmean,
                        mix: vmix,
                    },
                    exact,
                    None,
                    &q,
                    scale,
                    None,
                    &mut out,
                    &mut lse,
                );
                r.map(|()| (out, lse))
            };
            let run4 =
                |kmean: Option<&[f32]>,
                 vmean: Option<&[f32]>,
                 kmix: Option<&[f32]>,
                 vmix: Option<&[f32]>| run5(kmean, vmean, kmix, vmix, None);
            let run = |kmean: Option<&[f32]>, vmean: Option<&[f32]>| run4(kmean, vmean, None, None);
            let (out, lse) = run(Some(&km), Some(&vm)).unwrap();
            let (want, wlse) = reference_attention(&kdec, &vdec, &q, (d, d), scale, &|_, _| 0.0);
            for (a, b) in out.iter().zip(&want).chain(lse.iter().zip(&wlse)) {
                assert!((a - b).abs() < 1e-4, "{rot:?}: {a} vs {b}");
            }
            // Without the means the outputs are another thing.
            let (plain, _) = run(None, None).unwrap();
            let far = plain.iter().zip(&want).any(|(a, b)| (a - b).abs() > 0.1);
            assert!(far, "{rot:?}");
            // A mix W: the vectors read as W·(x̂ + mean), the queries and outputs mapped once.
            let mix = |seed: u64| -> Vec<f32> {
                let noise = gauss(d * d, seed);
                (0..d * d)
                    .map(|i| {
                        0.3 * noise[i]
                            + if i % (d + 1) == 0 {
                                1.0 + (i % 7) as f32
                            } else {
                                0.0
                            }
                    })
                    .collect()
            };
            let (wk, wv) = (mix(6), mix(7));
            let apply = |w: &[f32], x: &[f32]| -> Vec<f32> {
                x.chunks_exact(d)
                    .flat_map(|v| {
                        w.chunks_exact(d)
                            .map(|row| row.iter().zip(v).map(|(a, b)| a * b).sum::<f32>())
                            .collect::<Vec<_>>()
                    })
                    .collect()
            };
            let (out, lse) = run4(Some(&km), Some(&vm), Some(&wk), Some(&wv)).unwrap();
            let (want, wlse) = reference_attention(
                &apply(&wk, &kdec),
                &apply(&wv, &vdec),
                &q,
                (d, d),
                scale,
                &|_, _| 0.0,
            );
            for (a, b) in out.iter().zip(&want).chain(lse.iter().zip(&wlse)) {
                assert!(
                    (a - b).abs() < 2e-3 * (1.0 + b.abs()),
                    "{rot:?} mixed: {a} vs {b}"
                );
            }
            // Exact sinks and window tokens stay in the original domain, beside mixed codes.
            let (ek, ev) = (gauss(5 * d, 8), gauss(5 * d, 9));
            let exact = Exact {
                keys: &ek,
                values: &ev,
                sinks: 2,
            };
            let (out, lse) = run5(Some(&km), Some(&vm), Some(&wk), Some(&wv), Some(exact)).unwrap();
            let around = |e: &[f32], mid: Vec<f32>| [&e[..2 * d], &mid[..], &e[2 * d..]].concat();
            let (want, wlse) = reference_attention(
                &around(&ek, apply(&wk, &kdec)),
                &around(&ev, apply(&wv, &vdec)),
                &q,
                (d, d),
                scale,
                &|_, _| 0.0,
            );
            for (a, b) in out.iter().zip(&want).chain(lse.iter().zip(&wlse)) {
                assert!(
                    (a - b).abs() < 2e-3 * (1.0 + b.abs()),
                    "{rot:?} mixed, exact: {a} vs {b}"
                );
            }
            assert!(matches!(
                run4(None, None, Some(&wk[1..]), None),
                Err(LatticeError::Length {
                    what: "key mix",
                    ..
                })
            ));
            assert!(matches!(
                run4(None, None, None, Some(&wv[..d])),
                Err(LatticeError::Length {
                    what: "value mix",
                    ..
                })
            ));
            assert!(matches!(
                run(Some(&km[1..]), None),
                Err(LatticeError::Length {
                    what: "key mean",
                    ..
                })
            ));
            assert!(matches!(
                run(None, Some(&vm[..9])),
                Err(LatticeError::Length {
                    what: "value mean",
                    ..
                })
            ));
        }
    }

    #[test]
    fn quantizers_are_named_as_the_error_lists_them() {
        for name in KvQuantizer::NAMES {
            let q = KvQuantizer::named(name, 10).unwrap();
            assert!(
                KvCodec::new(64, 4, q, Rotation::Rht, 0, false).is_ok(),
                "{name}"
            );
        }
        for bad in ["a2", "E8", "", "int"] {
            let e = KvQuantizer::named(bad, 10).unwrap_err();
            assert!(matches!(e, LatticeError::UnknownKvQuantizer { .. }));
            assert!(e.to_string().ends_with("use e8, d4, z1 or trellis"), "{e}");
        }
    }

    #[test]
    fn attention_without_queries_or_with_a_wrapping_bias_stride_is_no_panic() {
        let d = 16;
        let c = e8(d, 4, Rotation::Rht, 1, false);
        let x = gauss(2 * d, 3);
        let (mut codes, mut scales) = (vec![0u8; 2 * c.code_bytes()], vec![0u16; 2]);
        c.encode_into(&x, None, &mut codes, &mut scales).unwrap();
        let side = plain_side(&c, &codes, &scales);
        // No query over two tokens: nothing to do (it divided by the query count).
        attend_into(side, side, None, None, &[], 1.0, None, &mut [], &mut []).unwrap();
        // A bias whose rows · stride wraps: a length error, not an index past the values.
        let q = gauss(2 * d, 4);
        let (mut out, mut lse) = (vec![0f32; 2 * d], vec![0f32; 2]);
        let bias = Bias {
            values: &[0.0],
            stride: usize::MAX,
            rows: 2,
        };
        let r = attend_into(
            side,
            side,
            None,
            None,
            &q,
            1.0,
            Some(bias),
            &mut out,
            &mut lse,
        );
        assert!(matches!(r, Err(LatticeError::Length { .. })), "{r:?}");
        // A slice that is not a power of two is refused before the butterflies run past it.
        assert!(std::panic::catch_unwind(|| crate::rht::fwht(&mut [0f32; 12])).is_err());
        let h = [0f32; 0];
        assert!(crate::rotate_hessian(&h, 1 << 32, &crate::LatticeParams::default()).is_err());
    }

    #[test]
    fn values_near_the_f32_range_decode_finite() {
        // A value of 3e38 among small ones came back as +inf (its decoded value a rounding
        // past f32's largest).
        for (quantizer, bits) in [
            (KvQuantizer::Lattice(Lattice::E8), 4),
            (KvQuantizer::Lattice(Lattice::Z1), 4),
            (KvQuantizer::Trellis { l: 10 }, 2),
        ] {
            for d in [7usize, 16, 64] {
                let mut x: Vec<f32> = gauss(d, 5);
                x[d / 3] = 3e38;
                let c = KvCodec::new(d, bits, quantizer, Rotation::Rht, 1, false).unwrap();
                let (mut codes, mut scales) = (vec![0u8; c.code_bytes()], vec![0u16; 1]);
                c.encode_into(&x, None, &mut codes, &mut scales).unwrap();
                let mut back = vec![f32::NAN; d];
                c.decode_into(&codes, &scales, None, &mut back).unwrap();
                assert!(
                    back.iter().all(|v| v.is_finite()),
                    "{quantizer:?} {d}: {back:?}"
                );
                assert!(back[d / 3] > 1e38, "{quantizer:?} {d}: {}", back[d / 3]);
            }
        }
    }

    #[test]
    fn vectors_of_subnormal_values_encode() {
        // Their RMS (about 1e-40) has no f32 reciprocal; the trellis refused them as "not
        // finite". They code like any vector (bf16 scales hold the RMS, coarsely).
        let d = 64;
        let x: Vec<f32> = gauss(d, 3).iter().map(|v| v * 1e-40).collect();
        let c = KvCodec::new(
            d,
            2,
            KvQuantizer::Trellis { l: 10 },
            Rotation::Rht,
            1,
            false,
        )
        .unwrap();
        let (mut codes, mut scales) = (vec![0u8; c.code_bytes()], vec![0u16; 1]);
        c.encode_into(&x, None, &mut codes, &mut scales).unwrap();
        let mut back = vec![f32::NAN; d];
        c.decode_into(&codes, &scales, None, &mut back).unwrap();
        assert!(back.iter().all(|v| v.is_finite() && v.abs() < 1e-37));
    }

    #[test]
    fn log8_scales_are_one_byte_after_the_codes_and_cost_little() {
        let (log8, unlog8) = (ScaleFormat::log8, ScaleFormat::unlog8);
        assert_eq!((log8(0.0), log8(-1.0), log8(f32::NAN)), (0, 0, 0));
        assert_eq!((log8(1.0), unlog8(128), unlog8(0)), (128, 1.0, 0.0));
        // Above the grid's range: its top; below half its least value: 0 (a zero vector, not
        // one amplified to the least scale); between, the least value.
        assert_eq!(
            (log8(1e-30), log8(1e30), log8(f32::INFINITY)),
            (0, 255, 255)
        );
        assert_eq!((log8(0.4 * unlog8(1)), log8(0.6 * unlog8(1))), (0, 1));
        let mut c = 2e-5f32;
        while c < 5e4 {
            let k = log8(c);
            let err = (unlog8(k) - c).abs();
            assert!(err <= 0.0443 * c, "{c}: {k} is {}", unlog8(k));
            // The nearer of the two grid values around it.
            for j in [k - 1, k + 1] {
                assert!((unlog8(j) - c).abs() >= err, "{c}: {j} nearer than {k}");
            }
            c *= 1.0137;
        }
        let (n, d) = (300, 64);
        let mut x = gauss(n * d, 21);
        // Vectors from 1e-3 to 1e3 in size, and a zero vector.
        for (i, v) in x.chunks_exact_mut(d).enumerate() {
            let m = 10f32.powf(-3.0 + 6.0 * i as f32 / n as f32);
            v.iter_mut().for_each(|a| *a *= m);
        }
        x[5 * d..6 * d].iter_mut().for_each(|a| *a = 0.0);
        for (q, bits) in [
            (KvQuantizer::Lattice(Lattice::E8), 2),
            (KvQuantizer::Trellis { l: 10 }, 1),
            (KvQuantizer::Trellis { l: 10 }, 2),
        ] {
            let b = KvCodec::new(d, bits, q, Rotation::Rht, 1, false).unwrap();
            let l = b.clone().with_scale_format(ScaleFormat::Log8);
            assert_eq!(l.code_bytes(), b.code_bytes() + 1);
            assert_eq!((l.scale_len(n), b.scale_len(n)), (0, n));
            assert_eq!(
                l.bits_per_value() - b.bits_per_value(),
                -8.0 / d as f64,
                "{q:?}"
            );
            let (bc, lc) = (b.code_bytes(), l.code_bytes());
            let mut bcodes = vec![0u8; n * bc];
            let mut bscales = vec![0u16; n];
            b.encode_into(&x, None, &mut bcodes, &mut bscales).unwrap();
            let mut lcodes = vec![0u8; n * lc];
            l.encode_into(&x, None, &mut lcodes, &mut []).unwrap();
            for i in 0..n {
                // The same codes; the scale byte after them.
                assert_eq!(lcodes[i * lc..i * lc + bc], bcodes[i * bc..(i + 1) * bc]);
                let (fb, fl) = (
                    bf16::from_bits(bscales[i]).to_f32(),
                    unlog8(lcodes[(i + 1) * lc - 1]),
                );
                assert!((fl - fb).abs() <= 0.045 * fb, "{i}: {fl} vs {fb}");
            }
            let (yb, yl) = (roundtrip(&b, &x, None), roundtrip(&l, &x, None));
            assert!(yl[5 * d..6 * d].iter().all(|&v| v == 0.0));
            // Per-vector SNR, so every size counts alike.
            let mean = |y: &[f32]| {
                x.chunks_exact(d)
                    .zip(y.chunks_exact(d))
                    .enumerate()
                    .filter(|(i, _)| *i != 5)
                    .map(|(_, (a, b))| snr(a, b))
                    .sum::<f64>()
                    / (n - 1) as f64
            };
            let (sb, sl) = (mean(&yb), mean(&yl));
            assert!(sl > sb - 0.1, "{q:?} at {bits} bits: {sl} dB against {sb}");
            // A scales array where the scale is in the codes is a typed error.
            assert!(matches!(
                l.encode_into(&x, None, &mut lcodes, &mut bscales),
                Err(LatticeError::Length { what: "scales", .. })
            ));
            assert!(matches!(
                l.decode_into(&lcodes, &bscales, None, &mut vec![0f32; n * d]),
                Err(LatticeError::Length { what: "scales", .. })
            ));
        }
    }

    #[test]
    fn log4_scales_pack_four_vectors_to_an_entry_and_cost_little_near_unit_size() {
        let (log4, unlog4) = (ScaleFormat::log4, ScaleFormat::unlog4);
        assert_eq!((log4(0.0), log4(-1.0), log4(f32::NAN)), (0, 0, 0));
        assert_eq!(
            (log4(1.0), unlog4(8), unlog4(0), unlog4(0x18)),
            (8, 1.0, 0.0, 1.0)
        );
        // Far above the grid: its end; below half its least value: 0 (the nearer).
        assert_eq!((log4(1e-30), log4(1e30), log4(f32::INFINITY)), (0, 15, 15));
        assert_eq!((log4(0.148), log4(0.15), log4(0.2)), (0, 1, 1));
        let mut c = 0.3f32;
        while c < 3.36 {
            let k = log4(c);
            let err = (unlog4(k) - c).abs();
            assert!(err <= 0.0906 * c, "{c}: {k} is {}", unlog4(k));
            for j in [k - 1, k + 1].into_iter().filter(|j| (1..=15).contains(j)) {
                assert!((unlog4(j) - c).abs() >= err, "{c}: {j} nearer than {k}");
            }
            c *= 1.0137;
        }
        // An odd count (the last entry holds three vectors), sizes from ½ to 2, a zero vector.
        let (n, d) = (303, 64);
        let mut x = gauss(n * d, 23);
        for (i, v) in x.chunks_exact_mut(d).enumerate() {
            let m = 2f32.powf(-1.0 + 2.0 * i as f32 / n as f32);
            v.iter_mut().for_each(|a| *a *= m);
        }
        x[6 * d..7 * d].iter_mut().for_each(|a| *a = 0.0);
        // The grid is one of RMS for every quantizer (a lattice's scale is RMS/α): at 3 to 5
        // bits the codes' own error nears the scale's (about −26 dB), so the loss grows.
        for (q, bits, loss) in [
            (KvQuantizer::Lattice(Lattice::E8), 2, 0.25),
            (KvQuantizer::Trellis { l: 10 }, 1, 0.25),
            (KvQuantizer::Trellis { l: 10 }, 2, 0.25),
            (KvQuantizer::Lattice(Lattice::E8), 3, 0.7),
            (KvQuantizer::Lattice(Lattice::E8), 4, 1.6),
            (KvQuantizer::Lattice(Lattice::D4), 4, 1.6),
            (KvQuantizer::Lattice(Lattice::E8), 5, 3.3),
        ] {
            let b = KvCodec::new(d, bits, q, Rotation::Rht, 1, false).unwrap();
            let l = b.clone().with_scale_format(ScaleFormat::Log4);
            assert_eq!(
                (l.code_bytes(), l.scale_len(n), l.scale_len(4)),
                (b.code_bytes(), 76, 1)
            );
            assert_eq!(l.bits_per_value() - b.bits_per_value(), -12.0 / d as f64);
            let mut bcodes = vec![0u8; n * b.code_bytes()];
            let mut bscales = vec![0u16; n];
            b.encode_into(&x, None, &mut bcodes, &mut bscales).unwrap();
            // Stale bits in the scales are overwritten.
            let (mut lcodes, mut lscales) = (vec![0u8; n * l.code_bytes()], vec![0xffffu16; 76]);
            l.encode_into(&x, None, &mut lcodes, &mut lscales).unwrap();
            assert_eq!(lcodes, bcodes, "{q:?}: the same codes");
            assert_eq!(
                lscales[75] >> 12,
                0,
                "the last entry's unused nibble is clear"
            );
            for i in 0..n {
                let fb = bf16::from_bits(bscales[i]).to_f32();
                let k = ((lscales[i / 4] >> (4 * (i % 4))) & 15) as u8;
                // (The bf16 scale is itself rounded: a grid value, not necessarily the same.)
                let err = (unlog4(k) / l.alpha() - fb).abs();
                assert!(err <= 0.095 * fb, "{i}: nibble {k} for scale {fb}");
            }
            let (yb, yl) = (roundtrip(&b, &x, None), roundtrip(&l, &x, None));
            assert!(yl[6 * d..7 * d].iter().all(|&v| v == 0.0));
            let mean = |y: &[f32]| {
                x.chunks_exact(d)
                    .zip(y.chunks_exact(d))
                    .enumerate()
                    .filter(|(i, _)| *i != 6)
                    .map(|(_, (a, b))| snr(a, b))
                    .sum::<f64>()
                    / (n - 1) as f64
            };
            let (sb, sl) = (mean(&yb), mean(&yl));
            assert!(sl > sb - loss, "{q:?} at {bits} bits: {sl} dB against {sb}");
            // Wrong scale lengths are typed errors.
            for len in [75, 77, n] {
                assert!(matches!(
                    l.encode_into(&x, None, &mut lcodes, &mut vec![0u16; len]),
                    Err(LatticeError::Length { what: "scales", .. })
                ));
                assert!(matches!(
                    l.decode_into(&lcodes, &vec![0u16; len], None, &mut vec![0f32; n * d]),
                    Err(LatticeError::Length { what: "scales", .. })
                ));
            }
        }
        // Far from unit size the grid clamps: a vector of size 100 reads back far too small.
        let big: Vec<f32> = gauss(d, 5).iter().map(|v| v * 100.0).collect();
        let c = KvCodec::new(
            d,
            2,
            KvQuantizer::Trellis { l: 10 },
            Rotation::Rht,
            1,
            false,
        )
        .unwrap()
        .with_scale_format(ScaleFormat::Log4);
        assert!(snr(&big, &roundtrip(&c, &big, None)) < 1.0);
    }

    fn same_decoding(fast: &KvCodec, slow: &KvCodec, x: &[f32]) -> bool {
        let n = x.len() / fast.dim();
        let mut codes = vec![0u8; n * fast.code_bytes()];
        let mut scales = vec![0u16; n];
        fast.encode_into(x, None, &mut codes, &mut scales).unwrap();
        let (mut a, mut b) = (vec![0f32; x.len()], vec![0f32; x.len()]);
        fast.decode_into(&codes, &scales, None, &mut a).unwrap();
        slow.decode_into(&codes, &scales, None, &mut b).unwrap();
        a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits())
    }

    #[test]
    fn the_avx2_word_decoder_equals_the_portable_one_bit_for_bit() {
        let x = gauss(64 * 300, 11);
        for bits in [2u8, 3, 4] {
            for rot in [Rotation::None, Rotation::Rht] {
                let q = KvQuantizer::Lattice(Lattice::E8);
                let fast = KvCodec::new(64, bits, q, rot, 2, false).unwrap();
                let mut slow = fast.clone();
                slow.avx2 = false;
                assert!(same_decoding(&fast, &slow, &x), "{bits} bits {rot:?}");
            }
        }
    }

    #[test]
    fn the_trellis_state_table_equals_the_trellis_decoder() {
        // Vectors of 64 and 80 values, and 8 (one window of L = 12 at 2 bits wraps over most of it).
        for dim in [64, 80, 8] {
            let x = gauss(dim * 50, 12);
            for (l, bits) in [(10u8, 2u8), (10, 3), (12, 4), (16, 8), (12, 2), (8, 2)] {
                if dim * (bits as usize) < l as usize {
                    continue;
                }
                let q = KvQuantizer::Trellis { l };
                let fast = KvCodec::new(dim, bits, q, Rotation::None, 2, false).unwrap();
                assert!(!fast.states.is_empty());
                let mut slow = fast.clone();
                slow.states.clear();
                assert!(same_decoding(&fast, &slow, &x), "dim {dim} L {l} K {bits}");
            }
        }
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        // A dithered trellis says what is wrong (it used to name a missing fixed-rate form).
        let msg = KvCodec::new(
            64,
            4,
            KvQuantizer::Trellis { l: 10 },
            Rotation::Rht,
            0,
            true,
        )
        .expect_err("no dithered trellis")
        .to_string();
        assert!(msg.contains("no dithered form"), "{msg}");
        assert!(KvCodec::new(
            64,
            1,
            KvQuantizer::Lattice(Lattice::E8),
            Rotation::Rht,
            0,
            false
        )
        .is_err());
        assert!(KvCodec::new(
            64,
            4,
            KvQuantizer::Lattice(Lattice::A2),
            Rotation::Rht,
            0,
            false
        )
        .is_err());
        assert!(KvCodec::new(
            0,
            4,
            KvQuantizer::Lattice(Lattice::E8),
            Rotation::Rht,
            0,
            false
        )
        .is_err());
        let c = e8(64, 4, Rotation::Rht, 0, false);
        let mut codes = vec![0u8; 32];
        let mut scales = vec![0u16; 1];
        let mut x = vec![1f32; 64];
        x[7] = f32::NAN;
        assert_eq!(
            c.encode_into(&x, None, &mut codes, &mut scales),
            Err(LatticeError::NonFinite { index: 7 })
        );
        assert!(c
            .encode_into(&x[..60], None, &mut codes, &mut scales)
            .is_err());
        // Keys given to a codec that does not dither would dither one side only.
        x[7] = 1.0;
        assert!(c
            .encode_into(&x, Some(&[3]), &mut codes, &mut scales)
            .is_err());
        // Values near f32's limit overflow in the rotation: refused, not coded as zeros.
        let big = vec![3e38f32; 64];
        assert!(matches!(
            c.encode_into(&big, None, &mut codes, &mut scales),
            Err(LatticeError::RotationOverflow { vector: 0 })
        ));
        // An absurd length is refused before anything is allocated.
        let q = KvQuantizer::Trellis { l: 10 };
        assert!(KvCodec::new(1 << 40, 3, q, Rotation::Rht, 0, false).is_err());
        // And a length of 0, named as the range it is outside (it said "expected 4096, got 0").
        let e = KvCodec::new(0, 3, q, Rotation::Rht, 0, false).unwrap_err();
        assert_eq!(e.to_string(), "the vector length must be 1 to 4096, not 0");
        let mut out = vec![0f32; 64];
        assert!(c
            .decode_into(&codes[..31], &scales, None, &mut out)
            .is_err());
    }
}
