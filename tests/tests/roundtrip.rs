//! Property tests of the container and every scalar format through it.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use hypercodec_hwz::{
    encode, AffineParams, Archive, Compression, EncodeOptions, Encoding, FloatDtype, Group,
};
use hypercodec_hwz::{Coding, Lattice};
use hypercodec_tests::{roundtrip, sample_archive};
use proptest::prelude::*;

/// Realistic weights: Gaussian-like bulk, a heavy tail, exact zeros.
fn weights(n: usize) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(
        prop_oneof![
            8 => (-3.0f32..3.0).prop_map(|x| x * 0.02),
            1 => -40.0f32..40.0,
            1 => Just(0.0f32),
        ],
        n,
    )
}

fn encoding() -> impl Strategy<Value = Encoding> {
    let dtype = prop_oneof![
        Just(FloatDtype::F32),
        Just(FloatDtype::F16),
        Just(FloatDtype::Bf16)
    ];
    let group = prop_oneof![
        Just(Group::Tensor),
        Just(Group::Row),
        (1u32..100).prop_map(Group::Size)
    ];
    prop_oneof![
        dtype.clone().prop_map(|dtype| Encoding::Raw { dtype }),
        (1u8..=8, group, any::<bool>(), dtype).prop_map(|(bits, group, symmetric, scale_dtype)| {
            Encoding::affine(AffineParams {
                bits,
                group,
                symmetric,
                scale_dtype,
            })
        }),
    ]
}

fn shape() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        Just(vec![]),
        (0u64..50).prop_map(|a| vec![a]),
        (1u64..8, 1u64..70).prop_map(|(a, b)| vec![a, b]),
        (1u64..3, 1u64..4, 1u64..30).prop_map(|(a, b, c)| vec![a, b, c]),
    ]
}

fn tensor() -> impl Strategy<Value = (Vec<u64>, Vec<f32>, Encoding)> {
    (shape(), encoding()).prop_flat_map(|(shape, enc)| {
        let n = shape.iter().product::<u64>() as usize;
        (Just(shape), weights(n), Just(enc))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever goes in comes out as the codec alone decodes it: the container adds nothing
    /// and loses nothing, with and without zstd.
    #[test]
    fn container_roundtrip(tensors in proptest::collection::vec(tensor(), 1..6), zstd in any::<bool>()) {
        let named: Vec<_> = tensors.into_iter().enumerate()
            .map(|(i, (s, v, e))| (format!("layer.{i}"), s, v, e)).collect();
        let compression = if zstd { Compression::Zstd } else { Compression::None };
        let (_, decoded) = roundtrip(&named, compression).unwrap();
        for ((name, shape, values, enc), got) in named.iter().zip(&decoded) {
            // The same tensor decoded straight from the codec, without the container, under
            // the encoding the codec reports (f16 scales it cannot hold become bf16).
            let t = encode(name, values, shape, enc, EncodeOptions::default()).unwrap();
            let refs: Vec<(&str, &[u8])> = t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
            let mut direct = vec![0.0; values.len()];
            hypercodec_hwz::decode_into(name, &t.encoding, shape, &refs, &mut direct).unwrap();
            prop_assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), direct.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            if let Encoding::Raw { dtype } = enc {
                for (a, b) in values.iter().zip(got) {
                    prop_assert_eq!(dtype.round(*a).to_bits(), b.to_bits(), "raw {} must be exact", dtype);
                }
            }
        }
    }

    /// Any corruption of a valid archive gives an error or a decodable archive: never a panic.
    #[test]
    fn corruption_never_panics(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut bytes = sample_archive();
        for (i, b) in edits {
            let at = i.index(bytes.len());
            bytes[at] = b;
        }
        if let Ok(a) = Archive::open(&bytes[..]) {
            for t in a.tensors() {
                let _ = a.decode_tensor(&t.name);
            }
        }
    }
}

fn lattice_case() -> impl Strategy<Value = (u64, u64, Encoding, u64)> {
    let lattice = prop::sample::select(Lattice::ALL.to_vec());
    (
        1u64..5,
        1u64..70,
        lattice,
        0.3f32..24.0,
        0u8..4,
        2u8..=8,
        any::<u64>(),
    )
        .prop_map(|(rows, cols, lattice, alpha, c, bits, seed)| {
            let coding = match c {
                3 if lattice == Lattice::E8 => Coding::Prefix {
                    limit: 8 + (seed % 5) as u8,
                    pair_limit: [0, 8, 10, 11, 12][(seed / 5 % 5) as usize]
                        .min((32 - 8 - (seed % 5) as u8) / 2),
                    segment: 1 + (seed / 25 % 4) as u32,
                    // Spans of several row groups where a row is one segment (32 columns a
                    // block).
                    span: if cols.div_ceil(32) <= 1 + seed / 25 % 4 {
                        1 + (seed / 100 % 3) as u32
                    } else {
                        1
                    },
                },
                0 => Coding::Rans {
                    chunk: 8 * (1 + (seed % 20) as u32),
                    lanes: 1 + (seed % 33) as u8,
                    prob_bits: 8 + (seed % 8) as u8,
                },
                1 => Coding::Rice {
                    chunk: 1 + (seed % 50) as u32,
                },
                _ if lattice.has_fixed() => Coding::Fixed { bits },
                _ => Coding::Rice { chunk: 16 },
            };
            let tile = hypercodec_lattice::tile_for(cols as usize, 4096) as u32;
            let enc = Encoding::Lattice {
                lattice,
                alpha,
                tile,
                seed,
                scale_dtype: FloatDtype::Bf16,
                coding,
            };
            (rows, cols, enc, seed)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// Lattice tensors through the container decode as the codec alone decodes them, and the
    /// error stays within the covering radius of the lattice, scaled back per row.
    #[test]
    fn lattice_roundtrip((rows, cols, enc, seed) in lattice_case(), zstd in any::<bool>()) {
        let values = hypercodec_tests::fixture_values((rows * cols) as usize, seed);
        let named = vec![("w".to_string(), vec![rows, cols], values.clone(), enc.clone())];
        let compression = if zstd { Compression::Zstd } else { Compression::None };
        // Prefix codes have no escapes: a symbol beyond their tables is a typed refusal.
        if let Err(e) = encode("w", &values, &[rows, cols], &enc, EncodeOptions::default()) {
            let unfit = matches!(
                e,
                hypercodec_hwz::HwzError::Coding { source: hypercodec_hwz::CodingError::Unrepresentable { .. }, .. }
            );
            prop_assert!(unfit && matches!(enc, Encoding::Lattice { coding: Coding::Prefix { .. }, .. }), "{}", e);
            prop_assert!(roundtrip(&named, compression).is_err());
            return Ok(());
        }
        let (_, decoded) = roundtrip(&named, compression).unwrap();
        let t = encode("w", &values, &[rows, cols], &enc, EncodeOptions::default()).unwrap();
        let refs: Vec<(&str, &[u8])> = t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
        let mut direct = vec![0.0; values.len()];
        hypercodec_hwz::decode_into("w", &enc, &[rows, cols], &refs, &mut direct).unwrap();
        prop_assert_eq!(&decoded[0], &direct);
        // Fixed-rate forms clamp outliers, so only entropy-coded points obey the radius bound.
        if let Encoding::Lattice { lattice, alpha, coding: Coding::Rans { .. } | Coding::Rice { .. } | Coding::Prefix { .. }, .. } = enc {
            // Per row: ‖x − x̂‖ ≤ (covering radius · √(words) · σ/α) plus the rounding of σ,
            // the row's RMS (the default `LatticeScale::Row`).
            for r in 0..rows as usize {
                let row = &values[r * cols as usize..(r + 1) * cols as usize];
                let got = &decoded[0][r * cols as usize..(r + 1) * cols as usize];
                let sigma = (row.iter().map(|x| x * x).sum::<f32>() / cols as f32).sqrt();
                let words = (cols as usize).div_ceil(lattice.dim()) as f32;
                let err = row.iter().zip(got).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
                let bound = lattice.covering_radius() * words.sqrt() * sigma * 1.01 / alpha + 0.01 * sigma * (cols as f32).sqrt();
                prop_assert!(err <= bound + 1e-4, "row {}: error {} > bound {}", r, err, bound);
            }
        }
    }
}

/// Convolutions: a rank ≥ 3 tensor is coded as `[shape[0], prod(shape[1..])]` in a version-2
/// archive; a version-1 archive's rank ≥ 3 tensor keeps decoding under the old last-dimension
/// view; an archive of matrices stays version 1.
#[test]
fn conv_tensors_use_the_outer_matrix_view_and_old_archives_still_decode() {
    use hypercodec_hwz::{matrix_view, FORMAT_VERSION, MATRIX_VIEW_VERSION};
    use hypercodec_tests::{assemble, fixture_values, split};
    assert_eq!(matrix_view(&[96, 16, 1, 1], 1536), (96, 16));
    assert_eq!(matrix_view(&[32, 1, 3, 3], 288), (32, 9));
    assert_eq!(matrix_view(&[4, 0, 4], 0), (0, 0));
    let int4 = Encoding::affine(AffineParams {
        bits: 4,
        group: Group::Size(128),
        symmetric: false,
        scale_dtype: FloatDtype::F16,
    });
    // A pointwise kernel: one group per output channel (16 values), not one per value.
    let pw = fixture_values(96 * 16, 3);
    let (bytes, back) = roundtrip(
        &[("pw".into(), vec![96, 16, 1, 1], pw.clone(), int4.clone())],
        Compression::None,
    )
    .unwrap();
    let a = Archive::open(&bytes[..]).unwrap();
    assert_eq!(a.manifest().version, MATRIX_VIEW_VERSION);
    let bps = a.stored_bytes(&a.tensors()[0]) as f64 * 8.0 / pw.len() as f64;
    assert!(bps <= 4.0 + 32.0 / 16.0 + 1e-9, "{bps} bps");
    // Each 16-value row is its own group: the error stays within half a step of its range.
    for (row, got) in pw.chunks(16).zip(back[0].chunks(16)) {
        let (lo, hi) = row
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        let half_step = (hi - lo) / 15.0 / 2.0 * 1.01 + 1e-3;
        assert!(row.iter().zip(got).all(|(x, y)| (x - y).abs() <= half_step));
    }
    // Matrices only: version 1, as before.
    let (bytes2, _) = roundtrip(
        &[(
            "m".into(),
            vec![6, 40],
            fixture_values(240, 4),
            int4.clone(),
        )],
        Compression::None,
    )
    .unwrap();
    assert_eq!(
        Archive::open(&bytes2[..]).unwrap().manifest().version,
        FORMAT_VERSION
    );
    // A version-1 archive whose [2, 3, 40] tensor was coded as 6 rows of 40 (the old view).
    let (streams, mut manifest) = split(&bytes2);
    manifest["tensors"][0]["shape"] = serde_json::json!([2, 3, 40]);
    let old = assemble(&streams, &manifest);
    let a_old = Archive::open(&old[..]).unwrap();
    let a_new = Archive::open(&bytes2[..]).unwrap();
    assert_eq!(
        a_old.decode_tensor("m").unwrap(),
        a_new.decode_tensor("m").unwrap()
    );
    // The same streams claimed under version 2 do not fit the outer view (2 rows of 120).
    manifest["version"] = serde_json::json!(MATRIX_VIEW_VERSION);
    assert!(Archive::open(&assemble(&streams, &manifest)[..]).is_err());
    manifest["version"] = serde_json::json!(MATRIX_VIEW_VERSION + 1);
    assert!(matches!(
        Archive::open(&assemble(&streams, &manifest)[..]),
        Err(hypercodec_hwz::HwzError::UnsupportedVersion { .. })
    ));
}
