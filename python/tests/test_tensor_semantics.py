"""Tensors behave as a PyTorch user expects: bool() of one element, elementwise == and !=,
reshape/view with -1 (and a traced batch size), .to, tolist, kiln.tensor(dtype=...),
kiln.cond — eagerly and under to_static, with a clear error where a value cannot be known."""

import numpy as np
import pytest

import kiln


def test_bool_is_the_value_of_one_element():
    x = kiln.tensor([1.0, -2.0])
    assert bool(x.sum() < 0) and not bool(x.sum() > 0)
    taken = "positive" if x.sum() > 0 else "negative"  # the branch a PyTorch user writes
    assert taken == "negative"
    with pytest.raises(kiln.KilnError, match="bool\\(\\) of a tensor of 2 elements is ambiguous"):
        bool(x > 0)


def test_bool_while_tracing_names_the_line_and_kiln_cond():
    @kiln.to_static
    def f(x):
        if x.sum() > 0:
            return x * 2
        return x

    with pytest.raises(kiln.KilnError, match=r"traced by to_static at .*test_tensor_semantics.py:\d+.*kiln.cond"):
        f(kiln.tensor([[1.0, 2.0]]))


def test_cond_branches_eagerly_and_traced():
    def f(x):
        return kiln.cond(x.sum() > 0, lambda: x * 2.0, lambda: x - 1.0)

    compiled = kiln.to_static(f)
    for values in ([[1.0, 2.0]], [[-3.0, 1.0]]):
        x = kiln.tensor(values)
        want = np.array(values) * 2 if np.sum(values) > 0 else np.array(values) - 1
        np.testing.assert_allclose(f(x).numpy(), want)
        np.testing.assert_allclose(compiled(x).numpy(), want)

    def raises():
        raise ArithmeticError("in a branch")

    with pytest.raises(ArithmeticError, match="in a branch"):
        kiln.cond(kiln.tensor(1.0) > 0, raises, lambda: kiln.tensor(0.0))


def test_equality_is_elementwise_and_tensors_stay_hashable():
    a, b = kiln.tensor([1, 2, 3]), kiln.tensor([1, 0, 3])
    assert (a == b).numpy().tolist() == [True, False, True]
    assert (a != b).numpy().tolist() == [False, True, False]
    assert (a == 2).numpy().tolist() == [False, True, False]
    assert (a == None) is False and (a != None) is True  # noqa: E711
    assert len({a, b}) == 2 and {a: 1}[a] == 1


def test_reshape_and_view_infer_minus_one():
    x = kiln.tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    assert x.reshape(-1).shape == (24,)
    assert x.reshape(2, -1).shape == (2, 12)
    assert x.view([4, -1, 2]).shape == (4, 3, 2)
    with pytest.raises(kiln.ShapeError, match="24 elements do not divide by 5"):
        x.reshape(5, -1)
    with pytest.raises(kiln.ShapeError, match="only one size may be -1"):
        x.reshape(-1, -1)

    @kiln.to_static
    def flatten(images):
        return images.reshape(images.shape[0], -1).sum(axis=1)  # the batch stays symbolic

    for n in (3, 5):
        batch = np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4)
        np.testing.assert_allclose(flatten(kiln.tensor(batch)).numpy(), batch.reshape(n, -1).sum(1))


def test_to_tolist_and_tensor_dtypes():
    x = kiln.tensor([1.5, 2.5], dtype=kiln.float64)
    assert x.dtype == "float64"
    assert x.to(kiln.int64).tolist() == [1, 2]
    assert kiln.tensor([[1, 2]], dtype="float32").tolist() == [[1.0, 2.0]]
    assert kiln.tensor(3, dtype=kiln.int32).dtype == "int32"


def test_indexing_reads_and_differentiates_eagerly_and_traced():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = kiln.tensor(a)
    for key in [0, -1, (1, 2), (slice(None), slice(1, 3)), (Ellipsis, -1), (0, Ellipsis, 1),
                (slice(None), None, 0), (slice(0, 2), slice(None, None, 2), slice(1, None))]:
        np.testing.assert_array_equal(x[key].numpy(), a[key], err_msg=str(key))
    np.testing.assert_array_equal(x[:, [2, 0]].numpy(), a[:, [2, 0]])
    np.testing.assert_array_equal(x[np.array([1, 0])].numpy(), a[[1, 0]])
    np.testing.assert_array_equal(x[a > 20].numpy(), a[a > 20])
    np.testing.assert_array_equal(x[np.array([False, True])].numpy(), a[[False, True]])
    with pytest.raises(IndexError, match="index 3 is out of range for axis 1 of size 3"):
        x[0, 3]
    with pytest.raises(IndexError, match="4 indices for a tensor of rank 3"):
        x[0, 0, 0, 0]

    w = kiln.tensor(a, requires_grad=True)
    (w[:, 1:3, -1] * 2.0).sum().backward()
    expected = np.zeros_like(a)
    expected[:, 1:3, -1] = 2.0
    np.testing.assert_array_equal(w.grad.numpy(), expected)

    @kiln.to_static
    def last_feature(batch):
        return batch[..., -1] + batch[:, 0, 1:2]

    for n in (2, 5):
        b = np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4)
        np.testing.assert_array_equal(last_feature(kiln.tensor(b)).numpy(), b[..., -1] + b[:, 0, 1:2])


def test_max_min_cat_and_stack():
    a = np.array([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]], dtype=np.float32)
    x = kiln.tensor(a)
    assert x.max().item() == 7.0 and x.min().item() == 0.0
    values, indices = x.max(dim=1)
    assert values.tolist() == [5.0, 7.0] and indices.tolist() == [1, 0]
    values, indices = x.min(1, keepdim=True)
    assert values.shape == (2, 1) and indices.tolist() == [[0], [1]]
    assert kiln.cat([x, x], dim=1).shape == (2, 6)
    np.testing.assert_array_equal(kiln.stack([x, x * 2.0], dim=1).numpy(), np.stack([a, a * 2], axis=1))
