//! The workloads the peer frameworks are measured on (`../shared/baselines`, W2–W8, and Kiln's
//! own W9–W12 — the digits CNN, a recurrent network, a transformer encoder, Fashion-MNIST
//! epochs — whose peer scripts are in `scripts/peers/`), written with Kiln's public API. The
//! criterion benches (`benches/workloads.rs`) and the comparison runner
//! (`examples/peer_workloads.rs`, which writes the peers' JSON-lines records) both run these,
//! so the figures they report are of the same code.

use kiln_backend::Array;
use kiln_backend::random::Stream;
use kiln_ir::{BinaryOp, DType, Shape, Type, Value};
use kiln_runtime::distributed::DataParallel;
use kiln_runtime::layers::{self, Activation, Dense};
use kiln_runtime::{Adam, Fetch, Init, Optimizer, Program, RuntimeResult, Session, Sgd, Target};
use ndarray::{ArrayD, IxDyn};
use std::sync::Arc;

/// `sqrt(2/π)`, the constant of the tanh form of gelu.
const GELU_K: f64 = 0.797_884_560_802_865_4;

/// An f32 array of `shape` whose element `i` (row-major) is `f(i)`, allocated as Kiln
/// allocates its own buffers (cache-line aligned), as a framework's tensors are.
fn filled(shape: &[usize], f: impl Fn(u64) -> f64) -> Array {
    let mut a = Array::zeros(DType::F32, shape);
    if let Array::F32(x) = &mut a {
        for (i, v) in x.iter_mut().enumerate() {
            *v = f(i as u64) as f32;
        }
    }
    a
}

/// Normal samples (mean 0, std `scale`), seeded.
pub fn normal(shape: &[usize], scale: f64, seed: u64) -> Array {
    let stream = Stream::new(seed, 0);
    filled(shape, |i| stream.normal(i, 0.0, scale))
}

/// Uniform samples in `[low, high)`, seeded.
pub fn uniform(shape: &[usize], low: f64, high: f64, seed: u64) -> Array {
    let stream = Stream::new(seed, 0);
    filled(shape, |i| stream.uniform(i, low, high))
}

/// A program computing one value from fed arrays, run in a session: W2, W3 and W4.
pub struct Forward {
    pub session: Session,
    pub output: Value,
    pub feeds: Vec<(String, Arc<Array>)>,
    /// The previous call's output, kept alive in [`Forward::call_fresh`] so that every call
    /// needs a new output buffer (what the peers' calls do).
    held: Option<Arc<Array>>,
}

impl Forward {
    fn new(program: Program, output: Value, feeds: Vec<(&str, Array)>) -> RuntimeResult<Forward> {
        Ok(Forward {
            session: Session::new(&program)?,
            output,
            feeds: feeds
                .into_iter()
                .map(|(n, a)| (n.to_owned(), Arc::new(a)))
                .collect(),
            held: None,
        })
    }

    fn run(&mut self) -> RuntimeResult<Arc<Array>> {
        let feeds: Vec<(&str, Arc<Array>)> = self
            .feeds
            .iter()
            .map(|(n, a)| (n.as_str(), a.clone()))
            .collect();
        Ok(self
            .session
            .run_shared(&[Fetch::Value(self.output)], &feeds)?
            .remove(0))
    }

    /// One call writing a fresh output buffer, as a caller that keeps its results gets.
    pub fn call_fresh(&mut self) -> RuntimeResult<Arc<Array>> {
        let out = self.run()?;
        self.held = Some(out.clone());
        Ok(out)
    }

    /// One call reusing the previous output's buffer (the caller dropped it).
    pub fn call_reused(&mut self) -> RuntimeResult<()> {
        self.held = None;
        self.run().map(drop)
    }

    pub fn input(&self, name: &str) -> &Array {
        &self
            .feeds
            .iter()
            .find(|(n, _)| n == name)
            .expect("a fed input")
            .1
    }
}

/// W2: `y = gelu_tanh(x·a + b)`, `x` f32[rows, cols], `a` and `b` f32[cols] broadcast along
/// rows, spelled out as the peers' "explicit formula".
pub fn gelu(rows: usize, cols: usize) -> RuntimeResult<Forward> {
    let mut p = Program::new();
    let x = p.placeholder("x", DType::F32, Shape::fixed(&[rows, cols]))?;
    let a = p.placeholder("a", DType::F32, Shape::fixed(&[cols]))?;
    let b = p.placeholder("b", DType::F32, Shape::fixed(&[cols]))?;
    let xa = p.mul(x, a)?;
    let v = p.add(xa, b)?;
    let v2 = p.mul(v, v)?;
    let v3 = p.mul(v2, v)?;
    let c = p.scalar(DType::F32, 0.044715)?;
    let cv3 = p.mul(v3, c)?;
    let inner = p.add(v, cv3)?;
    let k = p.scalar(DType::F32, GELU_K)?;
    let scaled = p.mul(inner, k)?;
    let t = p.tanh(scaled)?;
    let one = p.scalar(DType::F32, 1.0)?;
    let t1 = p.add(t, one)?;
    let vt = p.mul(v, t1)?;
    let half = p.scalar(DType::F32, 0.5)?;
    let y = p.mul(vt, half)?;
    let feeds = vec![
        ("x", normal(&[rows, cols], 1.0, 1)),
        ("a", normal(&[cols], 1.0, 2)),
        ("b", normal(&[cols], 1.0, 3)),
    ];
    Forward::new(p, y, feeds)
}

/// W2's reference in f64 for the first `rows` rows.
pub fn gelu_reference(x: &Array, a: &Array, b: &Array, rows: usize) -> Vec<f64> {
    let (x, a, b) = (x.to_f64_vec(), a.to_f64_vec(), b.to_f64_vec());
    let cols = a.len();
    (0..rows * cols)
        .map(|i| {
            let v = x[i] * a[i % cols] + b[i % cols];
            0.5 * v * (1.0 + (GELU_K * (v + 0.044715 * v * v * v)).tanh())
        })
        .collect()
}

/// One fused kernel of `sqrt`, `div` and `exp` over `len` floats — `x · exp(√x / (x + 1))` —
/// fed uniform values in `[1, 2)` scaled by `scale`: with a scale of 1e-40 every input and
/// output is subnormal (the speed of subnormals: `benches/workloads.rs`, `subnormals`).
pub fn sqrt_div_exp(len: usize, scale: f64) -> RuntimeResult<Forward> {
    let mut p = Program::new();
    let x = p.placeholder("x", DType::F32, Shape::fixed(&[len]))?;
    let root = p.sqrt(x)?;
    let one = p.scalar(DType::F32, 1.0)?;
    let shifted = p.add(x, one)?;
    let ratio = p.div(root, shifted)?;
    let e = p.exp(ratio)?;
    let y = p.mul(x, e)?;
    Forward::new(p, y, vec![("x", uniform(&[len], scale, 2.0 * scale, 5))])
}

/// An f32 sum over `axes` of `x` (`terms` 0), `x·y` (1) or `exp(x)·y` (2), of shape
/// `[rows, cols]`: the reduction forms of `benches/workloads.rs`, `reductions`.
pub fn sum(rows: usize, cols: usize, axes: Vec<usize>, terms: usize) -> RuntimeResult<Forward> {
    let mut p = Program::new();
    let x = p.placeholder("x", DType::F32, Shape::fixed(&[rows, cols]))?;
    let y = p.placeholder("y", DType::F32, Shape::fixed(&[rows, cols]))?;
    let operand = match terms {
        0 => x,
        1 => p.mul(x, y)?,
        _ => {
            let e = p.exp(x)?;
            p.mul(e, y)?
        }
    };
    let s = p.reduce(kiln_ir::ReduceOp::Sum, operand, axes, false)?;
    let feeds = vec![
        ("x", normal(&[rows, cols], 1.0, 6)),
        ("y", normal(&[rows, cols], 1.0, 7)),
    ];
    Forward::new(p, s, feeds)
}

/// W3: the numerically stable row softmax `exp(x − max) / Σ exp(x − max)` of f32[rows, cols].
pub fn softmax(rows: usize, cols: usize) -> RuntimeResult<Forward> {
    let mut p = Program::new();
    let x = p.placeholder("x", DType::F32, Shape::fixed(&[rows, cols]))?;
    let y = layers::softmax(&mut p, x, 1)?;
    Forward::new(p, y, vec![("x", normal(&[rows, cols], 4.0, 4))])
}

/// W3's reference in f64 for the first `rows` rows.
pub fn softmax_reference(x: &Array, cols: usize, rows: usize) -> Vec<f64> {
    let x = x.to_f64_vec();
    let mut out = Vec::with_capacity(rows * cols);
    for row in x.chunks(cols).take(rows) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        out.extend(row.iter().map(|v| (v - m).exp() / s));
    }
    out
}

/// W4: `[m, k] @ [k, n]` in f32.
pub fn matmul(m: usize, k: usize, n: usize) -> RuntimeResult<Forward> {
    let mut p = Program::new();
    let a = p.placeholder("a", DType::F32, Shape::fixed(&[m, k]))?;
    let b = p.placeholder("b", DType::F32, Shape::fixed(&[k, n]))?;
    let c = p.matmul(a, b)?;
    Forward::new(
        p,
        c,
        vec![
            ("a", normal(&[m, k], 1.0, 5)),
            ("b", normal(&[k, n], 1.0, 6)),
        ],
    )
}

/// W5's sizes: an MLP 784-512-512-10 trained with batch 256.
pub const MLP_SIZES: [usize; 4] = [784, 512, 512, 10];
pub const MLP_BATCH: usize = 256;

/// W9's batch: the digits CNN of `examples/digits_cnn.rs` trained with batch 256.
pub const CNN_BATCH: usize = 256;

/// One training step on a fixed batch, run in a session: W5 and W9.
pub struct TrainStep {
    pub session: Session,
    pub train: Target,
    pub loss: Value,
    pub feeds: Vec<(String, Arc<Array>)>,
}

/// W5: one training step of an MLP (ReLU, softmax cross-entropy on integer labels, plain SGD
/// with learning rate 0.01) on a fixed batch of seeded normal inputs; seeded initial weights.
pub fn mlp_step() -> RuntimeResult<TrainStep> {
    mlp_step_share(0, 1, 0)
}

/// W5 on `ranks` data-parallel ranks: rank `rank` trains on its share of the batch (rows
/// `rank·256/ranks ..`), and the gradients are averaged over the ranks of the current
/// thread's communicator ([`DataParallel`], in buckets of `bucket_bytes`, 0 for the default).
/// One rank is [`mlp_step`].
pub fn mlp_step_share(rank: usize, ranks: usize, bucket_bytes: usize) -> RuntimeResult<TrainStep> {
    let [d_in, h1, h2, d_out] = MLP_SIZES;
    let share = MLP_BATCH / ranks;
    let mut p = Program::with_seed(0);
    let x = p.placeholder("x", DType::F32, Shape::fixed(&[share, d_in]))?;
    let y = p.placeholder("y", DType::I64, Shape::fixed(&[share]))?;
    let h = Dense::new(&mut p, "fc1", d_in, h1, Activation::Relu)?.apply(&mut p, x)?;
    let h = Dense::new(&mut p, "fc2", h1, h2, Activation::Relu)?.apply(&mut p, h)?;
    let logits = Dense::new(&mut p, "fc3", h2, d_out, Activation::Identity)?.apply(&mut p, h)?;
    let rows = rank * share..(rank + 1) * share;
    let labels: Vec<i64> = (rows.start as u64..rows.end as u64)
        .map(|i| (Stream::new(8, 0).bits(i) % d_out as u64) as i64)
        .collect();
    let Array::F32(all) = normal(&[MLP_BATCH, d_in], 1.0, 7) else {
        unreachable!("normal() makes f32")
    };
    let x_batch = Array::F32(all.slice(ndarray::s![rows, ..]).to_owned().into_dyn());
    let sgd = Sgd::new(0.01);
    if ranks == 1 {
        TrainStep::new(p, logits, y, sgd, x_batch, labels)
    } else {
        let mut rule = DataParallel::new(sgd);
        if bucket_bytes > 0 {
            rule = rule.with_bucket_bytes(bucket_bytes);
        }
        TrainStep::new(p, logits, y, rule, x_batch, labels)
    }
}

/// W9: one training step of the digits CNN ([`crate::demos::digits_cnn::network`], hidden
/// 128; softmax cross-entropy, plain SGD with learning rate 0.05) on the first 256 digits;
/// seeded initial weights.
pub fn cnn_step() -> RuntimeResult<TrainStep> {
    let mut p = Program::with_seed(0);
    let x = p.placeholder("x", DType::F32, Shape::fixed(&[CNN_BATCH, 1, 8, 8]))?;
    let y = p.placeholder("y", DType::I64, Shape::fixed(&[CNN_BATCH]))?;
    let logits = crate::demos::digits_cnn::network(&mut p, x, 128)?;
    let digits = kiln_runtime::data::digits()?;
    let images = digits.features.slice(ndarray::s![..CNN_BATCH, ..]);
    let x_batch = ArrayD::from_shape_vec(
        IxDyn(&[CNN_BATCH, 1, 8, 8]),
        images.iter().copied().collect(),
    )
    .expect("256 images of 64 pixels");
    let labels = digits.labels[..CNN_BATCH].to_vec();
    TrainStep::new(p, logits, y, Sgd::new(0.05), Array::F32(x_batch), labels)
}

impl TrainStep {
    /// Adds the loss and `rule`'s update to `p`, which computes `logits` from placeholders
    /// `x` and `labels`, and opens a session fed with `x_batch` and `labels_batch`.
    fn new(
        mut p: Program,
        logits: Value,
        labels: Value,
        rule: impl Optimizer,
        x_batch: Array,
        labels_batch: Vec<i64>,
    ) -> RuntimeResult<TrainStep> {
        let loss = layers::softmax_cross_entropy(&mut p, logits, labels)?;
        let n = labels_batch.len();
        let y_batch = ArrayD::from_shape_vec(IxDyn(&[n]), labels_batch).expect("a batch");
        TrainStep::with_loss(p, loss, rule, x_batch, Array::I64(y_batch))
    }

    /// Adds `rule`'s update of `loss` to `p` and opens a session fed `x` and `y`.
    fn with_loss(
        mut p: Program,
        loss: Value,
        mut rule: impl Optimizer,
        x: Array,
        y: Array,
    ) -> RuntimeResult<TrainStep> {
        let train = rule.minimize(&mut p, loss)?;
        Ok(TrainStep {
            session: Session::new(&p)?,
            train,
            loss,
            feeds: vec![("x".to_owned(), Arc::new(x)), ("y".to_owned(), Arc::new(y))],
        })
    }

    /// Runs `fetches` on the batch; returns the first fetched value (the loss).
    fn run(&mut self, fetches: &[Fetch]) -> RuntimeResult<f64> {
        let feeds: Vec<(&str, Arc<Array>)> = (self.feeds.iter())
            .map(|(n, a)| (n.as_str(), a.clone()))
            .collect();
        let out = self.session.run_shared(fetches, &feeds)?;
        Ok(out[0].to_f64_vec()[0])
    }

    /// One training step; returns the loss before the update.
    pub fn step(&mut self) -> RuntimeResult<f64> {
        self.run(&[Fetch::Target(self.train), Fetch::Value(self.loss)])
    }

    /// The loss at the current parameters, without training.
    pub fn loss(&mut self) -> RuntimeResult<f64> {
        self.run(&[Fetch::Value(self.loss)])
    }
}

/// W10's sizes: steps, batch, width (inputs and state).
pub const RNN_SIZES: [usize; 3] = [64, 64, 256];

/// The parameter names of W10's cell, as `(weight, bias)`: the input's `[in, out]` weight
/// and bias, then the state's.
fn rnn_parameter_names() -> Vec<(String, String)> {
    ["rnn.ih", "rnn.hh"]
        .map(|l| (format!("{l}.w"), format!("{l}.b")))
        .to_vec()
}

/// W10: one training step of a recurrent network in a `while` loop — `h ← tanh(x_t·W + b +
/// h·U + c)` over 64 steps from `h = 0` (batch 64, width 256), `x_t` gathered from the
/// sequence by the loop counter — with the loss `mean((h − y)²)` of the last state and plain
/// SGD (learning rate 0.1); gradients through the loop.
pub fn rnn_step() -> RuntimeResult<TrainStep> {
    let [steps, batch, width] = RNN_SIZES;
    let mut p = Program::with_seed(0);
    let xs = p.placeholder("x", DType::F32, Shape::fixed(&[steps, batch, width]))?;
    let y = p.placeholder("y", DType::F32, Shape::fixed(&[batch, width]))?;
    let bound = 1.0 / (width as f64).sqrt();
    let init = Init::Uniform {
        low: -bound,
        high: bound,
    };
    let names = rnn_parameter_names();
    let mut params = Vec::new();
    for (w, b) in &names {
        params.push(p.parameter(w, DType::F32, &[width, width], init)?);
        params.push(p.parameter(b, DType::F32, &[width], init)?);
    }
    let (w_ih, b_ih, w_hh, b_hh) = (params[0], params[1], params[2], params[3]);
    let zero = p.scalar(DType::I32, 0.0)?;
    let h0 = p.constant(
        kiln_ir::Literal::F32(vec![0.0]),
        Type::new(DType::F32, Shape::fixed(&[batch, width])),
    )?;
    let last = p.while_loop(
        &[zero, h0],
        |b, c| {
            let n = b.scalar(DType::I32, steps as f64)?;
            b.compare(kiln_ir::CompareOp::Lt, c[0], n)
        },
        |f, c| {
            let x = f.gather(xs, c[0], 0)?;
            let xw = f.matmul(x, w_ih)?;
            let hu = f.matmul(c[1], w_hh)?;
            let bias = f.add(b_ih, b_hh)?;
            let s = f.add(xw, hu)?;
            let s = f.add(s, bias)?;
            let h = f.tanh(s)?;
            let one = f.scalar(DType::I32, 1.0)?;
            Ok::<_, kiln_ir::BuildError>(vec![f.add(c[0], one)?, h])
        },
    )?;
    let loss = layers::mse(&mut p, last[1], y)?;
    let x_batch = normal(&[steps, batch, width], 1.0, 21);
    let y_batch = uniform(&[batch, width], -0.5, 0.5, 22);
    TrainStep::with_loss(p, loss, Sgd::new(0.1), x_batch, y_batch)
}

/// W11's sizes: batch, tokens, model width, heads, feed-forward width, layers.
pub const TRANSFORMER_SIZES: [usize; 6] = [16, 128, 256, 4, 1024, 2];

/// W11: one training step of a 2-layer pre-norm transformer encoder
/// ([`layers::TransformerEncoderLayer`]: width 256, 4 causal heads, feed-forward 1024 with
/// GELU) and a final layer norm, on 16 sequences of 128 tokens; loss `mean((out − y)²)` with
/// `y` the input one token back; Adam (learning rate 1e-4).
pub fn transformer_step() -> RuntimeResult<TrainStep> {
    let [batch, tokens, width, heads, ff, layers] = TRANSFORMER_SIZES;
    let mut p = Program::with_seed(0);
    let shape = Shape::fixed(&[batch, tokens, width]);
    let x = p.placeholder("x", DType::F32, shape.clone())?;
    let y = p.placeholder("y", DType::F32, shape)?;
    let mut h = x;
    for l in 0..layers {
        let layer = layers::TransformerEncoderLayer::new(
            &mut p,
            &format!("layer{l}"),
            [width, heads, ff],
            true,
        )?;
        h = layer.apply(&mut p, h)?;
    }
    let h = layers::layer_norm(&mut p, "norm", h, 1e-5)?;
    let loss = layers::mse(&mut p, h, y)?;
    let x_batch = normal(&[batch, tokens, width], 1.0, 31);
    let Array::F32(xs) = &x_batch else {
        unreachable!("normal() makes f32")
    };
    let mut ys = ndarray::Array3::<f32>::zeros((batch, tokens, width));
    ys.slice_mut(ndarray::s![.., 1.., ..])
        .assign(&xs.slice(ndarray::s![.., ..tokens - 1, ..]));
    let y_batch = Array::F32(ys.into_dyn());
    TrainStep::with_loss(p, loss, Adam::new(1e-4), x_batch, y_batch)
}

/// W8: a GAN on 1-D data as the peers run it — generator 1→16→16→1 (tanh), discriminator
/// 1→16→16→1 (tanh, sigmoid out), real data N(4, 0.5), noise U(−8, 8), batch 64, losses
/// with `log(p + 1e-8)`, and plain SGD (learning rate 0.01) for each network. One iteration
/// is a discriminator update, then a generator update on fresh noise.
pub struct Gan {
    pub session: Session,
    pub d_train: Target,
    pub g_train: Target,
    pub d_loss: Value,
    pub g_loss: Value,
}

const GAN_BATCH: usize = 64;
const GAN_HIDDEN: usize = 16;

fn gan_mlp(p: &mut Program, name: &str) -> RuntimeResult<[Dense; 3]> {
    Ok([
        Dense::new(p, &format!("{name}.fc1"), 1, GAN_HIDDEN, Activation::Tanh)?,
        Dense::new(
            p,
            &format!("{name}.fc2"),
            GAN_HIDDEN,
            GAN_HIDDEN,
            Activation::Tanh,
        )?,
        Dense::new(
            p,
            &format!("{name}.out"),
            GAN_HIDDEN,
            1,
            Activation::Identity,
        )?,
    ])
}

fn gan_apply(p: &mut Program, net: &[Dense; 3], x: Value, sigmoid: bool) -> RuntimeResult<Value> {
    let mut h = x;
    for layer in net {
        h = layer.apply(p, h)?;
    }
    Ok(if sigmoid { p.sigmoid(h)? } else { h })
}

/// `mean(−log(p + 1e-8))`.
fn neg_log_mean(p: &mut Program, probability: Value) -> RuntimeResult<Value> {
    let eps = p.scalar(DType::F32, 1e-8)?;
    let shifted = p.add(probability, eps)?;
    let log = p.log(shifted)?;
    let m = layers::mean(p, log)?;
    Ok(p.neg(m)?)
}

pub fn gan() -> RuntimeResult<Gan> {
    let mut p = Program::with_seed(0);
    let batch = Type::new(DType::F32, Shape::fixed(&[GAN_BATCH, 1]));
    let generator = gan_mlp(&mut p, "gen")?;
    let discriminator = gan_mlp(&mut p, "disc")?;
    let real = p.random_normal(batch.clone(), 4.0, 0.5, 11)?;
    let z = p.random_uniform(batch.clone(), -8.0, 8.0, 12)?;
    let fake = gan_apply(&mut p, &generator, z, false)?;
    let d_real = gan_apply(&mut p, &discriminator, real, true)?;
    let d_fake = gan_apply(&mut p, &discriminator, fake, true)?;
    let one = p.scalar(DType::F32, 1.0)?;
    let not_fake = p.binary(BinaryOp::Sub, one, d_fake)?;
    let real_term = neg_log_mean(&mut p, d_real)?;
    let fake_term = neg_log_mean(&mut p, not_fake)?;
    let d_loss = p.add(real_term, fake_term)?;
    let z2 = p.random_uniform(batch, -8.0, 8.0, 13)?;
    let fake2 = gan_apply(&mut p, &generator, z2, false)?;
    let d_fake2 = gan_apply(&mut p, &discriminator, fake2, true)?;
    let g_loss = neg_log_mean(&mut p, d_fake2)?;
    let names = |prefix: &str, p: &Program| -> Vec<String> {
        (p.params().iter())
            .filter(|q| q.name.starts_with(prefix))
            .map(|q| q.name.clone())
            .collect()
    };
    let (d_params, g_params) = (names("disc.", &p), names("gen.", &p));
    let d_train = Sgd::named("d_sgd", 0.01).minimize_params(&mut p, d_loss, &d_params)?;
    let g_train = Sgd::named("g_sgd", 0.01).minimize_params(&mut p, g_loss, &g_params)?;
    Ok(Gan {
        session: Session::new(&p)?,
        d_train,
        g_train,
        d_loss,
        g_loss,
    })
}

impl Gan {
    /// One discriminator update and one generator update; returns both losses.
    pub fn iteration(&mut self) -> RuntimeResult<(f64, f64)> {
        let d = self.session.run_shared(
            &[Fetch::Target(self.d_train), Fetch::Value(self.d_loss)],
            &[],
        )?;
        let g = self.session.run_shared(
            &[Fetch::Target(self.g_train), Fetch::Value(self.g_loss)],
            &[],
        )?;
        Ok((d[0].to_f64_vec()[0], g[0].to_f64_vec()[0]))
    }
}

/// W6: one eager op, `x + x` on an f32[4] tensor.
pub fn eager_add_input() -> kiln_runtime::eager::Tensor {
    kiln_runtime::eager::Tensor::new(Array::F32(
        ArrayD::from_shape_vec(IxDyn(&[4]), vec![0.0, 1.0, 2.0, 3.0]).expect("four elements"),
    ))
}

/// Reduces a row-major array to `f64`s of its first `n` elements (for error checks).
pub fn head(a: &Array, n: usize) -> Vec<f64> {
    a.to_f64_vec().into_iter().take(n).collect()
}

/// The largest absolute difference between two sequences.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// What W12 measured: each epoch's seconds (data loading by the [`DataLoader`] included), the
/// seconds reading the files, the last epoch's mean loss and the test accuracy after training.
///
/// [`DataLoader`]: kiln_runtime::data::DataLoader
pub struct EpochRun {
    pub epoch_seconds: Vec<f64>,
    pub load_seconds: f64,
    pub mean_loss_last_epoch: f64,
    pub test_accuracy: f64,
}

/// W12: `epochs` epochs of the tour's CNN on the MNIST-format folder `dir` (Fashion-MNIST) as a
/// static program — batch 64 shuffled each epoch, Adam with learning rate 0.001 — driven by the
/// [`crate::train::Trainer`] over a [`kiln_runtime::data::DataLoader`].
pub fn fashion_epochs(dir: &std::path::Path, epochs: usize) -> RuntimeResult<EpochRun> {
    use crate::train::{Control, Event, StaticClassifier, Trainer};
    use kiln_runtime::data::{self, DataLoader};
    let start = std::time::Instant::now();
    let images = data::mnist(dir)?;
    let load_seconds = start.elapsed().as_secs_f64();
    let mut p = Program::with_seed(0);
    let [c, h, w] = [1, 28, 28].map(kiln_ir::Dim::Fixed);
    let x = p.placeholder("x", DType::F32, vec![kiln_ir::Dim::sym("N"), c, h, w])?;
    let y = p.placeholder("y", DType::I64, vec![kiln_ir::Dim::sym("N")])?;
    let logits = crate::demos::digits_cnn::network(&mut p, x, 128)?;
    let loss = layers::softmax_cross_entropy(&mut p, logits, y)?;
    let train = kiln_runtime::Adam::new(0.001).minimize(&mut p, loss)?;
    let learner = StaticClassifier::new(Session::new(&p)?, logits, loss, train);
    let mut epoch_seconds = Vec::new();
    let mut trainer = Trainer::new(learner).progress(false).on(|event| {
        if let Event::EpochEnd { record } = event {
            epoch_seconds.push(record.seconds);
        }
        Control::Continue
    });
    let history = trainer.fit(&DataLoader::new(images.train, 64).shuffle(1), epochs)?;
    let mean_loss_last_epoch = history.epochs.last().map_or(f64::NAN, |e| e.train.loss);
    let (test, _) = trainer.evaluate(&DataLoader::new(images.test, 1000))?;
    drop(trainer);
    Ok(EpochRun {
        epoch_seconds,
        load_seconds,
        mean_loss_last_epoch,
        test_accuracy: test.accuracy,
    })
}
