//! Layers against formulas written independently of Kiln: each reference below is plain f64
//! loops from the layer's textbook (and PyTorch's) definition — never the library's
//! composites or its gradient pass. A layer's eager forward values must match the reference,
//! and its gradients (of the input and of every parameter, from `backward()`) must match
//! central finite differences of the reference in f64. Every parameter, biases included, is
//! set to random values, so that a bias added twice or a gate read from the wrong block shows.
//!
//! Conventions checked (PyTorch's): LSTM gates `i, f, g, o` in blocks of the `[D, 4H]` and
//! `[H, 4H]` weights (Kiln's weights are PyTorch's transposed), `c' = f·c + i·g`,
//! `h' = o·tanh(c')`; GRU gates `r, z, n` with both biases and `n = tanh(x·W_n + b_in +
//! r·(h·U_n + b_hn))`, `h' = (1 − z)·n + z·h`; layer norm with the biased variance and `eps`
//! inside the square root; batch norm normalising by the biased batch variance and keeping the
//! unbiased one in its running average (momentum 0.1); attention scaled by `1/√d`; average
//! pooling dividing by the whole window (padding counts).

use kiln_backend::Array;
use kiln_ir::{Conv2dAttrs, Pool2dAttrs};
use kiln_runtime::eager::nn::{self, BatchNorm, Conv2d, Gru, Layer, LayerNorm, Lstm, Parameter};
use kiln_runtime::eager::{self, Tensor};

/// Deterministic values in [-1, 1), each exactly an f32 (so Kiln and the reference start from
/// the same numbers).
fn data(n: usize, seed: u64) -> Vec<f64> {
    let s = kiln_backend::random::Stream::new(seed, 7);
    (0..n as u64)
        .map(|i| s.uniform(i, -1.0, 1.0) as f32 as f64)
        .collect()
}

fn tensor(shape: &[usize], values: &[f64]) -> Tensor {
    Tensor::from_f32(shape, values.iter().map(|&v| v as f32).collect()).unwrap()
}

fn set(p: &Parameter, values: &[f64]) {
    let shape = p.decl().ty.shape.as_fixed().unwrap();
    let a = ndarray::ArrayD::from_shape_vec(shape, values.iter().map(|&v| v as f32).collect());
    p.set(Array::F32(a.unwrap())).unwrap();
}

fn numel(p: &Parameter) -> usize {
    p.decl().ty.shape.num_elements().unwrap()
}

#[track_caller]
fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: Kiln {g}, reference {w}"
        );
    }
}

/// Checks a layer: `forward` runs it on an eager input of `x_shape`; `reference` computes the
/// same from the input's values and each parameter's (in `params`' order), in f64. The loss is
/// `Σ y·w` for fixed random `w`, so every output element's gradient differs.
fn check(
    what: &str,
    x_shape: &[usize],
    params: &[Parameter],
    forward: impl Fn(&Tensor) -> Tensor,
    reference: impl Fn(&[Vec<f64>]) -> Vec<f64>,
) {
    let mut args = vec![data(x_shape.iter().product(), 1)];
    for (k, p) in params.iter().enumerate() {
        let values: Vec<f64> = data(numel(p), 10 + k as u64)
            .iter()
            .map(|v| 0.6 * v)
            .collect();
        set(p, &values);
        p.zero_grad();
        args.push(values);
    }
    let x = tensor(x_shape, &args[0]).requires_grad().unwrap();
    let y = forward(&x);
    let want = reference(&args);
    let y_shape = y.ty().shape.as_fixed().unwrap();
    let weights = data(want.len(), 99);
    close(
        &format!("{what}: output"),
        &y.to_f64_vec().unwrap(),
        &want,
        1e-5,
    );
    let loss = y
        .mul(&tensor(&y_shape, &weights))
        .unwrap()
        .sum_all()
        .unwrap();
    loss.backward().unwrap();
    let weighted = |args: &[Vec<f64>]| -> f64 {
        reference(args)
            .iter()
            .zip(&weights)
            .map(|(y, w)| y * w)
            .sum()
    };
    let grads: Vec<Vec<f64>> = std::iter::once(x.grad())
        .chain(params.iter().map(Parameter::grad))
        .map(|g| g.map_or_else(Vec::new, |g| g.to_f64_vec().unwrap()))
        .collect();
    // The same layer traced with `to_static` and compiled (its own kernels, the gradient
    // pass over the traced program) against the same reference.
    let ty = x.ty();
    let mut compiled = eager::to_static(&[("x", ty.clone()), ("w", y.ty())], |t| {
        let y = forward(&t[0]);
        Ok(vec![y.mul(&t[1])?.sum_all()?, y])
    })
    .unwrap();
    let (plain, w) = (tensor(x_shape, &args[0]), tensor(&y_shape, &weights));
    let outs = compiled.call(&[&plain, &w]).unwrap();
    close(
        &format!("{what}: compiled output"),
        &outs[1].to_f64_vec().unwrap(),
        &want,
        1e-5,
    );
    let (_, traced) = compiled.gradients(&[&plain, &w], 0).unwrap();
    let compiled_grads: Vec<Vec<f64>> = std::iter::once(traced.inputs[0].as_ref())
        .map(|g| g.map_or_else(Vec::new, |g| g.to_f64_vec().unwrap()))
        .chain(params.iter().map(|p| {
            let found = traced.parameters.iter().find(|(n, _)| n == p.name());
            found.map_or_else(Vec::new, |(_, g)| g.to_f64_vec().unwrap())
        }))
        .collect();
    for (k, got) in grads.iter().enumerate() {
        let name = if k == 0 {
            "input"
        } else {
            params[k - 1].name()
        };
        let mut fd = Vec::with_capacity(args[k].len());
        for j in 0..args[k].len() {
            let h = 1e-6;
            let mut moved = args.clone();
            moved[k][j] += h;
            let up = weighted(&moved);
            moved[k][j] -= 2.0 * h;
            let down = weighted(&moved);
            fd.push((up - down) / (2.0 * h));
        }
        close(&format!("{what}: d/d{name}"), got, &fd, 2e-4);
        close(
            &format!("{what}: compiled d/d{name}"),
            &compiled_grads[k],
            &fd,
            2e-4,
        );
    }
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// `x[n, t, :] · w` for `w` of `[rows, cols]`, column block `block` of width `h`.
fn affine(x: &[f64], w: &[f64], cols: usize, block: usize, h: usize, unit: usize) -> f64 {
    (0..x.len())
        .map(|i| x[i] * w[i * cols + block * h + unit])
        .sum()
}

/// PyTorch's LSTM, batch-first, zero initial state: every step's hidden state.
fn lstm_reference(args: &[Vec<f64>], [n, t, d, hidden]: [usize; 4]) -> Vec<f64> {
    let (x, w_ih, w_hh, b) = (&args[0], &args[1], &args[2], &args[3]);
    let cols = 4 * hidden;
    let mut out = Vec::new();
    let mut states = vec![(vec![0.0; hidden], vec![0.0; hidden]); n];
    let mut steps = vec![vec![vec![0.0; hidden]; t]; n];
    for step in 0..t {
        for (s, (h, c)) in states.iter_mut().enumerate() {
            let xt = &x[(s * t + step) * d..][..d];
            let pre = |block: usize, u: usize| {
                affine(xt, w_ih, cols, block, hidden, u)
                    + affine(h, w_hh, cols, block, hidden, u)
                    + b[block * hidden + u]
            };
            let gates: Vec<[f64; 4]> = (0..hidden)
                .map(|u| {
                    [
                        sigmoid(pre(0, u)),
                        sigmoid(pre(1, u)),
                        pre(2, u).tanh(),
                        sigmoid(pre(3, u)),
                    ]
                })
                .collect();
            for (u, [i, f, g, o]) in gates.into_iter().enumerate() {
                c[u] = f * c[u] + i * g;
                h[u] = o * c[u].tanh();
            }
            steps[s][step] = h.clone();
        }
    }
    for sample in steps {
        for h in sample {
            out.extend(h);
        }
    }
    out
}

#[test]
fn lstm_matches_pytorchs_definition() {
    let [n, t, d, hidden] = [2, 3, 3, 4];
    let lstm = Lstm::new("lstm", d, hidden).unwrap();
    let params = lstm.parameters();
    check(
        "lstm",
        &[n, t, d],
        &params,
        |x| lstm.forward(x).unwrap(),
        |args| lstm_reference(args, [n, t, d, hidden]),
    );
}

/// PyTorch's GRU, batch-first, zero initial state: every step's hidden state.
fn gru_reference(args: &[Vec<f64>], [n, t, d, hidden]: [usize; 4]) -> Vec<f64> {
    let (x, w_ih, w_hh, b_ih, b_hh) = (&args[0], &args[1], &args[2], &args[3], &args[4]);
    let cols = 3 * hidden;
    let mut out = vec![0.0; n * t * hidden];
    for s in 0..n {
        let mut h = vec![0.0; hidden];
        for step in 0..t {
            let xt = &x[(s * t + step) * d..][..d];
            let gx = |block: usize, u: usize| {
                affine(xt, w_ih, cols, block, hidden, u) + b_ih[block * hidden + u]
            };
            let gh = |block: usize, u: usize| {
                affine(&h, w_hh, cols, block, hidden, u) + b_hh[block * hidden + u]
            };
            let next: Vec<f64> = (0..hidden)
                .map(|u| {
                    let r = sigmoid(gx(0, u) + gh(0, u));
                    let z = sigmoid(gx(1, u) + gh(1, u));
                    let cand = (gx(2, u) + r * gh(2, u)).tanh();
                    (1.0 - z) * cand + z * h[u]
                })
                .collect();
            h = next;
            out[(s * t + step) * hidden..][..hidden].copy_from_slice(&h);
        }
    }
    out
}

#[test]
fn gru_matches_pytorchs_definition() {
    let [n, t, d, hidden] = [2, 3, 3, 4];
    let gru = Gru::new("gru", d, hidden).unwrap();
    let params = gru.parameters();
    check(
        "gru",
        &[n, t, d],
        &params,
        |x| gru.forward(x).unwrap(),
        |args| gru_reference(args, [n, t, d, hidden]),
    );
}

#[test]
fn layer_norm_matches_its_definition() {
    let [rows, width] = [3, 5];
    let eps = 1e-5;
    let ln = LayerNorm::new("ln", width, eps).unwrap();
    check(
        "layer_norm",
        &[rows, width],
        &ln.parameters(),
        |x| ln.forward(x).unwrap(),
        |args| {
            let (x, gamma, beta) = (&args[0], &args[1], &args[2]);
            let mut out = Vec::new();
            for row in x.chunks(width) {
                let mean = row.iter().sum::<f64>() / width as f64;
                let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / width as f64;
                for (j, v) in row.iter().enumerate() {
                    out.push((v - mean) / (var + eps).sqrt() * gamma[j] + beta[j]);
                }
            }
            out
        },
    );
}

/// Batch norm of NCHW `x` with per-channel `mean` and `var` (or the batch's when `None`).
fn batch_norm_reference(
    x: &[f64],
    [n, c, plane]: [usize; 3],
    stats: Option<(&[f64], &[f64])>,
    gamma: &[f64],
    beta: &[f64],
) -> Vec<f64> {
    let at = |s: usize, ch: usize, p: usize| x[(s * c + ch) * plane + p];
    let mut out = vec![0.0; x.len()];
    for ch in 0..c {
        let values: Vec<f64> = (0..n)
            .flat_map(|s| (0..plane).map(move |p| (s, p)))
            .map(|(s, p)| at(s, ch, p))
            .collect();
        let count = values.len() as f64;
        let batch_mean = values.iter().sum::<f64>() / count;
        let batch_var = values.iter().map(|v| (v - batch_mean).powi(2)).sum::<f64>() / count;
        let (mean, var) = stats.map_or((batch_mean, batch_var), |(m, v)| (m[ch], v[ch]));
        for s in 0..n {
            for p in 0..plane {
                let i = (s * c + ch) * plane + p;
                out[i] = (x[i] - mean) / (var + 1e-5).sqrt() * gamma[ch] + beta[ch];
            }
        }
    }
    out
}

#[test]
fn batch_norm_matches_its_definition_in_training_and_evaluation() {
    let [n, c, h, w] = [3, 2, 2, 2];
    let mut bn = BatchNorm::new("bn", c).unwrap();
    check(
        "batch_norm (training)",
        &[n, c, h, w],
        &bn.parameters(),
        |x| bn.forward(x).unwrap(),
        |args| batch_norm_reference(&args[0], [n, c, h * w], None, &args[1], &args[2]),
    );
    // The running averages after one training step of a fresh layer (momentum 0.1, from
    // zeros and ones): the batch mean and the unbiased batch variance.
    let fresh = BatchNorm::new("bn_fresh", c).unwrap();
    let x = data(n * c * h * w, 1);
    fresh.forward(&tensor(&[n, c, h, w], &x)).unwrap();
    let (mut means, mut vars) = (Vec::new(), Vec::new());
    for ch in 0..c {
        let values: Vec<f64> = (0..n)
            .flat_map(|s| x[(s * c + ch) * h * w..][..h * w].to_vec())
            .collect();
        let count = values.len() as f64;
        let mean = values.iter().sum::<f64>() / count;
        let unbiased = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (count - 1.0);
        means.push(0.1 * mean);
        vars.push(0.9 + 0.1 * unbiased);
    }
    let running = |p: &Parameter| p.tensor().unwrap().to_f64_vec().unwrap();
    close("running mean", &running(&fresh.running_mean), &means, 1e-6);
    close("running var", &running(&fresh.running_var), &vars, 1e-6);
    // Evaluation: the running statistics, not the batch's.
    bn.set_training(false);
    let (rm, rv) = (running(&bn.running_mean), running(&bn.running_var));
    let params = bn.parameters();
    check(
        "batch_norm (evaluation)",
        &[n, c, h, w],
        &params,
        |x| bn.forward(x).unwrap(),
        |args| {
            batch_norm_reference(
                &args[0],
                [n, c, h * w],
                Some((&rm, &rv)),
                &args[1],
                &args[2],
            )
        },
    );
}

/// `a · b` for row-major `[m, k]` and `[k, n]`.
fn matmul(a: &[f64], b: &[f64], [m, k, n]: [usize; 3]) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
        }
    }
    out
}

#[test]
fn self_attention_matches_its_definition() {
    let [n, t, features, dim] = [2, 3, 4, 2];
    let attention = nn::SelfAttention::new("att", features, dim).unwrap();
    check(
        "self_attention",
        &[n, t, features],
        &attention.parameters(),
        |x| attention.forward(x).unwrap(),
        |args| {
            let (wq, wk, wv, wo) = (&args[1], &args[2], &args[3], &args[4]);
            let mut out = Vec::new();
            for x in args[0].chunks(t * features) {
                let q = matmul(x, wq, [t, features, dim]);
                let k = matmul(x, wk, [t, features, dim]);
                let v = matmul(x, wv, [t, features, dim]);
                let mut context = vec![0.0; t * dim];
                for i in 0..t {
                    let scores: Vec<f64> = (0..t)
                        .map(|j| {
                            (0..dim)
                                .map(|l| q[i * dim + l] * k[j * dim + l])
                                .sum::<f64>()
                                / (dim as f64).sqrt()
                        })
                        .collect();
                    let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                    let total: f64 = e.iter().sum();
                    for j in 0..t {
                        for l in 0..dim {
                            context[i * dim + l] += e[j] / total * v[j * dim + l];
                        }
                    }
                }
                out.extend(matmul(&context, wo, [t, dim, features]));
            }
            out
        },
    );
}

/// Causal multi-head attention with biased projections, against its definition written out
/// head by head: token `i` of head `h` attends to tokens `j ≤ i` with that head's features.
#[test]
fn causal_multi_head_attention_matches_its_definition() {
    let [n, t, width, heads] = [2, 4, 6, 3];
    let dim = width / heads;
    let attention = nn::MultiHeadAttention::new("mha", width, heads, true).unwrap();
    check(
        "multi_head_attention",
        &[n, t, width],
        &attention.parameters(),
        |x| attention.forward(x).unwrap(),
        |args| {
            let project = |x: &[f64], k: usize| -> Vec<f64> {
                let (w, b) = (&args[1 + 2 * k], &args[2 + 2 * k]);
                let y = matmul(x, w, [t, width, width]);
                y.iter()
                    .enumerate()
                    .map(|(i, v)| v + b[i % width])
                    .collect()
            };
            let mut out = Vec::new();
            for x in args[0].chunks(t * width) {
                let (q, k, v) = (project(x, 0), project(x, 1), project(x, 2));
                let mut context = vec![0.0; t * width];
                for h in 0..heads {
                    let at = |m: &[f64], i: usize, l: usize| m[i * width + h * dim + l];
                    for i in 0..t {
                        let scores: Vec<f64> = (0..=i)
                            .map(|j| {
                                (0..dim).map(|l| at(&q, i, l) * at(&k, j, l)).sum::<f64>()
                                    / (dim as f64).sqrt()
                            })
                            .collect();
                        let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                        let total: f64 = e.iter().sum();
                        for (j, e) in e.iter().enumerate() {
                            for l in 0..dim {
                                context[i * width + h * dim + l] += e / total * at(&v, j, l);
                            }
                        }
                    }
                }
                out.extend(project(&context, 3));
            }
            out
        },
    );
}

#[test]
fn softmax_cross_entropy_matches_its_definition() {
    let [rows, classes] = [4, 5];
    let labels: Vec<i64> = vec![0, 3, 4, 3];
    let label_tensor = Tensor::new(Array::I64(ndarray::arr1(&labels).into_dyn()));
    check(
        "softmax_cross_entropy",
        &[rows, classes],
        &[],
        |x| nn::cross_entropy(x, &label_tensor).unwrap(),
        |args| {
            let total: f64 = (args[0].chunks(classes).zip(&labels))
                .map(|(row, &label)| {
                    let top = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let log_sum = row.iter().map(|v| (v - top).exp()).sum::<f64>().ln() + top;
                    log_sum - row[label as usize]
                })
                .sum();
            vec![total / rows as f64]
        },
    );
}

/// The input element a window tap reads: `None` where it reads padding.
fn tap(
    out: usize,
    k: usize,
    stride: usize,
    dilation: usize,
    low: usize,
    size: usize,
) -> Option<usize> {
    (out * stride + k * dilation)
        .checked_sub(low)
        .filter(|&i| i < size)
}

#[test]
fn convolution_with_strides_padding_dilation_and_groups_matches_its_definition() {
    let [n, c, h, w, o, kh, kw] = [2, 4, 5, 6, 4, 2, 3];
    let attrs = Conv2dAttrs {
        strides: [2, 1],
        padding: [(1, 0), (2, 1)],
        dilation: [2, 1],
        groups: 2,
        channels_last: false,
    };
    let conv = Conv2d::new("conv", [c, o], [kh, kw], attrs).unwrap();
    let out_size = |size: usize, axis: usize, k: usize| {
        let (lo, hi) = attrs.padding[axis];
        (size + lo + hi - attrs.dilation[axis] * (k - 1) - 1) / attrs.strides[axis] + 1
    };
    let (oh, ow) = (out_size(h, 0, kh), out_size(w, 1, kw));
    let (cg, og) = (c / attrs.groups, o / attrs.groups);
    check(
        "conv2d",
        &[n, c, h, w],
        &conv.parameters(),
        |x| conv.forward(x).unwrap(),
        |args| {
            let (x, wt, bias) = (&args[0], &args[1], &args[2]);
            let mut out = Vec::new();
            for s in 0..n {
                for oc in 0..o {
                    let group = oc / og;
                    for y in 0..oh {
                        for xo in 0..ow {
                            let mut acc = bias[oc];
                            for ci in 0..cg {
                                let ic = group * cg + ci;
                                for a in 0..kh {
                                    for b in 0..kw {
                                        let iy = tap(y, a, 2, 2, 1, h);
                                        let ix = tap(xo, b, 1, 1, 2, w);
                                        if let (Some(iy), Some(ix)) = (iy, ix) {
                                            acc += x[((s * c + ic) * h + iy) * w + ix]
                                                * wt[((oc * cg + ci) * kh + a) * kw + b];
                                        }
                                    }
                                }
                            }
                            out.push(acc);
                        }
                    }
                }
            }
            out
        },
    );
}

/// Max or average pooling of NCHW `x` by its definition: windows over the padded input
/// (padding is −∞ for max, 0 for average, whose divisor is the whole window).
fn pool_reference(
    x: &[f64],
    [planes, h, w]: [usize; 3],
    attrs: Pool2dAttrs,
    max: bool,
) -> Vec<f64> {
    let [kh, kw] = attrs.window;
    let [(top, bottom), (left, right)] = attrs.padding;
    let oh = (h + top + bottom - kh) / attrs.strides[0] + 1;
    let ow = (w + left + right - kw) / attrs.strides[1] + 1;
    let mut out = Vec::new();
    for plane in 0..planes {
        for y in 0..oh {
            for xo in 0..ow {
                let taps = (0..kh)
                    .flat_map(|a| (0..kw).map(move |b| (a, b)))
                    .map(|(a, b)| {
                        let iy = tap(y, a, attrs.strides[0], 1, top, h);
                        let ix = tap(xo, b, attrs.strides[1], 1, left, w);
                        match (iy, ix) {
                            (Some(iy), Some(ix)) => x[(plane * h + iy) * w + ix],
                            _ if max => f64::NEG_INFINITY,
                            _ => 0.0,
                        }
                    });
                out.push(match max {
                    true => taps.fold(f64::NEG_INFINITY, f64::max),
                    false => taps.sum::<f64>() / (kh * kw) as f64,
                });
            }
        }
    }
    out
}

#[test]
fn pooling_with_overlapping_strided_asymmetrically_padded_windows_matches_its_definition() {
    let [n, c, h, w] = [2, 2, 7, 6];
    for attrs in [
        // Overlapping windows (stride < window), asymmetric padding.
        Pool2dAttrs {
            window: [3, 3],
            strides: [2, 2],
            padding: [(1, 0), (2, 1)],
            channels_last: false,
        },
        // Strides larger than the window (inputs skipped), and a non-square window.
        Pool2dAttrs {
            window: [2, 1],
            strides: [3, 2],
            padding: [(0, 1), (0, 0)],
            channels_last: false,
        },
    ] {
        for max in [true, false] {
            let what = format!(
                "{} {attrs:?}",
                if max { "max_pool2d" } else { "avg_pool2d" }
            );
            check(
                &what,
                &[n, c, h, w],
                &[],
                |x| match max {
                    true => x.max_pool2d(attrs).unwrap(),
                    false => x.avg_pool2d(attrs).unwrap(),
                },
                |args| pool_reference(&args[0], [n * c, h, w], attrs, max),
            );
        }
    }
}

#[test]
fn linear_matches_its_definition() {
    let [rows, inputs, outputs] = [3, 4, 2];
    let linear = nn::Linear::new("fc", inputs, outputs).unwrap();
    check(
        "linear",
        &[rows, inputs],
        &linear.parameters(),
        |x| linear.forward(x).unwrap(),
        |args| {
            let y = matmul(&args[0], &args[1], [rows, inputs, outputs]);
            (y.iter().enumerate())
                .map(|(i, v)| v + args[2][i % outputs])
                .collect()
        },
    );
}

/// erf by its Maclaurin series, to f64 precision for |x| ≤ 3.
fn erf(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..80 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn elementwise_composites_match_their_definitions() {
    let shape = [3, 4];
    // GELU (the erf form, as PyTorch's default).
    check(
        "gelu",
        &shape,
        &[],
        |x| x.gelu().unwrap(),
        |args| {
            (args[0].iter())
                .map(|&v| 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2)))
                .collect()
        },
    );
    // Softmax and log-softmax along the last axis.
    let softmax_rows = |x: &[f64], log: bool| -> Vec<f64> {
        x.chunks(shape[1])
            .flat_map(|row| {
                let total: f64 = row.iter().map(|v| v.exp()).sum();
                row.iter()
                    .map(move |v| if log { v - total.ln() } else { v.exp() / total })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    check(
        "softmax",
        &shape,
        &[],
        |x| x.softmax(1).unwrap(),
        |a| softmax_rows(&a[0], false),
    );
    check(
        "log_softmax",
        &shape,
        &[],
        |x| x.log_softmax(1).unwrap(),
        |a| softmax_rows(&a[0], true),
    );
    // Mean squared error and binary cross-entropy with logits, against fixed targets.
    let targets = data(12, 5).iter().map(|v| v.abs()).collect::<Vec<f64>>();
    let target_tensor = tensor(&shape, &targets);
    check(
        "mse",
        &shape,
        &[],
        |x| nn::mse(x, &target_tensor).unwrap(),
        |a| {
            let sum: f64 = a[0]
                .iter()
                .zip(&targets)
                .map(|(p, t)| (p - t).powi(2))
                .sum();
            vec![sum / 12.0]
        },
    );
    check(
        "binary_cross_entropy_with_logits",
        &shape,
        &[],
        |x| nn::binary_cross_entropy_with_logits(x, &target_tensor).unwrap(),
        |a| {
            let sum: f64 = (a[0].iter().zip(&targets))
                .map(|(&z, &t)| {
                    let p = sigmoid(z);
                    -(t * p.ln() + (1.0 - t) * (1.0 - p).ln())
                })
                .sum();
            vec![sum / 12.0]
        },
    );
    // The spatial mean of NCHW.
    check(
        "global_avg_pool",
        &[2, 3, 2, 2],
        &[],
        |x| nn::GlobalAvgPool.forward(x).unwrap(),
        |a| {
            a[0].chunks(4)
                .map(|p| p.iter().sum::<f64>() / 4.0)
                .collect()
        },
    );
}

#[test]
fn embedding_rows_and_their_gradient_with_repeated_indices() {
    let emb = nn::Embedding::new("emb", 4, 3).unwrap();
    let table = data(12, 3);
    set(&emb.table, &table);
    emb.table.zero_grad();
    let indices = [2i64, 0, 2, 3, 2];
    let idx = Tensor::new(Array::I64(ndarray::arr1(&indices).into_dyn()));
    let y = emb.forward(&idx).unwrap();
    let want: Vec<f64> = (indices.iter())
        .flat_map(|&i| table[i as usize * 3..][..3].to_vec())
        .collect();
    close("embedding", &y.to_f64_vec().unwrap(), &want, 1e-7);
    let weights = data(15, 4);
    let loss = y
        .mul(&tensor(&[5, 3], &weights))
        .unwrap()
        .sum_all()
        .unwrap();
    loss.backward().unwrap();
    // Row r's gradient: the weights of every position that read row r, added.
    let mut grad = vec![0.0; 12];
    for (position, &i) in indices.iter().enumerate() {
        for j in 0..3 {
            grad[i as usize * 3 + j] += weights[position * 3 + j];
        }
    }
    let got = emb.table.grad().unwrap().to_f64_vec().unwrap();
    close("embedding gradient", &got, &grad, 1e-6);
}

#[test]
fn accuracy_counts_rows_whose_argmax_is_the_label() {
    let logits = tensor(
        &[4, 3],
        &[0.1, 0.9, 0.0, 0.5, 0.2, 0.3, 0.0, 0.0, 1.0, 0.3, 0.2, 0.1],
    );
    let labels = Tensor::new(Array::I64(ndarray::arr1(&[1i64, 2, 2, 0]).into_dyn()));
    let acc = nn::accuracy(&logits, &labels).unwrap().item().unwrap();
    // Rows 0, 2 and 3 are right; row 1's arg-max is 0, not 2.
    assert!((acc - 0.75).abs() < 1e-7, "{acc}");
}
