//! Encode and decode speed of the trellis on one core: `cargo run --release -p
//! hypercodec-trellis --example speed [L] [K]`.

use hypercodec_trellis::{decode, TrellisParams};
use std::time::Instant;

fn main() {
    let mut a = std::env::args()
        .skip(1)
        .filter_map(|v| v.parse::<u8>().ok());
    let (l, k) = (a.next().unwrap_or(12), a.next().unwrap_or(4));
    let seq: usize = std::env::var("TRELLIS_SEQ")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let p = TrellisParams::new(l, k);
    let x: Vec<f32> = (0..1 << 14)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 290.0)
        .collect();
    let t = Instant::now();
    let mut enc = hypercodec_trellis::Encoder::new(&p).expect("params");
    let streams: Vec<Vec<u8>> = x
        .chunks(seq)
        .map(|c| {
            let mut out = vec![0u8; seq * k as usize / 8];
            enc.encode_into(c, &mut out).expect("encode");
            out
        })
        .collect();
    let enc = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut n = 0;
    for s in &streams {
        n += decode(s, seq, &p).expect("decode").len();
    }
    let dec = t.elapsed().as_secs_f64();
    println!(
        "L {l} K {k}: encode {:.3} M values/s, decode {:.1} M values/s",
        x.len() as f64 / enc / 1e6,
        n as f64 / dec / 1e6
    );
}
