//! One test per cap and per malformed-input class of the `.hwz` reader: each gives its typed
//! error, never a panic and never an allocation the file does not justify.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use hypercodec_hwz::{
    encode, Archive, EncodeOptions, Encoding, FloatDtype, HwzError, Tail, HEADER_LEN, MAX_ELEMENTS,
    MAX_MANIFEST_LEN, MAX_NAME_LEN, MAX_RANK, MAX_STREAMS, MAX_TENSORS, MAX_ZSTD_EXPANSION,
    TAIL_LEN,
};
use hypercodec_scalar::ScalarError;
use hypercodec_tests::{assemble, assemble_raw, crc32c, sample_archive, split};
use serde_json::{json, Value};

fn open(bytes: &[u8]) -> Result<Archive<&[u8]>, HwzError> {
    Archive::open(bytes)
}

/// Opens and decodes every tensor; the first error wins.
fn open_and_decode(bytes: &[u8]) -> Result<(), HwzError> {
    let a = open(bytes)?;
    for t in a.tensors() {
        a.decode_tensor(&t.name)?;
    }
    Ok(())
}

fn with_manifest(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let (streams, mut m) = split(&sample_archive());
    edit(&mut m);
    assemble(&streams, &m)
}

#[test]
fn the_sample_is_valid() {
    open_and_decode(&sample_archive()).unwrap();
    // and assemble() rebuilds an equivalent archive (key order may differ)
    let good = sample_archive();
    let (streams, m) = split(&good);
    let rebuilt = assemble(&streams, &m);
    assert_eq!(
        open(&rebuilt).unwrap().manifest(),
        open(&good).unwrap().manifest()
    );
    open_and_decode(&rebuilt).unwrap();
    assert_eq!(crc32c(b"123456789"), 0xE306_9283, "CRC-32C check value");
}

#[test]
fn every_truncation_is_an_error() {
    let good = sample_archive();
    for len in 0..good.len() {
        assert!(
            open_and_decode(&good[..len]).is_err(),
            "prefix of {len} bytes accepted"
        );
    }
    assert!(matches!(open(&good[..50]), Err(HwzError::TooShort { .. })));
    assert!(matches!(open(&good[..0]), Err(HwzError::TooShort { .. })));
}

#[test]
fn bad_magic_at_head_and_tail() {
    let mut b = sample_archive();
    b[0] = b'X';
    assert!(matches!(
        open(&b),
        Err(HwzError::BadMagic { place: "head", .. })
    ));
    let mut b = sample_archive();
    let n = b.len();
    b[n - 1] = b'X';
    assert!(matches!(
        open(&b),
        Err(HwzError::BadMagic { place: "tail", .. })
    ));
}

#[test]
fn legacy_zip_is_recognized() {
    let mut b = vec![0u8; 200];
    b[..4].copy_from_slice(b"PK\x03\x04");
    assert!(matches!(open(&b), Err(HwzError::LegacyArchive)));
}

#[test]
fn unknown_flags() {
    let mut b = sample_archive();
    b[4] = 1;
    assert!(matches!(open(&b), Err(HwzError::UnknownFlags { flags: 1 })));
}

fn set_tail(b: &mut [u8], offset: u64, len: u64) {
    let n = b.len();
    b[n - 24..n - 16].copy_from_slice(&offset.to_le_bytes());
    b[n - 16..n - 8].copy_from_slice(&len.to_le_bytes());
}

#[test]
fn manifest_length_cap() {
    let mut b = sample_archive();
    set_tail(&mut b, HEADER_LEN, MAX_MANIFEST_LEN + 1);
    assert!(matches!(
        open(&b),
        Err(HwzError::LimitExceeded {
            what: "manifest length",
            ..
        })
    ));
}

#[test]
fn manifest_out_of_bounds() {
    let good = sample_archive();
    let n = good.len() as u64;
    for (offset, len) in [
        (n, 10),
        (0, 10),
        (HEADER_LEN, n),
        (u64::MAX - 3, 10),
        (n - TAIL_LEN - 5, 6),
    ] {
        let mut b = good.clone();
        set_tail(&mut b, offset, len);
        assert!(
            matches!(open(&b), Err(HwzError::ManifestOutOfBounds { .. })),
            "offset {offset} len {len}"
        );
    }
}

#[test]
fn manifest_checksum_mismatch() {
    let mut b = sample_archive();
    let tail = Tail::parse(&b[b.len() - TAIL_LEN as usize..], b.len() as u64).unwrap();
    b[tail.manifest_offset as usize + 3] ^= 0x20;
    assert!(matches!(open(&b), Err(HwzError::ManifestChecksum { .. })));
}

#[test]
fn manifest_not_json_or_wrong_shape() {
    let (streams, _) = split(&sample_archive());
    for bad in [
        &b"{not json"[..],
        b"[]",
        b"{\"version\":1}",
        b"{\"version\":1,\"format\":\"zip\",\"tensors\":[],\"streams\":[]}",
    ] {
        assert!(
            matches!(
                open(&assemble_raw(&streams, bad)),
                Err(HwzError::ManifestJson { .. })
            ),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn unsupported_version() {
    let b = with_manifest(|m| m["version"] = json!(3));
    assert!(matches!(
        open(&b),
        Err(HwzError::UnsupportedVersion { version: 3, .. })
    ));
}

#[test]
fn tensor_count_cap() {
    let (streams, _) = split(&sample_archive());
    let tensors: Vec<Value> = (0..=MAX_TENSORS).map(|_| json!({})).collect();
    let m = json!({"format": "hwz", "version": 1, "tensors": tensors, "streams": []});
    assert!(matches!(
        open(&assemble(&streams, &m)),
        Err(HwzError::LimitExceeded {
            what: "tensors",
            ..
        })
    ));
}

#[test]
fn stream_count_cap() {
    let (streams, _) = split(&sample_archive());
    let list: Vec<Value> = (0..=MAX_STREAMS).map(|_| json!(0)).collect();
    let m = json!({"format": "hwz", "version": 1, "tensors": [], "streams": list});
    assert!(matches!(
        open(&assemble(&streams, &m)),
        Err(HwzError::LimitExceeded {
            what: "streams",
            ..
        })
    ));
}

#[test]
fn stream_out_of_bounds() {
    let b = with_manifest(|m| m["streams"][0]["length"] = json!(1u64 << 40));
    assert!(matches!(
        open(&b),
        Err(HwzError::StreamOutOfBounds { stream: 0, .. })
    ));
    let b = with_manifest(|m| m["streams"][0]["offset"] = json!(u64::MAX - 63));
    assert!(matches!(
        open(&b),
        Err(HwzError::StreamOutOfBounds { stream: 0, .. })
    ));
    let b = with_manifest(|m| m["streams"][0]["offset"] = json!(0));
    assert!(matches!(
        open(&b),
        Err(HwzError::StreamOutOfBounds { stream: 0, .. })
    ));
}

#[test]
fn stream_misaligned() {
    let b = with_manifest(|m| {
        let o = m["streams"][1]["offset"].as_u64().unwrap();
        m["streams"][1]["offset"] = json!(o + 1);
    });
    assert!(matches!(
        open(&b),
        Err(HwzError::StreamMisaligned { stream: 1, .. })
    ));
}

#[test]
fn streams_overlap() {
    let b = with_manifest(|m| {
        let s0 = m["streams"][0].clone();
        let len = s0["length"].as_u64().unwrap();
        m["streams"][1]["offset"] = s0["offset"].clone();
        m["streams"][1]["length"] = json!(len);
        m["streams"][1]["raw_length"] = json!(len);
        m["streams"][1]["compression"] = json!("none");
    });
    assert!(matches!(open(&b), Err(HwzError::StreamsOverlap { .. })));
}

#[test]
fn stream_checksum_mismatch() {
    let mut b = sample_archive();
    b[HEADER_LEN as usize + 5] ^= 1;
    assert!(open(&b).is_ok(), "streams are verified lazily, when read");
    assert!(matches!(
        open_and_decode(&b),
        Err(HwzError::StreamChecksum { stream: 0, .. })
    ));
}

fn first_zstd_stream(m: &Value) -> usize {
    m["streams"]
        .as_array()
        .unwrap()
        .iter()
        .position(|s| s["compression"] == "zstd")
        .expect("a zstd stream")
}

#[test]
fn zstd_expansion_cap() {
    let b = with_manifest(|m| {
        let i = first_zstd_stream(m);
        let len = m["streams"][i]["length"].as_u64().unwrap();
        m["streams"][i]["raw_length"] = json!(len * MAX_ZSTD_EXPANSION + 1);
    });
    assert!(matches!(open(&b), Err(HwzError::StreamExpansion { .. })));
    let b = with_manifest(|m| {
        m["streams"][0]["raw_length"] = json!(m["streams"][0]["length"].as_u64().unwrap() + 1)
    });
    assert!(open(&b).is_err());
}

#[test]
fn zstd_corrupt_frame() {
    let good = sample_archive();
    let (mut streams, m) = split(&good);
    let i = first_zstd_stream(&m);
    let off = (m["streams"][i]["offset"].as_u64().unwrap() - HEADER_LEN) as usize;
    let len = m["streams"][i]["length"].as_u64().unwrap() as usize;
    for b in &mut streams[off..off + len] {
        *b = 0xA5;
    }
    let mut m = m;
    m["streams"][i]["crc32c"] = json!(crc32c(&streams[off..off + len]));
    assert!(matches!(
        open_and_decode(&assemble(&streams, &m)),
        Err(HwzError::Decompress { .. })
    ));
}

#[test]
fn unknown_encoding_tag() {
    let b =
        with_manifest(|m| m["tensors"][0]["encoding"] = json!({"type": "quantum", "qubits": 3}));
    match open(&b) {
        Err(HwzError::UnknownEncoding { tag, .. }) => assert_eq!(tag, "quantum"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_encoding_fields() {
    let b = with_manifest(|m| m["tensors"][0]["encoding"]["dtype"] = json!("f12"));
    assert!(matches!(open(&b), Err(HwzError::InvalidEncoding { .. })));
    let b = with_manifest(|m| m["tensors"][0]["encoding"]["surprise"] = json!(1));
    assert!(matches!(open(&b), Err(HwzError::InvalidEncoding { .. })));
    let b = with_manifest(|m| {
        let i = m["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .position(|t| t["encoding"]["type"] == "affine")
            .unwrap();
        m["tensors"][i]["encoding"]["bits"] = json!(12);
    });
    assert!(matches!(open(&b), Err(HwzError::InvalidEncoding { .. })));
}

#[test]
fn prefix_spans_out_of_their_bounds_are_refused() {
    // The sample's prefix tensors: 6×40 (5 words, 2 blocks a row), segments of 1 and 2 blocks.
    let set_span = |segment: u64, span: u64| {
        with_manifest(|m| {
            let i = m["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .position(|t| {
                    t["encoding"]["coding"]["type"] == "prefix"
                        && t["encoding"]["coding"]["segment"] == segment
                })
                .unwrap();
            m["tensors"][i]["encoding"]["coding"]["span"] = json!(span);
        })
    };
    // A row in one segment may span groups (one group here: the same chunk).
    open_and_decode(&set_span(2, 2)).unwrap();
    // Not with two segments a row, not past 2^16 blocks a chunk, not 0.
    for (segment, span) in [(1, 2), (2, 1 << 16), (2, 0)] {
        let b = set_span(segment, span);
        assert!(
            matches!(open(&b), Err(HwzError::InvalidEncoding { .. })),
            "segment {segment}, span {span}"
        );
    }
}

#[test]
fn shape_overflow_and_caps() {
    let b = with_manifest(|m| m["tensors"][0]["shape"] = json!([u64::MAX, 3]));
    assert!(matches!(open(&b), Err(HwzError::ShapeOverflow { .. })));
    let b = with_manifest(|m| m["tensors"][0]["shape"] = json!([MAX_ELEMENTS, 2]));
    assert!(matches!(open(&b), Err(HwzError::ShapeOverflow { .. })));
    let b = with_manifest(|m| m["tensors"][0]["shape"] = json!(vec![1; MAX_RANK + 1]));
    assert!(matches!(
        open(&b),
        Err(HwzError::LimitExceeded {
            what: "tensor rank",
            ..
        })
    ));
    // A shape that does not match its streams' sizes.
    let b = with_manifest(|m| m["tensors"][0]["shape"] = json!([6, 41]));
    assert!(matches!(open(&b), Err(HwzError::StreamSize { .. })));
}

#[test]
fn stream_roles() {
    let b = with_manifest(|m| {
        m["tensors"][0]["streams"]
            .as_object_mut()
            .unwrap()
            .remove("values");
    });
    assert!(matches!(open(&b), Err(HwzError::MissingStream { .. })));
    let b = with_manifest(|m| m["tensors"][0]["streams"]["codes"] = json!(1));
    assert!(matches!(open(&b), Err(HwzError::UnexpectedStream { .. })));
    let b = with_manifest(|m| m["tensors"][0]["streams"]["values"] = json!(100_000));
    assert!(matches!(
        open(&b),
        Err(HwzError::StreamRef { index: 100_000, .. })
    ));
}

#[test]
fn tensor_names() {
    let b = with_manifest(|m| m["tensors"][1]["name"] = m["tensors"][0]["name"].clone());
    assert!(matches!(open(&b), Err(HwzError::InvalidName { .. })));
    let b = with_manifest(|m| m["tensors"][0]["name"] = json!(""));
    assert!(matches!(open(&b), Err(HwzError::InvalidName { .. })));
    let b = with_manifest(|m| m["tensors"][0]["name"] = json!("x".repeat(MAX_NAME_LEN + 1)));
    assert!(matches!(open(&b), Err(HwzError::InvalidName { .. })));
    let b = with_manifest(|m| m["tensors"][0]["name"] = json!("a\nb"));
    assert!(matches!(open(&b), Err(HwzError::InvalidName { .. })));
}

#[test]
fn source_dtype_cap() {
    let b = with_manifest(|m| m["tensors"][0]["source_dtype"] = json!("f".repeat(33)));
    assert!(matches!(
        open(&b),
        Err(HwzError::LimitExceeded {
            what: "source dtype length",
            ..
        })
    ));
}

#[test]
fn nan_input_is_refused_by_the_writer_side() {
    let raw = Encoding::Raw {
        dtype: FloatDtype::F32,
    };
    let r = encode("w", &[1.0, f32::NAN], &[2], &raw, EncodeOptions::default());
    assert!(matches!(
        r,
        Err(HwzError::Scalar {
            source: ScalarError::NonFinite { index: 1, .. },
            ..
        })
    ));
    let ok = encode(
        "w",
        &[1.0, f32::NAN],
        &[2],
        &raw,
        EncodeOptions {
            allow_non_finite: true,
            ..EncodeOptions::default()
        },
    );
    assert!(ok.is_ok());
    let affine = Encoding::affine(Default::default());
    let r = encode(
        "w",
        &[f32::INFINITY, 0.0],
        &[1, 2],
        &affine,
        EncodeOptions {
            allow_non_finite: true,
            ..EncodeOptions::default()
        },
    );
    assert!(matches!(
        r,
        Err(HwzError::Scalar {
            source: ScalarError::NonFinite { .. },
            ..
        })
    ));
    let r = encode("w", &[1.0; 5], &[2, 2], &raw, EncodeOptions::default());
    assert!(matches!(
        r,
        Err(HwzError::ElementCount {
            expected: 4,
            actual: 5,
            ..
        })
    ));
}

#[test]
fn unknown_tensor_name() {
    let a = sample_archive();
    assert!(matches!(
        open(&a).unwrap().decode_tensor("nope"),
        Err(HwzError::TensorNotFound { .. })
    ));
}

#[test]
fn values_per_stored_byte_cap() {
    // A raw tensor of 240 values claiming a 3-byte zstd stream: within the zstd expansion cap
    // (480 ≤ 3·256) but below the floor of one stored byte per 64 values.
    let b = with_manifest(|m| {
        let i = m["tensors"][1]["streams"]["values"].as_u64().unwrap() as usize;
        m["streams"][i]["compression"] = json!("zstd");
        m["streams"][i]["length"] = json!(3);
    });
    assert!(matches!(
        open(&b),
        Err(HwzError::LimitExceeded {
            what: "values per stored byte",
            max: hypercodec_hwz::MAX_VALUES_PER_STORED_BYTE,
            ..
        })
    ));
}

#[test]
fn constant_tensors_are_stored_within_the_floor() {
    // zstd would shrink a constant tensor far below the floor: the writer stores it plainly.
    let zeros = vec![0.0f32; 1 << 16];
    let enc = Encoding::affine(hypercodec_hwz::AffineParams {
        bits: 1,
        ..Default::default()
    });
    let named = vec![("z".to_string(), vec![256, 256], zeros, enc)];
    let (bytes, decoded) =
        hypercodec_tests::roundtrip(&named, hypercodec_hwz::Compression::Zstd).unwrap();
    assert!(decoded[0].iter().all(|&v| v == 0.0));
    let a = open(&bytes).unwrap();
    let stored = a.stored_bytes(&a.tensors()[0]);
    assert!(
        stored >= hypercodec_hwz::min_stored_bytes(1 << 16),
        "{stored}"
    );
}

/// An archive of one tensor with hand-made streams (right lengths, hostile contents).
fn crafted(shape: &[u64], encoding: Encoding, streams: Vec<(&'static str, Vec<u8>)>) -> Vec<u8> {
    let t = hypercodec_hwz::EncodedTensor { encoding, streams };
    let mut w = hypercodec_hwz::Writer::new(Vec::new(), Default::default()).unwrap();
    w.add_tensor("t", shape, "f32", &t, None).unwrap();
    w.finish().unwrap().0
}

#[test]
fn hostile_codebook_family_streams_are_typed_errors() {
    use hypercodec_hwz::{Assignments, Residual, ResidualDtype, ScaleMode};
    let cb = |assignments, count| Encoding::Codebook {
        block: 4,
        prototypes: 5,
        scale_mode: ScaleMode::Tensor,
        scale_dtype: FloatDtype::F32,
        proto_dtype: FloatDtype::F32,
        assignments,
        residual: Residual {
            count,
            dtype: ResidualDtype::F32,
        },
    };
    let protos = vec![0u8; 5 * 4 * 4];
    let scale = 1f32.to_le_bytes().to_vec();
    // 16 blocks of 3-bit indices, all 7 (>= 5 prototypes).
    let bad_idx = vec![0xff; 6];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "index >= prototypes",
            crafted(
                &[8, 8],
                cb(Assignments::Packed, 0),
                vec![
                    ("prototypes", protos.clone()),
                    ("assignments", bad_idx),
                    ("scales", scale.clone()),
                ],
            ),
        ),
        (
            "run past the tensor",
            crafted(
                &[8, 8],
                cb(Assignments::Rle, 0),
                vec![
                    ("prototypes", protos.clone()),
                    ("assignments", vec![1, 100]),
                    ("scales", scale.clone()),
                ],
            ),
        ),
        (
            "residual position out of range",
            crafted(
                &[8, 8],
                cb(Assignments::Packed, 1),
                vec![
                    ("prototypes", protos.clone()),
                    ("assignments", vec![0; 6]),
                    ("scales", scale.clone()),
                    ("residual_index", vec![64]),
                    ("residual_values", vec![0; 4]),
                ],
            ),
        ),
        (
            "non-finite prototype",
            crafted(
                &[8, 8],
                cb(Assignments::Packed, 0),
                vec![
                    ("prototypes", f32::NAN.to_le_bytes().repeat(20)),
                    ("assignments", vec![0; 6]),
                    ("scales", scale.clone()),
                ],
            ),
        ),
        (
            "non-finite low-rank scale",
            crafted(
                &[4, 4],
                Encoding::LowRank { rank: 1 },
                vec![
                    ("u", vec![1; 4]),
                    ("u_scales", f32::INFINITY.to_le_bytes().to_vec()),
                    ("v", vec![1; 4]),
                    ("v_scales", 1f32.to_le_bytes().to_vec()),
                ],
            ),
        ),
        (
            "sparse positions not increasing",
            crafted(
                &[64],
                Encoding::Sparse {
                    count: 2,
                    dtype: FloatDtype::F32,
                },
                vec![("indices", vec![0x80, 0x80]), ("values", vec![0; 8])],
            ),
        ),
        (
            "mixed index beyond the payload",
            crafted(
                &[2, 32],
                Encoding::Mixed {
                    block_rows: 1,
                    parts: vec![
                        Encoding::Raw {
                            dtype: FloatDtype::F32
                        };
                        2
                    ],
                },
                vec![
                    (
                        "index",
                        [128u64, 256].iter().flat_map(|x| x.to_le_bytes()).collect(),
                    ),
                    ("payload", vec![0; 256]),
                ],
            ),
        ),
        (
            "mixed part of the wrong length",
            crafted(
                &[2, 32],
                Encoding::Mixed {
                    block_rows: 1,
                    parts: vec![
                        Encoding::Raw {
                            dtype: FloatDtype::F32
                        };
                        2
                    ],
                },
                vec![
                    (
                        "index",
                        [64u64, 192].iter().flat_map(|x| x.to_le_bytes()).collect(),
                    ),
                    ("payload", vec![0; 256]),
                ],
            ),
        ),
    ];
    for (what, bytes) in cases {
        match open_and_decode(&bytes) {
            Err(e) => assert!(!e.to_string().is_empty(), "{what}"),
            Ok(()) => panic!("{what}: accepted"),
        }
    }
}

/// An empty, uncompressed stream entry at `offset`.
fn empty_stream(offset: u64) -> Value {
    json!({"offset": offset, "length": 0, "crc32c": 0, "compression": "none", "raw_length": 0})
}

#[test]
fn a_stream_starting_inside_another_is_caught_past_an_empty_stream() {
    let b = with_manifest(|m| {
        let s0 = m["streams"][0].clone();
        let (o, len) = (
            s0["offset"].as_u64().unwrap(),
            s0["length"].as_u64().unwrap(),
        );
        assert!(
            len > 64,
            "the sample's first stream spans more than one alignment unit"
        );
        // Sorted by offset: stream 0, the empty stream, stream 1 starting inside stream 0.
        m["streams"][1]["offset"] = json!(o + 64);
        let empty = empty_stream(o + 64);
        m["streams"].as_array_mut().unwrap().push(empty);
    });
    assert!(matches!(
        open(&b),
        Err(HwzError::StreamsOverlap {
            first: 0,
            second: 1
        })
    ));
}

#[test]
fn many_tensors_sharing_one_stream_are_rejected() {
    let b = with_manifest(|m| {
        let first = m["tensors"][0].clone();
        let tensors = m["tensors"].as_array_mut().unwrap();
        for i in 0..1000 {
            let mut t = first.clone();
            t["name"] = json!(format!("copy.{i}"));
            tensors.push(t);
        }
    });
    assert!(matches!(
        open(&b),
        Err(HwzError::StreamShared { ref tensor, .. }) if tensor == "copy.0"
    ));
}

#[test]
fn one_stream_for_two_roles_of_a_tensor_is_rejected() {
    let b = with_manifest(|m| {
        let t = m["tensors"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|t| t["streams"].as_object().unwrap().len() >= 2)
            .unwrap();
        let roles = t["streams"].as_object_mut().unwrap();
        let first = roles.values().next().unwrap().clone();
        for v in roles.values_mut() {
            *v = first.clone();
        }
    });
    assert!(matches!(open(&b), Err(HwzError::StreamShared { .. })));
}

#[test]
fn empty_streams_may_share_an_offset_but_not_a_reference() {
    // Two zero-element tensors, each with its own empty stream at the offset of stream 0.
    let two = |shared: bool| {
        with_manifest(|m| {
            let at = m["streams"][0]["offset"].as_u64().unwrap();
            let streams = m["streams"].as_array_mut().unwrap();
            let n = streams.len();
            streams.push(empty_stream(at));
            streams.push(empty_stream(at));
            let tensors = m["tensors"].as_array_mut().unwrap();
            for (i, name) in ["empty.a", "empty.b"].into_iter().enumerate() {
                let index = if shared { n } else { n + i };
                tensors.push(json!({
                    "name": name, "shape": [0, 4], "source_dtype": "f32",
                    "encoding": {"type": "raw", "dtype": "f32"},
                    "streams": {"values": index},
                }));
            }
        })
    };
    let ok = two(false);
    let a = open(&ok).unwrap();
    assert!(a.decode_tensor("empty.b").unwrap().is_empty());
    assert!(matches!(
        open(&two(true)),
        Err(HwzError::StreamShared { ref tensor, .. }) if tensor == "empty.b"
    ));
}

#[test]
fn a_plan_stream_must_exist_and_belong_to_no_tensor() {
    let shared = with_manifest(|m| m["plan_stream"] = json!(0));
    assert!(matches!(open(&shared), Err(HwzError::StreamShared { .. })));
    let missing = with_manifest(|m| m["plan_stream"] = json!(1_000_000));
    assert!(matches!(open(&missing), Err(HwzError::StreamRef { .. })));
}

#[test]
fn a_compressed_manifest_reads_like_json_and_a_bomb_is_refused() {
    let (streams, m) = split(&sample_archive());
    let json = serde_json::to_vec(&m).unwrap();
    // The same manifest as one zstd frame opens to the same archive.
    let z = hypercodec_hwz::zstd_codec::compress(&json);
    let framed = assemble_raw(&streams, &z);
    assert_eq!(
        open(&framed).unwrap().manifest(),
        open(&assemble(&streams, &m)).unwrap().manifest()
    );
    open_and_decode(&framed).unwrap();
    // A small frame that inflates beyond its ratio cap: a typed error, not a parse of megabytes.
    let mut padded = json.clone();
    padded.splice(1..1, std::iter::repeat_n(b' ', 8 << 20));
    let bomb = hypercodec_hwz::zstd_codec::compress(&padded);
    assert!(bomb.len() < 4096, "{} bytes", bomb.len());
    let err = open(&assemble_raw(&streams, &bomb)).unwrap_err();
    assert!(
        matches!(&err, HwzError::ManifestJson { message } if message.contains("zstd")),
        "{err}"
    );
    // A frame cut short or garbled after its magic: typed errors.
    for bad in [&z[..z.len() / 2], &[0x28, 0xB5, 0x2F, 0xFD, 0xFF, 0xFF][..]] {
        let err = open(&assemble_raw(&streams, bad)).unwrap_err();
        assert!(matches!(err, HwzError::ManifestJson { .. }), "{err}");
    }
}
