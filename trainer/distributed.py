"""Data parallelism for the trainer: one process = one rank, PyTorch FSDP2 under torchrun.

    torchrun --nproc-per-node 2 -m trainer --config run.yaml     # gloo on CPU, nccl on GPU
    python -m trainer --config run.yaml                           # world size 1: no group

The contract (the update equals the single-process update on the same global batch):
every rank draws the same global prompts and generates its contiguous share; the kept
groups are gathered to every rank in rank order, so each rank holds the whole batch in
the single-process order; forward/backward work is split by rows
(`trainer.logprobs.balanced_share`, by token count), and every
statistic that crosses rows is reduced over ranks (`all_sum`, `all_max`). FSDP2 averages
gradients over ranks, so each rank's loss is scaled by the world size to sum them instead.
FSDP2 runs collectives in every forward, so ranks must make the same number of forward
calls: micro-batch counts are padded to the largest rank's (`pad_to`), and generation
runs on unsharded weights (`unsharded`), where ranks may decode different lengths.
Rank 0 alone writes files; `model_state` gathers the full weights for it.

Every collective here allocates its tensors on `collective_device`: the rank's GPU under
NCCL (which has no CPU path: "No backend type associated with device type cpu"), the CPU
under gloo. Python objects travel as pickled bytes in such a tensor (`gather`), and
ragged rollouts as one padded tensor plus lengths (`gather_ragged`), never as
`all_gather_object` lists of Python objects; `scatter` hands rank 0's objects out the same
way.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import os
import pickle
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

# The oldest torch the code is tested against: CI's 2.13 and the GPU device image's 2.11
# (tests/trainer, tests/distributed and tests/algorithms pass on both on CPU). pyproject's
# floor says the same (tests/docs/test_constraints.py keeps them equal). FSDP2's
# activation-checkpointing fix (trainer.distributed.layer_inputs_in) is tested on both.
MIN_TORCH = (2, 11)


def check_torch(ranks: int, version: str | None = None) -> None:
    """Refuse FSDP2 (several ranks) on a torch older than MIN_TORCH, in one line, before
    any job or process group starts."""
    from packaging.version import Version

    found = Version(version or torch.__version__)
    if ranks > 1 and found.release[:2] < MIN_TORCH:
        floor = ".".join(map(str, MIN_TORCH))
        raise ValueError(f"{ranks} training ranks run FSDP2, which this project runs on "
                         f"torch>={floor}; this is torch {found}: pip install "
                         f"'torch>={floor}' (or train on one GPU)")


# A rank that waits this long in a collective gives up (torchrun ends the job sooner when a
# peer process exits). Short: every collective here is entered by all ranks together, since
# a wait on one rank's long work (the rollout worker, a checkpoint write, a slow load, MLflow)
# goes through `align` first, which has no fixed limit but notices a dead or hung peer within
# this same time. RPG_COLLECTIVE_TIMEOUT_S overrides it (the fault drills use seconds).
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
TIMEOUT_ENV = "RPG_COLLECTIVE_TIMEOUT_S"


def collective_timeout() -> datetime.timedelta:
    """COLLECTIVE_TIMEOUT, or RPG_COLLECTIVE_TIMEOUT_S seconds when set (a positive number)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return COLLECTIVE_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r}: give a positive number of seconds, or unset "
                         f"it for the default ({COLLECTIVE_TIMEOUT.total_seconds():.0f} s)")
    return datetime.timedelta(seconds=seconds)


@dataclass(frozen=True)
class World:
    """This process's place in the job."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1  # ranks on this node (torchrun's LOCAL_WORLD_SIZE)

    @property
    def main(self) -> bool:
        """Rank 0: the only writer of metrics, MLflow, checkpoints and DONE."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def init(device_type: str) -> World:
    """Join torchrun's process group (env RANK, WORLD_SIZE, LOCAL_RANK); a plain process is
    world size 1 and creates no group."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    world = World(int(os.environ["RANK"]), size, int(os.environ.get("LOCAL_RANK", "0")),
                  int(os.environ.get("LOCAL_WORLD_SIZE", str(size))))
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(world.local_rank)
        dist.init_process_group(backend, timeout=collective_timeout())
    _Heartbeat.start(world)
    return world


def shutdown() -> None:
    _Heartbeat.stop()
    if dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------ waits on uneven work

# How often a rank's heartbeat ticks, and how often a waiting rank looks (seconds).
HEARTBEAT_S = 1.0
ALIGN_POLL_S = 0.05
_PREFIX = "rpg/"


class PeerLost(RuntimeError):
    """A rank waiting in `align` saw a peer's heartbeat stop: that rank died or hung."""


class _Heartbeat:
    """A daemon thread that ticks this rank's counter in the process group's store every
    HEARTBEAT_S, so a rank waiting in `align` can tell a peer at work (ticking) from a dead
    one (not). The counter lives in torchrun's store, which outlives every rank."""

    _thread = None
    _stop = None

    @classmethod
    def start(cls, world: World) -> None:
        if cls._thread is not None or not world.distributed:
            return
        store, key, stop = _store(), f"{_PREFIX}alive/{world.rank}", threading.Event()

        def tick() -> None:
            while not stop.wait(HEARTBEAT_S):
                try:
                    store.add(key, 1)
                except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                    return

        store.add(key, 1)
        cls._stop = stop
        cls._thread = threading.Thread(target=tick, name="rpg-heartbeat", daemon=True)
        cls._thread.start()

    @classmethod
    def stop(cls) -> None:
        if cls._thread is not None:
            cls._stop.set()
            cls._thread.join(timeout=5)
        cls._thread = cls._stop = None


def _store():
    """The default process group's key-value store (torchrun's TCPStore, under a prefix)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


_aligned = 0  # how many `align` calls this process made (the same on every rank)
# Set by a stop signal (trainer.checkpoint.PreemptionFlag): from then on a peer silent for
# SILENT_WHEN_STOPPING_S is taken for dead. torchrun SIGTERMs the survivors of a rank that
# died, and a survivor waiting in `align` must then end before torchrun's SIGKILL, which
# would leave its rollout worker's files behind; a preempted job's ranks all beat on.
STOPPING = threading.Event()
SILENT_WHEN_STOPPING_S = 5 * HEARTBEAT_S


def align(world: World, what: str) -> None:
    """Every rank reaches this point before any goes on: the wait before a collective that
    follows work only some ranks do (rank 0 waiting for the rollout worker, writing a
    checkpoint, loading weights, talking to MLflow). Unlike a collective it has no fixed
    limit, which such work would outlast (hours of generation at the paper's sizes): it polls
    the store and ends only when a peer that has not arrived stops its heartbeat for the
    collective timeout (PeerLost, naming the rank and `what` was being waited for). A rank
    that exits is noticed sooner by torchrun, which ends the job."""
    global _aligned
    if not world.distributed:
        return
    _aligned += 1
    store, key = _store(), f"{_PREFIX}align/{_aligned}"
    store.add(key, 1)
    timeout = collective_timeout().total_seconds()
    peers = [r for r in range(world.size) if r != world.rank]
    seen = {r: (store.add(f"{_PREFIX}alive/{r}", 0), time.monotonic()) for r in peers}
    next_look = time.monotonic() + HEARTBEAT_S
    while store.add(key, 0) < world.size:
        time.sleep(ALIGN_POLL_S)
        now = time.monotonic()
        if now < next_look:
            continue
        next_look = now + HEARTBEAT_S
        limit = min(timeout, SILENT_WHEN_STOPPING_S) if STOPPING.is_set() else timeout
        for r in peers:
            beat = store.add(f"{_PREFIX}alive/{r}", 0)
            if beat != seen[r][0]:
                seen[r] = (beat, now)
            elif now - seen[r][1] > limit and store.add(key, 0) < world.size:
                raise PeerLost(
                    f"rank {world.rank} waited for every rank at {what!r}: rank {r} has shown "
                    f"no sign of life for {now - seen[r][1]:.0f} s (> {limit:.0f} s: the "
                    f"collective timeout, {TIMEOUT_ENV}, or {SILENT_WHEN_STOPPING_S:.0f} s once "
                    "the job is being stopped); it died or hung: see its log")
    if _aligned > 2:  # every rank is past the one before last: its key is no longer read
        store.delete_key(f"{_PREFIX}align/{_aligned - 2}")


def mesh_shape(world: World) -> tuple[int, ...]:
    """(ranks,) on one node; (nodes, ranks per node) across nodes: HSDP replicates across
    nodes and shards within one, so the per-layer all-gathers and reduce-scatters stay on
    the node's fast links and only one gradient all-reduce per layer crosses nodes."""
    if world.local_size >= world.size or world.size % world.local_size:
        return (world.size,)
    return (world.size // world.local_size, world.local_size)


def device_mesh(world: World, device_type: str):
    from torch.distributed.device_mesh import init_device_mesh

    shape = mesh_shape(world)
    names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def mixed_precision(param_dtype: torch.dtype | None):
    """FSDP2's policy for the decoder layers: weights all-gathered and computed in
    `param_dtype` (bf16 on GPU: half the bytes and unsharded-layer memory of float32),
    gradients reduced in float32 and applied to the float32 master shards."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def _cast_output(dtype: torch.dtype, module, args, output):
    """Forward hook: `output`'s floating tensors (a tensor or a tuple of them) in `dtype`."""
    def cast(t):
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
    return tuple(cast(t) for t in output) if isinstance(output, tuple) else cast(output)


def layer_inputs_in(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Make what enters the decoder layers already `dtype`: the token embeddings and the
    rotary (cos, sin) the backbone computes once for all layers are cast as they are made.

    Why: FSDP2's policy casts a layer's floating inputs to its param dtype in the layer's
    pre-forward hook. Where a checkpoint runs that hook inside it (transformers'
    checkpointing), torch before 2.13 (pytorch#159359, fixed by #182580) skips the cast in
    the recompute, so the layer recomputes from float32 inputs what it computed from bf16
    ones and the backward stops with "CheckpointError: Recomputed values ... saved bf16,
    recomputed float32". The trainer's own checkpoint sits inside the hooks
    (`trainer.parallelize`), which avoids it too; this is the second defence, for a model
    whose checkpointing is set up otherwise. Inputs that are already bf16 make the cast a
    no-op in both passes on every torch. Idempotent."""
    backbone = model.get_decoder()
    if getattr(backbone, "_layer_inputs_dtype", None) == dtype:
        return
    hook = functools.partial(_cast_output, dtype)
    for module in (backbone.get_input_embeddings(), getattr(backbone, "rotary_emb", None)):
        if module is not None:
            module.register_forward_hook(hook)
    backbone._layer_inputs_dtype = dtype


def apply_fsdp(model: torch.nn.Module, mesh, param_dtype: torch.dtype | None = None,
               offload: bool = False) -> torch.nn.Module:
    """`fully_shard` each decoder layer with `mixed_precision(param_dtype)`, then the root.

    The root (embeddings, final norm, LM head) keeps its storage dtype when gathered: the
    chunked head casts its weight per chunk (trainer.logprobs), and a bf16 unsharded head
    would sum its gradient over the chunks in bf16. With a `param_dtype`, the layers'
    inputs are made in it (`layer_inputs_in`), so activation checkpointing inside a layer
    recomputes from the inputs the forward saw on every torch. `offload`: shards and
    optimizer-free weights live on the CPU between uses (FSDP2's CPUOffloadPolicy; the held
    reference).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: no decoder `layers` to shard")
    if param_dtype is not None:
        layer_inputs_in(model, param_dtype)
    offload_policy = CPUOffloadPolicy(pin_memory=False) if offload else OffloadPolicy()
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mixed_precision(param_dtype),
                    offload_policy=offload_policy)
    fully_shard(model, mesh=mesh, mp_policy=mixed_precision(None), offload_policy=offload_policy)
    return model


def shard(model: torch.nn.Module, world: World, device_type: str,
          param_dtype: torch.dtype | None = None, offload: bool = False) -> torch.nn.Module:
    """FSDP2 over `device_mesh(world)` (`apply_fsdp`); world size 1: the model as it is.

    Parameters stay in their storage dtype (float32 master weights and AdamW states,
    sharded); decoder layers compute in `param_dtype` (the trainer passes its autocast
    dtype: bf16 on GPU). Gradients are reduced in float32.
    """
    if not world.distributed:
        return model
    return apply_fsdp(model, device_mesh(world, device_type), param_dtype, offload)


def fsdp_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every FSDP2-sharded module in `model` (each decoder layer and the root)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def unsharded(model: torch.nn.Module, world: World):
    """Full weights on every rank for the duration (generation): one all-gather in, no
    collective per forward inside, so ranks may run different numbers of forwards.

    `unshard()`/`reshard()` act on one module's own parameters, not its children's, so
    each FSDP module is gathered and released: otherwise the layers would gather lazily at
    their first forward and keep their full weights after generation. On the way out each
    module gets FSDP2's default back (`restore_reshard_defaults`); an unshard that fails
    half-way still reshards what it gathered."""
    if not world.distributed:
        yield
        return
    modules = fsdp_modules(model)
    try:
        model.set_reshard_after_forward(False, recurse=True)
        for m in modules:
            m.unshard()
        yield
    finally:
        for m in modules:
            m.reshard()
        restore_reshard_defaults(model)


def restore_reshard_defaults(root: torch.nn.Module) -> None:
    """FSDP2's `reshard_after_forward` defaults on `root` and its FSDP children: the layers
    reshard after each forward (their all-gather is what sharding saves), the root keeps
    its parameters (the embeddings and head, needed again by the backward). A plain
    `set_reshard_after_forward(True)` would leave the root resharding after every forward,
    so every later micro-batch gathers the float32 embedding and head again."""
    root.set_reshard_after_forward(True, recurse=True)
    root.set_reshard_after_forward(False, recurse=False)


# ------------------------------------------------------------------ set-up: rank 0 reads

# Set-up memory (docs/performance.md): rank 0 alone reads the checkpoint; every other rank
# builds the model on the meta device (no storage), and every held copy (the reference)
# is a meta twin. After `fully_shard`, rank 0's full weights are broadcast into each
# rank's shards (`load_from_rank0`). verl's FSDP2 workers do the same.


def empty_model(path, **kwargs):
    """The checkpoint's model with its parameters and buffers on the meta device (no
    storage; config.json and generation_config.json are read, model.safetensors is not).
    `kwargs` as for `from_pretrained` (dtype, attn_implementation)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    kwargs.pop("trust_remote_code", None)  # never the repository's own code
    config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False, **kwargs)
    with contextlib.suppress(OSError):  # EOS ids live there (common.generation.hf)
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model


def meta_twin(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy whose parameters are on the meta device (tied parameters stay tied;
    buffers are copied, being small): a held copy that costs no memory until
    `load_from_rank0` fills its shards."""
    memo = {id(p): torch.nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
            for p in module.parameters()}
    return copy.deepcopy(module, memo)


def full_state_on_rank0(module: torch.nn.Module, world: World) -> dict:
    """Rank 0's full weights (references, no copy) for `load_from_rank0`; {} on other
    ranks and at world size 1. Taken before `fully_shard`, which replaces the parameters
    by shards."""
    return dict(module.state_dict()) if world.main and world.distributed else {}


def load_from_rank0(module: torch.nn.Module, full_state: dict, world: World,
                    device: torch.device, offload: bool = False) -> None:
    """Fill an FSDP2-sharded `module` (meta or not) with rank 0's `full_state`.

    Meta shards are allocated first (`to_empty`: on `device`, or on the CPU with
    `offload`, where CPUOffloadPolicy keeps them). torch's `set_model_state_dict(...,
    full_state_dict=True, broadcast_from_rank0=True)` then broadcasts one tensor at a time
    (on the process group's device) and each rank copies its slice into its shard, cast to
    the shard's dtype (a bf16 reference from float32 weights). Buffers (rotary inv_freq:
    not in the state dict) are broadcast from rank 0's module and live on `device`.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    align(world, "rank 0's weights")  # it read them from disk while the others waited
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()
               if not b.is_meta} if world.main else {}
    if any(t.is_meta for t in (*module.parameters(), *module.buffers())):
        module.to_empty(device=torch.device("cpu") if offload else device)
    # a copy: set_model_state_dict writes this rank's shards into the dict it is given,
    # and the same full state fills the reference next
    set_model_state_dict(module, dict(full_state), options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():
        for name, b in module.named_buffers():
            b.data = b.data.to(device)
            if world.main:
                b.copy_(buffers[name])
            _broadcast(b, world)


# ------------------------------------------------------------------ collectives


def collective_device(backend: str, local_rank: int) -> torch.device:
    """Where a collective's tensors must live for this process group backend: NCCL works
    on CUDA tensors only (the rank's own GPU); gloo, and a mixed `cpu:gloo,cuda:nccl`
    group, take CPU tensors (no device copy for small control values)."""
    if backend == "nccl":
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _device(world: World) -> torch.device:
    return collective_device(str(dist.get_backend()), world.local_rank)


def _broadcast(x: torch.Tensor, world: World) -> None:
    """Rank 0's `x` into every rank's `x`, in place."""
    y = x.to(_device(world))
    dist.broadcast(y, src=0)
    if y is not x:
        x.copy_(y)


def _all_reduce(x: torch.Tensor, op, world: World) -> torch.Tensor:
    if not world.distributed:
        return x
    y = x.to(_device(world))
    dist.all_reduce(y, op=op)
    if y is not x:
        x.copy_(y)
    return x


def all_sum(x: torch.Tensor, world: World) -> torch.Tensor:
    return _all_reduce(x, dist.ReduceOp.SUM, world)


def all_max(x: torch.Tensor, world: World) -> torch.Tensor:
    return _all_reduce(x, dist.ReduceOp.MAX, world)


def pad_to(count: int, world: World) -> int:
    """The largest `count` over ranks (so every rank makes that many forward calls)."""
    if not world.distributed:
        return count
    return int(all_max(torch.tensor([count]), world))


def _all_gather_padded(flat: torch.Tensor, world: World) -> list[torch.Tensor]:
    """Every rank's 1-D `flat` (lengths may differ), in rank order: one gather of the
    lengths, one of the values padded to the longest."""
    device = _device(world)
    n = torch.tensor([flat.numel()], device=device)
    ns = [torch.zeros_like(n) for _ in range(world.size)]
    dist.all_gather(ns, n)
    counts = [int(c) for c in ns]  # one host sync
    padded = torch.zeros(max(counts), dtype=flat.dtype, device=device)
    padded[: flat.numel()] = flat.to(device)
    out = [torch.empty_like(padded) for _ in range(world.size)]
    dist.all_gather(out, padded)
    return [t[:c].cpu() for t, c in zip(out, counts)]


def gather_ragged(rows: list[list], world: World, dtype: torch.dtype) -> list[list[list]]:
    """Every rank's list of variable-length rows (token ids, log-probs), in rank order, as
    Python lists: gathered as one flat padded tensor plus the row lengths."""
    if not world.distributed:
        return [rows]
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    flat = torch.tensor([x for r in rows for x in r], dtype=dtype)
    out = []
    for lens, values in zip(_all_gather_padded(lengths, world),
                            _all_gather_padded(flat, world)):
        out.append([part.tolist() for part in torch.split(values, lens.tolist())])
    return out


def gather(obj, world: World) -> list:
    """Every rank's picklable `obj`, in rank order, on every rank (small control objects:
    pickled bytes in a tensor on the collective device)."""
    if not world.distributed:
        return [obj]
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    return [pickle.loads(t.numpy().tobytes()) for t in _all_gather_padded(data, world)]


def scatter(objs: list | None, world: World):
    """Item r of rank 0's list of picklable objects, on rank r (`objs` is read on rank 0
    only): one process's results handed out to the ranks (trainer.async_rollout). Pickled
    bytes in tensors padded to the longest, as `gather` does."""
    if not world.distributed:
        return objs[0]
    device = _device(world)
    blobs = [pickle.dumps(o) for o in objs] if world.main else []
    sizes = torch.tensor([len(b) for b in blobs] if world.main else [0] * world.size,
                         dtype=torch.long)
    _broadcast(sizes, world)
    width = int(sizes.max())
    chunks = None
    if world.main:
        chunks = [torch.zeros(width, dtype=torch.uint8, device=device) for _ in blobs]
        for chunk, blob in zip(chunks, blobs):
            chunk[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    out = torch.empty(width, dtype=torch.uint8, device=device)
    dist.scatter(out, chunks, src=0)
    return pickle.loads(out[: int(sizes[world.rank])].cpu().numpy().tobytes())


def any_rank(flag: bool, world: World) -> bool:
    """True on every rank if it is true on any (e.g. a preemption signal)."""
    return bool(all_max(torch.tensor([int(flag)]), world)) if world.distributed else flag


def sharded_model_state(module: torch.nn.Module) -> dict:
    """This rank's shards of the weights (DTensors under FSDP2, plain tensors otherwise),
    keyed like `module.state_dict()`: what `trainer.sharded_state` saves, and the template
    it loads into."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(module)


def sharded_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """This rank's shards of the optimizer state, keyed by parameter names (initialised
    first when the optimizer has not stepped yet, so it can serve as a load template)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer)


def set_sharded_state(module: torch.nn.Module, model_state: dict,
                      optimizer: torch.optim.Optimizer | None = None,
                      optimizer_state: dict | None = None) -> None:
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    set_model_state_dict(module, model_state)
    if optimizer is not None:
        set_optimizer_state_dict(module, optimizer, optimizer_state)


def barrier(world: World, what: str = "a barrier") -> None:
    """Every rank here before any goes on (`align`: no fixed limit for uneven work)."""
    align(world, what)


def model_state(module: torch.nn.Module) -> dict:
    """The full (unsharded) weights on CPU, keyed like `module.state_dict()`; a collective
    under FSDP2. For the HF checkpoint rank 0 writes (the resume state is saved sharded)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
