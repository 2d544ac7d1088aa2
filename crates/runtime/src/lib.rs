//! hypercodec-runtime: executes compressed tensors: a compressed linear operator for every
//! Encoding on CPU (and CUDA through hypercodec-kernels-cuda), and the compressed KV cache.
//!
//! Key design decision: the runtime never opens files; it takes hwz tensors (an encoding and
//! its streams) that a front end has read, decodes chunks into cache-sized buffers and fuses
//! them with the dot product, so no weight is materialized in full precision.
//!
//! Status: filled by the runtime issues.
#![deny(missing_docs)]
