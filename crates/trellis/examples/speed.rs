//! Encode and decode speed of the trellis on one core: `cargo run --release -p
//! hypercodec-trellis --example speed [L] [K]`.

use hypercodec_trellis::{decode, encode, TrellisParams};
use std::time::Instant;

fn main() {
    let mut a = std::env::args()
        .skip(1)
        .filter_map(|v| v.parse::<u8>().ok());
    let (l, k) = (a.next().unwrap_or(12), a.next().unwrap_or(4));
    let p = TrellisParams {
        l,
        k,
        scale: TrellisParams::default_scale(l, k),
    };
    let x: Vec<f32> = (0..1 << 15)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 290.0)
        .collect();
    let t = Instant::now();
    let streams: Vec<Vec<u8>> = x
        .chunks(256)
        .map(|c| encode(c, &p).expect("encode"))
        .collect();
    let enc = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut n = 0;
    for s in &streams {
        n += decode(s, 256, &p).expect("decode").len();
    }
    let dec = t.elapsed().as_secs_f64();
    println!(
        "L {l} K {k}: encode {:.3} M values/s, decode {:.1} M values/s",
        x.len() as f64 / enc / 1e6,
        n as f64 / dec / 1e6
    );
}
