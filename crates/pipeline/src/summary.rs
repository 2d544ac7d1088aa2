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
    /// Bits per scalar of the streams; `None` (JSON `null`) for an archive of no values,
    /// which has no rate.
    pub bps_payload: Option<f64>,
    /// Bits per scalar of the whole file; `None` for an archive of no values.
    pub bps_file: Option<f64>,
    /// f32 bytes over file bytes; `None` for an archive of no values.
    pub ratio_vs_f32: Option<f64>,
    /// The lossy tensors alone (those with a finite stored SNR): what every quality figure is
    /// quoted over, so that an exactly stored tensor never inflates it. `None` when every
    /// tensor is exact or unmeasured.
    pub lossy: Option<LossyTotals>,
    /// Tensors whose stored values differ from their source where no finite SNR says by how
    /// much ([`lossy_without_snr`]): not in `lossy`, and not exact either.
    pub lossy_without_snr: usize,
}

/// Totals over the lossy tensors of an archive, from their stored statistics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LossyTotals {
    /// Lossy tensors.
    pub tensors: usize,
    /// Their values.
    pub elements: u64,
    /// Their stored bytes.
    pub stored_bytes: u64,
    /// Their bits per value, all their streams included.
    pub bps: f64,
    /// The file's bits per lossy value once the exactly stored tensors' own bytes are left
    /// out: their streams, plus the manifest, a stored plan and the alignment of every stream
    /// (what a rate target over the lossy tensors is met against, all-in).
    pub all_in_bps: f64,
    /// `10·log10(Σ signal / Σ noise)` over them.
    pub snr_db: f64,
    /// The lowest SNR of one of them.
    pub min_snr_db: f64,
    /// The median of their SNRs.
    pub median_snr_db: f64,
}

/// [`LossyTotals`] of tensors given as `(values, stored bytes, mse, snr_db)`, in a file of
/// `file_bytes` whose `exact_bytes` are the other tensors' streams.
fn lossy_totals(
    rows: impl Iterator<Item = (u64, u64, f64, f64)>,
    file_bytes: u64,
    exact_bytes: u64,
) -> Option<LossyTotals> {
    let (mut signal, mut noise, mut elements, mut bytes) = (0.0f64, 0.0f64, 0u64, 0u64);
    let mut snrs = Vec::new();
    for (n, stored, mse, snr) in rows {
        let e = mse * n as f64;
        noise += e;
        signal += e * 10f64.powf(snr / 10.0);
        elements += n;
        bytes += stored;
        snrs.push(snr);
    }
    if snrs.is_empty() || noise <= 0.0 {
        return None;
    }
    snrs.sort_by(|a, b| a.total_cmp(b));
    Some(LossyTotals {
        tensors: snrs.len(),
        elements,
        stored_bytes: bytes,
        bps: per_value(bytes, elements),
        all_in_bps: per_value(file_bytes.saturating_sub(exact_bytes), elements),
        snr_db: 10.0 * (signal / noise).log10(),
        min_snr_db: snrs[0],
        median_snr_db: snrs[snrs.len() / 2],
    })
}

/// Whether a tensor's stored values differ from its source with no finite SNR stored: a
/// source with NaN (its SNR is NaN) or a value that became infinite (its error is). Its largest
/// error is then absent or positive; a tensor stored exactly has 0 (NaN differences do not
/// count: `f64::max` passes over them). Unmeasured tensors (no statistics) are not counted.
pub fn lossy_without_snr(stats: Option<&TensorStats>) -> bool {
    stats.is_some_and(|s| s.snr_db.is_none() && s.max_abs_err != Some(0.0))
}

/// `(values, stored bytes, mse, snr_db)` of a lossy tensor: one with a finite stored SNR
/// over a nonzero error; `None` for a tensor stored exactly (or unmeasured).
fn lossy_row(t: &TensorSummary) -> Option<(u64, u64, f64, f64)> {
    let stats = t.stats.as_ref()?;
    match (stats.mse, stats.snr_db) {
        (Some(mse), Some(snr)) if snr.is_finite() && mse > 0.0 => {
            Some((t.elements, t.stored_bytes, mse, snr))
        }
        _ => None,
    }
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
        bps_payload: (elements > 0).then(|| per_value(payload, elements)),
        bps_file: (elements > 0).then(|| per_value(file_bytes, elements)),
        ratio_vs_f32: (elements > 0 && file_bytes > 0)
            .then(|| elements as f64 * 4.0 / file_bytes as f64),
        lossy: lossy_totals(
            tensors.iter().filter_map(lossy_row),
            file_bytes,
            tensors
                .iter()
                .filter(|t| lossy_row(t).is_none())
                .map(|t| t.stored_bytes)
                .sum(),
        ),
        lossy_without_snr: tensors
            .iter()
            .filter(|t| lossy_without_snr(t.stats.as_ref()))
            .count(),
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
        "elements": elements, "bps_file": (elements > 0).then(|| per_value(file_bytes, elements))})
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercodec_hwz::{encode, EncodeOptions, Encoding, FloatDtype, TensorStats, Writer};

    #[test]
    fn lossy_totals_leave_exactly_stored_tensors_out() {
        let mut w = Writer::new(Vec::new(), Default::default()).expect("writer");
        let raw = Encoding::Raw {
            dtype: FloatDtype::F32,
        };
        // A norm of large values, stored exactly: it must not lift the SNR.
        let norm =
            encode("norm", &[100.0; 64], &[64], &raw, EncodeOptions::default()).expect("norm");
        w.add_tensor("norm", &[64], "f32", &norm, Some(TensorStats::default()))
            .expect("add");
        for (name, mse, snr) in [("a", 0.01, 20.0), ("b", 0.04, 10.0)] {
            let t =
                encode(name, &[0.5; 256], &[16, 16], &raw, EncodeOptions::default()).expect("t");
            let stats = TensorStats {
                mse: Some(mse),
                snr_db: Some(snr),
                ..TensorStats::default()
            };
            w.add_tensor(name, &[16, 16], "f32", &t, Some(stats))
                .expect("add");
        }
        let (bytes, m) = w.finish().expect("finish");
        let s = summarize(&m, 0, bytes.len() as u64);
        let l = s.totals.lossy.expect("lossy tensors");
        assert_eq!((l.tensors, l.elements), (2, 512));
        // Σsignal / Σnoise = (2.56·100 + 10.24·10) / (2.56 + 10.24).
        let expected = 10.0 * ((2.56 * 100.0 + 10.24 * 10.0) / (2.56 + 10.24f64)).log10();
        assert!((l.snr_db - expected).abs() < 1e-9, "{}", l.snr_db);
        assert_eq!((l.min_snr_db, l.median_snr_db), (10.0, 20.0));
        assert_eq!(l.bps, 32.0);
        // All-in: the file less the norm's 256 bytes, over the 512 lossy values.
        let all_in = (bytes.len() as f64 - 256.0) * 8.0 / 512.0;
        assert!((l.all_in_bps - all_in).abs() < 1e-9, "{}", l.all_in_bps);
        assert!(l.all_in_bps > l.bps);
    }
}
