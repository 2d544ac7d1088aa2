//! The `mixed` and `exceptions` encodings: tensors made of other encodings. Their inner
//! streams travel concatenated in one `payload` stream described by an `index` stream of u64
//! lengths, so every inner stream is checked against its own encoding before it is decoded.

use crate::encoding::{check_roles, role, Encoding, StreamLen};
use crate::{EncodedTensor, HwzError, Result};
use hypercodec_hdc::pack;
use hypercodec_scalar as scalar;

/// Most parts of a `mixed` tensor.
pub const MAX_PARTS: u64 = 1 << 20;

fn invalid(tensor: &str, message: String) -> HwzError {
    HwzError::InvalidEncoding {
        tensor: tensor.to_string(),
        message,
    }
}

fn check_leaf(tensor: &str, e: &Encoding) -> Result<()> {
    if matches!(e, Encoding::Mixed { .. } | Encoding::Exceptions { .. }) {
        return Err(invalid(
            tensor,
            "mixed and exceptions encodings do not nest".into(),
        ));
    }
    Ok(())
}

/// The rows of each part of a `mixed` tensor with `rows` rows.
pub(crate) fn part_rows(
    tensor: &str,
    rows: u64,
    block_rows: u64,
    parts: usize,
) -> Result<Vec<u64>> {
    if block_rows == 0 {
        return Err(invalid(tensor, "block_rows must be positive".into()));
    }
    let n = rows.div_ceil(block_rows);
    if n != parts as u64 || n > MAX_PARTS {
        return Err(invalid(
            tensor,
            format!("{parts} parts for {rows} rows in blocks of {block_rows} (expected {n}, at most {MAX_PARTS})"),
        ));
    }
    Ok((0..n)
        .map(|i| block_rows.min(rows - i * block_rows))
        .collect())
}

fn sum_lens(lens: &[(&'static str, StreamLen)]) -> (u64, u64) {
    lens.iter().fold((0u64, 0u64), |(a, b), (_, l)| {
        (a.saturating_add(l.min), b.saturating_add(l.max))
    })
}

/// Stream lengths of `mixed` / `exceptions` for a `rows × cols` tensor of `n` values.
pub(crate) fn stream_lens(
    tensor: &str,
    encoding: &Encoding,
    rows: u64,
    cols: u64,
    n: u64,
) -> Result<Vec<(&'static str, StreamLen)>> {
    match encoding {
        Encoding::Mixed { block_rows, parts } => {
            let mut count = 0u64;
            let (mut lo, mut hi) = (0u64, 0u64);
            for (p, r) in parts
                .iter()
                .zip(part_rows(tensor, rows, *block_rows, parts.len())?)
            {
                check_leaf(tensor, p)?;
                let lens = p.stream_lens(tensor, &[r, cols])?;
                count += lens.len() as u64;
                let (a, b) = sum_lens(&lens);
                lo = lo.saturating_add(a);
                hi = hi.saturating_add(b);
            }
            Ok(vec![
                (role::INDEX, StreamLen::exact(8 * count)),
                (role::PAYLOAD, StreamLen { min: lo, max: hi }),
            ])
        }
        Encoding::Exceptions { base, count, dtype } => {
            check_leaf(tensor, base)?;
            if *count > n {
                return Err(invalid(
                    tensor,
                    format!("{count} exceptions for {n} values"),
                ));
            }
            let lens = base.stream_lens(tensor, &[rows, cols])?;
            let (lo, hi) = sum_lens(&lens);
            Ok(vec![
                (role::INDEX, StreamLen::exact(8 * lens.len() as u64)),
                (role::PAYLOAD, StreamLen { min: lo, max: hi }),
                (
                    role::INDICES,
                    StreamLen {
                        min: *count,
                        max: count * 10,
                    },
                ),
                (role::VALUES, StreamLen::exact(count * dtype.size() as u64)),
            ])
        }
        _ => Err(invalid(tensor, "not a nested encoding".into())),
    }
}

fn concat(parts: &[&EncodedTensor]) -> (Vec<u8>, Vec<u8>) {
    let mut index = Vec::new();
    let mut payload = Vec::new();
    for p in parts {
        for (_, b) in &p.streams {
            index.extend_from_slice(&(b.len() as u64).to_le_bytes());
            payload.extend_from_slice(b);
        }
    }
    (index, payload)
}

/// A `mixed` tensor from its parts, encoded top to bottom (each of `block_rows` rows, the last
/// possibly fewer).
pub fn assemble_mixed(block_rows: u64, parts: &[EncodedTensor]) -> EncodedTensor {
    let refs: Vec<&EncodedTensor> = parts.iter().collect();
    let (index, payload) = concat(&refs);
    EncodedTensor {
        encoding: Encoding::Mixed {
            block_rows,
            parts: parts.iter().map(|p| p.encoding.clone()).collect(),
        },
        streams: vec![(role::INDEX, index), (role::PAYLOAD, payload)],
    }
}

/// An `exceptions` tensor: `base` with the values at `positions` (strictly increasing)
/// replaced by `values` stored as `dtype`.
pub fn assemble_exceptions(
    tensor: &str,
    base: &EncodedTensor,
    positions: &[u64],
    values: &[f32],
    dtype: scalar::FloatDtype,
) -> Result<EncodedTensor> {
    let (index, payload) = concat(&[base]);
    let vals =
        scalar::encode_floats(values, dtype, false).map_err(crate::encoding::scalar_err(tensor))?;
    Ok(EncodedTensor {
        encoding: Encoding::Exceptions {
            base: Box::new(base.encoding.clone()),
            count: positions.len() as u64,
            dtype,
        },
        streams: vec![
            (role::INDEX, index),
            (role::PAYLOAD, payload),
            (role::INDICES, pack::encode_positions(positions)),
            (role::VALUES, vals),
        ],
    })
}

/// Encodes with a nested encoding by encoding every part with its own encoding.
pub(crate) fn encode(
    tensor: &str,
    values: &[f32],
    rows: u64,
    cols: u64,
    encoding: &Encoding,
    options: crate::EncodeOptions,
) -> Result<EncodedTensor> {
    match encoding {
        Encoding::Mixed { block_rows, parts } => {
            let mut done = Vec::with_capacity(parts.len());
            let mut start = 0usize;
            for (p, r) in parts
                .iter()
                .zip(part_rows(tensor, rows, *block_rows, parts.len())?)
            {
                let len = (r * cols) as usize;
                done.push(crate::encode(
                    tensor,
                    &values[start..start + len],
                    &[r, cols],
                    p,
                    options,
                )?);
                start += len;
            }
            Ok(assemble_mixed(*block_rows, &done))
        }
        Encoding::Exceptions { base, count, dtype } => {
            let b = crate::encode(tensor, values, &[rows, cols], base, options)?;
            let mut approx = vec![0f32; values.len()];
            decode_one(tensor, &b.encoding, rows, cols, &b.streams, &mut approx)?;
            let (pos, _) = hypercodec_hdc::residual::top_k(values, &approx, *count as usize);
            let vals: Vec<f32> = pos.iter().map(|&p| values[p as usize]).collect();
            assemble_exceptions(tensor, &b, &pos, &vals, *dtype)
        }
        _ => Err(invalid(tensor, "not a nested encoding".into())),
    }
}

fn decode_one(
    tensor: &str,
    e: &Encoding,
    rows: u64,
    cols: u64,
    streams: &[(&'static str, Vec<u8>)],
    out: &mut [f32],
) -> Result<()> {
    let refs: Vec<(&str, &[u8])> = streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
    crate::decode_into(tensor, e, &[rows, cols], &refs, out)
}

/// Splits `payload` by `index` into the streams of each encoding in turn, checking each
/// against its encoding's lengths, and calls `f(part, streams)`.
pub(crate) fn split<'a>(
    tensor: &str,
    encodings: &[(&Encoding, [u64; 2])],
    index: &[u8],
    payload: &'a [u8],
    mut f: impl FnMut(usize, &[(&'static str, &'a [u8])]) -> Result<()>,
) -> Result<()> {
    let mut lens = index
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
    let mut pos = 0u64;
    for (i, (e, shape)) in encodings.iter().enumerate() {
        let roles = e.stream_lens(tensor, shape)?;
        let mut streams = Vec::with_capacity(roles.len());
        for (r, _) in &roles {
            let len = lens
                .next()
                .ok_or_else(|| invalid(tensor, "index too short".into()))?;
            let end = pos
                .checked_add(len)
                .filter(|&e| e <= payload.len() as u64)
                .ok_or_else(|| invalid(tensor, "index points past the payload".into()))?;
            streams.push((*r, &payload[pos as usize..end as usize]));
            pos = end;
        }
        check_roles(
            tensor,
            &roles,
            streams.iter().map(|(r, b)| (*r, b.len() as u64)),
        )?;
        f(i, &streams)?;
    }
    if pos != payload.len() as u64 {
        return Err(invalid(
            tensor,
            "payload bytes not covered by the index".into(),
        ));
    }
    Ok(())
}
