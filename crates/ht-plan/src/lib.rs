//! hypercodec-plan: measures the stored bytes and the error of every candidate encoding of a
//! tensor (and of each row block of it) and chooses one by a planner mode, or allocates a
//! global bit budget across tensors.
//!
//! Key design decision: every choice is made from *measured* reconstruction error and stored
//! bytes, never from a rule of thumb, and the [`Plan`] records every candidate tried, its
//! bytes and error, and why the winner won. A plan is serde JSON, stored in the archive, and
//! replaying it ([`Spec::encode`]) gives the same bytes.
//!
//! # Acceptability
//! The threshold `τ = 10^(−min_snr_db/10)` bounds the relative MSE `Σ(x−x̂)²/Σx²`.
//! - `f32` is always acceptable.
//! - `f16` is acceptable when its largest element-wise relative error is `≤ eps_fp16`
//!   (default 0: only exactly representable tensors); `bf16` likewise with `eps_bf16`.
//! - every other candidate (affine, lattice, codebook, low-rank, sparse) is acceptable when its
//!   relative MSE is `≤ τ`.
//!
//! The same tests apply to one row block (`block_rows` rows) with the block's own energy.
//! "Cheapest" orders by stored bytes, then relative MSE, then `f16` before `bf16` (or the
//! reverse with `prefer_bf16`).
//!
//! # Modes
//! - `LOWEST`: the cheapest candidate, error ignored.
//! - `HIGHEST`: the most accurate candidate (lowest relative MSE), bytes breaking ties.
//! - `BEST`: the cheapest acceptable candidate; if none is, `HIGHEST`.
//! - `ALLOW`: the cheapest candidate acceptable on at least `allow_share` (0.7) of the row
//!   blocks — a few blocks may miss the threshold; if none reaches the share, `BEST`.
//! - `CLOSEST`: every block picks its cheapest acceptable candidate (its most accurate if
//!   none is); the tensor takes the median of those picks, ordered cheapest first.
//! - `AVERAGE`: with the same block picks, the pick of more than `majority` (0.6) of the
//!   blocks; otherwise the candidate whose bps is nearest the blocks' mean bps (the more
//!   precise one on a tie).
//! - `PER_BLOCK`: each row block keeps its own pick, stored as hwz `mixed` (codebook,
//!   low-rank and sparse candidates, which learn from the whole tensor, do not take part).
//! - `PER_WEIGHT`: a dense base plus exact exceptions: for every candidate, the fewest of its
//!   worst-reconstructed values that, stored exactly (f32), bring the tensor to `τ`; the
//!   candidate with the fewest total bytes wins (hwz `exceptions`).
//! - `BUDGET`: given a target (bps, ratio or bytes), each tensor's candidates form a
//!   rate–distortion set `(bytes, w·SSE)`; starting from every tensor's cheapest point on
//!   its lower convex hull, the upgrade with the largest distortion drop per byte that
//!   still fits is applied until none fits (Lagrangian allocation). The total never exceeds
//!   the budget; `w` is an optional per-tensor sensitivity weight (default 1).
//! - `AUTO` (Hyper Glyph's rule, measured; by default screened on 512 rows, see
//!   [`Planner::screen_rows`]): with a target, the most accurate candidate whose
//!   bytes fit `numel·bps/8`; without, the cheapest whose relative MSE is at most 1.05× that of
//!   per-row INT4 (`int4-row`, always measured).
#![deny(missing_docs)]

mod budget;
pub mod measure;
mod modes;
mod spec;

pub use budget::allocate;
pub use measure::{Measured, Sums};
pub use spec::{top_errors, Spec, CALIBRATED_TRELLIS_SEQ};

use hypercodec_hwz::{EncodedTensor, FloatDtype, HwzError};
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// Errors of the planner.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// Encoding or decoding failed.
    #[error(transparent)]
    Hwz(#[from] HwzError),
    /// A candidate name or setting is not understood.
    #[error("{message}")]
    Candidate {
        /// The name or setting and what is wrong with it.
        message: String,
    },
    /// No candidate could encode the tensor.
    #[error("tensor `{tensor}`: no candidate could encode it ({reasons})")]
    NoCandidate {
        /// Tensor name.
        tensor: String,
        /// Why each failed.
        reasons: String,
    },
    /// Even the cheapest candidates exceed the budget.
    #[error(
        "budget of {budget} bytes is below the {cheapest} bytes of the cheapest candidates \
         (the smallest reachable target: {min_bps:.3} bits per value)"
    )]
    BudgetTooSmall {
        /// The budget.
        budget: u64,
        /// The sum of every tensor's cheapest candidate.
        cheapest: u64,
        /// `cheapest` in bits per planned value.
        min_bps: f64,
    },
}

/// Result of this crate.
pub type Result<T, E = PlanError> = std::result::Result<T, E>;

/// Planner modes (see the crate docs for each rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Cheapest.
    Lowest,
    /// Most accurate.
    Highest,
    /// Cheapest acceptable on most blocks.
    Allow,
    /// Median of the blocks' picks.
    Closest,
    /// Majority or mean of the blocks' picks.
    Average,
    /// Cheapest acceptable.
    Best,
    /// One pick per row block (`mixed`).
    PerBlock,
    /// Base plus exact exceptions.
    PerWeight,
    /// Global bit budget.
    Budget,
    /// Hyper Glyph's rule.
    Auto,
}

impl FromStr for Mode {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "lowest" => Mode::Lowest,
            "highest" => Mode::Highest,
            "allow" => Mode::Allow,
            "closest" => Mode::Closest,
            "average" => Mode::Average,
            "best" => Mode::Best,
            "per_block" => Mode::PerBlock,
            "per_weight" => Mode::PerWeight,
            "budget" => Mode::Budget,
            "auto" => Mode::Auto,
            _ => {
                return Err(PlanError::Candidate { message: format!(
                    "unknown mode `{s}` (lowest, highest, allow, closest, average, best, per_block, per_weight, budget, auto)"
                ) })
            }
        })
    }
}

/// Quality thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Thresholds {
    /// A lossy candidate is acceptable at this SNR or above (dB; `null` in JSON = exact only).
    #[serde(with = "measure::inf_as_null")]
    pub min_snr_db: f64,
    /// Largest element-wise relative error accepted from `f16`.
    pub eps_fp16: f64,
    /// Largest element-wise relative error accepted from `bf16`.
    pub eps_bf16: f64,
    /// Between equally sized `f16` and `bf16`, take `bf16`.
    pub prefer_bf16: bool,
    /// `ALLOW`: share of blocks that must accept the candidate.
    pub allow_share: f64,
    /// `AVERAGE`: share of blocks that makes a pick the majority.
    pub majority: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            min_snr_db: 30.0,
            eps_fp16: 0.0,
            eps_bf16: 0.0,
            prefer_bf16: false,
            allow_share: 0.7,
            majority: 0.6,
        }
    }
}

impl Thresholds {
    /// `τ`, the largest acceptable relative MSE.
    pub fn max_rel_mse(&self) -> f64 {
        10f64.powf(-self.min_snr_db / 10.0)
    }
}

/// A size target for `BUDGET` and `AUTO`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Average bits per value over all planned tensors.
    Bps(f64),
    /// f32 bytes divided by stored bytes.
    Ratio(f64),
    /// Total stored bytes.
    Bytes(u64),
}

impl Target {
    /// The byte budget for `elements` values.
    pub fn bytes(&self, elements: u64) -> u64 {
        match *self {
            Target::Bps(b) => (b.max(0.0) * elements as f64 / 8.0).floor() as u64,
            Target::Ratio(r) => (4.0 * elements as f64 / r.max(1e-9)).floor() as u64,
            Target::Bytes(b) => b,
        }
    }
}

/// The plan of one tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorPlan {
    /// Tensor name.
    pub name: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// The chosen recipe.
    pub spec: Spec,
    /// Its label.
    pub label: String,
    /// Measured stored bytes of the choice.
    pub bytes: u64,
    /// Measured relative MSE of the choice.
    pub rel_mse: f64,
    /// Measured SNR of the choice (dB; `null` when exact).
    #[serde(with = "measure::inf_as_null")]
    pub snr_db: f64,
    /// Why it won.
    pub reason: String,
    /// Every candidate measured: the planner's, in order, then any the mode built (AUTO's
    /// lattice fitted to the reference error, the `mixed` of PER_BLOCK, the base plus
    /// exceptions of PER_WEIGHT).
    pub candidates: Vec<Measured>,
    /// Candidates that could not encode this tensor, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<(String, String)>,
    /// Per row block, the label of its pick (block modes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<Vec<String>>,
    /// The candidates' recipes (for re-planning under a budget).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidate_specs: Vec<Spec>,
    /// The sums of the choice on the whole tensor, when it was measured there (not stored).
    #[serde(skip)]
    pub sums: Option<measure::Sums>,
    /// When set, `candidates` were measured on this many evenly spaced rows and only the
    /// choice on the whole tensor (`bytes`, `rel_mse`, `snr_db`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screened_rows: Option<u64>,
}

impl TensorPlan {
    /// Number of values (saturating at `u64::MAX`: a plan read from JSON may hold any shape).
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }
}

/// The plan of a model: what every tensor gets and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Plan format version (1).
    pub version: u32,
    /// The mode.
    pub mode: Mode,
    /// The thresholds.
    pub thresholds: Thresholds,
    /// The size target, if any.
    #[serde(default)]
    pub target: Option<Target>,
    /// Rows per block of the block modes.
    pub block_rows: u64,
    /// Per tensor.
    pub tensors: Vec<TensorPlan>,
}

/// `x` rounded to 7 significant digits (what a report needs; JSON then prints it short).
fn round7(x: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    format!("{x:.6e}").parse().unwrap_or(x)
}

impl Plan {
    /// The plan as an archive stores it: every tensor's choice, reason and every candidate's
    /// measurement (to 7 significant digits), without the candidates' recipes that only
    /// re-planning needs (`hypercodec plan` prints the full plan). Under BUDGET that is about
    /// half the bytes (the synthetic CNN's manifest: 365 KB → 230 KB).
    pub fn for_archive(&self) -> Plan {
        let mut p = self.clone();
        for t in &mut p.tensors {
            t.candidate_specs.clear();
            t.rel_mse = round7(t.rel_mse);
            t.snr_db = round7(t.snr_db);
            for c in &mut t.candidates {
                c.bps = round7(c.bps);
                c.rel_mse = round7(c.rel_mse);
                c.snr_db = round7(c.snr_db);
                c.max_rel_err = round7(c.max_rel_err);
                c.sse = round7(c.sse);
            }
        }
        p
    }

    /// Stored bytes of all chosen encodings (as measured).
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }

    /// Values in all tensors.
    pub fn total_elements(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |a, t| a.saturating_add(t.numel()))
    }

    /// The plan of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorPlan> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// The planner: candidates, a mode and thresholds.
#[derive(Debug, Clone)]
pub struct Planner {
    /// The mode.
    pub mode: Mode,
    /// Thresholds.
    pub thresholds: Thresholds,
    /// Candidate recipes, measured on every tensor.
    pub candidates: Vec<Spec>,
    /// Rows per block (block modes, and per-block measurements).
    pub block_rows: u64,
    /// Size target (`BUDGET`, `AUTO`).
    pub target: Option<Target>,
    /// Storage of `PER_WEIGHT` exceptions.
    pub exception_dtype: FloatDtype,
    /// Candidates measured at once: 1 measures them one after the other; more runs them on
    /// the workspace pool (rayon). By default, the pool's thread count.
    pub threads: usize,
    /// `LOWEST`, `HIGHEST`, `BEST`, `AUTO`: measure the candidates on this many evenly spaced
    /// rows of a tensor with more than twice as many, then only the winner on the whole
    /// tensor (its figures in the plan are the whole tensor's). `None`: every candidate on
    /// every row. Default: 512 for `AUTO`, `None` otherwise.
    pub screen_rows: Option<u64>,
    /// Encoder choices applied to every candidate (e.g. [`hypercodec_hwz::LatticeScale`]).
    pub encode_options: hypercodec_hwz::EncodeOptions,
    /// The compression of the archive the plan is written into: candidates' bytes are
    /// counted as its writer stores them (zstd takes nothing off entropy-coded streams and
    /// part of some integer codes). By default, [`Compression::None`](hypercodec_hwz::Compression::None):
    /// the streams' own bytes.
    pub container: hypercodec_hwz::Compression,
}

/// The default candidates: `f32`, `bf16`, `f16`, `int8-row`, `int4`, `e8@4`.
pub const DEFAULT_CANDIDATES: &[&str] = &["f32", "bf16", "f16", "int8-row", "int4", "e8@4"];

/// The parsed candidates `AUTO` always measures (callers add a codebook, low-rank, sparse and
/// a lattice at the target rate where they apply): `bf16`, `int8-row`, `int4-row`, `int4`,
/// `e8@3`, `e8@4`.
pub const AUTO_CANDIDATES: &[&str] = &["bf16", "int8-row", "int4-row", "int4", "e8@3", "e8@4"];

/// The default candidates of `BUDGET`: a rate–distortion ladder, down to one bit per value with
/// one scale per tensor (the floor for narrow tensors, whose per-row scales cost bits).
pub const BUDGET_CANDIDATES: &[&str] = &[
    "bf16",
    "int8-row",
    "int4",
    "int3",
    "int2",
    "e8@2",
    "e8@2.5",
    "e8@3",
    "e8@3.5",
    "e8@4",
    "e8@5",
    "e8@6",
    "int4-tensor",
    "int2-tensor",
    "int1-tensor",
];

impl Planner {
    /// A planner for `mode` with the mode's default candidates.
    pub fn new(mode: Mode) -> Self {
        let names = if mode == Mode::Budget {
            BUDGET_CANDIDATES
        } else {
            DEFAULT_CANDIDATES
        };
        Planner {
            mode,
            thresholds: Thresholds::default(),
            candidates: names
                .iter()
                .map(|n| Spec::parse(n))
                .collect::<Result<_>>()
                .unwrap_or_default(),
            block_rows: 32,
            target: None,
            exception_dtype: FloatDtype::F32,
            threads: rayon::current_num_threads(),
            screen_rows: (mode == Mode::Auto).then_some(512),
            encode_options: hypercodec_hwz::EncodeOptions::default(),
            container: hypercodec_hwz::Compression::None,
        }
    }

    /// Plans one tensor; returns its plan and, except under `BUDGET` (decided across
    /// tensors by [`allocate`]), the chosen encoding.
    pub fn plan_tensor(
        &self,
        name: &str,
        values: &[f32],
        shape: &[u64],
    ) -> Result<(TensorPlan, Option<EncodedTensor>)> {
        modes::plan_tensor(self, name, values, shape)
    }
}

#[cfg(test)]
mod tests;
