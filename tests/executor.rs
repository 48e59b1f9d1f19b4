//! The compiled executor as a Session uses it: memory planning (no allocation per step once
//! warm, parameters and optimizer state updated where they live) and agreement with the
//! reference interpreter over whole training runs.

use kiln::backend::Array;
use kiln::ir::{DType, Shape};
use kiln::runtime::layers::{self, Activation, Dense};
use kiln::runtime::{Adam, Backend, Fetch, Optimizer, Program, Session, Sgd, Target};
use kiln::workloads::normal;
use std::sync::Arc;

const BATCH: usize = 32;

/// A 20-16-16-4 classifier with a training step by `optimizer`.
fn classifier(optimizer: &mut dyn Optimizer) -> (Program, Target, kiln::ir::Value) {
    let mut p = Program::with_seed(3);
    let x = p
        .placeholder("x", DType::F32, Shape::fixed(&[BATCH, 20]))
        .unwrap();
    let y = p
        .placeholder("y", DType::I64, Shape::fixed(&[BATCH]))
        .unwrap();
    let h = Dense::new(&mut p, "fc1", 20, 16, Activation::Relu)
        .unwrap()
        .apply(&mut p, x)
        .unwrap();
    let h = Dense::new(&mut p, "fc2", 16, 16, Activation::Tanh)
        .unwrap()
        .apply(&mut p, h)
        .unwrap();
    let logits = Dense::new(&mut p, "fc3", 16, 4, Activation::Identity)
        .unwrap()
        .apply(&mut p, h)
        .unwrap();
    let loss = layers::softmax_cross_entropy(&mut p, logits, y).unwrap();
    let train = optimizer.minimize(&mut p, loss).unwrap();
    (p, train, loss)
}

fn batch() -> Vec<(&'static str, Arc<Array>)> {
    let labels = (0..BATCH as i64).map(|i| (i * 7) % 4).collect();
    let y = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[BATCH]), labels).unwrap();
    vec![
        ("x", Arc::new(normal(&[BATCH, 20], 1.0, 11))),
        ("y", Arc::new(Array::I64(y))),
    ]
}

#[test]
fn a_warm_training_step_allocates_nothing_and_updates_state_in_place() {
    let (program, train, loss) = classifier(&mut Adam::new(0.01));
    let mut session = Session::new(&program).unwrap();
    let feeds = batch();
    let step = [Fetch::Target(train), Fetch::Value(loss)];
    for _ in 0..2 {
        drop(session.run_shared(&step, &feeds).unwrap());
    }
    let warm = session.exec_stats();
    assert!(warm.kernels > 0, "the step runs compiled kernels: {warm:?}");
    assert_eq!(warm.interpreted, 0, "nothing falls back: {warm:?}");

    const STEPS: u64 = 5;
    for _ in 0..STEPS {
        // The loss is dropped before the next step, so its buffer comes back.
        let out = session.run_shared(&step, &feeds).unwrap();
        assert!(out[0].to_f64_vec()[0].is_finite());
    }
    let after = session.exec_stats();
    assert_eq!(after.runs - warm.runs, STEPS);
    assert_eq!(
        after.allocations, warm.allocations,
        "warm steps allocated buffers: {warm:?} -> {after:?}"
    );
    assert!(after.reuses > warm.reuses);
    // Six parameters, each with two Adam moments, plus the step counter: every one is
    // written over its own buffer.
    let in_place_per_step = (after.in_place - warm.in_place) / STEPS;
    assert!(
        in_place_per_step > 6 * 3,
        "{in_place_per_step} in-place updates per step: {after:?}"
    );
}

/// A caller that keeps each result until the next one arrives gets the buffer of the result
/// it dropped: fresh results without fresh pages.
#[test]
fn results_held_until_the_next_run_come_back_when_dropped() {
    let (program, train, loss) = classifier(&mut Adam::new(0.01));
    let mut session = Session::new(&program).unwrap();
    let feeds = batch();
    let step = [Fetch::Target(train), Fetch::Value(loss)];
    let mut held = session.run_shared(&step, &feeds).unwrap();
    for _ in 0..2 {
        held = session.run_shared(&step, &feeds).unwrap();
    }
    let warm = session.exec_stats();
    let mut previous: Vec<*const Array> = Vec::new();
    for _ in 0..6 {
        // The new result is computed while the previous one is still held.
        let next = session.run_shared(&step, &feeds).unwrap();
        assert!(!Arc::ptr_eq(&next[0], &held[0]));
        previous.push(Arc::as_ptr(&next[0]));
        held = next;
    }
    drop(held);
    let after = session.exec_stats();
    assert_eq!(
        after.allocations, warm.allocations,
        "held results were not recycled: {warm:?} -> {after:?}"
    );
    // Two buffers take turns.
    previous.sort();
    previous.dedup();
    assert_eq!(previous.len(), 2, "{previous:?}");
}

#[test]
fn fetching_only_a_target_allocates_nothing_once_warm() {
    let (program, train, _) = classifier(&mut Adam::new(0.01));
    let mut session = Session::new(&program).unwrap();
    let feeds = batch();
    for _ in 0..2 {
        session.run_shared(&[Fetch::Target(train)], &feeds).unwrap();
    }
    let warm = session.exec_stats();
    for _ in 0..5 {
        assert!(
            session
                .run_shared(&[Fetch::Target(train)], &feeds)
                .unwrap()
                .is_empty()
        );
    }
    assert_eq!(session.exec_stats().allocations, warm.allocations);
}

/// Trains the classifier for `steps` steps on `backend` with `optimizer`; returns the losses
/// and the parameters.
fn train(
    backend: Backend,
    steps: usize,
    optimizer: &mut dyn Optimizer,
) -> (Vec<f64>, Vec<(String, Vec<f64>)>) {
    let (program, train, loss) = classifier(optimizer);
    let mut session = Session::new(&program).unwrap().with_backend(backend);
    let feeds = batch();
    let losses = (0..steps)
        .map(|_| {
            let out = session
                .run_shared(&[Fetch::Target(train), Fetch::Value(loss)], &feeds)
                .unwrap();
            out[0].to_f64_vec()[0]
        })
        .collect();
    let params = (session.scope().iter())
        .map(|(name, value)| (name.to_owned(), value.to_f64_vec()))
        .collect();
    (losses, params)
}

#[test]
fn compiled_training_follows_the_interpreter() {
    follows_the_interpreter(&mut || Box::new(Adam::new(0.02)));
}

/// Plain SGD, whose weight updates the `fold_updates` pass folds into their gradients' products
/// (gemm adds `−lr·xᵀg` onto the weight's buffer; `passes/tests/products.rs` tests the fold):
/// the run still follows the interpreter.
#[test]
fn compiled_sgd_training_follows_the_interpreter() {
    follows_the_interpreter(&mut || Box::new(Sgd::new(0.5)));
}

fn follows_the_interpreter(optimizer: &mut dyn FnMut() -> Box<dyn Optimizer>) {
    let steps = 30;
    let (compiled, compiled_params) = train(Backend::Compiled, steps, &mut *optimizer());
    let (oracle, oracle_params) = train(Backend::Interpreter, steps, &mut *optimizer());
    assert!(
        oracle[steps - 1] < oracle[0] * 0.8,
        "the run learns: {oracle:?}"
    );
    for (step, (c, o)) in compiled.iter().zip(&oracle).enumerate() {
        // Kernels round differently (fused expressions, polynomial exp/tanh, gemm's order).
        assert!(
            (c - o).abs() <= 1e-4 * o.abs().max(1.0),
            "step {step}: compiled loss {c}, interpreter {o}"
        );
    }
    assert_eq!(compiled_params.len(), oracle_params.len());
    for ((name, c), (oracle_name, o)) in compiled_params.iter().zip(&oracle_params) {
        assert_eq!(name, oracle_name);
        let worst = (c.iter().zip(o))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst <= 1e-3, "{name}: parameters differ by {worst}");
    }
}

#[test]
fn the_interpreter_backend_compiles_nothing() {
    let (program, train, loss) = classifier(&mut Adam::new(0.01));
    let mut session = Session::new(&program)
        .unwrap()
        .with_backend(Backend::Interpreter);
    session
        .run_shared(&[Fetch::Target(train), Fetch::Value(loss)], &batch())
        .unwrap();
    let stats = session.exec_stats();
    assert_eq!((stats.runs, stats.kernels), (0, 0), "{stats:?}");
}

/// A loop body's trips reuse the buffers of the values they carry: the value a trip computes
/// lands in the buffer of the one it replaces, so a warm run allocates as much for 50 trips
/// as for 5 (the first trip's outputs only).
#[test]
fn loop_trips_allocate_nothing_once_warm() {
    use kiln::backend::exec::Executable;
    use kiln::backend::{Interpreter, StateStore};
    let text = std::fs::read_to_string("tests/programs/control_flow.kir").unwrap();
    let mut module = kiln::ir::parse_module(&text).unwrap();
    kiln::passes::manager::PassManager::pipeline("default")
        .unwrap()
        .run(&mut module)
        .unwrap();
    let executable = Executable::new(module.function("newton_sqrt").unwrap());
    let interp = Interpreter::new(&module);
    let mut state = StateStore::initialize(&module).unwrap();
    let a = Arc::new(Array::F64(ndarray::ArrayD::from_elem(vec![1000], 2.0)));
    let mut allocations = |trips: i32| {
        let iters = Arc::new(Array::I32(ndarray::arr0(trips).into_dyn()));
        let before = executable.stats().allocations;
        let root = executable.run(vec![a.clone(), iters], &mut state, &interp, false);
        assert!((root.unwrap()[0].to_f64_vec()[0] - 2f64.sqrt()).abs() < 1e-12);
        executable.stats().allocations - before
    };
    allocations(5);
    let (few, many) = (allocations(5), allocations(50));
    assert_eq!(
        few, many,
        "allocations grow with the trips: {few} for 5, {many} for 50"
    );
}
