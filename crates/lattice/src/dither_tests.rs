//! Subtractive dither: exact inverse, error inside the Voronoi cell, independent of the input.

use crate::{
    dequantize_rows, dither_word, quantize_rows, quantize_rows_into, symbols_per_row, Lattice,
    LatticeParams, QuantizedMut,
};

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

#[test]
fn quantizing_in_parts_with_row_offsets_equals_quantizing_at_once() {
    // With the dither on, each row's dither is keyed on its global row index.
    let (rows, cols) = (10usize, 64usize);
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let params = LatticeParams {
        tile: 64,
        dither: true,
        ..LatticeParams::default()
    };
    let whole = quantize_rows(&values, rows, cols, &params, |s| s).expect("whole");
    let spr = symbols_per_row(params.lattice, cols);
    let mut symbols = vec![0u32; rows * spr];
    let mut scales = vec![0f32; rows];
    let split = 4;
    let (s0, s1) = symbols.split_at_mut(split * spr);
    let (c0, c1) = scales.split_at_mut(split);
    for (first, n, sym, sc) in [(0, split, s0, c0), (split, rows - split, s1, c1)] {
        let out = QuantizedMut {
            symbols: sym,
            scales: sc,
        };
        let v = &values[first * cols..(first + n) * cols];
        quantize_rows_into(v, n, cols, &params, |s| s, first, out).expect("part");
    }
    assert_eq!(symbols, whole.symbols);
    assert_eq!(scales, whole.scales);
}
