"""Numbers the docs state about the code are the code's numbers."""

from __future__ import annotations

import re

from reliability_helpers import REPO

from trainer.tiny import TinyConfig, build_tokenizer


def test_readme_tiny_tokenizer_size_is_the_real_one():
    """docs/trainer.md once said 394 tokens; the tokenizer (and the model's vocabulary) has 397."""
    readme = (REPO / "docs/trainer.md").read_text()
    stated = re.search(r"byte-level BPE tokenizer \((\d+) tokens", readme)
    assert stated is not None
    assert int(stated.group(1)) == len(build_tokenizer(TinyConfig()))
