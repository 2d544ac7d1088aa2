//! `hypercodec run`: every weight matrix of an archive loaded as a [`CompressedLinear`] and run
//! as a stack — a layer feeds the next when the widths chain (an MLP, a block's projections),
//! otherwise it gets a fresh input — timed against the same stack with dense f32 weights (the
//! original's when a source is given, else the decompressed ones) in the same run.

use crate::shards::ArchiveSet;
use crate::{PipelineError, Result, TensorSource};
use hypercodec_runtime::{bench, CompressedLinear, LoadOptions, Result as RunResult};
use std::path::Path;

/// What `run` does. By default: batch 1, every matrix, 0.5 s of timing per figure.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Rows of activations per call. By default, 1.
    pub batch: usize,
    /// Only weights whose name contains this. By default, all.
    pub filter: Option<String>,
    /// Minimum timing per figure, seconds. By default, 0.5.
    pub min_seconds: f64,
    /// How the operators are loaded. By default, as stored.
    pub load: LoadOptions,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            batch: 1,
            filter: None,
            min_seconds: 0.5,
            load: LoadOptions::default(),
        }
    }
}

/// One layer of the stack.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LayerReport {
    /// The weight's name.
    pub name: String,
    /// `[rows, cols]` of its matrix view.
    pub shape: [usize; 2],
    /// The operator's route at the run's batch ([`CompressedLinear::route`]).
    pub path: String,
    /// Bytes the operator holds.
    pub held_bytes: u64,
    /// Whether its input is the previous layer's output.
    pub chained: bool,
}

/// The measured stack.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunReport {
    /// The layers, in archive order.
    pub layers: Vec<LayerReport>,
    /// Batch size.
    pub batch: usize,
    /// Median µs of one forward pass through the compressed stack.
    pub ours_us: f64,
    /// Median µs of the same pass with dense f32 weights.
    pub dense_us: f64,
    /// `dense_us / ours_us`.
    pub speedup: f64,
    /// Bytes the compressed operators hold.
    pub held_bytes: u64,
    /// Bytes of the dense f32 weights.
    pub dense_bytes: u64,
    /// SNR (dB) of the stack's outputs against the dense stack's (all layers' outputs); infinite
    /// where they match exactly, NaN where the outputs are not finite (`null` in JSON either
    /// way, as every report's SNR).
    pub output_snr_db: f64,
    /// Whether the dense weights are the original's (else the decompressed ones).
    pub against_original: bool,
    /// Threads of the pool and the instruction set of the kernels.
    pub threads: usize,
    /// `avx2+fma` or `baseline`.
    pub simd: String,
}

/// One layer's `y = x·Wᵀ` by index, compressed or dense.
type Layer<'a> = dyn Fn(usize, &[f32], &mut [f32]) -> RunResult<()> + 'a;

/// Unit-RMS rows, so a chained stack of random layers neither explodes nor vanishes.
fn normalize(y: &mut [f32], width: usize) {
    for row in y.chunks_exact_mut(width.max(1)) {
        let rms = (row.iter().map(|v| v * v).sum::<f32>() / width.max(1) as f32).sqrt();
        if rms > 0.0 && rms.is_finite() {
            row.iter_mut().for_each(|v| *v /= rms);
        }
    }
}

/// Seeded activations in [−1, 1).
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut s = crate::SplitMix64(seed);
    (0..n)
        .map(|_| (s.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect()
}

/// Loads the matrices of `archive` (a `.hwz` or a shard index) and runs them as a stack.
pub fn run(archive: &Path, original: Option<&str>, options: &RunOptions) -> Result<RunReport> {
    let set = ArchiveSet::open(archive)?;
    let batch = options.batch.max(1);
    let source = original.map(TensorSource::open).transpose()?;
    let mut ops = Vec::new();
    let mut dense = Vec::new();
    for (k, t) in set.tensors().enumerate() {
        if t.shape.len() < 2 || options.filter.as_ref().is_some_and(|f| !t.name.contains(f)) {
            continue;
        }
        let view = set.view(k)?;
        let (rows, cols) = (view.rows() as usize, view.cols() as usize);
        if rows == 0 || cols == 0 {
            // No weights to run (a `[0, N]` tensor): its width alone would size the buffers
            // (`[0, 2^64 - 1]` asked for an allocation that overflows).
            continue;
        }
        let w = match &source {
            Some(src) => {
                let i = src
                    .tensors
                    .iter()
                    .position(|s| s.name == t.name)
                    .ok_or_else(|| PipelineError::NoTensors {
                        message: format!("`{}` is not in the original", t.name),
                    })?;
                src.read(i)?
            }
            None => {
                let mut w = vec![0f32; rows * cols];
                view.decode_rows_into(0..rows as u64, &mut w)?;
                w
            }
        };
        if w.len() != rows * cols {
            return Err(PipelineError::NoTensors {
                message: format!("`{}` has another size in the original", t.name),
            });
        }
        let load = options.load.for_tensor(&view);
        ops.push(CompressedLinear::new(view, None, &load)?);
        dense.push(w);
    }
    if ops.is_empty() {
        return Err(PipelineError::NoTensors {
            message: "no weight matrix (rank >= 2) to run".into(),
        });
    }
    // The stack: inputs of unchained layers are drawn once, up front.
    let chained: Vec<bool> = (0..ops.len())
        .map(|i| i > 0 && ops[i].cols() == ops[i - 1].rows())
        .collect();
    let fresh: Vec<Vec<f32>> = ops
        .iter()
        .enumerate()
        .map(|(i, op)| activations(batch * op.cols(), i as u64 + 1))
        .collect();
    let pass = |layer: &Layer<'_>, outs: &mut Vec<Vec<f32>>| -> RunResult<()> {
        for i in 0..ops.len() {
            let mut y = std::mem::take(&mut outs[i]);
            y.resize(batch * ops[i].rows(), 0.0);
            if chained[i] {
                layer(i, &outs[i - 1], &mut y)?;
            } else {
                layer(i, &fresh[i], &mut y)?;
            }
            normalize(&mut y, ops[i].rows());
            outs[i] = y;
        }
        Ok(())
    };
    let ours_layer = |i: usize, x: &[f32], y: &mut [f32]| ops[i].forward(x, batch, y);
    let dense_layer = |i: usize, x: &[f32], y: &mut [f32]| -> RunResult<()> {
        bench::dense(&dense[i], ops[i].rows(), ops[i].cols(), x, batch, y)
    };
    let mut ours_out = vec![Vec::new(); ops.len()];
    let mut dense_out = vec![Vec::new(); ops.len()];
    let ours_us = bench::time_us(options.min_seconds, || pass(&ours_layer, &mut ours_out))?;
    let dense_us = bench::time_us(options.min_seconds, || pass(&dense_layer, &mut dense_out))?;
    let (mut signal, mut noise) = (0f64, 0f64);
    for (a, b) in ours_out.iter().zip(&dense_out) {
        for (&p, &q) in a.iter().zip(b) {
            signal += (q as f64).powi(2);
            noise += (p as f64 - q as f64).powi(2);
        }
    }
    let layers = ops
        .iter()
        .zip(&chained)
        .map(|(op, &chained)| LayerReport {
            name: op.name().to_string(),
            shape: [op.rows(), op.cols()],
            path: op.route(batch),
            held_bytes: op.held_bytes(),
            chained,
        })
        .collect();
    Ok(RunReport {
        layers,
        batch,
        ours_us,
        dense_us,
        speedup: dense_us / ours_us,
        held_bytes: ops.iter().map(CompressedLinear::held_bytes).sum(),
        dense_bytes: dense.iter().map(|w| 4 * w.len() as u64).sum(),
        output_snr_db: if noise == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (signal / noise).log10()
        },
        against_original: source.is_some(),
        threads: rayon::current_num_threads(),
        simd: hypercodec_runtime::simd_level().into(),
    })
}
