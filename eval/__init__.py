"""Evaluation: Mean@n / pass@k / maj@k of checkpoints on AIME24, AIME25, AMC23 and the toy task.

Modules: benchmarks (problems from the hub or a local file), metrics, run (checkpoints x
benchmarks -> per-sample JSONL + summary JSON, one engine start-up), lighteval_convert
(cross-check). Prompts, grading and the generation engines are in `common`, shared with the
trainer. CLI: ``python -m eval --help``.
"""
