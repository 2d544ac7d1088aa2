//! Sparse top-k residual repair (and the sparse candidate, which is the same thing against a
//! zero reconstruction): the `count` largest errors by magnitude, stored as delta-coded
//! positions and int8 values with one scale, or as f32.

use crate::pack::{decode_positions, encode_positions};
use crate::{HdcError, Result};

/// Storage of residual values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum ResidualDtype {
    /// Signed 8-bit codes times one f32 scale (`max |r| / 127`), scale stored first.
    Int8,
    /// Exact f32 corrections.
    F32,
}

impl ResidualDtype {
    /// `int8` or `f32`.
    pub fn name(self) -> &'static str {
        match self {
            ResidualDtype::Int8 => "int8",
            ResidualDtype::F32 => "f32",
        }
    }

    /// Bytes of the values stream for `count` entries.
    pub fn values_len(self, count: u64) -> u64 {
        match self {
            ResidualDtype::Int8 if count == 0 => 0,
            ResidualDtype::Int8 => 4 + count,
            ResidualDtype::F32 => 4 * count,
        }
    }
}

/// Positions (ascending) and values of the `count` largest `|target − approx|` (a NaN
/// difference counts as the largest: a non-finite value kept as an exception is kept exactly).
pub fn top_k(target: &[f32], approx: &[f32], count: usize) -> (Vec<u64>, Vec<f32>) {
    let n = target.len().min(approx.len());
    let count = count.min(n);
    if count == 0 {
        return (Vec::new(), Vec::new());
    }
    let err = |i: usize| {
        let e = (target[i] - approx[i]).abs();
        if e.is_nan() {
            f32::INFINITY
        } else {
            e
        }
    };
    // Threshold from a sample, lowered until enough candidates pass, then an exact selection
    // among the candidates: memory stays proportional to `count`, not to the tensor.
    let step = (n / 65536).max(1);
    let mut sample: Vec<f32> = (0..n).step_by(step).map(err).collect();
    let q = ((1.0 - 1.5 * count as f64 / n as f64).max(0.0) * (sample.len() - 1) as f64) as usize;
    let (_, t, _) = sample.select_nth_unstable_by(q, f32::total_cmp);
    // (Finite, so that halving reaches 0: an infinite one stayed infinite, and the loop with it.)
    let mut threshold = t.min(f32::MAX);
    let mut cand: Vec<(f32, u32)>;
    loop {
        cand = (0..n)
            .filter(|&i| err(i) >= threshold)
            .map(|i| (err(i), i as u32))
            .collect();
        if cand.len() >= count || threshold <= 0.0 {
            break;
        }
        threshold = if threshold < f32::MIN_POSITIVE {
            0.0
        } else {
            threshold * 0.5
        };
    }
    if cand.len() > count {
        cand.select_nth_unstable_by(count - 1, |a, b| b.0.total_cmp(&a.0));
        cand.truncate(count);
    }
    let mut pos: Vec<u64> = cand.iter().map(|&(_, i)| i as u64).collect();
    pos.sort_unstable();
    let vals = pos
        .iter()
        .map(|&i| target[i as usize] - approx[i as usize])
        .collect();
    (pos, vals)
}

/// The stored bytes of a residual: `(positions, values)`.
pub fn encode(positions: &[u64], values: &[f32], dtype: ResidualDtype) -> (Vec<u8>, Vec<u8>) {
    let idx = encode_positions(positions);
    let vals = match dtype {
        ResidualDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ResidualDtype::Int8 => {
            if values.is_empty() {
                Vec::new()
            } else {
                let max = values.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = max / 127.0;
                let mut out = scale.to_le_bytes().to_vec();
                out.extend(values.iter().map(|&v| {
                    if scale > 0.0 {
                        (v / scale).round().clamp(-127.0, 127.0) as i8 as u8
                    } else {
                        0
                    }
                }));
                out
            }
        }
    };
    (idx, vals)
}

/// Adds (`replace == false`) or writes (`replace == true`) `count` stored corrections into
/// `out`.
pub fn apply(
    idx: &[u8],
    vals: &[u8],
    count: usize,
    dtype: ResidualDtype,
    out: &mut [f32],
    replace: bool,
) -> Result<()> {
    Corrections::decode(idx, vals, count, dtype, out.len() as u64)?.apply(0, out, replace);
    Ok(())
}

/// Decoded sparse corrections: ascending flat positions and their values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Corrections {
    /// Flat positions, ascending.
    pub positions: Vec<u64>,
    /// The value at each position.
    pub values: Vec<f32>,
}

impl Corrections {
    /// Decodes `count` corrections whose positions are below `limit`; a non-finite value is
    /// an error.
    pub fn decode(
        idx: &[u8],
        vals: &[u8],
        count: usize,
        dtype: ResidualDtype,
        limit: u64,
    ) -> Result<Self> {
        if vals.len() as u64 != dtype.values_len(count as u64) {
            return Err(HdcError::Corrupt {
                message: format!("{} residual value bytes for {count} entries", vals.len()),
            });
        }
        let positions = decode_positions(idx, count, limit)?;
        let value = |i: usize| -> f32 {
            match dtype {
                ResidualDtype::F32 => f32::from_le_bytes([
                    vals[4 * i],
                    vals[4 * i + 1],
                    vals[4 * i + 2],
                    vals[4 * i + 3],
                ]),
                ResidualDtype::Int8 => {
                    let scale = f32::from_le_bytes([vals[0], vals[1], vals[2], vals[3]]);
                    vals[4 + i] as i8 as f32 * scale
                }
            }
        };
        let values: Vec<f32> = (0..positions.len()).map(value).collect();
        if values.iter().any(|v| !v.is_finite()) {
            return Err(HdcError::Corrupt {
                message: "non-finite residual value".into(),
            });
        }
        Ok(Corrections { positions, values })
    }

    /// Applies the corrections whose positions fall in `start .. start + out.len()` to `out`
    /// (which holds those elements): added, or replacing the value when `replace`. Positions
    /// are ascending, as [`Corrections::decode`] gives them; of fields set otherwise (out of
    /// order, or more positions than values) only what lies in range and has a value applies.
    pub fn apply(&self, start: u64, out: &mut [f32], replace: bool) {
        let end = start.saturating_add(out.len() as u64);
        let n = self.positions.len().min(self.values.len());
        let (pos, val) = (&self.positions[..n], &self.values[..n]);
        let from = pos.partition_point(|&p| p < start);
        let to = pos.partition_point(|&p| p < end).max(from);
        for (&p, &v) in pos[from..to].iter().zip(&val[from..to]) {
            if let Some(o) = p.checked_sub(start).and_then(|i| out.get_mut(i as usize)) {
                *o = if replace { v } else { *o + v };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_picks_the_largest_errors() {
        let target: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32).collect();
        let approx = vec![0f32; 1000];
        let (pos, vals) = top_k(&target, &approx, 10);
        assert_eq!(pos.len(), 10);
        assert!(vals.iter().all(|&v| v == 100.0), "{vals:?}");
        assert!(pos.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn top_k_of_nan_differences_ends_and_takes_them_first() {
        // NaN · 0.5 is NaN: the threshold loop never ended.
        let mut target: Vec<f32> = (0..5000).map(|i| (i % 7) as f32).collect();
        let approx = vec![0f32; 5000];
        for i in [3, 400, 4999] {
            target[i] = f32::NAN;
        }
        let (pos, _) = top_k(&target, &approx, 5);
        assert_eq!(pos.len(), 5);
        assert!([3u64, 400, 4999].iter().all(|p| pos.contains(p)), "{pos:?}");
        // Every difference infinite or NaN.
        let (pos, _) = top_k(&[f32::INFINITY; 100], &[0.0; 100], 10);
        assert_eq!(pos.len(), 10);
        let (pos, _) = top_k(&[f32::NAN; 100], &[f32::NAN; 100], 100);
        assert_eq!(pos.len(), 100);
    }

    #[test]
    fn corrections_apply_within_their_range_whatever_their_fields() {
        let c = Corrections {
            positions: vec![1, 5, 2, u64::MAX],
            values: vec![1.0, 2.0, 3.0],
        };
        let mut out = [0f32; 4];
        c.apply(u64::MAX - 1, &mut out, false);
        assert_eq!(out, [0.0; 4]);
        c.apply(0, &mut out, true);
        assert!(out.iter().all(|v| v.is_finite()));
        let c = Corrections {
            positions: vec![1, 3],
            values: vec![1.0, 2.0],
        };
        let mut out = [0f32; 3];
        c.apply(1, &mut out, false);
        assert_eq!(out, [1.0, 0.0, 2.0]);
    }

    #[test]
    fn int8_and_f32_round_trip() {
        let target = [0.0, 5.0, 0.0, -2.5, 0.0, 1.0];
        let approx = [0.0; 6];
        let (pos, vals) = top_k(&target, &approx, 3);
        for dtype in [ResidualDtype::Int8, ResidualDtype::F32] {
            let (i, v) = encode(&pos, &vals, dtype);
            let mut out = approx;
            apply(&i, &v, 3, dtype, &mut out, false).unwrap();
            for (o, t) in out.iter().zip(&target) {
                assert!((o - t).abs() <= 5.0 / 254.0 + 1e-6, "{out:?}");
            }
        }
        let (i, v) = encode(&pos, &vals, ResidualDtype::F32);
        assert!(apply(&i, &v[..4], 3, ResidualDtype::F32, &mut [0.0; 6], false).is_err());
    }
}
