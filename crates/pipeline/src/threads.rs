//! The workspace's one thread pool: rayon's global pool, sized once by the front end.
//!
//! Every crate below (hwz, hdc-codebook, ht-plan) runs its parallel work on that pool and
//! spawns no threads of its own, so `--threads N` (or `HYPERCODEC_THREADS=N`) bounds the
//! worker threads of every step.

use crate::{PipelineError, Result};

/// The environment variable read when no explicit thread count is given.
pub const THREADS_ENV: &str = "HYPERCODEC_THREADS";

/// The most worker threads the pool is sized to (`--threads 100000` started 17 000 threads
/// before the system ran out of processes).
pub const MAX_THREADS: usize = 1024;

/// Sizes the pool: `threads` when given, else `$HYPERCODEC_THREADS`, else one thread per core.
/// Call it before any work. Returns the pool's size; asking for a size other than that of a
/// pool already running is an error, and so is 0, more than [`MAX_THREADS`], a value that is
/// not a number, or a pool the system cannot start (a process limit).
pub fn init_threads(threads: Option<usize>) -> Result<usize> {
    let option = if threads.is_some() {
        "--threads"
    } else {
        THREADS_ENV
    };
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
    if let Some(n) = wanted.filter(|n| !(1..=MAX_THREADS).contains(n)) {
        return Err(PipelineError::InvalidOption {
            option: option.into(),
            message: format!("{n} threads: must be from 1 to {MAX_THREADS}"),
        });
    }
    let mut builder = rayon::ThreadPoolBuilder::new();
    if let Some(n) = wanted {
        builder = builder.num_threads(n);
    }
    if let Err(e) = builder.build_global() {
        // The pool already runs (its size cannot change any more; checked below), or the
        // system refused its threads: then asking rayon for its size would panic.
        if !e.to_string().contains("already") {
            return Err(PipelineError::InvalidOption {
                option: option.into(),
                message: format!("cannot start the thread pool: {e}"),
            });
        }
    }
    let actual = rayon::current_num_threads();
    match wanted {
        Some(n) if n != actual => Err(PipelineError::InvalidOption {
            option: option.into(),
            message: format!("the thread pool already runs with {actual} threads"),
        }),
        _ => Ok(actual),
    }
}
