"""`hf:NAME[:CONFIG][:SPLIT]` data sources, read through the `datasets` library.

NAME is a hub id (`openai/gsm8k`) or a local directory: one written by `save_to_disk` (read with
`load_from_disk`) or a directory of data files that `datasets.load_dataset` accepts (e.g.
`train.jsonl` and `test.jsonl`: the file names give the splits). CONFIG picks a dataset
configuration; SPLIT a split, with an optional slice (`train[:1000]`, `train+test`). Leave CONFIG
empty for a dataset without configs: `hf:NAME::test`. Without SPLIT, data.train reads `train` and
data.eval reads `test`.

The rows then go through the same checks as a data file's (data.rows.check_rows). A local
NAME is looked up like a data file: as given, then relative to the recipe's directory.
`datasets` is imported only when such a source is loaded (`rltune validate` without an hf:
source never imports it).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .rows import DataError, check_rows, missing_file_reason

DEFAULT_SPLIT = {"data.train": "train", "data.eval": "test"}
CHECK_ROWS = 10_000  # `validate` checks the prompts of at most this many rows (train checks all)
FORM = "hf:NAME[:CONFIG][:SPLIT]"
_SPLIT = re.compile(r"^\w[\w.-]*(\[[^\]]*\])?(\+\w[\w.-]*(\[[^\]]*\])?)*$")


@dataclass(frozen=True)
class HfSource:
    name: str
    config: Optional[str]  # None: the dataset's default
    split: Optional[str]  # None: the default of the recipe key (DEFAULT_SPLIT)


def hf_syntax_problem(spec: str) -> Optional[str]:
    """What is wrong with the form of an `hf:` spec, or None (what `validate --skip-files` checks)."""
    name, _, rest = spec[3:].partition(":")
    config, _, split = rest.partition(":")
    example = "e.g. hf:openai/gsm8k:main:train, or hf:./my_dataset for a local directory"
    if not name:
        return f"`{spec}` names no dataset; the form is {FORM}, {example}"
    for label, part in (("name", name), ("config", config), ("split", split)):
        if part != part.strip() or any(c.isspace() for c in part.strip()):
            return f"`{spec}`: the {label} `{part}` contains spaces; write {FORM} without spaces, {example}"
    if split and not _SPLIT.match(split):
        return (f"`{spec}`: `{split}` is not a split name; the form is {FORM} (a split may carry a slice: "
                f"train[:1000]), {example}")
    return None


def parse_hf_spec(spec: str) -> HfSource:
    """The parts of an `hf:` spec; a malformed one raises DataError."""
    problem = hf_syntax_problem(spec)
    if problem:
        raise DataError(problem, f"write {FORM}, e.g. hf:openai/gsm8k:main:train")
    name, _, rest = spec[3:].partition(":")
    config, _, split = rest.partition(":")
    return HfSource(name, config or None, split or None)


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _local_path(name: str, base_dir: Optional[Path]) -> Optional[Path]:
    """The local directory or file NAME names (as given, then relative to the recipe's directory)."""
    p = Path(name).expanduser()
    if p.exists():
        return p
    if not p.is_absolute() and base_dir is not None and (Path(base_dir) / p).exists():
        return Path(base_dir) / p
    return None


def resolve_hf_spec(spec: str, base_dir: Optional[Path]) -> str:
    """The spec with a local NAME that exists only relative to the recipe's directory made absolute
    (so that train, whose current directory may differ, reads what validate checked)."""
    if hf_syntax_problem(spec):
        return spec
    name, sep, rest = spec[3:].partition(":")
    p = Path(name).expanduser()
    if p.exists() or p.is_absolute() or base_dir is None or not (Path(base_dir) / p).exists():
        return spec
    return f"hf:{(Path(base_dir) / p).resolve()}{sep}{rest}"


def _is_saved(path: Path) -> bool:
    """A directory written by Dataset.save_to_disk or DatasetDict.save_to_disk."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _listed(text: str) -> list[str]:
    """The Python list in a `datasets` message ("... Should be one of ['train', 'test'].")."""
    m = re.search(r"\[[^\[\]]*\]", text)
    try:
        return [str(x) for x in ast.literal_eval(m.group(0))] if m else []
    except (ValueError, SyntaxError):
        return []


def _download_fix(src: HfSource, key: str) -> str:
    args = ", ".join(repr(x) for x in (src.name, src.config) if x)
    local = src.name.rstrip("/").rsplit("/", 1)[-1]
    target = f"hf:./{local}" + (f"::{src.split}" if src.split else "")
    return (f"download it on a machine with access (python -c \"import datasets; "
            f"datasets.load_dataset({args}).save_to_disk('{local}')\"), copy the {local} directory here "
            f"and set {key}: {target}")


def _from_disk(path: Path, src: HfSource, split: str, spec: str, key: str = "data.train"):
    """The rows of a save_to_disk directory for `split` (the spec's, or the key's default). A
    missing split is refused, never answered with whatever the directory holds: one saved
    `Dataset` has one split (its name, or none), and data.eval must not read training rows."""
    import datasets

    if src.config:
        raise DataError(f"{spec}: a save_to_disk directory has no configs, but the spec names `{src.config}`",
                        f"remove the config: hf:{src.name}" + (f"::{src.split}" if src.split else ""))
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.Dataset):
        if not ds.split:   # one dataset without a split name: the training rows, and only those
            if src.split is None and key == "data.train":
                return ds
            asked = f"split `{split}`" + ("" if src.split else f" ({key}'s default)")
            raise DataError(f"{spec}: the directory holds one dataset without split names, so it has no {asked}",
                            f"use it as data.train (hf:{src.name}), and give {key} its own held-out rows"
                            if key != "data.train" else f"set {key}: hf:{src.name}")
        parts = {str(ds.split): ds}
    else:
        parts = dict(ds)
    names = set(re.split(r"[+]", re.sub(r"\[[^\]]*\]", "", split)))
    missing = sorted(n.strip() for n in names if n.strip() not in parts)
    if missing:
        held = ", ".join(parts) or "none"
        usual = DEFAULT_SPLIT.get(key, "train")
        other = usual if usual in parts else next((p for p in parts if p != "train"), next(iter(parts), "SPLIT"))
        raise DataError(f"{spec}: no split `{missing[0]}` (splits: {held})",
                        f"set {key}: hf:{src.name}::{other}")
    try:
        instructions = datasets.ReadInstruction.from_spec(split).to_absolute({k: len(v) for k, v in parts.items()})
    except (ValueError, AssertionError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"{spec}: the split slice `{split}` is not valid: {first}",
                        f"write a slice like {next(iter(parts), 'train')}[:1000] or {next(iter(parts), 'train')}[:50%] "
                        "(percentages between -100 and 100)") from None
    picked = [parts[i.splitname].select(range(i.from_, i.to)) for i in instructions]
    return picked[0] if len(picked) == 1 else datasets.concatenate_datasets(picked)


def _load(src: HfSource, path: Optional[Path], split: str, spec: str, key: str = "data.train"):
    import datasets

    if path is not None and _is_saved(path):
        return _from_disk(path, src, split, spec, key)
    quiet = path is not None and datasets.is_progress_bar_enabled()  # a hub download keeps its progress bar
    if quiet:
        datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(str(path) if path is not None else src.name, name=src.config, split=split)
    finally:
        if quiet:
            datasets.enable_progress_bars()


def _load_problem(err: Exception, src: HfSource, spec: str, key: str, split: str, local: bool) -> DataError:
    """A `datasets` exception as a DataError naming what to change."""
    from datasets.exceptions import DatasetNotFoundError

    msg = str(err).strip()
    first = msg.splitlines()[0] if msg else type(err).__name__
    base = f"hf:{src.name}"
    if isinstance(err, ConnectionError) and not local:
        import datasets

        why = ("offline (HF_HUB_OFFLINE=1 is set)" if datasets.config.HF_HUB_OFFLINE
               else "no network (the Hugging Face Hub cannot be reached)")
        return DataError(f"{spec} could not be loaded: {why} and it is not in the local Hugging Face cache",
                         _download_fix(src, key))
    if isinstance(err, DatasetNotFoundError):
        return DataError(f"{spec} could not be loaded: {first}",
                         f"check the dataset id (as on huggingface.co/datasets; a gated one needs `hf auth login`), "
                         f"or name a local directory: {key}: hf:./my_dataset")
    if isinstance(err, ValueError) and "Unknown split" in msg:
        splits = _listed(msg)
        return DataError(f"{spec}: no split `{split}` (splits: {', '.join(splits) or 'none'})",
                         f"set {key}: {base}:{src.config or ''}:{splits[0] if splits else 'SPLIT'}")
    if isinstance(err, ValueError) and ("Config name is missing" in msg or "BuilderConfig" in msg):
        configs = _listed(msg)
        what = f"no config `{src.config}`" if src.config else "the dataset has several configs and the spec names none"
        return DataError(f"{spec}: {what} (configs: {', '.join(configs) or 'none'})",
                         f"set {key}: {base}:{configs[0] if configs else 'CONFIG'}" + (f":{src.split}" if src.split else ""))
    if local:
        return DataError(f"{spec}: the directory could not be read as a dataset: {first[:300]}",
                         "point to a directory written by save_to_disk, or one holding .jsonl/.json/.csv/.parquet "
                         "files (train.jsonl, test.jsonl, ...)")
    return DataError(f"{spec} could not be loaded: {type(err).__name__}: {first[:300]}",
                     f"check that `python -c \"import datasets; datasets.load_dataset("
                     f"{', '.join(repr(x) for x in (src.name, src.config) if x)}, split={split!r})\"` works here")


def load_hf_rows(spec: str, prompt_key: str = "prompt", *, key: str = "data.train",
                 base_dir: Optional[Path] = None, max_rows: Optional[int] = None) -> tuple[list[dict], list[str]]:
    """The rows of an `hf:` source and where each one is ("row 3"), checked like a data file's rows.

    `key`: the recipe key (data.train | data.eval; it picks the default split and names the fix).
    `max_rows`: check at most this many rows (a quick check, as `validate` does).
    Raises DataError naming the source, the problem and a fix."""
    src = parse_hf_spec(spec)
    path = _local_path(src.name, base_dir)
    if path is None and _looks_local(src.name):
        looked = "" if Path(src.name).expanduser().is_absolute() else \
            f" (looked in {Path.cwd()}" + (f" and {Path(base_dir).resolve()})" if base_dir else ")")
        raise DataError(f"{spec}: the directory {src.name} {missing_file_reason(Path(src.name).expanduser())}{looked}",
                        f"check {key}: a local NAME is a directory written by save_to_disk or one holding data files; "
                        "a hub id looks like openai/gsm8k")
    if path is not None and not path.is_dir():
        raise DataError(f"{spec}: {src.name} is a file, not a dataset directory",
                        f"for a data file drop the hf: prefix ({key}: {src.name}); hf: names a hub id or a directory")
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise DataError(f"{spec}: hf: sources need the `datasets` package, which is not installed",
                        "pip install datasets (or use a .jsonl file)") from None
    split = src.split or DEFAULT_SPLIT.get(key, "train")
    try:
        ds = _load(src, path, split, spec, key)
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - the datasets library's errors become a user message
        raise _load_problem(err, src, spec, key, split, path is not None) from None
    if prompt_key not in ds.column_names:
        raise DataError(f"{spec}: no column {prompt_key!r} (columns: {', '.join(ds.column_names) or 'none'})",
                        "set data.prompt_key to the column that holds the prompt")
    n = len(ds) if max_rows is None else min(len(ds), max_rows)
    rows = (ds if n == len(ds) else ds.select(range(n))).to_list()
    where = [f"row {i + 1}" for i in range(n)]
    check_rows(rows, where, prompt_key, spec, "hf")
    return rows, where
