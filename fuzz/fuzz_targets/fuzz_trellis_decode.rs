//! Arbitrary bytes as trellis streams with arbitrary `(L, K, n)`: the decoder returns values
//! or a typed error, never panics, and every value it returns equals the random-access read.
#![no_main]

use hypercodec_trellis::{decode, value_at, TrellisParams};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (head, bits) = data.split_at(4);
    let p = TrellisParams::new(head[0] % 20, head[1] % 10);
    let n = u16::from_le_bytes([head[2], head[3]]) as usize % 8192;
    if let Ok(v) = decode(bits, n, &p) {
        assert_eq!(v.len(), n);
        for (i, &x) in v.iter().enumerate().step_by(7) {
            assert_eq!(value_at(bits, n, &p, i).ok(), Some(x));
        }
    } else {
        assert!(value_at(bits, n, &p, 0).is_err());
    }
});
