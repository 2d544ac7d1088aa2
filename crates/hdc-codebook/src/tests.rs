use super::*;
use crate::rng::Rng;

fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.normal()).collect()
}

/// The HDC index of `protos` (blocks of 8) the tests use.
fn index_of(protos: &[f32]) -> HdcIndex<'_> {
    HdcIndex::new(
        protos,
        8,
        HdcParams {
            dim: 64,
            buckets: 8,
            seed: 1,
        },
    )
    .unwrap()
}

fn snr(x: &[f32], y: &[f32]) -> f64 {
    let s: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
    let e: f64 = x
        .iter()
        .zip(y)
        .map(|(&a, &b)| ((a - b) as f64).powi(2))
        .sum();
    10.0 * (s / e).log10()
}

fn round_trip(x: &[f32], rows: usize, cols: usize, p: &CodebookParams) -> Vec<f32> {
    let cb = codebook::encode(x, rows, cols, p).unwrap();
    let mut out = vec![0f32; x.len()];
    codebook::decode_into(&cb.as_ref(p.block, p.scale_mode), rows, cols, &mut out).unwrap();
    out
}

#[test]
fn tensor_made_of_few_blocks_is_exact() {
    // 4 distinct blocks repeated: 4 prototypes reproduce the tensor up to f16 rounding.
    let shapes = [
        [1.0, -2.0, 3.0, 0.5],
        [0.0, 0.0, 1.0, 1.0],
        [-1.0, -1.0, -1.0, 2.0],
        [4.0, 0.0, -4.0, 0.25],
    ];
    let x: Vec<f32> = (0..64).flat_map(|i| shapes[(i * 7) % 4]).collect();
    for mode in [ScaleMode::Tensor, ScaleMode::Channel, ScaleMode::Block] {
        let p = CodebookParams {
            block: 4,
            prototypes: 4,
            scale_mode: mode,
            ..Default::default()
        };
        let y = round_trip(&x, 16, 16, &p);
        assert!(snr(&x, &y) > 50.0, "{mode:?}: {} dB", snr(&x, &y));
    }
}

#[test]
fn no_more_blocks_than_prototypes_is_exact_under_bucketed_search() {
    // Each block is a prototype of its own; the buckets could send a block to another one
    // (a 1 × 16 weight at 4-value blocks came back 0.78 off for some seeds).
    for seed in 0..8 {
        for (rows, cols, block, k) in [
            (1, 16, 4, 4096),
            (1, 16, 4, 256),
            (2, 8, 8, 256),
            (1, 32, 8, 4096),
        ] {
            let x = gaussian(rows * cols, seed);
            let p = CodebookParams {
                block,
                prototypes: k,
                ..Default::default()
            };
            assert!(p.hdc.is_some());
            let y = round_trip(&x, rows, cols, &p);
            assert!(
                snr(&x, &y) > 40.0,
                "{rows}x{cols} b{block} k{k} seed {seed}: {} dB",
                snr(&x, &y)
            );
        }
    }
}

#[test]
fn more_prototypes_more_snr_and_padding_rows() {
    let (rows, cols) = (64, 100); // 100 is not a multiple of 8: padded last block
    let x = gaussian(rows * cols, 1);
    let mut last = 0.0;
    for k in [4, 32, 256] {
        let p = CodebookParams {
            prototypes: k,
            ..Default::default()
        };
        let s = snr(&x, &round_trip(&x, rows, cols, &p));
        assert!(s > last + 0.5, "k {k}: {s} dB after {last}");
        last = s;
    }
}

#[test]
fn hdc_assignment_is_close_to_exhaustive() {
    let (rows, cols) = (256, 256);
    let x = gaussian(rows * cols, 2);
    let exact = CodebookParams {
        hdc: None,
        ..Default::default()
    };
    let fast = CodebookParams::default();
    let se = snr(&x, &round_trip(&x, rows, cols, &exact));
    let sf = snr(&x, &round_trip(&x, rows, cols, &fast));
    assert!(
        sf <= se + 0.05 && sf > se - 0.6,
        "hdc {sf} dB vs exact {se} dB"
    );
}

#[test]
fn hdc_index_returns_an_exactly_compared_prototype() {
    let protos = gaussian(64 * 8, 3);
    let idx = index_of(&protos);
    for q in gaussian(100 * 8, 4).chunks_exact(8) {
        let (i, d) = idx.nearest(q);
        let exact = kmeans::dist2(&protos[i as usize * 8..][..8], q);
        assert_eq!(d, exact);
        // A prototype equal to the query is always found.
    }
    let q = &protos[5 * 8..6 * 8];
    assert_eq!(idx.nearest(q), (5, 0.0));
}

#[test]
fn invalid_params_and_input_are_typed_errors() {
    let x = vec![0f32; 16];
    let bad = CodebookParams {
        block: 1,
        ..Default::default()
    };
    assert!(matches!(
        codebook::encode(&x, 4, 4, &bad),
        Err(HdcError::InvalidParams { .. })
    ));
    let bad = CodebookParams {
        hdc: Some(HdcParams {
            dim: 2,
            buckets: 8,
            seed: 0,
        }),
        ..Default::default()
    };
    assert!(matches!(
        codebook::encode(&x, 4, 4, &bad),
        Err(HdcError::InvalidParams { .. })
    ));
    let mut y = x.clone();
    y[3] = f32::NAN;
    assert_eq!(
        codebook::encode(&y, 4, 4, &CodebookParams::default()),
        Err(HdcError::NonFinite { index: 3 })
    );
    assert!(matches!(
        codebook::encode(&x, 3, 4, &CodebookParams::default()),
        Err(HdcError::Shape { .. })
    ));
    let cb = codebook::encode(
        &x,
        4,
        4,
        &CodebookParams {
            block: 4,
            prototypes: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let mut bad = cb.clone();
    bad.assignments[0] = 9;
    let mut out = vec![0f32; 16];
    assert!(codebook::decode_into(&bad.as_ref(4, ScaleMode::Channel), 4, 4, &mut out).is_err());
}

#[test]
fn zero_tensor_decodes_to_zero() {
    let x = vec![0f32; 256];
    let y = round_trip(&x, 16, 16, &CodebookParams::default());
    assert!(y.iter().all(|&v| v == 0.0));
}

#[test]
fn low_rank_recovers_a_low_rank_matrix() {
    let (rows, cols, r) = (48, 40, 3);
    let a = gaussian(rows * r, 5);
    let b = gaussian(cols * r, 6);
    let m: Vec<f32> = (0..rows)
        .flat_map(|i| {
            let (a, b) = (&a, &b);
            (0..cols).map(move |j| (0..r).map(|k| a[i * r + k] * b[j * r + k]).sum::<f32>())
        })
        .collect();
    let lr = lowrank::fit(&m, rows, cols, r, 6, 0).unwrap();
    let mut out = vec![0f32; m.len()];
    lowrank::decode_into(&lr, rows, cols, &mut out).unwrap();
    assert!(snr(&m, &out) > 30.0, "{} dB", snr(&m, &out));
    let lr1 = lowrank::fit(&m, rows, cols, 1, 6, 0).unwrap();
    lowrank::decode_into(&lr1, rows, cols, &mut out).unwrap();
    assert!(snr(&m, &out) < 20.0, "rank 1 cannot be that good");
    assert!(lowrank::fit(&m, rows, cols, 0, 6, 0).is_err());
    // The same matrix at magnitudes far from 1 (near f32's largest, 1e-30, subnormal): finite
    // scales and the same fit, relative to its size (subnormals lose their low bits). The
    // subnormal one had infinite scales, refused as corrupt when decoded.
    for (scale, floor) in [(1e36f32, 30.0), (1e-30, 30.0), (1e-40, 5.0)] {
        let big: Vec<f32> = m.iter().map(|v| v * scale).collect();
        let lr = lowrank::fit(&big, rows, cols, r, 6, 0).unwrap();
        assert!(lr
            .u_scales
            .iter()
            .chain(&lr.v_scales)
            .all(|s| s.is_finite()));
        lowrank::decode_into(&lr, rows, cols, &mut out).unwrap();
        let db = snr(&big, &out);
        assert!(db > floor, "{scale}: {db} dB");
    }
}

#[test]
fn low_rank_rank_one_product() {
    let (rows, cols) = (40usize, 48usize);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i / cols) as f32 * 0.1).cos() * ((i % cols) as f32 * 0.2).sin())
        .collect();
    for r in [1, 2] {
        let lr = lowrank::fit(&w, rows, cols, r, 4, 0).unwrap();
        let mut out = vec![0f32; w.len()];
        lowrank::decode_into(&lr, rows, cols, &mut out).unwrap();
        assert!(snr(&w, &out) > 40.0, "rank {r}: {} dB", snr(&w, &out));
    }
}

#[test]
fn hostile_sizes_are_typed_errors_or_leave_outputs_alone() {
    let protos = gaussian(64 * 8, 1);
    // Blocks of 0 values: an error, not a division by zero.
    assert!(HdcIndex::new(
        &protos,
        0,
        HdcParams {
            dim: 64,
            buckets: 8,
            seed: 1
        }
    )
    .is_err());
    assert_eq!(kmeans::nearest_brute(&protos, 0, &[]).1, f32::INFINITY);
    for (block, k) in [(0, 4), (8, 0), (8, 1 << 40), (1 << 20, 4)] {
        assert!(
            matches!(
                kmeans::train(&protos, block, k, 2, 0),
                Err(HdcError::InvalidParams { .. })
            ),
            "{block} {k}"
        );
    }
    assert_eq!(kmeans::train(&protos, 8, 4, 2, 0).unwrap().len(), 32);
    // `out` longer than the blocks held: the rest is left as it was.
    let idx = index_of(&protos);
    let mut out = [u32::MAX; 4];
    idx.assign(&protos[..16], &mut out);
    assert!(out[..2].iter().all(|&a| a < 64) && out[2..] == [u32::MAX; 2]);
    let mut out = [u32::MAX; 3];
    kmeans::assign_brute(&protos, 8, &protos[..8], &mut out);
    assert!(out[0] == 0 && out[1..] == [u32::MAX; 2]);
    // rows·cols past usize: typed errors (they wrapped to match an empty buffer).
    let p = CodebookParams::default();
    assert!(matches!(
        codebook::encode(&[], 1 << 32, 1 << 32, &p),
        Err(HdcError::Shape { .. })
    ));
    assert!(matches!(
        lowrank::fit(&[], 1 << 62, 4, 1, 1, 0),
        Err(HdcError::Shape { .. })
    ));
    let lr = lowrank::LowRank {
        u: vec![],
        u_scales: vec![1.0],
        v: vec![0; 4],
        v_scales: vec![1.0],
    };
    assert!(lowrank::decode_into(&lr, 1 << 62, 4, &mut []).is_err());
    assert_eq!(
        ScaleMode::Block.count(usize::MAX, usize::MAX, 1),
        usize::MAX
    );
}
