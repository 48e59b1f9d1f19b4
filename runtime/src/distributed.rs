//! Training on several ranks: the optimizer adds the communication ops.
//!
//! - [`DataParallel`] wraps any [`Optimizer`]: every rank computes gradients on its own part
//!   of the global batch, and `minimize` inserts a mean all-reduce of the gradients between
//!   the backward ops and the updates. Gradients travel in buckets of about
//!   [`DataParallel::with_bucket_bytes`] (PyTorch DDP's buckets, Horovod's tensor fusion), and
//!   each bucket's `all_reduce_mean` sits right after its last gradient, so the executor
//!   starts it while the rest of the backward pass runs.
//! - [`ParameterServer`] splits training into a trainer program (forward, backward, `send`
//!   the gradients, `recv` the new parameters) and a server program (`recv` every trainer's
//!   gradients, average, apply the optimizer's update, `send` the parameters back), over
//!   one or more server ranks holding disjoint shards of the parameters.
//!
//! The ranks are those of the current thread's [`Communicator`]: threads of one process
//! ([`local::run`]) or MPI processes. Sessions broadcast the parameters from rank 0 when they
//! start ([`Session::new`](crate::Session::new)), so every rank begins from the same values;
//! optimizer state then stays equal because every rank applies the same averaged gradients.

use crate::error::{RuntimeError, RuntimeResult};
use crate::optim::Optimizer;
use crate::program::{Program, Target};
use crate::scope::Scope;
use kiln_backend::Array;
pub use kiln_backend::comm::{CommError, Communicator, local};
use kiln_ir::{AllReduceOp, AxisSlice, BinaryOp, Inst, Op, StateDecl, Value};
use std::collections::HashMap;

/// The default bucket size: 1 MiB. (PyTorch DDP caps buckets at 25 MiB with a first bucket
/// of 1 MiB.) On the CPU, with models of a few MiB, small buckets overlap more of the
/// backward pass: W5 on two ranks steps in 4.50–4.76 ms with 1 MiB buckets and 6.06–6.32 ms
/// with one bucket for everything (BENCHMARKS.md).
pub const DEFAULT_BUCKET_BYTES: usize = 1 << 20;

/// An optimizer whose gradients are averaged over the ranks before its updates.
pub struct DataParallel<O> {
    inner: O,
    bucket_bytes: usize,
    allow_unused: bool,
    /// ZeRO stage 1 over this many ranks: optimizer state sharded.
    shard_over: Option<usize>,
    /// f32 gradients all-reduced as bfloat16.
    bf16: bool,
}

impl<O: Optimizer> DataParallel<O> {
    /// Data parallelism around `inner`, with buckets of [`DEFAULT_BUCKET_BYTES`].
    pub fn new(inner: O) -> DataParallel<O> {
        DataParallel {
            inner,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            allow_unused: false,
            shard_over: None,
            bf16: false,
        }
    }

    /// All-reduces buckets of f32 gradients as bfloat16: half the bytes on the wire, each
    /// rank's gradient rounded to bf16 and the sum accumulated in f32 (then rounded to bf16).
    /// Buckets holding other dtypes travel exactly. `BENCHMARKS.md` measures its effect on
    /// the trajectory.
    pub fn with_bf16_wire(mut self) -> DataParallel<O> {
        self.bf16 = true;
        self
    }

    /// ZeRO stage 1 over `ranks` ranks (the run's size, fixed when the program is built):
    /// each bucket of gradients is reduce-scattered instead of all-reduced, each rank updates
    /// its block of every parameter (flattened, zero-padded to a multiple of `ranks`) with
    /// optimizer state for that block alone — 1/`ranks` of the moments — and the new blocks
    /// are all-gathered into the parameters. The inner rule must be elementwise (SGD,
    /// momentum, Adam are). Checkpoints of such a run hold rank 0's block only, so
    /// [`Session::save`](crate::Session::save) refuses them.
    pub fn with_sharded_state(mut self, ranks: usize) -> DataParallel<O> {
        self.shard_over = Some(ranks.max(1));
        self
    }

    /// Leaves parameters that the loss does not depend on unchanged, instead of refusing them
    /// (PyTorch DDP's `find_unused_parameters`).
    pub fn allow_unused(mut self) -> DataParallel<O> {
        self.allow_unused = true;
        self
    }

    /// Buckets of about `bytes` (a gradient larger than that travels alone; 0 sends each
    /// gradient on its own).
    pub fn with_bucket_bytes(mut self, bytes: usize) -> DataParallel<O> {
        self.bucket_bytes = bytes;
        self
    }
}

impl<O: Optimizer> Optimizer for DataParallel<O> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn step(
        &mut self,
        p: &mut Program,
        update: &crate::optim::Update<'_>,
    ) -> RuntimeResult<crate::optim::Step> {
        self.inner.step(p, update)
    }

    fn finish(&mut self, p: &mut Program) -> RuntimeResult<Vec<(StateDecl, Value)>> {
        self.inner.finish(p)
    }

    fn learning_rate(&self) -> Option<crate::optim::LearningRate> {
        self.inner.learning_rate()
    }

    fn set_learning_rate(&mut self, lr: crate::optim::LearningRate) -> RuntimeResult<()> {
        self.inner.set_learning_rate(lr)
    }

    /// Like every optimizer's, but a named parameter that no gradient reaches — usually a
    /// layer left out of the forward pass — is an error naming it, unless
    /// [`DataParallel::allow_unused`].
    fn minimize_params(
        &mut self,
        p: &mut Program,
        loss: Value,
        names: &[String],
    ) -> RuntimeResult<Target> {
        let updates = crate::optim::gradient_updates(p, loss, names)?;
        let unused: Vec<&str> = (names.iter())
            .filter(|n| !updates.iter().any(|(decl, ..)| decl.name == **n))
            .map(String::as_str)
            .collect();
        if !unused.is_empty() && !self.allow_unused {
            return Err(RuntimeError::Usage(format!(
                "DataParallel: the loss does not depend on parameter(s) `{}`, so no gradient \
                 reaches them (a layer left out of the forward pass?); use them, minimize the \
                 others with `minimize_params`, or call `allow_unused()` to leave them unchanged",
                unused.join("`, `")
            )));
        }
        self.apply_gradients(p, &updates, "minimize")
    }

    fn apply_gradients(
        &mut self,
        p: &mut Program,
        updates: &[(StateDecl, Value, Value)],
        suffix: &str,
    ) -> RuntimeResult<Target> {
        if let Some(ranks) = self.shard_over {
            return self.apply_sharded(p, updates, suffix, ranks);
        }
        let grads: Vec<Value> = updates.iter().map(|u| u.2).collect();
        let averaged = all_reduce_mean_buckets(p, &grads, self.bucket_bytes, self.bf16)?;
        let updates: Vec<(StateDecl, Value, Value)> = (updates.iter().zip(averaged))
            .map(|((decl, value, _), grad)| (decl.clone(), *value, grad))
            .collect();
        self.inner.apply_gradients(p, &updates, suffix)
    }
}

impl<O: Optimizer> DataParallel<O> {
    /// ZeRO stage 1's update ops (see [`DataParallel::with_sharded_state`]).
    fn apply_sharded(
        &mut self,
        p: &mut Program,
        updates: &[(StateDecl, Value, Value)],
        suffix: &str,
        ranks: usize,
    ) -> RuntimeResult<Target> {
        let grads: Vec<Value> = updates.iter().map(|u| u.2).collect();
        let mut stores = Vec::new();
        let mut previous: Option<Inst> = None;
        for bucket in buckets(p, &grads, self.bucket_bytes) {
            let flat: Vec<Value> = (bucket.iter())
                .map(|&i| flat_padded(p, grads[i], ranks))
                .collect::<RuntimeResult<_>>()?;
            let grad_blocks = p.reduce_scatter(AllReduceOp::Mean, &flat, ranks)?;
            let inst = p.last_inst().expect("the reduce-scatter was just added");
            p.hoist(inst, previous);
            previous = Some(inst);
            let params: Vec<Value> = (bucket.iter())
                .map(|&i| flat_padded(p, updates[i].1, ranks))
                .collect::<RuntimeResult<_>>()?;
            let param_blocks = p.shard(&params, ranks)?;
            let mut new_blocks = Vec::new();
            for (k, &i) in bucket.iter().enumerate() {
                let decl = &updates[i].0;
                let block = StateDecl {
                    ty: p.graph().value_type(param_blocks[k]).clone(),
                    ..decl.clone()
                };
                let update = crate::optim::Update {
                    decl: &block,
                    value: param_blocks[k],
                    grad: grad_blocks[k],
                };
                let step = self.inner.step(p, &update)?;
                for (state, next) in &step.state {
                    p.mark_sharded(&state.name);
                    stores.push(p.store(state, *next)?);
                }
                new_blocks.push(step.param);
            }
            let gathered = p.all_gather(&new_blocks, ranks)?;
            for (&i, full) in bucket.iter().zip(gathered) {
                let decl = &updates[i].0;
                let n = decl
                    .ty
                    .shape
                    .as_fixed()
                    .map_or(0, |d| d.iter().product::<usize>());
                let exact = match n % ranks {
                    0 => full,
                    _ => p.slice(
                        full,
                        vec![AxisSlice::Range {
                            start: 0,
                            end: n,
                            step: 1,
                        }],
                    )?,
                };
                let value = p.reshape(exact, decl.ty.shape.clone())?;
                stores.push(p.store(decl, value)?);
            }
        }
        crate::optim::finish_target(&mut self.inner, p, stores, suffix)
    }
}

/// `x` flattened and zero-padded to a multiple of `ranks` elements, its ops placed right
/// after `x`'s definition (so that a gradient's bucket can be sent while the backward pass
/// goes on).
fn flat_padded(p: &mut Program, x: Value, ranks: usize) -> RuntimeResult<Value> {
    let ty = p.graph().value_type(x).clone();
    let n: usize = ty.shape.as_fixed().map_or(0, |d| d.iter().product());
    let flat = p.reshape(x, kiln_ir::Shape::fixed(&[n]))?;
    place_after_operands(p, flat);
    let padded = n.div_ceil(ranks) * ranks;
    if padded == n {
        return Ok(flat);
    }
    let out = p.pad(flat, vec![0], vec![padded - n], vec![0])?;
    place_after_operands(p, out);
    Ok(out)
}

/// Moves the instruction defining `v`, if it is the last one, up to just after its operands.
fn place_after_operands(p: &mut Program, v: Value) {
    if let Some(inst) = p.last_inst()
        && p.graph().inst(inst).results.contains(&v)
    {
        p.hoist(inst, None);
    }
}

/// Groups `grads` into buckets of about `bucket_bytes`, in the order the backward pass
/// produces them: indices into `grads`.
pub fn buckets(p: &Program, grads: &[Value], bucket_bytes: usize) -> Vec<Vec<usize>> {
    let graph = p.graph();
    // Where each value is defined in the body (arguments, defined before all, have none).
    let position: HashMap<Value, usize> = (graph.region(graph.body()).insts.iter().enumerate())
        .flat_map(|(at, &i)| graph.inst(i).results.iter().map(move |&r| (r, at)))
        .collect();
    let mut order: Vec<usize> = (0..grads.len()).collect();
    order.sort_by_key(|&i| position.get(&grads[i]));
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut filled = 0;
    for i in order {
        let ty = graph.value_type(grads[i]);
        let bytes = ty
            .shape
            .as_fixed()
            .map_or(0, |s| s.iter().product::<usize>())
            * ty.dtype.size_bytes();
        if buckets.is_empty() || filled >= bucket_bytes || filled + bytes > bucket_bytes {
            buckets.push(Vec::new());
            filled = 0;
        }
        buckets.last_mut().expect("a bucket is open").push(i);
        filled += bytes;
    }
    buckets
}

/// The mean over the ranks of each of `grads`, one `all_reduce_mean` per bucket, each placed
/// right after the last gradient it carries.
fn all_reduce_mean_buckets(
    p: &mut Program,
    grads: &[Value],
    bucket_bytes: usize,
    bf16: bool,
) -> RuntimeResult<Vec<Value>> {
    let mut averaged = grads.to_vec();
    let mut previous: Option<Inst> = None;
    for bucket in buckets(p, grads, bucket_bytes) {
        let values: Vec<Value> = bucket.iter().map(|&i| grads[i]).collect();
        let all_f32 =
            (values.iter()).all(|&v| p.graph().value_type(v).dtype == kiln_ir::DType::F32);
        let reduced = p.all_reduce_on_wire(AllReduceOp::Mean, &values, bf16 && all_f32)?;
        let inst = p.last_inst().expect("the all-reduce was just added");
        p.hoist(inst, previous);
        previous = Some(inst);
        for (&i, r) in bucket.iter().zip(reduced) {
            averaged[i] = r;
        }
    }
    Ok(averaged)
}

/// Makes every rank start a session from rank `root`'s state (nothing happens without a
/// communicator of several ranks): all of the program's state — parameters, optimizer moments
/// and step counts, running statistics — when every rank declares the same state (data
/// parallel), so that a checkpoint only rank 0 loaded resumes exactly as an uninterrupted run;
/// else the parameters alone (parameter servers, whose servers keep optimizer state of their
/// own). The ranks' declarations are gathered first: ranks whose parameters differ from rank
/// `root`'s (a different model) are an error on every rank, naming the first that differs.
pub fn broadcast_start_state(
    scope: &mut Scope,
    program: &Program,
    root: usize,
) -> RuntimeResult<()> {
    let params: Vec<String> = program.params().iter().map(|q| q.name.clone()).collect();
    let Some(comm) = Communicator::current() else {
        return broadcast_scope(scope, &params, root);
    };
    if comm.size() == 1 {
        return Ok(());
    }
    let ranks = comm.all_gather_text(&declarations(program))?;
    if ranks.iter().all(|d| *d == ranks[root]) {
        let names: Vec<String> = program
            .module()
            .states
            .iter()
            .map(|s| s.name.clone())
            .collect();
        return broadcast_scope(scope, &names, root);
    }
    let parameters = |text: &str| -> Vec<String> {
        (text.lines())
            .filter_map(|l| l.strip_prefix("parameter "))
            .map(str::to_owned)
            .collect()
    };
    let theirs = parameters(&ranks[root]);
    for (rank, text) in ranks.iter().enumerate() {
        let mine = parameters(text);
        let longest = mine.len().max(theirs.len());
        if let Some(at) = (0..longest).find(|&i| mine.get(i) != theirs.get(i)) {
            let say = |decls: &[String]| {
                decls
                    .get(at)
                    .map_or("nothing more".into(), |d| format!("`{d}`"))
            };
            return Err(CommError::Mismatch {
                rank: comm.rank(),
                message: format!(
                    "the ranks run different models: rank {rank} declares {} where rank {root} \
                     declares {} (parameters in name order); every rank must build the same \
                     parameters",
                    say(&mine),
                    say(&theirs)
                ),
            }
            .into());
        }
    }
    broadcast_scope(scope, &params, root)
}

/// The program's state declarations, one `parameter NAME: TYPE` or `state NAME: TYPE` line
/// each, in name order.
fn declarations(program: &Program) -> String {
    let params: Vec<&str> = program.params().iter().map(|q| q.name.as_str()).collect();
    let mut lines: Vec<(String, String)> = (program.module().states.iter())
        .map(|s| {
            let kind = if params.contains(&s.name.as_str()) {
                "parameter"
            } else {
                "state"
            };
            (s.name.clone(), format!("{kind} {}: {}\n", s.name, s.ty))
        })
        .collect();
    lines.sort();
    lines.into_iter().map(|(_, l)| l).collect()
}

/// Sends every value of `scope` from rank `root` to the other ranks, in name order (the same
/// on every rank of the same program). Nothing happens without a communicator.
pub fn broadcast_scope(scope: &mut Scope, names: &[String], root: usize) -> RuntimeResult<()> {
    let Some(comm) = Communicator::current() else {
        // Alone is right, unless mpirun started several copies of a build without MPI.
        kiln_backend::comm::check_launch()?;
        return Ok(());
    };
    if comm.size() == 1 || names.is_empty() {
        return Ok(());
    }
    let mut names = names.to_vec();
    names.sort();
    let values: Vec<Array> = (names.iter())
        .map(|n| {
            scope.get(n).cloned().ok_or_else(|| RuntimeError::State {
                name: n.clone(),
                message: "has no value to broadcast".into(),
            })
        })
        .collect::<RuntimeResult<_>>()?;
    let received = comm
        .broadcast(&values.iter().collect::<Vec<_>>(), root)
        .and_then(kiln_backend::comm::Pending::wait)?;
    for (name, value) in names.iter().zip(received) {
        scope.set(name, value)?;
    }
    Ok(())
}

/// The parameter-server split of one training step. Ranks `0..servers` are servers, the rest
/// trainers; the parameters are shared out by bytes ([`ParameterServer::placement`]), so
/// every server holds about as much (within one tensor's size) whatever the layers' shapes.
#[derive(Clone, Debug)]
pub struct ParameterServer {
    servers: usize,
    ranks: usize,
}

impl ParameterServer {
    /// `servers` server ranks among `ranks` in all (at least one trainer).
    pub fn new(servers: usize, ranks: usize) -> RuntimeResult<ParameterServer> {
        if servers == 0 || servers >= ranks {
            return Err(RuntimeError::Usage(format!(
                "a parameter server needs at least one server and one trainer rank; \
                 asked for {servers} server(s) among {ranks} rank(s)"
            )));
        }
        Ok(ParameterServer { servers, ranks })
    }

    /// The trainer ranks.
    pub fn trainers(&self) -> std::ops::Range<usize> {
        self.servers..self.ranks
    }

    /// Whether `rank` serves parameters.
    pub fn is_server(&self, rank: usize) -> bool {
        rank < self.servers
    }

    /// The server of each parameter of `params` (in the program's order): largest first, each
    /// to the server holding the fewest bytes so far (the lowest rank on a tie), so that no
    /// server holds more than an equal share plus one tensor. Every rank computes the same
    /// placement from the same program.
    pub fn placement(&self, params: &[StateDecl]) -> Vec<usize> {
        self.share_out(params).0
    }

    /// The bytes of `params` each server holds under [`ParameterServer::placement`].
    pub fn shares(&self, params: &[StateDecl]) -> Vec<u128> {
        self.share_out(params).1
    }

    /// Each parameter's server, and the bytes each server then holds.
    fn share_out(&self, params: &[StateDecl]) -> (Vec<usize>, Vec<u128>) {
        let mut order: Vec<usize> = (0..params.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(params[i].ty.fixed_bytes()));
        let mut held = vec![0u128; self.servers];
        let mut placed = vec![0; params.len()];
        for i in order {
            let server = (0..self.servers)
                .min_by_key(|&s| (held[s], s))
                .expect("at least one server");
            held[server] += params[i].ty.fixed_bytes();
            placed[i] = server;
        }
        (placed, held)
    }

    fn placement_of(&self, p: &Program) -> Vec<usize> {
        let decls: Vec<StateDecl> = parameters(p).into_iter().map(|(d, _)| d).collect();
        self.placement(&decls)
    }

    /// The trainer's step, added to `p`: the gradients of `loss` sent to their servers, the
    /// new parameter values received and stored. Returns the target `ps.train`.
    pub fn trainer_step(&self, p: &mut Program, loss: Value) -> RuntimeResult<Target> {
        let params: Vec<(StateDecl, Value)> = parameters(p);
        let server_of = self.placement_of(p);
        let values: Vec<Value> = params.iter().map(|(_, v)| *v).collect();
        let grads = p.gradients(loss, &values)?;
        let mut effects = Vec::new();
        for (i, &g) in grads.iter().enumerate() {
            effects.push(p.send(&[g], server_of[i], i as u64)?);
        }
        for (i, (decl, _)) in params.iter().enumerate() {
            let new = p.recv(vec![decl.ty.clone()], server_of[i], i as u64)?[0];
            effects.push(p.store(decl, new)?);
        }
        p.add_target("ps.train", effects)
    }

    /// Server `rank`'s step, added to `p` (the same model program as the trainers', so the
    /// parameters are declared alike): each of its parameters' gradients received from every
    /// trainer and averaged, `rule`'s update applied, the new values sent back. Returns the
    /// target `ps.serve`.
    pub fn server_step(
        &self,
        p: &mut Program,
        rule: &mut dyn Optimizer,
        rank: usize,
    ) -> RuntimeResult<Target> {
        let server_of = self.placement_of(p);
        let params: Vec<(usize, StateDecl, Value)> = (parameters(p).into_iter().enumerate())
            .filter(|(i, _)| server_of[*i] == rank)
            .map(|(i, (decl, v))| (i, decl, v))
            .collect();
        let trainers = self.ranks - self.servers;
        let mut updates = Vec::new();
        for (i, decl, value) in &params {
            let mut sum: Option<Value> = None;
            for t in self.trainers() {
                let g = p.recv(vec![decl.ty.clone()], t, *i as u64)?[0];
                sum = Some(match sum {
                    Some(s) => p.binary(BinaryOp::Add, s, g)?,
                    None => g,
                });
            }
            let n = p.scalar(decl.ty.dtype, trainers as f64)?;
            let mean = p.div(sum.expect("at least one trainer"), n)?;
            updates.push((decl.clone(), *value, mean));
        }
        let applied = rule.apply_gradients(p, &updates, "ps")?;
        let mut effects = p.target_stores(applied).to_vec();
        let graph = p.graph();
        let new_values: Vec<(usize, Value)> = (params.iter())
            .map(|(i, decl, _)| {
                let store = effects.iter().find(
                    |&&s| matches!(&graph.inst(s).op, Op::Store { state } if *state == decl.name),
                );
                (
                    *i,
                    graph.inst(*store.expect("every parameter is stored")).args[0],
                )
            })
            .collect();
        for (i, new) in new_values {
            for t in self.trainers() {
                effects.push(p.send(&[new], t, i as u64)?);
            }
        }
        p.add_target("ps.serve", effects)
    }
}

/// The program's trainable parameters, in declaration order, with their values.
fn parameters(p: &Program) -> Vec<(StateDecl, Value)> {
    (p.params().iter())
        .map(|q| {
            let decl = p.module().state(&q.name).expect("parameters are declared");
            (decl.clone(), q.value)
        })
        .collect()
}
