//! Throughput of each stage of the lattice path on one core, on a seeded Gaussian
//! 4096 × 4096 tensor at about 4 bits per value, beside memcpy of the same f32 bytes.
//!
//! `cargo run --release -p hypercodec-hwz --example lattice_speed [ROWS COLS]`
//! prints a Markdown table: median of 5 runs, in millions of values (or symbols) per second.

use hypercodec_hwz::{decode_into, encode, Coding, EncodeOptions, Encoding, FloatDtype, Lattice};
use hypercodec_lattice::{dequantize_rows, quantize_rows, LatticeParams, Rht};
use hypercodec_rice::{rans, rice};
use std::time::Instant;

fn median(mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[2]
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

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rows, cols) = (
        args.first().copied().unwrap_or(4096),
        args.get(1).copied().unwrap_or(4096),
    );
    let n = rows * cols;
    let x = gaussian(n);
    let alpha = hypercodec_lattice::calibration::alpha_for_bps(Lattice::E8, 4.0);
    let p = LatticeParams {
        lattice: Lattice::E8,
        alpha,
        tile: hypercodec_lattice::tile_for(cols, 4096),
        seed: 1,
        fixed_bits: None,
        dither: false,
    };
    let e8 = |j: usize, f: u32| Lattice::E8.context(j, f);
    let ctx = rans::Contexts {
        word: 8,
        count: 3,
        map: &e8,
        first_free: false,
    };
    let rp = rans::RansParams::default();
    let q = quantize_rows(&x, rows, cols, &p, |s| FloatDtype::F16.round(s)).expect("quantize");
    let rs = rans::encode(&q.symbols, ctx, &rp).expect("rans");
    let ri = rice::encode(&q.symbols, 2048).expect("rice");
    let mut sym = vec![0u32; q.symbols.len()];
    let mut out = vec![0f32; n];
    let mut rows_buf = x.clone();
    let rht = Rht::new(cols, p.tile, 1).expect("rht");
    let enc = |coding| Encoding::Lattice {
        lattice: Lattice::E8,
        alpha,
        tile: p.tile as u32,
        seed: 1,
        scale_dtype: FloatDtype::F16,
        coding,
    };
    let rans_enc = enc(Coding::Rans {
        chunk: 1 << 18,
        lanes: 32,
        prob_bits: 14,
    });
    let rice_enc = enc(Coding::Rice { chunk: 2048 });
    let shape = [rows as u64, cols as u64];
    let t_rans = encode("w", &x, &shape, &rans_enc, EncodeOptions::default()).expect("encode");
    let t_rice = encode("w", &x, &shape, &rice_enc, EncodeOptions::default()).expect("encode");
    let refs = |t: &hypercodec_hwz::EncodedTensor| {
        t.streams
            .iter()
            .map(|(r, b)| (*r, b.clone()))
            .collect::<Vec<_>>()
    };
    let (sr, si) = (refs(&t_rans), refs(&t_rice));
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut copy = vec![0u8; bytes.len()];

    let rows_out: Vec<(&str, f64)> = vec![
        (
            "memcpy of the f32 tensor (peer)",
            median(|| copy.copy_from_slice(&bytes)),
        ),
        (
            "RHT forward (tile 4096)",
            median(|| rows_buf.chunks_exact_mut(cols).for_each(|r| rht.forward(r))),
        ),
        (
            "RHT inverse",
            median(|| rows_buf.chunks_exact_mut(cols).for_each(|r| rht.inverse(r))),
        ),
        (
            "RHT + scale + E8 nearest point (quantize_rows)",
            median(|| drop(quantize_rows(&x, rows, cols, &p, |s| s))),
        ),
        (
            "E8 decode + scale + RHT inverse (dequantize_rows)",
            median(|| drop(dequantize_rows(&q.symbols, &q.scales, rows, cols, &p))),
        ),
        (
            "rANS encode (symbols)",
            median(|| drop(rans::encode(&q.symbols, ctx, &rp))),
        ),
        (
            "rANS decode (symbols)",
            median(|| rans::decode(&rs, ctx, &rp, &mut sym).expect("decode")),
        ),
        (
            "Rice encode (symbols)",
            median(|| drop(rice::encode(&q.symbols, 2048))),
        ),
        (
            "Rice decode, fast (symbols)",
            median(|| rice::decode(&ri, 2048, &mut sym).expect("decode")),
        ),
        (
            "Rice decode, reference (symbols)",
            median(|| rice::decode_ref(&ri, 2048, &mut sym).expect("decode")),
        ),
        ("fixed-rate 4-bit symbols: unpack (execution form)", {
            let codes: Vec<u8> = q.symbols.iter().map(|&s| (s & 15) as u8).collect();
            let packed = hypercodec_scalar::pack_bits(&codes, 4).expect("pack");
            let mut unpacked = vec![0u8; codes.len()];
            median(|| {
                hypercodec_scalar::unpack_bits_into(&packed, 4, &mut unpacked).expect("unpack")
            })
        }),
        (
            "full encode, E8 + rANS, one α (hwz::encode)",
            median(|| drop(encode("w", &x, &shape, &rans_enc, EncodeOptions::default()))),
        ),
        (
            "full decode, E8 + rANS (hwz::decode_into)",
            median(|| {
                let r: Vec<(&str, &[u8])> = sr.iter().map(|(a, b)| (*a, b.as_slice())).collect();
                decode_into("w", &rans_enc, &shape, &r, &mut out).expect("decode")
            }),
        ),
        (
            "full decode, E8 + Rice",
            median(|| {
                let r: Vec<(&str, &[u8])> = si.iter().map(|(a, b)| (*a, b.as_slice())).collect();
                decode_into("w", &rice_enc, &shape, &r, &mut out).expect("decode")
            }),
        ),
    ];
    println!("{rows}×{cols} Gaussian, E8 at α = {alpha:.3} (≈4 bps); rANS {:.3} bps, Rice {:.3} bps; one core, median of 5\n",
        t_rans.payload_bytes() as f64 * 8.0 / n as f64, t_rice.payload_bytes() as f64 * 8.0 / n as f64);
    println!("| stage | M values/s | GB/s of f32 |\n|---|---:|---:|");
    for (name, s) in rows_out {
        println!(
            "| {name} | {:.0} | {:.2} |",
            n as f64 / s / 1e6,
            n as f64 * 4.0 / s / 1e9
        );
    }
}
