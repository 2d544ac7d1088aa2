//! SNR of the plain group fit (min/max or absmax, what `affine_encode` uses) against the
//! MSE-clipped one ([`GroupQuant::fit_clipped`], what the calibrated encoders use) on N(0, 1)
//! values, and the time of each: `cargo run --release -p hypercodec-scalar --example clip_probe`.
//!
//! Clipping raises the weights' SNR at every width up to 6 bits, but as the plain encoder's
//! default it made SmolLM2-135M's perplexity worse at 3 and 4 bits (2026-12-05,
//! `python -m hypercodec eval --models smollm2 --bps 2,3,4 --methods affine,affine-row
//! --no-speed`: INT4 g128 86.6 → 93.4, INT4 per-row 162.7 → 497.1, INT3 g128 1395 → 2362;
//! INT2 g128 8.5e7 → 2.3e6), so it stays with calibration.
use hypercodec_scalar::{AffineParams, Group, GroupQuant};

fn main() {
    // N(0, 1) by Box–Muller from a 64-bit LCG.
    let mut s = 0x1234_5678_9abc_def0u64;
    let mut u = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let n = 1 << 20;
    let v: Vec<f32> = (0..n)
        .map(|_| ((-2.0 * u().ln()).sqrt() * (std::f64::consts::TAU * u()).cos()) as f32)
        .collect();
    let sig: f64 = v.iter().map(|&x| (x as f64).powi(2)).sum();
    println!(
        "| group | bits | symmetric | fit dB | clipped dB | fit ns/value | clipped ns/value |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|");
    for glen in [32usize, 128, 1024] {
        for bits in 1..=8u8 {
            for symmetric in [false, true] {
                let p = AffineParams {
                    bits,
                    group: Group::Size(glen as u32),
                    symmetric,
                    ..Default::default()
                };
                let mut err = [0f64; 2];
                let mut ns = [0f64; 2];
                for (k, clipped) in [false, true].into_iter().enumerate() {
                    let t = std::time::Instant::now();
                    let fits: Vec<GroupQuant> = v
                        .chunks(glen)
                        .map(|g| {
                            if clipped {
                                GroupQuant::fit_clipped(g, &p)
                            } else {
                                GroupQuant::fit(g, &p)
                            }
                            .expect("fit")
                        })
                        .collect();
                    ns[k] = t.elapsed().as_secs_f64() * 1e9 / n as f64;
                    for (g, q) in v.chunks(glen).zip(&fits) {
                        err[k] += g
                            .iter()
                            .map(|&x| ((x - q.value(q.code(x))) as f64).powi(2))
                            .sum::<f64>();
                    }
                }
                let db = |e: f64| 10.0 * (sig / e).log10();
                println!(
                    "| {glen} | {bits} | {symmetric} | {:.2} | {:.2} | {:.1} | {:.1} |",
                    db(err[0]),
                    db(err[1]),
                    ns[0],
                    ns[1]
                );
            }
        }
    }
}
