//! The stream layout of every encoding: which streams a tensor has and how long each may be
//! ([`Encoding::stream_lens`]), and how nested encodings pack their parts' streams. The writer
//! produces exactly this, the reader checks it before it allocates anything, and the decoders
//! rely on it. This module knows the vocabulary ([`crate::encoding`]) and nothing of coding.

use crate::encoding::{
    element_count, matrix_view, rans_params, role, Assignments, Coding, Encoding, StreamLen,
    MAX_MODEL_LEN, MAX_SYMBOLS_PER_BYTE,
};
use crate::{HwzError, Result};
use hypercodec_hdc::{codebook, lowrank, pack};

/// Most parts of a `mixed` tensor.
pub const MAX_PARTS: u64 = 1 << 20;

fn invalid(tensor: &str, message: String) -> HwzError {
    HwzError::InvalidEncoding {
        tensor: tensor.to_string(),
        message,
    }
}

fn check_leaf(tensor: &str, e: &Encoding) -> Result<()> {
    if matches!(e, Encoding::Mixed { .. } | Encoding::Exceptions { .. }) {
        return Err(invalid(
            tensor,
            "mixed and exceptions encodings do not nest".into(),
        ));
    }
    Ok(())
}

impl Encoding {
    /// The decoded byte length of every stream of a tensor of `shape`, in a fixed order, with
    /// the parameters validated.
    ///
    /// This is the single source of truth that the writer produces, the reader checks before
    /// it allocates anything, and the decoder relies on. Raw and affine streams have exact
    /// lengths; entropy-coded lattice symbols have a minimum ([`MAX_SYMBOLS_PER_BYTE`]).
    pub fn stream_lens(
        &self,
        tensor: &str,
        shape: &[u64],
    ) -> Result<Vec<(&'static str, StreamLen)>> {
        let n = element_count(tensor, shape)?;
        let (rows, cols) = matrix_view(shape, n);
        let invalid = |message: String| HwzError::InvalidEncoding {
            tensor: tensor.to_string(),
            message,
        };
        match *self {
            Encoding::Raw { dtype } => Ok(vec![(
                role::VALUES,
                StreamLen::exact(n * dtype.size() as u64),
            )]),
            Encoding::Affine { .. } => {
                let params = self
                    .affine_params()
                    .ok_or_else(|| invalid("not affine".into()))?;
                let lens = params
                    .stream_lens(rows as usize, cols as usize)
                    .map_err(|e| invalid(e.to_string()))?;
                let mut v = vec![
                    (role::CODES, StreamLen::exact(lens.codes as u64)),
                    (role::SCALES, StreamLen::exact(lens.scales as u64)),
                ];
                if !params.symmetric {
                    v.push((role::OFFSETS, StreamLen::exact(lens.offsets as u64)));
                }
                Ok(v)
            }
            Encoding::Lattice {
                lattice,
                alpha,
                tile,
                seed: _,
                scale_dtype,
                coding,
            } => {
                if !(alpha.is_finite() && alpha > 0.0) {
                    return Err(invalid(format!(
                        "alpha {alpha} must be finite and positive"
                    )));
                }
                check_tile(tile, cols).map_err(invalid)?;
                let symbols = rows
                    .checked_mul(hypercodec_lattice::symbols_per_row(lattice, cols as usize) as u64)
                    .ok_or_else(|| invalid("symbol count overflows".into()))?;
                let coded_min = symbols.div_ceil(MAX_SYMBOLS_PER_BYTE);
                let mut v = vec![(
                    role::SCALES,
                    StreamLen::exact(rows * scale_dtype.size() as u64),
                )];
                match coding {
                    Coding::Rice { chunk } => {
                        if chunk == 0 || chunk > 1 << 24 {
                            return Err(invalid(format!("rice chunk {chunk} must be in 1..=2^24")));
                        }
                        let chunks = symbols.div_ceil(chunk as u64);
                        v.push((role::PARAMS, StreamLen::exact(chunks)));
                        v.push((role::OFFSETS, StreamLen::exact(chunks * 4)));
                        v.push((
                            role::SYMBOLS,
                            StreamLen {
                                min: coded_min,
                                max: u64::MAX,
                            },
                        ));
                    }
                    Coding::Rans {
                        chunk,
                        lanes,
                        prob_bits,
                    } => {
                        let p = rans_params(chunk, lanes, prob_bits);
                        p.validate().map_err(|e| invalid(e.to_string()))?;
                        if !(chunk as usize).is_multiple_of(lattice.dim()) {
                            return Err(invalid(format!(
                                "rans chunk {chunk} must be a multiple of {}",
                                lattice.dim()
                            )));
                        }
                        let chunks = symbols.div_ceil(chunk as u64);
                        v.push((
                            role::MODEL,
                            StreamLen {
                                min: 2,
                                max: MAX_MODEL_LEN,
                            },
                        ));
                        v.push((
                            role::INDEX,
                            StreamLen::exact(chunks * 4 * (1 + lanes as u64)),
                        ));
                        v.push((
                            role::SYMBOLS,
                            StreamLen {
                                min: coded_min,
                                max: u64::MAX,
                            },
                        ));
                    }
                    Coding::Fixed { bits } => {
                        if !(2..=8).contains(&bits) || !lattice.has_fixed() {
                            return Err(invalid(format!(
                                "no fixed-rate {lattice} with {bits} bits"
                            )));
                        }
                        let len = symbols
                            .checked_mul(bits as u64)
                            .ok_or_else(|| invalid("overflow".into()))?
                            .div_ceil(8);
                        v.push((role::SYMBOLS, StreamLen::exact(len)));
                    }
                    c @ Coding::Prefix { .. } => {
                        use hypercodec_rice::prefix as px;
                        let p = c.prefix_params().unwrap_or_default();
                        p.validate().map_err(|e| invalid(e.to_string()))?;
                        if lattice != hypercodec_lattice::Lattice::E8 {
                            return Err(invalid(format!(
                                "prefix codes are for e8 words, not {lattice}"
                            )));
                        }
                        let layout = px::Layout::new(
                            usize::try_from(rows).map_err(|_| invalid("too many rows".into()))?,
                            (cols as usize).div_ceil(px::WORD),
                            &p,
                        );
                        layout.check(&p).map_err(|e| invalid(e.to_string()))?;
                        let (singles, pairs) = if p.pairs() { (3, 2) } else { (3, 0) };
                        let model_max = p.pairs() as u64
                            + singles * (2 + px::MAX_SINGLE as u64 / 2)
                            + pairs * (2 + (px::MAX_PAIR_BASE * px::MAX_PAIR_BASE) as u64 / 2);
                        let model_min = p.pairs() as u64 + 2 * (singles + pairs);
                        v.push((
                            role::MODEL,
                            StreamLen {
                                min: model_min,
                                max: model_max,
                            },
                        ));
                        v.push((role::INDEX, StreamLen::exact(layout.chunks() as u64 * 4)));
                        v.push((
                            role::SYMBOLS,
                            StreamLen {
                                min: coded_min.next_multiple_of(4),
                                max: u64::MAX,
                            },
                        ));
                    }
                }
                Ok(v)
            }
            Encoding::Trellis {
                l,
                k,
                scale,
                tile,
                seq,
                scale_dtype,
                v,
                ..
            } => {
                if !(8..=16).contains(&l) || !(1..=8).contains(&k) || k >= l {
                    return Err(invalid(format!(
                        "trellis L = {l}, K = {k}: use 8 <= L <= 16 and 1 <= K <= 8 with K < L"
                    )));
                }
                if v != 1 && (v != 2 || k > 4 || 2 * k >= l) {
                    return Err(invalid(format!(
                        "trellis V = {v} at K = {k}, L = {l}: use V = 1, or V = 2 with K <= 4 and 2K < L"
                    )));
                }
                if v == 2 && cols % 2 != 0 {
                    return Err(invalid(format!(
                        "rows of {cols} values do not split into pairs (trellis V = 2)"
                    )));
                }
                if !(scale.is_finite() && scale > 0.0) {
                    return Err(invalid(format!(
                        "trellis scale {scale} must be finite and positive"
                    )));
                }
                if seq == 0 || seq % 8 != 0 || seq > 1 << 20 {
                    return Err(invalid(format!(
                        "trellis sequence of {seq} values: use a multiple of 8 up to 2^20"
                    )));
                }
                check_tile(tile, cols).map_err(invalid)?;
                if rows > 0 && cols > 0 && cols * (k as u64) < l as u64 {
                    return Err(invalid(format!(
                        "rows of {cols} values hold {} bits, fewer than the {l}-bit trellis state",
                        cols * k as u64
                    )));
                }
                // Every tail-biting sequence (the shortest has min(seq, cols) values) must hold
                // the state too.
                if rows > 0 && cols >= seq as u64 && (seq as u64) * (k as u64) < l as u64 {
                    return Err(invalid(format!(
                        "sequences of {seq} values hold {} bits, fewer than the {l}-bit trellis state",
                        seq as u64 * k as u64
                    )));
                }
                let row_bytes = cols
                    .checked_mul(k as u64)
                    .ok_or_else(|| invalid("overflow".into()))?
                    .div_ceil(8);
                Ok(vec![
                    (
                        role::SCALES,
                        StreamLen::exact(rows * scale_dtype.size() as u64),
                    ),
                    (
                        role::SYMBOLS,
                        StreamLen::exact(
                            rows.checked_mul(row_bytes)
                                .ok_or_else(|| invalid("overflow".into()))?,
                        ),
                    ),
                ])
            }
            Encoding::Codebook { .. } | Encoding::LowRank { .. } | Encoding::Sparse { .. } => {
                codebook_lens(self, rows, cols, n).map_err(invalid)
            }
            Encoding::Mixed { .. } | Encoding::Exceptions { .. } => {
                nested_lens(tensor, self, rows, cols, n)
            }
        }
    }
}

/// Stream lengths of the three encodings (`n = rows · cols`).
fn codebook_lens(
    encoding: &Encoding,
    rows: u64,
    cols: u64,
    n: u64,
) -> std::result::Result<Vec<(&'static str, StreamLen)>, String> {
    match *encoding {
        Encoding::Codebook {
            block,
            prototypes,
            scale_mode,
            scale_dtype,
            proto_dtype,
            assignments,
            residual,
        } => {
            if !(codebook::MIN_BLOCK..=codebook::MAX_BLOCK).contains(&(block as usize)) {
                return Err(format!("codebook block {block} must be in 2..=64"));
            }
            if !(1..=codebook::MAX_PROTOTYPES as u32).contains(&prototypes) {
                return Err(format!("prototypes {prototypes} must be in 1..=65536"));
            }
            if residual.count > n {
                return Err(format!(
                    "{} residual entries for {n} values",
                    residual.count
                ));
            }
            let blocks = rows * cols.div_ceil(block as u64);
            let bits = pack::index_bits(prototypes as usize) as u64;
            let scales = scale_mode.count(rows as usize, cols as usize, block as usize) as u64;
            let mut v = vec![
                (
                    role::PROTOTYPES,
                    StreamLen::exact(prototypes as u64 * block as u64 * proto_dtype.size() as u64),
                ),
                (
                    role::ASSIGNMENTS,
                    match assignments {
                        Assignments::Packed => StreamLen::exact((blocks * bits).div_ceil(8)),
                        Assignments::Rle => StreamLen {
                            min: 2 * u64::from(blocks > 0),
                            max: blocks * 20,
                        },
                    },
                ),
                (
                    role::SCALES,
                    StreamLen::exact(scales * scale_dtype.size() as u64),
                ),
            ];
            if residual.count > 0 {
                v.extend(residual_lens(
                    residual.count,
                    residual.dtype.values_len(residual.count),
                ));
            }
            Ok(v)
        }
        Encoding::LowRank { rank } => {
            let r = rank as u64;
            if r == 0 || r > lowrank::MAX_RANK as u64 || r > rows.min(cols) {
                return Err(format!(
                    "rank {rank} must be in 1..=min({rows}, {cols}, 1024)"
                ));
            }
            Ok(vec![
                (role::U, StreamLen::exact(rows * r)),
                (role::U_SCALES, StreamLen::exact(4 * r)),
                (role::V, StreamLen::exact(cols * r)),
                (role::V_SCALES, StreamLen::exact(4 * r)),
            ])
        }
        Encoding::Sparse { count, dtype } => {
            if count > n {
                return Err(format!("{count} sparse entries for {n} values"));
            }
            let v = residual_lens(count, count * dtype.size() as u64);
            Ok(vec![(role::INDICES, v[0].1), (role::VALUES, v[1].1)])
        }
        _ => Err("not a codebook-family encoding".into()),
    }
}

fn residual_lens(count: u64, values: u64) -> [(&'static str, StreamLen); 2] {
    [
        (
            role::RESIDUAL_INDEX,
            StreamLen {
                min: count,
                max: count * 10,
            },
        ),
        (role::RESIDUAL_VALUES, StreamLen::exact(values)),
    ]
}

/// The rows of each part of a `mixed` tensor with `rows` rows.
pub(crate) fn part_rows(
    tensor: &str,
    rows: u64,
    block_rows: u64,
    parts: usize,
) -> Result<Vec<u64>> {
    if block_rows == 0 {
        return Err(invalid(tensor, "block_rows must be positive".into()));
    }
    let n = rows.div_ceil(block_rows);
    if n != parts as u64 || n > MAX_PARTS {
        return Err(invalid(
            tensor,
            format!("{parts} parts for {rows} rows in blocks of {block_rows} (expected {n}, at most {MAX_PARTS})"),
        ));
    }
    Ok((0..n)
        .map(|i| block_rows.min(rows - i * block_rows))
        .collect())
}

fn sum_lens(lens: &[(&'static str, StreamLen)]) -> (u64, u64) {
    lens.iter().fold((0u64, 0u64), |(a, b), (_, l)| {
        (a.saturating_add(l.min), b.saturating_add(l.max))
    })
}

/// Stream lengths of `mixed` / `exceptions` for a `rows × cols` tensor of `n` values.
fn nested_lens(
    tensor: &str,
    encoding: &Encoding,
    rows: u64,
    cols: u64,
    n: u64,
) -> Result<Vec<(&'static str, StreamLen)>> {
    match encoding {
        Encoding::Mixed { block_rows, parts } => {
            let mut count = 0u64;
            let (mut lo, mut hi) = (0u64, 0u64);
            for (p, r) in parts
                .iter()
                .zip(part_rows(tensor, rows, *block_rows, parts.len())?)
            {
                check_leaf(tensor, p)?;
                let lens = p.stream_lens(tensor, &[r, cols])?;
                count += lens.len() as u64;
                let (a, b) = sum_lens(&lens);
                lo = lo.saturating_add(a);
                hi = hi.saturating_add(b);
            }
            Ok(vec![
                (role::INDEX, StreamLen::exact(8 * count)),
                (role::PAYLOAD, StreamLen { min: lo, max: hi }),
            ])
        }
        Encoding::Exceptions { base, count, dtype } => {
            check_leaf(tensor, base)?;
            if *count > n {
                return Err(invalid(
                    tensor,
                    format!("{count} exceptions for {n} values"),
                ));
            }
            let lens = base.stream_lens(tensor, &[rows, cols])?;
            let (lo, hi) = sum_lens(&lens);
            Ok(vec![
                (role::INDEX, StreamLen::exact(8 * lens.len() as u64)),
                (role::PAYLOAD, StreamLen { min: lo, max: hi }),
                (
                    role::INDICES,
                    StreamLen {
                        min: *count,
                        max: count * 10,
                    },
                ),
                (role::VALUES, StreamLen::exact(count * dtype.size() as u64)),
            ])
        }
        _ => Err(invalid(tensor, "not a nested encoding".into())),
    }
}

/// Splits `payload` by `index` into the streams of each encoding in turn, checking each
/// against its encoding's lengths, and calls `f(part, streams)`.
pub(crate) fn split<'a>(
    tensor: &str,
    encodings: &[(&Encoding, [u64; 2])],
    index: &[u8],
    payload: &'a [u8],
    mut f: impl FnMut(usize, &[(&'static str, &'a [u8])]) -> Result<()>,
) -> Result<()> {
    let mut lens = index
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
    let mut pos = 0u64;
    for (i, (e, shape)) in encodings.iter().enumerate() {
        let roles = e.stream_lens(tensor, shape)?;
        let mut streams = Vec::with_capacity(roles.len());
        for (r, _) in &roles {
            let len = lens
                .next()
                .ok_or_else(|| invalid(tensor, "index too short".into()))?;
            let end = pos
                .checked_add(len)
                .filter(|&e| e <= payload.len() as u64)
                .ok_or_else(|| invalid(tensor, "index points past the payload".into()))?;
            streams.push((*r, &payload[pos as usize..end as usize]));
            pos = end;
        }
        check_roles(
            tensor,
            &roles,
            streams.iter().map(|(r, b)| (*r, b.len() as u64)),
        )?;
        f(i, &streams)?;
    }
    if pos != payload.len() as u64 {
        return Err(invalid(
            tensor,
            "payload bytes not covered by the index".into(),
        ));
    }
    Ok(())
}

/// Checks that `present` holds exactly the roles of `lens`, each of an allowed length.
pub(crate) fn check_roles<'a>(
    tensor: &str,
    lens: &[(&'static str, StreamLen)],
    present: impl Iterator<Item = (&'a str, u64)> + Clone,
) -> Result<()> {
    for (role, _) in present.clone() {
        if !lens.iter().any(|(r, _)| *r == role) {
            return Err(HwzError::UnexpectedStream {
                tensor: tensor.to_string(),
                role: role.to_string(),
            });
        }
    }
    for (role, len) in lens {
        match present.clone().find(|(r, _)| r == role) {
            None => {
                return Err(HwzError::MissingStream {
                    tensor: tensor.to_string(),
                    role: role.to_string(),
                })
            }
            Some((_, actual)) if !len.allows(actual) => {
                return Err(HwzError::StreamSize {
                    tensor: tensor.to_string(),
                    role: role.to_string(),
                    expected: if actual < len.min { len.min } else { len.max },
                    actual,
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// An RHT tile must be a power of two up to 4096 that divides the rows.
fn check_tile(tile: u32, cols: u64) -> std::result::Result<(), String> {
    let tile = tile as u64;
    if tile == 0
        || !tile.is_power_of_two()
        || tile > hypercodec_lattice::MAX_TILE as u64
        || (cols > 0 && !cols.is_multiple_of(tile))
    {
        return Err(format!(
            "RHT tile {tile} must be a power of two <= 4096 dividing {cols}"
        ));
    }
    Ok(())
}
