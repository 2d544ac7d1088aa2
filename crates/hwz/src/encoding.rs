//! The `Encoding` vocabulary and the encode/decode of one tensor.

use crate::{HwzError, Result, MAX_ELEMENTS, MAX_RANK};
use hypercodec_scalar::{self as scalar, AffineParams, FloatDtype};
use serde::{Deserialize, Serialize};

/// How one tensor is stored. Serialized in the manifest as an object with a `type` tag.
///
/// Encodings are added, never changed: a changed meaning gets a new tag. A reader meets an
/// unknown tag with [`HwzError::UnknownEncoding`] and unknown fields with
/// [`HwzError::InvalidEncoding`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Encoding {
    /// Plain floats, little-endian. Stream `values`.
    Raw {
        /// Storage type.
        dtype: FloatDtype,
    },
    /// Affine integers with group scales ([`hypercodec_scalar`]). Streams `codes`, `scales`,
    /// and `offsets` when asymmetric.
    Affine {
        /// Bits per code, 1..=8.
        bits: u8,
        /// `"tensor"`, `"row"` or a group size.
        group: scalar::Group,
        /// Symmetric (no offsets) or asymmetric.
        symmetric: bool,
        /// Storage type of scales and offsets.
        scale_dtype: FloatDtype,
    },
}

/// The `type` tags this build knows.
pub const KNOWN_ENCODINGS: &[&str] = &["raw", "affine"];

/// Stream roles.
pub mod role {
    /// Raw float values.
    pub const VALUES: &str = "values";
    /// Packed integer codes.
    pub const CODES: &str = "codes";
    /// Group scales.
    pub const SCALES: &str = "scales";
    /// Group offsets (asymmetric affine).
    pub const OFFSETS: &str = "offsets";
}

impl Encoding {
    /// The encoding's `type` tag.
    pub fn tag(&self) -> &'static str {
        match self {
            Encoding::Raw { .. } => "raw",
            Encoding::Affine { .. } => "affine",
        }
    }

    /// A short human label, e.g. `raw-bf16` or `affine-int4-g128-asym-f16`.
    pub fn label(&self) -> String {
        match self {
            Encoding::Raw { dtype } => format!("raw-{dtype}"),
            Encoding::Affine {
                bits,
                group,
                symmetric,
                scale_dtype,
            } => format!(
                "affine-int{bits}-{group}-{}-{scale_dtype}",
                if *symmetric { "sym" } else { "asym" }
            ),
        }
    }

    /// The affine parameters of an affine encoding.
    pub fn affine_params(&self) -> Option<AffineParams> {
        match *self {
            Encoding::Affine {
                bits,
                group,
                symmetric,
                scale_dtype,
            } => Some(AffineParams {
                bits,
                group,
                symmetric,
                scale_dtype,
            }),
            _ => None,
        }
    }

    /// The affine encoding of `params`.
    pub fn affine(params: AffineParams) -> Self {
        Encoding::Affine {
            bits: params.bits,
            group: params.group,
            symmetric: params.symmetric,
            scale_dtype: params.scale_dtype,
        }
    }

    /// The exact decoded byte length of every stream of a tensor of `shape`, in a fixed order.
    ///
    /// This is the single source of truth that the writer produces, the reader checks before
    /// it allocates anything, and the decoder relies on.
    pub fn stream_lens(&self, tensor: &str, shape: &[u64]) -> Result<Vec<(&'static str, u64)>> {
        let n = element_count(tensor, shape)?;
        let (rows, cols) = matrix_view(shape, n);
        match self {
            Encoding::Raw { dtype } => Ok(vec![(role::VALUES, n * dtype.size() as u64)]),
            Encoding::Affine { .. } => {
                let params = self.affine_params().expect("affine");
                let lens = params
                    .stream_lens(rows as usize, cols as usize)
                    .map_err(|e| HwzError::InvalidEncoding {
                        tensor: tensor.to_string(),
                        message: e.to_string(),
                    })?;
                let mut v = vec![
                    (role::CODES, lens.codes as u64),
                    (role::SCALES, lens.scales as u64),
                ];
                if !params.symmetric {
                    v.push((role::OFFSETS, lens.offsets as u64));
                }
                Ok(v)
            }
        }
    }
}

/// The number of elements of `shape`, checked against [`MAX_RANK`] and [`MAX_ELEMENTS`].
pub fn element_count(tensor: &str, shape: &[u64]) -> Result<u64> {
    if shape.len() > MAX_RANK {
        return Err(HwzError::LimitExceeded {
            what: "tensor rank",
            value: shape.len() as u64,
            max: MAX_RANK as u64,
        });
    }
    let overflow = || HwzError::ShapeOverflow {
        tensor: tensor.to_string(),
        shape: shape.to_vec(),
        max: MAX_ELEMENTS,
    };
    let n = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    if n > MAX_ELEMENTS {
        return Err(overflow());
    }
    Ok(n)
}

/// The `rows × cols` view of a tensor: `cols` is the last dimension (the input dimension of a
/// linear layer's weight), `rows` everything before it. A scalar is `1 × 1`.
pub fn matrix_view(shape: &[u64], n: u64) -> (u64, u64) {
    match shape.last() {
        Some(&cols) if cols > 0 => (n / cols, cols),
        Some(_) => (0, 0),
        None => (1, 1),
    }
}

/// Options of [`encode`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Store NaN and infinities in raw encodings instead of failing. By default, `false`:
    /// non-finite input is an error.
    pub allow_non_finite: bool,
}

/// One tensor encoded: its encoding and its streams by role, ready for the writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedTensor {
    /// The encoding.
    pub encoding: Encoding,
    /// `(role, bytes)` in the order of [`Encoding::stream_lens`].
    pub streams: Vec<(&'static str, Vec<u8>)>,
}

impl EncodedTensor {
    /// Stored bytes of all streams before any container-level compression.
    pub fn payload_bytes(&self) -> u64 {
        self.streams.iter().map(|(_, b)| b.len() as u64).sum()
    }
}

fn scalar_err(tensor: &str) -> impl Fn(scalar::ScalarError) -> HwzError + '_ {
    move |source| HwzError::Scalar {
        tensor: tensor.to_string(),
        source,
    }
}

/// Encodes `values` (row-major, of `shape`) with `encoding`.
pub fn encode(
    tensor: &str,
    values: &[f32],
    shape: &[u64],
    encoding: &Encoding,
    options: EncodeOptions,
) -> Result<EncodedTensor> {
    let n = element_count(tensor, shape)?;
    if values.len() as u64 != n {
        return Err(HwzError::ElementCount {
            tensor: tensor.to_string(),
            shape: shape.to_vec(),
            expected: n,
            actual: values.len() as u64,
        });
    }
    let lens = encoding.stream_lens(tensor, shape)?;
    let (rows, cols) = matrix_view(shape, n);
    let streams = match encoding {
        Encoding::Raw { dtype } => {
            let bytes = scalar::encode_floats(values, *dtype, options.allow_non_finite)
                .map_err(scalar_err(tensor))?;
            vec![(role::VALUES, bytes)]
        }
        Encoding::Affine { .. } => {
            let params = encoding.affine_params().expect("affine");
            let enc = scalar::affine_encode(values, rows as usize, cols as usize, &params)
                .map_err(scalar_err(tensor))?;
            let mut v = vec![(role::CODES, enc.codes), (role::SCALES, enc.scales)];
            if !params.symmetric {
                v.push((role::OFFSETS, enc.offsets));
            }
            v
        }
    };
    debug_assert!(streams
        .iter()
        .zip(&lens)
        .all(|((r, b), (lr, l))| r == lr && b.len() as u64 == *l));
    Ok(EncodedTensor {
        encoding: *encoding,
        streams,
    })
}

/// Decodes one tensor from its streams (already verified and decompressed) into `out`, which
/// must hold exactly the tensor's element count.
///
/// `streams` maps each role of [`Encoding::stream_lens`] to its bytes; a missing, extra or
/// wrongly sized stream is a typed error raised before any work.
pub fn decode_into(
    tensor: &str,
    encoding: &Encoding,
    shape: &[u64],
    streams: &[(&str, &[u8])],
    out: &mut [f32],
) -> Result<()> {
    let n = element_count(tensor, shape)?;
    if out.len() as u64 != n {
        return Err(HwzError::ElementCount {
            tensor: tensor.to_string(),
            shape: shape.to_vec(),
            expected: n,
            actual: out.len() as u64,
        });
    }
    let lens = encoding.stream_lens(tensor, shape)?;
    check_roles(
        tensor,
        &lens,
        streams.iter().map(|(r, b)| (*r, b.len() as u64)),
    )?;
    let get = |role: &str| {
        streams
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, b)| *b)
            .unwrap_or(&[])
    };
    let (rows, cols) = matrix_view(shape, n);
    match encoding {
        Encoding::Raw { dtype } => scalar::decode_floats_into(get(role::VALUES), *dtype, out),
        Encoding::Affine { .. } => {
            let params = encoding.affine_params().expect("affine");
            scalar::affine_decode_into(
                get(role::CODES),
                get(role::SCALES),
                get(role::OFFSETS),
                rows as usize,
                cols as usize,
                &params,
                out,
            )
        }
    }
    .map_err(scalar_err(tensor))
}

/// Checks that `present` holds exactly the roles of `lens`, each of the required length.
pub(crate) fn check_roles<'a>(
    tensor: &str,
    lens: &[(&'static str, u64)],
    present: impl Iterator<Item = (&'a str, u64)> + Clone,
) -> Result<()> {
    for (role, _) in present.clone() {
        if !lens.iter().any(|(r, _)| *r == role) {
            return Err(HwzError::UnexpectedStream {
                tensor: tensor.to_string(),
                role: role.to_string(),
            });
        }
    }
    for (role, expected) in lens {
        match present.clone().find(|(r, _)| r == role) {
            None => {
                return Err(HwzError::MissingStream {
                    tensor: tensor.to_string(),
                    role: role.to_string(),
                })
            }
            Some((_, actual)) if actual != *expected => {
                return Err(HwzError::StreamSize {
                    tensor: tensor.to_string(),
                    role: role.to_string(),
                    expected: *expected,
                    actual,
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}
