//! Stream compression with zstd: the C library with the `native-zstd` feature, the pure-Rust
//! `ruzstd` otherwise (wasm32). Both read and write standard zstd frames.

/// The zstd level writers use (zstd's own default).
pub const LEVEL: i32 = 3;

/// The zstd level of a manifest: small, written once and read whole, so worth zstd's strong
/// levels (on a 95 KB manifest of 247 tensors: 11.7 KB at level 3, 9.1 KB at level 19).
pub const MANIFEST_LEVEL: i32 = 19;

/// The level for a manifest or plan of `len` bytes: [`MANIFEST_LEVEL`] up to 1 MiB (a few
/// tens of milliseconds), the streams' [`LEVEL`] above (level 19 would take seconds).
pub fn manifest_level(len: usize) -> i32 {
    if len <= 1 << 20 {
        MANIFEST_LEVEL
    } else {
        LEVEL
    }
}

/// The first four bytes of every zstd frame.
pub const FRAME_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Compresses `raw` into one zstd frame.
pub fn compress(raw: &[u8]) -> Vec<u8> {
    compress_at(raw, LEVEL)
}

/// Compresses `raw` into one zstd frame at `level` (the C library's levels; the pure-Rust
/// encoder has one level only).
pub fn compress_at(raw: &[u8], level: i32) -> Vec<u8> {
    #[cfg(feature = "native-zstd")]
    {
        // Compressing from memory into memory cannot fail but for allocation; fall back to
        // the pure-Rust encoder rather than panic.
        if let Ok(z) = zstd::bulk::compress(raw, level) {
            return z;
        }
    }
    #[cfg(not(feature = "native-zstd"))]
    let _ = level;
    ruzstd::encoding::compress_to_vec(raw, ruzstd::encoding::CompressionLevel::Fastest)
}

/// Decompresses exactly one frame (nothing may follow it) of unknown decoded length, refusing
/// any output longer than `max` bytes: the output grows with what the frame yields, and the
/// decoder's window is limited to what `max` bytes can need.
pub fn decompress_bounded(stored: &[u8], max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::new();
    #[cfg(feature = "native-zstd")]
    {
        let frame = zstd::zstd_safe::find_frame_compressed_size(stored)
            .map_err(|code| zstd::zstd_safe::get_error_name(code).to_string())?;
        if frame != stored.len() {
            return Err(format!("{} bytes follow its frame", stored.len() - frame));
        }
        // A window never needs to exceed the output (libzstd sizes it to the input's).
        let window_log = (u64::BITS - max.max(1).saturating_sub(1).leading_zeros()).clamp(10, 31);
        let mut decoder = zstd::stream::read::Decoder::with_buffer(stored)
            .map_err(|e| e.to_string())?
            .single_frame();
        decoder
            .window_log_max(window_log)
            .map_err(|e| e.to_string())?;
        decoder
            .take(max + 1)
            .read_to_end(&mut out)
            .map_err(|e| e.to_string())?;
    }
    #[cfg(not(feature = "native-zstd"))]
    {
        let mut decoder =
            ruzstd::decoding::StreamingDecoder::new(stored).map_err(|e| e.to_string())?;
        (&mut decoder)
            .take(max + 1)
            .read_to_end(&mut out)
            .map_err(|e| e.to_string())?;
        if out.len() as u64 <= max {
            // The same checks as libzstd's: nothing after the frame, its checksum if present.
            let rest = decoder.get_ref().len();
            if rest != 0 {
                return Err(format!("{rest} bytes follow its frame"));
            }
            let frame = decoder.into_frame_decoder();
            if let (Some(want), Some(got)) = (
                frame.get_checksum_from_data(),
                frame.get_calculated_checksum(),
            ) {
                if want != got {
                    return Err("frame checksum mismatch".into());
                }
            }
        }
    }
    if out.len() as u64 > max {
        return Err(format!("decodes to more than {max} bytes"));
    }
    Ok(out)
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
