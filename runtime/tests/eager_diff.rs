//! `eager::diff`: eager against compiled, op by op, named by the caller's source line.

// Planted faults exist in debug builds only.
#[cfg(debug_assertions)]
use kiln_backend::exec::fault;
use kiln_runtime::eager::{self, Tensor, nn::Layer, nn::Linear};

fn input() -> Tensor {
    Tensor::from_f32(&[2, 3], vec![0.5, -1.0, 2.0, 0.25, 1.5, -0.75]).unwrap()
}

#[test]
fn a_layer_and_activations_agree_eager_and_compiled() {
    eager::reset();
    let layer = Linear::new("diff.fc", 3, 4).unwrap();
    let report = eager::diff(
        |t| Ok(vec![layer.forward(&t[0])?.tanh()?.exp()?.mean_all()?]),
        &[&input()],
    )
    .unwrap();
    assert!(report.agrees(), "{report}");
    assert!(report.compared >= 4, "{report}");
    assert!(report.to_string().starts_with("agree: "), "{report}");
}

#[test]
#[cfg(debug_assertions)]
fn a_planted_wrong_kernel_is_named_at_the_callers_line() {
    eager::reset();
    let line = line!() + 3;
    let f = |t: &[Tensor]| {
        let h = t[0].mul(&t[0])?;
        let y = h.tanh()?;
        Ok(vec![y.sub(&t[0])?])
    };
    fault::plant(Some("tanh"));
    let report = eager::diff(f, &[&input()]);
    fault::plant(None);
    let report = report.unwrap();
    let first = report.first.clone().expect("a difference");
    assert_eq!(first.op, "tanh", "{report}");
    assert_eq!(
        first.loc.to_string(),
        format!("{}:{line}:19", file!()),
        "{report}"
    );
    let (index, eager, compiled) = first.mismatch.worst.clone().unwrap();
    assert_eq!(index, [0, 0]);
    assert!((compiled - eager - 1.0).abs() < 1e-5, "{report}");
}

#[test]
fn the_first_op_to_make_a_nan_is_named_in_every_run() {
    eager::reset();
    let line = line!() + 3;
    let f = |t: &[Tensor]| {
        let s = t[0].abs()?;
        let l = t[0].log()?;
        Ok(vec![l.add(&s)?.exp()?])
    };
    let report = eager::diff(f, &[&input()]).unwrap();
    assert!(!report.agrees());
    let runs: Vec<&str> = report.non_finite.iter().map(|n| n.run).collect();
    assert_eq!(runs, ["eager", "compiled", "interpreted"], "{report}");
    for n in &report.non_finite {
        assert_eq!(n.op, "log", "{report}");
        assert_eq!(
            n.loc.to_string(),
            format!("{}:{line}:22", file!()),
            "{report}"
        );
        assert_eq!((n.nan, n.inf), (2, 0), "{report}");
    }
    // Both runs make the same NaNs: no value differs.
    assert!(report.first.is_none(), "{report}");
}
