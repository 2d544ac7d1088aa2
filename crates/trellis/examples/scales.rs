//! Measures, for each (L, K), the reconstruction scale that minimizes the squared error of
//! the trellis on unit Gaussian data, and the SNR it reaches beside the Gaussian bound
//! (6.02·K dB): `cargo run --release -p hypercodec-trellis --example scales [L...]`.

use hypercodec_trellis::{decode, encode, TrellisParams};

fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut u = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| ((-2.0 * u().ln()).sqrt() * (std::f64::consts::TAU * u()).cos()) as f32)
        .collect()
}

fn snr(x: &[f32], p: &TrellisParams, seq: usize) -> f64 {
    let (mut sig, mut err) = (0f64, 0f64);
    for c in x.chunks(seq) {
        let bits = encode(c, p).expect("encode");
        let y = decode(&bits, c.len(), p).expect("decode");
        for (a, b) in c.iter().zip(&y) {
            sig += (*a as f64).powi(2);
            err += (*a as f64 - *b as f64).powi(2);
        }
    }
    10.0 * (sig / err).log10()
}

fn main() {
    let ls: Vec<u8> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ls = if ls.is_empty() { vec![8, 10, 12] } else { ls };
    let x = gaussian(1 << 14, 7);
    println!(
        "| L | K | best scale | SNR dB | bound dB | gap dB |\n|---:|---:|---:|---:|---:|---:|"
    );
    for &l in &ls {
        for k in 1..=4u8 {
            let mut best = (0.0f32, f64::MIN);
            let mut lo = 0.3f32;
            let mut hi = 2.0f32;
            // Golden-section search on the scale.
            for _ in 0..14 {
                let a = lo + 0.382 * (hi - lo);
                let b = lo + 0.618 * (hi - lo);
                let fa = snr(&x[..4096], &TrellisParams { l, k, scale: a }, 256);
                let fb = snr(&x[..4096], &TrellisParams { l, k, scale: b }, 256);
                if fa > fb {
                    hi = b;
                    if fa > best.1 {
                        best = (a, fa);
                    }
                } else {
                    lo = a;
                    if fb > best.1 {
                        best = (b, fb);
                    }
                }
            }
            let s = snr(
                &x,
                &TrellisParams {
                    l,
                    k,
                    scale: best.0,
                },
                256,
            );
            let bound = 6.0206 * k as f64;
            println!(
                "| {l} | {k} | {:.4} | {s:.2} | {bound:.2} | {:.2} |",
                best.0,
                bound - s
            );
        }
    }
}
