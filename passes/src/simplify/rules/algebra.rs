//! Algebraic identities of elementwise ops. The ones marked *rounding* hold exactly in real
//! arithmetic and within a few ulps in floating point; none changes a finite result into a
//! non-finite one except by overflow.

use super::is_splat;
use crate::simplify::lang::{Node, Typing};
use egg::{Rewrite, rewrite as rw};

/// The algebraic rules.
pub fn rules() -> Vec<Rewrite<Node, Typing>> {
    vec![
        rw!("add-zero"; "(add ?x ?z)" => "?x" if is_splat("?z", 0.0)), // x + 0 = x
        rw!("zero-add"; "(add ?z ?x)" => "?x" if is_splat("?z", 0.0)), // 0 + x = x
        rw!("sub-zero"; "(sub ?x ?z)" => "?x" if is_splat("?z", 0.0)), // x − 0 = x
        rw!("mul-one"; "(mul ?x ?o)" => "?x" if is_splat("?o", 1.0)),  // x · 1 = x
        rw!("one-mul"; "(mul ?o ?x)" => "?x" if is_splat("?o", 1.0)),  // 1 · x = x
        rw!("div-one"; "(div ?x ?o)" => "?x" if is_splat("?o", 1.0)),  // x / 1 = x
        rw!("neg-neg"; "(neg (neg ?x))" => "?x"),                      // −(−x) = x
        rw!("add-neg"; "(add ?a (neg ?b))" => "(sub ?a ?b)"),          // a + (−b) = a − b
        rw!("sub-neg"; "(sub ?a (neg ?b))" => "(add ?a ?b)"),          // a − (−b) = a + b
        rw!("neg-sub"; "(neg (sub ?a ?b))" => "(sub ?b ?a)"),          // −(a − b) = b − a
        rw!("neg-mul-neg"; "(mul (neg ?a) (neg ?b))" => "(mul ?a ?b)"), // (−a)(−b) = ab
        rw!("mul-recip"; "(mul ?a (recip ?b))" => "(div ?a ?b)"),      // a · (1/b) = a / b
        rw!("recip-sqrt"; "(recip (sqrt ?x))" => "(rsqrt ?x)"),        // 1/√x = rsqrt x
        rw!("div-sqrt"; "(div ?a (sqrt ?b))" => "(mul ?a (rsqrt ?b))"), // a/√b = a · rsqrt b   (rounding)
        rw!("recip-exp"; "(recip (exp ?x))" => "(exp (neg ?x))"), // 1/eˣ = e⁻ˣ           (rounding)
        rw!("not-eq"; "(not (eq ?a ?b))" => "(ne ?a ?b)"),        // ¬(a = b) = a ≠ b (NaN too)
        rw!("not-ne"; "(not (ne ?a ?b))" => "(eq ?a ?b)"),        // ¬(a ≠ b) = a = b
        rw!("select-same"; "(select ?c ?x ?x)" => "?x"),          // c ? x : x = x
        rw!("max-self"; "(max ?x ?x)" => "?x"),                   // max(x, x) = x
        rw!("min-self"; "(min ?x ?x)" => "?x"),                   // min(x, x) = x
        rw!("add-comm"; "(add ?a ?b)" => "(add ?b ?a)"),          // a + b = b + a
        rw!("mul-comm"; "(mul ?a ?b)" => "(mul ?b ?a)"),          // ab = ba
        rw!("factor-add"; "(add (mul ?x ?a) (mul ?x ?b))" => "(mul ?x (add ?a ?b))"), // xa + xb = x(a + b)   (rounding)
        rw!("factor-sub"; "(sub (mul ?x ?a) (mul ?x ?b))" => "(mul ?x (sub ?a ?b))"), // xa − xb = x(a − b)   (rounding)
        rw!("div-div"; "(div (div ?a ?b) ?c)" => "(div ?a (mul ?b ?c))"), // (a/b)/c = a/(bc)     (rounding)
    ]
}
