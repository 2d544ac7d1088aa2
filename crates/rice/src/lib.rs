//! hypercodec-rice: entropy coding of the unsigned integer symbols the lattice quantizer
//! emits: Rice codes and interleaved rANS, both cut into independent chunks.
//!
//! Key design decision: every stream is cut into chunks that decode alone — each chunk has
//! its own parameters and an entry in an offset table — so a CPU thread or a GPU warp can
//! start at any chunk, and corruption stays inside the chunk it hits. Symbols of any size are
//! coded (escapes carry the rare large ones verbatim): nothing is ever truncated.
//!
//! - [`rice`]: Rice codes, one `k` per chunk chosen by exact cost, MSB-first bit order, an
//!   escape for quotients ≥ [`rice::ESCAPE_Q`]; a fast decoder (64-bit window, leading-zero
//!   count) and a plain reference decoder.
//! - [`rans`]: interleaved rANS (32-bit states, 16-bit renormalization, `lanes` states per
//!   chunk — one per GPU lane) with a static model of several contexts fitted to the
//!   histogram and stored compactly; within a few thousandths of a bit of the empirical entropy.
//!   With AVX2 its decoder takes 32 symbols at a time over 32 lanes: E8's words (each word's
//!   tables chosen from its first symbol) and words whose contexts are fixed by position
//!   ([`rans::Contexts::first_free`]: Z1, A2, D4).
//! - [`prefix`]: lane-interleaved canonical prefix codes of E8 words (codes of at most 8–12
//!   bits, optionally pairs of symbols coded jointly) in chunks of eight rows (or spans of
//!   several groups of eight where a row is short), shaped for a GPU
//!   warp that decodes one word a lane inside a GEMV; no escapes, so symbols beyond its tables
//!   are refused with [`CodingError::Unrepresentable`].
#![deny(missing_docs)]

pub mod prefix;
pub mod rans;
pub mod rice;
#[cfg(target_arch = "x86_64")]
mod simd;

/// Everything that can go wrong in this crate. Decoders meet corrupt input with these errors,
/// never with a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodingError {
    /// A stream ends before the symbols it should hold.
    #[error("{what} is truncated")]
    Truncated {
        /// Which part.
        what: &'static str,
    },
    /// A parameter or table entry is out of range.
    #[error("invalid {what}: {value}")]
    Invalid {
        /// Which field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// A chunk did not decode back to its initial state or left words unread: the data is corrupt.
    #[error("chunk {chunk} is corrupt (its final state or length does not check)")]
    Corrupt {
        /// Chunk index.
        chunk: usize,
    },
    /// A symbol or alphabet that a coder without escapes cannot hold (a prefix table's limit):
    /// code the data with rANS instead.
    #[error(
        "prefix codes hold no {what} above {max}, and this data has {value}: code it with rANS"
    )]
    Unrepresentable {
        /// What overflowed.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The largest value held, or the count allowed.
        max: u64,
    },
    /// Sizes do not match.
    #[error("{what}: expected {expected}, got {actual}")]
    Length {
        /// What was counted.
        what: &'static str,
        /// Expected.
        expected: u64,
        /// Actual.
        actual: u64,
    },
}

/// Result alias of this crate.
pub type Result<T, E = CodingError> = std::result::Result<T, E>;

/// Number of chunks for `n` symbols in chunks of `chunk`.
pub fn chunk_count(n: usize, chunk: usize) -> usize {
    n.div_ceil(chunk.max(1))
}
