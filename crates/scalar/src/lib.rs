//! hypercodec-scalar: the scalar formats of hypercodec — raw `f32` / `f16` / `bf16` and affine
//! integers of 1 to 8 bits with one scale per group of values, packed LSB-first.
//!
//! Key design decision: every format is a pure function from a slice of `f32` to byte streams
//! and back, with the exact length of every stream derivable from the shape and the parameters
//! alone ([`AffineParams::stream_lens`]). A container can therefore check a stream's size
//! *before* it allocates anything, and a GPU kernel can find any group without a table.
//!
//! - [`encode_floats`] / [`decode_floats_into`]: raw casts through the `half` crate
//!   (round-to-nearest-even). Non-finite input and values that overflow the target type are
//!   typed errors unless explicitly allowed.
//! - [`affine_encode`] / [`affine_decode_into`]: affine quantization along the last (input)
//!   dimension, per tensor, per row or in groups of `g` values, symmetric or asymmetric, with
//!   scales stored as `f32`, `f16` or `bf16`.
//! - [`pack_bits`] / [`unpack_bits`]: the LSB-first bit packing used by the codes.
//! - [`ldlq`]: rounding with error feedback from a layer's input statistics (GPTQ's rule),
//!   [`affine_ldlq_codes`] + [`affine_pack`] for the affine format (the streams are the same
//!   format; only which codes are chosen changes).
//!
//! ```
//! use hypercodec_scalar::{affine_decode_into, affine_encode, AffineParams, Group};
//! let w: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
//! let params = AffineParams { bits: 4, group: Group::Size(64), ..AffineParams::default() };
//! let enc = affine_encode(&w, 2, 128, &params)?;
//! let mut back = vec![0.0; w.len()];
//! affine_decode_into(&enc.codes, &enc.scales, &enc.offsets, 2, 128, &params, &mut back)?;
//! assert!(w.iter().zip(&back).all(|(a, b)| (a - b).abs() <= 1.0 / 15.0 + 1e-3));
//! # Ok::<(), hypercodec_scalar::ScalarError>(())
//! ```
#![deny(missing_docs)]

mod affine;
mod bits;
mod float;
pub mod ldlq;

pub use affine::{
    affine_decode, affine_decode_into, affine_decode_rows_into, affine_encode, affine_ldlq_codes,
    affine_pack, AffineEncoded, AffineParams, AffineStreams, FitError, Group, GroupLayout,
    GroupQuant, StreamLens, MAX_BITS,
};
pub use bits::{pack_bits, packed_len, unpack_bits, unpack_bits_into, unpack_bits_range_into};
pub use float::{
    check_finite, decode_floats, decode_floats_into, encode_floats, f16_bits_to_f32, FloatDtype,
};

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ScalarError {
    /// An input value is NaN or infinite and the format was not told to allow it.
    #[error("value {value} at index {index} is not finite; clean the tensor or allow non-finite values for raw formats")]
    NonFinite {
        /// Position of the first offending value.
        index: usize,
        /// The value itself.
        value: f32,
    },
    /// A finite input value does not fit the target float type (it would become infinite).
    #[error("value {value:.3e} at index {index} overflows {dtype}; {}", wider_values(*.dtype))]
    OutOfRange {
        /// Position of the first offending value.
        index: usize,
        /// The value itself.
        value: f32,
        /// The target type.
        dtype: FloatDtype,
    },
    /// Finite values that a cast to `dtype` loses most of (they underflow it: f16 keeps
    /// nothing below about 6e-8), where a cast of values in its range keeps 50 dB or more.
    #[error("the values underflow {dtype}: cast, they keep only {snr_db:.1} dB of the tensor; {}", wider_values(*.dtype))]
    ValuesUnderflow {
        /// The target type.
        dtype: FloatDtype,
        /// What the cast kept: signal to error, in dB.
        snr_db: f64,
    },
    /// A group's scale or offset does not fit the scale type.
    #[error("scale or offset {value:.3e} of group {group} overflows {dtype}; {}", wider(*.dtype))]
    ScaleOverflow {
        /// Index of the group.
        group: usize,
        /// The scale or offset that overflowed.
        value: f32,
        /// The scale type.
        dtype: FloatDtype,
    },
    /// An asymmetric group's values span more than f32's largest value (about 3.4e38): the top
    /// level `offset + q·scale` cannot be computed in f32, by this crate or any runtime.
    #[error(
        "group {group} spans {low:e} to {high:e}, wider than f32's range: asymmetric codes \
         cannot hold it; use symmetric codes or a float type"
    )]
    SpanOverflow {
        /// Index of the group.
        group: usize,
        /// Its smallest value.
        low: f32,
        /// Its largest value.
        high: f32,
    },
    /// A group's nonzero scale is below the smallest normal value of f16, the one scale type
    /// whose range is narrower than f32's: stored, it would lose its precision or become zero
    /// (see [`FloatDtype::underflows`]; an asymmetric affine group only when its values are
    /// that small too). Encoders retry such a tensor with bf16 scales.
    #[error("scale {value} of group {group} underflows {dtype}; {}", wider(*.dtype))]
    ScaleUnderflow {
        /// Index of the group.
        group: usize,
        /// The scale that underflowed.
        value: f32,
        /// The scale type.
        dtype: FloatDtype,
    },
    /// The bit width is outside 1..=8.
    #[error("bit width {bits} is not supported; use 1 to {max}", max = MAX_BITS)]
    InvalidBits {
        /// The requested width.
        bits: u8,
    },
    /// A group size of zero was requested.
    #[error("group size must be at least 1")]
    InvalidGroup,
    /// Input statistics for error feedback (a hessian) that hold NaN or an infinity.
    #[error("the input statistics (hessian): value {value} at index {index} is not finite")]
    NonFiniteStatistics {
        /// Position of the first offending value.
        index: usize,
        /// The value itself.
        value: f32,
    },
    /// A damping factor for error feedback that is negative, NaN or infinite.
    #[error("damping {damp} must be a finite number of at least 0 (0.01 is GPTQ's default)")]
    InvalidDamp {
        /// The factor given.
        damp: f64,
    },
    /// Input statistics for error feedback that no damping makes positive definite.
    #[error("the {n}x{n} input statistics are not positive definite, even damped")]
    NotPositiveDefinite {
        /// Their size.
        n: usize,
    },
    /// `rows * cols` does not match the number of values (or overflows).
    #[error("shape {rows}x{cols} does not match {len} values")]
    ShapeMismatch {
        /// Rows of the 2-D view.
        rows: usize,
        /// Columns of the 2-D view (the last dimension).
        cols: usize,
        /// Number of values given.
        len: usize,
    },
    /// A byte stream has the wrong length for the shape and parameters.
    #[error("{stream} stream holds {actual} bytes but the shape and parameters need {expected}")]
    StreamLength {
        /// Which stream (`codes`, `scales`, `offsets`, `values`).
        stream: &'static str,
        /// The length the shape implies.
        expected: usize,
        /// The length given.
        actual: usize,
    },
}

/// What to do about a value that `dtype` cannot hold (it said "use bf16 or f32" for bf16 too).
fn wider_values(dtype: FloatDtype) -> &'static str {
    match dtype {
        FloatDtype::F16 => "use bf16 or f32",
        FloatDtype::Bf16 | FloatDtype::F32 => "use f32",
    }
}

/// What to do about a scale that `dtype` cannot hold.
fn wider(dtype: FloatDtype) -> &'static str {
    match dtype {
        FloatDtype::F16 => "store scales as bf16 or f32",
        FloatDtype::Bf16 => "store scales as f32",
        FloatDtype::F32 => "no scale type holds it",
    }
}

/// Result alias of this crate.
pub type Result<T, E = ScalarError> = std::result::Result<T, E>;

impl ScalarError {
    /// The error of a scale `value` of `group` that `dtype` cannot hold: [`Self::ScaleOverflow`]
    /// when it is not finite, [`Self::ScaleUnderflow`] otherwise.
    pub fn scale_range(group: usize, value: f32, dtype: FloatDtype) -> Self {
        if value.is_finite() {
            ScalarError::ScaleUnderflow {
                group,
                value,
                dtype,
            }
        } else {
            ScalarError::ScaleOverflow {
                group,
                value,
                dtype,
            }
        }
    }

    /// Whether this is a scale the scale type cannot hold, in either direction: the error after
    /// which an encoder may retry with a wider scale type.
    pub fn is_scale_range(&self) -> bool {
        matches!(
            self,
            ScalarError::ScaleOverflow { .. } | ScalarError::ScaleUnderflow { .. }
        )
    }
}
