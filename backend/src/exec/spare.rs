//! Large buffers that died outside any slot, kept for the next allocation of their size.
//!
//! A slot's buffer returns to its slot when its value dies. A buffer that leaves the run it
//! was made in does not: a loop's stacks of states are made in the body's run, carried out
//! of the loop and die in the caller's run. Freed, each training step would allocate it
//! again and fault its pages in again — W10's three 4 MiB stacks cost 0.6–1 ms each that
//! way. Kept here (up to [`CAP_BYTES`]), the next allocation of the same dtype and length
//! takes one back.
use crate::Array;
use kiln_ir::DType;
use std::sync::{Mutex, PoisonError};

/// Smaller buffers come back from the allocator cheaply.
const MIN_BYTES: usize = 1 << 20;
/// The most memory kept; the oldest buffers go first.
const CAP_BYTES: usize = 256 << 20;

static SPARE: Mutex<Vec<Array>> = Mutex::new(Vec::new());

fn bytes(array: &Array) -> usize {
    array.len() * array.dtype().size_bytes()
}

/// Keeps `array` if it is large; gives it back otherwise.
pub(super) fn keep(array: Array) -> Option<Array> {
    let size = bytes(&array);
    if !(MIN_BYTES..=CAP_BYTES).contains(&size) {
        return Some(array);
    }
    let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
    let mut total: usize = spare.iter().map(bytes).sum::<usize>() + size;
    while total > CAP_BYTES && !spare.is_empty() {
        total -= bytes(&spare.remove(0));
    }
    spare.push(array);
    None
}

/// A kept buffer of `dtype` with `len` elements (any shape, any contents).
pub(super) fn take(dtype: DType, len: usize) -> Option<Array> {
    if len * dtype.size_bytes() < MIN_BYTES {
        return None;
    }
    let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
    let i = spare
        .iter()
        .rposition(|a| a.dtype() == dtype && a.len() == len)?;
    Some(spare.swap_remove(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A length no other test's buffers have (the pool is the process's).
    const LEN: usize = (1 << 18) + 13;

    #[test]
    fn a_dead_large_buffer_serves_the_next_allocation_of_its_size() {
        let array = Array::zeros(DType::F32, &[LEN]);
        let address = array.data_ptr();
        assert!(keep(array).is_none(), "kept");
        assert!(take(DType::F64, LEN).is_none(), "another dtype");
        let again = take(DType::F32, LEN).expect("the dead buffer");
        assert_eq!(again.data_ptr(), address);
        assert!(take(DType::F32, LEN).is_none(), "taken once");
        assert!(
            keep(Array::zeros(DType::F32, &[1000])).is_some(),
            "small buffers are given back"
        );
        assert!(take(DType::F32, 1000).is_none());
    }
}
