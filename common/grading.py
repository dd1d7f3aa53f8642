"""Answer grading: the DAPO/verl "Answer:" scorer and math-verify, with one result type.

Two scorers, both run on every evaluated sample:

* ``dapo`` re-implements the behaviour of the DAPO/verl math reward (the scorer behind the
  RPG paper's numbers), quirks included: look only at the last 300 characters, take what
  follows the last "Answer:" (case-insensitive) on its line, apply Minerva-style
  ``normalize_final_answer`` to it and to the gold, then compare strings. A trailing "." is
  *not* removed ("Answer: 540." is wrong), leading zeros are kept ("033" != "33"), bold
  markers break the match ("**Answer:** 540"), and ``\\boxed{}`` alone is no answer. Pure
  Python on at most 300 characters, so it is cheap enough for the trainer's reward.
* ``math_verify`` uses the math-verify library (``parse`` / ``verify``, gold first). Its
  signal-based timeouts do not work off the main thread, so they are disabled and each item
  runs in a process pool under a wall-clock limit; a worker that exceeds it is killed and
  replaced and the item is counted as ``timeout``. Like lighteval's, it reads any answer it
  can find, boxed or not: in a small model's text it reads "So the final answer is
  41 + 16 = 172." as 57 (the left side), and a list's "5." as the answer 5.
* ``math_verify_boxed`` is math-verify on the response's last ``\\boxed{}`` alone (no box,
  or an empty one: "no_answer"), read with anchored extraction (LaTeX inside the box only,
  no fallback to a bare number), and a number gold is matched only by a written number
  (``\\boxed{32 + 48}`` restates "What is 32 + 48?"): the format the boxed templates ask
  for, and a reward a small model cannot game by restating the question.

Strict or lenient (`Scorer.strict`, the one owner): a strict scorer credits only the answer
where the prompt asked for it (``dapo``: the last "Answer:" line; ``math_verify_boxed``: the
last box); ``math_verify`` is lenient, an evaluation diagnostic, never a training reward
unless a sweep opts in (sweep.checks).

Failure policy: ``status`` is "ok" (an answer was extracted and compared), "no_answer"
(nothing to extract), "timeout" (math_verify only) or "error" (the scorer raised, or the gold
could not be parsed). Only "ok" results can be correct. Nothing from a completion is ever
executed.

    from common.grading import grade, grade_many
    grade("... Answer: 540", "540", "dapo")  # GradeResult(correct=True, extracted='540', ...)
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

from algorithms.registry import Registry

# name -> Scorer (its grading function and whether it is strict); filled below
SCORERS: Registry[Scorer] = Registry("scorer")
# what an evaluation grades with unless told otherwise: the paper's grader and math-verify;
# math_verify_boxed is opt-in (a sweep's eval.scorers, or --scorer)
DEFAULT_SCORERS = ("dapo", "math_verify")
STATUSES = ("ok", "no_answer", "timeout", "error")
DEFAULT_TIMEOUT_S = 10.0
# A fresh worker imports sympy and math-verify (~1-2 s); far more means something is broken.
_WORKER_START_LIMIT_S = 120.0


@dataclass(frozen=True)
class Scorer:
    """A registered scorer: its grading function and whether it is strict.

    strict: it credits only an answer found where the prompt asked for it (anchored
    extraction), so restating the question, or a right number somewhere in the text, earns
    nothing; a lenient scorer reads any answer it can find, which a policy trained on it
    learns to exploit (docs/evaluation.md, "Strict and lenient scorers").
    """

    grade: Callable[..., list[GradeResult]]  # (completions, golds, timeout_s, workers)
    strict: bool


def scorer(name: str, *, strict: bool):
    """Decorator: register a grading function under `name` as a `Scorer`."""

    def add(grade: Callable[..., list[GradeResult]]) -> Callable[..., list[GradeResult]]:
        SCORERS.register(name, Scorer(grade, strict))
        return grade

    return add


def strict_scorers() -> list[str]:
    """The names of the strict scorers, in registration order."""
    return [name for name, s in SCORERS.items() if s.strict]


@dataclass(frozen=True)
class GradeResult:
    """Outcome of grading one completion against one gold answer."""

    correct: bool
    extracted: str | None  # the normalized (dapo) or parsed (math_verify) answer
    status: str  # one of STATUSES


# --------------------------------------------------------------------------------------
# dapo: behaviour of verl's math_dapo.compute_score (Minerva normalisation, string equality)
# --------------------------------------------------------------------------------------

# Source: DAPO/verl keeps only the tail because the longest MATH-500 answer is ~200 chars.
DAPO_TAIL_CHARS = 300
_DAPO_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Minerva (Lewkowycz et al. 2022, App. D) normalisation, applied in this order: first the
# substitutions, then plain deletions of units and TeX noise. Order matters ("a " is removed
# before spaces, "\text{m}" becomes "\text{}" before "\text{}" is deleted).
_MINERVA_SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
    ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)  # fmt: skip
_MINERVA_DELETIONS: tuple[str, ...] = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units",
    "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm",
    "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples",
    "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}",
    "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip
# (pattern, replacement) applied with re.sub after the string edits.
_MINERVA_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r".*?\$(.*?)\$.*"), r"$\1$"),  # keep the first $...$ span
    (re.compile(r"\\text\{(.*?)\}"), r"\1"),
    (re.compile(r"\\textbf\{(.*?)\}"), r"\1"),
    (re.compile(r"\\overline\{(.*?)\}"), r"\1"),
    (re.compile(r"\\boxed\{(.*)\}"), r"\1"),
    (re.compile(r"frac([^{])(.)"), r"frac{\1}{\2}"),  # \frac12 -> \frac{1}{2}
    (re.compile(r"sqrt([^{])"), r"sqrt{\1}"),  # \sqrt2 -> \sqrt{2}
)


def normalize_final_answer(answer: str) -> str:
    """Minerva-style normalisation as used by DAPO/verl (quirks kept on purpose)."""
    text = answer.split("=")[-1]
    for old, new in _MINERVA_SUBSTITUTIONS:
        text = text.replace(old, new)
    for old in _MINERVA_DELETIONS:
        text = text.replace(old, "")
    for pattern, replacement in _MINERVA_REWRITES:
        text = pattern.sub(replacement, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")  # "1,000" -> "1000"
    return text.strip()


def _grade_dapo(completion: str, gold: str) -> GradeResult:
    matches = _DAPO_ANSWER.findall(completion[-DAPO_TAIL_CHARS:])
    if not matches:
        return GradeResult(correct=False, extracted=None, status="no_answer")
    pred = normalize_final_answer(matches[-1])
    return GradeResult(correct=pred == normalize_final_answer(gold), extracted=pred, status="ok")


# --------------------------------------------------------------------------------------
# math_verify: process pool with a per-item wall-clock limit
# --------------------------------------------------------------------------------------


_WORKER_FILE = Path(__file__).with_name("_math_verify_worker.py")


class _Worker:
    """One child process serving math-verify requests as JSON lines over pipes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-u", str(_WORKER_FILE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            encoding="utf-8",
            errors="surrogatepass",
        )
        self.started = time.monotonic()
        self.ready = False
        self.item: int | None = None
        self.deadline = 0.0

    def fileno(self) -> int:
        return self.process.stdout.fileno()

    def send(self, index: int, completion: str, gold: str, strict: bool) -> None:
        # ensure_ascii escapes lone surrogates and control bytes from model output.
        line = json.dumps({"i": index, "completion": completion, "gold": gold,
                           "strict": strict})
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


def default_workers() -> int:
    """The job's CPU budget: `OMP_NUM_THREADS` where set (Snakemake exports the rule's
    `threads:`, 1 in the default), else up to 4 of the machine's cores.

    Why: each worker imports sympy and math-verify (~2 s of CPU); with two one-thread jobs
    side by side on two cores, a second worker per job only adds start-up and contention.
    The grades do not depend on the number of workers (each item is graded on its own).
    """
    budget = os.environ.get("OMP_NUM_THREADS", "")
    if budget.isdigit() and int(budget) > 0:
        return min(4, int(budget))
    return max(1, min(4, os.cpu_count() or 1))


class MathVerifyPool:
    """Grades (completion, gold) pairs with math-verify in `workers` child processes.

    Each item gets `timeout_s` seconds of wall time from the moment a ready worker receives
    it; a worker past its deadline is killed, replaced, and the item is a "timeout".
    Cost: starting a worker imports sympy and math-verify (~1-2 s), so workers are kept
    alive between calls and only replaced after a timeout or a crash.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()
        self._pool: list[_Worker] = []

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._pool[self._pool.index(worker)] = _Worker()

    def _receive(self, worker: _Worker, results: list[GradeResult | None]) -> None:
        try:
            line = worker.process.stdout.readline()
            reply = json.loads(line) if line else None
        except (OSError, ValueError):
            reply = None
        if reply is None:  # the worker died: on start-up that is fatal, on an item an error
            if not worker.ready:
                raise RuntimeError(
                    f"a math_verify worker ({_WORKER_FILE}) exited while starting; "
                    "see its stderr above"
                )
            if worker.item is not None:
                results[worker.item] = GradeResult(False, None, "error")
            self._replace(worker)
        elif "ready" in reply:
            worker.ready = True
        else:
            results[reply["i"]] = GradeResult(reply["correct"], reply["extracted"], reply["status"])
            worker.item = None

    def grade(
        self, completions: Sequence[str], golds: Sequence[str], timeout_s: float,
        strict: bool = False,
    ) -> list[GradeResult]:
        """Grade each pair; `strict`: each completion is an extract, read anchored
        (`_math_verify_worker.grade_one`)."""
        self._pool = [w for w in self._pool if w.process.poll() is None]
        while len(self._pool) < self.workers:
            self._pool.append(_Worker())
        results: list[GradeResult | None] = [None] * len(completions)
        pending = deque(range(len(completions)))
        while pending or any(w.item is not None for w in self._pool):
            for w in self._pool:
                if w.ready and w.item is None and pending:
                    w.item = pending.popleft()
                    try:
                        w.send(w.item, completions[w.item], golds[w.item], strict)
                    except OSError:  # died while idle; its EOF is handled by _receive
                        pass
                    w.deadline = time.monotonic() + timeout_s
            now = time.monotonic()
            busy = [w.deadline for w in self._pool if w.item is not None]
            wait_s = max(0.0, min(busy) - now) if busy else _WORKER_START_LIMIT_S
            for worker in wait(list(self._pool), timeout=wait_s):
                self._receive(worker, results)
            now = time.monotonic()
            for w in list(self._pool):
                if w.item is not None and now > w.deadline:
                    results[w.item] = GradeResult(False, None, "timeout")
                    self._replace(w)
                elif not w.ready and now - w.started > _WORKER_START_LIMIT_S:
                    raise RuntimeError(
                        f"a math_verify worker did not start within {_WORKER_START_LIMIT_S}s"
                    )
        return results  # type: ignore[return-value]

    def close(self) -> None:
        for w in self._pool:
            try:
                w.process.stdin.close()  # EOF ends the worker's loop
                w.process.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
            w.kill()
        self._pool = []


_POOLS: dict[int | None, MathVerifyPool] = {}


def _shared_pool(workers: int | None) -> MathVerifyPool:
    if workers not in _POOLS:
        _POOLS[workers] = MathVerifyPool(workers)
    return _POOLS[workers]


@atexit.register
def close_pools() -> None:
    """Stop the shared math-verify workers (also runs at interpreter exit)."""
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def grade_many(
    completions: Sequence[str],
    golds: Sequence[str],
    scorer: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    workers: int | None = None,
) -> list[GradeResult]:
    """Grade `completions[i]` against `golds[i]` with `scorer`, in order.

    "dapo" runs in-process (no pool; the trainer calls this on every rollout batch).
    "math_verify" runs in a shared pool of `workers` processes with `timeout_s` per item.
    """
    grade_all = SCORERS.get(scorer).grade
    if len(completions) != len(golds):
        raise ValueError(f"{len(completions)} completions but {len(golds)} golds")
    for name, values in (("completion", completions), ("gold", golds)):
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise TypeError(f"{name} {i} is {type(value).__name__}, expected str")
    return grade_all(completions, golds, timeout_s, workers)


# strict: only the last "Answer:" line of the tail is read, and its text compared as a string
@scorer("dapo", strict=True)
def _grade_dapo_many(completions, golds, timeout_s, workers) -> list[GradeResult]:
    """In-process, no pool and no time limit: the trainer calls it on every rollout batch."""
    return [_grade_dapo(c, g) for c, g in zip(completions, golds)]


def _math_verify(completions, golds, timeout_s, workers, strict: bool) -> list[GradeResult]:
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s} must be > 0")
    if not completions:
        return []
    return _shared_pool(workers).grade(completions, golds, timeout_s, strict)


# lenient: reads any expression anywhere (an evaluation diagnostic, not a reward)
@scorer("math_verify", strict=False)
def _grade_math_verify_many(completions, golds, timeout_s, workers) -> list[GradeResult]:
    """In the shared pool of `workers` processes, `timeout_s` per item."""
    return _math_verify(completions, golds, timeout_s, workers, strict=False)


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text` (braces matched), None when there is
    none or it never closes; "" for an empty box."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


@scorer("math_verify_boxed", strict=True)
def _grade_math_verify_boxed_many(completions, golds, timeout_s, workers) -> list[GradeResult]:
    """math-verify on the last boxed answer alone, read anchored; a response without one (or
    with an empty one) has no answer, whatever numbers its text holds."""
    boxed = [last_boxed(c) for c in completions]
    todo = [i for i, b in enumerate(boxed) if b and b.strip()]
    graded = _math_verify(["\\boxed{" + boxed[i] + "}" for i in todo],
                          [golds[i] for i in todo], timeout_s, workers, strict=True)
    out = [GradeResult(False, None, "no_answer")] * len(completions)
    for i, result in zip(todo, graded):  # extracted: the box's text, as the model wrote it
        out[i] = (GradeResult(result.correct, boxed[i], "ok") if result.status == "ok"
                  else result)
    return out


def grade(
    completion: str, gold: str, scorer: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> GradeResult:
    """Grade one completion; see `grade_many`."""
    return grade_many([completion], [gold], scorer, timeout_s=timeout_s)[0]
