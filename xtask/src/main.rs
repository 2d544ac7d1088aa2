//! `cargo xtask`: project automation for hypercodec, with no dependencies beyond std.
//!
//! - `ci` — everything `.ci/run` checks: fmt, clippy, tests (default and pure-Rust features),
//!   docs, the wasm32 build of the pure crates, the fuzz targets' build, and the memory check.
//! - `wasm-check` — builds the leaf codecs and hwz for `wasm32-unknown-unknown`.
//! - `fuzz-build` — builds the fuzz targets on stable (running them needs nightly `cargo fuzz`).
//! - `rss` — compresses a synthetic 100 M-parameter f32 model and checks peak memory.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// The crates that must build for wasm32 (pure: slices in, `Result` out, no I/O).
const WASM_CRATES: &[&str] = &[
    "hypercodec-rice",
    "hypercodec-lattice",
    "hypercodec-hdc",
    "hypercodec-scalar",
    "hypercodec-hwz",
];

/// Peak resident memory allowed while compressing a 100 M-parameter f32 model (issue 2).
const RSS_LIMIT_BYTES: u64 = 1_500_000_000;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn run(what: &str, cmd: &mut Command) -> Result<(), String> {
    println!("==> {what}");
    let start = Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    println!(
        "<== {what}: {} in {:.1} s",
        if status.success() { "ok" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

fn wasm_check() -> Result<(), String> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    let has = installed
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("wasm32-unknown-unknown"))
        .unwrap_or(false);
    if !has {
        run(
            "rustup target add wasm32-unknown-unknown",
            Command::new("rustup").args(["target", "add", "wasm32-unknown-unknown"]),
        )?;
    }
    let mut c = cargo();
    c.args([
        "build",
        "--target",
        "wasm32-unknown-unknown",
        "--no-default-features",
    ]);
    for k in WASM_CRATES {
        c.args(["-p", k]);
    }
    run("wasm32 build of the pure crates", &mut c)
}

fn fuzz_build() -> Result<(), String> {
    run(
        "fuzz targets build",
        cargo().args(["build", "--manifest-path", "fuzz/Cargo.toml"]),
    )
}

fn rss() -> Result<(), String> {
    run(
        "release build",
        cargo().args(["build", "--release", "-p", "hypercodec"]),
    )?;
    let bin = root().join("target/release/hypercodec");
    let dir = root().join("target/rss");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let model = dir.join("model-100m.safetensors");
    // 25 × 2048 × 2048 = 104 857 600 parameters, 419 MB of f32.
    if !model.exists() {
        run(
            "synthetic 100 M-parameter model",
            Command::new(&bin).args(["synth"]).arg(&model).args([
                "--shape",
                "2048x2048",
                "--tensors",
                "25",
            ]),
        )?;
    }
    println!("| step | encoding | peak RSS MB | limit MB | seconds |\n|---|---|---:|---:|---:|");
    let mut worst = 0;
    for (step, args) in [
        ("compress", vec!["compress", "--encoding", "affine"]),
        ("compress", vec!["compress", "--encoding", "raw-bf16"]),
        ("decompress", vec!["decompress"]),
        ("inspect", vec!["inspect"]),
    ] {
        let hwz = dir.join("model.hwz");
        let mut c = Command::new(&bin);
        c.arg(args[0]).env("HYPERCODEC_REPORT_RSS", "1");
        match step {
            "compress" => c.arg(&model).arg(&hwz).args(&args[1..]),
            "decompress" => c.arg(&hwz).arg(dir.join("back.safetensors")),
            _ => c.arg(&hwz),
        };
        let start = Instant::now();
        let out = c
            .output()
            .map_err(|e| format!("/usr/bin/time: {e} (install the `time` package)"))?;
        if !out.status.success() {
            return Err(format!(
                "{step} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&out.stderr);
        let bytes: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("peak_rss_bytes:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or("the binary reported no peak RSS (needs Linux /proc)")?;
        worst = worst.max(bytes);
        let kb = bytes / 1024;
        let enc = args.get(2).copied().unwrap_or("-");
        println!(
            "| {step} | {enc} | {:.0} | {:.0} | {:.1} |",
            kb as f64 / 1024.0,
            RSS_LIMIT_BYTES as f64 / 1e6,
            start.elapsed().as_secs_f64()
        );
    }
    let _ = std::fs::remove_file(dir.join("back.safetensors"));
    if worst > RSS_LIMIT_BYTES {
        return Err(format!("peak RSS {worst} B exceeds {RSS_LIMIT_BYTES} B"));
    }
    Ok(())
}

fn ci() -> Result<(), String> {
    run(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--", "--check"]),
    )?;
    run(
        "cargo clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    run("cargo test", cargo().args(["test", "--workspace"]))?;
    run(
        "cargo test hwz without native zstd and file I/O",
        cargo().args([
            "test",
            "-p",
            "hypercodec-hwz",
            "--no-default-features",
            "--lib",
        ]),
    )?;
    run(
        "cargo doc",
        cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    wasm_check()?;
    fuzz_build()?;
    rss()
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    let result = match task.as_str() {
        "ci" => ci(),
        "wasm-check" => wasm_check(),
        "fuzz-build" => fuzz_build(),
        "rss" => rss(),
        _ => {
            eprintln!("usage: cargo xtask <ci | wasm-check | fuzz-build | rss>");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {task}: {e}");
            ExitCode::FAILURE
        }
    }
}
