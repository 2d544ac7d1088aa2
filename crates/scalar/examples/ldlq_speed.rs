//! The time to build the error-feedback factor of one layer ([`Ldlq::new`]: a Cholesky factor
//! and a triangular inverse, `n × n` in float64) on one thread and on the whole thread pool,
//! and to round 256 rows with it (affine INT4, groups of 128: [`affine_ldlq_codes`]) one row
//! per call against all rows in one call (rows share each read of the factor), on one thread;
//! in the same run, median of three.
//!
//! ```text
//! cargo run --release -p hypercodec-scalar --example ldlq_speed [n ...]
//! ```
use hypercodec_scalar::ldlq::Ldlq;
use hypercodec_scalar::{affine_ldlq_codes, AffineParams, FloatDtype, Group};
use std::time::Instant;

fn median_seconds(f: impl Fn()) -> f64 {
    let mut t: Vec<f64> = (0..3)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[1]
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![768, 1536, 4096]
    } else {
        sizes
    };
    let threads = rayon::current_num_threads();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    println!(
        "| n | factor, 1 thread s | factor, {threads} threads s | speed-up | 256 rows one per call s | 256 rows in one call s | speed-up |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        // ρ^|i−j| (positive definite for |ρ| < 1): the factor's cost does not depend on the values.
        let h: Vec<f32> = (0..n * n)
            .map(|k| 0.97f32.powi((k / n).abs_diff(k % n) as i32))
            .collect();
        let build = || {
            std::hint::black_box(Ldlq::new(&h, n, 0.01).expect("positive definite"));
        };
        let serial = one.install(|| median_seconds(build));
        let parallel = median_seconds(build);
        let f = Ldlq::new(&h, n, 0.01).expect("positive definite");
        let rows = 256;
        let w: Vec<f32> = (0..rows * n)
            .map(|k| ((k.wrapping_mul(2654435761) >> 7) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let p = AffineParams {
            bits: 4,
            group: Group::Size(128),
            symmetric: false,
            scale_dtype: FloatDtype::F16,
        };
        let by_row = one.install(|| {
            median_seconds(|| {
                for r in w.chunks(n) {
                    std::hint::black_box(affine_ldlq_codes(r, 1, n, &p, &f).expect("codes"));
                }
            })
        });
        let together = one.install(|| {
            median_seconds(|| {
                std::hint::black_box(affine_ldlq_codes(&w, rows, n, &p, &f).expect("codes"));
            })
        });
        println!(
            "| {n} | {serial:.2} | {parallel:.2} | {:.2}× | {by_row:.2} | {together:.2} | {:.2}× |",
            serial / parallel,
            by_row / together
        );
    }
}
