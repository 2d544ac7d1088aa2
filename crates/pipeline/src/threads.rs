//! The workspace's one thread pool: rayon's global pool, sized once by the front end.
//!
//! Every crate below (hwz, hdc-codebook, ht-plan) runs its parallel work on that pool and
//! spawns no threads of its own, so `--threads N` (or `HYPERCODEC_THREADS=N`) bounds the
//! worker threads of every step.

use crate::{PipelineError, Result};

/// The environment variable read when no explicit thread count is given.
pub const THREADS_ENV: &str = "HYPERCODEC_THREADS";

/// Sizes the pool: `threads` when given, else `$HYPERCODEC_THREADS`, else one thread per core.
/// Call it before any work. Returns the pool's size; asking for a size other than that of a
/// pool already running is an error, and so is 0 or a value that is not a number.
pub fn init_threads(threads: Option<usize>) -> Result<usize> {
    let wanted = match threads {
        Some(n) => Some(n),
        None => match std::env::var(THREADS_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                Some(
                    v.trim()
                        .parse::<usize>()
                        .map_err(|_| PipelineError::InvalidOption {
                            option: THREADS_ENV.into(),
                            message: format!("`{v}` is not a thread count"),
                        })?,
                )
            }
            _ => None,
        },
    };
    if wanted == Some(0) {
        return Err(PipelineError::InvalidOption {
            option: "--threads".into(),
            message: "must be at least 1".into(),
        });
    }
    let mut builder = rayon::ThreadPoolBuilder::new();
    if let Some(n) = wanted {
        builder = builder.num_threads(n);
    }
    // An error here means the pool already runs (its size cannot change any more).
    let _ = builder.build_global();
    let actual = rayon::current_num_threads();
    match wanted {
        Some(n) if n != actual => Err(PipelineError::InvalidOption {
            option: "--threads".into(),
            message: format!("the thread pool already runs with {actual} threads"),
        }),
        _ => Ok(actual),
    }
}
