//! Any bytes given to the legacy (Hyper Glyph zip) importer: open, list and decode every
//! tensor. The property: a typed error or a result, never a panic, no allocation bomb.
#![no_main]

use hypercodec_hwz::legacy::LegacyArchive;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(archive) = LegacyArchive::open(data) {
        for t in archive.tensors() {
            let _ = archive.decode_tensor(&t.name);
        }
    }
});
