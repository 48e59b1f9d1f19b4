//! Parameter initializers, resolved to the IR's `constant`, `uniform` and `normal`.

use kiln_ir::Initializer;

/// How to initialise a parameter. Fans follow the `[in, out]` layout of dense weights (the
/// fan-in is the product of every dimension but the last, the fan-out the last dimension), and
/// for rank-4 convolution weights `[O, C/groups, KH, KW]` PyTorch's: fan-in `C/groups·KH·KW`,
/// fan-out `O·KH·KW`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Zeros.
    Zeros,
    /// Ones.
    Ones,
    /// Every element the value.
    Constant(f64),
    /// Uniform samples in [`low`, `high`).
    Uniform {
        /// The lower bound.
        low: f64,
        /// The upper bound.
        high: f64,
    },
    /// Normal samples of `mean` and `std`.
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        std: f64,
    },
    /// Glorot & Bengio (2010): `U(-a, a)` with `a = sqrt(6 / (fan_in + fan_out))`.
    XavierUniform,
    /// Glorot & Bengio (2010): `N(0, 2 / (fan_in + fan_out))`.
    XavierNormal,
    /// He et al. (2015), for ReLU layers: `U(-a, a)` with `a = sqrt(6 / fan_in)`.
    KaimingUniform,
    /// He et al. (2015), for ReLU layers: `N(0, 2 / fan_in)`.
    KaimingNormal,
}

impl Init {
    /// The IR initializer for a parameter of `shape`, drawing with `seed`.
    pub fn initializer(self, shape: &[usize], seed: u64) -> Initializer {
        let (fan_in, fan_out) = fans(shape);
        match self {
            Init::Zeros => Initializer::constant(0.0),
            Init::Ones => Initializer::constant(1.0),
            Init::Constant(v) => Initializer::constant(v),
            Init::Uniform { low, high } => Initializer::uniform(low, high, seed),
            Init::Normal { mean, std } => Initializer::normal(mean, std, seed),
            Init::XavierUniform => {
                let a = (6.0 / (fan_in + fan_out)).sqrt();
                Initializer::uniform(-a, a, seed)
            }
            Init::XavierNormal => Initializer::normal(0.0, (2.0 / (fan_in + fan_out)).sqrt(), seed),
            Init::KaimingUniform => {
                let a = (6.0 / fan_in).sqrt();
                Initializer::uniform(-a, a, seed)
            }
            Init::KaimingNormal => Initializer::normal(0.0, (2.0 / fan_in).sqrt(), seed),
        }
    }
}

/// `(fan_in, fan_out)` of a parameter of `shape` (see [`Init`]).
fn fans(shape: &[usize]) -> (f64, f64) {
    let product = |dims: &[usize]| dims.iter().product::<usize>().max(1) as f64;
    match shape {
        [o, cg, kh, kw] => {
            let receptive = (kh * kw).max(1) as f64;
            (
                (*cg).max(1) as f64 * receptive,
                (*o).max(1) as f64 * receptive,
            )
        }
        [] | [_] => {
            let n = product(shape);
            (n, n)
        }
        [rest @ .., last] => (product(rest), (*last).max(1) as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fans_follow_the_dense_layout() {
        let Initializer::Uniform { high, .. } = Init::XavierUniform.initializer(&[784, 512], 1)
        else {
            panic!()
        };
        assert!((high.0 - (6.0f64 / (784.0 + 512.0)).sqrt()).abs() < 1e-15);
        let Initializer::Normal { std, .. } = Init::KaimingNormal.initializer(&[64, 10], 1) else {
            panic!()
        };
        assert!((std.0 - (2.0f64 / 64.0).sqrt()).abs() < 1e-15);
    }
}
