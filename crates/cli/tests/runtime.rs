//! `hypercodec run` and `hypercodec benchmark --runtime` end to end.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn ok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hypercodec"))
        .args(args)
        .output()
        .expect("spawn hypercodec");
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn run_chains_a_compressed_mlp_and_matches_the_dense_stack() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("mlp.safetensors");
    // Three 384x384 layers: each feeds the next.
    ok(&["synth", p(&model), "--shape", "384x384", "--tensors", "3"]);
    for (label, flags) in [
        ("int4", vec!["--bits", "4"]),
        (
            "e8-fixed",
            vec!["--encoding", "lattice", "--coding", "fixed", "--bps", "4"],
        ),
        ("e8-rans", vec!["--encoding", "lattice", "--bps", "4"]),
        (
            "tcq",
            vec!["--encoding", "trellis", "--bits", "4", "--trellis-l", "12"],
        ),
        (
            "tcq-pairs",
            vec![
                "--encoding",
                "trellis",
                "--bits",
                "4",
                "--trellis-l",
                "12",
                "--trellis-pairs",
            ],
        ),
    ] {
        let hwz = dir.path().join(format!("{label}.hwz"));
        let mut args = vec!["compress", p(&model), p(&hwz)];
        args.extend(flags);
        ok(&args);
        let r: Value =
            serde_json::from_str(&ok(&["run", p(&hwz), "--json", "--batch", "2"])).unwrap();
        let layers = r["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 3, "{label}");
        let chained: Vec<bool> = layers
            .iter()
            .map(|l| l["chained"].as_bool().unwrap())
            .collect();
        assert_eq!(chained, [false, true, true]);
        // Each layer's route at the run's batch (it printed the batch-1 path).
        if label == "tcq" {
            let path = layers[0]["path"].as_str().unwrap();
            assert!(path.contains("2 rows"), "{path}");
        }
        // Against the decompressed weights: the same product, up to f32 summation order.
        let snr = r["output_snr_db"].as_f64().unwrap_or(f64::INFINITY);
        assert!(snr > 80.0, "{label}: {snr}");
        assert!(r["speedup"].as_f64().unwrap() > 0.0);
        // Against the original weights: the compression's error, a 4-bit one.
        let r: Value =
            serde_json::from_str(&ok(&["run", p(&hwz), "--json", "--original", p(&model)]))
                .unwrap();
        let snr = r["output_snr_db"].as_f64().unwrap();
        assert!((12.0..40.0).contains(&snr), "{label}: {snr}");
        assert_eq!(r["against_original"], true);
    }
}

#[test]
fn runtime_benchmark_reports_every_encoding_and_batch() {
    let out = ok(&[
        "benchmark",
        "--runtime",
        "--shapes",
        "64x256,40x100",
        "--batches",
        "1,3,20",
        "--json",
    ]);
    let rows: Value = serde_json::from_str(&out).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2 * 8 * 3);
    // 3-bit codes (BUDGET's candidates hold them) are dotted in 3-byte words, as 4-bit ones
    // in bytes.
    assert!(rows
        .iter()
        .any(|r| r["encoding"] == "int3-g128" && r["path"] == "affine-int3-fused"));
    // The prefix codes run on the CPU from their stored chunks at batch 1.
    assert!(rows.iter().any(|r| r["encoding"] == "e8-prefix"
        && r["batch"] == 1
        && r["path"] == "lattice-resident-prefix"));
    for r in rows {
        for key in ["ours_us", "dense_us", "speedup"] {
            assert!(r[key].as_f64().unwrap() > 0.0, "{r}");
        }
        let (held, stored) = (
            r["held_bytes"].as_u64().unwrap(),
            r["stored_bytes"].as_u64().unwrap(),
        );
        assert!(held > 0 && stored > 0);
        if r["batch"] == 1 {
            assert!(!r["path"].as_str().unwrap().contains("tiles"), "{r}");
        }
    }
    let table = ok(&[
        "benchmark",
        "--runtime",
        "--shapes",
        "32x64",
        "--batches",
        "1",
        "--encodings",
        "int4",
    ]);
    assert!(
        table.contains("| 32x64 | 1 | int4-g128 | affine-int4-fused |"),
        "{table}"
    );
}

#[test]
fn trellis_falls_back_on_rows_too_short_for_its_state() {
    // 8×3 rows hold 6 bits at K = 2, fewer than a 12-bit state: the model still compresses,
    // that tensor takes the lattice's fallback grid and is listed.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("short.safetensors");
    ok(&["synth", p(&model), "--shape", "8x3", "--tensors", "2"]);
    let hwz = dir.path().join("short.hwz");
    let out = ok(&[
        "compress",
        p(&model),
        p(&hwz),
        "--encoding",
        "trellis",
        "--bits",
        "2",
        "--trellis-l",
        "12",
        "--json",
    ]);
    let r: Value = serde_json::from_str(&out).unwrap();
    let fallbacks = r["fallbacks"].as_array().unwrap();
    assert_eq!(fallbacks.len(), 2, "{r}");
    assert!(fallbacks[0].to_string().contains("trellis state"), "{r}");
}
