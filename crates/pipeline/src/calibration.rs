//! Input statistics for calibrated rounding: a safetensors file of `E[x·xᵀ]` per linear layer
//! (written by the Python wheel's `hypercodec.nn.save_hessians`), looked up by tensor name.

use crate::error::{PipelineError, Result};
use crate::source::TensorSource;
use std::collections::HashMap;

/// The statistics of a calibration file, read lazily by layer.
pub struct Calibration {
    source: TensorSource,
    by_name: HashMap<String, usize>,
    /// The file's name, recorded in the archive.
    pub name: String,
}

impl std::fmt::Debug for Calibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calibration")
            .field("name", &self.name)
            .field("layers", &self.by_name.len())
            .finish()
    }
}

impl Calibration {
    /// Opens `path` (a safetensors file of square f32 matrices named by layer).
    pub fn open(path: &std::path::Path) -> Result<Self> {
        let spec = path.to_str().ok_or_else(|| {
            PipelineError::option("--calibration", format!("{path:?} is not UTF-8"))
        })?;
        let source = TensorSource::open(spec)?;
        let by_name = source
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Calibration {
            source,
            by_name,
            name: path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        })
    }

    /// Layers held.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether the file holds no layer.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The file's layers that none of `tensors` reads (no tensor of that name, nor of that
    /// name and `.weight`), sorted: statistics of another model, or names spelt otherwise.
    pub fn unmatched(&self, tensors: &[&str]) -> Vec<&str> {
        crate::plan::unmatched_names(
            self.by_name.keys().map(String::as_str),
            tensors
                .iter()
                .flat_map(|t| [*t, t.strip_suffix(".weight").unwrap_or(t)]),
        )
    }

    /// The statistics of the weight `tensor` (looked up as its name, then without a trailing
    /// `.weight`) when they are `cols × cols`; `None` when the file has none. A matrix of
    /// another size is an error: it belongs to a different model.
    pub fn get(&self, tensor: &str, cols: usize) -> Result<Option<Vec<f32>>> {
        let Some(&i) = self.by_name.get(tensor).or_else(|| {
            self.by_name
                .get(tensor.strip_suffix(".weight").unwrap_or(tensor))
        }) else {
            return Ok(None);
        };
        let t = &self.source.tensors[i];
        if t.shape != [cols as u64, cols as u64] {
            return Err(PipelineError::option(
                "--calibration",
                format!(
                    "`{}` is {:?}, but `{tensor}` needs {cols}x{cols} input statistics",
                    t.name, t.shape
                ),
            ));
        }
        Ok(Some(self.source.read(i)?))
    }
}
