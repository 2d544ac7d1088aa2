//! hypercodec-web: the browser inspector's engine — `hypercodec-hwz` and the pure codecs
//! compiled to WebAssembly behind a small wasm-bindgen API.
//!
//! Key design decision: the page never hands the whole file to WebAssembly. JavaScript reads
//! the head and the tail with `Blob.slice`, then the manifest, then — only when a tensor is
//! chosen — the byte range of that tensor's streams. [`Inspector`] validates each piece with the
//! same code as the native reader (caps, bounds, checksums), so a multi-gigabyte archive shows
//! its table after three small reads and a corrupt one gets the reader's typed message.
//!
//! Flow: `Inspector::new(head, tail, file_len)` → `manifest_range()` → `load_manifest(bytes)` →
//! `summary()` (JSON for the table and the payload chart) → `tensor_range(name)` →
//! `histogram(name, range_start, bytes, bins)` (JSON).
#![deny(missing_docs)]

use hypercodec_hwz::legacy::LegacyArchive;
use hypercodec_hwz::{self as hwz, HwzError, Manifest, Tail, TensorEntry, HEADER_LEN, TAIL_LEN};
use serde_json::{json, Value};
use std::borrow::Cow;
use wasm_bindgen::prelude::*;

/// Largest tensor decoded for a histogram: 2^26 values (256 MiB of f32), a quarter of what a
/// 32-bit WebAssembly memory can hold.
pub const MAX_HISTOGRAM_VALUES: u64 = 1 << 26;

/// Bytes to read from the start of a file.
#[wasm_bindgen]
pub fn head_len() -> u32 {
    8
}

/// Bytes to read from the end of a file.
#[wasm_bindgen]
pub fn tail_len() -> u32 {
    TAIL_LEN as u32
}

fn js(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

fn legacy_message() -> String {
    "this is a legacy zip-based .hwz archive (Hyper Glyph); this inspector reads HWZ1 archives only"
        .into()
}

/// An archive being inspected: an HWZ1 archive (its tail, then its manifest, then tensors on
/// demand) or a legacy Hyper Glyph zip archive (read whole: such archives are small).
#[wasm_bindgen]
#[derive(Debug)]
pub struct Inspector {
    file_len: u64,
    tail: Tail,
    manifest: Option<Manifest>,
    legacy: Option<LegacyArchive<Vec<u8>>>,
}

/// Largest legacy archive read whole into the page.
pub const MAX_LEGACY_BYTES: u64 = 512 << 20;

impl Inspector {
    /// Native constructor (the JS one maps errors to exceptions).
    pub fn open(head: &[u8], tail: &[u8], file_len: u64) -> Result<Inspector, String> {
        if head.starts_with(&hwz::ZIP_MAGIC) {
            return Err(legacy_message());
        }
        if file_len < HEADER_LEN + TAIL_LEN {
            return Err(HwzError::TooShort {
                len: file_len,
                min: HEADER_LEN + TAIL_LEN,
            }
            .to_string());
        }
        hwz::parse_head(head).map_err(|e| e.to_string())?;
        let tail = Tail::parse(tail, file_len).map_err(|e| e.to_string())?;
        Ok(Inspector {
            file_len,
            tail,
            manifest: None,
            legacy: None,
        })
    }

    /// Native constructor of a legacy (zip) archive from all its bytes.
    pub fn open_legacy(bytes: Vec<u8>) -> Result<Inspector, String> {
        let file_len = bytes.len() as u64;
        if file_len > MAX_LEGACY_BYTES {
            return Err(format!("legacy archive of {file_len} bytes is larger than the {MAX_LEGACY_BYTES} this page reads whole"));
        }
        let archive = LegacyArchive::open(bytes).map_err(|e| e.to_string())?;
        let tail = Tail {
            manifest_offset: 0,
            manifest_len: 0,
            manifest_crc32c: 0,
        };
        Ok(Inspector {
            file_len,
            tail,
            manifest: None,
            legacy: Some(archive),
        })
    }

    fn legacy_summary(&self, a: &LegacyArchive<Vec<u8>>) -> Value {
        let roles: std::collections::BTreeMap<String, u64> = a
            .streams()
            .iter()
            .map(|(name, s)| (name.clone(), s.stored_bytes))
            .collect();
        let payload: u64 = roles.values().sum();
        let elements: u64 = a.tensors().iter().map(|t| t.numel()).sum();
        let tensors: Vec<Value> = a
            .tensors()
            .iter()
            .map(|t| {
                let n = t.numel();
                json!({
                    "name": t.name, "shape": t.shape, "source_dtype": "f32", "encoding": format!("legacy {}", t.codec),
                    "elements": n, "stored_bytes": t.payload_bytes,
                    "bps": if n == 0 { 0.0 } else { t.payload_bytes as f64 * 8.0 / n as f64 },
                    "ratio_vs_f32": if t.payload_bytes == 0 { Value::Null } else { json!(n as f64 * 4.0 / t.payload_bytes as f64) },
                    "snr_db": Value::Null, "streams": {},
                })
            })
            .collect();
        let version = a
            .metadata()
            .get("format_version")
            .and_then(Value::as_str)
            .unwrap_or("?");
        json!({
            "version": format!("legacy zip {version}"), "generator": "Hyper Glyph", "file_bytes": self.file_len,
            "manifest_bytes": 0, "elements": elements, "payload_bytes": payload,
            "bps_all_in": if elements == 0 { 0.0 } else { self.file_len as f64 * 8.0 / elements as f64 },
            "roles": roles, "tensors": tensors,
            "metadata_keys": a.metadata().as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()).unwrap_or_default(),
        })
    }

    /// Native manifest loading.
    pub fn load(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.manifest = Some(Manifest::parse(bytes, &self.tail).map_err(|e| e.to_string())?);
        Ok(())
    }

    fn manifest_ref(&self) -> Result<&Manifest, String> {
        self.manifest
            .as_ref()
            .ok_or_else(|| "the manifest is not loaded yet".to_string())
    }

    fn tensor(&self, name: &str) -> Result<&TensorEntry, String> {
        self.manifest_ref()?
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| HwzError::TensorNotFound { name: name.into() }.to_string())
    }

    /// `[start, end)` of the bytes holding all of a tensor's streams (empty for legacy
    /// archives, which are held whole).
    pub fn range(&self, name: &str) -> Result<(u64, u64), String> {
        if self.legacy.is_some() {
            return Ok((0, 0));
        }
        let m = self.manifest_ref()?;
        let t = self.tensor(name)?;
        let mut start = u64::MAX;
        let mut end = 0;
        for &i in t.streams.values() {
            let s = &m.streams[i as usize];
            start = start.min(s.offset);
            end = end.max(s.offset + s.length);
        }
        Ok(if start == u64::MAX {
            (HEADER_LEN, HEADER_LEN)
        } else {
            (start, end)
        })
    }

    /// The table, the payload breakdown and the totals, as JSON.
    pub fn summary_value(&self) -> Result<Value, String> {
        if let Some(a) = &self.legacy {
            return Ok(self.legacy_summary(a));
        }
        let m = self.manifest_ref()?;
        // The same summary as `hypercodec inspect --json`, in the page's field names.
        let s = hypercodec_pipeline::summarize(m, self.tail.manifest_len, self.file_len);
        let mut roles: std::collections::BTreeMap<&str, u64> = Default::default();
        let tensors: Vec<Value> = s
            .tensors
            .iter()
            .map(|t| {
                let mut by_role = serde_json::Map::new();
                for (role, st) in &t.streams {
                    *roles.entry(role).or_default() += st.stored;
                    by_role.insert(role.clone(), json!(st.stored));
                }
                let (n, stored) = (t.elements, t.stored_bytes);
                json!({
                    "name": t.name, "shape": t.shape, "source_dtype": t.source_dtype,
                    "encoding": t.label, "encoding_json": t.encoding, "elements": n,
                    "stored_bytes": stored, "bps": t.bps,
                    "ratio_vs_f32": if stored == 0 { Value::Null } else { json!(n as f64 * 4.0 / stored as f64) },
                    "snr_db": t.stats.and_then(|s| s.snr_db), "streams": by_role,
                })
            })
            .collect();
        Ok(json!({
            "version": s.version, "generator": s.generator, "file_bytes": s.totals.file_bytes,
            "manifest_bytes": s.totals.manifest_bytes, "elements": s.totals.elements,
            "payload_bytes": s.totals.payload_bytes, "bps_all_in": s.totals.bps_file,
            "lossy": s.totals.lossy, "lossy_without_snr": s.totals.lossy_without_snr,
            "roles": roles, "tensors": tensors, "metadata_keys": s.metadata_keys,
        }))
    }

    /// Decodes `name` from `bytes` (the file's bytes from `start`) and bins its values.
    pub fn histogram_value(
        &self,
        name: &str,
        start: u64,
        bytes: &[u8],
        bins: u32,
    ) -> Result<Value, String> {
        if let Some(a) = &self.legacy {
            let t = a
                .tensors()
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| format!("no tensor named `{name}`"))?;
            if t.numel() > MAX_HISTOGRAM_VALUES {
                return Err(format!("tensor `{name}` has {} values; the browser decodes at most {MAX_HISTOGRAM_VALUES}", t.numel()));
            }
            let values = a.decode_tensor(name).map_err(|e| e.to_string())?;
            return Ok(histogram(&values, bins.clamp(1, 1024) as usize));
        }
        let m = self.manifest_ref()?;
        let t = self.tensor(name)?;
        let n = t.numel();
        if n > MAX_HISTOGRAM_VALUES {
            return Err(format!("tensor `{name}` has {n} values; the browser decodes at most {MAX_HISTOGRAM_VALUES}"));
        }
        let mut streams: Vec<(String, Cow<'_, [u8]>)> = Vec::new();
        for (role, &i) in &t.streams {
            let s = &m.streams[i as usize];
            let lo = s
                .offset
                .checked_sub(start)
                .ok_or("the bytes given do not cover the tensor")? as usize;
            let stored = bytes
                .get(lo..lo + s.length as usize)
                .ok_or("the bytes given do not cover the tensor")?;
            let decoded = hwz::decode_stream(i as usize, s, Cow::Borrowed(stored))
                .map_err(|e| e.to_string())?;
            streams.push((role.clone(), decoded));
        }
        let refs: Vec<(&str, &[u8])> = streams
            .iter()
            .map(|(r, b)| (r.as_str(), b.as_ref()))
            .collect();
        let mut values = vec![0f32; n as usize];
        hwz::decode_into(&t.name, &t.encoding, &t.shape, &refs, &mut values)
            .map_err(|e| e.to_string())?;
        Ok(histogram(&values, bins.clamp(1, 1024) as usize))
    }
}

/// Bins finite values between their min and max; counts non-finite ones apart.
pub fn histogram(values: &[f32], bins: usize) -> Value {
    let finite = || values.iter().copied().filter(|v| v.is_finite());
    let (lo, hi) = finite().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    let count = finite().count();
    let mut counts = vec![0u64; bins];
    if count > 0 {
        let width = (hi - lo) as f64 / bins as f64;
        for v in finite() {
            let k = if width > 0.0 {
                (((v - lo) as f64 / width) as usize).min(bins - 1)
            } else {
                0
            };
            counts[k] += 1;
        }
    }
    let mean = finite().map(|v| v as f64).sum::<f64>() / count.max(1) as f64;
    let var = finite().map(|v| (v as f64 - mean).powi(2)).sum::<f64>() / count.max(1) as f64;
    json!({
        "min": if count > 0 { json!(lo) } else { Value::Null },
        "max": if count > 0 { json!(hi) } else { Value::Null },
        "mean": mean, "std": var.sqrt(), "count": count, "non_finite": values.len() - count, "counts": counts,
    })
}

#[wasm_bindgen]
impl Inspector {
    /// Checks the head (first [`head_len`] bytes) and the tail (last [`tail_len`] bytes) of a
    /// file of `file_len` bytes.
    #[wasm_bindgen(constructor)]
    pub fn new(head: &[u8], tail: &[u8], file_len: f64) -> Result<Inspector, JsError> {
        Inspector::open(head, tail, file_len as u64).map_err(js)
    }

    /// Opens a legacy zip-based (Hyper Glyph) archive from all its bytes.
    pub fn legacy(bytes: Vec<u8>) -> Result<Inspector, JsError> {
        Inspector::open_legacy(bytes).map_err(js)
    }

    /// `[offset, length]` of the manifest.
    #[wasm_bindgen(js_name = manifestRange)]
    pub fn manifest_range(&self) -> Vec<f64> {
        vec![
            self.tail.manifest_offset as f64,
            self.tail.manifest_len as f64,
        ]
    }

    /// Parses and validates the manifest bytes.
    #[wasm_bindgen(js_name = loadManifest)]
    pub fn load_manifest(&mut self, bytes: &[u8]) -> Result<(), JsError> {
        self.load(bytes).map_err(js)
    }

    /// The summary as a JSON string.
    pub fn summary(&self) -> Result<String, JsError> {
        self.summary_value().map(|v| v.to_string()).map_err(js)
    }

    /// `[start, end)` of the bytes to read for a tensor.
    #[wasm_bindgen(js_name = tensorRange)]
    pub fn tensor_range(&self, name: &str) -> Result<Vec<f64>, JsError> {
        self.range(name)
            .map(|(a, b)| vec![a as f64, b as f64])
            .map_err(js)
    }

    /// The histogram of a tensor as a JSON string, from the bytes of its range.
    #[wasm_bindgen(js_name = histogram)]
    pub fn histogram_js(
        &self,
        name: &str,
        start: f64,
        bytes: &[u8],
        bins: u32,
    ) -> Result<String, JsError> {
        self.histogram_value(name, start as u64, bytes, bins)
            .map(|v| v.to_string())
            .map_err(js)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden(name: &str) -> Vec<u8> {
        std::fs::read(format!(
            "{}/../tests/data/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .expect("golden file")
    }

    fn open(bytes: &[u8]) -> Result<Inspector, String> {
        let n = bytes.len();
        let mut i = Inspector::open(
            &bytes[..8.min(n)],
            &bytes[n.saturating_sub(TAIL_LEN as usize)..],
            n as u64,
        )?;
        let [off, len] = [
            i.tail.manifest_offset as usize,
            i.tail.manifest_len as usize,
        ];
        i.load(&bytes[off..off + len])?;
        Ok(i)
    }

    #[test]
    fn golden_archives_summarize_and_decode() {
        for file in [
            "golden-v1.hwz",
            "golden-v1-lattice.hwz",
            "golden-v1-trellis.hwz",
            "golden-v1-trellis-pairs.hwz",
            "golden-v1-prefix.hwz",
            "golden-v1-prefix-span.hwz",
        ] {
            let bytes = golden(file);
            let i = open(&bytes).expect("valid");
            let s = i.summary_value().expect("summary");
            let tensors = s["tensors"].as_array().expect("tensors");
            assert!(!tensors.is_empty());
            for t in tensors {
                let name = t["name"].as_str().expect("name");
                let (a, b) = i.range(name).expect("range");
                let h = i
                    .histogram_value(name, a, &bytes[a as usize..b as usize], 16)
                    .expect("histogram");
                assert_eq!(h["count"], t["elements"]);
                assert_eq!(
                    h["counts"]
                        .as_array()
                        .expect("counts")
                        .iter()
                        .map(|c| c.as_u64().unwrap_or(0))
                        .sum::<u64>(),
                    t["elements"].as_u64().expect("elements")
                );
            }
            let roles: u64 = s["roles"]
                .as_object()
                .expect("roles")
                .values()
                .map(|v| v.as_u64().unwrap_or(0))
                .sum();
            assert_eq!(roles, s["payload_bytes"].as_u64().expect("payload"));
        }
    }

    #[test]
    fn bad_files_get_the_readers_messages() {
        assert!(open(b"PK\x03\x04 and more bytes than a head and a tail need ............................................").unwrap_err().contains("legacy"));
        assert!(Inspector::open_legacy(b"PK\x03\x04 not a zip".to_vec())
            .unwrap_err()
            .contains("legacy"));
        let hg = golden("hyperglyph-auto.hwz");
        let i = Inspector::open_legacy(hg).expect("legacy archive");
        let s = i.summary_value().expect("summary");
        assert_eq!(s["tensors"].as_array().expect("tensors").len(), 5);
        let h = i
            .histogram_value("dense.weight", 0, &[], 8)
            .expect("histogram");
        assert_eq!(h["count"], 64 * 96);
        assert!(open(b"HWZ1").unwrap_err().contains("too short"));
        let mut b = golden("golden-v1.hwz");
        let n = b.len();
        b[n - 30] ^= 1; // inside the manifest
        assert!(open(&b).unwrap_err().contains("checksum"));
        let b = golden("golden-v1.hwz");
        let i = open(&b).expect("valid");
        let name = i.summary_value().expect("summary")["tensors"][0]["name"]
            .as_str()
            .expect("name")
            .to_string();
        let (a, e) = i.range(&name).expect("range");
        let mut bytes = b[a as usize..e as usize].to_vec();
        bytes[1] ^= 0xFF;
        assert!(i
            .histogram_value(&name, a, &bytes, 8)
            .unwrap_err()
            .contains("checksum"));
        assert!(i
            .histogram_value(&name, a + 1, &b[a as usize..e as usize], 8)
            .is_err());
    }

    #[test]
    fn histogram_bins() {
        let h = histogram(&[0.0, 1.0, 2.0, 3.0, f32::NAN], 3);
        assert_eq!(h["counts"], json!([1, 1, 2]));
        assert_eq!(h["non_finite"], 1);
    }
}
