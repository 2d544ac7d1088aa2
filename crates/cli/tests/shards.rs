//! Sharded archives: written with `--shard-size`, opened as one model by `inspect` and
//! `decompress` through the index; a cancelled or failed run leaves no shard behind.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use serde_json::Value;
use std::process::Command;

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hypercodec"))
        .args(args)
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(101), "panicked: {args:?}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn sharded_archives_write_inspect_and_decompress_as_one_model() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let model = p("m.safetensors");
    let (ok, _, err) = run(&["synth", &model, "--shape", "64x256", "--tensors", "6"]);
    assert!(ok, "{err}");
    let (ok, _, err) = run(&[
        "compress",
        &model,
        &p("s.hwz"),
        "--encoding",
        "lattice",
        "--bps",
        "4",
        "--shard-size",
        "20KB",
    ]);
    assert!(ok, "{err}");
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // 6 tensors of ~8 KB at 4 bps, shards of 20 KB: 3 shards of 2, nothing else left over.
    assert_eq!(
        names,
        [
            "m.safetensors",
            "s-00001-of-00003.hwz",
            "s-00002-of-00003.hwz",
            "s-00003-of-00003.hwz",
            "s.hwz.index.json"
        ]
    );
    let (ok, out, err) = run(&["inspect", &p("s.hwz.index.json"), "--json"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tensors"].as_array().unwrap().len(), 6);
    assert!(v["totals"]["lossy"]["snr_db"].as_f64().unwrap() > 20.0);
    // The same values as the single-file archive of the same run.
    let (ok, _, err) = run(&[
        "compress",
        &model,
        &p("one.hwz"),
        "--encoding",
        "lattice",
        "--bps",
        "4",
    ]);
    assert!(ok, "{err}");
    for (input, out) in [
        ("s.hwz.index.json", "a.safetensors"),
        ("one.hwz", "b.safetensors"),
    ] {
        let (ok, _, err) = run(&["decompress", &p(input), &p(out)]);
        assert!(ok, "{err}");
    }
    assert_eq!(
        std::fs::read(p("a.safetensors")).unwrap(),
        std::fs::read(p("b.safetensors")).unwrap()
    );
    // A shard missing from the folder: a typed error, not a partial model.
    std::fs::remove_file(p("s-00002-of-00003.hwz")).unwrap();
    let (ok, _, err) = run(&["inspect", &p("s.hwz.index.json")]);
    assert!(!ok && err.contains("s-00002-of-00003.hwz"), "{err}");
    // A failing run (a bad rate for the lattice) leaves no shard and no index behind.
    let (ok, _, _) = run(&[
        "compress",
        &model,
        &p("bad.hwz"),
        "--encoding",
        "lattice",
        "--bps",
        "0.01",
        "--shard-size",
        "20KB",
    ]);
    assert!(!ok);
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("bad") || n.starts_with(".bad") || n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let (ok, _, err) = run(&["compress", &model, &p("z.hwz"), "--shard-size", "lots"]);
    assert!(!ok && err.contains("--shard-size"), "{err}");
}
