//! A bounds-checked GGUF (v2/v3) reader with dequantization of the common llama.cpp types.
//!
//! Every length in the file is checked against the bytes that remain before it is used, so a
//! hostile file gives [`PipelineError::Gguf`] rather than a panic or an allocation bomb.

use crate::error::{PipelineError, Result};
use half::{bf16, f16};
use serde_json::Value;

/// Most tensors accepted in a GGUF file.
const MAX_TENSORS: u64 = 1 << 20;
/// Most metadata entries.
const MAX_KV: u64 = 1 << 20;
/// Highest rank (GGML's own limit is 4).
const MAX_DIMS: u32 = 8;
/// Longest string (a tokenizer's merges are arrays of short strings).
const MAX_STRING: u64 = 1 << 24;
/// Arrays longer than this are not copied into the archive's metadata (tokenizer vocabularies).
const MAX_METADATA_ARRAY: u64 = 64;

/// GGML tensor types this reader dequantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// f32.
    F32,
    /// f16.
    F16,
    /// bf16.
    Bf16,
    /// 32-value blocks: f16 scale, 4-bit codes − 8.
    Q4_0,
    /// 32-value blocks: f16 scale and min, 4-bit codes.
    Q4_1,
    /// 32-value blocks: f16 scale, 5-bit codes − 16.
    Q5_0,
    /// 32-value blocks: f16 scale and min, 5-bit codes.
    Q5_1,
    /// 32-value blocks: f16 scale, int8 codes.
    Q8_0,
    /// 256-value super-blocks, 6-bit sub-block scales and mins, 4-bit codes.
    Q4K,
    /// 256-value super-blocks, 6-bit sub-block scales and mins, 5-bit codes.
    Q5K,
    /// 256-value super-blocks, int8 sub-block scales, 6-bit codes.
    Q6K,
}

impl GgmlType {
    fn from_u32(t: u32) -> Option<Self> {
        Some(match t {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::Bf16,
            _ => return None,
        })
    }

    /// (values per block, bytes per block).
    fn block(self) -> (u64, u64) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
        }
    }

    /// The stored bytes of `n` values (whole blocks only: `None` for a partial block).
    pub(crate) fn stored_bytes(self, n: u64) -> Option<u64> {
        let (bv, bb) = self.block();
        n.is_multiple_of(bv).then(|| n / bv * bb)
    }

    /// Lowercase name, as llama.cpp prints it.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Bf16 => "bf16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q4K => "q4_k",
            GgmlType::Q5K => "q5_k",
            GgmlType::Q6K => "q6_k",
        }
    }
}

/// One tensor of a GGUF file.
#[derive(Debug, Clone)]
pub struct GgufTensor {
    /// Name.
    pub name: String,
    /// Shape outermost first (GGUF stores it innermost first; this is reversed).
    pub shape: Vec<u64>,
    /// Storage type.
    pub ty: GgmlType,
    /// Absolute byte range in the file.
    pub start: usize,
    /// Stored bytes.
    pub len: usize,
}

/// A parsed GGUF file over borrowed bytes.
#[derive(Debug)]
pub struct Gguf {
    /// The tensors.
    pub tensors: Vec<GgufTensor>,
    /// Scalar and small-array metadata, for the archive's metadata.
    pub metadata: serde_json::Map<String, Value>,
    /// Integer tensors (I8, I16, I32, I64: token ids, positions), left out as a safetensors
    /// file's are: (name, type).
    pub skipped: Vec<(String, String)>,
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

fn bad(msg: impl Into<String>) -> PipelineError {
    PipelineError::Gguf {
        message: msg.into(),
    }
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let n = usize::try_from(n).map_err(|_| bad("length overflows"))?;
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| bad("file is truncated"))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u64()?;
        if n > MAX_STRING {
            return Err(bad(format!("string of {n} bytes exceeds the limit")));
        }
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    /// Reads a value of type `t`; arrays are returned only when short.
    fn value(&mut self, t: u32, depth: u32) -> Result<Option<Value>> {
        let v = match t {
            0 => Value::from(self.take(1)?[0]),
            1 => Value::from(self.take(1)?[0] as i8),
            2 => {
                let s = self.take(2)?;
                Value::from(u16::from_le_bytes([s[0], s[1]]))
            }
            3 => {
                let s = self.take(2)?;
                Value::from(i16::from_le_bytes([s[0], s[1]]))
            }
            4 => Value::from(self.u32()?),
            5 => Value::from(self.u32()? as i32),
            6 => Value::from(f32::from_bits(self.u32()?) as f64),
            7 => Value::from(self.take(1)?[0] != 0),
            8 => Value::from(self.string()?),
            9 => {
                if depth > 2 {
                    return Err(bad("arrays nested too deep"));
                }
                let et = self.u32()?;
                let n = self.u64()?;
                // Every element takes at least one byte: the count is bounded by the file.
                if n > (self.b.len() - self.pos) as u64 {
                    return Err(bad(format!("array of {n} elements exceeds the file")));
                }
                let mut items = Vec::new();
                for _ in 0..n {
                    let item = self.value(et, depth + 1)?;
                    if n <= MAX_METADATA_ARRAY {
                        items.extend(item);
                    }
                }
                return Ok((n <= MAX_METADATA_ARRAY).then_some(Value::Array(items)));
            }
            10 => Value::from(self.u64()?),
            11 => Value::from(self.u64()? as i64),
            12 => Value::from(f64::from_bits(self.u64()?)),
            _ => return Err(bad(format!("unknown metadata value type {t}"))),
        };
        Ok(Some(v))
    }
}

/// True when `bytes` starts like a GGUF file.
pub fn is_gguf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"GGUF")
}

impl Gguf {
    /// Parses the header, metadata and tensor table; tensor data stays in `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Gguf> {
        let mut c = Cursor { b: bytes, pos: 0 };
        if c.take(4)? != b"GGUF" {
            return Err(bad("not a GGUF file"));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(bad(format!(
                "GGUF version {version} is not supported (2 and 3 are)"
            )));
        }
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        if n_tensors > MAX_TENSORS || n_kv > MAX_KV {
            return Err(bad(format!(
                "{n_tensors} tensors / {n_kv} metadata entries exceed the limits"
            )));
        }
        let mut metadata = serde_json::Map::new();
        let mut alignment = 32u64;
        for _ in 0..n_kv {
            let key = c.string()?;
            let t = c.u32()?;
            let v = c.value(t, 0)?;
            if key == "general.alignment" {
                alignment = v
                    .as_ref()
                    .and_then(Value::as_u64)
                    .filter(|a| a.is_power_of_two() && *a <= 1 << 20)
                    .ok_or_else(|| bad("general.alignment must be a power of two"))?;
            }
            if let Some(v) = v {
                metadata.insert(key, v);
            }
        }
        let mut infos = Vec::with_capacity(n_tensors.min(4096) as usize);
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()?;
            if n_dims > MAX_DIMS {
                return Err(bad(format!("tensor `{name}` has {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64()?);
            }
            let t = c.u32()?;
            let offset = c.u64()?;
            infos.push((name, dims, t, offset));
        }
        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(infos.len());
        let mut skipped = Vec::new();
        for (name, dims, t, offset) in infos {
            if let Some(int) = ["I8", "I16", "I32", "I64"].get((t as usize).wrapping_sub(24)) {
                skipped.push((name, int.to_string()));
                continue;
            }
            let ty = GgmlType::from_u32(t).ok_or_else(|| PipelineError::UnsupportedDtype {
                tensor: name.clone(),
                dtype: format!("ggml type {t}"),
            })?;
            let n = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| bad(format!("tensor `{name}` shape overflows")))?;
            let (bv, bb) = ty.block();
            if dims.first().is_some_and(|&d0| d0 % bv != 0) {
                return Err(bad(format!(
                    "tensor `{name}`: row of {} values is not a multiple of the {bv}-value block",
                    dims[0]
                )));
            }
            let len = (n / bv)
                .checked_mul(bb)
                .ok_or_else(|| bad("tensor size overflows"))?;
            let start = data_start
                .checked_add(offset)
                .ok_or_else(|| bad("offset overflows"))?;
            let end = start
                .checked_add(len)
                .filter(|&e| e <= bytes.len() as u64)
                .ok_or_else(|| bad(format!("tensor `{name}` data lies outside the file")))?;
            tensors.push(GgufTensor {
                name,
                shape: dims.into_iter().rev().collect(),
                ty,
                start: start as usize,
                len: (end - start) as usize,
            });
        }
        Ok(Gguf {
            tensors,
            metadata,
            skipped,
        })
    }
}

fn h(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// 6-bit scale and min `j` of a K-quant super-block (llama.cpp `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((q[j] & 63) as f32, (q[j + 4] & 63) as f32)
    } else {
        (
            ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as f32,
            ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as f32,
        )
    }
}

/// Dequantizes `data` (exactly the tensor's bytes) of type `ty` into `out`.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    let (bv, bb) = ty.block();
    if data.len() as u64 != out.len() as u64 / bv * bb || !(out.len() as u64).is_multiple_of(bv) {
        return Err(bad("tensor data size does not match its shape"));
    }
    let blocks = data
        .chunks_exact(bb as usize)
        .zip(out.chunks_exact_mut(bv as usize));
    match ty {
        GgmlType::F32 => {
            for (b, o) in blocks {
                o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => blocks.for_each(|(b, o)| o[0] = h(b, 0)),
        GgmlType::Bf16 => {
            blocks.for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        GgmlType::Q4_0 => {
            for (b, o) in blocks {
                let d = h(b, 0);
                for j in 0..16 {
                    o[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
                    o[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (b, o) in blocks {
                let (d, m) = (h(b, 0), h(b, 2));
                for j in 0..16 {
                    o[j] = (b[4 + j] & 0xF) as f32 * d + m;
                    o[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            for (b, o) in blocks {
                let (d, m, at) = if ty == GgmlType::Q5_0 {
                    (h(b, 0), 0.0, 2)
                } else {
                    (h(b, 0), h(b, 2), 4)
                };
                let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                let qs = &b[at + 4..at + 20];
                let bias = if ty == GgmlType::Q5_0 { 16 } else { 0 };
                for j in 0..16 {
                    let h0 = (((qh >> j) << 4) & 0x10) as u8;
                    let h1 = ((qh >> (j + 12)) & 0x10) as u8;
                    o[j] = (((qs[j] & 0xF) | h0) as i32 - bias) as f32 * d + m;
                    o[j + 16] = (((qs[j] >> 4) | h1) as i32 - bias) as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (b, o) in blocks {
                let d = h(b, 0);
                for j in 0..32 {
                    o[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            for (b, o) in blocks {
                let (d, dmin) = (h(b, 0), h(b, 2));
                let scales = &b[4..16];
                let (qh, ql) = if ty == GgmlType::Q5K {
                    (&b[16..48], &b[48..176])
                } else {
                    (&b[0..0], &b[16..144])
                };
                for (k, chunk) in o.chunks_exact_mut(64).enumerate() {
                    let (s1, m1) = scale_min_k4(2 * k, scales);
                    let (s2, m2) = scale_min_k4(2 * k + 1, scales);
                    let q = &ql[32 * k..32 * k + 32];
                    for l in 0..32 {
                        let (hi1, hi2) = if qh.is_empty() {
                            (0, 0)
                        } else {
                            (
                                ((qh[l] >> (2 * k)) & 1) << 4,
                                ((qh[l] >> (2 * k + 1)) & 1) << 4,
                            )
                        };
                        chunk[l] = d * s1 * ((q[l] & 0xF) | hi1) as f32 - dmin * m1;
                        chunk[l + 32] = d * s2 * ((q[l] >> 4) | hi2) as f32 - dmin * m2;
                    }
                }
            }
        }
        GgmlType::Q6K => {
            for (b, o) in blocks {
                let (ql_all, qh_all, sc_all) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = h(b, 208);
                for half in 0..2 {
                    let ql = &ql_all[64 * half..];
                    let qh = &qh_all[32 * half..];
                    let sc = &sc_all[8 * half..];
                    let y = &mut o[128 * half..128 * half + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 file of `(name, dims, ggml type, bytes)` tensors and no metadata.
    fn gguf(tensors: &[(&str, &[u64], u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend(0u64.to_le_bytes());
        let mut offset = 0u64;
        for (name, dims, t, data) in tensors {
            b.extend((name.len() as u64).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(t.to_le_bytes());
            b.extend(offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        for (_, _, _, data) in tensors {
            b.resize(b.len().div_ceil(32) * 32, 0);
            b.extend(data);
        }
        b
    }

    #[test]
    fn integer_tensors_are_left_out_and_unknown_types_refused() {
        let f32s: Vec<u8> = [1f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let ids: Vec<u8> = [7i32, 8, 9, 10]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let bytes = gguf(&[("w", &[4], 0, f32s.clone()), ("ids", &[4], 26, ids)]);
        let g = Gguf::parse(&bytes).expect("parse");
        assert_eq!(g.tensors.len(), 1);
        assert_eq!(g.tensors[0].name, "w");
        assert_eq!(g.skipped, vec![("ids".to_string(), "I32".to_string())]);
        // A type this reader does not know (not an integer) still stops the run.
        let bytes = gguf(&[("w", &[4], 0, f32s), ("k", &[256], 99, vec![0; 64])]);
        assert!(matches!(
            Gguf::parse(&bytes),
            Err(PipelineError::UnsupportedDtype { .. })
        ));
    }
}
