//! The classic passes and fusion, written as `check(passes, input, expected)`: IR text in,
//! IR text out.

mod common;

use kiln_ir::parse_and_verify;
use kiln_passes::PassManager;

#[track_caller]
fn check(passes: &[&str], input: &str, expected: &str) {
    let got = common::optimised(input, passes).to_string();
    let want = parse_and_verify(expected)
        .unwrap_or_else(|e| panic!("expected text: {}", e.render(expected)));
    assert_eq!(got, want.to_string(), "\ngot:\n{got}\nwant:\n{want}");
}

#[test]
fn dce_removes_unused_pure_ops_and_keeps_stores_and_calls() {
    check(
        &["dce"],
        r#"module {
  state @w : f32[2] = constant(value=0.0)
  func @f(%x: f32[2], %p: bool[]) -> f32[2] {
    %dead = exp %x : f32[2]
    %also_dead = cond %p : f32[2] then {
      %n = neg %x : f32[2]
      yield %n
    } else {
      yield %x
    }
    %t = tanh %x : f32[2]
    store @w, %t
    %c = call @side_effect, %x : f32[2]
    %y = mul %x, %x : f32[2]
    return %y
  }
}"#,
        r#"module {
  state @w : f32[2] = constant(value=0.0)
  func @f(%x: f32[2], %p: bool[]) -> f32[2] {
    %t = tanh %x : f32[2]
    store @w, %t
    %c = call @side_effect, %x : f32[2]
    %y = mul %x, %x : f32[2]
    return %y
  }
}"#,
    );
}

#[test]
fn cse_gives_a_merged_name_to_an_unnamed_survivor() {
    check(
        &["cse", "dce"],
        r#"module {
  func @f(%x: f32[2]) -> f32[2] {
    %0 = exp %x : f32[2]
    %total = exp %x : f32[2]
    %named = neg %x : f32[2]
    %kept = neg %x : f32[2]
    %s = add %0, %total : f32[2]
    %t = add %named, %kept : f32[2]
    %out = add %s, %t : f32[2]
    return %out
  }
}"#,
        r#"module {
  func @f(%x: f32[2]) -> f32[2] {
    %total = exp %x : f32[2]
    %named = neg %x : f32[2]
    %s = add %total, %total : f32[2]
    %t = add %named, %named : f32[2]
    %out = add %s, %t : f32[2]
    return %out
  }
}"#,
    );
}

#[test]
fn cse_merges_equal_ops_loads_and_draws_across_regions() {
    check(
        &["cse", "dce"],
        r#"module {
  state @w : f32[2] = constant(value=1.0)
  func @f(%x: f32[2], %p: bool[]) -> f32[2] {
    %a = exp %x : f32[2]
    %b = exp %x : f32[2]
    %w1 = load @w : f32[2]
    %w2 = load @w : f32[2]
    %r1 = random_normal {mean=0.0, std=1.0, seed=3} : f32[2]
    %r2 = random_normal {mean=0.0, std=1.0, seed=3} : f32[2]
    %s = add %a, %b : f32[2]
    %t = add %w1, %w2 : f32[2]
    %u = add %r1, %r2 : f32[2]
    %in = cond %p : f32[2] then {
      %again = exp %x : f32[2]
      yield %again
    } else {
      yield %x
    }
    %v = add %s, %t : f32[2]
    %z = add %v, %u : f32[2]
    %out = add %z, %in : f32[2]
    return %out
  }
}"#,
        r#"module {
  state @w : f32[2] = constant(value=1.0)
  func @f(%x: f32[2], %p: bool[]) -> f32[2] {
    %a = exp %x : f32[2]
    %w1 = load @w : f32[2]
    %r1 = random_normal {mean=0.0, std=1.0, seed=3} : f32[2]
    %s = add %a, %a : f32[2]
    %t = add %w1, %w1 : f32[2]
    %u = add %r1, %r1 : f32[2]
    %in = cond %p : f32[2] then {
      yield %a
    } else {
      yield %x
    }
    %v = add %s, %t : f32[2]
    %z = add %v, %u : f32[2]
    %out = add %z, %in : f32[2]
    return %out
  }
}"#,
    );
}

#[test]
fn fold_evaluates_constants_and_keeps_splats_splat() {
    check(
        &["fold", "dce"],
        r#"module {
  func @f(%x: f32[N,2]) -> (f32[N,2], f32[2]) {
    %one = const 1.0 : f32[]
    %two = add %one, %one : f32[]
    %spread = broadcast %two : f32[N,2]
    %y = mul %x, %spread : f32[N,2]
    %v = const [1.0, 4.0] : f32[2]
    %r = sqrt %v : f32[2]
    %n = neg %r : f32[2]
    return %y, %n
  }
}"#,
        r#"module {
  func @f(%x: f32[N,2]) -> (f32[N,2], f32[2]) {
    %spread = const 2.0 : f32[N,2]
    %y = mul %x, %spread : f32[N,2]
    %n = const [-1.0, -2.0] : f32[2]
    return %y, %n
  }
}"#,
    );
}

/// A folded value of one repeated element is a splat; a constant counting `0, 1, 2, …` is
/// the `iota` it is, and ops on an `iota` fold.
#[test]
fn fold_writes_splats_and_iotas_as_such() {
    check(
        &["fold", "dce"],
        r#"module {
  func @f(%x: i64[2,3]) -> (i64[2,3], i64[2,3], f32[2]) {
    %c = const [0, 1, 2] : i64[3]
    %b = broadcast %c : i64[2,3]
    %y = add %x, %b : i64[2,3]
    %i = iota {axis=0} : i64[2,3]
    %two = const 2 : i64[2,3]
    %d = mul %i, %two : i64[2,3]
    %z = add %x, %d : i64[2,3]
    %v = const [4.0, 4.0] : f32[2]
    %r = sqrt %v : f32[2]
    return %y, %z, %r
  }
}"#,
        r#"module {
  func @f(%x: i64[2,3]) -> (i64[2,3], i64[2,3], f32[2]) {
    %b = iota {axis=1} : i64[2,3]
    %y = add %x, %b : i64[2,3]
    %d = const [[0, 0, 0], [2, 2, 2]] : i64[2,3]
    %z = add %x, %d : i64[2,3]
    %r = const 2.0 : f32[2]
    return %y, %z, %r
  }
}"#,
    );
}

/// A broadcast of an `iota` that keeps its axis is the larger `iota`, of any size (symbolic
/// too); one that stretches the counted axis is not.
#[test]
fn fold_writes_a_broadcast_iota_as_the_larger_iota() {
    check(
        &["fold", "dce"],
        r#"module {
  func @f(%x: i64[N,3,2000]) -> (i64[N,3,2000], i64[4,3]) {
    %i = iota {axis=0} : i64[2000]
    %b = broadcast %i : i64[N,3,2000]
    %y = add %x, %b : i64[N,3,2000]
    %j = iota {axis=1} : i64[1,1]
    %s = broadcast %j : i64[4,3]
    return %y, %s
  }
}"#,
        r#"module {
  func @f(%x: i64[N,3,2000]) -> (i64[N,3,2000], i64[4,3]) {
    %b = iota {axis=2} : i64[N,3,2000]
    %y = add %x, %b : i64[N,3,2000]
    %s = const 0 : i64[4,3]
    return %y, %s
  }
}"#,
    );
}

/// Each constant (and `iota`) just before its first reader, one used only by the yield at
/// the end; a constant read inside a region before the region's instruction.
#[test]
fn place_constants_puts_each_constant_before_its_first_reader() {
    check(
        &["place_constants"],
        r#"module {
  func @f(%x: f32[3], %p: bool[]) -> (f32[3], f32[3]) {
    %one = const 1.0 : f32[3]
    %two = const 2.0 : f32[3]
    %unused = const 5.0 : f32[3]
    %e = exp %x : f32[3]
    %y = add %e, %one : f32[3]
    %c = cond %p : f32[3] then {
      %m = mul %y, %two : f32[3]
      yield %m
    } else {
      yield %y
    }
    return %c, %one
  }
}"#,
        r#"module {
  func @f(%x: f32[3], %p: bool[]) -> (f32[3], f32[3]) {
    %e = exp %x : f32[3]
    %one = const 1.0 : f32[3]
    %y = add %e, %one : f32[3]
    %two = const 2.0 : f32[3]
    %c = cond %p : f32[3] then {
      %m = mul %y, %two : f32[3]
      yield %m
    } else {
      yield %y
    }
    %unused = const 5.0 : f32[3]
    return %c, %one
  }
}"#,
    );
}

#[test]
fn canonicalize_collapses_layout_chains() {
    check(
        &["canonicalize", "dce"],
        r#"module {
  func @f(%x: f32[2,3,4]) -> (f32[24], f32[2,3,4], f32[4,2,3]) {
    %r1 = reshape %x : f32[6,4]
    %r2 = reshape %r1 : f32[24]
    %t1 = transpose %x {perm=[1, 2, 0]} : f32[3,4,2]
    %t2 = transpose %t1 {perm=[2, 0, 1]} : f32[2,3,4]
    %t3 = transpose %x {perm=[2, 0, 1]} : f32[4,2,3]
    %c = cast %t3 : f32[4,2,3]
    return %r2, %t2, %c
  }
}"#,
        r#"module {
  func @f(%x: f32[2,3,4]) -> (f32[24], f32[2,3,4], f32[4,2,3]) {
    %r2 = reshape %x : f32[24]
    %t3 = transpose %x {perm=[2, 0, 1]} : f32[4,2,3]
    return %r2, %x, %t3
  }
}"#,
    );
}

/// Softmax is one kernel: a reduction, elementwise ops over its broadcast, another
/// reduction, and the division.
#[test]
fn fusion_makes_softmax_one_kernel() {
    check(
        &["fuse"],
        r#"module {
  func @softmax(%x: f32[N,8]) -> f32[N,8] {
    %m = reduce_max %x {axes=[1], keep_dims=true} : f32[N,1]
    %mb = broadcast %m : f32[N,8]
    %z = sub %x, %mb : f32[N,8]
    %e = exp %z : f32[N,8]
    %s = reduce_sum %e {axes=[1], keep_dims=true} : f32[N,1]
    %sb = broadcast %s : f32[N,8]
    %p = div %e, %sb : f32[N,8]
    return %p
  }
}"#,
        r#"module {
  func @softmax(%x: f32[N,8]) -> f32[N,8] {
    %p = fused %x : f32[N,8] body(%0: f32[N,8]) {
      %m = reduce_max %0 {axes=[1], keep_dims=true} : f32[N,1]
      %1 = broadcast %m : f32[N,8]
      %z = sub %0, %1 : f32[N,8]
      %e = exp %z : f32[N,8]
      %s = reduce_sum %e {axes=[1], keep_dims=true} : f32[N,1]
      %2 = broadcast %s : f32[N,8]
      %3 = div %e, %2 : f32[N,8]
      yield %3
    }
    return %p
  }
}"#,
    );
}

/// A matmul is not fused; the bias add and activation after it are one kernel, and a value
/// used after the kernel (here by the second matmul and the output) leaves it as a second
/// result.
#[test]
fn fusion_stops_at_matmuls_and_yields_values_used_later() {
    check(
        &["fuse"],
        r#"module {
  func @mlp(%x: f32[N,4], %w1: f32[4,4], %b1: f32[4], %w2: f32[4,2]) -> (f32[N,2], f32[N,4]) {
    %h0 = matmul %x, %w1 : f32[N,4]
    %bb = broadcast %b1 : f32[N,4]
    %h1 = add %h0, %bb : f32[N,4]
    %h = relu %h1 : f32[N,4]
    %y = matmul %h, %w2 : f32[N,2]
    %t = tanh %y : f32[N,2]
    return %t, %h1
  }
}"#,
        r#"module {
  func @mlp(%x: f32[N,4], %w1: f32[4,4], %b1: f32[4], %w2: f32[4,2]) -> (f32[N,2], f32[N,4]) {
    %h0 = matmul %x, %w1 : f32[N,4]
    %h1, %h = fused %b1, %h0 : f32[N,4], f32[N,4] body(%0: f32[4], %1: f32[N,4]) {
      %2 = broadcast %0 : f32[N,4]
      %3 = add %1, %2 : f32[N,4]
      %4 = relu %3 : f32[N,4]
      yield %3, %4
    }
    %y = matmul %h, %w2 : f32[N,2]
    %t = fused %y : f32[N,2] body(%5: f32[N,2]) {
      %6 = tanh %5 : f32[N,2]
      yield %6
    }
    return %t, %h1
  }
}"#,
    );
}

/// A value with consumers in two different places is not merged into either (nor recomputed:
/// its other reader, a product, needs it in memory), and a broadcast is copied into every
/// kernel that uses it.
#[test]
fn fusion_yields_values_a_product_also_reads() {
    check(
        &["fuse"],
        r#"module {
  func @f(%x: f32[4], %w: f32[4,4]) -> (f32[4], f32[1,4]) {
    %e = exp %x : f32[4]
    %a = add %e, %e : f32[4]
    %row = reshape %e : f32[1,4]
    %m = matmul %row, %w : f32[1,4]
    return %a, %m
  }
}"#,
        r#"module {
  func @f(%x: f32[4], %w: f32[4,4]) -> (f32[4], f32[1,4]) {
    %e, %a = fused %x : f32[4], f32[4] body(%0: f32[4]) {
      %1 = exp %0 : f32[4]
      %2 = add %1, %1 : f32[4]
      yield %1, %2
    }
    %row = reshape %e : f32[1,4]
    %m = matmul %row, %w : f32[1,4]
    return %a, %m
  }
}"#,
    );
}

/// A mask computed from iotas alone and broadcast into a larger kernel gets a kernel of its
/// own (inside the consumer it would be recomputed for every copy); a splat-sized one, or one
/// of the consumer's own shape, is still fused.
#[test]
fn fusion_computes_an_input_free_broadcast_value_once() {
    check(
        &["fuse"],
        r#"module {
  func @f(%s: f32[2,3,3], %x: f32[N,3]) -> (f32[2,3,3], f32[N,3]) {
    %q = iota {axis=0} : i64[3,3]
    %k = iota {axis=1} : i64[3,3]
    %seen = le %k, %q : bool[3,3]
    %zero = const 0.0 : f32[3,3]
    %hidden = const -inf : f32[3,3]
    %bias = select %seen, %zero, %hidden : f32[3,3]
    %wide = broadcast %bias : f32[2,3,3]
    %masked = add %s, %wide : f32[2,3,3]
    %e = exp %masked : f32[2,3,3]
    %c = iota {axis=1} : i64[N,3]
    %two = const 2 : i64[N,3]
    %keep = ge %c, %two : bool[N,3]
    %none = const 0.0 : f32[N,3]
    %y = select %keep, %x, %none : f32[N,3]
    return %e, %y
  }
}"#,
        r#"module {
  func @f(%s: f32[2,3,3], %x: f32[N,3]) -> (f32[2,3,3], f32[N,3]) {
    %bias = fused : f32[3,3] body() {
      %0 = iota {axis=0} : i64[3,3]
      %1 = iota {axis=1} : i64[3,3]
      %seen = le %1, %0 : bool[3,3]
      %2 = const 0.0 : f32[3,3]
      %3 = const -inf : f32[3,3]
      %4 = select %seen, %2, %3 : f32[3,3]
      yield %4
    }
    %e = fused %bias, %s : f32[2,3,3] body(%5: f32[3,3], %6: f32[2,3,3]) {
      %7 = broadcast %5 : f32[2,3,3]
      %masked = add %6, %7 : f32[2,3,3]
      %8 = exp %masked : f32[2,3,3]
      yield %8
    }
    %y = fused %x : f32[N,3] body(%9: f32[N,3]) {
      %10 = iota {axis=1} : i64[N,3]
      %11 = const 2 : i64[N,3]
      %keep = ge %10, %11 : bool[N,3]
      %12 = const 0.0 : f32[N,3]
      %13 = select %keep, %9, %12 : f32[N,3]
      yield %13
    }
    return %e, %y
  }
}"#,
    );
}

#[test]
fn unknown_passes_and_pipelines_are_named() {
    let err = PassManager::from_names(&["cse", "inline"])
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        err,
        "unknown pass `inline`; the passes are: place_constants, canonicalize, fold, cse, simplify, channels_last, \
         loops, fold_updates, dce, fuse, order_epilogues"
    );
    let err = PassManager::pipeline("O3").err().unwrap().to_string();
    assert_eq!(
        err,
        "unknown pipeline `O3`; the pipelines are: default, simplify, none"
    );
}

/// `--explain`: fusion says why each value was or was not fused, each reason once.
#[test]
fn fusion_explains_each_decision() {
    let mut module = parse_and_verify(
        r#"module {
  func @f(%s: f32[2,3,3], %x: f32[4], %w: f32[4,4]) -> (f32[2,3,3], f32[4], f32[1,4]) {
    %q = iota {axis=0} : i64[3,3]
    %k = iota {axis=1} : i64[3,3]
    %seen = le %k, %q : bool[3,3]
    %zero = const 0.0 : f32[3,3]
    %hidden = const -inf : f32[3,3]
    %bias = select %seen, %zero, %hidden : f32[3,3]
    %wide = broadcast %bias : f32[2,3,3]
    %masked = add %s, %wide : f32[2,3,3]
    %e = exp %x : f32[4]
    %row = reshape %e : f32[1,4]
    %m = matmul %row, %w : f32[1,4]
    %a = add %e, %e : f32[4]
    %n = neg %m : f32[1,4]
    %r = reshape %n : f32[4]
    %b = mul %a, %r : f32[4]
    return %masked, %b, %m
  }
}"#,
    )
    .unwrap();
    let reports = PassManager::from_names(&["fuse"])
        .unwrap()
        .explain(true)
        .run(&mut module)
        .unwrap();
    let got = reports[0].explanations.join("\n");
    let want = "\
%seen (le) fused into the kernel of %bias (select)
%bias (select) kept out of the kernel of %masked (add): it is computed from constants alone and %masked (add) broadcasts it to more elements (that kernel would compute it again for every copy)
%masked (add) ends a kernel: nothing that reads it is fused (read by the region's results)
%e (exp) not fused into the kernel of %a (add): %row (reshape) reads it too, before that kernel ends and outside it
%a (add) fused into the kernel of %b (mul)
%n (neg) ends a kernel: nothing that reads it is fused (read by %r (reshape))
%b (mul) ends a kernel: nothing that reads it is fused (read by the region's results)";
    assert_eq!(got, want, "\ngot:\n{got}");
    let quiet = PassManager::from_names(&["fuse"])
        .unwrap()
        .run(&mut module)
        .unwrap();
    assert!(quiet[0].explanations.is_empty());
}

/// A backward kernel that reads values the forward kernel computed elementwise (`x + b` and
/// `tanh` of it) computes them again from the product and the bias: the forward kernel then
/// writes only what the second product reads, and the backward one reads the first product
/// once instead of two values of its size.
const RECOMPUTED: &str = r#"module {
  func @f(%x: f32[N,4], %w: f32[4,4], %b: f32[4], %g: f32[N,4]) -> (f32[N,4], f32[N,4]) {
    %h0 = matmul %x, %w : f32[N,4]
    %bb = broadcast %b : f32[N,4]
    %h = add %h0, %bb : f32[N,4]
    %t = tanh %h : f32[N,4]
    %y = matmul %t, %w : f32[N,4]
    %dy = mul %g, %y : f32[N,4]
    %t2 = mul %t, %t : f32[N,4]
    %d = sub %dy, %t2 : f32[N,4]
    %dh = mul %d, %h : f32[N,4]
    return %y, %dh
  }
}"#;

#[test]
fn fusion_recomputes_elementwise_values_in_later_kernels() {
    check(
        &["fuse"],
        RECOMPUTED,
        r#"module {
  func @f(%x: f32[N,4], %w: f32[4,4], %b: f32[4], %g: f32[N,4]) -> (f32[N,4], f32[N,4]) {
    %h0 = matmul %x, %w : f32[N,4]
    %t = fused %b, %h0 : f32[N,4] body(%0: f32[4], %1: f32[N,4]) {
      %2 = broadcast %0 : f32[N,4]
      %h = add %1, %2 : f32[N,4]
      %3 = tanh %h : f32[N,4]
      yield %3
    }
    %y = matmul %t, %w : f32[N,4]
    %dh = fused %g, %y, %b, %h0 : f32[N,4] body(%4: f32[N,4], %5: f32[N,4], %6: f32[4], %7: f32[N,4]) {
      %dy = mul %4, %5 : f32[N,4]
      %8 = broadcast %6 : f32[N,4]
      %9 = add %7, %8 : f32[N,4]
      %10 = tanh %9 : f32[N,4]
      %t2 = mul %10, %10 : f32[N,4]
      %d = sub %dy, %t2 : f32[N,4]
      %11 = mul %d, %9 : f32[N,4]
      yield %11
    }
    return %y, %dh
  }
}"#,
    );
    let mut module = parse_and_verify(RECOMPUTED).unwrap();
    let reports = PassManager::from_names(&["fuse"])
        .unwrap()
        .explain(true)
        .run(&mut module)
        .unwrap();
    let notes = reports[0].explanations.join("\n");
    assert!(
        notes.contains(
            "%h (add) recomputed by the 1 kernel reading it: 4080 bytes fewer moved a run"
        ) && notes.contains("%t (tanh) recomputed"),
        "{notes}"
    );
}

/// A value in a kernel of its own (a reader inside another kernel's span kept it out) that both
/// its reading kernels recompute is gone: no kernel computes it for nothing.
#[test]
fn fusion_drops_a_value_every_reader_recomputes() {
    check(
        &["fuse"],
        r#"module {
  func @f(%x: f32[4]) -> (f32[4], f32[1,4]) {
    %t = exp %x : f32[4]
    %u1 = mul %t, %x : f32[4]
    %u2 = add %t, %x : f32[4]
    %row = reshape %u2 : f32[1,4]
    %v = mul %u1, %u1 : f32[4]
    return %v, %row
  }
}"#,
        r#"module {
  func @f(%x: f32[4]) -> (f32[4], f32[1,4]) {
    %v = fused %x : f32[4] body(%0: f32[4]) {
      %1 = exp %0 : f32[4]
      %u1 = mul %1, %0 : f32[4]
      %2 = mul %u1, %u1 : f32[4]
      yield %2
    }
    %u2 = fused %x : f32[4] body(%3: f32[4]) {
      %4 = exp %3 : f32[4]
      %5 = add %4, %3 : f32[4]
      yield %5
    }
    %row = reshape %u2 : f32[1,4]
    return %v, %row
  }
}"#,
    );
}
