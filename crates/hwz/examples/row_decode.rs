//! Decoding one row block of an entropy-coded tensor through a [`TensorView`], against the
//! whole decode, with the default 2^18-symbol chunks and with chunks aligned to the block.
//!
//! `cargo run --release -p hypercodec-hwz --example row_decode [ROWS COLS BLOCK_ROWS]`
//! (default 11008 4096 32: an LLM MLP matrix at E8 + rANS, 4.0 bits per value all-in) prints a
//! Markdown table: bits per value, the stored bytes one block reads against its share of the
//! symbol stream, and the medians of the whole decode (all pool threads) and of one block's
//! decode (one thread), over the same run.

use hypercodec_hwz::{
    encode_to_rate, role, Coding, EncodeOptions, Encoding, FloatDtype, Lattice, TensorView,
};
use std::time::Instant;

fn median(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[runs / 2]
}

fn gaussian(n: usize) -> Vec<f32> {
    let mut s = 12345u64;
    let mut next = move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        (hypercodec_lattice::rht::mix64(s) >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            ((-2.0 * (1.0 - next()).ln()).sqrt() * (std::f64::consts::TAU * next()).cos()) as f32
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rows = args.first().copied().unwrap_or(11008);
    let cols = args.get(1).copied().unwrap_or(4096);
    let block = args.get(2).copied().unwrap_or(32);
    let x = gaussian((rows * cols) as usize);
    let shape = [rows, cols];
    let plain = Encoding::Lattice {
        lattice: Lattice::E8,
        alpha: 1.0,
        tile: hypercodec_lattice::tile_for(cols as usize, 4096) as u32,
        seed: 0,
        scale_dtype: FloatDtype::F16,
        coding: Coding::RANS_DEFAULT,
    };
    println!(
        "{rows}×{cols} E8 + rANS @4.0 bps, blocks of {block} rows, {} pool threads\n",
        rayon::current_num_threads()
    );
    // The cost of alignment at one fixed α (the rate-controlled rows below absorb it in SNR).
    let alpha = hypercodec_lattice::calibration::alpha_for_bps(Lattice::E8, 4.0);
    let fixed_bps = |e: &Encoding| -> Result<f64, hypercodec_hwz::HwzError> {
        let t = hypercodec_hwz::encode(
            "w",
            &x,
            &shape,
            &e.with_alpha(alpha),
            EncodeOptions::default(),
        )?;
        Ok(t.payload_bytes() as f64 * 8.0 / x.len() as f64)
    };
    let (a, b) = (
        fixed_bps(&plain)?,
        fixed_bps(&plain.with_row_aligned_chunks(cols, block))?,
    );
    println!(
        "at α = {alpha:.3}: {a:.4} bps with 2^18-symbol chunks, {b:.4} aligned: alignment costs {:+.4} bps\n",
        b - a
    );
    println!("| chunks | bps all-in | block reads B | block's share B | read / share | whole decode ms | one block ms | block / whole |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (label, template) in [
        ("2^18 symbols (default)", plain.clone()),
        (
            "aligned to the block",
            plain.with_row_aligned_chunks(cols, block),
        ),
    ] {
        let t = encode_to_rate("w", &x, &shape, &template, 4.0, EncodeOptions::default())?;
        let bps = t.payload_bytes() as f64 * 8.0 / x.len() as f64;
        let refs: Vec<(&str, &[u8])> = t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
        let view = TensorView::new("w", &t.encoding, &shape, &refs)?;
        let symbols = refs
            .iter()
            .find(|(r, _)| *r == role::SYMBOLS)
            .map_or(0, |(_, b)| b.len()) as f64;
        let blocks = rows / block;
        let share = symbols * block as f64 / rows as f64;
        let mut read = Vec::new();
        for b in 0..blocks {
            read.push(view.stored_bytes_for_rows(b * block..(b + 1) * block)? as f64);
        }
        read.sort_by(|a, b| a.total_cmp(b));
        let read = read[read.len() / 2];
        let mut whole = vec![0f32; x.len()];
        let whole_s = median(5, || {
            view.decode_rows_into(0..rows, &mut whole).expect("decode");
        });
        let mut part = vec![0f32; (block * cols) as usize];
        let mut b = 0u64;
        let block_s = median(31, || {
            let r = (b * 7 % blocks) * block;
            b += 1;
            view.decode_rows_into(r..r + block, &mut part)
                .expect("decode");
        });
        // The block is the same rows as the whole decode, bit for bit.
        let r = (blocks / 2) * block;
        view.decode_rows_into(r..r + block, &mut part)?;
        let same = part
            .iter()
            .zip(&whole[(r * cols) as usize..((r + block) * cols) as usize])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "block decode differs from the whole decode");
        println!(
            "| {label} | {bps:.4} | {read:.0} | {share:.0} | {:.2} | {:.1} | {:.2} | 1/{:.0} |",
            read / share,
            whole_s * 1e3,
            block_s * 1e3,
            whole_s / block_s
        );
    }
    Ok(())
}
