//! The compress driver: every route from a [`TensorSource`] to a `.hwz` archive.

use crate::error::{PipelineError, Result};
use crate::plan::{plan_source, Chooser, PlanOptions, Selection};
use crate::progress::{Cancel, Phase, Progress, Tracker};
use crate::source::TensorSource;
use crate::stats::ErrorAcc;
use hypercodec_hwz::{
    self as hwz, AffineParams, Compression, EncodeOptions, Encoding, FileWriter, FloatDtype, Group,
    Manifest, WriterOptions,
};
use hypercodec_plan::{Mode, Plan, Spec};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

/// Values decoded at a time when a written tensor's error is measured.
const STATS_BLOCK_VALUES: usize = 1 << 20;

/// How the encoding of each selected tensor is chosen.
#[derive(Debug, Clone)]
pub enum Route {
    /// The same recipe for every tensor.
    Fixed(Spec),
    /// A planner mode (AUTO, BUDGET with its two passes: measure all, allocate, encode; ...).
    Planner(PlanOptions),
    /// The recipes of a plan (written by `hypercodec plan`), stored in the archive.
    PlanFile(Plan),
}

/// Settings of [`compress`].
#[derive(Debug, Clone)]
pub struct CompressOptions {
    /// How each selected tensor is encoded. By default, affine INT4 in groups of 128 with f16
    /// scales and offsets.
    pub route: Route,
    /// Which tensors are encoded; the others are kept raw in their source type. By default,
    /// every tensor of rank ≥ 2.
    pub selection: Selection,
    /// Store NaN/Inf found in raw-encoded tensors instead of failing. By default, false.
    pub allow_non_finite: bool,
    /// Input statistics per layer: a fixed affine or lattice recipe rounds with error feedback
    /// from them (GPTQ's rule) where the file has the tensor's; the archive records the file's
    /// name. By default, none (calibration-free).
    pub calibration: Option<std::sync::Arc<crate::Calibration>>,
    /// The step of entropy-coded lattice rows (also for a planner's candidates). By default,
    /// each row's own RMS ([`hwz::LatticeScale::Row`]).
    pub lattice_scale: hwz::LatticeScale,
    /// Trellis rows coded by this encoder instead of the CPU's (the same bits; a GPU's, from
    /// the Python wheel). By default, none.
    pub trellis_rows: Option<hwz::TrellisRowsEncoder>,
}

impl Default for CompressOptions {
    fn default() -> Self {
        CompressOptions {
            route: Route::Fixed(Spec::fixed(Encoding::affine(AffineParams {
                bits: 4,
                group: Group::Size(128),
                symmetric: false,
                scale_dtype: FloatDtype::F16,
            }))),
            selection: Selection::default(),
            allow_non_finite: false,
            calibration: None,
            lattice_scale: hwz::LatticeScale::Row,
            trellis_rows: None,
        }
    }
}

/// What [`compress`] did.
#[derive(Debug, Clone)]
pub struct CompressReport {
    /// Tensors written.
    pub tensors: usize,
    /// Tensors of the source left out (not floats).
    pub skipped: usize,
    /// Values written.
    pub elements: u64,
    /// Error over every tensor written (exactly stored ones add no noise, but their signal
    /// would inflate an SNR: quote the archive's lossy totals, [`FileReport::lossy`] or
    /// [`crate::summarize`]'s, instead).
    pub error: ErrorAcc,
    /// Tensors that a model-wide lattice rate could not serve, or whose lossy encoding came
    /// back at an SNR of 0 dB or less (stored raw instead), with what they got and why.
    pub fallbacks: Vec<(String, String)>,
    /// The plan stored in the archive, if a planner or plan file chose.
    pub plan: Option<Plan>,
}

/// The archive's size, after [`compress_to_file`].
#[derive(Debug, Clone)]
pub struct FileReport {
    /// What was written.
    pub report: CompressReport,
    /// Bytes of every stream as stored.
    pub payload_bytes: u64,
    /// Bytes of the file.
    pub file_bytes: u64,
    /// Seconds from the call to the rename.
    pub seconds: f64,
    /// The lossy tensors as the archive stores them (the same figures `inspect` shows).
    pub lossy: Option<crate::LossyTotals>,
    /// Lossy tensors without a finite SNR (`Totals::lossy_without_snr`).
    pub lossy_without_snr: usize,
}

impl FileReport {
    /// Stream bits per value.
    pub fn bps(&self) -> f64 {
        self.payload_bytes as f64 * 8.0 / self.report.elements.max(1) as f64
    }
}

/// Bytes of the tensors' streams of a manifest as stored: every stream but the stored plan's
/// (which `inspect` counts beside the manifest, as the side information it is).
pub fn payload_bytes(m: &Manifest) -> u64 {
    m.streams
        .iter()
        .enumerate()
        .filter(|(i, _)| m.plan_stream != Some(*i as u64))
        .map(|(_, s)| s.length)
        .sum()
}

/// Encodes every tensor of `source` into `writer` (source metadata, skipped tensors and the
/// plan included). `progress` hears of every tensor; `cancel` is checked before each one.
/// The caller finishes the writer.
pub fn compress(
    source: &TensorSource,
    options: &CompressOptions,
    writer: &mut dyn crate::shards::ArchiveSink,
    progress: &mut dyn FnMut(Progress<'_>),
    cancel: &Cancel,
) -> Result<CompressReport> {
    let total = source.total_elements();
    let sel = options.selection;
    let opts = EncodeOptions {
        allow_non_finite: options.allow_non_finite,
        lattice_scale: options.lattice_scale,
        trellis_rows: options.trellis_rows,
    };
    let chooser = match &options.route {
        Route::Planner(p) => Some(Chooser::new(PlanOptions {
            encode_options: opts,
            ..p.clone()
        })?),
        _ => None,
    };
    // BUDGET decides across tensors: measure every tensor first, then encode the choices.
    let mut plan = match (&chooser, &options.route) {
        (Some(c), _) if c.mode() == Mode::Budget => Some(plan_source(
            source,
            c,
            sel,
            &mut |p| {
                progress(Progress {
                    phase: Phase::Measure,
                    ..p
                })
            },
            cancel,
        )?),
        (Some(c), _) => Some(c.empty_plan()),
        (None, Route::PlanFile(p)) => {
            check_plan(p, source, sel)?;
            Some(p.clone())
        }
        _ => None,
    };
    let replay = matches!(options.route, Route::PlanFile(_))
        || chooser.as_ref().is_some_and(|c| c.mode() == Mode::Budget);
    for (k, v) in &source.metadata {
        writer.insert_metadata(k, v.clone());
    }
    if !source.skipped.is_empty() {
        let skipped: Vec<Value> = source
            .skipped
            .iter()
            .map(|s| json!({"name": s.name, "dtype": s.dtype}))
            .collect();
        writer.insert_metadata("skipped_tensors", Value::Array(skipped));
    }
    // A model-wide lattice rate: decided from the shapes before any tensor is read.
    let rate_plan = match &options.route {
        Route::Fixed(Spec::Rate {
            template: template @ Encoding::Lattice { coding, .. },
            max_tile,
            bps: Some(bps),
        }) if !matches!(coding, hwz::Coding::Fixed { .. }) => Some(crate::rate::plan_rate(
            source, sel, template, *max_tile, *bps,
        )?),
        _ => None,
    };
    // What the rate plan gave the tensors written so far less what they took (container zstd
    // shrinks the fallback grids; rate control lands under its target), in bits: handed on to
    // the lattice tensors still to come, in proportion to their values.
    let mut surplus_bits = 0.0f64;
    let mut lattice_left: u64 = rate_plan.as_ref().map_or(0, |rp| {
        source
            .tensors
            .iter()
            .filter(|t| {
                sel.planned(&t.shape)
                    && matches!(
                        rp.choices.get(&t.name),
                        Some(crate::rate::RateChoice::Lattice { .. })
                    )
            })
            .map(|t| t.numel())
            .sum()
    });
    let mut fallbacks = Vec::new();
    let mut acc = ErrorAcc::default();
    let mut bar = Tracker::new(Phase::Compress, total, progress);
    let calibration = options.calibration.as_deref();
    let mut calibrated = 0usize;
    for (i, t) in source.tensors.iter().enumerate() {
        cancel.check()?;
        let values = source.read(i)?;
        // A spec's encoding, with error feedback where calibration statistics are given; where
        // prefix codes cannot hold the tensor's symbols (they have no escapes), GPU-shaped rANS.
        let cols = hwz::matrix_view(&t.shape, values.len() as u64).1;
        let mut unfit = None;
        let mut encode = |spec: &Spec| {
            let mut go = |spec: &Spec| {
                encode_spec(
                    spec,
                    &t.name,
                    &values,
                    &t.shape,
                    opts,
                    calibration,
                    &mut calibrated,
                )
            };
            match (go(spec), prefix_fallback(spec, cols)) {
                (Err(e), Some(fallback)) if prefix_unfit(&e) => {
                    if let hypercodec_plan::PlanError::Hwz(hwz::HwzError::Coding {
                        source, ..
                    }) = e
                    {
                        unfit = Some(source);
                    }
                    go(&fallback)
                }
                (other, _) => other,
            }
        };
        // The planner measured its choice on this very encoding: its sums replace a decode.
        let mut measured = None;
        // Bits the rate plan gives this lattice tensor (before its share of the surplus).
        let mut given_bits = None;
        let mut encoded = if !sel.planned(&t.shape) {
            let raw = Encoding::Raw {
                dtype: t.ty.raw_dtype(),
            };
            hwz::encode(&t.name, &values, &t.shape, &raw, opts)?
        } else if let (true, Some(p)) = (replay, &plan) {
            let tp = p.tensor(&t.name).ok_or_else(|| PipelineError::NotInPlan {
                tensor: t.name.clone(),
            })?;
            // A plan's (or BUDGET's) choice, rounded with error feedback when calibration
            // statistics are given: the same format and, but for entropy coding, the same bytes.
            encode(&tp.spec)?
        } else if let (Some(c), Some(p)) = (&chooser, &mut plan) {
            let (tp, enc) = c.plan_tensor(&t.name, &values, &t.shape)?;
            let enc = match enc {
                Some(e) => {
                    measured = tp.sums;
                    e
                }
                None => tp.spec.encode(&t.name, &values, &t.shape, opts)?,
            };
            p.tensors.push(tp);
            enc
        } else if let (
            Some(rp),
            Route::Fixed(Spec::Rate {
                template, max_tile, ..
            }),
        ) = (&rate_plan, &options.route)
        {
            let fallback = |why: &str, fallbacks: &mut Vec<(String, String)>| {
                let e = rp.fallback(&t.shape);
                fallbacks.push((t.name.clone(), format!("{} ({why})", e.label())));
                hwz::encode(&t.name, &values, &t.shape, &e, opts)
            };
            match rp.choices.get(&t.name) {
                Some(crate::rate::RateChoice::Lattice {
                    bps,
                    template: chosen,
                }) => {
                    // The plan's rate and this tensor's share of the surplus, within what
                    // the lattice's rate control covers.
                    let n = t.numel();
                    // At most a bit a value, or up to the model's target where the plan put
                    // this tensor further below it (a grid that holds most of the values and
                    // that zstd shrank: a 100000×1 column took 2.9 of its 4 planned bits): a
                    // surplus that accrues late would otherwise pile onto the last few small
                    // tensors (4.8 bits where the large layer had 1.9).
                    let cap = (rp.target_bps - *bps).max(1.0);
                    let share = (surplus_bits.max(0.0) / lattice_left.max(1) as f64).min(cap);
                    let ceiling = match chosen {
                        Encoding::Lattice { lattice, .. } => {
                            hypercodec_lattice::calibration::max_bps(*lattice)
                        }
                        _ => *bps,
                    };
                    given_bits = Some(bps * n as f64);
                    let bps = &(*bps + share).min(ceiling.max(*bps));
                    lattice_left = lattice_left.saturating_sub(n);
                    // The planned template; where it is prefix or Rice codes and rate
                    // control finds no scale for them, their rANS rung; then the grid.
                    let rungs = std::iter::once(chosen.clone())
                        .chain(crate::rate::rans_gpu_rung(chosen))
                        .chain(crate::rate::rice_rung(chosen))
                        .enumerate();
                    let mut found = None;
                    for (k, e) in rungs {
                        let spec = Spec::Rate {
                            template: e.clone(),
                            max_tile: *max_tile,
                            bps: Some(*bps),
                        };
                        match encode(&spec) {
                            Err(hypercodec_plan::PlanError::Hwz(
                                hwz::HwzError::RateUnreachable { .. },
                            )) => continue,
                            other => {
                                if &e != template {
                                    let why = match (k, chosen) {
                                        (0, _) => "prefix code lengths exceed the rate",
                                        (
                                            _,
                                            Encoding::Lattice {
                                                coding: hwz::Coding::Rice { .. },
                                                ..
                                            },
                                        ) => "rate control found no scale for Rice codes",
                                        _ => "rate control found no scale for prefix codes",
                                    };
                                    fallbacks
                                        .push((t.name.clone(), format!("{} ({why})", e.label())));
                                }
                                found = Some(other?);
                                break;
                            }
                        }
                    }
                    match found {
                        Some(e) => e,
                        None => fallback("rate control found no scale", &mut fallbacks)?,
                    }
                }
                Some(crate::rate::RateChoice::Fallback(_)) => {
                    let why = crate::rate::why_not_served(
                        &t.name,
                        &t.shape,
                        template,
                        *max_tile,
                        rp.lattice_bps,
                    )
                    .unwrap_or_else(|| {
                        "taking it onto the lattice would leave the others a rate that does \
                         not serve them"
                            .into()
                    });
                    fallback(&why, &mut fallbacks)?
                }
                None => hwz::encode(
                    &t.name,
                    &values,
                    &t.shape,
                    &Encoding::Raw {
                        dtype: t.ty.raw_dtype(),
                    },
                    opts,
                )?,
            }
        } else if let Some((e, why)) = match &options.route {
            Route::Fixed(spec) => crate::rate::narrow_fallback(spec, &t.name, &t.shape),
            _ => None,
        } {
            // Rows a fixed-rate recipe serves badly (too short for a trellis state, or for
            // their scale and padding): the lattice's fallback rule.
            fallbacks.push((t.name.clone(), format!("{} ({why})", e.label())));
            hwz::encode(&t.name, &values, &t.shape, &e, opts)?
        } else if let Route::Fixed(spec) = &options.route {
            match encode(spec) {
                // A constant tensor (a zeroed adapter) that the encoding asked for cannot hold
                // (sparse or low-rank codes of one below the format's floor of 1/8 bit a value):
                // its exact form, a bit a value (the run failed on it).
                Err(hypercodec_plan::PlanError::Hwz(hwz::HwzError::InvalidEncoding {
                    message,
                    ..
                })) if is_constant(&values) && codebook_family(spec) => {
                    let exact = hwz::encode(&t.name, &values, &t.shape, &constant_form(), opts)?;
                    let label = exact.encoding.label();
                    fallbacks.push((
                        t.name.clone(),
                        format!("{label} (a constant tensor: {message})"),
                    ));
                    exact
                }
                other => other?,
            }
        } else {
            unreachable!("every route is handled above")
        };
        if let Some(why) = unfit {
            // One line per tensor: a later fallback (the rate's) already says what it became.
            if !fallbacks.iter().any(|(name, _)| name == &t.name) {
                let e = encoded.encoding.label();
                fallbacks.push((t.name.clone(), format!("{e} ({why})")));
            }
        }
        let mut one = match measured {
            Some(s) => ErrorAcc::from(s),
            None => measure(&t.name, &values, &t.shape, &encoded)?,
        };
        if let Some((exact, why)) = constant_instead(
            &t.name,
            &values,
            &t.shape,
            &encoded,
            Some(one.snr_db()),
            opts,
        )? {
            encoded = exact;
            fallbacks.retain(|(name, _)| name != &t.name);
            let label = encoded.encoding.label();
            fallbacks.push((t.name.clone(), format!("{label} ({why})")));
            one = ErrorAcc::default();
            one.add(&values, &values);
        }
        if let Some((raw, why)) = raw_instead(
            &t.name,
            &values,
            &t.shape,
            &encoded,
            t.ty.raw_dtype(),
            Some(&one),
            opts,
        )? {
            encoded = raw;
            // One line per tensor: this replaces any fallback it already had.
            fallbacks.retain(|(name, _)| name != &t.name);
            let label = encoded.encoding.label();
            fallbacks.push((t.name.clone(), format!("{label} ({why})")));
            one = ErrorAcc::default();
            one.add(&values, &values);
        }
        acc.merge(&one);
        let stored = writer.add_tensor(
            &t.name,
            &t.shape,
            t.ty.label(),
            &encoded,
            Some(one.to_stats()),
        )?;
        if let Some(rp) = rate_plan.as_ref().filter(|_| sel.planned(&t.shape)) {
            // A tensor off the lattice was given its grid's bytes before zstd (the plan's
            // count), whatever it became.
            let given = match given_bits {
                Some(b) => b,
                None => {
                    8.0 * crate::rate::exact_bytes(&t.name, &t.shape, &rp.fallback(&t.shape))?
                        as f64
                }
            };
            surplus_bits += given - 8.0 * stored as f64;
        }
        bar.step(&t.name, t.numel());
    }
    if let Some(c) = calibration {
        writer.insert_metadata(
            "calibration",
            json!({"file": c.name, "layers": c.len(), "tensors_calibrated": calibrated,
                   "rule": "LDLQ error feedback (GPTQ), damping 0.01 of the mean diagonal"}),
        );
    }
    if let Some(p) = &plan {
        writer.set_plan(serde_json::to_value(p.for_archive()).map_err(|e| {
            PipelineError::Json {
                what: "plan".into(),
                message: e.to_string(),
            }
        })?);
    }
    Ok(CompressReport {
        tensors: source.tensors.len(),
        skipped: source.skipped.len(),
        elements: total,
        error: acc,
        fallbacks,
        plan,
    })
}

/// `options` with a planner that counts candidates' bytes as a writer with `compression`
/// stores them (copied only where that changes them).
fn for_container(
    options: &CompressOptions,
    compression: Compression,
) -> std::borrow::Cow<'_, CompressOptions> {
    match &options.route {
        Route::Planner(p) if p.container != compression => {
            let mut options = options.clone();
            if let Route::Planner(p) = &mut options.route {
                p.container = compression;
            }
            std::borrow::Cow::Owned(options)
        }
        _ => std::borrow::Cow::Borrowed(options),
    }
}

/// The error of `encoded` against `values`, decoded in row blocks through the tensor's view:
/// the decoded copy never holds more than a block (about 4 MB of f32), whatever the size.
fn measure(
    name: &str,
    values: &[f32],
    shape: &[u64],
    encoded: &hwz::EncodedTensor,
) -> Result<ErrorAcc> {
    let refs: Vec<(&str, &[u8])> = encoded
        .streams
        .iter()
        .map(|(r, b)| (*r, b.as_slice()))
        .collect();
    let view = hwz::TensorView::new(name, &encoded.encoding, shape, &refs)?;
    let cols = view.cols() as usize;
    let block = ((STATS_BLOCK_VALUES / cols.max(1)).max(1)) as u64;
    let mut decoded = Vec::new();
    let mut acc = ErrorAcc::default();
    let mut r = 0u64;
    while r < view.rows() {
        let e = (r + block).min(view.rows());
        let (a, b) = (r as usize * cols, e as usize * cols);
        decoded.resize(b - a, 0.0);
        view.decode_rows_into(r..e, &mut decoded)?;
        acc.add(&values[a..b], &decoded);
        r = e;
    }
    Ok(acc)
}

/// The exact form of a constant tensor (an untrained norm or gate, a zeroed adapter) where
/// `encoded` stores it with loss or in more bytes than that form, with the reason (for the
/// fallbacks list); `None` for any other tensor. `snr_db` is what `encoded` measured (infinite
/// where exact); `None` decodes it here.
///
/// Only rotations are replaced (a lattice or trellis turns a constant into noise-like
/// coordinates: 9 dB at 2 bits; a trellis stores zeros in its 2 bits a value): an affine grid
/// holds a constant within its scale type's rounding (73 dB at f16) in the form the GPU
/// kernels run, and raw types are what was asked for. The pipeline applies this to every
/// tensor it writes; a front end that encodes one layer itself (Python's `Linear.quantize`)
/// calls it too.
pub fn constant_instead(
    name: &str,
    values: &[f32],
    shape: &[u64],
    encoded: &hwz::EncodedTensor,
    snr_db: Option<f64>,
    opts: EncodeOptions,
) -> Result<Option<(hwz::EncodedTensor, String)>> {
    if !matches!(
        encoded.encoding,
        Encoding::Lattice { .. } | Encoding::Trellis { .. }
    ) || !is_constant(values)
    {
        return Ok(None);
    }
    let snr_db = match snr_db {
        Some(db) => db,
        None => measure(name, values, shape, encoded)?.snr_db(),
    };
    let exact = hwz::encode(name, values, shape, &constant_form(), opts)?;
    let (bytes, exact_bytes) = (encoded.payload_bytes(), exact.payload_bytes());
    let label = encoded.encoding.label();
    // Lossy is anything short of +∞ (a zero tensor stored with noise measures −∞).
    let why = if snr_db != f64::INFINITY {
        format!("a constant tensor, which {label} stored at {snr_db:.2} dB")
    } else if bytes > exact_bytes {
        format!("a constant tensor, which {label} stored in {bytes} bytes, not {exact_bytes}")
    } else {
        return Ok(None);
    };
    Ok(Some((exact, why)))
}

/// The raw form (`dtype`, the source type) of a tensor that `encoded` stores no better than
/// zeros (SNR <= 0 dB: values below what its scales can hold, e.g. std 1e-8 or subnormals
/// under f16 scales), with the reason; `None` for any other. Such a result is never reported as
/// a success. `error` is what `encoded` measured. `None` decodes it here where such a result
/// can happen: tensors of up to 2^20 values, or whose largest magnitude lies outside
/// 1e-3..1e30 (a large tensor of ordinary weights is not decoded again: a trellis layer coded on
/// the GPU would spend as long here). The pipeline applies this to every tensor it writes, and
/// so does Python's `Linear.quantize`.
pub fn raw_instead(
    name: &str,
    values: &[f32],
    shape: &[u64],
    encoded: &hwz::EncodedTensor,
    dtype: FloatDtype,
    error: Option<&ErrorAcc>,
    opts: EncodeOptions,
) -> Result<Option<(hwz::EncodedTensor, String)>> {
    let measured;
    let error = match error {
        Some(e) => e,
        None => {
            let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
            if values.len() > 1 << 20 && (1e-3..=1e30).contains(&amax) {
                return Ok(None);
            }
            measured = measure(name, values, shape, encoded)?;
            &measured
        }
    };
    if !(error.noise > 0.0 && error.snr_db() <= 0.0) {
        return Ok(None);
    }
    let why = format!(
        "{} reached only {:.2} dB",
        encoded.encoding.label(),
        error.snr_db()
    );
    let raw = hwz::encode(name, values, shape, &Encoding::Raw { dtype }, opts)?;
    Ok(Some((raw, why)))
}

/// Whether `spec` stores a codebook-family encoding (codebook, low-rank, sparse): the codes
/// the format's floor of 1/8 bit a value can refuse for a constant tensor.
fn codebook_family(spec: &Spec) -> bool {
    let e = match spec {
        Spec::Fixed { encoding } => encoding,
        Spec::Codebook { template, .. } | Spec::Rate { template, .. } => template,
        _ => return false,
    };
    matches!(
        e,
        Encoding::Codebook { .. } | Encoding::LowRank { .. } | Encoding::Sparse { .. }
    )
}

/// Whether a tensor's values are all one finite value (bit for bit).
fn is_constant(values: &[f32]) -> bool {
    values.first().is_some_and(|first| {
        first.is_finite() && values.iter().all(|v| v.to_bits() == first.to_bits())
    })
}

/// The exact form of a constant tensor: affine INT1 with one f32 scale (zero) and offset (the
/// value) for the tensor. Its codes are stored as they are (a bit a value): zstd would shrink
/// them past what readers accept of a stream (256 times) or of a tensor (64 values a byte).
fn constant_form() -> Encoding {
    Encoding::affine(AffineParams {
        bits: 1,
        group: Group::Tensor,
        symmetric: false,
        scale_dtype: FloatDtype::F32,
    })
}

/// A plan file read back for `source` (one written by `hypercodec plan`, possibly edited): a
/// version this build reads, each tensor once, every entry a planned tensor of the input with
/// its shape. A plan made for another model or edited wrongly is refused before anything is
/// written, naming the entry.
fn check_plan(plan: &Plan, source: &TensorSource, sel: Selection) -> Result<()> {
    let bad = |message: String| PipelineError::Json {
        what: "plan".into(),
        message,
    };
    if plan.version != 1 {
        return Err(bad(format!(
            "version {} (this build reads version 1)",
            plan.version
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for t in &plan.tensors {
        if !seen.insert(t.name.as_str()) {
            return Err(bad(format!("tensor `{}` is planned twice", t.name)));
        }
        let Some(s) = source.tensors.iter().find(|s| s.name == t.name) else {
            return Err(bad(format!(
                "tensor `{}` is not in the input (a plan for another model?)",
                t.name
            )));
        };
        if s.shape != t.shape {
            return Err(bad(format!(
                "tensor `{}` is planned with shape {:?}, the input's is {:?}",
                t.name, t.shape, s.shape
            )));
        }
        if !sel.planned(&s.shape) {
            return Err(bad(format!(
                "tensor `{}` is planned, but the selection keeps it raw (--include-1d, \
                 --min-tensor-size)",
                t.name
            )));
        }
    }
    Ok(())
}

/// Encodes with `spec`, with error feedback from `calibration`'s statistics for the tensor
/// when there are some (counted in `calibrated`).
fn encode_spec(
    spec: &Spec,
    name: &str,
    values: &[f32],
    shape: &[u64],
    opts: EncodeOptions,
    calibration: Option<&crate::Calibration>,
    calibrated: &mut usize,
) -> std::result::Result<hwz::EncodedTensor, hypercodec_plan::PlanError> {
    let cols = hwz::matrix_view(shape, values.len() as u64).1 as usize;
    let h = match calibration.map(|c| c.get(name, cols)) {
        Some(Ok(h)) => h,
        Some(Err(e)) => {
            return Err(hypercodec_plan::PlanError::Candidate {
                message: e.to_string(),
            })
        }
        None => None,
    };
    match h {
        Some(h) if shape.len() >= 2 => {
            let (t, used) = spec.encode_calibrated(name, values, shape, opts, &h, 0.01)?;
            *calibrated += used as usize;
            Ok(t)
        }
        _ => spec.encode(name, values, shape, opts),
    }
}

/// Whether `e` is a prefix coder's refusal of symbols beyond its tables (prefix codes have no
/// escapes; at about 5 bits a value and above, E8's pair coordinates outgrow them): the
/// encoding is then retried with [`prefix_fallback`].
pub fn prefix_unfit(e: &hypercodec_plan::PlanError) -> bool {
    matches!(
        e,
        hypercodec_plan::PlanError::Hwz(hwz::HwzError::Coding {
            source: hwz::CodingError::Unrepresentable { .. },
            ..
        })
    )
}

/// The spec with its prefix codes replaced by GPU-shaped rANS, which escapes the rare large
/// symbols that prefix tables cannot hold; `None` for a spec without prefix codes. `cols` is
/// the tensor's row length (a fixed encoding's chunks are aligned to rows).
pub fn prefix_fallback(spec: &Spec, cols: u64) -> Option<Spec> {
    let rans = crate::rate::rans_gpu_rung;
    match spec {
        Spec::Rate {
            template,
            bps,
            max_tile,
        } => Some(Spec::Rate {
            template: rans(template)?,
            bps: *bps,
            max_tile: *max_tile,
        }),
        Spec::Fixed { encoding } => {
            let spr = cols.div_ceil(8).max(1) * 8;
            let rows = (hwz::GPU_CHUNK_SYMBOLS as u64 / spr).max(1);
            Some(Spec::Fixed {
                encoding: rans(encoding)?.with_row_aligned_chunks(cols, rows),
            })
        }
        _ => None,
    }
}

/// The generator string of archives this build writes.
pub const GENERATOR: &str = concat!("hypercodec ", env!("CARGO_PKG_VERSION"));

/// [`compress`] into a file that appears under `path` only when complete: an error or a
/// cancel leaves no archive there (any previous file stays untouched).
pub fn compress_to_file(
    source: &TensorSource,
    options: &CompressOptions,
    path: &Path,
    zstd: bool,
    progress: &mut dyn FnMut(Progress<'_>),
    cancel: &Cancel,
) -> Result<FileReport> {
    let started = Instant::now();
    crate::output::check_output(path, source.files())?;
    let writer_options = WriterOptions {
        compression: if zstd {
            Compression::Zstd
        } else {
            Compression::None
        },
        generator: GENERATOR.into(),
    };
    let options = &for_container(options, writer_options.compression);
    let mut writer = FileWriter::create(path, writer_options).map_err(|e| io_at(path, e))?;
    let report = compress(source, options, &mut *writer, progress, cancel)?;
    // A signal during the last tensor: no archive either.
    cancel.check()?;
    let manifest = writer.finish().map_err(|e| io_at(path, e))?;
    let file_bytes = std::fs::metadata(path)
        .map_err(PipelineError::io(path))?
        .len();
    let totals = crate::summarize(&manifest, 0, file_bytes).totals;
    Ok(FileReport {
        report,
        payload_bytes: payload_bytes(&manifest),
        file_bytes,
        seconds: started.elapsed().as_secs_f64(),
        lossy: totals.lossy,
        lossy_without_snr: totals.lossy_without_snr,
    })
}

/// [`compress`] into shards of about `shard_bytes` each (`out` = `model.hwz` gives
/// `model-0000K-of-0000N.hwz` and `model.hwz.index.json` beside it; see [`crate::shards`]).
/// Nothing appears under a final name unless every shard is complete.
pub fn compress_to_shards(
    source: &TensorSource,
    options: &CompressOptions,
    out: &Path,
    zstd: bool,
    shard_bytes: u64,
    progress: &mut dyn FnMut(Progress<'_>),
    cancel: &Cancel,
) -> Result<FileReport> {
    let started = Instant::now();
    let writer_options = WriterOptions {
        compression: if zstd {
            Compression::Zstd
        } else {
            Compression::None
        },
        generator: GENERATOR.into(),
    };
    let index = crate::shards::index_path(out);
    crate::output::check_output(&index, source.files())?;
    let options = &for_container(options, writer_options.compression);
    let mut writer = crate::shards::ShardedWriter::new(out, shard_bytes, writer_options)?
        .reading(source.files());
    let report = compress(source, options, &mut writer, progress, cancel)?;
    writer.finish()?;
    let set = crate::shards::ArchiveSet::open(&index)?;
    let summary = set.summary()?;
    Ok(FileReport {
        report,
        payload_bytes: set
            .parts
            .iter()
            .map(|(_, a)| payload_bytes(a.manifest()))
            .sum(),
        file_bytes: summary.totals.file_bytes,
        seconds: started.elapsed().as_secs_f64(),
        lossy: summary.totals.lossy,
        lossy_without_snr: summary.totals.lossy_without_snr,
    })
}

/// An archive error, with the file named when it is an I/O error.
pub(crate) fn io_at(path: &Path, e: hwz::HwzError) -> PipelineError {
    match e {
        hwz::HwzError::Io(source) => PipelineError::Io {
            path: path.into(),
            source,
        },
        e => PipelineError::Hwz(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> TensorSource {
        TensorSource::open("gaussian:32x64:3").expect("synthetic")
    }

    fn gauss(n: usize, seed: u64) -> Vec<f32> {
        let mut v = vec![0f32; n];
        crate::source::SplitMix64(seed).fill_gaussian(&mut v);
        v
    }

    /// E8 with `coding`, its scale and tile left to rate control and the matrix.
    fn e8(coding: hwz::Coding) -> Encoding {
        Encoding::Lattice {
            lattice: hwz::Lattice::E8,
            alpha: 1.0,
            tile: 1,
            seed: 0,
            scale_dtype: FloatDtype::F16,
            coding,
        }
    }

    /// `tensors` written as a safetensors file in `dir`, opened as a source.
    fn written(dir: &Path, tensors: &[(String, Vec<u64>, Vec<f32>)]) -> TensorSource {
        let input = dir.join("m.safetensors");
        crate::synth::write_tensors(&input, tensors).expect("write");
        TensorSource::open(input.to_str().expect("utf-8")).expect("open")
    }

    #[test]
    fn prefix_routes_keep_small_tensors_entropy_coded() {
        // A layer too small for the prefix codes' kilobyte of code lengths at 4 bits takes
        // GPU-shaped rANS (the same lattice), not the INT6 grid, and the archive keeps its rate.
        let dir = tempfile::tempdir().expect("tempdir");
        let tensors = vec![
            ("big".to_string(), vec![256u64, 1024], gauss(256 * 1024, 1)),
            ("small".to_string(), vec![100u64, 40], gauss(4000, 2)),
        ];
        let source = written(dir.path(), &tensors);
        let template = e8(hwz::Coding::PREFIX_GPU);
        let options = CompressOptions {
            route: Route::Fixed(Spec::Rate {
                template,
                max_tile: 4096,
                bps: Some(4.0),
            }),
            ..CompressOptions::default()
        };
        let out = dir.path().join("m.hwz");
        let r = compress_to_file(&source, &options, &out, false, &mut |_| {}, &Cancel::new())
            .expect("compress");
        assert!(r.bps() <= 4.0 && r.bps() > 3.9, "{}", r.bps());
        assert_eq!(r.report.fallbacks.len(), 1, "{:?}", r.report.fallbacks);
        assert_eq!(r.report.fallbacks[0].0, "small");
        assert!(r.report.fallbacks[0].1.contains("rans-gpu"));
        let file = hwz::Archive::open_file(&out).expect("open");
        let coding = |name: &str| match &file.tensor(name).expect("tensor").encoding {
            Encoding::Lattice { coding, .. } => *coding,
            e => panic!("{name}: {e:?}"),
        };
        assert!(matches!(coding("big"), hwz::Coding::Prefix { .. }));
        assert!(matches!(
            coding("small"),
            hwz::Coding::Rans {
                lanes: 32,
                prob_bits: 12,
                ..
            }
        ));
    }

    #[test]
    fn constant_tensors_under_a_rotation_are_stored_exactly() {
        // A lattice or trellis rotates a constant into noise-like coordinates (9-12 dB at
        // 2 bits) and spends its bits on zeros; its exact form is smaller.
        let dir = tempfile::tempdir().expect("tempdir");
        let tensors = vec![
            ("w".to_string(), vec![128u64, 256], gauss(128 * 256, 5)),
            ("ones".to_string(), vec![64u64, 256], vec![1.0; 64 * 256]),
            ("small".to_string(), vec![32u64, 512], vec![-0.02; 32 * 512]),
            ("zero".to_string(), vec![64u64, 256], vec![0.0; 64 * 256]),
        ];
        let source = written(dir.path(), &tensors);
        let lattice = Spec::Rate {
            template: e8(hwz::Coding::RANS_DEFAULT),
            max_tile: 4096,
            bps: Some(2.0),
        };
        let trellis = Spec::trellis(8, 2, 4096, 0).expect("trellis");
        for (spec, replaced) in [(lattice, 2), (trellis, 3)] {
            let options = CompressOptions {
                route: Route::Fixed(spec),
                ..CompressOptions::default()
            };
            let out = dir.path().join("m.hwz");
            let r = compress_to_file(&source, &options, &out, false, &mut |_| {}, &Cancel::new())
                .expect("compress");
            let names: Vec<&str> = r.report.fallbacks.iter().map(|f| f.0.as_str()).collect();
            assert_eq!(names.len(), replaced, "{:?}", r.report.fallbacks);
            assert!(r
                .report
                .fallbacks
                .iter()
                .all(|f| f.1.contains("a constant tensor")));
            let file = hwz::Archive::open_file(&out).expect("open");
            for (name, _, values) in &tensors[1..] {
                assert_eq!(&file.decode_tensor(name).expect("decode"), values, "{name}");
            }
            assert!(!names.contains(&"w"));
        }
    }

    #[test]
    fn a_constant_tensor_below_a_sparse_codes_floor_is_stored_exactly() {
        // Sparse codes of a zero tensor store no bytes, below the format's floor of 1/8 bit a
        // value: the whole run failed on a zeroed adapter. A tensor that is not constant still
        // gets the encoding asked for.
        let dir = tempfile::tempdir().expect("tempdir");
        let tensors = vec![
            ("w".to_string(), vec![64u64, 256], gauss(64 * 256, 5)),
            ("zero".to_string(), vec![64u64, 256], vec![0.0; 64 * 256]),
        ];
        let source = written(dir.path(), &tensors);
        let options = CompressOptions {
            route: Route::Fixed(Spec::parse("sparse").expect("spec")),
            ..CompressOptions::default()
        };
        let out = dir.path().join("m.hwz");
        let r = compress_to_file(&source, &options, &out, false, &mut |_| {}, &Cancel::new())
            .expect("compress");
        assert_eq!(r.report.fallbacks.len(), 1, "{:?}", r.report.fallbacks);
        let (name, why) = &r.report.fallbacks[0];
        assert!(name == "zero" && why.contains("below the floor"), "{why}");
        let file = hwz::Archive::open_file(&out).expect("open");
        assert_eq!(file.decode_tensor("zero").expect("decode"), tensors[1].2);
        assert!(file
            .manifest()
            .tensors
            .iter()
            .any(|t| t.name == "w" && t.encoding.label().starts_with("sparse")));
    }

    #[test]
    fn a_depthwise_kernel_that_falls_back_keeps_every_channel() {
        // Trained depthwise channels differ in range by orders of magnitude: under one scale
        // for the tensor the small ones decoded as zeros (EfficientNet-Lite0: 25-166 channels).
        let dir = tempfile::tempdir().expect("tempdir");
        let mut dw = gauss(64 * 9, 7);
        dw.iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v *= if i / 9 == 5 { 300.0 } else { 1.0 });
        let tensors = vec![
            ("fc".to_string(), vec![256u64, 512], gauss(256 * 512, 8)),
            ("dw".to_string(), vec![64u64, 1, 3, 3], dw.clone()),
        ];
        let source = written(dir.path(), &tensors);
        let template = e8(hwz::Coding::RANS_DEFAULT);
        for bps in [2.0, 3.0, 4.0] {
            let options = CompressOptions {
                route: Route::Fixed(Spec::Rate {
                    template: template.clone(),
                    max_tile: 4096,
                    bps: Some(bps),
                }),
                ..CompressOptions::default()
            };
            let out = dir.path().join("m.hwz");
            let r = compress_to_file(&source, &options, &out, false, &mut |_| {}, &Cancel::new())
                .expect("compress");
            assert_eq!(r.report.fallbacks.len(), 1, "{:?}", r.report.fallbacks);
            let file = hwz::Archive::open_file(&out).expect("open");
            let back = file.decode_tensor("dw").expect("decode");
            for (c, (x, y)) in dw.chunks(9).zip(back.chunks(9)).enumerate() {
                let signal: f32 = x.iter().map(|v| v * v).sum();
                let noise: f32 = x.iter().zip(y).map(|(a, b)| (a - b) * (a - b)).sum();
                assert!(
                    noise < 0.25 * signal,
                    "{bps} bits, channel {c}: {x:?} -> {y:?}"
                );
            }
        }
    }

    #[test]
    fn cancel_returns_cancelled_and_leaves_no_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("c.hwz");
        let cancel = Cancel::new();
        cancel.cancel();
        let r = compress_to_file(
            &source(),
            &CompressOptions::default(),
            &out,
            true,
            &mut |_| {},
            &cancel,
        );
        assert!(matches!(r, Err(PipelineError::Cancelled)), "{r:?}");
        assert!(!out.exists());
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert!(left.is_empty(), "temporary file left: {left:?}");
    }

    #[test]
    fn a_cancel_during_the_last_tensor_writes_no_archive() {
        // The flag is set while the only tensor is encoded (its progress report comes after
        // the loop's last check): the run ends cancelled, not with an archive.
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("c.hwz");
        let cancel = Cancel::new();
        let r = compress_to_file(
            &source(),
            &CompressOptions::default(),
            &out,
            true,
            &mut |p| {
                if p.phase == Phase::Compress {
                    cancel.cancel()
                }
            },
            &cancel,
        );
        assert!(matches!(r, Err(PipelineError::Cancelled)), "{r:?}");
        assert!(!out.exists());
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert!(left.is_empty(), "temporary file left: {left:?}");
    }

    #[test]
    fn progress_sums_to_the_element_count_in_every_phase() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("b.hwz");
        let options = CompressOptions {
            route: Route::Planner(PlanOptions {
                mode: Mode::Budget,
                target: Some(hypercodec_plan::Target::Bps(3.0)),
                ..PlanOptions::default()
            }),
            ..CompressOptions::default()
        };
        let mut seen: std::collections::HashMap<Phase, u64> = Default::default();
        let r = compress_to_file(
            &source(),
            &options,
            &out,
            false,
            &mut |p| {
                *seen.entry(p.phase).or_default() += p.elements;
                assert!(p.done <= p.total);
            },
            &Cancel::new(),
        )
        .expect("compress");
        assert_eq!(seen.get(&Phase::Measure), Some(&(32 * 64)));
        assert_eq!(seen.get(&Phase::Compress), Some(&(32 * 64)));
        assert_eq!(r.report.elements, 32 * 64);
        assert!(r.bps() <= 3.0, "{}", r.bps());
        assert!(out.exists());
    }
}
