//! What a pass is: the [`Pass`] trait, the [`Stats`] it reports and the [`PassError`] it
//! fails with. Every pass depends on this file alone; the manager, which lists every pass,
//! depends on them.

use kiln_ir::Module;
use std::fmt;

/// What a pass did, in its own words: `("e-graph nodes", "1234")`, `("stopped by", "Saturated")`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Named figures, in the order they were added.
    pub entries: Vec<(&'static str, String)>,
}

impl Stats {
    /// Adds the figure `key`.
    pub fn with(mut self, key: &'static str, value: impl fmt::Display) -> Stats {
        self.entries.push((key, value.to_string()));
        self
    }

    /// The figure `key`, if there is one.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a pass or pipeline failed.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// No pass has that name.
    #[error("unknown pass `{name}`; the passes are: {available}")]
    UnknownPass {
        /// The name.
        name: String,
        /// What there is, listed.
        available: String,
    },
    /// No pipeline has that name.
    #[error("unknown pipeline `{name}`; the pipelines are: {available}")]
    UnknownPipeline {
        /// The name.
        name: String,
        /// What there is, listed.
        available: String,
    },
    /// A pass left the module ill-formed (a bug in the pass).
    #[error("after pass `{pass}`, the module does not verify (a bug in the pass):\n{rendered}")]
    Verify {
        /// The pass.
        pass: &'static str,
        /// The verifier's errors, rendered against the module.
        rendered: String,
    },
    /// A pass failed.
    #[error("pass `{pass}` failed: {message}")]
    Failed {
        /// The pass.
        pass: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// A transformation of a module, in place, keeping its meaning.
pub trait Pass {
    /// The pass's name, as `--passes` spells it.
    fn name(&self) -> &'static str;
    /// Runs the pass over `module`, returning what it did.
    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError>;
    /// Asks the pass to record why it changed what it changed (`kiln opt --explain`); passes
    /// without explanations ignore it.
    fn set_explain(&mut self, _on: bool) {}
    /// The explanations the last run recorded, each a paragraph (empty unless asked for).
    fn take_explanations(&mut self) -> Vec<String> {
        Vec::new()
    }
}
