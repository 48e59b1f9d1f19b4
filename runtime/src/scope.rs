//! The parameter scope: the values of a program's state, shared by every run of a session and
//! by every sub-program that reads the same parameters.

use crate::checkpoint::{self, CheckpointError};
use crate::error::{RuntimeError, RuntimeResult};
use kiln_backend::{Array, StateStore};
use kiln_ir::{Module, Type};
use std::collections::BTreeMap;
use std::path::Path;

/// State values by name, with the types they were declared with.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    store: StateStore,
    declared: BTreeMap<String, Type>,
}

impl Scope {
    /// An empty scope.
    pub fn new() -> Scope {
        Scope::default()
    }

    /// A scope holding every state of `module` at its initial value (seeded: reproducible).
    pub fn from_module(module: &Module) -> RuntimeResult<Scope> {
        let mut scope = Scope::new();
        scope.declare(module)?;
        Ok(scope)
    }

    /// Adds `module`'s state declarations; state without a value gets its initial value,
    /// state that has one keeps it. A name declared with another type is an error.
    pub fn declare(&mut self, module: &Module) -> RuntimeResult<()> {
        for decl in &module.states {
            match self.declared.get(&decl.name) {
                Some(ty) if *ty != decl.ty => {
                    return Err(RuntimeError::State {
                        name: decl.name.clone(),
                        message: format!("declared as {ty} in this scope, and as {} now", decl.ty),
                    });
                }
                _ => {
                    self.declared.insert(decl.name.clone(), decl.ty.clone());
                }
            }
        }
        self.store.initialize_missing(module)?;
        Ok(())
    }

    /// The value of state `name`.
    pub fn get(&self, name: &str) -> Option<&Array> {
        self.store.get(name)
    }

    /// Replaces a state value; its dtype and shape must match the declaration.
    pub fn set(&mut self, name: &str, value: Array) -> RuntimeResult<()> {
        let Some(ty) = self.declared.get(name) else {
            return Err(RuntimeError::State {
                name: name.to_owned(),
                message: "no such state is declared".into(),
            });
        };
        if value.ty() != *ty {
            return Err(RuntimeError::State {
                name: name.to_owned(),
                message: format!("declared as {ty}, given {}", value.ty()),
            });
        }
        self.store.insert(name, value);
        Ok(())
    }

    /// Every state value, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Array)> {
        self.store.iter()
    }

    /// The declared type of every state.
    pub fn declared(&self) -> &BTreeMap<String, Type> {
        &self.declared
    }

    /// The values.
    pub fn store(&self) -> &StateStore {
        &self.store
    }

    /// The values, to change (types are checked on the next run).
    pub fn store_mut(&mut self) -> &mut StateStore {
        &mut self.store
    }

    /// A copy of every value, by name (a trainer's checkpoint).
    pub fn values(&self) -> BTreeMap<String, Array> {
        (self.store.iter())
            .map(|(n, a)| (n.to_owned(), a.clone()))
            .collect()
    }

    /// Saves every value as a safetensors checkpoint (atomically).
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        checkpoint::save(self.store.iter(), path)
    }

    /// Loads every declared value from a checkpoint; on any error nothing changes.
    pub fn load(&mut self, path: &Path) -> Result<(), CheckpointError> {
        let values = checkpoint::load(path, &self.declared)?;
        for (name, value) in values {
            self.store.insert(name, value);
        }
        Ok(())
    }

    /// Loads the declared values a checkpoint has, keeping the others (an optimizer's moments
    /// when the file holds parameters only); returns the names it skipped. On any error
    /// nothing changes.
    pub fn load_present(&mut self, path: &Path) -> Result<Vec<String>, CheckpointError> {
        let (values, skipped) = checkpoint::load_present(path, &self.declared)?;
        for (name, value) in values {
            self.store.insert(name, value);
        }
        Ok(skipped)
    }
}
