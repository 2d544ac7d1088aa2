//! Golden version-1 archives: committed once, decoded forever.
//!
//! - `golden-v1.hwz`: one tensor per raw and affine variant, zstd and plain streams, metadata.
//! - `golden-v1-lattice.hwz`: one tensor per lattice and coding (rANS, Rice, fixed-rate).
//! - `golden-v1-codebook.hwz`: codebook (packed and run-length indices, int8 and f32
//!   residuals, per row/block/tensor scales), lowrank, sparse, mixed and exceptions.
//! - `golden-v1-trellis.hwz`: trellis codes (L 8 to 16, K 1 to 4, one or several sequences
//!   per row).
//! - `golden-v1-prefix.hwz`: E8 in lane-interleaved prefix codes (pairs and singles, one- and
//!   two-block segments, a partial group of rows, a short last block).
//! - `golden-v1-prefix-span.hwz`: prefix codes in chunks spanning several groups of rows.
//!
//! Each `*.expected.f32` holds what its tensors decoded to when the file was made. A reader
//! change that alters a single bit fails here. To remake them (only for a deliberate format
//! addition, never to make this test pass):
//! `HWZ_WRITE_GOLDEN=1 cargo test -p hypercodec-tests --test golden -- --ignored`.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use hypercodec_hwz::{
    encode, Archive, Compression, EncodeOptions, Encoding, TensorStats, Writer, WriterOptions,
};
use hypercodec_tests::{
    fixture_values, golden_codebook_encodings, golden_encodings, golden_lattice_encodings,
    golden_prefix_encodings, golden_prefix_span_encodings, golden_trellis_encodings,
    golden_trellis_pair_encodings,
};
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

fn check(stem: &str, encodings: &[Encoding]) {
    let bytes = std::fs::read(data(&format!("{stem}.hwz"))).unwrap();
    let expected: Vec<u32> = std::fs::read(data(&format!("{stem}.expected.f32")))
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
    assert!(got == expected, "{stem} decodes differently");
    let found: Vec<Encoding> = archive
        .tensors()
        .iter()
        .map(|t| t.encoding.clone())
        .collect();
    assert_eq!(found, encodings);
}

#[test]
fn golden_v1_decodes_to_its_recorded_values() {
    check("golden-v1", &golden_encodings());
    let bytes = std::fs::read(data("golden-v1.hwz")).unwrap();
    let archive = Archive::open(&bytes[..]).unwrap();
    assert!(archive
        .manifest()
        .streams
        .iter()
        .any(|s| s.compression == Compression::Zstd));
}

#[test]
fn golden_v1_lattice_decodes_to_its_recorded_values() {
    check("golden-v1-lattice", &golden_lattice_encodings());
}

#[test]
fn golden_v1_trellis_decodes_to_its_recorded_values() {
    check("golden-v1-trellis", &golden_trellis_encodings());
}

#[test]
fn golden_v1_trellis_pairs_decode_to_their_recorded_values() {
    check("golden-v1-trellis-pairs", &golden_trellis_pair_encodings());
}

#[test]
fn golden_v1_prefix_decodes_to_its_recorded_values() {
    check("golden-v1-prefix", &golden_prefix_encodings());
}

#[test]
fn golden_v1_prefix_spans_decode_to_their_recorded_values() {
    check("golden-v1-prefix-span", &golden_prefix_span_encodings());
}

#[test]
fn golden_v1_codebook_decodes_to_its_recorded_values() {
    check("golden-v1-codebook", &golden_codebook_encodings());
}

fn write(stem: &str, encodings: &[Encoding], seed: u64) {
    write_shaped(stem, encodings, seed, [6, 40]);
}

fn write_shaped(stem: &str, encodings: &[Encoding], seed: u64, shape: [u64; 2]) {
    let options = WriterOptions {
        compression: Compression::Zstd,
        generator: "hypercodec golden".into(),
    };
    let mut w = Writer::new(Vec::new(), options).unwrap();
    w.insert_metadata("purpose", "golden file of the .hwz v1 format".into());
    let mut expected = Vec::new();
    for (i, enc) in encodings.iter().enumerate() {
        let values = fixture_values((shape[0] * shape[1]) as usize, seed + i as u64);
        let name = format!("{i}.{}", enc.label());
        let t = encode(&name, &values, &shape, enc, EncodeOptions::default()).unwrap();
        let refs: Vec<(&str, &[u8])> = t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
        let mut out = vec![0.0; values.len()];
        hypercodec_hwz::decode_into(&name, enc, &shape, &refs, &mut out).unwrap();
        expected.extend(out.iter().flat_map(|x| x.to_le_bytes()));
        let stats = TensorStats {
            snr_db: Some(20.0),
            ..Default::default()
        };
        w.add_tensor(&name, &shape, "f32", &t, Some(stats)).unwrap();
    }
    let (bytes, _) = w.finish().unwrap();
    std::fs::write(data(&format!("{stem}.hwz")), bytes).unwrap();
    std::fs::write(data(&format!("{stem}.expected.f32")), expected).unwrap();
}

#[test]
#[ignore = "writes the golden files; run only for a deliberate format addition"]
fn write_golden() {
    if std::env::var("HWZ_WRITE_GOLDEN").is_err() {
        return;
    }
    if !data("golden-v1.hwz").exists() {
        write("golden-v1", &golden_encodings(), 100);
    }
    if !data("golden-v1-lattice.hwz").exists() {
        write("golden-v1-lattice", &golden_lattice_encodings(), 200);
    }
    if !data("golden-v1-codebook.hwz").exists() {
        write("golden-v1-codebook", &golden_codebook_encodings(), 300);
    }
    if !data("golden-v1-trellis.hwz").exists() {
        write("golden-v1-trellis", &golden_trellis_encodings(), 400);
    }
    if !data("golden-v1-prefix.hwz").exists() {
        write("golden-v1-prefix", &golden_prefix_encodings(), 600);
    }
    if !data("golden-v1-prefix-span.hwz").exists() {
        write_shaped(
            "golden-v1-prefix-span",
            &golden_prefix_span_encodings(),
            700,
            [20, 40],
        );
    }
    if !data("golden-v1-trellis-pairs.hwz").exists() {
        write(
            "golden-v1-trellis-pairs",
            &golden_trellis_pair_encodings(),
            500,
        );
    }
}
