"""The bundled trainer: one KL-regularized policy-gradient run per grid cell.

Modules: config (typed RunConfig), tiny (the offline tiny model + warm start), tasks (toy
and math prompts, rewards from common.grading), rollout (a common.generation engine bound
to the run's sampling settings), logprobs
(chunked token log-probs), reference (reference schedules), loop (the RL loop), checkpoint
(HF checkpoints, atomic resume state, preemption), tracking (metrics.jsonl + MLflow).
CLI: ``python -m trainer --help``.
"""
