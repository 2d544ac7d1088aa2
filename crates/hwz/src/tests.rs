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
