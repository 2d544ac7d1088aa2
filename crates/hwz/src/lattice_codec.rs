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

/// The rANS contexts of a lattice: words of `dim` symbols, tables chosen by [`Lattice::context`].
fn contexts(l: &Lattice) -> rans::Contexts<impl Fn(usize, u32) -> usize + Copy + '_> {
    rans::Contexts {
        word: l.dim(),
        count: l.contexts(),
        map: move |j, first| l.context(j, first),
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
    let q = lat::quantize_rows(values, rows as usize, cols as usize, &params, |s| {
        scale_dtype.round(s)
    })
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
    let scales = scalar::encode_floats(&q.scales, scale_dtype, false).map_err(|source| {
        HwzError::Scalar {
            tensor: tensor.into(),
            source,
        }
    })?;
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
            let ctx = contexts(&lattice);
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
            let packed = scalar::pack_bits(&codes, bits).map_err(|source| HwzError::Scalar {
                tensor: tensor.into(),
                source,
            })?;
            streams.push((role::SYMBOLS, packed));
        }
    }
    Ok(streams)
}

/// Decodes a lattice-encoded tensor whose stream sizes were checked against its shape.
pub(crate) fn decode<'a>(
    tensor: &str,
    encoding: &Encoding,
    rows: u64,
    cols: u64,
    get: &dyn Fn(&str) -> &'a [u8],
    out: &mut [f32],
) -> Result<()> {
    let (lattice, scale_dtype, coding, params) = unpack(tensor, encoding)?;
    let scales = scalar::decode_floats(get(role::SCALES), scale_dtype).map_err(|source| {
        HwzError::Scalar {
            tensor: tensor.into(),
            source,
        }
    })?;
    // Justified by the stream sizes: at most MAX_SYMBOLS_PER_BYTE symbols per stored byte.
    let n_symbols = rows as usize * lat::symbols_per_row(lattice, cols as usize);
    let mut symbols = vec![0u32; n_symbols];
    match coding {
        Coding::Rice { chunk } => {
            let parts = rice::RiceParts {
                params: get(role::PARAMS),
                offsets: get(role::OFFSETS),
                payload: get(role::SYMBOLS),
            };
            rice::decode_parts(parts, chunk as usize, &mut symbols).map_err(coding_err(tensor))?;
        }
        Coding::Rans {
            chunk,
            lanes,
            prob_bits,
        } => {
            let ctx = contexts(&lattice);
            let parts = rans::RansParts {
                model: get(role::MODEL),
                index: get(role::INDEX),
                payload: get(role::SYMBOLS),
            };
            let p = crate::encoding::rans_params(chunk, lanes, prob_bits);
            rans::decode_parts(parts, ctx, &p, &mut symbols).map_err(coding_err(tensor))?;
        }
        Coding::Fixed { bits } => {
            let codes =
                scalar::unpack_bits(get(role::SYMBOLS), bits, n_symbols).map_err(|source| {
                    HwzError::Scalar {
                        tensor: tensor.into(),
                        source,
                    }
                })?;
            symbols
                .iter_mut()
                .zip(codes)
                .for_each(|(s, c)| *s = c as u32);
        }
    }
    lat::dequantize_rows_into(
        &symbols,
        &scales,
        rows as usize,
        cols as usize,
        &params,
        out,
    )
    .map_err(lat_err(tensor))
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
    let mut best: Option<(f32, crate::EncodedTensor)> = None;
    for _ in 0..8 {
        let enc = crate::encode(tensor, values, shape, &with_alpha(alpha), options)?;
        let bps = enc.payload_bytes() as f64 * 8.0 / n;
        if bps <= target_bps && best.as_ref().is_none_or(|(a, _)| alpha > *a) {
            best = Some((alpha, enc));
        }
        let gap = target_bps - bps;
        if (0.0..0.002).contains(&gap) {
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
