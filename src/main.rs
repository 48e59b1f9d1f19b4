//! `kiln`: check, print, run and draw Kiln IR programs.

use clap::{Parser, Subcommand};
use kiln::backend::Interpreter;
use kiln::ir::print::ValueNames;
use kiln::ir::{Function, Module, parse_and_verify};
use kiln::runtime::Scope;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Kiln: check, optimise, inspect, draw and run Kiln IR programs (.kir) and ONNX models",
    after_help = "Examples:\n  \
        kiln                                     the tour: train, compile, write IR, drawings, a plot\n  \
        kiln check tests/programs/mlp.kir        parse and verify\n  \
        kiln run tests/programs/mlp.kir --feed 'x=[[1,2,3,4]]'\n  \
        kiln import model.onnx -o imported/      an ONNX model as Kiln IR and parameters\n  \
        kiln opt tests/programs/layer_norm.kir --print-after-all\n  \
        kiln diff tests/programs/layer_norm.kir    the first value where compiled and interpreted part\n  \
        kiln stats tests/programs/mlp.kir --bind N=256\n  \
        kiln dot tests/programs/mlp.kir | dot -Tsvg > mlp.svg\n\n\
        Each command's --help shows more."
)]
struct Cli {
    /// Without a command, `kiln` runs the tour (see `kiln tour --help`).
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The tour: a CNN on Fashion-MNIST (Debian's dataset-fashion-mnist; else the built-in
    /// digits), trained eagerly for its first steps, then with its training step compiled by
    /// to_static; a GAN on 1-D data; writes the IR of each stage, the parameters, the trainer's
    /// checkpoint, a drawing, the curves and a confusion matrix. What `kiln` with no command
    /// runs.
    #[command(after_help = "Examples:\n  \
        kiln tour\n  \
        kiln tour --data ~/mnist --epochs 2\n  \
        kiln tour --digits --out /tmp/kiln-tour --epochs 2 --gan-iterations 300\n  \
        kiln tour --report                       and kiln report's page of each program it wrote")]
    Tour {
        /// The folder everything is written to.
        #[arg(long, value_name = "DIR", default_value = "kiln-out")]
        out: PathBuf,
        /// An MNIST-format folder to train on (train-images-idx3-ubyte[.gz], ...); by default
        /// /usr/share/datasets/fashion-mnist when it exists, else the built-in digits.
        #[arg(long, value_name = "DIR", conflicts_with = "digits")]
        data: Option<PathBuf>,
        /// Train on the built-in 8x8 digits.
        #[arg(long)]
        digits: bool,
        /// Epochs in all (default: 3 on MNIST-format images, 10 on the digits).
        #[arg(long)]
        epochs: Option<usize>,
        /// Steps trained eagerly before the training step is compiled.
        #[arg(long, default_value_t = 10)]
        eager_steps: usize,
        /// Iterations of the GAN (a discriminator and a generator step each).
        #[arg(long, default_value_t = 3000)]
        gan_iterations: usize,
        /// Also write `kiln report`'s page of each program the tour wrote: OUT/report.html
        /// (the training step), OUT/report-predict.html, OUT/report-gan.html.
        #[arg(long)]
        report: bool,
    },
    /// Parse and verify programs; print every error with its line.
    #[command(after_help = "Example:\n  kiln check tests/programs/mlp.kir")]
    Check {
        /// One or more .kir files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Import an ONNX model: writes DIR/model.kir (the graph as Kiln IR) and
    /// DIR/model.safetensors (its initializers); lists every unsupported node at once.
    #[command(after_help = "Examples:\n  \
        kiln import model.onnx -o imported/\n  \
        kiln run imported/model.kir --state imported/model.safetensors --feed x=input.npy\n  \
        kiln run model.onnx --feed x=input.npy           (imports on the fly)")]
    Import {
        /// The .onnx file (external data is read beside it).
        file: PathBuf,
        /// The folder written.
        #[arg(short, long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Export a function as an ONNX model: the states it reads become initializers (from
    /// --state, else their declared initial values), symbolic sizes named dynamic axes.
    #[command(after_help = "Examples:\n  \
        kiln export kiln-out/predict.kir --state kiln-out/parameters.safetensors -o cnn.onnx\n  \
        kiln export tests/programs/mlp.kir --func predict --opset 17 -o mlp.onnx\n  \
        kiln run cnn.onnx --feed x=images.npy              (the model read back)")]
    Export {
        file: PathBuf,
        /// The function to export; may be left out when the program has only one.
        #[arg(long)]
        func: Option<String>,
        /// The state values, from a safetensors checkpoint (else the declared initializers).
        #[arg(long, value_name = "FILE")]
        state: Option<PathBuf>,
        /// The ONNX file written (initializers past 2 GiB go beside it, in FILE.data).
        #[arg(short, long, value_name = "FILE")]
        out: PathBuf,
        /// The ONNX opset written (17 to the newest Kiln imports).
        #[arg(long, default_value_t = kiln::onnx::export::DEFAULT_EXPORT_OPSET)]
        opset: i64,
    },
    /// Print a program in canonical form.
    #[command(after_help = "Example:\n  kiln dump tests/programs/mlp.kir")]
    Dump { file: PathBuf },
    /// Run a function — compiled (pass pipeline, JIT kernels, gemm) unless --interpret — and
    /// print its results.
    #[command(after_help = "Examples:\n  \
        kiln run tests/programs/mlp.kir --func predict --feed 'x=[[1,2,3,4]]'\n  \
        kiln run tests/programs/mlp.kir --feed x=inputs.npy --out results/\n  \
        kiln run tests/programs/mlp.kir --feed 'x=[[1,2,3,4]]' --interpret")]
    Run {
        file: PathBuf,
        /// The function to run; may be left out when the program has only one.
        #[arg(long)]
        func: Option<String>,
        /// An argument: NAME=FILE.npy, or NAME=LITERAL such as 'x=[[1,2],[3,4]]'.
        #[arg(long = "feed", value_name = "NAME=VALUE")]
        feeds: Vec<String>,
        /// Write each result as DIR/<name>.npy.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Start from the state values in a safetensors checkpoint (instead of the
        /// declared initializers).
        #[arg(long, value_name = "FILE")]
        state: Option<PathBuf>,
        /// After the run, save every state value to a safetensors checkpoint.
        #[arg(long, value_name = "FILE")]
        save_state: Option<PathBuf>,
        /// Run the program as written with the reference interpreter (the oracle) instead of
        /// compiling it.
        #[arg(long)]
        interpret: bool,
        /// Fail when a `while` loop makes more trips than this (a loop that never ends then
        /// stops with an error naming it).
        #[arg(long, value_name = "N")]
        max_trips: Option<u64>,
        /// Refuse the run before it starts if one value or the state needs more than this
        /// many bytes (suffixes K, M, G, T; default: the machine's memory).
        #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
        memory_limit: Option<u64>,
    },
    /// Run a function through the interpreter (the program as written) and compiled (after the
    /// pass pipeline), compare every value its top level computes, and print the first that
    /// differs — its line, both values, the errors, the fused kernel that computed it — and the
    /// pass after which the difference first appears. Exits 0 when the runs agree, 1 when not.
    #[command(after_help = "Examples:\n  \
        kiln diff tests/programs/mlp.kir --feed 'x=[[1,2,3,4]]'\n  \
        kiln diff tests/programs/layer_norm.kir --bind N=16 --all\n  \
        kiln diff kiln-out/train_step.kir --state kiln-out/checkpoint.safetensors --json\n\n\
        Arguments not fed are drawn at random (floats in [-2, 2]); --bind sizes their symbolic\n\
        dimensions (default 4).")]
    Diff {
        file: PathBuf,
        /// The function to compare; may be left out when the program has only one.
        #[arg(long)]
        func: Option<String>,
        /// An argument: NAME=FILE.npy, or NAME=LITERAL such as 'x=[[1,2],[3,4]]'.
        #[arg(long = "feed", value_name = "NAME=VALUE")]
        feeds: Vec<String>,
        /// A size for a symbolic dimension of a random argument, as NAME=SIZE.
        #[arg(long = "bind", value_name = "NAME=SIZE")]
        bindings: Vec<String>,
        /// Start from the state values in a safetensors checkpoint.
        #[arg(long, value_name = "FILE")]
        state: Option<PathBuf>,
        /// Values agree when |a - b| <= tol * (1 + |a|) everywhere (default: 1e-4 for f32,
        /// 1e-9 for f64, 1e-2 for f16 and bf16; integers exactly).
        #[arg(long)]
        tol: Option<f64>,
        /// Print every value that differs, not only the first.
        #[arg(long)]
        all: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// The pass pipeline compiled runs use.
        #[arg(long, default_value = "default")]
        pipeline: String,
    },
    /// Write one self-contained HTML page with a program's whole journey: the IR after each
    /// pass with what changed marked, why (the e-graph's rules, fusion's decisions), each
    /// function's fused kernels and their plans, its memory plan, per-pass and per-step timings
    /// from profiled runs on random arguments, and the dataflow drawn when Graphviz is there.
    #[command(after_help = "Examples:\n  \
        kiln report tests/programs/attention.kir -o attention.html\n  \
        kiln report kiln-out/train_step.kir --bind N=64 -o step.html")]
    Report {
        file: PathBuf,
        /// The page written.
        #[arg(short, long, value_name = "FILE", default_value = "report.html")]
        out: PathBuf,
        /// A size for a symbolic dimension of the profiled runs, as NAME=SIZE (default 4).
        #[arg(long = "bind", value_name = "NAME=SIZE")]
        bindings: Vec<String>,
        /// Start from the state values in a safetensors checkpoint.
        #[arg(long, value_name = "FILE")]
        state: Option<PathBuf>,
        /// Profiled runs per function.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Print the gradient function of a scalar loss: `@<func>_grad` returns the loss and the
    /// gradient with respect to each `--wrt` (arguments by name, state as `@name`).
    #[command(after_help = "Example:\n  \
        kiln grad tests/programs/softmax_xent.kir --func loss --wrt logits")]
    Grad {
        file: PathBuf,
        /// The function whose result is the loss; may be left out when there is only one.
        #[arg(long)]
        func: Option<String>,
        /// Which result of the function is the loss.
        #[arg(long, default_value_t = 0)]
        loss: usize,
        /// What to differentiate with respect to: `x,@fc1.w` (arguments and state).
        #[arg(long, value_delimiter = ',', required = true)]
        wrt: Vec<kiln::passes::Wrt>,
    },
    /// Optimise a program with a pipeline or a list of passes, and print the result.
    #[command(after_help = "Examples:\n  \
        kiln opt tests/programs/layer_norm.kir\n  \
        kiln opt tests/programs/mlp.kir --passes canonicalize,cse,simplify,dce --print-after-all\n  \
        kiln opt tests/programs/softmax_xent.kir --stats\n  \
        kiln opt tests/programs/attention.kir --explain\n  \
        kiln opt tests/programs/conv_step.kir --passes channels_last --explain\n\n\
        Passes: place_constants, canonicalize, fold, cse, simplify, channels_last, loops, fold_updates, \
        dce, fuse, order_epilogues. \
        Pipelines: default, simplify, none.")]
    Opt {
        file: PathBuf,
        /// Passes to run, in order, separated by commas.
        #[arg(long, value_delimiter = ',', conflicts_with = "pipeline")]
        passes: Vec<String>,
        /// A named pipeline.
        #[arg(long, default_value = "default")]
        pipeline: String,
        /// Print the IR after every pass, each under a header naming the pass.
        #[arg(long)]
        print_after_all: bool,
        /// Print each pass's time, instruction counts and statistics (to stderr).
        #[arg(long)]
        stats: bool,
        /// Before the program, say why each pass changed what it changed: for the e-graph,
        /// each rewritten value's chain of rules and its cost before and after; for fusion,
        /// why each value was or was not fused (comment lines, `//`).
        #[arg(long)]
        explain: bool,
    },
    /// Op counts, parameters and their sizes, fused kernels and estimated memory traffic, as
    /// written and after the default pass pipeline.
    #[command(after_help = "Examples:\n  \
        kiln stats tests/programs/mlp.kir\n  \
        kiln stats kiln-out/train_step.kir --bind N=32")]
    Stats {
        file: PathBuf,
        /// A size for a symbolic dimension, as NAME=SIZE (unbound ones count as 1).
        #[arg(long = "bind", value_name = "NAME=SIZE")]
        bindings: Vec<String>,
    },
    /// Fuzz Kiln: mutate programs, `.npy` feeds and checkpoints, drive every command's code on
    /// each, and report any panic or any difference between compiled and interpreted runs.
    /// Exits 1 on a finding; each is written to OUT to reproduce.
    #[command(after_help = "Examples:\n  \
        kiln fuzz --seconds 60                       a minute, from the repository's corpus\n  \
        kiln fuzz --cases 5000 --seed 7              a reproducible budget\n  \
        kiln fuzz --corpus my_programs/ --out findings/")]
    Fuzz {
        /// The run is a function of the seed (with a budget in cases).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Stop after this many cases.
        #[arg(long)]
        cases: Option<u64>,
        /// Stop after this many seconds (default: 60 when no --cases is given).
        #[arg(long)]
        seconds: Option<f64>,
        /// Programs and models to mutate: .kir files or folders of them, .onnx files or
        /// folders holding them at any depth (default: the repository's tests/programs,
        /// tests/diagnostics, tests/runtime_limits, tests/fuzz_regressions, tests/onnx, and
        /// target/onnx-node and target/onnx-models when scripts/onnx_node_tests.py wrote them).
        #[arg(long, value_name = "PATH")]
        corpus: Vec<PathBuf>,
        /// Where the input being tried and the findings are written.
        #[arg(long, value_name = "DIR", default_value = "target/fuzz")]
        out: PathBuf,
        /// Instead of fuzzing, try these programs and models (files or folders) as they are:
        /// every command, and both runs compared — to check a finding again.
        #[arg(long, value_name = "PATH", num_args = 1..)]
        replay: Vec<PathBuf>,
    },
    /// The book's mdBook preprocessor: replaces `{{#kiln-ops}}` with the op reference made
    /// from the op table (`docs/book.toml` runs it).
    #[command(hide = true)]
    BookOps {
        /// mdBook asks `supports <renderer>` first.
        args: Vec<String>,
    },
    /// Text from a trained language model: the folder `examples/gpt.rs train --out DIR`
    /// writes (config.json, tokenizer.json, model.safetensors). Draws at a temperature from
    /// the top-k tokens (nanoGPT's sample.py defaults), or greedily; seeded, so one seed
    /// gives one text.
    #[command(after_help = "Examples:\n  \
        cargo run --release --example gpt -- train --out target/gpt\n  \
        kiln generate target/gpt --prompt 'ROMEO:' --tokens 200\n  \
        kiln generate target/gpt --prompt 'To be' --greedy --no-cache")]
    Generate {
        /// The model's folder.
        dir: PathBuf,
        /// The text to go on from.
        #[arg(long, default_value = "\n")]
        prompt: String,
        /// Tokens to add (fewer when the model ends the text).
        #[arg(long, default_value_t = 200)]
        tokens: usize,
        /// The most likely token each time instead of drawing.
        #[arg(long)]
        greedy: bool,
        /// Divides the logits before drawing.
        #[arg(long, default_value_t = 0.8)]
        temperature: f64,
        /// Draw only from the k most likely tokens.
        #[arg(long, value_name = "K", default_value_t = 200)]
        top_k: usize,
        /// Draw only from the most likely tokens whose probabilities reach P together.
        #[arg(long, value_name = "P")]
        top_p: Option<f64>,
        /// The seed of the draws.
        #[arg(long, default_value_t = 1337)]
        seed: u64,
        /// Compute the whole window again for each token instead of reading the KV cache
        /// (the same text, slower: the cache's oracle).
        #[arg(long)]
        no_cache: bool,
    },
    /// Draw a function's dataflow as Graphviz DOT (render with `dot -Tsvg`).
    #[command(after_help = "Example:\n  kiln dot tests/programs/mlp.kir | dot -Tsvg > mlp.svg")]
    Dot {
        file: PathBuf,
        /// The function to draw; may be left out when the program has only one.
        #[arg(long)]
        func: Option<String>,
    },
}

/// `kiln generate`: prints the prompt and what the model adds to it.
fn generate(
    dir: &Path,
    prompt: &str,
    tokens: usize,
    (temperature, top_k, top_p, seed): (f64, usize, Option<f64>, u64),
    cached: bool,
) -> Result<(), Failed> {
    let mut sampling =
        kiln::runtime::Sampling::temperature(temperature, seed)?.with_top_k(top_k)?;
    if let Some(p) = top_p {
        sampling = sampling.with_top_p(p)?;
    }
    let model = kiln::lm::LanguageModel::load(dir)?;
    println!(
        "{}",
        model.generate_with(prompt, tokens, &sampling, cached)?
    );
    Ok(())
}

/// A failure already explained to the user.
struct Failed(String);

impl<E: std::fmt::Display> From<E> for Failed {
    fn from(e: E) -> Failed {
        Failed(e.to_string())
    }
}

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of our output goes away
    // (`kiln opt … | head`) instead of failing on the closed pipe.
    // SAFETY: restoring the default action of a signal, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Tour {
        out: PathBuf::from("kiln-out"),
        data: None,
        digits: false,
        epochs: None,
        eager_steps: 10,
        gan_iterations: 3000,
        report: false,
    });
    let outcome = match command {
        Command::Tour {
            out,
            data,
            digits,
            epochs,
            eager_steps,
            gan_iterations,
            report: with_report,
        } => {
            use kiln::demos::tour::{Config, DataChoice};
            let data = match (data, digits) {
                (Some(dir), _) => DataChoice::Folder(dir),
                (None, true) => DataChoice::Digits,
                (None, false) => DataChoice::Auto,
            };
            let written = out.clone();
            tour(Config {
                out,
                data,
                epochs,
                eager_steps,
                gan_iterations,
                ..Config::default()
            })
            .and_then(|()| match with_report {
                true => tour_reports(&written),
                false => Ok(()),
            })
        }
        Command::Check { files } => check(&files),
        Command::Import { file, out } => import_onnx(&file, &out),
        Command::Export {
            file,
            func,
            state,
            out,
            opset,
        } => export_onnx(&file, func.as_deref(), state.as_deref(), &out, opset),
        Command::Dump { file } => load(&file).map(|m| print!("{m}")),
        Command::Run {
            file,
            func,
            feeds,
            out,
            state,
            save_state,
            interpret,
            max_trips,
            memory_limit,
        } => {
            kiln::backend::limits::set_max_trips(max_trips);
            kiln::backend::limits::set_memory_limit(memory_limit);
            run(&RunArgs {
                file: &file,
                func: func.as_deref(),
                feeds: &feeds,
                out: out.as_deref(),
                state: state.as_deref(),
                save_state: save_state.as_deref(),
                interpret,
            })
        }
        Command::Grad {
            file,
            func,
            loss,
            wrt,
        } => load(&file).and_then(|m| {
            let f = pick_function(&m, func.as_deref())?;
            let grad = kiln::passes::gradient_function(&m, f, loss, &wrt)
                .map_err(|e| Failed(format!("error: {e}")))?;
            let out = Module {
                states: m.states.clone(),
                functions: vec![grad],
            };
            kiln::ir::verify_module(&out).map_err(|e| {
                Failed(format!(
                    "error: the gradient does not verify:\n{}",
                    e.render(&out)
                ))
            })?;
            print!("{out}");
            Ok(())
        }),
        Command::Opt {
            file,
            passes,
            pipeline,
            print_after_all,
            stats,
            explain,
        } => opt(
            &file,
            &passes,
            &pipeline,
            OptOutput {
                print_after_all,
                stats,
                explain,
            },
        ),
        Command::Stats { file, bindings } => stats(&file, &bindings),
        Command::Report {
            file,
            out,
            bindings,
            state,
            runs,
        } => report(&file, &out, &bindings, state.as_deref(), runs),
        Command::Diff {
            file,
            func,
            feeds,
            bindings,
            state,
            tol,
            all,
            json,
            pipeline,
        } => diff(&DiffArgs {
            file: &file,
            func: func.as_deref(),
            feeds: &feeds,
            bindings: &bindings,
            state: state.as_deref(),
            tol,
            all,
            json,
            pipeline: &pipeline,
        }),
        Command::Fuzz {
            seed,
            cases,
            seconds,
            corpus,
            out,
            replay,
        } => fuzz(seed, cases, seconds, corpus, out, &replay),
        Command::BookOps { args } => book_ops(&args),
        Command::Generate {
            dir,
            prompt,
            tokens,
            greedy,
            temperature,
            top_k,
            top_p,
            seed,
            no_cache,
        } => {
            let temperature = if greedy { 0.0 } else { temperature };
            let sampling = (temperature, top_k, top_p, seed);
            generate(&dir, &prompt, tokens, sampling, !no_cache)
        }
        Command::Dot { file, func } => load(&file).and_then(|m| {
            let f = pick_function(&m, func.as_deref())?;
            print!("{}", kiln::dot::function_to_dot(f));
            Ok(())
        }),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed(message)) => {
            if !message.is_empty() {
                eprintln!("{message}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The book's preprocessor: every renderer is supported; the book comes on stdin as JSON and
/// goes back on stdout with the op reference in place.
fn book_ops(args: &[String]) -> Result<(), Failed> {
    if args.first().map(String::as_str) == Some("supports") {
        return Ok(());
    }
    let mut input = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)
        .map_err(|e| Failed(format!("error: cannot read the book from stdin: {e}")))?;
    let book = kiln::book::preprocess(&input).map_err(|e| Failed(format!("error: {e}")))?;
    print!("{book}");
    Ok(())
}

/// Reads, parses and verifies a program, rendering errors against its source.
/// A program from its text IR, or imported from an `.onnx` model (its parameters dropped).
fn load(path: &Path) -> Result<Module, Failed> {
    load_with_parameters(path).map(|(module, _, _)| module)
}

/// A program and, for an `.onnx` model, its parameters and the graph's input names (a `.kir`
/// file has neither).
fn load_with_parameters(path: &Path) -> Result<Loaded, Failed> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
    {
        let model = kiln::onnx::import(path)
            .map_err(|e| Failed(format!("error: {}: {e}", path.display())))?;
        return Ok((model.module, model.parameters, model.inputs));
    }
    Ok((load_text(path)?, Default::default(), Vec::new()))
}

type Loaded = (
    Module,
    std::collections::BTreeMap<String, kiln::backend::Array>,
    Vec<String>,
);

fn load_text(path: &Path) -> Result<Module, Failed> {
    let source = std::fs::read_to_string(path)
        .map_err(|e| Failed(format!("error: cannot read {}: {e}", path.display())))?;
    parse_and_verify(&source)
        .map_err(|e| Failed(format!("{}: {}", path.display(), e.render(&source))))
}

fn import_onnx(file: &Path, out: &Path) -> Result<(), Failed> {
    let model =
        kiln::onnx::import(file).map_err(|e| Failed(format!("error: {}: {e}", file.display())))?;
    let failed = |e: &dyn std::fmt::Display| Failed(format!("error: {e}"));
    std::fs::create_dir_all(out).map_err(|e| failed(&e))?;
    let (kir, weights) = (out.join("model.kir"), out.join("model.safetensors"));
    kiln::runtime::checkpoint::write_atomically(&kir, model.module.to_string().as_bytes())
        .map_err(|e| failed(&e))?;
    kiln::runtime::checkpoint::save(
        model.parameters.iter().map(|(n, a)| (n.as_str(), a)),
        &weights,
    )
    .map_err(|e| failed(&e))?;
    let bytes: usize = (model.parameters.values())
        .map(|a| a.len() * a.dtype().size_bytes())
        .sum();
    let f = &model.module.functions[0];
    println!(
        "imported {}: @{} ({} instructions; inputs {}; outputs {}), {} parameters ({bytes} bytes)",
        file.display(),
        f.name(),
        f.num_insts(),
        model.inputs.join(", "),
        model.outputs.join(", "),
        model.parameters.len()
    );
    println!("wrote {} and {}", kir.display(), weights.display());
    Ok(())
}

fn check(files: &[PathBuf]) -> Result<(), Failed> {
    let mut failures = Vec::new();
    for path in files {
        match load(path) {
            Ok(m) => println!(
                "ok: {} ({} function{}, {} state)",
                path.display(),
                m.functions.len(),
                if m.functions.len() == 1 { "" } else { "s" },
                m.states.len()
            ),
            Err(Failed(message)) => failures.push(message),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Failed(failures.join("\n")))
    }
}

fn export_onnx(
    file: &Path,
    func: Option<&str>,
    state: Option<&Path>,
    out: &Path,
    opset: i64,
) -> Result<(), Failed> {
    let failed = |e: &dyn std::fmt::Display| Failed(format!("error: {e}"));
    let (module, parameters, _) = load_with_parameters(file)?;
    let func = pick_function(&module, func)?;
    let mut scope = Scope::from_module(&module).map_err(|e| failed(&e))?;
    for (name, value) in parameters {
        scope.set(&name, value).map_err(|e| failed(&e))?;
    }
    if let Some(checkpoint) = state {
        scope.load(checkpoint).map_err(|e| failed(&e))?;
    }
    let options = kiln::onnx::export::ExportOptions {
        opset,
        ..Default::default()
    };
    kiln::onnx::export::export_to_file(&module, func.name(), scope.store(), out, &options)
        .map_err(|e| Failed(format!("error: {}: {e}", file.display())))?;
    println!(
        "exported @{} of {} to {} (opset {opset})",
        func.name(),
        file.display(),
        out.display()
    );
    Ok(())
}

fn pick_function<'m>(module: &'m Module, name: Option<&str>) -> Result<&'m Function, Failed> {
    let available = || {
        module
            .functions
            .iter()
            .map(|f| format!("@{}", f.name()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match name {
        Some(n) => {
            let n = n.trim_start_matches('@');
            module.function(n).ok_or_else(|| {
                Failed(format!(
                    "error: no function @{n}; the program has: {}",
                    available()
                ))
            })
        }
        None => match &module.functions[..] {
            [only] => Ok(only),
            [] => Err(Failed("error: the program has no functions".into())),
            _ => Err(Failed(format!(
                "error: the program has several functions ({}); choose one with --func",
                available()
            ))),
        },
    }
}

/// What `kiln opt` prints besides the result.
struct OptOutput {
    print_after_all: bool,
    stats: bool,
    explain: bool,
}

fn opt(path: &Path, passes: &[String], pipeline: &str, output: OptOutput) -> Result<(), Failed> {
    let OptOutput {
        print_after_all,
        stats,
        explain,
    } = output;
    use kiln::passes::PassManager;
    let mut module = load(path)?;
    let manager = if passes.is_empty() {
        PassManager::pipeline(pipeline)
    } else {
        PassManager::from_names(passes)
    };
    let mut manager = manager
        .map_err(|e| Failed(format!("error: {e}")))?
        .verify_each(true)
        .explain(explain);
    let mut previous = module.to_string();
    let reports = manager
        .run_with(&mut module, |report, m| {
            if explain && !report.explanations.is_empty() {
                println!("// {} explained:", report.pass);
                for paragraph in &report.explanations {
                    for line in paragraph.lines() {
                        println!("//   {line}");
                    }
                }
                println!();
            }
            if print_after_all {
                println!("{}", kiln::passes::manager::dump_header(report.pass));
                println!("// {report}");
                let text = m.to_string();
                if text == previous {
                    println!("// (unchanged)\n");
                } else {
                    println!("{text}");
                }
                previous = text;
            }
        })
        .map_err(|e| Failed(format!("error: {e}")))?;
    if !print_after_all {
        print!("{module}");
    }
    if stats {
        for report in &reports {
            eprintln!("{report}");
        }
    }
    Ok(())
}

/// `--bind NAME=SIZE`s as symbol sizes.
fn parse_bindings(bindings: &[String]) -> Result<kiln::ir::SymbolBindings, Failed> {
    let mut bound = kiln::ir::SymbolBindings::new();
    for binding in bindings {
        let size = binding
            .split_once('=')
            .and_then(|(name, size)| Some((name, size.parse::<usize>().ok()?)));
        let Some((name, size)) = size else {
            return Err(Failed(format!(
                "error: --bind {binding:?} is not NAME=SIZE (for example N=256)"
            )));
        };
        bound.insert(kiln::ir::Symbol::new(name), size);
    }
    Ok(bound)
}

fn stats(path: &Path, bindings: &[String]) -> Result<(), Failed> {
    let module = load(path)?;
    let bound = parse_bindings(bindings)?;
    println!("{}", path.display());
    print!(
        "{}",
        kiln::stats::report(&module, &bound).map_err(|e| Failed(format!("error: {e}")))?
    );
    Ok(())
}

fn fuzz(
    seed: u64,
    cases: Option<u64>,
    seconds: Option<f64>,
    corpus: Vec<PathBuf>,
    out: PathBuf,
    replay: &[PathBuf],
) -> Result<(), Failed> {
    let defaults = kiln::fuzz::Config::default();
    let config = kiln::fuzz::Config {
        seed,
        cases,
        seconds: seconds.or(cases.is_none().then_some(60.0)),
        corpus: if corpus.is_empty() {
            defaults.corpus.clone()
        } else {
            corpus
        },
        out,
        ..defaults
    };
    let summary = if replay.is_empty() {
        println!(
            "kiln fuzz: seed {seed}, {}; inputs in {}",
            match (config.cases, config.seconds) {
                (Some(n), _) => format!("{n} cases"),
                (None, Some(s)) => format!("{s} s"),
                (None, None) => "no budget".to_owned(),
            },
            config.out.display()
        );
        kiln::fuzz::run(&config, |line| println!("{line}"))
    } else {
        kiln::fuzz::replay(replay, &config)
    }
    .map_err(|e| Failed(format!("error: {e}")))?;
    println!("{summary}");
    if summary.findings.is_empty() {
        return Ok(());
    }
    let mut report = String::new();
    for f in &summary.findings {
        report += &format!(
            "finding: {} ({})
  {}
",
            f.what,
            f.input.display(),
            f.detail
        );
    }
    Err(Failed(format!(
        "{report}error: {} findings",
        summary.findings.len()
    )))
}

fn tour(config: kiln::demos::tour::Config) -> Result<(), Failed> {
    use kiln::demos::tour;
    println!(
        "Kiln tour: a CNN trained eagerly, then compiled with to_static; a GAN on 1-D data.\n"
    );
    let summary =
        tour::run(&config, |line| println!("{line}")).map_err(|e| Failed(format!("error: {e}")))?;
    let (e, c) = (&summary.eager, &summary.compiled);
    println!("\nsummary");
    println!("  data                 {}", summary.source);
    println!(
        "  test accuracy        {:.1} % after {} eager steps, {:.1} % after {} epochs \
         (top-5 {:.1} %)",
        100.0 * e.test.accuracy,
        e.steps,
        100.0 * c.test.accuracy,
        summary.epochs,
        100.0 * c.test.top_k
    );
    println!(
        "  speed                eager {:.1} steps/s, compiled {:.1} steps/s ({:.1}x); \
         training {:.0} s in all",
        e.steps_per_second(),
        c.steps_per_second(),
        c.steps_per_second() / e.steps_per_second(),
        summary.train_seconds
    );
    println!(
        "  compile time         {:.3} s (trace, gradients, Adam, passes, JIT, first step)",
        summary.compile_seconds
    );
    println!(
        "  GAN                  generated mean {:.3}, std {:.3} (target 4, 0.5)",
        summary.gan_mean, summary.gan_std
    );
    println!("\nwritten");
    for (what, path) in &summary.files {
        println!("  {:<48} {}", what, path.display());
    }
    let dir = config.out.display();
    println!("\nnext");
    println!("  kiln opt {dir}/train_step.kir --print-after-all | less   # the IR after each pass");
    println!("  dot -Tsvg {dir}/train_step.dot > step.svg                # draw the training step");
    println!(
        "  kiln diff {dir}/train_step.kir                            # compiled against the interpreter"
    );
    println!(
        "  kiln report {dir}/train_step.kir -o {dir}/report.html      # the step's whole journey, one page"
    );
    println!(
        "  kiln run {dir}/predict.kir --state {dir}/parameters.safetensors --feed x={dir}/test_images.npy"
    );
    Ok(())
}

/// `kiln tour --report`: a report of each program the tour wrote — OUT/report.html of the
/// training step, OUT/report-predict.html and OUT/report-gan.html.
fn tour_reports(out: &Path) -> Result<(), Failed> {
    for (program, page) in [
        ("train_step.kir", "report.html"),
        ("predict.kir", "report-predict.html"),
        ("gan.kir", "report-gan.html"),
    ] {
        report(
            &out.join(program),
            &out.join(page),
            &["N=32".to_owned()],
            None,
            3,
        )?;
    }
    Ok(())
}

struct RunArgs<'a> {
    file: &'a Path,
    func: Option<&'a str>,
    feeds: &'a [String],
    out: Option<&'a Path>,
    state: Option<&'a Path>,
    save_state: Option<&'a Path>,
    interpret: bool,
}

/// `4096`, `512M`, `8G`: a byte count with an optional binary suffix.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let (digits, shift) = match text.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 10),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 20),
        t if t.ends_with('G') => (t[..t.len() - 1].to_string(), 30),
        t if t.ends_with('T') => (t[..t.len() - 1].to_string(), 40),
        t => (t, 0),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a byte count such as 4096, 512M or 8G"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is more bytes than 2^64"))
}

/// The arguments of `func` from `--feed NAME=VALUE`s (ONNX inputs also by their model names).
/// A missing feed is an error naming it, or, with `random` (the sizes of symbolic dimensions),
/// drawn at random: floats uniform in [-2, 2], integers in [0, 4), bools either way.
fn arguments(
    func: &Function,
    feeds: &[String],
    onnx_inputs: &[String],
    random: Option<&kiln::ir::SymbolBindings>,
) -> Result<Vec<kiln::backend::Array>, Failed> {
    let names = ValueNames::new(func);
    let arg_names: Vec<String> = (func.args().iter())
        .map(|&a| names.get(a)[1..].to_owned())
        .collect();
    let mut given: Vec<(&str, &str)> = Vec::new();
    for feed in feeds {
        let (mut name, value) = feed
            .split_once('=')
            .ok_or_else(|| Failed(format!("error: --feed {feed:?} is not NAME=VALUE")))?;
        // An ONNX input is fed by its name in the model, as well as by its IR name.
        if let Some(i) = onnx_inputs.iter().position(|n| n == name) {
            name = &arg_names[i];
        }
        given.push((name.trim_start_matches('%'), value));
    }
    if let Some((unknown, _)) = (given.iter()).find(|(n, _)| !arg_names.iter().any(|a| a == n)) {
        return Err(Failed(format!(
            "error: @{} has no argument %{unknown}",
            func.name()
        )));
    }
    let mut args = Vec::new();
    for (&arg, name) in func.args().iter().zip(&arg_names) {
        let ty = func.value_type(arg);
        let array = match (given.iter().find(|(n, _)| n == name), random) {
            (Some((_, value)), _) if value.ends_with(".npy") => {
                kiln::npy::read_npy(Path::new(value), ty.dtype)?
            }
            (Some((_, value)), _) => kiln::npy::parse_array_literal(value, ty.dtype)?,
            (None, Some(sizes)) => kiln::diff::random_value(ty, sizes, args.len() as u64)
                .map_err(|e| Failed(format!("error: argument %{name} of @{}: {e}", func.name())))?,
            (None, None) => {
                return Err(Failed(format!(
                    "error: no feed for argument %{name}: {ty} of @{}; pass --feed {name}=FILE.npy or --feed '{name}=[...]'",
                    func.name()
                )));
            }
        };
        args.push(array);
    }
    Ok(args)
}

fn run(opts: &RunArgs<'_>) -> Result<(), Failed> {
    let (feeds, out) = (opts.feeds, opts.out);
    let (module, parameters, onnx_inputs) = load_with_parameters(opts.file)?;
    let func = pick_function(&module, opts.func)?;
    let names = ValueNames::new(func);
    let args = arguments(func, feeds, &onnx_inputs, None)?;
    let mut scope = Scope::from_module(&module).map_err(|e| Failed(format!("error: {e}")))?;
    for (name, value) in parameters {
        scope
            .set(&name, value)
            .map_err(|e| Failed(format!("error: {e}")))?;
    }
    if let Some(checkpoint) = opts.state {
        scope
            .load(checkpoint)
            .map_err(|e| Failed(format!("error: {e}")))?;
    }
    let before = scope.store().clone();
    let failed = |e: &dyn std::fmt::Display| Failed(format!("error: {e}"));
    let (results, state) = if opts.interpret {
        let mut state = before.clone();
        let results = (Interpreter::new(&module).run_function(func, args, &mut state))
            .map_err(|e| failed(&e))?;
        (results, state)
    } else {
        let mut compiled =
            kiln::serve::Predictor::compile(module.clone(), func.name(), before.clone())
                .map_err(|e| failed(&e))?;
        let results = compiled.predict(args).map_err(|e| failed(&e))?;
        (results, compiled.state().clone())
    };
    if let Some(dir) = out {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failed(format!("error: cannot create {}: {e}", dir.display())))?;
    }
    for (i, (&v, array)) in func.results().iter().zip(&results).enumerate() {
        let printed = names.get(v);
        println!("result {i} ({printed}): {}", array.ty());
        println!("{array}");
        if let Some(dir) = out {
            let file = dir.join(result_file_name(&printed, i, func.results()));
            kiln::npy::write_npy(&file, array)?;
            println!("  written to {}", file.display());
        }
    }
    for (name, value) in state.iter() {
        if before.get(name) != Some(value) {
            println!("state @{name} updated: {}", value.ty());
        }
    }
    if let Some(path) = opts.save_state {
        kiln::runtime::checkpoint::save(state.iter(), path)
            .map_err(|e| Failed(format!("error: {e}")))?;
        println!("state saved to {}", path.display());
    }
    Ok(())
}

/// `y.npy` for a named result returned once; `result<i>.npy` otherwise.
fn result_file_name(printed: &str, index: usize, results: &[kiln::ir::Value]) -> String {
    let name = &printed[1..];
    let named = !name.chars().all(|c| c.is_ascii_digit());
    let unique = results.iter().filter(|&&v| v == results[index]).count() == 1;
    if named && unique {
        format!("{name}.npy")
    } else {
        format!("result{index}.npy")
    }
}

struct DiffArgs<'a> {
    file: &'a Path,
    func: Option<&'a str>,
    feeds: &'a [String],
    bindings: &'a [String],
    state: Option<&'a Path>,
    tol: Option<f64>,
    all: bool,
    json: bool,
    pipeline: &'a str,
}

fn diff(opts: &DiffArgs<'_>) -> Result<(), Failed> {
    let failed = |e: &dyn std::fmt::Display| Failed(format!("error: {e}"));
    let (module, parameters, onnx_inputs) = load_with_parameters(opts.file)?;
    // Without --func, every function of the program, each from the same state.
    let funcs = match opts.func {
        Some(name) => vec![pick_function(&module, Some(name))?],
        None => module.functions.iter().collect(),
    };
    let sizes = parse_bindings(opts.bindings)?;
    let mut scope = Scope::from_module(&module).map_err(|e| failed(&e))?;
    for (name, value) in parameters {
        scope.set(&name, value).map_err(|e| failed(&e))?;
    }
    if let Some(checkpoint) = opts.state {
        scope.load(checkpoint).map_err(|e| failed(&e))?;
    }
    if opts.tol.is_some_and(|t| t.is_nan() || t < 0.0) {
        return Err(Failed("error: --tol must be a number >= 0".into()));
    }
    let tolerance = kiln::diff::Tolerance { tol: opts.tol };
    let mut agree = true;
    for func in funcs {
        let args = arguments(func, opts.feeds, &onnx_inputs, Some(&sizes))?;
        let mut pipeline =
            kiln::passes::PassManager::pipeline(opts.pipeline).map_err(|e| failed(&e))?;
        let report = (kiln::diff::diff(
            &module,
            func.name(),
            &args,
            scope.store(),
            &mut pipeline,
            tolerance,
        ))
        .map_err(|e| failed(&e))?;
        if opts.json {
            println!("{}", kiln::diff::to_json(&report, opts.all));
        } else {
            print!("{}", kiln::diff::render(&report, opts.all));
        }
        agree &= report.agrees();
    }
    if agree {
        Ok(())
    } else {
        Err(Failed(String::new()))
    }
}

fn report(
    path: &Path,
    out: &Path,
    bindings: &[String],
    state: Option<&Path>,
    runs: usize,
) -> Result<(), Failed> {
    let failed = |e: &dyn std::fmt::Display| Failed(format!("error: {e}"));
    let (module, parameters, _) = load_with_parameters(path)?;
    let mut scope = Scope::from_module(&module).map_err(|e| failed(&e))?;
    for (name, value) in parameters {
        scope.set(&name, value).map_err(|e| failed(&e))?;
    }
    if let Some(checkpoint) = state {
        scope.load(checkpoint).map_err(|e| failed(&e))?;
    }
    let options = kiln::report::Options {
        title: path.display().to_string(),
        sizes: parse_bindings(bindings)?,
        runs,
    };
    let page = kiln::report::html(&module, scope.store(), &options).map_err(|e| failed(&e))?;
    kiln::runtime::checkpoint::write_atomically(out, page.as_bytes())
        .map_err(|e| Failed(format!("error: cannot write {}: {e}", out.display())))?;
    println!(
        "wrote {} ({} KiB)",
        out.display(),
        page.len().div_ceil(1024)
    );
    Ok(())
}
