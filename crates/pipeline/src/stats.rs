//! Reconstruction error measures, accumulated over any number of tensors.

use hypercodec_hwz::TensorStats;

/// Sums from which every error measure follows; add tensors with [`ErrorAcc::add`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ErrorAcc {
    /// Values compared.
    pub n: u64,
    /// Σx².
    pub signal: f64,
    /// Σ(x − x̂)².
    pub noise: f64,
    /// Σx̂².
    pub recon: f64,
    /// Σx·x̂.
    pub dot: f64,
    /// max |x − x̂|.
    pub max_abs: f64,
}

impl ErrorAcc {
    /// Adds a tensor and its reconstruction (of the same length: of unequal ones, the pairs
    /// their common length holds).
    pub fn add(&mut self, x: &[f32], y: &[f32]) {
        // Per-chunk f32 sums would lose precision on large tensors: accumulate in f64.
        for (&a, &b) in x.iter().zip(y) {
            let (a, b) = (a as f64, b as f64);
            let e = a - b;
            self.signal += a * a;
            self.noise += e * e;
            self.recon += b * b;
            self.dot += a * b;
            self.max_abs = self.max_abs.max(e.abs());
        }
        self.n += x.len().min(y.len()) as u64;
    }

    /// Adds another accumulator's sums.
    pub fn merge(&mut self, o: &ErrorAcc) {
        self.n += o.n;
        self.signal += o.signal;
        self.noise += o.noise;
        self.recon += o.recon;
        self.dot += o.dot;
        self.max_abs = self.max_abs.max(o.max_abs);
    }

    /// Mean squared error.
    pub fn mse(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.noise / self.n as f64
        }
    }

    /// `10·log10(Σx² / Σ(x−x̂)²)`; infinite when exact.
    pub fn snr_db(&self) -> f64 {
        if self.noise == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (self.signal / self.noise).log10()
        }
    }

    /// Cosine similarity of the flattened tensors (1 when both are zero).
    pub fn cosine(&self) -> f64 {
        let d = (self.signal * self.recon).sqrt();
        if d == 0.0 {
            if self.noise == 0.0 {
                1.0
            } else {
                0.0
            }
        } else {
            self.dot / d
        }
    }

    /// As stored in a manifest.
    pub fn to_stats(self) -> TensorStats {
        TensorStats {
            mse: Some(self.mse()),
            snr_db: Some(self.snr_db()),
            max_abs_err: Some(self.max_abs),
            cosine: Some(self.cosine()),
        }
    }
}

/// The planner measures with the same sums.
#[cfg(feature = "fs")]
impl From<hypercodec_plan::Sums> for ErrorAcc {
    fn from(s: hypercodec_plan::Sums) -> Self {
        let hypercodec_plan::Sums {
            n,
            signal,
            noise,
            recon,
            dot,
            max_abs,
        } = s;
        ErrorAcc {
            n,
            signal,
            noise,
            recon,
            dot,
            max_abs,
        }
    }
}

/// The best SNR any code can reach on i.i.d. Gaussian data at `bps` bits per scalar:
/// `10·log10(2^(2R))` = 6.0206·R dB.
pub fn gaussian_bound_db(bps: f64) -> f64 {
    20.0 * 2f64.log10() * bps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_follow_their_definitions() {
        let mut acc = ErrorAcc::default();
        acc.add(&[1.0, -1.0, 2.0, 0.0], &[1.0, -1.0, 1.0, 0.0]);
        assert_eq!(acc.mse(), 0.25);
        assert!((acc.snr_db() - 10.0 * 6f64.log10()).abs() < 1e-12);
        assert_eq!(acc.max_abs, 1.0);
        assert!((acc.cosine() - 4.0 / (6f64.sqrt() * 3f64.sqrt())).abs() < 1e-12);
        assert!((gaussian_bound_db(4.0) - 24.082).abs() < 1e-3);
    }
}
