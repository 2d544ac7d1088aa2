//! hypercodec-hdc: weight blocks mapped to learned prototypes, with hyperdimensional
//! (random-projection sign hash) bucketing to make assignment fast, per block/tensor/channel
//! scales, sparse top-k residual repair, and low-rank and sparse candidates.
//!
//! Key design decision: the bucketing is an index for *exact* search inside candidate
//! buckets, so it speeds assignment up without changing what a block is mapped to more than
//! a measured amount (`cargo run --release -p hypercodec-hdc --example hdc_speed` prints the
//! speedup over exhaustive search and the SNR each reaches).
//!
//! The pipeline of [`codebook::encode`]:
//! 1. cut each row into blocks of `block` values (the last one zero-padded, padding never
//!    stored); divide each block by the RMS of its scale scope (block, row or tensor);
//! 2. learn `prototypes` centroids on a stratified sample of blocks: k-means++ seeding, then
//!    Lloyd iterations ([`kmeans::train`]);
//! 3. assign every block to its nearest prototype, exhaustively or through the
//!    [`hdc::HdcIndex`];
//! 4. refit every scale by least squares against the chosen prototypes, rounded to its
//!    storage type.
//!
//! [`residual`] then repairs the largest errors, [`pack`] lays the indices out (bit-packed or
//! run-length), and [`lowrank`] is a separate candidate for small or low-rank matrices. The
//! crate is pure: slices in, `Result` out, no I/O; it builds for `wasm32` (threads are used
//! where the platform has them, one thread otherwise).
#![deny(missing_docs)]

pub mod codebook;
pub mod hdc;
pub mod kmeans;
pub mod lowrank;
pub mod pack;
mod par;
pub mod residual;
mod rng;

pub use codebook::{Codebook, CodebookParams, CodebookRef, ScaleMode};
pub use hdc::{HdcIndex, HdcParams};
pub use residual::ResidualDtype;

/// Errors of this crate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum HdcError {
    /// A parameter is out of range.
    #[error("invalid codebook parameters: {message}")]
    InvalidParams {
        /// Which parameter and why.
        message: String,
    },
    /// Values and shape disagree.
    #[error("shape mismatch: {message}")]
    Shape {
        /// What does not match.
        message: String,
    },
    /// NaN or infinity in the input.
    #[error("non-finite value at element {index}")]
    NonFinite {
        /// Flat element index.
        index: u64,
    },
    /// Stored bytes that cannot be decoded.
    #[error("corrupt codebook data: {message}")]
    Corrupt {
        /// What is wrong.
        message: String,
    },
}

/// Result of this crate.
pub type Result<T, E = HdcError> = std::result::Result<T, E>;

/// `rows·cols`, or [`HdcError::Shape`] where it passes `usize` (wrapped, it could match a
/// small buffer).
pub(crate) fn numel(rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols).ok_or_else(|| HdcError::Shape {
        message: format!("a {rows}×{cols} tensor has more values than memory can address"),
    })
}

#[cfg(test)]
mod tests;
