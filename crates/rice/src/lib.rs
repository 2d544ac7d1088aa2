//! hypercodec-rice: entropy coding of the integer symbols that the lattice quantizer emits.
//!
//! Key design decision: every stream is cut into independent chunks, each with its own
//! parameters and a bit offset in a table, so that a CPU thread or a GPU warp can start
//! decoding at any chunk. Rice is the simple coder, interleaved rANS the near-ideal one,
//! and a fixed-rate code serves execution buffers.
//!
//! Status: the coders land with the lattice + entropy coding issue; this crate holds their
//! place in the workspace so that the dependency graph of `DESIGN.md` is fixed from the start.
#![deny(missing_docs)]
