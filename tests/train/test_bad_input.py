"""Bad input during a run ends with a message that names the sample or column, no traceback."""

from __future__ import annotations

import json

import pytest

from trainlib import run_inproc


def _check(res, code, *needles):
    assert res.returncode == code, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in res.stderr, (n, res.stderr[-3000:])


def test_reward_function_that_raises_names_sample_and_function(capfd, recipe_factory, tmp_path):
    (tmp_path / "rew.py").write_text(
        "def boom(prompts, completions, **kw):\n"
        "    if any(p.startswith('1') for p in prompts):\n"
        "        raise ValueError('cannot score this one')\n"
        "    return [0.0] * len(prompts)\n")
    path = recipe_factory(reward={"functions": [f"{tmp_path / 'rew.py'}:boom"]}, trainer__max_steps=2)
    res = run_inproc(capfd, "train", path)
    _check(res, 1, "rew.py:boom", "ValueError", "cannot score this one", "sample", "reward.on_error")


def test_reward_nan_names_sample(capfd, recipe_factory, tmp_path):
    (tmp_path / "rew.py").write_text(
        "def nan(prompts, completions, **kw):\n    return [float('nan')] * len(prompts)\n")
    path = recipe_factory(reward={"functions": [f"{tmp_path / 'rew.py'}:nan"]}, trainer__max_steps=2)
    res = run_inproc(capfd, "train", path)
    _check(res, 1, "rew.py:nan", "returned nan for sample 0", "prompt")


def test_reward_beyond_float32_names_function_and_value(capfd, recipe_factory, tmp_path):
    # issue 44 item 6: 1e39 is finite in Python but inf in the trainer's float32 rewards; the run
    # used to stop with "check the reward model / normalisation" though there was no reward model
    (tmp_path / "rew.py").write_text(
        "def huge(prompts, completions, **kw):\n    return [1e39] * len(prompts)\n")
    path = recipe_factory(reward={"functions": [f"{tmp_path / 'rew.py'}:huge"]}, trainer__max_steps=2)
    res = run_inproc(capfd, "train", path)
    _check(res, 1, "rew.py:huge", "returned 1e+39 for sample 0", "float32", "reward.on_error")
    assert "check the reward model" not in res.stderr, res.stderr[-3000:]


def test_reward_on_error_zero_keeps_training(capfd, recipe_factory, tmp_path):
    (tmp_path / "rew.py").write_text(
        "def nan(prompts, completions, **kw):\n    return [float('nan')] * len(prompts)\n")
    path = recipe_factory(reward={"functions": [f"{tmp_path / 'rew.py'}:nan", "builtin:format"],
                                  "on_error": "zero"}, trainer__max_steps=1, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path)
    _check(res, 0, "scored 0 (reward.on_error: zero)")


def test_data_file_without_prompt_column(capfd, recipe_factory, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(50)))
    path = recipe_factory(data={"train": str(data)}, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path)
    _check(res, 2, "no column 'prompt'", "question", "data.prompt_key")


def test_empty_data_file(capfd, recipe_factory, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("")
    path = recipe_factory(data={"train": str(data)}, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path)
    _check(res, 2, "d.jsonl is empty")


def test_missing_data_file(capfd, recipe_factory, tmp_path):
    path = recipe_factory(data={"train": str(tmp_path / "nope.parquet")}, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path)
    _check(res, 2, "nope.parquet does not exist")


def test_lint_errors_stop_training(capfd, recipe_factory, tmp_path):
    path = recipe_factory("tiny-ppo.yaml", critic__lr=1.0e-2)  # == actor.lr: playbook error
    res = run_inproc(capfd, "train", path)
    _check(res, 1, "lr-order", "not training")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_jsonl_data_with_extra_columns_reach_rewards(capfd, recipe_factory, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i % 9}+1=", "answer": str(i % 9 + 1), "tag": "x"}) + "\n"
                            for i in range(64)))
    (tmp_path / "rew.py").write_text(
        "def tagged(prompts, completions, answer, tag, **kw):\n"
        "    assert all(t == 'x' for t in tag) and len(answer) == len(prompts)\n"
        "    return [1.0] * len(prompts)\n")
    path = recipe_factory(data={"train": str(data)}, reward={"functions": [f"{tmp_path / 'rew.py'}:tagged"]},
                          trainer__max_steps=1, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path)
    _check(res, 0)


def test_hub_model_offline_is_a_clear_error(recipe_factory):
    from trainlib import run_cli

    path = recipe_factory(model={"policy": "Qwen/Qwen2.5-0.5B-Instruct"})
    res = run_cli("train", path)   # HF_HUB_OFFLINE=1 in the child: no network retries
    _check(res, 2, "could not load model 'Qwen/Qwen2.5-0.5B-Instruct'", "builtin:smollm2-135m-instruct")


def test_fp16_where_deepspeed_has_none_is_a_clear_error(capfd, recipe_factory):
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().is_fp16_supported():
        pytest.skip("this device supports fp16")
    path = recipe_factory("tiny-grpo.yaml", trainer__precision="fp16", trainer__max_steps=1, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path)
    assert res.returncode != 0
    assert "trainer.precision: fp16 is not supported" in res.stderr and "fix: set trainer.precision: bf16" in res.stderr
    assert "Traceback" not in res.stderr
