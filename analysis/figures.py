"""The paper's Figures 2 and 3, computed from the implemented losses (not redrawn formulas).

    python -m analysis figures --out results/paper

Figure 2: the dual-clipped differentiable surrogate (Algorithm 1): the per-token reward
term of the loss against the importance weight w, for A > 0 and A < 0 (the KL term is
scaled by beta = 1e-300 so only the clip shows).
Figure 3: RPG-Style Clip on the REINFORCE surrogate (Algorithm 2): the per-token loss L_i
against w with l_i = -log pi = 1, as the paper's caption has it, with the method's own
beta; panels by the sign of psi_i = A'_i * l_i (A' = A + C_KL / w, the effective advantage).
Inside the trust region L_i = w A' l_i; in a clipped region it is the constant bound * A' l_i.
Each curve is evaluated point by point through `algorithms.compute_policy_loss`; a segment
is drawn solid where autograd finds a nonzero gradient w.r.t. log pi and dotted where the
gradient is zero, so the figure shows what the code does.
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

W_GRID = np.geomspace(0.1, 20.0, 600)  # log scale: the trust region and c = 10 both show


def loss_curve(method: str, adv: float, w_grid=W_GRID, *, with_kl: bool = True):
    """(value, grad) per w for one token with l = -log pi = 1 and pi_old = pi / w.

    with_kl: the method's beta, value = the whole per-token loss; else beta -> 1e-300 and
    value = the reward (pg) term alone. grad = d loss / d log pi.
    """
    update = {"agg": "seq-mean-token-sum"} | ({} if with_kl else {"beta": 1e-300})
    cfg = METHODS[method].loss.model_copy(update=update)
    logp = torch.full((1, 1), -1.0, dtype=torch.float64)
    advantage = torch.tensor([adv], dtype=torch.float64)
    values, grads = [], []
    for w in w_grid:
        lp = logp.clone().requires_grad_(True)
        old = logp - math.log(w)
        loss, metrics = compute_policy_loss(cfg, lp, old, None, advantage, torch.ones(1, 1))
        (g,) = torch.autograd.grad(loss, lp)
        values.append(float(loss.detach() if with_kl else metrics["pg_loss"]))
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
    flowing = np.abs(grads) > 1e-100  # Figure 2's beta = 1e-300 leaves ~1e-300
    first = True
    for xs, ys, flows in _segments(x, y, flowing):
        ax.plot(xs, ys, color=color, linestyle="-" if flows else ":", linewidth=2,
                label=label if first else None)
        first = False


def _figure(method: str, with_kl: bool, title: str, out: Path, stem: str) -> list[Path]:
    clip = METHODS[method].loss.clip
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    for ax, adv, color in zip(axes, (1.0, -1.0), ("tab:blue", "tab:red")):
        values, grads = loss_curve(method, adv, with_kl=with_kl)
        sign = "> 0" if adv > 0 else "< 0"
        _draw(ax, W_GRID, values, grads, color,
              f"A = {adv:+.0f}" + (f", beta = {METHODS[method].loss.beta:g}" if with_kl else ""))
        ax.set_xscale("log")
        for xv, name in ((1 - clip.eps_low, "1-eps_low"), (1 + clip.eps_high, "1+eps_high"),
                         (clip.dual_c, "c")):
            ax.axvline(xv, color="grey", linewidth=0.8, linestyle="--")
            # Inside the axes (axes-fraction y), so no label is cut at the frame, at the end
            # of the line that the curve leaves free.
            lo, hi = ax.get_ylim()
            high = (np.interp(xv, W_GRID, values) - lo) / (hi - lo) > 0.5
            y, va = (0.03, "bottom") if high else (0.97, "top")
            ax.text(xv, y, name, rotation=90, va=va, ha="right", fontsize=8,
                    transform=ax.get_xaxis_transform())
        ax.set_xlabel("importance weight w = pi / pi_old (log scale)")
        if with_kl:
            ax.set_ylabel("per-token loss L_i (l_i = -log pi = 1)")
            ax.set_title(f"{title}, psi = A' l {sign}")
        else:
            ax.set_ylabel("per-token reward term of the loss")
            ax.set_title(f"{title}, A {sign}")
        ax.legend(loc="center left", fontsize=8)
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
        _figure("RPG-URKL", False, "Algorithm 1: dual-clip surrogate", out, "figure2_dual_clip")
        + _figure("RPG-REINFORCE-URKL", True, "Algorithm 2: RPG-Style Clip", out,
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
