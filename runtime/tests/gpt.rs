//! The GPT: shapes and causality, its loss at initialisation, the compiled step equal to the
//! eager one, training on a text it then generates; and the sampling rules.

use kiln_backend::Array;
use kiln_backend::random::SplitMix64;
use kiln_ir::{DType, Dim, Shape, Type};
use kiln_runtime::eager::nn::Layer;
use kiln_runtime::eager::{self, EagerOptimizer, Gpt, GptConfig, Tensor};
use kiln_runtime::{Adam, Sampling};

fn tiny() -> GptConfig {
    GptConfig {
        vocab: 11,
        context: 8,
        width: 16,
        heads: 2,
        layers: 2,
    }
}

fn tokens(rows: &[&[i64]]) -> Tensor {
    let flat: Vec<i64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    let shape = vec![rows.len(), rows[0].len()];
    Tensor::new(Array::I64(
        ndarray::Array::from_shape_vec(shape, flat)
            .unwrap()
            .into_dyn(),
    ))
}

#[test]
fn logits_are_per_token_and_never_see_later_tokens() {
    eager::reset();
    let gpt = Gpt::new("gpt", tiny()).unwrap();
    let a = gpt.forward(&tokens(&[&[1, 2, 3, 4, 5]])).unwrap();
    assert_eq!(a.ty().to_string(), "f32[1,5,11]");
    let b = gpt.forward(&tokens(&[&[1, 2, 3, 9, 0]])).unwrap();
    let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    assert_eq!(
        a[..3 * 11],
        b[..3 * 11],
        "the first three positions changed"
    );
    assert_ne!(a[3 * 11..], b[3 * 11..]);
    let too_long = tokens(&[&[0; 9]]);
    let message = gpt.forward(&too_long).unwrap_err().to_string();
    assert!(message.contains("1 ≤ T ≤ 8"), "{message}");
    let four = GptConfig { heads: 3, ..tiny() };
    assert!(Gpt::new("bad", four).is_err());
}

#[test]
fn the_loss_at_initialisation_is_near_uniform_and_the_head_is_tied() {
    eager::reset();
    let gpt = Gpt::new("gpt", tiny()).unwrap();
    let x = tokens(&[&[1, 2, 3, 4], &[5, 6, 7, 8]]);
    let y = tokens(&[&[2, 3, 4, 5], &[6, 7, 8, 9]]);
    let loss = gpt.loss(&x, &y).unwrap().item().unwrap();
    // Weights of std 0.02 give logits near 0: a loss near ln(vocab).
    assert!((loss - 11f64.ln()).abs() < 0.05, "{loss}");
    let names: Vec<String> = gpt
        .parameters()
        .iter()
        .map(|p| p.name().to_string())
        .collect();
    assert_eq!(names.iter().filter(|n| n.contains("tokens")).count(), 1);
    assert!(!names.iter().any(|n| n.contains("head")));
    // 2 embeddings, 2 blocks of 16 (two norms, four projections and two MLP layers, two
    // parameters each), the final norm's 2.
    assert_eq!(names.len(), 2 + 2 * 16 + 2, "{names:?}");
}

#[test]
fn the_compiled_step_equals_the_eager_step() {
    eager::reset();
    let gpt = Gpt::new("gpt", tiny()).unwrap();
    let x = tokens(&[&[1, 2, 3, 4, 5, 6], &[7, 8, 9, 10, 0, 1]]);
    let y = tokens(&[&[2, 3, 4, 5, 6, 7], &[8, 9, 10, 0, 1, 2]]);
    let eager_loss = gpt.loss(&x, &y).unwrap();
    eager_loss.backward().unwrap();
    let ty = |d| Type::new(d, Shape(vec![Dim::sym("N"), Dim::Fixed(6)]));
    let mut step = eager::to_static(&[("x", ty(DType::I64)), ("y", ty(DType::I64))], |t| {
        Ok(vec![gpt.loss(&t[0], &t[1])?])
    })
    .unwrap();
    let (loss, grads) = step.gradients(&[&x, &y], 0).unwrap();
    let (a, b) = (eager_loss.item().unwrap(), loss.item().unwrap());
    assert!((a - b).abs() < 1e-5 * a.abs(), "{a} vs {b}");
    for (name, g) in &grads.parameters {
        let p = gpt
            .parameters()
            .into_iter()
            .find(|p| p.name() == name)
            .unwrap();
        let want = p.grad().unwrap().to_f64_vec().unwrap();
        let got = g.to_f64_vec().unwrap();
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-4 * scale + 1e-7, "{name}: {g} vs {w}");
        }
    }
}

#[test]
fn a_gpt_learns_a_repeating_text_and_generates_it_greedily() {
    eager::reset();
    let gpt = Gpt::new("gpt", tiny()).unwrap();
    let text: Vec<i64> = (0..64).map(|i| [3, 1, 4, 1, 5, 9][i % 6]).collect();
    // Windows at every phase of the pattern: generation past the context slides the window.
    let rows: Vec<&[i64]> = (0..6).map(|r| &text[r..r + 8]).collect();
    let targets: Vec<&[i64]> = (0..6).map(|r| &text[r + 1..r + 9]).collect();
    let (x, y) = (tokens(&rows), tokens(&targets));
    let mut opt = EagerOptimizer::new(Adam::new(1e-2), gpt.parameters()).unwrap();
    let first = gpt.loss(&x, &y).unwrap().item().unwrap();
    let mut last = first;
    for _ in 0..60 {
        opt.zero_grad();
        let loss = gpt.loss(&x, &y).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        last = loss.item().unwrap();
    }
    assert!(last < 0.1 * first, "{first} → {last}");
    let out = gpt
        .generate(&[3, 1, 4], 9, &Sampling::greedy(), &[])
        .unwrap();
    assert_eq!(out, [3, 1, 4, 1, 5, 9, 3, 1, 4, 1, 5, 9]);
    // A stop token ends the text, and is kept.
    let out = gpt
        .generate(&[3, 1, 4], 9, &Sampling::greedy(), &[9])
        .unwrap();
    assert_eq!(out, [3, 1, 4, 1, 5, 9]);
    assert!(gpt.generate(&[], 3, &Sampling::greedy(), &[]).is_err());
}

#[test]
fn greedy_takes_the_first_most_likely_and_top_k_1_and_tiny_top_p_agree() {
    let logits = [0.5, 2.0, -1.0, 2.0, f64::NAN];
    let mut rng = SplitMix64::new(7);
    assert_eq!(Sampling::greedy().sample(&logits, &mut rng), 1);
    let warm = Sampling::temperature(1.0, 3).unwrap();
    for _ in 0..20 {
        let k1 = warm.with_top_k(1).unwrap().sample(&logits, &mut rng);
        let p = warm.with_top_p(1e-9).unwrap().sample(&logits, &mut rng);
        assert_eq!((k1, p), (1, 1));
    }
    assert!(Sampling::temperature(-1.0, 0).is_err());
    assert!(warm.with_top_k(0).is_err() && warm.with_top_p(1.5).is_err());
}

#[test]
fn draws_follow_the_softmax_within_the_kept_tokens() {
    let logits = [1.0f64, 0.0, 2.0, -3.0];
    let draw = |s: Sampling| {
        let mut rng = SplitMix64::new(s.seed);
        let mut counts = [0usize; 4];
        for _ in 0..40_000 {
            counts[s.sample(&logits, &mut rng)] += 1;
        }
        counts.map(|c| c as f64 / 40_000.0)
    };
    let softmax = |t: f64, keep: &[usize]| {
        let w: Vec<f64> = (0..4)
            .map(|i| {
                if keep.contains(&i) {
                    (logits[i] / t).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let total: f64 = w.iter().sum();
        w.into_iter().map(|v| v / total).collect::<Vec<_>>()
    };
    let near = |got: [f64; 4], want: Vec<f64>| {
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 0.01, "{got:?} vs {want:?}");
        }
    };
    near(
        draw(Sampling::temperature(1.0, 1).unwrap()),
        softmax(1.0, &[0, 1, 2, 3]),
    );
    near(
        draw(Sampling::temperature(2.0, 2).unwrap()),
        softmax(2.0, &[0, 1, 2, 3]),
    );
    let top2 = Sampling::temperature(1.0, 3)
        .unwrap()
        .with_top_k(2)
        .unwrap();
    near(draw(top2), softmax(1.0, &[0, 2]));
    // Probabilities at temperature 1: 0.259, 0.095, 0.705, 0.005 — top-p 0.9 keeps the
    // first two of them in order (0.705 + 0.259 ≥ 0.9).
    let nucleus = Sampling::temperature(1.0, 4)
        .unwrap()
        .with_top_p(0.9)
        .unwrap();
    near(draw(nucleus), softmax(1.0, &[0, 2]));
    // One seed, one sequence of draws.
    assert_eq!(draw(nucleus), draw(nucleus));
}

#[test]
fn a_pytorch_state_dict_loads_into_kiln_names_and_layouts() {
    use kiln_runtime::checkpoint::{self, StateDictLayout};
    let torch = StateDictLayout::PyTorch;
    assert_eq!(
        torch.name_of("gpt.block0.ff1.w"),
        ("gpt.block0.ff1.weight".into(), true)
    );
    assert_eq!(
        torch.name_of("gpt.norm.gamma"),
        ("gpt.norm.weight".into(), false)
    );
    assert_eq!(
        torch.name_of("gpt.norm.beta"),
        ("gpt.norm.bias".into(), false)
    );
    assert_eq!(
        torch.name_of("gpt.tokens.table"),
        ("gpt.tokens.weight".into(), false)
    );
    assert_eq!(StateDictLayout::Kiln.name_of("a.w"), ("a.w".into(), false));
    // As PyTorch saves a Linear(3, 2): weight [2, 3] (out, in), bias [2].
    let weight = ndarray::Array::from_shape_vec(vec![2, 3], vec![1f32, 2., 3., 4., 5., 6.]);
    let weight = Array::F32(weight.unwrap().into_dyn());
    let bias = Array::F32(ndarray::arr1(&[7f32, 8.]).into_dyn());
    let path = std::env::temp_dir().join(format!("kiln-torch-{}.safetensors", std::process::id()));
    let tensors = [("fc.weight", &weight), ("fc.bias", &bias)];
    checkpoint::save(tensors, &path).unwrap();
    let f32s = |shape: &[usize]| Type::new(DType::F32, Shape::fixed(shape));
    let declared = [
        ("fc.w".to_string(), f32s(&[3, 2])),
        ("fc.b".to_string(), f32s(&[2])),
    ];
    let loaded = checkpoint::load_state_dict(&path, &declared.clone().into(), torch).unwrap();
    assert_eq!(loaded["fc.w"].shape(), &[3, 2]);
    assert_eq!(loaded["fc.w"].to_f64_vec(), [1., 4., 2., 5., 3., 6.]);
    assert_eq!(loaded["fc.b"].to_f64_vec(), [7., 8.]);
    // A shape that does not fit is named as the file has it.
    let wrong = [("fc.w".to_string(), f32s(&[2, 3]))].into();
    let message = checkpoint::load_state_dict(&path, &wrong, torch)
        .unwrap_err()
        .to_string();
    assert!(message.contains("fc.weight"), "{message}");
    std::fs::remove_file(&path).unwrap();
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol * scale, "{x} vs {y}");
    }
}

#[test]
fn prefill_and_each_decode_step_give_the_logits_of_the_whole_prefix() {
    eager::reset();
    let gpt = Gpt::new("gpt", tiny()).unwrap();
    let _no_grad = eager::no_grad();
    let sequence: [i64; 8] = [4, 7, 1, 9, 2, 2, 10, 0];
    let cache = eager::KvCache::new(&gpt, 1).unwrap();
    let prefix = tokens(&[&sequence[..3]]);
    let no_pads = tokens(&[&[0]]).reshape(Shape::fixed(&[1])).unwrap();
    let prefilled = (gpt.prefill(&cache, &prefix, &no_pads))
        .unwrap()
        .to_f64_vec()
        .unwrap();
    close(
        &prefilled,
        &gpt.forward(&prefix).unwrap().to_f64_vec().unwrap(),
        1e-6,
    );
    for pos in 3..8 {
        let token = tokens(&[&sequence[pos..pos + 1]]);
        let at = Tensor::new(Array::I64(ndarray::arr0(pos as i64).into_dyn()));
        let step = gpt
            .decode(&cache, &token, &at, &no_pads)
            .unwrap()
            .to_f64_vec()
            .unwrap();
        let whole = gpt
            .forward(&tokens(&[&sequence[..=pos]]))
            .unwrap()
            .to_f64_vec()
            .unwrap();
        close(&step, &whole[pos * 11..], 1e-5);
    }
}

#[test]
fn cached_generation_equals_recomputing_the_prefix_token_for_token() {
    eager::reset();
    eager::manual_seed(3);
    let gpt = Gpt::new("gpt", tiny()).unwrap();
    // Greedy, and drawn at a temperature, past the context (8): the cache fills at 8 and each
    // later step prefills the last 8 tokens, as recomputing does.
    let drawn = Sampling::temperature(1.0, 5)
        .unwrap()
        .with_top_k(5)
        .unwrap();
    let mut generator = eager::Generator::new(&gpt, 1).unwrap();
    for sampling in [Sampling::greedy(), drawn] {
        let want = gpt.generate(&[3, 1, 4], 14, &sampling, &[]).unwrap();
        let got = generator
            .generate(&[vec![3, 1, 4]], 14, &sampling, &[])
            .unwrap();
        assert_eq!(got[0], want, "{sampling:?}");
    }
    // One decode program for every position; prefills of the prompt's length and the context's.
    assert_eq!(generator.compilations(), 3);
    // A batch of prompts gives each row what it gives alone, past the context too; a stop
    // token ends its row while the other goes on (each row still fed to the end).
    let mut pair = eager::Generator::new(&gpt, 2).unwrap();
    let prompts = [vec![3, 1, 4], vec![5, 9, 2]];
    let both = pair
        .generate(&prompts, 14, &Sampling::greedy(), &[])
        .unwrap();
    for (row, prompt) in both.iter().zip(&prompts) {
        let alone = gpt.generate(prompt, 14, &Sampling::greedy(), &[]).unwrap();
        assert_eq!(row, &alone);
    }
    let stop = both[0][4];
    let until_stop = |row: &Vec<i64>| match row.iter().skip(3).position(|&t| t == stop) {
        Some(at) => row[..at + 4].to_vec(),
        None => row.clone(),
    };
    let stopped = pair
        .generate(&prompts, 14, &Sampling::greedy(), &[stop])
        .unwrap();
    assert_eq!(stopped[0], until_stop(&both[0]));
    assert_eq!(stopped[1], until_stop(&both[1]));
    let message = pair
        .generate(&[vec![1], vec![]], 2, &Sampling::greedy(), &[])
        .unwrap_err();
    assert!(
        message.to_string().contains("at least 1 token"),
        "{message}"
    );
}

#[test]
fn a_padded_prefill_gives_each_row_the_logits_of_its_own_tokens() {
    eager::reset();
    let gpt = Gpt::new("gpt", tiny()).unwrap();
    let _no_grad = eager::no_grad();
    let cache = eager::KvCache::new(&gpt, 2).unwrap();
    // Row 0 is padded by 3 slots (its padding tokens are arbitrary), row 1 by none.
    let rows = tokens(&[&[9, 9, 9, 4, 7], &[5, 1, 3, 8, 2]]);
    let pads = tokens(&[&[3, 0]]).reshape(Shape::fixed(&[2])).unwrap();
    let padded = gpt
        .prefill(&cache, &rows, &pads)
        .unwrap()
        .to_f64_vec()
        .unwrap();
    let alone = |row: &[i64]| gpt.forward(&tokens(&[row])).unwrap().to_f64_vec().unwrap();
    close(&padded[3 * 11..5 * 11], &alone(&[4, 7]), 1e-5);
    close(&padded[5 * 11..], &alone(&[5, 1, 3, 8, 2]), 1e-5);
    // A decode step after it: row 0 at its position 2, row 1 at 5, both at slot 5.
    let next = tokens(&[&[6], &[10]]);
    let slot = Tensor::new(Array::I64(ndarray::arr0(5).into_dyn()));
    let step = (gpt.decode(&cache, &next, &slot, &pads))
        .unwrap()
        .to_f64_vec()
        .unwrap();
    close(&step[..11], &alone(&[4, 7, 6])[2 * 11..], 1e-5);
    close(&step[11..], &alone(&[5, 1, 3, 8, 2, 10])[5 * 11..], 1e-5);
}

#[test]
fn prompts_of_different_lengths_generate_together_what_each_gives_alone() {
    eager::reset();
    eager::manual_seed(3);
    let gpt = Gpt::new("gpt", tiny()).unwrap();
    // Lengths 1, 3 and 6 (context 8): 14 tokens take every row past the context, where the
    // batch prefills each row's last 8 tokens (or all it has) every step.
    let prompts = [vec![2], vec![3, 1, 4], vec![5, 9, 2, 6, 5, 3]];
    let mut three = eager::Generator::new(&gpt, 3).unwrap();
    let together = three
        .generate(&prompts, 14, &Sampling::greedy(), &[])
        .unwrap();
    for (row, prompt) in together.iter().zip(&prompts) {
        let alone = gpt.generate(prompt, 14, &Sampling::greedy(), &[]).unwrap();
        assert_eq!(row, &alone, "prompt {prompt:?}");
    }
    assert_eq!(three.compilations(), 3);
}
