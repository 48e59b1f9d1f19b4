//! The optimisation pipeline's own speed: generated programs of about 1,000 and 10,000 ops,
//! and the training steps of the MLP and GAN examples.
//!
//!     cargo bench --bench passes

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kiln::ir::{DType, Dim, FunctionBuilder, Module, ReduceOp, Shape, Type};
use kiln::passes::PassManager;
use std::hint::black_box;

/// A program of `blocks` blocks of ten ops each: a dense layer, activations, identities the
/// simplifier removes, a row reduction broadcast back — the mix a training step has.
pub fn generated(blocks: usize) -> Module {
    let mut b = FunctionBuilder::new("generated");
    let n = || Shape(vec![Dim::sym("N"), Dim::Fixed(64)]);
    let mut h = b.arg("x", Type::new(DType::F32, n()));
    let w = b.arg("w", Type::new(DType::F32, Shape::fixed(&[64, 64])));
    let bias = b.arg("b", Type::new(DType::F32, Shape::fixed(&[64])));
    for i in 0..blocks {
        let m = b.matmul(h, w).unwrap();
        let a = b.add(m, bias).unwrap();
        let t = if i % 2 == 0 {
            b.tanh(a).unwrap()
        } else {
            b.relu(a).unwrap()
        };
        let one = b.scalar(DType::F32, 1.0).unwrap();
        let same = b.mul(t, one).unwrap();
        let n1 = b.neg(same).unwrap();
        let n2 = b.neg(n1).unwrap();
        let mean = b.reduce(ReduceOp::Mean, n2, vec![1], true).unwrap();
        h = b.sub(n2, mean).unwrap();
    }
    let mut module = Module::new();
    module.add_function(b.finish(&[h]).unwrap());
    module
}

fn pipeline(module: &Module) -> Module {
    let mut m = module.clone();
    PassManager::pipeline("default")
        .unwrap()
        .verify_each(false)
        .run(&mut m)
        .unwrap();
    m
}

fn generated_programs(c: &mut Criterion) {
    let mut group = c.benchmark_group("pipeline/generated");
    group.sample_size(10);
    for blocks in [100, 1000] {
        let module = generated(blocks);
        let ops = kiln::passes::manager::instruction_count(&module);
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{ops}_ops")),
            &module,
            |bench, m| bench.iter(|| black_box(pipeline(m))),
        );
    }
    group.finish();
}

fn training_steps(c: &mut Criterion) {
    use kiln::demos::{digits_static, gan_1d};
    let mlp = digits_static::build(
        &digits_static::Config::default(),
        digits_static::DIGITS_IMAGE,
    )
    .unwrap();
    let mlp_step = Module {
        states: mlp.program.module().states.clone(),
        functions: vec![mlp.program.export("train_step", &[mlp.loss], &[mlp.train])],
    };
    let gan = gan_1d::build(&gan_1d::Config::default()).unwrap();
    let gan_steps = Module {
        states: gan.program.module().states.clone(),
        functions: vec![
            gan.program.export("d_step", &[gan.d_loss], &[gan.d_train]),
            gan.program.export("g_step", &[gan.g_loss], &[gan.g_train]),
        ],
    };
    let mut group = c.benchmark_group("pipeline/training_step");
    group.bench_function("mlp", |bench| bench.iter(|| black_box(pipeline(&mlp_step))));
    group.bench_function("gan", |bench| {
        bench.iter(|| black_box(pipeline(&gan_steps)))
    });
    group.finish();
}

criterion_group!(benches, generated_programs, training_steps);
criterion_main!(benches);
