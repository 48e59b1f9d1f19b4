use kiln_backend::vecmath::{self, Isa};
use kiln_ir::UnaryOp;
use std::time::Instant;
fn main() {
    let n = 512;
    let mut xs: Vec<f32> = (0..n).map(|i| (i as f32 / n as f32) * 8.0 - 4.0).collect();
    let src: Vec<f32> = (0..n).map(|i| (i as f32 / n as f32) * 8.0 - 4.0 + 4.1).collect();
    for op in [UnaryOp::Exp, UnaryOp::Log, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Softplus, UnaryOp::Erf] {
        for isa in [Isa::Avx2, Isa::Avx512] {
            let reps = 20000;
            let t = Instant::now();
            for _ in 0..reps {
                vecmath::apply(op, isa, &mut xs);
                xs.copy_from_slice(&src);
            }
            let el = t.elapsed().as_secs_f64() / (reps * n) as f64 * 1e9;
            println!("{:?} {:?} {:.3} ns/elem (incl refill)", op, isa, el);
        }
    }
}
