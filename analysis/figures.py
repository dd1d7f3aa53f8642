"""The paper's Figures 2 and 3, computed from the implemented losses (not redrawn formulas).

    python -m analysis figures --out results/paper

Figure 2: the dual-clipped differentiable surrogate (Algorithm 1): the per-token reward
term of the loss against the importance weight w, for A > 0 and A < 0.
Figure 3: RPG-Style Clip on the REINFORCE surrogate (Algorithm 2): the stop-gradient
coefficient w * A the token carries, against w.
Each curve is evaluated point by point through `algorithms.compute_policy_loss`; a segment
is drawn solid where autograd finds a nonzero gradient w.r.t. log pi and dotted where the
gradient is zero (the KL term is scaled by beta = 1e-300 so only the clip shows),
so the figure shows what the code does.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from algorithms import METHODS, compute_policy_loss  # noqa: E402

W_GRID = np.linspace(0.05, 4.0, 400)


def loss_curve(method: str, adv: float, w_grid=W_GRID):
    """(value, grad) per w for one token: value = the pg term of the loss, grad = d/dlogp.

    The KL term is switched off (beta -> tiny) so the curve shows the clipping alone.
    """
    cfg = METHODS[method].loss.model_copy(update={"beta": 1e-300, "agg": "seq-mean-token-sum"})
    old = torch.full((1, 1), math.log(0.2), dtype=torch.float64)
    advantage = torch.tensor([adv], dtype=torch.float64)
    values, grads = [], []
    for w in w_grid:
        logp = (old + math.log(w)).requires_grad_(True)
        loss, metrics = compute_policy_loss(cfg, logp, old, None, advantage, torch.ones(1, 1))
        (g,) = torch.autograd.grad(loss, logp)
        values.append(float(metrics["pg_loss"]))
        grads.append(float(g))
    return np.array(values), np.array(grads)


def _segments(x, y, flowing):
    """Split a curve into runs of equal `flowing` status."""
    start = 0
    for i in range(1, len(x) + 1):
        if i == len(x) or flowing[i] != flowing[start]:
            yield x[start:i + 1], y[start:i + 1], bool(flowing[start])
            start = i


def _draw(ax, x, y, grads, color, label):
    flowing = np.abs(grads) > 1e-100  # the KL term's beta = 1e-300 leaves ~1e-300
    first = True
    for xs, ys, flows in _segments(x, y, flowing):
        ax.plot(xs, ys, color=color, linestyle="-" if flows else ":", linewidth=2,
                label=label if first else None)
        first = False


def _figure(method: str, quantity: str, title: str, out: Path, stem: str) -> list[Path]:
    clip = METHODS[method].loss.clip
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    for ax, adv, color in zip(axes, (1.0, -1.0), ("tab:blue", "tab:red")):
        values, grads = loss_curve(method, adv)
        y = values if quantity == "loss" else -grads  # coefficient of grad log pi
        _draw(ax, W_GRID, y, grads, color, f"A = {adv:+.0f}")
        for xv, name in ((1 - clip.eps_low, "1-eps_low"), (1 + clip.eps_high, "1+eps_high"),
                         (clip.dual_c, "c")):
            ax.axvline(xv, color="grey", linewidth=0.8, linestyle="--")
            ax.text(xv, ax.get_ylim()[1], name, rotation=90, va="top", ha="right", fontsize=8)
        ax.set_xlabel("importance weight w = pi / pi_old")
        ax.set_ylabel("per-token loss term" if quantity == "loss" else "gradient coefficient")
        ax.set_title(f"{title}, A {'> 0' if adv > 0 else '< 0'}")
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"{method}: solid = gradient flows, dotted = gradient is zero", fontsize=10)
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    for p in paths:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return paths


def write_figures(out: Path) -> list[Path]:
    """Figure 2 (Algorithm 1) and Figure 3 (Algorithm 2) as PNG and PDF under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    return (
        _figure("RPG-URKL", "loss", "Algorithm 1: dual-clip surrogate", out, "figure2_dual_clip")
        + _figure("RPG-REINFORCE-URKL", "coefficient", "Algorithm 2: RPG-Style Clip", out,
                  "figure3_rpg_style_clip")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis figures", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/paper"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one-token losses: threads only add overhead
    for path in write_figures(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
