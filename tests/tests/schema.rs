//! The manifest JSON Schema (`crates/hwz/manifest.schema.json`) and the code agree: every
//! manifest the writer makes validates, and manifests the reader refuses for their shape are
//! refused by the schema too.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use hypercodec_tests::{sample_archive, split};
use serde_json::{json, Value};

fn schema() -> jsonschema::Validator {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crates/hwz/manifest.schema.json"
    ))
    .unwrap();
    jsonschema::validator_for(&serde_json::from_str::<Value>(&text).unwrap()).unwrap()
}

#[test]
fn written_manifests_validate() {
    let v = schema();
    let (_, m) = split(&sample_archive());
    let errors: Vec<String> = v.iter_errors(&m).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    for name in [
        "golden-v1.hwz",
        "golden-v1-trellis.hwz",
        "golden-v1-trellis-pairs.hwz",
        "golden-v1-prefix.hwz",
        "golden-v1-prefix-span.hwz",
    ] {
        let path = format!("{}/data/{name}", env!("CARGO_MANIFEST_DIR"));
        let golden = std::fs::read(path).unwrap();
        let errors: Vec<String> = v
            .iter_errors(&split(&golden).1)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");
    }
    // A trellis encoding's `v` is 1 or 2.
    let pairs = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/golden-v1-trellis-pairs.hwz"
    ))
    .unwrap();
    let mut m = split(&pairs).1;
    m["tensors"][0]["encoding"]["v"] = json!(3);
    assert!(!v.is_valid(&m));
}

#[test]
fn malformed_manifests_are_invalid() {
    let v = schema();
    let (_, good) = split(&sample_archive());
    let edits = [
        ("/version", json!(3)),
        ("/tensors/0/encoding", json!({"type": "quantum"})),
        ("/tensors/0/encoding/dtype", json!("f12")),
        ("/tensors/0/shape", json!([1, 1, 1, 1, 1, 1, 1, 1, 1])),
        ("/tensors/0/name", json!("")),
        ("/streams/0/offset", json!(65)),
        ("/streams/0/compression", json!("lz4")),
    ];
    for (pointer, value) in edits {
        let mut m = good.clone();
        *m.pointer_mut(pointer).unwrap() = value;
        assert!(!v.is_valid(&m), "{pointer} edit should be invalid");
    }
    let mut m = good.clone();
    m["tensors"][0]["encoding"]["extra"] = json!(1);
    assert!(!v.is_valid(&m), "unknown encoding field");
    let affine = good["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .position(|t| t["encoding"]["type"] == "affine")
        .unwrap();
    let mut m = good.clone();
    m["tensors"][affine]["encoding"]["bits"] = json!(9);
    assert!(!v.is_valid(&m));
}
