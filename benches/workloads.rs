//! The peers' workloads (W2–W8 of `../shared/baselines/README.md`, and Kiln's own training steps
//! W9, the digits CNN, W10, a recurrent network, and W11, a transformer encoder) run by Kiln's
//! compiled backend, under criterion. The side-by-side comparison
//! with the peers' own scripts is `scripts/compare_peers.sh`, which uses
//! `examples/peer_workloads.rs` and the peers' timing protocol; these benches are for watching
//! Kiln's own figures move.
//!
//!     cargo bench --bench workloads [-- w5]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kiln::backend::jit;
use kiln::workloads;
use std::hint::black_box;
use std::time::Duration;

/// W2 and W3: a fresh output per call (as the peers' calls allocate) and a reused output.
fn elementwise(c: &mut Criterion) {
    let mut group = c.benchmark_group("w2_w3");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    let cases = [
        ("w2_gelu_4096x4096", workloads::gelu(4096, 4096).unwrap()),
        (
            "w3_softmax_8192x1024",
            workloads::softmax(8192, 1024).unwrap(),
        ),
    ];
    for (name, mut forward) in cases {
        // Bytes read and written once each, as the peers count them.
        let bytes = 2 * 4 * forward.input("x").len() as u64;
        group.throughput(Throughput::Bytes(bytes));
        group.bench_function(BenchmarkId::new(name, "fresh output"), |b| {
            b.iter(|| drop(black_box(forward.call_fresh().unwrap())))
        });
        group.bench_function(BenchmarkId::new(name, "reused output"), |b| {
            b.iter(|| forward.call_reused().unwrap())
        });
    }
    group.finish();
}

fn matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group("w4_matmul");
    group.sample_size(20);
    for (m, k, n) in [(1024, 1024, 1024), (256, 784, 512)] {
        let mut forward = workloads::matmul(m, k, n).unwrap();
        group.throughput(Throughput::Elements(2 * (m * k * n) as u64));
        group.bench_function(format!("[{m},{k}]@[{k},{n}] (elements = flops)"), |b| {
            b.iter(|| drop(black_box(forward.call_fresh().unwrap())))
        });
    }
    group.finish();
}

fn training(c: &mut Criterion) {
    let mut step = workloads::mlp_step().unwrap();
    c.bench_function("w5_mlp_train_step", |b| {
        b.iter(|| black_box(step.step().unwrap()))
    });

    // W7: build the program, open a session and run the first step, with nothing compiled.
    let mut group = c.benchmark_group("w7_first_call");
    group.sample_size(10);
    group.bench_function("mlp_step_build_passes_jit_first_step", |b| {
        b.iter(|| {
            jit::forget_cached_kernels();
            let mut step = workloads::mlp_step().unwrap();
            black_box(step.step().unwrap())
        })
    });
    group.finish();

    let mut gan = workloads::gan().unwrap();
    c.bench_function("w8_gan_iteration", |b| {
        b.iter(|| black_box(gan.iteration().unwrap()))
    });

    let mut cnn = workloads::cnn_step().unwrap();
    let mut group = c.benchmark_group("w9_cnn");
    group.sample_size(30);
    group.bench_function("digits_cnn_train_step_batch_256", |b| {
        b.iter(|| black_box(cnn.step().unwrap()))
    });
    group.finish();

    let mut rnn = workloads::rnn_step().unwrap();
    let mut group = c.benchmark_group("w10_rnn");
    group.sample_size(20);
    group.bench_function("while_64_steps_width_256_batch_64", |b| {
        b.iter(|| black_box(rnn.step().unwrap()))
    });
    group.finish();

    let mut transformer = workloads::transformer_step().unwrap();
    let mut group = c.benchmark_group("w11_transformer");
    group.sample_size(10);
    group.bench_function("two_encoder_layers_width_256_seq_128_batch_16", |b| {
        b.iter(|| black_box(transformer.step().unwrap()))
    });
    group.finish();
}

/// Where a stage's two codes cross: a softmax over rows of length 3 to 2048 (about 2²⁰
/// elements in all; its reductions keep the rows) on Cranelift's f32x4 code and as a tile
/// program, so that the rule choosing between them (`jit::PROGRAMS_MIN_ROW`) is a measured
/// one.
fn paths(c: &mut Criterion) {
    use kiln::backend::Array;
    use kiln::ir::{DType, FunctionBuilder, ReduceOp, Shape, Type};
    let mut group = c.benchmark_group("paths");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(1));
    for row in [3usize, 10, 16, 64, 96, 128, 192, 256, 2048] {
        let rows = (1 << 20) / row;
        let mut b = FunctionBuilder::new("k");
        let x = b.arg("x", Type::new(DType::F32, Shape::fixed(&[rows, row])));
        let m = b.reduce(ReduceOp::Max, x, vec![1], true).unwrap();
        let z = b.sub(x, m).unwrap();
        let e = b.exp(z).unwrap();
        let s = b.reduce(ReduceOp::Sum, e, vec![1], true).unwrap();
        let y = b.div(e, s).unwrap();
        let func = b.finish(&[y]).unwrap();
        let kernel = jit::kernel(&func).unwrap();
        assert!(kernel.plan.scratch.is_empty() && kernel.plan.symbols.is_empty());
        let input = Array::zeros(DType::F32, &[rows, row]);
        let mut output = Array::zeros(DType::F32, &[rows, row]);
        let buffers = [input.data_ptr().cast_mut(), output.data_mut_ptr()];
        group.throughput(Throughput::Elements((rows * row) as u64));
        for path in [jit::Path::Cranelift, jit::Path::Programs] {
            group.bench_function(
                BenchmarkId::new(format!("{path:?}/softmax"), row),
                |bench| {
                    // SAFETY: the kernel's one input and one output, contiguous, of its types.
                    bench.iter(|| unsafe { kernel.execute_on(&buffers, &[], false, Some(path)) })
                },
            );
        }
    }
    group.finish();
}

/// `x·a + b` over 2²⁰ f32 (4 MiB in, 4 MiB out): an elementwise kernel with no
/// transcendental, on Cranelift's f32x4 code and on its tile program (one fused multiply-add
/// pass at the CPU's width).
fn xa_plus_b(c: &mut Criterion) {
    use kiln::backend::Array;
    use kiln::ir::{DType, FunctionBuilder, Shape, Type};
    let mut b = FunctionBuilder::new("k");
    let x = b.arg("x", Type::new(DType::F32, Shape::fixed(&[1 << 20])));
    let a = b.scalar(DType::F32, 0.7).unwrap();
    let y = b.mul(x, a).unwrap();
    let shift = b.scalar(DType::F32, 0.1).unwrap();
    let y = b.add(y, shift).unwrap();
    let kernel = jit::kernel(&b.finish(&[y]).unwrap()).unwrap();
    let input = Array::zeros(DType::F32, &[1 << 20]);
    let mut output = Array::zeros(DType::F32, &[1 << 20]);
    let buffers = [input.data_ptr().cast_mut(), output.data_mut_ptr()];
    let mut group = c.benchmark_group("xa_plus_b_2^20");
    group
        .sample_size(20)
        .throughput(Throughput::Elements(1 << 20));
    for path in [jit::Path::Cranelift, jit::Path::Programs] {
        group.bench_function(format!("{path:?}"), |bench| {
            // SAFETY: the kernel's one input and one output, contiguous, of its types.
            bench.iter(|| unsafe { kernel.execute_on(&buffers, &[], false, Some(path)) })
        });
    }
    group.finish();
}

/// f32 sums over 2²¹ elements in each form a kernel has — a row per 1024 elements, columns of
/// `[2048, 1024]` (an accumulate stage), the whole array, columns of a product `x·y` (a
/// bias gradient's shape) and of `exp(x)·y` (split across threads by columns) — which
/// accumulate in f64 (blocked partials, an f64 accumulator).
fn reductions(c: &mut Criterion) {
    let mut group = c.benchmark_group("reductions");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1 << 21));
    let forms: [(&str, Vec<usize>, usize); 5] = [
        ("rows", vec![1], 0),
        ("columns", vec![0], 0),
        ("whole", vec![0, 1], 0),
        ("columns of x·y", vec![0], 1),
        ("columns of exp(x)·y, split", vec![0], 2),
    ];
    for (name, axes, terms) in forms {
        let mut forward = workloads::sum(2048, 1024, axes, terms).unwrap();
        group.bench_function(name, |b| b.iter(|| forward.call_reused().unwrap()));
    }
    group.finish();
}

/// One kernel (`sqrt`, `div`, `exp`; [`workloads::sqrt_div_exp`]) over 2²² normal and
/// subnormal floats, with subnormals flushed (the default) and kept (IEEE): what a
/// microcode assist per subnormal costs on this CPU, and what flushing saves.
fn subnormals(c: &mut Criterion) {
    use kiln::backend::subnormals::{Subnormals, set_subnormals};
    let mut group = c.benchmark_group("subnormals");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1 << 22));
    for (inputs, scale) in [("normal", 1.0), ("subnormal", 1e-40)] {
        let mut forward = workloads::sqrt_div_exp(1 << 22, scale).unwrap();
        for (mode, policy) in [("flush", Subnormals::Flush), ("keep", Subnormals::Keep)] {
            set_subnormals(Some(policy));
            group.bench_function(BenchmarkId::new(mode, inputs), |b| {
                b.iter(|| forward.call_reused().unwrap())
            });
        }
    }
    set_subnormals(None);
    group.finish();
}

fn eager(c: &mut Criterion) {
    let x = workloads::eager_add_input();
    c.bench_function("w6_eager_add_f32x4", |b| b.iter(|| black_box(&x + &x)));
}

criterion_group!(
    benches,
    elementwise,
    matmul,
    training,
    eager,
    paths,
    xa_plus_b,
    reductions,
    subnormals
);
criterion_main!(benches);
