//! Serving a saved program from Rust: load its text IR and a checkpoint of its parameters (or
//! an ONNX model, [`Predictor::load_onnx`]), compile it once (pass pipeline, JIT kernels), then call it as often as needed.
//!
//! ```no_run
//! use kiln::serve::Predictor;
//! # fn main() -> Result<(), kiln::serve::ServeError> {
//! let mut model = Predictor::load("predict.kir".as_ref(), "params.safetensors".as_ref())?;
//! let images = kiln::backend::Array::F32(ndarray::ArrayD::zeros(ndarray::IxDyn(&[1, 64])));
//! let logits = model.predict(vec![images])?;
//! # Ok(()) }
//! ```

use kiln_backend::exec::Executable;
use kiln_backend::{Array, Interpreter, StateStore, unshare};
use kiln_ir::{Function, Module, parse_and_verify};
use kiln_passes::PassManager;
use kiln_runtime::Scope;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a model could not be loaded, compiled or run.
#[derive(thiserror::Error, Debug)]
pub enum ServeError {
    /// The program file could not be read.
    #[error("cannot read {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The program does not parse, verify or fit.
    #[error("{path}: {message}")]
    Program {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The parameters could not be loaded.
    #[error("{path}: {message}")]
    Parameters {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A run failed.
    #[error("{0}")]
    Run(String),
    /// The optimisation pipeline failed.
    #[error("the optimisation pipeline failed: {0}")]
    Pass(#[from] kiln_passes::PassError),
    /// The pass pipeline removed the function.
    #[error("the pass pipeline removed @{0}")]
    Removed(String),
}

/// A compiled function of a program, with its parameters. `kiln run` runs programs this way.
pub struct Predictor {
    /// The program after the pass pipeline.
    module: Module,
    function: usize,
    executable: Executable,
    state: StateStore,
}

impl Predictor {
    /// Loads `program` (text IR; its only function, or the one named `predict`) and the
    /// parameters in the safetensors file `parameters`, and compiles it.
    pub fn load(program: &Path, parameters: &Path) -> Result<Predictor, ServeError> {
        let source = std::fs::read_to_string(program).map_err(|e| ServeError::Read {
            path: program.to_owned(),
            message: e.to_string(),
        })?;
        let program_error = |message: String| ServeError::Program {
            path: program.to_owned(),
            message,
        };
        let module = parse_and_verify(&source).map_err(|e| program_error(e.render(&source)))?;
        let function = match module.functions.len() {
            1 => 0,
            _ => (module.functions.iter())
                .position(|f| f.name() == "predict")
                .ok_or_else(|| {
                    program_error("has several functions and none is named @predict".into())
                })?,
        };
        let mut scope = Scope::from_module(&module).map_err(|e| program_error(e.to_string()))?;
        scope.load(parameters).map_err(|e| ServeError::Parameters {
            path: parameters.to_owned(),
            message: e.to_string(),
        })?;
        let name = module.functions[function].name().to_owned();
        Predictor::compile(module, &name, scope.store().clone())
    }

    /// Imports the ONNX model at `path` (see [`kiln_onnx`]) and compiles its graph, with its
    /// initializers as the parameters.
    pub fn load_onnx(path: &Path) -> Result<Predictor, ServeError> {
        let model = kiln_onnx::import(path).map_err(|e| ServeError::Program {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let mut state = StateStore::new();
        for (name, value) in model.parameters {
            state.insert(name, value);
        }
        let name = model.module.functions[0].name().to_owned();
        Predictor::compile(model.module, &name, state)
    }

    /// Compiles function `name` of `module` (verified) after the default pass pipeline, to run
    /// over `state`.
    pub fn compile(
        mut module: Module,
        name: &str,
        state: StateStore,
    ) -> Result<Predictor, ServeError> {
        PassManager::pipeline("default")
            .expect("the default pipeline exists")
            .run(&mut module)?;
        let function = (module.functions.iter())
            .position(|f| f.name() == name)
            .ok_or_else(|| ServeError::Removed(name.to_owned()))?;
        let executable = Executable::new(&module.functions[function]);
        Ok(Predictor {
            module,
            function,
            executable,
            state,
        })
    }

    /// The state (parameters) the function reads and, when it stores, updates.
    pub fn state(&self) -> &StateStore {
        &self.state
    }

    /// The function served (after the pass pipeline): its arguments and results.
    pub fn function(&self) -> &Function {
        &self.module.functions[self.function]
    }

    /// Runs the function on `inputs` (one array per argument, in order).
    pub fn predict(&mut self, inputs: Vec<Array>) -> Result<Vec<Array>, ServeError> {
        let interp = Interpreter::new(&self.module);
        let args = inputs.into_iter().map(Arc::new).collect();
        let results = (self.executable)
            .run(args, &mut self.state, &interp, false)
            .map_err(|e| ServeError::Run(e.to_string()))?;
        Ok(results.into_iter().map(unshare).collect())
    }
}
