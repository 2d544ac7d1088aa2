//! Rice codes in independent chunks.
//!
//! Symbol `z` with parameter `k`: `q = z >> k`; if `q < ESCAPE_Q`, `q` zero bits, a one bit,
//! then the `k` low bits of `z`; otherwise `ESCAPE_Q` zero bits, a one bit, then `z` in 32
//! bits. Bits are written MSB-first; every chunk starts on a byte boundary.
//!
//! Streams: `params` (one `k` byte per chunk), `offsets` (one little-endian `u32` byte offset
//! per chunk into the payload) and the `payload`.

use crate::{chunk_count, CodingError, Result};
use std::borrow::Cow;

/// Quotients from this on are escaped (the value follows in 32 bits).
pub const ESCAPE_Q: u32 = 32;
/// Largest `k`.
pub const MAX_K: u8 = 31;

/// A Rice-coded symbol sequence.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RiceStreams {
    /// `k` per chunk.
    pub params: Vec<u8>,
    /// Byte offset of each chunk in `payload`, little-endian `u32`.
    pub offsets: Vec<u8>,
    /// The bits.
    pub payload: Vec<u8>,
}

struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl BitWriter {
    #[inline]
    fn put(&mut self, value: u64, bits: u32) {
        // At most 7 bits are pending between calls, so 32 more always fit the 64-bit accumulator.
        debug_assert!(bits <= 32);
        self.acc = (self.acc << bits) | (value & ((1u64 << bits) - 1));
        self.n += bits;
        while self.n >= 8 {
            self.n -= 8;
            self.out.push((self.acc >> self.n) as u8);
        }
    }
    fn align(&mut self) {
        if self.n > 0 {
            self.out.push((self.acc << (8 - self.n)) as u8);
            self.n = 0;
        }
        self.acc = 0;
    }
}

/// The cheapest `k` for a chunk, by exact bit count.
pub fn best_k(symbols: &[u32]) -> u8 {
    let mut best = (u64::MAX, 0u8);
    for k in 0..=MAX_K {
        let mut bits = 0u64;
        for &z in symbols {
            let q = z >> k;
            bits += if q < ESCAPE_Q {
                q as u64 + 1 + k as u64
            } else {
                ESCAPE_Q as u64 + 1 + 32
            };
        }
        if bits < best.0 {
            best = (bits, k);
        }
        // Costs are convex in k: stop once they rise.
        if bits > best.0 {
            break;
        }
    }
    best.1
}

/// Encodes `symbols` in chunks of `chunk` symbols.
pub fn encode(symbols: &[u32], chunk: usize) -> Result<RiceStreams> {
    if chunk == 0 {
        return Err(CodingError::Invalid {
            what: "chunk size",
            value: 0,
        });
    }
    let mut w = BitWriter {
        out: Vec::with_capacity(symbols.len() / 2),
        acc: 0,
        n: 0,
    };
    let mut s = RiceStreams::default();
    for c in symbols.chunks(chunk) {
        let k = best_k(c);
        let offset = u32::try_from(w.out.len()).map_err(|_| CodingError::Invalid {
            what: "payload size",
            value: w.out.len() as u64,
        })?;
        s.params.push(k);
        s.offsets.extend_from_slice(&offset.to_le_bytes());
        for &z in c {
            let q = z >> k;
            if q < ESCAPE_Q {
                w.put(1, q + 1);
                w.put(z as u64, k as u32);
            } else {
                w.put(0, ESCAPE_Q);
                w.put(1, 1);
                w.put(z as u64, 32);
            }
        }
        w.align();
    }
    s.payload = w.out;
    Ok(s)
}

/// The streams of a Rice-coded sequence, borrowed (e.g. straight from a memory map).
#[derive(Debug, Clone, Copy)]
pub struct RiceParts<'a> {
    /// `k` per chunk.
    pub params: &'a [u8],
    /// Byte offsets per chunk.
    pub offsets: &'a [u8],
    /// The bits.
    pub payload: &'a [u8],
}

impl RiceStreams {
    /// Borrows the streams.
    pub fn parts(&self) -> RiceParts<'_> {
        RiceParts {
            params: &self.params,
            offsets: &self.offsets,
            payload: &self.payload,
        }
    }
}

/// Checks the tables against `n` symbols and returns `(k, start, end)` per chunk.
fn chunk_table(s: RiceParts<'_>, n: usize, chunk: usize) -> Result<Vec<(u8, usize, usize)>> {
    let chunks = chunk_count(n, chunk);
    if s.params.len() != chunks {
        return Err(CodingError::Length {
            what: "rice params",
            expected: chunks as u64,
            actual: s.params.len() as u64,
        });
    }
    if s.offsets.len() != chunks * 4 {
        return Err(CodingError::Length {
            what: "rice offsets",
            expected: chunks as u64 * 4,
            actual: s.offsets.len() as u64,
        });
    }
    let mut t = Vec::with_capacity(chunks);
    for i in 0..chunks {
        let k = s.params[i];
        if k > MAX_K {
            return Err(CodingError::Invalid {
                what: "rice k",
                value: k as u64,
            });
        }
        let o = |j: usize| {
            u32::from_le_bytes([
                s.offsets[4 * j],
                s.offsets[4 * j + 1],
                s.offsets[4 * j + 2],
                s.offsets[4 * j + 3],
            ]) as usize
        };
        let start = o(i);
        let end = if i + 1 < chunks {
            o(i + 1)
        } else {
            s.payload.len()
        };
        if start > end || end > s.payload.len() {
            return Err(CodingError::Invalid {
                what: "rice chunk offset",
                value: start as u64,
            });
        }
        t.push((k, start, end));
    }
    Ok(t)
}

/// Reference decoder: one bit at a time.
pub fn decode_ref(s: &RiceStreams, chunk: usize, out: &mut [u32]) -> Result<()> {
    let s = s.parts();
    let table = chunk_table(s, out.len(), chunk)?;
    for ((k, start, end), o) in table.into_iter().zip(out.chunks_mut(chunk.max(1))) {
        let bytes = &s.payload[start..end];
        let mut pos = 0usize;
        let mut bit = || -> Result<u32> {
            let b = bytes
                .get(pos / 8)
                .ok_or(CodingError::Truncated { what: "rice chunk" })?;
            let v = (b >> (7 - pos % 8)) & 1;
            pos += 1;
            Ok(v as u32)
        };
        for z in o.iter_mut() {
            let mut q = 0u32;
            while bit()? == 0 {
                q += 1;
                if q > ESCAPE_Q {
                    return Err(CodingError::Invalid {
                        what: "rice quotient",
                        value: q as u64,
                    });
                }
            }
            let (width, base) = if q < ESCAPE_Q {
                (k as u32, q << k)
            } else {
                (32, 0)
            };
            if q < ESCAPE_Q && (q as u64) << k > u32::MAX as u64 {
                return Err(CodingError::Invalid {
                    what: "rice symbol",
                    value: (q as u64) << k,
                });
            }
            let mut r = 0u32;
            for _ in 0..width {
                r = (r << 1) | bit()?;
            }
            *z = base | r;
        }
    }
    Ok(())
}

/// Fast decoder: a 64-bit window refilled from the bytes, quotients by leading-zero count.
pub fn decode(s: &RiceStreams, chunk: usize, out: &mut [u32]) -> Result<()> {
    decode_parts(s.parts(), chunk, out)
}

/// [`decode`] over borrowed streams.
pub fn decode_parts(s: RiceParts<'_>, chunk: usize, out: &mut [u32]) -> Result<()> {
    let d = Decoder::new(s, chunk, out.len())?;
    d.decode_chunks(0..d.chunks(), out)
}

/// A validated Rice sequence of `n` symbols: the chunk table is checked once, then any range
/// of chunks decodes alone.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    payload: Cow<'a, [u8]>,
    table: Vec<(u8, usize, usize)>,
    chunk: usize,
    n: usize,
}

impl<'a> Decoder<'a> {
    /// Checks the tables against `n` symbols in chunks of `chunk`.
    pub fn new(s: RiceParts<'a>, chunk: usize, n: usize) -> Result<Self> {
        let table = chunk_table(s, n, chunk)?;
        Ok(Decoder {
            payload: Cow::Borrowed(s.payload),
            table,
            chunk: chunk.max(1),
            n,
        })
    }

    /// The same decoder owning a copy of the payload.
    pub fn into_owned(self) -> Decoder<'static> {
        Decoder {
            payload: Cow::Owned(self.payload.into_owned()),
            table: self.table,
            chunk: self.chunk,
            n: self.n,
        }
    }

    /// Bytes held: the payload and the parsed chunk table.
    pub fn stream_bytes(&self) -> u64 {
        (self.payload.len() + self.table.len() * std::mem::size_of::<(u8, usize, usize)>()) as u64
    }

    /// Number of chunks.
    pub fn chunks(&self) -> usize {
        self.table.len()
    }

    /// Symbols per chunk (the last chunk may hold fewer).
    pub fn chunk_symbols(&self) -> usize {
        self.chunk
    }

    /// The symbol range `[start, end)` of chunks `range`.
    pub fn symbol_range(&self, range: std::ops::Range<usize>) -> std::ops::Range<usize> {
        (range.start.saturating_mul(self.chunk)).min(self.n)
            ..(range.end.saturating_mul(self.chunk)).min(self.n)
    }

    /// The payload bytes chunks `range` occupy.
    pub fn payload_bytes(&self, range: std::ops::Range<usize>) -> u64 {
        self.table
            .get(range)
            .map_or(0, |t| t.iter().map(|&(_, a, b)| (b - a) as u64).sum())
    }

    /// Decodes chunks `range` into `out`, which must hold exactly their symbols.
    pub fn decode_chunks(&self, range: std::ops::Range<usize>, out: &mut [u32]) -> Result<()> {
        let Some(table) = self.table.get(range.clone()) else {
            return Err(CodingError::Invalid {
                what: "rice chunk range",
                value: range.end as u64,
            });
        };
        let want = self.symbol_range(range);
        if out.len() != want.len() {
            return Err(CodingError::Length {
                what: "rice output",
                expected: want.len() as u64,
                actual: out.len() as u64,
            });
        }
        for (&(k, start, end), o) in table.iter().zip(out.chunks_mut(self.chunk)) {
            decode_chunk(&self.payload[start..end], k as u32, o)?;
        }
        Ok(())
    }
}

#[inline]
fn decode_chunk(bytes: &[u8], k: u32, out: &mut [u32]) -> Result<()> {
    // `win` holds `avail` valid bits, MSB-aligned.
    let mut win: u64 = 0;
    let mut avail: u32 = 0;
    let mut pos = 0usize;
    let truncated = CodingError::Truncated { what: "rice chunk" };
    macro_rules! refill {
        () => {
            if avail <= 32 {
                if let Some(b) = bytes.get(pos..pos + 4) {
                    win |= (u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64) << (32 - avail);
                    avail += 32;
                    pos += 4;
                } else {
                    while avail <= 56 && pos < bytes.len() {
                        win |= (bytes[pos] as u64) << (56 - avail);
                        avail += 8;
                        pos += 1;
                    }
                }
            }
        };
    }
    for z in out.iter_mut() {
        refill!();
        let q = win.leading_zeros();
        if q < ESCAPE_Q && q + 1 + k <= avail {
            // Common case: the whole code is in the window.
            let len = q + 1 + k;
            let v = if k == 0 {
                0
            } else {
                (win << (q + 1)) >> (64 - k)
            } as u32;
            if k > 0 && (q as u64) << k > u32::MAX as u64 {
                return Err(CodingError::Invalid {
                    what: "rice symbol",
                    value: (q as u64) << k,
                });
            }
            *z = (q << k) | v;
            win <<= len;
            avail -= len;
            continue;
        }
        // Slow path: long quotient, escape, or a window that needs more bits.
        let mut q = 0u32;
        loop {
            refill!();
            if avail == 0 {
                return Err(truncated);
            }
            if win >> 63 == 1 {
                win <<= 1;
                avail -= 1;
                break;
            }
            win <<= 1;
            avail -= 1;
            q += 1;
            if q > ESCAPE_Q {
                return Err(CodingError::Invalid {
                    what: "rice quotient",
                    value: q as u64,
                });
            }
        }
        let width = if q < ESCAPE_Q { k } else { 32 };
        refill!();
        if avail < width {
            return Err(truncated);
        }
        let r = if width == 0 {
            0
        } else {
            (win >> (64 - width)) as u32
        };
        if width > 0 {
            win = if width == 64 { 0 } else { win << width };
        }
        avail -= width;
        *z = if q < ESCAPE_Q {
            if (q as u64) << k > u32::MAX as u64 {
                return Err(CodingError::Invalid {
                    what: "rice symbol",
                    value: (q as u64) << k,
                });
            }
            (q << k) | r
        } else {
            r
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(symbols: &[u32], chunk: usize) {
        let s = encode(symbols, chunk).unwrap();
        let mut a = vec![0u32; symbols.len()];
        let mut b = vec![0u32; symbols.len()];
        decode(&s, chunk, &mut a).unwrap();
        decode_ref(&s, chunk, &mut b).unwrap();
        assert_eq!(a, symbols);
        assert_eq!(b, symbols);
    }

    #[test]
    fn escapes_and_extremes() {
        roundtrip(&[0, u32::MAX, 1, 1 << 31, 5, 0, 0, 7_000_000], 3);
        roundtrip(&[], 16);
        roundtrip(&[0; 1000], 64);
    }

    #[test]
    fn k_is_chosen_per_chunk() {
        let mut v = vec![1u32; 512];
        v.extend(std::iter::repeat_n(3000u32, 512));
        let s = encode(&v, 512).unwrap();
        assert!(s.params[0] <= 1 && s.params[1] >= 10, "{:?}", s.params);
        roundtrip(&v, 512);
    }

    #[test]
    fn corrupt_tables_are_errors() {
        let s = encode(&[5; 100], 10).unwrap();
        let mut out = vec![0u32; 100];
        let mut bad = s.clone();
        bad.params[3] = 40;
        assert!(decode(&bad, 10, &mut out).is_err());
        let mut bad = s.clone();
        bad.offsets[4] = 0xFF;
        assert!(decode(&bad, 10, &mut out).is_err());
        let mut bad = s.clone();
        bad.payload.truncate(bad.payload.len() - 1);
        assert!(decode(&bad, 10, &mut out).is_err());
        assert!(decode(&s, 10, &mut vec![0u32; 101]).is_err());
    }

    proptest! {
        #[test]
        fn any_symbols_roundtrip(v in proptest::collection::vec(prop_oneof![8 => 0u32..40, 1 => any::<u32>()], 0..600), chunk in 1usize..200) {
            roundtrip(&v, chunk);
        }

        #[test]
        fn chunk_ranges_decode_alone(v in proptest::collection::vec(prop_oneof![8 => 0u32..40, 1 => any::<u32>()], 1..600), chunk in 1usize..100, a in 0usize..10, b in 0usize..10) {
            let s = encode(&v, chunk).unwrap();
            let d = Decoder::new(s.parts(), chunk, v.len()).unwrap();
            let (a, b) = (a.min(b).min(d.chunks()), a.max(b).min(d.chunks()));
            let r = d.symbol_range(a..b);
            let mut out = vec![0u32; r.len()];
            d.decode_chunks(a..b, &mut out).unwrap();
            prop_assert_eq!(&out[..], &v[r]);
            prop_assert!(d.decode_chunks(0..d.chunks() + 1, &mut out).is_err());
        }

        #[test]
        fn garbage_never_panics(params in proptest::collection::vec(any::<u8>(), 0..4), payload in proptest::collection::vec(any::<u8>(), 0..64), n in 0usize..64) {
            let chunks = chunk_count(n, 16);
            let offsets: Vec<u8> = (0..chunks as u32).flat_map(|i| (i * 3).to_le_bytes()).collect();
            let s = RiceStreams { params, offsets, payload };
            let mut out = vec![0u32; n];
            let a = decode(&s, 16, &mut out);
            let mut out2 = vec![0u32; n];
            let b = decode_ref(&s, 16, &mut out2);
            prop_assert_eq!(a.is_ok(), b.is_ok());
            if a.is_ok() { prop_assert_eq!(out, out2); }
        }
    }
}
