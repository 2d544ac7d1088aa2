//! Byte layouts: LEB128 varints, delta-coded sorted positions, LSB-first bit packing of
//! prototype indices, and run-length coding of assignments.

use crate::{HdcError, Result};

/// Appends `v` as an unsigned LEB128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one LEB128 varint at `*pos`, advancing it. At most 10 bytes; a value that does not
/// fit in 64 bits or runs past the end is an error.
pub fn get_varint(bytes: &[u8], pos: &mut usize) -> Result<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *bytes.get(*pos).ok_or_else(|| HdcError::Corrupt {
            message: "varint runs past the end".into(),
        })?;
        *pos += 1;
        if i == 9 && b > 1 {
            return Err(HdcError::Corrupt {
                message: "varint overflows 64 bits".into(),
            });
        }
        v |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(HdcError::Corrupt {
        message: "varint longer than 10 bytes".into(),
    })
}

/// Strictly increasing positions as varint gaps (the first is the position itself, each next
/// one the gap minus one).
pub fn encode_positions(positions: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(positions.len() * 2);
    let mut prev: Option<u64> = None;
    for &p in positions {
        put_varint(&mut out, prev.map_or(p, |q| p - q - 1));
        prev = Some(p);
    }
    out
}

/// Decodes `count` positions written by [`encode_positions`], each `< limit`; the stream must
/// be consumed exactly.
pub fn decode_positions(bytes: &[u8], count: usize, limit: u64) -> Result<Vec<u64>> {
    if count > bytes.len() {
        return Err(HdcError::Corrupt {
            message: format!("{count} positions cannot fit in {} bytes", bytes.len()),
        });
    }
    let mut out = Vec::with_capacity(count);
    let mut pos = 0;
    let mut prev: Option<u64> = None;
    for _ in 0..count {
        let g = get_varint(bytes, &mut pos)?;
        let p = match prev {
            None => Some(g),
            Some(q) => q.checked_add(g).and_then(|x| x.checked_add(1)),
        }
        .filter(|&p| p < limit)
        .ok_or_else(|| HdcError::Corrupt {
            message: format!("position out of range (limit {limit})"),
        })?;
        out.push(p);
        prev = Some(p);
    }
    if pos != bytes.len() {
        return Err(HdcError::Corrupt {
            message: format!("{} bytes after the last position", bytes.len() - pos),
        });
    }
    Ok(out)
}

/// Bits per index for `k` prototypes: `ceil(log2 k)`, at least 1.
pub fn index_bits(k: usize) -> u32 {
    (usize::BITS - (k.max(2) - 1).leading_zeros()).max(1)
}

/// Packs `values` (each `< 2^bits`, `bits` ≤ 32) LSB-first.
pub fn pack(values: &[u32], bits: u32) -> Vec<u8> {
    let total = (values.len() as u64 * bits as u64).div_ceil(8) as usize;
    let mut out = Vec::with_capacity(total);
    let (mut acc, mut n) = (0u64, 0u32);
    for &v in values {
        acc |= (v as u64) << n;
        n += bits;
        while n >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            n -= 8;
        }
    }
    if n > 0 {
        out.push(acc as u8);
    }
    out
}

/// Unpacks `out.len()` values of `bits` bits written by [`pack`]; `bytes` must have exactly the
/// packed length.
pub fn unpack_into(bytes: &[u8], bits: u32, out: &mut [u32]) -> Result<()> {
    unpack_range_into(bytes, bits, out.len(), 0, out)
}

/// Unpacks values `first .. first + out.len()` of `total` values of `bits` bits written by
/// [`pack`], reading only the bytes they occupy; `bytes` must have exactly the packed length
/// of `total` values.
pub fn unpack_range_into(
    bytes: &[u8],
    bits: u32,
    total: usize,
    first: usize,
    out: &mut [u32],
) -> Result<()> {
    // (Saturated: no stream holds a count past u64.)
    let need = (total as u64).saturating_mul(bits as u64).div_ceil(8);
    if bytes.len() as u64 != need || bits == 0 || bits > 32 {
        return Err(HdcError::Corrupt {
            message: format!(
                "{} packed bytes for {total} indices of {bits} bits (expected {need})",
                bytes.len(),
            ),
        });
    }
    if first.checked_add(out.len()).is_none_or(|e| e > total) {
        return Err(HdcError::Shape {
            message: format!("indices {first}..+{} of {total}", out.len()),
        });
    }
    let mask = if bits == 32 {
        u32::MAX as u64
    } else {
        (1u64 << bits) - 1
    };
    let bit = first as u64 * bits as u64;
    let mut pos = (bit / 8) as usize;
    let skip = (bit % 8) as u32;
    let (mut acc, mut n) = (0u64, 0u32);
    if skip > 0 && !out.is_empty() {
        acc = (bytes[pos] as u64) >> skip;
        n = 8 - skip;
        pos += 1;
    }
    for o in out.iter_mut() {
        while n < bits {
            acc |= (bytes[pos] as u64) << n;
            pos += 1;
            n += 8;
        }
        *o = (acc & mask) as u32;
        acc >>= bits;
        n -= bits;
    }
    Ok(())
}

/// Run-length form: `(value, run − 1)` varint pairs.
pub fn rle_encode(values: &[u32]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < values.len() {
        let v = values[i];
        let mut j = i + 1;
        while j < values.len() && values[j] == v {
            j += 1;
        }
        put_varint(&mut out, v as u64);
        put_varint(&mut out, (j - i - 1) as u64);
        i = j;
    }
    out
}

/// Decodes exactly `out.len()` values, each `< k`, written by [`rle_encode`].
pub fn rle_decode_into(bytes: &[u8], k: u32, out: &mut [u32]) -> Result<()> {
    rle_decode_prefix_into(bytes, k, out.len(), out)
}

/// Decodes the first `out.len()` values of a run-length stream of exactly `total` values
/// (`out.len() ≤ total`). The whole stream is checked — every index below `k`, the runs
/// summing to `total`, no bytes after the last run — but only the prefix is written.
pub fn rle_decode_prefix_into(bytes: &[u8], k: u32, total: usize, out: &mut [u32]) -> Result<()> {
    if out.len() > total {
        return Err(HdcError::Shape {
            message: format!(
                "{} values asked of a run-length stream of {total}",
                out.len()
            ),
        });
    }
    let mut pos = 0;
    let mut filled = 0usize;
    while filled < total {
        let v = get_varint(bytes, &mut pos)?;
        let run = get_varint(bytes, &mut pos)?;
        if v >= k as u64 {
            return Err(HdcError::Corrupt {
                message: format!("prototype index {v} >= {k}"),
            });
        }
        let end = (run as usize)
            .checked_add(1)
            .and_then(|r| r.checked_add(filled))
            .filter(|&e| e <= total)
            .ok_or_else(|| HdcError::Corrupt {
                message: "run-length runs past the tensor".into(),
            })?;
        let len = out.len();
        if filled < len {
            out[filled..end.min(len)].fill(v as u32);
        }
        filled = end;
    }
    if pos != bytes.len() {
        return Err(HdcError::Corrupt {
            message: "bytes after the last run".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varint_round_trip(v in any::<u64>()) {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut pos = 0;
            prop_assert_eq!(get_varint(&b, &mut pos).unwrap(), v);
            prop_assert_eq!(pos, b.len());
        }

        #[test]
        fn positions_round_trip(mut p in proptest::collection::vec(0u64..1 << 40, 0..200)) {
            p.sort_unstable();
            p.dedup();
            let b = encode_positions(&p);
            prop_assert_eq!(decode_positions(&b, p.len(), 1 << 40).unwrap(), p);
        }

        #[test]
        fn pack_round_trip(bits in 1u32..=16, raw in proptest::collection::vec(any::<u32>(), 0..300)) {
            let v: Vec<u32> = raw.iter().map(|x| x & ((1 << bits) - 1)).collect();
            let b = pack(&v, bits);
            let mut out = vec![0; v.len()];
            unpack_into(&b, bits, &mut out).unwrap();
            prop_assert_eq!(out, v);
        }

        #[test]
        fn rle_round_trip(v in proptest::collection::vec(0u32..4, 0..300)) {
            let b = rle_encode(&v);
            let mut out = vec![0; v.len()];
            rle_decode_into(&b, 4, &mut out).unwrap();
            prop_assert_eq!(out, v);
        }

        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64), n in 0usize..50) {
            let mut out = vec![0; n];
            let _ = rle_decode_into(&b, 7, &mut out);
            let _ = decode_positions(&b, n, 1000);
            let _ = unpack_into(&b, 5, &mut out);
        }
    }

    #[test]
    fn hostile_varints_are_errors() {
        assert!(get_varint(&[0xff; 11], &mut 0).is_err());
        assert!(get_varint(&[0x80], &mut 0).is_err());
        assert!(
            decode_positions(&[5, 0], 2, 6).is_err(),
            "6 is out of range"
        );
        assert!(
            rle_decode_into(&[1, 9], 4, &mut [0; 3]).is_err(),
            "run too long"
        );
    }

    #[test]
    fn index_bits_per_k() {
        assert_eq!(index_bits(1), 1);
        assert_eq!(index_bits(2), 1);
        assert_eq!(index_bits(16), 4);
        assert_eq!(index_bits(17), 5);
        assert_eq!(index_bits(256), 8);
        assert_eq!(index_bits(4096), 12);
    }
}
