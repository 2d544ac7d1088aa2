//! Cross-crate tests of hypercodec; the tests live in `tests/`.
