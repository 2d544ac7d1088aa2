//! Tensor sources: safetensors and GGUF files read lazily through a memory map, and seeded
//! synthetic tensors (`gaussian:ROWSxCOLS[:SEED]`), behind one [`TensorSource`].

use crate::error::{PipelineError, Result};
use crate::gguf::{dequantize, is_gguf, GgmlType, Gguf};
use half::{bf16, f16};
use hypercodec_hwz::FloatDtype;
use memmap2::Mmap;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// How a tensor is stored in its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceType {
    /// A float type.
    Float(FloatDtype),
    /// A GGML block type.
    Ggml(GgmlType),
    /// Generated values.
    Synthetic,
}

impl SourceType {
    /// The label written to the manifest.
    pub fn label(&self) -> &'static str {
        match self {
            SourceType::Float(d) => d.name(),
            SourceType::Ggml(t) => t.name(),
            SourceType::Synthetic => "f32",
        }
    }

    /// The float type that stores this tensor exactly when kept raw.
    pub fn raw_dtype(&self) -> FloatDtype {
        match self {
            SourceType::Float(d) => *d,
            _ => FloatDtype::F32,
        }
    }
}

/// One tensor of a source.
#[derive(Debug, Clone)]
pub struct SourceTensor {
    /// Name.
    pub name: String,
    /// Shape, outermost first.
    pub shape: Vec<u64>,
    /// Storage type.
    pub ty: SourceType,
    file: usize,
    start: usize,
    len: usize,
    seed: u64,
}

impl SourceTensor {
    /// Element count.
    pub fn numel(&self) -> u64 {
        crate::numel(&self.shape)
    }
}

/// A tensor left out of a source because its type is not a float.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedTensor {
    /// Name.
    pub name: String,
    /// Its type, as the source names it.
    pub dtype: String,
}

/// An opened input: its tensors, read one at a time.
#[derive(Debug)]
pub struct TensorSource {
    /// One map per file (several for a sharded model).
    maps: Vec<Mmap>,
    path: Option<PathBuf>,
    /// Every file read (a sharded model's index and shards).
    files: Vec<PathBuf>,
    /// Readable tensors, in file order.
    pub tensors: Vec<SourceTensor>,
    /// Tensors left out because their type is not a float.
    pub skipped: Vec<SkippedTensor>,
    /// Metadata to carry into the archive (key, value).
    pub metadata: Vec<(String, Value)>,
}

/// splitmix64: a tiny, fixed generator, so seeded data is the same on every machine and version.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Fills `out` with i.i.d. N(0, 1) values (Box–Muller).
    pub fn fill_gaussian(&mut self, out: &mut [f32]) {
        for pair in out.chunks_mut(2) {
            let r = (-2.0 * self.unit().ln()).sqrt();
            let t = std::f64::consts::TAU * self.unit();
            pair[0] = (r * t.cos()) as f32;
            if let Some(p) = pair.get_mut(1) {
                *p = (r * t.sin()) as f32;
            }
        }
    }
}

/// Largest synthetic tensor, in values: 2^31 (8 GiB of f32, held twice while compressing:
/// values and their decode). The largest single tensors of today's models (embedding tables
/// such as 256000 × 8192 = 2.1·10^9 values) fit; a larger spec is refused before any
/// allocation with [`PipelineError::SyntheticTooLarge`].
pub const MAX_SYNTHETIC_VALUES: u64 = 1 << 31;

/// Parses `ROWSxCOLS[xCOLS...][:SEED]`.
fn parse_dims(spec: &str) -> Option<(Vec<u64>, u64)> {
    let (dims, seed) = match spec.split_once(':') {
        Some((d, s)) => (d, s.parse().ok()?),
        None => (spec, 0),
    };
    let shape: Option<Vec<u64>> = dims.split('x').map(|d| d.parse().ok()).collect();
    shape.filter(|s| !s.is_empty()).map(|s| (s, seed))
}

/// Whether `path` is a PyTorch checkpoint: a zip whose first entry is `…/data.pkl` (what
/// `torch.save` writes), or an older pickle (protocol 2+) named `.pt`, `.pth` or `.ckpt`.
fn is_torch_checkpoint(path: &Path, map: &[u8]) -> bool {
    if map.starts_with(b"PK\x03\x04") && map.len() >= 30 {
        let name_len = u16::from_le_bytes([map[26], map[27]]) as usize;
        return map
            .get(30..30 + name_len)
            .is_some_and(|name| name.ends_with(b"data.pkl"));
    }
    let torch_name = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("pt" | "pth" | "ckpt")
    );
    torch_name && map.first() == Some(&0x80)
}

/// True when `bytes` starts like a safetensors file: an 8-byte header length, then the
/// header's JSON object.
fn looks_like_safetensors(bytes: &[u8]) -> bool {
    bytes.get(8) == Some(&b'{')
}

impl TensorSource {
    /// Opens a `.safetensors` or `.gguf` file, or a synthetic spec `gaussian:ROWSxCOLS[:SEED]`.
    pub fn open(spec: &str) -> Result<TensorSource> {
        if let Some(rest) = spec.strip_prefix("gaussian:") {
            let (shape, seed) = parse_dims(rest).ok_or_else(|| PipelineError::Synthetic {
                spec: spec.into(),
                reason: "use gaussian:ROWSxCOLS[:SEED]".into(),
            })?;
            let mut s = Self::synthetic(shape, seed)?;
            s.metadata = vec![("synthetic".into(), Value::from(spec))];
            return Ok(s);
        }
        let path = Path::new(spec);
        if let Some((shards, listed)) = shard_files(path)? {
            let mut source = Self::merge(
                shards
                    .iter()
                    .map(|p| Self::open_file(p))
                    .collect::<Result<Vec<_>>>()?,
            )?;
            // Every tensor the index lists is in the shards (read, or skipped as non-float).
            let have: std::collections::HashSet<&str> = source
                .tensors
                .iter()
                .map(|t| t.name.as_str())
                .chain(source.skipped.iter().map(|t| t.name.as_str()))
                .collect();
            if let Some(missing) = listed.iter().find(|n| !have.contains(n.as_str())) {
                return Err(PipelineError::Shards {
                    message: format!("tensor `{missing}` is in the index but in no shard"),
                });
            }
            source
                .metadata
                .push(("shards".into(), Value::from(shards.len())));
            source.path = Some(path.into());
            source.files = std::iter::once(path.to_path_buf()).chain(shards).collect();
            return Ok(source);
        }
        let mut source = Self::open_file(path)?;
        source.path = Some(path.into());
        source.files = vec![path.into()];
        Ok(source)
    }

    /// Several opened shards as one model: their tensors in shard order, every name once; the
    /// first shard's metadata.
    fn merge(parts: Vec<TensorSource>) -> Result<TensorSource> {
        let mut out = TensorSource {
            maps: Vec::new(),
            path: None,
            files: Vec::new(),
            tensors: Vec::new(),
            skipped: Vec::new(),
            metadata: Vec::new(),
        };
        let mut names = std::collections::HashSet::new();
        for (k, p) in parts.into_iter().enumerate() {
            let base = out.maps.len();
            for mut t in p.tensors {
                if !names.insert(t.name.clone()) {
                    return Err(PipelineError::Shards {
                        message: format!("tensor `{}` is in two shards", t.name),
                    });
                }
                t.file += base;
                out.tensors.push(t);
            }
            out.maps.extend(p.maps);
            out.skipped.extend(p.skipped);
            if k == 0 {
                out.metadata = p.metadata;
            }
        }
        Ok(out)
    }

    /// Opens one `.safetensors` or `.gguf` file.
    fn open_file(path: &Path) -> Result<TensorSource> {
        let file = crate::output::open_input(path)?;
        // SAFETY: read-only map of an input the user names; it is assumed not to change while
        // this process runs. Every access below is bounds-checked.
        let map = unsafe { Mmap::map(&file) }.map_err(PipelineError::io(path))?;
        let source = if is_gguf(&map) {
            Self::from_gguf(map)
        } else if is_torch_checkpoint(path, &map) {
            Err(PipelineError::TorchCheckpoint { path: path.into() })
        } else if map.starts_with(b"HWZ1") || map.starts_with(b"PK\x03\x04") {
            Err(PipelineError::AlreadyArchive { path: path.into() })
        } else if looks_like_safetensors(&map) {
            Self::from_safetensors(map)
        } else {
            Err(PipelineError::UnknownFormat { path: path.into() })
        }?;
        // A GGUF tensor may bear safetensors' reserved name; its archive could never be
        // decompressed (the name is the header's metadata entry).
        if source.tensors.iter().any(|t| t.name == "__metadata__") {
            return Err(PipelineError::NoTensors {
                message: format!(
                    "{}: a tensor is named `__metadata__`, a name safetensors reserves",
                    path.display()
                ),
            });
        }
        if source.tensors.is_empty() {
            let skipped: Vec<String> = source
                .skipped
                .iter()
                .map(|s| format!("`{}` ({})", s.name, s.dtype))
                .collect();
            return Err(PipelineError::NoTensors {
                message: if skipped.is_empty() {
                    format!("{}: the file holds no tensor", path.display())
                } else {
                    format!(
                        "{}: no float tensor (f32, f16, bf16 or a GGUF block type) to read; skipped {}",
                        path.display(),
                        skipped.join(", ")
                    )
                },
            });
        }
        Ok(source)
    }

    /// The file read, if the source is one (not synthetic).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Every file this source reads: the file, or a sharded model's index (or folder) and its
    /// shards; none for synthetic data. An output must be none of them.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(PathBuf::as_path)
    }

    /// One seeded i.i.d. N(0, 1) tensor `gaussian.weight` of `shape`, with no metadata.
    pub fn synthetic(shape: Vec<u64>, seed: u64) -> Result<TensorSource> {
        let values = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        if values.is_none_or(|n| n > MAX_SYNTHETIC_VALUES) {
            return Err(PipelineError::SyntheticTooLarge {
                shape,
                values,
                cap: MAX_SYNTHETIC_VALUES,
            });
        }
        Ok(TensorSource {
            maps: Vec::new(),
            path: None,
            files: Vec::new(),
            tensors: vec![SourceTensor {
                name: "gaussian.weight".into(),
                shape,
                ty: SourceType::Synthetic,
                file: 0,
                start: 0,
                len: 0,
                seed,
            }],
            skipped: vec![],
            metadata: vec![],
        })
    }

    fn from_gguf(map: Mmap) -> Result<TensorSource> {
        let g = Gguf::parse(&map)?;
        let tensors = g
            .tensors
            .into_iter()
            .map(|t| SourceTensor {
                name: t.name,
                shape: t.shape,
                ty: SourceType::Ggml(t.ty),
                file: 0,
                start: t.start,
                len: t.len,
                seed: 0,
            })
            .collect();
        Ok(TensorSource {
            maps: vec![map],
            path: None,
            files: Vec::new(),
            tensors,
            skipped: g
                .skipped
                .into_iter()
                .map(|(name, dtype)| SkippedTensor { name, dtype })
                .collect(),
            metadata: vec![("gguf".into(), Value::Object(g.metadata))],
        })
    }

    fn from_safetensors(map: Mmap) -> Result<TensorSource> {
        let st_err = |e: safetensors::SafeTensorError| PipelineError::SafeTensors {
            message: e.to_string(),
        };
        let st = safetensors::SafeTensors::deserialize(&map).map_err(st_err)?;
        let (_, meta) = safetensors::SafeTensors::read_metadata(&map).map_err(st_err)?;
        let base = map.as_ptr() as usize;
        let mut tensors = Vec::new();
        let mut skipped = Vec::new();
        // File order, so that reads walk the map front to back.
        let mut views = st.tensors();
        views.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
        for (name, view) in views {
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => FloatDtype::F32,
                safetensors::Dtype::F16 => FloatDtype::F16,
                safetensors::Dtype::BF16 => FloatDtype::Bf16,
                other => {
                    skipped.push(SkippedTensor {
                        name,
                        dtype: format!("{other:?}"),
                    });
                    continue;
                }
            };
            tensors.push(SourceTensor {
                name,
                shape: view.shape().iter().map(|&d| d as u64).collect(),
                ty: SourceType::Float(dtype),
                file: 0,
                start: view.data().as_ptr() as usize - base,
                len: view.data().len(),
                seed: 0,
            });
        }
        let metadata = meta
            .metadata()
            .as_ref()
            .map(|m| {
                let obj: serde_json::Map<String, Value> = m
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                    .collect();
                vec![("safetensors".to_string(), Value::Object(obj))]
            })
            .unwrap_or_default();
        Ok(TensorSource {
            maps: vec![map],
            path: None,
            files: Vec::new(),
            tensors,
            skipped,
            metadata,
        })
    }

    /// Values of every tensor.
    pub fn total_elements(&self) -> u64 {
        self.tensors.iter().map(|t| t.numel()).sum()
    }

    /// Reads tensor `i` as `f32` and releases its pages of the map again, so that peak memory
    /// follows the largest tensor, not the file.
    pub fn read(&self, i: usize) -> Result<Vec<f32>> {
        let t = self
            .tensors
            .get(i)
            .ok_or_else(|| PipelineError::NoTensors {
                message: format!("no tensor {i} in this source"),
            })?;
        // The shape is a public field: checked against what is stored before `n` values are
        // allocated (a shape of [2^40] asked for 4 TiB; [4, 4] over 6 stored values gave zeros).
        let n = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let stored = match t.ty {
            SourceType::Synthetic => n.filter(|&n| n <= MAX_SYNTHETIC_VALUES).map(|_| 0),
            SourceType::Float(d) => n.and_then(|n| n.checked_mul(d.size() as u64)),
            SourceType::Ggml(g) => n.and_then(|n| g.stored_bytes(n)),
        };
        let n = match (n.map(usize::try_from), stored) {
            (Some(Ok(n)), Some(b)) if b == t.len as u64 => n,
            _ => {
                return Err(PipelineError::Shape {
                    tensor: t.name.clone(),
                    shape: t.shape.clone(),
                    message: format!("its values do not fill the {} bytes stored", t.len),
                })
            }
        };
        let mut out = vec![0.0f32; n];
        let map = match (t.ty, self.maps.get(t.file)) {
            (SourceType::Synthetic, _) => {
                SplitMix64(t.seed ^ 0x6879_7065_7263_6f64).fill_gaussian(&mut out);
                return Ok(out);
            }
            (_, Some(map)) => map,
            (_, None) => {
                return Err(PipelineError::NoTensors {
                    message: format!("tensor `{}` has no backing file", t.name),
                })
            }
        };
        // Float tensors convert in blocks, each block's pages dropped again right after, so the
        // file's pages and the f32 copy are never both resident for a whole huge tensor.
        let release = |start: usize, len: usize| {
            // SAFETY: the map is a read-only, file-backed mapping and no slice of this range
            // outlives this point; dropped pages are read again from the file if touched.
            // Advice only: a failure changes memory use, never results.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len)
            };
        };
        let bytes = &map[t.start..t.start + t.len];
        match t.ty {
            SourceType::Float(dtype) => {
                let size = dtype.size();
                let per = READ_BLOCK_BYTES / size;
                for (k, (o, b)) in out
                    .chunks_mut(per)
                    .zip(bytes.chunks(per * size))
                    .enumerate()
                {
                    match dtype {
                        FloatDtype::F32 => {
                            for (o, b) in o.iter_mut().zip(b.chunks_exact(4)) {
                                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                            }
                        }
                        FloatDtype::F16 => {
                            for (o, b) in o.iter_mut().zip(b.chunks_exact(2)) {
                                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
                            }
                        }
                        FloatDtype::Bf16 => {
                            for (o, b) in o.iter_mut().zip(b.chunks_exact(2)) {
                                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                            }
                        }
                    }
                    release(t.start + k * per * size, b.len());
                }
            }
            SourceType::Ggml(g) => {
                dequantize(g, bytes, &mut out).map_err(|e| match e {
                    PipelineError::Gguf { message } => PipelineError::Gguf {
                        message: format!("tensor `{}`: {message}", t.name),
                    },
                    e => e,
                })?;
                release(t.start, t.len);
            }
            SourceType::Synthetic => {}
        }
        Ok(out)
    }
}

/// Bytes of a float tensor converted before their pages are released.
const READ_BLOCK_BYTES: usize = 16 << 20;

/// The files of a sharded model, or `None` for a single file: a Hugging Face
/// `*.safetensors.index.json` (or a folder holding `model.safetensors.index.json`), whose
/// `weight_map` names the shards; or a split GGUF `NAME-00001-of-0000N.gguf` (any of its
/// parts), whose siblings are the other parts.
fn shard_files(path: &Path) -> Result<Option<(Vec<PathBuf>, Vec<String>)>> {
    let index = if path.is_dir() {
        let i = path.join("model.safetensors.index.json");
        if !i.exists() {
            return Err(PipelineError::Shards {
                message: format!(
                    "{}: a folder without model.safetensors.index.json",
                    path.display()
                ),
            });
        }
        Some(i)
    } else if path.to_string_lossy().ends_with(".index.json") {
        Some(path.to_path_buf())
    } else {
        None
    };
    if let Some(index) = index {
        let index = crate::shards::read_index(&index)?;
        return Ok(Some((index.files, index.weight_map.into_keys().collect())));
    }
    // NAME-00001-of-00003.gguf
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let Some(name) = name else { return Ok(None) };
    let Some(stem) = name.strip_suffix(".gguf") else {
        return Ok(None);
    };
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    if let [count, "of", _index, prefix] = parts[..] {
        if let Ok(n) = count.parse::<usize>() {
            if (1..=crate::shards::MAX_SHARDS).contains(&n) && count.len() == 5 {
                let dir = path.parent().unwrap_or(Path::new("."));
                return Ok(Some((
                    (1..=n)
                        .map(|i| dir.join(format!("{prefix}-{i:05}-of-{count}.gguf")))
                        .collect(),
                    Vec::new(),
                )));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_that_does_not_fill_the_stored_bytes_is_refused_before_allocating() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.safetensors");
        crate::synth::write_tensors(&path, &[("a".into(), vec![2u64, 3], vec![1.0; 6])])
            .expect("write");
        let mut src = TensorSource::open(path.to_str().expect("utf-8")).expect("open");
        assert_eq!(src.read(0).expect("read"), vec![1.0; 6]);
        // The tensors are public: a shape changed after reading.
        for shape in [vec![4u64, 4], vec![1], vec![1 << 40], vec![u64::MAX, 2]] {
            src.tensors[0].shape = shape.clone();
            assert!(
                matches!(src.read(0), Err(PipelineError::Shape { .. })),
                "{shape:?}"
            );
        }
        let mut syn = TensorSource::synthetic(vec![4, 4], 1).expect("synthetic");
        assert_eq!(syn.read(0).expect("read").len(), 16);
        syn.tensors[0].shape = vec![1 << 40];
        assert!(matches!(syn.read(0), Err(PipelineError::Shape { .. })));
        // A safetensors output whose size overflows is refused before any byte is written.
        let out = dir.path().join("o.safetensors");
        let t = crate::safetensors_out::OutTensor {
            name: "w".into(),
            shape: vec![1 << 62, 4],
            dtype: FloatDtype::F32,
        };
        let r = crate::safetensors_out::write_safetensors(&out, &[t], None, |_, _| Ok(()));
        assert!(matches!(r, Err(PipelineError::Shape { .. })));
        assert!(!out.exists());
    }

    #[test]
    fn pytorch_checkpoints_are_named_as_such() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A zip whose first entry is `m/data.pkl` (torch.save's format), under any name.
        let mut zip = b"PK\x03\x04".to_vec();
        zip.extend([0u8; 22]);
        zip.extend(10u16.to_le_bytes());
        zip.extend(0u16.to_le_bytes());
        zip.extend(b"m/data.pkl");
        // An older pickle named .pt; another zip (a legacy archive) stays an archive.
        let mut other = zip.clone();
        other[30..40].copy_from_slice(b"manifest.j");
        for (name, bytes, torch) in [
            ("a.bin", zip, true),
            ("old.pt", vec![0x80, 2, 0x8a, 0x0a], true),
            ("z.hwz", other, false),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, &bytes).expect("write");
            let r = TensorSource::open(path.to_str().expect("utf-8"));
            match r {
                Err(PipelineError::TorchCheckpoint { .. }) if torch => {}
                Err(PipelineError::AlreadyArchive { .. }) if !torch => {}
                other => panic!("{name}: {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn sharded_safetensors_and_split_gguf_open_as_one_model() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = |name: &str, v: f32| (name.to_string(), vec![2u64, 3], vec![v; 6]);
        crate::synth::write_tensors(
            &dir.path().join("model-00001-of-00002.safetensors"),
            &[t("a", 1.0), t("b", 2.0)],
        )
        .expect("shard 1");
        crate::synth::write_tensors(
            &dir.path().join("model-00002-of-00002.safetensors"),
            &[t("c", 3.0)],
        )
        .expect("shard 2");
        let index = |map: &str| {
            let p = dir.path().join("model.safetensors.index.json");
            std::fs::write(
                &p,
                format!("{{\"metadata\": {{}}, \"weight_map\": {{{map}}}}}"),
            )
            .expect("index");
            p
        };
        let ok = r#""a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors""#;
        let p = index(ok);
        for spec in [
            p.to_str().expect("utf-8"),
            dir.path().to_str().expect("utf-8"),
        ] {
            let s = TensorSource::open(spec).expect("sharded");
            let names: Vec<&str> = s.tensors.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, ["a", "b", "c"]);
            assert_eq!(s.read(2).expect("c"), vec![3.0; 6]);
            assert_eq!(s.read(0).expect("a"), vec![1.0; 6]);
        }
        let missing = index(&format!(
            "{ok}, \"d\": \"model-00002-of-00002.safetensors\""
        ));
        assert!(matches!(
            TensorSource::open(missing.to_str().expect("utf-8")),
            Err(PipelineError::Shards { .. })
        ));
        let outside = index(r#""a": "../elsewhere.safetensors""#);
        assert!(matches!(
            TensorSource::open(outside.to_str().expect("utf-8")),
            Err(PipelineError::Shards { .. })
        ));
        // A split GGUF: every part found from any of them (here the same part twice, so its
        // tensors collide: the parts were read as one model).
        let gguf = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/blocks.gguf"
        ))
        .expect("gguf");
        for i in 1..=2 {
            std::fs::write(dir.path().join(format!("m-0000{i}-of-00002.gguf")), &gguf)
                .expect("part");
        }
        let part2 = dir.path().join("m-00002-of-00002.gguf");
        assert!(matches!(
            TensorSource::open(part2.to_str().expect("utf-8")),
            Err(PipelineError::Shards { .. })
        ));
    }

    #[test]
    fn synthetic_source_is_deterministic() {
        let a = TensorSource::open("gaussian:16x32:5").expect("spec");
        let b = TensorSource::open("gaussian:16x32:5").expect("spec");
        let c = TensorSource::open("gaussian:16x32:6").expect("spec");
        assert_eq!(a.tensors[0].shape, vec![16, 32]);
        let (va, vb, vc) = (
            a.read(0).expect("a"),
            b.read(0).expect("b"),
            c.read(0).expect("c"),
        );
        assert_eq!(va, vb);
        assert_ne!(va, vc);
        // The generator is pinned: `gaussian:...:0` starts with these values on every machine
        // and in every version (bit patterns, as written by `hypercodec synth` since 0.1).
        let zero = TensorSource::open("gaussian:2x2:0")
            .expect("spec")
            .read(0)
            .expect("read");
        let bits: Vec<u32> = zero[..3].iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, [0xbf5f_e805, 0x3f7f_2aeb, 0xbef1_ec60]);
        assert!(matches!(
            TensorSource::open("gaussian:16xq"),
            Err(PipelineError::Synthetic { .. })
        ));
    }

    #[test]
    fn synthetic_tensors_above_the_cap_are_refused_before_allocating() {
        for spec in [
            "gaussian:131072x131072",
            "gaussian:65536x32769",
            "gaussian:4294967296x4294967296x16",
        ] {
            assert!(
                matches!(
                    TensorSource::open(spec),
                    Err(PipelineError::SyntheticTooLarge {
                        cap: MAX_SYNTHETIC_VALUES,
                        ..
                    })
                ),
                "{spec}"
            );
        }
        // At the cap: accepted (nothing is allocated until a read).
        assert!(TensorSource::open("gaussian:65536x32768").is_ok());
    }
}
