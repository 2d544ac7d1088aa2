//! Stream compression with zstd: the C library with the `native-zstd` feature, the pure-Rust
//! `ruzstd` otherwise (wasm32). Both read and write standard zstd frames.

/// The zstd level writers use (zstd's own default).
pub const LEVEL: i32 = 3;

/// Compresses `raw` into one zstd frame.
pub fn compress(raw: &[u8]) -> Vec<u8> {
    #[cfg(feature = "native-zstd")]
    {
        // Compressing from memory into memory cannot fail but for allocation; fall back to
        // the pure-Rust encoder rather than panic.
        if let Ok(z) = zstd::bulk::compress(raw, LEVEL) {
            return z;
        }
    }
    ruzstd::encoding::compress_to_vec(raw, ruzstd::encoding::CompressionLevel::Fastest)
}

/// Decompresses one frame that must yield exactly `raw_len` bytes; `raw_len` must already be
/// justified by the caller (it is allocated up front).
pub fn decompress(stored: &[u8], raw_len: u64) -> Result<Vec<u8>, String> {
    let out = decompress_inner(stored, raw_len)?;
    if out.len() as u64 != raw_len {
        return Err(format!(
            "decoded {} bytes, the manifest says {raw_len}",
            out.len()
        ));
    }
    Ok(out)
}

#[cfg(feature = "native-zstd")]
fn decompress_inner(stored: &[u8], raw_len: u64) -> Result<Vec<u8>, String> {
    let cap = usize::try_from(raw_len).map_err(|_| "decoded length overflows".to_string())?;
    zstd::bulk::decompress(stored, cap).map_err(|e| e.to_string())
}

#[cfg(not(feature = "native-zstd"))]
fn decompress_inner(stored: &[u8], raw_len: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut decoder = ruzstd::decoding::StreamingDecoder::new(stored).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(raw_len as usize);
    (&mut decoder)
        .take(raw_len + 1)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}
