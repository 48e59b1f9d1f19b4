//! Optimizers by PyTorch's names and meanings, checked once for every front end: an
//! [`OptimizerOptions`] of a kind's defaults, its options set by name, then
//! [`OptimizerOptions::build`], which refuses a value the rule cannot use — when the optimizer
//! is made, never ignored.

use crate::optim::{Adam, Momentum, Optimizer, Sgd};

/// An update rule's options: SGD (`momentum`, `dampening`, `nesterov`, `weight_decay`; a
/// momentum makes it [`Momentum`]) or Adam (`betas`, `eps`, `weight_decay`, `decoupled`:
/// AdamW).
#[derive(Clone, Debug, PartialEq)]
pub enum OptimizerOptions {
    /// Stochastic gradient descent, with momentum when `momentum` is above 0.
    Sgd {
        /// The momentum factor.
        momentum: f64,
        /// How much of each gradient the momentum leaves out.
        dampening: f64,
        /// Nesterov's momentum.
        nesterov: bool,
        /// L2 weight decay, added to the gradient.
        weight_decay: f64,
    },
    /// Adam.
    Adam {
        /// The moments' decay rates.
        betas: (f64, f64),
        /// The denominator's guard.
        eps: f64,
        /// Weight decay: added to the gradient, or applied to the weight when `decoupled`.
        weight_decay: f64,
        /// AdamW's decoupled weight decay.
        decoupled: bool,
    },
}

/// Why options cannot make an optimizer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptimizerError {
    /// No optimizer has the kind's name.
    #[error("unknown optimizer `{0}` (the optimizers are: sgd, adam)")]
    UnknownKind(String),
    /// The kind takes no option of that name.
    #[error("{kind} takes no option `{option}` (it takes {})", .takes.join(", "))]
    UnknownOption {
        /// The optimizer.
        kind: &'static str,
        /// The option given.
        option: String,
        /// The options it takes.
        takes: &'static [&'static str],
    },
    /// An option given a value of another kind (a number for a flag, say).
    #[error("{0}")]
    WrongType(String),
    /// A value the rule cannot use.
    #[error("{0}")]
    Invalid(String),
}

/// The value an option is set to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptionValue {
    /// A number.
    Number(f64),
    /// A pair of numbers (`betas`).
    Pair(f64, f64),
    /// A flag.
    Flag(bool),
}

impl OptimizerOptions {
    /// The defaults of the optimizer named `kind` (`sgd`, `adam`), PyTorch's.
    pub fn of_kind(kind: &str) -> Result<OptimizerOptions, OptimizerError> {
        match kind {
            "sgd" => Ok(OptimizerOptions::Sgd {
                momentum: 0.0,
                dampening: 0.0,
                nesterov: false,
                weight_decay: 0.0,
            }),
            "adam" => Ok(OptimizerOptions::Adam {
                betas: (0.9, 0.999),
                eps: 1e-8,
                weight_decay: 0.0,
                decoupled: false,
            }),
            other => Err(OptimizerError::UnknownKind(other.to_owned())),
        }
    }

    /// The optimizer's name.
    pub fn kind(&self) -> &'static str {
        match self {
            OptimizerOptions::Sgd { .. } => "sgd",
            OptimizerOptions::Adam { .. } => "adam",
        }
    }

    /// The names of the options it takes.
    pub fn option_names(&self) -> &'static [&'static str] {
        match self {
            OptimizerOptions::Sgd { .. } => &["momentum", "dampening", "nesterov", "weight_decay"],
            OptimizerOptions::Adam { .. } => &["betas", "eps", "weight_decay", "decoupled"],
        }
    }

    /// Sets option `name`; `kind` of value is checked by the option (a number, a pair, a
    /// flag) and a wrong one refused.
    pub fn set(&mut self, name: &str, value: OptionValue) -> Result<(), OptimizerError> {
        let (kind, takes) = (self.kind(), self.option_names());
        let wrong = |what: &str| {
            OptimizerError::WrongType(format!("{kind}'s `{name}` is {what}, given {value:?}"))
        };
        let number = |v: OptionValue| match v {
            OptionValue::Number(x) => Ok(x),
            _ => Err(wrong("a number")),
        };
        let flag = |v: OptionValue| match v {
            OptionValue::Flag(b) => Ok(b),
            _ => Err(wrong("a flag")),
        };
        use OptimizerOptions::{Adam, Sgd};
        match (self, name) {
            (Sgd { momentum, .. }, "momentum") => *momentum = number(value)?,
            (Sgd { dampening, .. }, "dampening") => *dampening = number(value)?,
            (Sgd { nesterov, .. }, "nesterov") => *nesterov = flag(value)?,
            (Sgd { weight_decay, .. } | Adam { weight_decay, .. }, "weight_decay") => {
                *weight_decay = number(value)?
            }
            (Adam { betas, .. }, "betas") => match value {
                OptionValue::Pair(b1, b2) => *betas = (b1, b2),
                _ => return Err(wrong("a pair of numbers")),
            },
            (Adam { eps, .. }, "eps") => *eps = number(value)?,
            (Adam { decoupled, .. }, "decoupled") => *decoupled = flag(value)?,
            _ => {
                return Err(OptimizerError::UnknownOption {
                    kind,
                    option: name.to_owned(),
                    takes,
                });
            }
        }
        Ok(())
    }

    /// The optimizer, named `name`, with learning rate `lr`; a value the rule cannot use
    /// (a negative rate or decay, betas outside [0, 1), Nesterov without momentum, …) is an
    /// error. NaN is refused wherever a bound is.
    pub fn build(&self, name: &str, lr: f64) -> Result<Box<dyn Optimizer>, OptimizerError> {
        let invalid = |what: String| Err(OptimizerError::Invalid(what));
        let at_least_zero = |v: f64| v >= 0.0; // false for NaN too
        if !(lr >= 0.0 && lr.is_finite()) {
            return invalid(format!(
                "learning rate {lr}: it must be a finite number, 0 or more"
            ));
        }
        match *self {
            OptimizerOptions::Sgd {
                momentum,
                dampening,
                nesterov,
                weight_decay,
            } => {
                if !at_least_zero(weight_decay) {
                    return invalid(format!("weight_decay {weight_decay}: it must be 0 or more"));
                }
                if !at_least_zero(momentum) {
                    return invalid(format!("momentum {momentum}: it must be 0 or more"));
                }
                if nesterov && (momentum <= 0.0 || dampening != 0.0) {
                    return invalid(
                        "Nesterov momentum needs a momentum above 0 and no dampening".into(),
                    );
                }
                if momentum == 0.0 {
                    if dampening != 0.0 {
                        return invalid(
                            "dampening applies to a momentum, and momentum is 0".into(),
                        );
                    }
                    return Ok(Box::new(
                        Sgd::named(name, lr).with_weight_decay(weight_decay),
                    ));
                }
                Ok(Box::new(
                    Momentum::named(name, lr, momentum)
                        .with_dampening(dampening)
                        .with_nesterov(nesterov)
                        .with_weight_decay(weight_decay),
                ))
            }
            OptimizerOptions::Adam {
                betas: (b1, b2),
                eps,
                weight_decay,
                decoupled,
            } => {
                if !at_least_zero(weight_decay) {
                    return invalid(format!("weight_decay {weight_decay}: it must be 0 or more"));
                }
                if !((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2)) {
                    return invalid(format!("betas ({b1}, {b2}): each must be in [0, 1)"));
                }
                if !at_least_zero(eps) {
                    return invalid(format!("eps {eps}: it must be 0 or more"));
                }
                let adam = Adam::named(name, lr).with_betas(b1, b2).with_eps(eps);
                Ok(Box::new(if decoupled {
                    adam.with_decoupled_weight_decay(weight_decay)
                } else {
                    adam.with_weight_decay(weight_decay)
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(kind: &str, options: &[(&str, OptionValue)]) -> Result<(), OptimizerError> {
        let mut o = OptimizerOptions::of_kind(kind)?;
        for (name, value) in options {
            o.set(name, *value)?;
        }
        o.build(kind, 0.1).map(|_| ())
    }

    #[test]
    fn options_by_name_are_checked_when_the_optimizer_is_made() {
        use OptionValue::{Flag, Number, Pair};
        assert_eq!(built("sgd", &[("momentum", Number(0.9))]), Ok(()));
        assert_eq!(
            built(
                "adam",
                &[("betas", Pair(0.5, 0.9)), ("decoupled", Flag(true))]
            ),
            Ok(())
        );
        let message = |r: Result<(), OptimizerError>| r.unwrap_err().to_string();
        assert_eq!(
            message(built("sgd", &[("betas", Pair(0.5, 0.9))])),
            "sgd takes no option `betas` (it takes momentum, dampening, nesterov, weight_decay)"
        );
        assert_eq!(
            message(built("sgd", &[("nesterov", Flag(true))])),
            "Nesterov momentum needs a momentum above 0 and no dampening"
        );
        assert_eq!(
            message(built("adam", &[("betas", Pair(1.0, 0.9))])),
            "betas (1, 0.9): each must be in [0, 1)"
        );
        assert_eq!(
            message(built("sgd", &[("weight_decay", Number(f64::NAN))])),
            "weight_decay NaN: it must be 0 or more"
        );
        assert_eq!(
            message(built("rmsprop", &[])),
            "unknown optimizer `rmsprop` (the optimizers are: sgd, adam)"
        );
    }
}
