"""Generation overlapped with training (`rollout.mode: async`): the rollout engine runs in a
process of its own and samples step t+1's batch while the trainer updates on step t's.

It changes the time, not the algorithm. Under `rollout.staleness: k` (k >= 1) step t+1 is
sampled by theta_{max(t-k, 0)} (trainer.staleness), weights that exist before step t's
update starts, so the worker can sample step t+1 during that update. Everything else is the
simulated staleness's own code: the trainer keeps the lagged copy that recomputes pi_old,
the prompts and seeds are the ones the synchronous loop would draw, and the sampler's
log-probs travel with each rollout, so an async run writes the same metrics.jsonl as the
simulated one (tests/trainer/test_async_rollout.py). The staleness bound is kept by
waiting, never by dropping a rollout: nothing biases which answers are trained on.

Each rollout comes back tagged with the step of the weights that sampled it, and the trainer
refuses to score it with any other weights (`check_scored_by_sampler`): an async run that
silently scores a rollout with newer weights than those that sampled it, the failure
async trainers elsewhere shipped, stops instead.

    rollouts = start(cfg, lag, pushes=0, world=world)   # rank 0 starts the worker
    rollouts.ensure(step, lag.full_weights)  # the worker holds theta_step (sent if not)
    rollouts.submit(parts, n=...)            # sampled ahead, while the ranks train
    samples = rollouts.generate(prompts, n=..., seed=...)  # that result, or a new request
    rollouts.sampled_steps                   # the weights' step of each result since taken

Under FSDP2 (several ranks) rank 0 owns the one worker: each generate gathers every rank's
share (its prompts and seed) to rank 0, the worker samples each share as that rank would
(the same prompts and seed, so the same samples), and each rank gets its own back
(`AsyncRollouts`). Weights are gathered whole from the sharded lag (a collective) and sent
by rank 0. On GPUs `rollout.gpus: g` gives the worker the job's last g GPUs (vLLM tensor
parallel over them, weights reloaded from a safetensors folder through vLLM's
`collective_rpc("reload_weights")`), and the trainer's torchrun the others.

The worker ignores SIGINT and SIGTERM (the trainer decides about preemption and closes it),
dies with the trainer (PR_SET_PDEATHSIG on Linux; EOF on its pipe elsewhere), and relays its
own error: the trainer raises it at its next wait, or reports the exit code when the worker
died without a word.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from common.generation import ENGINES
from common.generation.base import Engine, Sample
from trainer import distributed, handoff

# How often a wait looks at whether the worker is still alive (seconds).
POLL_S = 0.5
# How long `close` waits for the worker to end before it is killed (seconds).
CLOSE_S = 30.0


class WorkerFailed(RuntimeError):
    """The rollout worker raised, or died; the message carries its error or exit code."""


def check_scored_by_sampler(sampled: list[int], scoring: int, step: int) -> None:
    """Every generation round of step `step` was sampled by the weights of step `scoring`,
    the ones that recompute its behaviour log-probs pi_old; otherwise the importance ratio
    would correct for the wrong lag (the trainer stops: RuntimeError)."""
    wrong = sorted({s for s in sampled if s != scoring})
    if wrong:
        raise RuntimeError(
            f"step {step}: the rollout was sampled by the weights of step(s) {wrong} but "
            f"would be scored by those of step {scoring}: pi_old must be recomputed by the "
            "weights that sampled (a bug in the async hand-off; docs/trainer.md \"Overlapped "
            "rollouts\")")


@dataclass
class Request:
    """One generate call: what it asks and which weights it must be sampled with."""

    id: int
    parts: list[tuple[list[str], int]]  # (prompts, seed): one rank's share each
    n: int
    temperature: float
    top_p: float
    max_new_tokens: int
    weights_step: int

    def key(self) -> tuple:
        return (tuple((tuple(p), seed) for p, seed in self.parts), self.n, self.temperature,
                self.top_p, self.max_new_tokens, self.weights_step)


@dataclass
class Fault:
    """The worker's drills (cfg.debug): `rollout_worker_fault` [step, how] fails the request
    with that step's seed (`how`: raise an error, or exit at once with code 17), or exits
    with 17 half-way through loading that step's weights (exit_loading);
    `rollout_delay_s` sleeps before each generate; `rollout_wrong_weights` skips loading
    that step's weights (its fingerprint must then stop the run)."""

    seed: int | None = None
    how: str | None = None
    step: int | None = None
    delay_s: float = 0.0
    wrong_weights: int | None = None

    @classmethod
    def from_config(cls, cfg) -> Fault | None:
        from trainer.collection import generation_seed

        d = cfg.debug
        fault = cls(delay_s=d.rollout_delay_s, wrong_weights=d.rollout_wrong_weights)
        if d.rollout_worker_fault is not None:
            fault.step, fault.how = d.rollout_worker_fault
            if fault.how != "exit_loading":  # a request's fault: that step's seed
                fault.seed = generation_seed(cfg.seed, fault.step, 0)
        return fault if fault != cls() else None


class WrongWeights(RuntimeError):
    """The worker sampled with weights whose fingerprint is not that of the step it was
    sent: a rollout would be scored by other weights than those that sampled it."""


# ---------------------------------------------------------------------------- worker side


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL to this process when its parent dies (a SIGKILLed
    trainer leaves no worker behind). Elsewhere the pipe's EOF ends it at its next read."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


# torchrun's variables: the worker is not a rank, and vLLM must not take it for one
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE")


def worker_gpus(count: int, visible: str | None, *, device_count: int,
                trainer_gpus: int) -> str:
    """CUDA_VISIBLE_DEVICES for a worker on the last `count` of the job's GPUs on this node
    (`visible`: the trainer's CUDA_VISIBLE_DEVICES, None when unset: all `device_count`),
    after the `trainer_gpus` its ranks use (cuda:0 .. cuda:trainer_gpus-1)."""
    ids = ([v.strip() for v in visible.split(",") if v.strip()]
           if visible is not None and visible.strip() else [str(i) for i in range(device_count)])
    if count + trainer_gpus > len(ids):
        raise ValueError(
            f"rollout.gpus={count} and {trainer_gpus} trainer rank(s) on this node need "
            f"{count + trainer_gpus} GPUs, but the job sees {len(ids)} "
            f"(CUDA_VISIBLE_DEVICES={visible}); lower rollout.gpus, or give the job more "
            "(resources.train.gpus counts the trainer's and the worker's)")
    return ",".join(ids[-count:])


def _build_engine(cfg, threads: int):
    """The worker's model (loaded as the trainer loads it, adapters included) and the
    run's engine on it."""
    from trainer.lora import apply_lora
    from trainer.runtime import autocast_dtype, resolve_device, tune_cpu_runtime
    from trainer.setup import load_policy

    tune_cpu_runtime()
    torch.set_num_threads(threads)
    device = resolve_device(cfg.model.device)
    # vLLM holds its own weights: the worker's copy is only where they arrive, on the CPU
    holder = device if cfg.rollout.engine == "hf" else torch.device("cpu")
    model, tokenizer = load_policy(cfg.model, holder)
    if cfg.model.lora:
        apply_lora(model, cfg.model.lora)
    model.requires_grad_(False)
    engine = ENGINES.get(cfg.rollout.engine).for_rollout(
        cfg.rollout, model, tokenizer, model_path=cfg.model.path, seed=cfg.seed,
        compute_dtype=autocast_dtype(cfg.model.compute_dtype, device))
    if hasattr(engine, "spill_to"):  # its own files (vLLM's adapters) in the run, not /tmp
        engine.spill_to(cfg.out_dir)
    return model, engine


def serve(conn, cfg, threads: int, fault: Fault | None, cuda_devices: str | None) -> None:
    """The worker's loop: weights in, requests in order, samples (tagged with the weights'
    step, one list per share) out; any error goes back as text before the worker exits.
    `cuda_devices`: its CUDA_VISIBLE_DEVICES (None: the trainer's, inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    for name in TORCHRUN_ENV:
        os.environ.pop(name, None)
    engine = None
    try:
        if cuda_devices is not None:  # before anything initialises CUDA here
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda_devices
        model, engine = _build_engine(cfg, threads)
        conn.send(("ready", os.getpid()))
        step = None  # the step of the weights the engine holds
        held = None  # their fingerprint (by content), returned with every result
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the trainer is gone
                return
            if msg[0] == "close":
                return
            if msg[0] == "weights":
                step, path = msg[1], msg[2]
                if fault is not None and fault.how == "exit_loading" and step == fault.step:
                    os._exit(17)  # the pushed file left behind, for the trainer to remove
                state = handoff.read(path)
                if fault is None or fault.wrong_weights != step:
                    with torch.no_grad():  # whole at first; then maybe the trained part only
                        model.load_state_dict(state, strict=held is None)
                    engine.sync_weights(model)
                held = handoff.fingerprint(model.state_dict())
                del state
                continue
            req: Request = msg[1]
            if req.weights_step != step:
                raise RuntimeError(f"request {req.id} wants the weights of step "
                                   f"{req.weights_step}, the worker holds step {step}")
            results = []
            for prompts, seed in req.parts:
                if fault is not None and fault.delay_s:
                    time.sleep(fault.delay_s)
                if fault is not None and seed == fault.seed:
                    if fault.how == "exit":
                        os._exit(17)
                    raise RuntimeError(f"debug.rollout_worker_fault: the worker fails at the "
                                       f"request with seed {seed}")
                results.append(engine.generate(
                    prompts, n=req.n, temperature=req.temperature, top_p=req.top_p,
                    max_new_tokens=req.max_new_tokens, seed=seed))
            conn.send(("samples", req.id, step, results, held))
    except BaseException:  # noqa: BLE001 - relayed whole to the trainer, which raises it
        try:
            conn.send(("error", traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass
    finally:
        if engine is not None:
            engine.close()


# ---------------------------------------------------------------------------- trainer side


class AsyncEngine:
    """The process's handle on the worker (rank 0's under FSDP2): a generate returns the
    result of the request submitted ahead when it is the same request, else asks the
    worker now.

    cfg: the RunConfig (the worker builds its model and engine from it); the worker starts
    on `weights` (CPU tensors), the weights of step `weights_step`; `threads`: its CPU
    threads; `cuda_devices`: its CUDA_VISIBLE_DEVICES (None: the trainer's)."""

    def __init__(self, cfg, *, weights_step: int, weights: dict[str, torch.Tensor],
                 threads: int = 1, fault: Fault | None = None,
                 cuda_devices: str | None = None,
                 changing: Callable[[str], bool] | None = None) -> None:
        self._hand_off = handoff.HandOff(cfg.out_dir)
        self._changing = changing  # names a push after the first carries (None: all)
        self._expected: dict[int, str] = {}  # fingerprints of the steps sent
        atexit.register(self._kill)  # before multiprocessing's exit joins the worker
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        # vLLM's tensor parallel starts processes of its own, which a daemon may not
        self.process = ctx.Process(target=serve, name="rollout-worker",
                                   daemon=cfg.rollout.gpus <= 1,
                                   args=(child, cfg, threads, fault, cuda_devices))
        self.process.start()
        child.close()
        self._next_id = 0
        self._ahead: Request | None = None  # submitted, its result not yet taken
        self._sent_step: int | None = None
        self.pid = self._receive("ready")[1]
        self.ensure(weights_step, lambda: weights)

    # -------------------------------------------------------------- requests

    def ensure(self, step: int, state: Callable[[], dict[str, torch.Tensor]]) -> None:
        """The worker holds the weights of `step` for the requests that follow; `state()`
        (whole CPU tensors) is handed off (trainer.handoff: one file) only when it holds
        another step's: all of it the first time, after that the `changing` names."""
        if step == self._sent_step:
            return
        full = state()
        self._expected = {s: f for s, f in self._expected.items() if s >= (self._sent_step or 0)}
        self._expected[step] = handoff.fingerprint(full)
        part = full
        if self._changing is not None and self._sent_step is not None:
            part = {name: t for name, t in full.items() if self._changing(name)}
        self._send(("weights", step, self._hand_off.write(part, step)))
        self._sent_step = step

    def submit(self, parts: list[tuple[list[str], int]], *, n: int, temperature: float,
               top_p: float, max_new_tokens: int) -> None:
        """Ask for these shares' samples now, with the weights last ensured; `generate`
        with the same arguments returns them."""
        self._discard_ahead()
        self._ahead = self._request(parts, n, temperature, top_p, max_new_tokens)

    def generate(self, parts: list[tuple[list[str], int]], *, n: int, temperature: float,
                 top_p: float, max_new_tokens: int) -> tuple[int, list[list[list[Sample]]]]:
        """The samples of each share (prompt-major groups of n), and the step of the
        weights that sampled them."""
        wanted = Request(-1, parts, n, temperature, top_p, max_new_tokens, self._sent_step)
        if self._ahead is not None and self._ahead.key() == wanted.key():
            req, self._ahead = self._ahead, None
        else:
            self._discard_ahead()
            req = self._request(parts, n, temperature, top_p, max_new_tokens)
        _, _, step, results, held = self._receive("samples", req.id)
        if held != self._expected.get(step):
            raise WrongWeights(
                f"the rollout worker (pid {self.pid}) sampled request {req.id} under the label "
                f"of step {step}, but the weights it holds have fingerprint {held}, not "
                f"{self._expected.get(step)}, that of the step-{step} weights the trainer sent; "
                "the rollout would be scored by other weights than those that sampled it "
                "(a hand-off bug: docs/reliability.md)")
        return step, results

    def _request(self, parts, n, temperature, top_p, max_new_tokens) -> Request:
        if self._sent_step is None:
            raise RuntimeError("async engine: no weights sent; call ensure() first")
        req = Request(self._next_id, [(list(p), seed) for p, seed in parts], n, temperature,
                      top_p, max_new_tokens, self._sent_step)
        self._next_id += 1
        self._send(("generate", req))
        return req

    def _discard_ahead(self) -> None:
        if self._ahead is not None:
            self._receive("samples", self._ahead.id)
            self._ahead = None

    # -------------------------------------------------------------- the pipe

    def _send(self, msg: tuple) -> None:
        self._check_alive()
        try:
            self._conn.send(msg)
        except (BrokenPipeError, OSError):
            self._check_alive(wait_s=2.0)
            raise

    def _receive(self, kind: str, req_id: int | None = None) -> tuple:
        """The worker's next message, which must be `kind` (for request `req_id`); raises
        WorkerFailed with the worker's error, or when it dies without one."""
        while True:
            if self._conn.poll(POLL_S):
                try:
                    msg = self._conn.recv()
                except (EOFError, OSError):  # OSError: it died with our request unread
                    self._check_alive(wait_s=2.0)
                    raise WorkerFailed("rollout worker closed its pipe") from None
                if msg[0] == "error":
                    self.process.join(timeout=5)
                    raise WorkerFailed(f"rollout worker (pid {self.process.pid}) failed:\n"
                                       f"{msg[1]}")
                if msg[0] != kind or (req_id is not None and msg[1] != req_id):
                    raise WorkerFailed(f"rollout worker answered {msg[:2]}, expected "
                                       f"{kind} {req_id}")
                return msg
            self._check_alive()

    def _check_alive(self, wait_s: float = 0.0) -> None:
        if wait_s:
            self.process.join(timeout=wait_s)
        if not self.process.is_alive():
            code = self.process.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            raise WorkerFailed(f"rollout worker (pid {self.process.pid}) died ({how}) "
                               "without reporting an error; see the job's log")

    def _kill(self) -> None:
        """At interpreter exit, whatever path got there: the worker ignores SIGTERM, which
        multiprocessing's exit handler sends before it joins, so it must be killed first."""
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self._hand_off.close()

    def close(self) -> None:
        """End the worker: asked first, killed after CLOSE_S, or at once when it is still
        sampling ahead (a preempted run regenerates that rollout on resume, the same); then
        remove what the hand-off left (a push a killed worker never read)."""
        atexit.unregister(self._kill)
        if self._ahead is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        if self.process.is_alive():
            try:
                self._conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
            deadline = time.monotonic() + CLOSE_S
            while self.process.is_alive() and time.monotonic() < deadline:
                self.process.join(timeout=POLL_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout=5)
        self._conn.close()
        self._hand_off.close()


class AsyncRollouts(Engine):
    """Every rank's view of the one rollout worker (rank 0 owns it: `worker`, None on the
    other ranks). A generate gathers each rank's share (prompts, seed) to rank 0, which
    has the worker sample every share, and hands each rank its own; on one process that
    is the caller's request itself. Every rank makes the same calls in the same order (a
    weights change is a collective: the lag's whole weights are gathered from its shards)."""

    name = "async"

    def __init__(self, worker: AsyncEngine | None, world, weights_step: int) -> None:
        self.worker, self.world = worker, world
        self._sent_step = weights_step
        self.sampled_steps: list[int] = []  # the weights' step of each result taken

    @classmethod
    def from_checkpoint(cls, path, options):  # pragma: no cover - rollouts only
        raise NotImplementedError("the async engine serves rollouts only")

    def load_weights(self, weights) -> None:  # pragma: no cover - weights go by step
        raise NotImplementedError("the async engine takes weights by step: ensure()")

    def sync_weights(self, model) -> None:
        """Nothing: the trainer sends weights by step (`ensure`) before each request."""

    def ensure(self, step: int, state: Callable[[], dict[str, torch.Tensor]]) -> None:
        """The worker holds the weights of `step`; `state()` (a collective under FSDP2,
        called on every rank) only when it holds another step's."""
        if step == self._sent_step:
            return
        weights = state()
        if self.worker is not None:
            self.worker.ensure(step, lambda: weights)
        self._sent_step = step

    def submit(self, parts: list[tuple[list[str], int]], *, n: int, temperature: float,
               top_p: float, max_new_tokens: int) -> None:
        """Every rank's share of a round (`parts`, in rank order), asked for ahead."""
        if self.worker is not None:
            self.worker.submit(parts, n=n, temperature=temperature, top_p=top_p,
                               max_new_tokens=max_new_tokens)

    def generate(self, prompts: list[str], *, n: int, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int) -> list[list[Sample]]:
        # rank 0 may arrive late (it sent the worker weights), and the others wait while
        # the worker samples: both waits are `align`s, with no fixed limit (hours at scale)
        distributed.align(self.world, "the rollout's prompts")
        parts = distributed.gather((list(prompts), seed), self.world)
        mine = None
        if self.worker is not None:
            step, results = self.worker.generate(parts, n=n, temperature=temperature,
                                                 top_p=top_p, max_new_tokens=max_new_tokens)
            mine = [(step, r) for r in results]
        distributed.align(self.world, "the rollout worker's samples")
        step, samples = distributed.scatter(mine, self.world)
        self.sampled_steps.append(step)
        return samples

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def start(cfg, lag, *, pushes: int, world):
    """The run's RolloutEngine on a worker process (rank 0's), starting on the lag's
    weights after `pushes` updates (a resumed run: its saved lag)."""
    from trainer.rollout import RolloutEngine
    from trainer.runtime import resolve_device

    r = cfg.rollout
    on_gpu = resolve_device(cfg.model.device).type == "cuda"
    if r.gpus and not on_gpu:
        raise ValueError(f"rollout.gpus={r.gpus} needs GPUs, but the run is on "
                         f"{cfg.model.device}: set rollout.gpus: 0 (on CPU the worker takes "
                         "rollout.async_threads cores)")
    step = lag.sampling_step(pushes)
    weights = lag.full_weights(keep=world.main)  # every rank: a collective under FSDP2
    worker = None
    if world.main:
        cuda_devices = None
        if r.gpus:
            cuda_devices = worker_gpus(r.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"),
                                       device_count=torch.cuda.device_count(),
                                       trainer_gpus=world.local_size)
        # LoRA: the frozen base goes once, the adapters (all that trains) after
        changing = (lambda name: "lora_" in name) if cfg.model.lora else None
        worker = AsyncEngine(cfg, weights_step=step, weights=weights, threads=r.async_threads,
                             fault=Fault.from_config(cfg), cuda_devices=cuda_devices,
                             changing=changing)
        where = (f"GPU(s) {cuda_devices} (CUDA_VISIBLE_DEVICES), tensor parallel {r.gpus}"
                 if cuda_devices else "rank 0's GPU, shared" if on_gpu
                 else f"the CPU, {r.async_threads} thread(s)")
        print(f"[trainer] rollout worker pid {worker.pid} on {where}", flush=True)
    del weights
    distributed.align(world, "the rollout worker's start")  # minutes for vLLM at scale
    return RolloutEngine(AsyncRollouts(worker, world, step), r.temperature, r.top_p,
                         r.max_new_tokens)


def split_cpu_threads(cfg) -> int | None:
    """On CPU the worker computes with `rollout.async_threads` threads and the trainer with
    the other cores (at least one), so the two do not fight over cores; nothing when
    OMP_NUM_THREADS sets the trainer's count or the run is on a GPU. Returns the trainer's
    thread count when it was set. (The command line calls this; `train()` in a library
    keeps its caller's threads.)"""
    from trainer.runtime import resolve_device

    if os.environ.get("OMP_NUM_THREADS") or resolve_device(cfg.model.device).type != "cpu":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) - cfg.rollout.async_threads)
    torch.set_num_threads(threads)
    return threads
