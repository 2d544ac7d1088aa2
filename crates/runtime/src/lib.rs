//! hypercodec-runtime: executes compressed tensors. [`CompressedLinear`] computes
//! `y = x·Wᵀ (+ b)` for a weight stored in any hwz encoding, on the CPU, without ever holding
//! `W` in full precision.
//!
//! Key design decision: the operator runs on the *stored* form. It owns the tensor's validated
//! [`hwz::TensorView`] (the stored bytes plus parsed side information) and, at batch 1, moves
//! the work to the activation instead of the weight: affine codes are dotted in groups against
//! `x` with the group offsets folded into per-group sums of `x` (codes of every width 1–8 read
//! in place, a 32-bit lane word of codes at a time: a byte, or 20, 24 or 28 bits); a lattice row is dotted
//! against `RHT(x)`, computed once per call (`y_r = (σ_r/α)·⟨p_r, RHT(x)⟩`), with fixed-rate E8
//! words rebuilt in registers (coset bit and parity coordinate) instead of a dense row;
//! entropy-coded symbols are decoded a chunk at a time into a per-thread buffer and consumed at
//! once ("resident"); trellis bits are decoded in registers (each weight's window, the 1MAD
//! hash and its byte sum) against `RHT(x)`; a codebook becomes a lookup table of prototype·x
//! dot products; a low-rank weight is two thin products. Larger batches decode row tiles that
//! fit the cache and run a GEMM ([`gemm`]) on them (lattice and trellis tiles without the
//! inverse RHT, against `RHT(X)`). Every path is checked against [`reference::linear`], which
//! decodes `W` to f32 and multiplies plainly.
//!
//! Instruction sets: AVX-512 (affine rows; trellis rows with VBMI + VNNI), AVX2 + FMA, or
//! portable loops, chosen at run time
//! ([`simd_level`]); `HYPERCODEC_NO_AVX512=1` keeps to AVX2 for comparison.
//!
//! Threads: the rows are split over rayon's global pool, the workspace's one pool (its size is
//! set by the front ends' `--threads` / `HYPERCODEC_THREADS`).
//!
//! ```
//! use hypercodec_hwz::{encode, EncodeOptions, Encoding, FloatDtype, Group};
//! use hypercodec_runtime::{CompressedLinear, LoadOptions};
//! let (rows, cols) = (64usize, 256usize);
//! let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0).collect();
//! let int4 = Encoding::Affine { bits: 4, group: Group::Size(128), symmetric: false, scale_dtype: FloatDtype::F16 };
//! let shape = [rows as u64, cols as u64];
//! let t = encode("w", &w, &shape, &int4, EncodeOptions::default())?;
//! let op = CompressedLinear::from_encoded("w", &t, &shape, None, &LoadOptions::default())?;
//! assert_eq!(op.path().to_string(), "affine-int4-fused");
//! let x = vec![1.0f32; cols];
//! let mut y = vec![0.0f32; rows];
//! op.forward(&x, 1, &mut y)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod bench;
mod kernels;
mod linear;
pub mod reference;
mod simd;
#[cfg(test)]
mod tests;

use hypercodec_hwz as hwz;

pub use linear::{CompressedLinear, DeviceForm, Int8Weight, LoadOptions, Path};
pub use simd::simd_level;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The tensor's streams or side information are invalid.
    #[error(transparent)]
    Hwz(#[from] hwz::HwzError),
    /// A buffer does not have the length the shapes require.
    #[error("{what}: expected {expected} values, got {actual}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Its required length.
        expected: usize,
        /// Its actual length.
        actual: usize,
    },
    /// A buffer's required length (rows × values a row) past `usize`.
    #[error("{what}: {rows} rows of {per_row} values overflow the address space")]
    Overflow {
        /// Which buffer.
        what: &'static str,
        /// Its rows.
        rows: usize,
        /// Values a row.
        per_row: usize,
    },
    /// A row index past the weight's rows (an embedding id out of range).
    #[error("row index {index} is out of range for {rows} rows")]
    RowIndex {
        /// The index asked for.
        index: usize,
        /// The weight's rows.
        rows: usize,
    },
    /// The tensor cannot act as a linear layer's weight.
    #[error("tensor `{tensor}` of shape {shape:?} is not a weight matrix (rank ≥ 2 needed)")]
    NotAMatrix {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// A weight to be read as stored `[in, out]` ([`CompressedLinear::transposed`]) is not 2-D.
    #[error("tensor `{tensor}` of shape {shape:?} cannot be read as [in, out] (2-D needed)")]
    NotInOut {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// Stored side information is out of range (e.g. a prototype index past the codebook).
    #[error("tensor `{tensor}`: {message}")]
    Corrupt {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// A load option does not apply to this tensor.
    #[error("tensor `{tensor}`: {message}")]
    Option {
        /// The tensor.
        tensor: String,
        /// Why the option does not apply.
        message: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
