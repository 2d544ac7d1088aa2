//! Round trips, the tail-biting search against brute force, random access, hostile input.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use super::*;
use proptest::prelude::*;

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

/// `n` bytes of xorshift64 from state `s` (advanced), for streams of arbitrary bits.
fn random_bytes(n: usize, s: &mut u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *s ^= *s << 13;
            *s ^= *s >> 7;
            *s ^= *s << 17;
            *s as u8
        })
        .collect()
}

/// What the two-pass tail-biting search may lose against the free-start bound on 256 values.
const TAIL_BITING_SLACK: f64 = 0.05;

fn mse(x: &[f32], y: &[f32]) -> f64 {
    x.iter()
        .zip(y)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum::<f64>()
        / x.len() as f64
}

#[test]
fn code_values_are_about_unit_gaussian() {
    let v: Vec<f64> = (0..1u32 << 16).map(|s| code_value(s) as f64).collect();
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
    assert!(
        mean.abs() < 0.02 && (var - 1.0).abs() < 0.05,
        "{mean} {var}"
    );
}

#[test]
fn the_tail_biting_search_is_within_reach_of_brute_force() {
    // L = 8, K = 2, 10 values: every one of the 2^20 circular streams, decoded. One value a
    // state (2^(L−K) = 64 boundaries) or pairs (4 bits a step, 16 boundaries): all are tried,
    // so the search finds the exact optimum.
    for v in [1u8, 2] {
        let p = TrellisParams {
            l: 8,
            k: 2,
            scale: 1.0,
            v,
        };
        for seed in 0..4 {
            let x = gaussian(10, seed + 10 * (v as u64 - 1));
            let mut best = f64::INFINITY;
            for stream in 0u32..1 << 20 {
                let bits = stream.to_le_bytes()[..3].to_vec();
                best = best.min(mse(&x, &decode(&bits, 10, &p).unwrap()));
            }
            let ours = mse(&x, &decode(&encode(&x, &p).unwrap(), 10, &p).unwrap());
            assert!(
                ours >= best - 1e-9 && ours <= best * (1.0 + 1e-6) + 1e-9,
                "V {v} seed {seed}: {ours} vs best {best}"
            );
        }
    }
}

#[test]
fn tail_biting_costs_almost_nothing_on_long_sequences() {
    // Against the free-start optimum (a lower bound of any tail-biting path): the boundary
    // constrains about (L − K)/K of 256 values.
    for (l, k) in [(10u8, 2u8), (12, 3)] {
        let p = TrellisParams {
            l,
            k,
            scale: 1.0,
            v: 1,
        };
        let x = gaussian(256, l as u64);
        let e = Encoder::new(&p).unwrap();
        let mut v = Viterbi::new(1 << l, 1 << (l - k), x.len());
        let (_, free) = v.run(
            &x,
            1,
            &e.sums,
            p.scale,
            k as u32,
            (l - k) as u32,
            Start::Free,
            e.step,
        );
        let ours = mse(&x, &decode(&encode(&x, &p).unwrap(), 256, &p).unwrap()) * 256.0;
        assert!(
            ours <= free * (1.0 + TAIL_BITING_SLACK) + 1e-6,
            "L {l} K {k}: {ours} vs {free}"
        );
    }
}

#[test]
fn snr_approaches_the_bound_on_gaussian_data() {
    // Sequences of 256 values, L = 12: within 1.3 dB of 6.02·K dB at K = 2, 3, 4.
    let x = gaussian(1 << 13, 3);
    for k in 2..=4u8 {
        let p = TrellisParams::new(12, k);
        let (mut sig, mut err) = (0f64, 0f64);
        for c in x.chunks(256) {
            let y = decode(&encode(c, &p).unwrap(), c.len(), &p).unwrap();
            sig += c.iter().map(|v| (*v as f64).powi(2)).sum::<f64>();
            err += mse(c, &y) * c.len() as f64;
        }
        let snr = 10.0 * (sig / err).log10();
        assert!(snr > 6.0206 * k as f64 - 1.3, "K = {k}: {snr:.2} dB");
    }
}

#[test]
fn pairs_reach_their_calibration_and_stay_near_one_value_per_state() {
    // Other data than the calibration's, sequences of 1024: each pair code within 0.25 dB of
    // its table's SNR, and within 0.15 dB (L = 16, 2 bits) to 0.5 dB (4 bits) of the 1MAD code.
    let x = gaussian(1 << 12, 5);
    let sig: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
    let snr = |p: &TrellisParams| {
        let err: f64 = x
            .chunks(1024)
            .map(|c| mse(c, &decode(&encode(c, p).unwrap(), c.len(), p).unwrap()) * c.len() as f64)
            .sum();
        10.0 * (sig / err).log10()
    };
    for (l, k, gap) in [(12u8, 2u8, 0.35), (14, 3, 0.3), (16, 2, 0.15), (16, 4, 0.5)] {
        let (one, two) = (
            snr(&TrellisParams::new(l, k)),
            snr(&TrellisParams::pairs(l, k)),
        );
        let table = TrellisParams::pair_snr_db(l, k).unwrap() as f64;
        assert!(
            (two - table).abs() < 0.25,
            "L {l} K {k}: {two:.2} dB vs table {table:.2}"
        );
        assert!(
            two > one - gap,
            "L {l} K {k}: pairs {two:.2} dB, 1MAD {one:.2}"
        );
        assert!(
            two < 6.0206 * k as f64,
            "L {l} K {k}: {two:.2} dB beats the bound"
        );
    }
}

#[test]
fn pair_values_are_about_unit_gaussian_and_uncorrelated() {
    let (mut m, mut v, mut c) = ([0f64; 2], [0f64; 2], 0f64);
    let n = 1u32 << 16;
    for s in 0..n {
        let p = pair_sums(s).map(|q| (q as f64 - 510.0) / 147.8019);
        for j in 0..2 {
            m[j] += p[j];
            v[j] += p[j] * p[j];
        }
        c += p[0] * p[1];
    }
    let n = n as f64;
    for j in 0..2 {
        assert!((m[j] / n).abs() < 0.02, "mean {}", m[j] / n);
        assert!((v[j] / n - 1.0).abs() < 0.03, "variance {}", v[j] / n);
    }
    assert!((c / n).abs() < 0.02, "correlation {}", c / n);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn decode_inverts_encode_and_any_value_decodes_alone(
        l in 8u8..=16,
        k in 1u8..=8,
        n in 16usize..80,
        seed in any::<u64>(),
    ) {
        let k = k.min(l - 1);
        // Pairs where they are defined (K ≤ 4, 2K < L; an even length).
        let v = if k <= 4 && 2 * k < l && seed % 2 == 0 { 2 } else { 1 };
        let n = n / v as usize * v as usize;
        let p = TrellisParams { l, k, scale: 1.1, v };
        let x = gaussian(n, seed);
        let bits = encode(&x, &p).unwrap();
        prop_assert_eq!(bits.len(), (n * k as usize).div_ceil(8));
        let y = decode(&bits, n, &p).unwrap();
        for (i, &v) in y.iter().enumerate() {
            prop_assert_eq!(value_at(&bits, n, &p, i).unwrap(), v);
        }
        // The search never does worse than the all-zero stream, a valid tail-biting path.
        let zeros = decode(&vec![0u8; bits.len()], n, &p).unwrap();
        prop_assert!(mse(&x, &y) <= mse(&x, &zeros) + 1e-9);
    }

    #[test]
    fn any_bytes_decode_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..64), n in 0usize..200, l in 0u8..20, k in 0u8..10, v in 0u8..4) {
        let p = TrellisParams { l, k, scale: 1.0, v };
        let _ = decode(&bytes, n, &p);
        let _ = value_at(&bytes, n, &p, n / 2);
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let x = gaussian(64, 1);
    let bad = |l, k| TrellisParams {
        l,
        k,
        scale: 1.0,
        v: 1,
    };
    assert!(matches!(
        encode(&x, &bad(7, 2)),
        Err(TrellisError::InvalidParams { .. })
    ));
    assert!(matches!(
        encode(&x, &bad(12, 12)),
        Err(TrellisError::InvalidParams { .. })
    ));
    assert!(matches!(
        encode(&x[..3], &bad(12, 2)),
        Err(TrellisError::TooShort { .. })
    ));
    let mut nan = x.clone();
    nan[5] = f32::NAN;
    assert!(matches!(
        encode(&nan, &bad(10, 2)),
        Err(TrellisError::NonFinite { index: 5 })
    ));
    assert!(matches!(
        decode(&[0u8; 3], 64, &bad(10, 2)),
        Err(TrellisError::Length { .. })
    ));
    let with_v = |l, k, v| TrellisParams {
        l,
        k,
        scale: 1.0,
        v,
    };
    for (l, k, v) in [(12, 5, 2), (8, 4, 2), (12, 2, 0), (12, 2, 3)] {
        assert!(
            matches!(
                encode(&x, &with_v(l, k, v)),
                Err(TrellisError::InvalidValuesPerState { .. })
            ),
            "L {l} K {k} V {v}"
        );
    }
    assert!(matches!(
        encode(&x[..63], &with_v(12, 2, 2)),
        Err(TrellisError::OddLength { n: 63 })
    ));
    assert!(matches!(
        value_at(&[0u8; 16], 63, &with_v(12, 2, 2), 3),
        Err(TrellisError::OddLength { n: 63 })
    ));
}

#[test]
fn the_simd_steps_equal_the_portable_one() {
    // (L, bits per step, values a state): pairs step 2K bits.
    let cases = [
        (10u32, 1u32, 1usize),
        (11, 2, 1),
        (12, 3, 1),
        (12, 4, 1),
        (13, 5, 1),
        (14, 8, 1),
    ]
    .into_iter()
    .chain([(10, 2, 2), (12, 4, 2), (14, 6, 2), (16, 8, 2)]);
    for (l, k, v) in cases {
        let (states, groups) = (1usize << l, 1usize << (l - k));
        let top = l - k;
        let cost: Vec<u32> = gaussian(states, l as u64)
            .iter()
            .enumerate()
            .map(|(s, v)| tagged(1.0 + v.abs(), s, k, top))
            .collect();
        let sums: Vec<u16> = (0..(v * states) as u32)
            .map(|s| code_sum(s) as u16)
            .collect();
        let x = Point {
            xc: 0.3 + 510.0 / 147.8,
            c1: 1.0 / 147.8,
            xc2: -0.7 + 510.0 / 147.8,
        };
        let run = |f: StepFn| {
            let (mut back, mut next) = (vec![0u8; groups], vec![0u32; states]);
            // SAFETY: every step is called only where the CPU has its features (step_fn).
            let low = unsafe { f(&cost, &mut back, &mut next, &sums, x, k, 0.25) };
            (back, next, low)
        };
        let (portable, avx2): (StepFn, StepFn) = if v == 2 {
            (step_portable::<2>, x86_or(step_portable::<2>, true))
        } else {
            (step_portable::<1>, x86_or(step_portable::<1>, false))
        };
        let want = run(portable);
        assert_eq!(want, run(step_fn(groups, v == 2)), "L {l} K {k} V {v}");
        assert_eq!(want, run(avx2), "L {l} K {k} V {v}: AVX2");
    }
}

/// The AVX2 step of one or two values a state where the CPU has it, else `fallback`.
fn x86_or(fallback: StepFn, pairs: bool) -> StepFn {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        return if pairs {
            x86::step_avx2::<2>
        } else {
            x86::step_avx2::<1>
        };
    }
    let _ = pairs;
    fallback
}

#[test]
fn pair_streams_decode_as_random_access_reads_them() {
    // Any bytes are a valid pair stream: the (AVX2) decoder against `value_at`, bit for bit,
    // with lengths that leave partial blocks of eight steps and wrapped windows.
    let mut s = 0x5eed_u64;
    for (l, k) in [(12u8, 2u8), (16, 4), (10, 3), (16, 1), (9, 4)] {
        for n in [34usize, 64, 202, 1000] {
            if n * (k as usize) < l as usize {
                continue;
            }
            let p = TrellisParams::pairs(l, k);
            let bits = random_bytes((n * k as usize).div_ceil(8), &mut s);
            let got = decode(&bits, n, &p).unwrap();
            for (i, g) in got.iter().enumerate() {
                assert_eq!(
                    *g,
                    value_at(&bits, n, &p, i).unwrap(),
                    "L {l} K {k} n {n} i {i}"
                );
            }
        }
    }
}

#[test]
fn short_sequences_decode_as_random_access_reads_them() {
    // Streams of up to 64 bits (calibrated rows: 16 values) take the doubled-integer path of
    // `decode_into` (a few just longer take the other one); `value_at` reads each window
    // around the wrap with two window reads, checked bit by bit below.
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    for k in 1u8..=8 {
        for l in (k + 1).max(8)..=16 {
            for n in [2usize, 3, 4, 6, 8, 12, 16, 24, 32, 64] {
                if n * k as usize > 64 + 8 || n * (k as usize) < l as usize {
                    continue;
                }
                let p = TrellisParams {
                    l,
                    k,
                    scale: 0.5,
                    v: 1,
                };
                let bits = random_bytes((n * k as usize).div_ceil(8), &mut s);
                let got = decode(&bits, n, &p).unwrap();
                for (i, g) in got.iter().enumerate() {
                    assert_eq!(
                        *g,
                        value_at(&bits, n, &p, i).unwrap(),
                        "k {k} l {l} n {n} value {i}"
                    );
                }
            }
        }
    }
}

#[test]
fn wrapped_windows_read_the_circular_stream() {
    // Bit by bit around the wrap, against the two window reads `wrapped_state` makes.
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    for total in [8usize, 12, 16, 24, 40, 64, 100, 2048] {
        let bits = random_bytes(total.div_ceil(8), &mut s);
        for l in 8..=16usize.min(total) {
            for end in 1..l {
                let mut want = 0u32;
                for j in 0..l {
                    let pos = (end + total * 2 - l + j) % total;
                    want |= (((bits[pos / 8] >> (pos % 8)) & 1) as u32) << j;
                }
                assert_eq!(
                    wrapped_state(&bits, total, l, end),
                    want,
                    "total {total} l {l} end {end}"
                );
            }
        }
    }
}

#[test]
fn hostile_lengths_scales_and_windows_are_typed_errors_or_zeros() {
    let p = TrellisParams::new(12, 2);
    // `n` is checked against the stream before `n` values are allocated (4 TiB here).
    assert!(matches!(
        decode(&[0], 1 << 40, &p),
        Err(TrellisError::Length { .. })
    ));
    assert!(matches!(
        decode(&[0], usize::MAX, &p),
        Err(TrellisError::Length { .. })
    ));
    // An encoder of a scale that is not finite and positive (its Viterbi costs NaN).
    let x = gaussian(64, 3);
    for scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let q = TrellisParams { scale, ..p };
        assert_eq!(encode(&x, &q), Err(TrellisError::InvalidScale), "{scale}");
    }
    // Windows past the stream read zeros; L = 32 gives all four bytes.
    assert_eq!(window(&[0xff, 0xff], 100, 12), 0);
    assert_eq!(window(&[0xff; 4], 0, 32), u32::MAX);
    assert_eq!(window(&[0xab, 0xcd], 4, 8), 0xda);
}
