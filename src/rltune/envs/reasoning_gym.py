"""reasoning-gym's procedural tasks as prompts (`data.train: reasoning_gym:NAME`, docs/agents.md,
"reasoning-gym and math-verify"); the reward `builtin:reasoning_gym` (reward/ecosystem.py) scores
them with the dataset's own `score_answer`.

    data.train: reasoning_gym:NAME     the dataset registered under NAME (reasoning_gym.factory.DATASETS)
    data.options: {...}                its config class's fields (seed and size are rltune's)
    data.builtin_size / eval_size      how many rows; trainer.seed seeds the generator

Rows: `prompt` (the entry's question), `answer` (the entry's answer), `reasoning_gym` (JSON: the
dataset, its options, seed, size and the entry's index: what the reward rebuilds the exact entry
from) and `metadata` (JSON, the entry's metadata, for reading; tuples and sets become lists, so it is
not what the reward scores against).

Held-out split: every question belongs to eval or to train by a hash of its text (1 in 5 to eval),
and the two splits are drawn with different generator seeds, each derived from trainer.seed and the
split by a hash, so an eval question is never a train question, whatever the seeds.

reasoning_gym is imported only inside these functions (`validate` on other recipes stays fast).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json

from rltune.data.rows import DataError

INSTALL_FIX = "pip install 'rltune[envs]' (or: pip install reasoning-gym)"
RESERVED = {"seed": "trainer.seed seeds the generator", "size": "data.builtin_size (train) and data.eval_size (eval) set it"}
EVAL_BUCKETS = 5          # 1 question in 5 (by hash) is held out for eval
DRAW_FACTOR = 50          # draws at most DRAW_FACTOR * size + 1000 entries before giving up


def _registry():
    try:
        from reasoning_gym.factory import DATASETS
        import reasoning_gym  # noqa: F401 - registers every dataset
    except ImportError:
        return None
    return DATASETS


def _fields(config_cls) -> dict:
    return {f.name: f for f in dataclasses.fields(config_cls) if f.init}


def _config_value(field, value):
    """YAML has no tuples: a list where the config's default is a tuple becomes one."""
    default = field.default if field.default is not dataclasses.MISSING else None
    return tuple(value) if isinstance(value, list) and isinstance(default, tuple) else value


def _config_kwargs(config_cls, options: dict) -> dict:
    fields = _fields(config_cls)
    return {k: _config_value(fields[k], v) for k, v in options.items() if k in fields}


def data_problems(name: str, options: dict) -> list[tuple[str, str]]:
    """What `validate` reports about `reasoning_gym:NAME` with `data.options`, before any model loads."""
    datasets = _registry()
    if datasets is None:
        return [(f"data.train reasoning_gym:{name} needs reasoning-gym, which is not installed", INSTALL_FIX)]
    if name not in datasets:
        close = difflib.get_close_matches(name, list(datasets), n=3, cutoff=0.6)
        hint = ("did you mean " + " or ".join(f"`reasoning_gym:{c}`" for c in close) + "? ") if close else ""
        return [(f"unknown reasoning-gym dataset `{name}`",
                 hint + f"it has {len(datasets)}: " + ", ".join(sorted(datasets)))]
    dataset_cls, config_cls = datasets[name]
    fields = _fields(config_cls)
    valid = [k for k in fields if k not in RESERVED]
    problems = []
    for key in options:
        if key in RESERVED:
            problems.append((f"data.options.{key}: reasoning_gym:{name}'s {key} is rltune's to set",
                             f"remove it: {RESERVED[key]}"))
        elif key not in fields:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
            problems.append((f"data.options.{key} is not an option of reasoning_gym:{name} ({config_cls.__name__})",
                             (f"did you mean `{close[0]}`? " if close else "") + "its options: " + ", ".join(valid)))
    if problems:
        return problems
    try:
        config = config_cls(**_config_kwargs(config_cls, options), seed=0, size=1)
        if callable(getattr(config, "validate", None)):
            config.validate()
        dataset_cls(config=config)[0]       # some generators refuse only when they generate
    except Exception as err:  # noqa: BLE001 - the generator's own refusal, reported as is
        what = str(err) or type(err).__name__
        return [(f"data.options of reasoning_gym:{name}: its config refuses them ({type(err).__name__}: {what})",
                 f"check the values against {config_cls.__name__}'s fields: " + ", ".join(
                     f"{k}={_show(fields[k])}" for k in valid))]
    return []


def _show(field) -> str:
    if field.default is not dataclasses.MISSING:
        return repr(field.default)
    return "(required)" if field.default_factory is dataclasses.MISSING else "(a default)"


def _bucket(question: str) -> int:
    return int(hashlib.sha1(str(question).encode("utf-8")).hexdigest()[:8], 16) % EVAL_BUCKETS


def split_seed(seed: int, split: str) -> int:
    """The generator's seed, derived from the run's and the split by a hash. reasoning-gym's entry i
    comes from Random(seed + i): seeds 7 and 8 would give the same entries shifted by one."""
    return int(hashlib.sha1(f"rltune:{split}:{int(seed)}".encode()).hexdigest()[:8], 16)


def make_dataset(name: str, options: dict, seed: int, size: int):
    """The dataset object (the same entries for the same arguments: what the reward rebuilds)."""
    datasets = _registry()
    if datasets is None:
        raise DataError(f"reasoning_gym:{name} needs reasoning-gym, which is not installed", INSTALL_FIX)
    dataset_cls, config_cls = datasets[name]
    config = config_cls(**_config_kwargs(config_cls, options), seed=seed, size=size)
    return dataset_cls(config=config)


def rows(name: str, options: dict, size: int, seed: int, split: str) -> list[dict]:
    """`size` rows of reasoning_gym:NAME for `split` (train or eval), reproducible from `seed`."""
    problems = data_problems(name, options)
    if problems:
        problem, fix = problems[0]
        raise DataError(f"data.{split}: {problem}", fix)
    seed = split_seed(seed, split)
    limit = DRAW_FACTOR * int(size) + 1000
    ds = make_dataset(name, options, seed, limit)
    keep = (lambda b: b == 0) if split == "eval" else (lambda b: b != 0)
    meta = {"dataset": name, "options": options, "seed": seed, "size": limit}
    out = []
    for index in range(limit):
        entry = ds[index]
        if not keep(_bucket(entry["question"])):
            continue
        answer = entry.get("answer")
        out.append({"prompt": str(entry["question"]),
                    "answer": None if answer is None else str(answer),
                    "reasoning_gym": json.dumps({**meta, "index": index}, sort_keys=True, default=str),
                    "metadata": json.dumps(entry.get("metadata", {}), sort_keys=True, default=str)})
        if len(out) == size:
            return out
    raise DataError(f"data.{split}: reasoning_gym:{name} gave {len(out)} {split} questions of the {size} asked "
                    f"in {limit} draws (its {split} split holds the questions whose hash falls there, and these "
                    "options allow too few distinct questions)",
                    "widen the generator's ranges in data.options, or lower data.builtin_size / data.eval_size")
