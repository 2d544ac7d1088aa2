//! Block splitting, scales, prototype learning and assignment: the codebook encoder and
//! decoder.

use crate::hdc::{HdcIndex, HdcParams};
use crate::{kmeans, HdcError, Result};
use hypercodec_scalar::FloatDtype;

/// Smallest block.
pub const MIN_BLOCK: usize = 2;
/// Largest block.
pub const MAX_BLOCK: usize = 64;
/// Most prototypes.
pub const MAX_PROTOTYPES: usize = 1 << 16;

/// What one scale covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum ScaleMode {
    /// One scale per block (gain–shape: prototypes learn shapes, scales carry gains).
    Block,
    /// One scale for the whole tensor.
    Tensor,
    /// One scale per row (output channel).
    Channel,
}

impl ScaleMode {
    /// `block`, `tensor` or `channel`.
    pub fn name(self) -> &'static str {
        match self {
            ScaleMode::Block => "block",
            ScaleMode::Tensor => "tensor",
            ScaleMode::Channel => "channel",
        }
    }

    /// The number of scales of a `rows × cols` tensor cut into blocks of `block`.
    pub fn count(self, rows: usize, cols: usize, block: usize) -> usize {
        match self {
            // (Saturated: no buffer holds that many, so a length check against it fails.)
            ScaleMode::Block => rows.saturating_mul(cols.div_ceil(block.max(1))),
            ScaleMode::Tensor => usize::from(rows > 0 && cols > 0),
            ScaleMode::Channel => rows,
        }
    }
}

/// Parameters of [`encode`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodebookParams {
    /// Values per block, `MIN_BLOCK..=MAX_BLOCK`. Blocks run along rows; a row whose length is
    /// not a multiple is padded with zeros that are never stored.
    pub block: usize,
    /// Number of prototypes, `1..=MAX_PROTOTYPES`.
    pub prototypes: usize,
    /// Scale granularity.
    pub scale_mode: ScaleMode,
    /// Storage type of the scales (the encoder fits against the rounded values).
    pub scale_dtype: FloatDtype,
    /// Storage type of the prototypes.
    pub proto_dtype: FloatDtype,
    /// Lloyd iterations after k-means++ seeding.
    pub iters: usize,
    /// Most blocks the prototypes are learned on (a stratified sample).
    pub sample_blocks: usize,
    /// Seed of sampling, seeding and the HDC projections.
    pub seed: u64,
    /// Bucketed assignment, or `None` for exhaustive search.
    pub hdc: Option<HdcParams>,
}

impl Default for CodebookParams {
    fn default() -> Self {
        CodebookParams {
            block: 8,
            prototypes: 256,
            scale_mode: ScaleMode::Channel,
            scale_dtype: FloatDtype::F16,
            proto_dtype: FloatDtype::F16,
            iters: 8,
            sample_blocks: 32768,
            seed: 0,
            hdc: Some(HdcParams {
                dim: 32,
                buckets: 16,
                seed: 0,
            }),
        }
    }
}

impl CodebookParams {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<()> {
        if !(MIN_BLOCK..=MAX_BLOCK).contains(&self.block) {
            return Err(HdcError::InvalidParams {
                message: format!("block {} must be in {MIN_BLOCK}..={MAX_BLOCK}", self.block),
            });
        }
        if !(1..=MAX_PROTOTYPES).contains(&self.prototypes) {
            return Err(HdcError::InvalidParams {
                message: format!(
                    "prototypes {} must be in 1..={MAX_PROTOTYPES}",
                    self.prototypes
                ),
            });
        }
        if let Some(h) = self.hdc {
            h.validate()?;
        }
        Ok(())
    }
}

/// A tensor as prototypes, one prototype index per block, and scales.
#[derive(Debug, Clone, PartialEq)]
pub struct Codebook {
    /// `prototypes × block` values (already rounded to their storage type).
    pub protos: Vec<f32>,
    /// One prototype index per block, row-major.
    pub assignments: Vec<u32>,
    /// Scales per [`ScaleMode::count`] (already rounded to their storage type).
    pub scales: Vec<f32>,
}

fn scope_of(mode: ScaleMode, blocks_per_row: usize, b: usize) -> usize {
    match mode {
        ScaleMode::Block => b,
        ScaleMode::Tensor => 0,
        ScaleMode::Channel => b / blocks_per_row,
    }
}

/// Encodes a row-major `rows × cols` tensor.
pub fn encode(
    values: &[f32],
    rows: usize,
    cols: usize,
    params: &CodebookParams,
) -> Result<Codebook> {
    params.validate()?;
    if values.len() != crate::numel(rows, cols)? {
        return Err(HdcError::Shape {
            message: format!("{} values for a {rows}×{cols} tensor", values.len()),
        });
    }
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(HdcError::NonFinite { index: i as u64 });
    }
    let block = params.block;
    let bpr = cols.div_ceil(block);
    let n_blocks = rows * bpr;
    let n_scales = params.scale_mode.count(rows, cols, block);
    // Initial scales: RMS per scope.
    let mut sumsq = vec![0f64; n_scales];
    let mut count = vec![0u64; n_scales];
    for r in 0..rows {
        for (c, &x) in values[r * cols..(r + 1) * cols].iter().enumerate() {
            let s = scope_of(params.scale_mode, bpr, r * bpr + c / block);
            sumsq[s] += (x as f64) * (x as f64);
            count[s] += 1;
        }
    }
    let rms: Vec<f32> = sumsq
        .iter()
        .zip(&count)
        .map(|(&s, &n)| {
            if n == 0 {
                0.0
            } else {
                (s / n as f64).sqrt() as f32
            }
        })
        .collect();
    // Normalized, zero-padded blocks.
    let mut blocks = vec![0f32; n_blocks * block];
    for r in 0..rows {
        for (c, &x) in values[r * cols..(r + 1) * cols].iter().enumerate() {
            let b = r * bpr + c / block;
            let s = rms[scope_of(params.scale_mode, bpr, b)];
            blocks[b * block + c % block] = if s > 0.0 { x / s } else { 0.0 };
        }
    }
    let mut rng = crate::rng::Rng::new(params.seed);
    let sample = kmeans::sample(&blocks, block, params.sample_blocks.max(1), &mut rng);
    let mut protos = kmeans::train(&sample, block, params.prototypes, params.iters, params.seed)?;
    drop(sample);
    for p in &mut protos {
        *p = params.proto_dtype.round(*p);
    }
    let mut assignments = vec![0u32; n_blocks];
    match params.hdc {
        // No more blocks than prototypes: each block is a prototype of its own (k-means seeds
        // them all), which only the exhaustive search is sure to find (a bucket may hold
        // another: a 1 × 16 weight came back 0.78 off); and it costs at most k² distances.
        Some(h) if n_blocks > params.prototypes => {
            HdcIndex::new(&protos, block, h)?.assign(&blocks, &mut assignments)
        }
        _ => kmeans::assign_brute(&protos, block, &blocks, &mut assignments),
    }
    drop(blocks);
    // Least-squares scales against the chosen prototypes, then rounded to storage.
    let mut num = vec![0f64; n_scales];
    let mut den = vec![0f64; n_scales];
    for r in 0..rows {
        for (c, &x) in values[r * cols..(r + 1) * cols].iter().enumerate() {
            let b = r * bpr + c / block;
            let p = protos[assignments[b] as usize * block + c % block] as f64;
            let s = scope_of(params.scale_mode, bpr, b);
            num[s] += x as f64 * p;
            den[s] += p * p;
        }
    }
    let scales = num
        .iter()
        .zip(&den)
        .map(|(&n, &d)| {
            let s = if d > 0.0 { (n / d) as f32 } else { 0.0 };
            params
                .scale_dtype
                .round(if s.is_finite() { s } else { 0.0 })
        })
        .collect();
    Ok(Codebook {
        protos,
        assignments,
        scales,
    })
}

/// Decodes into `out` (`rows × cols`). Every assignment must be `< protos.len() / block` and
/// `scales` must have [`ScaleMode::count`] entries.
pub fn decode_into(cb: &CodebookRef<'_>, rows: usize, cols: usize, out: &mut [f32]) -> Result<()> {
    decode_rows_into(cb, rows, cols, 0, out)
}

/// Decodes rows `first .. first + out.len() / cols` of a `rows × cols` tensor into `out`:
/// `cb.assignments` holds the assignments of those rows only, `cb.scales` all of the tensor's
/// scales. The values are bit for bit those rows of [`decode_into`].
pub fn decode_rows_into(
    cb: &CodebookRef<'_>,
    rows: usize,
    cols: usize,
    first: usize,
    out: &mut [f32],
) -> Result<()> {
    let block = cb.block;
    if !(MIN_BLOCK..=MAX_BLOCK).contains(&block) {
        return Err(HdcError::InvalidParams {
            message: format!("block {block}"),
        });
    }
    let bpr = cols.div_ceil(block);
    let k = cb.protos.len() / block;
    let count = out.len().checked_div(cols).unwrap_or(0);
    if count * cols != out.len()
        || first.checked_add(count).is_none_or(|e| e > rows)
        || cb.assignments.len() != count * bpr
        || cb.scales.len() != cb.scale_mode.count(rows, cols, block)
        || !cb.protos.len().is_multiple_of(block)
    {
        return Err(HdcError::Shape {
            message: format!(
                "codebook parts do not match rows {first}..+{count} of a {rows}×{cols} tensor"
            ),
        });
    }
    if let Some(&a) = cb.assignments.iter().find(|&&a| a as usize >= k) {
        return Err(HdcError::Corrupt {
            message: format!("prototype index {a} >= {k}"),
        });
    }
    for r in 0..count {
        let row = &mut out[r * cols..(r + 1) * cols];
        for (j, chunk) in row.chunks_mut(block).enumerate() {
            let b = (first + r) * bpr + j;
            let s = cb.scales[scope_of(cb.scale_mode, bpr, b)];
            let p = &cb.protos[cb.assignments[r * bpr + j] as usize * block..][..chunk.len()];
            for (o, &x) in chunk.iter_mut().zip(p) {
                *o = s * x;
            }
        }
    }
    Ok(())
}

/// Borrowed parts of a codebook-coded tensor, for [`decode_into`].
#[derive(Debug, Clone, Copy)]
pub struct CodebookRef<'a> {
    /// Values per block.
    pub block: usize,
    /// Scale granularity.
    pub scale_mode: ScaleMode,
    /// `k × block` prototype values.
    pub protos: &'a [f32],
    /// One index per block.
    pub assignments: &'a [u32],
    /// Scales.
    pub scales: &'a [f32],
}

impl Codebook {
    /// This codebook borrowed, for [`decode_into`].
    pub fn as_ref(&self, block: usize, scale_mode: ScaleMode) -> CodebookRef<'_> {
        CodebookRef {
            block,
            scale_mode,
            protos: &self.protos,
            assignments: &self.assignments,
            scales: &self.scales,
        }
    }
}
