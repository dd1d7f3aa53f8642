"""`python -m algorithms.audit` writes a readable table whose rows agree with theory."""

import pandas as pd

from algorithms.audit import main
from algorithms.config import ESTIMATORS


def test_audit_writes_markdown_and_csv(tmp_path):
    assert main(["--out", str(tmp_path), "--policies", "categorical"]) == 0
    table = pd.read_csv(tmp_path / "audit.csv")
    md = (tmp_path / "audit.md").read_text()
    # 6 RPG divergences x forms x ratio levels + each estimator x (3 weights + reward) + designs
    assert len(table) == 24 + 4 * len(ESTIMATORS) + 5
    rpg = table[table["loss"].str.startswith("RPG")]
    assert (rpg["bias off-policy"] == "0 (exact)").all()
    grpo = table.set_index("loss").loc["k3 in loss, no IW"]
    assert grpo["bias off-policy"] != "0 (exact)"
    assert grpo["KL part descends (on-policy)"] == "KL(ref||pi)"
    assert "| RPG-URKL reinforce token" in md
