//! The α ↔ SNR ↔ rate relation of each lattice on i.i.d. unit Gaussian input, measured offline
//! and committed (`calibration_table.rs`, written by
//! `cargo run --release -p hypercodec-lattice --example calibrate`).
//!
//! Each point is `[alpha, snr_db, entropy_bps]`: the SNR of the reconstruction and the
//! empirical entropy, in bits per scalar, of the symbols under the lattice's context model (the
//! rate an ideal static entropy coder reaches). Points are in increasing α; SNR and rate both
//! increase with α, so either can be inverted by interpolation.

use crate::Lattice;

/// The generated tables (α values are round powers of 2^(1/8), not constants of mathematics).
#[allow(clippy::approx_constant, clippy::excessive_precision)]
mod generated {
    include!("calibration_table.rs");
}
pub use generated::{A2, D4, E8, FIXED, Z1};

/// The calibration points of a lattice.
pub fn table(lattice: Lattice) -> &'static [[f32; 3]] {
    match lattice {
        Lattice::Z1 => Z1,
        Lattice::A2 => A2,
        Lattice::D4 => D4,
        Lattice::E8 => E8,
    }
}

fn interpolate(points: &[[f32; 3]], key: usize, value: f32, out: usize) -> f32 {
    let first = points[0];
    let last = points[points.len() - 1];
    if value <= first[key] {
        return first[out];
    }
    if value >= last[key] {
        return last[out];
    }
    for w in points.windows(2) {
        let (a, b) = (w[0], w[1]);
        if value <= b[key] {
            // Rate and SNR are near-linear in log α.
            let t = (value - a[key]) / (b[key] - a[key]);
            return if out == 0 {
                (a[0].ln() + t * (b[0].ln() - a[0].ln())).exp()
            } else {
                a[out] + t * (b[out] - a[out])
            };
        }
    }
    last[out]
}

/// The largest rate the calibration covers (its smallest α): rate control has no scale above
/// it (E8: 8.05 bits per value).
pub fn max_bps(lattice: Lattice) -> f64 {
    table(lattice)
        .iter()
        .map(|row| row[2] as f64)
        .fold(0.0, f64::max)
}

/// The α whose ideal-coder rate on Gaussian data is `bps` (clamped to the table's range).
pub fn alpha_for_bps(lattice: Lattice, bps: f32) -> f32 {
    interpolate(table(lattice), 2, bps, 0)
}

/// The α whose SNR on Gaussian data is `snr_db` (clamped to the table's range).
pub fn alpha_for_snr(lattice: Lattice, snr_db: f32) -> f32 {
    interpolate(table(lattice), 1, snr_db, 0)
}

/// The α that maximizes the SNR of the fixed-rate form with `bits` bits on Gaussian data,
/// and that SNR; `None` where the form does not exist.
pub fn fixed_alpha(lattice: Lattice, bits: u8) -> Option<(f32, f32)> {
    FIXED
        .iter()
        .find(|f| f.0 == lattice.name() && f.1 == bits)
        .map(|f| (f.2, f.3))
}

/// Predicted `(snr_db, entropy_bps)` at `alpha` on Gaussian data.
pub fn predict(lattice: Lattice, alpha: f32) -> (f32, f32) {
    let t = table(lattice);
    let a = alpha.max(t[0][0]).min(t[t.len() - 1][0]);
    for w in t.windows(2) {
        if a <= w[1][0] {
            let f = (a.ln() - w[0][0].ln()) / (w[1][0].ln() - w[0][0].ln());
            return (
                w[0][1] + f * (w[1][1] - w[0][1]),
                w[0][2] + f * (w[1][2] - w[0][2]),
            );
        }
    }
    (t[t.len() - 1][1], t[t.len() - 1][2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_monotone_and_invert() {
        for l in Lattice::ALL {
            let t = table(l);
            assert!(t.len() > 20, "{l}");
            for w in t.windows(2) {
                assert!(
                    w[1][0] > w[0][0] && w[1][1] > w[0][1] && w[1][2] >= w[0][2],
                    "{l}: {w:?}"
                );
            }
            for bps in [2.0f32, 3.0, 4.0, 5.0] {
                let a = alpha_for_bps(l, bps);
                assert!((predict(l, a).1 - bps).abs() < 0.02, "{l} at {bps} bps");
            }
        }
    }

    #[test]
    fn e8_beats_z1_at_equal_rate() {
        // E8's granular gain: about 0.65 dB over scalar rounding at high rate.
        let snr = |l| predict(l, alpha_for_bps(l, 4.0)).0;
        assert!(
            snr(Lattice::E8) > snr(Lattice::Z1) + 0.4,
            "{} vs {}",
            snr(Lattice::E8),
            snr(Lattice::Z1)
        );
    }
}
