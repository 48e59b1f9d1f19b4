use kiln_backend::{Array, Interpreter, StateStore, jit};
use kiln_ir::diagnostic::parse_and_verify;
use ndarray::{ArrayD, IxDyn};

fn f32s(shape: &[usize], seed: u64) -> Array {
    let n: usize = shape.iter().product();
    let mut s = seed;
    let v = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f64 / (1u64 << 31) as f64 * 6.0 - 3.0) as f32
        })
        .collect();
    Array::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
}

fn check(src: &str, inputs: Vec<Array>) {
    let module = parse_and_verify(src).unwrap_or_else(|e| panic!("{}", e.render(src)));
    let func = &module.functions[0];
    let want = Interpreter::new(&module)
        .run_function(func, inputs.clone(), &mut StateStore::default())
        .unwrap();
    let kernel = jit::kernel(func).unwrap();
    let refs: Vec<&Array> = inputs.iter().collect();
    let got = kernel.call(&refs).unwrap();
    for (g, w) in got.iter().zip(&want) {
        let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "element {i}: got {a}, want {b}"
            );
        }
    }
}

#[test]
fn softmax() {
    check(
        "module { func @k(%x: f32[N,37]) -> f32[N,37] {
            %m = reduce_max %x {axes=[1], keep_dims=true} : f32[N,1]
            %mb = broadcast %m : f32[N,37]
            %d = sub %x, %mb : f32[N,37]
            %e = exp %d : f32[N,37]
            %s = reduce_sum %e {axes=[1], keep_dims=true} : f32[N,1]
            %sb = broadcast %s : f32[N,37]
            %y = div %e, %sb : f32[N,37]
            return %y
        } }",
        vec![f32s(&[5, 37], 1)],
    );
}

#[test]
fn column_sum_and_gelu() {
    check(
        "module { func @k(%x: f32[N,19], %a: f32[19]) -> (f32[19], f32[N,19]) {
            %ab = broadcast %a : f32[N,19]
            %y = mul %x, %ab : f32[N,19]
            %t = tanh %y : f32[N,19]
            %c = reduce_sum %t {axes=[0], keep_dims=false} : f32[19]
            return %c, %t
        } }",
        vec![f32s(&[7, 19], 2), f32s(&[19], 3)],
    );
}
