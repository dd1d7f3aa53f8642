"""The bottom layer that `trainer` and `eval` both stand on (they never import each other).

Modules: files (atomic writes, JSONL/YAML readers), layout (the run-directory layout, its one
owner), prompts (templates + the one prompt-tokenization rule), grading (the DAPO "Answer:"
scorer and math-verify in a bounded process pool), generation (engines behind one
interface: hf, vllm), toy (the synthetic arithmetic task), tracking (MLflow access that
fails fast). Layers, imports pointing down only:

    workflow -> sweep, analysis -> trainer, eval -> common -> algorithms

`tests/test_import_layers.py` fails when an import points up or sideways.
"""
