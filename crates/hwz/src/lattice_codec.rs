//! Encode and decode of the `lattice` encoding: the lattice pipeline of `hypercodec-lattice`
//! with the symbol coders of `hypercodec-rice`.

use crate::encoding::{role, Coding, Encoding, StreamLen};
use crate::{HwzError, Result};
use hypercodec_lattice::{self as lat, Lattice};
use hypercodec_rice::{prefix, rans, rice, CodingError};
use hypercodec_scalar::{self as scalar, FloatDtype, ScalarError};

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
        first_free: matches!(l, Lattice::Z1 | Lattice::A2 | Lattice::D4),
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

/// [`ScalarError::ScaleUnderflow`] for the first row whose stored (rounded) scale loses it
/// ([`FloatDtype::loses`]: only f16 is narrower than f32); its value is the row's RMS. Shared
/// with the trellis.
pub(crate) fn underflow(
    scales: &[f32],
    values: &[f32],
    cols: usize,
    dtype: FloatDtype,
) -> Option<ScalarError> {
    if dtype != FloatDtype::F16 {
        return None;
    }
    scales.iter().enumerate().find_map(|(i, &s)| {
        let row = values.get(i * cols..(i + 1) * cols).unwrap_or(&[]);
        dtype.loses(s, row).then(|| {
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols.max(1) as f64;
            ScalarError::ScaleUnderflow {
                group: i,
                value: ms.sqrt() as f32,
                dtype,
            }
        })
    })
}

/// A row too large for the rotation both codecs apply in f32. The Hadamard transform of a
/// tile sums its values before it normalizes: every partial sum is at most the tile's L1
/// norm, and the decoder's inverse sums rotated values whose L1 norm is at most √tile times
/// the tile's L2 norm (a quarter more for the quantization's error). Where either can pass
/// f32's largest value the row surfaced as a scale "that no type holds"; this names the row,
/// its largest value and the way out instead.
pub(crate) fn too_large_to_rotate(
    tensor: &str,
    values: &[f32],
    cols: usize,
    tile: usize,
) -> Option<HwzError> {
    let tile = tile.clamp(1, cols.max(1));
    let max = f32::MAX as f64;
    let at = values.chunks(tile).position(|t| {
        let l1: f64 = t.iter().map(|&v| (v as f64).abs()).sum();
        let l2 = t.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
        l1 > max || 1.25 * (tile as f64).sqrt() * l2 > max
    })?;
    let part = &values[at * tile..((at + 1) * tile).min(values.len())];
    let value = part.iter().fold(0f32, |m, v| m.max(v.abs()));
    Some(HwzError::InvalidEncoding {
        tensor: tensor.into(),
        message: format!(
            "row {} holds values up to {value:.3e}: its rotation (a Hadamard transform of \
             {tile} values, in f32) would overflow; store the tensor as f32 or with affine codes",
            at * tile / cols.max(1)
        ),
    })
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
    let (r, c) = (rows as usize, cols as usize);
    let spr = lat::symbols_per_row(lattice, c);
    let rans_p = match coding {
        Coding::Rans {
            chunk,
            lanes,
            prob_bits,
        } => Some(crate::encoding::rans_params(chunk, lanes, prob_bits)),
        _ => None,
    };
    let ctx = contexts(&lattice);
    // Checked here, so that the index is the tensor's whichever block or part meets it.
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(lat_err(tensor)(lat::LatticeError::NonFinite { index }));
    }
    if let Some(e) = too_large_to_rotate(tensor, values, c, params.tile) {
        return Err(e);
    }
    // A huge tensor's symbols are held as 16 bits while its model is counted (u32 symbols
    // would double the memory of its values); others are quantized in one go.
    let huge = rans_p.is_some() && ldlq.is_none() && r.saturating_mul(spr) > HUGE_SYMBOLS;
    let (scales, held, counts) = if huge {
        let mut scales = vec![0f32; r];
        let mut held = Compact::with_capacity(r * spr);
        let mut counts = rans::Counts::new(ctx).map_err(coding_err(tensor))?;
        let block = (BLOCK_SYMBOLS / spr).max(1);
        for start in (0..r).step_by(block) {
            let n = block.min(r - start);
            let q = quantize_parallel(
                &values[start * c..(start + n) * c],
                (n, c),
                start,
                &params,
                round_scale,
                None,
            )
            .map_err(lat_err(tensor))?;
            scales[start..start + n].copy_from_slice(&q.scales);
            counts.add(&q.symbols, ctx);
            held.extend(&q.symbols);
        }
        (scales, Held::Compact(held), Some(counts))
    } else {
        let q = quantize_parallel(values, (r, c), 0, &params, round_scale, ldlq)
            .map_err(lat_err(tensor))?;
        (q.scales, Held::Full(q.symbols), None)
    };
    if let Some(mut group) = scales.iter().position(|s| !s.is_finite()) {
        let largest = |v: &[f32]| {
            v.iter().enumerate().fold(
                (0, 0f32),
                |m, (i, x)| if x.abs() > m.1 { (i, x.abs()) } else { m },
            )
        };
        let mut value = largest(&values[group * c..(group + 1) * c]).1;
        if tensor_rms.is_some() {
            // One scale for every row: the tensor's largest value is what overflows it.
            let (at, v) = largest(values);
            (group, value) = (at / c.max(1), v);
        }
        return Err(HwzError::Scalar {
            tensor: tensor.into(),
            source: ScalarError::ScaleOverflow {
                group,
                value,
                dtype: scale_dtype,
            },
        });
    }
    if let Some(err) = underflow(&scales, values, c, scale_dtype) {
        return Err(HwzError::Scalar {
            tensor: tensor.into(),
            source: err,
        });
    }
    let scales = scalar::encode_floats(&scales, scale_dtype, false)
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
    match (coding, held, rans_p) {
        (_, held, Some(p)) => {
            let model = match (&counts, &held) {
                (Some(counts), _) => counts.model(p.prob_bits),
                (None, Held::Full(symbols)) => rans::Model::fit(symbols, ctx, p.prob_bits),
                (None, Held::Compact(_)) => unreachable!("compact symbols are always counted"),
            }
            .map_err(coding_err(tensor))?;
            let s = rans_chunks(&held, r * spr, ctx, &p, &model).map_err(coding_err(tensor))?;
            streams.push((role::MODEL, s.model));
            streams.push((role::INDEX, s.index));
            streams.push((role::SYMBOLS, pad(s.payload)));
        }
        (Coding::Rice { chunk }, Held::Full(symbols), None) => {
            let s = rice::encode(&symbols, chunk as usize).map_err(coding_err(tensor))?;
            streams.push((role::PARAMS, s.params));
            streams.push((role::OFFSETS, s.offsets));
            streams.push((role::SYMBOLS, pad(s.payload)));
        }
        (Coding::Fixed { bits }, Held::Full(symbols), None) => {
            // Fixed-rate symbols are below 2^bits <= 256 by construction.
            let codes: Vec<u8> = symbols.iter().map(|&s| s as u8).collect();
            let packed =
                scalar::pack_bits(&codes, bits).map_err(crate::encoding::scalar_err(tensor))?;
            streams.push((role::SYMBOLS, packed));
        }
        (c @ Coding::Prefix { .. }, Held::Full(symbols), None) => {
            let p = c.prefix_params().unwrap_or_default();
            let s =
                prefix_streams(&symbols, r, spr / lattice.dim(), &p).map_err(coding_err(tensor))?;
            streams.push((role::MODEL, s.model));
            streams.push((role::INDEX, s.index));
            // Whole 32-bit words of zeros: a chunk reads zeros past its end anyway.
            let mut payload = pad(s.payload);
            payload.resize(payload.len().next_multiple_of(4), 0);
            streams.push((role::SYMBOLS, payload));
        }
        _ => unreachable!("only rANS holds compact symbols, and only rANS has rANS parameters"),
    }
    Ok(streams)
}

/// Symbols above which a tensor's symbols are held as 16 bits (64 MB as `u32`; small in unit
/// tests, which compare that path with the plain one).
const HUGE_SYMBOLS: usize = if cfg!(test) { 1 << 12 } else { 1 << 24 };

/// Symbols quantized at once by the huge-tensor path (16 MB as `u32`).
const BLOCK_SYMBOLS: usize = if cfg!(test) { 1 << 10 } else { 1 << 22 };

/// A tensor's symbols while they are entropy-coded.
enum Held {
    /// All symbols.
    Full(Vec<u32>),
    /// 16 bits each, escapes aside.
    Compact(Compact),
}

/// Symbols held as `u16`; a symbol of `u16::MAX` or more is stored as `u16::MAX` and listed
/// in `escapes` (position, symbol), in position order. Lattice symbols at useful rates stay
/// far below 2^16, so escapes are rare.
struct Compact {
    low: Vec<u16>,
    escapes: Vec<(usize, u32)>,
}

impl Compact {
    fn with_capacity(n: usize) -> Compact {
        Compact {
            low: Vec::with_capacity(n),
            escapes: Vec::new(),
        }
    }

    fn extend(&mut self, symbols: &[u32]) {
        for &s in symbols {
            if s >= u16::MAX as u32 {
                self.escapes.push((self.low.len(), s));
            }
            self.low.push(s.min(u16::MAX as u32) as u16);
        }
    }

    /// Symbols `range` as `u32`.
    fn get(&self, range: std::ops::Range<usize>) -> Vec<u32> {
        let mut out: Vec<u32> = self.low[range.clone()].iter().map(|&s| s as u32).collect();
        let first = self.escapes.partition_point(|&(i, _)| i < range.start);
        for &(i, s) in self.escapes[first..]
            .iter()
            .take_while(|(i, _)| *i < range.end)
        {
            out[i - range.start] = s;
        }
        out
    }
}

/// rANS streams of `n` held symbols, chunks encoded on the pool a few at a time (each group's
/// words are copied into the payload before the next group starts).
fn rans_chunks<F: Fn(usize, u32) -> usize + Copy + Sync + Send>(
    held: &Held,
    n: usize,
    ctx: rans::Contexts<F>,
    p: &rans::RansParams,
    model: &rans::Model,
) -> std::result::Result<rans::RansStreams, CodingError> {
    let chunks = n.div_ceil(p.chunk);
    let group = (crate::par::threads() * 4).max(1);
    let mut out = rans::ChunkWriter::new(n, p);
    for first in (0..chunks).step_by(group) {
        let jobs: Vec<usize> = (first..chunks.min(first + group)).collect();
        let done = crate::par::map(jobs, |k| {
            let range = k * p.chunk..n.min((k + 1) * p.chunk);
            match held {
                Held::Full(symbols) => rans::encode_chunk(&symbols[range], ctx, p, model),
                Held::Compact(compact) => rans::encode_chunk(&compact.get(range), ctx, p, model),
            }
        });
        for chunk in done {
            out.push(&chunk?)?;
        }
    }
    Ok(out.finish(model))
}

/// Prefix streams of a `rows × words` matrix of E8 words, chunks encoded on the pool.
fn prefix_streams(
    symbols: &[u32],
    rows: usize,
    words: usize,
    p: &prefix::PrefixParams,
) -> std::result::Result<prefix::PrefixStreams, CodingError> {
    let layout = prefix::Layout::new(rows, words, p);
    let model = prefix::Model::fit(symbols, p)?;
    let jobs: Vec<usize> = (0..layout.chunks()).collect();
    let chunks = crate::par::map(jobs, |c| prefix::encode_chunk(symbols, &layout, &model, c))
        .into_iter()
        .collect::<std::result::Result<Vec<_>, _>>()?;
    prefix::assemble(&chunks, &model)
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
    (rows, cols): (usize, usize),
    first_row: usize,
    params: &lat::LatticeParams,
    round_scale: impl Fn(f32) -> f32 + Copy + Sync,
    ldlq: Option<&hypercodec_scalar::ldlq::Ldlq>,
) -> std::result::Result<lat::Quantized, lat::LatticeError> {
    let parts = row_parts(rows, cols);
    if parts.len() <= 1 && ldlq.is_none() && first_row == 0 {
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
            None => {
                lat::quantize_rows_into(v, n, cols, params, round_scale, first_row + start, out)
            }
            Some(f) => lat::quantize_rows_ldlq_into(
                v,
                n,
                cols,
                params,
                round_scale,
                first_row + start,
                out,
                f,
            ),
        }
    })
    .into_iter()
    .collect::<std::result::Result<(), _>>()?;
    Ok(lat::Quantized { symbols, scales })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode, EncodeOptions, FloatDtype};

    /// The huge-tensor path (symbols held as 16 bits with escapes, the model counted block by
    /// block, chunks encoded a group at a time) writes exactly the streams of one quantization
    /// and one rANS encode of all symbols.
    #[test]
    fn huge_tensor_path_writes_the_plain_streams() {
        let (rows, cols) = (64usize, 200usize);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as f32 * 0.7548).sin() + (i as f32 * 0.0123).cos()) * (1 + i % 5) as f32)
            .collect();
        // α = 3e4 puts most symbols past u16 (escapes) and past rANS's direct alphabet.
        for alpha in [3.0f32, 3e4] {
            let enc = Encoding::Lattice {
                lattice: Lattice::E8,
                alpha,
                tile: 8,
                seed: 5,
                scale_dtype: FloatDtype::F16,
                coding: Coding::Rans {
                    chunk: 512,
                    lanes: 4,
                    prob_bits: 12,
                },
            };
            let shape = [rows as u64, cols as u64];
            let tensor = EncodeOptions {
                lattice_scale: crate::LatticeScale::Tensor,
                ..EncodeOptions::default()
            };
            let got = encode("w", &values, &shape, &enc, tensor).unwrap();
            let params = enc.lattice_params().unwrap();
            assert!(rows * lat::symbols_per_row(Lattice::E8, cols) > HUGE_SYMBOLS);
            let ms = values.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / values.len() as f64;
            let t = FloatDtype::F16.round(ms.sqrt() as f32);
            let q = lat::quantize_rows(&values, rows, cols, &params, |_| t).unwrap();
            if alpha > 1e3 {
                assert!(q.symbols.iter().filter(|&&s| s >= u16::MAX as u32).count() > 1000);
            }
            let want = rans::encode(
                &q.symbols,
                contexts(&Lattice::E8),
                &crate::encoding::rans_params(512, 4, 12),
            )
            .unwrap();
            let stream = |role: &str| &got.streams.iter().find(|(r, _)| *r == role).unwrap().1;
            assert_eq!(stream(role::MODEL), &want.model);
            assert_eq!(stream(role::INDEX), &want.index);
            assert_eq!(stream(role::SYMBOLS), &want.payload);
            let back = got.decode("w", &shape).unwrap();
            let direct = lat::dequantize_rows(&q.symbols, &q.scales, rows, cols, &params).unwrap();
            assert_eq!(back, direct);
        }
    }
}
