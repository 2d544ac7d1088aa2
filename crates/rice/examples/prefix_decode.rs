//! Times the CPU decoder of lane-interleaved prefix codes (`hypercodec_rice::prefix`) on the E8
//! symbols of a 4096 × 4096 matrix at the lattice scale of 4 bits a value in rANS (the RHT makes
//! the seeded uniform input Gaussian), in the GPU shape's chunks, pairs and 8-bit singles;
//! median of 7, one thread:
//!
//! ```text
//! cargo run --release -p hypercodec-rice --example prefix_decode
//! ```

use hypercodec_lattice::{calibration, quantize_rows, tile_for, Lattice, LatticeParams};
use hypercodec_rice::prefix::{encode, Decoder, Layout, PrefixParams, WORD};
use std::time::Instant;

fn main() {
    let (rows, cols) = (4096usize, 4096usize);
    let words = cols / WORD;
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let x: Vec<f32> = (0..rows * cols)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    let params = LatticeParams {
        lattice: Lattice::E8,
        alpha: calibration::alpha_for_bps(Lattice::E8, 4.0),
        tile: tile_for(cols, 4096),
        seed: 1,
        fixed_bits: None,
        dither: false,
    };
    let symbols = quantize_rows(&x, rows, cols, &params, |v| v)
        .expect("quantizes")
        .symbols;
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
