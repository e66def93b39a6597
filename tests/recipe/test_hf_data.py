"""`data.train: hf:NAME[:CONFIG][:SPLIT]` through `datasets` (data/hub.py): saved dataset
directories, data-file directories, split selection, offline and bad-split messages, validate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import datasets  # noqa: E402  (a dependency of rltune: never skipped)

from rltune.data.datasets import DataError, load_prompts  # noqa: E402
from rltune.data.hub import load_hf_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRAIN = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+3=", "answer": "5"}, {"prompt": "4+4=", "answer": "8"}]
TEST = [{"prompt": "7+1=", "answer": "8"}, {"prompt": "9+0=", "answer": "9"}]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def saved(tmp_path):
    d = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(TRAIN),
                          "test": datasets.Dataset.from_list(TEST)}).save_to_disk(str(d))
    return d


def test_saved_dataset_dict_default_split_is_train(saved):
    rows, where = load_hf_rows("hf:./dd")
    assert rows == TRAIN and where == ["row 1", "row 2", "row 3"]


def test_split_selection_and_slice(saved):
    assert load_hf_rows("hf:./dd::test")[0] == TEST
    assert load_hf_rows("hf:./dd::train[:1]")[0] == TRAIN[:1]
    assert load_hf_rows("hf:./dd", key="data.eval")[0] == TEST  # data.eval defaults to test


def test_saved_single_dataset(tmp_path):
    datasets.Dataset.from_list(TRAIN).save_to_disk(str(tmp_path / "one"))
    assert load_prompts("hf:./one").rows == TRAIN


def test_directory_of_jsonl_files(tmp_path):
    d = tmp_path / "files"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(f'{{"prompt": "{r["prompt"]}", "answer": "{r["answer"]}"}}\n' for r in TRAIN))
    (d / "test.jsonl").write_text('{"prompt": "7+1=", "answer": "8"}\n{"prompt": "9+0=", "answer": "9"}\n')
    assert load_hf_rows("hf:./files")[0] == TRAIN
    assert load_hf_rows("hf:./files::test")[0] == TEST


def test_bad_split_lists_the_splits(saved):
    with pytest.raises(DataError) as e:
        load_prompts("hf:./dd::bogus")
    assert str(e.value) == ("data.train: hf:./dd::bogus: no split `bogus` (splits: train, test)\n"
                            "  fix: set data.train: hf:./dd::train")


def test_missing_prompt_column_and_bad_prompt(saved, tmp_path):
    with pytest.raises(DataError) as e:
        load_hf_rows("hf:./dd", prompt_key="question")
    assert e.value.problem == "hf:./dd: no column 'question' (columns: prompt, answer)"
    datasets.Dataset.from_list([{"prompt": "ok"}, {"prompt": ""}]).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(DataError) as e:
        load_hf_rows("hf:./bad")
    assert e.value.problem == "dataset hf:./bad, row 2: empty 'prompt'"


def test_missing_local_directory(tmp_path):
    with pytest.raises(DataError) as e:
        load_hf_rows("hf:./nope")
    assert e.value.problem == f"hf:./nope: the directory ./nope does not exist (looked in {tmp_path})"


def _cli(tmp_path, *args, **env):
    full = dict(os.environ, HF_HOME=str(tmp_path / "hf-home"), **env)
    p = subprocess.run([sys.executable, "-m", "rltune.cli", *args], cwd=tmp_path, env=full,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


RECIPE = """model:
  policy: builtin:tiny-llama
data:
  train: {train}
reward:
  functions: [builtin:exact_answer]
"""


def test_offline_hub_id_message(tmp_path):
    (tmp_path / "r.yaml").write_text(RECIPE.format(train="hf:gsm8k:main"))
    code, out = _cli(tmp_path, "validate", "r.yaml", HF_HUB_OFFLINE="1")
    assert code == 2, out
    assert ("r.yaml:4:3: error input: data.train: hf:gsm8k:main could not be loaded: offline (HF_HUB_OFFLINE=1 is set) "
            "and it is not in the local Hugging Face cache") in out
    assert ("fix: download it on a machine with access (python -c \"import datasets; datasets.load_dataset('gsm8k', "
            "'main').save_to_disk('gsm8k')\"), copy the gsm8k directory here and set data.train: hf:./gsm8k") in out
    code, out = _cli(tmp_path, "validate", "--skip-files", "r.yaml", HF_HUB_OFFLINE="1")
    assert code == 0, out


def test_syntax_checked_with_skip_files(tmp_path):
    (tmp_path / "r.yaml").write_text(RECIPE.format(train="'hf:'"))
    code, out = _cli(tmp_path, "validate", "--skip-files", "r.yaml")
    assert code == 1, out
    assert "`hf:` names no dataset; the form is hf:NAME[:CONFIG][:SPLIT]" in out


def test_validate_passes_on_saved_dir_relative_to_recipe(saved, tmp_path):
    sub = tmp_path / "elsewhere"
    sub.mkdir()
    (tmp_path / "r.yaml").write_text(RECIPE.format(train="hf:./dd"))
    code, out = _cli(sub, "validate", "../r.yaml")  # ./dd is found next to the recipe
    assert code == 0, out


def test_one_training_step_reads_the_saved_dataset(tmp_path, capfd, monkeypatch):
    """validate passes, then one tiny GRPO step trains on the saved dataset found next to the recipe."""
    import yaml

    from rltune.cli import main

    exp = tmp_path / "exp"
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(exp / "dd"))
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny-grpo.yaml").read_text())
    recipe["data"] = {"train": "hf:./dd"}
    recipe["rollout"]["engine"] = "hf"
    recipe["trainer"].update(output_dir=str(tmp_path / "run"), max_steps=1, eval_every=0)
    (exp / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for args in (["validate", "exp/recipe.yaml"], ["train", "exp/recipe.yaml"]):
        try:
            main(args)
            code = 0
        except SystemExit as e:
            code = e.code or 0
        out = capfd.readouterr()
        assert code == 0, out.out + out.err
    import logging

    logging.getLogger("rltune").handlers.clear()
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 1


# ---- a missing split is refused (issue 25, item 12; item 16's slice fix)

def test_one_unnamed_dataset_is_training_rows_only(tmp_path):
    # one saved Dataset used to answer every split: data.eval (split test by default) evaluated on the
    # training rows and logged them as held-out, and `::validation` "validated"
    datasets.Dataset.from_list(TRAIN).save_to_disk(str(tmp_path / "one"))
    assert load_hf_rows("hf:./one")[0] == TRAIN
    with pytest.raises(DataError, match=r"one dataset without split names, so it has no split `test` \(data.eval's default\)"):
        load_hf_rows("hf:./one", key="data.eval")
    for key in ("data.train", "data.eval"):
        with pytest.raises(DataError, match="has no split `validation`"):
            load_hf_rows("hf:./one::validation", key=key)


def test_a_named_single_dataset_has_only_its_split(tmp_path):
    ds = datasets.Dataset.from_list(TRAIN, split=datasets.Split.TRAIN)
    ds.save_to_disk(str(tmp_path / "named"))
    assert load_hf_rows("hf:./named::train[:2]")[0] == TRAIN[:2]
    with pytest.raises(DataError, match=r"no split `test` \(splits: train\)"):
        load_hf_rows("hf:./named", key="data.eval")


def test_a_bad_slice_gets_a_slice_fix(saved):
    with pytest.raises(DataError) as e:
        load_hf_rows("hf:./dd::train[:200%]")
    assert "the split slice `train[:200%]` is not valid" in str(e.value)
    assert "train[:50%]" in e.value.fix and "save_to_disk" not in e.value.fix
