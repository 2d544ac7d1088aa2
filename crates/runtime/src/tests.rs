//! Every path against the reference (decode to f32, multiply in f64), on fresh random shapes.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use crate::{reference, CompressedLinear, LoadOptions, Path, RuntimeError};
use hypercodec_hwz::{
    assemble_exceptions, assemble_mixed, codebook_template, encode, encode_codebook, Assignments,
    CodebookSettings, Coding, EncodeOptions, EncodedTensor, Encoding, FloatDtype, Group, Lattice,
    ResidualDtype, ScaleMode, TensorView,
};
use hypercodec_scalar::AffineParams;
use proptest::prelude::*;

/// An f32 dot product summed in another order (lanes, groups, chunks) and, for lattice rows,
/// through `RHT(x)` instead of `RHT⁻¹(q)`: a few hundred ulps of `‖w‖·‖x‖` at most.
const DOT_REL_TOL: f32 = 2e-5;
/// bfloat16 inputs and outputs: 8 bits of mantissa.
const BF16_REL_TOL: f32 = 1.0 / 64.0;

/// Gaussian-like values with a heavy tail and a few zeros.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            let g = ((u * 12.0) - 6.0) * 0.3;
            match i % 89 {
                0 => 0.0,
                11 => (g * 15.0) as f32,
                _ => g as f32,
            }
        })
        .collect()
}

fn lattice(l: Lattice, coding: Coding, cols: u64) -> Encoding {
    Encoding::Lattice {
        lattice: l,
        alpha: 5.0,
        tile: hypercodec_lattice::tile_for(cols as usize, 4096) as u32,
        seed: 3,
        scale_dtype: FloatDtype::F16,
        coding,
    }
}

fn affine(bits: u8, group: Group, symmetric: bool, scale_dtype: FloatDtype) -> Encoding {
    Encoding::affine(AffineParams {
        bits,
        group,
        symmetric,
        scale_dtype,
    })
}

/// Every encoding and the fast path it should take.
fn zoo(cols: u64) -> Vec<(Encoding, Option<Path>)> {
    let mut v: Vec<(Encoding, Option<Path>)> = FloatDtype::ALL
        .iter()
        .map(|&dtype| (Encoding::Raw { dtype }, Some(Path::Dense)))
        .collect();
    for (bits, group, symmetric, sd) in [
        (4, Group::Size(128), false, FloatDtype::F16),
        (4, Group::Size(16), true, FloatDtype::Bf16),
        (8, Group::Row, false, FloatDtype::F32),
        (8, Group::Tensor, true, FloatDtype::F16),
        (2, Group::Size(32), false, FloatDtype::F16),
        (1, Group::Row, true, FloatDtype::F16),
        (3, Group::Size(5), true, FloatDtype::F16),
        (3, Group::Size(128), false, FloatDtype::Bf16),
        (3, Group::Row, true, FloatDtype::F16),
        (6, Group::Size(32), true, FloatDtype::F16),
        (5, Group::Size(64), false, FloatDtype::F16),
        (5, Group::Size(12), true, FloatDtype::F16),
        (7, Group::Size(40), false, FloatDtype::Bf16),
        (6, Group::Row, false, FloatDtype::F16),
        (7, Group::Tensor, true, FloatDtype::F32),
    ] {
        v.push((affine(bits, group, symmetric, sd), None));
    }
    for bits in 2..=8 {
        v.push((
            lattice(Lattice::E8, Coding::Fixed { bits }, cols),
            Some(Path::E8Fixed { bits }),
        ));
    }
    v.push((
        lattice(Lattice::D4, Coding::Fixed { bits: 4 }, cols),
        Some(Path::LatticeWords),
    ));
    v.push((
        lattice(Lattice::Z1, Coding::Fixed { bits: 3 }, cols),
        Some(Path::LatticeWords),
    ));
    for l in Lattice::ALL {
        v.push((
            lattice(
                l,
                Coding::Rans {
                    chunk: 24,
                    lanes: 3,
                    prob_bits: 12,
                },
                cols,
            ),
            Some(Path::LatticeResident { coding: "rans" }),
        ));
        v.push((
            lattice(l, Coding::Rice { chunk: 40 }, cols),
            Some(Path::LatticeResident { coding: "rice" }),
        ));
    }
    v.push((
        lattice(Lattice::E8, Coding::RANS_DEFAULT, cols),
        Some(Path::LatticeResident { coding: "rans" }),
    ));
    // Prefix codes: pairs in one-block segments, 10-bit singles in two-block ones, chunks of
    // two row groups where a row is one segment; at a lower α (about 2.5 bits), since pair
    // coordinates beyond ±31 are refused and the test values have heavy tails.
    for (limit, pair_limit, segment) in [(8, 12, 1), (10, 0, 2)] {
        let coding = Coding::Prefix {
            limit,
            pair_limit,
            segment,
            span: if cols.div_ceil(32) <= segment as u64 {
                2
            } else {
                1
            },
        };
        let mut e = lattice(Lattice::E8, coding, cols);
        if let Encoding::Lattice { alpha, .. } = &mut e {
            *alpha = 1.5;
        }
        v.push((e, Some(Path::LatticeResident { coding: "prefix" })));
    }
    // Trellis codes where a row holds the state (cols·K ≥ L; f32 in their place otherwise, so
    // the zoo's length does not depend on the shape); short sequences, so rows hold several,
    // the last one longer.
    for (l, k, seq) in [
        (8u8, 2u8, 16u32),
        (10, 4, 1024),
        (12, 1, 24),
        (9, 3, 8),
        (16, 4, 16),
        (12, 3, 16),
        (16, 1, 16),
    ] {
        if cols * (k as u64) < l as u64 {
            v.push((
                Encoding::Raw {
                    dtype: FloatDtype::F32,
                },
                Some(Path::Dense),
            ));
        } else {
            let mut e = Encoding::trellis(
                l,
                k,
                hypercodec_lattice::tile_for(cols as usize, 4096) as u32,
                5,
            );
            if let Encoding::Trellis { seq: s, .. } = &mut e {
                *s = seq;
            }
            v.push((e, Some(Path::Trellis { l, k, v: 1 })));
        }
    }
    // Pairs (two values a state): rows of an even length that hold the state.
    for (l, k, seq) in [(12u8, 2u8, 1024u32), (16, 4, 16), (10, 3, 24)] {
        if cols.is_multiple_of(2) && cols * (k as u64) >= l as u64 {
            let mut e = Encoding::trellis_pairs(
                l,
                k,
                hypercodec_lattice::tile_for(cols as usize, 4096) as u32,
                6,
            );
            if let Encoding::Trellis { seq: s, .. } = &mut e {
                *s = seq;
            }
            v.push((e, Some(Path::Trellis { l, k, v: 2 })));
        }
    }
    v.push((
        lattice(Lattice::Z1, Coding::Fixed { bits: 8 }, cols),
        Some(Path::LatticeWords),
    ));
    // GPU-shaped rANS: chunks of whole rows, 32 lanes, 12-bit probabilities.
    v.push((
        lattice(Lattice::E8, Coding::RANS_GPU, cols).for_matrix(64, cols, 4096),
        Some(Path::LatticeResident { coding: "rans" }),
    ));
    // 32 lanes, chunks of 640 symbols: whole groups of 32 take the vector decoder (with AVX2),
    // E8's and the positional lattices', until fewer than 80 stream bytes are left; the rest
    // and partial groups the scalar one (the decoders' symbols are checked in hypercodec-rice;
    // here each lattice's product runs end to end on them).
    for l in Lattice::ALL {
        v.push((
            lattice(
                l,
                Coding::Rans {
                    chunk: 640,
                    lanes: 32,
                    prob_bits: 12,
                },
                cols,
            ),
            Some(Path::LatticeResident { coding: "rans" }),
        ));
    }
    v
}

/// The learned and nested encodings after the zoo: codebook packed / run-length, low-rank,
/// sparse, mixed, exceptions.
const EXTRA: usize = 6;

fn encode_any(x: &[f32], shape: &[u64], which: usize) -> (EncodedTensor, Option<Path>) {
    let cols = shape[1];
    let list = zoo(cols);
    let Some(extra) = which.checked_sub(list.len()) else {
        let (e, p) = &list[which];
        return (
            encode("w", x, shape, e, EncodeOptions::default()).unwrap(),
            *p,
        );
    };
    match extra {
        0 | 1 => {
            let mut t = codebook_template(4, 16, ScaleMode::Block, ResidualDtype::Int8);
            if extra == 1 {
                if let Encoding::Codebook { assignments, .. } = &mut t {
                    *assignments = Assignments::Rle;
                }
            }
            let settings = CodebookSettings {
                residual_k: Some(0.25),
                hdc: None,
                ..CodebookSettings::default()
            };
            let path = if extra == 0 {
                Path::CodebookLut
            } else {
                Path::DecodeTiles
            };
            (
                encode_codebook("w", x, shape, &t, &settings).unwrap(),
                Some(path),
            )
        }
        2 => (
            encode(
                "w",
                x,
                shape,
                &Encoding::LowRank {
                    rank: 3.min(shape[0].min(cols)) as u32,
                },
                EncodeOptions::default(),
            )
            .unwrap(),
            Some(Path::LowRank),
        ),
        3 => {
            let sparse: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, &v)| match (i % 5, v == 0.0) {
                    (0, true) => 1.0,
                    (0, false) => v,
                    _ => 0.0,
                })
                .collect();
            let count = sparse.iter().filter(|v| **v != 0.0).count() as u64;
            let e = Encoding::Sparse {
                count,
                dtype: FloatDtype::F16,
            };
            (
                encode("w", &sparse, shape, &e, EncodeOptions::default()).unwrap(),
                Some(Path::Sparse),
            )
        }
        4 => {
            let block_rows = 3u64;
            let parts: Vec<EncodedTensor> = (0..shape[0].div_ceil(block_rows))
                .map(|i| {
                    let r0 = i * block_rows;
                    let r = block_rows.min(shape[0] - r0);
                    let slice = &x[(r0 * cols) as usize..((r0 + r) * cols) as usize];
                    let e = &list[[3usize, 13, 16, 30][i as usize % 4] % list.len()].0;
                    encode("w", slice, &[r, cols], e, EncodeOptions::default()).unwrap()
                })
                .collect();
            (assemble_mixed(block_rows, &parts), Some(Path::Mixed))
        }
        _ => {
            let base = encode("w", x, shape, &list[9].0, EncodeOptions::default()).unwrap();
            let positions: Vec<u64> = (0..x.len() as u64).step_by(6).collect();
            let vals: Vec<f32> = positions.iter().map(|&p| x[p as usize] * 1.5).collect();
            (
                assemble_exceptions("w", &base, &positions, &vals, FloatDtype::F32).unwrap(),
                Some(Path::Exceptions),
            )
        }
    }
}

fn view_of<'a>(t: &'a EncodedTensor, shape: &[u64]) -> TensorView<'a> {
    let refs: Vec<(&str, &[u8])> = t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
    TensorView::new("w", &t.encoding, shape, &refs).unwrap()
}

/// Runs the operator and the reference on the same input and compares them.
fn check(
    t: &EncodedTensor,
    shape: &[u64],
    batch: usize,
    seed: u64,
    with_bias: bool,
) -> CompressedLinear {
    let view = view_of(t, shape);
    let (rows, cols) = (view.rows() as usize, view.cols() as usize);
    let bias: Option<Vec<f32>> = with_bias.then(|| values(rows, seed ^ 99));
    let op = CompressedLinear::new(view.clone(), bias.as_deref(), &LoadOptions::default()).unwrap();
    let x = values(batch * cols, seed);
    let mut y = vec![f32::NAN; batch * rows];
    op.forward(&x, batch, &mut y).unwrap();
    let want = reference::linear(&view, &x, batch, bias.as_deref()).unwrap();
    let scale = reference::norm_products(&view, &x, batch).unwrap();
    for i in 0..y.len() {
        let tol =
            DOT_REL_TOL * (scale[i] + bias.as_ref().map_or(0.0, |b| b[i % rows].abs())) + 1e-30;
        assert!(
            (y[i] - want[i]).abs() <= tol,
            "{} {shape:?} batch {batch} out {i}: {} vs {} (tol {tol})",
            op.path_detail(),
            y[i],
            want[i]
        );
    }
    op
}

proptest! {
    // 160 cases by default; PROPTEST_CASES=N for a longer run.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(160),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_path_matches_the_reference(
        rows in 1u64..40,
        cols in prop_oneof![1u64..12, 12u64..300, Just(512u64)],
        which in 0usize..(zoo(8).len() + EXTRA),
        batch in prop_oneof![Just(1usize), 2usize..17, 17usize..21],
        seed in any::<u64>(),
        bias in any::<bool>(),
    ) {
        let shape = [rows, cols];
        let x = values((rows * cols) as usize, seed);
        let (t, _) = encode_any(&x, &shape, which);
        check(&t, &shape, batch, seed ^ 1, bias);
    }
}

#[test]
fn each_encoding_takes_its_fast_path() {
    let shape = [24u64, 256];
    let x = values(24 * 256, 5);
    for which in 0..zoo(256).len() + EXTRA {
        let (t, want) = encode_any(&x, &shape, which);
        let op = check(&t, &shape, 1, 9, false);
        check(&t, &shape, 7, 9, true);
        check(&t, &shape, 33, 9, true);
        check(&t, &shape, 0, 9, true); // an empty batch (entropy-coded E8 panicked on it)
        let path = op.path();
        match want {
            Some(p) => assert_eq!(path, p, "{:?}", t.encoding),
            None => {
                let Encoding::Affine { bits, group, .. } = t.encoding else {
                    panic!()
                };
                // Fused where a group is whole lane words (8 codes of 3 bits, 4 of 5, 6 or 7,
                // 8/bits of the others) that start on a byte.
                let per = match bits {
                    3 => 8,
                    5..=7 => 4,
                    _ => 8 / bits as u64,
                };
                let whole = match group {
                    Group::Size(g) => {
                        let g = (g as u64).min(shape[1]);
                        g.is_multiple_of(per) && (g * bits as u64).is_multiple_of(8)
                    }
                    _ => true,
                };
                let expect = if whole {
                    Path::AffineFused { bits }
                } else {
                    Path::AffineUnpacked { bits }
                };
                assert_eq!(path, expect);
            }
        }
    }
}

#[test]
fn calibrated_trellis_rows_of_any_length_match_the_reference() {
    // Sequences of 16 values: whole rows take the doubled-stream GEMV; a row that is not a
    // multiple of 16 ends with a longer sequence, which takes the general one.
    for cols in [16u64, 31, 32, 40, 47, 48, 100, 256] {
        let shape = [5u64, cols];
        let x = values(5 * cols as usize, cols);
        let mut seen = 0;
        for which in 0..zoo(cols).len() {
            let (t, _) = encode_any(&x, &shape, which);
            if let Encoding::Trellis { seq: 16, .. } = t.encoding {
                check(&t, &shape, 1, cols ^ 3, true);
                check(&t, &shape, 3, cols ^ 5, false);
                seen += 1;
            }
        }
        assert!(seen >= 3, "{cols}: {seen} trellis codes of sequences of 16");
    }
}

#[test]
fn convolutions_run_on_their_matrix_view() {
    // A [out, in, kh, kw] kernel is the matrix [out, in·kh·kw]; a depthwise [C, 1, 3, 3] one too.
    for shape in [[16u64, 8, 3, 3], [32, 1, 3, 3], [24, 16, 1, 1]] {
        let n = shape.iter().product::<u64>() as usize;
        let x = values(n, 17);
        for which in [3, 16, 30] {
            let (t, _) = encode_any_shape(&x, &shape, which);
            let op = check(&t, &shape, 1, 4, false);
            assert_eq!(op.rows() as u64, shape[0]);
            assert_eq!(op.cols() as u64, shape[1..].iter().product::<u64>());
        }
    }
}

fn encode_any_shape(x: &[f32], shape: &[u64], which: usize) -> (EncodedTensor, Option<Path>) {
    let cols = shape[1..].iter().product::<u64>();
    let (e, p) = zoo(cols)[which].clone();
    (
        encode("w", x, shape, &e, EncodeOptions::default()).unwrap(),
        p,
    )
}

#[test]
fn bf16_activations_match_f32_within_bf16_rounding() {
    let shape = [40u64, 128];
    let x = values(40 * 128, 3);
    let (t, _) = encode_any(&x, &shape, 3);
    let view = view_of(&t, &shape);
    let op = CompressedLinear::new(view.clone(), None, &LoadOptions::default()).unwrap();
    let xs = values(2 * 128, 8);
    let xb: Vec<half::bf16> = xs.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let mut yb = vec![half::bf16::ZERO; 2 * 40];
    op.forward_bf16(&xb, 2, &mut yb).unwrap();
    let want = reference::linear(&view, &xs, 2, None).unwrap();
    let scale = reference::norm_products(&view, &xs, 2).unwrap();
    for i in 0..yb.len() {
        assert!((yb[i].to_f32() - want[i]).abs() <= BF16_REL_TOL * scale[i] + 1e-6);
    }
}

#[test]
fn load_time_fixed_rate_conversion_is_measured() {
    let shape = [48u64, 256];
    let x = values(48 * 256, 21);
    let e = lattice(Lattice::E8, Coding::RANS_DEFAULT, 256);
    let t = encode("w", &x, &shape, &e, EncodeOptions::default()).unwrap();
    let view = view_of(&t, &shape);
    // Wide enough for every point: nothing is clipped.
    let wide = CompressedLinear::new(
        view.clone(),
        None,
        &LoadOptions {
            fixed_bits: Some(8),
        },
    )
    .unwrap();
    assert_eq!(wide.path(), Path::E8Fixed { bits: 8 });
    assert_eq!(wide.conversion_snr_db(), Some(f64::INFINITY));
    // Narrow: clipped, and the SNR says by how much.
    let narrow = CompressedLinear::new(
        view.clone(),
        None,
        &LoadOptions {
            fixed_bits: Some(3),
        },
    )
    .unwrap();
    let snr = narrow.conversion_snr_db().unwrap();
    assert!(snr.is_finite() && snr > 0.0, "{snr}");
    // The converted operator computes with the converted weight: within the clipping error.
    let xs = values(256, 2);
    let (mut a, mut b) = (vec![0f32; 48], vec![0f32; 48]);
    wide.forward(&xs, 1, &mut a).unwrap();
    let want = reference::linear(&view, &xs, 1, None).unwrap();
    let scale = reference::norm_products(&view, &xs, 1).unwrap();
    for i in 0..48 {
        assert!((a[i] - want[i]).abs() <= DOT_REL_TOL * scale[i] + 1e-30);
    }
    narrow.forward(&xs, 1, &mut b).unwrap();
    assert!(a.iter().zip(&b).any(|(p, q)| p != q));
    // Not for affine tensors.
    let (t, _) = encode_any(&x, &shape, 3);
    let err = CompressedLinear::new(
        view_of(&t, &shape),
        None,
        &LoadOptions {
            fixed_bits: Some(4),
        },
    );
    assert!(matches!(err, Err(RuntimeError::Option { .. })));
    // For a whole model: kept for the entropy-coded lattice tensor, dropped for the others.
    let four = LoadOptions {
        fixed_bits: Some(4),
    };
    assert_eq!(four.for_tensor(&view), four);
    assert_eq!(
        four.for_tensor(&view_of(&t, &shape)),
        LoadOptions::default()
    );
}

#[test]
fn a_small_rans_layer_holds_tables_for_its_symbols_not_for_2_to_the_14() {
    // 64×64 at 4 bits: 14-bit probabilities held 298 KB of decode tables for 2 KB of codes
    // (16 KB as f32); its 4096 symbols are modelled at 11 bits.
    let shape = [64u64, 64];
    let x = values(64 * 64, 5);
    let t = encode(
        "w",
        &x,
        &shape,
        &lattice(Lattice::E8, Coding::RANS_DEFAULT, 64),
        EncodeOptions::default(),
    )
    .unwrap();
    assert!(matches!(
        t.encoding,
        Encoding::Lattice {
            coding: Coding::Rans { prob_bits: 11, .. },
            ..
        }
    ));
    let op =
        CompressedLinear::from_encoded("w", &t, &shape, None, &LoadOptions::default()).unwrap();
    assert!(op.held_bytes() < 48 << 10, "{}", op.held_bytes());
    let mut y = vec![0f32; 64];
    op.forward(&x[..64], 1, &mut y).unwrap();
    assert!(y.iter().all(|v| v.is_finite()));
}

#[test]
fn held_bytes_stay_within_five_percent_of_the_stored_bytes() {
    let shape = [256u64, 1024];
    let x = values(256 * 1024, 4);
    for e in [
        affine(4, Group::Size(128), false, FloatDtype::F16),
        lattice(Lattice::E8, Coding::Fixed { bits: 4 }, 1024),
        lattice(Lattice::E8, Coding::RANS_DEFAULT, 1024),
    ] {
        let t = encode("w", &x, &shape, &e, EncodeOptions::default()).unwrap();
        // The model's precision as written (`Encoding::sized_for`).
        let e = t.encoding.clone();
        let op =
            CompressedLinear::from_encoded("w", &t, &shape, None, &LoadOptions::default()).unwrap();
        let stored = t.payload_bytes();
        let held = op.held_bytes();
        // rANS: plus the decode tables of its model, a fixed size per tensor (2^prob_bits
        // slots of 6 bytes per context: 288 KB for E8 at 14 bits, 3.5 % of a 4096² tensor).
        let tables = match e {
            Encoding::Lattice {
                coding: Coding::Rans { prob_bits, .. },
                ..
            } => (3 * 6) << prob_bits,
            _ => 0,
        };
        assert!(
            held >= stored / 2 && held as f64 <= 1.05 * stored as f64 + tables as f64,
            "{e:?}: {held} vs {stored}"
        );
    }
}

#[test]
fn row_lookups_equal_the_decoded_rows() {
    let shape = [40u64, 96];
    let x = values(40 * 96, 8);
    for which in [3, 16, 30, zoo(96).len() + 4, zoo(96).len() + 5] {
        let (t, _) = encode_any(&x, &shape, which);
        let op =
            CompressedLinear::from_encoded("w", &t, &shape, None, &LoadOptions::default()).unwrap();
        let whole = op.decode_weight().unwrap();
        let ids = [7usize, 0, 39, 7, 21];
        let mut got = vec![0f32; ids.len() * 96];
        op.decode_rows(&ids, &mut got).unwrap();
        for (k, &r) in ids.iter().enumerate() {
            assert_eq!(
                &got[k * 96..(k + 1) * 96],
                &whole[r * 96..(r + 1) * 96],
                "{which}"
            );
        }
        assert!(matches!(
            op.decode_rows(&[40], &mut got[..96]),
            Err(RuntimeError::RowIndex {
                index: 40,
                rows: 40
            })
        ));
    }
}

#[test]
fn bad_shapes_are_typed_errors() {
    let shape = [8u64, 64];
    let x = values(8 * 64, 1);
    let (t, _) = encode_any(&x, &shape, 3);
    let op =
        CompressedLinear::from_encoded("w", &t, &shape, None, &LoadOptions::default()).unwrap();
    let mut y = vec![0f32; 8];
    assert!(matches!(
        op.forward(&x[..63], 1, &mut y),
        Err(RuntimeError::Length { what: "x", .. })
    ));
    assert!(matches!(
        op.forward(&x[..64], 1, &mut y[..7]),
        Err(RuntimeError::Length { what: "y", .. })
    ));
    let bias =
        CompressedLinear::from_encoded("w", &t, &shape, Some(&[0.0; 7]), &LoadOptions::default());
    assert!(matches!(
        bias,
        Err(RuntimeError::Length { what: "bias", .. })
    ));
    let v = encode(
        "b",
        &x[..64],
        &[64],
        &Encoding::Raw {
            dtype: FloatDtype::F32,
        },
        EncodeOptions::default(),
    )
    .unwrap();
    let err = CompressedLinear::from_encoded("b", &v, &[64], None, &LoadOptions::default());
    assert!(matches!(err, Err(RuntimeError::NotAMatrix { .. })));
}

#[test]
fn batches_whose_lengths_overflow_are_typed_errors() {
    // batch · 64 wraps to 64 at 2^58 + 1: the length checks passed, and the fast paths
    // returned Ok without writing y (or indexed past x).
    let shape = [64u64, 64];
    let x = values(64 * 64, 2);
    let batch = (1usize << 58) + 1;
    for which in [0, 3, 9] {
        let (t, _) = encode_any(&x, &shape, which);
        let op =
            CompressedLinear::from_encoded("w", &t, &shape, None, &LoadOptions::default()).unwrap();
        let mut y = vec![f32::NAN; 64];
        assert!(matches!(
            op.forward(&x[..64], batch, &mut y),
            Err(RuntimeError::Overflow { what: "x", .. })
        ));
        let xb = vec![half::bf16::ZERO; 64];
        let mut yb = vec![half::bf16::ZERO; 64];
        assert!(matches!(
            op.forward_bf16(&xb, batch, &mut yb),
            Err(RuntimeError::Overflow { .. })
        ));
        let view = view_of(&t, &shape);
        assert!(matches!(
            crate::reference::linear(&view, &x[..64], batch, None),
            Err(RuntimeError::Overflow { .. })
        ));
        // The reference checks the bias (and the norms their x) instead of indexing past them.
        assert!(matches!(
            crate::reference::linear(&view, &x[..64], 1, Some(&[0.0; 3])),
            Err(RuntimeError::Length { what: "bias", .. })
        ));
        assert!(matches!(
            crate::reference::norm_products(&view, &x[..10], 1),
            Err(RuntimeError::Length { what: "x", .. })
        ));
    }
    // The dense baseline (safe, over an unsafe GEMM) checks every buffer.
    let w = values(256 * 256, 3);
    let mut y = vec![0f32; 4];
    for (w_, x_, y_) in [
        (&w[..0], &w[..1024], 1024usize),
        (&w[..], &w[..1023], 1024),
        (&w[..], &w[..1024], 4),
    ] {
        let mut yy = vec![0f32; y_];
        assert!(crate::bench::dense(w_, 256, 256, x_, 4, &mut yy).is_err());
    }
    assert!(crate::bench::dense(&w, 256, 256, &w[..1024], 4, &mut y).is_err());
    let mut y = vec![0f32; 1024];
    crate::bench::dense(&w, 256, 256, &w[..1024], 4, &mut y).unwrap();
}

#[test]
fn a_codebook_index_past_the_prototypes_is_an_error() {
    let shape = [16u64, 64];
    let x = values(16 * 64, 2);
    let t = codebook_template(4, 16, ScaleMode::Tensor, ResidualDtype::Int8);
    let mut t = encode_codebook(
        "w",
        &x,
        &shape,
        &t,
        &CodebookSettings {
            residual_k: Some(0.0),
            ..CodebookSettings::default()
        },
    )
    .unwrap();
    // 16 prototypes need 4-bit indices: every index is valid, so shrink the codebook instead.
    if let Encoding::Codebook { prototypes, .. } = &mut t.encoding {
        assert_eq!(*prototypes, 16);
    }
    let assignments = t
        .streams
        .iter_mut()
        .find(|(r, _)| *r == "assignments")
        .unwrap();
    assignments.1.iter_mut().for_each(|b| *b = 0xFF);
    let protos = t
        .streams
        .iter_mut()
        .find(|(r, _)| *r == "prototypes")
        .unwrap();
    let keep = protos.1.len() * 9 / 16;
    protos.1.truncate(keep);
    if let Encoding::Codebook { prototypes, .. } = &mut t.encoding {
        *prototypes = 9;
    }
    let refs: Vec<(&str, &[u8])> = t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
    // Validation parses the codebook but leaves index ranges to the decoders: the operator
    // meets the bad index at run time.
    let view = TensorView::new("w", &t.encoding, &shape, &refs).unwrap();
    let op = CompressedLinear::new(view, None, &LoadOptions::default()).unwrap();
    let mut y = vec![0f32; 16];
    let err = op.forward(&x[..64], 1, &mut y);
    assert!(matches!(err, Err(RuntimeError::Corrupt { .. })), "{err:?}");
}

#[test]
fn empty_matrices_run_and_give_empty_or_zero_outputs() {
    // [0, 8]: no outputs; [8, 0]: every output is the bias (an empty dot product).
    for (shape, which) in [([0u64, 8], 0usize), ([8, 0], 0), ([0, 8], 3), ([8, 0], 3)] {
        let n = (shape[0] * shape[1]) as usize;
        let Ok((t, _)) = std::panic::catch_unwind(|| encode_any(&values(n, 1), &shape, which))
        else {
            continue; // the encoder refuses this shape: nothing to run
        };
        // hwz's matrix view of [8, 0] has no rows (it counts them by values); the operator
        // takes them from the shape.
        let rows = shape[0] as usize;
        let bias = vec![0.5f32; rows];
        let op =
            CompressedLinear::from_encoded("w", &t, &shape, Some(&bias), &LoadOptions::default())
                .unwrap();
        assert_eq!(op.rows(), rows);
        for batch in [1usize, 3, 20] {
            let x = vec![1.0f32; batch * op.cols()];
            let mut y = vec![f32::NAN; batch * rows];
            op.forward(&x, batch, &mut y).unwrap();
            assert!(
                y.iter().all(|&v| v == 0.5),
                "{shape:?} {which} batch {batch}: {y:?}"
            );
        }
    }
}

#[test]
fn huge_and_tiny_weights_stay_finite_and_match_the_reference() {
    // Values near f32's range ends (1e30, 1e-30) through raw f32 and INT8 with f32 scales.
    let shape = [8u64, 64];
    for scale in [1e30f32, 1e-30] {
        let x: Vec<f32> = values(8 * 64, 2).iter().map(|v| v * scale).collect();
        for which in [0usize, 5] {
            let (t, _) = encode_any(&x, &shape, which);
            let op = check(&t, &shape, 1, 5, false);
            check(&t, &shape, 20, 5, false);
            assert!(op.decode_weight().unwrap().iter().all(|v| v.is_finite()));
        }
    }
    // f16 scales cannot hold 1e30 or 1e-30: the encoder stores bf16 ones, which run.
    for scale in [1e30f32, 1e-30] {
        let x: Vec<f32> = values(8 * 64, 2).iter().map(|v| v * scale).collect();
        let e = &zoo(64)[3].0;
        let t = encode("w", &x, &shape, e, EncodeOptions::default()).unwrap();
        assert_eq!(t.encoding.scale_dtype(), Some(FloatDtype::Bf16));
        let op = check(&t, &shape, 3, 5, false);
        assert!(op.decode_weight().unwrap().iter().all(|v| v.is_finite()));
    }
}

/// Weights within a few powers of two of f32's range: a fused affine row's scale and offset
/// terms are each past f32's range where their sum is not (they cancel). They came out as
/// NaN or ±inf at batches the fused kernels take, and right through decode + GEMM.
#[test]
fn affine_rows_whose_terms_overflow_f32_but_cancel_stay_finite() {
    let (rows, cols) = (6usize, 128usize);
    let w: Vec<f32> = values(rows * cols, 8).iter().map(|v| v * 1e36).collect();
    let x = vec![1f32; 16 * cols];
    for (bits, group, symmetric) in [
        (4, Group::Size(128), false),
        (4, Group::Size(64), false),
        (8, Group::Size(128), false),
        (2, Group::Size(128), false),
        (4, Group::Size(128), true),
    ] {
        let e = affine(bits, group, symmetric, FloatDtype::F32);
        let shape = [rows as u64, cols as u64];
        let t = encode("w", &w, &shape, &e, EncodeOptions::default()).unwrap();
        let view = view_of(&t, &shape);
        let op = CompressedLinear::new(view.clone(), None, &LoadOptions::default()).unwrap();
        let dec = op.decode_weight().unwrap();
        for batch in [1usize, 3, 8, 16] {
            let mut y = vec![f32::NAN; batch * rows];
            op.forward(&x[..batch * cols], batch, &mut y).unwrap();
            for (i, &got) in y.iter().enumerate() {
                let r = i % rows;
                let want: f64 = dec[r * cols..(r + 1) * cols]
                    .iter()
                    .map(|&v| f64::from(v))
                    .sum();
                let norm: f64 = dec[r * cols..(r + 1) * cols]
                    .iter()
                    .map(|&v| f64::from(v).abs())
                    .sum();
                assert!(
                    got.is_finite() && (f64::from(got) - want).abs() <= 1e-5 * norm,
                    "{bits} bits {group:?} sym {symmetric} batch {batch} out {i}: {got} vs {want} ({})",
                    op.path_detail()
                );
            }
        }
    }
}

/// A tensor of no rows has no device form (nothing to run), whatever its encoding; the
/// tensor-scaled grid it falls back to stores no scale, which the form used to try to read.
#[test]
fn empty_tensors_have_no_device_form() {
    let shape = [0u64, 512];
    for which in 0..zoo(512).len() {
        let (t, _) = encode_any(&[], &shape, which);
        let op = CompressedLinear::new(view_of(&t, &shape), None, &LoadOptions::default()).unwrap();
        assert!(op.device_form().unwrap().is_none(), "zoo entry {which}");
    }
}

/// The device form's contract (what `hypercodec-kernels-cuda` computes), decoded here on the
/// host: affine `s·(qmul·q − qbias) + lo` per group, and E8 words scaled per row in the RHT
/// domain; both must give the weight the operator decodes.
#[test]
fn device_forms_decode_to_the_stored_weight() {
    use crate::DeviceForm;
    use hypercodec_lattice::Rht;
    let mut seen = [0usize; 8];
    for shape in [[7u64, 100], [5, 256], [3, 8], [21, 64]] {
        let (rows, cols) = (shape[0] as usize, shape[1] as usize);
        let x = values(rows * cols, 41);
        for which in 0..zoo(shape[1]).len() + EXTRA {
            let (t, _) = encode_any(&x, &shape, which);
            let op =
                CompressedLinear::new(view_of(&t, &shape), None, &LoadOptions::default()).unwrap();
            let want = op.decode_weight().unwrap();
            let Some(form) = op.device_form().unwrap() else {
                continue;
            };
            match form {
                DeviceForm::Affine {
                    codes,
                    scales,
                    offsets,
                    scale_dtype,
                    bits,
                    group_len,
                    scales_per_row,
                    qmul,
                    qbias,
                } => {
                    seen[0] += 1;
                    // Every scale and offset converts back to the stored type exactly.
                    for &v in scales.iter().chain(&offsets) {
                        assert_eq!(scale_dtype.round(v), v, "{v} as {scale_dtype:?}");
                    }
                    for r in 0..rows {
                        for j in 0..cols {
                            let bit = (r * cols + j) * bits as usize;
                            let two = codes[bit / 8] as u32
                                | codes.get(bit / 8 + 1).map_or(0, |&b| (b as u32) << 8);
                            let q = ((two >> (bit % 8)) & ((1 << bits) - 1)) as f32;
                            let si = if scales_per_row == 0 {
                                0
                            } else {
                                r * scales_per_row + j / group_len
                            };
                            let lo = offsets.get(si).copied().unwrap_or(0.0);
                            let w = scales[si] * (qmul * q - qbias) + lo;
                            let e = want[r * cols + j];
                            assert!(
                                (w - e).abs() <= 1e-6 * e.abs().max(1e-3),
                                "{} ({r}, {j}): {w} vs {e}",
                                op.path_detail()
                            );
                        }
                    }
                }
                DeviceForm::Trellis {
                    bits,
                    row_bytes,
                    row_scales,
                    l,
                    k,
                    seq,
                    c1,
                    c0,
                    v,
                    tile,
                    seed,
                } => {
                    // The kernels' rule, written out: value t of a sequence of n values is
                    // c1·sum(state) + c0, state the L bits of the circular stream ending with
                    // its K bits; with pairs, values 2i and 2i+1 share the state ending with
                    // value 2i+1's bits and take its first and second byte sums.
                    seen[2] += 1;
                    seen[5] += (v == 2) as usize;
                    let rht = Rht::new(cols, tile, seed).unwrap();
                    let (l, k) = (l as usize, k as usize);
                    for r in 0..rows {
                        let mut rotated = want[r * cols..(r + 1) * cols].to_vec();
                        rht.forward(&mut rotated);
                        let row = &bits[r * row_bytes..(r + 1) * row_bytes];
                        for q in hypercodec_trellis::row_sequences(cols, seq) {
                            let n = q.len();
                            let bit = |p: usize| {
                                (row[(q.start * k + p) / 8] >> ((q.start * k + p) % 8)) & 1
                            };
                            for t in 0..n {
                                let end = (if v == 2 { t | 1 } else { t } + 1) * k;
                                let mut state = 0u32;
                                for j in 0..l {
                                    let p = (end + 2 * n * k - l + j) % (n * k);
                                    state |= (bit(p) as u32) << j;
                                }
                                let sum = if v == 2 {
                                    hypercodec_trellis::pair_sums(state)[t & 1]
                                } else {
                                    hypercodec_trellis::code_sum(state)
                                };
                                let got = row_scales[r] * (c1 * sum as f32 + c0);
                                let e = rotated[q.start + t];
                                assert!(
                                    (got - e).abs() <= 1e-4 * (1.0 + e.abs()),
                                    "trellis ({r}, {}): {got} vs {e}",
                                    q.start + t
                                );
                            }
                        }
                    }
                }
                DeviceForm::E8Rans {
                    payload,
                    index,
                    slots,
                    prob_bits,
                    chunk,
                    row_scales,
                    words,
                    tile,
                    seed,
                } => {
                    // The kernel's loop (kernels/gemv.cu, hc_e8_rans), written out: 32 lanes
                    // per step, the word's coset bit from its first lane's byte, words read in
                    // lane order, each value doubled: 2s + c, or 2(2t + parity) + c at
                    // position 0 (its byte is 2t + c).
                    seen[3] += 1;
                    let pb = prob_bits as u32;
                    let spr = 8 * words;
                    let u16s: Vec<u32> = payload
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
                        .collect();
                    let idx: Vec<u32> = index
                        .chunks_exact(4)
                        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    let n = rows * spr;
                    let chunks = n.div_ceil(chunk);
                    let mut doubled = vec![0i32; n];
                    for c in 0..chunks {
                        let e = &idx[c * 33..];
                        let end = if c + 1 < chunks {
                            e[33] as usize
                        } else {
                            u16s.len()
                        };
                        let mut x = e[1..33].to_vec();
                        let mut pos = e[0] as usize;
                        for st in (c * chunk..((c + 1) * chunk).min(n)).step_by(32) {
                            let slot: Vec<usize> =
                                x.iter().map(|v| (v & ((1 << pb) - 1)) as usize).collect();
                            let first: Vec<u32> = (0..32).map(|l| slots[slot[l & 24]]).collect();
                            let ent: Vec<u32> = (0..32)
                                .map(|l| {
                                    let cs = (first[l & 24] >> 24) & 1;
                                    if l & 7 == 0 {
                                        first[l]
                                    } else {
                                        slots[((1 + cs as usize) << pb) + slot[l]]
                                    }
                                })
                                .collect();
                            for l in 0..32 {
                                let en = ent[l];
                                x[l] = (((en >> 12) & 0xFFF) + 1) * (x[l] >> pb) + (en & 0xFFF);
                                if x[l] < 1 << 16 {
                                    x[l] = x[l] << 16 | if pos < end { u16s[pos] } else { 0 };
                                    pos += 1;
                                }
                            }
                            let byte = |l: usize| (ent[l] as i32) >> 24;
                            for l in 0..32 {
                                let cs = byte(l & 24) & 1;
                                let (lc, par, coset) = if l & 7 == 0 {
                                    let par = (1..8).map(|q| byte(l + q) & 1).sum::<i32>() & 1;
                                    (l + 7, par, -1)
                                } else {
                                    ((l & 24) + (l & 7) - 1, 0, 1)
                                };
                                doubled[st + lc] = 2 * (byte(l) + par) + cs * coset;
                            }
                        }
                        // Every word read (the last chunk may be followed by zero padding).
                        assert!(pos == end || (c + 1 == chunks && pos <= end), "chunk {c}");
                    }
                    let rht = Rht::new(cols, tile, seed).unwrap();
                    for r in 0..rows {
                        let mut rotated = want[r * cols..(r + 1) * cols].to_vec();
                        rht.forward(&mut rotated);
                        for (j, &e) in rotated.iter().enumerate() {
                            let got = 0.5 * row_scales[r] * doubled[r * spr + j] as f32;
                            assert!(
                                (got - e).abs() <= 1e-4 * (1.0 + e.abs()),
                                "e8 rans ({r}, {j}): {got} vs {e}"
                            );
                        }
                    }
                }
                DeviceForm::E8Prefix {
                    payload,
                    starts,
                    table,
                    limit,
                    pair_limit,
                    segment,
                    span,
                    row_scales,
                    words,
                    tile,
                    seed,
                } => {
                    // The kernels' walk (kernels/e8_prefix.cuh), written out: per chunk of `span`
                    // groups of eight rows, 32 lanes with a bit buffer each, kept from group to
                    // group; at each refill check the lanes
                    // holding fewer than 32 bits take the chunk's next words in lane order;
                    // each unit is one lookup of the table, whose entry is the doubled
                    // coordinate as f32 bits (code length in bits 0–4, parity in bit 5).
                    seen[6] += 1;
                    let w32: Vec<u32> = payload
                        .chunks_exact(4)
                        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    let (l, lp) = (limit as u32, pair_limit as u32);
                    // Units of a word between checks.
                    let groups: Vec<Vec<usize>> = if lp > 0 {
                        vec![vec![0, 1], vec![2, 3, 4]]
                    } else {
                        let g = (32 / l) as usize;
                        (0..8)
                            .step_by(g)
                            .map(|a| (a..(a + g).min(8)).collect())
                            .collect()
                    };
                    let blocks = words / 4;
                    let segs = blocks.div_ceil(segment);
                    let mut doubled = vec![0f32; rows * 8 * words];
                    let groups_n = rows.div_ceil(8);
                    seen[7] += (span > 1 && groups_n > 1) as usize;
                    for c in 0..groups_n.div_ceil(span) * segs {
                        let (sp, s0) = (c / segs, c % segs);
                        let (mut at, end) = (starts[c] as usize, starts[c + 1] as usize);
                        let (mut buf, mut have) = ([0u64; 32], [0u32; 32]);
                        let steps = segment.min(blocks - s0 * segment);
                        let span_groups = sp * span..((sp + 1) * span).min(groups_n);
                        for (g, t) in span_groups.flat_map(|g| (0..steps).map(move |t| (g, t))) {
                            let (mut e0, mut par) = ([0u32; 32], [0u32; 32]);
                            let mut vals = [[0f32; 8]; 32];
                            for units in &groups {
                                for lane in (0..32).filter(|&n| g * 8 + n / 4 < rows) {
                                    if have[lane] < 32 {
                                        let w = if at < end { w32[at] } else { 0 };
                                        at += 1;
                                        buf[lane] |= (w as u64) << (32 - have[lane]);
                                        have[lane] += 32;
                                    }
                                }
                                for lane in (0..32).filter(|&n| g * 8 + n / 4 < rows) {
                                    let (b, h) = (&mut buf[lane], &mut have[lane]);
                                    // The entry the buffer's top `bits` bits index from
                                    // `base`, its code consumed.
                                    let mut look = |base: usize, bits: u32, width: usize| {
                                        let i = base + width * (*b >> (64 - bits)) as usize;
                                        *b <<= table[i] & 31;
                                        *h -= table[i] & 31;
                                        i
                                    };
                                    let v = &mut vals[lane];
                                    for &u in units {
                                        // The word's coset: bit 5 of its first entry.
                                        let cs = ((e0[lane] >> 5) & 1) as usize;
                                        let e = if u == 0 {
                                            e0[lane] = table[look(0, l, 1)];
                                            continue;
                                        } else if lp > 0 && u < 4 {
                                            let i = look(768 + (cs << (lp + 1)), lp, 2);
                                            v[2 * u - 1] = f32::from_bits(table[i + 1]);
                                            v[2 * u - 2] = f32::from_bits(table[i] & !63);
                                            table[i]
                                        } else {
                                            let e = table[look((1 + cs) << l, l, 1)];
                                            v[if lp > 0 { 6 } else { u - 1 }] =
                                                f32::from_bits(e & !63);
                                            e
                                        };
                                        par[lane] ^= e;
                                    }
                                }
                            }
                            for lane in (0..32).filter(|&n| g * 8 + n / 4 < rows) {
                                let mut v = vals[lane];
                                v[7] = f32::from_bits(e0[lane] & !63)
                                    + if par[lane] & 32 != 0 { 2.0 } else { 0.0 };
                                let (r, wd) = (g * 8 + lane / 4, (s0 * segment + t) * 4 + lane % 4);
                                doubled[(r * words + wd) * 8..][..8].copy_from_slice(&v);
                            }
                        }
                        // Every stored word is read (the last chunk may be followed by padding).
                        assert!(at >= end, "chunk {c}: {at} of {end} words read");
                    }
                    let rht = Rht::new(cols, tile, seed).unwrap();
                    for r in 0..rows {
                        let mut rotated = want[r * cols..(r + 1) * cols].to_vec();
                        rht.forward(&mut rotated);
                        for (j, &e) in rotated.iter().enumerate() {
                            let got = 0.5 * row_scales[r] * doubled[r * 8 * words + j];
                            assert!(
                                (got - e).abs() <= 1e-4 * (1.0 + e.abs()),
                                "e8 prefix ({r}, {j}): {got} vs {e}"
                            );
                        }
                    }
                }
                DeviceForm::Z1Fixed {
                    packed,
                    row_scales,
                    bits,
                    tile,
                    seed,
                } => {
                    seen[4] += 1;
                    let rht = Rht::new(cols, tile, seed).unwrap();
                    let b = bits as usize;
                    for r in 0..rows {
                        let mut rotated = want[r * cols..(r + 1) * cols].to_vec();
                        rht.forward(&mut rotated);
                        for (j, &e) in rotated.iter().enumerate() {
                            let bit = (r * cols + j) * b;
                            let two = packed[bit / 8] as u32
                                | packed.get(bit / 8 + 1).map_or(0, |&v| (v as u32) << 8);
                            let sym = ((two >> (bit % 8)) & ((1 << b) - 1)) as i32;
                            let got = row_scales[r] * (sym - (1 << (b - 1))) as f32;
                            assert!(
                                (got - e).abs() <= 1e-4 * (1.0 + e.abs()),
                                "z1-fixed{bits} ({r}, {j}): {got} vs {e}"
                            );
                        }
                    }
                }
                DeviceForm::E8Fixed {
                    packed,
                    row_scales,
                    words,
                    bits,
                    tile,
                    seed,
                } => {
                    seen[1] += 1;
                    let rht = Rht::new(cols, tile, seed).unwrap();
                    let b = bits as usize;
                    for r in 0..rows {
                        let mut rotated = want[r * cols..(r + 1) * cols].to_vec();
                        rht.forward(&mut rotated);
                        rotated.resize(8 * words, 0.0);
                        for w in 0..words {
                            let at = (r * words + w) * b;
                            let mut v = 0u64;
                            for (i, &byte) in packed[at..at + b].iter().enumerate() {
                                v |= (byte as u64) << (8 * i);
                            }
                            let syms: Vec<u32> = (0..8)
                                .map(|i| ((v >> (i * b)) & ((1 << b) - 1)) as u32)
                                .collect();
                            let mut p = [0f32; 8];
                            Lattice::E8.decode_word_fixed(&syms, bits, &mut p);
                            // Padding coordinates meet zeros of x' (their points are free).
                            for i in 0..8.min(cols.saturating_sub(8 * w)) {
                                let got = row_scales[r] * p[i];
                                let e = rotated[8 * w + i];
                                assert!(
                                    (got - e).abs() <= 1e-4 * (1.0 + e.abs()),
                                    "e8-fixed{bits} ({r}, word {w}, {i}): {got} vs {e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        seen[0] >= 30
            && seen[1] >= 21
            && seen[2] >= 8
            && seen[3] >= 1
            && seen[4] >= 3
            && seen[5] >= 1
            && seen[6] >= 2
            && seen[7] >= 1,
        "{seen:?}"
    );
}

#[test]
fn fixed_rate_conversion_rescales_rows_coded_with_the_tensor_step() {
    // Rows whose RMS spans 1/8 to 8, entropy-coded with one step for all rows (the default):
    // the big rows do not fit a fixed box sized for their own RMS at the tensor's step.
    let (rows, cols) = (64usize, 256usize);
    let mut x = values(rows * cols, 31);
    for (r, row) in x.chunks_exact_mut(cols).enumerate() {
        let k = 2f32.powf((r % 7) as f32 - 3.0);
        row.iter_mut().for_each(|v| *v *= k);
    }
    let shape = [rows as u64, cols as u64];
    let e = lattice(Lattice::E8, Coding::RANS_DEFAULT, 256);
    let t =
        hypercodec_hwz::encode_to_rate("w", &x, &shape, &e, 4.0, EncodeOptions::default()).unwrap();
    let op = CompressedLinear::new(
        view_of(&t, &shape),
        None,
        &LoadOptions {
            fixed_bits: Some(4),
        },
    )
    .unwrap();
    // Rescaled to its own RMS at the fixed form's α, each row reaches about the fixed-rate
    // calibration (20.8 dB measured; kept at the entropy-coded α the big rows clip: 12.7 dB).
    let snr = op.conversion_snr_db().unwrap();
    assert!(snr > 18.0, "{snr}");
}

/// A layer with no inputs (`nn.Linear(0, 8)`, a convolution of 0 channels): its rows come from
/// the shape, and every output is the bias, or 0, whatever the encoding.
#[test]
fn a_matrix_without_columns_keeps_its_rows_and_gives_its_bias() {
    let bias: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
    for shape in [vec![8u64, 0], vec![8, 0, 3, 3]] {
        for e in [
            Encoding::Raw {
                dtype: FloatDtype::Bf16,
            },
            affine(4, Group::Size(128), false, FloatDtype::F16),
            lattice(Lattice::E8, Coding::RANS_DEFAULT, 0),
        ] {
            let t = encode("w", &[], &shape, &e, EncodeOptions::default()).unwrap();
            for b in [Some(&bias[..]), None] {
                let op =
                    CompressedLinear::new(view_of(&t, &shape), b, &LoadOptions::default()).unwrap();
                assert_eq!((op.rows(), op.cols()), (8, 0), "{}", e.label());
                let mut y = vec![f32::NAN; 3 * 8];
                op.forward(&[], 3, &mut y).unwrap();
                let want: Vec<f32> = (0..3)
                    .flat_map(|_| (0..8).map(|i| b.map_or(0.0, |b| b[i])))
                    .collect();
                assert_eq!(y, want);
                let view = view_of(&t, &shape);
                assert_eq!(crate::reference::linear(&view, &[], 3, b).unwrap(), want);
                assert!(op.decode_weight().unwrap().is_empty());
                assert!(op.device_form().unwrap().is_none());
                assert!(op.decode_rows(&[9], &mut []).is_err());
            }
            // A bias of the wrong length is still refused.
            assert!(CompressedLinear::new(
                view_of(&t, &shape),
                Some(&bias[..3]),
                &LoadOptions::default()
            )
            .is_err());
        }
    }
}

/// The GPU form of rANS chunks is read by kernels that cannot report corruption as they go:
/// a chunk table whose offsets run backwards or past the payload, or a lane state below the
/// coder's range, is refused when the form is taken (the host decoder would meet it later).
#[test]
fn a_corrupt_rans_chunk_table_is_refused_before_the_gpu_sees_it() {
    let shape = [64u64, 256];
    let x = values(64 * 256, 7);
    let e = lattice(Lattice::E8, Coding::RANS_GPU, 256).for_matrix(64, 256, 4096);
    let t = encode("w", &x, &shape, &e, EncodeOptions::default()).unwrap();
    // The GPU shape puts these 64 rows in one chunk; chunks of 4 rows give a table to corrupt.
    let e4 = e.with_row_aligned_chunks(256, 4);
    let t4 = encode("w", &x, &shape, &e4, EncodeOptions::default()).unwrap();
    for t in [&t, &t4] {
        let op =
            CompressedLinear::from_encoded("w", t, &shape, None, &LoadOptions::default()).unwrap();
        assert!(matches!(
            op.device_form().unwrap(),
            Some(crate::DeviceForm::E8Rans { .. })
        ));
    }
    let index = |t: &EncodedTensor| t.streams.iter().position(|(r, _)| *r == "index").unwrap();
    let at = index(&t4);
    let payload_words = t4
        .streams
        .iter()
        .find(|(r, _)| *r == "symbols")
        .unwrap()
        .1
        .len() as u32
        / 2;
    let entry = 4 * 33;
    for (offset, value) in [
        (2 * entry, 0u32),              // chunk 2 starts before chunk 1
        (3 * entry, payload_words + 1), // past the payload
        (entry + 4 * 5, 17),            // a lane state below 2^16
    ] {
        let mut bad = t4.clone();
        bad.streams[at].1[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
        let op = CompressedLinear::from_encoded("w", &bad, &shape, None, &LoadOptions::default())
            .unwrap();
        let err = op.device_form().map(|_| ());
        assert!(
            matches!(err, Err(RuntimeError::Corrupt { .. })),
            "{offset}: {err:?}"
        );
    }
}

/// The integer form: affine codes of 1-8 bits with a scale per row, per group or for the
/// tensor (asymmetric ones centred, with their offsets), and the points of Z1, D4 and E8
/// tensors, fixed-rate or entropy-coded (in their RHT domain, E8's doubled), times their row
/// or group scales (plus the offsets) are the decoded weight; A2, points outside i8 and
/// padded rows have none.
#[test]
fn int8_weights_times_their_scales_are_the_stored_weight() {
    use hypercodec_lattice::Rht;
    let (rows, cols) = (12usize, 256usize);
    let shape = [rows as u64, cols as u64];
    let x = values(rows * cols, 17);
    // (encoding, in the RHT domain, columns a scale covers)
    for (e, rotated, glen) in [
        (affine(8, Group::Row, true, FloatDtype::F16), false, cols),
        (affine(8, Group::Tensor, true, FloatDtype::F16), false, cols),
        (affine(4, Group::Row, true, FloatDtype::F16), false, cols),
        (affine(3, Group::Tensor, true, FloatDtype::F32), false, cols),
        (affine(1, Group::Row, true, FloatDtype::F16), false, cols),
        (
            affine(4, Group::Size(128), true, FloatDtype::F16),
            false,
            128,
        ),
        (affine(5, Group::Size(64), true, FloatDtype::F32), false, 64),
        (
            affine(4, Group::Size(128), false, FloatDtype::F16),
            false,
            128,
        ),
        (
            affine(8, Group::Size(128), false, FloatDtype::F16),
            false,
            128,
        ),
        (affine(4, Group::Row, false, FloatDtype::Bf16), false, cols),
        (
            lattice(Lattice::Z1, Coding::Fixed { bits: 8 }, 256),
            true,
            cols,
        ),
        (
            lattice(Lattice::Z1, Coding::Fixed { bits: 4 }, 256),
            true,
            cols,
        ),
        (
            lattice(Lattice::Z1, Coding::Fixed { bits: 3 }, 64),
            true,
            cols,
        ),
        (
            lattice(Lattice::E8, Coding::Fixed { bits: 4 }, 256),
            true,
            cols,
        ),
        (
            lattice(Lattice::E8, Coding::Fixed { bits: 2 }, 64),
            true,
            cols,
        ),
        (
            lattice(Lattice::E8, Coding::Fixed { bits: 8 }, 256),
            true,
            cols,
        ),
        (
            lattice(Lattice::D4, Coding::Fixed { bits: 4 }, 256),
            true,
            cols,
        ),
        (lattice(Lattice::E8, Coding::RANS_DEFAULT, 256), true, cols),
        (
            lattice(
                Lattice::D4,
                Coding::Rans {
                    chunk: 24,
                    lanes: 3,
                    prob_bits: 12,
                },
                256,
            ),
            true,
            cols,
        ),
        (
            lattice(Lattice::Z1, Coding::Rice { chunk: 40 }, 256),
            true,
            cols,
        ),
        // Chunks of 20 symbols: words of 8 straddle every other chunk boundary (decoded in
        // parallel runs that start on word boundaries).
        (
            lattice(Lattice::E8, Coding::Rice { chunk: 20 }, 256),
            true,
            cols,
        ),
    ] {
        let t = encode("w", &x, &shape, &e, EncodeOptions::default()).unwrap();
        let op =
            CompressedLinear::from_encoded("w", &t, &shape, None, &LoadOptions::default()).unwrap();
        let w8 = op
            .int8_weight()
            .unwrap()
            .unwrap_or_else(|| panic!("{}: no int8 form", e.label()));
        let groups = cols.div_ceil(glen);
        assert_eq!(
            (w8.values.len(), w8.scales.len(), w8.group_len),
            (rows * cols, rows * groups, glen)
        );
        assert_eq!(w8.tile != 0, rotated);
        assert!(w8.offsets.is_empty() || w8.offsets.len() == rows * groups);
        // Asymmetric codes are centred: their values straddle zero.
        if !w8.offsets.is_empty() {
            let (lo, hi) = (w8.values.iter().min(), w8.values.iter().max());
            assert!(lo < Some(&0) && hi >= Some(&0), "{}", e.label());
        }
        let want = op.decode_weight().unwrap();
        for r in 0..rows {
            let mut row = want[r * cols..(r + 1) * cols].to_vec();
            if rotated {
                Rht::new(cols, w8.tile, w8.seed).unwrap().forward(&mut row);
            }
            for (j, &e) in row.iter().enumerate() {
                let i = r * groups + j / glen;
                let off = w8.offsets.get(i).copied().unwrap_or(0.0);
                let got = w8.scales[i] * w8.values[r * cols + j] as f32 + off;
                assert!(
                    (got - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{} ({r}, {j}): {got} vs {e}",
                    e
                );
            }
        }
    }
    // A2's points are not integers; E8 points scaled to α = 100 (8-bit fixed-rate, or
    // entropy-coded) pass ±64 (±128 doubled); E8 rows of 12 columns are padded to 16 in the
    // RHT domain.
    let wide = |coding: Coding| match lattice(Lattice::E8, coding, 256) {
        Encoding::Lattice {
            alpha: _,
            lattice,
            tile,
            seed,
            scale_dtype,
            coding,
        } => Encoding::Lattice {
            lattice,
            alpha: 100.0,
            tile,
            seed,
            scale_dtype,
            coding,
        },
        _ => unreachable!(),
    };
    for (e, shape) in [
        (lattice(Lattice::A2, Coding::RANS_DEFAULT, 256), shape),
        (wide(Coding::Fixed { bits: 8 }), shape),
        (wide(Coding::Rice { chunk: 20 }), shape),
        (
            lattice(Lattice::E8, Coding::Fixed { bits: 4 }, 12),
            [24, 12],
        ),
    ] {
        let x = values((shape[0] * shape[1]) as usize, 5);
        let t = encode("w", &x, &shape, &e, EncodeOptions::default()).unwrap();
        let op =
            CompressedLinear::from_encoded("w", &t, &shape, None, &LoadOptions::default()).unwrap();
        assert!(op.int8_weight().unwrap().is_none(), "{}", e.label());
    }
}

/// `int8_weight` of a hostile lattice tensor: garbage symbol bytes (rANS and Rice) give an
/// error or a form of the tensor's size, never a panic; a chunk table that runs backwards is
/// refused.
#[test]
fn int8_weight_of_corrupt_lattice_symbols_is_an_error_or_a_whole_form() {
    let shape = [64u64, 256];
    let x = values(64 * 256, 9);
    for e in [
        lattice(Lattice::E8, Coding::RANS_GPU, 256)
            .for_matrix(64, 256, 4096)
            .with_row_aligned_chunks(256, 4),
        lattice(Lattice::E8, Coding::Rice { chunk: 20 }, 256),
    ] {
        let t = encode("w", &x, &shape, &e, EncodeOptions::default()).unwrap();
        let at = t.streams.iter().position(|(r, _)| *r == "symbols").unwrap();
        for seed in 0..8u32 {
            let mut bad = t.clone();
            for (i, b) in bad.streams[at].1.iter_mut().enumerate() {
                if (i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 7 == 0 {
                    *b ^= 0x5a ^ seed as u8;
                }
            }
            let Ok(op) =
                CompressedLinear::from_encoded("w", &bad, &shape, None, &LoadOptions::default())
            else {
                continue;
            };
            if let Ok(Some(w)) = op.int8_weight() {
                assert_eq!(w.values.len(), 64 * 256, "{}", e.label());
            }
        }
        if let Some(at) = t.streams.iter().position(|(r, _)| *r == "index") {
            let mut bad = t.clone();
            bad.streams[at].1[2 * 4 * 33..2 * 4 * 33 + 4].copy_from_slice(&0u32.to_le_bytes());
            let op =
                CompressedLinear::from_encoded("w", &bad, &shape, None, &LoadOptions::default())
                    .unwrap();
            assert!(op.int8_weight().is_err(), "{}", e.label());
        }
    }
}

/// A small entropy-coded layer holds less than its f32 weights: its rANS model is written with
/// as few probability bits as its symbols need (`Encoding::sized_for`), so its decode tables
/// (`2^prob_bits` slots a context) stay in proportion (at 14 and 13 bits a 256×256 layer held
/// 1.26× and a 128×128 one 2.40× its f32 weights).
#[test]
fn small_rans_layers_hold_less_than_their_f32_weights() {
    for (rows, cols) in [(128usize, 128usize), (256, 256), (384, 384), (64, 1024)] {
        let shape = [rows as u64, cols as u64];
        let x = values(rows * cols, 9);
        let e = lattice(Lattice::E8, Coding::RANS_DEFAULT, cols as u64);
        let t = encode("w", &x, &shape, &e, EncodeOptions::default()).unwrap();
        let op =
            CompressedLinear::from_encoded("w", &t, &shape, None, &LoadOptions::default()).unwrap();
        let f32_bytes = 4 * (rows * cols) as u64;
        assert!(
            op.held_bytes() < f32_bytes,
            "{rows}x{cols}: held {} of {f32_bytes} f32 bytes ({:?})",
            op.held_bytes(),
            t.encoding
        );
    }
}

/// `y` against a float64 `x·w (+ b)` for `w` of `inputs × outputs` (row-major) and the rows of
/// `x` (`inputs` values each), within [`DOT_REL_TOL`] of `‖x_b‖·‖w_o‖ + |b|` per output (the
/// scale `check` takes: affine terms `s·q + lo` that cancel leave an error relative to `lo`).
/// `rotated`: the rows were summed in their RHT domain, where an output mixes the whole row,
/// so the scale is `‖x_b‖·‖w‖` (an output that is exactly 0 in the weight's basis comes back
/// as a sum of rounded terms).
fn assert_in_out_product(
    what: &str,
    (w, inputs, outputs): (&[f32], usize, usize),
    x: &[f32],
    bias: Option<&[f32]>,
    y: &[f32],
    rotated: bool,
) {
    let batch = x.len() / inputs.max(1);
    assert_eq!(y.len(), batch * outputs, "{what}");
    let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|a| (a as f64).powi(2)).sum::<f64>().sqrt();
    let whole = if rotated {
        norm(&mut w.iter().copied())
    } else {
        0.0
    };
    for b in 0..batch {
        let xb = &x[b * inputs..(b + 1) * inputs];
        let xn = norm(&mut xb.iter().copied());
        for o in 0..outputs {
            let want: f64 = (0..inputs)
                .map(|i| xb[i] as f64 * w[i * outputs + o] as f64)
                .sum();
            let scale = xn * norm(&mut (0..inputs).map(|i| w[i * outputs + o])).max(whole);
            let bo = bias.map_or(0.0, |v| v[o] as f64);
            let tol = DOT_REL_TOL as f64 * (scale + bo.abs()) + 1e-30;
            let got = y[b * outputs + o] as f64;
            assert!(
                (got - (want + bo)).abs() <= tol,
                "{what} out ({b}, {o}): {got} vs {}",
                want + bo
            );
        }
    }
}

/// `y = x·W (+ b)` for `W` stored `[in, out]` against a float64 product of the decoded weight;
/// the decoded weight, its rows, and the forms a transposed operator does not have.
fn check_transposed(t: &EncodedTensor, shape: &[u64], batch: usize, seed: u64, with_bias: bool) {
    let view = view_of(t, shape);
    let (inputs, outputs) = (view.rows() as usize, view.cols() as usize);
    let bias: Option<Vec<f32>> = with_bias.then(|| values(outputs, seed ^ 99));
    let op = CompressedLinear::transposed(view.clone(), bias.as_deref(), &LoadOptions::default())
        .unwrap();
    assert_eq!((op.rows(), op.cols()), (outputs, inputs));
    assert!(op.is_transposed());
    assert_eq!(op.path(), Path::TransposedTiles);
    let mut w = vec![0f32; inputs * outputs];
    view.decode_rows_into(0..inputs as u64, &mut w).unwrap();
    let x = values(batch * inputs, seed);
    let mut y = vec![f32::NAN; batch * outputs];
    op.forward(&x, batch, &mut y).unwrap();
    let what = format!("{:?} {shape:?} batch {batch}", t.encoding);
    let rotated = rht_domain(&t.encoding);
    assert_in_out_product(
        &what,
        (&w, inputs, outputs),
        &x,
        bias.as_deref(),
        &y,
        rotated,
    );
    // The operator's weight is the stored one transposed, exactly.
    let wt = op.decode_weight().unwrap();
    for i in 0..inputs {
        for o in 0..outputs {
            assert_eq!(wt[o * inputs + i].to_bits(), w[i * outputs + o].to_bits());
        }
    }
    let ids = [outputs - 1, 0, outputs / 2];
    let mut rows = vec![0f32; 3 * inputs];
    op.decode_rows(&ids, &mut rows).unwrap();
    for (k, &o) in ids.iter().enumerate() {
        assert_eq!(
            rows[k * inputs..(k + 1) * inputs],
            wt[o * inputs..(o + 1) * inputs]
        );
    }
    assert!(op.device_form().unwrap().is_none());
    assert!(op.int8_weight().unwrap().is_none());
    assert_eq!(
        op.route(batch),
        if batch <= 1 {
            "transposed-tiles"
        } else {
            "transposed-tiles+gemm"
        }
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn transposed_weights_match_a_product_with_the_stored_weight(
        rows in 1u64..70,
        cols in prop_oneof![1u64..12, 12u64..300],
        which in 0usize..(zoo(8).len() + EXTRA),
        batch in prop_oneof![Just(1usize), 2usize..9],
        seed in any::<u64>(),
        bias in any::<bool>(),
    ) {
        let shape = [rows, cols];
        let x = values((rows * cols) as usize, seed);
        let (t, _) = encode_any(&x, &shape, which);
        check_transposed(&t, &shape, batch, seed ^ 1, bias);
    }
}

#[test]
fn every_encoding_runs_transposed() {
    // GPT-2's Conv1D holds [in, out]: taller than wide, and the other way; every stored form.
    for shape in [[96u64, 40], [40, 256], [1, 7], [300, 1]] {
        let x = values((shape[0] * shape[1]) as usize, shape[0]);
        for which in 0..zoo(shape[1]).len() + EXTRA {
            let (t, _) = encode_any(&x, &shape, which);
            for batch in [1, 3, 20] {
                check_transposed(&t, &shape, batch, which as u64, batch == 3);
            }
        }
    }
}

#[test]
fn a_transposed_bias_has_one_value_per_stored_column() {
    let shape = [8u64, 5];
    let (t, _) = encode_any(&values(40, 1), &shape, 3);
    let view = view_of(&t, &shape);
    let err = CompressedLinear::transposed(view.clone(), Some(&[0.0; 8]), &LoadOptions::default())
        .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::Length {
                what: "bias",
                expected: 5,
                actual: 8
            }
        ),
        "{err}"
    );
    let op = CompressedLinear::transposed(view, None, &LoadOptions::default()).unwrap();
    let mut y = vec![0f32; 5];
    let err = op.forward(&[0.0; 5], 1, &mut y).unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::Length {
                what: "x",
                expected: 8,
                actual: 5
            }
        ),
        "{err}"
    );
}

#[test]
fn transposed_weights_match_across_tiles_tasks_and_batch_slices() {
    // Tiles of one row, of three and whole: later tiles' offsets into x and into the stored
    // rows, sums of several tasks, chunks shared by two tiles (the zoo's rANS chunks of 24
    // symbols and Rice chunks of 40 straddle rows); and a batch of three slices of 64 rows.
    // (Byte-aligned affine codes at batch 1 take no tiles: transposed_affine_row.)
    let shape = [37u64, 72];
    let (inputs, outputs) = (37, 72);
    let x = values(37 * 72, 21);
    for which in 0..zoo(72).len() + EXTRA {
        let (t, _) = encode_any(&x, &shape, which);
        let view = view_of(&t, &shape);
        let mut w = vec![0f32; inputs * outputs];
        view.decode_rows_into(0..inputs as u64, &mut w).unwrap();
        let bias = values(outputs, 5);
        let op = CompressedLinear::transposed(view, Some(&bias), &LoadOptions::default()).unwrap();
        for (tile, batch) in [(1, 1), (1, 5), (3 * 72, 2), (usize::MAX, 3)] {
            let xs = values(batch * inputs, tile as u64 ^ batch as u64);
            let mut y = vec![f32::NAN; batch * outputs];
            op.transposed_rows(&xs, batch, &mut y, Some(tile)).unwrap();
            // (transposed_rows leaves the bias to forward)
            let what = format!("{:?} tiles of {tile} values, batch {batch}", t.encoding);
            let rotated = rht_domain(&t.encoding);
            assert_in_out_product(&what, (&w, inputs, outputs), &xs, None, &y, rotated);
        }
        let xs = values(130 * inputs, 8);
        let mut y = vec![f32::NAN; 130 * outputs];
        op.forward(&xs, 130, &mut y).unwrap();
        let what = format!("{:?} batch 130", t.encoding);
        let rotated = rht_domain(&t.encoding);
        assert_in_out_product(&what, (&w, inputs, outputs), &xs, Some(&bias), &y, rotated);
    }
}

#[test]
fn only_a_2d_tensor_runs_transposed() {
    for shape in [vec![4u64, 3, 2, 2], vec![48]] {
        let n = shape.iter().product::<u64>() as usize;
        let e = affine(4, Group::Row, false, FloatDtype::F16);
        let t = encode("w", &values(n, 3), &shape, &e, EncodeOptions::default()).unwrap();
        let view = view_of(&t, &shape);
        let err = CompressedLinear::transposed(view, None, &LoadOptions::default()).unwrap_err();
        assert!(
            matches!(err, RuntimeError::NotInOut { .. }),
            "{shape:?}: {err}"
        );
    }
}

#[test]
fn transposed_affine_rows_at_batch_1_split_over_tasks() {
    // Batch 1 of byte-aligned affine codes dequantizes each stored row straight into the sum
    // (no tile): 600 rows of 128 make two tasks on two threads or more. Groups, rows and a tensor scale; symmetric
    // codes; f16 and f32 scales; a zero input row and huge ones.
    let shape = [600u64, 128];
    let w = values(600 * 128, 4);
    let mut x = values(600, 6);
    x[7] = 0.0;
    x[300] = 1e20;
    for e in [
        affine(4, Group::Size(32), false, FloatDtype::F16),
        affine(4, Group::Row, true, FloatDtype::F32),
        affine(8, Group::Size(64), true, FloatDtype::Bf16),
        affine(8, Group::Tensor, false, FloatDtype::F32),
    ] {
        let t = encode("w", &w, &shape, &e, EncodeOptions::default()).unwrap();
        let view = view_of(&t, &shape);
        let mut wd = vec![0f32; 600 * 128];
        view.decode_rows_into(0..600, &mut wd).unwrap();
        let op = CompressedLinear::transposed(view, None, &LoadOptions::default()).unwrap();
        let mut y = vec![f32::NAN; 128];
        op.forward(&x, 1, &mut y).unwrap();
        assert_in_out_product(&format!("{e:?}"), (&wd, 600, 128), &x, None, &y, false);
    }
}

/// Whether a transposed weight of this encoding sums its rows in the RHT domain.
fn rht_domain(e: &Encoding) -> bool {
    matches!(e, Encoding::Lattice { .. } | Encoding::Trellis { .. })
}
