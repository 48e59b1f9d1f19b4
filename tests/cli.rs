//! The `kiln` command-line tool, run as a user runs it.

mod common;

use common::kiln;

use std::process::Output;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Each command fails (exit 1) with its expected words on stderr.
fn refused(cases: &[(&[&str], &str)]) {
    for &(args, expected) in cases {
        let out = kiln(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn check_accepts_the_corpus_and_rejects_bad_programs() {
    let ok = kiln(&[
        "check",
        "tests/programs/mlp.kir",
        "tests/programs/control_flow.kir",
    ]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert_eq!(
        stdout(&ok),
        "ok: tests/programs/mlp.kir (1 function, 4 state)\nok: tests/programs/control_flow.kir (2 functions, 0 state)\n"
    );
    let bad = kiln(&["check", "tests/diagnostics/matmul_contraction_mismatch.kir"]);
    assert_eq!(bad.status.code(), Some(1));
    let err = stderr(&bad);
    assert!(
        err.contains("line 3, column 10: in @f: matmul: contraction dimensions differ"),
        "{err}"
    );
    assert!(
        err.contains("   3 |     %y = matmul %x, %w : f32[N,10]\n     |          ^"),
        "{err}"
    );
}

#[test]
fn dump_prints_the_canonical_form() {
    let out = kiln(&["dump", "tests/programs/sgd_step.kir"]);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(
        text.starts_with("module {\n  state @w : f32[3,1] = constant(value=0.0)\n"),
        "{text}"
    );
    assert!(kiln::ir::parse_and_verify(&text).is_ok());
}

#[test]
fn run_feeds_literals_and_npy_files_and_writes_results() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x = dir.join("x.npy");
    let input = kiln::backend::Array::F64(ndarray::arr1(&[4.0, 9.0]).into_dyn());
    kiln::npy::write_npy(&x, &input).unwrap();
    let out_dir = dir.join("out");
    let out = kiln(&[
        "run",
        "tests/programs/control_flow.kir",
        "--func",
        "newton_sqrt",
        "--feed",
        &format!("a={}", x.display()),
        "--feed",
        "iters=25",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("result 0 (%root): f64[2]\n[2, 3]\n"),
        "{text}"
    );
    let written = kiln::npy::read_npy(&out_dir.join("root.npy"), kiln::ir::DType::F64).unwrap();
    assert_eq!(written.to_f64_vec(), [2.0, 3.0]);

    let step = kiln(&[
        "run",
        "tests/programs/sgd_step.kir",
        "--feed",
        "x=[[1,0,0],[0,1,0]]",
        "--feed",
        "y=[[1],[2]]",
        "--feed",
        "lr=0.5",
    ]);
    assert!(step.status.success(), "{}", stderr(&step));
    let text = stdout(&step);
    assert!(text.contains("result 0 (%loss): f32[]\n2.5\n"), "{text}");
    assert!(text.contains("state @w updated: f32[3,1]"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The numbers a `kiln run` printed, in order.
fn printed_numbers(text: &str) -> Vec<f64> {
    (text.lines())
        .filter(|l| !l.starts_with("result") && !l.starts_with("state"))
        .flat_map(|l| l.split(|c: char| "[], ".contains(c)))
        .filter_map(|w| w.parse().ok())
        .collect()
}

#[test]
fn run_compiles_by_default_and_interprets_on_request() {
    let args = [
        "run",
        "tests/programs/mlp.kir",
        "--feed",
        "x=[[1,2,3,4],[0.5,-1,0,2]]",
    ];
    let compiled = kiln(&args);
    assert!(compiled.status.success(), "{}", stderr(&compiled));
    let interpreted = kiln(&[&args[..], &["--interpret"]].concat());
    assert!(interpreted.status.success(), "{}", stderr(&interpreted));
    let (c, i) = (
        printed_numbers(&stdout(&compiled)),
        printed_numbers(&stdout(&interpreted)),
    );
    assert_eq!(c.len(), 6, "{}", stdout(&compiled));
    assert_eq!(c.len(), i.len());
    for (a, b) in c.iter().zip(&i) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{c:?} vs {i:?}");
    }
}

#[test]
fn run_explains_what_is_missing_or_wrong() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["run", "tests/programs/control_flow.kir"],
            "several functions (@newton_sqrt, @clip_by_norm); choose one with --func",
        ),
        (
            &["run", "tests/programs/mlp.kir", "--func", "predcit"],
            "no function @predcit; the program has: @predict",
        ),
        (
            &["run", "tests/programs/mlp.kir"],
            "no feed for argument %x: f32[N,4] of @predict",
        ),
        (
            &["run", "tests/programs/mlp.kir", "--feed", "x=[[1,2]]"],
            "argument %x of @predict: expected f32[N,4], found f32[1,2]",
        ),
        (
            &[
                "run",
                "tests/programs/mlp.kir",
                "--feed",
                "x=[[1,2,3,4]]",
                "--feed",
                "z=1",
            ],
            "@predict has no argument %z",
        ),
    ];
    refused(&cases);
}

#[test]
fn dot_draws_regions_as_clusters() {
    let out = kiln(&[
        "dot",
        "tests/programs/control_flow.kir",
        "--func",
        "clip_by_norm",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dot = stdout(&out);
    assert!(dot.starts_with("digraph \"@clip_by_norm\" {"), "{dot}");
    assert!(dot.contains("label=\"cond then\""), "{dot}");
    assert!(dot.contains("label=\"cond else\""), "{dot}");
    assert!(
        dot.contains("[shape=box, label=\"sqrt\\n%norm: f32[]\"]"),
        "{dot}"
    );
    assert_eq!(dot.matches('{').count(), dot.matches('}').count());
}

#[test]
fn grad_prints_a_runnable_gradient_function() {
    let out = kiln(&["grad", "tests/programs/sgd_step.kir", "--wrt", "x,@w"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("func @train_step_grad(%x: f32[N,3], %y: f32[N,1], %lr: f32[]) -> (f32[], f32[N,3], f32[3,1])"), "{text}");
    assert!(text.contains("return %loss, %grad_x, %grad_w"), "{text}");
    let module = kiln::ir::parse_and_verify(&text).unwrap();
    assert_eq!(module.functions.len(), 1);

    let not_scalar = kiln(&["grad", "tests/programs/mlp.kir", "--wrt", "x"]);
    assert_eq!(not_scalar.status.code(), Some(1));
    assert!(stderr(&not_scalar).contains("the loss must be a float scalar, found f32[N,3]"));
    let unknown = kiln(&["grad", "tests/programs/sgd_step.kir", "--wrt", "z"]);
    assert!(
        stderr(&unknown)
            .contains("@train_step has no such argument; its arguments are %x, %y, %lr"),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn opt_prints_the_ir_after_each_pass_and_statistics() {
    let out = kiln(&[
        "opt",
        "tests/programs/layer_norm.kir",
        "--passes",
        "cse,simplify,fuse",
        "--print-after-all",
        "--stats",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let headers: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("// -----// IR Dump After"))
        .collect();
    assert_eq!(
        headers,
        [
            "// -----// IR Dump After cse //----- //",
            "// -----// IR Dump After simplify //----- //",
            "// -----// IR Dump After fuse //----- //"
        ]
    );
    let last = text
        .rsplit("// -----// IR Dump After fuse //----- //\n")
        .next()
        .unwrap();
    let module = kiln::ir::parse_and_verify(last).unwrap();
    assert_eq!(
        module.functions[0].num_insts(),
        17,
        "one fused kernel with its body, plus two loads"
    );
    let stats = stderr(&out);
    assert!(
        stats.contains("simplify") && stats.contains("stopped by: saturated"),
        "{stats}"
    );
    assert!(
        stats.contains("fuse") && stats.contains("kernels: 1"),
        "{stats}"
    );
    let bad = kiln(&["opt", "tests/programs/mlp.kir", "--passes", "cse,inline"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains(
        "unknown pass `inline`; the passes are: place_constants, canonicalize, fold, cse, simplify, channels_last, loops, fold_updates, dce, fuse, order_epilogues"
    ));
    // `--help` lists every pass the manager knows.
    let help = stdout(&kiln(&["opt", "--help"]));
    for (pass, _) in kiln::passes::manager::PASSES {
        assert!(
            help.contains(pass),
            "`kiln opt --help` does not list `{pass}`:\n{help}"
        );
    }
    // The default pipeline shows its layout choice: the IR after the pass, and why.
    let out = kiln(&[
        "opt",
        "tests/programs/conv_step.kir",
        "--explain",
        "--print-after-all",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let after = text
        .split("// -----// IR Dump After channels_last //----- //\n")
        .nth(1)
        .unwrap();
    assert!(
        after.contains("channels_last=true} : f32[N,8,8,4]"),
        "{after}"
    );
    assert!(
        text.contains("@train_step: 2 convolution(s), 2 pooling(s)")
            && text
                .contains("(saving 512 element moves in the convolutions, paying 64 at the edges)"),
        "{text}"
    );
}

#[test]
fn stats_counts_ops_parameters_kernels_and_traffic() {
    let out = kiln(&["stats", "tests/programs/layer_norm.kir", "--bind", "N=8"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for part in [
        "state:",
        "as written",
        "optimised",
        "fused kernels",
        "memory traffic",
    ] {
        assert!(text.contains(part), "no {part:?} in\n{text}");
    }
    let kernels = text
        .lines()
        .find(|l| l.trim_start().starts_with("fused kernels"))
        .unwrap();
    let counts: Vec<usize> = kernels
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(counts[0], 0, "{kernels}");
    assert!(counts[1] >= 1, "the pipeline fuses: {kernels}");
    let bad = kiln(&["stats", "tests/programs/mlp.kir", "--bind", "N"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).contains("is not NAME=SIZE"),
        "{}",
        stderr(&bad)
    );
}

/// Every command on every malformed program exits with an error message (code 1), never a
/// panic (101) or an abort (134).
#[test]
fn no_command_panics_or_aborts_on_malformed_programs() {
    let dir = common::root().join("tests/diagnostics");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kir"))
        .collect();
    files.sort();
    assert!(files.len() >= 45, "only {} malformed programs", files.len());
    for file in &files {
        let file = file.to_str().unwrap();
        for command in [
            vec!["check", file],
            vec!["dump", file],
            vec!["run", file],
            vec!["run", file, "--interpret"],
            vec!["opt", file],
            vec!["stats", file],
            vec!["dot", file],
            vec!["grad", file, "--wrt", "x"],
        ] {
            let out = kiln(&command);
            assert_eq!(
                out.status.code(),
                Some(1),
                "`kiln {}` should fail with a message:\n{}",
                command.join(" "),
                stderr(&out)
            );
            assert!(stderr(&out).contains("error"), "{}", stderr(&out));
        }
    }
}

/// Programs that verify but ask for more than a run may have: refused before they start, or
/// stopped with an error naming the loop.
#[test]
fn runs_past_the_limits_are_refused_with_a_message() {
    for (file, extra, expected) in [
        (
            "tests/runtime_limits/state_past_memory.kir",
            &[][..],
            "state @w: f32[1000000,1000000], 4000000000000 bytes, more than the memory limit",
        ),
        (
            "tests/runtime_limits/constant_past_memory.kir",
            &[][..],
            "%c in @f: f32[1000000,1000000], 4000000000000 bytes",
        ),
        (
            "tests/runtime_limits/endless_while.kir",
            &["--feed", "x=1.0", "--max-trips", "100"][..],
            "`while` at line 3, column 10 failed: the loop did not end within 100 trips",
        ),
    ] {
        for backend in [&[][..], &["--interpret"][..]] {
            let mut args = vec!["run", file];
            args.extend_from_slice(extra);
            args.extend_from_slice(backend);
            let out = kiln(&args);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
            assert!(
                stderr(&out).contains(expected),
                "{args:?}: {}",
                stderr(&out)
            );
        }
    }
    let small = kiln(&[
        "run",
        "tests/programs/control_flow.kir",
        "--func",
        "newton_sqrt",
        "--feed",
        "a=[1,2,3,4]",
        "--feed",
        "iters=3",
        "--memory-limit",
        "8",
    ]);
    assert_eq!(small.status.code(), Some(1), "{}", stderr(&small));
    assert!(
        stderr(&small).contains("more than the memory limit of 8 bytes"),
        "{}",
        stderr(&small)
    );
}

#[test]
fn diff_finds_every_program_of_the_corpus_in_agreement() {
    let programs: Vec<String> = std::fs::read_dir("tests/programs")
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".kir"))
        .collect();
    assert!(programs.len() >= 8);
    for program in &programs {
        let out = kiln(&["diff", program, "--bind", "N=5"]);
        assert!(
            out.status.success(),
            "{program}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        let text = stdout(&out);
        assert!(
            text.lines().all(|l| l.starts_with("agree: @")),
            "{program}: {text}"
        );
        let explained = kiln(&["opt", program, "--explain"]);
        assert!(
            explained.status.success(),
            "{program}: {}",
            stderr(&explained)
        );
    }
    // An imported model: the tools take the .onnx file as they take IR.
    let onnx = kiln(&["diff", "tests/onnx/mlp.onnx", "--bind", "batch=3"]);
    assert!(onnx.status.success(), "{}", stderr(&onnx));
    assert!(stdout(&onnx).starts_with("agree: @"), "{}", stdout(&onnx));
    let explained = kiln(&["opt", "tests/onnx/mlp.onnx", "--explain"]);
    assert!(stdout(&explained).contains("// fuse explained:"));
    let fed = kiln(&[
        "diff",
        "tests/programs/mlp.kir",
        "--feed",
        "x=[[1,2,3,4]]",
        "--json",
    ]);
    assert!(fed.status.success(), "{}", stderr(&fed));
    let report: serde_json::Value = serde_json::from_str(&stdout(&fed)).unwrap();
    assert_eq!(report["agree"], true);
    assert_eq!(report["function"], "predict");
    let default = kiln::passes::PassManager::pipeline("default")
        .unwrap()
        .pass_names();
    let ran: Vec<&str> = (report["passes"].as_array().unwrap().iter())
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(ran, default);
}

#[test]
fn diff_refuses_bad_input_clearly() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["diff", "tests/programs/missing.kir"],
            "error: cannot read tests/programs/missing.kir",
        ),
        (
            &["diff", "tests/programs/mlp.kir", "--tol=-1"],
            "error: --tol must be a number >= 0",
        ),
        (
            &["diff", "tests/programs/mlp.kir", "--func", "nope"],
            "error: no function @nope; the program has: @predict",
        ),
        (
            &["diff", "tests/programs/mlp.kir", "--feed", "x=[[1,2,3]]"],
            "error: the interpreted run failed",
        ),
        (
            &["diff", "tests/programs/mlp.kir", "--bind", "N=100000000000"],
            "error: argument %x of @predict: a random f32[100000000000,4] takes 1600000000000 bytes, more than the memory limit",
        ),
    ];
    refused(&cases);
}

#[test]
fn opt_explain_names_the_rules_their_costs_and_fusion_decisions() {
    let out = kiln(&["opt", "tests/programs/attention.kir", "--explain"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "// simplify explained:",
        "//   %out (line 19, column 12): cost 1550162329.6 → 1483577753.6 (bytes moved, estimated); rules: div-broadcast",
        "//       as written: %out = matmul %p, %e : f32[B,T,4]",
        "//       1. div-broadcast ⇒ (mul %ez (broadcast (recip %den)))",
        "// fuse explained:",
        "//   %ez (exp) fused into the kernel of %den (reduce_sum)",
        "//   %p (mul) ends a kernel: nothing that reads it is fused (read by %out (matmul))",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // The program printed after the explanations is the one `kiln opt` prints without them.
    let plain = stdout(&kiln(&["opt", "tests/programs/attention.kir"]));
    assert!(!plain.contains("explained"));
    let program: String = (text
        .lines()
        .filter(|l| !l.starts_with("//") && !l.is_empty()))
    .map(|l| format!("{l}\n"))
    .collect();
    let plain_program: String = (plain.lines().filter(|l| !l.is_empty()))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(program, plain_program);
}

#[test]
fn report_writes_one_page_for_every_program_of_the_corpus() {
    let dir = std::env::temp_dir().join(format!("kiln-report-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir("tests/programs").unwrap() {
        let program = entry.unwrap().path();
        let page = dir
            .join(program.file_stem().unwrap())
            .with_extension("html");
        let args = [
            "report",
            program.to_str().unwrap(),
            "-o",
            page.to_str().unwrap(),
            "--runs",
            "1",
        ];
        let out = kiln(&args);
        assert!(out.status.success(), "{program:?}: {}", stderr(&out));
        let html = std::fs::read_to_string(&page).unwrap();
        for part in [
            "<!DOCTYPE html>",
            "id=\"input\"",
            "id=\"pass-1\"",
            "id=\"pass-10\"",
            "After fuse",
            "<h3>Fused kernels",
            "<h3>Memory plan</h3>",
            "id=\"graphs\"",
            "id=\"self-check\"",
            "</html>",
        ] {
            assert!(html.contains(part), "{program:?}: no {part:?}");
        }
        // Every in-page link has its target (the browser check in CI runs the same test).
        for link in html.split("href=\"#").skip(1) {
            let id = &link[..link.find('"').unwrap()];
            assert!(
                html.contains(&format!("id=\"{id}\"")),
                "{program:?}: link #{id} has no target"
            );
        }
    }
    let page = dir.join("onnx.html");
    let onnx = kiln(&[
        "report",
        "tests/onnx/mlp.onnx",
        "-o",
        page.to_str().unwrap(),
    ]);
    assert!(onnx.status.success(), "{}", stderr(&onnx));
    assert!(
        std::fs::read_to_string(&page)
            .unwrap()
            .contains("<h3>Profile</h3>")
    );
    // The memory plan says what a step keeps for a later one, and what it runs as its
    // epilogue.
    let conv_step = std::fs::read_to_string(dir.join("conv_step.html")).unwrap();
    for kept in [
        "records its argmax (#0) for its gradient",
        "reads the argmax #0 max pooling recorded",
        "runs the next kernel on each run of samples it writes (its epilogue)",
    ] {
        assert!(conv_step.contains(kept), "no {kept:?}");
    }
    let layer_norm = std::fs::read_to_string(dir.join("layer_norm.html")).unwrap();
    assert!(
        layer_norm.contains("<mark>    %y = fused %x, %gamma, %beta : f32[N,8] body("),
        "the fused kernel is marked new"
    );
    assert!(
        layer_norm.contains("%mu (reduce_mean) fused into the kernel of %d (sub)"),
        "fusion explained"
    );
    assert!(layer_norm.contains("<h3>Profile</h3>"), "profiled");
    std::fs::remove_dir_all(&dir).unwrap();
    let missing = kiln(&["report", "tests/programs/missing.kir"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("error: cannot read tests/programs/missing.kir"));
    let unwritable = kiln(&[
        "report",
        "tests/programs/mlp.kir",
        "-o",
        "/nonexistent-dir/r.html",
    ]);
    assert_eq!(unwritable.status.code(), Some(1));
    assert!(
        stderr(&unwritable).contains("error: cannot write /nonexistent-dir/r.html"),
        "{}",
        stderr(&unwritable)
    );
}
