"""kiln.nn.GPT (issue 51): its logits and gradients against the same model in PyTorch
(scripts/peers/gpt_torch.py, where torch is installed), generation through the KV cache equal
token for token to recomputing each prefix (and to PyTorch's greedy loop), sampling seeded,
stop tokens, and a training step under to_static."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import nn

SIZES = dict(vocab_size=11, context=8, width=16, heads=2, layers=2)


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    kiln.manual_seed(5)


def tokens(shape, seed=0):
    return np.random.default_rng(seed).integers(0, SIZES["vocab_size"], size=shape)


TORCH_NAMES = {"w": "weight", "b": "bias", "gamma": "weight", "beta": "bias", "table": "weight"}


def torch_name(key):
    """PyTorch's name of Kiln's parameter `key` (the peer's modules are named as Kiln's
    layers; the last part differs, as StateDictLayout::PyTorch says)."""
    path, last = key.rsplit(".", 1)
    return f"{path}.{TORCH_NAMES[last]}"


def as_torch(key, array):
    """A Linear weight is [in, out] in Kiln, [out, in] in PyTorch."""
    return array.T if key.endswith(".w") else array


def torch_twin(gpt):
    """The peer script's GPT holding `gpt`'s weights."""
    torch = pytest.importorskip("torch")
    path = Path(__file__).parents[2] / "scripts" / "peers" / "gpt_torch.py"
    spec = importlib.util.spec_from_file_location("gpt_torch", path)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    s = SIZES
    twin = peer.Gpt(s["vocab_size"], s["context"], s["width"], s["heads"], s["layers"])
    state = {torch_name(k): torch.tensor(as_torch(k, p.numpy()))
             for k, p in gpt.named_parameters()}
    twin.load_state_dict(state, strict=True)
    return torch, twin


def test_logits_and_gradients_equal_pytorchs():
    gpt = nn.GPT(**SIZES)
    torch, twin = torch_twin(gpt)
    idx, targets = tokens((3, 8)), tokens((3, 8), seed=1)
    loss = gpt.loss(kiln.tensor(idx), kiln.tensor(targets))
    loss.backward()
    logits_t = twin(torch.tensor(idx))
    loss_t = torch.nn.functional.cross_entropy(
        logits_t.reshape(-1, SIZES["vocab_size"]), torch.tensor(targets).reshape(-1))
    loss_t.backward()
    np.testing.assert_allclose(gpt(kiln.tensor(idx)).numpy(), logits_t.detach().numpy(),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(loss.item(), loss_t.item(), rtol=1e-5)
    grads_t = {k: p.grad.numpy() for k, p in twin.named_parameters()}
    for key, p in gpt.named_parameters():
        np.testing.assert_allclose(as_torch(key, p.grad.numpy()), grads_t[torch_name(key)],
                                   rtol=1e-3, atol=1e-5, err_msg=key)


def test_greedy_generation_equals_pytorchs_greedy_loop():
    gpt = nn.GPT(**SIZES)
    torch, twin = torch_twin(gpt)
    idx = [[3, 1, 4]]
    got = gpt.generate(idx, 12, greedy=True)[0]
    seq = torch.tensor(idx)
    with torch.no_grad():
        for _ in range(12):
            logits = twin(seq[:, -SIZES["context"]:])
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert got == seq[0].tolist()


def test_the_cache_gives_the_tokens_recomputing_gives():
    gpt = nn.GPT(**SIZES)
    prompts = np.array([[3, 1, 4], [5, 9, 2]])
    # Past the context (8): each later step sees the last 8 tokens either way.
    greedy = gpt.generate(prompts, 12, greedy=True)
    assert greedy == gpt.generate(prompts, 12, greedy=True, use_cache=False)
    assert [len(r) for r in greedy] == [15, 15]
    for how in [dict(temperature=0.9), dict(temperature=1.3, top_k=4), dict(top_p=0.8)]:
        cached = gpt.generate([[3, 1, 4]], 12, seed=7, **how)
        assert cached == gpt.generate([[3, 1, 4]], 12, seed=7, use_cache=False, **how), how
        assert cached == gpt.generate([[3, 1, 4]], 12, seed=7, **how)
    seeds = {tuple(gpt.generate([[3, 1, 4]], 12, seed=s)[0]) for s in range(4)}
    assert len(seeds) > 1, "the seed changes nothing"
    assert gpt.generate([[3]], 6, top_k=1, seed=2) == gpt.generate([[3]], 6, greedy=True)


def test_prompts_of_different_lengths_go_through_the_cache_together():
    gpt = nn.GPT(**SIZES)
    prompts = [[2], [3, 1, 4], [5, 9, 2, 6, 5, 3]]
    together = gpt.generate(prompts, 12, greedy=True)
    assert together == gpt.generate(prompts, 12, greedy=True, use_cache=False)
    assert [len(r) for r in together] == [13, 15, 18]


def test_a_stop_token_ends_its_row_alone():
    gpt = nn.GPT(**SIZES)
    prompts = [[3, 1, 4], [5, 9, 2]]
    free = gpt.generate(prompts, 12, greedy=True)
    stop = free[0][3]
    stopped = gpt.generate(prompts, 12, greedy=True, stop=[stop])
    for row, full in zip(stopped, free):
        made = full[3:]
        want = full[:3 + made.index(stop) + 1] if stop in made else full
        assert row == want


def test_bad_prompts_are_clear_errors():
    gpt = nn.GPT(**SIZES)
    with pytest.raises(kiln.KilnError, match="at least 1 token"):
        gpt.generate([[1], []], 3)
    with pytest.raises(ValueError, match="no prompts"):
        gpt.generate([], 3)
    with pytest.raises(kiln.KilnError, match="temperature"):
        gpt.generate([[1]], 3, temperature=-1.0)
    with pytest.raises(ValueError, match="3 heads must divide the width 16"):
        nn.GPT(11, 8, width=16, heads=3)
    with pytest.raises(kiln.KilnError, match="context"):
        gpt(kiln.tensor(tokens((1, 9))))


def test_a_gpt_trains_under_to_static():
    gpt = nn.GPT(**SIZES)
    idx = tokens((4, 8), seed=3)
    targets = np.roll(idx, -1, axis=1)
    step = kiln.to_static(gpt.loss).minimize(kiln.optim.Adam(lr=1e-2))
    x, y = kiln.tensor(idx), kiln.tensor(targets)
    eager = gpt.loss(x, y).item()
    first = step.train_step(x, y).item()
    assert first == pytest.approx(eager, rel=1e-5)
    for _ in range(40):
        last = step.train_step(x, y).item()
    assert last < 0.5 * first
