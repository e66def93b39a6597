"""A run whose only reward is its episodes' (issue 46, item 2): an OpenAI-client agent function's
run() returns the episode's reward, and an isolated environment class (rollout.env_isolate)
defines reward() in its worker, so neither needs reward.functions. `validate` says ok and `train`
trains (it used to stop at set-up with 'no reward: set reward.functions'); a recipe with truly no
reward source is refused by `validate`, before any model loads."""

from __future__ import annotations

import textwrap

import yaml

from trainlib import ROOT, read_metrics, run_inproc

SMALL = {"rollout": {"batch_size": 16}, "train": {"batch_size": 16, "micro_batch_size": 16},
         "trainer": {"max_steps": 2, "eval_every": 0}}


def _recipe(tmp_path, name: str, **rollout) -> "Path":  # noqa: F821
    data = yaml.safe_load((ROOT / "recipes" / name).read_text())
    data["reward"] = {}                                # no reward.functions, no reward.model
    for key, value in SMALL.items():
        data.setdefault(key, {}).update(value)
    data["rollout"].update(rollout)
    data["algorithm"]["group_size"] = 4
    data["trainer"]["output_dir"] = str(tmp_path / "run")
    (tmp_path / "guess_agent.py").write_text((ROOT / "recipes" / "guess_agent.py").read_text())
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _validate_then_train(capfd, path, run):
    res = run_inproc(capfd, "validate", str(path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "no reward" not in res.stderr
    res = run_inproc(capfd, "train", str(path), "--resume", "never")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "no reward" not in res.stderr
    m = read_metrics(run)
    assert len(m) == 2 and all("reward/env" in x for x in m)
    return m


def test_an_agent_without_reward_functions_trains_on_what_run_returns(capfd, tmp_path):
    """recipes/tiny-guess-agent.yaml with reward: {} (its agent's run() returns the reward)."""
    m = _validate_then_train(capfd, _recipe(tmp_path, "tiny-guess-agent.yaml"), tmp_path / "run")
    assert all(x["reward/mean"] == x["reward/env"] for x in m)    # the agent's reward is the only source


def test_an_isolated_environment_with_reward_trains_without_reward_functions(capfd, tmp_path):
    """builtin:guess (it defines reward()) in a worker process: the trainer asks the worker."""
    _validate_then_train(capfd, _recipe(tmp_path, "tiny-guess.yaml", env_isolate=True), tmp_path / "run")


def test_an_environment_without_reward_and_no_functions_is_refused_by_validate(capfd, monkeypatch, tmp_path):
    (tmp_path / "quiet.py").write_text(textwrap.dedent('''
        class Quiet:
            def reset(self, row):
                return None

            def step(self, text):
                return {"messages": [], "done": True}
    '''))
    path = _recipe(tmp_path, "tiny-guess.yaml", env="quiet.py:Quiet")
    res = run_inproc(capfd, "validate", str(path))
    assert res.returncode != 0 and "no reward" in res.stderr, res.stderr[-3000:]
    res = run_inproc(capfd, "train", str(path), "--resume", "never")
    assert res.returncode != 0 and "no reward" in res.stderr, res.stderr[-3000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    # module:Class: `validate` cannot tell without importing it; `train` refuses at set-up
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _recipe(tmp_path, "tiny-guess.yaml", env="quiet:Quiet")
    res = run_inproc(capfd, "train", str(path), "--resume", "never")
    assert res.returncode != 0 and "no reward" in res.stderr and "give rollout.env a reward" in res.stderr, \
        res.stderr[-3000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
