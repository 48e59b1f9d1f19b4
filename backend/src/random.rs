//! Counter-based random numbers: element `i` of a draw depends only on (seed, run counter, i).
//!
//! That makes a draw independent of evaluation order, so the interpreter, compiled kernels and
//! threads all produce the same numbers. The generator is SplitMix64 (Steele, Lea & Flood 2014)
//! started from a state derived from the seed and the run counter.

use std::f64::consts::TAU;

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64 drawn in sequence: small, seeded, and the same everywhere (the fuzzer's and
/// the tests' generators; draws of the IR use the counter-based [`Stream`]).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The generator started at `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }
}

/// One stream of random bits: fixed by a seed and a run counter.
#[derive(Clone, Copy, Debug)]
pub struct Stream {
    state: u64,
}

impl Stream {
    /// The stream for `seed` at run `counter`.
    pub fn new(seed: u64, counter: u64) -> Stream {
        Stream {
            state: mix(mix(seed.wrapping_add(GAMMA)) ^ counter.wrapping_mul(GAMMA)),
        }
    }

    /// The `i`-th 64 random bits of the stream.
    pub fn bits(self, i: u64) -> u64 {
        mix(self
            .state
            .wrapping_add(i.wrapping_add(1).wrapping_mul(GAMMA)))
    }

    /// A uniform sample in `[0, 1)` with 53 random bits.
    pub fn unit(self, i: u64) -> f64 {
        (self.bits(i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Element `i` of a uniform draw on `[low, high)`.
    pub fn uniform(self, i: u64, low: f64, high: f64) -> f64 {
        low + (high - low) * self.unit(i)
    }

    /// Element `i` of a normal draw (Box–Muller on two uniforms of the element's own).
    pub fn normal(self, i: u64, mean: f64, std: f64) -> f64 {
        let u1 = 1.0 - self.unit(2 * i); // in (0, 1]: the logarithm stays finite
        let u2 = self.unit(2 * i + 1);
        mean + std * (-2.0 * u1.ln()).sqrt() * (TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_right_and_streams_differ() {
        let n = 200_000u64;
        let s = Stream::new(7, 0);
        let (mut sum, mut sq) = (0.0, 0.0);
        for i in 0..n {
            let z = s.normal(i, 1.0, 2.0);
            sum += z;
            sq += z * z;
        }
        let mean = sum / n as f64;
        let var = sq / n as f64 - mean * mean;
        assert!((mean - 1.0).abs() < 0.02, "mean {mean}");
        assert!((var - 4.0).abs() < 0.05, "var {var}");
        let u: f64 = (0..n).map(|i| s.unit(i)).sum::<f64>() / n as f64;
        assert!((u - 0.5).abs() < 0.005, "uniform mean {u}");
        assert_ne!(Stream::new(7, 0).bits(0), Stream::new(7, 1).bits(0));
        assert_ne!(Stream::new(7, 0).bits(0), Stream::new(8, 0).bits(0));
        assert_eq!(Stream::new(7, 3).bits(11), Stream::new(7, 3).bits(11));
    }
}
