//! Unit tests of the container; cross-crate and malformed-input tests live in `tests/`.

use super::*;

fn sample() -> Vec<u8> {
    let w: Vec<f32> = (0..300)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut writer = Writer::new(
        Vec::new(),
        WriterOptions {
            compression: Compression::Zstd,
            ..Default::default()
        },
    )
    .unwrap();
    for (name, enc) in [
        (
            "raw",
            Encoding::Raw {
                dtype: FloatDtype::F32,
            },
        ),
        ("int4", Encoding::affine(AffineParams::default())),
    ] {
        let t = encode(name, &w, &[3, 100], &enc, EncodeOptions::default()).unwrap();
        writer.add_tensor(name, &[3, 100], "f32", &t, None).unwrap();
    }
    writer.finish().unwrap().0
}

#[test]
fn roundtrip_raw_is_exact_and_affine_close() {
    let bytes = sample();
    let a = Archive::open(&bytes[..]).unwrap();
    assert_eq!(a.tensors().len(), 2);
    let raw = a.decode_tensor("raw").unwrap();
    let int4 = a.decode_tensor("int4").unwrap();
    for (x, y) in raw.iter().zip(&int4) {
        assert!((x - y).abs() < 1.0 / 15.0);
    }
    for s in &a.manifest().streams {
        assert_eq!(s.offset % ALIGN, 0);
    }
}

#[test]
fn duplicate_names_are_refused_by_the_writer() {
    let t = encode(
        "a",
        &[1.0],
        &[1],
        &Encoding::Raw {
            dtype: FloatDtype::F32,
        },
        EncodeOptions::default(),
    )
    .unwrap();
    let mut w = Writer::new(Vec::new(), WriterOptions::default()).unwrap();
    w.add_tensor("a", &[1], "f32", &t, None).unwrap();
    assert!(matches!(
        w.add_tensor("a", &[1], "f32", &t, None),
        Err(HwzError::InvalidName { .. })
    ));
}

#[test]
fn encoding_json_is_stable() {
    let e = Encoding::affine(AffineParams {
        bits: 3,
        group: Group::Row,
        symmetric: true,
        scale_dtype: FloatDtype::Bf16,
    });
    let j = serde_json::to_string(&e).unwrap();
    assert_eq!(
        j,
        r#"{"type":"affine","bits":3,"group":"row","symmetric":true,"scale_dtype":"bf16"}"#
    );
    let bad = r#"{"type":"affine","bits":3,"group":"row","symmetric":true,"scale_dtype":"bf16","extra":1}"#;
    assert!(serde_json::from_str::<Encoding>(bad).is_err());
}

#[test]
fn zstd_stream_compresses_redundant_codes() {
    // Codes concentrated on a few values (like INT4 codes of Gaussian weights) compress.
    let raw: Vec<u8> = (0..100_000u32)
        .map(|i| [0x77u8, 0x78, 0x87, 0x88, 0x67][(i.wrapping_mul(2654435761) >> 29) as usize % 5])
        .collect();
    let z = zstd_codec::compress(&raw);
    assert!(z.len() < raw.len() * 3 / 4, "{} of {}", z.len(), raw.len());
    assert_eq!(zstd_codec::decompress(&z, raw.len() as u64).unwrap(), raw);
    assert!(zstd_codec::decompress(&z, raw.len() as u64 - 1).is_err());
}

#[cfg(all(feature = "std-fs", unix))]
mod files {
    use super::*;

    fn one_tensor() -> EncodedTensor {
        encode(
            "w",
            &[0.5, -1.5, 2.0, 0.0],
            &[2, 2],
            &Encoding::Raw {
                dtype: FloatDtype::F16,
            },
            EncodeOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_missing_folder_is_named_not_the_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope").join("a.hwz");
        let e = FileWriter::create(&path, WriterOptions::default()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("no folder") && msg.contains("nope"), "{msg}");
        assert!(!msg.contains(".hwz-"), "{msg}");
    }

    #[test]
    fn file_writer_appears_only_when_finished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.hwz");
        let mut w = FileWriter::create(&path, WriterOptions::default()).unwrap();
        w.add_tensor("w", &[2, 2], "f32", &one_tensor(), None)
            .unwrap();
        assert!(!path.exists(), "nothing under the final name before finish");
        w.finish().unwrap();
        for archive in [
            Archive::open_path(&path)
                .unwrap()
                .decode_tensor("w")
                .unwrap(),
            Archive::open_file(&path)
                .unwrap()
                .decode_tensor("w")
                .unwrap(),
        ] {
            assert_eq!(archive, vec![0.5, -1.5, 2.0, 0.0]);
        }
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(
            mode & 0o044,
            0o044,
            "readable by others like any written file (umask permitting)"
        );
    }

    #[test]
    fn dropped_writer_leaves_nothing_and_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.hwz");
        std::fs::write(&path, b"old").unwrap();
        let mut w = FileWriter::create(&path, WriterOptions::default()).unwrap();
        w.add_tensor("w", &[2, 2], "f32", &one_tensor(), None)
            .unwrap();
        drop(w);
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "temporary file removed"
        );
    }
}

fn snr(x: &[f32], y: &[f32]) -> f64 {
    let s: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
    let e: f64 = x
        .iter()
        .zip(y)
        .map(|(&a, &b)| ((a - b) as f64).powi(2))
        .sum();
    10.0 * (s / e).log10()
}

fn through_archive(name: &str, shape: &[u64], t: &EncodedTensor) -> Vec<f32> {
    let mut writer = Writer::new(Vec::new(), WriterOptions::default()).unwrap();
    writer.add_tensor(name, shape, "f32", t, None).unwrap();
    let bytes = writer.finish().unwrap().0;
    let a = Archive::open(&bytes[..]).unwrap();
    a.decode_tensor(name).unwrap()
}

fn wave(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (i as f32 * 0.37).sin() + ((i * 7919) % 101) as f32 / 300.0)
        .collect()
}

#[test]
fn codebook_round_trips_and_residual_helps() {
    let w = wave(64 * 96);
    let shape = [64u64, 96];
    let mut last = 0.0;
    for (k, dtype) in [
        (0.0, ResidualDtype::Int8),
        (0.5, ResidualDtype::Int8),
        (2.0, ResidualDtype::F32),
    ] {
        let tmpl = codebook_template(8, 16, ScaleMode::Channel, dtype);
        let settings = CodebookSettings {
            residual_k: Some(k),
            pick_layout: true,
            ..Default::default()
        };
        let t = encode_codebook("w", &w, &shape, &tmpl, &settings).unwrap();
        let Encoding::Codebook { residual, .. } = t.encoding else {
            panic!("not a codebook")
        };
        assert_eq!(residual.count, (k * 64.0 * 12.0) as u64);
        let out = through_archive("w", &shape, &t);
        let s = snr(&w, &out);
        assert!(s > last + 1.0, "k {k}: {s} dB after {last}");
        last = s;
    }
}

#[test]
fn a_codebook_keeps_no_more_prototypes_than_blocks() {
    // A 1 × 16 weight in blocks of 4 asked for 4096 prototypes stored all of them (32 KB for
    // 16 values); it keeps its 4 blocks as prototypes, exactly.
    let w = wave(16);
    let shape = [1u64, 16];
    let tmpl = codebook_template(4, 4096, ScaleMode::Channel, ResidualDtype::Int8);
    let t = encode_codebook("w", &w, &shape, &tmpl, &CodebookSettings::default()).unwrap();
    let Encoding::Codebook { prototypes, .. } = t.encoding else {
        panic!("not a codebook")
    };
    assert_eq!(prototypes, 4);
    let stored: usize = t.streams.iter().map(|(_, b)| b.len()).sum();
    assert!(stored < 64, "{stored} bytes");
    assert!(snr(&w, &through_archive("w", &shape, &t)) > 40.0);
}

#[test]
fn codebook_residual_budget_is_kept() {
    let w = wave(64 * 96);
    let tmpl = codebook_template(8, 16, ScaleMode::Block, ResidualDtype::Int8);
    let settings = CodebookSettings {
        residual_k: Some(4.0),
        residual_budget: Some(0.03),
        ..Default::default()
    };
    let t = encode_codebook("w", &w, &[64, 96], &tmpl, &settings).unwrap();
    let endless = CodebookSettings {
        iters: usize::MAX,
        ..settings
    };
    assert!(encode_codebook("w", &w, &[64, 96], &tmpl, &endless).is_err());
    let res: usize = t
        .streams
        .iter()
        .filter(|(r, _)| r.starts_with("residual"))
        .map(|(_, b)| b.len())
        .sum();
    let rest = t.payload_bytes() as usize - res;
    assert!(
        res > 0 && res as f64 <= 0.03 * rest as f64,
        "{res} of {rest}"
    );
}

#[test]
fn constant_tensor_uses_run_lengths_or_is_refused() {
    let w = vec![0.5f32; 128 * 64];
    let tmpl = codebook_template(4, 4, ScaleMode::Tensor, ResidualDtype::Int8);
    let settings = CodebookSettings {
        pick_layout: true,
        ..Default::default()
    };
    // 2048 blocks of one prototype: RLE is 3 bytes; all streams 37 < 128 bytes (the floor).
    let err = encode_codebook("c", &w, &[128, 64], &tmpl, &settings).unwrap_err();
    assert!(matches!(err, HwzError::InvalidEncoding { .. }), "{err}");
    let t = encode_codebook("c", &w, &[128, 64], &tmpl, &CodebookSettings::default()).unwrap();
    assert_eq!(through_archive("c", &[128, 64], &t), w);
}

#[test]
fn a_tensor_zstd_takes_below_the_floor_keeps_only_what_the_floor_needs_uncompressed() {
    // 256x512 zeros with a one at about 0.5 % of the places, in affine INT4 g128: its codes
    // (64 KB), f16 scales and offsets (2 KB each) all shrink within zstd's cap, together below
    // the floor of 2 KB (1/64 byte a value).
    let (rows, cols) = (256usize, 512usize);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let w: Vec<f32> = (0..rows * cols)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if (state >> 33).is_multiple_of(200) {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    let shape = [rows as u64, cols as u64];
    let t = encode(
        "c",
        &w,
        &shape,
        &Encoding::affine(AffineParams {
            bits: 4,
            group: Group::Size(128),
            symmetric: false,
            scale_dtype: FloatDtype::F16,
        }),
        EncodeOptions::default(),
    )
    .unwrap();
    let options = WriterOptions {
        compression: Compression::Zstd,
        ..Default::default()
    };
    let mut writer = Writer::new(Vec::new(), options).unwrap();
    let stored = writer.add_tensor("c", &shape, "f32", &t, None).unwrap();
    let floor = min_stored_bytes((rows * cols) as u64);
    // One f16 stream uncompressed (2 KB) and two zstd frames, not the 68 KB of all three raw.
    assert!(
        stored >= floor && stored < 2 * floor,
        "{stored} bytes, floor {floor}"
    );
    let bytes = writer.finish().unwrap().0;
    let a = Archive::open(&bytes[..]).unwrap();
    assert_eq!(
        a.decode_tensor("c").unwrap(),
        through_archive("c", &shape, &t)
    );
}

#[test]
fn lowrank_and_sparse_round_trip() {
    let (rows, cols) = (40usize, 48usize);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i / cols) as f32 * 0.1).cos() * ((i % cols) as f32 * 0.2).sin())
        .collect();
    let t = encode(
        "lr",
        &w,
        &[40, 48],
        &Encoding::LowRank { rank: 2 },
        EncodeOptions::default(),
    )
    .unwrap();
    let out = through_archive("lr", &[40, 48], &t);
    assert!(snr(&w, &out) > 35.0, "{}", snr(&w, &out));

    let mut s = vec![0f32; 1000];
    for i in (0..1000).step_by(37) {
        s[i] = i as f32 - 500.0;
    }
    let enc = Encoding::Sparse {
        count: s.iter().filter(|v| **v != 0.0).count() as u64,
        dtype: FloatDtype::F32,
    };
    let t = encode("sp", &s, &[1000], &enc, EncodeOptions::default()).unwrap();
    assert_eq!(through_archive("sp", &[1000], &t), s);
}

#[test]
fn codebook_encodings_are_validated() {
    let bad = [
        codebook_template(1, 16, ScaleMode::Block, ResidualDtype::Int8),
        codebook_template(8, 0, ScaleMode::Block, ResidualDtype::Int8),
        Encoding::LowRank { rank: 0 },
        Encoding::LowRank { rank: 9 },
        Encoding::Sparse {
            count: 65,
            dtype: FloatDtype::F16,
        },
    ];
    for e in bad {
        assert!(e.stream_lens("t", &[8, 8]).is_err(), "{e:?}");
    }
}

#[test]
fn mixed_and_exceptions_decode_exactly_as_planned() {
    let w = wave(10 * 64);
    let parts = vec![
        Encoding::Raw {
            dtype: FloatDtype::F32,
        },
        Encoding::affine(AffineParams::default()),
        Encoding::Raw {
            dtype: FloatDtype::Bf16,
        },
    ];
    let mixed = Encoding::Mixed {
        block_rows: 4,
        parts: parts.clone(),
    };
    let t = encode("m", &w, &[10, 64], &mixed, EncodeOptions::default()).unwrap();
    let out = through_archive("m", &[10, 64], &t);
    assert_eq!(out[..256], w[..256], "first block raw f32");
    let mut expect = vec![0f32; 4 * 64];
    let a = encode(
        "a",
        &w[256..512],
        &[4, 64],
        &parts[1],
        EncodeOptions::default(),
    )
    .unwrap();
    let refs: Vec<(&str, &[u8])> = a.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
    decode_into("a", &parts[1], &[4, 64], &refs, &mut expect).unwrap();
    assert_eq!(out[256..512], expect[..]);
    assert!(out[512..]
        .iter()
        .zip(&w[512..])
        .all(|(a, b)| (a - b).abs() <= b.abs() / 128.0));
    // Wrong number of parts for the rows, and nesting, are refused.
    let bad = Encoding::Mixed {
        block_rows: 8,
        parts: parts.clone(),
    };
    assert!(bad.stream_lens("m", &[10, 64]).is_err());
    let nested = Encoding::Mixed {
        block_rows: 5,
        parts: vec![mixed.clone(), parts[0].clone()],
    };
    assert!(nested.stream_lens("m", &[10, 64]).is_err());

    let exc = Encoding::Exceptions {
        base: Box::new(Encoding::affine(AffineParams {
            bits: 2,
            ..Default::default()
        })),
        count: 200,
        dtype: FloatDtype::F32,
    };
    let t = encode("e", &w, &[10, 64], &exc, EncodeOptions::default()).unwrap();
    let out = through_archive("e", &[10, 64], &t);
    let exact = out.iter().zip(&w).filter(|(a, b)| a == b).count();
    assert!(exact >= 200, "{exact} exact values");
    let base = encode(
        "b",
        &w,
        &[10, 64],
        &exc_base(&exc),
        EncodeOptions::default(),
    )
    .unwrap();
    let base_out = through_archive("b", &[10, 64], &base);
    assert!(snr(&w, &out) > snr(&w, &base_out) + 1.0);
}

fn exc_base(e: &Encoding) -> Encoding {
    match e {
        Encoding::Exceptions { base, .. } => (**base).clone(),
        _ => unreachable!(),
    }
}

#[test]
fn a_large_plan_travels_as_a_compressed_stream_and_reads_back() {
    let plan = serde_json::json!({
        "mode": "budget",
        "tensors": (0..400).map(|i| serde_json::json!({"name": format!("t{i}"), "label": "lattice-e8-rans@3"})).collect::<Vec<_>>(),
    });
    let t = encode(
        "w",
        &[0.5; 64],
        &[8, 8],
        &Encoding::Raw {
            dtype: FloatDtype::F32,
        },
        EncodeOptions::default(),
    )
    .unwrap();
    for (compression, streamed) in [(Compression::Zstd, true), (Compression::None, false)] {
        let mut w = Writer::new(
            Vec::new(),
            WriterOptions {
                compression,
                ..Default::default()
            },
        )
        .unwrap();
        w.add_tensor("w", &[8, 8], "f32", &t, None).unwrap();
        w.set_plan(plan.clone());
        let (bytes, m) = w.finish().unwrap();
        assert_eq!(m.plan_stream.is_some(), streamed);
        assert_eq!(m.plan.is_none(), streamed);
        let a = Archive::open(&bytes[..]).unwrap();
        assert_eq!(a.plan().unwrap(), Some(plan.clone()));
        assert_eq!(a.decode_tensor("w").unwrap(), vec![0.5; 64]);
    }
}

#[test]
fn a_long_manifest_is_stored_as_a_zstd_frame_unless_compression_is_off() {
    let t = encode(
        "w",
        &[0.5; 64],
        &[8, 8],
        &Encoding::Raw {
            dtype: FloatDtype::F32,
        },
        EncodeOptions::default(),
    )
    .unwrap();
    for (count, compression, framed) in [
        (2, Compression::Zstd, false),
        (200, Compression::Zstd, true),
        (200, Compression::None, false),
    ] {
        let mut w = Writer::new(
            Vec::new(),
            WriterOptions {
                compression,
                ..Default::default()
            },
        )
        .unwrap();
        for i in 0..count {
            w.add_tensor(&format!("layer.{i}.weight"), &[8, 8], "f32", &t, None)
                .unwrap();
        }
        let (bytes, written) = w.finish().unwrap();
        let tail = Tail::parse(
            &bytes[bytes.len() - TAIL_LEN as usize..],
            bytes.len() as u64,
        )
        .unwrap();
        let stored = &bytes[tail.manifest_offset as usize..][..tail.manifest_len as usize];
        assert_eq!(stored.starts_with(&zstd_codec::FRAME_MAGIC), framed);
        let plain = serde_json::to_vec(&written).unwrap().len();
        if framed {
            assert!(stored.len() * 5 < plain, "{} of {plain}", stored.len());
        }
        let a = Archive::open(&bytes[..]).unwrap();
        assert_eq!(a.manifest(), &written);
        assert_eq!(a.decode_tensor("layer.1.weight").unwrap(), vec![0.5; 64]);
    }
}

fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut u = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| ((-2.0 * u().ln()).sqrt() * (std::f64::consts::TAU * u()).cos()) as f32)
        .collect()
}

#[test]
fn trellis_round_trips_any_shape_and_rows_decode_alone() {
    // Convolutions, rows shorter than a sequence, rows of several sequences with a longer
    // last one, odd rows (tile 1), one row.
    for (shape, l, k) in [
        (vec![16u64, 3, 3, 3], 10u8, 2u8),
        (vec![8, 40], 12, 3),
        (vec![5, 2600], 10, 4),
        (vec![3, 7], 9, 2),
        (vec![1, 64], 8, 1),
    ] {
        let n: u64 = shape.iter().product();
        let cols = (n / shape[0]) as usize;
        let x: Vec<f32> = gaussian(n as usize, n).iter().map(|v| v * 0.02).collect();
        let enc = Encoding::trellis(l, k, tile_for(cols, 4096) as u32, 3);
        let t = encode("w", &x, &shape, &enc, EncodeOptions::default()).unwrap();
        let rows = n as usize / cols;
        assert_eq!(
            t.payload_bytes() as usize,
            rows * (2 + (cols * k as usize).div_ceil(8)),
            "{shape:?}: the stored bytes are the scales and the bits"
        );
        let y = through_archive("w", &shape, &t);
        let db = snr(&x, &y);
        // Short rows lose to the tail-biting start and tiny samples: a loose floor.
        assert!(
            db > 5.0 * k as f64 - 4.0,
            "{shape:?} L {l} K {k}: {db:.2} dB"
        );
        // Every row range decodes alone to the same values.
        let streams: Vec<(&str, &[u8])> =
            t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
        let view = TensorView::new("w", &enc, &shape, &streams).unwrap();
        for r in 0..rows {
            let mut o = vec![0f32; cols];
            view.decode_rows_into(r as u64..r as u64 + 1, &mut o)
                .unwrap();
            assert_eq!(o, y[r * cols..(r + 1) * cols], "{shape:?} row {r}");
        }
    }
}

#[test]
fn trellis_reaches_its_calibration_on_gaussian_rows() {
    // 16 rows of 4096 at L = 12 (fast): all-in SNR (f16 row scales included in the bytes)
    // within 0.3 dB of the calibrated figure.
    let x = gaussian(16 * 4096, 5);
    for k in [2u8, 4] {
        let enc = Encoding::trellis(12, k, 4096, 1);
        let t = encode("w", &x, &[16, 4096], &enc, EncodeOptions::default()).unwrap();
        let db = snr(&x, &through_archive("w", &[16, 4096], &t));
        let want = hypercodec_trellis::TrellisParams::calibrated_snr_db(12, k).unwrap() as f64;
        assert!(db > want - 0.3, "K {k}: {db:.2} dB vs calibrated {want:.2}");
    }
}

#[test]
fn trellis_pairs_reach_their_calibration_and_keep_v_in_the_manifest() {
    // As above with a pair of values per state.
    let x = gaussian(16 * 4096, 6);
    for k in [2u8, 4] {
        let enc = Encoding::trellis_pairs(12, k, 4096, 1);
        assert_eq!(enc.label(), format!("trellis-l12-k{k}-v2"));
        let t = encode("w", &x, &[16, 4096], &enc, EncodeOptions::default()).unwrap();
        let db = snr(&x, &through_archive("w", &[16, 4096], &t));
        let want = hypercodec_trellis::TrellisParams::pair_snr_db(12, k).unwrap() as f64;
        assert!(db > want - 0.3, "K {k}: {db:.2} dB vs calibrated {want:.2}");
    }
    let json = serde_json::to_string(&Encoding::trellis_pairs(12, 2, 8, 0)).unwrap();
    assert!(json.contains("\"v\":2"), "{json}");
    let json = serde_json::to_string(&Encoding::trellis(12, 2, 8, 0)).unwrap();
    assert!(
        !json.contains("\"v\""),
        "a one-value code writes no `v`: {json}"
    );
    let back: Encoding = serde_json::from_str(&json).unwrap();
    assert_eq!(back, Encoding::trellis(12, 2, 8, 0));
}

#[test]
fn trellis_refuses_bad_fields_and_short_rows() {
    let x = gaussian(64, 1);
    let bad = |e: Encoding| encode("w", &x, &[8, 8], &e, EncodeOptions::default());
    let good = Encoding::trellis(12, 2, 8, 0);
    let with = |f: &dyn Fn(&mut Encoding)| {
        let mut e = good.clone();
        f(&mut e);
        e
    };
    for e in [
        with(&|e| {
            if let Encoding::Trellis { l, .. } = e {
                *l = 17
            }
        }),
        with(&|e| {
            if let Encoding::Trellis { k, .. } = e {
                *k = 12
            }
        }),
        with(&|e| {
            if let Encoding::Trellis { scale, .. } = e {
                *scale = f32::NAN
            }
        }),
        with(&|e| {
            if let Encoding::Trellis { seq, .. } = e {
                *seq = 12
            }
        }),
        with(&|e| {
            if let Encoding::Trellis { tile, .. } = e {
                *tile = 16
            }
        }),
        // 8 values at 1 bit: fewer bits than the 12-bit state.
        Encoding::trellis(12, 1, 8, 0),
        // Sequences of 8 values at 1 bit: fewer bits than the 12-bit state, though the rows
        // (64 values) hold it.
        with(&|e| {
            if let Encoding::Trellis { k, seq, .. } = e {
                (*k, *seq) = (1, 8)
            }
        }),
        // Pairs: 5 bits, a step as long as the state, three values a state.
        Encoding::trellis_pairs(12, 5, 8, 0),
        Encoding::trellis_pairs(8, 4, 8, 0),
        with(&|e| {
            if let Encoding::Trellis { v, .. } = e {
                *v = 3
            }
        }),
    ] {
        assert!(
            matches!(bad(e.clone()), Err(HwzError::InvalidEncoding { .. })),
            "{e:?}"
        );
    }
    let mut nan = x.clone();
    nan[9] = f32::NAN;
    assert!(matches!(
        encode("w", &nan, &[8, 8], &good, EncodeOptions::default()),
        Err(HwzError::Trellis { .. })
    ));
    // Pairs need rows of an even length (a tile of 1: the RHT does not need a power of two).
    let odd = gaussian(63, 2);
    let pairs = Encoding::trellis_pairs(12, 2, 1, 0);
    assert!(matches!(
        encode("w", &odd, &[7, 9], &pairs, EncodeOptions::default()),
        Err(HwzError::InvalidEncoding { .. })
    ));
    // Zero rows decode to zeros.
    let t = encode("w", &[0.0; 64], &[8, 8], &good, EncodeOptions::default()).unwrap();
    assert!(through_archive("w", &[8, 8], &t).iter().all(|&v| v == 0.0));
}

#[test]
fn calibrated_encoding_is_the_same_format_and_lowers_the_output_error() {
    let (rows, cols) = (12usize, 64usize);
    let x = gaussian(rows * cols, 9);
    let shape = [rows as u64, cols as u64];
    let mut eye = vec![0f32; cols * cols];
    (0..cols).for_each(|i| eye[i * cols + i] = 1.0);
    let mut h = vec![0f32; cols * cols];
    for i in 0..cols {
        for j in 0..cols {
            h[i * cols + j] = 0.9f32.powi((i as i32 - j as i32).abs());
        }
    }
    let lattice = |coding| Encoding::Lattice {
        lattice: Lattice::E8,
        alpha: 2.5,
        tile: 64,
        seed: 1,
        scale_dtype: FloatDtype::F16,
        coding,
    };
    let out_err = |y: &[f32]| -> f64 {
        (0..rows)
            .map(|r| {
                let d: Vec<f64> = (0..cols)
                    .map(|c| (x[r * cols + c] - y[r * cols + c]) as f64)
                    .collect();
                (0..cols)
                    .map(|i| {
                        (0..cols)
                            .map(|j| d[i] * h[i * cols + j] as f64 * d[j])
                            .sum::<f64>()
                    })
                    .sum::<f64>()
            })
            .sum()
    };
    for enc in [
        Encoding::affine(AffineParams {
            bits: 3,
            group: Group::Size(32),
            ..AffineParams::default()
        }),
        lattice(Coding::Fixed { bits: 3 }),
        lattice(Coding::RANS_DEFAULT),
        // Feedback moves between sequences: 16 values each here (pairs too).
        trellis_seq16(10, 2, 64, 1),
        {
            let mut e = trellis_seq16(10, 2, 64, 1);
            if let Encoding::Trellis { v, scale, .. } = &mut e {
                *v = 2;
                *scale = hypercodec_trellis::TrellisParams::pair_scale(10, 2);
            }
            e
        },
    ] {
        // Uncorrelated inputs: no feedback, the plain encoding's codes bit for bit (lattice
        // and trellis rows keep the least-squares scale of their points: no larger an error;
        // affine groups, below).
        let plain = encode("w", &x, &shape, &enc, EncodeOptions::default()).unwrap();
        let same =
            encode_calibrated("w", &x, &shape, &enc, &eye, 0.01, EncodeOptions::default()).unwrap();
        let codes = |e: &EncodedTensor| -> Vec<(String, Vec<u8>)> {
            e.streams
                .iter()
                .filter(|(role, _)| *role != "scales")
                .map(|(role, b)| (role.to_string(), b.clone()))
                .collect()
        };
        if matches!(enc, Encoding::Affine { .. }) {
            // Affine groups are fitted with a clipping search when calibrated: with nothing to
            // feed back, no larger a squared error than round to nearest.
            let sse =
                |y: &[f32]| -> f64 { x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum() };
            let (p, q) = (
                sse(&through_archive("w", &shape, &plain)),
                sse(&through_archive("w", &shape, &same)),
            );
            assert!(q <= p, "{}: {q} vs {p}", enc.label());
        } else {
            assert_eq!(codes(&plain), codes(&same), "{}", enc.label());
            let (p, q) = (
                out_err(&through_archive("w", &shape, &plain)),
                out_err(&through_archive("w", &shape, &same)),
            );
            assert!(q <= p * (1.0 + 1e-3), "{}: {q} vs {p}", enc.label());
        }
        let fed =
            encode_calibrated("w", &x, &shape, &enc, &h, 0.01, EncodeOptions::default()).unwrap();
        let (a, b) = (
            out_err(&through_archive("w", &shape, &plain)),
            out_err(&through_archive("w", &shape, &fed)),
        );
        assert!(b < 0.9 * a, "{}: {b} vs {a}", enc.label());
        // One `Calibrated` encoding several times (its factor reused while the rotation is the
        // same, rebuilt when it is not) gives what a fresh call gives each time.
        let calibrated = Calibrated::new("w", &x, &shape, &h, 0.01, EncodeOptions::default());
        let reseeded = |e: &Encoding, s: u64| match e.clone() {
            Encoding::Lattice {
                lattice,
                alpha,
                tile,
                scale_dtype,
                coding,
                ..
            } => Encoding::Lattice {
                lattice,
                alpha: alpha * 1.25,
                tile,
                seed: s,
                scale_dtype,
                coding,
            },
            Encoding::Trellis {
                l,
                k,
                scale,
                tile,
                seq,
                scale_dtype,
                v,
                ..
            } => Encoding::Trellis {
                l,
                k,
                scale,
                tile,
                seed: s,
                seq,
                scale_dtype,
                v,
            },
            other => other,
        };
        for e in [
            enc.clone(),
            reseeded(&enc, 1),
            reseeded(&enc, 7),
            enc.clone(),
        ] {
            let fresh =
                encode_calibrated("w", &x, &shape, &e, &h, 0.01, EncodeOptions::default()).unwrap();
            assert_eq!(calibrated.encode(&e).unwrap(), fresh, "{}", e.label());
        }
    }
    // Statistics of the wrong size, an encoding without feedback: typed errors.
    let aff = Encoding::affine(AffineParams::default());
    assert!(matches!(
        encode_calibrated(
            "w",
            &x,
            &shape,
            &aff,
            &h[..10],
            0.01,
            EncodeOptions::default()
        ),
        Err(HwzError::InvalidEncoding { .. })
    ));
    assert!(matches!(
        encode_calibrated(
            "w",
            &x,
            &shape,
            &Encoding::Raw {
                dtype: FloatDtype::F16
            },
            &h,
            0.01,
            EncodeOptions::default()
        ),
        Err(HwzError::InvalidEncoding { .. })
    ));
}

#[test]
fn one_step_for_all_rows_lowers_the_squared_error_of_entropy_coded_rows() {
    // Rows whose RMS spans 1/8 to 8, and one zero row.
    let (rows, cols) = (64usize, 256usize);
    let mut x = gaussian(rows * cols, 7);
    for (r, row) in x.chunks_exact_mut(cols).enumerate() {
        let k = if r == 5 {
            0.0
        } else {
            2f32.powf((r % 7) as f32 - 3.0)
        };
        row.iter_mut().for_each(|v| *v *= k);
    }
    let template = |coding| Encoding::Lattice {
        lattice: Lattice::E8,
        alpha: 1.0,
        tile: 256,
        seed: 3,
        scale_dtype: FloatDtype::F16,
        coding,
    };
    let shape = [rows as u64, cols as u64];
    let sse = |t: &EncodedTensor| -> f64 {
        let y = t.decode("w", &shape).unwrap();
        x.iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum()
    };
    let run = |coding, scale| {
        let opts = EncodeOptions {
            lattice_scale: scale,
            ..EncodeOptions::default()
        };
        encode_to_rate("w", &x, &shape, &template(coding), 3.0, opts).unwrap()
    };
    for coding in [Coding::RANS_DEFAULT, Coding::RICE_DEFAULT] {
        let (row, tensor) = (
            run(coding, LatticeScale::Row),
            run(coding, LatticeScale::Tensor),
        );
        let bps = |t: &EncodedTensor| t.payload_bytes() as f64 * 8.0 / x.len() as f64;
        assert!(bps(&row) <= 3.0 && bps(&tensor) <= 3.0);
        assert!(
            sse(&tensor) < 0.8 * sse(&row),
            "{coding:?}: tensor step SSE {} vs row {}",
            sse(&tensor),
            sse(&row)
        );
        // The zero row stays exactly zero.
        let y = tensor.decode("w", &shape).unwrap();
        assert!(y[5 * cols..6 * cols].iter().all(|&v| v == 0.0));
    }
    // Fixed-rate codes keep each row's own step: the option changes nothing.
    let fixed = Coding::Fixed { bits: 4 };
    assert_eq!(
        run(fixed, LatticeScale::Row),
        run(fixed, LatticeScale::Tensor)
    );
}

#[test]
fn a_bounded_decompression_takes_one_whole_frame_and_no_more_than_its_cap() {
    let raw: Vec<u8> = (0..20_000u32)
        .flat_map(|i| (i % 251).to_le_bytes())
        .collect();
    let z = zstd_codec::compress(&raw);
    assert_eq!(
        zstd_codec::decompress_bounded(&z, raw.len() as u64).unwrap(),
        raw
    );
    // One byte short of the output: refused, whatever the frame says.
    assert!(zstd_codec::decompress_bounded(&z, raw.len() as u64 - 1).is_err());
    // Bytes after the frame, a second frame, a cut frame: refused by both decoders.
    for bad in [
        [&z[..], b"x"].concat(),
        [&z[..], &z[..]].concat(),
        z[..z.len() - 3].to_vec(),
    ] {
        assert!(zstd_codec::decompress_bounded(&bad, 1 << 24).is_err());
    }
}

#[test]
fn scales_f16_cannot_hold_are_stored_as_bf16_and_decode() {
    // Tiny tensors (f16 scales would be subnormal or zero), huge ones (they would overflow),
    // a convolution and one tiny row among ordinary ones: each comes back at about the SNR of
    // the same tensor at unit scale, with bf16 scales recorded in its encoding.
    let affine = |bits, group, symmetric| Encoding::Affine {
        bits,
        group,
        symmetric,
        scale_dtype: FloatDtype::F16,
    };
    let lattice = |coding| Encoding::Lattice {
        lattice: Lattice::E8,
        alpha: 2.0,
        tile: 128,
        seed: 5,
        scale_dtype: FloatDtype::F16,
        coding,
    };
    let encodings = [
        affine(8, hypercodec_scalar::Group::Row, true),
        affine(4, hypercodec_scalar::Group::Size(128), false),
        affine(2, hypercodec_scalar::Group::Tensor, false),
        affine(1, hypercodec_scalar::Group::Row, true),
        lattice(Coding::RANS_DEFAULT),
        lattice(Coding::Fixed { bits: 4 }),
        Encoding::trellis(12, 3, 128, 7),
        codebook_template(
            4,
            64,
            hypercodec_hdc::ScaleMode::Channel,
            ResidualDtype::Int8,
        ),
        codebook_template(2, 16, hypercodec_hdc::ScaleMode::Block, ResidualDtype::Int8),
    ];
    let shape = [32u64, 16, 4, 4];
    let unit = gaussian(32 * 256, 11);
    for e in &encodings {
        let t = encode("w", &unit, &shape, e, EncodeOptions::default()).unwrap();
        // (As written for this size: `Encoding::sized_for`.)
        assert_eq!(t.encoding, e.sized_for(32, 256), "unit scale keeps f16");
        let base = snr(&unit, &through_archive("w", &shape, &t));
        for factor in [1e-6f32, 1e-9, 1e-30, 1e8, 1e30] {
            let x: Vec<f32> = unit.iter().map(|v| v * factor).collect();
            let t = encode("w", &x, &shape, e, EncodeOptions::default())
                .unwrap_or_else(|err| panic!("{e:?} ×{factor}: {err}"));
            assert_eq!(
                t.encoding.scale_dtype(),
                Some(FloatDtype::Bf16),
                "{e:?} ×{factor}"
            );
            let db = snr(&x, &through_archive("w", &shape, &t));
            assert!(
                db > base - 1.0,
                "{e:?} ×{factor}: {db:.2} dB against {base:.2}"
            );
        }
        // One row a billion times smaller than the rest still decodes to its own values.
        let mut x = unit.clone();
        x[256..512].iter_mut().for_each(|v| *v *= 1e-9);
        let t = encode("w", &x, &shape, e, EncodeOptions::default()).unwrap();
        let y = through_archive("w", &shape, &t);
        if !matches!(
            e,
            Encoding::Affine {
                group: hypercodec_scalar::Group::Tensor,
                ..
            }
        ) {
            assert_eq!(t.encoding.scale_dtype(), Some(FloatDtype::Bf16), "{e:?}");
            let db = snr(&x[256..512], &y[256..512]);
            assert!(
                db > base - 3.0,
                "{e:?}: tiny row {db:.2} dB against {base:.2}"
            );
        }
        // Calibrated rounding (identity statistics) takes the same way out.
        if !matches!(
            e,
            Encoding::Affine { bits: 1, .. } | Encoding::Codebook { .. }
        ) {
            let tiny: Vec<f32> = unit.iter().map(|v| v * 1e-9).collect();
            let mut h = vec![0f32; 256 * 256];
            (0..256).for_each(|i| h[i * 257] = 1.0);
            let t = encode_calibrated("w", &tiny, &shape, e, &h, 0.01, EncodeOptions::default())
                .unwrap_or_else(|err| panic!("{e:?} calibrated: {err}"));
            assert_eq!(t.encoding.scale_dtype(), Some(FloatDtype::Bf16), "{e:?}");
            let db = snr(&tiny, &through_archive("w", &shape, &t));
            assert!(
                db > base - 1.0,
                "{e:?} calibrated: {db:.2} dB against {base:.2}"
            );
        }
    }
    // A symmetric INT8 step of std 1e-4 values (~3e-6) is subnormal in f16: no offset hides
    // its rounding, so the tensor takes bf16 scales and keeps its SNR.
    let e = affine(8, hypercodec_scalar::Group::Row, true);
    let base = snr(
        &unit,
        &through_archive(
            "w",
            &shape,
            &encode("w", &unit, &shape, &e, EncodeOptions::default()).unwrap(),
        ),
    );
    let x: Vec<f32> = unit.iter().map(|v| v * 1e-4).collect();
    let t = encode("w", &x, &shape, &e, EncodeOptions::default()).unwrap();
    assert_eq!(t.encoding.scale_dtype(), Some(FloatDtype::Bf16));
    let db = snr(&x, &through_archive("w", &shape, &t));
    assert!(db > base - 1.0, "INT8 ×1e-4: {db:.2} dB against {base:.2}");
    // Scales asked for in bf16 or f32 are kept, and what no type holds is a typed error.
    let e = affine(4, hypercodec_scalar::Group::Row, true).with_scale_dtype(FloatDtype::F32);
    let x: Vec<f32> = unit.iter().map(|v| v * 1e-9).collect();
    assert_eq!(
        encode("w", &x, &shape, &e, EncodeOptions::default())
            .unwrap()
            .encoding,
        e
    );
    let huge = vec![f32::MAX, -f32::MAX];
    assert!(matches!(
        encode(
            "w",
            &huge,
            &[1, 2],
            &affine(4, hypercodec_scalar::Group::Row, false),
            EncodeOptions::default()
        ),
        Err(HwzError::Scalar {
            source: hypercodec_scalar::ScalarError::SpanOverflow { group: 0, .. },
            ..
        })
    ));
    // A scale that overflows bf16 (symmetric codes of f32's largest value at 1 bit): the
    // message points past bf16.
    let err = encode(
        "w",
        &[f32::MAX, f32::MAX],
        &[1, 2],
        &affine(1, hypercodec_scalar::Group::Row, true),
        EncodeOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            HwzError::Scalar {
                source: hypercodec_scalar::ScalarError::ScaleOverflow {
                    dtype: FloatDtype::Bf16,
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().ends_with("store scales as f32"), "{err}");
}

/// A stand-in rows encoder that codes every row with the CPU's encoder (so its bits are the
/// row-by-row path's), counting its calls.
fn cpu_rows(
    x: &[f32],
    rows: usize,
    cols: usize,
    seq: usize,
    p: &hypercodec_trellis::TrellisParams,
    bits: &mut [u8],
) -> std::result::Result<(), String> {
    ROWS_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let k = p.k as usize;
    let rb = (cols * k).div_ceil(8);
    assert_eq!((x.len(), bits.len()), (rows * cols, rows * rb));
    let mut enc = hypercodec_trellis::Encoder::new(p).map_err(|e| e.to_string())?;
    for (row, b) in x.chunks_exact(cols).zip(bits.chunks_exact_mut(rb)) {
        for r in hypercodec_trellis::row_sequences(cols, seq) {
            enc.encode_into(
                &row[r.clone()],
                &mut b[r.start * k / 8..(r.end * k).div_ceil(8)],
            )
            .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

static ROWS_CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn declining_rows(
    _: &[f32],
    _: usize,
    _: usize,
    _: usize,
    _: &hypercodec_trellis::TrellisParams,
    bits: &mut [u8],
) -> std::result::Result<(), String> {
    bits.iter_mut().for_each(|b| *b = 0xA5);
    Err("no device".into())
}

#[test]
fn a_rows_encoder_gives_the_row_by_row_streams_and_a_declining_one_changes_nothing() {
    let (rows, cols) = (37usize, 192usize);
    let mut x = gaussian(rows * cols, 21);
    // A zero row, a tiny row and a large one.
    x[3 * cols..4 * cols].iter_mut().for_each(|v| *v = 0.0);
    x[5 * cols..6 * cols].iter_mut().for_each(|v| *v *= 1e-3);
    x[7 * cols..8 * cols].iter_mut().for_each(|v| *v *= 300.0);
    let mut e = Encoding::trellis(12, 2, 64, 3);
    if let Encoding::Trellis { seq, .. } = &mut e {
        *seq = 64;
    }
    let shape = [rows as u64, cols as u64];
    let plain = encode("w", &x, &shape, &e, EncodeOptions::default()).unwrap();
    let before = ROWS_CALLS.load(std::sync::atomic::Ordering::Relaxed);
    let with = |f| EncodeOptions {
        trellis_rows: Some(TrellisRowsEncoder(f)),
        ..EncodeOptions::default()
    };
    let batched = encode("w", &x, &shape, &e, with(cpu_rows)).unwrap();
    assert!(ROWS_CALLS.load(std::sync::atomic::Ordering::Relaxed) > before);
    assert_eq!(batched.streams, plain.streams);
    let declined = encode("w", &x, &shape, &e, with(declining_rows)).unwrap();
    assert_eq!(declined.streams, plain.streams);
}

#[test]
fn a_rows_encoder_gives_the_calibrated_trellis_streams_too() {
    // Error feedback between sequences of 16 (the last of each row 24 or 40 long), a zero
    // row, a large one: every row's sequence coded by the stand-in at once, the error fed
    // forward between calls, must give the row-by-row streams.
    for (rows, cols) in [(9usize, 64usize), (5, 56), (3, 200), (40, 64)] {
        let mut x = gaussian(rows * cols, 31);
        x[cols..2 * cols].iter_mut().for_each(|v| *v = 0.0);
        x[2 * cols..3 * cols].iter_mut().for_each(|v| *v *= 50.0);
        let mut h = vec![0f32; cols * cols];
        for i in 0..cols {
            for j in 0..cols {
                h[i * cols + j] = 0.85f32.powi((i as i32 - j as i32).abs());
            }
        }
        let tile = if cols.is_power_of_two() {
            cols as u32
        } else {
            8
        };
        let e = trellis_seq16(10, 2, tile, 1);
        let shape = [rows as u64, cols as u64];
        let plain =
            encode_calibrated("w", &x, &shape, &e, &h, 0.01, EncodeOptions::default()).unwrap();
        let before = ROWS_CALLS.load(std::sync::atomic::Ordering::Relaxed);
        let with = |f| EncodeOptions {
            trellis_rows: Some(TrellisRowsEncoder(f)),
            ..EncodeOptions::default()
        };
        let batched = encode_calibrated("w", &x, &shape, &e, &h, 0.01, with(cpu_rows)).unwrap();
        // One call per sequence position.
        let calls = ROWS_CALLS.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert!(calls >= (cols / 16).max(1), "{calls}");
        assert_eq!(batched.streams, plain.streams, "{rows}x{cols}");
        let declined =
            encode_calibrated("w", &x, &shape, &e, &h, 0.01, with(declining_rows)).unwrap();
        assert_eq!(declined.streams, plain.streams, "{rows}x{cols}");
    }
}

/// `Encoding::trellis(l, k, tile, seed)` cut into sequences of 16 (the calibrated rows').
fn trellis_seq16(l: u8, k: u8, tile: u32, seed: u64) -> Encoding {
    let mut e = Encoding::trellis(l, k, tile, seed);
    if let Encoding::Trellis { seq, .. } = &mut e {
        *seq = 16;
    }
    e
}

/// The GPU prefix shape's chunks shrink from 2^14 to 2^13 symbols where a matrix of 2^22 values
/// or more, with rows of 1024 values or more, would have fewer than about 3072 of them (a warp's
/// serial decode each), and a row's blocks are shared out evenly among its segments; rows
/// shorter than a segment make chunks of several groups of eight rows.
#[test]
fn gpu_prefix_chunks_shrink_until_a_matrix_has_enough_of_them() {
    let big = (PREFIX_GPU_CHUNKS as u64) << 14; // values: 3072 chunks of 2^14
    assert_eq!(prefix_gpu_chunk(big / 4096, 4096), 1 << 14);
    assert_eq!(prefix_gpu_chunk(big / 4096 - 1, 4096), 1 << 13);
    assert_eq!(prefix_gpu_chunk(PREFIX_GPU_SMALL / 4096, 4096), 1 << 13);
    assert_eq!(prefix_gpu_chunk(PREFIX_GPU_SMALL / 4096 - 1, 4096), 1 << 14);
    assert_eq!(prefix_gpu_chunk(PREFIX_GPU_SMALL / 1024, 1024), 1 << 13);
    assert_eq!(prefix_gpu_chunk(PREFIX_GPU_SMALL / 1023 + 1, 1023), 1 << 14);
    assert_eq!(prefix_gpu_chunk(0, 0), 1 << 14);
    assert_eq!(PREFIX_GPU_MIN_CHUNK, 1 << 13);
    // (rows, cols) → (segment in blocks of 32 columns, span in groups of eight rows, chunks)
    for ((rows, cols), want) in [
        ((28672u64, 8192u64), (64, 1, 14336)),
        ((8192, 8192), (64, 1, 4096)),
        ((14336, 4096), (64, 1, 3584)),
        ((11008, 4096), (32, 1, 5504)),
        ((4096, 11008), (32, 1, 5632)), // 344 blocks: 11 segments of 32 (the last of 24)
        ((4096, 4096), (32, 1, 2048)),
        ((1024, 4096), (32, 1, 512)),
        ((4096, 1536), (24, 1, 1024)), // 48 blocks: two segments of 24, not 32 and 16
        ((4096, 1280), (40, 1, 512)),  // 40 blocks: one segment, not 32 and 8
        ((8192, 640), (20, 3, 342)),   // short rows keep their spans
        ((49152, 576), (18, 3, 2048)), // (SmolLM2's embedding)
        ((1024, 2048), (64, 1, 128)),  // small: chunks of 2^14
        ((4096, 640), (20, 3, 171)),   // small: spans of 3 row groups
        ((256, 256), (8, 8, 4)),
        ((3, 40), (2, 51, 1)),
    ] {
        let (segment, span) =
            prefix_shape(&e8_template(1024, 3, Coding::PREFIX_GPU).for_matrix(rows, cols, 1024));
        let blocks = cols.div_ceil(32);
        let chunks = rows.div_ceil(8).div_ceil(span as u64) * blocks.div_ceil(segment as u64);
        assert_eq!(
            (segment, span, chunks),
            (want.0, want.1, want.2),
            "{rows}x{cols}"
        );
    }
    // A chunk size given (`e8@B-prefix-cN`) is taken as it is, the last segment as short as it
    // falls (6176 columns: 193 blocks, the last segment one), but never more than 16 segments a
    // row (14336 columns in chunks of 2^12 symbols: 28 blocks a segment, not 16).
    // (Rows of over 2^25 columns, a 3-D tensor's matrix view, cap the segment at 2^16 blocks.)
    for (chunk, cols, want) in [
        (1u32 << 14, 6176u64, 64u32),
        (1 << 12, 14336, 28),
        (1 << 12, 4096, 16),
        (256, 1 << 26, 1 << 16),
    ] {
        let e = e8_template(1024, 3, Coding::PREFIX_GPU.with_chunk(chunk));
        let (segment, span) = prefix_shape(&e.for_matrix(8, cols, 1024));
        assert_eq!((segment, span), (want, 1), "{chunk} {cols}");
    }
}

/// The (segment, span) of a prefix-coded lattice encoding.
fn prefix_shape(e: &Encoding) -> (u32, u32) {
    match *e {
        Encoding::Lattice {
            coding: Coding::Prefix { segment, span, .. },
            ..
        } => (segment, span),
        ref e => panic!("{e:?}"),
    }
}

/// Rate control with prefix codes, whose tables cap a coordinate's size: a rate they reach is
/// met (α shrinks past the scales whose symbols they cannot hold); one they cannot reach within
/// 0.1 bits is refused with the coder's typed error, for the pipeline's fallback to rANS.
#[test]
fn prefix_rate_control_meets_what_the_tables_hold_and_refuses_the_rest() {
    let (rows, cols) = (64usize, 1024usize);
    let x = gaussian(rows * cols, 9);
    let shape = [rows as u64, cols as u64];
    let template = e8_template(1024, 3, Coding::PREFIX_GPU.with_chunk(1 << 14)).for_matrix(
        rows as u64,
        cols as u64,
        1024,
    );
    // 1024 columns are 32 blocks: one segment of 64, and chunks spanning 2 groups of 8 rows.
    assert!(matches!(
        template,
        Encoding::Lattice {
            coding: Coding::Prefix {
                segment: 64,
                span: 2,
                ..
            },
            ..
        }
    ));
    let opts = EncodeOptions::default();
    for target in [3.0, 4.5] {
        let t = encode_to_rate("w", &x, &shape, &template, target, opts).unwrap();
        let bps = t.payload_bytes() as f64 * 8.0 / x.len() as f64;
        assert!(bps <= target && bps > target - 0.1, "{target}: {bps}");
        assert!(matches!(
            t.encoding,
            Encoding::Lattice {
                coding: Coding::Prefix { .. },
                ..
            }
        ));
    }
    let err = encode_to_rate("w", &x, &shape, &template, 6.0, opts).unwrap_err();
    assert!(
        matches!(
            err,
            HwzError::Coding {
                source: crate::CodingError::Unrepresentable { .. },
                ..
            }
        ),
        "{err}"
    );
}

/// Rates above the lattice calibration's largest α are refused with the range: asked for 9 to
/// 16 bits, the search settled at 1.3 to 2.5 bits and 5 to 14 dB.
#[test]
fn rates_above_the_calibration_are_refused_not_missed() {
    let x = gaussian(64 * 256, 3);
    let shape = [64u64, 256];
    let template = e8_template(256, 1, Coding::RANS_DEFAULT);
    let opts = EncodeOptions::default();
    let t = encode_to_rate("w", &x, &shape, &template, 7.5, opts).unwrap();
    assert!(t.payload_bytes() as f64 * 8.0 / x.len() as f64 > 7.0);
    for target in [9.0, 16.0] {
        match encode_to_rate("w", &x, &shape, &template, target, opts) {
            Err(HwzError::InvalidEncoding { message, .. }) => {
                assert!(
                    message.contains("8.05") && message.contains("INT8"),
                    "{message}"
                )
            }
            other => panic!("{target}: {other:?}"),
        }
    }
}

/// Near 8 bits rANS escapes make the rate rise about 2.4 bits per doubling of α, where rate
/// control's step assumed one: its tries diverged, and `--bps 8` landed at 7.56.
#[test]
fn rate_control_lands_under_high_rans_targets_where_the_rate_steepens() {
    let x = gaussian(512 * 1024, 1);
    let shape = [512u64, 1024];
    let template = e8_template(1024, 1, Coding::RANS_DEFAULT);
    for target in [7.8, 7.9, 8.0] {
        let t =
            encode_to_rate("w", &x, &shape, &template, target, EncodeOptions::default()).unwrap();
        let bps = t.payload_bytes() as f64 * 8.0 / x.len() as f64;
        assert!(bps <= target && bps > target - 0.05, "{target}: {bps}");
    }
}

#[test]
fn rows_too_large_for_the_rotation_are_named_and_large_lone_values_still_code() {
    // A row of values near f32's largest: the lattice's and the trellis's Hadamard transforms
    // would overflow. Before, the error blamed a scale "that no type holds", printed in full
    // digits and called the row a group.
    let big: Vec<f32> = (0..4 * 256)
        .map(|j| if j % 2 == 0 { 3.0e38 } else { -2.0e38 })
        .collect();
    let lattice = |scale_dtype| Encoding::Lattice {
        lattice: Lattice::E8,
        alpha: 2.5,
        tile: 256,
        seed: 1,
        scale_dtype,
        coding: Coding::RANS_DEFAULT,
    };
    for e in [
        lattice(FloatDtype::F16),
        lattice(FloatDtype::F32),
        Encoding::trellis(12, 2, 256, 3),
    ] {
        let err = encode("w", &big, &[4, 256], &e, EncodeOptions::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("row 0 holds values up to 3.000e38") && text.contains("would overflow"),
            "{text}"
        );
        if let Encoding::Lattice { .. } = e {
            // Rate control says so too, rather than that no scale reaches the rate (which
            // sent the tensor to a tensor-wide grid that zeroed its other rows).
            let err =
                crate::encode_to_rate("w", &big, &[4, 256], &e, 3.0, EncodeOptions::default())
                    .unwrap_err();
            assert!(err.to_string().contains("would overflow"), "{err}");
        }
        let text = err.to_string();
        assert!(
            text.contains("row 0 holds values up to 3.000e38") && text.contains("would overflow"),
            "{text}"
        );
    }
    // Two large values among small ones sum without overflow: they code, and decode finite
    // (a bound with twice the rotated row's L1 norm refused them).
    let mut lone = gaussian(4 * 256, 5);
    lone[300] = 1.0e37;
    lone[301] = -1.0e37;
    for e in [lattice(FloatDtype::F32), Encoding::trellis(12, 2, 256, 3)] {
        let t = encode("w", &lone, &[4, 256], &e, EncodeOptions::default()).unwrap();
        let y = through_archive("w", &[4, 256], &t);
        assert!(y.iter().all(|v| v.is_finite()), "{e:?}");
    }
}

/// A weight whose values sit in a few rows cannot spend the target on them: rate control kept
/// raising α (to 4e15 for 4 non-zero rows of 256 asked for 4 bits), and the tensor decoded to
/// zeros at 0 dB. It now stops at 16 times the calibration's largest α: far fewer bits than
/// asked, at that α's SNR (Gaussian rows: about 72 dB). A quarter of the rows zero, asked for
/// 7.9 bits, is not held back by that α.
#[test]
fn rate_control_stops_at_the_largest_alpha_where_the_target_is_out_of_reach() {
    let (rows, cols) = (256usize, 1024usize);
    let g = gaussian(rows * cols, 5);
    let shape = [rows as u64, cols as u64];
    let opts = EncodeOptions::default();
    for nonzero in [1, 4, 16] {
        let x: Vec<f32> = g
            .iter()
            .enumerate()
            .map(|(i, &v)| if i / cols < nonzero { 50.0 * v } else { 0.0 })
            .collect();
        for coding in [Coding::RANS_DEFAULT, Coding::RICE_DEFAULT] {
            let template = e8_template(1024, 1, coding);
            let t = encode_to_rate("w", &x, &shape, &template, 4.0, opts).unwrap();
            let bps = t.payload_bytes() as f64 * 8.0 / x.len() as f64;
            let y = through_archive("w", &shape, &t);
            let db = snr(&x, &y);
            assert!(
                bps < 4.0 && db > 65.0,
                "{nonzero} rows, {coding:?}: {bps:.3} bps, {db:.2} dB"
            );
        }
    }
    let x: Vec<f32> = g
        .iter()
        .enumerate()
        .map(|(i, &v)| if i / cols % 4 == 0 { 0.0 } else { v })
        .collect();
    let template = e8_template(1024, 1, Coding::RANS_DEFAULT);
    let t = encode_to_rate("w", &x, &shape, &template, 7.9, opts).unwrap();
    let bps = t.payload_bytes() as f64 * 8.0 / x.len() as f64;
    assert!(
        bps <= 7.9 && bps > 7.2, // (the search lands short here, 7.33: before these changes 6.62)
        "a quarter of the rows zero: {bps:.3}"
    );
}

/// Rate control's steps assumed a bit per doubling of α until the target was bracketed. Prefix
/// codes of a weight with three non-zero columns rise about half a bit per doubling there: each
/// step halved the gap from above and never crossed it, so 4 bits was "unreachable" while 3.9
/// and 4.3 were met. The step now follows the slope of the last two tries.
#[test]
fn rate_control_follows_a_shallow_rate_curve_to_its_target() {
    let (rows, cols) = (256usize, 1024usize);
    let x: Vec<f32> = gaussian(rows * cols, 5)
        .iter()
        .enumerate()
        .map(|(i, &v)| if i % cols < 3 { v } else { 0.0 })
        .collect();
    let shape = [rows as u64, cols as u64];
    let template = e8_template(1024, 3, Coding::PREFIX_GPU.with_chunk(1 << 14)).for_matrix(
        rows as u64,
        cols as u64,
        1024,
    );
    for target in [3.9, 4.0, 4.1, 4.3] {
        let t = encode_to_rate("w", &x, &shape, &template, target, EncodeOptions::default())
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        let bps = t.payload_bytes() as f64 * 8.0 / x.len() as f64;
        assert!(bps <= target && bps > target - 0.05, "{target}: {bps}");
    }
}

/// An E8 encoding of `coding` with f16 row scales (α: rate control's to choose).
fn e8_template(tile: u32, seed: u64, coding: Coding) -> Encoding {
    Encoding::Lattice {
        lattice: Lattice::E8,
        alpha: 1.0,
        tile,
        seed,
        scale_dtype: FloatDtype::F16,
        coding,
    }
}
