//! Arbitrary values and encoding parameters through encode → write → open → decode: the
//! decoded tensor equals what the codec alone decodes, and raw encodings are exact.
#![no_main]

use hypercodec_hwz::{
    decode_into, encode, AffineParams, Archive, Compression, EncodeOptions, Encoding, FloatDtype, Group, Writer,
    WriterOptions,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (head, body) = data.split_at(4);
    let dtype = [FloatDtype::F32, FloatDtype::F16, FloatDtype::Bf16][head[0] as usize % 3];
    let enc = if head[1] & 1 == 0 {
        Encoding::Raw { dtype }
    } else {
        let group = match head[2] % 3 {
            0 => Group::Tensor,
            1 => Group::Row,
            _ => Group::Size(1 + (head[2] as u32 >> 2)),
        };
        Encoding::affine(AffineParams { bits: 1 + head[1] % 8, group, symmetric: head[1] & 2 != 0, scale_dtype: dtype })
    };
    let values: Vec<f32> = body.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let cols = 1 + head[3] as usize % 16;
    let rows = values.len() / cols;
    let values = &values[..rows * cols];
    let shape = [rows as u64, cols as u64];
    let Ok(t) = encode("t", values, &shape, &enc, EncodeOptions { allow_non_finite: true, ..EncodeOptions::default() }) else {
        return; // non-finite affine input or an overflowing scale: a typed error is the contract
    };
    let mut w = Writer::new(Vec::new(), WriterOptions { compression: Compression::Zstd, ..Default::default() }).unwrap();
    w.add_tensor("t", &shape, "f32", &t, None).unwrap();
    let (bytes, _) = w.finish().unwrap();
    let got = Archive::open(&bytes[..]).unwrap().decode_tensor("t").unwrap();
    let refs: Vec<(&str, &[u8])> = t.streams.iter().map(|(r, b)| (*r, b.as_slice())).collect();
    let mut direct = vec![0.0; values.len()];
    decode_into("t", &enc, &shape, &refs, &mut direct).unwrap();
    assert!(got.iter().zip(&direct).all(|(a, b)| a.to_bits() == b.to_bits()));
    if let Encoding::Raw { dtype } = enc {
        assert!(values.iter().zip(&got).all(|(a, b)| dtype.round(*a).to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())));
    }
});
