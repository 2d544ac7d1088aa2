//! `BUDGET`: Lagrangian allocation over each tensor's lower convex hull of measured
//! (bytes, distortion) points.

use crate::{Plan, PlanError, Result, Target};
use std::collections::HashMap;

/// Chooses, for every tensor of `plan` (made in `BUDGET` mode), the candidate that minimizes
/// the total weighted distortion `Σ w·SSE` with total stored bytes `≤ target`. `weights` maps
/// tensor names to sensitivity weights (default 1). Returns the bytes used.
pub fn allocate(plan: &mut Plan, target: Target, weights: &HashMap<String, f64>) -> Result<u64> {
    // (A plan's fields are public, and plans are read from JSON: one without candidates would
    // index an empty hull.)
    if let Some(t) = plan.tensors.iter().find(|t| t.candidates.is_empty()) {
        return Err(PlanError::Candidate {
            message: format!("tensor `{}` has no candidates to allocate from", t.name),
        });
    }
    let budget = target.bytes(plan.total_elements());
    // Per tensor: hull points as candidate indices, cheapest first.
    let hulls: Vec<Vec<usize>> = plan
        .tensors
        .iter()
        .map(|t| {
            let w = weights.get(&t.name).copied().unwrap_or(1.0);
            let mut pts: Vec<(u64, f64, usize)> = t
                .candidates
                .iter()
                .enumerate()
                .map(|(i, m)| (m.bytes, w * m.sse, i))
                .collect();
            pts.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
            let mut hull: Vec<(u64, f64, usize)> = Vec::new();
            for p in pts {
                // Drop points that do not lower the distortion.
                if hull.last().is_some_and(|h| p.1 >= h.1) {
                    continue;
                }
                // Keep the hull convex: drop the last point while it lies on or above the
                // segment from its predecessor to `p`.
                while hull.len() >= 2 {
                    let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
                    let s_ab = (a.1 - b.1) / (b.0 - a.0).max(1) as f64;
                    let s_ap = (a.1 - p.1) / (p.0 - a.0).max(1) as f64;
                    if s_ap >= s_ab {
                        hull.pop();
                    } else {
                        break;
                    }
                }
                hull.push(p);
            }
            hull.into_iter().map(|h| h.2).collect()
        })
        .collect();
    let mut at = vec![0usize; hulls.len()];
    let bytes_of = |t: usize, h: usize| plan.tensors[t].candidates[hulls[t][h]].bytes;
    let dist_of = |t: usize, h: usize| {
        let w = weights.get(&plan.tensors[t].name).copied().unwrap_or(1.0);
        w * plan.tensors[t].candidates[hulls[t][h]].sse
    };
    let mut total: u64 = (0..hulls.len()).fold(0u64, |a, t| a.saturating_add(bytes_of(t, 0)));
    if total > budget {
        return Err(PlanError::BudgetTooSmall {
            budget,
            cheapest: total,
            min_bps: total as f64 * 8.0 / plan.total_elements().max(1) as f64,
        });
    }
    let mut open: Vec<bool> = hulls.iter().map(|h| h.len() > 1).collect();
    loop {
        // The upgrade with the largest distortion drop per byte among those that fit.
        let mut best: Option<(f64, usize)> = None;
        for t in 0..hulls.len() {
            if !open[t] {
                continue;
            }
            let db = bytes_of(t, at[t] + 1) - bytes_of(t, at[t]);
            if total + db > budget {
                open[t] = false;
                continue;
            }
            let slope = (dist_of(t, at[t]) - dist_of(t, at[t] + 1)) / db.max(1) as f64;
            if best.is_none_or(|(s, _)| slope > s) {
                best = Some((slope, t));
            }
        }
        let Some((_, t)) = best else { break };
        total += bytes_of(t, at[t] + 1) - bytes_of(t, at[t]);
        at[t] += 1;
        open[t] = at[t] + 1 < hulls[t].len();
    }
    for (t, tp) in plan.tensors.iter_mut().enumerate() {
        let i = hulls[t][at[t]];
        let m = &tp.candidates[i];
        tp.spec = tp
            .candidate_specs
            .get(i)
            .cloned()
            .ok_or_else(|| PlanError::Candidate {
                message: format!("tensor `{}`: plan has no candidate recipes", tp.name),
            })?;
        tp.label = m.label.clone();
        tp.bytes = m.bytes;
        tp.rel_mse = m.rel_mse;
        tp.snr_db = m.snr_db;
        tp.sums = Some(m.sums);
        tp.reason = format!(
            "budget {budget} bytes: hull point {} of {} (marginal allocation)",
            at[t] + 1,
            hulls[t].len()
        );
    }
    plan.target = Some(target);
    Ok(total)
}
