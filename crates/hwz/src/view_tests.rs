//! Row-range decodes equal the rows of the whole decode, bit for bit, for every encoding.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use super::*;
use crate::{
    assemble_exceptions, assemble_mixed, encode, encode_codebook, CodebookSettings, EncodeOptions,
    EncodedTensor, Group, Lattice, ResidualDtype,
};
use proptest::prelude::*;

/// Gaussian-like values with a heavy tail, a few zeros, from a seed.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            let g = ((u * 12.0) - 6.0) * 0.3;
            match i % 97 {
                0 => 0.0,
                13 => (g * 20.0) as f32,
                _ => g as f32,
            }
        })
        .collect()
}

fn lattice(l: Lattice, coding: Coding, cols: u64) -> Encoding {
    Encoding::Lattice {
        lattice: l,
        alpha: 6.0,
        tile: hypercodec_lattice::tile_for(cols as usize, 4096) as u32,
        seed: 7,
        scale_dtype: FloatDtype::F16,
        coding,
    }
}

/// The encodings tried: every tag, small chunks so that ranges cross chunk borders.
fn encodings(cols: u64) -> Vec<Encoding> {
    let mut v: Vec<Encoding> = FloatDtype::ALL
        .iter()
        .map(|&dtype| Encoding::Raw { dtype })
        .collect();
    for (bits, group, symmetric) in [
        (4, Group::Size(16), false),
        (3, Group::Size(5), true),
        (1, Group::Row, true),
        (8, Group::Tensor, false),
        (2, Group::Size(128), false),
    ] {
        v.push(Encoding::affine(AffineParams {
            bits,
            group,
            symmetric,
            scale_dtype: FloatDtype::F16,
        }));
    }
    for l in [Lattice::E8, Lattice::D4, Lattice::A2, Lattice::Z1] {
        v.push(lattice(
            l,
            Coding::Rans {
                chunk: 24,
                lanes: 3,
                prob_bits: 12,
            },
            cols,
        ));
        v.push(lattice(l, Coding::Rice { chunk: 40 }, cols));
    }
    v.push(lattice(Lattice::E8, Coding::Fixed { bits: 4 }, cols));
    v.push(lattice(Lattice::Z1, Coding::Fixed { bits: 3 }, cols));
    v.push(lattice(Lattice::E8, Coding::RANS_DEFAULT, cols).with_row_aligned_chunks(cols, 3));
    for (limit, pair_limit, segment, span) in [(8, 12, 1, 1), (10, 0, 2, 1), (8, 0, 64, 3)] {
        let prefix = Coding::Prefix {
            limit,
            pair_limit,
            segment,
            span,
        };
        v.push(lattice(Lattice::E8, prefix, cols));
    }
    v
}

fn encode_any(name: &str, x: &[f32], shape: &[u64], which: usize) -> EncodedTensor {
    let cols = shape[1];
    let list = encodings(cols);
    let extra = which.checked_sub(list.len());
    match extra {
        None => encode(name, x, shape, &list[which], EncodeOptions::default()).unwrap(),
        Some(0) | Some(1) => {
            // Codebook, packed or run-length indices, with an int8 residual.
            let mut t = crate::codebook_template(4, 8, ScaleMode::Channel, ResidualDtype::Int8);
            if extra == Some(1) {
                if let Encoding::Codebook { assignments, .. } = &mut t {
                    *assignments = Assignments::Rle;
                }
            }
            let settings = CodebookSettings {
                residual_k: Some(0.5),
                hdc: None,
                ..CodebookSettings::default()
            };
            encode_codebook(name, x, shape, &t, &settings).unwrap()
        }
        Some(2) => encode(
            name,
            x,
            shape,
            &Encoding::LowRank {
                rank: 2.min(shape[0].min(cols)) as u32,
            },
            EncodeOptions::default(),
        )
        .unwrap(),
        Some(3) => {
            let sparse: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, &v)| if i % 3 == 0 { v } else { 0.0 })
                .collect();
            let count = sparse.iter().filter(|v| **v != 0.0).count() as u64;
            encode(
                name,
                &sparse,
                shape,
                &Encoding::Sparse {
                    count,
                    dtype: FloatDtype::F16,
                },
                EncodeOptions::default(),
            )
            .unwrap()
        }
        Some(4) => {
            // Mixed: blocks of 2 rows, cycling through raw, affine and lattice parts.
            let block_rows = 2u64;
            let parts: Vec<EncodedTensor> = (0..shape[0].div_ceil(block_rows))
                .map(|i| {
                    let r0 = i * block_rows;
                    let r = block_rows.min(shape[0] - r0);
                    let slice = &x[(r0 * cols) as usize..((r0 + r) * cols) as usize];
                    let e = &list[[1usize, 4, 9, 17][i as usize % 4] % list.len()];
                    encode(name, slice, &[r, cols], e, EncodeOptions::default()).unwrap()
                })
                .collect();
            assemble_mixed(block_rows, &parts)
        }
        _ => {
            // Exceptions over an INT2 base: every 7th value exact.
            let base = encode(name, x, shape, &list[7], EncodeOptions::default()).unwrap();
            let positions: Vec<u64> = (0..x.len() as u64).step_by(7).collect();
            let vals: Vec<f32> = positions.iter().map(|&p| x[p as usize]).collect();
            assemble_exceptions(name, &base, &positions, &vals, FloatDtype::F32).unwrap()
        }
    }
}

const EXTRA: usize = 6;

fn whole_and_view<'a>(t: &'a EncodedTensor, shape: &[u64]) -> (Vec<f32>, TensorView<'a>) {
    let refs: Vec<(&str, &[u8])> = t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
    let n = (shape[0] * shape[1]) as usize;
    let mut whole = vec![0f32; n];
    crate::decode_into("t", &t.encoding, shape, &refs, &mut whole).unwrap();
    let view = TensorView::new("t", &t.encoding, shape, &refs).unwrap();
    (whole, view)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn row_range_equals_rows_of_whole(
        which in 0usize..(encodings(8).len() + EXTRA),
        rows in 1u64..24,
        cols in prop::sample::select(vec![8u64, 16, 24, 40, 64, 96]),
        a in 0u64..24, b in 0u64..24, seed in any::<u64>(),
    ) {
        let shape = [rows, cols];
        let x = values((rows * cols) as usize, seed);
        let t = encode_any("t", &x, &shape, which);
        let (whole, view) = whole_and_view(&t, &shape);
        let (a, b) = (a.min(b).min(rows), a.max(b).min(rows));
        let mut part = vec![0f32; ((b - a) * cols) as usize];
        view.decode_rows_into(a..b, &mut part).unwrap();
        let c = cols as usize;
        prop_assert!(same_bits(&part, &whole[a as usize * c..b as usize * c]),
            "{} rows {}..{}", t.encoding.label(), a, b);
        // f16 / bf16 outputs are the f32 rows rounded once.
        let mut h = vec![half::f16::ZERO; part.len()];
        view.decode_rows_to(a..b, OutBuf::F16(&mut h)).unwrap();
        prop_assert!(h.iter().zip(&part).all(|(h, &f)| h.to_bits() == half::f16::from_f32(f).to_bits()));
        let mut g = vec![half::bf16::ZERO; part.len()];
        view.decode_rows_to(a..b, OutBuf::Bf16(&mut g)).unwrap();
        prop_assert!(g.iter().zip(&part).all(|(g, &f)| g.to_bits() == half::bf16::from_f32(f).to_bits()));
        // Outside the rows, or a wrong buffer: typed errors.
        let mut one = vec![0f32; cols as usize];
        let outside = matches!(view.decode_rows_into(rows..rows + 1, &mut one), Err(HwzError::RowRange { .. }));
        prop_assert!(outside);
        let mut wrong = vec![0f32; part.len() + 1];
        let wrong_len = matches!(view.decode_rows_into(a..b, &mut wrong), Err(HwzError::ElementCount { .. }));
        prop_assert!(wrong_len);
    }
}

/// A big tensor takes the parallel path; every split must still agree with a serial decode.
#[test]
fn parallel_decode_equals_serial() {
    let (rows, cols) = (300u64, 1024u64);
    let x = values((rows * cols) as usize, 5);
    let e = lattice(Lattice::E8, Coding::RANS_DEFAULT, cols);
    let t = encode("t", &x, &[rows, cols], &e, EncodeOptions::default()).unwrap();
    let (whole, view) = whole_and_view(&t, &[rows, cols]);
    let mut serial = vec![0f32; whole.len()];
    view.decode_rows_serial(0..rows, &mut serial).unwrap();
    assert!(same_bits(&whole, &serial));
}

/// Row-aligned chunks: one block's decode reads one chunk, and alignment costs little.
#[test]
fn row_aligned_chunks_read_only_their_block() {
    let (rows, cols, block) = (128u64, 512u64, 32u64);
    let x = values((rows * cols) as usize, 9);
    let plain = lattice(Lattice::E8, Coding::RANS_DEFAULT, cols);
    let aligned = plain.with_row_aligned_chunks(cols, block);
    assert_eq!(
        aligned,
        plain.with_alpha(6.0).with_row_aligned_chunks(cols, block)
    );
    let t = encode("t", &x, &[rows, cols], &aligned, EncodeOptions::default()).unwrap();
    let (_, view) = whole_and_view(&t, &[rows, cols]);
    let symbols = t
        .streams
        .iter()
        .find(|(r, _)| *r == role::SYMBOLS)
        .unwrap()
        .1
        .len() as u64;
    let one = view.stored_bytes_for_rows(block..2 * block).unwrap();
    // A quarter of the rows: about a quarter of the symbol bytes, never the whole stream.
    assert!(one * 2 <= symbols, "{one} of {symbols}");
    assert!(one * 8 >= symbols, "{one} of {symbols}");
}

#[test]
fn exception_positions_out_of_order_or_without_values_are_refused_at_encode() {
    let x: Vec<f32> = (0..64).map(|i| i as f32 / 7.0).collect();
    let raw = Encoding::Raw {
        dtype: FloatDtype::F32,
    };
    let base = encode("w", &x, &[8, 8], &raw, EncodeOptions::default()).unwrap();
    let ok = assemble_exceptions("w", &base, &[1, 5], &[1.0, 2.0], FloatDtype::F32);
    assert!(ok.is_ok());
    for (positions, vals) in [
        (&[5u64, 1][..], &[1.0f32, 2.0][..]),
        (&[3, 3], &[1.0, 2.0]),
        (&[1, 5], &[1.0]),
    ] {
        let r = assemble_exceptions("w", &base, positions, vals, FloatDtype::F32);
        assert!(
            matches!(r, Err(HwzError::InvalidEncoding { .. })),
            "{positions:?} {vals:?}"
        );
    }
}
