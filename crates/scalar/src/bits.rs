//! LSB-first bit packing.
//!
//! Code `i` of width `b` occupies stream bits `i*b .. (i+1)*b`, and stream bit `j` is bit
//! `j % 8` of byte `j / 8`, least significant bit first. The last byte is zero-padded.
//! For `b = 4` this is "low nibble = even index"; for `b = 8` it is the bytes themselves.

use crate::{Result, ScalarError, MAX_BITS};

fn check_bits(bits: u8) -> Result<()> {
    if bits == 0 || bits > MAX_BITS {
        return Err(ScalarError::InvalidBits { bits });
    }
    Ok(())
}

/// Bytes needed for `n` codes of `bits` bits, or `None` on overflow.
pub fn packed_len(n: usize, bits: u8) -> Option<usize> {
    Some(n.checked_mul(bits as usize)?.div_ceil(8))
}

/// Packs `codes` (each masked to `bits` bits) LSB-first.
pub fn pack_bits(codes: &[u8], bits: u8) -> Result<Vec<u8>> {
    check_bits(bits)?;
    let len = packed_len(codes.len(), bits).ok_or(ScalarError::ShapeMismatch {
        rows: codes.len(),
        cols: bits as usize,
        len: codes.len(),
    })?;
    let mut out = Vec::with_capacity(len);
    if bits == 8 {
        out.extend_from_slice(codes);
        return Ok(out);
    }
    let mask = (1u64 << bits) - 1;
    let mut acc: u64 = 0;
    let mut filled: u32 = 0;
    for &c in codes {
        acc |= (c as u64 & mask) << filled;
        filled += bits as u32;
        if filled >= 32 {
            out.extend_from_slice(&(acc as u32).to_le_bytes());
            acc >>= 32;
            filled -= 32;
        }
    }
    while filled > 0 {
        out.push(acc as u8);
        acc >>= 8;
        filled = filled.saturating_sub(8);
    }
    debug_assert_eq!(out.len(), len);
    Ok(out)
}

/// Unpacks `out.len()` codes of `bits` bits; `bytes` must be exactly [`packed_len`] long.
pub fn unpack_bits_into(bytes: &[u8], bits: u8, out: &mut [u8]) -> Result<()> {
    check_bits(bits)?;
    let expected = packed_len(out.len(), bits).unwrap_or(usize::MAX);
    if bytes.len() != expected {
        return Err(ScalarError::StreamLength {
            stream: "codes",
            expected,
            actual: bytes.len(),
        });
    }
    if bits == 8 {
        out.copy_from_slice(bytes);
        return Ok(());
    }
    if bits == 4 {
        // Two codes per byte, low nibble first: a loop the compiler vectorizes.
        let (pairs, tail) = out.split_at_mut(out.len() & !1);
        for (o, &b) in pairs.chunks_exact_mut(2).zip(bytes) {
            o[0] = b & 15;
            o[1] = b >> 4;
        }
        if let (Some(t), Some(&b)) = (tail.first_mut(), bytes.last()) {
            *t = b & 15;
        }
        return Ok(());
    }
    // Eight codes fill `bits` whole bytes: whole octets first, with shifts the compiler knows
    // (a byte-at-a-time refill per code ran the CPU runtime's 3-bit layers at a tenth of
    // INT4's speed), then the tail code by code.
    let done = match bits {
        1 => unpack_octets::<1>(bytes, out),
        2 => unpack_octets::<2>(bytes, out),
        3 => unpack_octets::<3>(bytes, out),
        5 => unpack_octets::<5>(bytes, out),
        6 => unpack_octets::<6>(bytes, out),
        7 => unpack_octets::<7>(bytes, out),
        _ => 0,
    };
    let (bytes, out) = (&bytes[done / 8 * bits as usize..], &mut out[done..]);
    let mask = (1u64 << bits) - 1;
    let mut acc: u64 = 0;
    let mut avail: u32 = 0;
    let mut src = bytes.iter();
    for o in out.iter_mut() {
        if avail < bits as u32 {
            // Refill a byte at a time; `expected` guarantees the bytes exist.
            while avail <= 56 {
                match src.next() {
                    Some(&b) => {
                        acc |= (b as u64) << avail;
                        avail += 8;
                    }
                    None => break,
                }
            }
        }
        *o = (acc & mask) as u8;
        acc >>= bits;
        avail = avail.saturating_sub(bits as u32);
    }
    Ok(())
}

/// Unpacks the whole octets of codes of `B` bits (eight codes in `B` bytes, least significant
/// first) into `out`; returns how many codes it wrote (a multiple of 8).
fn unpack_octets<const B: usize>(bytes: &[u8], out: &mut [u8]) -> usize {
    let mask = (1u64 << B) - 1;
    let mut done = 0;
    for (o, b) in out.chunks_exact_mut(8).zip(bytes.chunks_exact(B)) {
        let v = b
            .iter()
            .enumerate()
            .fold(0u64, |v, (i, &x)| v | (x as u64) << (8 * i));
        for (i, c) in o.iter_mut().enumerate() {
            *c = (v >> (B * i) & mask) as u8;
        }
        done += 8;
    }
    done
}

/// Unpacks codes `first .. first + out.len()` of a stream of `total` codes of `bits` bits
/// (`bytes` exactly [`packed_len`]`(total, bits)` long), reading only the bytes they occupy.
pub fn unpack_bits_range_into(
    bytes: &[u8],
    bits: u8,
    total: usize,
    first: usize,
    out: &mut [u8],
) -> Result<()> {
    check_bits(bits)?;
    let expected = packed_len(total, bits).unwrap_or(usize::MAX);
    if bytes.len() != expected {
        return Err(ScalarError::StreamLength {
            stream: "codes",
            expected,
            actual: bytes.len(),
        });
    }
    if first.checked_add(out.len()).is_none_or(|end| end > total) {
        return Err(ScalarError::StreamLength {
            stream: "codes",
            expected: total,
            actual: first.saturating_add(out.len()),
        });
    }
    let bit = first * bits as usize;
    if bit.is_multiple_of(8) {
        let start = bit / 8;
        let len = packed_len(out.len(), bits).unwrap_or(0);
        return unpack_bits_into(&bytes[start..start + len], bits, out);
    }
    let mask = (1u64 << bits) - 1;
    let mut pos = bit / 8;
    let mut acc = (bytes.get(pos).copied().unwrap_or(0) as u64) >> (bit % 8);
    let mut avail = 8 - (bit % 8) as u32;
    pos += 1;
    for o in out.iter_mut() {
        while avail < bits as u32 {
            // The length check above guarantees these bytes exist.
            acc |= (bytes.get(pos).copied().unwrap_or(0) as u64) << avail;
            pos += 1;
            avail += 8;
        }
        *o = (acc & mask) as u8;
        acc >>= bits;
        avail -= bits as u32;
    }
    Ok(())
}

/// Unpacks `n` codes of `bits` bits.
pub fn unpack_bits(bytes: &[u8], bits: u8, n: usize) -> Result<Vec<u8>> {
    check_bits(bits)?;
    // Justify the allocation by the input before making it.
    if packed_len(n, bits) != Some(bytes.len()) {
        return Err(ScalarError::StreamLength {
            stream: "codes",
            expected: packed_len(n, bits).unwrap_or(usize::MAX),
            actual: bytes.len(),
        });
    }
    let mut out = vec![0u8; n];
    unpack_bits_into(bytes, bits, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nibbles_are_low_first() {
        assert_eq!(pack_bits(&[0x1, 0x2, 0x3], 4).unwrap(), vec![0x21, 0x03]);
        assert_eq!(
            pack_bits(&[1, 0, 1, 1, 0, 0, 0, 0, 1], 1).unwrap(),
            vec![0b1101, 1]
        );
    }

    #[test]
    fn wrong_length_and_width_are_errors() {
        assert!(matches!(
            unpack_bits(&[0; 3], 4, 4),
            Err(ScalarError::StreamLength { .. })
        ));
        assert!(matches!(
            pack_bits(&[0], 9),
            Err(ScalarError::InvalidBits { bits: 9 })
        ));
        assert!(matches!(
            pack_bits(&[0], 0),
            Err(ScalarError::InvalidBits { bits: 0 })
        ));
    }

    proptest! {
        #[test]
        fn pack_roundtrip(bits in 1u8..=8, codes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mask = ((1u16 << bits) - 1) as u8;
            let codes: Vec<u8> = codes.iter().map(|c| c & mask).collect();
            let packed = pack_bits(&codes, bits).unwrap();
            prop_assert_eq!(packed.len(), packed_len(codes.len(), bits).unwrap());
            prop_assert_eq!(unpack_bits(&packed, bits, codes.len()).unwrap(), codes);
        }

        #[test]
        fn range_unpack_equals_slice(bits in 1u8..=8, codes in proptest::collection::vec(any::<u8>(), 1..300), a in 0usize..300, b in 0usize..300) {
            let mask = ((1u16 << bits) - 1) as u8;
            let codes: Vec<u8> = codes.iter().map(|c| c & mask).collect();
            let (a, b) = (a.min(b) % (codes.len() + 1), a.max(b).min(codes.len()));
            let (a, b) = (a.min(b), b);
            let packed = pack_bits(&codes, bits).unwrap();
            let mut out = vec![0u8; b - a];
            unpack_bits_range_into(&packed, bits, codes.len(), a, &mut out).unwrap();
            prop_assert_eq!(&out[..], &codes[a..b]);
            let mut over = vec![0u8; 2];
            prop_assert!(unpack_bits_range_into(&packed, bits, codes.len(), codes.len() - 1, &mut over).is_err());
        }
    }
}
