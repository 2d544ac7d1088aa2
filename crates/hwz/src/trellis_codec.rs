//! Encode and decode of the `trellis` encoding: the RHT and row scales of `hypercodec-lattice`
//! with the bitshift trellis of `hypercodec-trellis`.

use crate::encoding::Encoding;
use crate::{HwzError, Result};
use hypercodec_lattice::rht::Rht;
use hypercodec_scalar::{self as scalar, FloatDtype, ScalarError};
use hypercodec_trellis::{self as tcq, TrellisParams};

pub(crate) fn tcq_err(tensor: &str) -> impl Fn(tcq::TrellisError) -> HwzError + '_ {
    move |source| HwzError::Trellis {
        tensor: tensor.to_string(),
        source,
    }
}

/// The fields of a trellis encoding that coding needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrellisLayout {
    /// `L`, `K` and the code scale.
    pub params: TrellisParams,
    /// RHT tile and seed.
    pub tile: usize,
    pub seed: u64,
    /// Values per tail-biting sequence.
    pub seq: usize,
    /// Storage type of the row scales.
    pub scale_dtype: FloatDtype,
}

impl TrellisLayout {
    pub(crate) fn of(tensor: &str, e: &Encoding) -> Result<Self> {
        match *e {
            Encoding::Trellis {
                l,
                k,
                scale,
                tile,
                seed,
                seq,
                scale_dtype,
                v,
            } => Ok(TrellisLayout {
                params: TrellisParams { l, k, scale, v },
                tile: tile as usize,
                seed,
                seq: seq as usize,
                scale_dtype,
            }),
            _ => Err(HwzError::InvalidEncoding {
                tensor: tensor.into(),
                message: "not a trellis encoding".into(),
            }),
        }
    }

    /// Bytes of one row's bits.
    pub(crate) fn row_bytes(&self, cols: usize) -> usize {
        (cols * self.params.k as usize).div_ceil(8)
    }

    fn rht(&self, tensor: &str, cols: usize) -> Result<Rht> {
        Rht::new(cols, self.tile, self.seed).map_err(crate::lattice_codec::lat_err(tensor))
    }
}

/// Streams `scales` and `symbols` of a trellis-encoded `rows × cols` tensor. Rows are split
/// across the workspace's threads, each with its own encoder. A row's scale is its RMS after
/// the RHT, refit after coding to the least-squares scale of the chosen codes (the best scale
/// for those bits), then rounded to the storage type.
///
/// With `feedback` (the LDLQ factor of the layer's input statistics, rotated by this
/// encoding's RHT: [`rotate_hessian`]), each row's sequences are coded left to right and each
/// sequence's error is fed into the columns not yet coded (GPTQ's rule, sequence by sequence).
/// `rows_encoder` (when given) codes every row at once, or with feedback every row's sequence
/// at once (see [`crate::TrellisRowsEncoder`]); where it declines, the CPU does.
pub(crate) fn encode(
    tensor: &str,
    values: &[f32],
    rows: u64,
    cols: u64,
    encoding: &Encoding,
    feedback: Option<&scalar::ldlq::Ldlq>,
    rows_encoder: Option<crate::TrellisRowsEncoder>,
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let t = TrellisLayout::of(tensor, encoding)?;
    let (rows, cols) = (rows as usize, cols as usize);
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(HwzError::Trellis {
            tensor: tensor.into(),
            source: tcq::TrellisError::NonFinite { index },
        });
    }
    if let Some(e) = crate::lattice_codec::too_large_to_rotate(tensor, values, cols, t.tile) {
        return Err(e);
    }
    let rb = t.row_bytes(cols);
    let mut bits = vec![0u8; rows * rb];
    let mut scales = vec![0f32; rows];
    if rows > 0 && cols > 0 {
        let rht = t.rht(tensor, cols)?;
        // About 2^16 values per job, so a tensor's rows spread over the pool.
        let rows_per_job = (65_536 / cols).max(1);
        let batched = match rows_encoder {
            Some(enc) => encode_batched(
                tensor,
                values,
                cols,
                (&t, &rht),
                enc,
                feedback,
                &mut bits,
                &mut scales,
            )?,
            None => false,
        };
        if batched {
            return finish(tensor, values, cols, &t, bits, scales);
        }
        let jobs: Vec<(usize, &mut [u8], &mut [f32])> = bits
            .chunks_mut(rows_per_job * rb)
            .zip(scales.chunks_mut(rows_per_job))
            .enumerate()
            .map(|(i, (b, s))| (i * rows_per_job, b, s))
            .collect();
        crate::par::map(jobs, |(first, b, s)| {
            encode_rows(
                tensor,
                &values[first * cols..],
                cols,
                &t,
                &rht,
                b,
                s,
                feedback,
            )
        })
        .into_iter()
        .collect::<Result<()>>()?;
    }
    finish(tensor, values, cols, &t, bits, scales)
}

/// The streams of a coded tensor: its row scales checked (finite, not below what their type
/// holds) and stored, and its bits.
fn finish(
    tensor: &str,
    values: &[f32],
    cols: usize,
    t: &TrellisLayout,
    bits: Vec<u8>,
    scales: Vec<f32>,
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    if let Some(row) = scales.iter().position(|s| !s.is_finite()) {
        let value = values[row * cols..(row + 1) * cols]
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        return Err(HwzError::Scalar {
            tensor: tensor.into(),
            source: ScalarError::ScaleOverflow {
                group: row,
                value,
                dtype: t.scale_dtype,
            },
        });
    }
    if let Some(err) = crate::lattice_codec::underflow(&scales, values, cols, t.scale_dtype) {
        return Err(HwzError::Scalar {
            tensor: tensor.into(),
            source: err,
        });
    }
    let scales = scalar::encode_floats(&scales, t.scale_dtype, false)
        .map_err(crate::encoding::scalar_err(tensor))?;
    Ok(vec![
        (crate::encoding::role::SCALES, scales),
        (crate::encoding::role::SYMBOLS, bits),
    ])
}

/// The input statistics `h` (`cols × cols`) of a layer coded with `encoding` (a trellis), in
/// the coordinates its RHT rotates rows into.
pub(crate) fn rotate_hessian(
    tensor: &str,
    encoding: &Encoding,
    h: &[f32],
    cols: usize,
) -> Result<Vec<f32>> {
    let t = TrellisLayout::of(tensor, encoding)?;
    let params = hypercodec_lattice::LatticeParams {
        tile: t.tile,
        seed: t.seed,
        ..Default::default()
    };
    hypercodec_lattice::rotate_hessian(h, cols, &params)
        .map_err(crate::lattice_codec::lat_err(tensor))
}

/// Encodes the rows whose bits are `bits` (whole rows) from `values` (starting at the first).
#[allow(clippy::too_many_arguments)]
fn encode_rows(
    tensor: &str,
    values: &[f32],
    cols: usize,
    t: &TrellisLayout,
    rht: &Rht,
    bits: &mut [u8],
    scales: &mut [f32],
    feedback: Option<&scalar::ldlq::Ldlq>,
) -> Result<()> {
    let rb = t.row_bytes(cols);
    let k = t.params.k as usize;
    let mut enc = tcq::Encoder::new(&t.params).map_err(tcq_err(tensor))?;
    // The job's rows normalized (zero where a row is zero), for the scale fit at the end.
    let n = scales.len();
    let mut us = vec![0f32; n * cols];
    let mut rmss = vec![0f64; n];
    for (((row, b), u), rms_out) in values
        .chunks_exact(cols)
        .zip(bits.chunks_exact_mut(rb))
        .zip(us.chunks_exact_mut(cols))
        .zip(rmss.iter_mut())
    {
        u.copy_from_slice(row);
        rht.forward(u);
        let rms = (u.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64).sqrt();
        *rms_out = rms;
        if !(rms > 0.0 && rms.is_finite()) {
            // A zero row: any bits, scale 0.
            u.iter_mut().for_each(|v| *v = 0.0);
            continue;
        }
        // In f64: an RMS below 2.9e-39 (subnormal rows) has no f32 reciprocal.
        u.iter_mut().for_each(|v| *v = (*v as f64 / rms) as f32);
        // With feedback, the job's rows are coded together below.
        if feedback.is_none() {
            for r in tcq::row_sequences(cols, t.seq) {
                enc.encode_into(
                    &u[r.clone()],
                    &mut b[r.start * k / 8..(r.end * k).div_ceil(8)],
                )
                .map_err(tcq_err(tensor))?;
            }
        }
    }
    if let Some(f) = feedback {
        // Sequence by sequence: code the target as feedback has moved it, write the decoded
        // values back, feed their error forward; every row of the job at once, so that each
        // sequence's rows of the factor are read once for the job (`rows_ranges`: the same
        // arithmetic per row as one row at a time).
        let mut w = us.clone();
        let ranges: Vec<_> = tcq::row_sequences(cols, t.seq).collect();
        let mut failed = None;
        f.rows_ranges(&mut w, n, ranges.iter().cloned(), |i, j0, upcoming| {
            // A zero row keeps zero bits (its values stay zero: no error to feed).
            if failed.is_some() || !(rmss[i] > 0.0 && rmss[i].is_finite()) {
                return;
            }
            let r = &ranges[ranges.partition_point(|r| r.start < j0)];
            debug_assert_eq!(r.start, j0);
            let len = r.len();
            let b = &mut bits[i * rb..(i + 1) * rb];
            let dst = &mut b[r.start * k / 8..(r.end * k).div_ceil(8)];
            let res = enc
                .encode_into(&upcoming[..len], dst)
                .and_then(|()| tcq::decode_into(dst, &t.params, &mut upcoming[..len]));
            if let Err(e) = res {
                failed = Some(e);
            }
        });
        if let Some(e) = failed {
            return Err(tcq_err(tensor)(e));
        }
    }
    refit_rows(tensor, &us, bits, &rmss, t, feedback, scales)
}

/// The scales of coded rows (`u`: each row's values over its RMS `rms`, zero where that is 0
/// or not finite; coded as `bits`): the least-squares scale of the chosen codes, in units of
/// the row's RMS (with statistics: the least output error, `cᵀHu / cᵀHc`, for all the rows in
/// one sweep of the factor), rounded to the storage type; 0 for a zero row, infinite for a
/// row whose RMS is not finite.
fn refit_rows(
    tensor: &str,
    u: &[f32],
    bits: &[u8],
    rms: &[f64],
    t: &TrellisLayout,
    feedback: Option<&scalar::ldlq::Ldlq>,
    scales: &mut [f32],
) -> Result<()> {
    let k = rms.len();
    if k == 0 {
        return Ok(());
    }
    let cols = u.len() / k;
    let rb = bits.len() / k;
    let coded = |r: f64| r > 0.0 && r.is_finite();
    let mut decoded = vec![0f32; u.len()];
    for ((b, d), &r) in bits
        .chunks_exact(rb)
        .zip(decoded.chunks_exact_mut(cols))
        .zip(rms)
    {
        if coded(r) {
            tcq::decode_row(b, t.seq, &t.params, d).map_err(tcq_err(tensor))?;
        }
    }
    let fits = feedback.map(|f| f.fit_rows(u, &decoded, k));
    for (i, ((ui, di), (&r, s))) in u
        .chunks_exact(cols)
        .zip(decoded.chunks_exact(cols))
        .zip(rms.iter().zip(scales.iter_mut()))
        .enumerate()
    {
        if !coded(r) {
            *s = if r == 0.0 { 0.0 } else { f32::INFINITY };
            continue;
        }
        let (xc, cc) = ui.iter().zip(di).fold((0f64, 0f64), |(a, b), (&x, &c)| {
            (a + x as f64 * c as f64, b + c as f64 * c as f64)
        });
        let plain = if cc > 0.0 { xc / cc } else { 1.0 };
        let fitted = fits
            .as_ref()
            .and_then(|f| f[i])
            .filter(|&h| h > 0.0)
            .map(|h| t.scale_dtype.round((r * h) as f32))
            .filter(|v| v.is_finite());
        *s = fitted.unwrap_or_else(|| t.scale_dtype.round((r * plain) as f32));
    }
    Ok(())
}

/// Codes every row at once with `enc`: the rows rotated and normalized on the pool, coded by
/// `enc`, then their scales refit on the pool. With `feedback`, the rows are coded sequence by
/// sequence, every row's sequence in one call of `enc`, each sequence's error fed forward as
/// row by row ([`scalar::ldlq::Ldlq::atoms_of_rows`]). The same streams as the row-by-row path
/// (a zero row keeps zero bits and scale 0). `false` (nothing written) where `enc` declines.
#[allow(clippy::too_many_arguments)]
fn encode_batched(
    tensor: &str,
    values: &[f32],
    cols: usize,
    (t, rht): (&TrellisLayout, &Rht),
    enc: crate::TrellisRowsEncoder,
    feedback: Option<&scalar::ldlq::Ldlq>,
    bits: &mut [u8],
    scales: &mut [f32],
) -> Result<bool> {
    let rows = scales.len();
    let rb = t.row_bytes(cols);
    let rows_per_job = (65_536 / cols).max(1);
    let mut u = vec![0f32; rows * cols];
    let mut rms = vec![0f64; rows];
    crate::par::map(
        u.chunks_mut(rows_per_job * cols)
            .zip(rms.chunks_mut(rows_per_job))
            .zip(values.chunks(rows_per_job * cols))
            .collect::<Vec<_>>(),
        |((u, rms), x)| {
            for ((u, r), x) in u
                .chunks_exact_mut(cols)
                .zip(rms.iter_mut())
                .zip(x.chunks_exact(cols))
            {
                u.copy_from_slice(x);
                rht.forward(u);
                *r = (u.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64).sqrt();
                if *r > 0.0 && r.is_finite() {
                    let r = *r;
                    u.iter_mut().for_each(|v| *v = (*v as f64 / r) as f32);
                } else {
                    u.iter_mut().for_each(|v| *v = 0.0);
                }
            }
        },
    );
    let coded = match feedback {
        None => (enc.0)(&u, rows, cols, t.seq, &t.params, bits).is_ok(),
        Some(f) => {
            let k = t.params.k as usize;
            let mut w = u.clone();
            let (mut atom, mut atom_bits, mut ok) = (Vec::new(), Vec::new(), true);
            f.atoms_of_rows(&mut w, rows, tcq::row_sequences(cols, t.seq), |j0, a, w| {
                if !ok {
                    return;
                }
                atom.resize(rows * a, 0f32);
                for (x, wi) in atom.chunks_exact_mut(a).zip(w.chunks_exact(cols)) {
                    x.copy_from_slice(&wi[j0..j0 + a]);
                }
                let ab = (a * k).div_ceil(8);
                atom_bits.resize(rows * ab, 0u8);
                // One sequence of `a` values per row (any `seq` ≥ a cuts none).
                let seq = a.next_multiple_of(8);
                if (enc.0)(&atom, rows, a, seq, &t.params, &mut atom_bits).is_err() {
                    ok = false;
                    return;
                }
                for ((ab_row, wi), b) in atom_bits
                    .chunks_exact(ab)
                    .zip(w.chunks_exact_mut(cols))
                    .zip(bits.chunks_exact_mut(rb))
                {
                    b[j0 * k / 8..j0 * k / 8 + ab].copy_from_slice(ab_row);
                    // The decoded values replace the targets, as row by row.
                    ok &= tcq::decode_into(ab_row, &t.params, &mut wi[j0..j0 + a]).is_ok();
                }
            });
            ok
        }
    };
    if !coded {
        // Whatever it wrote goes: the row-by-row path leaves zero rows' bits as they are.
        bits.iter_mut().for_each(|b| *b = 0);
        return Ok(false);
    }
    // A zero row keeps zero bits (as row by row); every row's scale, a job of rows per sweep.
    for (b, &r) in bits.chunks_exact_mut(rb).zip(&rms) {
        if !(r > 0.0 && r.is_finite()) {
            b.iter_mut().for_each(|v| *v = 0);
        }
    }
    crate::par::map(
        bits.chunks(rows_per_job * rb)
            .zip(scales.chunks_mut(rows_per_job))
            .zip(u.chunks(rows_per_job * cols).zip(rms.chunks(rows_per_job)))
            .collect::<Vec<_>>(),
        |((b, s), (u, rms))| refit_rows(tensor, u, b, rms, t, feedback, s),
    )
    .into_iter()
    .collect::<Result<()>>()?;
    Ok(true)
}

/// Decodes rows `a..b` of a trellis tensor into `out` (`(b − a) · cols` values).
pub(crate) fn decode_rows(
    tensor: &str,
    p: &crate::TrellisParts<'_>,
    cols: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    if cols == 0 || rows.is_empty() {
        return Ok(());
    }
    let rht = Rht::new(cols, p.tile, p.seed).map_err(crate::lattice_codec::lat_err(tensor))?;
    let rb = p.row_bytes(cols);
    for (r, o) in rows.zip(out.chunks_exact_mut(cols)) {
        tcq::decode_row(&p.bits[r * rb..(r + 1) * rb], p.seq, &p.params, o)
            .map_err(tcq_err(tensor))?;
        let s = p.scales[r];
        o.iter_mut().for_each(|v| *v *= s);
        rht.inverse(o);
    }
    Ok(())
}
