//! Shared helpers of hypercodec's cross-crate tests (the tests live in `tests/tests/`).
//!
//! - [`roundtrip`]: the one round-trip helper: encode, write, open, decode.
//! - [`assemble`]: builds an archive from a manifest JSON and a stream area, with a correct
//!   tail and checksum, so malformed-input tests can change one thing at a time.
//! - [`sample_archive`]: a small valid archive with every encoding and both compressions.
#![allow(missing_docs)]

use hypercodec_hwz::{
    encode, AffineParams, Archive, Coding, Compression, EncodeOptions, Encoding, FloatDtype, Group,
    HwzError, Lattice, Tail, Writer, WriterOptions, HEADER_LEN, MAGIC, TAIL_LEN,
};
use serde_json::Value;

/// Encodes each `(name, shape, values, encoding)`, writes an archive in memory, opens it and
/// decodes every tensor. Returns the archive bytes and the decoded tensors.
pub fn roundtrip(
    tensors: &[(String, Vec<u64>, Vec<f32>, Encoding)],
    compression: Compression,
) -> Result<(Vec<u8>, Vec<Vec<f32>>), HwzError> {
    let mut w = Writer::new(
        Vec::new(),
        WriterOptions {
            compression,
            ..Default::default()
        },
    )?;
    for (name, shape, values, enc) in tensors {
        let t = encode(name, values, shape, enc, EncodeOptions::default())?;
        w.add_tensor(name, shape, "f32", &t, None)?;
    }
    let (bytes, _) = w.finish()?;
    let archive = Archive::open(&bytes[..])?;
    let decoded = tensors
        .iter()
        .map(|(name, ..)| archive.decode_tensor(name))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((bytes, decoded))
}

/// Deterministic pseudo-Gaussian values (sum of uniforms), for fixtures.
pub fn fixture_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            let mut acc = 0.0f32;
            for _ in 0..4 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                acc += (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            }
            acc * 1.7
        })
        .collect()
}

/// The encodings of the first golden archive (raw and affine), frozen.
pub fn golden_encodings() -> Vec<Encoding> {
    let mut v: Vec<Encoding> = FloatDtype::ALL
        .iter()
        .map(|&dtype| Encoding::Raw { dtype })
        .collect();
    for (bits, group, symmetric, scale_dtype) in [
        (4, Group::Size(32), false, FloatDtype::F16),
        (8, Group::Row, true, FloatDtype::Bf16),
        (3, Group::Size(7), false, FloatDtype::F32),
        (1, Group::Tensor, true, FloatDtype::F16),
        (2, Group::Row, false, FloatDtype::Bf16),
    ] {
        v.push(Encoding::affine(AffineParams {
            bits,
            group,
            symmetric,
            scale_dtype,
        }));
    }
    v
}

/// The lattice encodings of the second golden archive (for 40-value rows), frozen.
pub fn golden_lattice_encodings() -> Vec<Encoding> {
    let l = |lattice, alpha, tile, coding| Encoding::Lattice {
        lattice,
        alpha,
        tile,
        seed: 7,
        scale_dtype: FloatDtype::F16,
        coding,
    };
    vec![
        l(
            Lattice::E8,
            3.8,
            8,
            Coding::Rans {
                chunk: 64,
                lanes: 4,
                prob_bits: 12,
            },
        ),
        l(Lattice::D4, 2.5, 4, Coding::Rice { chunk: 32 }),
        l(
            Lattice::A2,
            1.5,
            2,
            Coding::Rans {
                chunk: 96,
                lanes: 32,
                prob_bits: 14,
            },
        ),
        l(Lattice::Z1, 6.0, 8, Coding::Rice { chunk: 100 }),
        l(Lattice::E8, 3.0, 8, Coding::Fixed { bits: 4 }),
        l(Lattice::D4, 2.0, 1, Coding::Fixed { bits: 3 }),
    ]
}

/// The prefix-coded E8 encodings of `golden-v1-prefix.hwz` (6×40 tensors: a partial group of
/// rows, 5 words a row so the last block is short), frozen: pairs in one- and two-block
/// segments, singles of 10 and 12 bits.
pub fn golden_prefix_encodings() -> Vec<Encoding> {
    let l = |alpha, limit, pair_limit, segment| Encoding::Lattice {
        lattice: Lattice::E8,
        alpha,
        tile: 8,
        seed: 9,
        scale_dtype: FloatDtype::F16,
        coding: Coding::Prefix {
            limit,
            pair_limit,
            segment,
            span: 1,
        },
    };
    vec![
        l(3.8, 8, 12, 1),
        l(3.0, 8, 12, 2),
        l(4.5, 10, 0, 1),
        l(2.5, 12, 0, 2),
    ]
}

/// The trellis encodings of `golden-v1-trellis.hwz` (6×40 tensors): the default L = 16, one
/// sequence per row or several (the last one longer), 1 to 4 bits, every scale storage.
pub fn golden_trellis_encodings() -> Vec<Encoding> {
    // The scales are those the calibration gave when the file was made (they are stored, so a
    // later calibration changes nothing here).
    let t = |l, k, scale, tile, seq, scale_dtype| Encoding::Trellis {
        l,
        k,
        scale,
        tile,
        seed: 11,
        seq,
        scale_dtype,
        v: 1,
    };
    vec![
        t(16, 2, 1.0703, 8, 1024, FloatDtype::F16),
        t(12, 4, 1.1616, 8, 16, FloatDtype::Bf16),
        t(8, 1, 0.874, 1, 8, FloatDtype::F32),
        t(10, 3, 1.1451, 4, 24, FloatDtype::F16),
    ]
}

/// Trellis encodings of a pair of values per state (`v = 2`): a sequence per row or several,
/// 2 to 4 bits, every scale storage.
pub fn golden_trellis_pair_encodings() -> Vec<Encoding> {
    // The calibrated pair scales when the file was made (stored, like the others').
    let t = |l, k, scale, tile, seq, scale_dtype| Encoding::Trellis {
        l,
        k,
        scale,
        tile,
        seed: 12,
        seq,
        scale_dtype,
        v: 2,
    };
    vec![
        t(16, 2, 1.0548, 8, 1024, FloatDtype::F16),
        t(12, 4, 1.1641, 8, 16, FloatDtype::Bf16),
        t(10, 3, 1.1456, 4, 24, FloatDtype::F32),
    ]
}

/// The codebook family and the nested encodings of `golden-v1-codebook.hwz` (6×40 tensors).
pub fn golden_codebook_encodings() -> Vec<Encoding> {
    use hypercodec_hwz::{AffineParams, Assignments, Residual, ResidualDtype, ScaleMode};
    let cb = |block, prototypes, scale_mode, assignments, count, dtype| Encoding::Codebook {
        block,
        prototypes,
        scale_mode,
        scale_dtype: FloatDtype::F16,
        proto_dtype: FloatDtype::F16,
        assignments,
        residual: Residual { count, dtype },
    };
    let int = |bits| {
        Encoding::affine(AffineParams {
            bits,
            ..AffineParams::default()
        })
    };
    vec![
        cb(
            4,
            8,
            ScaleMode::Channel,
            Assignments::Packed,
            10,
            ResidualDtype::Int8,
        ),
        cb(
            5,
            4,
            ScaleMode::Block,
            Assignments::Packed,
            0,
            ResidualDtype::F32,
        ),
        cb(
            8,
            2,
            ScaleMode::Tensor,
            Assignments::Rle,
            3,
            ResidualDtype::F32,
        ),
        Encoding::LowRank { rank: 2 },
        Encoding::Sparse {
            count: 30,
            dtype: FloatDtype::F16,
        },
        Encoding::Mixed {
            block_rows: 4,
            parts: vec![
                int(4),
                Encoding::Raw {
                    dtype: FloatDtype::Bf16,
                },
            ],
        },
        Encoding::Exceptions {
            base: Box::new(int(2)),
            count: 12,
            dtype: FloatDtype::F32,
        },
    ]
}

/// The prefix-coded E8 encodings of `golden-v1-prefix-span.hwz` (20×40 tensors: three groups
/// of rows, the last partial; a row is one segment of 2 blocks), frozen: chunks spanning 2 and 3
/// groups (pairs, 8- and 10-bit singles).
pub fn golden_prefix_span_encodings() -> Vec<Encoding> {
    let l = |alpha, limit, pair_limit, span| Encoding::Lattice {
        lattice: Lattice::E8,
        alpha,
        tile: 8,
        seed: 11,
        scale_dtype: FloatDtype::F16,
        coding: Coding::Prefix {
            limit,
            pair_limit,
            segment: 2,
            span,
        },
    };
    vec![l(3.8, 8, 12, 2), l(4.5, 10, 0, 3), l(3.0, 8, 0, 2)]
}

/// Every encoding family with a few parameter choices (all fit 6×40 tensors).
pub fn sample_encodings() -> Vec<Encoding> {
    let mut v = golden_encodings();
    v.extend(golden_lattice_encodings());
    v.extend(golden_codebook_encodings());
    v.extend(golden_prefix_encodings());
    v
}

/// A small valid archive: one 6×40 tensor per sample encoding, zstd tried on each stream.
pub fn sample_archive() -> Vec<u8> {
    let tensors: Vec<_> = sample_encodings()
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            (
                format!("t{i}.{}", e.label()),
                vec![6, 40],
                fixture_values(240, i as u64),
                e,
            )
        })
        .collect();
    roundtrip(&tensors, Compression::Zstd)
        .expect("sample archive")
        .0
}

/// Splits a valid archive into (stream area bytes after the header, manifest JSON).
pub fn split(archive: &[u8]) -> (Vec<u8>, Value) {
    let n = archive.len() as u64;
    let tail = Tail::parse(&archive[archive.len() - TAIL_LEN as usize..], n).expect("valid tail");
    let streams = archive[HEADER_LEN as usize..tail.manifest_offset as usize].to_vec();
    let stored = &archive
        [tail.manifest_offset as usize..(tail.manifest_offset + tail.manifest_len) as usize];
    let json = if stored.starts_with(&hypercodec_hwz::zstd_codec::FRAME_MAGIC) {
        hypercodec_hwz::zstd_codec::decompress_bounded(stored, hypercodec_hwz::MAX_MANIFEST_LEN)
            .expect("a compressed manifest")
    } else {
        stored.to_vec()
    };
    (
        streams,
        serde_json::from_slice(&json).expect("valid manifest"),
    )
}

/// Builds an archive from a stream area and any manifest JSON, with a correct checksum.
pub fn assemble(streams: &[u8], manifest: &Value) -> Vec<u8> {
    assemble_raw(streams, &serde_json::to_vec(manifest).expect("json"))
}

/// Builds an archive from a stream area and raw manifest bytes, with a correct checksum.
pub fn assemble_raw(streams: &[u8], manifest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[0; (HEADER_LEN - 4) as usize]);
    out.extend_from_slice(streams);
    let tail = Tail {
        manifest_offset: out.len() as u64,
        manifest_len: manifest.len() as u64,
        manifest_crc32c: crc32c(manifest),
    };
    out.extend_from_slice(manifest);
    out.extend_from_slice(&tail.to_bytes());
    out
}

/// CRC-32C as the format uses it (bitwise reference implementation, independent of the
/// crate's table-driven one).
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
