//! Hostile inputs, each of which crashed Kiln, aborted it, ran without end or gave a wrong
//! answer before: the `kiln` tool must now give the right answer or an error that says what
//! was refused, on the compiled path and in the interpreter alike.

mod common;

use common::kiln;

use kiln::backend::Array;
use kiln::ir::DType;
use std::path::{Path, PathBuf};
use std::process::Output;

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// A scratch folder for this test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-hostile-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A `.npy` file written by hand: a version 1 header (`descr`, order, shape) and `data`.
fn write_npy_raw(path: &Path, descr: &str, fortran: bool, shape: &[u64], data: &[u8]) {
    let dims: String = shape.iter().map(|n| format!("{n},")).collect();
    let order = if fortran { "True" } else { "False" };
    std::fs::write(path, kiln::fuzz::raw_npy(descr, order, &dims, data)).unwrap();
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Runs `args` compiled and with `--interpret`; both must succeed with the same output.
fn same_both_ways(args: &[&str]) -> String {
    let compiled = kiln(args);
    let interpreted = kiln(&[args, &["--interpret"]].concat());
    assert!(compiled.status.success(), "{args:?}: {}", text(&compiled));
    assert!(
        interpreted.status.success(),
        "{args:?}: {}",
        text(&interpreted)
    );
    assert_eq!(text(&compiled), text(&interpreted), "{args:?}");
    text(&compiled)
}

/// Runs `args` compiled and with `--interpret`; both must fail with `expected` in the message.
fn refused_both_ways(args: &[&str], expected: &str) {
    for backend in [&[][..], &["--interpret"]] {
        let out = kiln(&[args, backend].concat());
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?} {backend:?}: {}",
            text(&out)
        );
        assert!(
            text(&out).contains(expected),
            "{args:?} {backend:?}: {}",
            text(&out)
        );
    }
}

#[test]
fn a_constant_larger_than_the_limit_is_refused_before_it_is_made() {
    // The compiled path made it while planning, and aborted on the allocation.
    refused_both_ways(
        &[
            "run",
            "tests/runtime_limits/constant_returned_past_memory.kir",
            "--memory-limit",
            "512M",
        ],
        "%c in @f: f32[100000,100000], 40000000000 bytes, more than the memory limit",
    );
}

#[test]
fn values_live_at_once_past_the_limit_are_refused_by_the_interpreter() {
    let program = "tests/runtime_limits/constants_live_past_memory.kir";
    let limit = ["--memory-limit", "32M"];
    let out = kiln(&[&["run", program, "--interpret"][..], &limit].concat());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(
            "@f: the values live at once at `%s1 = add %c0, %c1 : f32[1000000]`: 13 values \
             together, 52000000 bytes, more than the memory limit"
        ),
        "{}",
        text(&out)
    );
    // Compiled, the constants are folded into one kernel, which needs one buffer.
    let out = kiln(&[&["run", program][..], &limit].concat());
    assert!(
        out.status.success() && text(&out).contains("78000000"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_convolution_whose_scratch_space_passes_the_limit_is_refused() {
    // The patch matrix is built a run of 16 positions at a time (one sample's would be
    // 1001² × 500² elements); the table of every position's taps (4 bytes each) is what
    // passes the limit now.
    let dir = scratch("conv");
    let (x, w) = (dir.join("x.npy"), dir.join("w.npy"));
    write_npy_raw(&x, "<f4", false, &[1, 1, 1000, 1000], &[0; 4_000_000]);
    write_npy_raw(&w, "<f4", false, &[1, 1, 500, 500], &[0; 1_000_000]);
    let out = kiln(&[
        "run",
        "tests/runtime_limits/conv_scratch_past_memory.kir",
        "--feed",
        &format!("x={}", x.display()),
        "--feed",
        &format!("w={}", w.display()),
        "--memory-limit",
        "4G",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("the scratch space of %y = conv2d")
            && text(&out).contains("f32[16,250000], 1002024000064 bytes"),
        "{}",
        text(&out)
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn pooling_an_empty_padded_input_gives_the_interpreters_answer() {
    // Compiled max and average pooling divided by the empty input's plane size.
    let dir = scratch("pool");
    let x = dir.join("x.npy");
    write_npy_raw(&x, "<f4", false, &[1, 1, 0, 0], &[]);
    let program = dir.join("pool.kir");
    std::fs::write(
        &program,
        "module {
  func @f(%x: f32[1,1,0,0]) -> (f32[1,1,2,2], f32[1,1,2,2]) {
    %m = max_pool2d %x {window=[3,3], strides=[1,1], padding=[(2,2),(2,2)]} : f32[1,1,2,2]
    %a = avg_pool2d %x {window=[3,3], strides=[1,1], padding=[(2,2),(2,2)]} : f32[1,1,2,2]
    return %m, %a
  }
}",
    )
    .unwrap();
    let out = same_both_ways(&[
        "run",
        program.to_str().unwrap(),
        "--feed",
        &format!("x={}", x.display()),
    ]);
    assert!(
        out.contains("[[[[-inf, -inf],\n   [-inf, -inf]]]]"),
        "{out}"
    );
    assert!(out.contains("[[[[0, 0],\n   [0, 0]]]]"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn average_pooling_divides_by_the_whole_window_however_large() {
    // The window's area overflowed: 2^32 · 2^32 wrapped to 0, giving NaN (debug: a panic).
    let dir = scratch("avg");
    let program = dir.join("avg.kir");
    std::fs::write(
        &program,
        "module {
  func @f(%x: f32[1,1,1,1]) -> f32[1,1,1,1] {
    %y = avg_pool2d %x {window=[4294967296,4294967296], strides=[8589934592,8589934592], padding=[(4294967295,0),(4294967295,0)]} : f32[1,1,1,1]
    return %y
  }
}",
    )
    .unwrap();
    let out = same_both_ways(&["run", program.to_str().unwrap(), "--feed", "x=[[[[2]]]]"]);
    // 2 / 2^64 in f32.
    assert!(
        out.contains("[[[[0.00000000000000000010842022]]]]"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fortran_ordered_npy_feeds_are_read_as_their_shape_says() {
    // Compiled kernels read a Fortran-ordered array in memory order: wrong values for `neg`,
    // `add`, `matmul` and `reduce_sum`, and a panic in `reshape`.
    let dir = scratch("fortran");
    let x = dir.join("x.npy");
    // [[1, 2, 3], [4, 5, 6]], stored column by column.
    write_npy_raw(
        &x,
        "<f4",
        true,
        &[2, 3],
        &f32_bytes(&[1., 4., 2., 5., 3., 6.]),
    );
    let program = dir.join("f.kir");
    std::fs::write(
        &program,
        "module {
  func @f(%x: f32[2,3]) -> (f32[2,3], f32[2], f32[6], f32[2,2]) {
    %n = neg %x : f32[2,3]
    %s = reduce_sum %x {axes=[1]} : f32[2]
    %r = reshape %x : f32[6]
    %p = matmul %x, %x {transpose_b=true} : f32[2,2]
    return %n, %s, %r, %p
  }
}",
    )
    .unwrap();
    let out = same_both_ways(&[
        "run",
        program.to_str().unwrap(),
        "--feed",
        &format!("x={}", x.display()),
    ]);
    for expected in [
        "[[-1, -2, -3],\n [-4, -5, -6]]",
        "[6, 15]",
        "[1, 2, 3, 4, 5, 6]",
        "[[14, 32],\n [32, 77]]",
    ] {
        assert!(out.contains(expected), "no {expected:?} in\n{out}");
    }
    let read = kiln::npy::read_npy(&x, DType::F32).unwrap();
    assert!(read.is_standard_layout());
    assert_eq!(read.to_f64_vec(), [1., 2., 3., 4., 5., 6.]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn npy_headers_that_claim_more_than_the_file_holds_are_errors() {
    // The reader allocated 4 TiB for this header before reading any data, and aborted.
    let dir = scratch("npy");
    let huge = dir.join("huge.npy");
    write_npy_raw(&huge, "<f4", false, &[1 << 20, 1 << 20], &[0; 64]);
    let err = kiln::npy::read_npy(&huge, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("shape [1048576, 1048576] of '<f4' (4398046511104 bytes of data), but 64 bytes follow the header"),
        "{err}"
    );
    let short = dir.join("short.npy");
    write_npy_raw(&short, "<f4", false, &[3], &f32_bytes(&[1., 2.]));
    let err = kiln::npy::read_npy(&short, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("(12 bytes of data), but 8 bytes follow"),
        "{err}"
    );
    let overflowing = dir.join("overflowing.npy");
    write_npy_raw(&overflowing, "<f8", false, &[u64::MAX, u64::MAX], &[]);
    assert!(kiln::npy::read_npy(&overflowing, DType::F64).is_err());
    // No data and no elements, but a shape no array can have: ndarray's reader panicked.
    let empty_overflowing = dir.join("empty_overflowing.npy");
    write_npy_raw(
        &empty_overflowing,
        "<f4",
        false,
        &[0, 1 << 62, 1 << 62],
        &[],
    );
    let err = kiln::npy::read_npy(&empty_overflowing, DType::F32).unwrap_err();
    assert!(
        err.to_string().contains("more than memory can address"),
        "{err}"
    );
    // Within the file, but past the memory limit: refused by the limit (set for the tool).
    let out = kiln(&[
        "run",
        "tests/programs/mlp.kir",
        "--feed",
        &format!("x={}", huge.display()),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn inline_integer_feeds_are_exact() {
    // 2^53 + 1 was read through an f64 and came back as 2^53.
    let dir = scratch("ints");
    let program = dir.join("i.kir");
    std::fs::write(
        &program,
        "module {
  func @f(%x: i64[2]) -> i64[2] {
    %one = const 1 : i64[2]
    %y = add %x, %one : i64[2]
    return %y
  }
}",
    )
    .unwrap();
    let out = same_both_ways(&[
        "run",
        program.to_str().unwrap(),
        "--feed",
        "x=[9007199254740993, -9223372036854775808]",
    ]);
    assert!(
        out.contains("[9007199254740994, -9223372036854775807]"),
        "{out}"
    );
    let too_big = kiln(&[
        "run",
        program.to_str().unwrap(),
        "--feed",
        "x=[9223372036854775808, 0]",
    ]);
    assert_eq!(too_big.status.code(), Some(1), "{}", text(&too_big));
    assert!(text(&too_big).contains("out of range") || text(&too_big).contains("not an integer"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn max_trips_allows_exactly_that_many_trips_in_all_of_a_runs_loops() {
    let dir = scratch("trips");
    let counted = dir.join("counted.kir");
    std::fs::write(
        &counted,
        "module {
  func @f(%x: f32[]) -> f32[] {
    %r = while %x : f32[] cond(%a: f32[]) {
      %three = const 3.0 : f32[]
      %t = lt %a, %three : bool[]
      yield %t
    } body(%b: f32[]) {
      %one = const 1.0 : f32[]
      %e = add %b, %one : f32[]
      yield %e
    }
    return %r
  }
}",
    )
    .unwrap();
    let counted = counted.to_str().unwrap();
    // Three trips under a limit of three: before, the third was refused.
    let out = same_both_ways(&["run", counted, "--feed", "x=0", "--max-trips", "3"]);
    assert!(out.contains("result 0 (%r): f32[]\n3\n"), "{out}");
    refused_both_ways(
        &["run", counted, "--feed", "x=0", "--max-trips", "2"],
        "the loop did not end within 2 trips",
    );
    // Nested loops: each loop was counted on its own, so 30 trips of a loop of 30 trips ran
    // under a limit of 100 (and 64 nested loops were never stopped). The run's trips are
    // counted together now: 930 trips in all pass a limit of 100, or of 929. (The inner loop
    // starts from the outer one's value and its result is used, so no pass can hoist it out
    // or remove it.)
    let nested = dir.join("nested.kir");
    std::fs::write(
        &nested,
        "module {
  func @f(%x: f32[]) -> f32[] {
    %r = while %x : f32[] cond(%a: f32[]) {
      %thirty = const 30.0 : f32[]
      %t = lt %a, %thirty : bool[]
      yield %t
    } body(%b: f32[]) {
      %thirty2 = const 30.0 : f32[]
      %end = add %b, %thirty2 : f32[]
      %r2 = while %b : f32[] cond(%c: f32[]) {
        %lt = lt %c, %end : bool[]
        yield %lt
      } body(%d: f32[]) {
        %one = const 1.0 : f32[]
        %e = add %d, %one : f32[]
        yield %e
      }
      %back = const 29.0 : f32[]
      %next = sub %r2, %back : f32[]
      yield %next
    }
    return %r
  }
}",
    )
    .unwrap();
    let nested = nested.to_str().unwrap();
    for limit in ["100", "929"] {
        refused_both_ways(
            &["run", nested, "--feed", "x=0", "--max-trips", limit],
            &format!("the loop did not end within {limit} trips (the run's loops together"),
        );
    }
    let out = same_both_ways(&["run", nested, "--feed", "x=0", "--max-trips", "930"]);
    assert!(out.contains("result 0 (%r): f32[]\n30\n"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_reduction_over_an_empty_array_does_not_walk_its_other_axes() {
    // `[0, 2^40]` reduced over its second axis took 2^40 steps in the interpreter.
    let dir = scratch("empty");
    let x = dir.join("x.npy");
    write_npy_raw(&x, "<f4", false, &[0, 1 << 40], &[]);
    let program = dir.join("r.kir");
    std::fs::write(
        &program,
        "module {
  func @f(%x: f32[0,N]) -> (f32[0], f32[N]) {
    %s = reduce_sum %x {axes=[1]} : f32[0]
    %t = reduce_sum %x {axes=[0]} : f32[N]
    return %s, %t
  }
}",
    )
    .unwrap();
    // The second result has 2^40 elements: refused by the memory limit, before any work.
    refused_both_ways(
        &[
            "run",
            program.to_str().unwrap(),
            "--feed",
            &format!("x={}", x.display()),
        ],
        "%t in @f: f32[N], 4398046511104 bytes",
    );
    let reduced = kiln::backend::interp::kernels::reduce(
        kiln::ir::ReduceOp::Sum,
        &Array::zeros(DType::F32, &[0, 1 << 40]),
        &[1],
        false,
    )
    .unwrap();
    assert_eq!(reduced.shape(), &[0]);
    let kept = kiln::backend::interp::kernels::reduce(
        kiln::ir::ReduceOp::Mean,
        &Array::zeros(DType::F32, &[0, 3]),
        &[0],
        true,
    )
    .unwrap();
    assert_eq!(kept.shape(), &[1, 3]);
    assert!(
        kept.to_f64_vec().iter().all(|v| v.is_nan()),
        "the mean of nothing"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn stats_of_a_huge_binding_saturate_instead_of_wrapping() {
    let out = kiln(&[
        "stats",
        "tests/programs/mlp.kir",
        "--bind",
        "N=18446744073709551615",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("TiB"), "{}", text(&out));
}

#[test]
fn the_interpreters_loop_gradient_updates_its_stacks_in_place() {
    // Each trip of the forward loop copied its stack of states ([T+1, 256] here): O(T²)
    // work, hours at this size. In place, this runs in about a second. (No time is asserted:
    // a regression shows as a test that does not finish.)
    let trips = 20_000;
    let program = format!(
        "module {{
  func @f(%x: f32[256]) -> f32[] {{
    %zero = const 0 : i32[]
    %n = const {trips} : i32[]
    %i_end, %r = while %zero, %x : i32[], f32[256] cond(%i: i32[], %a: f32[256]) {{
      %t = lt %i, %n : bool[]
      yield %t
    }} body(%j: i32[], %b: f32[256]) {{
      %s = sin %b : f32[256]
      %one = const 1 : i32[]
      %k = add %j, %one : i32[]
      yield %k, %s
    }}
    %l = reduce_sum %r {{axes=[0]}} : f32[]
    return %l
  }}
}}"
    );
    let module = kiln::ir::parse_and_verify(&program).unwrap();
    let wrt = [kiln::passes::Wrt::Arg("x".into())];
    let grad = kiln::passes::gradient_function(&module, &module.functions[0], 0, &wrt).unwrap();
    let stacks = grad.walk_insts().into_iter();
    let updates = stacks
        .filter(|&i| matches!(grad.inst(i).op, kiln::ir::Op::UpdateSlice { .. }))
        .count();
    assert!(updates >= 1, "the gradient keeps its states in stacks");
    let x = Array::F32(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[256]), 0.5));
    let grad_module = kiln::ir::Module {
        states: vec![],
        functions: vec![grad.clone()],
    };
    let mut state = kiln::backend::StateStore::new();
    let results = kiln::backend::Interpreter::new(&grad_module)
        .run_function(&grad, vec![x], &mut state)
        .unwrap();
    // d/dx of sin applied T times, at 0.5: the product of cos over the orbit.
    let mut v = 0.5f64;
    let mut d = 1.0f64;
    for _ in 0..trips {
        d *= v.cos();
        v = v.sin();
    }
    let g = results[1].to_f64_vec();
    assert!((g[0] - d).abs() <= 1e-3 * d.abs(), "{} vs {d}", g[0]);
}
