//! The golden version-1 archive: committed once, decoded forever.
//!
//! `tests/data/golden-v1.hwz` holds one tensor per sample encoding (raw f32/f16/bf16 and affine
//! variants, zstd and plain streams, metadata); `golden-v1.expected.f32` holds what they decoded
//! to when the file was made. A reader change that alters a single bit fails here.
//! To remake both (only for a deliberate format addition, never to make this test pass):
//! `HWZ_WRITE_GOLDEN=1 cargo test -p hypercodec-tests --test golden -- --ignored`.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use hypercodec_hwz::{
    encode, Archive, Compression, EncodeOptions, TensorStats, Writer, WriterOptions,
};
use hypercodec_tests::{fixture_values, sample_encodings};
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

#[test]
fn golden_v1_decodes_to_its_recorded_values() {
    let bytes = std::fs::read(data("golden-v1.hwz")).unwrap();
    let expected: Vec<u32> = std::fs::read(data("golden-v1.expected.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let archive = Archive::open(&bytes[..]).unwrap();
    assert_eq!(archive.manifest().version, 1);
    assert_eq!(
        archive.manifest().metadata["purpose"],
        "golden file of the .hwz v1 format"
    );
    let mut got = Vec::new();
    for t in archive.tensors() {
        got.extend(
            archive
                .decode_tensor(&t.name)
                .unwrap()
                .iter()
                .map(|x| x.to_bits()),
        );
    }
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "golden archive decodes differently");
    assert_eq!(archive.tensors().len(), sample_encodings().len());
    let labels: Vec<String> = archive
        .tensors()
        .iter()
        .map(|t| t.encoding.label())
        .collect();
    let want: Vec<String> = sample_encodings().iter().map(|e| e.label()).collect();
    assert_eq!(labels, want);
    assert!(archive
        .manifest()
        .streams
        .iter()
        .any(|s| s.compression == Compression::Zstd));
}

#[test]
#[ignore = "writes the golden files; run only for a deliberate format addition"]
fn write_golden() {
    if std::env::var("HWZ_WRITE_GOLDEN").is_err() {
        return;
    }
    let mut w = Writer::new(
        Vec::new(),
        WriterOptions {
            compression: Compression::Zstd,
            generator: "hypercodec golden".into(),
        },
    )
    .unwrap();
    w.insert_metadata("purpose", "golden file of the .hwz v1 format".into());
    let mut expected = Vec::new();
    for (i, enc) in sample_encodings().iter().enumerate() {
        let shape = [6u64, 40];
        let values = fixture_values(240, 100 + i as u64);
        let t = encode(&enc.label(), &values, &shape, enc, EncodeOptions::default()).unwrap();
        let refs: Vec<(&str, &[u8])> = t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
        let mut out = vec![0.0; values.len()];
        hypercodec_hwz::decode_into(&enc.label(), enc, &shape, &refs, &mut out).unwrap();
        expected.extend(out.iter().flat_map(|x| x.to_le_bytes()));
        w.add_tensor(
            &enc.label(),
            &shape,
            "f32",
            &t,
            Some(TensorStats {
                snr_db: Some(20.0),
                ..Default::default()
            }),
        )
        .unwrap();
    }
    let (bytes, _) = w.finish().unwrap();
    std::fs::write(data("golden-v1.hwz"), bytes).unwrap();
    std::fs::write(data("golden-v1.expected.f32"), expected).unwrap();
}
