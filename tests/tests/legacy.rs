//! Legacy zip-based .hwz archives written by hyperglyph-codec 0.7.0 itself
//! (scripts/make_hyperglyph_golden.py): our importer decodes what the package decodes, and
//! malformed archives give typed errors, never panics.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use hypercodec_hwz::legacy::LegacyArchive;
use hypercodec_hwz::{sniff, HwzError, Sniff};
use serde_json::{json, Value};

fn data(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/data/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// Float-order differences (numpy's BLAS matmul) stay within a few ulps.
const REL_TOL: f32 = 1e-5;

fn check(stem: &str) {
    let bytes = data(&format!("{stem}.hwz"));
    assert_eq!(sniff(&bytes), Sniff::LegacyZip);
    let expected_meta: Value =
        serde_json::from_slice(&data(&format!("{stem}.expected.json"))).unwrap();
    let expected: Vec<f32> = data(&format!("{stem}.expected.f32"))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let a = LegacyArchive::open(&bytes[..]).unwrap();
    assert_eq!(a.tensors().len(), expected_meta.as_object().unwrap().len());
    let mut at = 0;
    for t in a.tensors() {
        let want = &expected_meta[&t.name];
        assert_eq!(json!(t.shape), want["shape"], "{}", t.name);
        assert_eq!(t.codec, want["codec"].as_str().unwrap());
        let got = a.decode_tensor(&t.name).unwrap();
        let exp = &expected[at..at + got.len()];
        let scale = exp.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (i, (g, e)) in got.iter().zip(exp).enumerate() {
            assert!(
                (g - e).abs() <= REL_TOL * scale,
                "{} [{i}]: {g} vs {e} ({})",
                t.name,
                t.codec
            );
        }
        at += got.len();
    }
    assert_eq!(at, expected.len());
}

#[test]
fn auto_mode_archive_decodes_like_the_package() {
    check("hyperglyph-auto");
}

#[test]
fn codebook_mode_archive_decodes_like_the_package() {
    check("hyperglyph-codebook");
}

#[test]
fn corrupt_legacy_archives_are_errors_not_panics() {
    let good = data("hyperglyph-auto.hwz");
    for cut in (0..good.len()).step_by(97) {
        let r = LegacyArchive::open(&good[..cut]);
        if let Ok(a) = r {
            for t in a.tensors() {
                let _ = a.decode_tensor(&t.name);
            }
        }
    }
    let mut any_error = 0;
    for pos in (0..good.len()).step_by(13) {
        let mut b = good.clone();
        b[pos] ^= 0x5A;
        match LegacyArchive::open(&b[..]) {
            Err(_) => any_error += 1,
            Ok(a) => {
                for t in a.tensors() {
                    if a.decode_tensor(&t.name).is_err() {
                        any_error += 1;
                    }
                }
            }
        }
    }
    assert!(any_error > 0);
    assert!(matches!(
        LegacyArchive::open(&b"PK\x03\x04 not really a zip"[..]),
        Err(HwzError::Legacy { .. })
    ));
}

/// A stored-method zip of `files`, written the way zip readers expect.
fn zip(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let crc = |b: &[u8]| {
        let mut c = !0u32;
        for &x in b {
            c ^= x as u32;
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    };
    let (mut out, mut cd) = (Vec::new(), Vec::new());
    for (name, data) in files {
        let off = out.len() as u32;
        let (c, n, l) = (crc(data), name.len() as u16, data.len() as u32);
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        for v in [c, l, l] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        cd.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        cd.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        for v in [c, l, l] {
            cd.extend_from_slice(&v.to_le_bytes());
        }
        cd.extend_from_slice(&n.to_le_bytes());
        cd.extend_from_slice(&[0; 8]);
        cd.extend_from_slice(&0u32.to_le_bytes());
        cd.extend_from_slice(&off.to_le_bytes());
        cd.extend_from_slice(name.as_bytes());
    }
    let cd_off = out.len() as u32;
    out.extend_from_slice(&cd);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&(files.len() as u16).to_le_bytes());
    out.extend_from_slice(&(files.len() as u16).to_le_bytes());
    out.extend_from_slice(&(cd.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_off.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

fn raw_int8_archive(meta_edit: impl Fn(&mut Value)) -> Vec<u8> {
    let values: Vec<u8> = (0..16).collect();
    let params: Vec<u8> = [0.5f32, -1.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut meta = json!({
        "format_version": "0.5",
        "tensors": [{"name": "w", "shape": [4, 4], "codec": "raw_int8", "raw_offset": 0, "raw_length": 16, "scale_offset": 0, "scale_length": 8}],
        "streams": {
            "raw_values": {"file": "raw_values.bin", "compression": "raw", "raw_bytes": 16, "stored_bytes": 16},
            "scales": {"file": "scales.bin", "compression": "raw", "raw_bytes": 8, "stored_bytes": 8}
        }
    });
    meta_edit(&mut meta);
    zip(&[
        ("raw_values.bin", values),
        ("scales.bin", params),
        ("metadata.json", serde_json::to_vec(&meta).unwrap()),
    ])
}

#[test]
fn crafted_archives() {
    let ok = raw_int8_archive(|_| {});
    let a = LegacyArchive::open(&ok[..]).unwrap();
    let w = a.decode_tensor("w").unwrap();
    assert_eq!(w[0], -1.0);
    assert_eq!(w[15], 6.5);
    for edit in [
        json!({"raw_offset": 10}),
        json!({"raw_length": 4}),
        json!({"shape": [4, 5]}),
        json!({"scale_length": 40}),
    ] {
        let b = raw_int8_archive(|m| {
            for (k, v) in edit.as_object().unwrap() {
                m["tensors"][0][k] = v.clone();
            }
        });
        let r = LegacyArchive::open(&b[..]).and_then(|a| a.decode_tensor("w"));
        assert!(matches!(r, Err(HwzError::Legacy { .. })), "{edit}: {r:?}");
    }
    let b = raw_int8_archive(|m| m["tensors"][0]["shape"] = json!([u64::MAX, 4]));
    assert!(matches!(
        LegacyArchive::open(&b[..]),
        Err(HwzError::ShapeOverflow { .. })
    ));
    let b = raw_int8_archive(|m| m["streams"]["scales"]["file"] = json!("nope.bin"));
    assert!(matches!(
        LegacyArchive::open(&b[..]).and_then(|a| a.decode_tensor("w")),
        Err(HwzError::Legacy { .. })
    ));
}

#[test]
fn a_truncated_deflate_entry_gives_a_short_message() {
    // metadata.json as one stored deflate block of 60000 bytes, cut after 30000 of them.
    let n = 60_000u16;
    let mut deflate = vec![0x01];
    deflate.extend_from_slice(&n.to_le_bytes());
    deflate.extend_from_slice(&(!n).to_le_bytes());
    deflate.extend(std::iter::repeat_n(b'A', 30_000));
    let mut b = zip(&[("metadata.json", deflate)]);
    let cd = b.len() - 22 - (46 + "metadata.json".len());
    // Method 8 (deflate) and the full inflated size, in the local and the central header.
    b[8] = 8;
    b[22..26].copy_from_slice(&(n as u32).to_le_bytes());
    b[cd + 10] = 8;
    b[cd + 24..cd + 28].copy_from_slice(&(n as u32).to_le_bytes());
    match LegacyArchive::open(&b[..]) {
        Err(HwzError::Legacy { message }) => {
            assert!(
                message.len() < 200,
                "{} bytes: {message:.300}",
                message.len()
            )
        }
        other => panic!("expected a Legacy error, got {:?}", other.map(|_| ())),
    }
}
