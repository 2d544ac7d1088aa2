//! Any bytes given as a file to the input readers (safetensors, GGUF): open the file as
//! `TensorSource::open` does, memory-mapped, and read every tensor small enough. The property:
//! a typed error or a result, never a panic, and no allocation beyond what the input justifies
//! (run with `-rss_limit_mb`/`-malloc_limit_mb` to catch allocation bombs).
#![no_main]

use hypercodec_pipeline::TensorSource;
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Most values read per input, over all its tensors (4 MiB of `f32`): a valid header may
/// declare a huge shape whose read would be a legitimate allocation, not a bug.
const MAX_VALUES_READ: u64 = 1 << 20;

/// One file per fuzzing process, rewritten for every input.
fn input_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("fuzz_source_corrupt.{}.bin", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let path = input_path();
    if std::fs::write(path, data).is_err() {
        return;
    }
    let Some(spec) = path.to_str() else { return };
    if let Ok(source) = TensorSource::open(spec) {
        let mut budget = MAX_VALUES_READ;
        for (i, t) in source.tensors.iter().enumerate() {
            let Some(n) = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)) else {
                continue;
            };
            if n <= budget {
                budget -= n;
                let _ = source.read(i);
            }
        }
    }
});
