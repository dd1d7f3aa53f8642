"""Collection: one step's rollout and reward, with dynamic sampling.

    collector = Collector(cfg, world, device, models, problems, sampler, engine)
    rollout = collector.collect(step)     # Rollout: the packed batch of kept groups + stats

A round draws prompts (every rank the same global ones, in seeded per-epoch permutations),
generates this rank's contiguous share with n responses each (hf or vllm engine), scores
them with the evaluation grader (+ DAPO's overlong shaping) and gathers every rank's round in
rank order. Dynamic sampling drops groups that cannot teach (all correct or all wrong) and
draws more rounds until `prompts_per_step` groups are kept or `max_gen_batches` is reached;
the extra groups of the last round are generated but not trained on, as DAPO does.

Legend: G groups (prompts) kept, n responses per prompt, B = G * n sequences.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field

import numpy as np
import torch

from common.prompts import build_prompt, encode_prompts
from trainer import distributed
from trainer.logprobs import PackedBatch, pack
from trainer.tasks import score


class PromptSampler:
    """Prompt indices in seeded per-epoch permutations; its position is part of the resume state."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed
        self.epoch, self.pos = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        random.Random(f"prompts-{self.seed}-{epoch}").shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.size:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation(self.epoch)


def generation_seed(seed: int, step: int, gen_batch: int) -> int:
    """A distinct, reproducible sampling seed per (run seed, step, generation batch)."""
    return (seed * 1_000_003 + step * 1_009 + gen_batch * 7) % (2**31 - 1)


def overlong_penalty(length: int, max_new_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO soft overlong punishment: 0 up to max-buffer, then linear down to -penalty at max."""
    start = max_new_tokens - buffer
    return -penalty * min(1.0, (length - start) / buffer) if length > start else 0.0


def has_signal(rewards: list[float], correct: list[bool], metric: str) -> bool:
    """Dynamic sampling's filter: keep a group only if it can teach something.

    acc (DAPO, the recipe's `filter_groups.metric=acc`): 0 < #correct < n, so an all-wrong
    group is dropped even when the overlong penalty makes its rewards differ. score: the
    shaped rewards are not all equal."""
    if metric == "acc":
        return 0 < sum(correct) < len(correct)
    return max(rewards) != min(rewards)


@dataclass
class Round:
    """One generation round of one rank: groups of n responses, prompt-major."""

    prompt_ids: list[list[int]]  # per group
    token_ids: list[list[int]]  # per response
    rewards: list[float]
    correct: list[bool]
    truncated: list[bool]
    logprobs: list[list[float] | None]  # per response: the engine's (vllm), or None (hf)


def gather_rounds(mine: Round, world: distributed.World) -> list[Round]:
    """Every rank's round, in rank order. Token ids and engine log-probs go as padded
    tensors with lengths (GBs of Python objects per rank at paper scale otherwise); the
    per-response scalars ride along as rows of length 1."""
    if not world.distributed:
        return [mine]
    ids = distributed.gather_ragged(mine.prompt_ids + mine.token_ids, world, torch.long)
    # float64: log-probs, rewards and flags come back exactly as they went in.
    has_lp = [lp is not None for lp in mine.logprobs]
    scalars = [[float(x), float(c), float(t), float(h)] for x, c, t, h in
               zip(mine.rewards, mine.correct, mine.truncated, has_lp)]
    floats = distributed.gather_ragged([lp or [] for lp in mine.logprobs] + scalars, world,
                                       torch.float64)
    out = []
    for rank_ids, rank_floats in zip(ids, floats):
        n_groups = len(rank_ids) - len(rank_floats) // 2
        m = len(rank_floats) // 2
        lps, sc = rank_floats[:m], rank_floats[m:]
        out.append(Round(
            prompt_ids=rank_ids[:n_groups], token_ids=rank_ids[n_groups:],
            rewards=[row[0] for row in sc], correct=[bool(row[1]) for row in sc],
            truncated=[bool(row[2]) for row in sc],
            logprobs=[lp if row[3] else None for lp, row in zip(lps, sc)]))
    return out


@dataclass
class Group:
    """One kept group: a prompt and its n responses, with what the update needs of them."""

    prompt_ids: list[int]
    token_ids: list[list[int]]  # per response
    rewards: list[float]
    logprobs: list[list[float] | None]  # per response: the sampler's (mu), or None (hf)
    truncated: list[bool]


@dataclass
class Rollout:
    """One step's training batch (kept groups) plus stats over everything generated."""

    batch: PackedBatch | None
    rewards: torch.Tensor  # (B,)
    group_ids: torch.Tensor  # (B,) long
    stats: dict = field(default_factory=dict)
    engine_logprobs: list | None = None  # per row: the engine's log-probs of its tokens
    truncated: torch.Tensor | None = None  # (B,) bool: cut at max_new_tokens


def generation_stats(rewards: list[float], correct: list[bool], lengths: list[int],
                     truncated: list[bool]) -> dict:
    """Reward, accuracy and length statistics over every response generated in a step."""
    rw = torch.tensor(rewards, dtype=torch.float32)
    return {
        "reward_mean": rw.mean().item(), "reward_std": rw.std(unbiased=False).item(),
        "acc_mean": float(np.mean(correct)),
        "response_length_mean": float(np.mean(lengths)),
        "response_length_max": int(max(lengths)),
        "truncated_frac": float(np.mean(truncated)),
    }


class Collector:
    """Rollout + reward of a run (see module doc): the prompts, the engine that samples and
    the grader; `collect(step)` is one step's Rollout."""

    def __init__(self, cfg, world, device: torch.device, models, problems: list[dict],
                 sampler: PromptSampler, engine) -> None:
        self.cfg, self.world, self.device = cfg, world, device
        self.method = cfg.resolved_method()
        self.models, self.problems, self.sampler, self.engine = models, problems, sampler, engine

    def prompt_texts(self, problems: list[dict]) -> list[str]:
        """The prompts the engine gets for `problems` (the run's template, chat-formatted)."""
        t = self.cfg.task
        return [build_prompt(p["problem"], t.template, self.models.tokenizer,
                             t.chat.enable_thinking) for p in problems]

    def per_round(self) -> int:
        """Prompts drawn per generation round. Without dynamic sampling one round is the
        whole batch: generating gen_prompts_per_round would throw the surplus groups away
        (and walk the data faster than the recipe)."""
        r = self.cfg.rollout
        if self.method.dynamic_sampling:
            return r.gen_prompts_per_round or r.prompts_per_step
        return r.prompts_per_step

    def share(self, idx: list[int], step: int, gen_batch: int, rank: int
              ) -> tuple[list[int], int]:
        """Rank `rank`'s contiguous share of a round's drawn prompt indices `idx`, and the
        seed it samples them with (round `gen_batch` of step `step`)."""
        size = self.world.size
        per_rank = len(idx) // size
        return (idx[rank * per_rank : (rank + 1) * per_rank],
                generation_seed(self.cfg.seed, step, gen_batch * size + rank))

    def first_round(self, step: int) -> list[tuple[list[str], int]]:
        """Every rank's share (prompts, seed) of step `step`'s first generation round, in
        rank order, read without drawing them: an overlapped worker samples them ahead
        (trainer.async_rollout), and `collect(step)` then asks for the very same."""
        ahead = PromptSampler(self.sampler.size, self.sampler.seed)
        ahead.load_state_dict(self.sampler.state_dict())
        idx = ahead.take(self.per_round())
        shares = [self.share(idx, step, 0, rank) for rank in range(self.world.size)]
        return [(self.prompt_texts([self.problems[i] for i in mine]), seed)
                for mine, seed in shares]

    def generate_round(self, problems: list[dict], seed: int) -> Round:
        """Generate and score one round's problems (this rank's share of them)."""
        r, t = self.cfg.rollout, self.cfg.task
        tokenizer = self.models.tokenizer
        texts = self.prompt_texts(problems)
        # the hf engine in process samples with the sampling weights' log-prob module (the
        # lag's under staleness), gathered whole; an async worker holds its own weights
        here = r.engine == "hf" and r.mode == "sync"
        gather = (distributed.unsharded(self.models.behaviour_policy, self.world) if here
                  else contextlib.nullcontext())
        # model.compile compiles the layers for the log-prob and update passes; decoding one
        # token at a time on a growing cache would recompile per length, so it runs eager.
        eager = (torch.compiler.set_stance("force_eager") if self.cfg.model.compile
                 else contextlib.nullcontext())
        with gather, eager:  # the hf engine decodes with the training model's (full) weights
            samples = self.engine.generate(texts, n=r.n, seed=seed)
        flat = [s for group in samples for s in group]
        golds = [p["answer"] for p in problems for _ in range(r.n)]
        rewards, correct = score([s.text for s in flat], golds, t)
        if self.method.overlong_shaping:
            rewards = [rw + overlong_penalty(len(s.token_ids), r.max_new_tokens,
                                             r.overlong_buffer, r.overlong_penalty)
                       for rw, s in zip(rewards, flat)]
        return Round(
            prompt_ids=encode_prompts(tokenizer, texts),
            token_ids=[list(s.token_ids) for s in flat], rewards=list(rewards),
            correct=list(correct), truncated=[s.finish_reason == "length" for s in flat],
            logprobs=[s.logprobs for s in flat])

    def collect(self, step: int) -> Rollout:
        """Rollout + reward (+ dynamic sampling) of RL step `step`. Stats cover every
        generated response.

        Every rank draws the same global prompts and generates its contiguous share; the
        rounds are gathered in rank order, so every rank holds the same kept groups in the
        single-process order and makes the same refill decision."""
        r, world = self.cfg.rollout, self.world
        dynamic = self.method.dynamic_sampling
        kept: list[Group] = []
        all_rewards, all_correct, lengths, truncated = [], [], [], []
        gen_batches = dropped = 0
        per_round = self.per_round()
        while True:
            mine, seed = self.share(self.sampler.take(per_round), step, gen_batches, world.rank)
            rounds = gather_rounds(
                self.generate_round([self.problems[i] for i in mine], seed), world)
            gen_batches += 1
            for res in rounds:
                all_rewards += res.rewards
                all_correct += res.correct
                lengths += [len(ids) for ids in res.token_ids]
                truncated += res.truncated
                for g, prompt_ids in enumerate(res.prompt_ids):
                    group = slice(g * r.n, (g + 1) * r.n)
                    group_rewards = res.rewards[group]
                    if dynamic and not has_signal(group_rewards, res.correct[group],
                                                  r.filter_metric):
                        dropped += 1
                        continue
                    kept.append(Group(prompt_ids, res.token_ids[group], group_rewards,
                                      res.logprobs[group], res.truncated[group]))
            if not dynamic or len(kept) >= r.prompts_per_step or gen_batches >= r.max_gen_batches:
                break
        # One sleep per rollout, after its last round: vLLM stays awake between rounds. Only
        # when an update follows: it re-pushes the weights a level-2 sleep discards.
        if kept:
            self.engine.sleep()
        # Extra groups from the last refill are generated but not trained on (DAPO does the same).
        groups_kept = min(len(kept), r.prompts_per_step)
        dropped += len(kept) - groups_kept
        kept = kept[:groups_kept]
        stats = {**generation_stats(all_rewards, all_correct, lengths, truncated),
                 "groups_kept": groups_kept, "groups_dropped": dropped,
                 "gen_batches": gen_batches, "response_tokens": int(sum(lengths))}
        if not kept:
            empty = torch.zeros(0)
            return Rollout(None, empty, empty.long(), stats)
        prompts = [g.prompt_ids for g in kept for _ in g.token_ids]
        responses = [ids for g in kept for ids in g.token_ids]
        batch = pack(prompts, responses, self.models.tokenizer.pad_token_id).to(self.device)
        rewards = torch.tensor([x for g in kept for x in g.rewards], device=self.device)
        group_ids = torch.arange(len(kept), device=self.device).repeat_interleave(r.n)
        return Rollout(batch, rewards, group_ids, stats,
                       [lp for g in kept for lp in g.logprobs],
                       torch.tensor([t for g in kept for t in g.truncated], device=self.device))
