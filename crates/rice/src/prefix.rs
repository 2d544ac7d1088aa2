//! Lane-interleaved prefix codes for E8 words, shaped for a GPU warp that decodes them inside a
//! GEMV: a whole word a lane, one table lookup a symbol (or a pair of symbols), refills at fixed
//! points of a word.
//!
//! **Words.** Symbols come in words of [`WORD`] = 8 (the E8 lattice's): the first symbol's low
//! bit (the coset) selects the tables of the other seven, as in the rANS contexts of E8.
//!
//! **Codes.** Canonical prefix codes of at most `limit` bits (8..=12; lengths by package-merge,
//! so they are the best codes within the limit), MSB first: codes of one length are consecutive
//! in symbol order, shorter lengths first. A decoder looks up the next `limit` bits. With pairs
//! (`pair_limit` > 0) a word is five *units*: the first symbol, the pairs (s₁, s₂), (s₃, s₄),
//! (s₅, s₆) coded jointly as `a·base + b` under codes of at most `pair_limit` bits, and s₇; else
//! eight units of one symbol.
//!
//! **Layout: eight rows a chunk.** A matrix of `rows × words` words is cut into groups of 8
//! rows and segments of `segment` blocks of 4 words (32 columns). A chunk is one group's
//! segment, decoded by one warp: at step `t` lane `4n + q` decodes word `4·(s·segment + t) + q`
//! of the group's row `n` (a lane whose word is past the matrix is idle at that step). Those
//! are the values that lane feeds `mma.m16n8k16` as B fragments, so one stream serves a GEMV
//! and the tensor cores.
//!
//! **Spans: short rows.** Where a row is one segment, a chunk may span `span` consecutive
//! groups: the warp decodes them one after the other, its lanes' bit strings running on from
//! group to group (step `t` of a chunk is block `t mod blocks` of its group `⌊t/blocks⌋`).
//! Each lane's last, partly read words then weigh on `span` times as many symbols: on rows of
//! 576 values, spans of 3 groups save about 0.1 bits a value.
//!
//! **Bits and refills.** A lane keeps its own bit string: its units' codes in the order it
//! decodes them. Before fixed units of each word (*checks*) every active lane holding fewer than
//! 32 unread bits takes the chunk's next 32-bit word; lanes take them in lane order (a warp's
//! ballot and prefix count), checks in word order. Between checks a word's units use at most 32
//! bits, so no lane ever runs short. Singles check before units 0, G, 2G, … with
//! `G = ⌊32/limit⌋`; pairs before units 0 and 2. The encoder writes each lane's string as
//! 32-bit words (first bit in bit 31) and interleaves them in the order the warp asks for them;
//! a lane that asks for a word past its string gets a zero word. A chunk's trailing zero words
//! are not stored: reads past a chunk's end give 0.
//!
//! Streams: `model` (with pairs one byte `base`; then per table a `u16` alphabet size and the
//! code lengths as 4-bit nibbles, low nibble first; tables: first, the others under coset 0 and
//! 1 — with pairs: first, s₇ under coset 0 and 1, pairs under coset 0 and 1), `index` (a `u32`
//! word offset per chunk), `payload` (32-bit words, little-endian).

use crate::{CodingError, Result};
use std::borrow::Cow;
use std::ops::{Range, RangeInclusive};

/// Lanes of a warp, and chunks' lanes.
pub const WARP: usize = 32;
/// Symbols per word (E8).
pub const WORD: usize = 8;
/// Code-length limits a table may have.
pub const LIMITS: RangeInclusive<u8> = 8..=12;
/// Single symbols are below this (as rANS's directly coded symbols): a single table holds at
/// most this many entries.
pub const MAX_SINGLE: u32 = 256;
/// Pair coordinates are below this: a pair table holds at most `64² = 4096` entries, the
/// symbols of a 12-bit code space.
pub const MAX_PAIR_BASE: u32 = 64;
/// Most 32-column blocks a chunk's rows hold (2^16: 2^21 columns).
pub const MAX_SEGMENT: usize = 1 << 16;
/// The most segments a row takes in the GPU shapes the writer chooses
/// ([`PrefixParams::segment_for`], [`PrefixParams::segment_taking`]): a GPU block's warps sum a
/// row's segments (where a row would need segments over [`MAX_SEGMENT`] blocks, it holds more).
pub const MAX_ROW_SEGMENTS: usize = 16;
/// Most row groups a chunk spans (2^16).
pub const MAX_SPAN: usize = 1 << 16;
/// Columns of a block: 4 words.
pub const BLOCK_WORDS: usize = 4;
/// Rows of a chunk.
pub const GROUP_ROWS: usize = 8;

/// Parameters of the prefix coder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixParams {
    /// Longest single code (8..=12). By default, 8.
    pub limit: u8,
    /// Longest pair code, or 0 for singles only; with pairs `limit + pair_limit ≤ 32` and
    /// `2·pair_limit + limit ≤ 32`. By default, 12.
    pub pair_limit: u8,
    /// 32-column blocks a chunk holds of each of its 8 rows (1..=[`MAX_SEGMENT`]). By default,
    /// 64: chunks of 2^14 symbols.
    pub segment: usize,
    /// Groups of 8 rows a chunk spans (1..=[`MAX_SPAN`]); above 1 only where a row is one
    /// segment, and at most [`MAX_SEGMENT`] blocks in all (a chunk holds at most 2^24 symbols,
    /// as with one segment of the most blocks): short rows then still make chunks of many
    /// symbols. By default, 1.
    pub span: usize,
}

impl Default for PrefixParams {
    fn default() -> Self {
        PrefixParams {
            limit: 8,
            pair_limit: 12,
            segment: 64,
            span: 1,
        }
    }
}

impl PrefixParams {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        if !LIMITS.contains(&self.limit) {
            return Err(CodingError::Invalid {
                what: "prefix limit",
                value: self.limit as u64,
            });
        }
        let (l, p) = (self.limit as u32, self.pair_limit as u32);
        if p != 0 && (!LIMITS.contains(&self.pair_limit) || l + 2 * p > 32) {
            return Err(CodingError::Invalid {
                what: "prefix pair_limit (8..=12, 2·pair_limit + limit ≤ 32)",
                value: p as u64,
            });
        }
        if self.segment == 0 || self.segment > MAX_SEGMENT {
            return Err(CodingError::Invalid {
                what: "prefix segment",
                value: self.segment as u64,
            });
        }
        if self.span == 0 || self.span > MAX_SPAN {
            return Err(CodingError::Invalid {
                what: "prefix span",
                value: self.span as u64,
            });
        }
        Ok(())
    }

    /// Whether pairs are coded jointly.
    pub fn pairs(&self) -> bool {
        self.pair_limit != 0
    }

    /// The segment that gives chunks of about `symbols` symbols for rows of `words` words:
    /// the row's blocks shared out evenly among the nearest whole number of chunks' worth, at
    /// least one and at most 16 segments a row (a GPU block's warps sum a row's segments).
    /// At 32 blocks a chunk, 40 blocks make one segment (not 32 and a short one of 8: a warp of
    /// a quarter of the work, and each lane's partly read last words over fewer symbols), 48
    /// make two of 24.
    pub fn segment_for(words: usize, symbols: usize) -> usize {
        let blocks = words.div_ceil(BLOCK_WORDS).max(1);
        let per_chunk = (symbols / (GROUP_ROWS * BLOCK_WORDS * WORD)).max(1);
        let segments = ((blocks + per_chunk / 2) / per_chunk).clamp(1, MAX_ROW_SEGMENTS);
        blocks.div_ceil(segments).min(MAX_SEGMENT)
    }

    /// A segment of `segment` blocks asked for rows of `words` words, lengthened where a row
    /// would hold more than [`MAX_ROW_SEGMENTS`] of them, at most [`MAX_SEGMENT`].
    pub fn segment_taking(words: usize, segment: usize) -> usize {
        let blocks = words.div_ceil(BLOCK_WORDS).max(1);
        segment
            .max(blocks.div_ceil(MAX_ROW_SEGMENTS))
            .min(MAX_SEGMENT)
    }

    /// The span that gives chunks of about `symbols` symbols for rows of `words` words cut in
    /// segments of `segment` blocks: 1 unless a row is one segment.
    pub fn span_for(words: usize, segment: usize, symbols: usize) -> usize {
        let blocks = words.div_ceil(BLOCK_WORDS).max(1);
        if blocks > segment {
            return 1;
        }
        (symbols / (GROUP_ROWS * words.max(1) * WORD)).clamp(1, MAX_SEGMENT / blocks)
    }

    /// The units of a word: (first symbol, symbols, table under coset 0, under coset 1).
    fn units(&self) -> &'static [(usize, usize, usize, usize)] {
        if self.pairs() {
            &[
                (0, 1, 0, 0),
                (1, 2, 3, 4),
                (3, 2, 3, 4),
                (5, 2, 3, 4),
                (7, 1, 1, 2),
            ]
        } else {
            &[
                (0, 1, 0, 0),
                (1, 1, 1, 2),
                (2, 1, 1, 2),
                (3, 1, 1, 2),
                (4, 1, 1, 2),
                (5, 1, 1, 2),
                (6, 1, 1, 2),
                (7, 1, 1, 2),
            ]
        }
    }

    /// The units of a word between consecutive refill checks, `units()[a..b]`: checks before
    /// units 0, G, 2G, … (`G = ⌊32/limit⌋`) for singles, before units 0 and 2 with pairs.
    fn groups(&self) -> Vec<(usize, usize)> {
        let n = self.units().len();
        let step = 32 / self.limit as usize;
        let checks: Vec<usize> = (0..n)
            .filter(|&u| {
                if self.pairs() {
                    u == 0 || u == 2
                } else {
                    u.is_multiple_of(step)
                }
            })
            .collect();
        checks
            .iter()
            .enumerate()
            .map(|(i, &a)| (a, checks.get(i + 1).copied().unwrap_or(n)))
            .collect()
    }

    /// Code-length limit of table `t`.
    fn table_limit(&self, t: usize) -> u8 {
        if self.pairs() && t >= 3 {
            self.pair_limit
        } else {
            self.limit
        }
    }

    /// Tables: 3 for singles, 5 with pairs.
    fn tables(&self) -> usize {
        if self.pairs() {
            5
        } else {
            3
        }
    }
}

/// A matrix of `rows × words` E8 words as the chunks of [`PrefixParams::segment`] blocks of
/// eight rows (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Rows.
    pub rows: usize,
    /// Words a row.
    pub words: usize,
    /// Blocks a chunk's rows hold.
    pub segment: usize,
    /// Groups of 8 rows a chunk spans (above 1 only where a row is one segment).
    pub span: usize,
}

impl Layout {
    /// The layout of `rows × words` words under `params`.
    pub fn new(rows: usize, words: usize, params: &PrefixParams) -> Layout {
        Layout {
            rows,
            words,
            segment: params.segment,
            span: params.span,
        }
    }

    fn blocks(&self) -> usize {
        self.words.div_ceil(BLOCK_WORDS)
    }

    /// Segments a row.
    pub fn segments(&self) -> usize {
        self.blocks().div_ceil(self.segment.max(1))
    }

    /// Groups of 8 rows.
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP_ROWS)
    }

    /// Spans of `span` groups (the last may hold fewer).
    pub fn spans(&self) -> usize {
        self.groups().div_ceil(self.span.max(1))
    }

    /// Chunks: spans × segments (0 for an empty matrix).
    pub fn chunks(&self) -> usize {
        if self.words == 0 {
            0
        } else {
            self.spans() * self.segments()
        }
    }

    /// The chunks that hold groups `groups` (chunks of one span are consecutive); with spans
    /// of several groups they may hold other groups too.
    pub fn group_chunks(&self, groups: Range<usize>) -> Range<usize> {
        let s = if self.words == 0 { 0 } else { self.segments() };
        let span = self.span.max(1);
        if groups.start >= groups.end {
            let c = groups.start.div_ceil(span) * s;
            return c..c;
        }
        groups.start / span * s..groups.end.div_ceil(span) * s
    }

    /// The groups chunk `c` holds (none for an empty matrix).
    pub fn chunk_groups(&self, c: usize) -> Range<usize> {
        let (segs, span) = (self.segments().max(1), self.span.max(1));
        let g = (c / segs).saturating_mul(span).min(self.groups());
        g..g.saturating_add(span).min(self.groups())
    }

    /// Blocks a row of chunk `c` holds (its segment's).
    fn seg_steps(&self, c: usize) -> usize {
        let s = c % self.segments();
        self.segment.min(self.blocks() - s * self.segment)
    }

    /// Steps of chunk `c`: its groups one after the other, the blocks of its segment in each.
    fn steps(&self, c: usize) -> usize {
        self.chunk_groups(c).len() * self.seg_steps(c)
    }

    /// The (row, word) lane `lane` decodes at step `t` of chunk `c`, if any.
    fn word_at(&self, c: usize, lane: usize, t: usize) -> Option<(usize, usize)> {
        let (s, n) = (c % self.segments(), self.seg_steps(c));
        let g = self.chunk_groups(c).start + t / n;
        let row = g * GROUP_ROWS + lane / BLOCK_WORDS;
        let word = (s * self.segment + t % n) * BLOCK_WORDS + lane % BLOCK_WORDS;
        (row < self.rows && word < self.words).then_some((row, word))
    }

    /// Checks the layout against `params`: the same segment and span, a span above 1 only where
    /// a row is one segment, a size that fits.
    pub fn check(&self, params: &PrefixParams) -> Result<()> {
        params.validate()?;
        if self.segment != params.segment {
            return Err(CodingError::Invalid {
                what: "prefix layout segment (differs from the parameters')",
                value: self.segment as u64,
            });
        }
        if self.span != params.span {
            return Err(CodingError::Invalid {
                what: "prefix layout span (differs from the parameters')",
                value: self.span as u64,
            });
        }
        if self.span > 1 && self.words > 0 && self.segments() > 1 {
            return Err(CodingError::Invalid {
                what: "prefix span (above 1 only where a row is one segment)",
                value: self.span as u64,
            });
        }
        if self.span > 1 && self.span.saturating_mul(self.blocks()) > MAX_SEGMENT {
            return Err(CodingError::Invalid {
                what: "prefix span (a chunk holds at most 2^16 blocks of its rows)",
                value: self.span as u64,
            });
        }
        if self
            .rows
            .checked_mul(self.words)
            .and_then(|w| w.checked_mul(WORD))
            .is_none()
        {
            return Err(CodingError::Invalid {
                what: "prefix matrix size (rows × words overflows)",
                value: self.rows as u64,
            });
        }
        Ok(())
    }
}

/// One table's codes: length (0: no code) and canonical code of each symbol.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Code {
    lengths: Vec<u8>,
    codes: Vec<u32>,
}

impl Code {
    fn new(lengths: Vec<u8>) -> Code {
        let mut order: Vec<usize> = (0..lengths.len()).filter(|&s| lengths[s] > 0).collect();
        order.sort_by_key(|&s| (lengths[s], s));
        let mut codes = vec![0u32; lengths.len()];
        let (mut code, mut prev) = (0u32, 0u8);
        for s in order {
            code <<= lengths[s] - prev;
            prev = lengths[s];
            codes[s] = code;
            code += 1;
        }
        Code { lengths, codes }
    }

    /// Slots of a `limit`-bit lookup: (symbol, length), length 0 where no code leads.
    fn slots(&self, limit: u8) -> Vec<(u32, u8)> {
        let mut t = vec![(0u32, 0u8); 1 << limit];
        for (s, (&n, &c)) in self.lengths.iter().zip(&self.codes).enumerate() {
            if n > 0 {
                let lo = (c as usize) << (limit - n);
                t[lo..lo + (1 << (limit - n))].fill((s as u32, n));
            }
        }
        t
    }
}

/// The per-table codes of a tensor's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    params: PrefixParams,
    /// Pair coordinates are below this (1 without pairs).
    base: u32,
    tables: Vec<Code>,
}

/// Optimal code lengths of at most `limit` bits for the symbols with a non-zero count
/// (package-merge); 0 for the others.
fn limited_lengths(counts: &[u64], limit: u8) -> Result<Vec<u8>> {
    let mut leaves: Vec<(u64, usize)> = (0..counts.len())
        .filter(|&s| counts[s] > 0)
        .map(|s| (counts[s], s))
        .collect();
    let mut lengths = vec![0u8; counts.len()];
    let n = leaves.len();
    if n > 1 << limit {
        return Err(CodingError::Unrepresentable {
            what: "count of distinct symbols in one table",
            value: n as u64,
            max: 1 << limit,
        });
    }
    if n <= 1 {
        if let Some(&(_, s)) = leaves.first() {
            lengths[s] = 1;
        }
        return Ok(lengths);
    }
    leaves.sort_unstable();
    // Nodes: leaves are 0..n (by weight), packages after; a package holds two nodes.
    let mut kids: Vec<(usize, usize)> = Vec::new();
    let leaf_list: Vec<(u64, usize)> = leaves.iter().enumerate().map(|(i, l)| (l.0, i)).collect();
    let mut cur = leaf_list.clone();
    for _ in 1..limit {
        let packages: Vec<(u64, usize)> = cur
            .chunks_exact(2)
            .map(|p| {
                kids.push((p[0].1, p[1].1));
                (p[0].0 + p[1].0, n + kids.len() - 1)
            })
            .collect();
        // Merge, leaves first on ties.
        let mut merged = Vec::with_capacity(n + packages.len());
        let (mut a, mut b) = (0, 0);
        while a < n || b < packages.len() {
            if b >= packages.len() || (a < n && leaf_list[a].0 <= packages[b].0) {
                merged.push(leaf_list[a]);
                a += 1;
            } else {
                merged.push(packages[b]);
                b += 1;
            }
        }
        cur = merged;
    }
    let mut stack: Vec<usize> = cur[..2 * n - 2].iter().map(|&(_, i)| i).collect();
    while let Some(i) = stack.pop() {
        if i < n {
            lengths[leaves[i].1] += 1;
        } else {
            let (x, y) = kids[i - n];
            stack.push(x);
            stack.push(y);
        }
    }
    Ok(lengths)
}

impl Model {
    /// The best codes within the limits for `symbols` (whole words).
    pub fn fit(symbols: &[u32], params: &PrefixParams) -> Result<Model> {
        params.validate()?;
        if !symbols.len().is_multiple_of(WORD) {
            return Err(CodingError::Length {
                what: "prefix symbols (whole words)",
                expected: symbols.len().next_multiple_of(WORD) as u64,
                actual: symbols.len() as u64,
            });
        }
        let too_large = |value: u32, max: u32| CodingError::Unrepresentable {
            what: "single symbol",
            value: value as u64,
            max: max as u64 - 1,
        };
        let base = if params.pairs() {
            let m = symbols
                .chunks_exact(WORD)
                .flat_map(|w| w[1..7].iter())
                .copied()
                .max()
                .unwrap_or(0);
            if m >= MAX_PAIR_BASE {
                return Err(CodingError::Unrepresentable {
                    what: "pair coordinate symbol",
                    value: m as u64,
                    max: MAX_PAIR_BASE as u64 - 1,
                });
            }
            m + 1
        } else {
            1
        };
        let units = params.units();
        let mut counts: Vec<Vec<u64>> = (0..params.tables())
            .map(|t| {
                let size = if params.pairs() && t >= 3 {
                    base * base
                } else {
                    MAX_SINGLE
                };
                vec![0u64; size as usize]
            })
            .collect();
        for w in symbols.chunks_exact(WORD) {
            let c = (w[0] & 1) as usize;
            for &(first, width, t0, t1) in units {
                let t = if c == 0 { t0 } else { t1 };
                let s = if width == 2 {
                    w[first] * base + w[first + 1]
                } else if w[first] >= MAX_SINGLE {
                    return Err(too_large(w[first], MAX_SINGLE));
                } else {
                    w[first]
                };
                counts[t][s as usize] += 1;
            }
        }
        let tables = counts
            .iter()
            .enumerate()
            .map(|(t, c)| {
                let mut l = limited_lengths(c, params.table_limit(t))?;
                let used = l.iter().rposition(|&n| n > 0).map_or(0, |i| i + 1);
                l.truncate(used);
                Ok(Code::new(l))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Model {
            params: *params,
            base,
            tables,
        })
    }

    /// The serialized model (module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.params.pairs() {
            out.push(self.base as u8);
        }
        for t in &self.tables {
            out.extend_from_slice(&(t.lengths.len() as u16).to_le_bytes());
            for p in t.lengths.chunks(2) {
                out.push(p[0] | p.get(1).map_or(0, |h| h << 4));
            }
        }
        out
    }

    /// Parses a model written by [`Model::to_bytes`] for `params`, checking every length
    /// against its table's limit and the code space (Kraft's inequality).
    pub fn from_bytes(bytes: &[u8], params: &PrefixParams) -> Result<Model> {
        params.validate()?;
        let truncated = CodingError::Truncated {
            what: "prefix model",
        };
        let mut at = 0usize;
        let base = if params.pairs() {
            let b = *bytes.first().ok_or(truncated.clone())? as u32;
            at = 1;
            if b == 0 || b > MAX_PAIR_BASE {
                return Err(CodingError::Invalid {
                    what: "prefix pair base",
                    value: b as u64,
                });
            }
            b
        } else {
            1
        };
        let mut tables = Vec::with_capacity(params.tables());
        for t in 0..params.tables() {
            let size = bytes.get(at..at + 2).ok_or(truncated.clone())?;
            let n = u16::from_le_bytes([size[0], size[1]]) as usize;
            at += 2;
            let max = if params.pairs() && t >= 3 {
                (base * base) as usize
            } else {
                MAX_SINGLE as usize
            };
            if n > max {
                return Err(CodingError::Invalid {
                    what: "prefix table size",
                    value: n as u64,
                });
            }
            let packed = bytes.get(at..at + n.div_ceil(2)).ok_or(truncated.clone())?;
            at += n.div_ceil(2);
            let lengths: Vec<u8> = (0..n)
                .map(|i| (packed[i / 2] >> (4 * (i % 2))) & 15)
                .collect();
            let limit = params.table_limit(t);
            let mut kraft = 0u64;
            for &l in &lengths {
                if l > limit {
                    return Err(CodingError::Invalid {
                        what: "prefix code length",
                        value: l as u64,
                    });
                }
                if l > 0 {
                    kraft += 1 << (limit - l);
                }
            }
            if kraft > 1 << limit {
                return Err(CodingError::Invalid {
                    what: "prefix code space (Kraft sum, in units of the longest code)",
                    value: kraft,
                });
            }
            tables.push(Code::new(lengths));
        }
        if at != bytes.len() {
            return Err(CodingError::Length {
                what: "prefix model bytes",
                expected: at as u64,
                actual: bytes.len() as u64,
            });
        }
        Ok(Model {
            params: *params,
            base,
            tables,
        })
    }

    /// The parameters the model was fitted or read for.
    pub fn params(&self) -> &PrefixParams {
        &self.params
    }

    /// Pair coordinates are below this (1 without pairs).
    pub fn base(&self) -> u32 {
        self.base
    }

    /// Per table, the code length of each symbol (0: no code): singles' tables are first, the
    /// others under coset 0 and 1; with pairs, first, s₇ under coset 0 and 1, pairs under
    /// coset 0 and 1 (a pair's symbol `a·base + b`).
    pub fn lengths(&self) -> Vec<&[u8]> {
        self.tables.iter().map(|t| t.lengths.as_slice()).collect()
    }

    /// Per table, its `2^limit` lookup slots: the symbol and code length the next `limit` bits
    /// begin with (length 0 where no code does), as a GPU table is built from them.
    pub fn slots(&self) -> Vec<Vec<(u32, u8)>> {
        (0..self.tables.len())
            .map(|t| self.tables[t].slots(self.params.table_limit(t)))
            .collect()
    }

    /// The decode tables a GPU warp reads (kernels/e8_prefix.cuh), `u32` entries: per table
    /// its `2^limit` slots (pair tables two `u32` a slot), tables in [`Model::lengths`]'s order.
    /// A slot holds the doubled E8 coordinate its code gives, as f32 bits, with the code length
    /// in bits 0–4 and a parity in bit 5: the first symbol's `4t + c` with the coset c; under
    /// coset c a single's `2s + c` with the parity of s, a pair's `2a + c` with the parity of
    /// a + b, then `2b + c` exact in the second `u32`. Slots no code reaches hold 1 (length 1,
    /// value 0), so a corrupt stream decodes to wrong values, never out of bounds.
    pub fn warp_table(&self) -> Vec<u32> {
        let unzz = |z: u32| ((z >> 1) as i32) ^ -((z & 1) as i32);
        let bits = |v: i32| (v as f32).to_bits();
        let mut out = Vec::new();
        for (t, slots) in self.slots().iter().enumerate() {
            let pair = self.params.pairs() && t >= 3;
            // The coset of the tables after the first: 1 + c (singles, or s₇ with pairs) or
            // 3 + c (pairs).
            let c = if t == 0 { 0 } else { ((t - 1) % 2) as i32 };
            for &(s, n) in slots {
                if n == 0 {
                    out.push(1);
                    if pair {
                        out.push(0);
                    }
                    continue;
                }
                let n = n as u32;
                if t == 0 {
                    let c = (s & 1) as i32;
                    out.push(bits(4 * unzz(s >> 1) + c) | n | (c as u32) << 5);
                } else if pair {
                    let (a, b) = (unzz(s / self.base), unzz(s % self.base));
                    out.push(bits(2 * a + c) | n | (((a + b) & 1) as u32) << 5);
                    out.push(bits(2 * b + c));
                } else {
                    let v = unzz(s);
                    out.push(bits(2 * v + c) | n | ((v & 1) as u32) << 5);
                }
            }
        }
        out
    }

    /// Code and length of unit symbol `s` in table `t` (length 0: none).
    fn code(&self, t: usize, s: u32) -> (u32, u8) {
        let c = &self.tables[t];
        match c.lengths.get(s as usize) {
            Some(&n) if n > 0 => (c.codes[s as usize], n),
            _ => (0, 0),
        }
    }
}

/// Packs a lane's codes MSB-first into 32-bit words.
#[derive(Default)]
struct BitString {
    words: Vec<u32>,
    acc: u64,
    bits: u32,
}

impl BitString {
    fn push(&mut self, code: u32, len: u8) {
        self.acc = (self.acc << len) | code as u64;
        self.bits += len as u32;
        if self.bits >= 32 {
            self.bits -= 32;
            self.words.push((self.acc >> self.bits) as u32);
        }
    }

    fn finish(mut self) -> Vec<u32> {
        if self.bits > 0 {
            self.words.push((self.acc << (32 - self.bits)) as u32);
        }
        self.words
    }
}

/// Encodes chunk `c` of the `layout.rows × layout.words` words `symbols` (row after row) with
/// `model`: its words in the order the warp reads them, trailing zeros dropped.
pub fn encode_chunk(symbols: &[u32], layout: &Layout, model: &Model, c: usize) -> Result<Vec<u32>> {
    let p = &model.params;
    check_layout(symbols.len(), layout, p)?;
    if c >= layout.chunks() {
        return Err(CodingError::Invalid {
            what: "prefix chunk index",
            value: c as u64,
        });
    }
    let (units, groups) = (p.units(), p.groups());
    let mut lanes: Vec<BitString> = (0..WARP).map(|_| BitString::default()).collect();
    let mut unread = [0u32; WARP];
    // Which lane takes each word, in the warp's order.
    let mut order: Vec<u8> = Vec::new();
    for t in 0..layout.steps(c) {
        for &(u, end) in &groups {
            for (lane, bits) in lanes.iter_mut().enumerate() {
                let Some((row, word)) = layout.word_at(c, lane, t) else {
                    continue;
                };
                let w = &symbols[(row * layout.words + word) * WORD..][..WORD];
                if unread[lane] < 32 {
                    order.push(lane as u8);
                    unread[lane] += 32;
                }
                let cset = (w[0] & 1) as usize;
                for &(first, width, t0, t1) in &units[u..end] {
                    let table = if cset == 0 { t0 } else { t1 };
                    let s = if width == 2 {
                        let m = w[first].max(w[first + 1]);
                        if m >= model.base {
                            return Err(CodingError::Invalid {
                                what: "pair coordinate symbol (beyond the model's base)",
                                value: m as u64,
                            });
                        }
                        w[first] * model.base + w[first + 1]
                    } else {
                        w[first]
                    };
                    let (code, len) = model.code(table, s);
                    if len == 0 {
                        return Err(CodingError::Invalid {
                            what: "symbol (the model has no code for it)",
                            value: s as u64,
                        });
                    }
                    bits.push(code, len);
                    unread[lane] -= len as u32;
                }
            }
        }
    }
    let strings: Vec<Vec<u32>> = lanes.into_iter().map(BitString::finish).collect();
    let mut next = [0usize; WARP];
    let mut out: Vec<u32> = order
        .iter()
        .map(|&l| {
            let l = l as usize;
            next[l] += 1;
            strings[l].get(next[l] - 1).copied().unwrap_or(0)
        })
        .collect();
    let keep = out.iter().rposition(|&w| w != 0).map_or(0, |i| i + 1);
    out.truncate(keep);
    Ok(out)
}

fn check_layout(n: usize, layout: &Layout, p: &PrefixParams) -> Result<()> {
    layout.check(p)?;
    let want = layout
        .rows
        .checked_mul(layout.words)
        .and_then(|w| w.checked_mul(WORD));
    if want != Some(n) {
        return Err(CodingError::Length {
            what: "prefix symbols",
            expected: want.unwrap_or(u64::MAX as usize) as u64,
            actual: n as u64,
        });
    }
    Ok(())
}

/// The streams of an encoded matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixStreams {
    /// The serialized model.
    pub model: Vec<u8>,
    /// A `u32` word offset per chunk, little-endian.
    pub index: Vec<u8>,
    /// 32-bit words, little-endian.
    pub payload: Vec<u8>,
}

/// Assembles encoded chunks (in chunk order) into streams.
pub fn assemble(chunks: &[Vec<u32>], model: &Model) -> Result<PrefixStreams> {
    let mut index = Vec::with_capacity(chunks.len() * 4);
    let mut payload = Vec::new();
    for c in chunks {
        let at = u32::try_from(payload.len() / 4).map_err(|_| CodingError::Invalid {
            what: "prefix payload words (over 2^32)",
            value: (payload.len() / 4) as u64,
        })?;
        index.extend_from_slice(&at.to_le_bytes());
        for w in c {
            payload.extend_from_slice(&w.to_le_bytes());
        }
    }
    Ok(PrefixStreams {
        model: model.to_bytes(),
        index,
        payload,
    })
}

/// Encodes a matrix's words with a model fitted to them.
pub fn encode(symbols: &[u32], layout: &Layout, params: &PrefixParams) -> Result<PrefixStreams> {
    check_layout(symbols.len(), layout, params)?;
    let model = Model::fit(symbols, params)?;
    let chunks = (0..layout.chunks())
        .map(|c| encode_chunk(symbols, layout, &model, c))
        .collect::<Result<Vec<_>>>()?;
    assemble(&chunks, &model)
}

/// Decodes the streams of one matrix, a group of 8 rows at a time.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    model: Model,
    layout: Layout,
    /// `chunks + 1` word offsets (checked: they never decrease and end at the payload's end).
    starts: Vec<u32>,
    payload: Cow<'a, [u8]>,
    /// Every table's slots end to end, each `len | a << 8` (singles) or `len | a << 8 | b << 16`
    /// (pairs), 0 where no code leads.
    flat: Vec<u32>,
    /// Each table's (offset, slots) in `flat`.
    tables: Vec<(usize, usize)>,
    /// The units between consecutive refill checks: `PrefixParams::units()[a..b]`.
    groups: Vec<(usize, usize)>,
    /// Bytes of the model and index streams.
    side_bytes: u64,
}

impl<'a> Decoder<'a> {
    /// Checks the streams against `layout` and `params`.
    pub fn new(
        model: &[u8],
        index: &[u8],
        payload: &'a [u8],
        layout: Layout,
        params: &PrefixParams,
    ) -> Result<Decoder<'a>> {
        let model_len = model.len();
        let model = Model::from_bytes(model, params)?;
        layout.check(params)?;
        let chunks = layout.chunks();
        if index.len() as u64 != chunks as u64 * 4 {
            return Err(CodingError::Length {
                what: "prefix index bytes",
                expected: chunks as u64 * 4,
                actual: index.len() as u64,
            });
        }
        if !payload.len().is_multiple_of(4) {
            return Err(CodingError::Invalid {
                what: "prefix payload bytes (whole 32-bit words)",
                value: payload.len() as u64,
            });
        }
        let total = (payload.len() / 4) as u64;
        let mut starts: Vec<u32> = index
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if starts.first().is_some_and(|&s| s != 0)
            || starts.windows(2).any(|w| w[1] < w[0])
            || starts.last().is_some_and(|&s| s as u64 > total)
        {
            return Err(CodingError::Invalid {
                what: "prefix chunk offsets (must start at 0, never decrease, stay in the payload)",
                value: total,
            });
        }
        if total > u32::MAX as u64 || (chunks == 0 && total > 0) {
            return Err(CodingError::Invalid {
                what: "prefix payload words (over 2^32, or any without a chunk)",
                value: total,
            });
        }
        starts.push(total as u32);
        let (mut flat, mut offsets) = (Vec::new(), Vec::new());
        for (t, slots) in model.slots().iter().enumerate() {
            offsets.push(flat.len());
            let pair = params.pairs() && t >= 3;
            flat.extend(slots.iter().map(|&(sym, n)| match (n, pair) {
                (0, _) => 0,
                (n, false) => n as u32 | sym << 8,
                (n, true) => n as u32 | (sym / model.base) << 8 | (sym % model.base) << 16,
            }));
        }
        let tables: Vec<(usize, usize)> = (0..offsets.len())
            .map(|t| (offsets[t], 1usize << params.table_limit(t)))
            .collect();
        if tables.iter().any(|&(at, n)| at + n > flat.len()) {
            return Err(CodingError::Invalid {
                what: "prefix decode tables (shorter than their code limits)",
                value: flat.len() as u64,
            });
        }
        let groups = params.groups();
        let side_bytes = (model_len + index.len()) as u64;
        Ok(Decoder {
            model,
            layout,
            starts,
            payload: Cow::Borrowed(payload),
            flat,
            tables,
            groups,
            side_bytes,
        })
    }

    /// The same decoder owning a copy of the payload.
    pub fn into_owned(self) -> Decoder<'static> {
        Decoder {
            payload: Cow::Owned(self.payload.into_owned()),
            model: self.model,
            layout: self.layout,
            starts: self.starts,
            flat: self.flat,
            tables: self.tables,
            groups: self.groups,
            side_bytes: self.side_bytes,
        }
    }

    /// Bytes of the three streams as stored.
    pub fn stream_bytes(&self) -> u64 {
        self.side_bytes + self.payload.len() as u64
    }

    /// The payload (32-bit words, little-endian).
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Payload bytes of the chunks of groups `groups`.
    pub fn payload_bytes(&self, groups: Range<usize>) -> u64 {
        let c = self
            .layout
            .group_chunks(groups.start.min(groups.end)..groups.end);
        let c = c.start.min(self.starts.len() - 1)..c.end.min(self.starts.len() - 1);
        (self.starts[c.end] - self.starts[c.start]) as u64 * 4
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Chunk `c`'s stored words.
    fn words(&self, c: usize) -> &[u8] {
        &self.payload[self.starts[c] as usize * 4..self.starts[c + 1] as usize * 4]
    }

    /// Word offsets of the chunks: `chunks + 1` of them, the last the payload's length.
    pub fn starts(&self) -> &[u32] {
        &self.starts
    }

    /// Decodes groups `groups` (of 8 rows) into `out`: their rows' symbols, row after row
    /// (`8·words·8` a group, fewer for the last). A chunk whose codes reach a slot no code
    /// leads to, or that stores words its lanes never read (other than zeros), is corrupt.
    pub fn decode_groups(&self, groups: Range<usize>, out: &mut [u32]) -> Result<()> {
        let l = &self.layout;
        if groups.end > l.groups() || groups.start > groups.end {
            return Err(CodingError::Invalid {
                what: "prefix group range end",
                value: groups.end as u64,
            });
        }
        let first_row = groups.start * GROUP_ROWS;
        let rows = (groups.end * GROUP_ROWS)
            .min(l.rows)
            .saturating_sub(first_row);
        let want = rows * l.words * WORD;
        if out.len() != want {
            return Err(CodingError::Length {
                what: "prefix output symbols",
                expected: want as u64,
                actual: out.len() as u64,
            });
        }
        for c in l.group_chunks(groups) {
            self.decode_chunk(c, first_row, out)?;
        }
        Ok(())
    }

    /// Decodes every word.
    pub fn decode(&self) -> Result<Vec<u32>> {
        let mut out = vec![0u32; self.layout.rows * self.layout.words * WORD];
        self.decode_groups(0..self.layout.groups(), &mut out)?;
        Ok(out)
    }

    fn decode_chunk(&self, c: usize, first_row: usize, out: &mut [u32]) -> Result<()> {
        let l = &self.layout;
        let words = self.words(c);
        let stored = words.len() / 4;
        let mut taken = 0usize;
        let mut buf = [0u64; WARP];
        let mut unread = [0u32; WARP];
        let out_rows = out.len() / (l.words * WORD).max(1);
        // Rows of the chunk's other groups outside `out` are decoded here and dropped (a lane's
        // word spans the checks, so each lane has its own).
        let mut scratch = [[0u32; WORD]; WARP];
        let tabs: Vec<&[u32]> = self
            .tables
            .iter()
            .map(|&(at, len)| &self.flat[at..at + len])
            .collect();
        let p = self.model.params();
        let (pairs, limits) = (p.pairs(), (p.limit as u32, p.pair_limit as u32));
        let (s, n) = (c % l.segments(), l.seg_steps(c));
        let g0 = l.chunk_groups(c).start;
        for t in 0..l.steps(c) {
            // Step t: block `blk` of group `g`; lane 4·r + q holds word 4·blk + q of row 8·g + r,
            // where both exist (the others are idle).
            let (g, blk) = (g0 + t / n, s * l.segment + t % n);
            let (row0, word0) = (g * GROUP_ROWS, blk * BLOCK_WORDS);
            let live_rows = l.rows.saturating_sub(row0).min(GROUP_ROWS);
            let live_words = l.words.saturating_sub(word0).min(BLOCK_WORDS);
            for &(u0, u1) in &self.groups {
                for r in 0..live_rows {
                    let row = row0 + r;
                    let local = row.wrapping_sub(first_row);
                    for q in 0..live_words {
                        let lane = r * BLOCK_WORDS + q;
                        let (mut b, mut left) = (buf[lane], unread[lane]);
                        // Branch-free: whether a lane takes a word is as good as random.
                        let need = left < 32;
                        let w = if taken < stored {
                            let at = taken * 4;
                            u32::from_le_bytes([
                                words[at],
                                words[at + 1],
                                words[at + 2],
                                words[at + 3],
                            ])
                        } else {
                            0
                        };
                        b |= ((w as u64) << (32 - left.min(32))) * need as u64;
                        taken += need as usize;
                        left += 32 * need as u32;
                        let w = if local < out_rows {
                            let at = (local * l.words + word0 + q) * WORD;
                            &mut out[at..at + WORD]
                        } else {
                            &mut scratch[lane][..]
                        };
                        let used = if pairs {
                            pair_units(&tabs, limits, u0, &mut b, w)
                        } else {
                            single_units(&tabs, limits.0, u0..u1, &mut b, w)
                        };
                        let Some(used) = used else {
                            return Err(CodingError::Corrupt { chunk: c });
                        };
                        (buf[lane], unread[lane]) = (b, left - used);
                    }
                }
            }
        }
        // Words past those the lanes read must be zeros (a writer's padding).
        if words
            .get(taken.min(stored) * 4..)
            .is_some_and(|rest| rest.iter().any(|&b| b != 0))
        {
            return Err(CodingError::Corrupt { chunk: c });
        }
        Ok(())
    }
}

/// Decodes one unit from the buffer `b` (MSB first) with table `t` of `limit`-bit slots: its
/// slot's symbol bits (`a`, or `a | b << 8` for a pair), the code consumed and its length added
/// to `used`; `None` at bits no code leads with.
#[inline(always)]
fn unit(t: &[u32], limit: u32, b: &mut u64, used: &mut u32) -> Option<u32> {
    let e = t[(*b >> (64 - limit)) as usize];
    let len = e & 0xFF;
    if len == 0 {
        return None;
    }
    *b <<= len;
    *used += len;
    Some(e >> 8)
}

/// Decodes the singles `units` of a word into `w` from the buffer `b` (consumed), returning the
/// bits they took, or `None` at bits no code leads with. Tables: `tabs[0]` for the first
/// symbol, `tabs[1 + c]` for the others (`c`: the first symbol's low bit).
#[inline(always)]
fn single_units(
    tabs: &[&[u32]],
    limit: u32,
    units: Range<usize>,
    b: &mut u64,
    w: &mut [u32],
) -> Option<u32> {
    let mut used = 0;
    let mut from = units.start;
    if from == 0 {
        w[0] = unit(tabs[0], limit, b, &mut used)?;
        from = 1;
    }
    let t = tabs[1 + (w[0] & 1) as usize];
    for sym in &mut w[from..units.end] {
        *sym = unit(t, limit, b, &mut used)?;
    }
    Some(used)
}

/// As [`single_units`] for a word in pairs: from unit 0, the first symbol and the pair
/// (s₁, s₂); from unit 2, the pairs (s₃, s₄), (s₅, s₆) and s₇. Tables: first, s₇ under coset 0
/// and 1, pairs under coset 0 and 1; `limits`: (singles, pairs).
#[inline(always)]
fn pair_units(
    tabs: &[&[u32]],
    limits: (u32, u32),
    from: usize,
    b: &mut u64,
    w: &mut [u32],
) -> Option<u32> {
    let mut used = 0;
    let pair = |t: &[u32], b: &mut u64, used: &mut u32| {
        unit(t, limits.1, b, used).map(|v| (v & 0xFF, v >> 8))
    };
    if from == 0 {
        // (The coset from the symbol in hand, not read back from `w`.)
        let s0 = unit(tabs[0], limits.0, b, &mut used)?;
        w[0] = s0;
        (w[1], w[2]) = pair(tabs[3 + (s0 & 1) as usize], b, &mut used)?;
    } else {
        let c = (w[0] & 1) as usize;
        (w[3], w[4]) = pair(tabs[3 + c], b, &mut used)?;
        (w[5], w[6]) = pair(tabs[3 + c], b, &mut used)?;
        w[7] = unit(tabs[1 + c], limits.0, b, &mut used)?;
    }
    Some(used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Symbols of E8 words at about `bits` bits a coordinate: zig-zag coordinates of a rounded
    /// Gaussian, the first symbol `2·zz(t) + c`.
    fn words(n: usize, spread: f64, seed: u64) -> Vec<u32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut uniform = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let zz = |v: i64| {
            if v >= 0 {
                2 * v as u32
            } else {
                (-2 * v - 1) as u32
            }
        };
        let mut out = Vec::with_capacity(n * WORD);
        for _ in 0..n {
            let mut gauss = || {
                let (a, b) = (uniform().max(1e-12), uniform());
                (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
            };
            let t = zz((gauss() * spread / 2.0).round() as i64);
            let rest: Vec<u32> = (1..WORD)
                .map(|_| zz((gauss() * spread).round() as i64))
                .collect();
            out.push(2 * t + (uniform() < 0.5) as u32);
            out.extend(rest);
        }
        out
    }

    fn roundtrip(symbols: &[u32], layout: Layout, params: PrefixParams) -> PrefixStreams {
        let s = encode(symbols, &layout, &params).unwrap();
        let d = Decoder::new(&s.model, &s.index, &s.payload, layout, &params).unwrap();
        assert_eq!(d.decode().unwrap(), symbols);
        s
    }

    const PARAMS: [(u8, u8); 5] = [(8, 0), (10, 0), (12, 0), (8, 12), (8, 11)];

    #[test]
    fn package_merge_is_optimal_within_the_limit() {
        // Fibonacci weights: an unlimited Huffman code would be 12 deep.
        let counts: Vec<u64> = {
            let mut f = vec![1u64, 1];
            for i in 2..13 {
                f.push(f[i - 1] + f[i - 2]);
            }
            f
        };
        for limit in [4u8, 6, 8, 12] {
            let l = limited_lengths(&counts, limit).unwrap();
            assert!(l.iter().all(|&n| n >= 1 && n <= limit));
            let kraft: f64 = l.iter().map(|&n| 0.5f64.powi(n as i32)).sum();
            assert!((kraft - 1.0).abs() < 1e-12, "a full code: {kraft}");
        }
        // Against exhaustive search on a small alphabet: no code within the limit is cheaper.
        let counts = [40u64, 30, 10, 9, 5, 3, 2, 1];
        let l = limited_lengths(&counts, 3).unwrap();
        let cost = |l: &[u8]| {
            l.iter()
                .zip(&counts)
                .map(|(&n, &c)| n as u64 * c)
                .sum::<u64>()
        };
        let mut best = u64::MAX;
        for code in 0..3u32.pow(8) {
            let ls: Vec<u8> = (0..8).map(|i| (code / 3u32.pow(i) % 3 + 1) as u8).collect();
            if ls.iter().map(|&n| 0.5f64.powi(n as i32)).sum::<f64>() <= 1.0 {
                best = best.min(cost(&ls));
            }
        }
        assert_eq!(cost(&l), best);
        assert!(matches!(
            limited_lengths(&[1; 257], 8),
            Err(CodingError::Unrepresentable { value: 257, .. })
        ));
    }

    /// Empirical entropy of the words' symbols under E8's three contexts, bits a symbol.
    fn entropy(s: &[u32]) -> f64 {
        let mut counts = std::collections::HashMap::new();
        for w in s.chunks_exact(WORD) {
            for (j, &x) in w.iter().enumerate() {
                let ctx = if j == 0 { 0 } else { 1 + (w[0] & 1) };
                *counts.entry((ctx, x)).or_insert(0u64) += 1;
            }
        }
        let mut per_ctx = [0u64; 3];
        for (&(c, _), &n) in &counts {
            per_ctx[c as usize] += n;
        }
        let bits: f64 = counts
            .iter()
            .map(|(&(c, _), &n)| -(n as f64) * (n as f64 / per_ctx[c as usize] as f64).log2())
            .sum();
        bits / s.len() as f64
    }

    /// Bits a symbol a form may spend over the entropy on whole-row chunks: the code limit
    /// (0.14 bits for 8-bit singles on Gaussian data, docs/eval/cuda_rans.md) and the lanes'
    /// last, partly filled words.
    const OVERHEAD_BITS: f64 = 0.45;

    #[test]
    fn every_form_roundtrips_at_its_rate() {
        let (rows, words_per_row) = (64, 128);
        let s = words(rows * words_per_row, 3.0, 1);
        let h = entropy(&s);
        for (limit, pair_limit) in PARAMS {
            for segment in [1, 3, 10, 32] {
                let p = PrefixParams {
                    limit,
                    pair_limit,
                    segment,
                    span: 1,
                };
                let layout = Layout {
                    rows,
                    words: words_per_row,
                    segment,
                    span: 1,
                };
                let streams = roundtrip(&s, layout, p);
                let bits = (streams.payload.len() + streams.index.len() + streams.model.len())
                    as f64
                    * 8.0
                    / s.len() as f64;
                if segment == 32 {
                    assert!(
                        bits < h + OVERHEAD_BITS,
                        "{limit}/{pair_limit}: {bits} vs {h}"
                    );
                }
            }
        }
    }

    #[test]
    fn spans_make_short_rows_cheap() {
        // Rows of 576 values (72 words, one segment of 18 blocks): eight rows are 4608 symbols,
        // and each lane's last, partly read words weigh on so few. Spans of 3 groups cut that.
        let (rows, words_per_row) = (96, 72);
        let s = words(rows * words_per_row, 3.0, 5);
        let bits = |span| {
            let p = PrefixParams {
                segment: 18,
                span,
                ..PrefixParams::default()
            };
            let e = roundtrip(&s, Layout::new(rows, words_per_row, &p), p);
            (e.payload.len() + e.index.len()) as f64 * 8.0 / s.len() as f64
        };
        let (one, three) = (bits(1), bits(3));
        assert_eq!(PrefixParams::span_for(words_per_row, 18, 1 << 14), 3);
        assert!(three < one - 0.05, "span 3: {three} bits, span 1: {one}");
        // A chunk holds at most 2^16 blocks of its rows (2^24 symbols); spans above 1 need a
        // row in one segment.
        let p = |segment, span| PrefixParams {
            segment,
            span,
            ..PrefixParams::default()
        };
        let fits = |segment, span| Layout::new(8, 1024, &p(segment, span)).check(&p(segment, span));
        assert!(fits(256, 256).is_ok());
        assert!(fits(256, 257).is_err() && fits(256, MAX_SPAN).is_err());
        assert!(fits(128, 2).is_err() && fits(128, 1).is_ok());
        assert_eq!(PrefixParams::span_for(1024, 256, 1 << 30), 256);
    }

    #[test]
    fn limits_hold_and_cost_little() {
        // A wide spread: singles of 8 bits lose more than 12-bit ones to the limit.
        let s = words(4096, 6.0, 2);
        let layout = |segment| Layout {
            rows: 64,
            words: 64,
            segment,
            span: 1,
        };
        let size = |limit, pair_limit| {
            let p = PrefixParams {
                limit,
                pair_limit,
                segment: 16,
                span: 1,
            };
            roundtrip(&s, layout(16), p).payload.len()
        };
        assert!(size(12, 0) < size(8, 0));
        let m = Model::fit(&s, &PrefixParams::default()).unwrap();
        for (t, l) in m.lengths().iter().enumerate() {
            let limit = if t >= 3 { 12 } else { 8 };
            assert!(l.iter().all(|&n| n <= limit));
        }
    }

    #[test]
    fn symbols_beyond_the_tables_are_refused() {
        let mut s = words(64, 2.0, 3);
        s[9] = MAX_PAIR_BASE;
        let p = PrefixParams::default();
        assert!(matches!(
            Model::fit(&s, &p),
            Err(CodingError::Unrepresentable { .. })
        ));
        let singles = PrefixParams { pair_limit: 0, ..p };
        assert!(Model::fit(&s, &singles).is_ok());
        s[9] = MAX_SINGLE;
        assert!(matches!(
            Model::fit(&s, &singles),
            Err(CodingError::Unrepresentable { .. })
        ));
    }

    #[test]
    fn bad_streams_are_refused() {
        let p = PrefixParams {
            segment: 2,
            ..PrefixParams::default()
        };
        let layout = Layout {
            rows: 9,
            words: 12,
            segment: 2,
            span: 1,
        };
        let s = words(9 * 12, 2.0, 4);
        let e = roundtrip(&s, layout, p);
        fn new<'a>(
            m: &[u8],
            i: &[u8],
            pl: &'a [u8],
            l: Layout,
            p: &PrefixParams,
        ) -> Result<Decoder<'a>> {
            Decoder::new(m, i, pl, l, p)
        }
        assert!(new(
            &e.model[..e.model.len() - 1],
            &e.index,
            &e.payload,
            layout,
            &p
        )
        .is_err());
        assert!(new(&e.model, &e.index[4..], &e.payload, layout, &p).is_err());
        assert!(new(&e.model, &e.index, &e.payload[1..], layout, &p).is_err());
        let mut idx = e.index.clone();
        idx[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(new(&e.model, &idx, &e.payload, layout, &p).is_err());
        // A length over the limit, a code space over full.
        let mut m = e.model.clone();
        m[3] = 0xFF;
        assert!(new(&m, &e.index, &e.payload, layout, &p).is_err());
        // Padding zeros are fine; other extra words are not.
        let mut padded = e.payload.clone();
        padded.extend_from_slice(&[0; 16]);
        let d = new(&e.model, &e.index, &padded, layout, &p).unwrap();
        assert_eq!(d.decode().unwrap(), s);
        padded.extend_from_slice(&[1, 0, 0, 0]);
        let d = new(&e.model, &e.index, &padded, layout, &p).unwrap();
        assert!(matches!(d.decode(), Err(CodingError::Corrupt { .. })));
    }

    proptest! {
        #[test]
        fn any_matrix_roundtrips(rows in 1usize..40, words_per_row in 1usize..30, segment in 1usize..9,
                                 span in 1usize..4, spread in 0.0f64..6.0, form in 0usize..5, seed in any::<u64>()) {
            let s = words(rows * words_per_row, spread, seed);
            let (limit, pair_limit) = PARAMS[form];
            // Spans above 1 where a row is one segment.
            let span = if words_per_row.div_ceil(BLOCK_WORDS) <= segment { span } else { 1 };
            let p = PrefixParams { limit, pair_limit, segment, span };
            let layout = Layout::new(rows, words_per_row, &p);
            match encode(&s, &layout, &p) {
                Ok(e) => {
                    prop_assert_eq!(e.index.len(), 4 * layout.chunks());
                    let d = Decoder::new(&e.model, &e.index, &e.payload, layout, &p).unwrap();
                    prop_assert_eq!(d.decode().unwrap(), s.clone());
                    // Any group range decodes alone, inside a span or across two.
                    let g = layout.groups();
                    for (a, b) in [(1, 2), (1, 3), (2, 4)] {
                        if g >= b {
                            let row = |g: usize| (8 * g).min(rows) * words_per_row * 8;
                            let mut out = vec![0u32; row(b) - row(a)];
                            d.decode_groups(a..b, &mut out).unwrap();
                            prop_assert_eq!(&out[..], &s[row(a)..row(b)]);
                        }
                    }
                }
                Err(e) => prop_assert!(matches!(e, CodingError::Unrepresentable { .. }), "{}", e),
            }
        }

        #[test]
        fn garbage_never_panics(model in proptest::collection::vec(any::<u8>(), 0..40),
                                index in proptest::collection::vec(any::<u8>(), 0..40),
                                payload in proptest::collection::vec(any::<u8>(), 0..80),
                                rows in 0usize..20, words_per_row in 0usize..20, form in 0usize..5) {
            let (limit, pair_limit) = PARAMS[form];
            let p = PrefixParams { limit, pair_limit, segment: 2, span: 1 + form % 2 };
            let layout = Layout::new(rows, words_per_row, &p);
            if let Ok(d) = Decoder::new(&model, &index, &payload, layout, &p) {
                // What decodes re-encodes (the model's tables bound every symbol) to itself.
                if let Ok(out) = d.decode() {
                    let again = encode(&out, &layout, &p).unwrap();
                    let d = Decoder::new(&again.model, &again.index, &again.payload, layout, &p).unwrap();
                    prop_assert_eq!(d.decode().unwrap(), out);
                }
            }
        }
    }
}
