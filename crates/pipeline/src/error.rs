//! The one error type of the pipeline.

use hypercodec_hwz::HwzError;
use std::path::PathBuf;

/// Everything a pipeline call reports. Front ends map it to an exit code or an exception.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The archive layer failed.
    #[error(transparent)]
    Hwz(#[from] HwzError),
    /// An archive on disk is not one, or is damaged: the archive layer's error, with the file.
    #[error("{path}: {source}")]
    Archive {
        /// The file.
        path: PathBuf,
        /// What the archive layer found.
        source: HwzError,
    },
    /// The runtime (compressed operators) failed.
    #[cfg(feature = "fs")]
    #[error(transparent)]
    Runtime(#[from] hypercodec_runtime::RuntimeError),
    /// The planner failed.
    #[cfg(feature = "fs")]
    #[error(transparent)]
    Plan(#[from] hypercodec_plan::PlanError),
    /// A safetensors file is malformed.
    #[error("safetensors: {message}")]
    SafeTensors {
        /// What is wrong.
        message: String,
    },
    /// A GGUF file is malformed.
    #[error("gguf: {message}")]
    Gguf {
        /// What is wrong.
        message: String,
    },
    /// A tensor's storage type cannot be read.
    #[error("tensor `{tensor}` has type {dtype}, which hypercodec cannot read")]
    UnsupportedDtype {
        /// Tensor name.
        tensor: String,
        /// Its type.
        dtype: String,
    },
    /// A synthetic input spec does not parse or is too large.
    #[error("bad synthetic spec `{spec}`: {reason}")]
    Synthetic {
        /// The spec as given.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// A synthetic tensor has more values than the stated cap (or a count that overflows).
    #[error(
        "synthetic tensor {shape:?} has {} values, above the cap of {cap} values ({} GiB of f32); use a smaller shape",
        values.map_or("too many".to_string(), |v| v.to_string()),
        (cap * 4) >> 30
    )]
    SyntheticTooLarge {
        /// The shape asked for.
        shape: Vec<u64>,
        /// Its values, `None` when the count overflows 64 bits.
        values: Option<u64>,
        /// The cap (`MAX_SYNTHETIC_VALUES` of the `fs` feature).
        cap: u64,
    },
    /// The input is neither a safetensors nor a GGUF file (nor an archive).
    #[error("{path}: not a safetensors or GGUF file (the first bytes match neither format)")]
    UnknownFormat {
        /// The input.
        path: PathBuf,
    },
    /// The input is a PyTorch checkpoint, which only the Python wheel reads (through torch).
    #[error(
        "{path}: a PyTorch checkpoint; the command line reads safetensors and GGUF files: \
         `python -m hypercodec compress` reads it through torch (weights only), or save it \
         with safetensors' save_file"
    )]
    TorchCheckpoint {
        /// The input.
        path: PathBuf,
    },
    /// The input is already a `.hwz` archive.
    #[error("{path} is already a .hwz archive")]
    AlreadyArchive {
        /// The input.
        path: PathBuf,
    },
    /// A plan file does not name a tensor of the input.
    #[error("tensor `{tensor}` is not in the plan")]
    NotInPlan {
        /// Tensor name.
        tensor: String,
    },
    /// A file (plan, sensitivity weights, peer output) is not the JSON expected.
    #[error("{what}: {message}")]
    Json {
        /// What was read.
        what: String,
        /// What is wrong.
        message: String,
    },
    /// An option's value is out of range, or options do not fit together.
    #[error("{option}: {message}")]
    InvalidOption {
        /// The option (or options) concerned.
        option: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A tensor's shape does not describe its stored bytes (a source's shape changed after
    /// it was read, or a count past the address space).
    #[error("tensor `{tensor}` of shape {shape:?}: {message}")]
    Shape {
        /// Tensor name.
        tensor: String,
        /// The shape given.
        shape: Vec<u64>,
        /// What is wrong.
        message: String,
    },
    /// Nothing of the input is left to work on.
    #[error("{message}")]
    NoTensors {
        /// Why.
        message: String,
    },
    /// A producer of tensor bytes gave the wrong number of bytes.
    #[error("tensor `{tensor}` produced {produced} bytes, expected {expected}")]
    TensorSize {
        /// Tensor name.
        tensor: String,
        /// Bytes produced.
        produced: u64,
        /// Bytes the shape and type call for.
        expected: u64,
    },
    /// A sharded model's index or parts do not fit together.
    #[error("sharded model: {message}")]
    Shards {
        /// What is wrong.
        message: String,
    },
    /// A model-wide rate below what the cheapest choice of every tensor needs.
    #[error("{target_bps:.4} bits per value cannot be reached: the smallest reachable average is {min_bps:.6} bits per value")]
    RateUnreachable {
        /// The target, bits per value all-in.
        target_bps: f64,
        /// The smallest average the tensors' cheapest choices reach.
        min_bps: f64,
    },
    /// A tensor name cannot be written to a safetensors file: empty, used twice, or the
    /// header's reserved key `__metadata__`. Nothing was written.
    #[error("cannot write tensor `{name}` to safetensors: the name is {reason}; rename it at the source")]
    OutputName {
        /// The name (cut to 64 characters).
        name: String,
        /// Why it cannot be written.
        reason: &'static str,
    },
    /// The output path names an input (under any name): writing would destroy it.
    #[error("{path}: the output is an input of this command; choose another output path")]
    OutputIsInput {
        /// The output path.
        path: PathBuf,
    },
    /// Something other than a regular file exists at the output path (a character device, a
    /// FIFO, a folder); it would be replaced by a regular file.
    #[error("{path} is {kind}, not a regular file; choose another output path")]
    OutputNotAFile {
        /// The output path.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
    },
    /// An input path names something other than a regular file (a FIFO would block the open
    /// for ever; a device or a folder is no model).
    #[error("{path} is {kind}, not a regular file to read")]
    InputNotAFile {
        /// The input path.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
    },
    /// A JSON input (a plan, sensitivity weights, a shard index) larger than any this program
    /// writes: refused before it is read whole.
    #[error("{path}: {bytes} bytes is more than a {what} holds (at most {max})")]
    InputTooLarge {
        /// The input path.
        path: PathBuf,
        /// What it should be.
        what: &'static str,
        /// Its size.
        bytes: u64,
        /// The most accepted.
        max: u64,
    },
    /// The caller's cancel flag was set; no archive was left under the final name.
    #[error("cancelled")]
    Cancelled,
}

impl PipelineError {
    /// Wraps an I/O error with the file it concerns.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> PipelineError {
        let path = path.into();
        move |source| PipelineError::Io { path, source }
    }

    /// An [`PipelineError::InvalidOption`].
    pub fn option(option: impl Into<String>, message: impl Into<String>) -> PipelineError {
        PipelineError::InvalidOption {
            option: option.into(),
            message: message.into(),
        }
    }
}

/// Result alias of the pipeline.
pub type Result<T, E = PipelineError> = std::result::Result<T, E>;
