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
        "--digits",
        "--out",
        dir.to_str().unwrap(),
        "--epochs",
        "3",
        "--gan-iterations",
        "200",
        "--report",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `--report`: a page for each program the tour wrote.
    for page in ["report.html", "report-predict.html", "report-gan.html"] {
        let html =
            std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            html.contains("id=\"pass-10\"") && html.ends_with("</html>\n"),
            "{page}"
        );
    }
    for line in [
        "data: the built-in 8×8 digits",
        "test accuracy",
        "eager: 10 steps",
        "compiled",
        "compile time",
        "generated mean",
        "epoch 3: training loss",
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
        kiln::serve::Predictor::load(&file("predict.kir"), &file("parameters.safetensors"))
            .unwrap();
    let digits = (kiln::runtime::data::digits().unwrap())
        .with_sample_shape(&[1, 8, 8])
        .unwrap();
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
    for plot in ["loss.svg", "curves.svg"] {
        let svg = std::fs::read_to_string(file(plot)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<polyline"),
            "{plot}: an SVG line plot"
        );
    }
    let confusion = std::fs::read_to_string(file("confusion.svg")).unwrap();
    assert!(confusion.starts_with("<svg") && confusion.contains("<rect"));
    file("checkpoint.safetensors");
    file("test_labels.npy");

    // Every command under "next" works as printed (those that only Graphviz or a pager need
    // are run up to the pipe).
    let next = stdout.split("\nnext\n").nth(1).expect("a `next` section");
    for line in next.lines().filter(|l| !l.trim().is_empty()) {
        let command = line.split('#').next().unwrap().split('|').next().unwrap();
        let command = command.split('>').next().unwrap().trim();
        let words: Vec<&str> = command.split_whitespace().collect();
        let (program, args) = words.split_first().unwrap();
        let status = match *program {
            "kiln" => kiln(args).status,
            "dot" if Command::new("dot").arg("-V").output().is_ok() => {
                Command::new("dot").args(args).output().unwrap().status
            }
            _ => continue,
        };
        assert!(status.success(), "`{command}` failed");
    }
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

#[test]
fn a_bad_data_folder_is_an_error_naming_it() {
    let dir = std::env::temp_dir().join(format!("kiln-tour-no-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = kiln(&[
        "tour",
        "--data",
        dir.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("{}: no train-images-idx3-ubyte", dir.display())),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
