//! `kiln report`: one self-contained HTML page with a program's whole journey — the IR after
//! each pass with what changed marked, why each pass did it (`--explain`'s explanations), each
//! function's fused kernels with their plans, its memory plan, per-pass and per-step timings
//! from a profiled run, and the dataflow drawn by Graphviz when `dot` is installed.
//!
//! The page needs no network and no files beside it: styles inline, drawings as inline SVG,
//! and a few lines of script that check every link between sections resolves
//! (`<p id="self-check">`), which CI reads back from a headless browser.

use crate::diff::random_value;
use kiln_backend::exec::Executable;
use kiln_backend::{Interpreter, StateStore};
use kiln_ir::{Module, SymbolBindings};
use kiln_passes::PassManager;
use kiln_passes::manager::PassReport;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

/// What to put in the report.
pub struct Options {
    /// The program's name as shown (its file).
    pub title: String,
    /// Sizes of symbolic dimensions for the profiled runs (4 when not bound).
    pub sizes: SymbolBindings,
    /// Profiled runs per function (after one warm-up run).
    pub runs: usize,
}

/// The report of `module` (verified), run from `state`, as one HTML page.
pub fn html(module: &Module, state: &StateStore, options: &Options) -> Result<String, String> {
    let mut snapshots: Vec<(PassReport, String)> = Vec::new();
    let mut optimised = module.clone();
    PassManager::pipeline("default")
        .map_err(|e| e.to_string())?
        .explain(true)
        .run_with(&mut optimised, |report, m| {
            snapshots.push((report.clone(), m.to_string()))
        })
        .map_err(|e| format!("the pass pipeline failed: {e}"))?;
    let mut page = Page::default();
    page.head(&options.title);
    page.contents(&snapshots, &optimised);
    page.section("input", "The program as written", "");
    page.ir(&module.to_string(), None);
    let mut previous = module.to_string();
    for (k, (report, text)) in snapshots.iter().enumerate() {
        page.pass(k, snapshots.len(), report, text, &previous);
        previous.clone_from(text);
    }
    for func in &optimised.functions {
        page.function(&optimised, func.name(), state, options);
    }
    page.graphs(module);
    page.finish();
    Ok(page.out)
}

#[derive(Default)]
struct Page {
    out: String,
}

/// `text` with `<`, `>`, `&` and quotes escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:70em;\
color:#222}pre{background:#f6f6f4;padding:.8em;overflow-x:auto;font-size:85%}\
mark{background:#fde68a}nav a{margin-right:1em}table{border-collapse:collapse;font-size:85%}\
td,th{border:1px solid #ddd;padding:.2em .5em;text-align:left;vertical-align:top}\
td.num{text-align:right}.explain{background:#eef5ff}h2{border-top:1px solid #ccc;padding-top:.6em}";

/// Checks, in the browser, that every in-page link has a target and that following it makes
/// that target the page's `:target`; the result is the text of `#self-check`, which CI reads
/// from headless Chromium's DOM.
const SELF_CHECK: &str = "<script>(function(){var links=document.querySelectorAll('a[href^=\"#\"]');\
var ok=0;links.forEach(function(a){var id=a.getAttribute('href').slice(1);\
var target=document.getElementById(id);if(!target)return;location.hash=id;\
if(document.querySelector(':target')===target)ok++;});history.replaceState(null,'',location.pathname);\
document.getElementById('self-check').textContent='links: '+ok+' of '+links.length+' resolve';})();</script>";

impl Page {
    fn head(&mut self, title: &str) {
        let title = escape(title);
        let _ = write!(
            self.out,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <title>kiln report: {title}</title><style>{STYLE}</style></head><body>\n\
             <h1>kiln report: {title}</h1>\n<p id=\"self-check\">links: not checked (scripts off)</p>\n"
        );
    }

    fn contents(&mut self, snapshots: &[(PassReport, String)], optimised: &Module) {
        self.out += "<nav id=\"contents\"><h2>Contents</h2><ol>\n<li><a href=\"#input\">The program as written</a></li>\n";
        for (k, (report, _)) in snapshots.iter().enumerate() {
            let _ = writeln!(
                self.out,
                "<li><a href=\"#pass-{}\">After {}</a> ({:.3} ms, {} → {} instructions)</li>",
                k + 1,
                report.pass,
                report.time.as_secs_f64() * 1e3,
                report.insts_before,
                report.insts_after
            );
        }
        for f in &optimised.functions {
            let _ = writeln!(
                self.out,
                "<li><a href=\"#run-{0}\">@{0}: kernels, memory plan, profile</a></li>",
                escape(f.name())
            );
        }
        self.out += "<li><a href=\"#graphs\">Drawings</a></li></ol></nav>\n";
    }

    fn section(&mut self, id: &str, heading: &str, note: &str) {
        let _ = writeln!(
            self.out,
            "<section id=\"{id}\"><h2>{}</h2>{note}",
            escape(heading)
        );
    }

    /// IR text, with the lines `previous` did not have marked.
    fn ir(&mut self, text: &str, previous: Option<&str>) {
        let mut before: HashMap<&str, usize> = HashMap::new();
        for line in previous.unwrap_or_default().lines() {
            *before.entry(line).or_default() += 1;
        }
        self.out += "<pre>";
        for line in text.lines() {
            // New: more copies of the line than the previous text had.
            let new = previous.is_some()
                && match before.get_mut(line) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        false
                    }
                    _ => true,
                };
            let line = escape(line);
            if new {
                let _ = writeln!(self.out, "<mark>{line}</mark>");
            } else {
                let _ = writeln!(self.out, "{line}");
            }
        }
        self.out += "</pre></section>\n";
    }

    fn pass(&mut self, k: usize, count: usize, report: &PassReport, text: &str, previous: &str) {
        let mut nav = String::from("<nav><a href=\"#contents\">contents</a>");
        let back = if k == 0 {
            "input".to_owned()
        } else {
            format!("pass-{k}")
        };
        let _ = write!(nav, "<a href=\"#{back}\">previous</a>");
        if k + 1 < count {
            let _ = write!(nav, "<a href=\"#pass-{}\">next</a>", k + 2);
        }
        nav += "</nav>";
        let stats: Vec<String> = (report.stats.entries.iter())
            .map(|(key, v)| format!("{key}: {}", escape(v)))
            .collect();
        let note = format!(
            "{nav}<p>{:.3} ms; {} → {} instructions{}{}</p>",
            report.time.as_secs_f64() * 1e3,
            report.insts_before,
            report.insts_after,
            if stats.is_empty() { "" } else { "; " },
            stats.join("; ")
        );
        self.section(
            &format!("pass-{}", k + 1),
            &format!("{}. After {}", k + 1, report.pass),
            &note,
        );
        if !report.explanations.is_empty() {
            self.out += "<pre class=\"explain\">";
            for paragraph in &report.explanations {
                self.out += &escape(paragraph);
                if !paragraph.ends_with('\n') {
                    self.out.push('\n');
                }
            }
            self.out += "</pre>";
        }
        if text == previous {
            self.out += "<p>(unchanged)</p></section>\n";
        } else {
            self.ir(text, Some(previous));
        }
    }

    /// One function of the optimised program: compiled, run, and shown.
    fn function(&mut self, module: &Module, name: &str, state: &StateStore, options: &Options) {
        let func = module.function(name).expect("listed");
        let id = format!("run-{}", escape(name));
        self.section(
            &id,
            &format!("@{name}: kernels, memory plan, profile"),
            "<nav><a href=\"#contents\">contents</a></nav>",
        );
        let executable = Executable::new(func).with_profile();
        let profiled = profile(module, &executable, state, options);
        self.kernels(&executable);
        self.memory_plan(&executable);
        match profiled {
            Err(e) => {
                let _ = writeln!(self.out, "<p>Not profiled: {}</p>", escape(&e));
            }
            Ok(()) => self.profile(&executable, options),
        }
        self.out += "</section>\n";
    }

    fn kernels(&mut self, executable: &Executable) {
        let kernels = executable.kernels();
        let _ = writeln!(self.out, "<h3>Fused kernels ({})</h3>", kernels.len());
        self.out += "<table><tr><th>kernel</th><th>stages</th><th>code</th></tr>\n";
        for k in &kernels {
            let stages: Vec<String> = (k.stages.iter().enumerate())
                .map(|(i, s)| format!("{i}: {}", escape(s)))
                .collect();
            let _ = writeln!(
                self.out,
                "<tr><td><code>{}</code></td><td>{}</td><td class=\"num\">{} bytes</td></tr>",
                escape(&k.inst),
                stages.join("<br>"),
                k.code_size
            );
        }
        self.out += "</table>\n";
    }

    fn memory_plan(&mut self, executable: &Executable) {
        self.out += "<h3>Memory plan</h3><table><tr><th>step</th><th>outputs</th></tr>\n";
        for p in executable.memory_plan() {
            let mut outputs: Vec<String> = (p.outputs.iter())
                .map(|(v, place)| format!("{} → {}", escape(v), escape(place)))
                .collect();
            outputs.extend(p.kept.map(|kept| format!("<i>{}</i>", escape(&kept))));
            let _ = writeln!(
                self.out,
                "<tr><td><code>{}</code></td><td>{}</td></tr>",
                escape(&p.inst),
                outputs.join("<br>")
            );
        }
        self.out += "</table>\n";
    }

    fn profile(&mut self, executable: &Executable, options: &Options) {
        let sizes: Vec<String> = (options.sizes.iter())
            .map(|(s, n)| format!("{s}={n}"))
            .collect();
        let _ = writeln!(
            self.out,
            "<h3>Profile</h3><p>{} runs on random arguments ({}), after one warm-up; \
             the 30 slowest steps.</p><table><tr><th>step</th><th>µs per run</th></tr>",
            options.runs.max(1),
            if sizes.is_empty() {
                "symbolic sizes 4".to_owned()
            } else {
                sizes.join(", ")
            }
        );
        for row in executable.profile().into_iter().take(30) {
            let per_run = row.total.as_secs_f64() * 1e6 / row.calls.max(1) as f64;
            let _ = writeln!(
                self.out,
                "<tr><td><code>{}</code></td><td class=\"num\">{per_run:.1}</td></tr>",
                escape(&row.inst)
            );
        }
        self.out += "</table>\n";
    }

    /// Each function of the program as written, drawn by Graphviz when `dot` runs.
    fn graphs(&mut self, module: &Module) {
        self.section(
            "graphs",
            "Drawings",
            "<nav><a href=\"#contents\">contents</a></nav>",
        );
        for func in &module.functions {
            let _ = writeln!(self.out, "<h3>@{}</h3>", escape(func.name()));
            let size = func.walk_insts().len();
            if size > MAX_DRAWN {
                // Graphviz's layout time grows faster than the graph: 10,000 instructions took
                // it seconds, 100,000 more than a quarter of an hour.
                let _ = writeln!(
                    self.out,
                    "<p>{size} instructions: not drawn (drawings have at most {MAX_DRAWN}; \
                     <code>kiln dot</code> writes the graph for another viewer).</p>"
                );
                continue;
            }
            match render_svg(&crate::dot::function_to_dot(func)) {
                Some(svg) => {
                    // The SVG as `dot` writes it, without its XML prologue.
                    let start = svg.find("<svg").unwrap_or(0);
                    self.out += &svg[start..];
                }
                None => {
                    self.out += "<p>Graphviz (<code>dot</code>) is not installed: no drawing.</p>\n"
                }
            }
        }
        self.out += "</section>\n";
    }

    fn finish(&mut self) {
        self.out += SELF_CHECK;
        self.out += "\n</body></html>\n";
    }
}

/// Runs `executable` (profiling) once to warm up, then `options.runs` times, on random
/// arguments; why not, if it cannot.
fn profile(
    module: &Module,
    executable: &Executable,
    state: &StateStore,
    options: &Options,
) -> Result<(), String> {
    let func = executable.function();
    let args = (func.args().iter().enumerate())
        .map(|(i, &a)| random_value(func.value_type(a), &options.sizes, i as u64).map(Arc::new))
        .collect::<Result<Vec<_>, String>>()?;
    let interp = Interpreter::new(module);
    for run in 0..options.runs.max(1) + 1 {
        let mut state = state.clone();
        (executable.run(args.clone(), &mut state, &interp, false))
            .map_err(|e| format!("the run failed: {e}"))?;
        if run == 0 {
            executable.clear_profile();
        }
    }
    Ok(())
}

/// The most instructions a function may have for the report to draw it.
const MAX_DRAWN: usize = 2000;

/// `dot -Tsvg` of `source`, or `None` when Graphviz is missing or fails.
fn render_svg(source: &str) -> Option<String> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(source.as_bytes()).ok()?;
    let output = child.wait_with_output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}
