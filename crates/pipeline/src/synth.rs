//! Seeded synthetic models for tests and benchmarks: the shapes of real architectures with
//! their initializers' statistics, written as safetensors.
//!
//! `cnn` is MobileNetV2 (3.5 M parameters, the torchvision layout and names): a 3×3 stem,
//! 17 inverted-residual blocks of 1×1 expansions `[hidden, cin, 1, 1]`, 3×3 depthwise
//! kernels `[hidden, 1, 3, 3]` and 1×1 projections, a 1×1 head, batch-norm weights, biases
//! and running statistics, and a 1000-way classifier — Kaiming-normal convolutions
//! (std √(2/fan_in)), batch-norm scales near 1 and variances near 1.

use crate::safetensors_out::{write_safetensors, OutTensor};
use crate::source::SplitMix64;
use crate::Result;
use hypercodec_hwz::FloatDtype;
use std::path::Path;

/// One synthetic tensor: name, shape, values.
pub type SynthTensor = (String, Vec<u64>, Vec<f32>);

/// A seeded MobileNetV2-shaped state dict (conv and linear weights, batch-norm parameters and
/// buffers, the classifier's bias), in torchvision's names and order.
pub fn cnn_state_dict(seed: u64) -> Vec<SynthTensor> {
    let mut rng = SplitMix64(seed ^ 0x636e_6e5f_7374_6174);
    let mut out: Vec<SynthTensor> = Vec::new();
    let gauss = |n: usize, rng: &mut SplitMix64| {
        let mut v = vec![0f32; n];
        rng.fill_gaussian(&mut v);
        v
    };
    let conv = |name: String, shape: Vec<u64>, out: &mut Vec<SynthTensor>, rng: &mut SplitMix64| {
        let fan_in: u64 = shape[1..].iter().product();
        let std = (2.0 / fan_in as f64).sqrt() as f32;
        let v: Vec<f32> = gauss(shape.iter().product::<u64>() as usize, rng)
            .into_iter()
            .map(|x| x * std)
            .collect();
        out.push((format!("{name}.weight"), shape, v));
    };
    let bn = |name: String, c: u64, out: &mut Vec<SynthTensor>, rng: &mut SplitMix64| {
        let g = |scale: f32, offset: f32, abs: bool, rng: &mut SplitMix64| -> Vec<f32> {
            let mut v = vec![0f32; c as usize];
            rng.fill_gaussian(&mut v);
            v.iter()
                .map(|&x| offset + scale * if abs { x.abs() } else { x })
                .collect()
        };
        let w = g(0.1, 1.0, false, rng);
        let b = g(0.05, 0.0, false, rng);
        let m = g(0.2, 0.0, false, rng);
        let var = g(0.5, 0.5, true, rng);
        for (k, v) in [
            ("weight", w),
            ("bias", b),
            ("running_mean", m),
            ("running_var", var),
        ] {
            out.push((format!("{name}.{k}"), vec![c], v));
        }
    };
    // Stem.
    conv("features.0.0".into(), vec![32, 3, 3, 3], &mut out, &mut rng);
    bn("features.0.1".into(), 32, &mut out, &mut rng);
    // Inverted residual blocks: (expansion t, channels c, repeats n).
    let mut cin = 32u64;
    let mut index = 1;
    for (t, c, n) in [
        (1u64, 16u64, 1),
        (6, 24, 2),
        (6, 32, 3),
        (6, 64, 4),
        (6, 96, 3),
        (6, 160, 3),
        (6, 320, 1),
    ] {
        for _ in 0..n {
            let hidden = cin * t;
            let base = format!("features.{index}.conv");
            let mut layer = 0;
            if t != 1 {
                conv(
                    format!("{base}.{layer}.0"),
                    vec![hidden, cin, 1, 1],
                    &mut out,
                    &mut rng,
                );
                bn(format!("{base}.{layer}.1"), hidden, &mut out, &mut rng);
                layer += 1;
            }
            conv(
                format!("{base}.{layer}.0"),
                vec![hidden, 1, 3, 3],
                &mut out,
                &mut rng,
            );
            bn(format!("{base}.{layer}.1"), hidden, &mut out, &mut rng);
            layer += 1;
            conv(
                format!("{base}.{layer}"),
                vec![c, hidden, 1, 1],
                &mut out,
                &mut rng,
            );
            bn(format!("{base}.{}", layer + 1), c, &mut out, &mut rng);
            cin = c;
            index += 1;
        }
    }
    // Head and classifier.
    conv(
        format!("features.{index}.0"),
        vec![1280, cin, 1, 1],
        &mut out,
        &mut rng,
    );
    bn(format!("features.{index}.1"), 1280, &mut out, &mut rng);
    let bound = (1.0f32 / 1280.0).sqrt();
    let w: Vec<f32> = gauss(1000 * 1280, &mut rng)
        .into_iter()
        .map(|x| x * bound * 0.6)
        .collect();
    out.push(("classifier.1.weight".into(), vec![1000, 1280], w));
    let b: Vec<f32> = gauss(1000, &mut rng)
        .into_iter()
        .map(|x| x * 0.01)
        .collect();
    out.push(("classifier.1.bias".into(), vec![1000], b));
    out
}

/// Writes `tensors` as an f32 safetensors file (atomically).
pub fn write_tensors(path: &Path, tensors: &[SynthTensor]) -> Result<()> {
    let heads: Vec<OutTensor> = tensors
        .iter()
        .map(|(name, shape, _)| OutTensor {
            name: name.clone(),
            shape: shape.clone(),
            dtype: FloatDtype::F32,
        })
        .collect();
    write_safetensors(path, &heads, None, |i, out| {
        for v in &tensors[i].2 {
            out.extend_from_slice(&v.to_le_bytes());
        }
        Ok(())
    })
}

/// The tensors of a Mistral-7B-shaped decoder (hidden 4096, MLP 14336, 32 heads of 128 with
/// 8 key/value heads, vocabulary 32000) with `layers` layers: name and shape, in order.
pub fn llm_shapes(layers: usize) -> Vec<(String, Vec<u64>)> {
    let (h, mlp, kv, vocab) = (4096u64, 14336u64, 1024u64, 32000u64);
    let mut v = vec![("model.embed_tokens.weight".to_string(), vec![vocab, h])];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, h]),
            ("mlp.gate_proj.weight", vec![mlp, h]),
            ("mlp.up_proj.weight", vec![mlp, h]),
            ("mlp.down_proj.weight", vec![h, mlp]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            v.push((format!("{p}.{name}"), shape));
        }
    }
    v.push(("model.norm.weight".into(), vec![h]));
    v.push(("lm_head.weight".into(), vec![vocab, h]));
    v
}

/// Writes a Mistral-7B-shaped model of `layers` layers into the folder `dir` as bf16
/// safetensors shards of about `shard_bytes` and a Hugging Face
/// `model.safetensors.index.json`; weights N(0, 0.02²), norms 1 + N(0, 0.05²). Tensor by
/// tensor: memory stays at one tensor. Returns the index's path.
pub fn write_llm(
    dir: &Path,
    layers: usize,
    shard_bytes: u64,
    seed: u64,
) -> Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir).map_err(crate::PipelineError::io(dir))?;
    let shapes = llm_shapes(layers);
    // Group tensors into shards in order.
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut size = 0u64;
    for (i, (_, shape)) in shapes.iter().enumerate() {
        let bytes = shape.iter().product::<u64>() * 2;
        if size > 0 && size + bytes > shard_bytes {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes;
        shards.last_mut().expect("a shard").push(i);
    }
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (k, members) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", k + 1);
        let heads: Vec<OutTensor> = members
            .iter()
            .map(|&i| OutTensor {
                name: shapes[i].0.clone(),
                shape: shapes[i].1.clone(),
                dtype: FloatDtype::Bf16,
            })
            .collect();
        write_safetensors(&dir.join(&file), &heads, None, |j, out| {
            let i = members[j];
            let (name, shape) = &shapes[i];
            let mut v = vec![0f32; shape.iter().product::<u64>() as usize];
            SplitMix64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9)).fill_gaussian(&mut v);
            let (scale, offset) = if shape.len() == 1 {
                (0.05, 1.0)
            } else {
                (0.02, 0.0)
            };
            out.reserve(v.len() * 2);
            for x in v {
                out.extend_from_slice(&half::bf16::from_f32(offset + scale * x).to_le_bytes());
            }
            weight_map.insert(name.clone(), serde_json::Value::from(file.clone()));
            Ok(())
        })?;
    }
    let index = dir.join("model.safetensors.index.json");
    let text = serde_json::to_vec_pretty(&serde_json::json!({
        "metadata": {"total_size": shapes.iter().map(|(_, s)| s.iter().product::<u64>() * 2).sum::<u64>()},
        "weight_map": weight_map,
    }))
    .map_err(|e| crate::PipelineError::Json {
        what: "index".into(),
        message: e.to_string(),
    })?;
    std::fs::write(&index, text).map_err(crate::PipelineError::io(&index))?;
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cnn_has_mobilenet_v2_shapes_and_statistics() {
        let t = cnn_state_dict(0);
        let params: usize = t.iter().map(|(_, _, v)| v.len()).sum();
        // torchvision's MobileNetV2: 3 504 872 parameters, plus 2·(batch-norm channels) buffers.
        let buffers: usize = t
            .iter()
            .filter(|(n, ..)| n.contains("running_"))
            .map(|(_, _, v)| v.len())
            .sum();
        assert_eq!(params - buffers, 3_504_872);
        let depthwise = t.iter().filter(|(_, s, _)| s[1..] == [1, 3, 3]).count();
        assert_eq!(depthwise, 17);
        let (_, shape, v) = t
            .iter()
            .find(|(n, ..)| n == "features.18.0.weight")
            .expect("head conv");
        assert_eq!(shape, &vec![1280, 320, 1, 1]);
        let std = (v.iter().map(|x| (x * x) as f64).sum::<f64>() / v.len() as f64).sqrt();
        assert!((std - (2.0f64 / 320.0).sqrt()).abs() < 0.01 * std, "{std}");
        assert_eq!(cnn_state_dict(0)[5].2, t[5].2);
        assert_ne!(cnn_state_dict(1)[5].2, t[5].2);
    }

    #[test]
    fn llm_shapes_count_seven_billion_and_a_small_one_reads_back_sharded() {
        let n: u64 = llm_shapes(32)
            .iter()
            .map(|(_, s)| s.iter().product::<u64>())
            .sum();
        assert_eq!(n, 7_241_732_096);
        let dir = tempfile::tempdir().expect("tempdir");
        // No layers: embedding, final norm, head; shards of 300 MB hold one matrix each.
        let index = write_llm(dir.path(), 0, 300_000_000, 1).expect("write");
        let s = crate::TensorSource::open(index.to_str().expect("utf-8")).expect("open");
        assert_eq!(s.tensors.len(), 3);
        let head = s.read(2).expect("head");
        let std = (head.iter().map(|x| (x * x) as f64).sum::<f64>() / head.len() as f64).sqrt();
        assert!((std - 0.02).abs() < 0.001, "{std}");
    }
}
