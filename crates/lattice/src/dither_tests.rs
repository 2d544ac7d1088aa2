//! Subtractive dither: exact inverse, error inside the Voronoi cell, independent of the input.

use crate::{dequantize_rows, dither_word, quantize_rows, Lattice, LatticeParams};

#[test]
fn dither_is_inside_the_voronoi_cell_and_decodes_back() {
    for l in Lattice::ALL {
        let mut d = vec![0f32; l.dim()];
        let mut mean = vec![0f64; l.dim()];
        for w in 0..2000 {
            dither_word(l, 9, 3, w, &mut d);
            let norm = d.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!(norm <= l.covering_radius() + 1e-5, "{l}: {norm}");
            mean.iter_mut()
                .zip(&d)
                .for_each(|(m, x)| *m += *x as f64 / 2000.0);
        }
        // Uniform over a centrally symmetric cell: zero mean.
        assert!(mean.iter().all(|m| m.abs() < 0.05), "{l}: {mean:?}");
    }
    // A constant row: without dither every word quantizes alike; with dither the error varies
    // and averages out, and decoding subtracts exactly what encoding added.
    let x = vec![0.3f32; 512];
    for dither in [false, true] {
        let p = LatticeParams {
            lattice: Lattice::E8,
            alpha: 2.0,
            tile: 1,
            seed: 5,
            fixed_bits: None,
            dither,
        };
        let q = quantize_rows(&x, 1, 512, &p, |s| s).expect("quantize");
        let y = dequantize_rows(&q.symbols, &q.scales, 1, 512, &p).expect("dequantize");
        let mean_err = x.iter().zip(&y).map(|(a, b)| (b - a) as f64).sum::<f64>() / 512.0;
        let max_err = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (b - a).abs())
            .fold(0f32, f32::max);
        assert!(max_err <= 0.3 / 2.0 * 1.0 * 8f32.sqrt() + 1e-4);
        if dither {
            assert!(
                mean_err.abs() < 0.01,
                "dithered error is unbiased: {mean_err}"
            );
        }
    }
}

#[test]
fn no_rows_allocate_nothing_whatever_the_row_length() {
    // `[0, 2^40]`: zero values; the row length alone must not size the transform's signs.
    let cols = 1usize << 40;
    let params = LatticeParams {
        tile: 8,
        ..LatticeParams::default()
    };
    let q = quantize_rows(&[], 0, cols, &params, |s| s).expect("no rows");
    assert!(q.symbols.is_empty() && q.scales.is_empty());
    let out = dequantize_rows(&[], &[], 0, cols, &params).expect("no rows");
    assert!(out.is_empty());
}
