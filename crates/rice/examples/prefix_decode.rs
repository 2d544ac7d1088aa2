//! Times the CPU decoder of lane-interleaved prefix codes (`hypercodec_rice::prefix`) on a
//! 4096 × 4096 matrix of E8 words at about 4 bits a value (rounded Gaussian coordinates, the
//! GPU shape's chunks), pairs and 8-bit singles; median of 7, one thread:
//!
//! ```text
//! cargo run --release -p hypercodec-rice --example prefix_decode
//! ```

use hypercodec_rice::prefix::{encode, Decoder, Layout, PrefixParams, WORD};
use std::time::Instant;

fn main() {
    let (rows, cols) = (4096usize, 4096usize);
    let words = cols / WORD;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut uniform = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let zz = |v: i64| {
        if v >= 0 {
            2 * v as u32
        } else {
            (-2 * v - 1) as u32
        }
    };
    let spread = 4.0;
    let mut symbols = Vec::with_capacity(rows * cols);
    for _ in 0..rows * words {
        let mut gauss = || {
            let (a, b) = (uniform().max(1e-12), uniform());
            (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
        };
        let t = zz((gauss() * spread / 2.0).round() as i64);
        let rest: Vec<u32> = (1..WORD)
            .map(|_| zz((gauss() * spread).round() as i64))
            .collect();
        symbols.push(2 * t + (uniform() < 0.5) as u32);
        symbols.extend(rest);
    }
    println!("| codes | ms (median of 7) | ns a symbol | payload bits a symbol |");
    println!("|---|---:|---:|---:|");
    for (name, pair_limit) in [("pairs (8, 12)", 12u8), ("singles (8)", 0)] {
        let mut p = PrefixParams {
            pair_limit,
            ..PrefixParams::default()
        };
        p.segment = PrefixParams::segment_for(words, 1 << 14);
        p.span = PrefixParams::span_for(words, p.segment, 1 << 14);
        let layout = Layout::new(rows, words, &p);
        let s = encode(&symbols, &layout, &p).expect("encodes");
        let d = Decoder::new(&s.model, &s.index, &s.payload, layout, &p).expect("valid streams");
        let mut out = vec![0u32; rows * cols];
        let mut times: Vec<f64> = (0..7)
            .map(|_| {
                let t = Instant::now();
                d.decode_groups(0..layout.groups(), &mut out)
                    .expect("decodes");
                t.elapsed().as_secs_f64()
            })
            .collect();
        assert_eq!(out, symbols, "the decoder gives back the symbols");
        times.sort_by(f64::total_cmp);
        let n = (rows * cols) as f64;
        println!(
            "| {name} | {:.1} | {:.2} | {:.3} |",
            times[3] * 1e3,
            times[3] * 1e9 / n,
            s.payload.len() as f64 * 8.0 / n
        );
    }
}
