//! Arbitrary bytes as Rice, rANS and prefix streams (model, tables, payload) with arbitrary
//! parameters: the decoders return symbols or a typed error, never panic, and decode valid
//! re-encodings of what they return back to the same symbols.
#![no_main]

use hypercodec_rice::{prefix, rans, rice};
use libfuzzer_sys::fuzz_target;

fn e8(j: usize, first: u32) -> usize {
    if j == 0 {
        0
    } else {
        1 + (first & 1) as usize
    }
}

/// Z1/A2/D4-like: each position's context fixed (the decoders' positional vector path).
fn positional(j: usize, _first: u32) -> usize {
    (j > 0) as usize
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (head, body) = data.split_at(8);
    let n = u16::from_le_bytes([head[0], head[1]]) as usize % 4096;
    let third = body.len() / 3;
    let (a, rest) = body.split_at(third);
    let (b, c) = rest.split_at(third);
    // Rice
    let chunk = 1 + head[2] as usize;
    let mut out = vec![0u32; n];
    let parts = rice::RiceParts { params: a, offsets: b, payload: c };
    if rice::decode_parts(parts, chunk, &mut out).is_ok() {
        let again = rice::encode(&out, chunk).unwrap();
        let mut back = vec![0u32; n];
        rice::decode(&again, chunk, &mut back).unwrap();
        assert_eq!(back, out);
    }
    // rANS
    let ctx = rans::Contexts { word: 8, count: 3, map: &e8, first_free: false };
    let params = rans::RansParams { chunk: 8 * (1 + head[3] as usize), lanes: 1 + head[4] as usize % 64, prob_bits: 8 + head[5] % 8 };
    let parts = rans::RansParts { model: a, index: b, payload: c };
    let mut out = vec![0u32; n];
    if rans::decode_parts(parts, ctx, &params, &mut out).is_ok() {
        let again = rans::encode(&out, ctx, &params).unwrap();
        let mut back = vec![0u32; n];
        rans::decode(&again, ctx, &params, &mut back).unwrap();
        assert_eq!(back, out);
    }
    // rANS with positional contexts (words of 1, 2 or 4), 32 or 64 lanes: the vector path.
    let word = [1usize, 2, 4][head[6] as usize % 3];
    let ctx = rans::Contexts { word, count: 2, map: &positional, first_free: true };
    let params = rans::RansParams { chunk: 32 * (1 + head[3] as usize), lanes: 32 * (1 + head[4] as usize % 2), prob_bits: 8 + head[5] % 8 };
    let parts = rans::RansParts { model: a, index: b, payload: c };
    let mut out = vec![0u32; n];
    if rans::decode_parts(parts, ctx, &params, &mut out).is_ok() {
        let again = rans::encode(&out, ctx, &params).unwrap();
        let mut back = vec![0u32; n];
        rans::decode(&again, ctx, &params, &mut back).unwrap();
        assert_eq!(back, out);
    }
    // Prefix codes
    let forms = [(8, 0), (10, 0), (12, 0), (8, 12), (8, 11)];
    let (limit, pair_limit) = forms[head[6] as usize % forms.len()];
    // Spans of 1–3 row groups (a span above 1 where a row is longer than a segment is refused).
    let params = prefix::PrefixParams {
        limit,
        pair_limit,
        segment: 1 + head[7] as usize % 4,
        span: 1 + head[7] as usize / 4 % 3,
    };
    let layout = prefix::Layout::new(n % 40, n / 40 % 20, &params);
    if let Ok(d) = prefix::Decoder::new(a, b, c, layout, &params) {
        if let Ok(out) = d.decode() {
            let again = prefix::encode(&out, &layout, &params).unwrap();
            let d = prefix::Decoder::new(&again.model, &again.index, &again.payload, layout, &params).unwrap();
            assert_eq!(d.decode().unwrap(), out);
        }
    }
});
