//! Sharded archives, the safetensors convention: `NAME-00001-of-00003.hwz` … and an index
//! `NAME.hwz.index.json` (`{"metadata": {...}, "weight_map": {tensor: shard file}}`), each shard
//! a complete `.hwz` archive. [`ShardedWriter`] writes them (shards appear under their final
//! names only when every shard is complete); [`ArchiveSet`] opens an index, or a single
//! archive, as one model.

use crate::compress::io_at;
use crate::error::{PipelineError, Result};
use hypercodec_hwz::{
    self as hwz, Archive, EncodedTensor, FileWriter, Manifest, TensorEntry, TensorStats,
    WriterOptions,
};
use memmap2::Mmap;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// Most shards of one archive set (Hugging Face's largest checkpoints have a few hundred).
pub const MAX_SHARDS: usize = 10_000;

/// Where the compress driver puts tensors: one archive, or shards of one.
pub trait ArchiveSink {
    /// Adds a free metadata entry.
    fn insert_metadata(&mut self, key: &str, value: Value);
    /// Adds one encoded tensor; returns the bytes its streams took (alignment included).
    fn add_tensor(
        &mut self,
        name: &str,
        shape: &[u64],
        source_dtype: &str,
        tensor: &EncodedTensor,
        stats: Option<TensorStats>,
    ) -> hwz::Result<u64>;
    /// Stores the plan that chose the encodings.
    fn set_plan(&mut self, plan: Value);
}

impl<W: std::io::Write> ArchiveSink for hwz::Writer<W> {
    fn insert_metadata(&mut self, key: &str, value: Value) {
        hwz::Writer::insert_metadata(self, key, value)
    }
    fn add_tensor(
        &mut self,
        name: &str,
        shape: &[u64],
        source_dtype: &str,
        tensor: &EncodedTensor,
        stats: Option<TensorStats>,
    ) -> hwz::Result<u64> {
        hwz::Writer::add_tensor(self, name, shape, source_dtype, tensor, stats)
    }
    fn set_plan(&mut self, plan: Value) {
        hwz::Writer::set_plan(self, plan)
    }
}

/// The index file of a sharded archive `out` (`model.hwz` → `model.hwz.index.json`).
pub fn index_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".index.json");
    PathBuf::from(s)
}

/// The name of shard `k` (1-based) of `n` of `out` (`model.hwz` → `model-00001-of-00003.hwz`).
fn shard_name(out: &Path, k: usize, n: usize) -> String {
    let stem = out
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned());
    format!("{stem}-{k:05}-of-{n:05}.hwz")
}

/// Writes shards of at most about `shard_bytes` each (a tensor never splits: one larger than
/// that gets a shard of its own). Finished shards wait under temporary names; [`finish`]
/// renames them all and writes the index; dropping the writer removes every one of them.
///
/// [`finish`]: ShardedWriter::finish
#[derive(Debug)]
pub struct ShardedWriter {
    out: PathBuf,
    shard_bytes: u64,
    options: WriterOptions,
    current: Option<FileWriter>,
    current_tensors: Vec<String>,
    /// Finished shards at their scratch paths (listed as unfinished until renamed).
    done: Vec<(tempfile::TempPath, hwz::Unfinished, Vec<String>, Manifest)>,
    metadata: Vec<(String, Value)>,
    plan: Option<Value>,
    /// Files the run reads: no shard may land on one.
    inputs: Vec<PathBuf>,
}

impl ShardedWriter {
    /// A writer of shards of `out` (`model.hwz` → `model-0000K-of-0000N.hwz` beside it).
    pub fn new(out: &Path, shard_bytes: u64, options: WriterOptions) -> Result<Self> {
        if shard_bytes == 0 {
            return Err(PipelineError::option("--shard-size", "must be positive"));
        }
        Ok(ShardedWriter {
            out: out.to_path_buf(),
            shard_bytes,
            options,
            current: None,
            current_tensors: Vec::new(),
            done: Vec::new(),
            metadata: Vec::new(),
            plan: None,
            inputs: Vec::new(),
        })
    }

    /// This writer for a run that reads `inputs`: [`finish`](Self::finish) refuses a shard
    /// name that is one of them (the rename would destroy it), before any shard is renamed.
    pub fn reading<'a>(mut self, inputs: impl IntoIterator<Item = &'a Path>) -> Self {
        self.inputs = inputs.into_iter().map(Path::to_path_buf).collect();
        self
    }

    fn dir(&self) -> PathBuf {
        match self.out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    /// Finishes the open shard into a temporary file of its own.
    fn close_current(&mut self) -> Result<()> {
        let Some(w) = self.current.take() else {
            return Ok(());
        };
        let scratch = self.scratch_path(self.done.len() + 1);
        let manifest = w.finish().map_err(|e| io_at(&scratch, e))?;
        // From here the finished shard is removed again unless `finish` renames it.
        let temp =
            tempfile::TempPath::try_from_path(&scratch).map_err(PipelineError::io(&scratch))?;
        let names = std::mem::take(&mut self.current_tensors);
        let listed = hwz::Unfinished::new(&scratch);
        self.done.push((temp, listed, names, manifest));
        if self.done.len() > MAX_SHARDS {
            return Err(PipelineError::Shards {
                message: format!("more than {MAX_SHARDS} shards: use a larger --shard-size"),
            });
        }
        Ok(())
    }

    /// Where finished shard `k` waits for its final name.
    fn scratch_path(&self, k: usize) -> PathBuf {
        let stem = self
            .out
            .file_name()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned());
        self.dir()
            .join(format!(".{stem}.shard-{k}.{}.tmp", std::process::id()))
    }

    fn open_new(&mut self) -> Result<&mut FileWriter> {
        // FileWriter writes a temporary file of its own and renames it to `scratch` when the
        // shard is complete.
        let scratch = self.scratch_path(self.done.len() + 1);
        let mut w =
            FileWriter::create(&scratch, self.options.clone()).map_err(|e| io_at(&scratch, e))?;
        for (k, v) in &self.metadata {
            w.insert_metadata(k, v.clone());
        }
        Ok(self.current.insert(w))
    }

    /// Renames every shard to its final name and writes the index; returns the shards'
    /// manifests and their paths.
    pub fn finish(mut self) -> Result<Vec<(PathBuf, Manifest)>> {
        if self.current.is_none() && self.done.is_empty() {
            self.open_new()?;
        }
        if let (Some(plan), Some(w)) = (self.plan.take(), self.current.as_mut()) {
            w.set_plan(plan);
        }
        self.close_current()?;
        let n = self.done.len();
        let dir = self.dir();
        for k in 0..n {
            let path = dir.join(shard_name(&self.out, k + 1, n));
            crate::output::check_output(&path, self.inputs.iter().map(PathBuf::as_path))?;
        }
        // The shards an earlier index of this archive listed (re-sharded at another size, it
        // left them beside the new ones): removed once the new index is in place.
        let before = read_index(&index_path(&self.out)).map_or(Vec::new(), |i| i.files);
        let mut weight_map = Map::new();
        let mut out = Vec::with_capacity(n);
        let mut total = 0u64;
        for (k, (temp, _listed, names, manifest)) in
            std::mem::take(&mut self.done).into_iter().enumerate()
        {
            let name = shard_name(&self.out, k + 1, n);
            let path = dir.join(&name);
            temp.persist(&path)
                .map_err(|e| PipelineError::io(&path)(e.error))?;
            total += manifest.streams.iter().map(|s| s.length).sum::<u64>();
            for t in names {
                weight_map.insert(t, Value::from(name.clone()));
            }
            out.push((path, manifest));
        }
        let index = json!({
            "metadata": {"format": "hwz", "total_size": total, "shards": n},
            "weight_map": weight_map,
        });
        let index_path = index_path(&self.out);
        let text = serde_json::to_vec_pretty(&index).map_err(|e| PipelineError::Json {
            what: "shard index".into(),
            message: e.to_string(),
        })?;
        let mut tmp = hwz::temp_file_in(&dir, ".hwz-index-").map_err(PipelineError::io(&dir))?;
        std::io::Write::write_all(&mut tmp, &text).map_err(PipelineError::io(&index_path))?;
        tmp.persist(&index_path)
            .map_err(|e| PipelineError::io(&index_path)(e.error))?;
        for old in before {
            // Only names this archive's shards take (an index is an input: it could name any
            // file beside it), and none of the new ones.
            let name = old.file_name().map(|f| f.to_string_lossy().into_owned());
            let ours = name.as_deref().is_some_and(|f| self.is_shard_name(f));
            if ours && !out.iter().any(|(p, _)| p == &old) {
                let _ = std::fs::remove_file(&old);
            }
        }
        Ok(out)
    }

    /// Whether `name` is one of this archive's shard names, `STEM-KKKKK-of-NNNNN.hwz` with
    /// 1 ≤ K ≤ N ≤ [`MAX_SHARDS`].
    fn is_shard_name(&self, name: &str) -> bool {
        // `shard_name(out, 1, 1)` without its `00001-of-00001.hwz`: the stem and its dash.
        let one = shard_name(&self.out, 1, 1);
        let Some(numbers) = name
            .strip_prefix(&one[..one.len() - "00001-of-00001.hwz".len()])
            .and_then(|rest| rest.strip_suffix(".hwz"))
        else {
            return false;
        };
        let Some((k, n)) = numbers.split_once("-of-") else {
            return false;
        };
        let count = |s: &str| {
            (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<usize>().ok())
                .flatten()
        };
        matches!((count(k), count(n)), (Some(k), Some(n)) if 1 <= k && k <= n && n <= MAX_SHARDS)
    }
}

impl ArchiveSink for ShardedWriter {
    fn insert_metadata(&mut self, key: &str, value: Value) {
        if let Some(w) = self.current.as_mut() {
            w.insert_metadata(key, value.clone());
        }
        self.metadata.push((key.to_string(), value));
    }

    fn add_tensor(
        &mut self,
        name: &str,
        shape: &[u64],
        source_dtype: &str,
        tensor: &EncodedTensor,
        stats: Option<TensorStats>,
    ) -> hwz::Result<u64> {
        let full = self.current.as_ref().is_some_and(|w| {
            !self.current_tensors.is_empty()
                && w.position() + tensor.payload_bytes() > self.shard_bytes
        });
        let to_hwz = |e: PipelineError| match e {
            PipelineError::Hwz(h) => h,
            PipelineError::Io { source, .. } => hwz::HwzError::Io(source),
            other => hwz::HwzError::Io(std::io::Error::other(other.to_string())),
        };
        if full {
            self.close_current().map_err(to_hwz)?;
        }
        if self.current.is_none() {
            self.open_new().map_err(to_hwz)?;
        }
        let w = self.current.as_mut().expect("a shard is open");
        let bytes = w.add_tensor(name, shape, source_dtype, tensor, stats)?;
        self.current_tensors.push(name.to_string());
        Ok(bytes)
    }

    fn set_plan(&mut self, plan: Value) {
        // The plan goes into the last shard.
        self.plan = Some(plan);
    }
}

/// A sharded model's index (`*.index.json`, Hugging Face's layout): its shards, sorted, and
/// which shard holds each tensor.
#[derive(Debug, Clone)]
pub struct ShardIndex {
    /// The shard files, beside the index, in name order.
    pub files: Vec<PathBuf>,
    /// Tensor name → shard file name.
    pub weight_map: std::collections::BTreeMap<String, String>,
}

/// Reads an index: `weight_map` must name 1..=[`MAX_SHARDS`] files, each a plain file name
/// beside the index (never a path elsewhere).
pub fn read_index(path: &Path) -> Result<ShardIndex> {
    let bad = |message: String| PipelineError::Shards { message };
    let text = crate::output::read_json_input(path, "shard index")?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let map = v["weight_map"]
        .as_object()
        .ok_or_else(|| bad(format!("{}: no `weight_map` object", path.display())))?;
    let mut weight_map = std::collections::BTreeMap::new();
    for (name, f) in map {
        let f = f.as_str().unwrap_or("");
        if f.is_empty() || f.contains(['/', '\\']) || f == ".." {
            return Err(bad(format!(
                "shard `{f}` is not a file name beside the index"
            )));
        }
        weight_map.insert(name.clone(), f.to_string());
    }
    let mut files: Vec<&String> = weight_map.values().collect();
    files.sort_unstable();
    files.dedup();
    if files.is_empty() || files.len() > MAX_SHARDS {
        return Err(bad(format!("{} shards (1..={MAX_SHARDS})", files.len())));
    }
    // Ours records its shard count: a weight map that names fewer lost a shard's tensors
    // (they were left out, without a word).
    if let Some(n) = v["metadata"]["shards"].as_u64() {
        if n != files.len() as u64 {
            return Err(bad(format!(
                "{}: its weight_map names {} shard files, its metadata {n}",
                path.display(),
                files.len()
            )));
        }
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let files = files.into_iter().map(|f| dir.join(f)).collect();
    Ok(ShardIndex { files, weight_map })
}

/// Several archives read as one model: a sharded archive's index, or one archive.
#[derive(Debug)]
pub struct ArchiveSet {
    /// The archives, in shard order.
    pub parts: Vec<(PathBuf, Archive<Mmap>)>,
    /// Every tensor as (part, index in that part's manifest), in order.
    order: Vec<(usize, usize)>,
}

impl ArchiveSet {
    /// The files of the set: its archive, or its shards.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.parts.iter().map(|(p, _)| p.as_path())
    }

    /// Opens `path`: a `*.hwz.index.json` (its shards beside it) or a single `.hwz`.
    pub fn open(path: &Path) -> Result<ArchiveSet> {
        if !path.to_string_lossy().ends_with(".index.json") {
            let a = crate::open_archive(path)?;
            let order = (0..a.tensors().len()).map(|i| (0, i)).collect();
            return Ok(ArchiveSet {
                parts: vec![(path.to_path_buf(), a)],
                order,
            });
        }
        let index = read_index(path)?;
        let mut parts = Vec::with_capacity(index.files.len());
        let mut order = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (k, p) in index.files.into_iter().enumerate() {
            let a = crate::open_archive(&p)?;
            let f = p.file_name().map(|n| n.to_string_lossy().into_owned());
            for (i, t) in a.tensors().iter().enumerate() {
                if index.weight_map.get(&t.name) != f.as_ref() {
                    return Err(PipelineError::Shards {
                        message: format!(
                            "tensor `{}` of {} is not indexed there",
                            t.name,
                            p.display()
                        ),
                    });
                }
                if !seen.insert(t.name.clone()) {
                    return Err(PipelineError::Shards {
                        message: format!("tensor `{}` is in two shards", t.name),
                    });
                }
                order.push((k, i));
            }
            parts.push((p, a));
        }
        if let Some(missing) = index.weight_map.keys().find(|n| !seen.contains(*n)) {
            return Err(PipelineError::Shards {
                message: format!("tensor `{missing}` is in the index but in no shard"),
            });
        }
        Ok(ArchiveSet { parts, order })
    }

    /// Every tensor, in order.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorEntry> + '_ {
        self.order
            .iter()
            .map(|&(p, i)| &self.parts[p].1.tensors()[i])
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether there is no tensor.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The archive holding tensor `k` (in [`ArchiveSet::tensors`] order) and its entry.
    fn entry(&self, k: usize) -> Result<(&Archive<Mmap>, &TensorEntry)> {
        let &(p, i) = self.order.get(k).ok_or_else(|| PipelineError::NoTensors {
            message: format!("no tensor {k} in this archive set"),
        })?;
        let a = &self.parts[p].1;
        Ok((a, &a.tensors()[i]))
    }

    /// Tensor `k` (in [`ArchiveSet::tensors`] order) as a validated view that owns its
    /// streams (for an operator that runs on them).
    pub fn view(&self, k: usize) -> Result<hypercodec_hwz::TensorView<'static>> {
        let (a, t) = self.entry(k)?;
        let streams = a.tensor_streams(t)?;
        let refs: Vec<(&str, &[u8])> = streams
            .iter()
            .map(|(r, b)| (r.as_str(), b.as_ref()))
            .collect();
        let shape = a.manifest().coded_shape(t);
        Ok(hypercodec_hwz::TensorView::new(&t.name, &t.encoding, &shape, &refs)?.into_owned())
    }

    /// Tensor `k`'s stored form as it lies in the archive (encoding and streams, nothing
    /// decoded), with its entry: what a copy of the tensor into another archive needs. A rank
    /// ≥ 3 tensor of a version-1 archive (coded under the old last-dimension view) is refused,
    /// since a copy would be read under the matrix view.
    pub fn encoded(&self, k: usize) -> Result<(&TensorEntry, EncodedTensor)> {
        let (a, t) = self.entry(k)?;
        if a.manifest().coded_shape(t) != t.shape {
            return Err(PipelineError::Shards {
                message: format!(
                    "tensor `{}` of shape {:?} is coded under the version-1 view; recompress it to copy it",
                    t.name, t.shape
                ),
            });
        }
        // The writer wants the roles as the encoding names them (in its order).
        let mut stored = a.tensor_streams(t)?;
        let mut streams = Vec::with_capacity(stored.len());
        for (role, _) in t.encoding.stream_lens(&t.name, &t.shape)? {
            let at = stored.iter().position(|(r, _)| r == role).ok_or_else(|| {
                PipelineError::Shards {
                    message: format!("tensor `{}` has no `{role}` stream", t.name),
                }
            })?;
            streams.push((role, stored.swap_remove(at).1.into_owned()));
        }
        Ok((
            t,
            EncodedTensor {
                encoding: t.encoding.clone(),
                streams,
            },
        ))
    }

    /// Tensor `k`'s stored bytes (its streams as they lie in the file).
    pub fn stored_bytes(&self, k: usize) -> Result<u64> {
        let (a, t) = self.entry(k)?;
        Ok(a.stored_bytes(t))
    }

    /// Decodes tensor `k` (in [`ArchiveSet::tensors`] order) into `out`.
    pub fn decode_into(&self, k: usize, out: &mut [f32]) -> Result<()> {
        let (a, t) = self.entry(k)?;
        Ok(a.decode_entry_into(t, out)?)
    }

    /// The summary `inspect` prints: every shard's tensors as one model, totals over all the
    /// files (the index's own bytes aside), the plan of whichever shard holds one.
    pub fn summary(&self) -> Result<crate::ArchiveSummary> {
        let mut combined: Option<Manifest> = None;
        let (mut manifest_bytes, mut file_bytes) = (0u64, 0u64);
        let mut plan = None;
        for (_, a) in &self.parts {
            manifest_bytes += a.tail().manifest_len;
            file_bytes += a.size();
            if plan.is_none() {
                plan = a.plan()?;
            }
            let m = a.manifest().clone();
            match &mut combined {
                None => combined = Some(m),
                Some(c) => {
                    let base = c.streams.len() as u64;
                    c.version = c.version.max(m.version);
                    for mut t in m.tensors {
                        t.streams.values_mut().for_each(|i| *i += base);
                        c.tensors.push(t);
                    }
                    c.streams.extend(m.streams);
                }
            }
        }
        let c = combined.ok_or_else(|| PipelineError::NoTensors {
            message: "an archive set without archives".into(),
        })?;
        let mut s = crate::summarize(&c, manifest_bytes, file_bytes);
        s.plan = plan;
        Ok(s)
    }
}

/// A size such as `2GB`, `500MB`, `64KiB` or a number of bytes.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => f64::NAN,
    };
    let v = num.parse::<f64>().unwrap_or(f64::NAN) * scale;
    if (1.0..1e18).contains(&v) {
        Ok(v as u64)
    } else {
        Err(PipelineError::option(
            "--shard-size",
            format!("`{text}` is not a size (e.g. 2GB, 500MB, 1048576)"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercodec_hwz::{encode, EncodeOptions, Encoding, FloatDtype};

    fn tensor() -> EncodedTensor {
        encode(
            "t",
            &[0.25; 4096],
            &[64, 64],
            &Encoding::Raw {
                dtype: FloatDtype::F32,
            },
            EncodeOptions::default(),
        )
        .expect("encode")
    }

    #[test]
    fn an_unfinished_sharded_writer_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("m.hwz");
        let mut w = ShardedWriter::new(&out, 20_000, WriterOptions::default()).expect("writer");
        for i in 0..5 {
            w.add_tensor(&format!("t{i}"), &[64, 64], "f32", &tensor(), None)
                .expect("add");
        }
        // 16 KB tensors in 20 KB shards: four shards are finished already.
        assert_eq!(w.done.len(), 4);
        drop(w);
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_stored_tensor_copies_into_another_archive_unchanged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("a.hwz");
        let values: Vec<f32> = (0..32 * 48)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let enc = Encoding::affine(hypercodec_hwz::AffineParams {
            group: hypercodec_hwz::Group::Size(16),
            ..Default::default()
        });
        let t = encode("w", &values, &[32, 48], &enc, EncodeOptions::default()).expect("encode");
        let mut w = FileWriter::create(&src, WriterOptions::default()).expect("writer");
        w.add_tensor("b", &[64, 64], "f32", &tensor(), None)
            .expect("add");
        w.add_tensor("w", &[32, 48], "bf16", &t, None).expect("add");
        w.finish().expect("finish");
        let set = ArchiveSet::open(&src).expect("open");
        let (entry, copy) = set.encoded(1).expect("encoded");
        assert_eq!(
            (entry.name.as_str(), entry.source_dtype.as_str()),
            ("w", "bf16")
        );
        assert_eq!(copy.streams, t.streams);
        let mut expected = vec![0f32; values.len()];
        set.decode_into(1, &mut expected).expect("decode");
        let mut again = vec![0f32; values.len()];
        let refs: Vec<(&str, &[u8])> = copy.streams.iter().map(|(r, b)| (*r, &b[..])).collect();
        hypercodec_hwz::decode_into("w", &copy.encoding, &[32, 48], &refs, &mut again)
            .expect("decode copy");
        assert_eq!(again, expected);
        assert!(set.encoded(2).is_err());
    }

    #[test]
    fn sharding_again_removes_the_shards_the_old_index_listed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("m.hwz");
        let write = |shard_bytes: u64, tensors: usize| {
            let mut w =
                ShardedWriter::new(&out, shard_bytes, WriterOptions::default()).expect("writer");
            for i in 0..tensors {
                w.add_tensor(&format!("t{i}"), &[64, 64], "f32", &tensor(), None)
                    .expect("add");
            }
            w.finish().expect("finish")
        };
        let names = || {
            let mut v: Vec<String> = std::fs::read_dir(dir.path())
                .expect("dir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        write(20_000, 3);
        // A file of the user's beside them, named like no shard of this archive.
        std::fs::write(dir.path().join("m-notes.hwz"), b"keep").expect("write");
        assert_eq!(names().len(), 5);
        write(1 << 20, 3);
        assert_eq!(
            names(),
            ["m-00001-of-00001.hwz", "m-notes.hwz", "m.hwz.index.json"]
        );
        assert!(ArchiveSet::open(&index_path(&out)).is_ok());
        // An index whose weight map lost a shard's tensors, against its recorded count.
        write(20_000, 3);
        let index = index_path(&out);
        let mut v: Value =
            serde_json::from_slice(&std::fs::read(&index).expect("index")).expect("json");
        v["weight_map"]
            .as_object_mut()
            .expect("map")
            .remove("t2")
            .expect("t2");
        std::fs::write(&index, v.to_string()).expect("write");
        let err = read_index(&index).expect_err("a shard short");
        assert!(
            err.to_string()
                .contains("names 2 shard files, its metadata 3"),
            "{err}"
        );
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("2GB").expect("size"), 2_000_000_000);
        assert_eq!(parse_size("64KiB").expect("size"), 65_536);
        assert_eq!(parse_size("1048576").expect("size"), 1_048_576);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
    }
}
