//! ARCHITECTURE.md maps every source file: each file under a crate's sources (and the Python
//! package's) is named in its crate's section, and each file a table row names exists. A file
//! added without its row fails here.
//!
//! A file is named by its path from its crate's `src/` or from the crate's folder
//! (`interp/mod.rs`, `src/import.rs`), or by its base name in a section that also names its
//! folder (a row for `data/` listing `idx.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each crate's folder, the heading that starts its section, and the source folders mapped.
const CRATES: &[(&str, &str, &[&str])] = &[
    ("ir", "## `ir/`", &["src"]),
    ("backend", "## `backend/`", &["src"]),
    ("passes", "## `passes/`", &["src"]),
    ("runtime", "## `runtime/`", &["src"]),
    ("onnx", "## `onnx/`", &["src"]),
    (".", "## The root crate", &["src"]),
    ("python", "## `python/`", &["src", "kiln"]),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The section of ARCHITECTURE.md that starts at `heading`, up to the next `## `.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no section `{heading}`"));
    let rest = &text[start + heading.len()..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

/// The backticked words of `text`.
fn code_spans(text: &str) -> BTreeSet<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Every `.rs` and `.py` file under `dir`, as a path from `base`.
fn sources(base: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "__pycache__") {
                sources(base, &path, out);
            }
        } else if path
            .extension()
            .is_some_and(|e| e == "rs" || e == "py" || e == "pyi")
        {
            let relative = path.strip_prefix(base).expect("under base");
            out.push(relative.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// Whether `file` (a path from the crate's folder) is named among `spans`.
fn named(file: &str, spans: &BTreeSet<&str>) -> bool {
    let from_src = file.strip_prefix("src/").unwrap_or(file);
    let (folder, base) = match from_src.rsplit_once('/') {
        Some((folder, base)) => (Some(folder), base),
        None => (None, from_src),
    };
    let folder_named = |folder: &str| {
        let with_slash = format!("{folder}/");
        let from_crate = format!("src/{with_slash}");
        (spans.iter()).any(|s| s.starts_with(&with_slash) || s.starts_with(&from_crate))
    };
    spans.contains(file)
        || spans.contains(from_src)
        || (spans.contains(base) && folder.is_none_or(folder_named))
}

#[test]
fn every_source_file_has_its_row_in_architecture_md() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for &(dir, heading, folders) in CRATES {
        let spans = code_spans(section(&text, heading));
        let crate_dir = root().join(dir);
        let mut files = Vec::new();
        for folder in folders {
            sources(&crate_dir, &crate_dir.join(folder), &mut files);
        }
        assert!(!files.is_empty(), "no sources found under {dir}");
        missing.extend(
            (files.into_iter())
                .filter(|f| !named(f, &spans))
                .map(|f| format!("{dir}/{f}")),
        );
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name these files in their crate's section:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn every_file_a_row_names_exists() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut absent = Vec::new();
    for &(dir, heading, folders) in CRATES {
        let crate_dir = root().join(dir);
        let exists = |path: &str| {
            crate_dir.join(path).exists()
                || folders
                    .iter()
                    .any(|f| crate_dir.join(f).join(path).exists())
        };
        for row in section(&text, heading).lines() {
            let Some(first_cell) = row.strip_prefix("| ").and_then(|r| r.split(" | ").next())
            else {
                continue;
            };
            let spans = code_spans(first_cell);
            for &span in &spans {
                let is_file = span.ends_with(".rs") || span.ends_with(".py") || span.ends_with('/');
                // A row's later names may be siblings of its first (`simplify/extract.rs`,
                // `simplify/mod.rs`; `init.py`, `optim.py` beside `kiln/init.py`).
                let sibling_exists = || {
                    (spans.iter()).any(|first| {
                        (first.rsplit_once('/'))
                            .is_some_and(|(folder, _)| exists(&format!("{folder}/{span}")))
                    })
                };
                if is_file && !exists(span) && !sibling_exists() {
                    absent.push(format!("{dir}: `{span}`"));
                }
            }
        }
    }
    assert!(
        absent.is_empty(),
        "ARCHITECTURE.md names files that do not exist:\n  {}",
        absent.join("\n  ")
    );
}
