//! Graphs far deeper and wider than any model: a chain of elementwise ops one after another
//! and one value read by as many ops, summed. Every command must finish with the right answer
//! or a clear error — a stack overflow aborts the process, which these tests would see as a
//! signal instead of an exit code.

mod common;

use common::kiln;
use std::path::{Path, PathBuf};
use std::process::Output;

/// Ops in each graph: deep enough that one stack frame per op overflowed the main thread's
/// 8 MiB in a debug build: 20,000 overflowed compiled runs and `kiln report`, and `kiln diff`
/// ran for more than ten minutes.
const OPS: usize = 20_000;

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

fn write(name: &str, source: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-deep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, source).unwrap();
    path
}

/// `neg(abs(neg(abs(… x))))`, summed: each pair makes every element `-|x|`.
fn chain(ops: usize) -> String {
    let mut s = String::from("module {\n  func @f(%x: f32[2,3]) -> f32[] {\n");
    let mut prev = "%x".to_string();
    for i in 0..ops {
        let op = if i.is_multiple_of(2) { "abs" } else { "neg" };
        s += &format!("    %t{i} = {op} {prev} : f32[2,3]\n");
        prev = format!("%t{i}");
    }
    s += &format!(
        "    %y = reduce_sum {prev} {{axes=[0, 1], keep_dims=false}} : f32[]\n    return %y\n  }}\n}}\n"
    );
    s
}

/// `ops` values each computed from `%x`, added together in one long sum.
fn wide(ops: usize) -> String {
    let mut s = String::from("module {\n  func @f(%x: f32[2,3]) -> f32[] {\n");
    for i in 0..ops {
        s += &format!("    %w{i} = abs %x : f32[2,3]\n");
    }
    s += "    %s0 = add %w0, %w1 : f32[2,3]\n";
    for i in 2..ops {
        s += &format!("    %s{} = add %s{}, %w{i} : f32[2,3]\n", i - 1, i - 2);
    }
    let last = ops - 2;
    s += &format!(
        "    %y = reduce_sum %s{last} {{axes=[0, 1], keep_dims=false}} : f32[]\n    return %y\n  }}\n}}\n"
    );
    s
}

const FEED: &str = "x=[[1,-2,3],[-4,5,-6]]";

/// Every command that reads a program, on `path`; the runs must print `expected`.
fn every_command(path: &Path, expected: &str) {
    let p = path.to_str().unwrap();
    let report = path.with_extension("html");
    let commands: Vec<Vec<&str>> = vec![
        vec!["check", p],
        vec!["dump", p],
        vec!["stats", p],
        vec!["opt", p, "--explain"],
        vec!["grad", p, "--wrt", "x"],
        vec!["dot", p],
        vec!["diff", p, "--feed", FEED],
        vec!["report", p, "-o", report.to_str().unwrap(), "--runs", "1"],
    ];
    for args in commands {
        let out = kiln(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
    }
    for backend in [&[][..], &["--interpret"]] {
        let out = kiln(&[&["run", p, "--feed", FEED][..], backend].concat());
        assert_eq!(
            out.status.code(),
            Some(0),
            "run {backend:?}: {}",
            text(&out)
        );
        assert!(
            text(&out).contains(expected),
            "run {backend:?}: {}",
            text(&out)
        );
    }
}

#[test]
fn a_chain_of_twenty_thousand_ops_goes_through_every_command() {
    // abs then neg, 10,000 times: every element ends as -|x|, summing to -21.
    every_command(&write("chain.kir", &chain(OPS)), "-21");
}

#[test]
fn twenty_thousand_reads_of_one_value_go_through_every_command() {
    // 20,000 copies of |x| summed: 21 · 20,000.
    every_command(&write("wide.kir", &wide(OPS)), "420000");
}

#[test]
fn fusion_cuts_a_long_chain_into_kernels_no_deeper_than_the_limit_and_says_why() {
    let ops: usize = 300;
    let mut s = String::from("module {\n  func @f(%x: f32[2,3]) -> f32[2,3] {\n");
    for i in 0..ops {
        let arg = if i == 0 {
            "%x".to_string()
        } else {
            format!("%t{}", i - 1)
        };
        s += &format!("    %t{i} = abs {arg} : f32[2,3]\n");
    }
    s += &format!("    return %t{}\n  }}\n}}\n", ops - 1);
    let path = write("chain300.kir", &s);
    let out = kiln(&[
        "opt",
        path.to_str().unwrap(),
        "--passes",
        "fuse",
        "--explain",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let printed = text(&out);
    let kernels = printed.lines().filter(|l| l.contains(" = fused ")).count();
    let limit = kiln::passes::MAX_KERNEL_DEPTH;
    assert_eq!(kernels, ops.div_ceil(limit), "{printed}");
    let cut = format!("it would make a chain of more than {limit} ops");
    assert_eq!(printed.matches(&cut).count(), kernels - 1, "{printed}");
    let out = kiln(&["run", path.to_str().unwrap(), "--feed", FEED]);
    let printed: String = text(&out).split_whitespace().collect();
    assert!(printed.contains("[[1,2,3],[4,5,6]]"), "{printed}");
}
