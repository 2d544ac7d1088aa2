//! The one error type of the command line.

use hypercodec_hwz::HwzError;
use std::path::PathBuf;

/// Everything the command line reports.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
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
    /// The planner failed.
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
    /// The input is neither safetensors, GGUF, .hwz nor a synthetic spec.
    #[error("{0}")]
    Input(String),
    /// The arguments do not fit together.
    #[error("{0}")]
    Usage(String),
}

impl CliError {
    /// Wraps an I/O error with the file it concerns.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CliError {
        let path = path.into();
        move |source| CliError::Io { path, source }
    }
}

/// Result alias of the command line.
pub type Result<T, E = CliError> = std::result::Result<T, E>;
