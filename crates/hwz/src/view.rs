//! Borrowed, validated views of encoded tensors: the seam that decoders, the runtime, the
//! CUDA kernels and Python read.
//!
//! A [`TensorView`] is built once from an encoding, a shape and the tensor's streams (checked
//! against [`Encoding::stream_lens`], exactly as a whole decode checks them). Side information
//! that is small next to the tensor (row scales, prototypes, the rANS model, chunk tables,
//! sparse positions) is parsed at that point; the bulk (codes, symbol streams, packed
//! indices, factors) stays borrowed. Then [`TensorView::decode_rows_into`] decodes any row
//! range, touching only the bytes of those rows — for entropy-coded symbols, the chunks that
//! cover them — and gives bit for bit the rows of the whole decode, which is itself a decode
//! of all rows.
//!
//! Rows are those of the tensor's matrix view ([`crate::matrix_view`]).

use crate::encoding::{rans_params, role, Assignments, Coding, Encoding};
use crate::lattice_codec::{coding_err, contexts, lat_err};
use crate::layout::check_roles;
use crate::{element_count, matrix_view, HwzError, Result};
use half::{bf16, f16};
use hypercodec_hdc::residual::Corrections;
use hypercodec_hdc::{codebook, pack, HdcError, ScaleMode};
use hypercodec_lattice as lat;
use hypercodec_rice::{prefix, rans, rice};
use hypercodec_scalar::{self as scalar, AffineParams, FloatDtype};
use std::borrow::Cow;
use std::ops::Range;

/// Values decoded at a time when a row range is converted to f16/bf16 or decoded in parts.
const BLOCK_VALUES: usize = 1 << 16;
/// Fixed-rate symbols unpacked at a time.
const CHUNK_SYMBOLS: usize = 1 << 16;
/// Values below which a decode stays on the calling thread.
const PARALLEL_MIN_VALUES: usize = 1 << 18;

/// A validated, borrowed view of one encoded tensor.
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    tensor: String,
    shape: Vec<u64>,
    rows: u64,
    cols: u64,
    encoding: Encoding,
    parts: Parts<'a>,
}

/// The parts of an encoded tensor, by encoding.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Parts<'a> {
    /// Plain little-endian floats.
    Raw {
        /// Storage type.
        dtype: FloatDtype,
        /// `rows × cols` values.
        values: Cow<'a, [u8]>,
    },
    /// Affine integer codes with group scales ([`hypercodec_scalar`]'s layout).
    Affine {
        /// Bits, grouping, symmetry, scale type.
        params: AffineParams,
        /// Codes packed LSB-first in row-major order.
        codes: Cow<'a, [u8]>,
        /// One scale per group, groups row by row.
        scales: Cow<'a, [u8]>,
        /// One offset per group (empty when symmetric).
        offsets: Cow<'a, [u8]>,
    },
    /// Lattice symbols after an RHT, with row scales.
    Lattice(LatticeParts<'a>),
    /// Trellis bits after an RHT, with row scales.
    Trellis(TrellisParts<'a>),
    /// Prototype indices, prototypes, scales and a sparse residual.
    Codebook(CodebookParts<'a>),
    /// Int8 low-rank factors.
    LowRank(LowRankParts<'a>),
    /// Zeros except the stored values.
    Sparse {
        /// Positions (ascending) and values.
        entries: Corrections,
    },
    /// Row blocks, each a tensor of its own.
    Mixed {
        /// Rows per block (the last may be shorter).
        block_rows: u64,
        /// One view per block, top to bottom.
        parts: Vec<TensorView<'a>>,
    },
    /// A dense base with exact values at some positions.
    Exceptions {
        /// The dense base.
        base: Box<TensorView<'a>>,
        /// Positions (ascending) and their exact values.
        exceptions: Corrections,
    },
}

/// The parts of a `lattice` tensor.
#[derive(Debug, Clone)]
pub struct LatticeParts<'a> {
    /// Lattice, α, RHT tile and seed, fixed-rate bits.
    pub params: lat::LatticeParams,
    /// One scale per row, decoded.
    pub scales: Vec<f32>,
    /// Symbols per row (the row length rounded up to the lattice dimension).
    pub symbols_per_row: usize,
    /// The symbols, by coding.
    pub symbols: Symbols<'a>,
}

/// The parts of a `trellis` tensor.
#[derive(Debug, Clone)]
pub struct TrellisParts<'a> {
    /// `L`, `K` and the code scale.
    pub params: hypercodec_trellis::TrellisParams,
    /// RHT tile.
    pub tile: usize,
    /// RHT seed.
    pub seed: u64,
    /// Values per tail-biting sequence ([`hypercodec_trellis::row_sequences`]).
    pub seq: usize,
    /// One scale per row, decoded.
    pub scales: Vec<f32>,
    /// The packed bits, `row_bytes(cols)` per row.
    pub bits: Cow<'a, [u8]>,
}

impl TrellisParts<'_> {
    /// Bytes of one row's bits: `ceil(cols·K / 8)`.
    pub fn row_bytes(&self, cols: usize) -> usize {
        (cols * self.params.k as usize).div_ceil(8)
    }
}

/// Lattice symbols as stored.
#[derive(Debug, Clone)]
pub enum Symbols<'a> {
    /// Chunked Rice codes with their validated chunk table.
    Rice(rice::Decoder<'a>),
    /// Chunked interleaved rANS with its parsed model and validated chunk table.
    Rans(rans::Decoder<'a>),
    /// Every symbol in `bits` bits, LSB-first (the execution form).
    Fixed {
        /// Bits per symbol.
        bits: u8,
        /// The packed symbols.
        packed: Cow<'a, [u8]>,
    },
    /// Lane-interleaved prefix codes in chunks of eight rows (or spans of several groups of
    /// eight), with the parsed model and validated chunk table.
    Prefix(prefix::Decoder<'a>),
}

impl Symbols<'_> {
    /// For entropy-coded symbols, the symbols a chunk holds and the number of chunks, as
    /// [`Symbols::decode_chunk`] walks them (prefix codes: a span of groups of eight whole
    /// rows, all its segments); `None` for fixed-rate symbols.
    pub fn chunking(&self) -> Option<(usize, usize)> {
        match self {
            Symbols::Rans(d) => Some((d.chunk_symbols(), d.chunks())),
            Symbols::Rice(d) => Some((d.chunk_symbols(), d.chunks())),
            Symbols::Prefix(d) => {
                let l = d.layout();
                let rows = prefix::GROUP_ROWS * l.span;
                Some((rows * l.words * prefix::WORD, l.spans()))
            }
            Symbols::Fixed { .. } => None,
        }
    }

    /// The symbols of chunks `chunks` (of [`Symbols::chunking`]); empty for fixed-rate symbols.
    pub fn symbol_range(&self, chunks: Range<usize>) -> Range<usize> {
        match self {
            Symbols::Rans(d) => d.symbol_range(chunks),
            Symbols::Rice(d) => d.symbol_range(chunks),
            Symbols::Prefix(d) => {
                let l = d.layout();
                let row = |c: usize| c.saturating_mul(prefix::GROUP_ROWS * l.span).min(l.rows);
                let spr = l.words * prefix::WORD;
                row(chunks.start) * spr..row(chunks.end) * spr
            }
            Symbols::Fixed { .. } => 0..0,
        }
    }

    /// Decodes chunk `c` (of [`Symbols::chunking`]) of a `lattice`'s symbols into `buf`,
    /// returning its symbol range; fixed-rate symbols have no chunks (an empty range).
    pub fn decode_chunk(
        &self,
        lattice: lat::Lattice,
        c: usize,
        buf: &mut Vec<u32>,
    ) -> std::result::Result<Range<usize>, hypercodec_rice::CodingError> {
        let have = self.symbol_range(c..c + 1);
        buf.resize(have.len(), 0);
        match self {
            Symbols::Rans(d) => d.decode_chunks(c..c + 1, contexts(&lattice), buf)?,
            Symbols::Rice(d) => d.decode_chunks(c..c + 1, buf)?,
            Symbols::Prefix(d) => {
                let l = d.layout();
                let g = (c * l.span).min(l.groups())..((c + 1) * l.span).min(l.groups());
                d.decode_groups(g, buf)?
            }
            Symbols::Fixed { .. } => {}
        }
        Ok(have)
    }
}

/// The parts of a `codebook` tensor.
#[derive(Debug, Clone)]
pub struct CodebookParts<'a> {
    /// Values per block.
    pub block: usize,
    /// What one scale covers.
    pub scale_mode: ScaleMode,
    /// `prototypes × block` values, decoded.
    pub protos: Vec<f32>,
    /// The scales, decoded.
    pub scales: Vec<f32>,
    /// Prototype index per block, as stored.
    pub assignments: AssignmentsRef<'a>,
    /// Sparse corrections added after the codebook (empty when none).
    pub residual: Corrections,
}

/// Prototype indices as stored.
#[derive(Debug, Clone)]
pub enum AssignmentsRef<'a> {
    /// `bits` bits each, LSB-first: any row's indices are read directly.
    Packed {
        /// Bits per index.
        bits: u32,
        /// The packed indices.
        bytes: Cow<'a, [u8]>,
    },
    /// `(index, run − 1)` varint pairs: a row range is found by scanning from the start.
    Rle(Cow<'a, [u8]>),
}

/// The parts of a `lowrank` tensor: `W ≈ (U·diag(su))·(V·diag(sv))ᵀ`.
#[derive(Debug, Clone)]
pub struct LowRankParts<'a> {
    /// Rank.
    pub rank: usize,
    /// `rows × rank` int8 codes.
    pub u: Cow<'a, [u8]>,
    /// Scales of U's columns.
    pub u_scales: Vec<f32>,
    /// `cols × rank` int8 codes.
    pub v: Cow<'a, [u8]>,
    /// Scales of V's columns.
    pub v_scales: Vec<f32>,
}

/// An output buffer of decoded values.
#[derive(Debug)]
pub enum OutBuf<'o> {
    /// f32 values.
    F32(&'o mut [f32]),
    /// IEEE half values (rounded to nearest even).
    F16(&'o mut [f16]),
    /// bfloat16 values (rounded to nearest even).
    Bf16(&'o mut [bf16]),
}

impl OutBuf<'_> {
    fn len(&self) -> usize {
        match self {
            OutBuf::F32(o) => o.len(),
            OutBuf::F16(o) => o.len(),
            OutBuf::Bf16(o) => o.len(),
        }
    }
}

fn hdc_err(tensor: &str) -> impl Fn(HdcError) -> HwzError + '_ {
    move |source| HwzError::Codebook {
        tensor: tensor.to_string(),
        source,
    }
}

fn floats(tensor: &str, bytes: &[u8], dtype: FloatDtype) -> Result<Vec<f32>> {
    scalar::decode_floats(bytes, dtype).map_err(crate::encoding::scalar_err(tensor))
}

fn finite(tensor: &str, v: &[f32], what: &str) -> Result<()> {
    if v.iter().all(|x| x.is_finite()) {
        Ok(())
    } else {
        Err(hdc_err(tensor)(HdcError::Corrupt {
            message: format!("non-finite {what}"),
        }))
    }
}

impl<'a> TensorView<'a> {
    /// Validates `streams` (role → decoded bytes) against `encoding` and `shape` and parses the
    /// side information. A missing, extra or wrongly sized stream, or side information that
    /// cannot be right (a non-finite scale, a corrupt chunk table), is a typed error.
    pub fn new(
        tensor: &str,
        encoding: &Encoding,
        shape: &[u64],
        streams: &[(&str, &'a [u8])],
    ) -> Result<Self> {
        let n = element_count(tensor, shape)?;
        let lens = encoding.stream_lens(tensor, shape)?;
        check_roles(
            tensor,
            &lens,
            streams.iter().map(|(r, b)| (*r, b.len() as u64)),
        )?;
        let get = |role: &str| -> &'a [u8] {
            streams
                .iter()
                .find(|(r, _)| *r == role)
                .map(|(_, b)| *b)
                .unwrap_or(&[])
        };
        let (rows, cols) = matrix_view(shape, n);
        let parts = Self::parts(tensor, encoding, rows, cols, &get)?;
        Ok(TensorView {
            tensor: tensor.to_string(),
            shape: shape.to_vec(),
            rows,
            cols,
            encoding: encoding.clone(),
            parts,
        })
    }

    fn parts(
        tensor: &str,
        encoding: &Encoding,
        rows: u64,
        cols: u64,
        get: &dyn Fn(&str) -> &'a [u8],
    ) -> Result<Parts<'a>> {
        let n = rows * cols;
        Ok(match *encoding {
            Encoding::Raw { dtype } => Parts::Raw {
                dtype,
                values: Cow::Borrowed(get(role::VALUES)),
            },
            Encoding::Affine { .. } => Parts::Affine {
                params: encoding
                    .affine_params()
                    .ok_or_else(|| HwzError::InvalidEncoding {
                        tensor: tensor.to_string(),
                        message: "not affine".into(),
                    })?,
                codes: Cow::Borrowed(get(role::CODES)),
                scales: Cow::Borrowed(get(role::SCALES)),
                offsets: Cow::Borrowed(get(role::OFFSETS)),
            },
            Encoding::Lattice {
                lattice,
                scale_dtype,
                coding,
                ..
            } => {
                let params =
                    encoding
                        .lattice_params()
                        .ok_or_else(|| HwzError::InvalidEncoding {
                            tensor: tensor.to_string(),
                            message: "not a lattice encoding".into(),
                        })?;
                let scales = floats(tensor, get(role::SCALES), scale_dtype)?;
                let spr = lat::symbols_per_row(lattice, cols as usize);
                // Justified by the stream sizes: at most MAX_SYMBOLS_PER_BYTE symbols per byte.
                let total = rows as usize * spr;
                let symbols = match coding {
                    Coding::Rice { chunk } => Symbols::Rice(
                        rice::Decoder::new(
                            rice::RiceParts {
                                params: get(role::PARAMS),
                                offsets: get(role::OFFSETS),
                                payload: get(role::SYMBOLS),
                            },
                            chunk as usize,
                            total,
                        )
                        .map_err(coding_err(tensor))?,
                    ),
                    Coding::Rans {
                        chunk,
                        lanes,
                        prob_bits,
                    } => Symbols::Rans(
                        rans::Decoder::new(
                            rans::RansParts {
                                model: get(role::MODEL),
                                index: get(role::INDEX),
                                payload: get(role::SYMBOLS),
                            },
                            &rans_params(chunk, lanes, prob_bits),
                            total,
                        )
                        .map_err(coding_err(tensor))?,
                    ),
                    Coding::Fixed { bits } => Symbols::Fixed {
                        bits,
                        packed: Cow::Borrowed(get(role::SYMBOLS)),
                    },
                    c @ Coding::Prefix { .. } => Symbols::Prefix(
                        prefix::Decoder::new(
                            get(role::MODEL),
                            get(role::INDEX),
                            get(role::SYMBOLS),
                            prefix::Layout::new(
                                rows as usize,
                                spr / prefix::WORD,
                                &c.prefix_params().unwrap_or_default(),
                            ),
                            &c.prefix_params().unwrap_or_default(),
                        )
                        .map_err(coding_err(tensor))?,
                    ),
                };
                Parts::Lattice(LatticeParts {
                    params,
                    scales,
                    symbols_per_row: spr,
                    symbols,
                })
            }
            Encoding::Trellis { .. } => {
                let t = crate::trellis_codec::TrellisLayout::of(tensor, encoding)?;
                let scales = floats(tensor, get(role::SCALES), t.scale_dtype)?;
                finite(tensor, &scales, "row scales")?;
                Parts::Trellis(TrellisParts {
                    params: t.params,
                    tile: t.tile,
                    seed: t.seed,
                    seq: t.seq,
                    scales,
                    bits: Cow::Borrowed(get(role::SYMBOLS)),
                })
            }
            Encoding::Codebook {
                block,
                prototypes,
                scale_mode,
                scale_dtype,
                proto_dtype,
                assignments,
                residual,
            } => {
                let protos = floats(tensor, get(role::PROTOTYPES), proto_dtype)?;
                let scales = floats(tensor, get(role::SCALES), scale_dtype)?;
                finite(tensor, &protos, "prototype")?;
                finite(tensor, &scales, "scale")?;
                let assignments = match assignments {
                    Assignments::Packed => AssignmentsRef::Packed {
                        bits: pack::index_bits(prototypes as usize),
                        bytes: Cow::Borrowed(get(role::ASSIGNMENTS)),
                    },
                    Assignments::Rle => AssignmentsRef::Rle(Cow::Borrowed(get(role::ASSIGNMENTS))),
                };
                let residual = if residual.count > 0 {
                    Corrections::decode(
                        get(role::RESIDUAL_INDEX),
                        get(role::RESIDUAL_VALUES),
                        residual.count as usize,
                        residual.dtype,
                        n,
                    )
                    .map_err(hdc_err(tensor))?
                } else {
                    Corrections::default()
                };
                Parts::Codebook(CodebookParts {
                    block: block as usize,
                    scale_mode,
                    protos,
                    scales,
                    assignments,
                    residual,
                })
            }
            Encoding::LowRank { rank } => {
                let f32s = |b: &[u8]| -> Vec<f32> {
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect()
                };
                let u_scales = f32s(get(role::U_SCALES));
                let v_scales = f32s(get(role::V_SCALES));
                if u_scales.iter().chain(&v_scales).any(|s| !s.is_finite()) {
                    return Err(hdc_err(tensor)(HdcError::Corrupt {
                        message: "non-finite low-rank scale".into(),
                    }));
                }
                Parts::LowRank(LowRankParts {
                    rank: rank as usize,
                    u: Cow::Borrowed(get(role::U)),
                    u_scales,
                    v: Cow::Borrowed(get(role::V)),
                    v_scales,
                })
            }
            Encoding::Sparse { count, dtype } => {
                let values = floats(tensor, get(role::VALUES), dtype)?;
                finite(tensor, &values, "sparse value")?;
                let positions = pack::decode_positions(get(role::INDICES), count as usize, n)
                    .map_err(hdc_err(tensor))?;
                Parts::Sparse {
                    entries: Corrections { positions, values },
                }
            }
            Encoding::Mixed {
                block_rows,
                ref parts,
            } => {
                let rs = crate::layout::part_rows(tensor, rows, block_rows, parts.len())?;
                let shapes: Vec<(&Encoding, [u64; 2])> = parts
                    .iter()
                    .zip(&rs)
                    .map(|(p, &r)| (p, [r, cols]))
                    .collect();
                let mut views = Vec::with_capacity(parts.len());
                crate::layout::split(
                    tensor,
                    &shapes,
                    get(role::INDEX),
                    get(role::PAYLOAD),
                    |i, streams| {
                        views.push(TensorView::new(tensor, &parts[i], &[rs[i], cols], streams)?);
                        Ok(())
                    },
                )?;
                Parts::Mixed {
                    block_rows,
                    parts: views,
                }
            }
            Encoding::Exceptions {
                ref base,
                count,
                dtype,
            } => {
                let mut inner = None;
                crate::layout::split(
                    tensor,
                    &[(base, [rows, cols])],
                    get(role::INDEX),
                    get(role::PAYLOAD),
                    |_, streams| {
                        inner = Some(TensorView::new(tensor, base, &[rows, cols], streams)?);
                        Ok(())
                    },
                )?;
                let base = inner.ok_or_else(|| HwzError::InvalidEncoding {
                    tensor: tensor.to_string(),
                    message: "exceptions without a base".into(),
                })?;
                let values = floats(tensor, get(role::VALUES), dtype)?;
                let positions = pack::decode_positions(get(role::INDICES), count as usize, n)
                    .map_err(hdc_err(tensor))?;
                Parts::Exceptions {
                    base: Box::new(base),
                    exceptions: Corrections { positions, values },
                }
            }
        })
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.tensor
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Rows of the matrix view.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Values per row of the matrix view.
    pub fn cols(&self) -> u64 {
        self.cols
    }

    /// The encoding.
    pub fn encoding(&self) -> &Encoding {
        &self.encoding
    }

    /// The parts, for executing them without decoding.
    pub fn parts_ref(&self) -> &Parts<'a> {
        &self.parts
    }

    /// The parts, taken out of the view.
    pub fn into_parts(self) -> Parts<'a> {
        self.parts
    }

    fn check_range(&self, range: &Range<u64>, len: usize) -> Result<()> {
        if range.start > range.end || range.end > self.rows {
            return Err(HwzError::RowRange {
                tensor: self.tensor.clone(),
                start: range.start,
                end: range.end,
                rows: self.rows,
            });
        }
        let expected = (range.end - range.start) * self.cols;
        if len as u64 != expected {
            return Err(HwzError::ElementCount {
                tensor: self.tensor.clone(),
                shape: vec![range.end - range.start, self.cols],
                expected,
                actual: len as u64,
            });
        }
        Ok(())
    }

    /// Decodes rows `range` of the matrix view into `out` (exactly their values), bit for bit
    /// as those rows of a whole decode. Large ranges are split across the workspace's threads.
    pub fn decode_rows_into(&self, range: Range<u64>, out: &mut [f32]) -> Result<()> {
        self.check_range(&range, out.len())?;
        let cols = self.cols as usize;
        let rows = (range.end - range.start) as usize;
        if rows < 2 || out.len() < PARALLEL_MIN_VALUES || crate::par::threads() < 2 {
            return self.decode_rows_serial(range, out);
        }
        let per = rows.div_ceil(crate::par::threads()).max(1);
        let jobs: Vec<(u64, &mut [f32])> = out
            .chunks_mut(per * cols)
            .enumerate()
            .map(|(i, o)| (range.start + (i * per) as u64, o))
            .collect();
        crate::par::map(jobs, |(start, o)| {
            let n = (o.len() / cols.max(1)) as u64;
            self.decode_rows_serial(start..start + n, o)
        })
        .into_iter()
        .collect()
    }

    /// Decodes rows `range` into an f32, f16 or bf16 buffer. A raw tensor stored in the
    /// buffer's own type is copied; otherwise rows are decoded in blocks of at most
    /// 65 536 values through a small f32 buffer, never the whole tensor.
    pub fn decode_rows_to(&self, range: Range<u64>, out: OutBuf<'_>) -> Result<()> {
        self.check_range(&range, out.len())?;
        let cols = self.cols as usize;
        let out = match out {
            OutBuf::F32(o) => return self.decode_rows_into(range, o),
            other => other,
        };
        if let Parts::Raw { dtype, values } = &self.parts {
            let size = dtype.size();
            let bytes =
                &values[range.start as usize * cols * size..range.end as usize * cols * size];
            match (dtype, out) {
                (FloatDtype::F16, OutBuf::F16(o)) => {
                    for (v, b) in o.iter_mut().zip(bytes.chunks_exact(2)) {
                        *v = f16::from_le_bytes([b[0], b[1]]);
                    }
                    return Ok(());
                }
                (FloatDtype::Bf16, OutBuf::Bf16(o)) => {
                    for (v, b) in o.iter_mut().zip(bytes.chunks_exact(2)) {
                        *v = bf16::from_le_bytes([b[0], b[1]]);
                    }
                    return Ok(());
                }
                (_, out) => return self.decode_rows_converting(range, out),
            }
        }
        self.decode_rows_converting(range, out)
    }

    fn decode_rows_converting(&self, range: Range<u64>, mut out: OutBuf<'_>) -> Result<()> {
        let cols = (self.cols as usize).max(1);
        let block_rows = (BLOCK_VALUES / cols).max(1) as u64;
        let mut buf = Vec::new();
        let mut r = range.start;
        while r < range.end {
            let e = (r + block_rows).min(range.end);
            let (a, b) = (
                ((r - range.start) as usize) * self.cols as usize,
                ((e - range.start) as usize) * self.cols as usize,
            );
            buf.resize(b - a, 0.0);
            self.decode_rows_into(r..e, &mut buf)?;
            match &mut out {
                OutBuf::F32(o) => o[a..b].copy_from_slice(&buf),
                OutBuf::F16(o) => o[a..b]
                    .iter_mut()
                    .zip(&buf)
                    .for_each(|(d, &v)| *d = f16::from_f32(v)),
                OutBuf::Bf16(o) => o[a..b]
                    .iter_mut()
                    .zip(&buf)
                    .for_each(|(d, &v)| *d = bf16::from_f32(v)),
            }
            r = e;
        }
        Ok(())
    }

    /// The stored bytes that decoding rows `range` reads, side information parsed at
    /// construction excluded (for entropy-coded symbols: the payload of the covering chunks).
    pub fn stored_bytes_for_rows(&self, range: Range<u64>) -> Result<u64> {
        self.check_range(&range, ((range.end - range.start) * self.cols) as usize)?;
        let cols = self.cols;
        let rows_bytes =
            |bits_per_value: u64| ((range.end - range.start) * cols * bits_per_value).div_ceil(8);
        Ok(match &self.parts {
            Parts::Raw { dtype, .. } => rows_bytes(8 * dtype.size() as u64),
            Parts::Affine { params, .. } => rows_bytes(params.bits as u64),
            Parts::Lattice(l) => {
                let spr = l.symbols_per_row as u64;
                match &l.symbols {
                    Symbols::Fixed { bits, .. } => {
                        ((range.end - range.start) * spr * *bits as u64).div_ceil(8)
                    }
                    Symbols::Rice(d) => {
                        d.payload_bytes(chunk_range(spr, d.chunk_symbols() as u64, &range))
                    }
                    Symbols::Rans(d) => d
                        .payload_bytes(chunk_range(spr, d.chunk_symbols() as u64, &range))
                        .map_err(coding_err(&self.tensor))?,
                    Symbols::Prefix(d) => d.payload_bytes(prefix_groups(&range)),
                }
            }
            Parts::Trellis(t) => (range.end - range.start) * t.row_bytes(cols as usize) as u64,
            Parts::Codebook(c) => match &c.assignments {
                AssignmentsRef::Packed { bits, .. } => {
                    let bpr = cols.div_ceil(c.block as u64);
                    ((range.end - range.start) * bpr * *bits as u64).div_ceil(8)
                }
                AssignmentsRef::Rle(b) => b.len() as u64,
            },
            Parts::LowRank(l) => (range.end - range.start) * l.rank as u64,
            Parts::Sparse { .. } => 0,
            Parts::Mixed { block_rows, parts } => {
                let mut total = 0;
                for (i, p) in parts.iter().enumerate() {
                    let s = i as u64 * block_rows;
                    let (a, b) = (range.start.max(s), range.end.min(s + p.rows));
                    if a < b {
                        total += p.stored_bytes_for_rows(a - s..b - s)?;
                    }
                }
                total
            }
            Parts::Exceptions { base, .. } => base.stored_bytes_for_rows(range)?,
        })
    }

    fn decode_rows_serial(&self, range: Range<u64>, out: &mut [f32]) -> Result<()> {
        let tensor = self.tensor.as_str();
        let cols = self.cols as usize;
        let (a, b) = (range.start as usize, range.end as usize);
        let count = b - a;
        let first_value = (a * cols) as u64;
        if count == 0 || cols == 0 {
            return Ok(());
        }
        match &self.parts {
            Parts::Raw { dtype, values } => {
                let size = dtype.size();
                scalar::decode_floats_into(&values[a * cols * size..b * cols * size], *dtype, out)
                    .map_err(crate::encoding::scalar_err(tensor))
            }
            Parts::Affine {
                params,
                codes,
                scales,
                offsets,
            } => scalar::affine_decode_rows_into(
                scalar::AffineStreams {
                    codes,
                    scales,
                    offsets,
                },
                self.rows as usize,
                cols,
                params,
                a,
                out,
            )
            .map_err(crate::encoding::scalar_err(tensor)),
            Parts::Lattice(l) => self.decode_lattice_rows(l, a, b, out),
            Parts::Trellis(t) => crate::trellis_codec::decode_rows(tensor, t, cols, a..b, out),
            Parts::Codebook(c) => {
                let bpr = cols.div_ceil(c.block);
                let total = self.rows as usize * bpr;
                let mut idx = vec![0u32; count * bpr];
                match &c.assignments {
                    AssignmentsRef::Packed { bits, bytes } => {
                        pack::unpack_range_into(bytes, *bits, total, a * bpr, &mut idx)
                    }
                    AssignmentsRef::Rle(bytes) => {
                        let mut all = vec![0u32; b * bpr];
                        let k = (c.protos.len() / c.block.max(1)) as u32;
                        pack::rle_decode_prefix_into(bytes, k, total, &mut all).map(|()| {
                            idx.copy_from_slice(&all[a * bpr..]);
                        })
                    }
                }
                .map_err(hdc_err(tensor))?;
                let cb = hypercodec_hdc::CodebookRef {
                    block: c.block,
                    scale_mode: c.scale_mode,
                    protos: &c.protos,
                    assignments: &idx,
                    scales: &c.scales,
                };
                codebook::decode_rows_into(&cb, self.rows as usize, cols, a, out)
                    .map_err(hdc_err(tensor))?;
                c.residual.apply(first_value, out, false);
                Ok(())
            }
            Parts::LowRank(l) => {
                let r = l.rank;
                let (us, vs) = (&l.u[a * r..b * r], &l.v[..]);
                if r == 0 || l.u_scales.len() != r || l.v_scales.len() != r {
                    return Err(hdc_err(tensor)(HdcError::Shape {
                        message: format!("low-rank parts do not match {}×{cols}", self.rows),
                    }));
                }
                let scaled = |codes: &[u8], scales: &[f32]| -> Vec<f32> {
                    codes
                        .chunks_exact(r)
                        .flat_map(|x| x.iter().zip(scales).map(|(&c, &s)| c as i8 as f32 * s))
                        .collect()
                };
                let (us, vs) = (scaled(us, &l.u_scales), scaled(vs, &l.v_scales));
                for (i, row) in out.chunks_exact_mut(cols.max(1)).enumerate() {
                    let ur = &us[i * r..(i + 1) * r];
                    for (o, vr) in row.iter_mut().zip(vs.chunks_exact(r)) {
                        *o = ur.iter().zip(vr).map(|(a, b)| a * b).sum();
                    }
                }
                Ok(())
            }
            Parts::Sparse { entries } => {
                out.fill(0.0);
                entries.apply(first_value, out, true);
                Ok(())
            }
            Parts::Mixed { block_rows, parts } => {
                for (i, p) in parts.iter().enumerate() {
                    let s = i as u64 * block_rows;
                    let (pa, pb) = (range.start.max(s), range.end.min(s + p.rows));
                    if pa < pb {
                        let o = &mut out[(pa - range.start) as usize * cols
                            ..(pb - range.start) as usize * cols];
                        p.decode_rows_serial(pa - s..pb - s, o)?;
                    }
                }
                Ok(())
            }
            Parts::Exceptions { base, exceptions } => {
                base.decode_rows_serial(range, out)?;
                exceptions.apply(first_value, out, true);
                Ok(())
            }
        }
    }
}

impl TensorView<'_> {
    /// Rows `a..b` of a lattice tensor, streamed: symbols are decoded a chunk (or, fixed-rate,
    /// a batch of rows) at a time and each completed row is dequantized at once, so the
    /// working memory is one chunk plus one row of symbols, not the range's symbols.
    fn decode_lattice_rows(
        &self,
        l: &LatticeParts<'_>,
        a: usize,
        b: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let tensor = self.tensor.as_str();
        let cols = self.cols as usize;
        let spr = l.symbols_per_row;
        let (first, end) = (a * spr, b * spr);
        // Symbols of rows `row..` not yet dequantized, starting at symbol `row * spr`.
        let mut pending: Vec<u32> = Vec::new();
        let mut row = a;
        let mut flush = |pending: &mut Vec<u32>, row: &mut usize| -> Result<()> {
            let n = pending.len() / spr.max(1);
            if n == 0 {
                return Ok(());
            }
            let o = &mut out[(*row - a) * cols..(*row - a + n) * cols];
            lat::dequantize_rows_into(
                &pending[..n * spr],
                &l.scales[*row..*row + n],
                n,
                cols,
                &l.params,
                o,
            )
            .map_err(lat_err(tensor))?;
            pending.drain(..n * spr);
            *row += n;
            Ok(())
        };
        match &l.symbols {
            Symbols::Fixed { bits, packed } => {
                let batch = (CHUNK_SYMBOLS / spr.max(1)).max(1) * spr;
                let mut codes = vec![0u8; batch.min(end - first)];
                let mut s = first;
                while s < end {
                    let n = batch.min(end - s);
                    scalar::unpack_bits_range_into(
                        packed,
                        *bits,
                        self.rows as usize * spr,
                        s,
                        &mut codes[..n],
                    )
                    .map_err(crate::encoding::scalar_err(tensor))?;
                    pending.extend(codes[..n].iter().map(|&c| c as u32));
                    flush(&mut pending, &mut row)?;
                    s += n;
                }
            }
            coded => {
                // Rice, rANS and prefix chunks alike (prefix: a span of groups of eight rows).
                let (chunk, _) = coded.chunking().unwrap_or((1, 0));
                let mut buf = Vec::new();
                for c in chunk_range(spr as u64, chunk as u64, &(a as u64..b as u64)) {
                    let have = coded
                        .decode_chunk(l.params.lattice, c, &mut buf)
                        .map_err(coding_err(tensor))?;
                    let (x, y) = (have.start.max(first), have.end.min(end));
                    pending.extend_from_slice(&buf[x - have.start..y - have.start]);
                    flush(&mut pending, &mut row)?;
                }
            }
        }
        debug_assert!(row == b && pending.is_empty());
        Ok(())
    }
}

/// The groups of eight rows that rows `range` lie in (`payload_bytes` counts their chunks).
fn prefix_groups(range: &Range<u64>) -> Range<usize> {
    let g = prefix::GROUP_ROWS as u64;
    if range.start >= range.end {
        return 0..0;
    }
    (range.start / g) as usize..range.end.div_ceil(g) as usize
}

fn own(b: Cow<'_, [u8]>) -> Cow<'static, [u8]> {
    Cow::Owned(b.into_owned())
}

impl TensorView<'_> {
    /// The same view owning copies of the bytes it borrowed, for an operator that outlives
    /// the archive it was read from.
    pub fn into_owned(self) -> TensorView<'static> {
        TensorView {
            tensor: self.tensor,
            shape: self.shape,
            rows: self.rows,
            cols: self.cols,
            encoding: self.encoding,
            parts: self.parts.into_owned(),
        }
    }

    /// Bytes the view holds: its streams (borrowed or owned) and the side information parsed
    /// from them (decoded scales and prototypes, sparse positions, chunk tables).
    pub fn held_bytes(&self) -> u64 {
        self.parts.held_bytes()
    }
}

impl Parts<'_> {
    /// The same parts owning copies of the bytes they borrowed.
    pub fn into_owned(self) -> Parts<'static> {
        match self {
            Parts::Raw { dtype, values } => Parts::Raw {
                dtype,
                values: own(values),
            },
            Parts::Affine {
                params,
                codes,
                scales,
                offsets,
            } => Parts::Affine {
                params,
                codes: own(codes),
                scales: own(scales),
                offsets: own(offsets),
            },
            Parts::Lattice(l) => Parts::Lattice(LatticeParts {
                params: l.params,
                scales: l.scales,
                symbols_per_row: l.symbols_per_row,
                symbols: match l.symbols {
                    Symbols::Rice(d) => Symbols::Rice(d.into_owned()),
                    Symbols::Rans(d) => Symbols::Rans(d.into_owned()),
                    Symbols::Prefix(d) => Symbols::Prefix(d.into_owned()),
                    Symbols::Fixed { bits, packed } => Symbols::Fixed {
                        bits,
                        packed: own(packed),
                    },
                },
            }),
            Parts::Trellis(t) => Parts::Trellis(TrellisParts {
                bits: own(t.bits),
                ..t
            }),
            Parts::Codebook(c) => Parts::Codebook(CodebookParts {
                block: c.block,
                scale_mode: c.scale_mode,
                protos: c.protos,
                scales: c.scales,
                assignments: match c.assignments {
                    AssignmentsRef::Packed { bits, bytes } => AssignmentsRef::Packed {
                        bits,
                        bytes: own(bytes),
                    },
                    AssignmentsRef::Rle(b) => AssignmentsRef::Rle(own(b)),
                },
                residual: c.residual,
            }),
            Parts::LowRank(l) => Parts::LowRank(LowRankParts {
                rank: l.rank,
                u: own(l.u),
                u_scales: l.u_scales,
                v: own(l.v),
                v_scales: l.v_scales,
            }),
            Parts::Sparse { entries } => Parts::Sparse { entries },
            Parts::Mixed { block_rows, parts } => Parts::Mixed {
                block_rows,
                parts: parts.into_iter().map(TensorView::into_owned).collect(),
            },
            Parts::Exceptions { base, exceptions } => Parts::Exceptions {
                base: Box::new(base.into_owned()),
                exceptions,
            },
        }
    }

    /// Bytes held: streams and parsed side information.
    pub fn held_bytes(&self) -> u64 {
        let f = |v: &[f32]| 4 * v.len() as u64;
        let corr = |c: &Corrections| 12 * c.positions.len() as u64;
        match self {
            Parts::Raw { values, .. } => values.len() as u64,
            Parts::Affine {
                codes,
                scales,
                offsets,
                ..
            } => (codes.len() + scales.len() + offsets.len()) as u64,
            Parts::Lattice(l) => {
                f(&l.scales)
                    + match &l.symbols {
                        Symbols::Rice(d) => d.stream_bytes(),
                        Symbols::Rans(d) => d.stream_bytes(),
                        Symbols::Prefix(d) => d.stream_bytes(),
                        Symbols::Fixed { packed, .. } => packed.len() as u64,
                    }
            }
            Parts::Trellis(t) => f(&t.scales) + t.bits.len() as u64,
            Parts::Codebook(c) => {
                f(&c.protos)
                    + f(&c.scales)
                    + corr(&c.residual)
                    + match &c.assignments {
                        AssignmentsRef::Packed { bytes, .. } => bytes.len() as u64,
                        AssignmentsRef::Rle(b) => b.len() as u64,
                    }
            }
            Parts::LowRank(l) => (l.u.len() + l.v.len()) as u64 + f(&l.u_scales) + f(&l.v_scales),
            Parts::Sparse { entries } => corr(entries),
            Parts::Mixed { parts, .. } => parts.iter().map(TensorView::held_bytes).sum(),
            Parts::Exceptions { base, exceptions } => base.held_bytes() + corr(exceptions),
        }
    }
}

/// The chunks of `chunk` symbols that hold rows `range` of `spr` symbols each.
fn chunk_range(spr: u64, chunk: u64, range: &Range<u64>) -> Range<usize> {
    let (s, e) = (range.start * spr, range.end * spr);
    if s == e {
        return 0..0;
    }
    (s / chunk) as usize..e.div_ceil(chunk) as usize
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
