//! Planner and codebook arguments, the choice of a recipe per tensor, and `hypercodec plan`.

use crate::error::{CliError, Result};
use crate::input::Input;
use clap::{Args, ValueEnum};
use hypercodec_hwz::{
    self as hwz, CodebookSettings, Encoding, HdcParams, ResidualDtype, ScaleMode,
};
use hypercodec_plan::{self as plan, Mode, Plan, Planner, Spec, Target, TensorPlan, Thresholds};
use std::collections::HashMap;
use std::path::PathBuf;

/// Codebook: what one scale covers.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ScaleArg {
    /// One scale per block.
    Block,
    /// One scale for the tensor.
    Tensor,
    /// One scale per row (output channel).
    Channel,
}

/// Codebook: residual value storage.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ResidualArg {
    /// int8 codes with one f32 scale.
    Int8,
    /// Exact f32.
    F32,
}

/// Arguments of the codebook family (named as Hyper Glyph names them).
#[derive(Args, Clone)]
pub struct CodebookArgs {
    /// Codebook: values per block (2..=64).
    #[arg(long, default_value_t = 8)]
    pub block_size: u32,
    /// Codebook: number of prototypes (1..=65536).
    #[arg(long, default_value_t = 256)]
    pub n_prototypes: u32,
    /// Codebook: residual corrections (largest errors) per block; fractions allowed (0.25 = one per four blocks).
    #[arg(long, default_value_t = 0.0)]
    pub residual_k: f64,
    /// Codebook: storage of the residual corrections.
    #[arg(long, value_enum, default_value = "int8")]
    pub residual_dtype: ResidualArg,
    /// Codebook: cap on the residual's bytes as a fraction of the codebook's other bytes (e.g. 0.03).
    #[arg(long)]
    pub residual_budget: Option<f64>,
    /// Codebook: what one scale covers.
    #[arg(long, value_enum, default_value = "channel")]
    pub scale_mode: ScaleArg,
    /// Codebook: random projections the HDC index chooses its bucket hyperplanes from; 0 = exhaustive search.
    #[arg(long, default_value_t = 32)]
    pub hdc_dim: usize,
    /// Codebook: HDC buckets (a power of two; more = faster, slightly less exact).
    #[arg(long, default_value_t = 16)]
    pub n_buckets: usize,
    /// Codebook: Lloyd iterations after k-means++.
    #[arg(long, default_value_t = 8)]
    pub lloyd_iters: usize,
    /// Low-rank: rank of the factors.
    #[arg(long, default_value_t = 16)]
    pub rank: u32,
}

impl CodebookArgs {
    /// The codebook recipe.
    pub fn spec(&self, seed: u64) -> Result<Spec> {
        let scale_mode = match self.scale_mode {
            ScaleArg::Block => ScaleMode::Block,
            ScaleArg::Tensor => ScaleMode::Tensor,
            ScaleArg::Channel => ScaleMode::Channel,
        };
        let dtype = match self.residual_dtype {
            ResidualArg::Int8 => ResidualDtype::Int8,
            ResidualArg::F32 => ResidualDtype::F32,
        };
        let template =
            hwz::codebook_template(self.block_size, self.n_prototypes, scale_mode, dtype);
        let hdc = (self.hdc_dim > 0).then_some(HdcParams {
            dim: self.hdc_dim,
            buckets: self.n_buckets,
            seed,
        });
        if let Some(h) = hdc {
            h.validate()
                .map_err(|e| CliError::Usage(format!("--hdc-dim / --n-buckets: {e}")))?;
        }
        if self.residual_k < 0.0 || !self.residual_k.is_finite() {
            return Err(CliError::Usage("--residual-k must be >= 0".into()));
        }
        // Reject a bad block size or prototype count before reading anything.
        template
            .stream_lens("check", &[1, 64])
            .map_err(|e| CliError::Usage(format!("--block-size / --n-prototypes: {e}")))?;
        Ok(Spec::Codebook {
            template,
            settings: CodebookSettings {
                iters: self.lloyd_iters,
                seed,
                hdc,
                residual_k: Some(self.residual_k),
                residual_budget: self.residual_budget,
                pick_layout: true,
                ..CodebookSettings::default()
            },
        })
    }

    /// The low-rank recipe.
    pub fn lowrank(&self) -> Spec {
        Spec::fixed(Encoding::LowRank { rank: self.rank })
    }
}

/// Arguments of the planner.
#[derive(Args, Clone)]
pub struct PlanArgs {
    /// Planner mode: lowest | highest | allow | closest | average | best | per_block | per_weight |
    /// budget | auto (`plan` defaults to best). LOWEST: fewest bytes. HIGHEST: lowest error. BEST: cheapest acceptable.
    /// ALLOW: cheapest acceptable on 70 % of row blocks. CLOSEST: median of the blocks' picks.
    /// AVERAGE: their majority (over 60 %), else the one nearest their mean bps. PER_BLOCK: one
    /// pick per row block (hwz `mixed`). PER_WEIGHT: a base plus its worst values exact.
    /// BUDGET: convex-hull allocation under --target-bps or --target-ratio. AUTO: Hyper Glyph's
    /// rule. Acceptable: a lossy SNR of at least --min-snr-db; f16 and bf16 when their
    /// element-wise relative error is at most --eps-fp16 / --eps-bf16.
    #[arg(long)]
    pub mode: Option<String>,
    /// Target average bits per value, all side information included (BUDGET, AUTO).
    #[arg(long)]
    pub target_bps: Option<f64>,
    /// Target compression ratio versus f32 (BUDGET, AUTO; for --encoding lattice the rate 32/ratio).
    #[arg(long, conflicts_with = "target_bps")]
    pub target_ratio: Option<f64>,
    /// Candidates, comma separated: f32, bf16, f16, intN (g128 asym), intN-row, e8@B, d4@B, a2@B,
    /// z1@B, codebook, lowrank, sparse. Default: f32,bf16,f16,int8-row,int4,e8@4; for BUDGET
    /// bf16,int8-row,int4,int3,int2,e8@2,e8@2.5,e8@3,e8@3.5,e8@4,e8@5,e8@6; for AUTO
    /// bf16,int8-row,int4-row,int4,e8@3,e8@4,codebook (+ lowrank, sparse and a fitted e8 where they apply).
    #[arg(long, value_delimiter = ',')]
    pub candidates: Vec<String>,
    /// Lossy candidates are acceptable at this SNR (dB) or above.
    #[arg(long, default_value_t = 30.0)]
    pub min_snr_db: f64,
    /// f16 is acceptable when its element-wise relative error is at most this (0 = exact only).
    #[arg(long, default_value_t = 0.0)]
    pub eps_fp16: f64,
    /// bf16 is acceptable when its element-wise relative error is at most this (0 = exact only).
    #[arg(long, default_value_t = 0.0)]
    pub eps_bf16: f64,
    /// Between equally sized f16 and bf16, take bf16.
    #[arg(long)]
    pub prefer_bf16: bool,
    /// Rows per block of the block modes.
    #[arg(long, default_value_t = 32)]
    pub block_rows: u64,
    /// BUDGET: a JSON object {tensor name: weight} scaling each tensor's distortion.
    #[arg(long)]
    pub sensitivity: Option<PathBuf>,
}

impl PlanArgs {
    /// The mode, if one was given.
    pub fn mode(&self) -> Result<Option<Mode>> {
        self.mode
            .as_deref()
            .map(|m| {
                m.parse::<Mode>()
                    .map_err(|e| CliError::Usage(e.to_string()))
            })
            .transpose()
    }

    /// The size target, if any.
    pub fn target(&self) -> Result<Option<Target>> {
        match (self.target_bps, self.target_ratio) {
            (Some(b), _) if !(b > 0.0 && b.is_finite()) => {
                Err(CliError::Usage("--target-bps must be positive".into()))
            }
            (_, Some(r)) if !(r > 0.0 && r.is_finite()) => {
                Err(CliError::Usage("--target-ratio must be positive".into()))
            }
            (Some(b), _) => Ok(Some(Target::Bps(b))),
            (_, Some(r)) => Ok(Some(Target::Ratio(r))),
            _ => Ok(None),
        }
    }

    fn thresholds(&self) -> Thresholds {
        Thresholds {
            min_snr_db: self.min_snr_db,
            eps_fp16: self.eps_fp16,
            eps_bf16: self.eps_bf16,
            prefer_bf16: self.prefer_bf16,
            ..Thresholds::default()
        }
    }

    fn weights(&self) -> Result<HashMap<String, f64>> {
        let Some(path) = &self.sensitivity else {
            return Ok(HashMap::new());
        };
        let text = std::fs::read_to_string(path).map_err(CliError::io(path))?;
        serde_json::from_str(&text).map_err(|e| {
            CliError::Usage(format!(
                "{}: not a {{name: weight}} object: {e}",
                path.display()
            ))
        })
    }
}

/// Chooses the recipe of every tensor: one planner per run, or per tensor for AUTO (whose
/// candidates depend on the tensor).
pub struct Chooser<'a> {
    /// The mode.
    pub mode: Mode,
    args: &'a PlanArgs,
    codebook: &'a CodebookArgs,
    seed: u64,
    target: Option<Target>,
}

impl<'a> Chooser<'a> {
    /// A chooser for `mode`.
    pub fn new(
        mode: Mode,
        args: &'a PlanArgs,
        codebook: &'a CodebookArgs,
        seed: u64,
    ) -> Result<Self> {
        let target = args.target()?;
        if target.is_some() && !matches!(mode, Mode::Budget | Mode::Auto) {
            return Err(CliError::Usage(format!(
                "--target-bps / --target-ratio mean nothing to --mode {:?}; use budget or auto",
                mode
            )));
        }
        if mode == Mode::Budget && target.is_none() {
            return Err(CliError::Usage(
                "--mode budget needs --target-bps or --target-ratio".into(),
            ));
        }
        let c = Chooser {
            mode,
            args,
            codebook,
            seed,
            target,
        };
        c.planner(&[], 0, 0)?; // reject bad candidate names before reading anything
        Ok(c)
    }

    fn candidate(&self, name: &str) -> Result<Spec> {
        match name {
            "codebook" => self.codebook.spec(self.seed),
            "lowrank" => Ok(self.codebook.lowrank()),
            n => Spec::parse(n).map_err(|e| CliError::Usage(e.to_string())),
        }
    }

    /// The planner for a tensor of `shape` with `numel` values, `nnz` of them nonzero.
    fn planner(&self, shape: &[u64], numel: u64, nnz: u64) -> Result<Planner> {
        let mut p = Planner::new(self.mode);
        p.thresholds = self.args.thresholds();
        p.block_rows = self.args.block_rows.max(1);
        p.target = self.target;
        let names: Vec<String> = if !self.args.candidates.is_empty() {
            self.args.candidates.clone()
        } else if self.mode == Mode::Auto {
            // Hyper Glyph's candidate kinds plus ours: affine, codebook, lattice; low-rank for
            // small matrices, sparse for mostly-zero tensors; the lattice at the target rate.
            let mut v: Vec<String> = plan::AUTO_CANDIDATES
                .iter()
                .map(|s| s.to_string())
                .chain(std::iter::once("codebook".to_string()))
                .collect();
            if shape.len() >= 2 && numel <= 1 << 18 {
                v.push("lowrank".into());
            }
            if nnz * 5 <= numel {
                v.push("sparse".into());
            }
            if let Some(t) = self.target {
                let bps = t.bytes(numel.max(1)) as f64 * 8.0 / numel.max(1) as f64;
                if bps > 0.5 {
                    v.push(format!("e8@{:.3}", bps.min(12.0)));
                }
            }
            v
        } else {
            return Ok(p);
        };
        p.candidates = names
            .iter()
            .map(|n| self.candidate(n))
            .collect::<Result<_>>()?;
        Ok(p)
    }

    /// Plans one tensor.
    pub fn plan_tensor(
        &self,
        name: &str,
        values: &[f32],
        shape: &[u64],
    ) -> Result<(TensorPlan, Option<hwz::EncodedTensor>)> {
        let nnz = values.iter().filter(|v| **v != 0.0).count() as u64;
        let p = self.planner(shape, values.len() as u64, nnz)?;
        Ok(p.plan_tensor(name, values, shape)?)
    }

    /// An empty plan of this chooser's settings.
    pub fn empty_plan(&self) -> Plan {
        Plan {
            version: 1,
            mode: self.mode,
            thresholds: self.args.thresholds(),
            target: self.target,
            block_rows: self.args.block_rows,
            tensors: Vec::new(),
        }
    }

    /// `BUDGET`: allocates across the measured tensors.
    pub fn allocate(&self, plan: &mut Plan) -> Result<u64> {
        let target = self
            .target
            .ok_or_else(|| CliError::Usage("budget needs a target".into()))?;
        Ok(plan::allocate(plan, target, &self.args.weights()?)?)
    }
}

/// Whether a tensor is planned (rank ≥ 2, or 1-D when asked; at least `min_size` values).
pub fn planned(shape: &[u64], include_1d: bool, min_size: u64) -> bool {
    (shape.len() >= 2 || include_1d) && shape.iter().product::<u64>() >= min_size
}

/// `hypercodec plan`: measures and chooses, prints the Plan as JSON.
pub fn plan_command(
    input: &str,
    args: &PlanArgs,
    codebook: &CodebookArgs,
    seed: u64,
    include_1d: bool,
    min_size: u64,
) -> Result<()> {
    let mode = args.mode()?.unwrap_or(Mode::Best);
    let chooser = Chooser::new(mode, args, codebook, seed)?;
    let input = Input::open(input)?;
    let total: u64 = input.tensors.iter().map(|t| t.numel()).sum();
    let bar = crate::progress(total, "plan");
    let mut plan = chooser.empty_plan();
    let started = std::time::Instant::now();
    for (i, t) in input.tensors.iter().enumerate() {
        if planned(&t.shape, include_1d, min_size) {
            let values = input.read(i)?;
            plan.tensors
                .push(chooser.plan_tensor(&t.name, &values, &t.shape)?.0);
        }
        bar.inc(t.numel());
    }
    if mode == Mode::Budget {
        chooser.allocate(&mut plan)?;
    }
    bar.finish_and_clear();
    let elements = plan.total_elements();
    eprintln!(
        "planned {} tensors ({} values) in {:.1} s: {} bytes, {:.3} bits/value",
        plan.tensors.len(),
        elements,
        started.elapsed().as_secs_f64(),
        plan.total_bytes(),
        plan.total_bytes() as f64 * 8.0 / elements.max(1) as f64
    );
    println!(
        "{}",
        serde_json::to_string_pretty(&plan).map_err(|e| CliError::Input(e.to_string()))?
    );
    Ok(())
}
