//! The `mixed` and `exceptions` encodings: tensors made of other encodings. Their inner
//! streams travel concatenated in one `payload` stream described by an `index` stream of u64
//! lengths, so every inner stream is checked against its own encoding before it is decoded.

use crate::encoding::{role, Encoding};
use crate::{EncodedTensor, HwzError, Result};
use hypercodec_hdc::pack;
use hypercodec_scalar as scalar;

fn concat(parts: &[&EncodedTensor]) -> (Vec<u8>, Vec<u8>) {
    let mut index = Vec::new();
    let mut payload = Vec::new();
    for p in parts {
        for (_, b) in &p.streams {
            index.extend_from_slice(&(b.len() as u64).to_le_bytes());
            payload.extend_from_slice(b);
        }
    }
    (index, payload)
}

/// A `mixed` tensor from its parts, encoded top to bottom (each of `block_rows` rows, the last
/// possibly fewer).
pub fn assemble_mixed(block_rows: u64, parts: &[EncodedTensor]) -> EncodedTensor {
    let refs: Vec<&EncodedTensor> = parts.iter().collect();
    let (index, payload) = concat(&refs);
    EncodedTensor {
        encoding: Encoding::Mixed {
            block_rows,
            parts: parts.iter().map(|p| p.encoding.clone()).collect(),
        },
        streams: vec![(role::INDEX, index), (role::PAYLOAD, payload)],
    }
}

/// An `exceptions` tensor: `base` with the values at `positions` (strictly increasing)
/// replaced by `values` stored as `dtype`. Positions out of order, repeated, or not one a
/// value are an [`HwzError::InvalidEncoding`].
pub fn assemble_exceptions(
    tensor: &str,
    base: &EncodedTensor,
    positions: &[u64],
    values: &[f32],
    dtype: scalar::FloatDtype,
) -> Result<EncodedTensor> {
    // (Checked here, not only at decode: a caller's unordered positions made a tensor that was
    // written and then could not be read.)
    if positions.len() != values.len() || positions.windows(2).any(|w| w[0] >= w[1]) {
        return Err(HwzError::InvalidEncoding {
            tensor: tensor.into(),
            message: format!(
                "exceptions: {} strictly ascending positions for {} values",
                positions.len(),
                values.len()
            ),
        });
    }
    let (index, payload) = concat(&[base]);
    let vals =
        scalar::encode_floats(values, dtype, false).map_err(crate::encoding::scalar_err(tensor))?;
    Ok(EncodedTensor {
        encoding: Encoding::Exceptions {
            base: Box::new(base.encoding.clone()),
            count: positions.len() as u64,
            dtype,
        },
        streams: vec![
            (role::INDEX, index),
            (role::PAYLOAD, payload),
            (role::INDICES, pack::encode_positions(positions)),
            (role::VALUES, vals),
        ],
    })
}
