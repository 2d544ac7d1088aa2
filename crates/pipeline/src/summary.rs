//! What `inspect` shows of an archive: per-tensor rows and totals, from the manifest alone.
//!
//! Pure (no files): the browser inspector builds its view from the same [`ArchiveSummary`].

use hypercodec_hwz::legacy::LegacyArchive;
use hypercodec_hwz::{Compression, Encoding, Manifest, ReadAt, TensorStats};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One stream of a tensor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamSummary {
    /// Bytes stored in the file.
    pub stored: u64,
    /// Bytes before container compression.
    pub raw: u64,
    /// Container compression.
    pub compression: Compression,
}

/// One tensor of an archive.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorSummary {
    /// Name.
    pub name: String,
    /// Shape, outermost first.
    pub shape: Vec<u64>,
    /// Type of the source tensor.
    pub source_dtype: String,
    /// The encoding.
    pub encoding: Encoding,
    /// The encoding's short label.
    pub label: String,
    /// Values.
    pub elements: u64,
    /// Bytes of every stream as stored.
    pub stored_bytes: u64,
    /// Bits per scalar of the stored streams.
    pub bps: f64,
    /// Streams by role.
    pub streams: BTreeMap<String, StreamSummary>,
    /// Error measured when written.
    pub stats: Option<TensorStats>,
}

/// Totals of an archive.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Totals {
    /// Tensors.
    pub tensors: usize,
    /// Values.
    pub elements: u64,
    /// Bytes of every stream.
    pub payload_bytes: u64,
    /// Bytes of the manifest.
    pub manifest_bytes: u64,
    /// Bytes of the file.
    pub file_bytes: u64,
    /// Bits per scalar of the streams.
    pub bps_payload: f64,
    /// Bits per scalar of the whole file.
    pub bps_file: f64,
    /// f32 bytes over file bytes.
    pub ratio_vs_f32: f64,
}

/// What `hypercodec inspect --json` prints of a native archive (less the file name).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArchiveSummary {
    /// Format version.
    pub version: u32,
    /// The writer's `generator` string.
    pub generator: String,
    /// Every tensor, in write order.
    pub tensors: Vec<TensorSummary>,
    /// Totals.
    pub totals: Totals,
    /// Keys of the free metadata.
    pub metadata_keys: Vec<String>,
    /// The Plan that chose the encodings, if one is stored.
    pub plan: Option<Value>,
}

fn per_value(bytes: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / n as f64
    }
}

/// Summarizes a (validated) manifest of a file of `file_bytes` whose manifest takes
/// `manifest_bytes`.
pub fn summarize(m: &Manifest, manifest_bytes: u64, file_bytes: u64) -> ArchiveSummary {
    let (mut elements, mut payload) = (0u64, 0u64);
    let tensors: Vec<TensorSummary> = m
        .tensors
        .iter()
        .map(|t| {
            let streams: BTreeMap<String, StreamSummary> = t
                .streams
                .iter()
                .filter_map(|(role, &i)| {
                    let s = m.streams.get(usize::try_from(i).ok()?)?;
                    Some((
                        role.clone(),
                        StreamSummary {
                            stored: s.length,
                            raw: s.raw_length,
                            compression: s.compression,
                        },
                    ))
                })
                .collect();
            let stored: u64 = streams.values().map(|s| s.stored).sum();
            let n = t.numel();
            elements += n;
            payload += stored;
            TensorSummary {
                name: t.name.clone(),
                shape: t.shape.clone(),
                source_dtype: t.source_dtype.clone(),
                encoding: t.encoding.clone(),
                label: t.encoding.label(),
                elements: n,
                stored_bytes: stored,
                bps: per_value(stored, n),
                streams,
                stats: t.stats,
            }
        })
        .collect();
    let totals = Totals {
        tensors: tensors.len(),
        elements,
        payload_bytes: payload,
        manifest_bytes,
        file_bytes,
        bps_payload: per_value(payload, elements),
        bps_file: per_value(file_bytes, elements),
        ratio_vs_f32: if file_bytes == 0 {
            0.0
        } else {
            elements as f64 * 4.0 / file_bytes as f64
        },
    };
    ArchiveSummary {
        version: m.version,
        generator: m.generator.clone(),
        tensors,
        totals,
        metadata_keys: m.metadata.keys().cloned().collect(),
        plan: m.plan.clone(),
    }
}

impl ArchiveSummary {
    /// As JSON (the shape `inspect --json` prints).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// What `hypercodec inspect --json` prints of a legacy zip archive of `file_bytes` (less the
/// file name).
pub fn legacy_summary<R: ReadAt>(a: &LegacyArchive<R>, file_bytes: u64) -> Value {
    let elements: u64 = a.tensors().iter().map(|t| t.numel()).sum();
    let rows: Vec<Value> = a
        .tensors()
        .iter()
        .map(|t| {
            let n = t.numel();
            json!({"name": t.name, "shape": t.shape, "codec": t.codec, "elements": n,
                   "payload_bytes": t.payload_bytes, "bps": per_value(t.payload_bytes, n)})
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
    json!({"format": "hyperglyph (legacy zip)", "format_version": a.metadata().get("format_version"),
        "tensors": rows, "streams": streams, "skipped_tensors": skipped, "file_bytes": file_bytes,
        "elements": elements, "bps_file": per_value(file_bytes, elements)})
}
