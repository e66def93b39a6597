"""`rltune eval RECIPE --model DIR` (issue 46 item 7): the recipe's held-out eval outside training.

It is the run's own eval (the same rows, engine, greedy episodes and rewards), so on a run's final/
it prints the run's own before -> after, as RUN/eval.json records it, to the printed precision.
Whatever DIR holds is checked before anything is built: a clear message and exit 1."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from trainlib import ROOT, run_inproc


def _before_after(ev: dict) -> str:
    return f"before {ev['before']:.3f} -> after {ev['after']:.3f}"


def test_eval_of_a_runs_final_prints_the_runs_own_before_and_after(capfd, recipe_factory, tmp_path):
    recipe = recipe_factory("tiny-grpo.yaml", trainer__max_steps=3, trainer__eval_every=3)
    trained = run_inproc(capfd, "train", recipe)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = tmp_path / "run"
    ev = json.loads((run / "eval.json").read_text())
    res = run_inproc(capfd, "eval", recipe, "--model", run)      # a run directory: its final/
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"eval reward on 32 held-out prompts: {_before_after(ev)}" in res.stdout
    for spec in ("exact_answer", "format"):   # each part's before -> after
        b, a = ev["before_parts"][f"builtin:{spec}"], ev["after_parts"][f"builtin:{spec}"]
        assert f"  {spec} (x1.0): before {b:.3f} -> after {a:.3f}" in res.stdout
    final = res.stdout[res.stdout.index("eval reward on"):].splitlines()
    assert all(line in trained.stderr for line in final)       # the lines the run printed at its end


def test_eval_of_an_openai_client_agent_plays_the_runs_episodes(capfd, tmp_path):
    """recipes/tiny-guess-agent.yaml: greedy episodes of OpenAI-client code through the recording
    endpoint, as the run's eval played them (turns and tool calls per episode included)."""
    run = tmp_path / "run"
    recipe = ROOT / "recipes" / "tiny-guess-agent.yaml"
    args = (f"trainer.output_dir={run}", "trainer.max_steps=2", "trainer.eval_every=2", "data.eval_size=8")
    res = run_inproc(capfd, "train", recipe, *args, "--resume", "never")
    assert res.returncode == 0, res.stderr[-3000:]
    ev = json.loads((run / "eval.json").read_text())
    res = run_inproc(capfd, "eval", recipe, *args, "--model", run / "final")
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"eval reward on 8 held-out prompts: {_before_after(ev)}" in res.stdout
    b, a = ev["before_episode"]["turns_mean"], ev["after_episode"]["turns_mean"]
    assert f"  turns per episode: before {b:.2f} -> after {a:.2f}" in res.stdout
    assert "tool calls per episode: before 0.00 -> after 0.00" in res.stdout


@pytest.fixture
def model_copy(tmp_path):
    """A copy of builtin:tiny-llama's directory (the recipe's policy): a model DIR that loads."""
    from rltune.models.loading import resolve_model_dir

    d = tmp_path / "model"
    shutil.copytree(resolve_model_dir("builtin:tiny-llama"), d)
    return d


def _refused(capfd, recipe, where, *words, named=None):
    """`eval --model WHERE` exits 1 with one message naming `named` (default `--model WHERE`) and a fix."""
    res = run_inproc(capfd, "eval", recipe, "--model", where)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "bug in rltune" not in res.stderr
    assert f"rltune: error: {named or f'--model {where}'}" in res.stderr and "\n  fix: " in res.stderr
    for w in words:
        assert w in res.stderr, res.stderr
    return res.stderr


def test_bad_model_dirs_are_refused_with_the_file_and_the_fix(capfd, recipe_factory, model_copy, tmp_path):
    recipe = recipe_factory("tiny-grpo.yaml")
    _refused(capfd, recipe, tmp_path / "nowhere", "does not exist")
    # another architecture's config.json (another vocabulary, more layers)
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg.update(vocab_size=cfg["vocab_size"] + 7, num_hidden_layers=cfg["num_hidden_layers"] + 1)
    (model_copy / "config.json").write_text(json.dumps(cfg))
    _refused(capfd, recipe, model_copy, "not the architecture of model.policy builtin:tiny-llama", "vocab",
             "layers")
    (model_copy / "config.json").write_text('{"vocab_size": "many"')
    _refused(capfd, recipe, model_copy, "is not valid JSON", named=f"--model: {model_copy / 'config.json'}: ")
    # a weights file that is a link (rltune never follows one it did not make)
    shutil.rmtree(model_copy)
    from rltune.models.loading import resolve_model_dir

    src = resolve_model_dir("builtin:tiny-llama")
    shutil.copytree(src, model_copy)
    (model_copy / "model.safetensors").unlink()
    os.symlink(os.path.join(src, "model.safetensors"), model_copy / "model.safetensors")
    _refused(capfd, recipe, model_copy, "model.safetensors is a link", named=f"--model {model_copy / 'model.safetensors'}: ")
    # a run directory whose run did not finish
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "metrics.jsonl").write_text("")
    _refused(capfd, recipe, tmp_path / "unfinished", "run directory without final/", "--resume auto")


def test_policy_weights_load_and_a_pickle_is_not_read(capfd, recipe_factory, model_copy):
    """The policy's own directory is a valid DIR (before == after; --json, --limit); without --model
    only the policy's score; a directory with only a pytorch_model.bin is refused (a pickle from
    elsewhere is never loaded)."""
    recipe = recipe_factory("tiny-grpo.yaml")
    res = run_inproc(capfd, "eval", recipe, "--model", model_copy, "--limit", "8", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["before"] == out["after"] and out["prompts"] == 8 and out["engine"] == "hf"
    assert set(out["before_parts"]) == {"builtin:exact_answer", "builtin:format"}
    res = run_inproc(capfd, "eval", recipe, "--limit", "4")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "on 4 held-out prompts" in res.stdout and "->" not in res.stdout
    (model_copy / "model.safetensors").rename(model_copy / "pytorch_model.bin")
    _refused(capfd, recipe, model_copy, "pytorch_model.bin is a pickle")


def test_a_recipe_without_an_eval_set_names_the_key(capfd, recipe_factory, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    recipe = recipe_factory("tiny-grpo.yaml", data__train=str(data), trainer__eval_every=0)
    res = run_inproc(capfd, "eval", recipe)
    assert res.returncode == 2
    assert "data.eval is not set" in res.stderr and "fix: set data.eval" in res.stderr


def test_a_lora_runs_adapter_and_a_whole_model_into_a_lora_recipe(capfd, recipe_factory, model_copy, tmp_path):
    """A LoRA run's final/ (the adapter) gives the run's own after; a whole model (here the policy's
    own weights) into a LoRA recipe zeroes the adapter: the policy's score again."""
    recipe = recipe_factory("tiny-grpo-lora.yaml", trainer__max_steps=2, trainer__eval_every=2)
    trained = run_inproc(capfd, "train", recipe)
    assert trained.returncode == 0, trained.stderr[-3000:]
    ev = json.loads((tmp_path / "run" / "eval.json").read_text())
    res = run_inproc(capfd, "eval", recipe, "--model", tmp_path / "run" / "final")
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"eval reward on 32 held-out prompts: {_before_after(ev)}" in res.stdout
    res = run_inproc(capfd, "eval", recipe, "--model", model_copy, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["after"] == out["before"] == pytest.approx(ev["before"])
