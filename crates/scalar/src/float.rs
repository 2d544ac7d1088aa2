//! Raw float formats: `f32`, `f16`, `bf16`, little-endian.

use crate::{Result, ScalarError};
use half::{bf16, f16};
use std::fmt;

/// A float storage type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum FloatDtype {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the top half of a binary32).
    Bf16,
}

impl FloatDtype {
    /// Every float type, widest first.
    pub const ALL: [FloatDtype; 3] = [FloatDtype::F32, FloatDtype::F16, FloatDtype::Bf16];

    /// Bytes per value.
    pub const fn size(self) -> usize {
        match self {
            FloatDtype::F32 => 4,
            FloatDtype::F16 | FloatDtype::Bf16 => 2,
        }
    }

    /// The lowercase name used in manifests and on the command line (`f32`, `f16`, `bf16`).
    pub const fn name(self) -> &'static str {
        match self {
            FloatDtype::F32 => "f32",
            FloatDtype::F16 => "f16",
            FloatDtype::Bf16 => "bf16",
        }
    }

    /// Parses a name as written by [`FloatDtype::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Whether a scale `x` (before rounding) keeps its precision in this type: zero, or a value
    /// that rounds to a finite normal number. Only f16 is checked below: its smallest normal
    /// (6.1e-5) is where a row or group scale starts to lose bits (and below 3e-8 it becomes
    /// zero); bf16 and f32 share f32's range.
    #[inline]
    pub fn holds_scale(self, x: f32) -> bool {
        self.round(x).is_finite() && !self.underflows(x)
    }

    /// Whether a stored (rounded) scale `s` of the values `covered` loses them: not finite,
    /// below f16's normal range, or an f16 zero for values that are not all zero.
    #[inline]
    pub fn loses(self, s: f32, covered: &[f32]) -> bool {
        !self.holds_scale(s)
            || (self == FloatDtype::F16 && s == 0.0 && covered.iter().any(|&v| v != 0.0))
    }

    /// Whether a nonzero `x` lies below this type's normal range where that range is narrower
    /// than f32's (f16 only: 6.1e-5).
    #[inline]
    pub fn underflows(self, x: f32) -> bool {
        self == FloatDtype::F16 && x != 0.0 && self.round(x).abs() < f16::MIN_POSITIVE.to_f32()
    }

    /// Rounds `x` to this type (round-to-nearest-even) and back to `f32`.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            FloatDtype::F32 => x,
            FloatDtype::F16 => f16::from_f32(x).to_f32(),
            FloatDtype::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }

    /// Appends `x` in this type, little-endian.
    #[inline]
    pub(crate) fn push(self, out: &mut Vec<u8>, x: f32) {
        match self {
            FloatDtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
            FloatDtype::F16 => out.extend_from_slice(&f16::from_f32(x).to_le_bytes()),
            FloatDtype::Bf16 => out.extend_from_slice(&bf16::from_f32(x).to_le_bytes()),
        }
    }

    /// Reads value `i` of a little-endian array of this type. `bytes` must hold it.
    #[inline]
    pub(crate) fn get(self, bytes: &[u8], i: usize) -> f32 {
        match self {
            FloatDtype::F32 => {
                let b = &bytes[4 * i..4 * i + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }
            FloatDtype::F16 => f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
            FloatDtype::Bf16 => bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
        }
    }
}

impl fmt::Display for FloatDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Fails with [`ScalarError::NonFinite`] at the first NaN or infinity.
pub fn check_finite(values: &[f32]) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(ScalarError::NonFinite {
            index,
            value: values[index],
        }),
        None => Ok(()),
    }
}

/// Encodes `values` as little-endian `dtype`.
///
/// With `allow_non_finite == false` (the safe default of every front end) a NaN or infinity is
/// [`ScalarError::NonFinite`], and a finite value that would round to infinity in `dtype` is
/// [`ScalarError::OutOfRange`]. With `true`, values are cast as they are (an overflow becomes
/// infinity, NaN stays NaN), which keeps raw archives of unusual tensors bit-faithful.
pub fn encode_floats(values: &[f32], dtype: FloatDtype, allow_non_finite: bool) -> Result<Vec<u8>> {
    if !allow_non_finite {
        check_finite(values)?;
    }
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    match dtype {
        FloatDtype::F32 => {
            for &v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        FloatDtype::F16 | FloatDtype::Bf16 => {
            for (index, &v) in values.iter().enumerate() {
                let before = out.len();
                dtype.push(&mut out, v);
                if !allow_non_finite && !dtype.get(&out[before..], 0).is_finite() {
                    return Err(ScalarError::OutOfRange {
                        index,
                        value: v,
                        dtype,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// IEEE half → f32, exact for every value, branch-free for finite ones (inlinable and
/// vectorizable, unlike a library call per value): the exponent and mantissa move to f32's
/// position and a multiplication by 2^112 rebiases the exponent (subnormals included).
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let rest = h & 0x7FFF;
    let v = if rest >= 0x7C00 {
        f32::from_bits((rest << 13) | 0x7F80_0000)
    } else {
        f32::from_bits(rest << 13) * f32::from_bits(0x7780_0000)
    };
    f32::from_bits(v.to_bits() | ((h & 0x8000) << 16))
}

/// Decodes little-endian `dtype` values into `out`; `bytes.len()` must be `out.len() * dtype.size()`.
pub fn decode_floats_into(bytes: &[u8], dtype: FloatDtype, out: &mut [f32]) -> Result<()> {
    let expected = out.len().saturating_mul(dtype.size());
    if bytes.len() != expected {
        return Err(ScalarError::StreamLength {
            stream: "values",
            expected,
            actual: bytes.len(),
        });
    }
    match dtype {
        FloatDtype::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        FloatDtype::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        FloatDtype::Bf16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
    }
    Ok(())
}

/// Decodes a whole little-endian `dtype` array; its length must be a multiple of the type's size.
pub fn decode_floats(bytes: &[u8], dtype: FloatDtype) -> Result<Vec<f32>> {
    let n = bytes.len() / dtype.size();
    let mut out = vec![0.0; n];
    decode_floats_into(bytes, dtype, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversion_is_exact() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            let got = f16_bits_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#x}"
            );
        }
    }

    #[test]
    fn nan_is_rejected_by_default_and_kept_when_allowed() {
        let v = [1.0, f32::NAN, 2.0];
        assert!(matches!(
            encode_floats(&v, FloatDtype::Bf16, false),
            Err(ScalarError::NonFinite { index: 1, .. })
        ));
        let b = encode_floats(&v, FloatDtype::Bf16, true).unwrap();
        assert!(decode_floats(&b, FloatDtype::Bf16).unwrap()[1].is_nan());
    }

    #[test]
    fn f16_overflow_is_a_typed_error() {
        assert!(matches!(
            encode_floats(&[0.0, 70000.0], FloatDtype::F16, false),
            Err(ScalarError::OutOfRange { index: 1, .. })
        ));
        // bf16 has f32's range.
        assert!(encode_floats(&[0.0, 70000.0], FloatDtype::Bf16, false).is_ok());
    }

    #[test]
    fn wrong_stream_length_is_reported() {
        let mut out = [0.0f32; 3];
        assert_eq!(
            decode_floats_into(&[0u8; 5], FloatDtype::F16, &mut out),
            Err(ScalarError::StreamLength {
                stream: "values",
                expected: 6,
                actual: 5
            })
        );
    }
}
