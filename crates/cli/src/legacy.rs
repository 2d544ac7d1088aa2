//! `inspect` and `decompress` of legacy zip-based .hwz archives (Hyper Glyph 0.6–0.7), read
//! through `hypercodec_hwz::legacy`.

use crate::error::{CliError, Result};
use crate::safetensors_out::{write_safetensors, OutTensor};
use hypercodec_hwz::legacy::LegacyArchive;
use hypercodec_hwz::FloatDtype;
use memmap2::Mmap;
use serde_json::{json, Value};
use std::path::Path;

/// True when the file starts like a zip archive.
pub fn is_legacy(path: &Path) -> Result<bool> {
    let mut head = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(CliError::io(path))?;
    let n = std::io::Read::read(&mut f, &mut head).map_err(CliError::io(path))?;
    Ok(n == 4 && head == hypercodec_hwz::ZIP_MAGIC)
}

fn open(path: &Path) -> Result<LegacyArchive<Mmap>> {
    let file = std::fs::File::open(path).map_err(CliError::io(path))?;
    // SAFETY: read-only map of a file the user names, assumed unchanged while we run; every
    // access is bounds-checked by the legacy reader.
    let map = unsafe { Mmap::map(&file) }.map_err(CliError::io(path))?;
    Ok(LegacyArchive::open(map)?)
}

/// Lists a legacy archive's tensors.
pub fn inspect(path: &Path, as_json: bool) -> Result<()> {
    let a = open(path)?;
    let file_bytes = std::fs::metadata(path).map_err(CliError::io(path))?.len();
    let elements: u64 = a.tensors().iter().map(|t| t.numel()).sum();
    let rows: Vec<Value> = a
        .tensors()
        .iter()
        .map(|t| {
            let n = t.numel();
            json!({"name": t.name, "shape": t.shape, "codec": t.codec, "elements": n, "payload_bytes": t.payload_bytes,
                   "bps": if n == 0 { 0.0 } else { t.payload_bytes as f64 * 8.0 / n as f64 }})
        })
        .collect();
    let streams: serde_json::Map<String, Value> = a
        .streams()
        .iter()
        .map(|(k, s)| {
            (
                k.clone(),
                json!({"raw": s.raw_bytes, "stored": s.stored_bytes, "compression": s.compression}),
            )
        })
        .collect();
    let skipped = a
        .metadata()
        .get("skipped_tensors")
        .cloned()
        .unwrap_or(Value::Null);
    if as_json {
        let out = json!({"file": path, "format": "hyperglyph (legacy zip)", "format_version": a.metadata().get("format_version"),
            "tensors": rows, "streams": streams, "skipped_tensors": skipped, "file_bytes": file_bytes, "elements": elements,
            "bps_file": if elements == 0 { 0.0 } else { file_bytes as f64 * 8.0 / elements as f64 }});
        println!("{out:#}");
        return Ok(());
    }
    let version = a
        .metadata()
        .get("format_version")
        .and_then(Value::as_str)
        .unwrap_or("?");
    println!(
        "{} — legacy Hyper Glyph archive (zip, format {version}), read-only",
        path.display()
    );
    println!(
        "{:<48} {:<16} {:<24} {:>7} {:>12}",
        "tensor", "shape", "codec", "bps*", "bytes*"
    );
    for r in &rows {
        let shape = crate::shape_text(&r["shape"]);
        println!(
            "{:<48} {:<16} {:<24} {:>7.3} {:>12}",
            r["name"].as_str().unwrap_or(""),
            shape,
            r["codec"].as_str().unwrap_or(""),
            r["bps"].as_f64().unwrap_or(0.0),
            r["payload_bytes"]
        );
    }
    println!(
        "{} tensors, {elements} values, file {file_bytes} B ({:.3} bps all-in); * = stream bytes before zstd; metadata skipped_tensors: {skipped}",
        rows.len(),
        if elements == 0 { 0.0 } else { file_bytes as f64 * 8.0 / elements as f64 }
    );
    Ok(())
}

/// Restores a legacy archive to safetensors (f32 unless `dtype` says otherwise).
pub fn decompress(path: &Path, output: &Path, dtype: Option<FloatDtype>) -> Result<()> {
    let a = open(path)?;
    let dtype = dtype.unwrap_or(FloatDtype::F32);
    let tensors: Vec<OutTensor> = a
        .tensors()
        .iter()
        .map(|t| OutTensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            dtype,
        })
        .collect();
    write_safetensors(output, &tensors, None, |i, out| {
        let t = &a.tensors()[i];
        let values = a.decode_tensor(&t.name)?;
        out.extend_from_slice(&crate::float_bytes(&t.name, &values, dtype)?);
        Ok(())
    })
}
