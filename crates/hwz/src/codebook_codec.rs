//! The `codebook`, `lowrank` and `sparse` encodings: stream layout, encode and decode over
//! [`hypercodec_hdc`].

use crate::encoding::{role, Assignments, Encoding, Residual};
use crate::manifest::min_stored_bytes;
use crate::{EncodedTensor, HwzError, Result};
use hypercodec_hdc::{
    codebook, lowrank, pack, residual, CodebookParams, HdcError, HdcParams, ResidualDtype,
};
use hypercodec_scalar as scalar;

/// Encoder-side settings of the codebook family that the manifest does not need: training,
/// search, and how the residual and the index layout are chosen.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CodebookSettings {
    /// Lloyd iterations.
    pub iters: usize,
    /// Most blocks the prototypes are learned on.
    pub sample_blocks: usize,
    /// Seed of sampling, k-means++ and the HDC projections.
    pub seed: u64,
    /// Bucketed assignment (`None`: exhaustive).
    pub hdc: Option<HdcParams>,
    /// Residual entries per block; when set it replaces the encoding's `residual.count`.
    pub residual_k: Option<f64>,
    /// Cap on the residual's stored bytes as a fraction of the rest of the tensor's bytes.
    pub residual_budget: Option<f64>,
    /// Choose packed or run-length indices by size (otherwise the encoding's choice holds).
    pub pick_layout: bool,
    /// Subspace iterations of the low-rank fit.
    pub lowrank_iters: usize,
}

impl Default for CodebookSettings {
    fn default() -> Self {
        let p = CodebookParams::default();
        CodebookSettings {
            iters: p.iters,
            sample_blocks: p.sample_blocks,
            seed: p.seed,
            hdc: p.hdc,
            residual_k: None,
            residual_budget: None,
            pick_layout: false,
            lowrank_iters: 4,
        }
    }
}

/// Most Lloyd or subspace iterations an encoder runs.
pub const MAX_ITERS: usize = 1000;

fn hdc_err(tensor: &str) -> impl Fn(HdcError) -> HwzError + '_ {
    move |source| HwzError::Codebook {
        tensor: tensor.to_string(),
        source,
    }
}

/// Encodes `values` with a codebook-family `encoding`. With default `settings` the encoding is
/// followed as given; `settings` may set the residual size and the index layout, and the
/// returned [`EncodedTensor::encoding`] says what was chosen — including bf16 scales where f16
/// ones cannot hold the tensor's (as [`crate::encode`]).
pub fn encode(
    tensor: &str,
    values: &[f32],
    shape: &[u64],
    encoding: &Encoding,
    settings: &CodebookSettings,
) -> Result<EncodedTensor> {
    crate::codec::with_scale_fallback(encoding, |e| encode_as(tensor, values, shape, e, settings))
}

/// [`encode`] without the retry with bf16 scales.
pub(crate) fn encode_as(
    tensor: &str,
    values: &[f32],
    shape: &[u64],
    encoding: &Encoding,
    settings: &CodebookSettings,
) -> Result<EncodedTensor> {
    let n = crate::element_count(tensor, shape)?;
    if values.len() as u64 != n {
        return Err(HwzError::ElementCount {
            tensor: tensor.to_string(),
            shape: shape.to_vec(),
            expected: n,
            actual: values.len() as u64,
        });
    }
    encoding.stream_lens(tensor, shape)?;
    // Settings may come from a plan file: bound the work they can ask for.
    if settings.iters > MAX_ITERS || settings.lowrank_iters > MAX_ITERS {
        return Err(HwzError::InvalidEncoding {
            tensor: tensor.into(),
            message: format!(
                "{} Lloyd / {} subspace iterations: at most {MAX_ITERS}",
                settings.iters, settings.lowrank_iters
            ),
        });
    }
    let (rows, cols) = crate::matrix_view(shape, n);
    let (rows, cols) = (rows as usize, cols as usize);
    let err = hdc_err(tensor);
    let floats = |v: &[f32], dtype: scalar::FloatDtype| {
        scalar::encode_floats(v, dtype, false).map_err(crate::encoding::scalar_err(tensor))
    };
    let (encoding, streams) = match *encoding {
        Encoding::Codebook {
            block,
            prototypes,
            scale_mode,
            scale_dtype,
            proto_dtype,
            assignments,
            residual,
        } => {
            // No more prototypes than blocks: each block is then a prototype of its own, and
            // the rest would be stored for nothing (a 1 × 16 weight at k4096 stored 32 KB).
            let blocks_in = rows * cols.div_ceil(block.max(1) as usize);
            let prototypes = prototypes.min(blocks_in.max(1).try_into().unwrap_or(u32::MAX));
            let params = CodebookParams {
                block: block as usize,
                prototypes: prototypes as usize,
                scale_mode,
                scale_dtype,
                proto_dtype,
                iters: settings.iters,
                sample_blocks: settings.sample_blocks,
                seed: settings.seed,
                hdc: settings.hdc,
            };
            let cb = codebook::encode(values, rows, cols, &params).map_err(&err)?;
            // Scales the scale type cannot hold: infinite, below f16's normal range, or zero
            // for values that are not.
            let bpr = cols.div_ceil(block.max(1) as usize).max(1);
            let covered = |g: usize| -> &[f32] {
                let (start, end) = match scale_mode {
                    hypercodec_hdc::ScaleMode::Tensor => (0, values.len()),
                    hypercodec_hdc::ScaleMode::Channel => (g * cols, (g + 1) * cols),
                    hypercodec_hdc::ScaleMode::Block => {
                        let (r, j) = (g / bpr, g % bpr);
                        let s = r * cols + j * block as usize;
                        (s, (s + block as usize).min((r + 1) * cols))
                    }
                };
                values.get(start..end).unwrap_or(&[])
            };
            let lost =
                (cb.scales.iter().enumerate()).position(|(g, &s)| scale_dtype.loses(s, covered(g)));
            if let Some(group) = lost {
                return Err(HwzError::Scalar {
                    tensor: tensor.into(),
                    source: scalar::ScalarError::scale_range(group, cb.scales[group], scale_dtype),
                });
            }
            let bits = pack::index_bits(prototypes as usize);
            let packed = pack::pack(&cb.assignments, bits);
            let layout = if settings.pick_layout {
                let rle = pack::rle_encode(&cb.assignments);
                if rle.len() < packed.len() {
                    (Assignments::Rle, rle)
                } else {
                    (Assignments::Packed, packed)
                }
            } else {
                match assignments {
                    Assignments::Packed => (Assignments::Packed, packed),
                    Assignments::Rle => (Assignments::Rle, pack::rle_encode(&cb.assignments)),
                }
            };
            let mut streams = vec![
                (role::PROTOTYPES, floats(&cb.protos, proto_dtype)?),
                (role::ASSIGNMENTS, layout.1),
                (role::SCALES, floats(&cb.scales, scale_dtype)?),
            ];
            let base_bytes: usize = streams.iter().map(|(_, b)| b.len()).sum();
            let blocks = cb.assignments.len();
            let mut count = match settings.residual_k {
                Some(k) => ((k.max(0.0) * blocks as f64) as u64).min(n),
                None => residual.count,
            };
            let mut residual = Residual {
                count,
                dtype: residual.dtype,
            };
            if count > 0 {
                let mut approx = vec![0f32; values.len()];
                codebook::decode_into(
                    &cb.as_ref(block as usize, scale_mode),
                    rows,
                    cols,
                    &mut approx,
                )
                .map_err(&err)?;
                let budget = settings
                    .residual_budget
                    .map(|f| (f.max(0.0) * base_bytes as f64) as usize);
                let mut coded;
                loop {
                    let (pos, vals) = residual::top_k(values, &approx, count as usize);
                    coded = residual::encode(&pos, &vals, residual.dtype);
                    let bytes = coded.0.len() + coded.1.len();
                    match budget {
                        Some(b) if bytes > b && count > 0 => {
                            count = ((count as f64 * b as f64 / bytes as f64 * 0.98) as u64)
                                .min(count - 1);
                        }
                        _ => break,
                    }
                }
                residual.count = count;
                if count > 0 {
                    streams.push((role::RESIDUAL_INDEX, coded.0));
                    streams.push((role::RESIDUAL_VALUES, coded.1));
                }
            }
            (
                Encoding::Codebook {
                    block,
                    prototypes,
                    scale_mode,
                    scale_dtype,
                    proto_dtype,
                    assignments: layout.0,
                    residual,
                },
                streams,
            )
        }
        Encoding::LowRank { rank } => {
            let lr = lowrank::fit(
                values,
                rows,
                cols,
                rank as usize,
                settings.lowrank_iters,
                settings.seed,
            )
            .map_err(&err)?;
            let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            let i8s = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
            (
                encoding.clone(),
                vec![
                    (role::U, i8s(&lr.u)),
                    (role::U_SCALES, f32s(&lr.u_scales)),
                    (role::V, i8s(&lr.v)),
                    (role::V_SCALES, f32s(&lr.v_scales)),
                ],
            )
        }
        Encoding::Sparse { count, dtype } => {
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(err(HdcError::NonFinite { index: i as u64 }));
            }
            let zeros = vec![0f32; values.len()];
            let (pos, vals) = residual::top_k(values, &zeros, count as usize);
            let pos: Vec<u64> = pos;
            (
                encoding.clone(),
                vec![
                    (role::INDICES, pack::encode_positions(&pos)),
                    (role::VALUES, floats(&vals, dtype)?),
                ],
            )
        }
        _ => {
            return Err(HwzError::InvalidEncoding {
                tensor: tensor.into(),
                message: "not a codebook-family encoding".into(),
            })
        }
    };
    let stored: u64 = streams.iter().map(|(_, b)| b.len() as u64).sum();
    if stored < min_stored_bytes(n) {
        return Err(HwzError::InvalidEncoding {
            tensor: tensor.into(),
            message: format!(
                "{} would store {stored} bytes for {n} values, below the floor of 1/8 bit per value; use another encoding",
                encoding.label()
            ),
        });
    }
    Ok(EncodedTensor { encoding, streams })
}

/// The codebook encoding with the given shape parameters, f16 scales and prototypes, packed
/// indices and no residual (a template for [`encode`]).
pub fn codebook_template(
    block: u32,
    prototypes: u32,
    scale_mode: hypercodec_hdc::ScaleMode,
    residual_dtype: ResidualDtype,
) -> Encoding {
    Encoding::Codebook {
        block,
        prototypes,
        scale_mode,
        scale_dtype: scalar::FloatDtype::F16,
        proto_dtype: scalar::FloatDtype::F16,
        assignments: Assignments::Packed,
        residual: Residual {
            count: 0,
            dtype: residual_dtype,
        },
    }
}
