//! Measuring a candidate: encode, decode, count stored bytes, and the error of the whole
//! tensor and of each row block.

use crate::spec::Spec;
use crate::Result;
use hypercodec_hwz::{Compression, EncodeOptions, EncodedTensor};
use serde::{Deserialize, Serialize};

/// What one candidate costs and how wrong it is, measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// The candidate's label.
    pub label: String,
    /// Stored bytes of all its streams, all side information, as the archive's writer stores
    /// them ([`EncodedTensor::stored_bytes`] under the planner's `container` compression).
    pub bytes: u64,
    /// `8 · bytes / elements`.
    pub bps: f64,
    /// `Σ(x − x̂)² / Σx²` (0 for an exact candidate; `Σ(x − x̂)²` itself for an all-zero tensor).
    pub rel_mse: f64,
    /// `10·log10(1 / rel_mse)`, infinite when exact (`null` in JSON).
    #[serde(with = "inf_as_null")]
    pub snr_db: f64,
    /// Largest `|x − x̂| / |x|` over the elements (infinite where `x = 0` and `x̂ ≠ 0`;
    /// `null` in JSON).
    #[serde(with = "inf_as_null")]
    pub max_rel_err: f64,
    /// `Σ(x − x̂)²`.
    pub sse: f64,
    /// Sums of the whole tensor, for callers that report statistics without decoding again.
    #[serde(skip)]
    pub sums: Sums,
    /// Per row block: `Σ(x − x̂)²`.
    #[serde(skip)]
    pub block_sse: Vec<f64>,
    /// Per row block: largest `|x − x̂| / |x|`.
    #[serde(skip)]
    pub block_max_rel: Vec<f64>,
}

/// Sums over a tensor and its reconstruction.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sums {
    /// Values.
    pub n: u64,
    /// `Σx²`.
    pub signal: f64,
    /// `Σ(x − x̂)²`.
    pub noise: f64,
    /// `Σx̂²`.
    pub recon: f64,
    /// `Σx·x̂`.
    pub dot: f64,
    /// `max |x − x̂|`.
    pub max_abs: f64,
}

/// Decodes an encoded tensor of `shape`.
pub fn decode(name: &str, shape: &[u64], t: &EncodedTensor) -> Result<Vec<f32>> {
    Ok(t.decode(name, shape)?)
}

/// `Σx²` of each block of `block_len` values, and of the whole.
pub fn energies(values: &[f32], block_len: usize) -> (Vec<f64>, f64) {
    let blocks: Vec<f64> = values
        .chunks(block_len.max(1))
        .map(|b| b.iter().map(|&x| (x as f64) * (x as f64)).sum())
        .collect();
    let total = blocks.iter().sum();
    (blocks, total)
}

/// Encodes `values` with `spec`, decodes, and measures; `block_len` values per row block; the
/// bytes are counted as a writer with `container` compression stores them.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    name: &str,
    values: &[f32],
    shape: &[u64],
    spec: &Spec,
    block_len: usize,
    energy: f64,
    options: EncodeOptions,
    container: Compression,
) -> Result<(Measured, EncodedTensor)> {
    let t = spec.encode(name, values, shape, options)?;
    let out = decode(name, shape, &t)?;
    let bytes = t.stored_bytes(values.len() as u64, container);
    let mut block_sse = Vec::with_capacity(values.len().div_ceil(block_len.max(1)));
    let mut block_max_rel = Vec::with_capacity(block_sse.capacity());
    let mut sums = Sums {
        n: values.len() as u64,
        signal: energy,
        ..Sums::default()
    };
    for (x, y) in values
        .chunks(block_len.max(1))
        .zip(out.chunks(block_len.max(1)))
    {
        let mut sse = 0f64;
        let mut max_rel = 0f64;
        for (&a, &b) in x.iter().zip(y) {
            let d = (a - b) as f64;
            sse += d * d;
            sums.recon += b as f64 * b as f64;
            sums.dot += a as f64 * b as f64;
            sums.max_abs = sums.max_abs.max(d.abs());
            if d != 0.0 {
                max_rel = max_rel.max(if a == 0.0 {
                    f64::INFINITY
                } else {
                    (d / a as f64).abs()
                });
            }
        }
        block_sse.push(sse);
        block_max_rel.push(max_rel);
    }
    let sse: f64 = block_sse.iter().sum();
    let rel_mse = if energy > 0.0 { sse / energy } else { sse };
    let n = values.len().max(1) as f64;
    Ok((
        Measured {
            label: spec.label(),
            bytes,
            bps: bytes as f64 * 8.0 / n,
            rel_mse,
            snr_db: if rel_mse > 0.0 {
                -10.0 * rel_mse.log10()
            } else {
                f64::INFINITY
            },
            max_rel_err: block_max_rel.iter().copied().fold(0.0, f64::max),
            sse,
            sums: Sums { noise: sse, ..sums },
            block_sse,
            block_max_rel,
        },
        t,
    ))
}

/// JSON has no infinity: write it as `null` and read `null` back as +∞.
pub(crate) mod inf_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_none()
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
    }
}
