//! The book (`docs/`): every link between its pages reaches a page and a heading; every
//! `console` sample's `kiln` command prints what the book shows; every page is in the summary
//! and among the pages whose Rust samples run as doc-tests (`src/lib.rs`). mdBook itself
//! builds the book in CI; these checks need only cargo.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every page of the book, as (path relative to `docs/src`, text).
fn pages() -> Vec<(String, String)> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                let name = path
                    .strip_prefix(base)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                out.push((name, with_includes(&path)));
            }
        }
    }
    let base = root().join("docs/src");
    let mut out = Vec::new();
    walk(&base, &base, &mut out);
    out
}

/// The page's text with each `{{#include FILE}}` line replaced by the file, as mdBook does.
fn with_includes(page: &Path) -> String {
    let text = std::fs::read_to_string(page).unwrap();
    (text.lines())
        .map(|line| {
            match line
                .trim()
                .strip_prefix("{{#include ")
                .and_then(|l| l.strip_suffix("}}"))
            {
                Some(file) => std::fs::read_to_string(page.parent().unwrap().join(file.trim()))
                    .unwrap_or_else(|e| panic!("{}: {{{{#include {file}}}}}: {e}", page.display())),
                None => format!("{line}\n"),
            }
        })
        .collect()
}

/// The page's text outside fenced code blocks, and its fenced blocks as (info, body).
fn split_code(text: &str) -> (String, Vec<(String, String)>) {
    let (mut prose, mut blocks) = (String::new(), Vec::new());
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        match (&mut open, line.trim_start().strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), String::new())),
            (Some(_), Some(_)) => blocks.push(open.take().unwrap()),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    (prose, blocks)
}

/// The ids mdBook gives a page's headings: lower case, spaces as dashes, only letters,
/// digits, `-` and `_` kept.
fn heading_ids(text: &str) -> Vec<String> {
    let (prose, _) = split_code(text);
    (prose.lines())
        .filter_map(|l| {
            l.strip_prefix('#')
                .map(|h| h.trim_start_matches('#').trim())
        })
        .map(|h| {
            (h.chars())
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => {
                        Some(c.to_ascii_lowercase())
                    }
                    _ => None,
                })
                .collect()
        })
        .collect()
}

/// The targets of the Markdown links in `prose` (`[text](target)`), inline code left out.
fn link_targets(prose: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose.lines() {
        let line: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    targets
}

#[test]
fn every_link_reaches_a_page_and_a_heading() {
    let pages = pages();
    let mut broken = Vec::new();
    for (name, text) in &pages {
        let (prose, _) = split_code(text);
        for target in link_targets(&prose) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f.to_owned(), Some(a.to_owned())),
                None => (target.clone(), None),
            };
            let dir = Path::new(name).parent().unwrap_or(Path::new(""));
            let resolved = if file.is_empty() {
                name.clone()
            } else {
                normalise(&dir.join(&file))
            };
            let Some((_, page)) = pages.iter().find(|(n, _)| *n == resolved) else {
                broken.push(format!("{name}: `{target}`: no page {resolved}"));
                continue;
            };
            if let Some(anchor) = anchor
                && !heading_ids(page).contains(&anchor)
            {
                broken.push(format!(
                    "{name}: `{target}`: no heading #{anchor} in {resolved}"
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The README's links reach files of the repository (and headings, in Markdown files).
#[test]
fn the_readme_links_reach_files_and_headings() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let (prose, _) = split_code(&readme);
    let mut broken = Vec::new();
    for target in link_targets(&prose) {
        if target.contains("://") {
            continue;
        }
        let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let path = root().join(file);
        if !path.exists() {
            broken.push(format!("`{target}`: no file {file}"));
        } else if !anchor.is_empty()
            && !heading_ids(&with_includes(&path))
                .iter()
                .any(|h| h == anchor)
        {
            broken.push(format!("`{target}`: no heading #{anchor} in {file}"));
        }
    }
    assert!(broken.is_empty(), "README links:\n{}", broken.join("\n"));
    assert!(
        readme.lines().count() < 150,
        "the README fits on a screen or two"
    );
}

/// `a/b/../c.md` as `a/c.md`.
fn normalise(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    parts.join("/")
}

#[test]
fn every_page_is_in_the_summary_and_its_rust_samples_run() {
    let summary = std::fs::read_to_string(root().join("docs/src/SUMMARY.md")).unwrap();
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    for (name, text) in pages() {
        if name == "SUMMARY.md" {
            continue;
        }
        assert!(
            summary.contains(&format!("]({name})")),
            "{name} is not in SUMMARY.md"
        );
        let (_, blocks) = split_code(&text);
        let runs_rust = blocks
            .iter()
            .any(|(info, _)| info == "rust" || info.is_empty());
        if runs_rust {
            assert!(
                lib.contains(&format!("\"{name}\"")),
                "{name} has Rust samples but is not among the doc-tested chapters of src/lib.rs"
            );
        }
    }
}

/// Each `console` block: lines `$ kiln …` are run (from the repository's root) and what they
/// print, stdout then stderr, must be the lines that follow; a line `...` stands for any
/// output.
#[test]
fn console_samples_print_what_the_book_shows() {
    let mut checked = 0;
    for (name, text) in pages() {
        for (info, body) in split_code(&text).1 {
            if info != "console" {
                continue;
            }
            let mut lines = body.lines().peekable();
            while let Some(line) = lines.next() {
                let command = line.strip_prefix("$ ").unwrap_or_else(|| {
                    panic!("{name}: a console block's commands start with `$ `: {line}")
                });
                let mut expected = Vec::new();
                while let Some(next) = lines.next_if(|l| !l.starts_with("$ ")) {
                    expected.push(next);
                }
                let args = command
                    .strip_prefix("kiln ")
                    .unwrap_or_else(|| panic!("{name}: only `kiln` commands are run: {command}"));
                let output = Command::new("sh")
                    .arg("-c")
                    .arg(format!("\"$KILN\" {args}"))
                    .env("KILN", env!("CARGO_BIN_EXE_kiln"))
                    .current_dir(root())
                    .output()
                    .unwrap();
                let printed = format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
                if expected == ["..."] {
                    assert!(
                        output.status.success(),
                        "{name}: `{command}` failed:\n{printed}"
                    );
                } else {
                    let got: Vec<&str> = printed.lines().map(str::trim_end).collect();
                    let want: Vec<&str> = expected.iter().map(|l| l.trim_end()).collect();
                    assert_eq!(got, want, "{name}: `{command}`");
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "only {checked} console samples");
}
