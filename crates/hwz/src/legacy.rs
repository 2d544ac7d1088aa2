//! Read-only import of legacy zip-based `.hwz` archives written by Hyper Glyph
//! (hyperglyph-codec 0.6–0.7, compact format 0.5): `metadata.json` plus one `NAME.bin[.zst]`
//! entry per stream, tensors coded as `packed_int4`, `raw_int8`, `codebook`, `low_rank` and
//! `sparse`, the first and the fourth optionally with a `_residual` repair.
//!
//! The zip container is parsed here (end record, central directory, local headers; stored or
//! deflated entries, CRC-32 checked) so the reader stays pure and builds for wasm32. Every size
//! read from the file is checked against the file and named caps before anything is allocated;
//! every offset in the metadata is checked against its stream.
//!
//! What a file can make the reader allocate is bounded by the file's own size:
//! - a stream decodes to at most [`MAX_LEGACY_EXPANSION`] times the bytes its zip entry
//!   occupies in the file (at least [`MIN_LEGACY_BUDGET`]), deflate and zstd together: one
//!   budget for the chain, never the product of two ratios;
//! - a tensor has at most [`MAX_LEGACY_VALUES_PER_FILE_BYTE`] values per byte of the file,
//!   checked at open, before any of its streams is read;
//! - each codec's sizes must then be produced by its stream bytes: a low-rank tensor's `r x k`
//!   and `k x c` int8 factors are in the stream with `1 <= k <= min(r, c, MAX_LEGACY_LOW_RANK)`
//!   and `r * c` equal to the shape's count; a codebook's `prototypes x block` int8 values are
//!   in the stream (at most [`MAX_LEGACY_PROTOTYPES`] by [`MAX_LEGACY_BLOCK`]) and its counts
//!   satisfy `assignments <= blocks <= values`.
//!
//! Sizes above a cap are [`HwzError::LegacyLimit`]; other inconsistencies [`HwzError::Legacy`].

use crate::{HwzError, ReadAt, Result, MAX_ELEMENTS, MAX_RANK, MAX_ZSTD_EXPANSION};
use half::f16;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Most entries in a legacy zip (Hyper Glyph writes a dozen).
pub const MAX_LEGACY_ENTRIES: usize = 4096;
/// Largest inflated/deflated ratio of one zip entry: a deflate stream spends at least about
/// two bits on a 258-byte match, so no entry inflates more than about 1032:1.
pub const MAX_DEFLATE_EXPANSION: u64 = 1032;
/// The one cap on a stream's whole expansion chain: the bytes a stream decodes to (deflate in
/// the zip, then zstd) are at most this many times the bytes its zip entry occupies in the
/// file. Deflate alone may use the whole ratio; a zstd frame inside draws from the same budget
/// instead of multiplying it (Hyper Glyph's streams are weights and indices, which neither
/// codec shrinks anywhere near 1000:1; the goldens stay below 2:1).
pub const MAX_LEGACY_EXPANSION: u64 = MAX_DEFLATE_EXPANSION;
/// The smallest expansion budget of an entry, whatever its size: a zstd frame spends 9 bytes
/// or more on its headers, so a short but honest stream of zeros can exceed the ratio above.
/// A 4 KiB floor per entry bounds nothing a reader would notice.
pub const MIN_LEGACY_BUDGET: u64 = 4096;
/// Most values one tensor may decode to per byte of the whole file: no more than one value
/// per decoded stream byte, the expansion a `raw_int8` tensor reaches from a maximal stream.
/// Output is thus at most `4 * MAX_LEGACY_EXPANSION` bytes of `f32` per byte of the file.
/// (The whole file, not the tensor's share: Hyper Glyph's streams are shared by all tensors.)
pub const MAX_LEGACY_VALUES_PER_FILE_BYTE: u64 = MAX_LEGACY_EXPANSION;
/// Highest low-rank rank (Hyper Glyph keeps ranks in the tens; a rank is also at most the
/// smaller factor dimension, and never 0).
pub const MAX_LEGACY_LOW_RANK: u64 = 4096;
/// Most prototypes in a codebook (Hyper Glyph uses up to 256, the uint8 assignment range).
pub const MAX_LEGACY_PROTOTYPES: u64 = 1 << 20;
/// Longest codebook block, values per prototype (Hyper Glyph uses 8 to 64). A block is also
/// justified by its prototype bytes: `prototypes * block` int8 values must be in the stream.
pub const MAX_LEGACY_BLOCK: u64 = 4096;
/// Largest `metadata.json`.
pub const MAX_LEGACY_METADATA: u64 = 64 << 20;

/// The bytes an entry occupying `stored` bytes of the file may decode to, through deflate and
/// zstd together.
fn expansion_budget(stored: u64) -> u64 {
    stored
        .saturating_mul(MAX_LEGACY_EXPANSION)
        .max(MIN_LEGACY_BUDGET)
}

fn limit(item: &str, what: &'static str, value: u64, max: u64) -> HwzError {
    HwzError::LegacyLimit {
        item: item.into(),
        what,
        value,
        max,
    }
}

/// A count from the file as `usize` (wasm32's is 32 bits).
fn to_usize(v: u64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| bad(format!("{what} {v} does not fit this platform")))
}

fn bad(message: impl Into<String>) -> HwzError {
    HwzError::Legacy {
        message: message.into(),
    }
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// CRC-32 (IEEE, as zip uses it).
fn crc32(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    !bytes.iter().fold(!0u32, |c, &b| {
        t[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8)
    })
}

#[derive(Debug, Clone)]
struct Entry {
    method: u16,
    crc: u32,
    compressed: u64,
    size: u64,
    local: u64,
}

/// One tensor of a legacy archive.
#[derive(Debug, Clone)]
pub struct LegacyTensor {
    /// Name.
    pub name: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Hyper Glyph's codec name (`packed_int4`, `codebook_residual`, ...).
    pub codec: String,
    /// Bytes of stream data this tensor uses, before zstd (what its `*_length` fields add up to).
    pub payload_bytes: u64,
    meta: serde_json::Map<String, Value>,
}

impl LegacyTensor {
    /// Element count.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A legacy stream as the metadata lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyStream {
    /// Zip entry name.
    pub file: String,
    /// `zstd` or `raw`.
    pub compression: String,
    /// Bytes after zstd.
    pub raw_bytes: u64,
    /// Bytes in the zip entry (before deflate, after zstd).
    pub stored_bytes: u64,
}

/// An opened legacy archive.
#[derive(Debug)]
pub struct LegacyArchive<R> {
    source: R,
    entries: BTreeMap<String, Entry>,
    metadata: Value,
    tensors: Vec<LegacyTensor>,
    streams: BTreeMap<String, LegacyStream>,
    decoded: Decoded,
}

/// The streams tensors have decoded so far, each inflated once: every tensor slices one of a
/// few shared streams, and inflating it again for each (a 20 KB file of 4000 tensors over one
/// 8 MB stream) took minutes. At most the sum of the streams' budgets, which the file's size
/// bounds.
#[derive(Default)]
struct Decoded(Mutex<BTreeMap<String, Arc<Vec<u8>>>>);

impl std::fmt::Debug for Decoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map_or(0, |m| m.len());
        write!(f, "Decoded({n} streams)")
    }
}

fn num(meta: &serde_json::Map<String, Value>, key: &str) -> Result<u64> {
    meta.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| bad(format!("tensor field `{key}` is missing or not a count")))
}

impl<R: ReadAt> LegacyArchive<R> {
    /// Parses the zip directory and `metadata.json`.
    pub fn open(source: R) -> Result<Self> {
        let len = source.size();
        if len < 22 {
            return Err(bad("file too short for a zip archive"));
        }
        let tail_len = len.min(22 + 65535) as usize;
        let mut tail = vec![0u8; tail_len];
        source.read_exact_at(len - tail_len as u64, &mut tail)?;
        let eocd = (0..=tail_len - 22)
            .rev()
            .find(|&i| u32_at(&tail, i) == 0x0605_4b50)
            .ok_or_else(|| bad("no zip end-of-directory record"))?;
        let e = &tail[eocd..];
        let count = u16_at(e, 10) as usize;
        let (cd_size, cd_off) = (u32_at(e, 12) as u64, u32_at(e, 16) as u64);
        if count == 0xFFFF || cd_off == 0xFFFF_FFFF {
            return Err(bad("zip64 archives are not supported"));
        }
        if count > MAX_LEGACY_ENTRIES {
            return Err(HwzError::LimitExceeded {
                what: "legacy zip entries",
                value: count as u64,
                max: MAX_LEGACY_ENTRIES as u64,
            });
        }
        if cd_off.checked_add(cd_size).is_none_or(|end| end > len) {
            return Err(bad("zip central directory lies outside the file"));
        }
        let mut cd = vec![0u8; cd_size as usize];
        source.read_exact_at(cd_off, &mut cd)?;
        let mut entries = BTreeMap::new();
        let mut p = 0usize;
        for _ in 0..count {
            let h = cd
                .get(p..p + 46)
                .ok_or_else(|| bad("truncated zip central directory"))?;
            if u32_at(h, 0) != 0x0201_4b50 {
                return Err(bad("bad zip central directory entry"));
            }
            let (n, x, c) = (
                u16_at(h, 28) as usize,
                u16_at(h, 30) as usize,
                u16_at(h, 32) as usize,
            );
            let name = cd
                .get(p + 46..p + 46 + n)
                .ok_or_else(|| bad("truncated zip entry name"))?;
            let entry = Entry {
                method: u16_at(h, 10),
                crc: u32_at(h, 16),
                compressed: u32_at(h, 20) as u64,
                size: u32_at(h, 24) as u64,
                local: u32_at(h, 42) as u64,
            };
            entries.insert(String::from_utf8_lossy(name).into_owned(), entry);
            p += 46 + n + x + c;
        }
        let mut archive = LegacyArchive {
            source,
            entries,
            metadata: Value::Null,
            tensors: vec![],
            streams: BTreeMap::new(),
            decoded: Decoded::default(),
        };
        if !archive.entries.contains_key("metadata.json") {
            // Any other zip (a PyTorch checkpoint is one): say what it is not.
            let torch = archive.entries.keys().any(|k| k.ends_with("data.pkl"));
            return Err(bad(if torch {
                "a zip without metadata.json: a PyTorch checkpoint (torch.save), not an archive; compress it first"
                    .to_string()
            } else {
                "a zip without metadata.json: not a .hwz archive (nor a legacy one)".to_string()
            }));
        }
        let meta_bytes = archive.entry("metadata.json", MAX_LEGACY_METADATA)?;
        archive.metadata =
            serde_json::from_slice(&meta_bytes).map_err(|e| bad(format!("metadata.json: {e}")))?;
        archive.parse_metadata()?;
        Ok(archive)
    }

    fn parse_metadata(&mut self) -> Result<()> {
        let file_len = self.source.size();
        let m = self
            .metadata
            .as_object()
            .ok_or_else(|| bad("metadata.json is not an object"))?;
        if let Some(streams) = m.get("streams").and_then(Value::as_object) {
            for (name, s) in streams {
                let field = |k: &str| {
                    s.get(k)
                        .and_then(Value::as_u64)
                        .ok_or_else(|| bad(format!("stream `{name}` lacks `{k}`")))
                };
                self.streams.insert(
                    name.clone(),
                    LegacyStream {
                        file: s
                            .get("file")
                            .and_then(Value::as_str)
                            .ok_or_else(|| bad(format!("stream `{name}` lacks `file`")))?
                            .into(),
                        compression: s
                            .get("compression")
                            .and_then(Value::as_str)
                            .unwrap_or("raw")
                            .into(),
                        raw_bytes: field("raw_bytes")?,
                        stored_bytes: field("stored_bytes")?,
                    },
                );
            }
        }
        let tensors = m
            .get("tensors")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("metadata.json lacks `tensors`"))?;
        if tensors.len() > crate::MAX_TENSORS {
            return Err(HwzError::LimitExceeded {
                what: "tensors",
                value: tensors.len() as u64,
                max: crate::MAX_TENSORS as u64,
            });
        }
        for t in tensors {
            let meta = t
                .as_object()
                .ok_or_else(|| bad("a tensor entry is not an object"))?
                .clone();
            let name = meta
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a tensor has no name"))?
                .to_string();
            let shape: Vec<u64> = meta
                .get("shape")
                .and_then(Value::as_array)
                .ok_or_else(|| bad(format!("tensor `{name}` has no shape")))?
                .iter()
                .map(|d| {
                    d.as_u64()
                        .ok_or_else(|| bad(format!("tensor `{name}` has a bad dimension")))
                })
                .collect::<Result<_>>()?;
            if shape.len() > MAX_RANK {
                return Err(HwzError::LimitExceeded {
                    what: "tensor rank",
                    value: shape.len() as u64,
                    max: MAX_RANK as u64,
                });
            }
            if shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .is_none_or(|n| n > MAX_ELEMENTS)
            {
                return Err(HwzError::ShapeOverflow {
                    tensor: name,
                    shape,
                    max: MAX_ELEMENTS,
                });
            }
            // Every value is justified by the file before anything is decoded.
            let numel = shape.iter().product::<u64>();
            let max_values = file_len.saturating_mul(MAX_LEGACY_VALUES_PER_FILE_BYTE);
            if numel > max_values {
                return Err(limit(&name, "values", numel, max_values));
            }
            let codec = meta
                .get("codec")
                .and_then(Value::as_str)
                .unwrap_or("packed_int4")
                .to_string();
            let payload_bytes = meta
                .iter()
                .filter(|(k, _)| {
                    k.ends_with("_length")
                        && *k != "prototype_value_length"
                        && *k != "prototype_scale_length"
                })
                .filter_map(|(_, v)| v.as_u64())
                .try_fold(0u64, u64::checked_add);
            // Lengths the file cannot hold (their sum past what its bytes decode to, or past
            // u64) are refused here rather than wrapped.
            let budget = expansion_budget(file_len);
            let payload_bytes = match payload_bytes {
                Some(n) if n <= budget => n,
                n => return Err(limit(&name, "payload bytes", n.unwrap_or(u64::MAX), budget)),
            };
            self.tensors.push(LegacyTensor {
                name,
                shape,
                codec,
                payload_bytes,
                meta,
            });
        }
        Ok(())
    }

    /// Reads and inflates a zip entry of at most `max` bytes, and at most its expansion budget
    /// ([`MAX_LEGACY_EXPANSION`] times its bytes in the file), checking its CRC-32.
    fn entry(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| bad(format!("zip entry `{name}` is missing")))?;
        let len = self.source.size();
        let mut local = [0u8; 30];
        if e.local.checked_add(30).is_none_or(|end| end > len) {
            return Err(bad(format!("zip entry `{name}` lies outside the file")));
        }
        self.source.read_exact_at(e.local, &mut local)?;
        if u32_at(&local, 0) != 0x0403_4b50 {
            return Err(bad(format!("zip entry `{name}` has a bad local header")));
        }
        let start = e.local + 30 + u16_at(&local, 26) as u64 + u16_at(&local, 28) as u64;
        if start.checked_add(e.compressed).is_none_or(|end| end > len) {
            return Err(bad(format!("zip entry `{name}` lies outside the file")));
        }
        let cap = max.min(expansion_budget(e.compressed));
        if e.size > cap {
            return Err(limit(name, "inflated bytes", e.size, cap));
        }
        // Both fit the file (checked above) or the cap.
        let mut data = vec![0u8; to_usize(e.compressed, "zip entry size")?];
        self.source.read_exact_at(start, &mut data)?;
        let out = match e.method {
            0 => data,
            8 => miniz_oxide::inflate::decompress_to_vec_with_limit(
                &data,
                to_usize(e.size, "zip entry size")?,
            )
            // The error holds everything inflated so far: name its status and size only.
            .map_err(|err| {
                bad(format!(
                    "zip entry `{name}` does not inflate ({:?} after {} bytes)",
                    err.status,
                    err.output.len()
                ))
            })?,
            m => {
                return Err(bad(format!(
                "zip entry `{name}` uses compression method {m}; only stored and deflate are read"
            )))
            }
        };
        if out.len() as u64 != e.size || crc32(&out) != e.crc {
            return Err(bad(format!(
                "zip entry `{name}` is corrupt (size or CRC-32 mismatch)"
            )));
        }
        Ok(out)
    }

    /// A stream's bytes after zstd: at most [`MAX_LEGACY_EXPANSION`] times the bytes its zip
    /// entry occupies in the file (or [`MIN_LEGACY_BUDGET`]), deflate and zstd together.
    pub fn stream(&self, name: &str) -> Result<Vec<u8>> {
        let s = self
            .streams
            .get(name)
            .ok_or_else(|| bad(format!("stream `{name}` is not listed in metadata.json")))?;
        let e = self
            .entries
            .get(&s.file)
            .ok_or_else(|| bad(format!("zip entry `{}` is missing", s.file)))?;
        let budget = expansion_budget(e.compressed);
        // Checked before inflating: the frame may not decode past the entry's budget.
        if s.compression == "zstd" && s.raw_bytes > budget {
            return Err(limit(name, "decoded bytes", s.raw_bytes, budget));
        }
        let stored = self.entry(&s.file, budget)?;
        match s.compression.as_str() {
            "raw" => Ok(stored),
            "zstd" => crate::zstd_codec::decompress(&stored, s.raw_bytes)
                .map_err(|m| bad(format!("stream `{name}`: {m}"))),
            other => Err(bad(format!(
                "stream `{name}` uses unknown compression `{other}`"
            ))),
        }
    }

    /// [`LegacyArchive::stream`], inflated once for every tensor that reads it.
    fn shared_stream(&self, name: &str) -> Result<Arc<Vec<u8>>> {
        let cached = self
            .decoded
            .0
            .lock()
            .ok()
            .and_then(|m| m.get(name).cloned());
        if let Some(s) = cached {
            return Ok(s);
        }
        let s = Arc::new(self.stream(name)?);
        if let Ok(mut m) = self.decoded.0.lock() {
            m.insert(name.to_string(), Arc::clone(&s));
        }
        Ok(s)
    }

    /// `metadata.json` as parsed.
    pub fn metadata(&self) -> &Value {
        &self.metadata
    }

    /// The tensors.
    pub fn tensors(&self) -> &[LegacyTensor] {
        &self.tensors
    }

    /// The streams listed in the metadata.
    pub fn streams(&self) -> &BTreeMap<String, LegacyStream> {
        &self.streams
    }

    /// Decodes tensor `name` to `f32`, as hyperglyph-codec 0.7.0 does.
    pub fn decode_tensor(&self, name: &str) -> Result<Vec<f32>> {
        let t = self
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| HwzError::TensorNotFound { name: name.into() })?;
        decode(self, t)
    }
}

/// A slice `[offset, offset + length)` of a stream, from tensor fields.
fn slice<'a>(
    stream: &'a [u8],
    meta: &serde_json::Map<String, Value>,
    off: &str,
    len: &str,
) -> Result<&'a [u8]> {
    let (o, l) = (num(meta, off)?, num(meta, len)?);
    let end = o.saturating_add(l);
    usize::try_from(o)
        .ok()
        .zip(usize::try_from(end).ok())
        .and_then(|(o, end)| stream.get(o..end))
        .ok_or_else(|| bad(format!("`{off}`/`{len}` lie outside their stream")))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn floats(b: &[u8], dtype: &str) -> Vec<f32> {
    if dtype == "float16" {
        b.chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect()
    } else {
        f32s(b)
    }
}

fn varints(b: &[u8]) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    let (mut cur, mut shift) = (0u64, 0u32);
    for &byte in b {
        if shift > 63 {
            return Err(bad("varint too long"));
        }
        cur |= ((byte & 0x7F) as u64) << shift;
        if byte & 0x80 != 0 {
            shift += 7;
            continue;
        }
        out.push(cur);
        cur = 0;
        shift = 0;
    }
    if shift != 0 {
        return Err(bad("truncated varint stream"));
    }
    Ok(out)
}

fn decode<R: ReadAt>(a: &LegacyArchive<R>, t: &LegacyTensor) -> Result<Vec<f32>> {
    // At most MAX_LEGACY_VALUES_PER_FILE_BYTE per byte of the file (checked at open).
    let n = to_usize(t.numel(), "element count")?;
    let m = &t.meta;
    let codec = t.codec.as_str();
    let dtype = m
        .get("scale_dtype")
        .and_then(Value::as_str)
        .unwrap_or("float32");
    // Every codec's main payload is at least 1/8 byte per value: justify the output first.
    let mut out = if codec == "sparse" {
        let count = num(m, "count")?;
        let idx = a.shared_stream("sparse_indices")?;
        let val = a.shared_stream("sparse_values")?;
        let idx = slice(&idx, m, "sparse_index_offset", "sparse_index_length")?;
        let val = slice(&val, m, "sparse_value_offset", "sparse_value_length")?;
        if count.checked_mul(4) != Some(idx.len() as u64)
            || count.checked_mul(2) != Some(val.len() as u64)
            || t.numel() > (idx.len() as u64).saturating_mul(MAX_ZSTD_EXPANSION) + 64
        {
            return Err(bad(format!(
                "sparse tensor `{}` has inconsistent sizes",
                t.name
            )));
        }
        let mut out = vec![0f32; n];
        for (i, v) in idx.chunks_exact(4).zip(val.chunks_exact(2)) {
            let i = u32_at(i, 0) as usize;
            *out.get_mut(i)
                .ok_or_else(|| bad("sparse index out of range"))? =
                f16::from_le_bytes([v[0], v[1]]).to_f32();
        }
        out
    } else if codec == "raw_int8" {
        let raw = a.shared_stream("raw_values")?;
        let values = slice(&raw, m, "raw_offset", "raw_length")?;
        let scales = a.shared_stream("scales")?;
        let p = f32s(slice(&scales, m, "scale_offset", "scale_length")?);
        if values.len() != n || p.len() < 2 {
            return Err(bad(format!(
                "raw_int8 tensor `{}` has inconsistent sizes",
                t.name
            )));
        }
        values.iter().map(|&q| q as f32 * p[0] + p[1]).collect()
    } else if codec.starts_with("low_rank") {
        let lr = a.shared_stream("low_rank")?;
        let scales = a.shared_stream("scales")?;
        let p = f32s(slice(&scales, m, "scale_offset", "scale_length")?);
        let dims = |k: &str| -> Result<(usize, usize)> {
            let v = m
                .get(k)
                .and_then(Value::as_array)
                .ok_or_else(|| bad(format!("`{k}` missing")))?;
            match (
                v.first().and_then(Value::as_u64),
                v.get(1).and_then(Value::as_u64),
            ) {
                (Some(a), Some(b)) => Ok((to_usize(a, k)?, to_usize(b, k)?)),
                _ => Err(bad(format!("`{k}` is not a 2-D shape"))),
            }
        };
        let ((r, k), (k2, c)) = (dims("u_shape")?, dims("v_shape")?);
        // The rule: u is r x k and v is k x c int8 values, both in the stream; r, k, c >= 1
        // (so r and c are each justified by factor bytes), 1 <= k <= min(r, c, MAX_LEGACY_LOW_RANK)
        // and r * c is the shape's element count, itself at most
        // MAX_LEGACY_VALUES_PER_FILE_BYTE per byte of the file.
        if k as u64 > MAX_LEGACY_LOW_RANK {
            return Err(limit(
                &t.name,
                "low-rank rank",
                k as u64,
                MAX_LEGACY_LOW_RANK,
            ));
        }
        let u = slice(&lr, m, "u_offset", "u_length")?;
        let v = slice(&lr, m, "v_offset", "v_length")?;
        if k != k2
            || k == 0
            || k > r.min(c)
            || r.checked_mul(k) != Some(u.len())
            || k.checked_mul(c) != Some(v.len())
            || r.checked_mul(c) != Some(n)
            || p.len() < 4
        {
            return Err(bad(format!(
                "low-rank tensor `{}` has inconsistent sizes (u {r}x{k}, v {k2}x{c}, {} and {} bytes, {n} values)",
                t.name,
                u.len(),
                v.len()
            )));
        }
        let left: Vec<f32> = u.iter().map(|&q| q as f32 * p[0] + p[1]).collect();
        let right: Vec<f32> = v.iter().map(|&q| q as f32 * p[2] + p[3]).collect();
        let mut out = vec![0f32; n];
        for i in 0..r {
            for (kk, &l) in left[i * k..(i + 1) * k].iter().enumerate() {
                for (o, &rv) in out[i * c..(i + 1) * c]
                    .iter_mut()
                    .zip(&right[kk * c..(kk + 1) * c])
                {
                    *o += l * rv;
                }
            }
        }
        out
    } else if codec.starts_with("codebook") {
        decode_codebook(a, t, dtype)?
    } else {
        // packed_int4 and Hyper Glyph's fallback: affine uint, LSB-first, per tensor or channel.
        let bits = m.get("bits").and_then(Value::as_u64).unwrap_or(4);
        let bits = u8::try_from(bits)
            .map_err(|_| bad(format!("tensor `{}` has {bits}-bit codes", t.name)))?;
        let stream = m
            .get("value_stream")
            .and_then(Value::as_str)
            .unwrap_or("assignments");
        let raw = a.shared_stream(stream)?;
        let values = slice(&raw, m, "value_offset", "value_length")?;
        let scales_s = a.shared_stream("scales")?;
        let zeros_s = a.shared_stream("zero_points")?;
        let scales = floats(slice(&scales_s, m, "scale_offset", "scale_length")?, dtype);
        let zeros = floats(slice(&zeros_s, m, "zero_offset", "zero_length")?, dtype);
        let codes = hypercodec_scalar::unpack_bits(values, bits, n)
            .map_err(|e| bad(format!("tensor `{}`: {e}", t.name)))?;
        let per_channel = m.get("axis").and_then(Value::as_u64) == Some(0) && t.shape.len() >= 2;
        let channels = if per_channel {
            to_usize(t.shape[0], "channel count")?
        } else {
            1
        };
        if scales.len() != channels || zeros.len() != channels {
            return Err(bad(format!(
                "tensor `{}` has {} scales for {channels} channels",
                t.name,
                scales.len()
            )));
        }
        let inner = n / channels.max(1);
        codes
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let ch = if per_channel { i / inner.max(1) } else { 0 };
                q as f32 * scales[ch] + zeros[ch]
            })
            .collect()
    };
    if m.contains_key("residual_count") {
        let idx_s = a.shared_stream("residual_indices")?;
        let val_s = a.shared_stream("residual_values")?;
        let idx = varints(slice(
            &idx_s,
            m,
            "residual_index_offset",
            "residual_index_length",
        )?)?;
        let val = slice(&val_s, m, "residual_value_offset", "residual_value_length")?;
        let scale = m
            .get("residual_scale")
            .and_then(Value::as_f64)
            .ok_or_else(|| bad("`residual_scale` missing"))? as f32;
        if idx.len() != val.len() {
            return Err(bad(format!(
                "tensor `{}`: {} residual indices for {} values",
                t.name,
                idx.len(),
                val.len()
            )));
        }
        let mut pos = 0u64;
        for (d, &v) in idx.iter().zip(val) {
            pos = pos
                .checked_add(*d)
                .ok_or_else(|| bad("residual index overflows"))?;
            *out.get_mut(pos as usize)
                .ok_or_else(|| bad("residual index out of range"))? += (v as i8) as f32 * scale;
        }
    }
    Ok(out)
}

fn decode_codebook<R: ReadAt>(
    a: &LegacyArchive<R>,
    t: &LegacyTensor,
    dtype: &str,
) -> Result<Vec<f32>> {
    let m = &t.meta;
    // At most MAX_LEGACY_VALUES_PER_FILE_BYTE per byte of the file (checked at open).
    let n = to_usize(t.numel(), "element count")?;
    // Prototypes: the archive's global codebook, or (auto mode) the tensor's own fields.
    let global = a.metadata.get("codebook").and_then(Value::as_object);
    let cb = global.unwrap_or(m);
    let get = |keys: &[&str]| keys.iter().find_map(|k| cb.get(*k).and_then(Value::as_u64));
    let shape = cb
        .get("prototype_shape")
        .or_else(|| cb.get("shape"))
        .and_then(Value::as_array)
        .ok_or_else(|| bad("codebook prototype shape missing"))?;
    let (protos, block) = match (
        shape.first().and_then(Value::as_u64),
        shape.get(1).and_then(Value::as_u64),
    ) {
        (Some(p), Some(b)) if p > 0 && b > 0 => (p, b),
        _ => return Err(bad("codebook prototype shape is invalid")),
    };
    if protos > MAX_LEGACY_PROTOTYPES {
        return Err(limit(
            &t.name,
            "codebook prototypes",
            protos,
            MAX_LEGACY_PROTOTYPES,
        ));
    }
    if block > MAX_LEGACY_BLOCK {
        return Err(limit(
            &t.name,
            "codebook block size",
            block,
            MAX_LEGACY_BLOCK,
        ));
    }
    // Both at most 2^20 and 2^12: they and their product fit a usize, even on wasm32.
    let (protos, block) = (protos as usize, block as usize);
    let value_start = get(&["value_offset", "prototype_offset"]).unwrap_or(0);
    let value_len = get(&["value_length", "prototype_value_length"]).unwrap_or(0);
    let value_end = value_start
        .checked_add(value_len)
        .ok_or_else(|| bad("prototype values outside their stream"))?;
    let base = if global.is_some() { 0 } else { value_start };
    let scale_start = match get(&["prototype_scale_offset", "scale_offset"]) {
        Some(s) => base
            .checked_add(s)
            .ok_or_else(|| bad("prototype scales outside their stream"))?,
        None => value_end,
    };
    let pstream = a.shared_stream("prototypes")?;
    let pv = usize::try_from(value_start)
        .ok()
        .zip(usize::try_from(value_end).ok())
        .and_then(|(s, e)| pstream.get(s..e))
        .ok_or_else(|| bad("prototype values outside their stream"))?;
    let ps = f32s(
        usize::try_from(scale_start)
            .ok()
            .and_then(|s| pstream.get(s..))
            .ok_or_else(|| bad("prototype scales outside their stream"))?,
    );
    // The prototypes' int8 values justify `protos` and `block`.
    if pv.len() != protos * block || ps.len() < protos {
        return Err(bad("codebook prototypes have inconsistent sizes"));
    }
    let proto = |p: usize, j: usize| (pv[p * block + j] as i8) as f32 * ps[p];
    let count = num(m, "assignment_count")?;
    let blocks = num(m, "block_count")?;
    let group = m
        .get("assignment_group_size")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .max(1);
    // The rule: every block holds at least one of the tensor's values and every assignment
    // covers at least one block, so count <= blocks <= n, and n itself is bounded by the
    // file. The blocks cover the tensor and the assignments cover the blocks.
    if count > blocks {
        return Err(limit(&t.name, "codebook assignments", count, blocks));
    }
    if blocks > n as u64 {
        return Err(limit(&t.name, "codebook blocks", blocks, n as u64));
    }
    if blocks
        .checked_mul(block as u64)
        .is_none_or(|total| total < n as u64)
        || blocks > count.saturating_mul(group)
    {
        return Err(bad(format!(
            "codebook tensor `{}` has inconsistent sizes ({count} assignments, {blocks} blocks of {block}, {n} values)",
            t.name
        )));
    }
    // Both at most n, which fits a usize.
    let (count, blocks, group) = (count as usize, blocks as usize, to_usize(group, "group")?);
    let astream = a.shared_stream("assignments")?;
    let payload = slice(&astream, m, "assignment_offset", "assignment_length")?;
    let assignments: Vec<u64> = match m
        .get("assignment_encoding")
        .and_then(Value::as_str)
        .unwrap_or("uint8")
    {
        "rle" => {
            let pairs = varints(payload)?;
            if pairs.len() % 2 != 0 {
                return Err(bad("invalid run-length assignment stream"));
            }
            // Runs stop at `count`, which the blocks, hence the file, justify.
            let mut v = Vec::with_capacity(count);
            for pair in pairs.chunks_exact(2) {
                let run = usize::try_from(pair[0])
                    .unwrap_or(usize::MAX)
                    .min(count - v.len());
                v.extend(std::iter::repeat_n(pair[1], run));
            }
            v
        }
        "uint4" => hypercodec_scalar::unpack_bits(payload, 4, count)
            .map_err(|e| bad(e.to_string()))?
            .into_iter()
            .map(u64::from)
            .collect(),
        "uint16" => payload
            .chunks_exact(2)
            .map(|c| u16_at(c, 0) as u64)
            .collect(),
        "uint32" => payload
            .chunks_exact(4)
            .map(|c| u32_at(c, 0) as u64)
            .collect(),
        _ => payload.iter().map(|&b| b as u64).collect(),
    };
    if assignments.len() < count {
        return Err(bad(format!(
            "codebook tensor `{}` has {} assignments, {count} expected",
            t.name,
            assignments.len()
        )));
    }
    let sstream = a.shared_stream("scales")?;
    let scales = floats(slice(&sstream, m, "scale_offset", "scale_length")?, dtype);
    if scales.len() < blocks {
        return Err(bad(format!(
            "codebook tensor `{}` has {} scales for {blocks} blocks",
            t.name,
            scales.len()
        )));
    }
    let mut out = Vec::with_capacity(n);
    for (b, &s) in scales.iter().enumerate().take(blocks) {
        let p = usize::try_from(assignments[b / group]).unwrap_or(usize::MAX);
        if p >= protos {
            return Err(bad("codebook assignment out of range"));
        }
        // The last block may be cut short by the end of the tensor.
        for j in 0..block.min(n - out.len()) {
            out.push(proto(p, j) * s);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A file in memory that counts the bytes read from it.
    struct Counted {
        bytes: Vec<u8>,
        read: AtomicU64,
    }

    impl ReadAt for Counted {
        fn size(&self) -> u64 {
            self.bytes.len() as u64
        }
        fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.read.fetch_add(buf.len() as u64, Ordering::Relaxed);
            let at = offset as usize;
            let src = self.bytes.get(at..at + buf.len()).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "past the end")
            })?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }

    /// A zip of `files`, stored (method 0).
    fn zip(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let (mut out, mut central) = (Vec::new(), Vec::new());
        for (name, data) in files {
            let local = out.len() as u32;
            let (crc, len, n) = (crc32(data), data.len() as u32, name.len() as u16);
            out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
            out.extend_from_slice(&[0; 4]); // version, flags
            out.extend_from_slice(&[0; 2]); // method: stored
            out.extend_from_slice(&[0; 4]); // time, date
            for v in [crc, len, len] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(&[0; 2]);
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(data);
            central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
            central.extend_from_slice(&[0; 6]); // versions, flags
            central.extend_from_slice(&[0; 2]); // method: stored
            central.extend_from_slice(&[0; 4]);
            for v in [crc, len, len] {
                central.extend_from_slice(&v.to_le_bytes());
            }
            central.extend_from_slice(&n.to_le_bytes());
            central.extend_from_slice(&[0; 12]); // extra, comment, disk, attributes
            central.extend_from_slice(&local.to_le_bytes());
            central.extend_from_slice(name.as_bytes());
        }
        let (cd_off, cd_size) = (out.len() as u32, central.len() as u32);
        out.extend_from_slice(&central);
        out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        let count = (files.len() as u16).to_le_bytes();
        out.extend_from_slice(&count);
        out.extend_from_slice(&count);
        out.extend_from_slice(&cd_size.to_le_bytes());
        out.extend_from_slice(&cd_off.to_le_bytes());
        out.extend_from_slice(&[0; 2]);
        out
    }

    #[test]
    fn tensors_over_one_shared_stream_read_it_once() {
        // 300 INT4 tensors, each slicing the start of one 64 KiB stream: each inflated that
        // stream again (a 20 KB deflated file of 4000 such tensors over 8 MB took minutes).
        let stream = |file: &str, bytes: usize| serde_json::json!({"file": file, "compression": "raw", "raw_bytes": bytes, "stored_bytes": bytes});
        let tensors: Vec<Value> = (0..300)
            .map(|i| {
                serde_json::json!({"name": format!("t{i}"), "shape": [2, 2], "codec": "packed_int4",
                    "bits": 4, "value_offset": 0, "value_length": 2, "scale_offset": 0,
                    "scale_length": 4, "zero_offset": 0, "zero_length": 4})
            })
            .collect();
        let meta = serde_json::json!({"format_version": "0.5", "tensors": tensors, "streams": {
            "assignments": stream("assignments.bin", 65536),
            "scales": stream("scales.bin", 16),
            "zero_points": stream("zero_points.bin", 16)}});
        let mut codes = vec![0u8; 65536];
        codes[..2].copy_from_slice(&[0x21, 0x43]); // codes 1, 2, 3, 4
        let bytes = zip(&[
            ("metadata.json", meta.to_string().into_bytes()),
            ("assignments.bin", codes),
            ("scales.bin", 0.5f32.to_le_bytes().repeat(4)),
            ("zero_points.bin", 0f32.to_le_bytes().repeat(4)),
        ]);
        let len = bytes.len() as u64;
        let a = LegacyArchive::open(Counted {
            bytes,
            read: AtomicU64::new(0),
        })
        .unwrap();
        let first = a.decode_tensor("t0").unwrap();
        assert_eq!(first.len(), 4);
        for i in 1..300 {
            assert_eq!(a.decode_tensor(&format!("t{i}")).unwrap(), first);
        }
        let read = a.source.read.load(Ordering::Relaxed);
        assert!(read < 2 * len, "{read} bytes read from a {len}-byte file");
    }
}
