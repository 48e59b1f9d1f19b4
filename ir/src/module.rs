//! Modules: named state (parameters, optimizer moments) and functions.
//!
//! Architecture invariant: a function reads state as it was when the function was called, and
//! its stores take effect when it returns. So a function's meaning does not depend on where a
//! `load` sits relative to a `store`, and a failed run changes no state.

use crate::function::Function;
use crate::literal::Literal;
use crate::op::{Attr, F64Attr};
use crate::types::{DType, Type};

/// How a state variable gets its first value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Initializer {
    /// Every element `value` (converted to the state's dtype).
    Constant {
        /// The value, converted to the state's dtype.
        value: F64Attr,
    },
    /// Independent samples from `U[low, high)`.
    Uniform {
        /// The lower bound.
        low: F64Attr,
        /// The upper bound.
        high: F64Attr,
        /// The seed of the counter-based generator.
        seed: u64,
    },
    /// Independent samples from `N(mean, std²)`.
    Normal {
        /// The mean.
        mean: F64Attr,
        /// The standard deviation.
        std: F64Attr,
        /// The seed of the counter-based generator.
        seed: u64,
    },
    /// Given elements, row-major, of the state's dtype (a parameter made from an array):
    /// `values([[1.0, 2.0], [3.0, 4.0]])`. One element fills the whole state.
    Values(Literal),
}

impl Initializer {
    /// Every element `value`.
    pub fn constant(value: f64) -> Initializer {
        Initializer::Constant {
            value: F64Attr(value),
        }
    }

    /// Why `literal` cannot be the initial value of a state of type `ty` (its dtype or its
    /// element count differ), if it cannot.
    pub fn check_values(literal: &Literal, ty: &Type) -> Result<(), InitialValuesError> {
        let state = || Box::new(ty.clone());
        if literal.dtype() != ty.dtype {
            return Err(InitialValuesError::DType {
                values: literal.dtype(),
                state: state(),
            });
        }
        match ty.shape.as_fixed().map(|d| d.iter().product::<usize>()) {
            Some(n) if literal.len() == n || literal.len() == 1 => Ok(()),
            Some(elements) => Err(InitialValuesError::Count {
                values: literal.len(),
                elements,
                state: state(),
            }),
            None => Err(InitialValuesError::Symbolic(state())),
        }
    }

    /// Uniform samples in [`low`, `high`).
    pub fn uniform(low: f64, high: f64, seed: u64) -> Initializer {
        Initializer::Uniform {
            low: F64Attr(low),
            high: F64Attr(high),
            seed,
        }
    }

    /// Normal samples of `mean` and `std`.
    pub fn normal(mean: f64, std: f64, seed: u64) -> Initializer {
        Initializer::Normal {
            mean: F64Attr(mean),
            std: F64Attr(std),
            seed,
        }
    }

    /// The initializer's name in the text form (`constant`, `uniform`, `normal`).
    pub fn name(&self) -> &'static str {
        match self {
            Initializer::Constant { .. } => "constant",
            Initializer::Uniform { .. } => "uniform",
            Initializer::Normal { .. } => "normal",
            Initializer::Values(_) => "values",
        }
    }

    /// The attributes the text form prints: `(low=…, high=…, seed=…)`; none for `values`,
    /// whose text is its literal.
    pub fn attributes(&self) -> Vec<(&'static str, Attr)> {
        match *self {
            Initializer::Values(_) => Vec::new(),
            Initializer::Constant { value } => vec![("value", Attr::Float(value.0))],
            Initializer::Uniform { low, high, seed } => vec![
                ("low", Attr::Float(low.0)),
                ("high", Attr::Float(high.0)),
                ("seed", Attr::Int(seed as i128)),
            ],
            Initializer::Normal { mean, std, seed } => vec![
                ("mean", Attr::Float(mean.0)),
                ("std", Attr::Float(std.0)),
                ("seed", Attr::Int(seed as i128)),
            ],
        }
    }

    /// Rebuilds an initializer from its text form `name(key=value, ...)`.
    pub(crate) fn from_parts(name: &str, attrs: &[(String, Attr)]) -> Result<Initializer, String> {
        let expected: &[&str] = match name {
            "constant" => &["value"],
            "uniform" => &["low", "high", "seed"],
            "normal" => &["mean", "std", "seed"],
            other => {
                return Err(format!(
                    "unknown initializer `{other}`; expected `constant`, `uniform`, `normal` \
                     or `values`"
                ));
            }
        };
        if let Some((key, _)) = attrs.iter().find(|(k, _)| !expected.contains(&k.as_str())) {
            return Err(format!("initializer `{name}` has no argument `{key}`"));
        }
        let get = |key: &str| -> Result<&Attr, String> {
            attrs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
                .ok_or_else(|| format!("initializer `{name}` needs `{key}=`"))
        };
        let number = |key: &str| -> Result<F64Attr, String> {
            match get(key)? {
                Attr::Float(v) => Ok(F64Attr(*v)),
                Attr::Int(v) => Ok(F64Attr(*v as f64)),
                other => Err(format!("`{key}` must be a number, found `{other}`")),
            }
        };
        let seed = || -> Result<u64, String> {
            match get("seed")? {
                Attr::Int(v) if u64::try_from(*v).is_ok() => Ok(*v as u64),
                other => Err(format!(
                    "`seed` must be a non-negative integer, found `{other}`"
                )),
            }
        };
        Ok(match name {
            "constant" => Initializer::Constant {
                value: number("value")?,
            },
            "uniform" => Initializer::Uniform {
                low: number("low")?,
                high: number("high")?,
                seed: seed()?,
            },
            _ => Initializer::Normal {
                mean: number("mean")?,
                std: number("std")?,
                seed: seed()?,
            },
        })
    }
}

/// A named, typed piece of state: `state @fc1.w : f32[784,512] = normal(...)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StateDecl {
    /// The state's name (`@name` in the text form).
    pub name: String,
    /// Its type; the shape is static.
    pub ty: Type,
    /// Its initial value.
    pub init: Initializer,
}

/// A module: state declarations and functions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Module {
    /// State declarations, in the order they print. Names are unique (the verifier checks).
    pub states: Vec<StateDecl>,
    /// Functions, in the order they print. Names are unique (the verifier checks).
    pub functions: Vec<Function>,
}

impl Module {
    /// An empty module.
    pub fn new() -> Module {
        Module::default()
    }

    /// The declaration of state `name`.
    pub fn state(&self, name: &str) -> Option<&StateDecl> {
        self.states.iter().find(|s| s.name == name)
    }

    /// The function named `name`.
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name() == name)
    }

    /// The function named `name`, to change.
    pub fn function_mut(&mut self, name: &str) -> Option<&mut Function> {
        self.functions.iter_mut().find(|f| f.name() == name)
    }

    /// Declares state, replacing nothing: `Err` if the name is taken with a different
    /// declaration. Declaring the same thing twice is allowed and changes nothing.
    pub fn declare_state(&mut self, decl: StateDecl) -> Result<&StateDecl, StateConflict> {
        match self.states.iter().position(|s| s.name == decl.name) {
            Some(i) if self.states[i] == decl => Ok(&self.states[i]),
            Some(i) => Err(StateConflict {
                name: decl.name,
                existing: Box::new(self.states[i].clone()),
            }),
            None => {
                self.states.push(decl);
                Ok(self.states.last().expect("just pushed"))
            }
        }
    }

    /// Adds a function, replacing one of the same name.
    pub fn add_function(&mut self, function: Function) {
        match self
            .functions
            .iter()
            .position(|f| f.name() == function.name())
        {
            Some(i) => self.functions[i] = function,
            None => self.functions.push(function),
        }
    }
}

/// A state declared again with a different type or initializer.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("state @{name} is already declared as {} = {}(...)", existing.ty, existing.init.name())]
pub struct StateConflict {
    /// The state's name.
    pub name: String,
    /// The declaration already in the module.
    pub existing: Box<StateDecl>,
}

#[cfg(test)]
mod tests {
    use crate::{parse_module, verify_module};

    #[test]
    fn values_initializers_print_and_parse_back() {
        let text = "module {\n  state @w : f32[2,2] = values([[1.0, -2.5], [3.0, 4.0]])\n  \
                    state @k : i64[3] = values([1, 9007199254740993, -7])\n  \
                    state @b : f32[4] = values(0.5)\n}\n";
        let module = parse_module(text).expect("parses");
        verify_module(&module).expect("verifies");
        let printed = module.to_string();
        assert!(
            printed.contains("values([[1.0, -2.5], [3.0, 4.0]])"),
            "{printed}"
        );
        assert!(
            printed.contains("values([1, 9007199254740993, -7])"),
            "{printed}"
        );
        assert_eq!(parse_module(&printed).expect("parses back"), module);
    }

    #[test]
    fn values_that_do_not_fit_the_state_are_refused() {
        let wrong_count = "module {\n  state @w : f32[2,2] = values([1.0, 2.0, 3.0])\n}\n";
        let error = parse_module(wrong_count).expect_err("three values for a [2,2] state");
        assert!(
            error.to_string().contains("a list of 2 elements"),
            "{error}"
        );
        let mut module =
            parse_module("module {\n  state @w : f32[3] = values([1.0, 2.0, 3.0])\n}\n")
                .expect("parses");
        module.states[0].ty = crate::Type::new(crate::DType::F32, crate::Shape::fixed(&[4]));
        let errors = verify_module(&module).expect_err("3 values for 4 elements");
        assert!(
            errors
                .to_string()
                .contains("it has 3 values for the 4 elements"),
            "{errors}"
        );
    }
}

/// Why a literal cannot be a state's initial value.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InitialValuesError {
    /// The values' dtype is not the state's.
    #[error("its values are {values}, the state {state}")]
    DType {
        /// The values' dtype.
        values: DType,
        /// The state's type.
        state: Box<Type>,
    },
    /// Neither one value nor one per element.
    #[error("it has {values} values for the {elements} elements of {state}")]
    Count {
        /// How many values there are.
        values: usize,
        /// How many elements the state has.
        elements: usize,
        /// The state's type.
        state: Box<Type>,
    },
    /// The state's shape has a symbol.
    #[error("a state needs a static shape, found {0}")]
    Symbolic(Box<Type>),
}
