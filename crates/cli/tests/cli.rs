//! End-to-end tests of the `hypercodec` binary.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use safetensors::tensor::{serialize, Dtype, TensorView};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hypercodec"))
}

fn run(args: &[&str]) -> Output {
    let out = bin().args(args).output().expect("spawn hypercodec");
    assert_ne!(
        out.status.code(),
        Some(101),
        "hypercodec panicked: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn repo_data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(name)
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Reads a safetensors file into (name, dtype, shape, bytes), sorted by name.
fn read_st(path: &Path) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// `n` values uniform in [-1, 1) with no structure a compressor finds (splitmix64): for tests
/// of rates, where `values`' multiplicative-hash pattern lets zstd shrink integer codes to a
/// fraction of a bit (and planners count bytes after zstd).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = (i ^ (seed << 40)).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A small model: f32, f16 and bf16 matrices, a 1-D bias, and an int64 buffer.
fn write_model(path: &Path, nan: bool) {
    let mut w32: Vec<f32> = values(64 * 48, 1);
    if nan {
        w32[17] = f32::NAN;
    }
    let b32: Vec<u8> = w32.iter().flat_map(|x| x.to_le_bytes()).collect();
    let b16: Vec<u8> = values(32 * 64, 2)
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    let bbf: Vec<u8> = values(16 * 128, 3)
        .iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect();
    let bias: Vec<u8> = values(48, 4).iter().flat_map(|x| x.to_le_bytes()).collect();
    let ids: Vec<u8> = (0..8i64).flat_map(|x| x.to_le_bytes()).collect();
    let tensors = vec![
        (
            "a.weight",
            TensorView::new(Dtype::F32, vec![64, 48], &b32).unwrap(),
        ),
        (
            "b.weight",
            TensorView::new(Dtype::F16, vec![32, 64], &b16).unwrap(),
        ),
        (
            "c.weight",
            TensorView::new(Dtype::BF16, vec![16, 128], &bbf).unwrap(),
        ),
        (
            "a.bias",
            TensorView::new(Dtype::F32, vec![48], &bias).unwrap(),
        ),
        (
            "position_ids",
            TensorView::new(Dtype::I64, vec![8], &ids).unwrap(),
        ),
    ];
    std::fs::write(path, serialize(tensors, None).unwrap()).unwrap();
}

#[test]
fn names_that_match_no_tensor_are_named_and_a_non_archive_names_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    write_model(&model, false);
    let hwz = dir.path().join("m.hwz");
    // Statistics for `a` (a.weight: 48 columns) and for two layers the model does not have.
    let eye: Vec<u8> = (0..48 * 48)
        .map(|i| if i % 49 == 0 { 1f32 } else { 0.0 })
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let small: Vec<u8> = [1f32; 4].iter().flat_map(|x| x.to_le_bytes()).collect();
    let stats = dir.path().join("stats.safetensors");
    let tensors = vec![
        (
            "a",
            TensorView::new(Dtype::F32, vec![48, 48], &eye).unwrap(),
        ),
        (
            "zz",
            TensorView::new(Dtype::F32, vec![2, 2], &small).unwrap(),
        ),
        (
            "lm_head",
            TensorView::new(Dtype::F32, vec![2, 2], &small).unwrap(),
        ),
    ];
    std::fs::write(&stats, serialize(tensors, None).unwrap()).unwrap();
    let out = run(&["compress", p(&model), p(&hwz), "--calibration", p(&stats)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(
            "warning: --calibration names 2 tensors the input does not have (`lm_head`, `zz`)"
        ),
        "{err}"
    );
    // Sensitivity weights: `a.weight` is a tensor, `a` is not.
    let out = run(&[
        "compress",
        p(&model),
        p(&hwz),
        "--mode",
        "budget",
        "--target-bps",
        "5",
        "--sensitivity",
        r#"{"a.weight": 2, "a": 3}"#,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("--sensitivity names 1 tensors the input does not have (`a`)"),
        "{err}"
    );
    // Every name matched: no warning.
    let out = run(&[
        "compress",
        p(&model),
        p(&hwz),
        "--mode",
        "budget",
        "--target-bps",
        "5",
        "--sensitivity",
        r#"{"a.weight": 2}"#,
    ]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning: --sensitivity"));
    // A file that is not an archive: the error names it.
    let err = fails(&["inspect", p(&model)]);
    assert!(
        err.contains(&format!("{}: not a .hwz archive", p(&model))),
        "{err}"
    );
}

#[test]
fn raw_encodings_restore_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    write_model(&model, false);
    let input = read_st(&model);
    // raw-f32 holds every source type exactly; decompress restores each tensor's source type.
    let hwz = dir.path().join("m.hwz");
    let out = dir.path().join("back.safetensors");
    ok(&["compress", p(&model), p(&hwz), "--encoding", "raw-f32"]);
    ok(&["decompress", p(&hwz), p(&out)]);
    let back = read_st(&out);
    let floats: Vec<_> = input
        .iter()
        .filter(|t| t.1 != Dtype::I64)
        .cloned()
        .collect();
    assert_eq!(back, floats, "raw round trip must be bit-exact");
    // The I64 tensor compress skipped is named by inspect (only `--json` had it).
    let table = ok(&["inspect", p(&hwz)]);
    assert!(
        table.contains("not stored: 1 source tensors") && table.contains("(I64)"),
        "{table}"
    );
    // raw-bf16 of a bf16 tensor is exact too.
    ok(&["compress", p(&model), p(&hwz), "--encoding", "raw-bf16"]);
    ok(&["decompress", p(&hwz), p(&out)]);
    let back = read_st(&out);
    let c = back.iter().find(|t| t.0 == "c.weight").unwrap();
    assert_eq!(c, input.iter().find(|t| t.0 == "c.weight").unwrap());
}

#[test]
fn an_f64_tensor_is_skipped_with_what_to_do() {
    // It said "not a float tensor" of F64.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    let (a, b): (Vec<u8>, Vec<u8>) = (
        values(64, 1).iter().flat_map(|x| x.to_le_bytes()).collect(),
        values(64, 2)
            .iter()
            .flat_map(|&x| f64::from(x).to_le_bytes())
            .collect(),
    );
    let views = vec![
        ("a", TensorView::new(Dtype::F32, vec![8, 8], &a).unwrap()),
        ("d", TensorView::new(Dtype::F64, vec![8, 8], &b).unwrap()),
    ];
    std::fs::write(&model, serialize(views, None).unwrap()).unwrap();
    let out = run(&["compress", p(&model), p(&dir.path().join("m.hwz"))]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("skipping tensor `d` of type F64 (not read: cast it to f32"),
        "{err}"
    );
}

#[test]
fn affine_keeps_1d_raw_and_inspect_lists_everything() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    write_model(&model, false);
    let hwz = dir.path().join("m.hwz");
    let out = run(&[
        "compress",
        p(&model),
        p(&hwz),
        "--bits",
        "4",
        "--group",
        "32",
        "--no-zstd",
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipping tensor `position_ids`"));
    let json: Value = serde_json::from_str(&ok(&["inspect", p(&hwz), "--json"])).unwrap();
    let tensors = json["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 4);
    let find = |n: &str| tensors.iter().find(|t| t["name"] == n).unwrap();
    assert_eq!(find("a.bias")["encoding"]["type"], "raw");
    assert_eq!(
        find("a.bias")["stats"]["snr_db"],
        Value::Null,
        "exact: no finite SNR"
    );
    let a = find("a.weight");
    assert_eq!(a["encoding"]["type"], "affine");
    assert_eq!(a["encoding"]["group"], 32);
    assert_eq!(a["shape"], serde_json::json!([64, 48]));
    assert!(a["stats"]["snr_db"].as_f64().unwrap() > 15.0);
    // 64 rows of 48: codes 4 bits each, two groups per row (32 + 16) of f16 scale + offset.
    let bytes = 64 * 48 / 2 + 64 * 2 * (2 + 2);
    assert_eq!(a["stored_bytes"], bytes);
    assert_eq!(a["bps"], bytes as f64 * 8.0 / (64.0 * 48.0));
    let text = ok(&["inspect", p(&hwz)]);
    assert!(text.contains("affine-int4-g32-asym-f16") && text.contains("a.bias"));
}

#[test]
fn gguf_block_types_match_the_reference_dequantizer() {
    let dir = tempfile::tempdir().unwrap();
    let hwz = dir.path().join("g.hwz");
    let out = dir.path().join("g.safetensors");
    ok(&[
        "compress",
        p(&repo_data("blocks.gguf")),
        p(&hwz),
        "--encoding",
        "raw-f32",
    ]);
    ok(&["decompress", p(&hwz), p(&out), "--dtype", "f32"]);
    let meta: Vec<Value> =
        serde_json::from_slice(&std::fs::read(repo_data("blocks.expected.json")).unwrap()).unwrap();
    let expected = std::fs::read(repo_data("blocks.expected.f32")).unwrap();
    let back = read_st(&out);
    let mut at = 0;
    for m in &meta {
        let name = m["name"].as_str().unwrap();
        let t = back
            .iter()
            .find(|t| t.0 == name)
            .unwrap_or_else(|| panic!("{name} missing"));
        let shape: Vec<usize> = m["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(t.2, shape, "{name}");
        let want = &expected[at..at + t.3.len()];
        assert!(
            t.3 == want,
            "{} ({}) dequantizes differently from gguf-py",
            name,
            m["type"]
        );
        at += t.3.len();
    }
    assert_eq!(at, expected.len());
    let json: Value = serde_json::from_str(&ok(&["inspect", p(&hwz), "--json"])).unwrap();
    let q6 = json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "t.q6_k")
        .unwrap();
    assert_eq!(q6["source_dtype"], "q6_k");
}

#[test]
fn nan_input_fails_cleanly_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("nan.safetensors");
    write_model(&model, true);
    let hwz = dir.path().join("nan.hwz");
    let out = run(&["compress", p(&model), p(&hwz)]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a.weight") && err.contains("not finite"),
        "{err}"
    );
    assert!(!hwz.exists(), "no archive under the final name");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        leftovers.len(),
        1,
        "temporary file left behind: {leftovers:?}"
    );
    // An existing archive is left untouched by a failed run.
    std::fs::write(&hwz, b"previous").unwrap();
    assert_eq!(
        run(&["compress", p(&model), p(&hwz)]).status.code(),
        Some(1)
    );
    assert_eq!(std::fs::read(&hwz).unwrap(), b"previous");
    // Raw encodings may keep NaN when asked to: f32 keeps every value (exact), f16 rounds the
    // finite ones, which has no finite SNR over NaN (it was printed "every tensor exact").
    let raw = |enc: &str| {
        ok(&[
            "compress",
            p(&model),
            p(&hwz),
            "--encoding",
            enc,
            "--allow-non-finite",
        ])
    };
    let table = |hwz: &Path| ok(&["inspect", p(hwz)]);
    assert!(raw("raw-f32").contains("every tensor exact"));
    assert!(!table(&hwz).contains("lossy"));
    let f16 = raw("raw-f16");
    assert!(
        f16.contains("lossy tensors without a finite SNR") && !f16.contains("every tensor exact"),
        "{f16}"
    );
    assert!(table(&hwz).contains("lossy"));
}

#[test]
fn hostile_archives_give_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let golden = std::fs::read(repo_data("golden-v1.hwz")).unwrap();
    let bad = dir.path().join("bad.hwz");
    let out = dir.path().join("out.safetensors");
    for cut in [0, 10, 100, golden.len() / 2, golden.len() - 1] {
        std::fs::write(&bad, &golden[..cut]).unwrap();
        assert_eq!(
            run(&["inspect", p(&bad)]).status.code(),
            Some(1),
            "cut {cut}"
        );
    }
    let mut flipped = golden.clone();
    flipped[70] ^= 0xFF;
    std::fs::write(&bad, &flipped).unwrap();
    let r = run(&["decompress", p(&bad), p(&out)]);
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("checksum"));
    assert!(!out.exists());
    std::fs::write(
        &bad,
        b"PK\x03\x04 pretend zip archive with enough bytes to sniff it properly...........",
    )
    .unwrap();
    let r = run(&["inspect", p(&bad)]);
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("legacy"),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
}

#[test]
fn benchmark_reports_every_representation() {
    let json: Value =
        serde_json::from_str(&ok(&["benchmark", "gaussian:64x256:7", "--json"])).unwrap();
    let rows = json["rows"].as_array().unwrap();
    let find = |n: &str| {
        rows.iter()
            .find(|r| r["representation"] == n)
            .unwrap_or_else(|| panic!("{n} missing"))
    };
    assert_eq!(find("raw-f32")["bps"], 32.0);
    assert_eq!(find("raw-f32")["snr_db"], Value::Null);
    // per-row int8: 8 bits + (f16 scale + f16 offset) / 256 values
    let int8 = find("affine-int8-row-asym-f16");
    assert!((int8["bps"].as_f64().unwrap() - (8.0 + 32.0 / 256.0)).abs() < 1e-9);
    for bits in 1..=8 {
        for g in ["row-asym", "g128-asym", "g128-sym"] {
            find(&format!("affine-int{bits}-{g}-f16"));
        }
    }
    // More bits, less error; every lossy row is below the Gaussian bound.
    let snr = |b: u32| {
        find(&format!("affine-int{b}-g128-asym-f16"))["snr_db"]
            .as_f64()
            .unwrap()
    };
    assert!((2..=8).all(|b| snr(b) > snr(b - 1)));
    for r in rows {
        if let Some(gap) = r["gap_db"].as_f64() {
            assert!(
                gap > 0.0,
                "{} beats the Shannon bound?",
                r["representation"]
            );
        }
    }
    find("zstd-3(f32), lossless peer");
    let dir = tempfile::tempdir().unwrap();
    let md = dir.path().join("b.md");
    ok(&["benchmark", "gaussian:32x128", "--markdown", p(&md)]);
    assert!(std::fs::read_to_string(&md)
        .unwrap()
        .contains("| affine-int4-g128-asym-f16 |"));
    // A table in a missing folder is refused before measuring (it failed after the whole run).
    let lost = dir.path().join("missing").join("b.md");
    let r = run(&["benchmark", "gaussian:32x128", "--markdown", p(&lost)]);
    assert_eq!(r.status.code(), Some(1));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("no folder") && r.stdout.is_empty(), "{err}");
}

#[test]
fn usage_errors_are_reported() {
    assert_eq!(
        run(&["compress", "gaussian:8x8", "/tmp/x.hwz", "--bits", "9"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        run(&["compress", "gaussian:8x8", "/tmp/x.hwz", "--group", "0"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        run(&["compress", "/nonexistent.safetensors", "/tmp/x.hwz"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(run(&["frobnicate"]).status.code(), Some(2));
    // A batch of 0 rows, and a model's shapes with --shape (it used to be ignored).
    let r = run(&["run", "/tmp/x.hwz", "--batch", "0"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("must be from 1 to 65536"));
    let r = run(&[
        "synth",
        "/tmp/x.safetensors",
        "--model",
        "cnn",
        "--shape",
        "4x4",
    ]);
    assert_eq!(r.status.code(), Some(2));
    // `--device`: a malformed name, and (on a machine without a GPU, as in CI) no device; on a
    // GPU machine the run succeeds with the CPU's bits.
    let dir = tempfile::tempdir().unwrap();
    let hwz = dir.path().join("t.hwz");
    let trellis = [
        "compress",
        "gaussian:8x256",
        p(&hwz),
        "--encoding",
        "trellis",
    ];
    let bad = run(&[&trellis[..], &["--device", "gpu"]].concat());
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--device"));
    let cuda = run(&[&trellis[..], &["--device", "cuda:0"]].concat());
    if cuda.status.success() {
        let gpu = std::fs::read(&hwz).unwrap();
        ok(&trellis);
        assert_eq!(gpu, std::fs::read(&hwz).unwrap());
    } else {
        let err = String::from_utf8_lossy(&cuda.stderr);
        assert!(err.contains("--device") && err.contains("CUDA"), "{err}");
        assert!(!hwz.exists());
    }
}

#[test]
fn lattice_compress_meets_its_rate_and_decompresses() {
    let dir = tempfile::tempdir().unwrap();
    let hwz = dir.path().join("l.hwz");
    let out = dir.path().join("l.safetensors");
    for (coding, bps) in [
        ("rans", "3"),
        ("rans-gpu", "3"),
        ("prefix-gpu", "3"),
        ("rice", "3.5"),
        ("fixed", "4"),
    ] {
        ok(&[
            "compress",
            "gaussian:64x1024:3",
            p(&hwz),
            "--encoding",
            "lattice",
            "--coding",
            coding,
            "--bps",
            bps,
            "--no-zstd",
        ]);
        let json: Value = serde_json::from_str(&ok(&["inspect", p(&hwz), "--json"])).unwrap();
        let t = &json["tensors"][0];
        assert_eq!(t["encoding"]["type"], "lattice");
        assert_eq!(t["encoding"]["tile"], 1024);
        if coding == "rans-gpu" {
            // Chunks of whole rows (16 of 1024 symbols), 12-bit probabilities, a warp's lanes.
            let c = &t["encoding"]["coding"];
            assert_eq!(
                (&c["chunk"], &c["prob_bits"], &c["lanes"]),
                (&16384.into(), &12.into(), &32.into()),
                "{c}"
            );
        }
        if coding == "prefix-gpu" {
            // 8-bit singles, 12-bit pairs, a row of 128 words in one segment of 32 blocks, so
            // chunks span 2 groups of eight rows (2^14 symbols).
            let c = &t["encoding"]["coding"];
            assert_eq!(
                (&c["type"], &c["limit"], &c["pair_limit"], &c["segment"]),
                (&"prefix".into(), &8.into(), &12.into(), &32.into()),
                "{c}"
            );
        }
        let got = t["bps"].as_f64().unwrap();
        let target: f64 = bps.parse().unwrap();
        if coding == "fixed" {
            // Fixed-rate adds the row scales (16 bits per 1024-value row).
            assert!(
                got <= target + 16.0 / 1024.0 + 1e-9 && got > target - 0.1,
                "{coding}: {got} bps for target {target}"
            );
        } else {
            // The others fit the rate all-in: this 64K-value file's manifest and alignment
            // (about 1 KB, 0.13 bits a value) are taken from the tensor's rate.
            let all_in = json["totals"]["lossy"]["all_in_bps"].as_f64().unwrap();
            assert!(
                all_in <= target && got < target - 0.05 && got > target - 0.3,
                "{coding}: {got} bps, {all_in} all-in, for target {target}"
            );
        }
        let snr = t["stats"]["snr_db"].as_f64().unwrap();
        // Below the Gaussian bound, and within 2.5 dB of it (rANS ≈ 1, Rice ≈ 1.6, fixed ≈ 4 at 4 bits).
        let bound = 6.0206 * got;
        let slack = if coding == "fixed" { 4.5 } else { 2.5 };
        assert!(
            snr < bound && snr > bound - slack,
            "{coding}: {snr} dB at {got} bps"
        );
        ok(&["decompress", p(&hwz), p(&out)]);
        assert_eq!(read_st(&out)[0].2, vec![64, 1024]);
    }
    assert_eq!(
        run(&[
            "compress",
            "gaussian:8x64",
            p(&hwz),
            "--encoding",
            "lattice",
            "--lattice",
            "a2",
            "--coding",
            "fixed"
        ])
        .status
        .code(),
        Some(1)
    );
    // Prefix codes are E8's; at 7 bits a value the symbols outgrow the pair tables and the
    // tensor falls back to rans-gpu, said on the report.
    let out = run(&[
        "compress",
        "gaussian:8x64",
        p(&hwz),
        "--encoding",
        "lattice",
        "--lattice",
        "d4",
        "--coding",
        "prefix-gpu",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lattice e8"));
    let report = ok(&[
        "compress",
        "gaussian:64x1024:3",
        p(&hwz),
        "--encoding",
        "lattice",
        "--coding",
        "prefix-gpu",
        "--bps",
        "7",
    ]);
    assert!(report.contains("prefix codes"), "{report}");
    let json: Value = serde_json::from_str(&ok(&["inspect", p(&hwz), "--json"])).unwrap();
    let c = &json["tensors"][0]["encoding"]["coding"];
    assert_eq!(
        (&c["type"], &c["lanes"]),
        (&"rans".into(), &32.into()),
        "{c}"
    );
    // GPU-shaped chunks are whole rows: a chunk size is refused, not silently misshaped.
    let out = run(&[
        "compress",
        "gaussian:8x64",
        p(&hwz),
        "--encoding",
        "lattice",
        "--coding",
        "rans-gpu",
        "--chunk",
        "100",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("whole rows"));
}

#[test]
fn legacy_hyperglyph_archives_inspect_and_decompress() {
    let dir = tempfile::tempdir().unwrap();
    let src = repo_data("hyperglyph-auto.hwz");
    let json: Value = serde_json::from_str(&ok(&["inspect", p(&src), "--json"])).unwrap();
    let codecs: Vec<&str> = json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["codec"].as_str().unwrap())
        .collect();
    assert_eq!(
        codecs,
        [
            "packed_int4",
            "low_rank_residual",
            "sparse",
            "raw_int8",
            "raw_int8"
        ]
    );
    let out = dir.path().join("hg.safetensors");
    ok(&["decompress", p(&src), p(&out)]);
    let back = read_st(&out);
    let expected: Vec<f32> = std::fs::read(repo_data("hyperglyph-auto.expected.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    // dense.weight is first in the archive: its values lead the expected file.
    let dense = back.iter().find(|t| t.0 == "dense.weight").unwrap();
    assert_eq!(dense.2, vec![64, 96]);
    let got: Vec<f32> = dense
        .3
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert!(got
        .iter()
        .zip(&expected)
        .all(|(a, b)| (a - b).abs() <= 1e-6));
}

fn inspect_json(path: &Path) -> Value {
    serde_json::from_str(&ok(&["inspect", p(path), "--json"])).unwrap()
}

#[test]
fn every_codebook_flag_changes_the_archive() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    ok(&["synth", p(&model), "--shape", "256x256", "--seed", "5"]);
    let compress = |name: &str, extra: &[&str]| -> (Value, Vec<u8>) {
        let out = dir.path().join(name);
        let mut args = vec![
            "compress",
            p(&model),
            p(&out),
            "--encoding",
            "codebook",
            "--no-zstd",
        ];
        args.extend_from_slice(extra);
        ok(&args);
        (inspect_json(&out), std::fs::read(&out).unwrap())
    };
    let (base, base_bytes) = compress("base.hwz", &[]);
    let enc = |v: &Value| v["tensors"][0]["encoding"].clone();
    assert_eq!(enc(&base)["type"], "codebook");
    assert_eq!(enc(&base)["block"], 8);
    assert_eq!(enc(&base)["prototypes"], 256);
    assert_eq!(enc(&base)["scale_mode"], "channel");
    let cases: Vec<(&[&str], &str, Value)> = vec![
        (&["--block-size", "4"], "block", 4.into()),
        (&["--n-prototypes", "16"], "prototypes", 16.into()),
        (&["--scale-mode", "block"], "scale_mode", "block".into()),
    ];
    for (flags, field, want) in cases {
        let (v, _) = compress("x.hwz", flags);
        assert_eq!(enc(&v)[field], want, "{flags:?}");
    }
    let (v, _) = compress("r.hwz", &["--residual-k", "0.5"]);
    assert_eq!(enc(&v)["residual"]["count"], 256 * 32 / 2);
    let (v, _) = compress("r.hwz", &["--residual-k", "0.5", "--residual-dtype", "f32"]);
    assert_eq!(enc(&v)["residual"]["dtype"], "f32");
    let (v, _) = compress("r.hwz", &["--residual-k", "2", "--residual-budget", "0.05"]);
    let count = enc(&v)["residual"]["count"].as_u64().unwrap();
    assert!(count > 0 && count < 256 * 32 * 2, "{count}");
    // Search and training flags change which prototypes are used: the bytes differ.
    for flags in [
        &["--seed", "9"][..],
        &["--hdc-dim", "0"],
        &["--n-buckets", "64", "--hdc-dim", "64"],
        &["--lloyd-iters", "1"],
    ] {
        let (_, bytes) = compress("s.hwz", flags);
        assert_ne!(bytes, base_bytes, "{flags:?} changed nothing");
    }
    let ignored = run(&[
        "compress",
        p(&model),
        "/tmp/never.hwz",
        "--encoding",
        "codebook",
        "--target-ratio",
        "8",
    ]);
    assert_eq!(
        ignored.status.code(),
        Some(1),
        "a target the codebook would ignore"
    );
    let bad = run(&[
        "compress",
        p(&model),
        "/tmp/never.hwz",
        "--encoding",
        "codebook",
        "--n-buckets",
        "3",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(!Path::new("/tmp/never.hwz").exists());
}

#[test]
fn min_tensor_size_compress_bias_and_target_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    write_model(&model, false);
    let out = dir.path().join("o.hwz");
    let types = |v: &Value| -> Vec<(String, String)> {
        v["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["name"].as_str().unwrap().to_string(),
                    t["encoding"]["type"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    ok(&["compress", p(&model), p(&out), "--min-tensor-size", "2049"]);
    let t = types(&inspect_json(&out));
    assert!(t.contains(&("a.weight".into(), "affine".into())), "{t:?}"); // 3072 values
    assert!(t.contains(&("b.weight".into(), "raw".into())), "{t:?}"); // 2048 values
    assert!(t.contains(&("a.bias".into(), "raw".into())));
    ok(&["compress", p(&model), p(&out), "--compress-bias"]);
    assert!(types(&inspect_json(&out)).contains(&("a.bias".into(), "affine".into())));
    ok(&[
        "compress",
        "gaussian:64x512:1",
        p(&out),
        "--encoding",
        "lattice",
        "--target-ratio",
        "10",
        "--no-zstd",
    ]);
    // 10× smaller than f32 is 3.2 bits a value, all-in (its manifest's share taken from the
    // tensor's rate, estimated within 2 % on this 32K-value file).
    let json = inspect_json(&out);
    let all_in = json["totals"]["lossy"]["all_in_bps"].as_f64().unwrap();
    let bps = json["tensors"][0]["bps"].as_f64().unwrap();
    assert!(all_in <= 3.2 * 1.02 && all_in > 3.1, "{all_in}");
    assert!(bps < 3.1, "{bps}");
}

#[test]
fn auto_picks_by_measurement_and_records_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("a.hwz");
    ok(&[
        "compress",
        "gaussian:256x512:2",
        p(&out),
        "--encoding",
        "auto",
        "--target-ratio",
        "10",
        "--no-zstd",
    ]);
    let v = inspect_json(&out);
    let t = &v["tensors"][0];
    assert!(t["bps"].as_f64().unwrap() <= 3.2);
    assert_eq!(v["plan"]["mode"], "auto");
    let cands = v["plan"]["tensors"][0]["candidates"].as_array().unwrap();
    assert!(cands.len() >= 7, "{cands:?}");
    // The winner is the most accurate candidate that fits 3.2 bps.
    let best = cands
        .iter()
        .filter(|c| c["bps"].as_f64().unwrap() <= 3.2)
        .map(|c| c["rel_mse"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    let chosen = v["plan"]["tensors"][0]["label"].as_str().unwrap();
    let chosen_rel = cands.iter().find(|c| c["label"] == chosen).unwrap()["rel_mse"]
        .as_f64()
        .unwrap();
    assert_eq!(chosen_rel, best);
}

#[test]
fn budget_targets_hold_for_the_whole_archive() {
    // Two matrices and a large 1-D norm kept raw (f32, 32 bits a value): the all-in target is
    // over every value the archive holds, its manifest, plan and raw tensors included (the
    // raw norm alone used to push a 2-bit target to 2.5).
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    let bytes = |n: usize, seed: u64| -> Vec<u8> {
        noise(n, seed)
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect()
    };
    let (a, b, norm) = (bytes(256 * 256, 1), bytes(128 * 256, 2), bytes(2048, 3));
    let tensors = vec![
        (
            "a.weight",
            TensorView::new(Dtype::F32, vec![256, 256], &a).unwrap(),
        ),
        (
            "b.weight",
            TensorView::new(Dtype::F32, vec![128, 256], &b).unwrap(),
        ),
        (
            "norm.weight",
            TensorView::new(Dtype::F32, vec![2048], &norm).unwrap(),
        ),
    ];
    std::fs::write(&model, serialize(tensors, None).unwrap()).unwrap();
    let out = dir.path().join("b.hwz");
    for target in [2.0, 3.0, 4.0] {
        ok(&[
            "compress",
            p(&model),
            p(&out),
            "--mode",
            "budget",
            "--target-bps",
            &target.to_string(),
        ]);
        let file = std::fs::metadata(&out).unwrap().len() as f64;
        let bps = file * 8.0 / (256.0 * 256.0 + 128.0 * 256.0 + 2048.0);
        assert!(
            bps <= target && bps > 0.6 * target,
            "{bps} bits for a target of {target}"
        );
    }
    // Six planned tensors, conv-shaped too: a manifest near the writer's 4 KB limit for a
    // plain one (a 3-bit target gave 3.042 when it was estimated as compressed).
    let shapes: [&[usize]; 6] = [
        &[32, 1, 3, 3],
        &[64, 32, 1, 1],
        &[16, 3, 7, 7],
        &[10, 64],
        &[256, 512],
        &[64, 96],
    ];
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| bytes(s.iter().product(), i as u64 + 7))
        .collect();
    let names: Vec<String> = (0..6).map(|i| format!("t{i}.weight")).collect();
    let tensors: Vec<_> = shapes
        .iter()
        .zip(&data)
        .zip(&names)
        .map(|((s, d), n)| {
            (
                n.as_str(),
                TensorView::new(Dtype::F32, s.to_vec(), d).unwrap(),
            )
        })
        .collect();
    std::fs::write(&model, serialize(tensors, None).unwrap()).unwrap();
    let values: usize = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    for target in [1.02, 2.0, 3.0, 4.0] {
        let t = target.to_string();
        let r = run(&[
            "compress",
            p(&model),
            p(&out),
            "--mode",
            "budget",
            "--target-bps",
            &t,
        ]);
        assert_eq!(r.status.code(), Some(0));
        let bps = std::fs::metadata(&out).unwrap().len() as f64 * 8.0 / values as f64;
        // Just above the cheapest choices' rate the archive's own bytes do not fit beside
        // them: the target holds over the streams, and the run says so (it was silent).
        let warned = String::from_utf8_lossy(&r.stderr).contains("above the target");
        assert_eq!(warned, bps > target, "{bps} bits for a target of {target}");
        assert_eq!(warned, target < 1.5, "{bps} bits for a target of {target}");
    }
}

#[test]
fn plan_then_compress_with_the_plan_and_budget_mode() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    ok(&["synth", p(&model), "--shape", "64x256", "--tensors", "3"]);
    let plan_text = ok(&["plan", p(&model), "--mode", "budget", "--target-bps", "3.5"]);
    let plan: Value = serde_json::from_str(&plan_text).unwrap();
    assert_eq!(plan["tensors"].as_array().unwrap().len(), 3);
    let planned: u64 = plan["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["bytes"].as_u64().unwrap())
        .sum();
    assert!(planned as f64 * 8.0 / (3.0 * 64.0 * 256.0) <= 3.5);
    let plan_path = dir.path().join("plan.json");
    std::fs::write(&plan_path, &plan_text).unwrap();
    let out = dir.path().join("p.hwz");
    ok(&["compress", p(&model), p(&out), "--plan", p(&plan_path)]);
    // The planner counts bytes as the (default, zstd) writer stores them.
    let v = inspect_json(&out);
    assert_eq!(
        v["totals"]["payload_bytes"].as_u64().unwrap(),
        planned,
        "replayed plan, same bytes"
    );
    assert_eq!(v["plan"]["mode"], "budget");
    // Edited plans that do not fit the input are refused, naming what is wrong, and nothing
    // is written.
    let edited = dir.path().join("edited.json");
    let bad_out = dir.path().join("bad.hwz");
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v = plan.clone();
        f(&mut v);
        std::fs::write(&edited, v.to_string()).unwrap();
        let err = fails(&["compress", p(&model), p(&bad_out), "--plan", p(&edited)]);
        assert!(!bad_out.exists());
        err
    };
    let err = edit(&|v| v["tensors"][0]["shape"] = serde_json::json!([256, 64]));
    assert!(err.contains("planned with shape [256, 64]"), "{err}");
    let err = edit(&|v| v["tensors"][1]["name"] = v["tensors"][0]["name"].clone());
    assert!(err.contains("planned twice"), "{err}");
    let err = edit(&|v| v["tensors"][0]["name"] = "ghost".into());
    assert!(err.contains("`ghost` is not in the input"), "{err}");
    let err = edit(&|v| v["version"] = 99.into());
    assert!(err.contains("version 99"), "{err}");
    // Budget directly in compress gives the same archive payload.
    ok(&[
        "compress",
        p(&model),
        p(&out),
        "--mode",
        "budget",
        "--target-bps",
        "3.5",
    ]);
    assert_eq!(
        inspect_json(&out)["totals"]["payload_bytes"]
            .as_u64()
            .unwrap(),
        planned
    );
    // Budget without a target, an unknown mode or candidate: usage errors.
    for args in [
        &["plan", p(&model), "--mode", "budget"][..],
        &["plan", p(&model), "--mode", "fastest"],
        &["plan", p(&model), "--candidates", "int4,e9@3"],
        &["plan", p(&model), "--mode", "best", "--target-bps", "3"],
    ] {
        assert_eq!(run(args).status.code(), Some(1), "{args:?}");
    }
    // PER_BLOCK writes `mixed` when blocks differ, and decompresses.
    ok(&[
        "compress",
        p(&model),
        p(&out),
        "--mode",
        "per_block",
        "--candidates",
        " f32 , int8-row,int4 ", // (spaces around the names, as --encodings takes them)
        "--min-snr-db",
        "25",
        "--block-rows",
        "16",
    ]);
    let v = inspect_json(&out);
    assert_eq!(v["plan"]["mode"], "per_block");
    ok(&[
        "decompress",
        p(&out),
        p(&dir.path().join("back.safetensors")),
    ]);
}

#[test]
fn threads_flag_and_env_size_the_one_pool() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.hwz");
    let out_s = out.to_str().unwrap();
    // The main thread, the signal watcher (Ctrl-C cleanup) and the pool's workers.
    for (threads, expected) in [("1", 3u64), ("2", 4)] {
        let o = bin()
            .args([
                "--threads",
                threads,
                "compress",
                "gaussian:600x512:3",
                out_s,
                "--encoding",
                "auto",
            ])
            .env("HYPERCODEC_REPORT_RSS", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        let live = err
            .lines()
            .find_map(|l| l.strip_prefix("threads: "))
            .and_then(|v| v.parse::<u64>().ok());
        assert_eq!(live, Some(expected), "{err}");
    }
    let zero = run(&["--threads", "0", "inspect", out_s]);
    assert_eq!(zero.status.code(), Some(1));
    // Too many threads is refused before any starts (100000 started 17 000 of them).
    let many = run(&["--threads", "100000", "inspect", out_s]);
    assert_eq!(many.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&many.stderr).contains("from 1 to 1024"));
    // A bad environment value is named as itself (0 was reported as `--threads`).
    for value in ["many", "0"] {
        let bad = bin()
            .args(["inspect", out_s])
            .env("HYPERCODEC_THREADS", value)
            .output()
            .unwrap();
        assert_eq!(bad.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&bad.stderr).contains("HYPERCODEC_THREADS"));
    }
}

/// A safetensors file from a header written by hand (shapes a serializer would refuse).
fn write_st_header(path: &Path, header: Value, data: &[u8]) {
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

/// Fails with exit code 1 (a typed error), not a panic (101) or an abort.
fn fails(args: &[&str]) -> String {
    let out = run(args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn zero_element_tensors_work_in_every_mode_and_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("z.safetensors");
    let w: Vec<u8> = values(64 * 32, 9)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let header = serde_json::json!({
        "a": {"dtype": "F32", "shape": [0, 32], "data_offsets": [0, 0]},
        "b": {"dtype": "F16", "shape": [32, 0], "data_offsets": [0, 0]},
        "c": {"dtype": "F32", "shape": [4, 0, 4], "data_offsets": [0, 0]},
        "w": {"dtype": "F32", "shape": [64, 32], "data_offsets": [0, w.len()]},
    });
    write_st_header(&model, header, &w);
    let hwz = dir.path().join("z.hwz");
    let back = dir.path().join("back.safetensors");
    for mode in [
        "lowest",
        "highest",
        "allow",
        "closest",
        "average",
        "best",
        "per_block",
        "per_weight",
    ] {
        ok(&["plan", p(&model), "--mode", mode]);
        ok(&["compress", p(&model), p(&hwz), "--mode", mode]);
    }
    for extra in [
        &["--mode", "budget", "--target-bps", "3"][..],
        &["--encoding", "auto"],
        &["--encoding", "lattice"],
        &["--encoding", "lowrank"],
        &["--encoding", "codebook"],
        &["--encoding", "sparse"],
    ] {
        let mut args = vec!["compress", p(&model), p(&hwz)];
        args.extend(extra);
        ok(&args);
        ok(&["decompress", p(&hwz), p(&back)]);
        let restored = read_st(&back);
        let shapes: Vec<_> = restored.iter().map(|t| t.2.clone()).collect();
        assert_eq!(
            shapes,
            [vec![0, 32], vec![32, 0], vec![4, 0, 4], vec![64, 32]]
        );
    }
    ok(&["benchmark", p(&model), "--no-peer"]);
}

#[test]
fn a_huge_claimed_shape_with_no_data_allocates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("huge.safetensors");
    let header = serde_json::json!({
        "a": {"dtype": "F32", "shape": [0u64, 1u64 << 40], "data_offsets": [0, 0]},
    });
    write_st_header(&model, header, &[]);
    let hwz = dir.path().join("h.hwz");
    for enc in ["lattice", "auto", "affine"] {
        for extra in [&[][..], &["--include-1d"]] {
            let mut args = vec!["compress", p(&model), p(&hwz), "--encoding", enc];
            args.extend(extra);
            ok(&args);
        }
    }
    ok(&["plan", p(&model)]);
    ok(&["plan", p(&model), "--mode", "closest"]);
    // Nothing with values to measure: a typed error, not a 4 TB allocation.
    fails(&["benchmark", p(&model), "--no-peer"]);
    fails(&["benchmark", p(&model), "--no-peer", "--budget-at", "2.5"]);
}

#[test]
fn budget_benchmark_on_small_tensors_leaves_out_what_cannot_encode_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("s.safetensors");
    ok(&["synth", p(&model), "--shape", "8x64"]);
    let out = run(&["benchmark", p(&model), "--budget-at", "2.5", "--no-peer"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("uniform INT4 g128 asym"), "{text}");
    let gguf = repo_data("blocks.gguf");
    ok(&["benchmark", p(&gguf), "--budget-at", "2.5", "--no-peer"]);
}

#[test]
fn synthetic_inputs_above_the_cap_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("g.hwz");
    fails(&["compress", "gaussian:131072x131072", p(&out)]);
    fails(&["plan", "gaussian:131072x131072"]);
    fails(&["benchmark", "gaussian:131072x131072", "--no-peer"]);
    let st = dir.path().join("g.safetensors");
    fails(&["synth", p(&st), "--shape", "131072x131072"]);
    assert!(!out.exists() && !st.exists());
}

#[test]
fn an_output_that_is_the_input_or_not_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    write_model(&model, false);
    let before = std::fs::read(&model).unwrap();
    fails(&["compress", p(&model), p(&model)]);
    let alias = dir.path().join(".").join("m.safetensors");
    fails(&["compress", p(&model), p(&alias)]);
    assert_eq!(std::fs::read(&model).unwrap(), before, "the input survives");
    let hwz = dir.path().join("m.hwz");
    ok(&["compress", p(&model), p(&hwz)]);
    let archive = std::fs::read(&hwz).unwrap();
    fails(&["decompress", p(&hwz), p(&hwz)]);
    assert_eq!(std::fs::read(&hwz).unwrap(), archive);
    // A folder, and on unix a character device and a FIFO, stay what they are.
    fails(&["compress", p(&model), p(dir.path())]);
    #[cfg(unix)]
    {
        fails(&["compress", p(&model), "/dev/null"]);
        fails(&["decompress", p(&hwz), "/dev/null"]);
        fails(&["synth", "/dev/null", "--shape", "4x4"]);
        let fifo = dir.path().join("fifo");
        let made = Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            fails(&["compress", p(&model), p(&fifo)]);
            use std::os::unix::fs::FileTypeExt;
            assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        }
    }
}

#[test]
fn odd_arguments_and_inputs_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    write_model(&model, false);
    let hwz = dir.path().join("m.hwz");
    let m = p(&model);
    for args in [
        &[
            "compress",
            m,
            p(&hwz),
            "--encoding",
            "lattice",
            "--snr-db",
            "NaN",
        ][..],
        &["compress", m, p(&hwz), "--min-snr-db", "NaN"],
        &[
            "compress",
            m,
            p(&hwz),
            "--mode",
            "best",
            "--min-snr-db",
            "NaN",
        ],
        &["plan", m, "--min-snr-db", "NaN"],
        &["plan", m, "--block-rows", "0"],
        &[
            "compress",
            m,
            p(&hwz),
            "--mode",
            "per_block",
            "--block-rows",
            "0",
        ],
    ] {
        fails(args);
    }
    assert!(!hwz.exists());
    // An SNR target beyond the lattice's calibrated range is refused, not clamped.
    let err = fails(&[
        "compress",
        "gaussian:8x64",
        p(&hwz),
        "--encoding",
        "lattice",
        "--snr-db",
        "60",
    ]);
    assert!(err.contains("dB on Gaussian data, not 60 dB"), "{err}");
    // Rates that one flag would silently override or round are refused, naming the flags.
    let lattice = [
        "compress",
        "gaussian:8x64",
        p(&hwz),
        "--encoding",
        "lattice",
    ];
    for (extra, says) in [
        (
            &["--bps", "3", "--target-ratio", "10"][..],
            "give one of --bps and --target-ratio",
        ),
        (
            &["--bps", "3", "--target-bps", "2"],
            "give one of --bps and --target-bps",
        ),
        (
            &["--coding", "fixed", "--bps", "1.5"],
            "2 to 8 whole bits per value, not 1.5",
        ),
        (
            &["--coding", "fixed", "--bps", "9"],
            "not 9; above 8 bits take affine INT8",
        ),
        (
            &["--coding", "fixed", "--target-bps", "3"],
            "not from --target-bps",
        ),
        (
            &["--snr-db", "20", "--target-ratio", "10"],
            "give one of them or --snr-db",
        ),
        (&["--coding", "fixed", "--snr-db", "20"], "not from an SNR"),
    ] {
        let args: Vec<&str> = lattice.iter().chain(extra).copied().collect();
        let err = fails(&args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // --bps and --snr-db where they do not apply (`--encoding affine --snr-db 20` wrote INT4
    // without a word).
    let (rate, snr) = (
        "sets the rate of --encoding lattice",
        "sets the target SNR of --encoding lattice",
    );
    for (extra, says) in [
        (&["--encoding", "affine", "--bps", "3"][..], rate),
        (
            &["--mode", "budget", "--target-bps", "3", "--bps", "3"],
            rate,
        ),
        (&["--encoding", "affine", "--snr-db", "20"], snr),
        (&["--mode", "best", "--snr-db", "20"], snr),
        // Other options that this run's route would not read, naming what reads them
        // (`--encoding lattice --bits 3` kept the lattice's 4 bits without a word).
        (
            &["--encoding", "lattice", "--bits", "3"][..],
            "--bits: applies to --encoding affine and trellis, not here: this run stores --encoding lattice",
        ),
        (
            &["--mode", "best", "--group", "64"],
            "--group: applies to --encoding affine, not here: this run plans with --mode best",
        ),
        (
            &["--encoding", "auto", "--coding", "rice"],
            "--coding: applies to --encoding lattice, not here: this run plans with --encoding auto",
        ),
        (
            &["--encoding", "affine", "--trellis-l", "12"],
            "--trellis-l: applies to --encoding trellis",
        ),
        (&["--candidates", "int4"], "--candidates: applies to a planner mode"),
        (
            &["--encoding", "trellis", "--min-snr-db", "20"],
            "--min-snr-db: applies to a planner mode (--mode), not here: this run stores --encoding trellis",
        ),
        (&["--block-rows", "8"], "--block-rows: applies to a planner mode"),
        (
            &["--encoding", "raw-f16", "--scale-dtype", "bf16"],
            "--scale-dtype: applies to --encoding affine, lattice and trellis",
        ),
    ] {
        let mut args = vec!["compress", "gaussian:8x64", p(&hwz)];
        args.extend(extra);
        let err = fails(&args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(!hwz.exists());
    // A plan's recipes are read as stored: the planner's options, even beside --encoding auto
    // (a planner mode of its own), are not read.
    let plan = dir.path().join("p.json");
    std::fs::write(&plan, ok(&["plan", "gaussian:8x64"])).unwrap();
    for extra in [
        &["--min-snr-db", "3"][..],
        &["--encoding", "auto", "--candidates", "int4"],
    ] {
        let mut args = vec!["compress", "gaussian:8x64", p(&hwz), "--plan", p(&plan)];
        args.extend(extra);
        let err = fails(&args);
        assert!(
            err.contains("not here: a plan chooses each tensor's encoding"),
            "{args:?}: {err}"
        );
    }
    assert!(!hwz.exists());
    // The same options where their route reads them.
    for extra in [
        &[
            "--encoding",
            "affine",
            "--bits",
            "3",
            "--group",
            "32",
            "--scale-dtype",
            "bf16",
        ][..],
        &[
            "--encoding",
            "trellis",
            "--bits",
            "2",
            "--trellis-l",
            "10",
            "--max-tile",
            "32",
        ],
        &[
            "--mode",
            "best",
            "--min-snr-db",
            "20",
            "--candidates",
            "int4,int8-row",
        ],
        &[
            "--encoding",
            "lattice",
            "--coding",
            "rice",
            "--chunk",
            "256",
        ],
    ] {
        let mut args = vec!["compress", "gaussian:8x64", p(&hwz)];
        args.extend(extra);
        ok(&args);
    }
    // The demo's folder named as a file: said so (it said "File exists").
    let err = fails(&["demo", "--dir", m]);
    assert!(
        err.contains("is a file; the demo writes its files into a folder"),
        "{err}"
    );
    // A file beside --runtime (which measures weights of --shapes) was ignored: a usage error.
    let both = run(&["benchmark", "gaussian:8x64", "--runtime"]);
    assert_eq!(both.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"));
    // The one that asks for a rate alone still works.
    ok(&[
        "compress",
        "gaussian:8x64",
        p(&hwz),
        "--encoding",
        "lattice",
        "--target-ratio",
        "10",
    ]);
    std::fs::remove_file(&hwz).unwrap();
    // A benchmark filter that matches nothing is named, even beside one that matches; spaces
    // and case as typed in a list still match; an empty list is named.
    let tiny = [
        "benchmark",
        "--runtime",
        "--shapes",
        "16x64",
        "--batches",
        "1",
    ];
    let with = |list: &'static str| {
        let mut a = tiny.to_vec();
        a.extend(["--encodings", list]);
        a
    };
    let err = fails(&with("int4-g128,int9"));
    assert!(err.contains("`int9` match no encoding"), "{err}");
    ok(&with("INT4-g128, int8"));
    assert!(fails(&with(",")).contains("names no encoding"));
    // --sensitivity: the JSON object itself, or a file holding it.
    let budget = [
        "plan",
        m,
        "--mode",
        "budget",
        "--target-bps",
        "4",
        "--sensitivity",
    ];
    let mut inline = budget.to_vec();
    inline.push(r#"{"a.weight": 4, "b.weight": 0.5}"#);
    ok(&inline);
    let weights = dir.path().join("w.json");
    std::fs::write(&weights, r#"{"a.weight": 4}"#).unwrap();
    let mut file = budget.to_vec();
    file.push(p(&weights));
    ok(&file);
    let mut bad = budget.to_vec();
    bad.push(r#"{"a.weight": "x"}"#);
    fails(&bad);
    // A near-GGUF magic is neither format.
    let ggux = dir.path().join("x.gguf");
    let mut bytes = std::fs::read(repo_data("blocks.gguf")).unwrap();
    bytes[..4].copy_from_slice(b"GGUX");
    std::fs::write(&ggux, bytes).unwrap();
    let err = fails(&["compress", p(&ggux), p(&hwz)]);
    assert!(err.contains("not a safetensors or GGUF file"), "{err}");
    // Every tensor skipped (f64 only): an error, and no archive.
    let f64s: Vec<u8> = (0..16).flat_map(|i| (i as f64).to_le_bytes()).collect();
    let only_f64 = dir.path().join("f64.safetensors");
    let view = TensorView::new(Dtype::F64, vec![4, 4], &f64s).unwrap();
    std::fs::write(&only_f64, serialize(vec![("w", view)], None).unwrap()).unwrap();
    let err = fails(&["compress", p(&only_f64), p(&hwz)]);
    assert!(err.contains("F64"), "{err}");
    assert!(!hwz.exists());
}

#[test]
fn a_closed_stdout_ends_every_printing_command_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("many.safetensors");
    ok(&["synth", p(&model), "--shape", "2x16", "--tensors", "1500"]);
    let hwz = dir.path().join("many.hwz");
    ok(&["compress", p(&model), p(&hwz), "--encoding", "raw-f16"]);
    // Each prints far more than a pipe holds (64 KiB), so the writes meet the closed pipe.
    for args in [
        &["inspect", p(&hwz)][..],
        &["inspect", p(&hwz), "--json"],
        &["plan", p(&model), "--candidates", "f32"],
    ] {
        let mut child = bin()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut head = [0u8; 64];
        child.stdout.take().unwrap().read_exact(&mut head).unwrap();
        // The read end is dropped here, like `| head -c 64`.
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn tiny_and_subnormal_values_are_never_a_lossy_success_below_0_db() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.safetensors");
    // std 1e-8 (below f16's smallest subnormal, 6e-8) and subnormal f32 values.
    let tiny: Vec<u8> = values(32 * 64, 5)
        .iter()
        .flat_map(|&x| (x * 1e-8).to_le_bytes())
        .collect();
    let sub: Vec<u8> = values(32 * 64, 6)
        .iter()
        .flat_map(|&x| (x * 1e-39).to_le_bytes())
        .collect();
    let tensors = vec![
        (
            "sub",
            TensorView::new(Dtype::F32, vec![32, 64], &sub).unwrap(),
        ),
        (
            "tiny",
            TensorView::new(Dtype::F32, vec![32, 64], &tiny).unwrap(),
        ),
    ];
    std::fs::write(&model, serialize(tensors, None).unwrap()).unwrap();
    let input = read_st(&model);
    let hwz = dir.path().join("t.hwz");
    let back = dir.path().join("back.safetensors");
    for enc in ["affine", "lattice", "codebook", "auto"] {
        ok(&["compress", p(&model), p(&hwz), "--encoding", enc]);
        let v = inspect_json(&hwz);
        for t in v["tensors"].as_array().unwrap() {
            let snr = t["stats"]["snr_db"].as_f64().unwrap_or(f64::INFINITY);
            assert!(snr > 0.0, "{enc}: {} at {snr} dB", t["name"]);
            // std 1e-8 is no longer too small for affine and lattice scales: they are stored
            // as bf16 (f16's would be zero) and keep the SNR of any Gaussian tensor.
            if t["name"] == "tiny" && (enc == "affine" || enc == "lattice") {
                assert!(snr > 15.0, "{enc}: tiny at {snr} dB");
                assert!(t["encoding"].to_string().contains("bf16"), "{enc}: {t}");
            }
        }
        ok(&["decompress", p(&hwz), p(&back)]);
        // Sorted by name: "sub", then "tiny".
        let out = read_st(&back);
        let f32s = |b: &[u8]| -> Vec<f64> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect()
        };
        let (a, b) = (f32s(&input[1].3), f32s(&out[1].3));
        let s: f64 = a.iter().map(|x| x * x).sum();
        let e: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
        assert!(10.0 * (s / e).log10() > 15.0, "{enc}: tiny decoded");
    }
}

#[test]
fn lattice_scale_tensor_lowers_the_squared_error_of_rows_of_unequal_size() {
    // Rows whose RMS spans 1/8 to 8, through --encoding lattice and through BUDGET.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("m.safetensors");
    let mut w = noise(128 * 256, 9);
    for (r, row) in w.chunks_exact_mut(256).enumerate() {
        let k = 2f32.powi((r % 7) as i32 - 3);
        row.iter_mut().for_each(|v| *v *= k);
    }
    let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    let t = TensorView::new(Dtype::F32, vec![128, 256], &bytes).unwrap();
    std::fs::write(&input, serialize(vec![("w", t)], None).unwrap()).unwrap();
    for route in [
        &["--encoding", "lattice", "--bps", "3"][..],
        // Lattice candidates only: counted after zstd, INT4 with one scale wins this tensor
        // (its small rows' codes compress), and the lattice's scale would not be exercised.
        &[
            "--mode",
            "budget",
            "--target-bps",
            "3",
            "--candidates",
            "e8@2,e8@2.5,e8@3,e8@3.5,e8@4",
        ][..],
    ] {
        let mut mse = Vec::new();
        for scale in ["row", "tensor"] {
            let out = dir.path().join(format!("{scale}.hwz"));
            let mut args = vec![
                "compress",
                p(&input),
                p(&out),
                "--json",
                "--lattice-scale",
                scale,
            ];
            args.extend_from_slice(route);
            let report: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
            assert!(
                report["lossy_bps"].as_f64().unwrap() <= 3.0 * 1.01,
                "{report}"
            );
            mse.push(10f64.powf(-report["snr_db"].as_f64().unwrap() / 10.0));
        }
        assert!(mse[1] < 0.8 * mse[0], "{route:?}: {mse:?}");
    }
}

/// Rice codes spend at least a bit a symbol, so near 1.5 bits a value their rate control finds
/// no scale: the tensor takes rANS on the same lattice within the rate (it took INT3 at 2.49
/// bits), and the fallback is listed with its reason.
#[test]
fn rice_below_its_reach_steps_down_to_rans_within_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    let hwz = dir.path().join("r.hwz");
    let out = ok(&[
        "compress",
        "gaussian:256x1024:1",
        p(&hwz),
        "--encoding",
        "lattice",
        "--coding",
        "rice",
        "--bps",
        "1.5",
    ]);
    assert!(out.contains("no scale for Rice codes"), "{out}");
    let json = inspect_json(&hwz);
    let t = &json["tensors"][0];
    assert_eq!(t["encoding"]["type"], "lattice", "{t}");
    assert_eq!(t["encoding"]["coding"]["type"], "rans", "{t}");
    let all_in = json["totals"]["lossy"]["all_in_bps"].as_f64().unwrap();
    assert!(all_in <= 1.5 * 1.02, "{all_in}");
}

#[test]
fn lattice_bps_hands_what_the_grid_tensors_leave_to_the_lattice_tensors() {
    // Sixteen 5×5 depthwise kernels (the lattice would pad 25 values to 32: they take the
    // grid) of few distinct values, whose grid codes zstd shrinks to a fraction; then one
    // large layer. The bits the kernels leave unspent go to the layer after them.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = (0..16)
        .map(|i| {
            let v: Vec<u8> = (0..64 * 25)
                .map(|j| (((j * 7 + i) % 5) as f32 - 2.0) * 0.25)
                .flat_map(|x: f32| x.to_le_bytes())
                .collect();
            (format!("dw{i:02}.weight"), vec![64, 1, 5, 5], v)
        })
        .collect();
    let big: Vec<u8> = values(512 * 1024, 9)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    owned.push(("fc.weight".into(), vec![512, 1024], big));
    let out = dir.path().join("m.hwz");
    // The model written, compressed at 3 bits, and inspected.
    let at_3 = |owned: &[(String, Vec<usize>, Vec<u8>)]| {
        let views: Vec<(&str, TensorView<'_>)> = owned
            .iter()
            .map(|(n, s, b)| {
                (
                    n.as_str(),
                    TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
                )
            })
            .collect();
        std::fs::write(&model, serialize(views, None).unwrap()).unwrap();
        ok(&[
            "compress",
            p(&model),
            p(&out),
            "--encoding",
            "lattice",
            "--bps",
            "3",
        ]);
        inspect_json(&out)
    };
    let v = at_3(&owned);
    let grid = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["label"].as_str().unwrap().starts_with("affine"))
        .count();
    assert_eq!(grid, 16, "{v}");
    let all_in = v["totals"]["lossy"]["all_in_bps"].as_f64().unwrap();
    // Without the hand-on: 2.71 (the layer at the plan's 2.80 bits).
    assert!((2.88..=3.0).contains(&all_in), "{all_in}");
    // The large layer first and a small one last: the kernels' surplus accrues after the
    // large layer, and the small one takes at most a bit a value more than the plan's rate
    // (uncapped it took all of it: 8 bits).
    owned.iter_mut().for_each(|t| {
        if t.0 == "fc.weight" {
            t.0 = "a.weight".into()
        }
    });
    let small: Vec<u8> = values(64 * 256, 10)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    owned.push(("z.weight".into(), vec![64, 256], small));
    let v = at_3(&owned);
    let z = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "z.weight")
        .unwrap();
    let z_bps = z["bps"].as_f64().unwrap();
    assert!((3.0..=4.05).contains(&z_bps), "{z_bps}");
    assert!(v["totals"]["lossy"]["all_in_bps"].as_f64().unwrap() <= 3.0);
    // A grid that holds most of the values (a 100000×1 column: a scale a row would cost 16
    // bits a value, so the lattice cannot serve it) shrinks under zstd, and what it leaves
    // goes to the layer after it up to the model's target, not just a bit a value more than
    // the plan's rate (it took 2.76 bits at 3).
    let col: Vec<u8> = values(100_000, 11)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let conv: Vec<u8> = values(64 * 3 * 7 * 7, 12)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let v = at_3(&[
        ("col".into(), vec![100_000, 1], col),
        ("conv.weight".into(), vec![64, 3, 7, 7], conv),
    ]);
    let conv = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "conv.weight")
        .unwrap();
    let conv_bps = conv["bps"].as_f64().unwrap();
    assert!((2.9..=3.05).contains(&conv_bps), "{conv_bps}: {v}");
    assert!(v["totals"]["lossy"]["all_in_bps"].as_f64().unwrap() <= 3.0);
}

#[test]
fn an_archive_of_no_values_states_no_rate() {
    // Its manifest over "one" value read 3688 bits/value all-in.
    let dir = tempfile::tempdir().unwrap();
    let hwz = dir.path().join("z.hwz");
    let text = ok(&[
        "compress",
        "gaussian:0x16",
        p(&hwz),
        "--encoding",
        "lattice",
        "--bps",
        "2",
    ]);
    assert!(
        text.contains("0 values") && !text.contains("bits/value all-in"),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["compress", "gaussian:0x16", p(&hwz), "--json"])).unwrap();
    assert!(json["bps_file"].is_null(), "{json}");
    // `inspect` agrees: no rate and no ratio (it printed 0.000 bps all-in for 461 bytes).
    let totals = &inspect_json(&hwz)["totals"];
    for key in ["bps_file", "bps_payload", "ratio_vs_f32"] {
        assert!(totals[key].is_null(), "{key}: {totals}");
    }
    let text = ok(&["inspect", p(&hwz)]);
    assert!(text.contains("(– bps all-in, –x vs f32)"), "{text}");
}

/// The planner counts bytes as the run's writer stores them: a three-level tensor's INT8 codes
/// shrink under zstd below the lattice's 4 bits, so LOWEST takes INT8 with zstd and the lattice
/// without (`compress --no-zstd`, and `plan --no-zstd` for a plan replayed so).
#[test]
fn lowest_counts_bytes_as_the_run_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    let data: Vec<u8> = noise(256 * 256, 5)
        .iter()
        .flat_map(|x| ((x * 1.5).round().clamp(-1.0, 1.0)).to_le_bytes())
        .collect();
    write_st_header(
        &model,
        serde_json::json!({"w": {"dtype": "F32", "shape": [256, 256], "data_offsets": [0, data.len()]}}),
        &data,
    );
    let out = dir.path().join("o.hwz");
    let label = |extra: &[&str]| -> String {
        let mut args = vec![
            "compress",
            p(&model),
            p(&out),
            "--mode",
            "lowest",
            "--candidates",
            "int8-row,e8@4",
        ];
        args.extend_from_slice(extra);
        ok(&args);
        inspect_json(&out)["tensors"][0]["label"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(label(&[]).starts_with("affine-int8"), "{}", label(&[]));
    assert!(label(&["--no-zstd"]).starts_with("lattice"));
    for (extra, expect) in [(&[][..], "affine-int8"), (&["--no-zstd"][..], "lattice")] {
        let mut args = vec![
            "plan",
            p(&model),
            "--mode",
            "lowest",
            "--candidates",
            "int8-row,e8@4",
        ];
        args.extend_from_slice(extra);
        let plan: Value = serde_json::from_str(&ok(&args)).unwrap();
        let got = plan["tensors"][0]["label"].as_str().unwrap();
        assert!(got.starts_with(expect), "{extra:?}: {got}");
    }
}

/// Inputs no issue names (a hostile pass): a run never panics on a tensor of no values or a
/// huge batch, no file the run reads is overwritten by its output (a shard of the input, a
/// plan, the benchmark's model), a FIFO or a sparse 3 GB "plan" is refused without blocking or
/// reading it, and `synth` caps its tensor count.
#[test]
fn hostile_inputs_and_outputs_are_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let code = |args: &[&str]| run(args).status.code();
    // A [0, 2^64 - 1] tensor has no values: compress takes it, run has nothing to run.
    let empty = d("empty.safetensors");
    write_st_header(
        &empty,
        serde_json::json!({"w": {"dtype": "F32", "shape": [0u64, u64::MAX], "data_offsets": [0, 0]}}),
        &[],
    );
    ok(&["compress", p(&empty), p(&d("e.hwz"))]);
    assert_eq!(code(&["run", p(&d("e.hwz"))]), Some(1));
    // Batches past the cap are usage errors, 0 too.
    let a = d("a.hwz");
    ok(&["compress", "gaussian:64x256", p(&a)]);
    assert_eq!(code(&["run", p(&a), "--batch", "4294967296"]), Some(2));
    for b in ["0", "18446744073709551615"] {
        assert_eq!(
            code(&[
                "benchmark",
                "--runtime",
                "--shapes",
                "64x64",
                "--batches",
                b
            ]),
            Some(2)
        );
    }
    // Outputs over files the run reads: refused, the file unchanged.
    let model = d("m.safetensors");
    ok(&["synth", p(&model), "--shape", "16x64"]);
    let before = std::fs::read(&model).unwrap();
    assert_eq!(
        code(&["benchmark", p(&model), "--markdown", p(&model)]),
        Some(1)
    );
    let plan = d("plan.json");
    std::fs::write(&plan, ok(&["plan", p(&model), "--mode", "lowest"])).unwrap();
    let plan_text = std::fs::read(&plan).unwrap();
    assert_eq!(
        code(&["compress", p(&model), p(&plan), "--plan", p(&plan)]),
        Some(1)
    );
    assert_eq!(std::fs::read(&plan).unwrap(), plan_text);
    let shards = d("sh");
    std::fs::create_dir(&shards).unwrap();
    let shard = shards.join("s1.safetensors");
    std::fs::copy(&model, &shard).unwrap();
    std::fs::write(
        shards.join("model.safetensors.index.json"),
        r#"{"weight_map": {"layers.0.weight": "s1.safetensors"}}"#,
    )
    .unwrap();
    assert_eq!(code(&["compress", p(&shards), p(&shard)]), Some(1));
    assert_eq!(std::fs::read(&shard).unwrap(), before);
    assert_eq!(std::fs::read(&model).unwrap(), before);
    // A 3 GB sparse file given as a plan is refused by its size, not read.
    let big = d("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    let err = fails(&["compress", p(&model), p(&d("o.hwz")), "--plan", p(&big)]);
    assert!(err.contains("more than a plan holds"), "{err}");
    // A FIFO is no input: refused at once, not opened (which would block for ever).
    #[cfg(unix)]
    {
        let fifo = d("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let err = fails(&["compress", p(&fifo), p(&d("f.hwz"))]);
            assert!(err.contains("a FIFO"), "{err}");
            let err = fails(&["inspect", p(&fifo)]);
            assert!(err.contains("a FIFO"), "{err}");
        }
    }
    let err = fails(&[
        "synth",
        p(&d("s.safetensors")),
        "--shape",
        "1x1",
        "--tensors",
        "10000000",
    ]);
    assert!(err.contains("at most 65536"), "{err}");
    // Codebook options no format holds, each named by its flag; codebook shapes with the
    // format's reason (the error named a probe tensor, "tensor `check` has an invalid encoding").
    for (args, says, check_ok) in [
        (
            &["--residual-k", "1", "--residual-budget=nan"][..],
            "--residual-budget",
            true,
        ),
        (
            &["--residual-k", "1", "--residual-budget=-1"],
            "--residual-budget",
            true,
        ),
        (
            &["--n-prototypes=0"],
            "--block-size / --n-prototypes: prototypes 0 must be in 1..=65536",
            false,
        ),
        (
            &["--block-size=0"],
            "--block-size / --n-prototypes: codebook block 0 must be in 2..=64",
            false,
        ),
    ] {
        let out = d("c.hwz");
        let mut argv = vec![
            "compress",
            "gaussian:64x256",
            p(&out),
            "--encoding",
            "codebook",
        ];
        argv.extend_from_slice(args);
        let err = fails(&argv);
        assert!(
            err.contains(says) && (check_ok || !err.contains("check")),
            "{err}"
        );
    }
    // A name that holds an escape sequence is printed escaped in the error.
    let esc = d("esc.safetensors");
    write_st_header(
        &esc,
        serde_json::json!({"w\u{1b}[2J": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}),
        &[0, 0, 0xc0, 0x7f].repeat(4),
    );
    let err = fails(&["compress", p(&esc), p(&d("esc.hwz"))]);
    assert!(
        !err.contains('\u{1b}') && err.contains("\\u{1b}"),
        "{err:?}"
    );
    // An encoding beside a planner mode or a plan is refused, not dropped (it wrote INT4).
    let t_out = d("t.hwz");
    for extra in [&["--mode", "lowest"][..], &["--plan", p(&plan)]] {
        let mut args = vec!["compress", p(&model), p(&t_out), "--encoding", "trellis"];
        args.extend_from_slice(extra);
        let err = fails(&args);
        assert!(err.contains("--encoding"), "{err}");
    }
}
