//! Interleaved rANS with a static, multi-context model, in independent chunks.
//!
//! State `x` is 32 bits, kept in `[L, 2³²)` with `L = 2¹⁶`, renormalized by 16-bit words.
//! Probabilities are frequencies summing to `M = 2^prob_bits`. Encoding symbol `s` with
//! frequency `f` and cumulative frequency `c`: if `x ≥ f·2^(32−prob_bits)` emit the low 16 bits
//! and shift; then `x ← ⌊x/f⌋·M + (x mod f) + c`. Decoding inverts it: `slot = x mod M`,
//! `s` = the symbol whose range holds `slot`, `x ← f·⌊x/M⌋ + slot − c`, and a 16-bit word is
//! read while `x < L`.
//!
//! **Lanes.** Symbol `i` of a chunk belongs to lane `i mod lanes`; each lane has its own state
//! and all lanes share one word stream, read in symbol order (a GPU warp decodes one symbol per
//! lane per step and finds its words with a prefix sum of who needs one). Encoders run
//! backwards and reverse the stream; every lane starts at `L`, its final state is stored in
//! the chunk table, and a decoder checks that every lane returns to `L` and every word is read.
//!
//! **Contexts.** Symbols come in words of `word` symbols; symbol `j` of a word uses the
//! frequency table `context(j, first symbol of the word)`, so the first symbol, decoded first,
//! can select the model of the others (E8 uses it for the coset bit).
//!
//! **Escapes.** A context whose largest symbol is ≥ [`MAX_DIRECT`] gets one extra symbol,
//! index `MAX_DIRECT`, meaning "the value follows in the stream as two 16-bit words (high, low)".
//!
//! Streams: `model` (prob_bits, then per context the alphabet size and the frequencies as
//! LEB128 varints), `index` (per chunk a little-endian `u32` word offset, then `lanes` final
//! states as `u32`), `payload` (16-bit words, little-endian).

use crate::{chunk_count, CodingError, Result};
use std::borrow::Cow;

/// Symbols below this are coded directly; larger ones are escaped.
pub const MAX_DIRECT: u32 = 256;
/// Smallest and largest probability precision.
pub const PROB_BITS_RANGE: std::ops::RangeInclusive<u8> = 8..=15;
/// Most lanes per chunk.
pub const MAX_LANES: usize = 64;
/// Most contexts.
pub const MAX_CONTEXTS: usize = 16;
const L: u32 = 1 << 16;

/// Parameters of the rANS coder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RansParams {
    /// Symbols per chunk. By default, 2^18.
    pub chunk: usize,
    /// Interleaved states per chunk (a GPU warp's lanes). By default, 32.
    pub lanes: usize,
    /// Probability precision in bits (8..=15). By default, 14.
    pub prob_bits: u8,
}

impl Default for RansParams {
    fn default() -> Self {
        RansParams {
            chunk: 1 << 18,
            lanes: 32,
            prob_bits: 14,
        }
    }
}

impl RansParams {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        if self.chunk == 0 || self.chunk > 1 << 24 {
            return Err(CodingError::Invalid {
                what: "rans chunk",
                value: self.chunk as u64,
            });
        }
        if self.lanes == 0 || self.lanes > MAX_LANES {
            return Err(CodingError::Invalid {
                what: "rans lanes",
                value: self.lanes as u64,
            });
        }
        check_prob_bits(self.prob_bits)
    }

    /// Bytes of the chunk table for `n` symbols.
    pub fn index_len(&self, n: usize) -> usize {
        // (Saturated: a wrapped length could pass for a small one.)
        chunk_count(n, self.chunk)
            .saturating_mul(4)
            .saturating_mul(self.lanes.saturating_add(1))
    }
}

/// `prob_bits` within [`PROB_BITS_RANGE`] (decode tables hold `2^prob_bits` entries a context).
fn check_prob_bits(prob_bits: u8) -> Result<()> {
    if !PROB_BITS_RANGE.contains(&prob_bits) {
        return Err(CodingError::Invalid {
            what: "rans prob_bits",
            value: prob_bits as u64,
        });
    }
    Ok(())
}

/// How symbols map to contexts: words of `word` symbols, `map(j, first)` for symbol `j`.
/// `map` is generic so that the per-symbol call is inlined.
#[derive(Clone, Copy)]
pub struct Contexts<F> {
    /// Symbols per word.
    pub word: usize,
    /// Number of contexts.
    pub count: usize,
    /// Context of symbol `j` of a word whose first symbol is `first`.
    pub map: F,
    /// Whether `map` ignores `first` (each position of a word has its own fixed context, as
    /// for Z1, A2 and D4): words whose size divides 32 then decode 32 symbols at a time in
    /// vector lanes where the CPU allows (a wrong `true` gives wrong symbols, never unsafety).
    pub first_free: bool,
}

impl<F> std::fmt::Debug for Contexts<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Contexts {{ word: {}, count: {}, first_free: {} }}",
            self.word, self.count, self.first_free
        )
    }
}

#[derive(Debug, Clone, Default)]
struct Table {
    /// Frequencies by symbol (escape last when present).
    freq: Vec<u32>,
    cum: Vec<u32>,
    /// ⌈2³²/f⌉ per symbol (0 where f = 0), for the encoder's division.
    rcp: Vec<u64>,
    escape: bool,
    /// Decode table, one entry per slot of the `2^prob_bits` range: `freq << 16 | bias`.
    fb: Vec<u32>,
    /// The symbol of each slot, plus one padding entry (a 4-byte vector gather at 2-byte
    /// stride reads one entry past the last).
    sy: Vec<u16>,
}

/// A fitted model: one frequency table per context.
#[derive(Debug, Clone)]
pub struct Model {
    prob_bits: u8,
    tables: Vec<Table>,
    /// Every table's decode slots, concatenated (`freq << 16 | bias`), so that one vector
    /// gather serves lanes of different contexts.
    fb: Vec<u32>,
    /// The symbol of every slot, concatenated, plus one padding entry.
    sy: Vec<u16>,
    /// Where each table's slots start in `fb`/`sy` (`None`: a table with no symbols).
    base: Vec<Option<usize>>,
}

/// One context's decode slots.
#[derive(Clone, Copy)]
struct DecTable<'m> {
    fb: &'m [u32],
    /// `fb.len() + 1` entries (the padding of [`Model::sy`]).
    sy: &'m [u16],
    escape: bool,
    /// Its first slot in the model's concatenated slots (the vector decoders' gathers).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    base: u32,
}

impl Model {
    /// Moves the tables' decode slots into one array.
    fn assemble(prob_bits: u8, mut tables: Vec<Table>) -> Model {
        let (mut fb, mut sy, mut base) = (Vec::new(), Vec::new(), Vec::new());
        for t in &mut tables {
            if t.fb.is_empty() {
                base.push(None);
                continue;
            }
            base.push(Some(fb.len()));
            fb.append(&mut t.fb);
            t.sy.pop();
            sy.append(&mut t.sy);
        }
        sy.push(0);
        Model {
            prob_bits,
            tables,
            fb,
            sy,
            base,
        }
    }

    /// The decode slots of context `c` (clamped to the last), `None` when it has no symbols.
    #[inline]
    fn dec_table(&self, c: usize) -> Option<DecTable<'_>> {
        let c = c.min(self.tables.len() - 1);
        let b = self.base[c]?;
        let m = 1usize << self.prob_bits;
        Some(DecTable {
            fb: &self.fb[b..b + m],
            sy: &self.sy[b..b + m + 1],
            escape: self.tables[c].escape,
            base: b as u32,
        })
    }
}

fn normalize(counts: &[u64], prob_bits: u8) -> Vec<u32> {
    let m = 1u64 << prob_bits;
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return vec![0; counts.len()];
    }
    let mut f: Vec<u32> = counts
        .iter()
        .map(|&c| {
            if c == 0 {
                0
            } else {
                ((c as f64 * m as f64 / total as f64).round() as u32).max(1)
            }
        })
        .collect();
    let mut sum: i64 = f.iter().map(|&x| x as i64).sum();
    // Fix the sum where it costs least: take from (or give to) the symbols whose relative
    // change is smallest, i.e. the most frequent ones.
    while sum != m as i64 {
        let mut order: Vec<usize> = (0..f.len())
            .filter(|&i| f[i] > 1 || (sum < m as i64 && f[i] > 0))
            .collect();
        order.sort_by(|&a, &b| counts[b].cmp(&counts[a]));
        if order.is_empty() {
            break;
        }
        for &i in &order {
            if sum == m as i64 {
                break;
            }
            if sum > m as i64 && f[i] > 1 {
                f[i] -= 1;
                sum -= 1;
            } else if sum < m as i64 {
                f[i] += 1;
                sum += 1;
            }
        }
    }
    f
}

impl Table {
    fn new(freq: Vec<u32>, escape: bool, prob_bits: u8) -> Result<Table> {
        let m = 1u32 << prob_bits;
        let mut cum = Vec::with_capacity(freq.len());
        let mut acc = 0u32;
        for &x in &freq {
            cum.push(acc);
            acc = acc.checked_add(x).ok_or(CodingError::Invalid {
                what: "rans frequency sum",
                value: u64::MAX,
            })?;
        }
        if !freq.is_empty() && acc != m {
            return Err(CodingError::Invalid {
                what: "rans frequency sum",
                value: acc as u64,
            });
        }
        let (mut fb, mut sy) = (Vec::new(), Vec::new());
        if !freq.is_empty() {
            fb = vec![0u32; m as usize];
            sy = vec![0u16; m as usize + 1];
            for (s, (&f, &c)) in freq.iter().zip(&cum).enumerate() {
                for k in 0..f {
                    // f ≤ 2^15 (prob_bits ≤ 15) and k < f: both fit 16 bits.
                    fb[(c + k) as usize] = (f << 16) | k;
                    sy[(c + k) as usize] = s as u16;
                }
            }
        }
        let rcp = freq
            .iter()
            .map(|&f| {
                if f == 0 {
                    0
                } else {
                    (1u64 << 32).div_ceil(f as u64)
                }
            })
            .collect();
        Ok(Table {
            freq,
            cum,
            rcp,
            escape,
            fb,
            sy,
        })
    }
}

/// Symbol counts per context, gathered slice by slice: the model of a sequence that is never
/// held whole (each slice must start on a word boundary).
#[derive(Debug, Clone)]
pub struct Counts {
    counts: Vec<Vec<u64>>,
    max: Vec<u32>,
}

impl Counts {
    /// No symbols counted yet, for `ctx.count` contexts.
    pub fn new<F>(ctx: Contexts<F>) -> Result<Counts> {
        if ctx.count == 0 || ctx.count > MAX_CONTEXTS || ctx.word == 0 {
            return Err(CodingError::Invalid {
                what: "rans contexts",
                value: ctx.count as u64,
            });
        }
        Ok(Counts {
            counts: vec![vec![0u64; MAX_DIRECT as usize + 1]; ctx.count],
            max: vec![0u32; ctx.count],
        })
    }

    /// Counts `symbols`, which start on a word boundary.
    pub fn add<F: Fn(usize, u32) -> usize + Copy>(&mut self, symbols: &[u32], ctx: Contexts<F>) {
        let last = self.counts.len() - 1;
        for w in symbols.chunks(ctx.word.max(1)) {
            for (j, &s) in w.iter().enumerate() {
                let c = (ctx.map)(j, w[0]).min(last);
                self.counts[c][s.min(MAX_DIRECT) as usize] += 1;
                self.max[c] = self.max[c].max(s);
            }
        }
    }

    /// The model of the symbols counted.
    ///
    /// # Errors
    /// [`CodingError::Invalid`] for `prob_bits` outside [`PROB_BITS_RANGE`] (its decode tables
    /// hold `2^prob_bits` entries a context).
    pub fn model(&self, prob_bits: u8) -> Result<Model> {
        check_prob_bits(prob_bits)?;
        let mut tables = Vec::with_capacity(self.counts.len());
        for (cnt, &max) in self.counts.iter().zip(&self.max) {
            let escape = max >= MAX_DIRECT;
            let alphabet = if escape {
                MAX_DIRECT as usize + 1
            } else if cnt.iter().all(|&x| x == 0) {
                0
            } else {
                max as usize + 1
            };
            tables.push(Table::new(
                normalize(&cnt[..alphabet], prob_bits),
                escape,
                prob_bits,
            )?);
        }
        Ok(Model::assemble(prob_bits, tables))
    }
}

impl Model {
    /// Fits a model to `symbols` (counted per context).
    pub fn fit<F: Fn(usize, u32) -> usize + Copy>(
        symbols: &[u32],
        ctx: Contexts<F>,
        prob_bits: u8,
    ) -> Result<Model> {
        let mut counts = Counts::new(ctx)?;
        counts.add(symbols, ctx);
        counts.model(prob_bits)
    }

    /// Serializes the model.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![self.prob_bits, self.tables.len() as u8];
        for t in &self.tables {
            leb(&mut out, t.freq.len() as u32);
            for &f in &t.freq {
                leb(&mut out, f);
            }
        }
        out
    }

    /// Parses and validates a serialized model.
    pub fn from_bytes(bytes: &[u8]) -> Result<Model> {
        let mut pos = 0usize;
        let mut byte = || -> Result<u8> {
            let b = *bytes
                .get(pos)
                .ok_or(CodingError::Truncated { what: "rans model" })?;
            pos += 1;
            Ok(b)
        };
        let prob_bits = byte()?;
        check_prob_bits(prob_bits)?;
        let n = byte()? as usize;
        if n == 0 || n > MAX_CONTEXTS {
            return Err(CodingError::Invalid {
                what: "rans contexts",
                value: n as u64,
            });
        }
        let mut read_leb = || -> Result<u32> {
            let mut v = 0u64;
            for shift in (0..35).step_by(7) {
                let b = byte()?;
                v |= ((b & 0x7F) as u64) << shift;
                if b & 0x80 == 0 {
                    return u32::try_from(v).map_err(|_| CodingError::Invalid {
                        what: "rans varint",
                        value: v,
                    });
                }
            }
            Err(CodingError::Invalid {
                what: "rans varint",
                value: v,
            })
        };
        let mut tables = Vec::with_capacity(n);
        for _ in 0..n {
            let alphabet = read_leb()? as usize;
            if alphabet > MAX_DIRECT as usize + 1 {
                return Err(CodingError::Invalid {
                    what: "rans alphabet",
                    value: alphabet as u64,
                });
            }
            let mut freq = Vec::with_capacity(alphabet);
            for _ in 0..alphabet {
                let f = read_leb()?;
                if f > 1 << prob_bits {
                    return Err(CodingError::Invalid {
                        what: "rans frequency",
                        value: f as u64,
                    });
                }
                freq.push(f);
            }
            tables.push(Table::new(
                freq,
                alphabet == MAX_DIRECT as usize + 1,
                prob_bits,
            )?);
        }
        if pos != bytes.len() {
            return Err(CodingError::Invalid {
                what: "rans model length",
                value: bytes.len() as u64,
            });
        }
        Ok(Model::assemble(prob_bits, tables))
    }

    /// The cost in bits of `symbols` under this model (the ideal rate of an exact coder);
    /// infinite where a symbol has no code (past its context's alphabet, or of frequency 0).
    pub fn cost_bits<F: Fn(usize, u32) -> usize + Copy>(
        &self,
        symbols: &[u32],
        ctx: Contexts<F>,
    ) -> f64 {
        let m = (1u64 << self.prob_bits) as f64;
        let mut bits = 0.0;
        for w in symbols.chunks(ctx.word.max(1)) {
            for (j, &s) in w.iter().enumerate() {
                let t = &self.tables[(ctx.map)(j, w[0]).min(self.tables.len() - 1)];
                let i = if t.escape && s >= MAX_DIRECT {
                    MAX_DIRECT as usize
                } else {
                    s as usize
                };
                let f = t.freq.get(i).map_or(0.0, |&f| f as f64);
                bits += -(f / m).log2() + if i == MAX_DIRECT as usize { 32.0 } else { 0.0 };
            }
        }
        bits
    }
}

fn leb(out: &mut Vec<u8>, mut v: u32) {
    loop {
        let b = (v & 0x7F) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// An rANS-coded symbol sequence.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RansStreams {
    /// The serialized model.
    pub model: Vec<u8>,
    /// Per chunk: word offset, then the lanes' final states (all `u32`, little-endian).
    pub index: Vec<u8>,
    /// 16-bit words, little-endian.
    pub payload: Vec<u8>,
}

/// Encodes `symbols` with a model fitted to them.
pub fn encode<F: Fn(usize, u32) -> usize + Copy>(
    symbols: &[u32],
    ctx: Contexts<F>,
    params: &RansParams,
) -> Result<RansStreams> {
    params.validate()?;
    let model = Model::fit(symbols, ctx, params.prob_bits)?;
    encode_with(symbols, ctx, params, &model)
}

/// Encodes `symbols` with a given model (which must give every symbol a non-zero frequency).
pub fn encode_with<F: Fn(usize, u32) -> usize + Copy>(
    symbols: &[u32],
    ctx: Contexts<F>,
    params: &RansParams,
    model: &Model,
) -> Result<RansStreams> {
    check_chunking(ctx, params)?;
    let mut out = ChunkWriter::new(symbols.len(), params);
    for chunk in symbols.chunks(params.chunk) {
        out.push(&encode_chunk(chunk, ctx, params, model)?)?;
    }
    Ok(out.finish(model))
}

fn check_chunking<F>(ctx: Contexts<F>, params: &RansParams) -> Result<()> {
    params.validate()?;
    if !params.chunk.is_multiple_of(ctx.word) {
        return Err(CodingError::Invalid {
            what: "rans chunk (must be a multiple of the word)",
            value: params.chunk as u64,
        });
    }
    Ok(())
}

/// One chunk encoded on its own: its lanes' final states and its 16-bit words in stream
/// order. Chunks are independent, so they may be encoded in any order or at once, then
/// assembled in order by a [`ChunkWriter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedChunk {
    symbols: usize,
    states: Vec<u32>,
    words: Vec<u16>,
}

/// Encodes one chunk (at most `params.chunk` symbols, the last chunk of a sequence may be
/// shorter) with `model`.
pub fn encode_chunk<F: Fn(usize, u32) -> usize + Copy>(
    chunk: &[u32],
    ctx: Contexts<F>,
    params: &RansParams,
    model: &Model,
) -> Result<EncodedChunk> {
    check_chunking(ctx, params)?;
    if chunk.len() > params.chunk {
        return Err(CodingError::Invalid {
            what: "rans chunk length",
            value: chunk.len() as u64,
        });
    }
    let pb = model.prob_bits as u32;
    let mut states = vec![L; params.lanes];
    let mut words: Vec<u16> = Vec::with_capacity(chunk.len() / 4);
    let last_table = model.tables.len() - 1;
    // Walk backwards with counters instead of two divisions per symbol.
    let (mut j, mut lane) = (
        (chunk.len().max(1) - 1) % ctx.word,
        (chunk.len().max(1) - 1) % params.lanes,
    );
    for i in (0..chunk.len()).rev() {
        let t = &model.tables[(ctx.map)(j, chunk[i - j]).min(last_table)];
        let s = chunk[i];
        let idx = if t.escape && s >= MAX_DIRECT {
            MAX_DIRECT as usize
        } else {
            s as usize
        };
        let f = *t
            .freq
            .get(idx)
            .filter(|&&f| f > 0)
            .ok_or(CodingError::Invalid {
                what: "symbol absent from the model",
                value: s as u64,
            })?;
        let c = t.cum[idx];
        let x = &mut states[lane];
        if (*x as u64) >= (f as u64) << (32 - pb) {
            words.push(*x as u16);
            *x >>= 16;
        }
        // x / f by a multiply with ⌈2³²/f⌉: the estimate is q or q + 1, corrected once.
        let mut q = ((*x as u64 * t.rcp[idx]) >> 32) as u32;
        if (q as u64) * (f as u64) > *x as u64 {
            q -= 1;
        }
        *x = (q << pb) + (*x - q * f) + c;
        if idx == MAX_DIRECT as usize {
            words.push(s as u16);
            words.push((s >> 16) as u16);
        }
        j = if j == 0 { ctx.word - 1 } else { j - 1 };
        lane = if lane == 0 {
            params.lanes - 1
        } else {
            lane - 1
        };
    }
    words.reverse();
    Ok(EncodedChunk {
        symbols: chunk.len(),
        states,
        words,
    })
}

/// Assembles encoded chunks, in order, into the streams of one sequence.
#[derive(Debug, Clone)]
pub struct ChunkWriter {
    index: Vec<u8>,
    payload: Vec<u8>,
    words: u64,
    chunk: usize,
    short: bool,
}

impl ChunkWriter {
    /// An empty sequence, with room for the index of `n` symbols.
    pub fn new(n: usize, params: &RansParams) -> ChunkWriter {
        // Capacities are hints from the caller's `n`, capped: the buffers grow with what is
        // pushed (an `n` of 2^40 reserved 512 GiB up front).
        const HINT_MAX: usize = 1 << 24;
        ChunkWriter {
            index: Vec::with_capacity(params.index_len(n).min(HINT_MAX)),
            payload: Vec::with_capacity((n / 2).min(HINT_MAX)),
            words: 0,
            chunk: params.chunk,
            short: false,
        }
    }

    /// Appends the next chunk: every chunk but the last holds exactly `params.chunk` symbols.
    pub fn push(&mut self, chunk: &EncodedChunk) -> Result<()> {
        if self.short || chunk.symbols > self.chunk {
            return Err(CodingError::Invalid {
                what: "rans chunk after a short one, or over the chunk size",
                value: chunk.symbols as u64,
            });
        }
        self.short = chunk.symbols < self.chunk;
        let offset = u32::try_from(self.words).map_err(|_| CodingError::Invalid {
            what: "payload size",
            value: self.words,
        })?;
        self.index.extend_from_slice(&offset.to_le_bytes());
        for s in &chunk.states {
            self.index.extend_from_slice(&s.to_le_bytes());
        }
        self.payload
            .extend(chunk.words.iter().flat_map(|w| w.to_le_bytes()));
        self.words += chunk.words.len() as u64;
        Ok(())
    }

    /// The streams, with `model` serialized.
    pub fn finish(self, model: &Model) -> RansStreams {
        RansStreams {
            model: model.to_bytes(),
            index: self.index,
            payload: self.payload,
        }
    }
}

/// The streams of an rANS-coded sequence, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct RansParts<'a> {
    /// The serialized model.
    pub model: &'a [u8],
    /// The chunk table.
    pub index: &'a [u8],
    /// 16-bit words.
    pub payload: &'a [u8],
}

impl RansStreams {
    /// Borrows the streams.
    pub fn parts(&self) -> RansParts<'_> {
        RansParts {
            model: &self.model,
            index: &self.index,
            payload: &self.payload,
        }
    }
}

/// Decodes `out.len()` symbols.
pub fn decode<F: Fn(usize, u32) -> usize + Copy>(
    s: &RansStreams,
    ctx: Contexts<F>,
    params: &RansParams,
    out: &mut [u32],
) -> Result<()> {
    decode_parts(s.parts(), ctx, params, out)
}

/// [`decode`] over borrowed streams.
pub fn decode_parts<F: Fn(usize, u32) -> usize + Copy>(
    s: RansParts<'_>,
    ctx: Contexts<F>,
    params: &RansParams,
    out: &mut [u32],
) -> Result<()> {
    let d = Decoder::new(s, params, out.len())?;
    d.decode_chunks(0..d.chunks(), ctx, out)
}

/// A validated rANS sequence of `n` symbols whose chunks decode independently: the model is
/// parsed and the chunk table checked once, then any range of chunks decodes alone.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    model: Model,
    index: Cow<'a, [u8]>,
    payload: Cow<'a, [u8]>,
    params: RansParams,
    n: usize,
}

impl<'a> Decoder<'a> {
    /// Parses the model and checks the chunk table against `n` symbols.
    pub fn new(s: RansParts<'a>, params: &RansParams, n: usize) -> Result<Self> {
        params.validate()?;
        let model = Model::from_bytes(s.model)?;
        let expected = params.index_len(n);
        if s.index.len() != expected {
            return Err(CodingError::Length {
                what: "rans index",
                expected: expected as u64,
                actual: s.index.len() as u64,
            });
        }
        if !s.payload.len().is_multiple_of(2) {
            return Err(CodingError::Invalid {
                what: "rans payload length",
                value: s.payload.len() as u64,
            });
        }
        Ok(Decoder {
            model,
            index: Cow::Borrowed(s.index),
            payload: Cow::Borrowed(s.payload),
            params: *params,
            n,
        })
    }

    /// The same decoder owning copies of the chunk table and the payload.
    pub fn into_owned(self) -> Decoder<'static> {
        Decoder {
            model: self.model,
            index: Cow::Owned(self.index.into_owned()),
            payload: Cow::Owned(self.payload.into_owned()),
            params: self.params,
            n: self.n,
        }
    }

    /// Bytes held: the chunk table, the payload and the parsed model's tables.
    pub fn stream_bytes(&self) -> u64 {
        let model: usize = self
            .model
            .tables
            .iter()
            .map(|t| 4 * (t.freq.len() + t.cum.len()) + 8 * t.rcp.len())
            .sum::<usize>()
            + 4 * self.model.fb.len()
            + 2 * self.model.sy.len();
        (self.index.len() + self.payload.len() + model) as u64
    }

    /// Number of chunks.
    pub fn chunks(&self) -> usize {
        chunk_count(self.n, self.params.chunk)
    }

    /// Symbols per chunk (the last chunk may hold fewer).
    pub fn chunk_symbols(&self) -> usize {
        self.params.chunk
    }

    /// Symbols of the whole sequence.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the sequence is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The symbol range `[start, end)` of chunks `range`.
    pub fn symbol_range(&self, range: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let c = self.params.chunk;
        (range.start.saturating_mul(c)).min(self.n)..(range.end.saturating_mul(c)).min(self.n)
    }

    /// The payload bytes that chunks `range` occupy (what decoding them reads, beside the
    /// model and their entries of the chunk table).
    pub fn payload_bytes(&self, range: std::ops::Range<usize>) -> Result<u64> {
        let words = self.payload.len() / 2;
        let start = self.word_offset(range.start, words)?;
        let end = self.word_offset(range.end, words)?;
        Ok(2 * end.saturating_sub(start) as u64)
    }

    fn word_offset(&self, chunk: usize, words: usize) -> Result<usize> {
        if chunk >= self.chunks() {
            return Ok(words);
        }
        let at = chunk * 4 * (1 + self.params.lanes);
        let b = self
            .index
            .get(at..at + 4)
            .ok_or(CodingError::Corrupt { chunk })?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    /// The chunk table as stored: per chunk a little-endian `u32` word offset into the payload,
    /// then `lanes` final states.
    pub fn index(&self) -> &[u8] {
        &self.index
    }

    /// The payload: 16-bit words, little-endian, every chunk's words in reading order.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The coder's parameters.
    pub fn params(&self) -> &RansParams {
        &self.params
    }

    /// The model's probability precision in bits.
    pub fn prob_bits(&self) -> u8 {
        self.model.prob_bits
    }

    /// Checks every chunk's entry of the table without decoding: word offsets that never
    /// decrease and stay inside the payload, lane states in `[L, 2³²)`. A GPU decoder, which
    /// cannot report corruption as it goes, needs this much to stay inside its chunk's words.
    pub fn check_chunk_table(&self) -> Result<()> {
        let words = self.payload.len() / 2;
        let entry = 4 * (1 + self.params.lanes);
        let u32_at = |at: usize| {
            let b = &self.index[at..at + 4];
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        };
        let mut last = 0usize;
        for ci in 0..self.chunks() {
            let start = u32_at(ci * entry) as usize;
            if start < last || start > words {
                return Err(CodingError::Corrupt { chunk: ci });
            }
            last = start;
            if (0..self.params.lanes).any(|l| u32_at(ci * entry + 4 + 4 * l) < L) {
                return Err(CodingError::Corrupt { chunk: ci });
            }
        }
        Ok(())
    }

    /// The decode slots of every context packed for a warp decoder (the CUDA GEMV keeps them
    /// in shared memory): `2^prob_bits` entries per context, each `byte << 24 | (f − 1) << 12
    /// | (slot − cum)`, so a lane decodes with one lookup, `x ← f·(x >> prob_bits) + (slot −
    /// cum)`, and finds in the top byte `byte(context, symbol)`: the symbol itself, or what
    /// the caller computes from it (E8 stores the signed coordinate). `None` when the model
    /// does not fit that packing: probabilities above 12 bits, a context with escapes (a symbol
    /// of 256 or more), or a symbol `byte` refuses. A context with no symbols gets zeros.
    pub fn warp_slots(&self, byte: impl Fn(usize, u32) -> Option<u8>) -> Option<Vec<u32>> {
        let pb = self.model.prob_bits;
        if pb > 12 || self.model.tables.iter().any(|t| t.escape) {
            return None;
        }
        let m = 1usize << pb;
        let mut out = vec![0u32; m * self.model.tables.len()];
        for (ci, (t, slots)) in self
            .model
            .tables
            .iter()
            .zip(out.chunks_exact_mut(m))
            .enumerate()
        {
            for (s, (&f, &c)) in t.freq.iter().zip(&t.cum).enumerate() {
                if f == 0 {
                    continue;
                }
                let b = byte(ci, s as u32)? as u32;
                // Alphabets without escapes hold at most MAX_DIRECT = 256 symbols, f ≤ 2^pb.
                for k in 0..f {
                    slots[(c + k) as usize] = b << 24 | (f - 1) << 12 | k;
                }
            }
        }
        Some(out)
    }

    /// Decodes chunks `range` into `out`, which must hold exactly their symbols
    /// ([`Decoder::symbol_range`]).
    pub fn decode_chunks<F: Fn(usize, u32) -> usize + Copy>(
        &self,
        range: std::ops::Range<usize>,
        ctx: Contexts<F>,
        out: &mut [u32],
    ) -> Result<()> {
        let chunks = self.chunks();
        if range.start > range.end || range.end > chunks {
            return Err(CodingError::Invalid {
                what: "rans chunk range",
                value: range.end as u64,
            });
        }
        let want = self.symbol_range(range.clone());
        if out.len() != want.len() {
            return Err(CodingError::Length {
                what: "rans output",
                expected: want.len() as u64,
                actual: out.len() as u64,
            });
        }
        let params = &self.params;
        let model = &self.model;
        let words = self.payload.len() / 2;
        let u32_at = |b: &[u8], i: usize| {
            u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
        };
        let entry = 1 + params.lanes;
        let mut states = vec![0u32; params.lanes];
        for (k, chunk) in out.chunks_mut(params.chunk).enumerate() {
            let ci = range.start + k;
            let start = u32_at(&self.index, ci * entry) as usize;
            let end = if ci + 1 < chunks {
                u32_at(&self.index, (ci + 1) * entry) as usize
            } else {
                words
            };
            if start > end || end > words {
                return Err(CodingError::Invalid {
                    what: "rans chunk offset",
                    value: start as u64,
                });
            }
            for (l, st) in states.iter_mut().enumerate() {
                *st = u32_at(&self.index, ci * entry + 1 + l);
                if *st < L {
                    return Err(CodingError::Corrupt { chunk: ci });
                }
            }
            let stream = &self.payload[2 * start..2 * end];
            let mut pos = 0usize;
            decode_chunk(model, ctx, &mut states, stream, &mut pos, chunk, ci)?;
            // Writers may pad the payload with zero bytes after the last chunk (see hwz's minimum
            // stream length); anything else left unread is corruption.
            if pos > stream.len() {
                return Err(CodingError::Corrupt { chunk: ci });
            }
            let rest = &stream[pos..];
            let padded = ci + 1 == chunks && rest.iter().all(|&b| b == 0);
            if (pos != stream.len() && !padded) || states.iter().any(|&x| x != L) {
                return Err(CodingError::Corrupt { chunk: ci });
            }
        }
        Ok(())
    }
}

/// Decodes one symbol of a lane: the slot of `x`, the state update, an escaped symbol's two
/// raw words, then the (branch-free) renormalization word.
#[inline(always)]
fn step(
    t: DecTable<'_>,
    x: &mut u32,
    stream: &[u8],
    pos: &mut usize,
    pb: u32,
    ci: usize,
) -> Result<u32> {
    let next = |pos: &mut usize| -> Result<u32> {
        let w = stream
            .get(*pos..*pos + 2)
            .ok_or(CodingError::Corrupt { chunk: ci })?;
        *pos += 2;
        Ok(u16::from_le_bytes([w[0], w[1]]) as u32)
    };
    let slot = (*x & ((1u32 << pb) - 1)) as usize;
    let (fb, mut sym) = match (t.fb.get(slot), t.sy.get(slot)) {
        (Some(&fb), Some(&sy)) => (fb, sy as u32),
        _ => return Err(CodingError::Corrupt { chunk: ci }),
    };
    *x = (fb >> 16) * (*x >> pb) + (fb & 0xFFFF);
    if t.escape && sym == MAX_DIRECT {
        let hi = next(pos)?;
        let lo = next(pos)?;
        sym = (hi << 16) | lo;
    }
    // Branch-free renormalization: whether a word is needed is a coin flip per symbol.
    let w = stream
        .get(*pos..*pos + 2)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as u32);
    let need = *x < L;
    *x = if need { (*x << 16) | w } else { *x };
    *pos += 2 * need as usize;
    Ok(sym)
}

/// The tables of four words of 8 symbols over 32 lanes whose states are `states`: lane `8k`
/// (word k's first symbol) its table 0, lanes `8k+1..8k+8` the one table that first symbol
/// (which the state's slot alone determines) picks for them; `None` where a word meets an
/// escape, a missing table or positions of differing tables (the scalar path takes it).
#[cfg(target_arch = "x86_64")]
fn word_bases<F: Fn(usize, u32) -> usize + Copy>(
    model: &Model,
    ctx: Contexts<F>,
    states: &[u32],
    mut first: u32,
    pb: u32,
) -> Option<[u32; 32]> {
    let mut bases = [0u32; 32];
    for (b, &x) in bases.chunks_exact_mut(8).zip(states.iter().step_by(8)) {
        // The first symbol of the word (its context may depend on the previous word's).
        let t0 = model.dec_table((ctx.map)(0, first))?;
        let sym0 = t0.sy[(x & ((1u32 << pb) - 1)) as usize] as u32;
        if t0.escape && sym0 == MAX_DIRECT {
            return None;
        }
        first = sym0;
        // Symbols 1..8 of the word must share one table.
        let c1 = (ctx.map)(1, first);
        let t1 = model.dec_table(c1)?;
        if !(2..8).all(|q| (ctx.map)(q, first) == c1) {
            return None;
        }
        b[0] = t0.base;
        b[1..].fill(t1.base);
    }
    Some(bases)
}

/// Decodes one chunk's symbols into `out` from `stream`, its lanes' `states` set from the
/// chunk table. With AVX2: groups of 32 symbols over 32 lanes in vector lanes, for words of 8
/// (E8's: the tables of each word chosen from its first symbol) and for contexts that ignore
/// the first symbol (words whose size divides 32: each lane's table fixed); otherwise words of
/// 8 whose last 7 share one table decode those 7 in vector lanes; everything else, one symbol
/// at a time.
fn decode_chunk<F: Fn(usize, u32) -> usize + Copy>(
    model: &Model,
    ctx: Contexts<F>,
    states: &mut [u32],
    stream: &[u8],
    pos: &mut usize,
    out: &mut [u32],
    ci: usize,
) -> Result<()> {
    let lanes = states.len();
    let pb = model.prob_bits as u32;
    let table = |c: usize| -> Result<DecTable<'_>> {
        model.dec_table(c).ok_or(CodingError::Corrupt { chunk: ci })
    };
    #[cfg(target_arch = "x86_64")]
    let simd = ctx.word == 8 && lanes.is_multiple_of(8) && crate::simd::has_avx2();
    let mut first = 0u32;
    let (mut j, mut lane) = (0usize, 0usize);
    #[cfg(target_arch = "x86_64")]
    let simd32 = simd && lanes.is_multiple_of(32);
    // Contexts that ignore the first symbol: every lane of a 32-symbol group that starts a word
    // in lane 0 has a fixed table (None where a table is missing: the scalar path reports it).
    #[cfg(target_arch = "x86_64")]
    let free32: Option<[u32; 32]> = (ctx.first_free
        && ctx.word != 0
        && 32 % ctx.word == 0
        && lanes.is_multiple_of(32)
        && crate::simd::has_avx2())
    .then(|| {
        let mut b = [0u32; 32];
        for (i, base) in b.iter_mut().enumerate() {
            *base = model.dec_table((ctx.map)(i % ctx.word, 0))?.base;
        }
        Some(b)
    })
    .flatten();
    #[cfg(target_arch = "x86_64")]
    let any_escape = model.tables.iter().any(|t| t.escape);
    let mut i = 0;
    while i < out.len() {
        // 32 symbols over 32 lanes, every symbol and state update in vector lanes, the
        // renormalization words assigned by a prefix count over the 32 lanes; the lanes' tables
        // fixed by position, or (four words of 8) each word's chosen from its first symbol.
        #[cfg(target_arch = "x86_64")]
        if (free32.is_some() || simd32) && j == 0 && lane % 32 == 0 && i + 32 <= out.len() {
            let bases =
                free32.or_else(|| word_bases(model, ctx, &states[lane..lane + 32], first, pb));
            // SAFETY: AVX2 is present (free32, simd32); lanes lane..lane+32 exist (lanes % 32
            // == 0, lane % 32 == 0); out has 32 symbols from i; every base is a table's start
            // in the model's concatenated slots.
            if let Some(bases) = bases {
                if unsafe {
                    crate::simd::rans_group32(
                        &model.fb,
                        &model.sy,
                        any_escape,
                        &bases,
                        pb,
                        &mut states[lane..lane + 32],
                        stream,
                        pos,
                        &mut out[i..i + 32],
                    )
                } {
                    first = out[i + 32 - ctx.word];
                    i += 32;
                    lane = (lane + 32) % lanes;
                    continue;
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if simd && j == 0 && i + 8 <= out.len() {
            let t0 = table((ctx.map)(0, first))?;
            let sym0 = step(t0, &mut states[lane], stream, pos, pb, ci)?;
            out[i] = sym0;
            first = sym0;
            let c1 = (ctx.map)(1, first);
            let shared = (2..8).all(|k| (ctx.map)(k, first) == c1);
            let t1 = table(c1)?;
            // SAFETY: AVX2 is present (simd); lanes lane..lane+8 exist (lanes % 8 == 0 and
            // lane is a multiple of 8 when j == 0); out has 8 symbols from i.
            let done = shared
                && unsafe {
                    crate::simd::rans_step7(
                        t1.fb,
                        t1.sy,
                        t1.escape,
                        pb,
                        &mut states[lane..lane + 8],
                        stream,
                        pos,
                        &mut out[i..i + 8],
                    )
                };
            if !done {
                for k in 1..8 {
                    let t = table((ctx.map)(k, first))?;
                    out[i + k] = step(t, &mut states[lane + k], stream, pos, pb, ci)?;
                }
            }
            i += 8;
            lane = (lane + 8) % lanes;
            continue;
        }
        let t = table((ctx.map)(j, first))?;
        let sym = step(t, &mut states[lane], stream, pos, pb, ci)?;
        first = if j == 0 { sym } else { first };
        out[i] = sym;
        i += 1;
        j += 1;
        if j == ctx.word {
            j = 0;
        }
        lane += 1;
        if lane == lanes {
            lane = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hostile_parameters_are_errors_or_bounded() {
        let syms = [0u32, 1, 2, 3];
        // prob_bits past the range asked for 2^31-entry tables a context.
        for pb in [0u8, 7, 16, 24, 31] {
            assert!(
                matches!(
                    Model::fit(&syms, ctx(), pb),
                    Err(CodingError::Invalid {
                        what: "rans prob_bits",
                        ..
                    })
                ),
                "{pb}"
            );
        }
        let m = Model::fit(&syms, ctx(), 12).unwrap();
        // A symbol past the model's alphabet has no code: infinite cost, not a panic; a word
        // of 0 symbols reads as words of 1.
        assert_eq!(m.cost_bits(&[0, 1000, 2], ctx()), f64::INFINITY);
        let zero = Contexts { word: 0, ..ctx() };
        assert_eq!(
            m.cost_bits(&[0, 0, 0], zero),
            3.0 * m.cost_bits(&[0], ctx())
        );
        let mut c = Counts::new(ctx()).unwrap();
        c.add(&syms, zero);
        // Capacities from a huge `n` are hints, capped; lengths saturate.
        let p = RansParams::default();
        let w = ChunkWriter::new(1 << 40, &p);
        assert!(w.index.capacity() <= 1 << 24 && w.payload.capacity() <= 1 << 24);
        let lanes = RansParams {
            lanes: usize::MAX,
            ..RansParams::default()
        };
        assert_eq!(lanes.index_len(1 << 20), usize::MAX);
    }

    fn e8_like(j: usize, first: u32) -> usize {
        if j == 0 {
            0
        } else {
            1 + (first & 1) as usize
        }
    }

    fn ctx() -> Contexts<fn(usize, u32) -> usize> {
        Contexts {
            word: 8,
            count: 3,
            map: e8_like,
            first_free: false,
        }
    }

    fn roundtrip(symbols: &[u32], params: RansParams) -> RansStreams {
        let s = encode(symbols, ctx(), &params).unwrap();
        let mut out = vec![0u32; symbols.len()];
        decode(&s, ctx(), &params, &mut out).unwrap();
        assert_eq!(out, symbols);
        s
    }

    /// Geometric-ish symbols, like zigzagged lattice coordinates.
    fn skewed(n: usize, seed: u64) -> Vec<u32> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as u32).trailing_zeros().min(20) * 2 + ((x >> 20) & 1) as u32
            })
            .collect()
    }

    /// The CUDA GEMV's warp loop over [`Decoder::warp_slots`] (kernels/gemv.cu,
    /// `hc_e8_rans`), step for step: 32 lanes decode one symbol each, lanes at position 0
    /// of a word first (their context is 0), the rest in the context their word's first symbol
    /// picks; the words a step needs come from a window of two 32-word buffers, each lane's at
    /// the count of lanes below it that need one.
    fn warp_decode(d: &Decoder<'_>, slots: &[u32], out: &mut [u32]) {
        let p = d.params();
        assert_eq!(p.lanes, 32);
        let pb = d.model.prob_bits as u32;
        let words: Vec<u32> = d
            .payload()
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
            .collect();
        let idx: Vec<u32> = d
            .index()
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let chunks = d.chunks();
        for (c, out) in out.chunks_mut(p.chunk).enumerate() {
            let e = &idx[c * 33..];
            let end = if c + 1 < chunks {
                e[33] as usize
            } else {
                words.len()
            };
            let word = |i: usize| if i < end { words[i] } else { 0 };
            let mut x: Vec<u32> = e[1..33].to_vec();
            let mut base = e[0] as usize;
            let mut b0: Vec<u32> = (0..32).map(|l| word(base + l)).collect();
            let mut b1: Vec<u32> = (0..32).map(|l| word(base + 32 + l)).collect();
            let mut rel = 0usize;
            for step in out.chunks_mut(32) {
                let slot: Vec<u32> = x.iter().map(|&v| v & ((1 << pb) - 1)).collect();
                let e0: Vec<u32> = slot.iter().map(|&s| slots[s as usize]).collect();
                let mut need = [false; 32];
                for l in 0..32 {
                    let sym0 = e0[l & 24] >> 24;
                    let ent = if l & 7 == 0 {
                        e0[l]
                    } else {
                        slots[(((1 + (sym0 & 1)) << pb) + slot[l]) as usize]
                    };
                    step[l] = ent >> 24;
                    x[l] = (((ent >> 12) & 0xFFF) + 1) * (x[l] >> pb) + (ent & 0xFFF);
                    need[l] = x[l] < L;
                }
                let mut below = 0;
                for l in 0..32 {
                    if need[l] {
                        let off = rel + below;
                        let w = if off < 32 { b0[off] } else { b1[off - 32] };
                        x[l] = (x[l] << 16) | w;
                        below += 1;
                    }
                }
                rel += below;
                if rel >= 32 {
                    base += 32;
                    b0 = b1;
                    b1 = (0..32).map(|l| word(base + 32 + l)).collect();
                    rel -= 32;
                }
            }
            assert!(
                x.iter().all(|&v| v == L),
                "chunk {c} ends at its lanes' start"
            );
        }
    }

    #[test]
    fn the_warp_loop_over_packed_slots_decodes_every_symbol() {
        for (n, chunk, pb, seed) in [(4096, 1024, 12, 5), (9216, 3072, 10, 6), (64, 64, 8, 7)] {
            // Rows of E8-like words whose coset bit (the first symbol's low bit) varies.
            let v = skewed(n, seed);
            let p = RansParams {
                chunk,
                lanes: 32,
                prob_bits: pb,
            };
            let s = roundtrip(&v, p);
            let d = Decoder::new(s.parts(), &p, n).unwrap();
            d.check_chunk_table().unwrap();
            let slots = d
                .warp_slots(|_, s| u8::try_from(s).ok())
                .expect("12-bit model without escapes");
            assert_eq!(slots.len(), 3 << pb);
            let mut out = vec![u32::MAX; n];
            warp_decode(&d, &slots, &mut out);
            assert_eq!(out, v);
        }
        // 14-bit probabilities, or an escaped symbol, do not pack.
        let v = skewed(1024, 8);
        let p14 = RansParams {
            chunk: 1024,
            lanes: 32,
            prob_bits: 14,
        };
        let s = roundtrip(&v, p14);
        let any = |_: usize, s: u32| u8::try_from(s).ok();
        assert!(Decoder::new(s.parts(), &p14, 1024)
            .unwrap()
            .warp_slots(any)
            .is_none());
        let mut big = v.clone();
        big[9] = 300;
        let p12 = RansParams {
            prob_bits: 12,
            ..p14
        };
        let s = roundtrip(&big, p12);
        assert!(Decoder::new(s.parts(), &p12, 1024)
            .unwrap()
            .warp_slots(any)
            .is_none());
        // A byte the caller refuses.
        let s = roundtrip(&v, p12);
        let d = Decoder::new(s.parts(), &p12, 1024).unwrap();
        assert!(d
            .warp_slots(|c, s| (c != 1 || s < 3).then_some(s as u8))
            .is_none());
    }

    #[test]
    fn a_chunk_table_that_runs_backwards_is_caught_before_any_decode() {
        let v = skewed(4096, 9);
        let p = RansParams {
            chunk: 1024,
            lanes: 32,
            prob_bits: 12,
        };
        let mut s = roundtrip(&v, p);
        // Chunk 2 claims to start before chunk 1.
        let entry = 4 * 33;
        s.index[2 * entry..2 * entry + 4].copy_from_slice(&0u32.to_le_bytes());
        s.index[entry..entry + 4].copy_from_slice(&5u32.to_le_bytes());
        let d = Decoder::new(s.parts(), &p, 4096).unwrap();
        assert_eq!(
            d.check_chunk_table(),
            Err(CodingError::Corrupt { chunk: 2 })
        );
        // A lane state below L.
        let mut s = roundtrip(&v, p);
        s.index[4..8].copy_from_slice(&7u32.to_le_bytes());
        let d = Decoder::new(s.parts(), &p, 4096).unwrap();
        assert_eq!(
            d.check_chunk_table(),
            Err(CodingError::Corrupt { chunk: 0 })
        );
    }

    #[test]
    fn near_entropy() {
        let v = skewed(1 << 16, 3);
        let p = RansParams {
            chunk: 1 << 16,
            lanes: 32,
            prob_bits: 14,
        };
        let s = roundtrip(&v, p);
        let model = Model::from_bytes(&s.model).unwrap();
        let ideal = model.cost_bits(&v, ctx());
        let actual = (s.payload.len() + s.index.len()) as f64 * 8.0;
        // Lane flushes cost at most 32 bits each; the rest is within 0.1 %.
        assert!(actual <= ideal * 1.001 + 32.0 * 33.0, "{actual} vs {ideal}");
    }

    #[test]
    fn chunks_encoded_apart_and_counted_apart_give_the_same_streams() {
        let v = skewed(5000, 11);
        let p = RansParams {
            chunk: 1024,
            lanes: 8,
            prob_bits: 12,
        };
        let whole = encode(&v, ctx(), &p).unwrap();
        let mut counts = Counts::new(ctx()).unwrap();
        v.chunks(1000).for_each(|b| counts.add(b, ctx()));
        let model = counts.model(12).unwrap();
        let mut w = ChunkWriter::new(v.len(), &p);
        // Encoded last to first, assembled in order.
        let mut done: Vec<_> = v
            .chunks(1024)
            .rev()
            .map(|c| encode_chunk(c, ctx(), &p, &model))
            .collect();
        done.reverse();
        for c in &done {
            w.push(c.as_ref().unwrap()).unwrap();
        }
        assert_eq!(w.finish(&model), whole);
        // A short chunk may only come last.
        let mut w = ChunkWriter::new(v.len(), &p);
        w.push(&encode_chunk(&v[..512], ctx(), &p, &model).unwrap())
            .unwrap();
        assert!(w.push(done[0].as_ref().unwrap()).is_err());
        assert!(encode_chunk(&v[..2048], ctx(), &p, &model).is_err());
    }

    #[test]
    fn escapes_and_edges() {
        let mut v = skewed(4096, 9);
        v[5] = u32::MAX;
        v[100] = 256;
        v[4095] = 70_000;
        roundtrip(
            &v,
            RansParams {
                chunk: 1024,
                lanes: 7,
                prob_bits: 12,
            },
        );
        // Vector lanes (multiples of 8): escapes inside a word fall back to one lane at a time;
        // chunks that end inside a word and streams that end within 16 bytes too.
        for (lanes, chunk) in [(8, 1024), (32, 1000), (16, 24), (32, 4096)] {
            roundtrip(
                &v,
                RansParams {
                    chunk,
                    lanes,
                    prob_bits: 12,
                },
            );
        }
        roundtrip(&[], RansParams::default());
        roundtrip(
            &[0; 80],
            RansParams {
                chunk: 16,
                lanes: 1,
                prob_bits: 8,
            },
        );
        roundtrip(
            &[3; 9],
            RansParams {
                chunk: 8,
                lanes: 64,
                prob_bits: 15,
            },
        );
    }

    #[test]
    fn corruption_is_detected() {
        let v = skewed(2048, 5);
        let p = RansParams {
            chunk: 1024,
            lanes: 4,
            prob_bits: 12,
        };
        let s = encode(&v, ctx(), &p).unwrap();
        let mut out = vec![0u32; v.len()];
        let mut bad = s.clone();
        let n = bad.payload.len();
        bad.payload[n / 2] ^= 0x10;
        assert!(decode(&bad, ctx(), &p, &mut out).is_err() || out != v);
        let mut bad = s.clone();
        bad.index[5] ^= 1;
        assert!(decode(&bad, ctx(), &p, &mut out).is_err());
        let mut bad = s.clone();
        bad.model[0] = 30;
        assert!(matches!(
            decode(&bad, ctx(), &p, &mut out),
            Err(CodingError::Invalid { .. })
        ));
        assert!(decode(&s, ctx(), &p, &mut vec![0u32; v.len() + 1]).is_err());
    }

    /// Z1-, A2- and D4-like contexts (word 1, 2, 4: position 0 table 0, the others table 1),
    /// which ignore the first symbol.
    fn positional(j: usize, _first: u32) -> usize {
        (j > 0) as usize
    }

    fn positional_ctx(word: usize) -> Contexts<fn(usize, u32) -> usize> {
        Contexts {
            word,
            count: 2,
            map: positional,
            first_free: true,
        }
    }

    #[test]
    fn positional_contexts_roundtrip_in_vector_groups() {
        // 32 lanes: whole groups of 32 symbols go through the vector path where AVX2 is
        // present; chunks of 200 words leave partial groups to the scalar path.
        for word in [1usize, 2, 4] {
            let v = skewed(40_000, word as u64);
            let p = RansParams {
                chunk: 1600,
                lanes: 32,
                prob_bits: 12,
            };
            let s = encode(&v, positional_ctx(word), &p).unwrap();
            let mut out = vec![0u32; v.len()];
            decode(&s, positional_ctx(word), &p, &mut out).unwrap();
            assert_eq!(out, v, "word {word}");
            // The same streams read with first_free off (every symbol scalar) agree.
            let slow = Contexts {
                first_free: false,
                ..positional_ctx(word)
            };
            let mut again = vec![0u32; v.len()];
            decode(&s, slow, &p, &mut again).unwrap();
            assert_eq!(again, v, "word {word}, scalar");
        }
    }

    proptest! {
        #[test]
        fn positional_symbols_roundtrip(v in proptest::collection::vec(prop_oneof![20 => 0u32..30, 1 => any::<u32>()], 0..3000),
                                        word in prop_oneof![Just(1usize), Just(2), Just(4)], chunk_words in 1usize..80) {
            let p = RansParams { chunk: chunk_words * 8, lanes: 32, prob_bits: 12 };
            let s = encode(&v, positional_ctx(word), &p).unwrap();
            let mut out = vec![0u32; v.len()];
            decode(&s, positional_ctx(word), &p, &mut out).unwrap();
            prop_assert_eq!(out, v);
        }

        #[test]
        fn positional_garbage_never_panics(model in proptest::collection::vec(any::<u8>(), 0..60), index in proptest::collection::vec(any::<u8>(), 0..300),
                                           payload in proptest::collection::vec(any::<u8>(), 0..400), n in 0usize..200, word in prop_oneof![Just(1usize), Just(2), Just(4)]) {
            let s = RansStreams { model, index, payload };
            let mut out = vec![0u32; n];
            let _ = decode(&s, positional_ctx(word), &RansParams { chunk: 64, lanes: 32, prob_bits: 10 }, &mut out);
        }

        #[test]
        fn any_symbols_roundtrip(v in proptest::collection::vec(prop_oneof![20 => 0u32..30, 1 => any::<u32>()], 0..700),
                                 lanes in 1usize..40, chunk_words in 1usize..40, prob_bits in 8u8..=15) {
            roundtrip(&v, RansParams { chunk: chunk_words * 8, lanes, prob_bits });
        }

        #[test]
        fn chunk_ranges_decode_alone(v in proptest::collection::vec(prop_oneof![20 => 0u32..30, 1 => any::<u32>()], 1..700),
                                     lanes in 1usize..40, chunk_words in 1usize..20, a in 0usize..12, b in 0usize..12) {
            let p = RansParams { chunk: chunk_words * 8, lanes, prob_bits: 12 };
            let s = encode(&v, ctx(), &p).unwrap();
            let d = Decoder::new(s.parts(), &p, v.len()).unwrap();
            let (a, b) = (a.min(b).min(d.chunks()), a.max(b).min(d.chunks()));
            let r = d.symbol_range(a..b);
            let mut out = vec![0u32; r.len()];
            d.decode_chunks(a..b, ctx(), &mut out).unwrap();
            prop_assert_eq!(&out[..], &v[r]);
            prop_assert!(d.payload_bytes(a..b).unwrap() <= s.payload.len() as u64);
            prop_assert!(d.decode_chunks(0..d.chunks() + 1, ctx(), &mut out).is_err());
        }

        #[test]
        fn garbage_never_panics(model in proptest::collection::vec(any::<u8>(), 0..40), index in proptest::collection::vec(any::<u8>(), 0..80),
                                payload in proptest::collection::vec(any::<u8>(), 0..80), n in 0usize..40) {
            let s = RansStreams { model, index, payload };
            let mut out = vec![0u32; n];
            let _ = decode(&s, ctx(), &RansParams { chunk: 16, lanes: 3, prob_bits: 10 }, &mut out);
        }
    }
}
