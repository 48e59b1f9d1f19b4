//! Static programs: build once, run any part of it in a [`Session`](crate::session::Session).
//!
//! A program is one graph function (`@graph`) holding every op built so far, plus the state
//! it declares (parameters, optimizer moments), its placeholders (the graph's arguments), and
//! its *targets*: named groups of `store`s, such as an optimizer's updates. A session runs the
//! slice of the graph that the requested values and targets need, so nothing that was built is
//! lost for want of a fetch, and sub-programs share one set of parameters.
//!
//! `Program` dereferences to the graph's [`FunctionBuilder`], so every op of the IR is a method
//! on it: `let h = p.matmul(x, w)?;`.

use crate::error::{RuntimeError, RuntimeResult};
use crate::init::Init;
use kiln_backend::Array;
use kiln_ir::{
    DType, Function, FunctionBuilder, Initializer, Inst, Module, Op, Shape, StateDecl, Type, Value,
    ValueDef, verify_module,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::{Deref, DerefMut};

/// A trainable parameter: its state name and the value its `load` gives in the graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// The parameter's name.
    pub name: String,
    /// Its value in the program (a load).
    pub value: Value,
}

/// A named group of state updates, run by fetching it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target(pub(crate) usize);

#[derive(Clone, Debug)]
struct TargetData {
    name: String,
    stores: Vec<Inst>,
}

/// A static program under construction: one graph of every op built, its state
/// (parameters, optimizer moments), placeholders and targets. Dereferences to the builder.
#[derive(Clone)]
pub struct Program {
    module: Module,
    graph: FunctionBuilder,
    placeholders: Vec<(String, Value)>,
    params: Vec<Param>,
    /// State adopted without being trained (see [`Program::adopt_state`]).
    adopted: Vec<(String, Value)>,
    /// State each rank holds its own block of (ZeRO's optimizer state): never broadcast.
    sharded: Vec<String>,
    targets: Vec<TargetData>,
    /// `(gradient, wrt, loss)` of each gradient [`Program::gradients`] made.
    gradient_paths: Vec<(Value, Value, Value)>,
    seed: u64,
}

impl Default for Program {
    fn default() -> Program {
        Program::new()
    }
}

impl Deref for Program {
    type Target = FunctionBuilder;

    fn deref(&self) -> &FunctionBuilder {
        &self.graph
    }
}

impl DerefMut for Program {
    fn deref_mut(&mut self) -> &mut FunctionBuilder {
        &mut self.graph
    }
}

/// FNV-1a: a stable hash, so parameter seeds do not depend on the standard library's hasher.
fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Program {
    /// An empty program with seed 0.
    pub fn new() -> Program {
        Program::with_seed(0)
    }

    /// A program whose random initializers derive their seeds from `seed` and each
    /// parameter's name, so building the same program twice gives the same IR.
    pub fn with_seed(seed: u64) -> Program {
        Program {
            module: Module::new(),
            graph: FunctionBuilder::new("graph"),
            placeholders: Vec::new(),
            params: Vec::new(),
            adopted: Vec::new(),
            sharded: Vec::new(),
            targets: Vec::new(),
            gradient_paths: Vec::new(),
            seed,
        }
    }

    /// An input fed at run time. Dimensions may be symbolic: `["N".into(), 64.into()]`.
    pub fn placeholder(
        &mut self,
        name: &str,
        dtype: DType,
        shape: impl Into<Shape>,
    ) -> RuntimeResult<Value> {
        self.check_new_name(name)?;
        let v = self.graph.arg(name, Type::new(dtype, shape.into()));
        self.placeholders.push((name.to_owned(), v));
        Ok(v)
    }

    /// A trainable parameter of a static `shape`, initialised by `init`.
    pub fn parameter(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Init,
    ) -> RuntimeResult<Value> {
        let v = self.buffer(name, dtype, shape, init)?;
        Ok(self.trained(name, v))
    }

    /// State of a static `shape` that is not trained — a buffer, as PyTorch calls it (a
    /// counter, a value a target assigns to) — first drawn by `init` as a parameter would be.
    pub fn buffer(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Init,
    ) -> RuntimeResult<Value> {
        let initializer = init.initializer(shape, self.seed ^ stable_hash(name));
        let ty = Type::new(dtype, Shape::fixed(shape));
        Ok(self.state(name, ty, initializer)?.1)
    }

    /// A trainable parameter whose first value is `value` (Keras's `variable(value)`): its
    /// type is the array's, and the text IR declares it with `values(...)`.
    pub fn parameter_from(&mut self, name: &str, value: &Array) -> RuntimeResult<Value> {
        let (_, v) = self.state_from(name, value)?;
        Ok(self.trained(name, v))
    }

    /// `v`, the load of state `name`, made a parameter: what optimizers update.
    fn trained(&mut self, name: &str, v: Value) -> Value {
        self.params.push(Param {
            name: name.to_owned(),
            value: v,
        });
        v
    }

    /// State that is not trained, whose first value is `value` (a step counter, a buffer a
    /// target assigns to): its declaration and the value of its `load`.
    pub fn state_from(&mut self, name: &str, value: &Array) -> RuntimeResult<(StateDecl, Value)> {
        self.state(name, value.ty(), Initializer::Values(value.to_literal()))
    }

    /// Marks state `name` as sharded: each rank holds its own block (ZeRO's optimizer
    /// state), so a session start does not make it equal across ranks.
    pub fn mark_sharded(&mut self, name: &str) {
        if !self.sharded.iter().any(|n| n == name) {
            self.sharded.push(name.to_owned());
        }
    }

    /// The state marked by [`Program::mark_sharded`].
    pub fn sharded_states(&self) -> &[String] {
        &self.sharded
    }

    /// Makes already-declared state (the eager scope's running statistics, say) state of this
    /// program that is not trained; returns its value. Adopting it twice gives the same value.
    pub fn adopt_state(&mut self, decl: &StateDecl) -> RuntimeResult<Value> {
        if let Some(&(_, v)) = self.adopted.iter().find(|(n, _)| *n == decl.name) {
            return Ok(v);
        }
        self.module.declare_state(decl.clone())?;
        let v = self.graph.load_at_top(decl)?;
        self.graph.set_name(v, &decl.name);
        self.adopted.push((decl.name.clone(), v));
        Ok(v)
    }

    /// Makes already-declared state (from another program, or the eager scope) a trainable
    /// parameter of this program; returns its value. Adopting it twice gives the same value.
    pub fn adopt_parameter(&mut self, decl: &StateDecl) -> RuntimeResult<Value> {
        if let Some(param) = self.params.iter().find(|q| q.name == decl.name) {
            return Ok(param.value);
        }
        self.module.declare_state(decl.clone())?;
        let v = self.graph.load_at_top(decl)?;
        self.graph.set_name(v, &decl.name);
        Ok(self.trained(&decl.name, v))
    }

    /// State that is not trained (a step counter, a running mean, an optimizer moment): its
    /// declaration and the value of a `load` of it in the graph.
    pub fn state(
        &mut self,
        name: &str,
        ty: Type,
        init: Initializer,
    ) -> RuntimeResult<(StateDecl, Value)> {
        self.check_new_name(name)?;
        if !ty.shape.is_static() {
            return Err(RuntimeError::DynamicParameter {
                name: name.to_owned(),
                ty: Box::new(ty),
            });
        }
        let decl = StateDecl {
            name: name.to_owned(),
            ty,
            init,
        };
        self.module
            .declare_state(decl.clone())
            .map_err(|_| RuntimeError::Duplicate {
                name: name.to_owned(),
            })?;
        let v = self.graph.load(&decl)?;
        self.graph.set_name(v, name);
        Ok((decl, v))
    }

    fn check_new_name(&self, name: &str) -> RuntimeResult<()> {
        let taken =
            self.placeholders.iter().any(|(n, _)| n == name) || self.module.state(name).is_some();
        if taken {
            Err(RuntimeError::Duplicate {
                name: name.to_owned(),
            })
        } else {
            Ok(())
        }
    }

    /// The state declarations (parameters and other state).
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The graph function holding every op built so far.
    pub fn graph(&self) -> &Function {
        self.graph.function()
    }

    /// The parameters, in the order they were declared.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The placeholders, with their names.
    pub fn placeholders(&self) -> &[(String, Value)] {
        &self.placeholders
    }

    /// The seed initializers derive theirs from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Groups `stores` (instructions of the graph) into a target named `name`.
    pub fn add_target(&mut self, name: &str, stores: Vec<Inst>) -> RuntimeResult<Target> {
        if self.targets.iter().any(|t| t.name == name) {
            return Err(RuntimeError::Duplicate {
                name: name.to_owned(),
            });
        }
        self.targets.push(TargetData {
            name: name.to_owned(),
            stores,
        });
        Ok(Target(self.targets.len() - 1))
    }

    /// Adds `stores` to target `t` (an update that also resets state of its own).
    pub(crate) fn extend_target(&mut self, t: Target, stores: Vec<Inst>) {
        self.targets[t.0].stores.extend(stores);
    }

    /// A target named `assign<i>` (the first free one) that stores each pair's new value into
    /// the state whose `load` the pair's first value is: a variable updated from a
    /// placeholder's value (TF's `assign`), or Keras's `updates`. The new value must have the
    /// state's type.
    pub fn assign(&mut self, pairs: &[(Value, Value)]) -> RuntimeResult<Target> {
        let mut stores = Vec::new();
        for &(var, new) in pairs {
            let decl = self.state_loaded_by(var).cloned().ok_or_else(|| {
                RuntimeError::Usage(format!(
                    "assign: {} is not a parameter or other state of the program (only state \
                     can be assigned to)",
                    self.describe(var)
                ))
            })?;
            stores.push(self.graph.store(&decl, new)?);
        }
        let name = (0..)
            .map(|i| format!("assign{i}"))
            .find(|n| self.target(n).is_none())
            .expect("a free name");
        self.add_target(&name, stores)
    }

    /// The declaration of the state `v` loads, when `v` is a `load` of the graph.
    pub fn state_loaded_by(&self, v: Value) -> Option<&StateDecl> {
        let graph = self.graph();
        let inst = graph.has_value(v).then(|| graph.producer(v)).flatten()?;
        match &graph.inst(inst).op {
            Op::Load { state, .. } => self.module.state(state),
            _ => None,
        }
    }

    /// The name of the parameter whose value `v` is, if it is one.
    pub fn parameter_name(&self, v: Value) -> Option<&str> {
        (self.params.iter().find(|q| q.value == v)).map(|q| q.name.as_str())
    }

    /// How errors name `v`: `` `name` `` when it has a name, else `%7 (a matmul)`.
    pub fn describe(&self, v: Value) -> String {
        let graph = self.graph();
        if !graph.has_value(v) {
            return format!("{v} (not a value of this program)");
        }
        if let Some(name) = graph.value_name(v) {
            return format!("`{name}`");
        }
        match graph.producer(v) {
            Some(inst) => format!("{v} (a {})", graph.inst(inst).op.name()),
            None => format!("{v} (an argument)"),
        }
    }

    /// Whether `v` is a value of the graph's top level (an argument or a result of a
    /// top-level instruction): only those can be fed, since a run cuts the graph there.
    pub fn is_top_level(&self, v: Value) -> bool {
        let graph = self.graph();
        if !graph.has_value(v) {
            return false;
        }
        match graph.value(v).def {
            ValueDef::Result(inst, _) => graph.region(graph.body()).insts.contains(&inst),
            ValueDef::Arg(region, _) => region == graph.body(),
        }
    }

    /// The name of `target`.
    pub fn target_name(&self, target: Target) -> &str {
        &self.targets[target.0].name
    }

    pub(crate) fn target_stores(&self, target: Target) -> &[Inst] {
        &self.targets[target.0].stores
    }

    /// A target by name.
    pub fn target(&self, name: &str) -> Option<Target> {
        self.targets.iter().position(|t| t.name == name).map(Target)
    }

    /// A named value of the graph (a placeholder, a parameter, or a value named with
    /// `set_name`).
    pub fn value(&self, name: &str) -> Option<Value> {
        let graph = self.graph();
        graph
            .args()
            .iter()
            .copied()
            .chain(
                graph
                    .walk_insts()
                    .iter()
                    .flat_map(|&i| graph.inst(i).results.clone()),
            )
            .find(|&v| graph.value_name(v) == Some(name))
    }

    /// Every name a fetch may use: named values and targets.
    pub(crate) fn fetchable_names(&self) -> Vec<String> {
        let graph = self.graph();
        let mut names: Vec<String> = graph
            .all_values()
            .filter_map(|(_, d)| d.name.clone())
            .collect();
        names.extend(self.targets.iter().map(|t| t.name.clone()));
        names
    }

    /// Appends the gradient of `loss` with respect to each of `wrt` (any float values of the
    /// graph's top level) to the graph and returns them, as values to fetch or build on:
    /// TF's `gradients`. The gradient of a gradient is a second derivative. A value `loss` does
    /// not depend on gets a gradient of zeros.
    pub fn gradients(&mut self, loss: Value, wrt: &[Value]) -> RuntimeResult<Vec<Value>> {
        let placeholder = FunctionBuilder::new("graph");
        let mut graph = std::mem::replace(&mut self.graph, placeholder).into_function();
        let result = kiln_passes::append_gradients(&mut graph, loss, wrt);
        self.graph = FunctionBuilder::resume(graph);
        let grads = result?;
        let paths = grads.iter().zip(wrt).map(|(&g, &w)| (g, w, loss));
        self.gradient_paths.extend(paths);
        Ok(grads)
    }

    /// `(gradient, wrt, loss)` of each gradient [`Program::gradients`] made: a run that needs
    /// the gradient must not feed a value between `wrt` and `loss`.
    pub(crate) fn gradient_paths(&self) -> &[(Value, Value, Value)] {
        &self.gradient_paths
    }

    /// The values `of` depends on, itself included (top level of the graph).
    pub fn ancestors(&self, of: Value) -> HashSet<Value> {
        self.ancestors_of(HashSet::from([of]))
    }

    /// The values a run fetching `values` and `targets` computes (top level of the graph).
    pub fn needed_by(&self, values: &[Value], targets: &[Target]) -> HashSet<Value> {
        let graph = self.graph();
        let stored = (targets.iter())
            .flat_map(|&t| self.target_stores(t))
            .flat_map(|&i| graph.inst(i).args.iter().copied());
        self.ancestors_of(values.iter().copied().chain(stored).collect())
    }

    fn ancestors_of(&self, mut needed: HashSet<Value>) -> HashSet<Value> {
        let graph = self.graph();
        for &inst in graph.region(graph.body()).insts.iter().rev() {
            let data = graph.inst(inst);
            if data.results.iter().any(|r| needed.contains(r)) {
                needed.extend(data.args.iter().copied());
                for &r in &data.regions {
                    needed.extend(graph.free_values(r));
                }
            }
        }
        needed
    }

    /// The slice of the graph computing `outputs` and performing the stores of `targets`, as
    /// a function `name` whose arguments are the placeholders it needs.
    pub fn export(&self, name: &str, outputs: &[Value], targets: &[Target]) -> Function {
        self.export_fed(name, outputs, targets, &[]).0
    }

    /// Like [`Program::export`], with `fed` values (and their arguments' names) made
    /// arguments: nothing upstream of a fed value is computed. Returns the function and the
    /// value of the program each argument stands for.
    pub fn export_fed(
        &self,
        name: &str,
        outputs: &[Value],
        targets: &[Target],
        fed: &[(Value, Option<String>)],
    ) -> (Function, Vec<Value>) {
        let stores: Vec<Inst> = targets
            .iter()
            .flat_map(|&t| self.target_stores(t).iter().copied())
            .collect();
        kiln_passes::prune_fed(self.graph(), name, outputs, &stores, fed)
    }

    /// The states the computation of `v` reads, transitively (through regions too).
    pub fn states_upstream_of(&self, v: Value) -> BTreeSet<String> {
        let graph = self.graph();
        let defining: HashMap<Value, Inst> = graph
            .walk_insts()
            .into_iter()
            .flat_map(|i| graph.inst(i).results.iter().map(move |&r| (r, i)))
            .collect();
        let (mut states, mut seen, mut stack) = (BTreeSet::new(), HashSet::new(), vec![v]);
        while let Some(v) = stack.pop() {
            let Some(&inst) = defining.get(&v) else {
                continue;
            };
            if !seen.insert(inst) {
                continue;
            }
            let data = graph.inst(inst);
            if let Op::Load { state, .. } = &data.op {
                states.insert(state.clone());
            }
            stack.extend(data.args.iter().copied());
            for &r in &data.regions {
                stack.extend(graph.free_values(r));
                for &i in &graph.region(r).insts {
                    stack.extend(graph.inst(i).results.iter().copied());
                }
            }
        }
        states
    }

    /// The states target `t` stores to.
    pub fn target_states(&self, t: Target) -> Vec<String> {
        let graph = self.graph();
        (self.target_stores(t).iter())
            .filter_map(|&i| match &graph.inst(i).op {
                Op::Store { state } => Some(state.clone()),
                _ => None,
            })
            .collect()
    }

    /// A verified module with this program's state and the exported functions, e.g.
    /// `[("predict", &[logits][..])]` for serving.
    pub fn export_module(&self, functions: &[(&str, &[Value])]) -> RuntimeResult<Module> {
        let functions = (functions.iter())
            .map(|(name, outputs)| self.export(name, outputs, &[]))
            .collect();
        self.module_of(functions)
    }

    /// A verified module of the program's states and `functions` (made by
    /// [`Program::export`]).
    pub fn module_of(&self, functions: Vec<Function>) -> RuntimeResult<Module> {
        let mut module = Module {
            states: self.module.states.clone(),
            functions: Vec::new(),
        };
        for function in functions {
            module.add_function(function);
        }
        verify_module(&module).map_err(|e| RuntimeError::Verify(e.render(&module)))?;
        Ok(module)
    }
}
