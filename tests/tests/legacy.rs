//! Legacy zip-based .hwz archives written by hyperglyph-codec 0.7.0 itself
//! (scripts/make_hyperglyph_golden.py): our importer decodes what the package decodes, and
//! malformed archives give typed errors, never panics.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use hypercodec_hwz::legacy::{self, LegacyArchive};
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

fn crc32(b: &[u8]) -> u32 {
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
}

/// A stored-method zip of `files`, written the way zip readers expect.
fn zip(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let entries: Vec<ZipEntry<'_>> = files
        .iter()
        .map(|(name, data)| ZipEntry {
            name,
            method: 0,
            crc: crc32(data),
            size: data.len() as u32,
            data: data.clone(),
        })
        .collect();
    zip_entries(&entries)
}

/// One zip entry: `data` as it lies in the file, `size` and `crc` of it inflated.
struct ZipEntry<'a> {
    name: &'a str,
    method: u16,
    crc: u32,
    size: u32,
    data: Vec<u8>,
}

fn zip_entries(files: &[ZipEntry<'_>]) -> Vec<u8> {
    let (mut out, mut cd) = (Vec::new(), Vec::new());
    for f in files {
        let off = out.len() as u32;
        let (n, l) = (f.name.len() as u16, f.data.len() as u32);
        let method = f.method.to_le_bytes();
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&[20, 0, 0, 0, method[0], method[1], 0, 0, 0, 0]);
        for v in [f.crc, l, f.size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(f.name.as_bytes());
        out.extend_from_slice(&f.data);
        cd.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        cd.extend_from_slice(&[20, 0, 20, 0, 0, 0, method[0], method[1], 0, 0, 0, 0]);
        for v in [f.crc, l, f.size] {
            cd.extend_from_slice(&v.to_le_bytes());
        }
        cd.extend_from_slice(&n.to_le_bytes());
        cd.extend_from_slice(&[0; 8]);
        cd.extend_from_slice(&0u32.to_le_bytes());
        cd.extend_from_slice(&off.to_le_bytes());
        cd.extend_from_slice(f.name.as_bytes());
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
    // Lengths whose sum wraps u64 (or passes what the file could decode to) are refused when
    // the archive opens; they used to wrap to a payload of a few bytes.
    for (a, b) in [(u64::MAX, 2u64), (1u64 << 63, 1 << 63), (1 << 62, 0)] {
        let f = raw_int8_archive(|m| {
            m["tensors"][0]["raw_length"] = json!(a);
            m["tensors"][0]["scale_length"] = json!(b);
        });
        assert!(
            matches!(
                LegacyArchive::open(&f[..]),
                Err(HwzError::LegacyLimit {
                    what: "payload bytes",
                    ..
                })
            ),
            "{a} + {b}"
        );
    }
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

// Hostile archives under a few KB that used to make the reader allocate gigabytes to
// terabytes: each is refused by a cap checked before the allocation, with a typed error.

/// A zstd frame of `blocks` RLE blocks of `run` zero bytes each (4 bytes per block): the
/// densest zstd there is, `run` <= 1024 (the 1 KiB window the header declares).
fn zstd_rle(blocks: usize, run: u32) -> Vec<u8> {
    assert!(blocks > 0 && run <= 1024);
    let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x00, 0x00];
    for b in 0..blocks {
        let last = (b + 1 == blocks) as u32;
        let header = last | (1 << 1) | (run << 3);
        f.extend_from_slice(&header.to_le_bytes()[..3]);
        f.push(0);
    }
    f
}

/// A legacy archive of one tensor `t` (fields of its metadata entry) over `streams`, each
/// `(name, compression, raw_bytes, bytes as stored)`.
fn archive(t: Value, streams: &[(&str, &str, u64, Vec<u8>)]) -> Vec<u8> {
    let mut listed = serde_json::Map::new();
    let mut files = vec![];
    for (name, compression, raw, data) in streams {
        let file = format!("{name}.bin");
        listed.insert(
            name.to_string(),
            json!({"file": file, "compression": compression, "raw_bytes": raw, "stored_bytes": data.len()}),
        );
        files.push((file, data.clone()));
    }
    let meta = json!({"format_version": "0.5", "tensors": [t], "streams": listed});
    let mut files: Vec<(&str, Vec<u8>)> =
        files.iter().map(|(n, d)| (n.as_str(), d.clone())).collect();
    let meta = serde_json::to_vec(&meta).unwrap();
    files.push(("metadata.json", meta));
    zip(&files)
}

fn scales(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn open_and_decode(b: &[u8]) -> Result<Vec<f32>, HwzError> {
    let a = LegacyArchive::open(b)?;
    let name = a.tensors()[0].name.clone();
    a.decode_tensor(&name)
}

#[test]
fn hostile_low_rank_shapes_are_refused_before_allocating() {
    let file = |shape: Value, u: [u64; 2], v: [u64; 2], factors: (&str, u64, Vec<u8>)| {
        let (compression, raw, data) = factors;
        let t = json!({"name": "lr", "codec": "low_rank", "shape": shape,
            "u_shape": u, "v_shape": v, "u_offset": 0, "u_length": u[0] * u[1],
            "v_offset": u[0] * u[1], "v_length": v[0] * v[1], "scale_offset": 0, "scale_length": 16});
        archive(
            t,
            &[
                ("low_rank", compression, raw, data),
                ("scales", "raw", 16, scales(&[1.0, 0.0, 1.0, 0.0])),
            ],
        )
    };
    // A zero inner dimension: no factor bytes for 2^40 values (4 TiB of f32).
    let b = file(
        json!([1u64 << 20, 1u64 << 20]),
        [1 << 20, 0],
        [0, 1 << 20],
        ("raw", 0, vec![]),
    );
    assert!(b.len() < 4096);
    match open_and_decode(&b) {
        Err(HwzError::LegacyLimit {
            item, value, max, ..
        }) => {
            assert_eq!((item.as_str(), value), ("lr", 1 << 40));
            assert_eq!(
                max,
                b.len() as u64 * legacy::MAX_LEGACY_VALUES_PER_FILE_BYTE
            );
        }
        other => panic!("expected LegacyLimit, got {other:?}"),
    }
    // Rank-1 factors of 2^20 zeros each, from a zstd frame of 4 KiB: the same 2^40 values.
    let frame = zstd_rle(2048, 1024);
    let b = file(
        json!([1u64 << 20, 1u64 << 20]),
        [1 << 20, 1],
        [1, 1 << 20],
        ("zstd", 2 << 20, frame),
    );
    assert!(matches!(
        open_and_decode(&b),
        Err(HwzError::LegacyLimit { .. })
    ));
    // Within the file's budget, a zero rank or a rank above a dimension is still refused.
    let b = file(json!([0, 0]), [0, 0], [0, 0], ("raw", 0, vec![]));
    assert!(matches!(open_and_decode(&b), Err(HwzError::Legacy { .. })));
    let b = file(json!([2, 2]), [2, 3], [3, 2], ("raw", 12, vec![1; 12]));
    assert!(matches!(open_and_decode(&b), Err(HwzError::Legacy { .. })));
    // And an honest one decodes: [1, 2]^T [3, 4].
    let b = file(json!([2, 2]), [2, 1], [1, 2], ("raw", 4, vec![1, 2, 3, 4]));
    assert_eq!(open_and_decode(&b).unwrap(), vec![3.0, 4.0, 6.0, 8.0]);
}

/// A codebook tensor with its own prototypes (auto mode): `protos` x `block` int8 values.
fn codebook_file(shape: Value, block: u64, fields: Value, assignments: Vec<u8>) -> Vec<u8> {
    let protos = 1u64;
    let mut t = json!({"name": "cb", "codec": "codebook", "shape": shape,
        "prototype_shape": [protos, block], "prototype_offset": 0, "prototype_value_length": protos * block,
        "prototype_scale_offset": protos * block,
        "assignment_offset": 0, "assignment_length": assignments.len(),
        "scale_dtype": "float32", "scale_offset": 0, "scale_length": 16});
    for (k, v) in fields.as_object().unwrap() {
        t[k] = v.clone();
    }
    let mut prototypes = vec![1u8; (protos * block) as usize];
    prototypes.extend(scales(&[1.0]));
    archive(
        t,
        &[
            ("prototypes", "raw", prototypes.len() as u64, prototypes),
            ("assignments", "raw", assignments.len() as u64, assignments),
            ("scales", "raw", 16, scales(&[1.0; 4])),
        ],
    )
}

#[test]
fn a_huge_rle_assignment_count_is_refused_before_allocating() {
    // One run of 2^40 assignments (8 TiB of u64) for a tensor of 64 values in 4 blocks.
    let mut rle = vec![];
    let mut run = 1u64 << 40;
    while run >= 0x80 {
        rle.push(run as u8 | 0x80);
        run >>= 7;
    }
    rle.extend([run as u8, 0]);
    let fields =
        json!({"assignment_encoding": "rle", "assignment_count": 1u64 << 40, "block_count": 4});
    let b = codebook_file(json!([64]), 16, fields, rle.clone());
    assert!(b.len() < 4096);
    match open_and_decode(&b) {
        Err(HwzError::LegacyLimit {
            item,
            what,
            value,
            max,
        }) => {
            assert_eq!((item.as_str(), value, max), ("cb", 1 << 40, 4), "{what}");
        }
        other => panic!("expected LegacyLimit, got {other:?}"),
    }
    // The same run with an honest count decodes (the run stops at the count).
    let fields = json!({"assignment_encoding": "rle", "assignment_count": 4, "block_count": 4});
    let b = codebook_file(json!([64]), 16, fields, rle);
    assert_eq!(open_and_decode(&b).unwrap(), vec![1.0; 64]);
}

#[test]
fn a_huge_codebook_block_is_refused_before_allocating() {
    // Blocks of 4096 values: 2^18 blocks with one shared assignment cover 2^30 values (4 GiB).
    let fields = json!({"assignment_encoding": "uint8", "assignment_count": 1,
        "assignment_group_size": 1u64 << 18, "block_count": 1u64 << 18});
    let b = codebook_file(json!([1u64 << 30]), 4096, fields, vec![0]);
    assert!(b.len() < 16384);
    assert!(matches!(
        open_and_decode(&b),
        Err(HwzError::LegacyLimit { what: "values", .. })
    ));
    // Above MAX_LEGACY_BLOCK, refused whatever the tensor.
    let fields = json!({"assignment_count": 1, "block_count": 1});
    let b = codebook_file(json!([16]), legacy::MAX_LEGACY_BLOCK + 1, fields, vec![0]);
    assert!(matches!(
        open_and_decode(&b),
        Err(HwzError::LegacyLimit {
            what: "codebook block size",
            ..
        })
    ));
    // A tensor shorter than its last block decodes without walking the rest of it.
    let fields = json!({"assignment_count": 1, "block_count": 1});
    let b = codebook_file(json!([3]), 4096, fields, vec![0]);
    assert_eq!(open_and_decode(&b).unwrap(), vec![1.0; 3]);
}

/// Raw deflate of `data` by hand (fixed Huffman): literals, then 258-byte matches at
/// distance `period` while the data repeats with that period, literals for the rest.
fn deflate_periodic(data: &[u8], period: usize) -> Vec<u8> {
    struct Bits(Vec<u8>, u64, u32);
    impl Bits {
        fn put(&mut self, v: u64, n: u32) {
            self.1 |= v << self.2;
            self.2 += n;
            while self.2 >= 8 {
                self.0.push(self.1 as u8);
                self.1 >>= 8;
                self.2 -= 8;
            }
        }
        /// A Huffman code goes most significant bit first.
        fn code(&mut self, c: u32, n: u32) {
            self.put((c.reverse_bits() >> (32 - n)) as u64, n);
        }
        fn literal(&mut self, b: u8) {
            if b < 144 {
                self.code(0x30 + b as u32, 8)
            } else {
                self.code(0x190 + (b as u32 - 144), 9)
            }
        }
    }
    assert!((1..=4).contains(&period));
    let mut w = Bits(vec![], 0, 0);
    w.put(1, 1); // final block
    w.put(1, 2); // fixed Huffman
    let mut i = 0;
    while i < data.len() {
        if i >= period
            && i + 258 <= data.len()
            && data[i..i + 258] == data[i - period..i - period + 258]
        {
            w.code(0xC5, 8); // length 258 (symbol 285)
            w.code(period as u32 - 1, 5); // distance 1..=4 (codes 0..=3)
            i += 258;
        } else {
            w.literal(data[i]);
            i += 1;
        }
    }
    w.code(0, 7); // end of block
    w.put(0, 7);
    w.0
}

#[test]
fn zstd_inside_deflate_shares_one_expansion_budget() {
    // A zstd frame of 1 KiB runs (256:1), deflated ~159:1 in the zip: an entry of a few
    // KB that the two caps multiplied let decode 256 MiB (for a tensor that reads 16 bytes
    // of it). One budget for the chain refuses it before inflating.
    let file = |blocks: usize| {
        let frame = zstd_rle(blocks, 1024);
        let deflated = deflate_periodic(&frame, 4);
        let raw = blocks as u64 * 1024;
        let meta = json!({"format_version": "0.5",
            "tensors": [{"name": "w", "shape": [16], "codec": "raw_int8", "raw_offset": 0, "raw_length": 16, "scale_offset": 0, "scale_length": 8}],
            "streams": {
                "raw_values": {"file": "raw_values.bin.zst", "compression": "zstd", "raw_bytes": raw, "stored_bytes": frame.len()},
                "scales": {"file": "scales.bin", "compression": "raw", "raw_bytes": 8, "stored_bytes": 8}
            }
        });
        let params = scales(&[1.0, 0.0]);
        let meta = serde_json::to_vec(&meta).unwrap();
        zip_entries(&[
            ZipEntry {
                name: "raw_values.bin.zst",
                method: 8,
                crc: crc32(&frame),
                size: frame.len() as u32,
                data: deflated,
            },
            ZipEntry {
                name: "scales.bin",
                method: 0,
                crc: crc32(&params),
                size: 8,
                data: params,
            },
            ZipEntry {
                name: "metadata.json",
                method: 0,
                crc: crc32(&meta),
                size: meta.len() as u32,
                data: meta,
            },
        ])
    };
    let b = file(1 << 18);
    assert!(b.len() < 16384, "{}", b.len());
    let a = LegacyArchive::open(&b[..]).unwrap();
    match a.decode_tensor("w") {
        Err(HwzError::LegacyLimit {
            item,
            what,
            value,
            max,
        }) => {
            assert_eq!((item.as_str(), value), ("raw_values", 1 << 28), "{what}");
            assert!(max < 1 << 24, "{max}");
        }
        other => panic!("expected LegacyLimit, got {:?}", other.map(|v| v.len())),
    }
    // The same chain within the budget decodes.
    let b = file(4);
    let w = LegacyArchive::open(&b[..])
        .unwrap()
        .decode_tensor("w")
        .unwrap();
    assert_eq!(w, vec![0.0; 16]);
}
