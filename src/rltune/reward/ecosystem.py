"""Rewards from the field's libraries (docs/agents.md, "reasoning-gym and math-verify"); each library
is imported only when its reward is first called (`pip install 'rltune[envs]'`).

builtin:reasoning_gym   the dataset's own `score_answer(answer, entry)` for rows of
                        `data.train: reasoning_gym:NAME`. The entry is rebuilt exactly from the row's
                        `reasoning_gym` column (dataset, options, seed, index); the answer is the text
                        of the completion's last <answer>...</answer> (reasoning_gym.utils.extract_answer,
                        as reasoning-gym's own evaluations read it), or the whole completion, stripped,
                        when it has no such tags (so a bare answer counts; extra words around it cost
                        what that dataset's score_answer makes them cost).
builtin:math_verify     1.0 when math-verify finds the completion's final answer equal to the row's
                        `answer` (LaTeX, \\boxed{}, fractions, sets, intervals, as it supports them),
                        else 0.0. Each completion is scored in a worker process (spawned once),
                        where its parse and comparison together are interrupted at
                        MATH_VERIFY_TIMEOUT_S by a signal (the worker's main thread: it works whatever
                        thread the trainer scores in); a worker stuck past that in native code a
                        signal cannot interrupt (sympy's huge integer powers) is killed. Either way
                        the completion scores 0, as math-verify scores its own timeouts. An `answer`
                        math-verify cannot parse raises (reward.on_error).
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
from functools import lru_cache

MATH_VERIFY_TIMEOUT_S = 5.0     # per completion: parsing it and comparing it with the answer
WORKER_SLACK_S = 60.0           # the worker's start (spawn, imports) on top of the per-completion bounds
INSTALL_FIX = "pip install 'rltune[envs]'"


# -- reasoning-gym

@lru_cache(maxsize=16)
def _rg_dataset(name: str, options_json: str, seed: int, size: int):
    from rltune.envs.reasoning_gym import make_dataset

    return make_dataset(name, json.loads(options_json), seed, size)


@lru_cache(maxsize=4096)
def _rg_entry(meta_json: str):
    meta = json.loads(meta_json)
    ds = _rg_dataset(meta["dataset"], json.dumps(meta.get("options") or {}, sort_keys=True),
                     int(meta["seed"]), int(meta["size"]))
    return ds, ds[int(meta["index"])]


def rg_extract(completion: str) -> str:
    """The answer reasoning-gym scores: the last <answer>...</answer>'s text, else the whole completion."""
    from reasoning_gym.utils import extract_answer

    found = extract_answer(completion)
    return found if found is not None else completion.strip()


def reasoning_gym(prompts, completions, reasoning_gym=None, answer=None, **_):  # noqa: A002 - the column's name
    """The dataset's own score_answer for each completion against its row's entry."""
    if reasoning_gym is None:
        raise ValueError("builtin:reasoning_gym needs the rows of data.train reasoning_gym:NAME "
                         "(their `reasoning_gym` column); this data has none")
    try:
        import reasoning_gym as _rg  # noqa: F401
    except ImportError:
        raise ValueError(f"builtin:reasoning_gym needs reasoning-gym, which is not installed: {INSTALL_FIX}") from None
    out = []
    for i, (completion, meta) in enumerate(zip(completions, reasoning_gym)):
        ds, entry = _rg_entry(meta)
        if answer is not None and answer[i] is not None and str(entry.get("answer")) != str(answer[i]):
            raise ValueError(f"the rebuilt reasoning-gym entry's answer {entry.get('answer')!r} is not the row's "
                             f"{answer[i]!r} (a different reasoning-gym version than the one that made the rows?)")
        out.append(float(ds.score_answer(rg_extract(completion), entry)))
    return out


# -- math-verify

class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _mv():
    try:
        import math_verify
        from math_verify import grader, parser
    except ImportError:
        raise ValueError(f"builtin:math_verify needs math-verify, which is not installed: {INSTALL_FIX}") from None
    # rltune bounds each completion itself (below): math-verify's own signal timeouts are off, and
    # so is its warning that they are
    parser.TIMEOUT_WARNING_SHOWN = grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


@lru_cache(maxsize=4096)
def _gold(answer: str):
    mv = _mv()
    text = str(answer)
    gold = mv.parse(text if "$" in text or "\\boxed" in text else f"${text}$", parsing_timeout=None,
                    fallback_mode="no_fallback")
    if not gold:
        gold = mv.parse(text, parsing_timeout=None, fallback_mode="no_fallback")
    if not gold:      # nothing math-verify reads as mathematics (its string fallback is no answer to compare with)
        raise ValueError(f"math-verify cannot parse the row's answer {text!r}")
    return gold


def _score_one(completion: str, gold, timeout_s: float) -> float:
    """1.0 / 0.0, math-verify's parse and verify of one completion under one SIGALRM deadline."""
    import signal

    mv = _mv()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        pred = mv.parse(completion, parsing_timeout=None)
        return 1.0 if pred and mv.verify(gold, pred, timeout_seconds=None) else 0.0
    except _Timeout:
        return 0.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def math_verify_scores(completions, answers, timeout_s: float = None) -> list[float]:
    """Scores in this (main) thread; a worker process calls this too."""
    timeout_s = MATH_VERIFY_TIMEOUT_S if timeout_s is None else timeout_s
    golds = [_gold(a) for a in answers]   # the row's answer: unparseable -> raise (reward.on_error)
    return [_score_one(c, g, timeout_s) for c, g in zip(completions, golds)]


_POOL = {"pool": None}
_POOL_LOCK = threading.Lock()
ITEM_SLACK_S = 2.0              # IPC on top of each completion's bound before the worker is killed


def _ready() -> bool:
    _mv()
    return True


def _worker_pool():
    import multiprocessing as mp

    if _POOL["pool"] is None:
        pool = mp.get_context("spawn").Pool(1)
        atexit.register(pool.terminate)
        try:
            pool.apply_async(_ready).get(WORKER_SLACK_S)    # its start: spawn, imports
        except mp.TimeoutError:
            pool.terminate()
            raise TimeoutError(f"builtin:math_verify's worker did not start within {WORKER_SLACK_S:g} s") from None
        _POOL["pool"] = pool
    return _POOL["pool"]


def _in_worker(completions, answers) -> list[float]:
    """Each completion scored in a spawned worker (its main thread, where math-verify's parse and
    verify are interrupted at MATH_VERIFY_TIMEOUT_S by a signal); a worker still busy ITEM_SLACK_S
    later (stuck in native code a signal cannot interrupt: sympy's big-integer powers) is killed,
    the completion scores 0 and the next one gets a fresh worker. The row's answer is parsed there too:
    one math-verify cannot read raises here (reward.on_error)."""
    import multiprocessing as mp

    timeout_s = MATH_VERIFY_TIMEOUT_S
    out = []
    with _POOL_LOCK:
        for completion, answer in zip(completions, answers):
            pool = _worker_pool()
            try:
                out.append(pool.apply_async(math_verify_scores, ([completion], [answer], timeout_s)).get(
                    timeout_s + ITEM_SLACK_S)[0])
            except mp.TimeoutError:
                pool.terminate()
                _POOL["pool"] = None
                logging.getLogger("rltune").warning(
                    "builtin:math_verify: a completion ran over %g s (in native code) and scored 0; its worker "
                    "was restarted", timeout_s)
                out.append(0.0)
    return out


def math_verify(prompts, completions, answer=None, **_):
    """1.0 when the completion's final answer equals the row's `answer` by math-verify, else 0.0."""
    if answer is None:
        raise ValueError("builtin:math_verify needs an 'answer' column in the data")
    if any(a is None for a in answer):
        raise ValueError("builtin:math_verify: a row has no answer (None)")
    _mv()
    return _in_worker(completions, [str(a) for a in answer])
