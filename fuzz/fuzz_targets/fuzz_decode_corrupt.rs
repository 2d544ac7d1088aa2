//! Any bytes given to the reader: open, list and decode every tensor. The property: a typed
//! error or a result, never a panic, and no allocation beyond what the input justifies
//! (run with `-rss_limit_mb`/`-malloc_limit_mb` to catch allocation bombs).
#![no_main]

use hypercodec_hwz::Archive;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(archive) = Archive::open(data) {
        for t in archive.tensors() {
            let _ = archive.decode_tensor(&t.name);
        }
    }
});
