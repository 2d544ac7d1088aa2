//! The reader: tail, manifest, then streams on demand.

use crate::codec::decode_into;
use crate::encoding::element_count;
use crate::manifest::{
    parse_head, Compression, Manifest, StreamEntry, Tail, TensorEntry, HEADER_LEN, TAIL_LEN,
};
use crate::{HwzError, Result};
use std::borrow::Cow;

/// Positional reads from an archive's bytes: a slice, a memory map, a file.
pub trait ReadAt {
    /// Total length in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` from `offset`; fails if the range is not inside the source.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
    /// The whole source as memory, when it is (enables zero-copy stream access).
    fn as_bytes(&self) -> Option<&[u8]> {
        None
    }
}

fn eof() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "read past the end of the archive",
    )
}

fn slice_read(src: &[u8], offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    let start = usize::try_from(offset).map_err(|_| eof())?;
    let end = start.checked_add(buf.len()).ok_or_else(eof)?;
    buf.copy_from_slice(src.get(start..end).ok_or_else(eof)?);
    Ok(())
}

impl ReadAt for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        slice_read(self, offset, buf)
    }
    fn as_bytes(&self) -> Option<&[u8]> {
        Some(self)
    }
}

impl ReadAt for Vec<u8> {
    fn size(&self) -> u64 {
        self.len() as u64
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        slice_read(self, offset, buf)
    }
    fn as_bytes(&self) -> Option<&[u8]> {
        Some(self)
    }
}

impl<T: ReadAt + ?Sized> ReadAt for &T {
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        (**self).read_exact_at(offset, buf)
    }
    fn as_bytes(&self) -> Option<&[u8]> {
        (**self).as_bytes()
    }
}

#[cfg(feature = "std-fs")]
impl ReadAt for memmap2::Mmap {
    fn size(&self) -> u64 {
        self.len() as u64
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        slice_read(self, offset, buf)
    }
    fn as_bytes(&self) -> Option<&[u8]> {
        Some(self)
    }
}

#[cfg(all(feature = "std-fs", unix))]
impl ReadAt for std::fs::File {
    fn size(&self) -> u64 {
        self.metadata().map(|m| m.len()).unwrap_or(0)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

/// An opened archive: the manifest is parsed and validated; streams are read when asked for.
#[derive(Debug)]
pub struct Archive<R> {
    source: R,
    manifest: Manifest,
    tail: Tail,
    size: u64,
}

impl<R: ReadAt> Archive<R> {
    /// Opens an archive with three reads: head, tail, manifest.
    pub fn open(source: R) -> Result<Self> {
        let size = source.size();
        let mut head = [0u8; 8];
        let head_len = size.min(8) as usize;
        source.read_exact_at(0, &mut head[..head_len])?;
        parse_head(&head[..head_len])?;
        if size < HEADER_LEN + TAIL_LEN {
            return Err(HwzError::TooShort {
                len: size,
                min: HEADER_LEN + TAIL_LEN,
            });
        }
        let mut tail_bytes = [0u8; TAIL_LEN as usize];
        source.read_exact_at(size - TAIL_LEN, &mut tail_bytes)?;
        let tail = Tail::parse(&tail_bytes, size)?;
        // Bounded by MAX_MANIFEST_LEN and by the file size (Tail::parse checked both).
        let mut json = vec![0u8; tail.manifest_len as usize];
        source.read_exact_at(tail.manifest_offset, &mut json)?;
        let manifest = Manifest::parse(&json, &tail)?;
        Ok(Archive {
            source,
            manifest,
            tail,
            size,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The tail.
    pub fn tail(&self) -> &Tail {
        &self.tail
    }

    /// File size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The tensors in write order.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.manifest.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Result<&TensorEntry> {
        self.manifest
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| HwzError::TensorNotFound {
                name: name.to_string(),
            })
    }

    /// Stored bytes of a tensor's streams (what it costs in the file).
    pub fn stored_bytes(&self, tensor: &TensorEntry) -> u64 {
        tensor
            .streams
            .values()
            .map(|&i| self.manifest.streams[i as usize].length)
            .sum()
    }

    /// Stream `index`, checksum-verified and decompressed. Zero-copy for in-memory and mapped
    /// sources when the stream is uncompressed.
    pub fn stream(&self, index: usize) -> Result<Cow<'_, [u8]>> {
        let entry = self
            .manifest
            .streams
            .get(index)
            .ok_or_else(|| HwzError::StreamRef {
                tensor: String::new(),
                role: String::new(),
                index: index as u64,
                count: self.manifest.streams.len(),
            })?;
        let stored: Cow<'_, [u8]> = match self.source.as_bytes() {
            // Bounds were validated against the file when the manifest was parsed.
            Some(all) => {
                Cow::Borrowed(&all[entry.offset as usize..(entry.offset + entry.length) as usize])
            }
            None => {
                let mut buf = vec![0u8; entry.length as usize];
                self.source.read_exact_at(entry.offset, &mut buf)?;
                Cow::Owned(buf)
            }
        };
        decode_stream(index, entry, stored)
    }

    /// A tensor's streams by role, verified and decompressed.
    pub fn tensor_streams(&self, tensor: &TensorEntry) -> Result<Vec<(String, Cow<'_, [u8]>)>> {
        tensor
            .streams
            .iter()
            .map(|(role, &i)| Ok((role.clone(), self.stream(i as usize)?)))
            .collect()
    }

    /// The Plan that chose the encodings, inline in the manifest or in its own stream (verified
    /// and decompressed like any stream); `None` when no planner made one.
    pub fn plan(&self) -> Result<Option<serde_json::Value>> {
        if let Some(p) = &self.manifest.plan {
            return Ok(Some(p.clone()));
        }
        let Some(index) = self.manifest.plan_stream else {
            return Ok(None);
        };
        let bytes = self.stream(index as usize)?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| HwzError::ManifestJson {
                message: format!("plan stream: {e}"),
            })
    }

    /// Decodes the tensor named `name` to `f32`.
    pub fn decode_tensor(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.tensor(name)?;
        // The element count is tied to the stream sizes by validation, which are bounded by
        // the file: this allocation is justified by the bytes on disk.
        let n = element_count(&t.name, &t.shape)?;
        let mut out = vec![0.0f32; n as usize];
        self.decode_entry_into(t, &mut out)?;
        Ok(out)
    }

    /// Decodes `tensor` into `out` (exactly its element count).
    pub fn decode_entry_into(&self, tensor: &TensorEntry, out: &mut [f32]) -> Result<()> {
        let streams = self.tensor_streams(tensor)?;
        let refs: Vec<(&str, &[u8])> = streams
            .iter()
            .map(|(r, b)| (r.as_str(), b.as_ref()))
            .collect();
        let shape = self.manifest.coded_shape(tensor);
        decode_into(&tensor.name, &tensor.encoding, &shape, &refs, out)
    }
}

/// Verifies a stored stream's checksum and undoes its compression.
pub fn decode_stream<'a>(
    index: usize,
    entry: &StreamEntry,
    stored: Cow<'a, [u8]>,
) -> Result<Cow<'a, [u8]>> {
    if stored.len() as u64 != entry.length {
        return Err(HwzError::StreamOutOfBounds {
            stream: index,
            offset: entry.offset,
            length: entry.length,
            end: stored.len() as u64,
        });
    }
    let computed = crc32c::crc32c(&stored);
    if computed != entry.crc32c {
        return Err(HwzError::StreamChecksum {
            stream: index,
            stored: entry.crc32c,
            computed,
        });
    }
    match entry.compression {
        Compression::None => Ok(stored),
        Compression::Zstd => {
            // raw_length was checked against MAX_ZSTD_EXPANSION × the stored length.
            let out =
                crate::zstd_codec::decompress(&stored, entry.raw_length).map_err(|message| {
                    HwzError::Decompress {
                        stream: index,
                        message,
                    }
                })?;
            Ok(Cow::Owned(out))
        }
    }
}

#[cfg(feature = "std-fs")]
impl Archive<memmap2::Mmap> {
    /// Opens the archive at `path` through a read-only memory map (zero-copy streams).
    ///
    /// The map assumes the file is not modified while it is open; use
    /// [`Archive::open_file`] where that cannot be promised.
    pub fn open_path(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let file = std::fs::File::open(path)?;
        // SAFETY: the map is read-only; the file is assumed not to change while mapped, as
        // documented above. Every access is bounds-checked against the validated manifest.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Archive::open(map)
    }
}

#[cfg(all(feature = "std-fs", unix))]
impl Archive<std::fs::File> {
    /// Opens the archive at `path` with positional reads (no memory map).
    pub fn open_file(path: impl AsRef<std::path::Path>) -> Result<Self> {
        Archive::open(std::fs::File::open(path)?)
    }
}
