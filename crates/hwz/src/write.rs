//! The streaming writer: tensor by tensor, bounded memory, manifest and tail at the end.

use crate::encoding::{element_count, EncodedTensor};
use crate::layout::check_roles;
use crate::manifest::{
    check_name, Compression, Manifest, StreamEntry, Tail, TensorEntry, TensorStats, ALIGN,
    FORMAT_VERSION, HEADER_LEN, MAGIC, MATRIX_VIEW_VERSION, MAX_STREAMS, MAX_TENSORS,
    MAX_ZSTD_EXPANSION,
};
use crate::manifest::{min_stored_bytes, tensor_numel};
use crate::{HwzError, Result};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::io::Write;

/// Options of a [`Writer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterOptions {
    /// Container compression to *try* on every stream; a stream is stored compressed only when
    /// that makes it smaller (and within [`MAX_ZSTD_EXPANSION`]). By default, [`Compression::None`].
    pub compression: Compression,
    /// The `generator` string of the manifest. By default, `hypercodec-hwz <version>`.
    pub generator: String,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            compression: Compression::None,
            generator: concat!("hypercodec-hwz ", env!("CARGO_PKG_VERSION")).to_string(),
        }
    }
}

/// Writes a `.hwz` archive to any [`Write`] in one pass.
///
/// Only the current tensor's streams and the (small) manifest entries are held in memory.
/// For files, use [`crate::FileWriter`], which adds the temporary-file-and-rename rule.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
    pos: u64,
    options: WriterOptions,
    tensors: Vec<TensorEntry>,
    streams: Vec<StreamEntry>,
    names: HashSet<String>,
    plan: Option<Value>,
    metadata: BTreeMap<String, Value>,
}

const ZEROS: [u8; ALIGN as usize] = [0; ALIGN as usize];

/// Plans up to this many bytes of JSON stay inline in the manifest; larger ones are written as
/// a zstd-compressed stream when the writer compresses (a BUDGET plan of a few hundred tensors
/// is a few hundred KB of JSON, several times smaller compressed).
pub const PLAN_INLINE_MAX: usize = 4096;

/// Manifests longer than this are stored as a zstd frame when that is smaller.
pub const MANIFEST_COMPRESS_MIN: usize = 4096;

impl<W: Write> Writer<W> {
    /// Starts an archive: writes the header.
    pub fn new(mut out: W, options: WriterOptions) -> Result<Self> {
        out.write_all(&MAGIC)?;
        out.write_all(&0u32.to_le_bytes())?;
        out.write_all(&ZEROS[..(HEADER_LEN - 8) as usize])?;
        Ok(Writer {
            out,
            pos: HEADER_LEN,
            options,
            tensors: Vec::new(),
            streams: Vec::new(),
            names: HashSet::new(),
            plan: None,
            metadata: BTreeMap::new(),
        })
    }

    /// Appends one encoded tensor. Its streams are written at once; nothing of it is kept but
    /// its manifest entry. Returns the bytes they took in the file (after zstd where it pays,
    /// their alignment included).
    pub fn add_tensor(
        &mut self,
        name: &str,
        shape: &[u64],
        source_dtype: &str,
        tensor: &EncodedTensor,
        stats: Option<TensorStats>,
    ) -> Result<u64> {
        let start = self.pos;
        check_name(name)?;
        if self.names.contains(name) {
            return Err(HwzError::InvalidName {
                name: name.to_string(),
                reason: "used by two tensors",
            });
        }
        if self.tensors.len() >= MAX_TENSORS
            || self.streams.len() + tensor.streams.len() > MAX_STREAMS
        {
            return Err(HwzError::LimitExceeded {
                what: "tensors",
                value: self.tensors.len() as u64 + 1,
                max: MAX_TENSORS as u64,
            });
        }
        element_count(name, shape)?;
        let lens = tensor.encoding.stream_lens(name, shape)?;
        check_roles(
            name,
            &lens,
            tensor.streams.iter().map(|(r, b)| (*r, b.len() as u64)),
        )?;
        let candidates = stored_forms(tensor, tensor_numel(shape), self.options.compression)?;
        let mut roles = BTreeMap::new();
        for ((role, raw), z) in tensor.streams.iter().zip(candidates) {
            let index = self.write_stream(raw, z)?;
            roles.insert(role.to_string(), index);
        }
        self.names.insert(name.to_string());
        self.tensors.push(TensorEntry {
            name: name.to_string(),
            shape: shape.to_vec(),
            source_dtype: source_dtype.to_string(),
            encoding: tensor.encoding.clone(),
            streams: roles,
            stats: stats.map(finite_stats),
        });
        Ok(self.pos - start)
    }

    /// The zstd form of a stream, when compression is on and it pays.
    fn try_compress(&self, raw: &[u8], level: i32) -> Option<Vec<u8>> {
        zstd_if_it_pays(raw, self.options.compression, level)
    }

    fn write_stream(&mut self, raw: &[u8], compressed: Option<Vec<u8>>) -> Result<u64> {
        let pad = (ALIGN - self.pos % ALIGN) % ALIGN;
        self.out.write_all(&ZEROS[..pad as usize])?;
        self.pos += pad;
        let (stored, compression) = match &compressed {
            Some(z) => (z.as_slice(), Compression::Zstd),
            None => (raw, Compression::None),
        };
        self.out.write_all(stored)?;
        self.streams.push(StreamEntry {
            offset: self.pos,
            length: stored.len() as u64,
            crc32c: crc32c::crc32c(stored),
            compression,
            raw_length: raw.len() as u64,
        });
        self.pos += stored.len() as u64;
        Ok(self.streams.len() as u64 - 1)
    }

    /// Stores the Plan that chose the encodings.
    pub fn set_plan(&mut self, plan: Value) {
        self.plan = Some(plan);
    }

    /// Adds a free metadata entry (e.g. a model's `config.json`).
    pub fn insert_metadata(&mut self, key: &str, value: Value) {
        self.metadata.insert(key.to_string(), value);
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Writes the manifest and the tail; returns the sink and the manifest written.
    pub fn finish(mut self) -> Result<(W, Manifest)> {
        // A large plan travels as a zstd-compressed stream rather than inline JSON.
        let mut plan_stream = None;
        if let Some(plan) = &self.plan {
            let json = serde_json::to_vec(plan).map_err(|e| HwzError::ManifestJson {
                message: e.to_string(),
            })?;
            if json.len() > PLAN_INLINE_MAX {
                if let Some(z) =
                    self.try_compress(&json, crate::zstd_codec::manifest_level(json.len()))
                {
                    plan_stream = Some(self.write_stream(&json, Some(z))?);
                    self.plan = None;
                }
            }
        }
        let manifest = Manifest {
            format: "hwz".to_string(),
            // Version 2 only when its one rule (the outer matrix view of rank ≥ 3) applies, so
            // archives of matrices stay readable by version-1 readers.
            version: if self.tensors.iter().any(|t| t.shape.len() >= 3) {
                MATRIX_VIEW_VERSION
            } else {
                FORMAT_VERSION
            },
            generator: self.options.generator.clone(),
            tensors: std::mem::take(&mut self.tensors),
            streams: std::mem::take(&mut self.streams),
            plan: self.plan.take(),
            plan_stream,
            metadata: std::mem::take(&mut self.metadata),
        };
        let json = serde_json::to_vec(&manifest).map_err(|e| HwzError::ManifestJson {
            message: e.to_string(),
        })?;
        if json.len() as u64 > crate::MAX_MANIFEST_LEN {
            return Err(HwzError::LimitExceeded {
                what: "manifest length",
                value: json.len() as u64,
                max: crate::MAX_MANIFEST_LEN,
            });
        }
        // A manifest of more than a few tensors is stored as one zstd frame when that saves
        // bytes (on a small model its JSON can be a tenth of the file); a small manifest stays
        // plain JSON, readable by every reader of version 1.
        let json = match self.options.compression {
            Compression::Zstd if json.len() > MANIFEST_COMPRESS_MIN => {
                let z = crate::zstd_codec::compress_at(
                    &json,
                    crate::zstd_codec::manifest_level(json.len()),
                );
                let fits =
                    json.len() as u64 <= crate::manifest::max_inflated_manifest(z.len() as u64);
                if z.len() < json.len() && fits {
                    z
                } else {
                    json
                }
            }
            _ => json,
        };
        let tail = Tail {
            manifest_offset: self.pos,
            manifest_len: json.len() as u64,
            manifest_crc32c: crc32c::crc32c(&json),
        };
        self.out.write_all(&json)?;
        self.out.write_all(&tail.to_bytes())?;
        self.out.flush()?;
        Ok((self.out, manifest))
    }
}

/// JSON has no infinity or NaN: such a measurement is left out.
fn finite_stats(s: TensorStats) -> TensorStats {
    let f = |x: Option<f64>| x.filter(|v| v.is_finite());
    TensorStats {
        mse: f(s.mse),
        snr_db: f(s.snr_db),
        max_abs_err: f(s.max_abs_err),
        cosine: f(s.cosine),
    }
}

#[cfg(feature = "std-fs")]
mod file {
    use super::*;
    use std::fs::File;
    use std::io::BufWriter;
    use std::ops::{Deref, DerefMut};
    use std::path::{Path, PathBuf};

    /// A [`Writer`] to a file that appears under its final name only when complete.
    ///
    /// The archive is written to a temporary file in the target's folder and renamed over the
    /// target by [`FileWriter::finish`]; dropping the writer (an error, a crash, Ctrl-C) removes
    /// the temporary file and leaves any previous file at the target untouched.
    #[derive(Debug)]
    pub struct FileWriter {
        writer: Writer<BufWriter<File>>,
        temp: tempfile::TempPath,
        path: PathBuf,
        _listed: super::Unfinished,
    }

    impl FileWriter {
        /// Starts an archive that will be named `path`.
        pub fn create(path: impl AsRef<Path>, options: WriterOptions) -> Result<Self> {
            let path = path.as_ref().to_path_buf();
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let (file, temp) = super::temp_file_in(&dir, ".hwz-")?.into_parts();
            let writer = Writer::new(BufWriter::with_capacity(1 << 20, file), options)?;
            let _listed = super::Unfinished::new(&temp);
            Ok(FileWriter {
                writer,
                temp,
                path,
                _listed,
            })
        }

        /// Completes the archive, syncs it to disk and renames it to its final name.
        pub fn finish(self) -> Result<Manifest> {
            let (buf, manifest) = self.writer.finish()?;
            let file = buf.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            drop(file);
            self.temp
                .persist(&self.path)
                .map_err(|e| HwzError::Io(e.error))?;
            Ok(manifest)
        }
    }

    impl Deref for FileWriter {
        type Target = Writer<BufWriter<File>>;
        fn deref(&self) -> &Self::Target {
            &self.writer
        }
    }

    impl DerefMut for FileWriter {
        fn deref_mut(&mut self) -> &mut Self::Target {
            &mut self.writer
        }
    }
}

#[cfg(feature = "std-fs")]
pub use file::FileWriter;

/// The temporary files of writers in progress ([`Unfinished`]), for [`remove_unfinished`].
#[cfg(feature = "std-fs")]
static UNFINISHED: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

/// A temporary file being written, listed for [`remove_unfinished`] until this guard drops
/// (after the file is renamed into place or removed).
#[cfg(feature = "std-fs")]
#[derive(Debug)]
pub struct Unfinished(std::path::PathBuf);

#[cfg(feature = "std-fs")]
impl Unfinished {
    /// Lists `path` as unfinished.
    pub fn new(path: &std::path::Path) -> Self {
        if let Ok(mut v) = UNFINISHED.lock() {
            v.push(path.to_path_buf());
        }
        Unfinished(path.to_path_buf())
    }
}

#[cfg(feature = "std-fs")]
impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Ok(mut v) = UNFINISHED.lock() {
            if let Some(i) = v.iter().position(|p| *p == self.0) {
                v.swap_remove(i);
            }
        }
    }
}

/// Removes the temporary files of every writer still in progress: for a process about to
/// exit without running destructors (a second Ctrl-C), which would otherwise leave them
/// beside their outputs. Files already renamed into place are not touched.
#[cfg(feature = "std-fs")]
pub fn remove_unfinished() {
    // A handler may run while a writer holds the lock for a moment: take it if free.
    if let Ok(v) = UNFINISHED.try_lock() {
        for p in v.iter() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Creates a temporary file in `dir` for a file that will be renamed into place when
/// complete. On Unix it gets `rw-r--r--` less the umask, like any file a program creates
/// (temporary files are otherwise private).
#[cfg(feature = "std-fs")]
pub fn temp_file_in(
    dir: &std::path::Path,
    prefix: &str,
) -> std::io::Result<tempfile::NamedTempFile> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix).suffix(".tmp");
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
    builder.tempfile_in(dir).map_err(|e| {
        // (The crate's error names the temporary's path, which the user never chose.)
        if e.kind() == std::io::ErrorKind::NotFound && !dir.is_dir() {
            let shown = if dir.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                dir
            };
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no folder {} to write in", shown.display()),
            )
        } else {
            e
        }
    })
}

/// The zstd form of a stream under `compression`, where it is smaller than the stream and
/// within readers' [`MAX_ZSTD_EXPANSION`]: the writer's rule for every stream it stores.
pub(crate) fn zstd_if_it_pays(raw: &[u8], compression: Compression, level: i32) -> Option<Vec<u8>> {
    match compression {
        Compression::Zstd if !raw.is_empty() => {
            let z = crate::zstd_codec::compress_at(raw, level);
            let within_cap =
                (raw.len() as u64) <= (z.len() as u64).saturating_mul(MAX_ZSTD_EXPANSION);
            (z.len() < raw.len() && within_cap).then_some(z)
        }
        _ => None,
    }
}

/// Each stream of `tensor` (of `numel` values) as a writer with `compression` stores it: its
/// zstd form where that pays ([`zstd_if_it_pays`]), else `None` (stored as it is). Compressed
/// first, then the tensor's floor of stored bytes per value is checked: where zstd shrinks a
/// tensor below it (a nearly constant one), its smallest streams are stored uncompressed, one by
/// one, until the floor is met (all of them, before: a 99.5 %-zero INT4 tensor kept 4 bits a
/// value where its f16 scales alone reach the floor). A tensor whose raw streams are below the
/// floor is refused: readers would refuse the file.
pub(crate) fn stored_forms(
    tensor: &EncodedTensor,
    numel: u64,
    compression: Compression,
) -> Result<Vec<Option<Vec<u8>>>> {
    let mut candidates: Vec<Option<Vec<u8>>> = tensor
        .streams
        .iter()
        .map(|(_, raw)| zstd_if_it_pays(raw, compression, crate::zstd_codec::LEVEL))
        .collect();
    let sizes = |c: &[Option<Vec<u8>>]| stored_len(tensor, c);
    let floor = min_stored_bytes(numel);
    if sizes(&candidates) < floor {
        let raw: u64 = tensor.streams.iter().map(|(_, b)| b.len() as u64).sum();
        if raw < floor {
            return Err(HwzError::LimitExceeded {
                what: "values per stored byte",
                value: numel / raw.max(1),
                max: crate::MAX_VALUES_PER_STORED_BYTE,
            });
        }
        let mut order: Vec<usize> = (0..candidates.len()).collect();
        order.sort_by_key(|&k| tensor.streams[k].1.len());
        for k in order {
            if sizes(&candidates) >= floor {
                break;
            }
            candidates[k] = None;
        }
    }
    Ok(candidates)
}

/// Bytes of `tensor`'s streams stored as `forms` says ([`stored_forms`]).
pub(crate) fn stored_len(tensor: &EncodedTensor, forms: &[Option<Vec<u8>>]) -> u64 {
    tensor
        .streams
        .iter()
        .zip(forms)
        .map(|((_, raw), z)| z.as_ref().map_or(raw.len(), Vec::len) as u64)
        .sum()
}
