//! hypercodec-lattice: randomized Hadamard transform (RHT) and nearest-point quantizers of the
//! Z1, A2, D4 and E8 lattices, with the calibration that relates the scale α, the SNR and the rate.
//!
//! Key design decision: quantizers work on integer representations of the lattice points
//! (E8 as 2·E8, all-even or all-odd with sum ≡ 0 mod 4), so the bits each lattice pins are
//! stripped losslessly before entropy coding, and the calibration table is generated offline
//! and committed: nothing calibrates at run time.
//!
//! Status: filled by the lattice + entropy coding issue.
#![deny(missing_docs)]
