//! hypercodec-hdc: weight blocks mapped to learned prototypes, with hyperdimensional
//! (random-projection sign hash) bucketing to make assignment fast, per block/tensor/channel
//! scales, sparse top-k residual repair, and low-rank and sparse candidates.
//!
//! Key design decision: the bucketing is an index for *exact* search inside candidate
//! buckets, so it speeds assignment up without changing what a block is mapped to more than
//! a measured amount.
//!
//! Status: filled by the codebook + residual issue.
#![deny(missing_docs)]
