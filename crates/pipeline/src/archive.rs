//! Archives on disk: inspect (native and legacy), decompress to safetensors, synthetic inputs.

use crate::compress::io_at;
use crate::error::{PipelineError, Result};
use crate::progress::{Cancel, Phase, Progress, Tracker};
use crate::safetensors_out::{write_safetensors, OutTensor};
use crate::source::TensorSource;
use crate::summary::legacy_summary;
use hypercodec_hwz::legacy::LegacyArchive;
use hypercodec_hwz::{self as hwz, Archive, FloatDtype};
use memmap2::Mmap;
use serde_json::{json, Value};
use std::path::Path;

/// True when the file starts like a legacy (zip) archive.
pub fn is_legacy(path: &Path) -> Result<bool> {
    let mut head = [0u8; 4];
    let mut f = crate::output::open_input(path)?;
    let n = std::io::Read::read(&mut f, &mut head).map_err(PipelineError::io(path))?;
    Ok(n == 4 && head == hwz::ZIP_MAGIC)
}

/// Opens a native archive through a memory map.
pub fn open_archive(path: &Path) -> Result<Archive<Mmap>> {
    crate::output::check_input(path)?; // (a FIFO is refused before the open would block)
                                       // Its format errors name the file (`inspect a.hwz b.hwz` said "bad magic" of neither).
    Archive::open_path(path).map_err(|e| match io_at(path, e) {
        PipelineError::Hwz(source) => PipelineError::Archive {
            path: path.into(),
            source,
        },
        e => e,
    })
}

/// Opens a legacy Hyper Glyph zip archive (memory-mapped).
pub fn open_legacy(path: &Path) -> Result<LegacyArchive<Mmap>> {
    let file = crate::output::open_input(path)?;
    // SAFETY: read-only map of a file the user names, assumed unchanged while we run; every
    // access is bounds-checked by the legacy reader.
    let map = unsafe { Mmap::map(&file) }.map_err(PipelineError::io(path))?;
    Ok(LegacyArchive::open(map)?)
}

/// What `inspect --json` prints of an archive, native or legacy: the summary plus `file`.
/// A legacy summary has `"format": "hyperglyph (legacy zip)"`.
pub fn inspect_file(path: &Path) -> Result<Value> {
    let mut v = if is_legacy(path)? {
        let a = open_legacy(path)?;
        let file_bytes = std::fs::metadata(path)
            .map_err(PipelineError::io(path))?
            .len();
        legacy_summary(&a, file_bytes)
    } else {
        // One archive, or a sharded archive's index: one model either way.
        let set = crate::shards::ArchiveSet::open(path)?;
        let mut v = set.summary()?.to_value();
        // The source's tensors compress left out (not float): in no archive, so say which.
        let skipped: Vec<Value> = set
            .parts
            .iter()
            .filter_map(|(_, a)| a.manifest().metadata.get("skipped_tensors"))
            .filter_map(Value::as_array)
            .flatten()
            .cloned()
            .collect();
        if let (Value::Object(m), false) = (&mut v, skipped.is_empty()) {
            m.insert("skipped_tensors".into(), Value::Array(skipped));
        }
        v
    };
    if let Value::Object(m) = &mut v {
        m.insert("file".into(), json!(path));
    }
    Ok(v)
}

/// Little-endian `dtype` bytes of decoded values. Non-finite values an archive holds are
/// restored as they are; finite values that overflow the type are an error, not an infinity,
/// and so are values that underflow it as a whole (the cast keeps less than
/// [`MIN_CAST_SNR_DB`] of the tensor: f16 of weights of 1e-9), not zeros.
pub fn float_bytes(name: &str, values: &[f32], dtype: FloatDtype) -> Result<Vec<u8>> {
    let err = |source| scalar_err(name, source);
    let keep = values.iter().any(|v| !v.is_finite());
    let bytes = hypercodec_scalar::encode_floats(values, dtype, keep).map_err(err)?;
    if !keep && dtype != FloatDtype::F32 {
        let mut acc = crate::ErrorAcc::default();
        let mut back = vec![0f32; values.len().min(1 << 16)];
        for (v, b) in values.chunks(1 << 16).zip(bytes.chunks(dtype.size() << 16)) {
            let back = &mut back[..v.len()];
            hypercodec_scalar::decode_floats_into(b, dtype, back).map_err(err)?;
            acc.add(v, back);
        }
        if acc.noise > 0.0 && acc.snr_db() < MIN_CAST_SNR_DB {
            return Err(err(hypercodec_scalar::ScalarError::ValuesUnderflow {
                dtype,
                snr_db: acc.snr_db(),
            }));
        }
    }
    Ok(bytes)
}

/// [`float_bytes`] in the tensor's own source type: its values were that type's, so a decoded
/// value past its largest (an f16 weight at 65504 decoded to 65540) is rounding error, and is
/// clamped to it (nearer the original: it could be no larger); values that were f16 subnormals
/// are kept as such, not refused as an underflow. Non-finite values stay as they are.
pub fn source_float_bytes(name: &str, values: &[f32], dtype: FloatDtype) -> Result<Vec<u8>> {
    let top = match dtype {
        FloatDtype::F16 => 65504.0, // (f16's largest finite value)
        _ => return float_bytes(name, values, dtype),
    };
    let clamped: Vec<f32> = values
        .iter()
        .map(|&v| if v.is_finite() { v.clamp(-top, top) } else { v })
        .collect();
    let keep = clamped.iter().any(|v| !v.is_finite());
    hypercodec_scalar::encode_floats(&clamped, dtype, keep)
        .map_err(|source| scalar_err(name, source))
}

/// A cast's error, naming its tensor.
fn scalar_err(name: &str, source: hypercodec_scalar::ScalarError) -> PipelineError {
    PipelineError::Hwz(hwz::HwzError::Scalar {
        tensor: name.to_string(),
        source,
    })
}

/// The least signal-to-error ratio (dB) a cast of decoded values to f16 or bf16 must keep:
/// rounding values within the type's range keeps about 50 (bf16) or 74 dB (f16).
pub const MIN_CAST_SNR_DB: f64 = 30.0;

/// Restores an archive (native or legacy) to a `.safetensors` file; each tensor in `dtype`,
/// by default its source type (f32 for GGUF block types and legacy archives), with the source
/// file's `__metadata__` when the archive kept it.
pub fn decompress(
    input: &Path,
    output: &Path,
    dtype: Option<FloatDtype>,
    progress: &mut dyn FnMut(Progress<'_>),
    cancel: &Cancel,
) -> Result<()> {
    crate::output::check_output(output, [input])?;
    if is_legacy(input)? {
        let a = open_legacy(input)?;
        let dtype = dtype.unwrap_or(FloatDtype::F32);
        let tensors: Vec<OutTensor> = a
            .tensors()
            .iter()
            .map(|t| OutTensor {
                name: t.name.clone(),
                shape: t.shape.clone(),
                dtype,
            })
            .collect();
        let total = a.tensors().iter().map(|t| t.numel()).sum();
        let mut bar = Tracker::new(Phase::Decompress, total, progress);
        return write_safetensors(output, &tensors, None, |i, out| {
            cancel.check()?;
            let t = &a.tensors()[i];
            let values = a.decode_tensor(&t.name)?;
            out.extend_from_slice(&float_bytes(&t.name, &values, dtype)?);
            bar.step(&t.name, t.numel());
            Ok(())
        });
    }
    let archive = crate::shards::ArchiveSet::open(input)?;
    // A shard of an index is an input too (the rename would destroy it).
    crate::output::check_output(output, archive.files())?;
    let tensors: Vec<_> = archive
        .tensors()
        .map(|t| OutTensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            dtype: dtype
                .or_else(|| FloatDtype::from_name(&t.source_dtype))
                .unwrap_or(FloatDtype::F32),
        })
        .collect();
    let total: u64 = archive.tensors().map(|t| t.numel()).sum();
    let entries: Vec<_> = archive.tensors().collect();
    let mut bar = Tracker::new(Phase::Decompress, total, progress);
    // The source file's `__metadata__` (kept under `safetensors`), strings only as the format
    // requires.
    let metadata = archive.parts.first().and_then(|(_, a)| {
        let m = a.manifest().metadata.get("safetensors")?.as_object()?;
        Some(
            m.iter()
                .filter(|(_, v)| v.is_string())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    });
    let mut values = Vec::new();
    write_safetensors(output, &tensors, metadata, |i, out| {
        cancel.check()?;
        let entry = entries[i];
        values.resize(entry.numel() as usize, 0.0);
        archive.decode_into(i, &mut values)?;
        let own = FloatDtype::from_name(&entry.source_dtype) == Some(tensors[i].dtype);
        let bytes = if own { source_float_bytes } else { float_bytes };
        out.extend_from_slice(&bytes(&entry.name, &values, tensors[i].dtype)?);
        bar.step(&entry.name, entry.numel());
        Ok(())
    })
}

/// Writes `count` seeded i.i.d. Gaussian f32 tensors `layers.N.weight` of `shape`
/// (`ROWSxCOLS...`) to a `.safetensors` file; tensor `i` has the values of
/// `gaussian:SHAPE:{seed + i}`.
pub fn write_synthetic(output: &Path, shape: &str, count: usize, seed: u64) -> Result<()> {
    crate::output::check_output(output, [])?;
    // Its header is built in memory: ten million tensors took 3.7 GB before a byte was written.
    const MAX_SYNTH_TENSORS: usize = 1 << 16;
    if count > MAX_SYNTH_TENSORS {
        return Err(PipelineError::Synthetic {
            spec: format!("{count} tensors"),
            reason: format!("at most {MAX_SYNTH_TENSORS}"),
        });
    }
    let (dims, _) = shape.split_once(':').unwrap_or((shape, ""));
    let parsed: Vec<u64> = dims
        .split('x')
        .map(|d| {
            d.parse().map_err(|_| PipelineError::Synthetic {
                spec: shape.into(),
                reason: "use e.g. 4096x4096".into(),
            })
        })
        .collect::<Result<_>>()?;
    let tensors: Vec<_> = (0..count)
        .map(|i| OutTensor {
            name: format!("layers.{i}.weight"),
            shape: parsed.clone(),
            dtype: FloatDtype::F32,
        })
        .collect();
    write_safetensors(output, &tensors, None, |i, out| {
        let source = TensorSource::synthetic(parsed.clone(), seed + i as u64)?;
        for v in source.read(0)? {
            out.extend_from_slice(&v.to_le_bytes());
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors_out::check_names;
    use hypercodec_hwz::{EncodeOptions, Encoding, FileWriter, WriterOptions};

    #[test]
    fn names_a_safetensors_header_cannot_hold_are_refused_before_writing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("m.hwz");
        let mut w = FileWriter::create(&input, WriterOptions::default()).expect("create");
        let raw = Encoding::Raw {
            dtype: FloatDtype::F32,
        };
        for name in ["a", "__metadata__"] {
            let t = hwz::encode(name, &[1.0, 2.0], &[2], &raw, EncodeOptions::default())
                .expect("encode");
            w.add_tensor(name, &[2], "f32", &t, None).expect("add");
        }
        w.finish().expect("finish");
        let out = dir.path().join("m.safetensors");
        let r = decompress(&input, &out, None, &mut |_| {}, &Cancel::new());
        assert!(
            matches!(r, Err(PipelineError::OutputName { ref name, .. }) if name == "__metadata__"),
            "{r:?}"
        );
        assert!(!out.exists());
        // Duplicate and empty names (a legacy zip or a producer may carry them).
        for names in [&["a", "b", "a"][..], &["a", ""]] {
            assert!(matches!(
                check_names(names.iter().copied()),
                Err(PipelineError::OutputName { .. })
            ));
        }
        assert!(check_names(["a", "b"]).is_ok());
    }

    #[test]
    fn a_cast_that_loses_the_tensor_is_an_error_not_zeros() {
        let g: Vec<f32> = (0..300)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        // In range: bytes, both types.
        for dtype in [FloatDtype::F16, FloatDtype::Bf16] {
            assert_eq!(float_bytes("w", &g, dtype).unwrap().len(), 600);
        }
        // Below f16's least subnormal (about 6e-8) every value is zero; at 1e-7 a few bits
        // are left: both refused with a typed error, as an overflow is. bf16 holds them.
        for scale in [1e-9f32, 1e-7] {
            let tiny: Vec<f32> = g.iter().map(|v| v * scale).collect();
            let r = float_bytes("w", &tiny, FloatDtype::F16);
            assert!(
                matches!(
                    r,
                    Err(PipelineError::Hwz(hwz::HwzError::Scalar {
                        source: hypercodec_scalar::ScalarError::ValuesUnderflow { .. },
                        ..
                    }))
                ),
                "{scale}: {r:?}"
            );
            assert!(float_bytes("w", &tiny, FloatDtype::Bf16).is_ok());
        }
        // A few tiny values beside normal ones are rounding, not a lost tensor; nor are zeros.
        let mut mixed = g.clone();
        mixed[..10].iter_mut().for_each(|v| *v *= 1e-9);
        assert!(float_bytes("w", &mixed, FloatDtype::F16).is_ok());
        assert!(float_bytes("w", &[0.0; 8], FloatDtype::F16).is_ok());
        // In the tensor's own type (f16 weights decoded): past f16's largest is rounding,
        // clamped; tiny values were f16 subnormals, kept. (Both were refused: compress took
        // such an f16 model, and decompress gave it back only with --dtype f32.)
        let back = |v: &[f32]| {
            let b = source_float_bytes("w", v, FloatDtype::F16).expect("own type");
            let mut out = vec![0f32; v.len()];
            hypercodec_scalar::decode_floats_into(&b, FloatDtype::F16, &mut out).expect("decode");
            out
        };
        assert!(float_bytes("w", &[65540.0, 1.0], FloatDtype::F16).is_err());
        assert_eq!(back(&[65540.0, -70000.0, 1.0]), [65504.0, -65504.0, 1.0]);
        let tiny: Vec<f32> = g.iter().map(|v| v * 1e-7).collect();
        assert!(back(&tiny).iter().any(|&v| v != 0.0));
    }

    #[test]
    fn decompress_restores_the_source_metadata() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (input, hwz, out) = (
            dir.path().join("m.safetensors"),
            dir.path().join("m.hwz"),
            dir.path().join("back.safetensors"),
        );
        let meta: serde_json::Map<String, Value> = [
            ("format".to_string(), json!("pt")),
            ("k".to_string(), json!("v")),
        ]
        .into_iter()
        .collect();
        let t = crate::safetensors_out::OutTensor {
            name: "w".into(),
            shape: vec![4, 8],
            dtype: FloatDtype::F32,
        };
        crate::safetensors_out::write_safetensors(&input, &[t], Some(meta.clone()), |_, buf| {
            buf.extend((0..32).flat_map(|i| (i as f32).to_le_bytes()));
            Ok(())
        })
        .expect("write");
        let source = crate::TensorSource::open(input.to_str().expect("utf-8")).expect("open");
        crate::compress_to_file(
            &source,
            &crate::CompressOptions::default(),
            &hwz,
            true,
            &mut |_| {},
            &Cancel::new(),
        )
        .expect("compress");
        decompress(&hwz, &out, None, &mut |_| {}, &Cancel::new()).expect("decompress");
        let bytes = std::fs::read(&out).expect("read");
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).expect("json");
        assert_eq!(header["__metadata__"], Value::Object(meta));
    }
}
