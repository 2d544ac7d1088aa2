"""Lane-interleaved prefix codes for E8 symbols: the numpy model (encoder, warp emulator, rates) of
the prototype GEMV kernels/prototypes/e8_prefix_gemv.cu.

Why: the committed rANS GEMV (`hc_e8_rans_gemv_m1`) spends about 79 warp instructions a symbol
(docs/eval/cuda_rans.md), so it runs at 0.14× bf16 where issue 15 asks 0.7×. This shape aims at
about a tenth of that:

- **A whole E8 word a lane.** Lane l of a warp decodes words l, l + 32, … of a row, its 8 symbols
  one after the other, so the context (the word's coset bit) and the parity of s₀…s₆ stay in the
  lane's registers: no shuffle, no ballot per symbol.
- **Canonical prefix codes of at most L bits** (package-merge, per context: the word's first symbol
  `2·zz(t) + c`, then `zz(s)` under coset 0 or 1), decoded by one shared-memory lookup of the next
  L bits. The entry is the coordinate's doubled value as float32 bits (`4t + c`, `2s + c`) with the
  code length in bits 0–4 and the coordinate's parity (or the coset, for the first symbol) in bit 5:
  one mask turns it into the FFMA's operand, and the funnel shift that consumes the code reads the
  length from the low 5 bits by itself.
- **A 64-bit bit buffer with a marker bit** below the valid bits: a lane needs words exactly when
  its low half is zero, and no count is kept per symbol.
- **Refills at fixed points** of a word (before symbols 0, G, 2G, … with G·L ≤ 32): the lanes with
  fewer than 32 bits left take the chunk's next 32-bit words in lane order (a ballot's prefix
  count). The encoder writes each lane's codes as its own bit string and then interleaves its
  words in the order the warp will ask for them, so a chunk is one compact run of words.
- **Chunks of whole rows** of about 2^14 symbols (the committed rANS-gpu chunking): one warp per
  chunk owns its rows' outputs, so sums are deterministic; a chunk costs its word offset (32 bits),
  each lane's last, partly filled word, and the words lanes ask for after their last code (zeros;
  those at the chunk's end are not stored, as reads past a chunk's end give 0).
- **Pairs** (`PairModel`): the word's pairs of free coordinates coded jointly, one lookup of an
  8-byte entry each, so a word takes 5 lookups: fewer instructions, and fewer bits than singles
  of at most 8 bits (singles of 10 or 12 bits still take fewer, at 3 or 4 refills a word).
- **Two layouts** of the words over lanes: `RowLayout` (lane l: words l, l + 32, … of a row) and
  `Rows8Layout` (8 rows a chunk, lane 4n + q: word q of each 32-column block of row n, which is
  that lane's share of mma.m16n8k16's B fragments), whose one stream serves the GEMV and the
  tensor cores. Words are 8 consecutive columns in both, as in the format.
"""

from __future__ import annotations

import numpy as np

WARP = 32
CHUNK_SYMBOLS = 1 << 14
M32 = np.uint64(0xFFFFFFFF)


def zz(v: np.ndarray) -> np.ndarray:
    return np.where(v >= 0, 2 * v, -2 * v - 1)


def unzz(u: np.ndarray) -> np.ndarray:
    return np.where(u & 1, -((u + 1) >> 1), u >> 1)


def _nearest_dn(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r = np.rint(a)
    d = a - r
    odd = (r.sum(1).astype(np.int64) & 1) == 1
    i = np.abs(d).argmax(1)
    rows = np.arange(len(a))
    step = np.where(d[rows, i] > 0, 1.0, -1.0)
    r[rows[odd], i[odd]] += step[odd]
    return r, ((a - r) ** 2).sum(1)


def e8_symbols(u: np.ndarray) -> np.ndarray:
    """The nearest E8 points of the words `u` (n × 8, in lattice units) as the format's symbols
    (n × 8, int64): `2·zz(t) + c`, then `zz(s₀)` … `zz(s₆)` (crates/lattice `encode_word`)."""
    ra, da = _nearest_dn(u)
    rb, db = _nearest_dn(u - 0.5)
    c = (db < da).astype(np.int64)
    s = np.where(c[:, None] == 1, rb, ra).astype(np.int64)
    p = s[:, :7].sum(1) & 1
    t = (s[:, 7] - p) >> 1
    return np.concatenate([(2 * zz(t) + c)[:, None], zz(s[:, :7])], 1)


def doubled_coords(sym: np.ndarray) -> np.ndarray:
    """Twice the lattice point of each word of symbols (n × 8 → n × 8 integers)."""
    c = sym[:, 0] & 1
    t = unzz(sym[:, 0] >> 1)
    s = unzz(sym[:, 1:])
    p = s.sum(1) & 1
    out = np.empty(sym.shape, np.int64)
    out[:, :7] = 2 * s + c[:, None]
    out[:, 7] = 2 * (2 * t + p) + c
    return out


def contexts(sym: np.ndarray) -> list[np.ndarray]:
    """The symbols of each context: first symbols, then the others under coset 0 and 1."""
    c = sym[:, 0] & 1
    return [sym[:, 0], sym[c == 0, 1:].ravel(), sym[c == 1, 1:].ravel()]


def entropy_bits(sym: np.ndarray) -> float:
    """Empirical entropy of the symbols under the three contexts, in bits (all symbols)."""
    tot = 0.0
    for s in contexts(sym):
        if s.size:
            cnt = np.bincount(s)
            p = cnt[cnt > 0] / s.size
            tot -= float((cnt[cnt > 0] * np.log2(p)).sum())
    return tot


def limited_lengths(counts: np.ndarray, limit: int) -> np.ndarray:
    """Optimal prefix-code lengths of at most `limit` bits (package-merge) for the symbols with a
    nonzero count; 0 for the others. Raises where more than 2^limit symbols occur."""
    syms = np.flatnonzero(counts)
    lengths = np.zeros(len(counts), np.int64)
    if len(syms) == 0:
        return lengths
    if len(syms) > (1 << limit):
        raise ValueError(f"{len(syms)} symbols do not fit codes of {limit} bits")
    if len(syms) == 1:
        lengths[syms[0]] = 1
        return lengths
    items = sorted((int(counts[s]), (int(s),)) for s in syms)
    cur = list(items)
    for _ in range(limit - 1):
        packages = [(cur[i][0] + cur[i + 1][0], cur[i][1] + cur[i + 1][1]) for i in range(0, len(cur) - 1, 2)]
        cur = sorted(items + packages, key=lambda t: t[0])
    for _, group in cur[: 2 * len(syms) - 2]:
        for s in group:
            lengths[s] += 1
    return lengths


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
    """Canonical codes (MSB first) of the given lengths: by length, then symbol."""
    codes = np.zeros(len(lengths), np.int64)
    code, prev = 0, 0
    for s in sorted(np.flatnonzero(lengths), key=lambda s: (lengths[s], s)):
        code <<= int(lengths[s]) - prev
        prev = int(lengths[s])
        codes[s] = code
        code += 1
    return codes


class Model:
    """Per-context code lengths and codes, and the decode tables the kernel loads (3 << L u32)."""

    def __init__(self, sym: np.ndarray, limit: int) -> None:
        self.limit = limit
        size = int(sym.max()) + 1
        self.lengths = [limited_lengths(np.bincount(s, minlength=size), limit) for s in contexts(sym)]
        self.codes = [canonical_codes(lg) for lg in self.lengths]
        self.table = np.zeros(3 << limit, np.uint32)
        for k in range(3):
            t = self.table[k << limit : (k + 1) << limit]
            t[:] = 1  # slots no code reaches (the code space is not full): length 1, value 0
            for s in np.flatnonzero(self.lengths[k]):
                lg, code = int(self.lengths[k][s]), int(self.codes[k][s])
                if k == 0:
                    c = s & 1
                    value, flag = 4 * int(unzz(np.int64(s >> 1))) + c, c
                else:
                    sv = int(unzz(np.int64(s)))
                    value, flag = 2 * sv + (k - 1), sv & 1
                bits = int(np.float32(value).view(np.uint32))
                assert bits & 63 == 0, "a value too large for the entry's low 6 bits"
                lo = code << (limit - lg)
                t[lo : lo + (1 << (limit - lg))] = bits | lg | (flag << 5)

        self.group = 32 // limit if limit > 8 else 4
        # Decode units of a word: (first symbol, symbols, table of coset 0, of coset 1, L).
        size = 1 << limit
        self.units = [(0, 1, 0, 0, limit)] + [(i, 1, size, 2 * size, limit) for i in range(1, 8)]
        self.checks = list(range(0, 8, self.group))  # refills before these symbols

    def model_bytes(self) -> int:
        """Stored size of the model: one byte per symbol of each context's alphabet, plus a
        two-byte alphabet size per context."""
        return sum(int(np.flatnonzero(lg).max(initial=-1)) + 1 + 2 for lg in self.lengths)

    def word_codes(self, sym: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Code length and code of every symbol (n × 8 each)."""
        lengths, codes = np.zeros(sym.shape, np.int64), np.zeros(sym.shape, np.int64)
        c = sym[:, :1] & 1
        for k, m in ((0, np.arange(8)[None, :] == 0), (1, (np.arange(8)[None, :] > 0) & (c == 0)),
                     (2, (np.arange(8)[None, :] > 0) & (c == 1))):
            m = np.broadcast_to(m, sym.shape)
            lengths[m] = self.lengths[k][sym[m]]
            codes[m] = self.codes[k][sym[m]]
        return lengths, codes


class PairModel:
    """Pairs: a word's first symbol and its last free coordinate `zz(s₆)` singly (codes of at most
    `ls` bits), `zz(s₀), zz(s₁)`, `zz(s₂), zz(s₃)` and `zz(s₄), zz(s₅)` as pairs (at most `lp` bits)
    under the word's coset: 5 lookups a word instead of 8. A pair's entry is two u32 (one 8-byte
    load): the first coordinate with the code length and the pair's parity in bits 0–5, the second
    exact. Refills before the first symbol and the second pair: ls + lp ≤ 32 and 2·lp + ls ≤ 32."""

    def __init__(self, sym: np.ndarray, ls: int = 8, lp: int = 12) -> None:
        assert ls + lp <= 32 and 2 * lp + ls <= 32
        self.ls, self.lp = ls, lp
        c = sym[:, 0] & 1
        self.base = int(sym[:, 1:7].max(initial=0)) + 1
        pairs = [self._pairs(sym[c == k]) for k in (0, 1)]
        size = int(sym.max()) + 1
        self.lengths = {"first": limited_lengths(np.bincount(sym[:, 0], minlength=size), ls)}
        for k in (0, 1):
            self.lengths[f"last{k}"] = limited_lengths(np.bincount(sym[c == k, 7], minlength=size), ls)
            self.lengths[f"pair{k}"] = limited_lengths(np.bincount(pairs[k], minlength=self.base**2), lp)
        self.codes = {k: canonical_codes(v) for k, v in self.lengths.items()}
        s1, s2 = 1 << ls, 1 << lp
        # u32 layout: first [s1], last0 [s1], last1 [s1], pair0 [2·s2], pair1 [2·s2]
        self.offsets = {"first": 0, "last0": s1, "last1": 2 * s1, "pair0": 3 * s1, "pair1": 3 * s1 + 2 * s2}
        self.table = np.zeros(3 * s1 + 4 * s2, np.uint32)
        for name, lg in self.lengths.items():
            limit = lp if name.startswith("pair") else ls
            width = 2 if name.startswith("pair") else 1
            t = self.table[self.offsets[name] : self.offsets[name] + width * (1 << limit)].reshape(-1, width)
            t[:, 0] = 1
            for sv in np.flatnonzero(lg):
                n, code = int(lg[sv]), int(self.codes[name][sv])
                if name == "first":
                    cc = sv & 1
                    first, flag, second = 4 * int(unzz(np.int64(sv >> 1))) + cc, cc, None
                elif name.startswith("last"):
                    cc = int(name[-1])
                    v = int(unzz(np.int64(sv)))
                    first, flag, second = 2 * v + cc, v & 1, None
                else:
                    cc = int(name[-1])
                    a, b = int(unzz(np.int64(sv // self.base))), int(unzz(np.int64(sv % self.base)))
                    first, flag, second = 2 * a + cc, (a + b) & 1, 2 * b + cc
                bits = int(np.float32(first).view(np.uint32))
                assert bits & 63 == 0, "a value too large for the entry's low 6 bits"
                lo = code << (limit - n)
                t[lo : lo + (1 << (limit - n)), 0] = bits | n | (flag << 5)
                if second is not None:
                    t[lo : lo + (1 << (limit - n)), 1] = np.float32(second).view(np.uint32)
        # (first symbol, symbols, table of coset 0, of coset 1, L)
        o = self.offsets
        self.units = [(0, 1, 0, 0, ls), (1, 2, o["pair0"], o["pair1"], lp), (3, 2, o["pair0"], o["pair1"], lp),
                      (5, 2, o["pair0"], o["pair1"], lp), (7, 1, o["last0"], o["last1"], ls)]
        self.checks = [0, 3]

    def _pairs(self, w: np.ndarray) -> np.ndarray:
        return (w[:, 1:7:2] * self.base + w[:, 2:7:2]).ravel()

    def model_bytes(self) -> int:
        """One byte a symbol of each single alphabet and a pair's alphabet, two-byte sizes."""
        return sum(int(np.flatnonzero(lg).max(initial=-1)) + 1 + 2 for lg in self.lengths.values())

    def word_codes(self, sym: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Code length and code of every unit, at its first symbol (0 at a pair's second)."""
        lengths, codes = np.zeros(sym.shape, np.int64), np.zeros(sym.shape, np.int64)
        lengths[:, 0], codes[:, 0] = self.lengths["first"][sym[:, 0]], self.codes["first"][sym[:, 0]]
        c = sym[:, 0] & 1
        for k in (0, 1):
            m = c == k
            lengths[m, 7], codes[m, 7] = self.lengths[f"last{k}"][sym[m, 7]], self.codes[f"last{k}"][sym[m, 7]]
            for i in (1, 3, 5):
                pr = sym[m, i] * self.base + sym[m, i + 1]
                lengths[m, i], codes[m, i] = self.lengths[f"pair{k}"][pr], self.codes[f"pair{k}"][pr]
        return lengths, codes


class RowLayout:
    """Lane l of a warp decodes words l, l + 32, … of each row (a word: 8 consecutive columns);
    a chunk is `rows_per_chunk` whole rows of about CHUNK_SYMBOLS symbols."""

    name = "rows"

    def __init__(self, rows: int, cols: int) -> None:
        assert cols % 8 == 0
        self.rows, self.cols = rows, cols
        self.rows_per_chunk = max(1, CHUNK_SYMBOLS // cols)
        self.chunks = -(-rows // self.rows_per_chunk)
        wpr = cols // 8
        spr = -(-wpr // WARP)
        self.steps = self.rows_per_chunk * spr  # a lane's words in a chunk
        c, lane, t = np.ogrid[: self.chunks, :WARP, : self.steps]
        self.row = c * self.rows_per_chunk + t // spr
        self.word = (t % spr) * WARP + lane
        self.active = (self.row < rows) & (self.word < wpr)

    def words(self, w: np.ndarray) -> np.ndarray:
        """The matrix as its E8 words (rows × cols/8 × 8)."""
        return w.reshape(self.rows, self.cols // 8, 8)

    def matrix(self, v: np.ndarray) -> np.ndarray:
        """Inverse of `words`."""
        return v.reshape(self.rows, self.cols)


class Rows8Layout:
    """Eight rows a chunk: lane 4n + q decodes word q of every 32-column block of row n (a word:
    8 consecutive columns, as in the format). Those are the values that lane feeds mma.m16n8k16
    as B fragments for the block's two k-tiles, the activations of the same columns as A
    fragments: the tensor cores sum the block's 32 products in another order, and the data stay
    in place. So one stream serves the GEMV (FFMA) and the tensor cores (batches up to 16). Rows
    are cut into `segments` of `seg_cols` columns (a warp each, summed in order). Needs
    cols % 32 == 0."""

    name = "rows8"

    def __init__(self, rows: int, cols: int, seg_cols: int | None = None) -> None:
        assert cols % 32 == 0
        self.rows, self.cols = rows, cols
        blocks = cols // 32
        if seg_cols is None:  # about CHUNK_SYMBOLS a chunk, at most 16 segments
            seg_cols = max(32 * -(-blocks // 16), 32 * max(1, CHUNK_SYMBOLS // 8 // 32))
        self.seg_blocks = -(-min(seg_cols, cols) // 32)
        self.segments = -(-blocks // self.seg_blocks)
        self.groups = -(-rows // 8)
        self.chunks = self.groups * self.segments
        self.steps = self.seg_blocks
        self.rows_per_chunk = 8
        c, lane, t = np.ogrid[: self.chunks, :WARP, : self.steps]
        self.row = (c // self.segments) * 8 + lane // 4
        blk = (c % self.segments) * self.seg_blocks + t
        self.word = blk * 4 + lane % 4
        self.active = (self.row < rows) & (blk < blocks)

    def words(self, w: np.ndarray) -> np.ndarray:
        return w.reshape(self.rows, self.cols // 8, 8)

    def matrix(self, v: np.ndarray) -> np.ndarray:
        return v.reshape(self.rows, self.cols)


class Encoded:
    """One matrix's payload: `words` (the chunks' words, end to end), `index` (chunks + 1 word
    offsets), the model and its `table`, the layout."""

    def __init__(self, words, index, model, layout):
        self.words, self.index, self.model, self.layout = words, index, model, layout

    @property
    def table(self) -> np.ndarray:
        return self.model.table

    def stored_bits(self) -> int:
        """Every stored bit: words, chunk offsets and the model (row scales not included)."""
        return 32 * len(self.words) + 32 * (len(self.index) - 1) + 8 * self.model.model_bytes()


def encode(sym: np.ndarray, rows: int, cols: int, model, layout=None) -> Encoded:
    """The chunks' word stream for the symbols (one E8 word a row of `sym`, in the order of the
    layout's `words`) of a rows × cols matrix; the row layout by default."""
    if rows == 0 or cols == 0:
        raise ValueError(f"a {rows}x{cols} matrix has no weights to encode")
    layout = layout or RowLayout(rows, cols)
    wl, wc = model.word_codes(sym)
    if np.any(wl[:, [u[0] for u in model.units]] == 0):
        raise ValueError("a symbol the model has no code for")
    wpr = cols // 8
    chunks, steps, active = layout.chunks, layout.steps, layout.active
    at = (np.minimum(layout.row, rows - 1) * wpr + np.minimum(layout.word, wpr - 1))
    lengths = wl[at] * active[..., None]  # (chunk, lane, step, 8)
    codes = wc[at]
    # Each lane's bit string, word aligned: the bit offset of every code.
    flat_len = lengths.reshape(chunks, WARP, -1)
    flat_code = codes.reshape(chunks, WARP, -1)
    ends = np.cumsum(flat_len, axis=2)
    bits = ends[..., -1]
    # The warp's refills: at each check, the active lanes with fewer than 32 bits take a word.
    points = model.checks
    bounds = points + [8]
    per_word = [lengths[..., a:b].sum(-1) for a, b in zip(bounds, bounds[1:])]
    v = np.zeros((chunks, WARP), np.int64)
    need = np.zeros((chunks, steps * len(points), WARP), bool)
    k = 0
    for st in range(steps):
        for pi in range(len(points)):
            n = active[:, :, st] & (v < 32)
            v += 32 * n
            v -= per_word[pi][:, :, st]
            assert np.all(v >= 0)
            need[:, k] = n
            k += 1
    asked = need.sum(1)  # words each lane reads
    assert np.all(asked * 32 >= bits)
    wmax = int(asked.max(initial=0))
    lane_words = np.zeros(chunks * WARP * wmax + 1, np.float64)
    base = (np.arange(chunks * WARP) * wmax).reshape(chunks, WARP, 1)
    start = ends - flat_len
    live = flat_len > 0
    o, ln, cd = start[live], flat_len[live], flat_code[live]
    b = np.broadcast_to(base, flat_len.shape)[live]
    shifted = (cd.astype(np.uint64) << (np.uint64(64) - ln.astype(np.uint64) - (o & 31).astype(np.uint64)))
    w = b + (o >> 5)
    lane_words += np.bincount(w, weights=(shifted >> np.uint64(32)).astype(np.float64), minlength=len(lane_words))
    lane_words += np.bincount(w + 1, weights=(shifted & M32).astype(np.float64), minlength=len(lane_words))
    lane_words = lane_words[:-1].astype(np.uint64).astype(np.uint32).reshape(chunks, WARP, max(wmax, 1) if wmax else 0)
    # Interleave: in each chunk, by check, then lane.
    j = np.cumsum(need, axis=1) - 1
    c_idx, _, l_idx = np.nonzero(need)
    words = lane_words[c_idx, l_idx, j[need.nonzero()]] if wmax else np.zeros(0, np.uint32)
    counts = need.sum((1, 2))
    # A chunk's trailing zero words are not stored: the kernel reads 0 past a chunk's end.
    owner = np.repeat(np.arange(chunks), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.where(words != 0, np.arange(len(words)), -1)
    last = np.full(chunks, -1, np.int64)
    some = counts > 0
    if len(words):
        last[some] = np.maximum.reduceat(pos, starts[some])
    keep = np.arange(len(words)) <= last[owner]
    words = words[keep]
    counts = np.bincount(owner[keep], minlength=chunks)
    index = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
    return Encoded(words.astype(np.uint32), index, model, layout)


def _fshl(lo: np.ndarray, hi: np.ndarray, n: np.ndarray) -> np.ndarray:
    """CUDA's `__funnelshift_l(lo, hi, n)` (wrap mode: n & 31), on uint64 arrays of 32-bit values."""
    n = n & np.uint64(31)
    return ((hi << n) | (lo >> (np.uint64(32) - n))) & M32


def emulate(e: Encoded) -> np.ndarray:
    """Decode `e` as the kernel's warps do (the marker buffer, the ballot's refills, the entries'
    bit fields, unit by unit), returning the doubled coordinates as the layout's words
    (rows × cols/8 × 8)."""
    model, layout = e.model, e.layout
    chunks, steps = layout.chunks, layout.steps
    words = np.concatenate([e.words.astype(np.uint64), np.zeros(1, np.uint64)])
    table = np.concatenate([e.table.astype(np.uint64), np.zeros(1, np.uint64)])
    start = e.index[:-1].astype(np.int64)
    stop = e.index[1:].astype(np.int64)
    hi = np.full((chunks, WARP), 0x80000000, np.uint64)
    lo = np.zeros((chunks, WARP), np.uint64)
    rel = np.zeros(chunks, np.int64)
    out = np.zeros((chunks, WARP, steps, 8), np.int64)
    f32 = lambda u: u.astype(np.uint32).view(np.float32).astype(np.int64)  # noqa: E731
    for st in range(steps):
        active = layout.active[:, :, st]
        par = np.zeros((chunks, WARP), np.uint64)
        c = np.zeros((chunks, WARP), np.int64)
        e0 = np.zeros((chunks, WARP), np.int64)
        for first, width, t0, t1, lim in model.units:
            if first in model.checks:
                need = active & (lo == 0)
                off = rel[:, None] + np.cumsum(need, 1) - need
                at = start[:, None] + off
                w = np.where(need & (at < stop[:, None]), words[np.minimum(at, len(words) - 1)], 0)
                m = hi & ((~hi + np.uint64(1)) & M32)
                p = w * m
                hi = np.where(need, (hi ^ m) | ((p >> np.uint64(31)) & M32), hi)
                lo = np.where(need, ((p << np.uint64(1)) & M32) | m, lo)
                rel += need.sum(1)
            idx = (hi >> np.uint64(32 - lim)).astype(np.int64) * width + np.where(c == 1, t1, t0)
            ent = np.where(active, table[idx], 0)
            hi, lo = (np.where(active, _fshl(lo, hi, ent), hi),
                      np.where(active, _fshl(np.zeros_like(lo), lo, ent), lo))
            val = f32(ent & ~np.uint64(63))
            if first == 0:
                e0, c = val, ((ent >> np.uint64(5)) & np.uint64(1)).astype(np.int64)
                continue
            par ^= ent
            out[:, :, st, first - 1] = val
            if width == 2:
                out[:, :, st, first] = np.where(active, f32(table[idx + 1]), 0)
        out[:, :, st, 7] = e0 + 2 * ((par >> np.uint64(5)) & np.uint64(1)).astype(np.int64)
    wpr = layout.cols // 8
    res = np.zeros((layout.rows, wpr, 8), np.int64)
    a = layout.active
    res[np.broadcast_to(layout.row, a.shape)[a], np.broadcast_to(layout.word, a.shape)[a]] = out[a]
    return res
