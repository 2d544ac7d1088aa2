#![allow(clippy::unwrap_used)]
use super::*;
use crate::measure::decode;

/// `n` values spread over about ±1.67 in a fixed scrambled order (the candidates' test weight).
fn spread(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0)
        .collect()
}

fn planner(mode: Mode, names: &[&str]) -> Planner {
    let mut p = Planner::new(mode);
    p.candidates = names.iter().map(|n| Spec::parse(n).unwrap()).collect();
    p.thresholds.min_snr_db = f64::INFINITY; // exact only
    p
}

fn plan(p: &Planner, values: &[f32], shape: &[u64]) -> (TensorPlan, Vec<f32>) {
    let (tp, t) = p.plan_tensor("w", values, shape).unwrap();
    let t = t.unwrap_or_else(|| {
        tp.spec
            .encode("w", values, shape, Default::default())
            .unwrap()
    });
    let out = decode("w", shape, &t).unwrap();
    (tp, out)
}

/// Rows of 128 values; every row holds all of 0..levels so affine groups are exact.
fn ladder(rows: usize, levels: impl Fn(usize) -> usize) -> Vec<f32> {
    (0..rows)
        .flat_map(|r| {
            let l = levels(r);
            (0..128).map(move |c| ((c * 7 + r) % l) as f32 - (l / 2) as f32)
        })
        .collect()
}

#[test]
fn fp16_representable_tensor_is_fp16_under_best() {
    let v: Vec<f32> = (0..256).map(half_exact).collect();
    let p = planner(Mode::Best, &["f32", "bf16", "f16", "int8-row", "int4"]);
    let (tp, out) = plan(&p, &v, &[2, 128]);
    assert_eq!(tp.label, "raw-f16", "{tp:#?}");
    assert_eq!(out, v);
}

fn half_exact(i: usize) -> f32 {
    // 11 significant bits: exact in f16, not in bf16 (8 bits).
    (1024 + (i * 37) % 1024) as f32 / 2048.0 * if i.is_multiple_of(2) { 1.0 } else { -1.0 }
}

#[test]
fn integers_in_int4_range_are_int4_exactly() {
    let v = ladder(4, |_| 16); // -8..=7
    let p = planner(Mode::Best, &["f32", "bf16", "f16", "int8-row", "int4"]);
    let (tp, out) = plan(&p, &v, &[4, 128]);
    assert_eq!(tp.label, "affine-int4-g128-asym-f16");
    assert_eq!(out, v);
    assert_eq!(tp.rel_mse, 0.0);
}

#[test]
fn eps_and_prefer_bf16_decide_between_halves() {
    let small: Vec<f32> = (0..256).map(|i| (i % 9) as f32 - 4.0).collect(); // exact in both
    let mut p = planner(Mode::Best, &["f32", "bf16", "f16"]);
    assert_eq!(plan(&p, &small, &[2, 128]).0.label, "raw-f16");
    p.thresholds.prefer_bf16 = true;
    assert_eq!(plan(&p, &small, &[2, 128]).0.label, "raw-bf16");
    // Not exact in either: f32 at eps 0, bf16 once its error (≤ 2^-9) is allowed.
    let v: Vec<f32> = (0..256).map(|i| 1.0 + i as f32 * 1e-4).collect();
    let mut p = planner(Mode::Best, &["f32", "bf16"]);
    assert_eq!(plan(&p, &v, &[2, 128]).0.label, "raw-f32");
    p.thresholds.eps_bf16 = 0.004;
    assert_eq!(plan(&p, &v, &[2, 128]).0.label, "raw-bf16");
}

#[test]
fn lowest_and_highest() {
    let v: Vec<f32> = (0..512)
        .map(|i| ((i * 7919) % 1000) as f32 / 999.0)
        .collect();
    let names = ["f32", "f16", "int8-row", "int2"];
    assert_eq!(
        plan(&planner(Mode::Lowest, &names), &v, &[4, 128]).0.label,
        "affine-int2-g128-asym-f16"
    );
    assert_eq!(
        plan(&planner(Mode::Highest, &names), &v, &[4, 128]).0.label,
        "raw-f32"
    );
}

/// 10 blocks of 32 rows: `int2`-exact blocks, and blocks of 16 levels where only `int4` is
/// exact. `odd(b)` says which blocks are the 16-level ones.
fn blocky(odd: impl Fn(usize) -> bool) -> Vec<f32> {
    ladder(320, |r| if odd(r / 32) { 16 } else { 4 })
}

#[test]
fn allow_tolerates_a_few_blocks_best_does_not() {
    let v = blocky(|b| b == 3);
    let names = ["f32", "f16", "int4", "int2"];
    let (tp, _) = plan(&planner(Mode::Allow, &names), &v, &[320, 128]);
    assert_eq!(tp.label, "affine-int2-g128-asym-f16", "{}", tp.reason);
    // int4 is not exact on the 4-level blocks (its f16 scale 3/15 rounds): BEST needs f16.
    let (tp, out) = plan(&planner(Mode::Best, &names), &v, &[320, 128]);
    assert_eq!(tp.label, "raw-f16");
    assert_eq!(out, v);
    // CLOSEST and AVERAGE follow the 9-of-10 majority of block picks.
    assert_eq!(
        plan(&planner(Mode::Closest, &names), &v, &[320, 128])
            .0
            .label,
        "affine-int2-g128-asym-f16"
    );
    assert_eq!(
        plan(&planner(Mode::Average, &names), &v, &[320, 128])
            .0
            .label,
        "affine-int2-g128-asym-f16"
    );
}

#[test]
fn average_without_majority_and_per_block() {
    let v = blocky(|b| b % 2 == 1); // 5 and 5
    let names = ["f32", "f16", "int4", "int2"];
    // Mean of 2.25 and 4.25 bps is 3.25: a tie, broken toward precision.
    let (tp, _) = plan(&planner(Mode::Average, &names), &v, &[320, 128]);
    assert_eq!(tp.label, "affine-int4-g128-asym-f16", "{}", tp.reason);
    let (tp, _) = plan(&planner(Mode::Closest, &names), &v, &[320, 128]);
    assert_eq!(tp.label, "affine-int4-g128-asym-f16");
    let (tp, out) = plan(&planner(Mode::PerBlock, &names), &v, &[320, 128]);
    assert!(matches!(tp.spec, Spec::Mixed { .. }), "{tp:#?}");
    assert_eq!(out, v, "every block exact as planned");
    let whole_int4 = tp
        .candidates
        .iter()
        .find(|c| c.label.starts_with("affine-int4"))
        .unwrap();
    assert!(
        tp.bytes < whole_int4.bytes,
        "{} vs {}",
        tp.bytes,
        whole_int4.bytes
    );
    assert_eq!(tp.blocks.as_ref().unwrap().len(), 10);
}

#[test]
fn per_weight_repairs_the_few_values_the_base_misses() {
    let mut v = ladder(8, |_| 4);
    for i in [5usize, 300, 777] {
        v[i] = 0.5; // between two int2 levels; group min/max unchanged
    }
    let (tp, out) = plan(
        &planner(Mode::PerWeight, &["f32", "f16", "int2"]),
        &v,
        &[8, 128],
    );
    match &tp.spec {
        Spec::Exceptions { count, .. } => assert!(*count <= 3, "{count}"),
        s => panic!("{s:?}"),
    }
    assert_eq!(out, v);
}

fn gaussianish(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            let mut acc = 0f32;
            for _ in 0..4 {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                acc += (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            }
            acc * scale
        })
        .collect()
}

#[test]
fn budget_is_never_exceeded_and_buys_distortion() {
    let tensors: Vec<(String, Vec<f32>, Vec<u64>)> = (0..4)
        .map(|i| {
            (
                format!("t{i}"),
                gaussianish(64 * 128, i, 1.0 + i as f32),
                vec![64, 128],
            )
        })
        .collect();
    let mut p = Planner::new(Mode::Budget);
    p.candidates = ["bf16", "int8-row", "int4", "int2", "e8@2", "e8@3", "e8@4"]
        .iter()
        .map(|n| Spec::parse(n).unwrap())
        .collect();
    let mut base = Plan {
        version: 1,
        mode: Mode::Budget,
        thresholds: p.thresholds,
        target: None,
        block_rows: p.block_rows,
        tensors: tensors
            .iter()
            .map(|(n, v, s)| p.plan_tensor(n, v, s).unwrap().0)
            .collect(),
    };
    let mut last = f64::INFINITY;
    for bps in [2.3, 3.0, 3.5, 4.5, 8.0] {
        let mut plan = base.clone();
        let used = allocate(&mut plan, Target::Bps(bps), &Default::default()).unwrap();
        let budget = Target::Bps(bps).bytes(plan.total_elements());
        assert!(
            used <= budget && plan.total_bytes() <= budget,
            "{used} > {budget}"
        );
        let d: f64 = plan
            .tensors
            .iter()
            .map(|t| t.rel_mse * t.candidates[0].sse / t.candidates[0].rel_mse.max(1e-300))
            .sum();
        assert!(d < last, "{bps} bps: {d} !< {last}");
        last = d;
        // The chosen recipes replay to the measured bytes.
        for (t, (n, v, s)) in plan.tensors.iter().zip(&tensors) {
            let e = t.spec.encode(n, v, s, Default::default()).unwrap();
            assert_eq!(e.payload_bytes(), t.bytes, "{}", t.label);
        }
    }
    // The archive's copy keeps every choice and measurement, not the re-planning recipes.
    let stored = base.for_archive();
    assert!(base.tensors.iter().all(|t| !t.candidate_specs.is_empty()));
    assert!(stored.tensors.iter().all(|t| t.candidate_specs.is_empty()));
    for (a, b) in base.tensors.iter().zip(&stored.tensors) {
        assert_eq!(
            (&a.label, a.bytes, a.candidates.len()),
            (&b.label, b.bytes, b.candidates.len())
        );
        for (x, y) in a.candidates.iter().zip(&b.candidates) {
            assert!(
                (x.rel_mse - y.rel_mse).abs() <= x.rel_mse * 1e-6,
                "{x:?} {y:?}"
            );
        }
    }
    let size = |p: &Plan| serde_json::to_string(p).unwrap().len();
    assert!(
        size(&stored) * 3 < size(&base) * 2,
        "{} vs {}",
        size(&stored),
        size(&base)
    );
    match allocate(&mut base, Target::Bps(0.5), &Default::default()) {
        // The error names the smallest reachable rate, and that rate is reachable.
        Err(PlanError::BudgetTooSmall { min_bps, .. }) => {
            assert!(min_bps > 0.5, "{min_bps}");
            allocate(&mut base, Target::Bps(min_bps + 1e-6), &Default::default()).unwrap();
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn auto_with_and_without_target() {
    let v = gaussianish(64 * 128, 9, 1.0);
    let mut p = Planner::new(Mode::Auto);
    p.candidates = ["bf16", "int8-row", "int4", "e8@3", "e8@4"]
        .iter()
        .map(|n| Spec::parse(n).unwrap())
        .collect();
    let (tp, _) = p.plan_tensor("w", &v, &[64, 128]).unwrap();
    let r = tp
        .candidates
        .iter()
        .find(|c| c.label.contains("int4-row"))
        .unwrap()
        .rel_mse;
    assert!(tp.rel_mse <= 1.05 * r);
    assert!(tp
        .candidates
        .iter()
        .all(|c| c.rel_mse > 1.05 * r || c.bytes >= tp.bytes));
    p.target = Some(Target::Bps(3.2));
    let (tp, _) = p.plan_tensor("w", &v, &[64, 128]).unwrap();
    assert!(tp.bytes as f64 * 8.0 / v.len() as f64 <= 3.2);
    assert!(tp.label.contains("e8"), "{}", tp.label);
}

#[test]
fn plan_json_round_trips() {
    let v = blocky(|b| b == 3);
    let p = planner(Mode::PerBlock, &["f32", "f16", "int4", "int2"]);
    let (tp, _) = p.plan_tensor("w", &v, &[320, 128]).unwrap();
    let plan = Plan {
        version: 1,
        mode: Mode::PerBlock,
        thresholds: p.thresholds,
        target: Some(Target::Bps(3.0)),
        block_rows: 32,
        tensors: vec![tp],
    };
    let json = serde_json::to_string(&plan).unwrap();
    let back: Plan = serde_json::from_str(&json).unwrap();
    assert_eq!(back.tensors[0].spec, plan.tensors[0].spec);
    assert_eq!(back.tensors[0].snr_db, f64::INFINITY);
    assert_eq!(serde_json::to_string(&back).unwrap(), json);
    assert!("per-block".parse::<Mode>().is_ok() && "nope".parse::<Mode>().is_err());
    assert!(Spec::parse("e9@3").is_err() && Spec::parse("int9").is_err());
}

#[test]
fn fixed_rate_lattice_candidates_parse_and_encode_at_their_width() {
    let w = spread(64 * 256);
    for (name, bits) in [("e8-fixed4", 4u8), ("d4-fixed3", 3), ("z1-fixed8", 8)] {
        let t = Spec::parse(name)
            .unwrap()
            .encode(
                "w",
                &w,
                &[64, 256],
                hypercodec_hwz::EncodeOptions::default(),
            )
            .unwrap();
        match t.encoding {
            hypercodec_hwz::Encoding::Lattice {
                coding: hypercodec_hwz::Coding::Fixed { bits: b },
                tile,
                ..
            } => assert_eq!((b, tile), (bits, 256), "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    for bad in ["a2-fixed4", "e8-fixed1", "e8-fixed9", "e8-fixedx"] {
        assert!(Spec::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn trellis_pair_candidates_parse_and_fall_back_to_one_value_on_odd_rows() {
    let w = spread(32 * 129);
    let v_of = |name: &str, cols: u64| {
        let t = Spec::parse(name)
            .unwrap()
            .encode(
                "w",
                &w[..32 * cols as usize],
                &[32, cols],
                hypercodec_hwz::EncodeOptions::default(),
            )
            .unwrap();
        match t.encoding {
            hypercodec_hwz::Encoding::Trellis { l, k, v, scale, .. } => (l, k, v, scale),
            other => panic!("{name}: {other:?}"),
        }
    };
    let pair = hypercodec_trellis::TrellisParams::pair_scale;
    let one = hypercodec_trellis::TrellisParams::default_scale;
    assert_eq!(v_of("tcq@2-v2", 128), (16, 2, 2, pair(16, 2)));
    assert_eq!(v_of("tcq@3-l12-v2", 128), (12, 3, 2, pair(12, 3)));
    assert_eq!(v_of("tcq@3-l12", 128), (12, 3, 1, one(12, 3)));
    // 129 columns do not split into pairs: one value per state, its own scale.
    assert_eq!(v_of("tcq@2-v2", 129), (16, 2, 1, one(16, 2)));
    assert_eq!(
        Spec::parse("tcq@2-v2").unwrap().label(),
        "trellis-l16-k2-v2"
    );
    for bad in ["tcq@5-v2", "tcq@4-l8-v2", "tcq@2-v3", "tcq@2-v2-l12"] {
        assert!(Spec::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn codebook_candidates_parse_and_encode_with_their_settings() {
    let w = spread(64 * 256);
    for (name, block, k, mode, residual) in [
        ("cb-b8-k256", 8, 256, "channel", 0.0),
        ("cb-b4-k16-r0.5-sblock", 4, 16, "block", 0.5),
        ("cb-b2-k64-stensor", 2, 64, "tensor", 0.0),
    ] {
        let spec = Spec::parse(name).unwrap();
        match &spec {
            Spec::Codebook { template, settings } => {
                match template {
                    hypercodec_hwz::Encoding::Codebook {
                        block: b,
                        prototypes,
                        scale_mode,
                        ..
                    } => assert_eq!(
                        (*b, *prototypes, scale_mode.name()),
                        (block, k, mode),
                        "{name}"
                    ),
                    other => panic!("{name}: {other:?}"),
                }
                assert_eq!(settings.residual_k, Some(residual), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
        let t = spec
            .encode(
                "w",
                &w,
                &[64, 256],
                hypercodec_hwz::EncodeOptions::default(),
            )
            .unwrap();
        assert!(
            matches!(t.encoding, hypercodec_hwz::Encoding::Codebook { .. }),
            "{name}"
        );
    }
    for bad in [
        "cb-b8",
        "cb-k256",
        "cb-b0-k256",
        "cb-b8-k1",
        "cb-b8-k256-x1",
        "cb-b8-k256-sround",
        "cb-",
        "cb-b8-k256-r-1",
    ] {
        assert!(Spec::parse(bad).is_err(), "{bad}");
    }
}

mod budget_props {
    use super::*;
    use proptest::prelude::*;

    fn measured(bytes: u64, sse: f64) -> Measured {
        Measured {
            label: format!("c{bytes}"),
            bytes,
            bps: 0.0,
            rel_mse: sse,
            snr_db: 0.0,
            max_rel_err: 0.0,
            sse,
            sums: Default::default(),
            block_sse: Vec::new(),
            block_max_rel: Vec::new(),
        }
    }

    fn plan_of(tensors: &[Vec<(u64, f64)>]) -> Plan {
        Plan {
            version: 1,
            mode: Mode::Budget,
            thresholds: Thresholds::default(),
            target: None,
            block_rows: 32,
            tensors: tensors
                .iter()
                .enumerate()
                .map(|(i, cands)| TensorPlan {
                    name: format!("t{i}"),
                    shape: vec![100],
                    spec: Spec::parse("f32").unwrap(),
                    label: String::new(),
                    bytes: 0,
                    rel_mse: 0.0,
                    snr_db: 0.0,
                    reason: String::new(),
                    candidates: cands.iter().map(|&(b, d)| measured(b, d)).collect(),
                    skipped: Vec::new(),
                    blocks: None,
                    candidate_specs: cands.iter().map(|_| Spec::parse("f32").unwrap()).collect(),
                    sums: None,
                    screened_rows: None,
                })
                .collect(),
        }
    }

    proptest! {
        #[test]
        fn never_over_budget_and_generous_budgets_buy_the_least_distortion(
            tensors in proptest::collection::vec(
                proptest::collection::vec((1u64..1000, 0.0f64..100.0), 1..6), 1..6),
            budget in 0u64..6000,
        ) {
            let mut plan = plan_of(&tensors);
            match allocate(&mut plan, Target::Bytes(budget), &Default::default()) {
                Ok(used) => {
                    prop_assert!(used <= budget);
                    prop_assert_eq!(plan.total_bytes(), used);
                    for (t, cands) in plan.tensors.iter().zip(&tensors) {
                        prop_assert!(cands.iter().any(|&(b, d)| b == t.bytes && d == t.rel_mse));
                    }
                }
                Err(PlanError::BudgetTooSmall { cheapest, .. }) => {
                    let min: u64 = tensors.iter().map(|c| c.iter().map(|x| x.0).min().unwrap()).sum();
                    prop_assert_eq!(cheapest, min);
                    prop_assert!(budget < min);
                }
                Err(e) => prop_assert!(false, "{e}"),
            }
            // With room for everything, every tensor gets its least distortion.
            let mut plan = plan_of(&tensors);
            allocate(&mut plan, Target::Bytes(u64::MAX / 2), &Default::default()).unwrap();
            for (t, cands) in plan.tensors.iter().zip(&tensors) {
                let best = cands.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
                prop_assert_eq!(t.rel_mse, best);
            }
        }
    }
}

#[test]
fn tensors_without_values_plan_raw_in_every_mode() {
    let modes = [
        Mode::Lowest,
        Mode::Highest,
        Mode::Allow,
        Mode::Closest,
        Mode::Average,
        Mode::Best,
        Mode::PerBlock,
        Mode::PerWeight,
        Mode::Budget,
        Mode::Auto,
    ];
    for mode in modes {
        let p = planner(mode, &["f32", "int4", "e8@4", "sparse"]);
        // `[0, 2^40]`: a header may claim it with no data; nothing may be sized by 2^40.
        for shape in [&[0, 32][..], &[32, 0], &[4, 0, 4], &[0, 1 << 40]] {
            let (tp, t) = p.plan_tensor("w", &[], shape).unwrap();
            assert_eq!(tp.label, "raw-f32", "{mode:?} {shape:?}");
            assert_eq!(tp.bytes, 0, "{mode:?} {shape:?}");
            assert_eq!(t.is_some(), mode != Mode::Budget);
        }
    }
}

#[test]
fn gpu_shaped_rans_candidates_resolve_to_chunks_of_whole_rows() {
    use hypercodec_hwz::{Coding, EncodeOptions, Encoding};
    // `e8@B-gpu`: rANS of 32 lanes and 12-bit probabilities, chunks of as many whole rows as
    // fit 2^14 symbols (one row when rows are longer); other lattices have no such kernel.
    let w = spread(48 * 640);
    let spec = Spec::parse("e8@3-gpu").unwrap();
    let t = spec
        .encode("w", &w, &[48, 640], EncodeOptions::default())
        .unwrap();
    match t.encoding {
        Encoding::Lattice {
            coding:
                Coding::Rans {
                    chunk,
                    lanes,
                    prob_bits,
                },
            ..
        } => assert_eq!((chunk, lanes, prob_bits), (640 * 25, 32, 12)),
        ref e => panic!("{e:?}"),
    }
    assert!(t.payload_bytes() as f64 * 8.0 / w.len() as f64 <= 3.0);
    let long: Vec<f32> = w.iter().cycle().take(2 * 20480).copied().collect();
    let t = spec
        .encode("w", &long, &[2, 20480], EncodeOptions::default())
        .unwrap();
    assert!(matches!(
        t.encoding,
        Encoding::Lattice {
            coding: Coding::Rans { chunk: 20480, .. },
            ..
        }
    ));
    for bad in ["d4@3-gpu", "z1@3-gpu", "e8@-gpu"] {
        assert!(Spec::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn gpu_shaped_prefix_candidates_meet_their_rate() {
    use hypercodec_hwz::{Coding, EncodeOptions, Encoding};
    // (limit, pair limit, segment, span) of a prefix-coded lattice encoding.
    let prefix = |e: &Encoding| match *e {
        Encoding::Lattice {
            coding:
                Coding::Prefix {
                    limit,
                    pair_limit,
                    segment,
                    span,
                },
            ..
        } => (limit, pair_limit, segment, span),
        ref e => panic!("{e:?}"),
    };
    let template = |name: &str| match Spec::parse(name).unwrap() {
        Spec::Rate { template, .. } => template,
        s => panic!("{name}: {s:?}"),
    };
    // `e8@B-prefix`: 8-bit singles and 12-bit pairs in chunks of eight rows, fitted to B bits a
    // value all in: chunks of about 2^14 symbols (one segment here: 640 columns are 20 blocks,
    // so chunks span 3 groups of eight rows).
    let w = spread(48 * 640);
    let spec = Spec::parse("e8@3-prefix").unwrap();
    let t = spec
        .encode("w", &w, &[48, 640], EncodeOptions::default())
        .unwrap();
    assert_eq!(prefix(&t.encoding), (8, 12, 20, 3));
    let bps = t.payload_bytes() as f64 * 8.0 / w.len() as f64;
    assert!(bps <= 3.0 && bps > 2.7, "{bps}");
    let back = t.decode("w", &[48, 640]).unwrap();
    let noise: f64 = w
        .iter()
        .zip(&back)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let signal: f64 = w.iter().map(|&a| (a as f64).powi(2)).sum();
    assert!(10.0 * (signal / noise).log10() > 12.0);
    // Other forms by their labels: singles of 10 bits, pairs of 11.
    for (name, limit, pair_limit) in [("e8@3-prefix10", 10, 0), ("e8@3-prefix8p11", 8, 11)] {
        let (l, p, _, _) = prefix(&template(name));
        assert_eq!((l, p), (limit, pair_limit), "{name}");
    }
    for bad in [
        "d4@3-prefix",
        "z1@3-prefix",
        "e8@-prefix",
        "e8@3-prefix7",
        "e8@3-prefix12p12",
        "e8@3-prefix8p",
        "e8@3-prefixx",
        "e8@3-prefix-c",
        "e8@3-prefix-c0",
        "e8@3-prefix-c100",
        "e8@3-prefix-c33554432",
        "e8@3-prefix-c256-c256",
        "e8@3-prefix-c+256",
        "e8@3-prefix-c0256",
    ] {
        assert!(Spec::parse(bad).is_err(), "{bad}");
    }
    // `-cN`: chunks of N symbols (segments of N/256 blocks), whatever the matrix; 2^12 on this
    // one makes a chunk a row group (640 columns are 20 blocks: a segment of 16 and one of 4).
    for (name, want) in [
        ("e8@3-prefix-c16384", (8, 12, 64)),
        ("e8@3-prefix10-c8192", (10, 0, 32)),
    ] {
        let (l, p, segment, _) = prefix(&template(name));
        assert_eq!((l, p, segment), want, "{name}");
    }
    let t = Spec::parse("e8@3-prefix-c4096")
        .unwrap()
        .encode("w", &w, &[48, 640], EncodeOptions::default())
        .unwrap();
    let (_, _, segment, span) = prefix(&t.encoding);
    assert_eq!((segment, span), (16, 1));
}

#[test]
fn unknown_candidates_list_the_name_families() {
    for name in ["codebook", "lowrank", "int", "e9@4"] {
        let msg = Spec::parse(name).expect_err(name).to_string();
        assert!(
            msg.contains(&format!("`{name}`"))
                && msg.contains("cb-b8-k256")
                && msg.contains("lowrank@R"),
            "{msg}"
        );
    }
}

#[test]
fn lattice_rates_out_of_range_say_so() {
    for name in ["e8@0", "e8@-1", "d4@1000", "e8@NaN"] {
        let msg = Spec::parse(name).expect_err(name).to_string();
        assert!(msg.contains("at most 16 bits per value"), "{msg}");
    }
}

/// LOWEST compares bytes as the archive stores them: INT8 codes of a three-level tensor take
/// 8 bits a value raw but shrink under the container's zstd below the lattice's entropy-coded
/// 4 bits, which zstd leaves as they are.
#[test]
fn lowest_counts_bytes_after_the_containers_zstd() {
    let mut s = 1u64;
    let v: Vec<f32> = (0..256 * 256)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % 3) as f32 - 1.0
        })
        .collect();
    let shape = [256, 256];
    let mut p = planner(Mode::Lowest, &["int8-row", "e8@4"]);
    let (raw, _) = plan(&p, &v, &shape);
    let label = |n: &str| Spec::parse(n).unwrap().label();
    assert_eq!(raw.label, label("e8@4"), "{:?}", raw.candidates);
    p.container = hypercodec_hwz::Compression::Zstd;
    let (zstd, _) = plan(&p, &v, &shape);
    assert_eq!(zstd.label, label("int8-row"), "{:?}", zstd.candidates);
    // The bytes counted are the stored ones: the chosen encoding under the writer's rule.
    let t = zstd
        .spec
        .encode("w", &v, &shape, Default::default())
        .unwrap();
    assert_eq!(
        zstd.bytes,
        t.stored_bytes(v.len() as u64, hypercodec_hwz::Compression::Zstd)
    );
    assert!(
        zstd.bytes < t.payload_bytes() / 2,
        "{} of {}",
        zstd.bytes,
        t.payload_bytes()
    );
}

/// The writer keeps a byte per 64 values: a tensor that zstd would take below that floor
/// (INT8 codes of an almost all-zero tensor) has its codes stored as they are, and the
/// planner counts them so, not at zstd's size.
#[test]
fn stored_bytes_keep_the_writers_floor() {
    let mut v = vec![0f32; 512 * 512];
    v[7] = 1.0;
    let shape = [512, 512];
    let t = Spec::parse("int8-row")
        .unwrap()
        .encode("w", &v, &shape, Default::default())
        .unwrap();
    let zstd = hypercodec_hwz::Compression::Zstd;
    let stored = t.stored_bytes(v.len() as u64, zstd);
    assert!(stored >= v.len() as u64 / 64, "{stored}");
    // What a writer stores for it.
    let mut w = hypercodec_hwz::Writer::new(
        Vec::new(),
        hypercodec_hwz::WriterOptions {
            compression: zstd,
            ..Default::default()
        },
    )
    .unwrap();
    let written = w.add_tensor("w", &shape, "f32", &t, None).unwrap();
    // (The writer's count includes its alignment padding, under 64 bytes a stream.)
    assert!(
        (stored..stored + 64 * t.streams.len() as u64).contains(&written),
        "{written} {stored}"
    );
}

/// `intN-gG` names affine groups of G (asymmetric), `intN-gG-sym` symmetric ones; their rates
/// are the codes plus a 16-bit scale (and offset) per group, and a malformed group is refused,
/// as is any other number of a name not spelled in plain digits.
#[test]
fn affine_group_sizes_are_named_by_g() {
    use hypercodec_hwz::{Encoding, Group};
    let (rows, cols) = (8u64, 512u64);
    let v: Vec<f32> = (0..(rows * cols) as usize)
        .map(|i| ((i * 7919) % 97) as f32 - 48.0)
        .collect();
    for (name, group, symmetric, bps) in [
        ("int4-g256", 256, false, 4.0 + 32.0 / 256.0),
        ("int4-g64-sym", 64, true, 4.0 + 16.0 / 64.0),
        ("int2-g32", 32, false, 2.0 + 32.0 / 32.0),
        ("int8-g128-sym", 128, true, 8.0 + 16.0 / 128.0),
        ("int4-g128", 128, false, 4.25),
    ] {
        let spec = Spec::parse(name).unwrap();
        let Spec::Fixed {
            encoding:
                Encoding::Affine {
                    group: g,
                    symmetric: s,
                    ..
                },
        } = spec
        else {
            panic!("{name}: {spec:?}")
        };
        assert_eq!((g, s), (Group::Size(group), symmetric), "{name}");
        let t = spec
            .encode("w", &v, &[rows, cols], Default::default())
            .unwrap();
        let got = t.payload_bytes() as f64 * 8.0 / v.len() as f64;
        assert!((got - bps).abs() < 1e-9, "{name}: {got} bps, want {bps}");
    }
    assert_eq!(
        Spec::parse("int4-g128").unwrap().label(),
        Spec::parse("int4").unwrap().label()
    );
    for bad in [
        "int4-g0",
        "int4-g",
        "int4-g+8",
        "int4-g08",
        "int4-gx",
        "int4-g64-asym",
        "int4-g64-",
        "int+4",
        "int04",
        "int4-g99999999999",
        "e8-fixed04",
        "e8-fixed+4",
        "tcq@+2",
        "tcq@2-l012",
        "lowrank@+8",
        "e8@4-prefix08",
        "e8@4-prefix8p+11",
    ] {
        assert!(Spec::parse(bad).is_err(), "{bad} was taken");
    }
}

#[test]
fn hostile_names_screens_and_plans_are_errors_not_panics() {
    // A non-ASCII key in a codebook name: split inside its first character.
    for name in ["cb-é", "cb-b8-ké", "cb-€8"] {
        assert!(Spec::parse(name).is_err(), "{name}");
    }
    // Screening of 2^63 rows: `2·m` wrapped to 0, and the screen's stride with it.
    let mut p = planner(Mode::Lowest, &["int8", "int4"]);
    p.screen_rows = Some(1 << 63);
    let values = spread(64 * 128);
    assert!(p.plan_tensor("w", &values, &[64, 128]).is_ok());
    // A plan (read from JSON: public fields) with a tensor of no candidates.
    let p = planner(Mode::Lowest, &["int8", "int4"]);
    let (mut tp, _) = p.plan_tensor("w", &values, &[64, 128]).unwrap();
    tp.candidates.clear();
    let mut plan = Plan {
        version: 1,
        mode: Mode::Lowest,
        thresholds: p.thresholds,
        target: None,
        block_rows: 0,
        tensors: vec![tp],
    };
    let r = allocate(&mut plan, Target::Bps(4.0), &Default::default());
    assert!(matches!(r, Err(PlanError::Candidate { .. })), "{r:?}");
}
