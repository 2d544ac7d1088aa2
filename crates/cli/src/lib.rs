//! `hypercodec`: compress, decompress, inspect and benchmark neural-network weights.
//!
//! A thin front end over `hypercodec-pipeline`: it parses arguments into the pipeline's
//! option structs, draws a progress bar on the pipeline's progress callback, prints, and
//! maps every error to exit code 1 (2 for arguments clap rejects, 128 + the signal's number for
//! a run a signal cancelled: 130 for Ctrl-C). The binary is
//! [`main_with_args`] over the process's arguments; the Python wheel's `python -m hypercodec`
//! calls the same function, so both front ends are one command line.

mod args;
mod exec;
mod print;
mod sink;

pub use sink::Captured;

use args::{CodebookArgs, DtypeArg, EncodingArgs, EncodingKind, PlanArgs};
use clap::{Args, Parser, Subcommand};
use hypercodec_hwz as hwz;
use hypercodec_pipeline::{
    self as pipeline, Cancel, Chooser, CompressOptions, PipelineError, Progress, Result, Route,
    Selection, TensorSource,
};
use hypercodec_plan::Mode;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "hypercodec",
    version,
    about = "Compress neural-network weights into .hwz archives, inspect and benchmark them"
)]
struct Cli {
    /// Worker threads of every step (one pool for the whole run). By default, $HYPERCODEC_THREADS,
    /// else one per core.
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compress a .safetensors (f32/f16/bf16) or .gguf file into a .hwz archive.
    Compress(Box<CompressArgs>),
    /// Restore a .hwz archive to a .safetensors file.
    Decompress {
        /// The .hwz archive.
        input: PathBuf,
        /// The .safetensors file to write.
        output: PathBuf,
        /// Type of the restored tensors. By default, each tensor's source type (f32 for GGUF block types).
        #[arg(long, value_enum)]
        dtype: Option<DtypeArg>,
    },
    /// List the tensors of a .hwz archive: shapes, encodings, bits per scalar, bytes per stream role.
    Inspect {
        /// The .hwz archive.
        input: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measure every candidate on every tensor and choose by a planner mode; print the Plan as JSON
    /// (feed it to `compress --plan`).
    Plan {
        /// Input: .safetensors, .gguf, a sharded model (`*.safetensors.index.json`, its folder, or
        /// any part of a split `NAME-0000K-of-0000N.gguf`), or `gaussian:ROWSxCOLS[:SEED]`.
        input: String,
        #[command(flatten)]
        planning: PlanArgs,
        #[command(flatten)]
        codebook: CodebookArgs,
        /// Seed of codebook training.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Plan 1-D tensors (biases, norms) too.
        #[arg(long, visible_alias = "compress-bias")]
        include_1d: bool,
        /// Tensors with fewer values are left out of the plan.
        #[arg(long, default_value_t = 0)]
        min_tensor_size: u64,
        /// Count candidates' bytes without the container's zstd: for a plan replayed by
        /// `compress --plan FILE --no-zstd`.
        #[arg(long)]
        no_zstd: bool,
    },
    /// Measure every representation (FP32, FP16, BF16, affine INT1..INT8 per row and g128) on a
    /// file's tensors: bytes, bits per scalar, error, gap to the Gaussian bound, speed.
    Benchmark(print::BenchArgs),
    /// Run an archive's weight matrices as compressed linear layers (chained where the widths
    /// chain) and time a pass against the same layers with dense f32 weights.
    Run(exec::RunArgs),
    /// Write a seeded i.i.d. Gaussian .safetensors file (test and demo data).
    Synth {
        /// The .safetensors file to write.
        output: PathBuf,
        /// Shape of each tensor, e.g. 4096x4096.
        #[arg(long, default_value = "4096x4096")]
        shape: String,
        /// Number of tensors (`layers.N.weight`).
        #[arg(long, default_value_t = 1)]
        tensors: usize,
        /// Seed; tensor i uses seed + i.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Instead of Gaussian tensors, a whole model's shapes: `cnn` (MobileNetV2, 3.5 M
        /// parameters: depthwise, pointwise and stem convolutions, batch norms, a classifier)
        /// into OUTPUT; `llm7b` (Mistral-7B's shapes, 7.24 G parameters, bf16) into the folder
        /// OUTPUT as 2 GB safetensors shards plus model.safetensors.index.json.
        #[arg(long, value_parser = ["cnn", "llm7b"], conflicts_with_all = ["shape", "tensors"])]
        model: Option<String>,
        /// `llm7b`: decoder layers (32 is the real model's).
        #[arg(long, default_value_t = 32)]
        layers: usize,
    },
    /// The built-in default job: a seeded Gaussian 4096x4096 tensor, compressed, inspected and benchmarked.
    Demo {
        /// Folder for the demo's files.
        #[arg(long, default_value = "target/demo")]
        dir: PathBuf,
        /// Shape of the demo tensor.
        #[arg(long, default_value = "4096x4096")]
        shape: String,
    },
}

#[derive(Args)]
struct CompressArgs {
    /// Input: .safetensors, .gguf, a sharded model (`*.safetensors.index.json`, its folder, or
    /// any part of a split `NAME-0000K-of-0000N.gguf`), or `gaussian:ROWSxCOLS[:SEED]`.
    input: String,
    /// The .hwz archive to write.
    output: PathBuf,
    #[command(flatten)]
    encoding: EncodingArgs,
    #[command(flatten)]
    planning: PlanArgs,
    /// Encode with the recipes of a plan written by `hypercodec plan` (stored in the archive).
    #[arg(long, conflicts_with = "mode")]
    plan: Option<PathBuf>,
    /// Encode 1-D tensors (biases, norms) too; by default they are kept raw in their source type.
    #[arg(long, visible_alias = "compress-bias")]
    include_1d: bool,
    /// Tensors with fewer values are kept raw in their source type.
    #[arg(long, default_value_t = 0)]
    min_tensor_size: u64,
    /// Store NaN/Inf found in raw-encoded tensors instead of failing.
    #[arg(long)]
    allow_non_finite: bool,
    /// Entropy-coded lattice (also a planner's lattice candidates): `row` scales each row by
    /// its own RMS (every row the same SNR); `tensor` takes one step for every row (the
    /// least total squared error — measured: higher perplexity on a language model).
    #[arg(long, value_enum, default_value = "row")]
    lattice_scale: args::LatticeScaleArg,
    /// Input statistics per linear layer (a safetensors file of `E[x·xᵀ]`, `in × in`, named by
    /// layer; Python: `hypercodec.nn.save_hessians`): affine, lattice and trellis recipes
    /// round with error feedback (GPTQ's rule) where the file has a tensor's. The format is
    /// unchanged.
    #[arg(long)]
    calibration: Option<std::path::PathBuf>,
    /// Do not try zstd on each stream.
    #[arg(long)]
    no_zstd: bool,
    /// Write shards of about this size (e.g. 2GB): OUTPUT `m.hwz` becomes `m-0000K-of-0000N.hwz`
    /// and `m.hwz.index.json` (the safetensors convention); `inspect` and `decompress` open the
    /// index as one model.
    #[arg(long)]
    shard_size: Option<String>,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
    /// Code trellis tensors on this GPU (`cuda` or `cuda:N`): the same bits as the CPU, tens
    /// of times faster (error-feedback rounding stays on the CPU). Needs a CUDA driver at run
    /// time; without one the command fails.
    #[arg(long)]
    device: Option<String>,
    /// The options given on the command line (clap's ids), not defaulted: those no route of
    /// this run reads are refused ([`unused_options`]).
    #[arg(skip)]
    given: Vec<String>,
}

/// The options of `args` given on the command line that this run would not read, each with
/// what does read it: an encoding's options beside a planner mode or a plan (which choose each
/// tensor's encoding) or beside another encoding (`--bits 3 --encoding lattice` kept the
/// lattice's 4 bits, silently), and the planner's own options without a mode.
fn unused_options(args: &CompressArgs, mode: Option<Mode>) -> Option<(String, &'static str)> {
    use EncodingKind as K;
    let kind = args.encoding.kind();
    let fixed = mode.is_none() && args.plan.is_none();
    let encoding = |kinds: &[K]| fixed && kinds.contains(&kind);
    let reads = |id: &str| -> Option<(bool, &'static str)> {
        Some(match id {
            "bits" => (
                encoding(&[K::Affine, K::Trellis]),
                "--encoding affine and trellis",
            ),
            "group" | "symmetric" => (encoding(&[K::Affine]), "--encoding affine"),
            "trellis_l" | "trellis_pairs" => (encoding(&[K::Trellis]), "--encoding trellis"),
            "lattice" | "coding" | "chunk" => (encoding(&[K::Lattice]), "--encoding lattice"),
            "max_tile" => (
                encoding(&[K::Lattice, K::Trellis]),
                "--encoding lattice and trellis",
            ),
            "scale_dtype" => (
                encoding(&[K::Affine, K::Lattice, K::Trellis]),
                "--encoding affine, lattice and trellis",
            ),
            // (A plan's recipes are read as stored: no option of the planner's applies.)
            "candidates" | "min_snr_db" | "eps_fp16" | "eps_bf16" | "prefer_bf16"
            | "block_rows" => (
                mode.is_some() && args.plan.is_none(),
                "a planner mode (--mode)",
            ),
            "sensitivity" | "target_scope" => (
                mode == Some(Mode::Budget) && args.plan.is_none(),
                "--mode budget",
            ),
            _ => return None,
        })
    };
    args.given.iter().find_map(|id| match reads(id) {
        Some((false, by)) => Some((format!("--{}", id.replace('_', "-")), by)),
        _ => None,
    })
}

/// `args` (the first is the program name) parsed, each `compress` command knowing which of its
/// options were given ([`CompressArgs::given`]).
fn parse_cli<I, T>(args: I) -> std::result::Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().try_get_matches_from(args)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let (Command::Compress(c), Some(("compress", sub))) =
        (&mut cli.command, matches.subcommand())
    {
        c.given = sub
            .ids()
            .filter(|id| {
                sub.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
            })
            .map(|id| id.as_str().to_string())
            .collect();
    }
    Ok(cli)
}

/// The GPU [`trellis_rows_on_gpu`] codes on: the last `--device` of the process (one compress
/// at a time).
static GPU: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A [`hwz::TrellisRowsEncoder`] function on the GPU of `--device`.
fn trellis_rows_on_gpu(
    values: &[f32],
    rows: usize,
    cols: usize,
    seq: usize,
    p: &hypercodec_trellis::TrellisParams,
    bits: &mut [u8],
) -> std::result::Result<(), String> {
    let ordinal = GPU.load(std::sync::atomic::Ordering::Relaxed);
    hypercodec_kernels_cuda::Kernels::shared(ordinal)
        .and_then(|k| {
            k.trellis_encode_host(values, rows, cols, seq, (p.l, p.k, p.v), p.affine(), bits)
        })
        .map_err(|e| e.to_string())
}

/// The trellis encoder of `--device` (`cuda` or `cuda:N`), its kernels loaded.
fn device_encoder(device: Option<&str>) -> Result<Option<hwz::TrellisRowsEncoder>> {
    let Some(d) = device else {
        return Ok(None);
    };
    let ordinal = match d.strip_prefix("cuda") {
        Some("") => 0,
        Some(n) => n
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| PipelineError::option("--device", "is `cuda` or `cuda:N`"))?,
        None => return Err(PipelineError::option("--device", "is `cuda` or `cuda:N`")),
    };
    hypercodec_kernels_cuda::Kernels::shared(ordinal)
        .map_err(|e| PipelineError::option("--device", e.to_string()))?;
    GPU.store(ordinal, std::sync::atomic::Ordering::Relaxed);
    Ok(Some(hwz::TrellisRowsEncoder(trellis_rows_on_gpu)))
}

/// The process's cancel flag, set by a signal ([`install_signal_handler`]).
static CANCEL: std::sync::LazyLock<std::sync::Arc<Cancel>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(Cancel::new()));

thread_local! {
    /// The cancel flag of the run on this thread where its caller gave one
    /// ([`run_args_cancellable`]).
    static RUN_CANCEL: std::cell::RefCell<Option<std::sync::Arc<Cancel>>> =
        const { std::cell::RefCell::new(None) };
}

/// The flag a run stops on: its caller's, else the process's.
fn cancel_flag() -> std::sync::Arc<Cancel> {
    RUN_CANCEL
        .with(|c| c.borrow().clone())
        .unwrap_or_else(|| CANCEL.clone())
}

/// Runs `f` (a run of the command line) with `cancel` as its cancel flag on this thread; the
/// previous one comes back after, a panic included.
fn with_run_cancel<T>(cancel: std::sync::Arc<Cancel>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<std::sync::Arc<Cancel>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0.take();
            RUN_CANCEL.with(|c| *c.borrow_mut() = old);
        }
    }
    let _restore = Restore(RUN_CANCEL.with(|c| c.borrow_mut().replace(cancel)));
    f()
}

/// A progress bar on a terminal that follows the pipeline's progress reports, one bar per phase.
#[derive(Default)]
pub struct Bar {
    current: Option<(pipeline::Phase, ProgressBar)>,
}

impl Bar {
    /// Advances (or starts) the bar of `p`'s phase.
    pub fn update(&mut self, p: Progress<'_>) {
        if !std::io::stdout().is_terminal() {
            return;
        }
        if self.current.as_ref().is_none_or(|(ph, _)| *ph != p.phase) {
            self.finish();
            let bar = ProgressBar::new(p.total);
            let style = ProgressStyle::with_template(
                "{msg} [{bar:40}] {percent}% {elapsed_precise} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_message(p.phase.name());
            self.current = Some((p.phase, bar));
        }
        if let Some((_, bar)) = &self.current {
            bar.set_position(p.done);
        }
    }

    /// Clears the bar.
    pub fn finish(&mut self) {
        if let Some((_, bar)) = self.current.take() {
            bar.finish_and_clear();
        }
    }
}

/// Runs `f` with a progress callback drawing a bar, and clears the bar after.
pub fn with_bar<T>(f: impl FnOnce(&mut dyn FnMut(Progress<'_>)) -> Result<T>) -> Result<T> {
    let mut bar = Bar::default();
    let r = f(&mut |p| bar.update(p));
    bar.finish();
    r
}

fn compress(args: &CompressArgs) -> Result<()> {
    // Reject bad arguments before reading anything.
    let mode = match (args.planning.mode()?, args.encoding.kind()) {
        (Some(m), _) => Some(m),
        (None, EncodingKind::Auto) => Some(Mode::Auto),
        _ => None,
    };
    let target = args.planning.target()?;
    let target_used = matches!(mode, Some(Mode::Auto | Mode::Budget))
        || (mode.is_none() && args.encoding.kind() == EncodingKind::Lattice);
    if target.is_some() && !target_used {
        return Err(PipelineError::option(
            "--target-bps / --target-ratio",
            "apply to --encoding lattice or auto and to --mode budget or auto",
        ));
    }
    // An encoding named beside a planner mode or a plan was dropped without a word (`--encoding
    // trellis --mode lowest` wrote INT4): the mode's candidates or the plan choose.
    if let (Some(e), true) = (
        args.encoding.encoding.filter(|e| *e != EncodingKind::Auto),
        args.planning.mode()?.is_some() || args.plan.is_some(),
    ) {
        let e = clap::ValueEnum::to_possible_value(&e)
            .map_or_else(String::new, |v| v.get_name().to_string());
        return Err(PipelineError::option(
            "--encoding",
            format!(
                "{e} is not used with --mode or --plan: they choose each tensor's encoding \
                 (name candidates with --candidates)"
            ),
        ));
    }
    if args.encoding.bps.is_some()
        && (mode.is_some() || args.plan.is_some() || args.encoding.kind() != EncodingKind::Lattice)
    {
        return Err(PipelineError::option(
            "--bps",
            "sets the rate of --encoding lattice; a planner mode takes --target-bps, affine and \
             trellis take --bits",
        ));
    }
    // (`--encoding affine --snr-db 20` wrote INT4 without a word.)
    if args.encoding.snr_db.is_some()
        && (mode.is_some() || args.plan.is_some() || args.encoding.kind() != EncodingKind::Lattice)
    {
        return Err(PipelineError::option(
            "--snr-db",
            "sets the target SNR of --encoding lattice; a planner mode takes --min-snr-db",
        ));
    }
    if let Some((flag, by)) = unused_options(args, mode) {
        let here = match (args.plan.is_some(), &args.planning.mode) {
            (true, _) => "a plan chooses each tensor's encoding".to_string(),
            (_, Some(m)) => format!("this run plans with --mode {m}"),
            _ if mode.is_some() => "this run plans with --encoding auto".to_string(),
            _ => format!(
                "this run stores --encoding {}",
                clap::ValueEnum::to_possible_value(&args.encoding.kind())
                    .map_or_else(String::new, |v| v.get_name().to_string())
            ),
        };
        return Err(PipelineError::option(
            flag,
            format!("applies to {by}, not here: {here}"),
        ));
    }
    // The files the run reads beside its input must survive it too (`--plan X` with output X
    // replaced the plan with the archive).
    let sensitivity = args.planning.sensitivity.as_deref();
    let read: Vec<&Path> = [args.plan.as_deref(), args.calibration.as_deref()]
        .into_iter()
        .flatten()
        .chain(
            sensitivity
                .filter(|v| !v.trim_start().starts_with('{'))
                .map(Path::new),
        )
        .collect();
    pipeline::check_output(&args.output, read)?;
    let codebook = args.encoding.codebook.options(args.encoding.seed);
    let route = match (&args.plan, mode) {
        (Some(path), _) => Route::PlanFile(pipeline::read_plan(path)?),
        (None, Some(m)) => {
            // (Its candidates' bytes are counted as this run's writer stores them:
            // `compress_to_file` sets the planner's container from --no-zstd.)
            let options = args.planning.options(m, codebook)?;
            Chooser::new(options.clone())?;
            Route::Planner(options)
        }
        (None, None) => Route::Fixed(args.encoding.spec(target)?),
    };
    let options = CompressOptions {
        route,
        selection: Selection {
            include_1d: args.include_1d,
            min_tensor_size: args.min_tensor_size,
        },
        allow_non_finite: args.allow_non_finite,
        lattice_scale: args.lattice_scale.into(),
        trellis_rows: device_encoder(args.device.as_deref())?,
        calibration: match &args.calibration {
            Some(p) => Some(std::sync::Arc::new(hypercodec_pipeline::Calibration::open(
                p,
            )?)),
            None => None,
        },
    };
    let source = TensorSource::open(&args.input)?;
    // Names that match no tensor of the input weigh or calibrate nothing: say so (a file of
    // another model, or `lm_head` for `lm_head.weight`, ran as if none were given).
    let names: Vec<&str> = source.tensors.iter().map(|t| t.name.as_str()).collect();
    let unmatched = |what: &str, v: Vec<&str>| {
        if !v.is_empty() {
            let some: Vec<String> = v.iter().take(3).map(|n| format!("`{n}`")).collect();
            let more = if v.len() > 3 { ", ..." } else { "" };
            sink::errln!(
                "warning: {what} names {} tensors the input does not have ({}{more}): they are not used",
                v.len(),
                some.join(", ")
            );
        }
    };
    if let Route::Planner(p) = &options.route {
        unmatched(
            "--sensitivity",
            pipeline::unmatched_sensitivity(&p.sensitivity, &names),
        );
    }
    if let Some(c) = &options.calibration {
        unmatched("--calibration", c.unmatched(&names));
    }
    for s in &source.skipped {
        // (F64 is a float type this reader does not take; Python's `save` casts it to f32.)
        let why = if s.dtype == "F64" {
            "not read: cast it to f32 to compress it"
        } else {
            "not a float tensor"
        };
        sink::errln!(
            "warning: skipping tensor `{}` of type {} ({why})",
            s.name,
            s.dtype
        );
    }
    let shard_bytes = args
        .shard_size
        .as_deref()
        .map(pipeline::shards::parse_size)
        .transpose()?;
    let report = with_bar(|progress| match shard_bytes {
        Some(bytes) => pipeline::compress_to_shards(
            &source,
            &options,
            &args.output,
            !args.no_zstd,
            bytes,
            progress,
            &cancel_flag(),
        ),
        None => pipeline::compress_to_file(
            &source,
            &options,
            &args.output,
            !args.no_zstd,
            progress,
            &cancel_flag(),
        ),
    })?;
    let written = match shard_bytes {
        Some(_) => pipeline::shards::index_path(&args.output),
        None => args.output.clone(),
    };
    // A target the archive's own bytes (manifest, plan, alignment) leave no room for beside
    // the cheapest choices is met over the tensors' streams alone: say so, all-in it is above.
    let target = match &options.route {
        Route::Planner(p) => p.target,
        _ => None,
    };
    let elements = report.report.elements;
    if let Some(cap) = target.map(|t| t.bytes(elements)).filter(|_| elements > 0) {
        if report.file_bytes > cap {
            let per_value = |bytes: u64| bytes as f64 * 8.0 / elements as f64;
            let (all_in, want) = (per_value(report.file_bytes), per_value(cap));
            sink::errln!(
                "warning: {all_in:.3} bits/value all-in, above the target of {want:.3}: the \
                 archive's own bytes (manifest, plan, alignment) do not fit beside the cheapest \
                 choices at this size, so the target was met over the tensors' streams alone"
            );
        }
    }
    print::compress_summary(&written, &report, args.json)
}

fn plan(
    input: &str,
    planning: &PlanArgs,
    codebook: &CodebookArgs,
    seed: u64,
    selection: Selection,
    no_zstd: bool,
) -> Result<()> {
    let mode = planning.mode()?.unwrap_or(Mode::Best);
    let mut options = planning.options(mode, codebook.options(seed))?;
    if no_zstd {
        options.container = hwz::Compression::None;
    }
    let chooser = Chooser::new(options)?;
    let source = TensorSource::open(input)?;
    let started = std::time::Instant::now();
    let plan = with_bar(|progress| {
        pipeline::plan_source(&source, &chooser, selection, progress, &cancel_flag())
    })?;
    print::plan(&plan, started.elapsed().as_secs_f64())
}

fn demo(dir: &Path, shape: &str) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        // (create_dir_all said only "File exists".)
        return Err(PipelineError::option(
            "--dir",
            format!(
                "{} is a file; the demo writes its files into a folder",
                dir.display()
            ),
        ));
    }
    std::fs::create_dir_all(dir).map_err(PipelineError::io(dir))?;
    let st = dir.join("gaussian.safetensors");
    sink::outln!("== 1. a seeded Gaussian {shape} tensor -> {}", st.display());
    pipeline::write_synthetic(&st, shape, 1, 0)?;
    let input = st.display().to_string();
    for (step, file, extra) in [
        (
            "2. compress with affine INT4, groups of 128, f16 scales",
            "gaussian-int4-g128.hwz",
            vec!["--encoding", "affine"],
        ),
        (
            "3. compress with E8 lattice + rANS at 4.0 bits per value, all-in",
            "gaussian-e8-4bps.hwz",
            vec!["--encoding", "lattice", "--bps", "4"],
        ),
        (
            "4. compress with the measured AUTO choice at ratio 10 (3.2 bits per value): affine, codebook, lattice candidates",
            "gaussian-auto-r10.hwz",
            vec!["--encoding", "auto", "--target-ratio", "10"],
        ),
    ] {
        sink::outln!("== {step}");
        let out = dir.join(file);
        let out_str = out.display().to_string();
        let mut argv = vec!["hypercodec", "compress", input.as_str(), out_str.as_str()];
        argv.extend(extra);
        if let Command::Compress(args) = parse_cli(argv)
            .map_err(|e| PipelineError::option("demo", e.to_string()))?
            .command
        {
            compress(&args)?;
        }
        print::inspect(&out, false)?;
    }
    sink::outln!("== 5. benchmark every representation on the same tensor");
    print::benchmark(&print::BenchArgs::for_input(input.clone()))?;
    sink::outln!(
        "== 6. run the INT4 archive as a compressed linear layer (y = x·Wᵀ from the stored codes) against the original f32 weight"
    );
    exec::run(&exec::RunArgs {
        archive: dir.join("gaussian-int4-g128.hwz"),
        original: Some(input),
        batch: 1,
        filter: None,
        fixed_bits: None,
        json: false,
    })
}

/// The number of the signal that set the cancel flag (0: none).
static SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The exit code of a run a signal (or a cancel flag) stopped: 128 + the signal's number, as a
/// shell reports a process that signal ended (130 for Ctrl-C, 143 for SIGTERM, 129 for
/// SIGHUP); 130 where no signal is known.
fn cancelled_exit_code() -> u8 {
    match SIGNAL.load(std::sync::atomic::Ordering::SeqCst) {
        s @ 1..=127 => (128 + s) as u8,
        _ => 130,
    }
}

/// Ctrl-C, SIGTERM and SIGHUP set the cancel flag: the running step stops at its next tensor
/// and the partial archive or safetensors file (a temporary beside the output) is removed as
/// the writer drops; the run exits with 128 + the signal's number. A second signal removes the
/// temporary files and exits at once (with 128 + its number).
#[cfg(unix)]
pub fn install_signal_handler() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                for sig in signals.forever() {
                    if CANCEL.is_cancelled() {
                        hypercodec_hwz::remove_unfinished();
                        std::process::exit(128 + sig);
                    }
                    SIGNAL.store(sig, std::sync::atomic::Ordering::SeqCst);
                    CANCEL.cancel();
                }
            });
        }
        Err(e) => eprintln!(
            "warning: no signal handler ({e}); an interrupted run may leave a temporary file"
        ),
    }
}

/// Ctrl-C and the console's close events set the cancel flag (as on Unix); a second removes the
/// temporary files and exits at once (exit code 130).
#[cfg(not(unix))]
pub fn install_signal_handler() {
    let result = ctrlc::set_handler(|| {
        if CANCEL.is_cancelled() {
            hypercodec_hwz::remove_unfinished();
            std::process::exit(130);
        }
        CANCEL.cancel();
    });
    if let Err(e) = result {
        eprintln!(
            "warning: no signal handler ({e}); an interrupted run may leave a temporary file"
        );
    }
}

fn run(cli: Cli) -> Result<()> {
    pipeline::init_threads(cli.threads)?;
    match cli.command {
        Command::Compress(args) => compress(&args),
        Command::Decompress {
            input,
            output,
            dtype,
        } => with_bar(|progress| {
            pipeline::decompress(
                &input,
                &output,
                dtype.map(Into::into),
                progress,
                &cancel_flag(),
            )
        }),
        Command::Inspect { input, json } => print::inspect(&input, json),
        Command::Benchmark(args) => print::benchmark(&args),
        Command::Run(args) => exec::run(&args),
        Command::Plan {
            input,
            planning,
            codebook,
            seed,
            include_1d,
            min_tensor_size,
            no_zstd,
        } => plan(
            &input,
            &planning,
            &codebook,
            seed,
            Selection {
                include_1d,
                min_tensor_size,
            },
            no_zstd,
        ),
        Command::Synth {
            output,
            shape,
            tensors,
            seed,
            model,
            layers,
        } => match model.as_deref() {
            Some("llm7b") => {
                pipeline::synth::write_llm(&output, layers, 2_000_000_000, seed).map(|_| ())
            }
            Some(_) => {
                pipeline::synth::write_tensors(&output, &pipeline::synth::cnn_state_dict(seed))
            }
            None => pipeline::write_synthetic(&output, &shape, tensors, seed),
        },
        Command::Demo { dir, shape } => demo(&dir, &shape),
    }
}

/// A failed write to stdout, as the pipeline's I/O error on `<stdout>`.
pub(crate) fn stdout_error(source: std::io::Error) -> PipelineError {
    PipelineError::Io {
        path: "<stdout>".into(),
        source,
    }
}

/// A number from this process's `/proc/self/status` line `key` (Linux), if the platform tells.
fn proc_status(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let v = status.lines().find_map(|l| l.strip_prefix(key))?.trim();
    v.trim_end_matches("kB").trim().parse::<u64>().ok()
}

/// Runs the command line on `args` (the first is the program name) and returns what failed,
/// arguments clap rejects included (as [`PipelineError::InvalidOption`]): for callers that
/// raise errors instead of printing them (the Python wheel). `--help` and `--version` print
/// and succeed.
pub fn run_args<I, T>(args: I) -> Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match parse_cli(args) {
        Ok(cli) => run(cli),
        Err(e) if e.exit_code() == 0 => {
            sink::write_out(format_args!("{}", e.render())).map_err(stdout_error)
        }
        Err(e) => Err(PipelineError::option("arguments", e.render().to_string())),
    }
}

/// [`run_args`] with what the command prints captured instead of written to the process's
/// stdout and stderr: for an embedding caller that writes it through streams of its own (the
/// Python wheel, whose users redirect `sys.stdout` or read it in a notebook). A progress bar
/// still draws on a terminal. Only this thread's text is captured.
pub fn run_args_captured<I, T>(args: I) -> (Result<()>, Captured)
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    sink::capture(|| run_args(args))
}

/// [`run_args_captured`] that stops, before its next tensor, once `cancel` is set (from another
/// thread: an embedding caller's interrupt), with [`PipelineError::Cancelled`], its temporary
/// file removed. Each run has its own flag: cancelling one never touches another.
pub fn run_args_cancellable<I, T>(args: I, cancel: std::sync::Arc<Cancel>) -> (Result<()>, Captured)
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    with_run_cancel(cancel, || run_args_captured(args))
}

/// [`main_with_args`] that stops once `cancel` is set, as [`run_args_cancellable`] does.
pub fn main_with_args_cancellable<I, T>(args: I, cancel: std::sync::Arc<Cancel>) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    with_run_cancel(cancel, || main_with_args(args))
}

/// The input, the output and the input's place among the arguments after `compress` (1: the
/// first after it) where `args` (the first is the program name) parse as a `compress`
/// command, as its parser reads them (an option's value is never taken for a path): for a
/// front end that prepares the input first (the Python wheel stages a PyTorch checkpoint as
/// safetensors and puts its path in the input's place). None for any other command or
/// arguments that do not parse.
pub fn compress_paths<I, T>(args: I) -> Option<(String, PathBuf, usize)>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().try_get_matches_from(args).ok()?;
    let (name, sub) = matches.subcommand()?;
    let at = sub.index_of("input")?;
    match Cli::from_arg_matches(&matches).ok()?.command {
        Command::Compress(c) if name == "compress" => Some((c.input, c.output, at)),
        _ => None,
    }
}

/// Runs the command line on `args` (the first is the program name) and returns the exit
/// code: 0, 1 for an error the pipeline reports, 2 for arguments clap rejects, 128 + the
/// signal's number for a run a signal stopped (130 for Ctrl-C, and for a cancel flag).
pub fn main_with_args<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match parse_cli(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; usage errors to stderr.
            let _ = e.print();
            return e.exit_code().clamp(0, 255) as u8;
        }
    };
    let result = run(cli);
    // Benchmarks (`cargo xtask rss`) read the peak memory of a run from here.
    if std::env::var_os("HYPERCODEC_REPORT_RSS").is_some() {
        if let Some(kb) = proc_status("VmHWM:") {
            eprintln!("peak_rss_bytes: {}", kb * 1024);
        }
        // The main thread plus the pool's workers: no step keeps threads of its own.
        if let Some(t) = proc_status("Threads:") {
            eprintln!("threads: {t}");
        }
    }
    match result {
        Ok(()) => 0,
        // The reader of stdout went away (`hypercodec inspect a.hwz | head`): nothing is
        // wrong with the work, and nobody is left to read more; end quietly, as `cat` does.
        Err(PipelineError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            0
        }
        // Stopped by a signal (the first: the temporary file is gone): 128 + its number, as a
        // shell reports a process that signal ended, so that scripts see the interruption.
        Err(PipelineError::Cancelled) => {
            eprintln!("error: {}", PipelineError::Cancelled);
            cancelled_exit_code()
        }
        // Every error the pipeline reports is exit code 1 (clap's own are 2).
        Err(e) => {
            // Names from the input (tensor names, paths) may hold control characters: escaped,
            // so that a crafted file cannot send escape sequences to the terminal.
            let text: String = e
                .to_string()
                .chars()
                .map(|c| match c {
                    '\n' => c.to_string(),
                    c if c.is_control() => c.escape_default().to_string(),
                    c => c.to_string(),
                })
                .collect();
            eprintln!("error: {text}");
            1
        }
    }
}
