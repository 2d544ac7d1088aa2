//! Encode and decode of the `lattice` encoding: the lattice pipeline of `hypercodec-lattice`
//! with the symbol coders of `hypercodec-rice`.

use crate::encoding::{role, Coding, Encoding, StreamLen};
use crate::{HwzError, Result};
use hypercodec_lattice::{self as lat, Lattice};
use hypercodec_rice::{rans, rice, CodingError};
use hypercodec_scalar::{self as scalar, ScalarError};

pub(crate) fn lat_err(tensor: &str) -> impl Fn(lat::LatticeError) -> HwzError + '_ {
    move |source| HwzError::Lattice {
        tensor: tensor.to_string(),
        source,
    }
}

pub(crate) fn coding_err(tensor: &str) -> impl Fn(CodingError) -> HwzError + '_ {
    move |source| HwzError::Coding {
        tensor: tensor.to_string(),
        source,
    }
}

/// The rANS contexts of a lattice: words of `dim` symbols, tables chosen by [`Lattice::context`].
pub(crate) fn contexts(l: &Lattice) -> rans::Contexts<impl Fn(usize, u32) -> usize + Copy + '_> {
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
    (rows, cols): (u64, u64),
    encoding: &Encoding,
    lens: &[(&'static str, StreamLen)],
    ldlq: Option<&hypercodec_scalar::ldlq::Ldlq>,
    scale: crate::LatticeScale,
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let (lattice, scale_dtype, coding, params) = unpack(tensor, encoding)?;
    // One step for every row only where an entropy coder makes the small rows' symbols cheap;
    // fixed-rate codes need each row in its own range.
    let tensor_rms = match (scale, coding) {
        (crate::LatticeScale::Tensor, Coding::Rans { .. } | Coding::Rice { .. }) => {
            let ms = values.iter().map(|&v| v as f64 * v as f64).sum::<f64>()
                / values.len().max(1) as f64;
            Some(ms.sqrt() as f32)
        }
        _ => None,
    };
    // The stored scale of a row: its own RMS, or the tensor's for every row that is not zero.
    let round_scale = move |rms: f32| match tensor_rms {
        Some(t) if rms > 0.0 => scale_dtype.round(t),
        _ => scale_dtype.round(rms),
    };
    let q = quantize_parallel(
        values,
        rows as usize,
        cols as usize,
        &params,
        round_scale,
        ldlq,
    )
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

/// [`lat::quantize_rows`] over row ranges on the pool, each part writing its own slice of one
/// symbol buffer (no second copy of the symbols).
fn quantize_parallel(
    values: &[f32],
    rows: usize,
    cols: usize,
    params: &lat::LatticeParams,
    round_scale: impl Fn(f32) -> f32 + Copy + Sync,
    ldlq: Option<&hypercodec_scalar::ldlq::Ldlq>,
) -> std::result::Result<lat::Quantized, lat::LatticeError> {
    let parts = row_parts(rows, cols);
    if parts.len() <= 1 && ldlq.is_none() {
        return lat::quantize_rows(values, rows, cols, params, round_scale);
    }
    let spr = lat::symbols_per_row(params.lattice, cols);
    let mut symbols = vec![0u32; rows * spr];
    let mut scales = vec![0f32; rows];
    let mut jobs = Vec::with_capacity(parts.len());
    let (mut sym_rest, mut scale_rest) = (&mut symbols[..], &mut scales[..]);
    for &(start, n) in &parts {
        let (sym, sr) = std::mem::take(&mut sym_rest).split_at_mut(n * spr);
        let (sc, cr) = std::mem::take(&mut scale_rest).split_at_mut(n);
        (sym_rest, scale_rest) = (sr, cr);
        jobs.push((start, n, sym, sc));
    }
    crate::par::map(jobs, |(start, n, sym, sc)| {
        let v = &values[start * cols..(start + n) * cols];
        let out = lat::QuantizedMut {
            symbols: sym,
            scales: sc,
        };
        match ldlq {
            None => lat::quantize_rows_into(v, n, cols, params, round_scale, start, out),
            Some(f) => lat::quantize_rows_ldlq_into(v, n, cols, params, round_scale, start, out, f),
        }
    })
    .into_iter()
    .collect::<std::result::Result<(), _>>()?;
    Ok(lat::Quantized { symbols, scales })
}
