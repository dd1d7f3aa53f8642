"""Evaluation: Mean@n / pass@k / maj@k of checkpoints on AIME24, AIME25, AMC23 and the toy task.

Modules: benchmarks (problems from the hub or a local file), prompts (dapo / boxed
templates), samplers (hf and vllm behind one interface), grading (DAPO "Answer:" scorer and
math-verify), metrics, run (one evaluation -> per-sample JSONL + summary JSON),
lighteval_convert (cross-check). CLI: ``python -m eval --help``.
"""
