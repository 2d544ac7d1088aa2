//! Every encoding and planner mode on a CNN (`synth --model cnn`: MobileNetV2's shapes, 3×3
//! depthwise and 1×1 pointwise kernels, a stem, batch norms): nothing aborts, and every rate
//! target holds over the encoded tensors, all side information included.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn hypercodec(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hypercodec"))
        .args(args)
        .output()
        .expect("spawn hypercodec");
    assert_ne!(out.status.code(), Some(101), "panicked: {args:?}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn compress(model: &Path, out: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "compress",
        model.to_str().unwrap(),
        out.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = hypercodec(&args);
    assert!(ok, "{extra:?} failed: {stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// Rates are met within this share of the target (rate control lands just under it).
const RATE_TOLERANCE: f64 = 0.01;

/// Bits per encoded value all-in (`inspect --json`'s `totals.lossy.all_in_bps`: the archive's
/// bytes less those of the tensors stored exactly, over the lossy tensors' values).
fn all_in_bps(archive: &Path) -> f64 {
    let (ok, stdout, stderr) = hypercodec(&["inspect", archive.to_str().unwrap(), "--json"]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    v["totals"]["lossy"]["all_in_bps"].as_f64().unwrap()
}

#[test]
fn every_encoding_and_mode_succeeds_on_a_cnn_at_2_3_4_bps() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("cnn.safetensors");
    let (ok, _, err) = hypercodec(&["synth", model.to_str().unwrap(), "--model", "cnn"]);
    assert!(ok, "{err}");
    let out = dir.path().join("cnn.hwz");
    for bps in ["2", "3", "4"] {
        let target: f64 = bps.parse().unwrap();
        for extra in [
            vec!["--encoding", "lattice", "--bps", bps],
            vec!["--encoding", "lattice", "--coding", "rice", "--bps", bps],
            vec!["--encoding", "auto", "--target-bps", bps],
            vec!["--mode", "budget", "--target-bps", bps],
        ] {
            let s = compress(&model, &out, &extra);
            let got = s["lossy_bps"].as_f64().unwrap();
            assert!(
                got <= target * (1.0 + RATE_TOLERANCE),
                "{extra:?}: {got} bps over the encoded tensors"
            );
            // All-in too (the manifest, a stored plan, the alignment), but for AUTO, whose
            // target is per tensor.
            if extra[1] != "auto" {
                let all_in = all_in_bps(&out);
                assert!(
                    all_in <= target * (1.0 + RATE_TOLERANCE),
                    "{extra:?}: {all_in} bps all-in"
                );
            }
            assert!(s["snr_db"].as_f64().unwrap() > 3.0, "{extra:?}: {s}");
        }
        // Fixed-rate and fixed-width forms: their width is the setting.
        for extra in [
            vec!["--encoding", "lattice", "--coding", "fixed", "--bps", bps],
            vec!["--encoding", "affine", "--bits", bps],
            vec![
                "--encoding",
                "affine",
                "--bits",
                bps,
                "--group",
                "row",
                "--symmetric",
            ],
        ] {
            let s = compress(&model, &out, &extra);
            assert!(s["min_snr_db"].as_f64().unwrap() > 0.0, "{extra:?}: {s}");
        }
    }
    // `--target-scope streams`: the budget is the streams' alone (more bytes for the weights).
    let all_in = compress(&model, &out, &["--mode", "budget", "--target-bps", "3"]);
    let streams = compress(
        &model,
        &out,
        &[
            "--mode",
            "budget",
            "--target-bps",
            "3",
            "--target-scope",
            "streams",
        ],
    );
    let (a, s) = (
        all_in["lossy_bps"].as_f64().unwrap(),
        streams["lossy_bps"].as_f64().unwrap(),
    );
    assert!(a < s && s <= 3.0 * (1.0 + RATE_TOLERANCE), "{a} vs {s}");
    // INT4 in groups of 128 along each output channel: no group per value on 1×1 kernels.
    let s = compress(&model, &out, &["--encoding", "affine", "--bits", "4"]);
    assert!(s["lossy_bps"].as_f64().unwrap() <= 4.6, "{s}");
    // A lattice target that nothing reaches names the smallest reachable rate.
    let (ok, _, err) = hypercodec(&[
        "compress",
        model.to_str().unwrap(),
        out.to_str().unwrap(),
        "--encoding",
        "lattice",
        "--bps",
        "0.3",
    ]);
    assert!(!ok && err.contains("smallest reachable"), "{err}");
    // The other encodings and every planner mode.
    for extra in [
        vec!["--encoding", "raw-bf16"],
        vec!["--encoding", "codebook"],
        vec!["--encoding", "lowrank"],
        vec!["--encoding", "sparse"],
        vec!["--encoding", "auto"],
        vec!["--mode", "lowest"],
        vec!["--mode", "highest"],
        vec!["--mode", "allow"],
        vec!["--mode", "closest"],
        vec!["--mode", "average"],
        vec!["--mode", "best"],
        vec!["--mode", "per_block"],
        vec!["--mode", "per_weight"],
    ] {
        compress(&model, &out, &extra);
    }
}
