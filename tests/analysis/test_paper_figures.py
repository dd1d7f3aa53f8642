"""Figures 2/3 are computed from the implemented losses: their solid/dotted split must sit
exactly at the clip boundaries, and Figure 3 plots the paper's L_i (l = -log pi = 1)."""

import math

import numpy as np

from algorithms import METHODS
from analysis.figures import loss_curve, write_figures


def test_algorithm1_curve_is_flat_exactly_where_clipped():
    w = np.array([0.5, 1.0, 1.2, 1.5, 2.0])
    _, g_pos = loss_curve("RPG-URKL", 1.0, w, with_kl=False)
    assert list(np.abs(g_pos) > 1e-100) == [True, True, True, False, False]
    _, g_neg = loss_curve("RPG-URKL", -1.0, np.array([0.5, 0.9, 2.0, 9.0, 11.0]), with_kl=False)
    assert list(np.abs(g_neg) > 1e-100) == [False, True, True, True, False]


def test_algorithm2_plots_the_papers_loss_value_with_unit_l():
    """Inside: L = w A' (l = 1); clipped: the constant bound * A' with zero gradient."""
    beta = METHODS["RPG-REINFORCE-URKL"].loss.beta
    w = np.array([0.5, 1.1, 2.0, 0.7, 3.0, 12.0])
    adv = np.array([1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
    for wi, ai, flows, bound in zip(w, adv, [True, True, False, False, True, False],
                                    [None, None, 1.28, 0.8, None, 10.0]):
        (value,), (grad,) = loss_curve("RPG-REINFORCE-URKL", ai, np.array([wi]))
        a_eff = ai - beta * math.log(wi)  # URKL: C_KL / w = -beta log w
        assert bool(grad != 0.0) == flows
        want = wi * a_eff if flows else bound * a_eff
        assert math.isclose(value, want, rel_tol=1e-9)


def test_write_figures_png_and_pdf(tmp_path):
    paths = write_figures(tmp_path)
    assert sorted(p.name for p in paths) == [
        "figure2_dual_clip.pdf", "figure2_dual_clip.png",
        "figure3_rpg_style_clip.pdf", "figure3_rpg_style_clip.png"]
    assert all(p.stat().st_size > 5000 for p in paths)
