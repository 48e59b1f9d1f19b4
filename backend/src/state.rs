//! The values of a module's state: name → array.

use crate::InterpError;
use crate::array::Array;
use crate::random::Stream;
use kiln_ir::{Initializer, Module, StateDecl};
use std::collections::BTreeMap;
use std::sync::Arc;

/// State values by name. Functions read it as of their call and write it when they return.
/// Values are shared, not copied, with the runs that load them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StateStore {
    values: BTreeMap<String, Arc<Array>>,
}

impl StateStore {
    /// An empty store.
    pub fn new() -> StateStore {
        StateStore::default()
    }

    /// Every declared state of `module` at its initial value.
    pub fn initialize(module: &Module) -> Result<StateStore, InterpError> {
        let mut store = StateStore::new();
        store.initialize_missing(module)?;
        Ok(store)
    }

    /// Gives declared state that has no value yet its initial value; leaves the rest alone.
    pub fn initialize_missing(&mut self, module: &Module) -> Result<(), InterpError> {
        for decl in &module.states {
            if !self.values.contains_key(&decl.name) {
                self.values
                    .insert(decl.name.clone(), Arc::new(initial_value(decl)?));
            }
        }
        Ok(())
    }

    /// The value of state `name`.
    pub fn get(&self, name: &str) -> Option<&Array> {
        self.values.get(name).map(|v| &**v)
    }

    /// The value, shared.
    pub fn get_shared(&self, name: &str) -> Option<&Arc<Array>> {
        self.values.get(name)
    }

    /// The value, for updating in place (with `Arc::get_mut` when no one else shares it).
    pub fn get_shared_mut(&mut self, name: &str) -> Option<&mut Arc<Array>> {
        self.values.get_mut(name)
    }

    /// Sets state `name` to `value` (laid out row-major: compiled code reads it in place).
    pub fn insert(&mut self, name: impl Into<String>, value: Array) {
        self.values
            .insert(name.into(), Arc::new(value.into_standard_layout()));
    }

    /// Sets state `name` to a shared `value` (copied if it is not laid out row-major).
    pub fn insert_shared(&mut self, name: impl Into<String>, value: Arc<Array>) {
        self.values
            .insert(name.into(), Array::standard_shared(value));
    }

    /// Sets a value, returning the one it replaces.
    pub fn replace_shared(
        &mut self,
        name: impl Into<String>,
        value: Arc<Array>,
    ) -> Option<Arc<Array>> {
        self.values.insert(name.into(), value)
    }

    /// Takes state `name` out of the store.
    pub fn remove(&mut self, name: &str) -> Option<Arc<Array>> {
        self.values.remove(name)
    }

    /// Every state value, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Array)> {
        self.values.iter().map(|(k, v)| (k.as_str(), &**v))
    }

    /// How many state values the store holds.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// The initial value of a state declaration; random initializers use run counter 0.
pub fn initial_value(decl: &StateDecl) -> Result<Array, InterpError> {
    let shape = decl
        .ty
        .shape
        .as_fixed()
        .ok_or_else(|| InterpError::StateMismatch {
            name: decl.name.clone(),
            message: format!("state needs a static shape, found {}", decl.ty),
        })?;
    let what = format!("state @{}", decl.name);
    crate::limits::check_bytes(&what, &decl.ty, decl.ty.fixed_bytes())?;
    let n: usize = shape.iter().product();
    let room = || -> Result<Vec<f64>, InterpError> {
        let mut values = Vec::new();
        values
            .try_reserve_exact(n)
            .map_err(|_| InterpError::StateMismatch {
                name: decl.name.clone(),
                message: format!("could not allocate {} bytes for {}", n * 8, decl.ty),
            })?;
        Ok(values)
    };
    let values = match &decl.init {
        Initializer::Constant { value } => {
            let mut values = room()?;
            values.resize(n, value.0);
            values
        }
        Initializer::Uniform { low, high, seed } => {
            let s = Stream::new(*seed, 0);
            let mut values = room()?;
            values.extend((0..n as u64).map(|i| s.uniform(i, low.0, high.0)));
            values
        }
        Initializer::Normal { mean, std, seed } => {
            let s = Stream::new(*seed, 0);
            let mut values = room()?;
            values.extend((0..n as u64).map(|i| s.normal(i, mean.0, std.0)));
            values
        }
        // Given elements keep their dtype (an i64 would not survive f64).
        Initializer::Values(literal) => {
            return Array::from_literal(literal, &shape)
                .filter(|a| a.dtype() == decl.ty.dtype)
                .ok_or_else(|| InterpError::StateMismatch {
                    name: decl.name.clone(),
                    message: format!(
                        "its {} {} values do not fill {}",
                        literal.len(),
                        literal.dtype(),
                        decl.ty
                    ),
                });
        }
    };
    let a = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&shape), values)
        .expect("the element count matches the shape");
    Ok(Array::F64(a).cast(decl.ty.dtype))
}
