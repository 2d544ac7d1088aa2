//! The manifest (UTF-8 JSON), the fixed head and tail, and their validation.

use crate::encoding::{element_count, Encoding, KNOWN_ENCODINGS};
use crate::layout::check_roles;
use crate::{HwzError, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};

/// The magic at the head and the tail of every version-1 archive.
pub const MAGIC: [u8; 4] = *b"HWZ1";
/// The first bytes of a zip file: a legacy (Hyper Glyph) archive.
pub const ZIP_MAGIC: [u8; 4] = *b"PK\x03\x04";
/// The format version this crate writes for archives whose tensors all have rank ≤ 2.
pub const FORMAT_VERSION: u32 = 1;
/// The format version written when an archive holds a tensor of rank ≥ 3: version 1 plus one
/// rule, such tensors are coded as the matrix `[shape[0], prod(shape[1..])]`
/// ([`crate::matrix_view`]). Readers of this crate read both; older readers refuse version 2
/// instead of decoding it under the old view.
pub const MATRIX_VIEW_VERSION: u32 = 2;
/// Every stream starts on a multiple of this (cache lines, GPU loads, mmap zero-copy).
pub const ALIGN: u64 = 64;
/// Bytes before the first stream: magic, flags, zero padding to [`ALIGN`].
pub const HEADER_LEN: u64 = ALIGN;
/// Bytes of the tail: manifest offset (u64), length (u64), crc32c (u32), magic.
pub const TAIL_LEN: u64 = 24;

/// Largest manifest accepted. A tensor entry takes ~300 bytes of JSON, so 64 MiB holds over
/// 200 000 tensors — ten times the largest checkpoints published — while bounding what a
/// hostile tail can make a reader allocate.
pub const MAX_MANIFEST_LEN: u64 = 64 << 20;

/// Largest ratio of a compressed manifest's JSON to its stored frame (plus 1 MiB): real
/// manifests compress about 10× (stream checksums and offsets do not compress), so a small
/// file cannot make a reader inflate and parse a huge one. A writer whose manifest would
/// compress further stores it as plain JSON.
pub const MAX_MANIFEST_RATIO: u64 = 16;

/// The most JSON bytes a compressed manifest of `stored` bytes may hold.
pub(crate) fn max_inflated_manifest(stored: u64) -> u64 {
    MAX_MANIFEST_LEN.min(stored.saturating_mul(MAX_MANIFEST_RATIO) + (1 << 20))
}
/// Most tensors in one archive (a sharded model splits further).
pub const MAX_TENSORS: usize = 1 << 20;
/// Most streams in one archive: a few per tensor.
pub const MAX_STREAMS: usize = 1 << 22;
/// Longest tensor name in bytes.
pub const MAX_NAME_LEN: usize = 1024;
/// Longest source dtype label in bytes.
pub const MAX_DTYPE_LEN: usize = 32;
/// Largest decoded/stored ratio of a zstd stream. Writers store a stream uncompressed rather
/// than exceed it, so a reader never allocates more than 256 times the bytes a file holds.
pub const MAX_ZSTD_EXPANSION: u64 = 256;

/// Most values a tensor may hold per stored byte (all its streams, as stored): at least 1/8 bit
/// per value is stored, so decoding never allocates more than 256 bytes of `f32` output per
/// byte of the file — the same bound as [`MAX_ZSTD_EXPANSION`]. Writers store a tensor's
/// streams uncompressed when compression would take it below (only constant tensors get there).
pub const MAX_VALUES_PER_STORED_BYTE: u64 = 64;

/// The fewest stored bytes a tensor of `numel` values may have.
pub fn min_stored_bytes(numel: u64) -> u64 {
    numel.div_ceil(MAX_VALUES_PER_STORED_BYTE)
}

/// Element count of a shape, saturating (for shapes already checked by `element_count`).
pub(crate) fn tensor_numel(shape: &[u64]) -> u64 {
    shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
}

/// Compression of one stream inside the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Stored as is.
    #[default]
    None,
    /// One zstd frame.
    Zstd,
}

impl Compression {
    /// The manifest name.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zstd => "zstd",
        }
    }
}

/// Where one stream lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamEntry {
    /// Absolute byte offset in the file; a multiple of [`ALIGN`].
    pub offset: u64,
    /// Stored bytes.
    pub length: u64,
    /// CRC-32C (Castagnoli) of the stored bytes.
    pub crc32c: u32,
    /// Container-level compression.
    #[serde(default)]
    pub compression: Compression,
    /// Bytes after decompression (equal to `length` when uncompressed).
    pub raw_length: u64,
}

/// Reconstruction error measured when the tensor was written. Absent fields were not measured
/// (or are infinite, like the SNR of an exact encoding).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct TensorStats {
    /// Mean squared error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mse: Option<f64>,
    /// `10·log10(Σx² / Σ(x−x̂)²)`; absent when the error is zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snr_db: Option<f64>,
    /// Largest absolute error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_abs_err: Option<f64>,
    /// Cosine similarity of the flattened tensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cosine: Option<f64>,
}

/// One tensor of the archive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// Unique name (UTF-8, 1..=[`MAX_NAME_LEN`] bytes).
    pub name: String,
    /// Dimensions, outermost first; the last is the input dimension.
    pub shape: Vec<u64>,
    /// The tensor's type in the source file (`f32`, `bf16`, `q4_1`, ...), informative.
    pub source_dtype: String,
    /// How it is stored.
    pub encoding: Encoding,
    /// Stream index by role.
    pub streams: BTreeMap<String, u64>,
    /// Error measured at write time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<TensorStats>,
}

impl TensorEntry {
    /// Number of elements (validated at parse time).
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// The archive's table of contents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"hwz"`.
    pub format: String,
    /// Format version, [`FORMAT_VERSION`].
    pub version: u32,
    /// Who wrote the archive, e.g. `hypercodec 0.1.0`.
    #[serde(default)]
    pub generator: String,
    /// The tensors, in write order.
    pub tensors: Vec<TensorEntry>,
    /// The streams, in file order.
    pub streams: Vec<StreamEntry>,
    /// The Plan that chose the encodings, if a planner made one (small plans inline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Value>,
    /// The index of a stream that holds the Plan as UTF-8 JSON (a large plan, so that it is
    /// zstd-compressed like any stream); no tensor refers to it. Read with
    /// [`crate::Archive::plan`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_stream: Option<u64>,
    /// Free user metadata (a model's config.json, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, Value>,
}

/// The parsed tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    /// Offset of the manifest.
    pub manifest_offset: u64,
    /// Length of the manifest.
    pub manifest_len: u64,
    /// CRC-32C of the manifest bytes.
    pub manifest_crc32c: u32,
}

/// What the first four bytes of a file say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniff {
    /// A version-1 archive.
    Hwz1,
    /// A zip file: a legacy Hyper Glyph archive.
    LegacyZip,
    /// Something else.
    Unknown,
}

/// Tells a `.hwz` v1 archive from a legacy zip one by its first bytes.
pub fn sniff(head: &[u8]) -> Sniff {
    match head.get(..4) {
        Some(m) if m == MAGIC => Sniff::Hwz1,
        Some(m) if m == ZIP_MAGIC => Sniff::LegacyZip,
        _ => Sniff::Unknown,
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Checks the first 8 bytes: magic and flags.
pub fn parse_head(head: &[u8]) -> Result<()> {
    let file_len = head.len() as u64;
    if head.len() < 8 {
        return Err(HwzError::TooShort {
            len: file_len,
            min: HEADER_LEN + TAIL_LEN,
        });
    }
    match sniff(head) {
        Sniff::Hwz1 => {}
        Sniff::LegacyZip => return Err(HwzError::LegacyArchive),
        Sniff::Unknown => {
            return Err(HwzError::BadMagic {
                found: [head[0], head[1], head[2], head[3]],
                place: "head",
            })
        }
    }
    let flags = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if flags != 0 {
        return Err(HwzError::UnknownFlags { flags });
    }
    Ok(())
}

impl Tail {
    /// Parses the last [`TAIL_LEN`] bytes of a file of `file_len` bytes and checks that the
    /// manifest lies between the header and the tail and is within [`MAX_MANIFEST_LEN`].
    pub fn parse(tail: &[u8], file_len: u64) -> Result<Tail> {
        if file_len < HEADER_LEN + TAIL_LEN || tail.len() as u64 != TAIL_LEN {
            return Err(HwzError::TooShort {
                len: file_len,
                min: HEADER_LEN + TAIL_LEN,
            });
        }
        let magic = &tail[20..24];
        if magic != MAGIC {
            return Err(HwzError::BadMagic {
                found: [magic[0], magic[1], magic[2], magic[3]],
                place: "tail",
            });
        }
        let manifest_offset = le_u64(&tail[0..8]);
        let manifest_len = le_u64(&tail[8..16]);
        let manifest_crc32c = u32::from_le_bytes([tail[16], tail[17], tail[18], tail[19]]);
        if manifest_len > MAX_MANIFEST_LEN {
            return Err(HwzError::LimitExceeded {
                what: "manifest length",
                value: manifest_len,
                max: MAX_MANIFEST_LEN,
            });
        }
        let fits = manifest_offset >= HEADER_LEN
            && manifest_offset
                .checked_add(manifest_len)
                .is_some_and(|end| end <= file_len - TAIL_LEN);
        if !fits {
            return Err(HwzError::ManifestOutOfBounds {
                offset: manifest_offset,
                len: manifest_len,
                file_len,
            });
        }
        Ok(Tail {
            manifest_offset,
            manifest_len,
            manifest_crc32c,
        })
    }

    /// Serializes the tail.
    pub fn to_bytes(&self) -> [u8; TAIL_LEN as usize] {
        let mut b = [0u8; TAIL_LEN as usize];
        b[0..8].copy_from_slice(&self.manifest_offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.manifest_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.manifest_crc32c.to_le_bytes());
        b[20..24].copy_from_slice(&MAGIC);
        b
    }
}

fn json_err(e: serde_json::Error) -> HwzError {
    HwzError::ManifestJson {
        message: e.to_string(),
    }
}

impl Manifest {
    /// The shape a tensor's encoding was applied to: its own shape, except that a version-1
    /// archive coded a tensor of rank ≥ 3 under the last-dimension view
    /// ([`crate::legacy_matrix_shape`]). Pass this to [`Encoding::stream_lens`],
    /// [`crate::decode_into`] and [`crate::TensorView::new`].
    pub fn coded_shape(&self, t: &TensorEntry) -> Vec<u64> {
        if self.version < MATRIX_VIEW_VERSION {
            crate::legacy_matrix_shape(&t.shape)
        } else {
            t.shape.clone()
        }
    }

    /// Parses and validates manifest bytes whose checksum is in `tail`: the checksum, the
    /// version, every cap, every encoding, every stream reference, bound and size.
    pub fn parse(bytes: &[u8], tail: &Tail) -> Result<Manifest> {
        let computed = crc32c::crc32c(bytes);
        if computed != tail.manifest_crc32c {
            return Err(HwzError::ManifestChecksum {
                stored: tail.manifest_crc32c,
                computed,
            });
        }
        let inflated;
        let json = if bytes.starts_with(&crate::zstd_codec::FRAME_MAGIC) {
            let max = max_inflated_manifest(bytes.len() as u64);
            inflated = crate::zstd_codec::decompress_bounded(bytes, max).map_err(|e| {
                HwzError::ManifestJson {
                    message: format!("its zstd frame does not decompress: {e}"),
                }
            })?;
            &inflated[..]
        } else {
            bytes
        };
        let value: Value = serde_json::from_slice(json).map_err(json_err)?;
        // Version first, so a newer archive gets a clear message rather than a shape error.
        match value.get("version").and_then(Value::as_u64) {
            Some(v) if (FORMAT_VERSION as u64..=MATRIX_VIEW_VERSION as u64).contains(&v) => {}
            Some(v) => {
                return Err(HwzError::UnsupportedVersion {
                    version: v,
                    known: MATRIX_VIEW_VERSION,
                })
            }
            None => {
                return Err(HwzError::ManifestJson {
                    message: "missing `version`".into(),
                })
            }
        }
        let count = |key: &str| value.get(key).and_then(Value::as_array).map_or(0, Vec::len);
        check_cap("tensors", count("tensors"), MAX_TENSORS)?;
        check_cap("streams", count("streams"), MAX_STREAMS)?;
        if let Some(tensors) = value.get("tensors").and_then(Value::as_array) {
            for t in tensors {
                let name = t
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string();
                let enc = t.get("encoding").ok_or_else(|| HwzError::InvalidEncoding {
                    tensor: name.clone(),
                    message: "missing `encoding`".into(),
                })?;
                let tag = enc.get("type").and_then(Value::as_str).unwrap_or("");
                if !KNOWN_ENCODINGS.contains(&tag) {
                    return Err(HwzError::UnknownEncoding {
                        tensor: name,
                        tag: tag.to_string(),
                    });
                }
                Encoding::deserialize(enc).map_err(|e| HwzError::InvalidEncoding {
                    tensor: name,
                    message: e.to_string(),
                })?;
            }
        }
        let manifest: Manifest = serde_json::from_value(value).map_err(json_err)?;
        if manifest.format != "hwz" {
            return Err(HwzError::ManifestJson {
                message: format!("format is `{}`, not `hwz`", manifest.format),
            });
        }
        manifest.validate(tail.manifest_offset)?;
        Ok(manifest)
    }

    /// Checks every structural rule of the spec against a stream area ending at `streams_end`.
    pub fn validate(&self, streams_end: u64) -> Result<()> {
        check_cap("tensors", self.tensors.len(), MAX_TENSORS)?;
        check_cap("streams", self.streams.len(), MAX_STREAMS)?;
        for (i, s) in self.streams.iter().enumerate() {
            if s.offset % ALIGN != 0 {
                return Err(HwzError::StreamMisaligned {
                    stream: i,
                    offset: s.offset,
                });
            }
            let inside = s.offset >= HEADER_LEN
                && s.offset
                    .checked_add(s.length)
                    .is_some_and(|e| e <= streams_end);
            if !inside {
                return Err(HwzError::StreamOutOfBounds {
                    stream: i,
                    offset: s.offset,
                    length: s.length,
                    end: streams_end,
                });
            }
            let justified = match s.compression {
                Compression::None => s.raw_length == s.length,
                Compression::Zstd => s.raw_length <= s.length.saturating_mul(MAX_ZSTD_EXPANSION),
            };
            if !justified {
                return Err(HwzError::StreamExpansion {
                    stream: i,
                    raw_length: s.raw_length,
                    length: s.length,
                    compression: s.compression.name(),
                });
            }
        }
        // Every pair at once: sorted by offset, each non-empty stream must start at or after
        // the furthest end of the non-empty streams before it (not only its neighbour's: an
        // empty stream between two must not hide an overlap). Empty streams occupy no bytes
        // and overlap nothing.
        let mut order: Vec<usize> = (0..self.streams.len()).collect();
        order.sort_by_key(|&i| (self.streams[i].offset, self.streams[i].length));
        let mut furthest: Option<(usize, u64)> = None;
        for &i in &order {
            let s = &self.streams[i];
            if s.length == 0 {
                continue;
            }
            // In bounds (checked above), so the end does not overflow.
            let end = s.offset + s.length;
            match furthest {
                Some((first, e)) if s.offset < e => {
                    return Err(HwzError::StreamsOverlap { first, second: i });
                }
                Some((_, e)) if e >= end => {}
                _ => furthest = Some((i, end)),
            }
        }
        // Each stream is one role of one tensor: no tensor shares another's stream, and no
        // tensor names one stream for two roles (empty streams included).
        let mut used = vec![false; self.streams.len()];
        if let Some(index) = self.plan_stream {
            let entry = usize::try_from(index)
                .ok()
                .and_then(|i| self.streams.get(i))
                .ok_or_else(|| HwzError::StreamRef {
                    tensor: String::new(),
                    role: "plan".into(),
                    index,
                    count: self.streams.len(),
                })?;
            // A plan is a manifest's worth of JSON at most.
            if entry.raw_length > MAX_MANIFEST_LEN {
                return Err(HwzError::LimitExceeded {
                    what: "plan stream length",
                    value: entry.raw_length,
                    max: MAX_MANIFEST_LEN,
                });
            }
            used[index as usize] = true;
        }
        let mut names = HashSet::with_capacity(self.tensors.len());
        for t in &self.tensors {
            check_name(&t.name)?;
            if !names.insert(t.name.as_str()) {
                return Err(HwzError::InvalidName {
                    name: t.name.clone(),
                    reason: "used by two tensors",
                });
            }
            if t.source_dtype.len() > MAX_DTYPE_LEN {
                return Err(HwzError::LimitExceeded {
                    what: "source dtype length",
                    value: t.source_dtype.len() as u64,
                    max: MAX_DTYPE_LEN as u64,
                });
            }
            element_count(&t.name, &t.shape)?;
            for (role, &index) in &t.streams {
                let Some(seen) = usize::try_from(index).ok().and_then(|i| used.get_mut(i)) else {
                    return Err(HwzError::StreamRef {
                        tensor: t.name.clone(),
                        role: role.clone(),
                        index,
                        count: self.streams.len(),
                    });
                };
                if std::mem::replace(seen, true) {
                    return Err(HwzError::StreamShared {
                        tensor: t.name.clone(),
                        role: role.clone(),
                        index,
                    });
                }
            }
            let lens = t.encoding.stream_lens(&t.name, &self.coded_shape(t))?;
            let present = t
                .streams
                .iter()
                .map(|(r, &i)| (r.as_str(), self.streams[i as usize].raw_length));
            check_roles(&t.name, &lens, present)?;
            let stored: u64 = t
                .streams
                .values()
                .map(|&i| self.streams[i as usize].length)
                .sum();
            let numel = tensor_numel(&t.shape);
            if stored < min_stored_bytes(numel) {
                return Err(HwzError::LimitExceeded {
                    what: "values per stored byte",
                    value: numel / stored.max(1),
                    max: MAX_VALUES_PER_STORED_BYTE,
                });
            }
        }
        Ok(())
    }
}

fn check_cap(what: &'static str, value: usize, max: usize) -> Result<()> {
    if value > max {
        return Err(HwzError::LimitExceeded {
            what,
            value: value as u64,
            max: max as u64,
        });
    }
    Ok(())
}

/// Checks a tensor name: 1..=[`MAX_NAME_LEN`] bytes, no control characters.
pub fn check_name(name: &str) -> Result<()> {
    let cut = || name.chars().take(64).collect::<String>();
    if name.is_empty() {
        return Err(HwzError::InvalidName {
            name: String::new(),
            reason: "empty",
        });
    }
    // (The reason is a static string: it states the limit's value, checked here.)
    const _: () = assert!(MAX_NAME_LEN == 1024);
    if name.len() > MAX_NAME_LEN {
        return Err(HwzError::InvalidName {
            name: cut(),
            reason: "longer than 1024 bytes",
        });
    }
    if name.chars().any(char::is_control) {
        return Err(HwzError::InvalidName {
            name: cut(),
            reason: "contains control characters",
        });
    }
    Ok(())
}
