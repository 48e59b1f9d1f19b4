//! The main job as a user meets it: `kiln tour` at a small size writes every file it promises,
//! and each one is what it says — IR that `kiln check` accepts, parameters that load into the
//! prediction program, a drawing Graphviz accepts (when it is installed), an SVG plot.

mod common;

use std::path::Path;
use std::process::Command;

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(common::root())
        .output()
        .expect("the kiln binary runs")
}

#[test]
fn the_tour_writes_what_it_promises() {
    let dir = std::env::temp_dir().join(format!("kiln-tour-test-{}", std::process::id()));
    let out = kiln(&[
        "tour",
        "--out",
        dir.to_str().unwrap(),
        "--epochs",
        "2",
        "--gan-iterations",
        "200",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "test accuracy",
        "eager",
        "compiled",
        "compile time",
        "generated mean",
    ] {
        assert!(stdout.contains(line), "no {line:?} in\n{stdout}");
    }

    let file = |name: &str| {
        let path = dir.join(name);
        assert!(
            stdout.contains(&path.display().to_string()),
            "{name} not listed"
        );
        assert!(path.is_file(), "{} missing", path.display());
        path
    };
    for ir in [
        "train_step.kir",
        "train_step.opt.kir",
        "predict.kir",
        "gan.kir",
    ] {
        let check = kiln(&["check", file(ir).to_str().unwrap()]);
        assert!(
            check.status.success(),
            "{ir}: {}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
    let optimised = std::fs::read_to_string(file("train_step.opt.kir")).unwrap();
    assert!(
        optimised.contains("fused"),
        "the optimised step has kernels"
    );

    // The parameters serve the prediction program, and it classifies most digits.
    let mut model =
        kiln::serve::Predictor::load(&file("predict.kir"), &file("digits.safetensors")).unwrap();
    let digits = kiln::runtime::data::digits().unwrap();
    let batch = digits.all();
    let logits = model.predict(vec![batch.x]).unwrap()[0].to_f64_vec();
    let correct = (logits.chunks(10).zip(&digits.labels))
        .filter(|(row, label)| {
            let best = (0..10).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            best as i64 == **label
        })
        .count();
    assert!(
        correct as f64 > 0.8 * digits.len() as f64,
        "{correct} of {} correct",
        digits.len()
    );

    let dot = file("train_step.dot");
    let text = std::fs::read_to_string(&dot).unwrap();
    assert!(text.starts_with("digraph") && text.contains("subgraph cluster"));
    graphviz_accepts(&dot);
    let svg = std::fs::read_to_string(file("loss.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("<polyline"),
        "an SVG line plot"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Renders with Graphviz's `dot` when it is installed (CI installs it).
fn graphviz_accepts(path: &Path) {
    match Command::new("dot").arg("-Tsvg").arg(path).output() {
        Ok(out) => assert!(
            out.status.success(),
            "dot rejected {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(_) => eprintln!("Graphviz is not installed: the DOT file was not rendered"),
    }
}
