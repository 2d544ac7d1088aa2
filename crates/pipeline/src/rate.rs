//! A uniform lattice rate over a whole model (`--encoding lattice --bps B`): B is the average
//! over the encoded tensors, all side information included (the archive's manifest and
//! alignment too, where the model is large enough to carry them), and no tensor aborts the model.
//!
//! The rule, decided from the shapes alone before any tensor is read:
//! 1. A tensor that the lattice cannot serve at the rate ([`lattice_serves`]) — its row scales,
//!    chunk tables and the coarsest useful scale (the calibration's smallest α) already cost
//!    more, or what is left per coded coordinate would do worse than a per-tensor grid —
//!    falls back to affine INT(⌊B⌋ + 2) with a symmetric f16 scale per row, that is per output
//!    channel ([`grid`]; one for the tensor where rows hold fewer than [`ROW_SCALE_MIN_COLS`]
//!    values)
//!    (fewer bits when the budget cannot afford two more): small and narrow tensors such as
//!    3×3 depthwise kernels (9 values per row) and stems. They hold few of the values, so the
//!    extra bits cost the others little, while a coarser grid over such large-magnitude kernels
//!    would dominate the model's noise.
//! 2. The bytes the fallbacks save or overspend are shared by the lattice tensors: each
//!    targets `B' = (B·N − fallback bits) / N_lattice`; a tensor that cannot reach `B'` falls
//!    back too, and `B'` is recomputed.
//! 3. Only a target below what the cheapest choice of every tensor needs is an error, and it
//!    states the smallest reachable average ([`PipelineError::RateUnreachable`]).
//!
//! A route of prefix codes (`--coding prefix-gpu`) has one rung between the two: a tensor
//! whose code lengths (about a kilobyte) the rate cannot carry but whose GPU-shaped rANS model
//! (about a hundred bytes) it can takes the same lattice with [`Coding::RANS_GPU`]
//! ([`rans_gpu_rung`]), which the same runtimes execute, before the grid.
//!
//! A lattice tensor that rate control still cannot fit at encode time (the estimate is from
//! shapes) falls back then, and is reported like the others.

use crate::error::{PipelineError, Result};
use crate::plan::Selection;
use crate::source::TensorSource;
use hypercodec_hwz::{self as hwz, AffineParams, Coding, Encoding, FloatDtype, Group};
use hypercodec_plan::Spec;
use std::collections::HashMap;

/// Margin on the estimated smallest lattice rate (rANS and Rice cost a little more than the
/// symbols' entropy, and a row sample's rate differs from the tensor's).
const FLOOR_MARGIN: f64 = 1.1;

/// What one tensor gets under a model-wide rate.
#[derive(Debug, Clone, PartialEq)]
pub enum RateChoice {
    /// The lattice at a rate.
    Lattice {
        /// Bits per value, all-in.
        bps: f64,
        /// The route's template, or its [`rans_gpu_rung`] where the route's prefix codes do not
        /// serve the tensor.
        template: Encoding,
    },
    /// The fallback encoding, and why.
    Fallback(Encoding),
}

/// The per-tensor choices for a model-wide lattice rate.
#[derive(Debug, Clone)]
pub struct RatePlan {
    /// The model-wide target.
    pub target_bps: f64,
    /// The rate every lattice tensor targets after the fallbacks' bytes are accounted.
    pub lattice_bps: f64,
    /// The fallback's width: ⌊B⌋ + 2 bits, or fewer when the budget is short ([`grid`]).
    pub fallback_bits: u8,
    /// By tensor name.
    pub choices: HashMap<String, RateChoice>,
}

impl RatePlan {
    /// The fallback encoding of a tensor of `shape`: the [`grid`] of the plan's width.
    pub fn fallback(&self, shape: &[u64]) -> Encoding {
        grid(self.fallback_bits, shape)
    }
}

/// Bits the fallback spends beyond ⌊bps⌋: the tensors that fall back are few and small, and
/// their error (a max-scaled grid over each row, often of large-magnitude weights such
/// as depthwise kernels) would otherwise dominate the model's total noise.
pub const FALLBACK_EXTRA_BITS: u8 = 2;

/// The fallback of a tensor of `shape` that the lattice cannot serve at `bps`: the [`grid`] of
/// INT(⌊bps⌋ + [`FALLBACK_EXTRA_BITS`]) bits (at most 8).
pub fn fallback_encoding(bps: f64, shape: &[u64]) -> Encoding {
    grid(fallback_bits(bps), shape)
}

/// The fallback's width at `bps`: ⌊bps⌋ + [`FALLBACK_EXTRA_BITS`], within 1..=8.
fn fallback_bits(bps: f64) -> u8 {
    (bps.floor() as u8)
        .saturating_add(FALLBACK_EXTRA_BITS)
        .clamp(1, 8)
}

/// The fallback of a tensor whose rows a fixed-rate recipe serves badly, and why: rows holding
/// fewer bits than a trellis state (`cols·K < L`), or rows so short that their scale and
/// padding cost a bit per value or more (3×3 depthwise kernels: 9-value trellis rows at 2 bits
/// code at 6 dB for 4.4 bits per value, where a per-tensor INT3 grid gives 11 dB at 3; a
/// one-value row of fixed-rate E8 pads to a word and a scale: 48 bits at 4) — affine
/// INT(K + 2) with a scale per row, or as many of the two extra bits as stay within
/// [`ALONE_OVERSPEND_BYTES`] of K bits a value ([`alone_fallback`]: a 100000×1 column takes
/// INT4 at 4 bits, not INT6). `None` for other recipes and shapes (entropy-coded lattice rates
/// have [`plan_rate`]'s rule).
pub fn narrow_fallback(spec: &Spec, name: &str, shape: &[u64]) -> Option<(Encoding, String)> {
    let Spec::Rate {
        template, max_tile, ..
    } = spec
    else {
        return None;
    };
    let n = crate::numel(shape);
    let (rows, cols) = hwz::matrix_view(shape, n);
    if rows == 0 || cols == 0 {
        return None;
    }
    let k = match *template {
        Encoding::Trellis { l, k, .. } => {
            if cols * (k as u64) < l as u64 {
                let why =
                    format!("rows of {cols} values hold fewer than the {l}-bit trellis state");
                return Some((narrow_grid(name, shape, k as f64), why));
            }
            k as u64
        }
        Encoding::Lattice {
            coding: Coding::Fixed { bits },
            ..
        } => bits as u64,
        _ => return None,
    };
    // Both forms have streams of fixed lengths: the bits, the row scales, the padding.
    let stored_bits =
        exact_bytes(name, shape, &template.for_matrix(rows, cols, *max_tile)).ok()? * 8;
    if stored_bits < n * (k + 1) {
        return None;
    }
    let why =
        format!("rows of {cols} values spend a bit per value or more on their scale and padding");
    Some((narrow_grid(name, shape, k as f64), why))
}

/// [`narrow_fallback`]'s grid at `bps`: [`alone_fallback`]'s, else [`fallback_encoding`]'s.
fn narrow_grid(name: &str, shape: &[u64], bps: f64) -> Encoding {
    alone_fallback(name, shape, bps)
        .ok()
        .flatten()
        .unwrap_or_else(|| fallback_encoding(bps, shape))
}

/// Bytes beyond the rate that the fallback of a tensor quantized alone may spend (one layer at a
/// time, as the Python layers are: no model budget to give the bits back): a small layer still
/// takes the fallback's [`FALLBACK_EXTRA_BITS`] (a 3×3 depthwise kernel of 64 channels: 576
/// values), a large one a grid within the rate.
pub const ALONE_OVERSPEND_BYTES: u64 = 8192;

/// The fallback of a tensor quantized alone at `bps` ([`ALONE_OVERSPEND_BYTES`]): the widest
/// [`grid`] of at most ⌊bps⌋ + [`FALLBACK_EXTRA_BITS`] bits whose bytes exceed the rate
/// by no more than that. `None` where not even INT1 does (a rate below one bit per value on a
/// large tensor).
pub fn alone_fallback(name: &str, shape: &[u64], bps: f64) -> Result<Option<Encoding>> {
    let n = hwz::element_count(name, shape)?;
    let allowed = (bps * n as f64 / 8.0).floor() as u64 + ALONE_OVERSPEND_BYTES;
    for bits in (1..=fallback_bits(bps)).rev() {
        let e = grid(bits, shape);
        if exact_bytes(name, shape, &e)? <= allowed {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// Exact stored bytes of `e` for `shape`, when every stream has a fixed length.
pub(crate) fn exact_bytes(name: &str, shape: &[u64], e: &Encoding) -> Result<u64> {
    Ok(e.stream_lens(name, shape)?.iter().map(|(_, l)| l.min).sum())
}

/// (estimated smallest bytes, side-information bytes, coded coordinates) of the lattice.
fn lattice_cost(
    name: &str,
    shape: &[u64],
    template: &Encoding,
    max_tile: u32,
) -> Option<(u64, u64, u64)> {
    let Encoding::Lattice {
        lattice, coding, ..
    } = *template
    else {
        return None;
    };
    let n = hwz::element_count(name, shape).ok()?;
    let (rows, cols) = hwz::matrix_view(shape, n);
    let e = template
        .for_matrix(rows, cols, max_tile)
        .with_alpha(hypercodec_lattice::calibration::table(lattice)[0][0]);
    let lens = e.stream_lens(name, shape).ok()?;
    let side: u64 = lens
        .iter()
        .filter(|(r, _)| *r != hwz::role::SYMBOLS && *r != hwz::role::MODEL)
        .map(|(_, l)| l.min)
        .sum();
    // A model of a few contexts of short alphabets: about a hundred bytes; prefix codes of
    // pairs store a length for each pair of the two pair alphabets: about a kilobyte.
    let model = match coding {
        Coding::Rans { .. } => 96,
        Coding::Prefix { pair_limit: 0, .. } => 96,
        Coding::Prefix { .. } => 1024,
        _ => 0,
    };
    let symbols = rows * hypercodec_lattice::symbols_per_row(lattice, cols as usize) as u64;
    let entropy = hypercodec_lattice::calibration::table(lattice)[0][2] as f64;
    Some((
        side + model + (symbols as f64 * entropy / 8.0 * FLOOR_MARGIN).ceil() as u64,
        side + model,
        symbols,
    ))
}

/// The GPU-shaped rANS form of a prefix-coded lattice `template` (the same lattice, scale and
/// seed): the rung a tensor takes where the prefix codes cannot serve it (their code lengths
/// cost more than the rate leaves, or its symbols exceed their tables). `None` for any other
/// template.
pub fn rans_gpu_rung(template: &Encoding) -> Option<Encoding> {
    recoded(
        template,
        |c| matches!(c, Coding::Prefix { .. }),
        Coding::RANS_GPU,
    )
}

/// The rung below Rice codes on the same lattice: rANS (CPU-shaped), whose rate reaches lower
/// (Rice spends at least a bit a symbol, so near 1.5 bits a value its rate control finds no
/// scale: 1024² then fell to INT3 at 2.49 bits). `None` for other codings.
pub fn rice_rung(template: &Encoding) -> Option<Encoding> {
    recoded(
        template,
        |c| matches!(c, Coding::Rice { .. }),
        Coding::RANS_DEFAULT,
    )
}

/// The lattice `template` with `to` for a coding that `from` accepts, else `None`.
fn recoded(template: &Encoding, from: impl Fn(&Coding) -> bool, to: Coding) -> Option<Encoding> {
    let mut e = template.clone();
    match &mut e {
        Encoding::Lattice { coding, .. } if from(coding) => *coding = to,
        _ => return None,
    }
    Some(e)
}

/// The lattice template that serves a tensor of `shape` at `bps` ([`lattice_serves`]): the
/// route's `template`, else its [`rans_gpu_rung`]; `None` where the tensor takes the grid
/// fallback.
pub fn serving_template(
    name: &str,
    shape: &[u64],
    template: &Encoding,
    max_tile: u32,
    bps: f64,
) -> Option<Encoding> {
    if lattice_serves(name, shape, template, max_tile, bps) {
        return Some(template.clone());
    }
    rans_gpu_rung(template).filter(|rung| lattice_serves(name, shape, rung, max_tile, bps))
}

/// Why the lattice `template` does not serve a tensor of `shape` at the shared rate `bps`
/// ([`lattice_serves`]'s verdict put in words), for the fallback's line in the report; `None`
/// where it does serve it.
pub fn why_not_served(
    name: &str,
    shape: &[u64],
    template: &Encoding,
    max_tile: u32,
    bps: f64,
) -> Option<String> {
    Some(match unserved(name, shape, template, max_tile, bps)? {
        Unserved::Shape => "the lattice cannot code its shape".into(),
        Unserved::Floor(floor_bps) => format!(
            "its smallest coded size (scales, padding, the coder's least rate) is \
             {floor_bps:.2} bits a value, over the lattice's rate of {bps:.2}"
        ),
        Unserved::Ceiling => format!(
            "the lattice's rate left to it ({bps:.2} bits) is above what its rate control covers"
        ),
        Unserved::BelowGrid => format!(
            "at the lattice's rate of {bps:.2} bits it would score below a per-tensor grid of \
             that rate"
        ),
    })
}

/// Why a lattice does not serve a tensor (see [`lattice_serves`]).
enum Unserved {
    /// No lattice cost for this shape and template.
    Shape,
    /// Its smallest coded size, in bits a value, is over the rate.
    Floor(f64),
    /// The rate is above what the lattice's rate control covers.
    Ceiling,
    /// Its expected SNR is below a per-tensor grid's at the rate.
    BelowGrid,
}

/// Whether the lattice `template` serves a tensor of `shape` at `bps` (the rule [`plan_rate`]
/// applies to every tensor): it must reach the rate by the estimate of the module docs, and
/// its expected SNR there — about 6.02 dB per bit left per coded coordinate once the side
/// information is paid, less 1.5 dB — must not fall below that of the per-tensor grid at
/// the same rate on Gaussian values (`12·(2^k−1)² / (8·ln n)` at k = bps, the grid spanning the largest of
/// `n` values). Narrow tensors (9-value rows padded to 16 coordinates, a 16-bit scale per row)
/// fail it at every rate.
pub fn lattice_serves(
    name: &str,
    shape: &[u64],
    template: &Encoding,
    max_tile: u32,
    bps: f64,
) -> bool {
    unserved(name, shape, template, max_tile, bps).is_none()
}

/// [`lattice_serves`]'s rule: `None` where the lattice serves the tensor, else why not.
fn unserved(
    name: &str,
    shape: &[u64],
    template: &Encoding,
    max_tile: u32,
    bps: f64,
) -> Option<Unserved> {
    let n = shape.iter().product::<u64>().max(1) as f64;
    let Some((floor, side, symbols)) = lattice_cost(name, shape, template, max_tile) else {
        return Some(Unserved::Shape);
    };
    if floor as f64 * 8.0 / n > bps {
        return Some(Unserved::Floor(floor as f64 * 8.0 / n));
    }
    // Above its calibration the lattice's rate control has no scale (a small tensor left
    // alone on the lattice by a low target was given 21.9 bits and failed the archive).
    if let Encoding::Lattice { lattice, .. } = template {
        if bps > hypercodec_lattice::calibration::max_bps(*lattice) {
            return Some(Unserved::Ceiling);
        }
    }
    let per_coordinate = (bps * n - side as f64 * 8.0) / symbols.max(1) as f64;
    let lattice_db = 6.02 * per_coordinate - 1.5;
    // The grid's curve taken at the rate itself, not at ⌊bps⌋: a threshold that fell by 6 dB
    // as the rate crossed below a whole bit (4.0 → 3.95 once the manifest's share came out of
    // it) kept EfficientNet-Lite0's 5×5 depthwise kernels on the lattice at 16 dB.
    let k = bps.clamp(1.0, 8.0);
    let levels = 2f64.powf(k) - 1.0;
    let grid_db = 10.0 * (12.0 * levels * levels / (8.0 * n.max(2.0).ln())).log10();
    (lattice_db < grid_db).then_some(Unserved::BelowGrid)
}

/// Rows shorter than this share one scale in the fallback [`grid`]: a row's f16 scale would
/// cost more than two bits a value.
pub const ROW_SCALE_MIN_COLS: u64 = 8;

/// The fallback grid of a tensor of `shape`: affine INT`bits` with a symmetric f16 scale per
/// row (per output channel), or one for the tensor where rows hold fewer than
/// [`ROW_SCALE_MIN_COLS`] values. Not one scale for every tensor: the channels of a trained
/// depthwise kernel differ in range by orders of magnitude, and one grid over them all decoded
/// 25 to 166 of EfficientNet-Lite0's 22 008 channels as zeros (at 2 to 4 bits) where a scale
/// per channel decodes none, at the same all-in size and within 0.16 dB of the model's SNR.
pub fn grid(bits: u8, shape: &[u64]) -> Encoding {
    let n = crate::numel(shape);
    let (rows, cols) = hwz::matrix_view(shape, n);
    let group = if rows > 1 && cols >= ROW_SCALE_MIN_COLS {
        Group::Row
    } else {
        Group::Tensor
    };
    Encoding::affine(AffineParams {
        bits,
        group,
        symmetric: true,
        scale_dtype: FloatDtype::F16,
    })
}

/// Which tensors stay on the lattice and the rate they share, given the fallbacks' bytes.
fn share(
    tensors: &[(&str, &[u64], u64)],
    floors: &[Option<u64>],
    fallback_bytes: &[u64],
    template: &Encoding,
    max_tile: u32,
    bps: f64,
    budget_bits: f64,
) -> (Vec<bool>, f64) {
    // The rate the lattice tensors share when `on` says which they are.
    let rate_with = |on: &[bool]| -> f64 {
        let (mut fb_bits, mut lat_values) = (0.0, 0u64);
        for (k, t) in tensors.iter().enumerate() {
            if on[k] {
                lat_values += t.2;
            } else {
                fb_bits += fallback_bytes[k] as f64 * 8.0;
            }
        }
        if lat_values == 0 {
            bps
        } else {
            (budget_bits - fb_bits) / lat_values as f64
        }
    };
    // Start with every tensor on the lattice; move the ones it cannot serve at the shared rate.
    let mut on_lattice: Vec<bool> = floors.iter().map(Option::is_some).collect();
    let mut lattice_bps = bps;
    for _ in 0..=tensors.len() {
        lattice_bps = rate_with(&on_lattice);
        let mut moved = false;
        for (k, t) in tensors.iter().enumerate() {
            let serves = floors[k].is_some()
                && serving_template(t.0, t.1, template, max_tile, lattice_bps).is_some();
            if on_lattice[k] && !serves {
                on_lattice[k] = false;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    // Moves only ever went off the lattice, at rates on the way to the final one: where the
    // fallbacks cost less than the lattice's share the rate rose as tensors left, and some
    // that left early would be served now. Bring back, one at a time, each that the rate it
    // leaves still serves together with every tensor on the lattice.
    let serves = |k: usize, rate: f64| {
        serving_template(tensors[k].0, tensors[k].1, template, max_tile, rate).is_some()
    };
    loop {
        let mut back = false;
        for k in 0..tensors.len() {
            if on_lattice[k] || floors[k].is_none() {
                continue;
            }
            on_lattice[k] = true;
            let rate = rate_with(&on_lattice);
            if (0..tensors.len()).all(|j| !on_lattice[j] || serves(j, rate)) {
                lattice_bps = rate;
                back = true;
            } else {
                on_lattice[k] = false;
            }
        }
        if !back {
            break;
        }
    }
    (on_lattice, lattice_bps)
}

/// Decides every selected tensor's encoding for a model-wide `bps` (see the module docs).
pub fn plan_rate(
    source: &TensorSource,
    sel: Selection,
    template: &Encoding,
    max_tile: u32,
    bps: f64,
) -> Result<RatePlan> {
    let tensors: Vec<(&str, &[u64], u64)> = source
        .tensors
        .iter()
        .filter(|t| sel.planned(&t.shape) && t.numel() > 0)
        .map(|t| (t.name.as_str(), t.shape.as_slice(), t.numel()))
        .collect();
    let total: u64 = tensors.iter().map(|t| t.2).sum();
    // A template that codes no shape at all (`--chunk 0`) is the options' error, said as such:
    // not a fallback of every tensor "because the lattice cannot code its shape".
    if let Some((name, _, _)) = tensors.first() {
        template
            .for_matrix(8, 256, max_tile)
            .stream_lens(name, &[8, 256])?;
    }
    // The smallest lattice floor of each tensor, over the route's template and its rung.
    let rung = rans_gpu_rung(template);
    let floors: Vec<Option<u64>> = tensors
        .iter()
        .map(|(name, shape, _)| {
            std::iter::once(template)
                .chain(rung.as_ref())
                .filter_map(|e| lattice_cost(name, shape, e, max_tile).map(|c| c.0))
                .min()
        })
        .collect();
    // The fallback's width: ⌊B⌋ + 2 bits, fewer when the budget cannot afford it (a model of
    // only small tensors has no lattice tensors to give bits back).
    let widest = fallback_bits(bps);
    // For a budget of bits: the widest fallback it affords, the tensors on the lattice and
    // their rate.
    let plan_for = |budget_bits: f64| -> Result<Option<(u8, Vec<bool>, f64)>> {
        if budget_bits < 0.0 {
            return Ok(None);
        }
        for bits in (1..=widest).rev() {
            let fallback_bytes: Vec<u64> = tensors
                .iter()
                .map(|(name, shape, _)| exact_bytes(name, shape, &grid(bits, shape)))
                .collect::<Result<_>>()?;
            let (on_lattice, lattice_bps) = share(
                &tensors,
                &floors,
                &fallback_bytes,
                template,
                max_tile,
                bps,
                budget_bits,
            );
            let spent: f64 = tensors
                .iter()
                .enumerate()
                .map(|(k, t)| {
                    if on_lattice[k] {
                        lattice_bps * t.2 as f64
                    } else {
                        fallback_bytes[k] as f64 * 8.0
                    }
                })
                .sum();
            if spent <= budget_bits * 1.000_001 && lattice_bps > 0.0 {
                return Ok(Some((bits, on_lattice, lattice_bps)));
            }
        }
        Ok(None)
    };
    // All-in (the archive's manifest and alignment, [`crate::plan::unplanned_side_bytes`], the
    // tensors kept raw counted as entries, taken from the lattice tensors' rate) where they
    // are at most a tenth of the budget and taking them moves at most 1 % of the values from
    // the lattice to the grid; near the lattice's floor, where taking them all would (the
    // all-in rate would put every tensor on INT1), as much of them as that rule allows; in a
    // small model the rate is over the tensors' streams.
    let side =
        crate::plan::unplanned_side_bytes(tensors.len(), source.tensors.len() - tensors.len());
    let budget = bps * total as f64;
    let streams = plan_for(budget)?;
    let on = |plan: &(u8, Vec<bool>, f64)| -> u64 {
        tensors
            .iter()
            .zip(&plan.1)
            .filter(|(_, &on)| on)
            .map(|(t, _)| t.2)
            .sum()
    };
    let keeps = |a: &(u8, Vec<bool>, f64)| {
        streams
            .as_ref()
            .is_none_or(|s| a.0 == s.0 && on(a) as f64 >= 0.99 * on(s) as f64)
    };
    let all_in = if side as f64 * 80.0 <= budget {
        match plan_for(budget - side as f64 * 8.0)?.filter(keeps) {
            Some(a) => Some(a),
            None => {
                // Near the lattice's floor: as much of the side as the rule allows (CNN at
                // 1.5 bits: 1.530 bits all-in where it took none).
                let (mut lo, mut hi, mut best) = (0.0, side as f64 * 8.0, None);
                for _ in 0..10 {
                    let mid = (lo + hi) / 2.0;
                    match plan_for(budget - mid)?.filter(keeps) {
                        Some(a) => (lo, best) = (mid, Some(a)),
                        None => hi = mid,
                    }
                }
                best
            }
        }
    } else {
        None
    };
    let Some((fallback_bits, on_lattice, lattice_bps)) = all_in.or(streams) else {
        // The cheapest choice of every tensor: its lattice floor or its INT1 grid.
        let mut least = 0.0;
        for (k, (name, shape, _)) in tensors.iter().enumerate() {
            let fb = exact_bytes(name, shape, &grid(1, shape))?;
            least += floors[k].map_or(fb, |f| f.min(fb)) as f64 * 8.0;
        }
        return Err(PipelineError::RateUnreachable {
            target_bps: bps,
            min_bps: least / total.max(1) as f64,
        });
    };
    let choices = tensors
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let serving = on_lattice[k]
                .then(|| serving_template(t.0, t.1, template, max_tile, lattice_bps))
                .flatten();
            let c = match serving {
                Some(template) => RateChoice::Lattice {
                    bps: lattice_bps,
                    template,
                },
                None => RateChoice::Fallback(grid(fallback_bits, t.1)),
            };
            (t.0.to_string(), c)
        })
        .collect();
    Ok(RatePlan {
        target_bps: bps,
        lattice_bps,
        fallback_bits,
        choices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e8() -> Encoding {
        Encoding::Lattice {
            lattice: hwz::Lattice::E8,
            alpha: 1.0,
            tile: 1,
            seed: 0,
            scale_dtype: FloatDtype::F16,
            coding: Coding::RANS_DEFAULT,
        }
    }

    /// E8 with GPU prefix codes, as a route's template.
    fn e8_prefix() -> Encoding {
        let mut e = e8();
        if let Encoding::Lattice { coding, .. } = &mut e {
            *coding = Coding::PREFIX_GPU;
        }
        e
    }

    #[test]
    fn prefix_codes_step_down_to_gpu_rans_before_the_grid() {
        let (big, small) = ([1024u64, 1024], [100u64, 40]);
        let rung = rans_gpu_rung(&e8_prefix()).expect("a rung");
        assert!(matches!(
            rung,
            Encoding::Lattice {
                coding: Coding::RANS_GPU,
                ..
            }
        ));
        // Only prefix codes have a rung.
        assert_eq!(rans_gpu_rung(&e8()), None);
        // 4000 values at 4 bits: a kilobyte of code lengths is half the budget, a hundred
        // bytes of rANS model is not.
        assert!(!lattice_serves("s", &small, &e8_prefix(), 4096, 4.0));
        assert_eq!(
            serving_template("s", &small, &e8_prefix(), 4096, 4.0),
            Some(rung.clone())
        );
        assert_eq!(
            serving_template("b", &big, &e8_prefix(), 4096, 4.0),
            Some(e8_prefix())
        );
        // 3×3 depthwise rows: neither coding serves them.
        assert_eq!(
            serving_template("d", &[64, 1, 3, 3], &e8_prefix(), 4096, 4.0),
            None
        );

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.safetensors");
        let tensors = vec![
            ("big".to_string(), big.to_vec(), vec![0.1f32; 1 << 20]),
            ("small".to_string(), small.to_vec(), vec![0.1f32; 4000]),
            ("dw".to_string(), vec![64u64, 1, 3, 3], vec![0.1f32; 576]),
        ];
        crate::synth::write_tensors(&path, &tensors).expect("write");
        let source = TensorSource::open(path.to_str().expect("utf-8")).expect("open");
        let p = plan_rate(&source, Selection::default(), &e8_prefix(), 4096, 4.0).expect("plan");
        let lattice = |template| RateChoice::Lattice {
            bps: p.lattice_bps,
            template,
        };
        assert_eq!(p.choices["big"], lattice(e8_prefix()));
        assert_eq!(p.choices["small"], lattice(rung));
        assert!(matches!(p.choices["dw"], RateChoice::Fallback(_)));
        // The depthwise kernel's INT6 (a 16-bit scale per channel) and the manifest are paid by
        // the two lattice tensors alike.
        let fb = 576.0 * 6.0 + 64.0 * 16.0 + crate::plan::unplanned_side_bytes(3, 0) as f64 * 8.0;
        let expected = (4.0 * (576.0 + 4000.0 + 1048576.0) - fb) / (4000.0 + 1048576.0);
        assert!((p.lattice_bps - expected).abs() < 1e-9, "{}", p.lattice_bps);
    }

    #[test]
    fn a_template_that_codes_no_shape_is_refused_not_a_fallback_for_every_tensor() {
        // `--chunk 0` gave every tensor INT3 "because the lattice cannot code its shape".
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.safetensors");
        let tensors = vec![("w".to_string(), vec![64u64, 256], vec![0.1f32; 64 * 256])];
        crate::synth::write_tensors(&path, &tensors).expect("write");
        let source = TensorSource::open(path.to_str().expect("utf-8")).expect("open");
        let mut bad = e8();
        if let Encoding::Lattice { coding, .. } = &mut bad {
            *coding = coding.with_chunk(0);
        }
        let err = plan_rate(&source, Selection::default(), &bad, 4096, 4.0).unwrap_err();
        assert!(
            matches!(
                err,
                PipelineError::Hwz(hwz::HwzError::InvalidEncoding { .. })
            ),
            "{err}"
        );
        assert!(plan_rate(&source, Selection::default(), &e8(), 4096, 4.0).is_ok());
    }

    #[test]
    fn fixed_rate_recipes_fall_back_on_rows_they_serve_badly() {
        let trellis = Spec::trellis(12, 2, 4096, 0).expect("spec");
        let fb = |spec: &Spec, shape: &[u64]| narrow_fallback(spec, "t", shape).map(|(e, _)| e);
        let int4 = |shape: &[u64]| Some(fallback_encoding(2.0, shape));
        // Depthwise 3×3 (9-value rows) and 16-value rows: scale and padding ≥ 1 bit per value.
        assert_eq!(fb(&trellis, &[32, 1, 3, 3]), int4(&[32, 1, 3, 3]));
        assert_eq!(fb(&trellis, &[64, 16]), int4(&[64, 16]));
        // Five values: fewer bits than the state.
        let (_, why) = narrow_fallback(&trellis, "t", &[8, 5]).expect("fallback");
        assert!(why.contains("state"), "{why}");
        // 24 values and more: the trellis (10.7 dB at 2.67 bits against the grid's 4.7 at 2).
        assert_eq!(fb(&trellis, &[64, 24]), None);
        assert_eq!(fb(&trellis, &[16, 8, 3, 3]), None);
        assert_eq!(fb(&trellis, &[0, 9]), None);
        // Fixed-rate E8 at 4 bits: a one-value row is a padded word and a scale (48 bits);
        // rows of 64 spend 4.25 bits; 3×3 kernels pad 9 values to 16 (≥ 5 bits).
        let mut e8_fixed = e8();
        if let Encoding::Lattice { coding, .. } = &mut e8_fixed {
            *coding = Coding::Fixed { bits: 4 };
        }
        let fixed = Spec::Rate {
            template: e8_fixed,
            bps: None,
            max_tile: 4096,
        };
        let int6 = |shape: &[u64]| Some(fallback_encoding(4.0, shape));
        assert_eq!(fb(&fixed, &[300, 1]), int6(&[300, 1]));
        assert_eq!(fb(&fixed, &[32, 1, 3, 3]), int6(&[32, 1, 3, 3]));
        assert_eq!(fb(&fixed, &[300, 64]), None);
        // A large one: only the extra bits that stay within ALONE_OVERSPEND_BYTES (a 100000×1
        // column took INT6 at 4 bits, 25 KB over).
        assert_eq!(fb(&fixed, &[100_000, 1]), Some(grid(4, &[100_000, 1])));
        assert_eq!(fb(&fixed, &[40_000, 1]), Some(grid(5, &[40_000, 1])));
        // Entropy-coded rates have plan_rate's rule instead.
        let rate = Spec::Rate {
            template: e8(),
            bps: Some(4.0),
            max_tile: 4096,
        };
        assert_eq!(fb(&rate, &[300, 1]), None);
    }

    #[test]
    fn a_tensor_alone_falls_back_within_the_rate_unless_it_is_small() {
        let bits = |shape: &[u64], bps: f64| match alone_fallback("t", shape, bps).expect("shape") {
            Some(Encoding::Affine { bits, .. }) => Some(bits),
            None => None,
            Some(e) => panic!("{e:?}"),
        };
        // Small: the two extra bits (a depthwise kernel, a 64 × 128 layer).
        assert_eq!(bits(&[64, 1, 3, 3], 4.0), Some(6));
        assert_eq!(bits(&[64, 128], 1.5), Some(3));
        // Large: the widest grid within the rate (8 KB of slack is 0.06 bits on 1024²).
        assert_eq!(bits(&[1024, 1024], 1.0), Some(1));
        assert_eq!(bits(&[1024, 1024], 4.0), Some(4));
        assert_eq!(bits(&[1024, 1024], 2.5), Some(2));
        // Below one bit per value on a large tensor: nothing fits.
        assert_eq!(bits(&[1024, 1024], 0.5), None);
    }

    #[test]
    fn the_lattice_verdict_does_not_jump_where_the_rate_crosses_a_whole_bit() {
        // Its bar is the per-tensor grid's curve at the rate: with the grid at ⌊bps⌋ it fell
        // 6 dB from 4.01 to 3.99 bits, and 5×5 depthwise kernels (25 values padded to 32
        // coordinates) went from the grid at 27 dB to the lattice at 16.
        let shapes: [&[u64]; 5] = [
            &[672, 1, 5, 5],
            &[1152, 1, 5, 5],
            &[144, 24, 1, 1],
            &[96, 1, 3, 3],
            &[256, 1000],
        ];
        for shape in shapes {
            for k in 2..8 {
                let k = k as f64;
                let below = lattice_serves("t", shape, &e8(), 4096, k - 0.01);
                let above = lattice_serves("t", shape, &e8(), 4096, k + 0.01);
                assert_eq!(below, above, "{shape:?} at {k} bits");
            }
        }
        assert!(!lattice_serves("t", &[672, 1, 5, 5], &e8(), 4096, 3.95));
        assert!(lattice_serves("t", &[256, 1000], &e8(), 4096, 3.95));
    }

    #[test]
    fn no_tensor_left_off_the_lattice_would_be_served_at_the_rate_its_return_leaves() {
        // The CNN's 53 planned shapes (depthwise, pointwise, stem, classifier): at low rates
        // the first pass moves small tensors to the grid while the rate is still low; as the
        // grid's tensors cost less than their share the rate rises, and four of them (at 1.5
        // bits) were left on the grid though the final rate serves them.
        let owned: Vec<(String, Vec<u64>, u64)> = crate::synth::cnn_state_dict(0)
            .into_iter()
            .filter(|t| t.1.len() > 1)
            .map(|t| {
                let n = t.1.iter().product();
                (t.0, t.1, n)
            })
            .collect();
        let tensors: Vec<(&str, &[u64], u64)> = owned
            .iter()
            .map(|t| (t.0.as_str(), t.1.as_slice(), t.2))
            .collect();
        let total: u64 = tensors.iter().map(|t| t.2).sum();
        let floors: Vec<Option<u64>> = tensors
            .iter()
            .map(|t| lattice_cost(t.0, t.1, &e8(), 4096).map(|c| c.0))
            .collect();
        let mut returned = 0;
        for (bps, bits) in [(1.25, 1u8), (1.5, 1), (1.75, 1), (2.0, 2), (3.0, 3)] {
            let fallback: Vec<u64> = tensors
                .iter()
                .map(|t| exact_bytes(t.0, t.1, &grid(bits, t.1)).expect("bytes"))
                .collect();
            let budget = bps * total as f64;
            let (on, rate) = share(&tensors, &floors, &fallback, &e8(), 4096, bps, budget);
            let serves = |k: usize, r: f64| {
                serving_template(tensors[k].0, tensors[k].1, &e8(), 4096, r).is_some()
            };
            assert!((0..on.len()).all(|k| !on[k] || serves(k, rate)), "{bps}");
            // Never above what rate control covers (at 1.25 bits a stem left alone on the
            // lattice was given 21.9 bits, and the archive failed).
            assert!(!on.iter().any(|&o| o) || rate <= 8.05, "{bps}: {rate}");
            for k in (0..on.len()).filter(|&k| !on[k] && floors[k].is_some()) {
                let mut back = on.clone();
                back[k] = true;
                let (mut fb, mut values) = (0.0, 0u64);
                for (j, t) in tensors.iter().enumerate() {
                    if back[j] {
                        values += t.2;
                    } else {
                        fb += fallback[j] as f64 * 8.0;
                    }
                }
                let r = (budget - fb) / values as f64;
                assert!(
                    (0..on.len()).any(|j| back[j] && !serves(j, r)),
                    "{bps} bits: {} would be served at {r}",
                    tensors[k].0
                );
            }
            returned += on.iter().filter(|&&o| o).count();
        }
        assert!(returned > 0);
    }

    #[test]
    fn narrow_kernels_fall_back_and_the_rest_share_the_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.safetensors");
        let tensors = vec![
            (
                "dw.weight".to_string(),
                vec![64u64, 1, 3, 3],
                vec![0.1f32; 576],
            ),
            (
                "pw.weight".to_string(),
                vec![256u64, 64, 1, 1],
                vec![0.1f32; 16384],
            ),
            (
                "fc.weight".to_string(),
                vec![512u64, 256],
                vec![0.1f32; 131072],
            ),
        ];
        crate::synth::write_tensors(&path, &tensors).expect("write");
        let source = TensorSource::open(path.to_str().expect("utf-8")).expect("open");
        let p = plan_rate(&source, Selection::default(), &e8(), 4096, 3.0).expect("plan");
        assert!(matches!(p.choices["dw.weight"], RateChoice::Fallback(_)));
        // Rows of 9 values padded to 16 coordinates with a scale each: the report says so.
        let why = why_not_served("dw.weight", &[64, 1, 3, 3], &e8(), 4096, p.lattice_bps)
            .expect("not served");
        assert!(
            why.starts_with("its smallest coded size (scales, padding"),
            "{why}"
        );
        assert_eq!(
            p.choices["fc.weight"],
            RateChoice::Lattice {
                bps: p.lattice_bps,
                template: e8()
            }
        );
        // INT5 for 576 values with a 16-bit scale for each of the 64 channels costs 5 + 16/9
        // bits, and the archive's manifest and alignment its estimate: the others give that back.
        let fb = 576.0 * 5.0 + 64.0 * 16.0;
        let side = crate::plan::unplanned_side_bytes(3, 0) as f64 * 8.0;
        assert!(side > 8.0 * 2100.0, "{side}");
        let expected = (3.0 * (576.0 + 16384.0 + 131072.0) - fb - side) / (16384.0 + 131072.0);
        assert!((p.lattice_bps - expected).abs() < 1e-9, "{}", p.lattice_bps);
        // One 64×64 tensor cannot carry a manifest of ~1 KB at 2 bits a value: the rate is
        // then over its stream, not refused.
        let one = dir.path().join("one.safetensors");
        crate::synth::write_tensors(
            &one,
            &[("w".to_string(), vec![64u64, 64], vec![0.1f32; 4096])],
        )
        .expect("write");
        let source1 = TensorSource::open(one.to_str().expect("utf-8")).expect("open");
        let p1 = plan_rate(&source1, Selection::default(), &e8(), 4096, 2.0).expect("plan");
        assert_eq!(p1.lattice_bps, 2.0);
        // Two small tensors at 4 bits: taking a ~2 KB manifest from their 3 KB would push the
        // 64×64 one to the grid (INT1); it keeps the lattice at the streams' rate instead.
        let two = dir.path().join("two.safetensors");
        crate::synth::write_tensors(
            &two,
            &[
                ("a".to_string(), vec![32u64, 64], vec![0.1f32; 2048]),
                ("b".to_string(), vec![64u64, 64], vec![0.1f32; 4096]),
            ],
        )
        .expect("write");
        let source2 = TensorSource::open(two.to_str().expect("utf-8")).expect("open");
        let p2 = plan_rate(&source2, Selection::default(), &e8(), 4096, 4.0).expect("plan");
        assert!(
            matches!(p2.choices["b"], RateChoice::Lattice { .. }),
            "{p2:?}"
        );
        // Near the lattice's floor (1.5 bits on 160×960): the manifest's share would take the
        // rate below it and the tensor to INT1; it keeps the lattice at the streams' rate.
        let near = dir.path().join("near.safetensors");
        crate::synth::write_tensors(
            &near,
            &[("w".to_string(), vec![160u64, 960], vec![0.1f32; 153600])],
        )
        .expect("write");
        let source3 = TensorSource::open(near.to_str().expect("utf-8")).expect("open");
        let p3 = plan_rate(&source3, Selection::default(), &e8(), 4096, 1.5).expect("plan");
        assert!(
            matches!(p3.choices["w"], RateChoice::Lattice { .. }),
            "{p3:?}"
        );
        // ... but takes as much of the side as keeps it there (it took none: 1.5 bits).
        assert!(
            p3.lattice_bps < 1.5 && p3.lattice_bps > 1.4,
            "{}",
            p3.lattice_bps
        );
        // Far below what anything can store: an error that names the least reachable rate.
        match plan_rate(&source, Selection::default(), &e8(), 4096, 0.2) {
            Err(PipelineError::RateUnreachable { min_bps, .. }) => {
                assert!(min_bps > 0.2 && min_bps < 3.0, "{min_bps}")
            }
            other => panic!("{other:?}"),
        }
    }
}
