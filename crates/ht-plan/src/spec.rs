//! How to encode one tensor: a fixed encoding, a lattice fitted to a rate, a codebook with its
//! training settings, or a composition (per row block, or a base plus exceptions).

use crate::{PlanError, Result};
use hypercodec_hwz::{
    self as hwz, AffineParams, CodebookSettings, Coding, EncodeOptions, EncodedTensor, Encoding,
    FloatDtype, Group, Lattice, ResidualDtype, ScaleMode,
};
use serde::{Deserialize, Serialize};

/// A recipe for one tensor. Serialized in the Plan; replaying it gives the same bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Spec {
    /// Exactly this encoding.
    Fixed {
        /// The encoding.
        encoding: Encoding,
    },
    /// A lattice encoding with its RHT tile set from each tensor's rows (the largest power of
    /// two dividing them, at most `max_tile`), and its α fitted per tensor to `bps` (all side
    /// information included) — or kept as it is when `bps` is `None` (a fixed-rate coding, or
    /// α from the SNR calibration).
    Rate {
        /// Lattice encoding (its α is a starting point).
        template: Encoding,
        /// Target bits per value.
        bps: Option<f64>,
        /// Largest RHT tile.
        #[serde(default = "default_max_tile")]
        max_tile: u32,
    },
    /// A codebook encoding with its encoder-side settings.
    Codebook {
        /// Codebook encoding (its residual count and index layout may be replaced).
        template: Encoding,
        /// Training, search and residual settings.
        settings: CodebookSettings,
    },
    /// One recipe per block of `block_rows` rows (hwz `mixed`).
    Mixed {
        /// Rows per block.
        block_rows: u64,
        /// One recipe per block, top to bottom.
        parts: Vec<Spec>,
    },
    /// A dense base plus the `count` values it reconstructs worst, stored exactly (hwz
    /// `exceptions`).
    Exceptions {
        /// The dense recipe.
        base: Box<Spec>,
        /// Number of exceptions.
        count: u64,
        /// Storage type of the exception values.
        dtype: FloatDtype,
    },
}

fn default_max_tile() -> u32 {
    4096
}

impl Spec {
    /// A fixed encoding.
    pub fn fixed(encoding: Encoding) -> Self {
        Spec::Fixed { encoding }
    }

    /// The trellis recipe: `k` bits per value at state bits `l` (calibrated scale), RHT tile
    /// from each tensor's rows (at most `max_tile`), RHT seed `seed`.
    pub fn trellis(l: u8, k: u8, max_tile: u32, seed: u64) -> Result<Self> {
        if !(8..=16).contains(&l) || !(1..=8).contains(&k) || k >= l {
            return Err(PlanError::Candidate {
                message: format!(
                    "trellis L = {l}, K = {k}: use 8 <= L <= 16 and 1 <= K <= 8 with K < L"
                ),
            });
        }
        Ok(Spec::Rate {
            template: Encoding::trellis(l, k, 1, seed),
            bps: None,
            max_tile,
        })
    }

    /// [`Spec::trellis`] with a pair of values per state (`v = 2`; `K ≤ 4`, `2K < L`): about
    /// 22 % fewer integer instructions per weight for a GPU decoder, 0.05–0.3 dB lower SNR.
    /// Rows of an odd length take one value per state ([`Encoding::for_matrix`]).
    pub fn trellis_pairs(l: u8, k: u8, max_tile: u32, seed: u64) -> Result<Self> {
        Spec::trellis(l, k, max_tile, seed)?;
        if k > 4 || 2 * k >= l {
            return Err(PlanError::Candidate {
                message: format!("trellis pairs at L = {l}, K = {k}: use K <= 4 and 2K < L"),
            });
        }
        Ok(Spec::Rate {
            template: Encoding::trellis_pairs(l, k, 1, seed),
            bps: None,
            max_tile,
        })
    }

    /// Parses a candidate name: `f32`, `bf16`, `f16`; `intN` (affine N bits, groups of 128,
    /// asymmetric, f16 scales), `intN-gG` (groups of G, asymmetric), `intN-gG-sym` (groups of G,
    /// a scale and no offset each), `intN-row` (one symmetric scale per row); `e8@B`, `d4@B`,
    /// `a2@B`, `z1@B` (lattice + rANS fitted to B bps; `e8@B-gpu` with [`Coding::RANS_GPU`], `e8@B-prefix` with [`Coding::PREFIX_GPU`], `e8@B-prefix10`, `e8@B-prefix8p11` for other code limits, a `-cN` suffix for chunks of N symbols); `e8-fixedN`, `d4-fixedN`, `z1-fixedN`
    /// (fixed-rate lattice symbols of N bits); `tcq@K`, `tcq@K-lL` (trellis, K bits per value,
    /// L state bits, by default 16; a `-v2` suffix codes a pair of values per state); `cb-bB-kK[-rR][-sMODE]` (a codebook of `K` prototypes of
    /// `B` values, `R` int8 residual corrections per block, scales per `channel` (default),
    /// `block` or `tensor`, HDC-bucketed search); `lowrank@R`; `sparse` (the nonzeros, f32).
    pub fn parse(name: &str) -> Result<Self> {
        let bad = || PlanError::Candidate {
            message: format!(
                "unknown candidate `{name}`: the names are f32, bf16, f16, intN, intN-gG[-sym], \
                 intN-row, intN-tensor, e8@B (also d4, a2, z1; e8@B-gpu, e8@B-prefix), e8-fixedN \
                 (d4, z1), tcq@K[-lL][-v2], cb-bB-kK[-rR][-sMODE] (codebooks, e.g. \
                 cb-b8-k256), lowrank@R, sparse"
            ),
        };
        let raw = |dtype| Spec::fixed(Encoding::Raw { dtype });
        Ok(match name {
            "f32" => raw(FloatDtype::F32),
            "bf16" => raw(FloatDtype::Bf16),
            "f16" => raw(FloatDtype::F16),
            "sparse" => Spec::fixed(Encoding::Sparse {
                count: u64::MAX,
                dtype: FloatDtype::F32,
            }),
            _ => {
                if let Some(rest) = name.strip_prefix("int") {
                    // `intN` groups of 128 (asymmetric), `intN-gG` groups of G (asymmetric;
                    // `intN-gG-sym`: symmetric, a scale and no offset per group), `intN-row`
                    // one scale per row and `intN-tensor` one scale for the tensor (both
                    // symmetric).
                    let (bits, group, symmetric) = if let Some(b) = rest.strip_suffix("-row") {
                        (b, Group::Row, true)
                    } else if let Some(b) = rest.strip_suffix("-tensor") {
                        (b, Group::Tensor, true)
                    } else if let Some((b, g)) = rest.split_once("-g") {
                        let (g, symmetric) = match g.strip_suffix("-sym") {
                            Some(g) => (g, true),
                            None => (g, false),
                        };
                        (b, Group::Size(plain_number(g).ok_or_else(bad)?), symmetric)
                    } else {
                        (rest, Group::Size(128), false)
                    };
                    let bits: u8 = plain_number(bits).ok_or_else(bad)?;
                    let params = AffineParams {
                        bits,
                        group,
                        symmetric,
                        scale_dtype: FloatDtype::F16,
                    };
                    params.validate().map_err(|e| PlanError::Candidate {
                        message: format!("`{name}`: {e}"),
                    })?;
                    Spec::fixed(Encoding::affine(params))
                } else if let Some((lat, bits)) = name.split_once("-fixed") {
                    // `e8-fixedN`, `d4-fixedN`, `z1-fixedN`: the fixed-rate lattice forms (the
                    // execution forms), α from the shipped fixed-rate calibration.
                    let lattice = match lat {
                        "e8" => Lattice::E8,
                        "d4" => Lattice::D4,
                        "z1" => Lattice::Z1,
                        _ => return Err(bad()),
                    };
                    let bits: u8 = plain_number(bits).ok_or_else(bad)?;
                    let (alpha, _) = hypercodec_lattice::calibration::fixed_alpha(lattice, bits)
                        .ok_or_else(bad)?;
                    Spec::Rate {
                        max_tile: 4096,
                        template: Encoding::Lattice {
                            lattice,
                            alpha,
                            tile: 1,
                            seed: 0,
                            scale_dtype: FloatDtype::F16,
                            coding: Coding::Fixed { bits },
                        },
                        bps: None,
                    }
                } else if let Some(rest) = name.strip_prefix("tcq@") {
                    // `tcq@K` (trellis, K bits per value, the default L) or `tcq@K-lL`, each
                    // with `-v2` for pairs.
                    let (rest, pairs) = match rest.strip_suffix("-v2") {
                        Some(r) => (r, true),
                        None => (rest, false),
                    };
                    let (k, l) = match rest.split_once("-l") {
                        Some((k, l)) => (k, plain_number::<u8>(l).ok_or_else(bad)?),
                        None => (rest, hypercodec_trellis::DEFAULT_L),
                    };
                    let k = plain_number(k).ok_or_else(bad)?;
                    if pairs {
                        Spec::trellis_pairs(l, k, 4096, 0)
                    } else {
                        Spec::trellis(l, k, 4096, 0)
                    }
                    .map_err(|e| PlanError::Candidate {
                        message: format!("`{name}`: {e}"),
                    })?
                } else if let Some(rest) = name.strip_prefix("cb-") {
                    Spec::codebook_named(rest).ok_or_else(bad)?
                } else if let Some(r) = name.strip_prefix("lowrank@") {
                    Spec::fixed(Encoding::LowRank {
                        rank: plain_number(r).ok_or_else(bad)?,
                    })
                } else if let Some((lat, bps)) = name.split_once('@') {
                    let lattice = match lat {
                        "e8" => Lattice::E8,
                        "d4" => Lattice::D4,
                        "a2" => Lattice::A2,
                        "z1" => Lattice::Z1,
                        _ => return Err(bad()),
                    };
                    // `e8@B-gpu`: rANS shaped for the CUDA GEMV that decodes it;
                    // `e8@B-prefix`: the GPU-shaped prefix codes, `e8@B-prefixL` singles of at
                    // most L bits, `e8@B-prefixLpP` pairs of at most P (`Coding::label`).
                    let gpu = match bps.split_once("-prefix") {
                        Some((b, form)) => Some((b, prefix_form(form).ok_or_else(bad)?)),
                        None => bps.strip_suffix("-gpu").map(|b| (b, Coding::RANS_GPU)),
                    };
                    let (bps, coding) = match gpu {
                        // Only E8 has the kernels that decode them.
                        Some((b, c)) if lattice == Lattice::E8 => (b, c),
                        Some(_) => return Err(bad()),
                        None => (bps, Coding::RANS_DEFAULT),
                    };
                    let bps: f64 = bps.parse().map_err(|_| bad())?;
                    if !(bps > 0.0 && bps <= 16.0) {
                        return Err(PlanError::Candidate {
                            message: format!(
                                "`{name}`: a lattice rate is more than 0 and at most 16 bits per \
                                 value, not {bps}"
                            ),
                        });
                    }
                    Spec::Rate {
                        max_tile: 4096,
                        template: Encoding::Lattice {
                            lattice,
                            alpha: 1.0,
                            tile: 1,
                            seed: 0,
                            scale_dtype: FloatDtype::F16,
                            coding,
                        },
                        bps: Some(bps),
                    }
                } else {
                    return Err(bad());
                }
            }
        })
    }

    /// The codebook of a candidate name after `cb-` (`b8-k256-r0.5-sblock`), if well formed.
    fn codebook_named(rest: &str) -> Option<Self> {
        let (mut block, mut k, mut residual, mut mode) = (None, None, 0.0, ScaleMode::Channel);
        for part in rest.split('-') {
            // (The first character, not byte: `split_at(1)` panicked inside a non-ASCII one.)
            let (key, value) = part.split_at(part.chars().next().map_or(0, char::len_utf8));
            match key {
                "b" => block = Some(parse_in(value, 1..=64)?),
                "k" => k = Some(parse_in(value, 2..=65536)?),
                "r" => residual = parse_in(value, 0.0..=64.0)?,
                "s" => {
                    mode = match value {
                        "channel" => ScaleMode::Channel,
                        "block" => ScaleMode::Block,
                        "tensor" => ScaleMode::Tensor,
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
        Some(Spec::Codebook {
            template: hwz::codebook_template(block?, k?, mode, ResidualDtype::Int8),
            settings: CodebookSettings {
                residual_k: Some(residual),
                pick_layout: true,
                ..Default::default()
            },
        })
    }

    /// A short label: the encoding's label, `@B` for rates, `mixed`, `…+exceptions`.
    pub fn label(&self) -> String {
        match self {
            Spec::Fixed {
                encoding: Encoding::Sparse { .. },
            } => "sparse".into(),
            Spec::Fixed { encoding } => encoding.label(),
            Spec::Rate {
                template,
                bps: Some(bps),
                ..
            } => format!("{}@{bps}", template.label()),
            Spec::Rate { template, .. } => template.label(),
            Spec::Codebook { template, .. } => template.label(),
            Spec::Mixed { parts, .. } => format!("mixed-{}", parts.len()),
            Spec::Exceptions { base, count, .. } => format!("{}+{count}exc", base.label()),
        }
    }

    /// Encodes one tensor.
    pub fn encode(
        &self,
        name: &str,
        values: &[f32],
        shape: &[u64],
        options: EncodeOptions,
    ) -> Result<EncodedTensor> {
        let (rows, cols) = hypercodec_hwz::matrix_view(shape, values.len() as u64);
        let cols = cols.max(1);
        Ok(match self {
            Spec::Fixed {
                encoding: Encoding::Sparse { count, dtype },
            } => {
                let nnz = values.iter().filter(|v| **v != 0.0).count() as u64;
                let enc = Encoding::Sparse {
                    count: (*count).min(nnz),
                    dtype: *dtype,
                };
                hwz::encode(name, values, shape, &enc, options)?
            }
            Spec::Fixed {
                encoding: Encoding::LowRank { rank },
            } => {
                // One recipe for every tensor: a rank above a small tensor's own is its own.
                let (rows, cols) = hwz::matrix_view(shape, values.len() as u64);
                let r = (*rank as u64).min(rows.min(cols).max(1)) as u32;
                hwz::encode(name, values, shape, &Encoding::LowRank { rank: r }, options)?
            }
            Spec::Fixed { encoding } => hwz::encode(name, values, shape, encoding, options)?,
            Spec::Rate {
                template,
                bps,
                max_tile,
            } => {
                let t = template.for_matrix(rows, cols, *max_tile);
                match bps {
                    Some(b) => hwz::encode_to_rate(name, values, shape, &t, *b, options)?,
                    None => hwz::encode(name, values, shape, &t, options)?,
                }
            }
            Spec::Codebook { template, settings } => {
                hwz::encode_codebook(name, values, shape, template, settings)?
            }
            Spec::Mixed { block_rows, parts } => {
                let n = values.len() as u64;
                let rows = n.checked_div(cols).unwrap_or(0);
                let mut done = Vec::with_capacity(parts.len());
                let mut start = 0usize;
                for (i, p) in parts.iter().enumerate() {
                    let r = (*block_rows).min(rows.saturating_sub(i as u64 * block_rows));
                    let len = (r * cols) as usize;
                    let slice =
                        values
                            .get(start..start + len)
                            .ok_or_else(|| PlanError::Candidate {
                                message: "mixed parts exceed the tensor".into(),
                            })?;
                    done.push(p.encode(name, slice, &[r, cols], options)?);
                    start += len;
                }
                let t = hwz::assemble_mixed(*block_rows, &done);
                // Validates part count against rows.
                t.encoding.stream_lens(name, shape)?;
                t
            }
            Spec::Exceptions { base, count, dtype } => {
                let b = base.encode(name, values, shape, options)?;
                let approx = b.decode(name, shape)?;
                let (pos, _) = top_errors(values, &approx, *count as usize);
                let vals: Vec<f32> = pos.iter().map(|&p| values[p as usize]).collect();
                hwz::assemble_exceptions(name, &b, &pos, &vals, *dtype)?
            }
        })
    }
}

/// Values per trellis sequence when rounding with error feedback ([`Spec::encode_calibrated`]):
/// the feedback moves between sequences (each is searched whole), so rows are cut much finer
/// than the default 1024, at a cost in weight SNR that perplexity repays. SmolLM2-135M at 3
/// bits (`python -m hypercodec eval --models smollm2 --bps 3 --methods trellis-l12+cal`):
/// perplexity 155.8 without feedback, 116.3 / 95.4 / 77.2 with sequences of 256 / 64 / 16
/// (weight SNR 17.11 → 15.95 / 15.31 / 13.77 dB); original 50.2.
pub const CALIBRATED_TRELLIS_SEQ: u32 = 16;

impl Spec {
    /// [`Spec::encode`] with error feedback from the layer's input statistics `h` (`cols ×
    /// cols`, row-major; [`hwz::encode_calibrated`]) where the recipe's encoding has it —
    /// affine, lattice (a rate is first fitted without `h`, then the tensor is encoded with
    /// feedback at that scale, and once more at a corrected scale when feedback took it over
    /// the rate) and trellis (in sequences of at most [`CALIBRATED_TRELLIS_SEQ`] values); other
    /// recipes are encoded as [`Spec::encode`] does. Returns whether feedback was used.
    pub fn encode_calibrated(
        &self,
        name: &str,
        values: &[f32],
        shape: &[u64],
        options: EncodeOptions,
        h: &[f32],
        damp: f64,
    ) -> Result<(EncodedTensor, bool)> {
        let (rows, cols) = hypercodec_hwz::matrix_view(shape, values.len() as u64);
        let cols = cols.max(1);
        let (encoding, target) = match self {
            Spec::Fixed {
                encoding: e @ Encoding::Affine { .. },
            } => (e.clone(), None),
            Spec::Rate {
                template,
                bps,
                max_tile,
            } if matches!(template, Encoding::Lattice { .. }) => {
                let t = template.for_matrix(rows, cols, *max_tile);
                match bps {
                    Some(b) => (
                        hwz::encode_to_rate(name, values, shape, &t, *b, options)?.encoding,
                        Some(*b),
                    ),
                    None => (t, None),
                }
            }
            Spec::Rate {
                template,
                bps: None,
                max_tile,
            } if matches!(template, Encoding::Trellis { .. }) => {
                let mut e = template.for_matrix(rows, cols, *max_tile);
                // Feedback runs between sequences only (each is searched whole): shorter ones
                // give it room, at a small tail-biting cost.
                if let Encoding::Trellis { seq, .. } = &mut e {
                    *seq = (*seq).min(CALIBRATED_TRELLIS_SEQ);
                }
                (e, None)
            }
            _ => return Ok((self.encode(name, values, shape, options)?, false)),
        };
        // (one feedback factor for both scales below)
        let calibrated = hwz::Calibrated::new(name, values, shape, h, damp, options);
        let enc = calibrated.encode(&encoding)?;
        // Feedback moves the points, so their entropy: one correction of α (the rate moves
        // by about one bit per value per doubling of α) brings an entropy-coded rate back
        // under its target, when it went over.
        if let (Some(b), Encoding::Lattice { alpha, .. }) = (target, &encoding) {
            let n = values.len().max(1) as f64;
            let bps = enc.payload_bytes() as f64 * 8.0 / n;
            if bps > b {
                let a = alpha * 2f32.powf((b - bps - 0.002) as f32);
                let again = calibrated.encode(&encoding.with_alpha(a))?;
                if (again.payload_bytes() as f64 * 8.0 / n) <= b {
                    return Ok((again, true));
                }
            }
        }
        Ok((enc, true))
    }
}

/// Positions (ascending) of the `count` largest `|target − approx|`.
pub fn top_errors(target: &[f32], approx: &[f32], count: usize) -> (Vec<u64>, Vec<f32>) {
    hypercodec_hwz::top_k_errors(target, approx, count)
}

/// `value` parsed as a number inside `range`, if it is one.
fn parse_in<T: std::str::FromStr + PartialOrd>(
    value: &str,
    range: std::ops::RangeInclusive<T>,
) -> Option<T> {
    value.parse::<T>().ok().filter(|v| range.contains(v))
}

/// `value` as a number spelled in plain decimal digits without a leading zero (one spelling a
/// number: no `+4`, no `04`), if it is one that fits `T`.
fn plain_number<T: std::str::FromStr>(value: &str) -> Option<T> {
    let plain = !value.is_empty()
        && value.bytes().all(|b| b.is_ascii_digit())
        && (value == "0" || !value.starts_with('0'));
    plain.then(|| value.parse().ok()).flatten()
}

/// The prefix coding a spec's `-prefix…` suffix names: `""` [`Coding::PREFIX_GPU`], `"L"`
/// singles of at most L bits, `"LpP"` pairs of at most P bits, each optionally followed by
/// `-cN`: chunks of eight rows of N symbols (a multiple of 256 from 256 to 2^24; segments of
/// N/256 blocks of 32 columns) instead of the size the matrix calls for
/// ([`hypercodec_hwz::prefix_gpu_chunk`]); `None` for anything else or limits the coder refuses.
fn prefix_form(form: &str) -> Option<Coding> {
    if let Some((form, n)) = form.split_once("-c") {
        let n: u32 = plain_number(n)?;
        if !n.is_multiple_of(256) || !(256..=1 << 24).contains(&n) {
            return None;
        }
        return prefix_form(form).map(|c| c.with_chunk(n));
    }
    let (limit, pair_limit) = match form {
        "" => return Some(Coding::PREFIX_GPU),
        f => match f.split_once('p') {
            Some((l, p)) => (plain_number(l)?, plain_number(p)?),
            None => (plain_number(f)?, 0),
        },
    };
    let c = Coding::Prefix {
        limit,
        pair_limit,
        segment: 0,
        span: 0,
    };
    let mut p = c.prefix_params()?;
    (p.segment, p.span) = (1, 1);
    p.validate().ok().map(|()| c)
}
