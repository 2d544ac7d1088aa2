//! Encode and decode of the `lattice` encoding: the lattice pipeline of `hypercodec-lattice`
//! with the symbol coders of `hypercodec-rice`.

use crate::encoding::{role, Coding, Encoding, StreamLen};
use crate::{HwzError, Result};
use hypercodec_lattice::{self as lat, Lattice};
use hypercodec_rice::{rans, rice, CodingError};
use hypercodec_scalar::{self as scalar, ScalarError};

fn lat_err(tensor: &str) -> impl Fn(lat::LatticeError) -> HwzError + '_ {
    move |source| HwzError::Lattice {
        tensor: tensor.to_string(),
        source,
    }
}

fn coding_err(tensor: &str) -> impl Fn(CodingError) -> HwzError + '_ {
    move |source| HwzError::Coding {
        tensor: tensor.to_string(),
        source,
    }
}

/// The fields of a lattice encoding and its pipeline parameters.
fn unpack(
    tensor: &str,
    encoding: &Encoding,
) -> Result<(
    Lattice,
    hypercodec_scalar::FloatDtype,
    Coding,
    lat::LatticeParams,
)> {
    match (encoding.clone(), encoding.lattice_params()) {
        (
            Encoding::Lattice {
                lattice,
                scale_dtype,
                coding,
                ..
            },
            Some(params),
        ) => Ok((lattice, scale_dtype, coding, params)),
        _ => Err(HwzError::InvalidEncoding {
            tensor: tensor.into(),
            message: "not a lattice encoding".into(),
        }),
    }
}

/// Streams of a lattice-encoded tensor, in the order of [`Encoding::stream_lens`].
pub(crate) fn encode(
    tensor: &str,
    values: &[f32],
    rows: u64,
    cols: u64,
    encoding: &Encoding,
    lens: &[(&'static str, StreamLen)],
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let (lattice, scale_dtype, coding, params) = unpack(tensor, encoding)?;
    let q = quantize_parallel(values, rows as usize, cols as usize, &params, scale_dtype)
        .map_err(lat_err(tensor))?;
    if let Some(group) = q.scales.iter().position(|s| !s.is_finite()) {
        let value = values[group * cols as usize..(group + 1) * cols as usize]
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        return Err(HwzError::Scalar {
            tensor: tensor.into(),
            source: ScalarError::ScaleOverflow {
                group,
                value,
                dtype: scale_dtype,
            },
        });
    }
    let scales = scalar::encode_floats(&q.scales, scale_dtype, false)
        .map_err(crate::encoding::scalar_err(tensor))?;
    // Pad short symbol streams to the minimum, in whole 16-bit words (rANS reads words).
    let min_symbols = (lens
        .iter()
        .find(|(r, _)| *r == role::SYMBOLS)
        .map_or(0, |(_, l)| l.min) as usize)
        .next_multiple_of(2);
    let pad = |mut v: Vec<u8>| {
        if v.len() < min_symbols {
            v.resize(min_symbols, 0);
        }
        v
    };
    let mut streams = vec![(role::SCALES, scales)];
    match coding {
        Coding::Rice { chunk } => {
            let s = rice::encode(&q.symbols, chunk as usize).map_err(coding_err(tensor))?;
            streams.push((role::PARAMS, s.params));
            streams.push((role::OFFSETS, s.offsets));
            streams.push((role::SYMBOLS, pad(s.payload)));
        }
        Coding::Rans {
            chunk,
            lanes,
            prob_bits,
        } => {
            let ctx = crate::view::contexts(&lattice);
            let s = rans::encode(
                &q.symbols,
                ctx,
                &crate::encoding::rans_params(chunk, lanes, prob_bits),
            )
            .map_err(coding_err(tensor))?;
            streams.push((role::MODEL, s.model));
            streams.push((role::INDEX, s.index));
            streams.push((role::SYMBOLS, pad(s.payload)));
        }
        Coding::Fixed { bits } => {
            // Fixed-rate symbols are below 2^bits <= 256 by construction.
            let codes: Vec<u8> = q.symbols.iter().map(|&s| s as u8).collect();
            let packed =
                scalar::pack_bits(&codes, bits).map_err(crate::encoding::scalar_err(tensor))?;
            streams.push((role::SYMBOLS, packed));
        }
    }
    Ok(streams)
}

/// Row ranges `(start, count)` for the pool's threads to share a tensor's rows: one range for
/// a small tensor.
fn row_parts(rows: usize, cols: usize) -> Vec<(usize, usize)> {
    let t = if rows * cols < 1 << 18 {
        1
    } else {
        crate::par::threads().min(rows).max(1)
    };
    let per = rows.div_ceil(t).max(1);
    if rows == 0 {
        return vec![(0, 0)];
    }
    (0..rows)
        .step_by(per)
        .map(|s| (s, per.min(rows - s)))
        .collect()
}

/// [`lat::quantize_rows`] over row ranges on the pool, results concatenated in row order.
fn quantize_parallel(
    values: &[f32],
    rows: usize,
    cols: usize,
    params: &lat::LatticeParams,
    scale_dtype: hypercodec_scalar::FloatDtype,
) -> std::result::Result<lat::Quantized, lat::LatticeError> {
    let parts = row_parts(rows, cols);
    if parts.len() <= 1 {
        return lat::quantize_rows(values, rows, cols, params, |s| scale_dtype.round(s));
    }
    let results = crate::par::map(parts.clone(), |(start, n)| {
        let v = &values[start * cols..(start + n) * cols];
        lat::quantize_rows(v, n, cols, params, |x| scale_dtype.round(x))
    });
    let mut all = lat::Quantized {
        symbols: Vec::new(),
        scales: Vec::with_capacity(rows),
    };
    for r in results {
        let q = r?;
        if all.symbols.is_empty() {
            all.symbols.reserve(q.symbols.len() * parts.len());
        }
        all.symbols.extend_from_slice(&q.symbols);
        all.scales.extend_from_slice(&q.scales);
    }
    Ok(all)
}

/// Encodes with the lattice encoding `template` (its `alpha` is ignored), choosing α so that
/// the stored bytes of all streams stay at or below `target_bps` bits per value: α starts from
/// the committed calibration and is corrected by the measured rate (rate is close to linear in
/// log₂ α), keeping the largest α that fits. For fixed-rate coding the rate is set by `bits`,
/// so α is the calibrated best-SNR value and `target_bps` is not used.
pub fn encode_to_rate(
    tensor: &str,
    values: &[f32],
    shape: &[u64],
    template: &Encoding,
    target_bps: f64,
    options: crate::EncodeOptions,
) -> Result<crate::EncodedTensor> {
    let Encoding::Lattice {
        lattice, coding, ..
    } = *template
    else {
        return Err(HwzError::InvalidEncoding {
            tensor: tensor.into(),
            message: "rate control needs a lattice encoding".into(),
        });
    };
    let with_alpha = |alpha: f32| template.with_alpha(alpha);
    if let Coding::Fixed { bits } = coding {
        let alpha = lat::calibration::fixed_alpha(lattice, bits).map_or(1.0, |f| f.0);
        return crate::encode(tensor, values, shape, &with_alpha(alpha), options);
    }
    if !(target_bps.is_finite() && target_bps > 0.0) {
        return Err(HwzError::InvalidEncoding {
            tensor: tensor.into(),
            message: format!("target rate {target_bps} bps is not positive"),
        });
    }
    let n = values.len().max(1) as f64;
    let mut alpha = lat::calibration::alpha_for_bps(lattice, target_bps as f32);
    // Fit α on a sample of whole rows first (a sixteenth, at least 64 rows): the rate of a
    // row sample tracks the tensor's closely, so the full tensor is then encoded once or twice.
    let (rows, cols) = crate::matrix_view(shape, values.len() as u64);
    let (rows, cols) = (rows as usize, cols as usize);
    let stride = (rows / 64).clamp(1, 16);
    if stride > 1 {
        let sample: Vec<f32> = values
            .chunks_exact(cols)
            .step_by(stride)
            .flatten()
            .copied()
            .collect();
        let sample_shape = [(sample.len() / cols) as u64, cols as u64];
        let sn = sample.len().max(1) as f64;
        for _ in 0..8 {
            let enc = crate::encode(tensor, &sample, &sample_shape, &with_alpha(alpha), options)?;
            let gap = target_bps - enc.payload_bytes() as f64 * 8.0 / sn;
            if (0.0..0.002).contains(&gap) {
                break;
            }
            alpha *= 2f32.powf((gap - 0.0005) as f32);
            if !(alpha.is_finite() && alpha > 1e-6) {
                alpha = lat::calibration::alpha_for_bps(lattice, target_bps as f32);
                break;
            }
        }
    }
    let mut best: Option<(f32, crate::EncodedTensor)> = None;
    for _ in 0..8 {
        let enc = crate::encode(tensor, values, shape, &with_alpha(alpha), options)?;
        let bps = enc.payload_bytes() as f64 * 8.0 / n;
        if bps <= target_bps && best.as_ref().is_none_or(|(a, _)| alpha > *a) {
            best = Some((alpha, enc));
        }
        let gap = target_bps - bps;
        // Close enough once inside the target by less than 0.01 bps (0.002 without sampling).
        let tolerance = if stride > 1 { 0.01 } else { 0.002 };
        if (0.0..tolerance).contains(&gap) {
            break;
        }
        // Aim a little below the target so the next try lands inside it.
        alpha *= 2f32.powf((gap - 0.0005) as f32);
        if !(alpha.is_finite() && alpha > 1e-6) {
            break;
        }
    }
    match best {
        Some((_, enc)) => Ok(enc),
        None => Err(HwzError::InvalidEncoding {
            tensor: tensor.into(),
            message: format!("no scale reaches {target_bps} bps for this tensor (side information alone may exceed it)"),
        }),
    }
}
