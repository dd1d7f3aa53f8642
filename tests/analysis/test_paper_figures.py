"""Figures 2/3 are computed from the implemented losses: their solid/dotted split must sit
exactly at the clip boundaries."""

import numpy as np

from analysis.figures import loss_curve, write_figures


def test_algorithm1_curve_is_flat_exactly_where_clipped():
    w = np.array([0.5, 1.0, 1.2, 1.5, 2.0])
    _, g_pos = loss_curve("RPG-URKL", 1.0, w)
    assert list(np.abs(g_pos) > 1e-100) == [True, True, True, False, False]
    _, g_neg = loss_curve("RPG-URKL", -1.0, np.array([0.5, 0.9, 2.0, 3.5]))
    assert list(np.abs(g_neg) > 1e-100) == [False, True, True, False]


def test_algorithm2_coefficient_is_w_times_a_inside_the_trust_region():
    w = np.array([0.5, 1.1, 2.0])
    _, g = loss_curve("RPG-REINFORCE-URKL", 1.0, w)
    np.testing.assert_allclose(-g[:2], w[:2], rtol=1e-9)
    assert g[2] == 0.0


def test_write_figures_png_and_pdf(tmp_path):
    paths = write_figures(tmp_path)
    assert sorted(p.name for p in paths) == [
        "figure2_dual_clip.pdf", "figure2_dual_clip.png",
        "figure3_rpg_style_clip.pdf", "figure3_rpg_style_clip.png"]
    assert all(p.stat().st_size > 5000 for p in paths)
