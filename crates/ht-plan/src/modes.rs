//! Measuring every candidate of a tensor and choosing by mode.

use crate::measure::{decode, energies, measure, Measured};
use crate::{Mode, PlanError, Planner, Result, Spec, TensorPlan};
use hypercodec_hwz::{EncodeOptions, EncodedTensor, Encoding, FloatDtype};
use std::cmp::Ordering;

/// The tensor being planned: everything a candidate's measurement takes besides the candidate.
#[derive(Clone, Copy)]
struct Subject<'a> {
    name: &'a str,
    values: &'a [f32],
    shape: &'a [u64],
    /// Values per row block.
    block_len: usize,
    /// The tensor's signal energy.
    energy: f64,
    options: EncodeOptions,
    container: hypercodec_hwz::Compression,
}

impl<'a> Subject<'a> {
    /// The tensor `values` (rows of `cols`) as planned by `p`, and its row blocks' energies.
    fn new(
        p: &Planner,
        name: &'a str,
        values: &'a [f32],
        shape: &'a [u64],
        cols: usize,
    ) -> (Self, Vec<f64>) {
        let block_len = (p.block_rows.max(1) as usize).saturating_mul(cols);
        let (block_e, energy) = energies(values, block_len);
        let sub = Subject {
            name,
            values,
            shape,
            block_len,
            energy,
            options: p.encode_options,
            container: p.container,
        };
        (sub, block_e)
    }

    /// Encodes with `spec`, decodes and measures ([`measure`]).
    fn measure(&self, spec: &Spec) -> Result<(Measured, EncodedTensor)> {
        measure(
            self.name,
            self.values,
            self.shape,
            spec,
            self.block_len,
            self.energy,
            self.options,
            self.container,
        )
    }
}

/// How acceptability is judged for a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    F32,
    F16,
    Bf16,
    /// Affine or lattice: encodes any row block on its own.
    Lossy,
    /// Codebook, low-rank, sparse: learned from the whole tensor.
    Learned,
}

fn kind(spec: &Spec) -> Kind {
    match spec {
        Spec::Fixed {
            encoding: Encoding::Raw { dtype },
        } => match dtype {
            FloatDtype::F32 => Kind::F32,
            FloatDtype::F16 => Kind::F16,
            FloatDtype::Bf16 => Kind::Bf16,
        },
        Spec::Fixed {
            encoding: Encoding::Affine { .. } | Encoding::Lattice { .. },
        }
        | Spec::Rate { .. } => Kind::Lossy,
        _ => Kind::Learned,
    }
}

/// Runs `f(i)` for `i in 0..n`, results in order: on the workspace's pool (rayon's global
/// pool) unless `threads` is 1. A worker's panic is resumed on the caller.
fn parallel<T: Send>(threads: usize, n: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    use rayon::prelude::*;
    if threads <= 1 || n <= 1 {
        return (0..n).map(f).collect();
    }
    (0..n).into_par_iter().map(f).collect()
}

struct Cand {
    spec: Spec,
    m: Measured,
    t: Option<EncodedTensor>,
}

struct Ctx<'a> {
    p: &'a Planner,
    c: Vec<Cand>,
    block_e: Vec<f64>,
    tau: f64,
}

impl Ctx<'_> {
    fn accept_with(&self, i: usize, rel_mse: f64, max_rel: f64) -> bool {
        let th = &self.p.thresholds;
        match kind(&self.c[i].spec) {
            Kind::F32 => true,
            Kind::F16 => max_rel <= th.eps_fp16,
            Kind::Bf16 => max_rel <= th.eps_bf16,
            Kind::Lossy | Kind::Learned => rel_mse <= self.tau,
        }
    }

    fn accept(&self, i: usize) -> bool {
        let m = &self.c[i].m;
        self.accept_with(i, m.rel_mse, m.max_rel_err)
    }

    fn accept_block(&self, i: usize, j: usize) -> bool {
        let m = &self.c[i].m;
        let e = self.block_e[j];
        let rel = if e > 0.0 {
            m.block_sse[j] / e
        } else {
            m.block_sse[j]
        };
        self.accept_with(i, rel, m.block_max_rel[j])
    }

    /// Cheapest first: bytes, then error, then the preferred half-precision type.
    fn cheaper(&self, a: usize, b: usize) -> Ordering {
        let (ma, mb) = (&self.c[a].m, &self.c[b].m);
        let pref = |i: usize| match (kind(&self.c[i].spec), self.p.thresholds.prefer_bf16) {
            (Kind::Bf16, true) | (Kind::F16, false) => 0,
            (Kind::Bf16, false) | (Kind::F16, true) => 1,
            _ => 0,
        };
        ma.bytes
            .cmp(&mb.bytes)
            .then(ma.rel_mse.total_cmp(&mb.rel_mse))
            .then(pref(a).cmp(&pref(b)))
    }

    fn more_accurate(&self, a: usize, b: usize) -> Ordering {
        self.c[a]
            .m
            .rel_mse
            .total_cmp(&self.c[b].m.rel_mse)
            .then(self.c[a].m.bytes.cmp(&self.c[b].m.bytes))
    }

    fn min_by(
        &self,
        it: impl Iterator<Item = usize>,
        f: impl Fn(usize, usize) -> Ordering,
    ) -> Option<usize> {
        it.min_by(|&a, &b| f(a, b))
    }

    fn all(&self) -> impl Iterator<Item = usize> + '_ {
        0..self.c.len()
    }

    fn lowest(&self) -> usize {
        self.min_by(self.all(), |a, b| self.cheaper(a, b))
            .unwrap_or(0)
    }

    fn highest(&self) -> usize {
        self.min_by(self.all(), |a, b| self.more_accurate(a, b))
            .unwrap_or(0)
    }

    fn best(&self) -> (usize, String) {
        match self.min_by(self.all().filter(|&i| self.accept(i)), |a, b| {
            self.cheaper(a, b)
        }) {
            Some(i) => (i, "cheapest acceptable candidate".into()),
            None => (
                self.highest(),
                "no candidate acceptable: most accurate".into(),
            ),
        }
    }

    /// Each block's pick: its cheapest acceptable candidate, else its most accurate.
    fn block_picks(&self, eligible: &dyn Fn(usize) -> bool) -> Vec<usize> {
        (0..self.block_e.len())
            .map(|j| {
                self.min_by(
                    self.all()
                        .filter(|&i| eligible(i) && self.accept_block(i, j)),
                    |a, b| self.cheaper(a, b),
                )
                .or_else(|| {
                    self.min_by(self.all().filter(|&i| eligible(i)), |a, b| {
                        self.c[a].m.block_sse[j]
                            .total_cmp(&self.c[b].m.block_sse[j])
                            .then(self.c[a].m.bytes.cmp(&self.c[b].m.bytes))
                    })
                })
                .unwrap_or(0)
            })
            .collect()
    }
}

pub(crate) fn plan_tensor(
    p: &Planner,
    name: &str,
    values: &[f32],
    shape: &[u64],
) -> Result<(TensorPlan, Option<EncodedTensor>)> {
    if values.is_empty() {
        return plan_empty(p, name, shape);
    }
    let cols = hypercodec_hwz::matrix_view(shape, values.len() as u64)
        .1
        .max(1) as usize;
    let rows = values.len() / cols;
    let screen = p
        .screen_rows
        .filter(|&m| m > 0 && m.checked_mul(2).is_some_and(|twice| rows as u64 > twice))
        .filter(|_| {
            matches!(
                p.mode,
                Mode::Lowest | Mode::Highest | Mode::Best | Mode::Auto
            )
        });
    let Some(m) = screen else {
        return plan_full(p, name, values, shape);
    };
    // Screening: every candidate on `m` evenly spaced rows, then the winner on all of them.
    let stride = rows / m as usize;
    let sample: Vec<f32> = values
        .chunks_exact(cols)
        .step_by(stride)
        .take(m as usize)
        .flatten()
        .copied()
        .collect();
    let (sp, _) = plan_full(p, name, &sample, &[m, cols as u64])?;
    let (sub, _) = Subject::new(p, name, values, shape, cols);
    let (full, t) = sub.measure(&sp.spec)?;
    if let (Mode::Auto, Some(target)) = (p.mode, p.target) {
        if full.bytes > target.bytes(values.len() as u64) {
            // The sample misjudged the size: measure everything on the whole tensor.
            return plan_full(p, name, values, shape);
        }
    }
    Ok((
        TensorPlan {
            name: name.to_string(),
            shape: shape.to_vec(),
            spec: sp.spec,
            label: full.label,
            bytes: full.bytes,
            rel_mse: full.rel_mse,
            snr_db: full.snr_db,
            reason: format!("{} (candidates measured on {m} of {rows} rows)", sp.reason),
            candidates: sp.candidates,
            skipped: sp.skipped,
            blocks: None,
            candidate_specs: Vec::new(),
            sums: Some(full.sums),
            screened_rows: Some(m),
        },
        Some(t),
    ))
}

/// A tensor without values (a zero dimension): raw f32, zero bytes, exact, in every mode; no
/// row blocks to pick for.
fn plan_empty(
    p: &Planner,
    name: &str,
    shape: &[u64],
) -> Result<(TensorPlan, Option<EncodedTensor>)> {
    let spec = Spec::fixed(Encoding::Raw {
        dtype: FloatDtype::F32,
    });
    let (m, t) = measure(
        name,
        &[],
        shape,
        &spec,
        1,
        0.0,
        p.encode_options,
        p.container,
    )?;
    let budget = p.mode == Mode::Budget;
    let plan = TensorPlan {
        name: name.to_string(),
        shape: shape.to_vec(),
        spec: spec.clone(),
        label: m.label.clone(),
        bytes: m.bytes,
        rel_mse: m.rel_mse,
        snr_db: m.snr_db,
        reason: "no values: stored raw".into(),
        sums: Some(m.sums),
        candidates: vec![m],
        skipped: Vec::new(),
        blocks: None,
        candidate_specs: if budget { vec![spec] } else { Vec::new() },
        screened_rows: None,
    };
    Ok((plan, (!budget).then_some(t)))
}

fn plan_full(
    p: &Planner,
    name: &str,
    values: &[f32],
    shape: &[u64],
) -> Result<(TensorPlan, Option<EncodedTensor>)> {
    let cols = hypercodec_hwz::matrix_view(shape, values.len() as u64)
        .1
        .max(1) as usize;
    let (sub, block_e) = Subject::new(p, name, values, shape, cols);
    let mut specs = p.candidates.clone();
    let int4_row = Spec::parse("int4-row")?;
    if p.mode == Mode::Auto && !specs.contains(&int4_row) {
        specs.push(int4_row.clone());
    }
    // BUDGET decides later, across tensors: keep the measurements, not the encodings.
    let keep = p.mode != Mode::Budget;
    let results = parallel(p.threads, specs.len(), |i| {
        sub.measure(&specs[i]).map(|(m, t)| (m, keep.then_some(t)))
    });
    let mut c = Vec::new();
    let mut skipped = Vec::new();
    for (spec, r) in specs.iter().zip(results) {
        match r {
            Ok((m, t)) => c.push(Cand {
                spec: spec.clone(),
                m,
                t,
            }),
            Err(e) => skipped.push((spec.label(), e.to_string())),
        }
    }
    if c.is_empty() {
        return Err(PlanError::NoCandidate {
            tensor: name.into(),
            reasons: skipped
                .iter()
                .map(|(l, e)| format!("{l}: {e}"))
                .collect::<Vec<_>>()
                .join("; "),
        });
    }
    let mut ctx = Ctx {
        p,
        c,
        block_e,
        tau: p.thresholds.max_rel_mse(),
    };
    let n = values.len() as u64;
    let mut blocks = None;
    let (pick, reason) = match p.mode {
        Mode::Lowest => (ctx.lowest(), "fewest bytes".to_string()),
        Mode::Highest => (ctx.highest(), "lowest error".to_string()),
        Mode::Best => ctx.best(),
        Mode::Allow => {
            let nb = ctx.block_e.len().max(1) as f64;
            let share = |i: usize| {
                (0..ctx.block_e.len())
                    .filter(|&j| ctx.accept_block(i, j))
                    .count() as f64
                    / nb
            };
            match ctx.min_by(
                ctx.all().filter(|&i| share(i) >= p.thresholds.allow_share),
                |a, b| ctx.cheaper(a, b),
            ) {
                Some(i) => (
                    i,
                    format!(
                        "cheapest acceptable on {:.0} % of blocks (≥ {:.0} %)",
                        100.0 * share(i),
                        100.0 * p.thresholds.allow_share
                    ),
                ),
                None => {
                    let (i, r) = ctx.best();
                    (i, format!("no candidate reaches the block share; {r}"))
                }
            }
        }
        Mode::Closest | Mode::Average => {
            let picks = ctx.block_picks(&|_| true);
            blocks = Some(picks.iter().map(|&i| ctx.c[i].m.label.clone()).collect());
            let mut sorted = picks.clone();
            sorted.sort_by(|&a, &b| ctx.cheaper(a, b));
            if p.mode == Mode::Closest {
                (
                    sorted[sorted.len() / 2],
                    "median of the blocks' picks".into(),
                )
            } else {
                let mut counts = vec![0usize; ctx.c.len()];
                picks.iter().for_each(|&i| counts[i] += 1);
                let (top, cnt) = counts
                    .iter()
                    .enumerate()
                    .max_by_key(|&(_, c)| *c)
                    .map(|(i, c)| (i, *c))
                    .unwrap_or((0, 0));
                if cnt as f64 > p.thresholds.majority * picks.len() as f64 {
                    (top, format!("pick of {cnt} of {} blocks", picks.len()))
                } else {
                    let mean =
                        picks.iter().map(|&i| ctx.c[i].m.bps).sum::<f64>() / picks.len() as f64;
                    let i = ctx
                        .min_by(ctx.all(), |a, b| {
                            let (da, db) =
                                ((ctx.c[a].m.bps - mean).abs(), (ctx.c[b].m.bps - mean).abs());
                            da.total_cmp(&db)
                                .then(ctx.c[b].m.bytes.cmp(&ctx.c[a].m.bytes))
                        })
                        .unwrap_or(0);
                    (
                        i,
                        format!("no majority: nearest the blocks' mean of {mean:.2} bps"),
                    )
                }
            }
        }
        Mode::Auto => {
            let reference = ctx
                .c
                .iter()
                .position(|c| c.spec == int4_row)
                .map(|i| ctx.c[i].m.rel_mse);
            match (p.target, reference) {
                (Some(t), _) => {
                    let budget = t.bytes(n);
                    match ctx.min_by(ctx.all().filter(|&i| ctx.c[i].m.bytes <= budget), |a, b| {
                        ctx.more_accurate(a, b)
                    }) {
                        Some(i) => (i, format!("most accurate within {budget} bytes")),
                        None => (
                            ctx.lowest(),
                            format!("nothing fits {budget} bytes: fewest bytes"),
                        ),
                    }
                }
                (None, Some(r)) => {
                    // A lattice fitted to the reference's error: from the lattice candidate
                    // nearest to it, at 6.02 dB per bit (MSE ∝ 2^(−2R)).
                    let matched = ctx
                        .all()
                        .filter_map(|i| match &ctx.c[i].spec {
                            Spec::Rate {
                                template,
                                bps: Some(b),
                                max_tile,
                            } if ctx.c[i].m.rel_mse > 0.0 => Some((
                                (ctx.c[i].m.rel_mse / r).log2().abs(),
                                template.clone(),
                                *b + (ctx.c[i].m.rel_mse / r).log2() / 2.0,
                                *max_tile,
                            )),
                            _ => None,
                        })
                        .min_by(|a, b| a.0.total_cmp(&b.0));
                    if let Some((_, template, bps, max_tile)) = matched {
                        let bps = (bps * 1000.0).floor() / 1000.0;
                        let spec = Spec::Rate {
                            template,
                            bps: Some(bps),
                            max_tile,
                        };
                        if (0.5..=12.0).contains(&bps) && !ctx.c.iter().any(|c| c.spec == spec) {
                            if let Ok((m, t)) = sub.measure(&spec) {
                                ctx.c.push(Cand {
                                    spec,
                                    m,
                                    t: Some(t),
                                });
                            }
                        }
                    }
                    match ctx.min_by(
                        ctx.all().filter(|&i| ctx.c[i].m.rel_mse <= 1.05 * r),
                        |a, b| ctx.cheaper(a, b),
                    ) {
                        Some(i) => (
                            i,
                            format!("cheapest with rel-MSE ≤ 1.05 × int4-row ({r:.3e})"),
                        ),
                        None => ctx.best(),
                    }
                }
                (None, None) => ctx.best(),
            }
        }
        Mode::Budget => (
            ctx.lowest(),
            "provisional: cheapest (the budget decides)".into(),
        ),
        Mode::PerBlock => {
            let picks = ctx.block_picks(&|i| kind(&ctx.c[i].spec) != Kind::Learned);
            blocks = Some(picks.iter().map(|&i| ctx.c[i].m.label.clone()).collect());
            if picks.iter().all(|&i| i == picks[0]) {
                (picks[0], "every block picks it".into())
            } else {
                let spec = Spec::Mixed {
                    block_rows: p.block_rows,
                    parts: picks.iter().map(|&i| ctx.c[i].spec.clone()).collect(),
                };
                let (m, t) = sub.measure(&spec)?;
                ctx.c.push(Cand {
                    spec,
                    m,
                    t: Some(t),
                });
                (
                    ctx.c.len() - 1,
                    "each block's cheapest acceptable candidate".into(),
                )
            }
        }
        Mode::PerWeight => per_weight(&mut ctx, &sub)?,
    };
    let winner = &mut ctx.c[pick];
    let t = if p.mode == Mode::Budget {
        None
    } else {
        winner.t.take()
    };
    let plan = TensorPlan {
        name: name.to_string(),
        shape: shape.to_vec(),
        spec: winner.spec.clone(),
        label: winner.m.label.clone(),
        bytes: winner.m.bytes,
        rel_mse: winner.m.rel_mse,
        snr_db: winner.m.snr_db,
        reason,
        candidates: ctx.c.iter().map(|c| c.m.clone()).collect(),
        skipped,
        blocks,
        candidate_specs: if p.mode == Mode::Budget {
            ctx.c.iter().map(|c| c.spec.clone()).collect()
        } else {
            Vec::new()
        },
        sums: Some(ctx.c[pick].m.sums),
        screened_rows: None,
    };
    Ok((plan, t))
}

/// `PER_WEIGHT`: the candidate plus exceptions with the fewest total bytes that reaches `τ`.
fn per_weight(ctx: &mut Ctx<'_>, sub: &Subject<'_>) -> Result<(usize, String)> {
    let (name, values, shape, energy) = (sub.name, sub.values, sub.shape, sub.energy);
    let target = ctx.tau * energy;
    let dsize = ctx.p.exception_dtype.size() as f64;
    let n = values.len().max(1) as f64;
    let mut best: Option<(f64, usize, u64)> = None;
    for i in 0..ctx.c.len() {
        let m = &ctx.c[i].m;
        let k = if m.sse <= target {
            0
        } else {
            let Some(t) = &ctx.c[i].t else { continue };
            let out = decode(name, shape, t)?;
            let mut err: Vec<f64> = values
                .iter()
                .zip(&out)
                .map(|(&a, &b)| ((a - b) as f64).powi(2))
                .collect();
            err.sort_unstable_by(|a, b| b.total_cmp(a));
            let mut rest = m.sse;
            let mut k = 0usize;
            while rest > target && k < err.len() {
                rest -= err[k];
                k += 1;
            }
            k as u64
        };
        // Index bytes: one LEB128 gap per exception, gaps of about n/k values.
        let gap_bytes = if k == 0 {
            0.0
        } else {
            ((n / k as f64).log2().max(1.0) / 7.0).ceil()
        };
        let cost = m.bytes as f64 + k as f64 * (dsize + gap_bytes);
        if best.is_none_or(|(c, _, _)| cost < c) {
            best = Some((cost, i, k));
        }
    }
    let (_, i, k) = best.ok_or_else(|| PlanError::Candidate {
        message: "no candidate".into(),
    })?;
    if k == 0 {
        return Ok((i, "cheapest acceptable without exceptions".into()));
    }
    let spec = Spec::Exceptions {
        base: Box::new(ctx.c[i].spec.clone()),
        count: k,
        dtype: ctx.p.exception_dtype,
    };
    let (m, t) = sub.measure(&spec)?;
    let reason = format!("{} plus its {k} worst values exact", ctx.c[i].m.label);
    ctx.c.push(Cand {
        spec,
        m,
        t: Some(t),
    });
    Ok((ctx.c.len() - 1, reason))
}
