//! A streaming safetensors writer: the header first (all sizes are known from shapes), then
//! each tensor as it is produced, into a temporary file renamed at the end.

use crate::error::{PipelineError, Result};
use hypercodec_hwz::FloatDtype;
use serde_json::{json, Map, Value};
use std::io::{BufWriter, Write};
use std::path::Path;

/// One tensor to write: name, shape, dtype.
pub struct OutTensor {
    /// Name.
    pub name: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Storage type.
    pub dtype: FloatDtype,
}

fn st_dtype(d: FloatDtype) -> &'static str {
    match d {
        FloatDtype::F32 => "F32",
        FloatDtype::F16 => "F16",
        FloatDtype::Bf16 => "BF16",
    }
}

/// The header key safetensors reserves for metadata: no tensor may have this name.
pub const METADATA_KEY: &str = "__metadata__";

/// Checks that every name can be a key of one safetensors header: non-empty, unique, and
/// not [`METADATA_KEY`] (readers would take it for metadata, or reject the file).
pub fn check_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for name in names {
        let reason = if name.is_empty() {
            "empty"
        } else if name == METADATA_KEY {
            "reserved for the header's metadata"
        } else if !seen.insert(name) {
            "used by two tensors"
        } else {
            continue;
        };
        return Err(PipelineError::OutputName {
            name: name.chars().take(64).collect(),
            reason,
        });
    }
    Ok(())
}

/// Writes `tensors` to `path`; `fill(i, out)` appends the little-endian bytes of tensor `i`.
/// Names are checked ([`check_names`]) and sizes computed before anything is written.
pub fn write_safetensors(
    path: &Path,
    tensors: &[OutTensor],
    metadata: Option<Map<String, Value>>,
    mut fill: impl FnMut(usize, &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    check_names(tensors.iter().map(|t| t.name.as_str()))?;
    let mut header = Map::new();
    if let Some(m) = metadata {
        header.insert(METADATA_KEY.into(), Value::Object(m));
    }
    let mut offset = 0u64;
    let mut sizes = Vec::with_capacity(tensors.len());
    for t in tensors {
        // (Checked: a wrapped size wrote offsets that its own reader refuses.)
        let size = t
            .shape
            .iter()
            .try_fold(t.dtype.size() as u64, |a, &d| a.checked_mul(d))
            .filter(|&size| offset.checked_add(size).is_some())
            .ok_or_else(|| PipelineError::Shape {
                tensor: t.name.clone(),
                shape: t.shape.clone(),
                message: "its bytes overflow a safetensors offset".into(),
            })?;
        header.insert(t.name.clone(), json!({ "dtype": st_dtype(t.dtype), "shape": t.shape, "data_offsets": [offset, offset + size] }));
        offset += size;
        sizes.push(size);
    }
    let mut hbytes =
        serde_json::to_vec(&Value::Object(header)).map_err(|e| PipelineError::SafeTensors {
            message: e.to_string(),
        })?;
    while hbytes.len() % 8 != 0 {
        hbytes.push(b' ');
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = hypercodec_hwz::temp_file_in(dir, ".st-").map_err(PipelineError::io(dir))?;
    let (file, temp_path) = tmp.into_parts();
    let _listed = hypercodec_hwz::Unfinished::new(&temp_path);
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let io = PipelineError::io(path);
    let mut go = || -> std::io::Result<()> {
        w.write_all(&(hbytes.len() as u64).to_le_bytes())?;
        w.write_all(&hbytes)
    };
    go().map_err(io)?;
    let mut buf = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        buf.clear();
        fill(i, &mut buf)?;
        if buf.len() as u64 != size {
            return Err(PipelineError::TensorSize {
                tensor: tensors[i].name.clone(),
                produced: buf.len() as u64,
                expected: size,
            });
        }
        w.write_all(&buf).map_err(PipelineError::io(path))?;
    }
    let file = w.into_inner().map_err(|e| PipelineError::Io {
        path: path.into(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(PipelineError::io(path))?;
    temp_path.persist(path).map_err(|e| PipelineError::Io {
        path: path.into(),
        source: e.error,
    })?;
    Ok(())
}
