//! Measures assignment through the HDC index against exhaustive search on a Gaussian matrix:
//! time, speedup, share of blocks mapped to the same prototype, and SNR.
//!
//! `cargo run --release -p hypercodec-hdc --example hdc_speed [ROWS COLS]`
#![allow(clippy::unwrap_used)]

use hypercodec_hdc::{codebook, kmeans, CodebookParams, HdcIndex, HdcParams};
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rows, cols) = (
        *args.first().unwrap_or(&4096),
        *args.get(1).unwrap_or(&4096),
    );
    // Deterministic N(0, 1) via a splitmix64 + Box–Muller.
    let mut s = 0x1234u64;
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let x: Vec<f32> = (0..rows * cols)
        .map(|_| {
            let (u1, u2) = (next().max(1e-300), next());
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect();
    let snr = |y: &[f32]| {
        let s: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
        let e: f64 = x
            .iter()
            .zip(y)
            .map(|(&a, &b)| ((a - b) as f64).powi(2))
            .sum();
        10.0 * (s / e).log10()
    };
    println!(
        "{rows}×{cols} N(0,1), channel scales, f16 prototypes; threads: {:?}",
        std::thread::available_parallelism().map(|n| n.get())
    );
    println!("| block | k | search | assign s | speedup | same proto | SNR dB | full encode s |");
    println!("|---:|---:|---|---:|---:|---:|---:|---:|");
    for (block, k) in [(8usize, 256usize), (4, 256), (8, 1024)] {
        let base = CodebookParams {
            block,
            prototypes: k,
            hdc: None,
            ..Default::default()
        };
        let t = Instant::now();
        let cb = codebook::encode(&x, rows, cols, &base).unwrap();
        let full_exact = t.elapsed().as_secs_f64();
        // Time assignment alone on the normalized blocks (row RMS is ≈ 1 here: use x itself).
        let mut blocks = vec![0f32; rows * cols.div_ceil(block) * block];
        for r in 0..rows {
            for c in 0..cols {
                blocks[(r * cols.div_ceil(block)) * block + c] = x[r * cols + c];
            }
        }
        let mut exact = vec![0u32; blocks.len() / block];
        let t = Instant::now();
        kmeans::assign_brute(&cb.protos, block, &blocks, &mut exact);
        let t_exact = t.elapsed().as_secs_f64();
        let mut out = vec![0f32; x.len()];
        codebook::decode_into(&cb.as_ref(block, base.scale_mode), rows, cols, &mut out).unwrap();
        println!("| {block} | {k} | exhaustive | {t_exact:.3} | 1.00 | 100 % | {:.2} | {full_exact:.2} |", snr(&out));
        for (dim, buckets) in [(16usize, 8usize), (32, 16), (32, 32), (64, 64)] {
            let h = HdcParams {
                dim,
                buckets,
                seed: 0,
            };
            let idx = HdcIndex::new(&cb.protos, block, h).unwrap();
            let mut fast = vec![0u32; exact.len()];
            let t = Instant::now();
            idx.assign(&blocks, &mut fast);
            let t_fast = t.elapsed().as_secs_f64();
            let same =
                fast.iter().zip(&exact).filter(|(a, b)| a == b).count() as f64 / exact.len() as f64;
            let p = CodebookParams {
                hdc: Some(h),
                ..base
            };
            let t = Instant::now();
            let cbf = codebook::encode(&x, rows, cols, &p).unwrap();
            let full = t.elapsed().as_secs_f64();
            codebook::decode_into(&cbf.as_ref(block, p.scale_mode), rows, cols, &mut out).unwrap();
            println!(
                "| {block} | {k} | hdc dim {dim} buckets {buckets} | {t_fast:.3} | {:.2} | {:.1} % | {:.2} | {full:.2} |",
                t_exact / t_fast,
                100.0 * same,
                snr(&out)
            );
        }
    }
}
