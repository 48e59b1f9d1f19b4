"""The peer of Kiln's GPT recipe (examples/gpt.rs): the same model in PyTorch, named as Kiln
names its layers, trained on the batches `gpt batches DIR` wrote with nanoGPT's recipe
(AdamW on two parameter groups, warm-up and cosine, clipping at norm 1).

    python scripts/peers/gpt_torch.py DIR            # writes DIR/init.safetensors, DIR/torch_losses.json
    python scripts/peers/gpt_torch.py DIR --time 20  # and times eager and torch.compile steps
    python scripts/peers/gpt_torch.py DIR --validate [--compile]   # the whole recipe's run

With --validate the run is the recipe's as Kiln trains it (examples/gpt.rs train): the loss
on the validation batches (DIR/x_validation.npy, y_validation.npy) every eval_every steps and
after the last, and the run's wall time, validations included (torch.compile's compilation
too, with --compile).

The initial weights are PyTorch's (seeded), saved before the first step as its state_dict;
Kiln loads them with `StateDictLayout::PyTorch` (scripts/peers/gpt_match.sh runs both).
"""

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        n, t, d = x.shape
        split = lambda z: z.view(n, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(context.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    """Kiln's TransformerEncoderLayer: norm1, attention, norm2, ff1, ff2 (pre-norm, GELU)."""

    def __init__(self, width, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.ff1, self.ff2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab, context, width, heads, layers):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.layers = layers
        for i in range(layers):
            setattr(self, f"block{i}", Block(width, heads))
        self.norm = nn.LayerNorm(width)
        for name, p in self.named_parameters():  # GPT-2's initialisation, as Kiln's
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                residual = name.endswith(("attention.o.weight", "ff2.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions.weight[: idx.shape[1]]
        for i in range(self.layers):
            x = getattr(self, f"block{i}")(x)
        return self.norm(x) @ self.tokens.weight.T


class Model(nn.Module):
    """The tree whose state_dict names are Kiln's: `gpt.block0.attention.q.weight`, …"""

    def __init__(self, **sizes):
        super().__init__()
        self.gpt = Gpt(**sizes)

    def forward(self, idx, targets):
        logits = self.gpt(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def lr_at(step, m):
    """nanoGPT's get_lr, as Kiln's Schedule::warmup_cosine."""
    if step < m["warmup"]:
        return m["lr"] * (step + 1) / (m["warmup"] + 1)
    along = min((step - m["warmup"]) / (m["decay_end"] - m["warmup"]), 1.0)
    return m["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * along)) * (m["lr"] - m["min_lr"])


def optimizer_of(model, m):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": m["weight_decay"]},
              {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=m["lr"], betas=tuple(m["betas"]), eps=1e-8)


def validation_loss(model, xs, ys):
    """The mean of the validation batches' losses, as Kiln's Trainer gives it."""
    with torch.no_grad():
        return sum(float(model(x, y)) for x, y in zip(xs, ys)) / len(xs)


def train(model, step_fn, xs, ys, m, validate=None):
    """Trains on every batch; validate(step) after each eval_every steps, if given."""
    optimizer = optimizer_of(model, m)
    losses = []
    for i in range(len(xs)):
        for g in optimizer.param_groups:
            g["lr"] = lr_at(i, m)
        loss = step_fn(xs[i], ys[i])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), m["clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if validate and ((i + 1) % m["eval_every"] == 0 or i + 1 == len(xs)):
            validate(i + 1)
    return losses


def main():
    from safetensors.torch import save_file  # here: W13's peers import this file without it

    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--time", type=int, default=0, help="also time this many steps, eager and compiled")
    ap.add_argument("--validate", action="store_true", help="the validation loss every eval_every steps")
    ap.add_argument("--compile", action="store_true", help="with --validate: torch.compile the model")
    args = ap.parse_args()
    m = json.loads((args.dir / "meta.json").read_text())
    xs = torch.from_numpy(np.load(args.dir / "x.npy"))
    ys = torch.from_numpy(np.load(args.dir / "y.npy"))
    torch.manual_seed(m["seed"])
    sizes = {k: m[k] for k in ("vocab", "context", "width", "heads", "layers")}
    model = Model(**sizes)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, args.dir / "init.safetensors")
    init = {k: v.clone() for k, v in model.state_dict().items()}
    if args.validate:
        return recipe_run(model, args, m, xs, ys)
    losses = train(model, model, xs, ys, m)
    (args.dir / "torch_losses.json").write_text(json.dumps(losses) + "\n")
    print(f"pytorch {torch.__version__}: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    for mode in ["eager", "compile"][: 2 if args.time else 0]:
        model.load_state_dict(init)
        step = model if mode == "eager" else torch.compile(model)
        train(model, step, xs[:3], ys[:3], m)  # warm-up (and compilation)
        started = time.perf_counter()
        train(model, step, xs[: args.time], ys[: args.time], m)
        per_step = (time.perf_counter() - started) / args.time
        print(f"pytorch {mode}: {1e3 * per_step:.1f} ms a step")


def recipe_run(model, args, m, xs, ys):
    """The whole recipe, validated as Kiln's run is; writes DIR/torch_recipe.json."""
    xv = torch.from_numpy(np.load(args.dir / "x_validation.npy"))
    yv = torch.from_numpy(np.load(args.dir / "y_validation.npy"))
    step = torch.compile(model) if args.compile else model
    started = time.perf_counter()
    validations = []

    def validate(at):
        validations.append((at, validation_loss(model, xv, yv)))
        print(f"step {at:>5}  validation loss {validations[-1][1]:.4f}  "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
    losses = train(model, step, xs, ys, m, validate)
    seconds = time.perf_counter() - started
    mode = "torch.compile" if args.compile else "eager"
    print(f"pytorch {torch.__version__} {mode}: {len(losses)} steps in {seconds:.1f} s, "
          f"validation loss {validations[-1][1]:.4f}")
    record = {"mode": mode, "seconds": seconds, "validations": validations, "losses": losses}
    (args.dir / f"torch_recipe_{mode.replace('.', '_')}.json").write_text(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
