"""Load prompt rows from a file or a builtin task.

A row is a dict: the prompt column (text, or a list of chat messages) plus any extra
columns, which are handed to reward functions as keyword arguments (e.g. `answer`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

LOADERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
BUILTIN_TASKS = ("arithmetic",)


from ..errors import UserError


class DataError(UserError):
    """Unusable data (message is user-facing: names the file, column and a fix)."""

    exit_code = 2


@dataclass(frozen=True)
class PromptSet:
    rows: list[dict]
    prompt_key: str
    source: str

    def __len__(self) -> int:
        return len(self.rows)


def arithmetic_rows(n: int, digits: int, seed: int, split: str, chat: bool = False) -> list[dict]:
    """N-digit addition problems with their answers; train and eval are disjoint.

    Plain models get `12+34=`; chat models get a question that asks for the bare number.
    """
    lo, hi = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    pairs = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)]
    if len(pairs) <= 20000:
        rng = random.Random(1234 + digits)  # the split does not depend on the run's seed
        rng.shuffle(pairs)
        n_eval = max(1, len(pairs) // 5)
        pool = pairs[:n_eval] if split == "eval" else pairs[n_eval:]
        rng = random.Random(seed)
        rows = [pool[i % len(pool)] for i in range(n)] if n > len(pool) else rng.sample(pool, n)
    else:  # large spaces: sample, keeping eval pairs out of train by parity of a hash
        rng = random.Random(seed + (7 if split == "eval" else 0))
        rows, want = [], 0 if split == "eval" else 1
        while len(rows) < n:
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            if (a * 31 + b) % 5 == 0 and want == 0 or (a * 31 + b) % 5 != 0 and want == 1:
                rows.append((a, b))
    if chat:
        return [{"prompt": f"What is {a}+{b}? Answer with just the number.", "answer": str(a + b)}
                for a, b in rows]
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in rows]


def load_prompts(spec: str, prompt_key: str = "prompt", *, size: int = 2000, digits: int = 1,
                 seed: int = 0, split: str = "train", chat: bool = False) -> PromptSet:
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_TASKS:
            raise DataError(f"unknown builtin data {spec!r}; available: "
                            + ", ".join("builtin:" + t for t in BUILTIN_TASKS))
        return PromptSet(arithmetic_rows(size, digits, seed, split, chat), "prompt", spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise DataError(f"data file {spec} does not exist\n  fix: check data.train / data.eval in the recipe")
    loader = LOADERS.get(path.suffix.lower())
    if loader is None:
        raise DataError(f"data file {spec}: unsupported extension {path.suffix!r}; use one of "
                        + ", ".join(LOADERS))
    if path.stat().st_size == 0:
        raise DataError(f"data file {spec} is empty\n  fix: add rows with a {prompt_key!r} column")
    from datasets import load_dataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    try:
        ds = load_dataset(loader, data_files=str(path), split="train")
    except Exception as err:  # noqa: BLE001 - becomes a user message
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"data file {spec} could not be read as {loader}: {first[:300]}") from err
    if len(ds) == 0:
        raise DataError(f"data file {spec} has no rows\n  fix: add rows with a {prompt_key!r} column")
    if prompt_key not in ds.column_names:
        raise DataError(
            f"data file {spec} has no column {prompt_key!r} (columns: {', '.join(ds.column_names)})\n"
            f"  fix: set data.prompt_key to the column that holds the prompt")
    rows = ds.to_list()
    for i, row in enumerate(rows):
        value = row.get(prompt_key)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataError(f"data file {spec}, row {i + 1}: empty {prompt_key!r}\n"
                            "  fix: remove the row or fill in its prompt")
    return PromptSet(rows, prompt_key, spec)
