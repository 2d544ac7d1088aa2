//! Measures candidate trellis codes that reconstruct *two* values per state (QTIP's V = 2)
//! against this crate's one-value 1MAD code, on i.i.d. unit Gaussian data: the SNR each
//! reaches at its best scale, beside the bound 6.02·K dB. A pair code halves the state
//! extractions and hashes a GPU decoder spends per weight (`docs/eval/cuda_trellis_codes.md`
//! has their SASS counts and H200 timings); this says what each costs in quality.
//!
//! Run: `cargo run --release -p hypercodec-trellis --example pair_codes -- [L] [K] [values]`
//! (default 16 2 8192). A plain free-start, free-end Viterbi over 2^L states (no tail-biting,
//! no SIMD: the codes are compared on equal terms, not timed).

use hypercodec_trellis::code_sum;

/// A code: its name, values per state, and the values of a state (the stream's `L`-bit
/// window, oldest bit lowest), about unit variance before the scale.
struct Code {
    name: &'static str,
    v: usize,
    f: Box<dyn Fn(u32) -> [f32; 2]>,
}

const SD: f32 = 147.8019;

fn bytes(x: u32) -> [i32; 4] {
    [0, 8, 16, 24].map(|s| ((x >> s) & 255) as i32)
}

fn hash(s: u32) -> u32 {
    s.wrapping_mul(34_038_481).wrapping_add(76_625_530)
}

fn codes(l: u32) -> Vec<Code> {
    // Gaussian pairs for the table codes, from a fixed seed.
    let g = gaussian(2 << l.max(10), 99);
    let pairs: Vec<[f32; 2]> = g.chunks(2).map(|p| [p[0], p[1]]).collect();
    let direct = pairs[..1 << l].to_vec();
    let t1024 = pairs[..1024].to_vec();
    let t256 = pairs[..256].to_vec();
    vec![
        Code {
            name: "1MAD (this crate's code), one value per state",
            v: 1,
            f: Box::new(|s| [(code_sum(s) as f32 - 510.0) / SD, 0.0]),
        },
        Code {
            name: "pairs: two hashes, two byte sums",
            v: 2,
            f: Box::new(|s| {
                let x = hash(s);
                let y = x.wrapping_mul(0x9E37_79B9).wrapping_add(0x7F4A_7C15);
                let sum = |z: u32| (bytes(z).iter().sum::<i32>() - 510) as f32 / SD;
                [sum(x), sum(y)]
            }),
        },
        Code {
            name: "pairs: one hash, bytes·(1,1,1,1) and bytes·(1,2,−1,−2)",
            v: 2,
            f: Box::new(|s| {
                let b = bytes(hash(s));
                let a = (b.iter().sum::<i32>() - 510) as f32 / SD;
                let c = (b[0] + 2 * b[1] - b[2] - 2 * b[3]) as f32 / (SD * (10f32 / 4.0).sqrt());
                [a, c]
            }),
        },
        Code {
            name: "pairs: one hash, bytes·(1,1,1,1) and bytes·(1,−1,1,−1)",
            v: 2,
            f: Box::new(|s| {
                let b = bytes(hash(s));
                let a = (b.iter().sum::<i32>() - 510) as f32 / SD;
                [a, (b[0] - b[1] + b[2] - b[3]) as f32 / SD]
            }),
        },
        Code {
            name: "pairs: a table of 2^L Gaussian pairs indexed by the state",
            v: 2,
            f: Box::new(move |s| direct[s as usize]),
        },
        Code {
            name: "pairs: a table of 1024 Gaussian pairs, index = top 10 bits of 34038481·s",
            v: 2,
            f: Box::new(move |s| t1024[(s.wrapping_mul(34_038_481) >> 22) as usize]),
        },
        Code {
            name: "pairs: a table of 256 Gaussian pairs, index = top 8 bits of 34038481·s",
            v: 2,
            f: Box::new(move |s| t256[(s.wrapping_mul(34_038_481) >> 24) as usize]),
        },
    ]
}

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

/// The mean squared error of the best path for `x` under `code` at `scale`.
fn mse(x: &[f32], l: u32, k: u32, code: &Code, scale: f32) -> f64 {
    let v = code.v;
    let kk = k * v as u32;
    let (states, fan) = (1usize << l, 1usize << kk);
    let groups = states >> kk;
    // The Viterbi's index keeps the newest bits lowest: the reversed window.
    let tab: Vec<[f32; 2]> = (0..states as u32)
        .map(|s| (code.f)(s.reverse_bits() >> (32 - l)).map(|c| c * scale))
        .collect();
    let steps = x.len() / v;
    let (mut cost, mut next) = (vec![0f32; states], vec![0f32; states]);
    let mut back = vec![0u16; steps * groups];
    for i in 0..steps {
        let xs = [x[i * v], if v == 2 { x[i * v + 1] } else { 0.0 }];
        for j in 0..groups {
            let (mut m, mut arg) = (f32::INFINITY, 0);
            for t in 0..fan {
                if cost[t * groups + j] < m {
                    (m, arg) = (cost[t * groups + j], t);
                }
            }
            back[i * groups + j] = arg as u16;
            for q in 0..fan {
                let s = j * fan + q;
                let d: f32 = (0..v).map(|u| (xs[u] - tab[s][u]).powi(2)).sum();
                next[s] = m + d;
            }
        }
        let low = next.iter().copied().fold(f32::INFINITY, f32::min);
        next.iter_mut().for_each(|c| *c -= low);
        std::mem::swap(&mut cost, &mut next);
    }
    let mut s = (0..states)
        .min_by(|&a, &b| cost[a].total_cmp(&cost[b]))
        .unwrap_or(0);
    let mut err = 0f64;
    for i in (0..steps).rev() {
        for u in 0..v {
            err += ((x[i * v + u] - tab[s][u]) as f64).powi(2);
        }
        let j = s >> kk;
        s = ((back[i * groups + j] as usize) << (l - kk)) | j;
    }
    err / (steps * v) as f64
}

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .map_or(d, |a| a.parse().expect("a number"))
    };
    let (l, k, n) = (arg(1, 16) as u32, arg(2, 2) as u32, arg(3, 8192));
    assert!(
        (8..=16).contains(&l) && (1..=4).contains(&k) && 2 * k < l,
        "L 8..=16, K 1..=4"
    );
    let x = gaussian(n, 7);
    println!(
        "L = {l}, K = {k}, {n} unit Gaussian values; bound {:.2} dB",
        6.02 * k as f64
    );
    println!("| code | L | SNR dB | scale |\n|---|---:|---:|---:|");
    for code in codes(l) {
        // The best scale on a grid of 0.05 (the refit fixed point lies within it).
        let (best, scale) = (0..10)
            .map(|i| 0.8 + 0.05 * i as f32)
            .map(|s| (mse(&x, l, k, &code, s), s))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("scales");
        println!(
            "| {} | {l} | {:.2} | {scale:.2} |",
            code.name,
            -10.0 * best.log10()
        );
    }
}
