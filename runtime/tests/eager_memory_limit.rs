//! An eager op is held to the memory limit with its operands: the op's inputs and its result
//! together, refused before the result is allocated. Its own test binary: the limit is
//! process-wide.

use kiln_backend::Array;
use kiln_backend::limits::set_memory_limit;
use kiln_ir::BinaryOp;
use kiln_runtime::eager::Tensor;

#[test]
fn an_eager_op_whose_operands_and_result_pass_the_limit_is_refused() {
    let x = Tensor::new(Array::zeros(kiln_ir::DType::F32, &[1_000_000]));
    set_memory_limit(Some(10_000_000));
    let sum = x.binary(BinaryOp::Add, &x);
    set_memory_limit(None);
    let message = sum.expect_err("refused").to_string();
    assert!(
        message.contains("3 operands and results together"),
        "{message}"
    );
    assert!(
        message.contains("12000000 bytes, more than the memory limit of 10000000"),
        "{message}"
    );
    assert!(
        x.binary(BinaryOp::Add, &x).is_ok(),
        "within the default limit"
    );
}
