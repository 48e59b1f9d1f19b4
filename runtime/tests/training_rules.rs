//! What language-model recipes add to an update rule — a warm-up and cosine schedule computed
//! in the program, clipping by the global gradient norm, weight decay on matrices only —
//! each against the same arithmetic done here in f64.

use kiln_runtime::eager::nn::Parameter;
use kiln_runtime::eager::{self, EagerOptimizer, Tensor};
use kiln_runtime::{Adam, ClipGradNorm, Init, Schedule, Sgd};

fn param(name: &str, shape: &[usize], value: f64) -> Parameter {
    Parameter::new(name, kiln_ir::DType::F32, shape, Init::Constant(value)).unwrap()
}

/// `sum(w * c)`: its gradient with respect to `w` is `c`.
fn linear_loss(w: &Parameter, c: &[f32]) -> Tensor {
    let c = Tensor::from_f32(&[c.len()], c.to_vec()).unwrap();
    let product = &w.tensor().unwrap() * &c;
    product.sum_all().unwrap()
}

#[test]
fn the_schedule_warms_up_then_follows_half_a_cosine_to_its_floor() {
    let s = Schedule::warmup_cosine(1e-3, 1e-4, 10, 110).unwrap();
    assert_eq!(s.at(0), 1e-3 / 11.0);
    assert_eq!(s.at(9), 1e-3 * 10.0 / 11.0);
    assert_eq!(s.at(10), 1e-3);
    assert!((s.at(60) - 5.5e-4).abs() < 1e-15, "{}", s.at(60));
    assert!((s.at(110) - 1e-4).abs() < 1e-18);
    assert_eq!(s.at(5000), s.at(110));
    assert!(Schedule::warmup_cosine(1e-3, 0.0, 10, 10).is_err());
    assert!(Schedule::warmup_cosine(f64::NAN, 0.0, 0, 10).is_err());
}

#[test]
fn a_scheduled_rate_in_the_program_equals_the_schedule_step_by_step() {
    eager::reset();
    let w = param("w", &[1], 0.0);
    let schedule = Schedule::warmup_cosine(0.5, 0.05, 3, 9).unwrap();
    let mut opt = EagerOptimizer::new(Sgd::new(schedule), vec![w.clone()]).unwrap();
    let mut before = 0.0;
    for step in 0..14 {
        opt.zero_grad();
        linear_loss(&w, &[1.0]).backward().unwrap();
        opt.step().unwrap();
        // With gradient 1, each step moves w by exactly the step's rate (rounded to f32).
        let now = w.tensor().unwrap().to_f64_vec().unwrap()[0];
        let want = schedule.at(step) as f32 as f64;
        let moved = before - now;
        assert!(
            (moved - want).abs() <= 2e-7 * (1.0 + before.abs()),
            "step {step}: {moved} vs {want}"
        );
        before = now;
    }
    // The counter is state: a checkpoint resumes the schedule where it was.
    let counter = eager::scope().unwrap().values()["sgd.step"].to_f64_vec()[0];
    assert_eq!(counter, 14.0);
}

#[test]
fn clipping_scales_every_gradient_by_the_global_norm_and_leaves_small_ones() {
    eager::reset();
    let (a, b) = (param("a", &[2], 1.0), param("b", &[1], 1.0));
    let clipped = ClipGradNorm::new(Sgd::new(1.0), 1.0).unwrap();
    let mut opt = EagerOptimizer::new(clipped, vec![a.clone(), b.clone()]).unwrap();
    // Gradients (3, 4) and (12): global norm 13, so each is scaled by 1 / (13 + 1e-6).
    let loss = &linear_loss(&a, &[3.0, 4.0]) + &linear_loss(&b, &[12.0]);
    loss.backward().unwrap();
    opt.step().unwrap();
    let factor = 1.0 / (13.0 + 1e-6);
    let got_a = a.tensor().unwrap().to_f64_vec().unwrap();
    let got_b = b.tensor().unwrap().to_f64_vec().unwrap();
    for (got, g) in got_a.iter().chain(&got_b).zip([3.0, 4.0, 12.0]) {
        let want = 1.0 - g * factor;
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
    // A norm below the limit passes unchanged.
    opt.zero_grad();
    let loss = &linear_loss(&a, &[0.3, 0.4]) + &linear_loss(&b, &[0.0]);
    loss.backward().unwrap();
    let before = a.tensor().unwrap().to_f64_vec().unwrap();
    opt.step().unwrap();
    let after = a.tensor().unwrap().to_f64_vec().unwrap();
    assert!((before[0] - after[0] - 0.3).abs() < 1e-6 && (before[1] - after[1] - 0.4).abs() < 1e-6);
    assert!(ClipGradNorm::new(Sgd::new(1.0), 0.0).is_err());
}

#[test]
fn decay_on_matrices_only_leaves_vectors_undecayed() {
    eager::reset();
    let (matrix, vector) = (param("m", &[2, 2], 1.0), param("v", &[2], 1.0));
    let rule = Adam::new(0.1)
        .with_decoupled_weight_decay(0.5)
        .decaying_matrices_only();
    let mut opt = EagerOptimizer::new(rule, vec![matrix.clone(), vector.clone()]).unwrap();
    // No gradient: Adam's step is zero, so only the decay moves a parameter.
    opt.step().unwrap();
    let decayed = 1.0 - 0.1 * 0.5;
    for got in matrix.tensor().unwrap().to_f64_vec().unwrap() {
        assert!((got - decayed).abs() < 1e-7, "{got}");
    }
    assert_eq!(vector.tensor().unwrap().to_f64_vec().unwrap(), [1.0, 1.0]);
}
