"""verifiers environments (issue 48, item 3): `rollout.env: verifiers:NAME` runs a verifiers.v1
environment (its taskset the data, its harness talking to the policy through rltune's recording
endpoint, its rubric the reward with per-criterion parts). The episodes here are played by a
scripted engine (exact ids, as tests/train/test_agent_episodes.py does), through the same
play_agents path training takes; `rltune train` runs the shipped recipe with the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("verifiers")
pytest.importorskip("openai")

from rltune.recipe.schema import Recipe  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DIGITS = "rltune.envs.verifiers_examples.digits"
GUESS = "rltune.envs.verifiers_examples.guess"
TOKENIZER = "builtin:smollm2-135m-instruct"


def _recipe(env, **rollout) -> Recipe:
    return Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": f"verifiers:{env}"},
        "reward": {}, "algorithm": {"name": "grpo", "group_size": 2},
        "rollout": {"engine": "hf", "batch_size": 2, "max_new_tokens": 16, "env": f"verifiers:{env}", **rollout},
        "train": {"batch_size": 2, "micro_batch_size": 2}})


class Scripted:
    """A rollout engine whose turn is `reply(prompt text)`; records what it sampled for each prompt."""

    name = "scripted"

    def __init__(self, tok, reply):
        self.tok, self.reply = tok, reply
        self.eos_ids, self.pad_id = {tok.eos_token_id}, tok.pad_token_id
        self.sampled: dict[tuple, list[int]] = {}

    def generate(self, prompt_ids, sampling):
        from rltune.rollout.experience import Experience

        rows = []
        for p in prompt_ids:
            ids = self.tok(self.reply(self.tok.decode(list(p))), add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            self.sampled[tuple(p)] = ids
            rows.append(ids)
        B, T = len(rows), max(len(r) for r in rows)
        response = torch.full((B, T), self.pad_id, dtype=torch.long)
        mask = torch.zeros(B, T)
        for i, r in enumerate(rows):
            response[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1.0
        return Experience(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                          response_ids=response, response_mask=mask, rollout_logp=-mask / 10)

    def sleep(self):
        pass


def _play(env, rows, reply, n=1, **rollout):
    from rltune.agents.env import load_env_class
    from rltune.agents.rendering import Renderer
    from rltune.models.loading import load_tokenizer
    from rltune.train.episodes import play

    tok = load_tokenizer(TOKENIZER)
    fn = load_env_class(f"verifiers:{env}", ROOT / "recipes", {})
    c = SimpleNamespace(recipe=_recipe(env, **rollout), tokenizer=tok, rollout=Scripted(tok, reply), env=(fn, Renderer(tok)))
    return c, play(c, rows, "prompt", n)


def _trained_runs(c, ep, b):
    """(ids, loss mask) of episode b's response; every trained run is what the engine sampled."""
    exp = ep.exp
    prompt = exp.prompt_ids[b][exp.prompt_mask[b].bool()].tolist()
    n = int(exp.response_mask[b].sum())
    ids, trained = exp.response_ids[b, :n].tolist(), exp.loss_mask[b, :n].tolist()
    p = 0
    while p < n:
        if trained[p] == 0:
            p += 1
            continue
        want = c.rollout.sampled[tuple(prompt + ids[:p])]
        assert ids[p:p + len(want)] == want and trained[p:p + len(want)] == [1.0] * len(want)
        p += len(want)
    return ids, trained


def test_validate_names_an_unknown_environment_with_the_fix_without_importing_verifiers():
    code = ("import sys, json; from rltune.agents.env import env_file_problems as f; "
            "p = f('verifiers:no-such-vf-env', None, {}); "
            "ok = f('verifiers:" + DIGITS + "', None, {}); "
            "print(json.dumps([p, ok, 'verifiers' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    problems, ok, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert ok == [] and not imported
    (problem, fix), = problems
    assert "no-such-vf-env" in problem and "not installed" in problem and "verifiers:path/to/env.py" in fix


def test_rows_come_from_the_taskset():
    from rltune.data.datasets import load_prompts

    import verifiers.v1 as vf
    from rltune.envs.verifiers_examples.digits import DigitsTaskset

    rows = load_prompts(f"verifiers:{DIGITS}", size=100).rows
    tasks = list(DigitsTaskset(vf.TasksetConfig()))
    assert [r["prompt"] for r in rows] == [t.data.prompt for t in tasks]
    assert [r["answer"] for r in rows] == [t.data.answer for t in tasks]
    assert rows[0]["vf_task"]["id"] == "digits-0"


def test_a_single_turn_episode_is_scored_by_the_rubric_with_its_parts():
    from rltune.data.datasets import load_prompts

    rows = load_prompts(f"verifiers:{DIGITS}").rows[:2]
    c, ep = _play(DIGITS, rows, lambda prompt: "4a" if "near 5" in prompt else "12")
    for b, row in enumerate(rows):
        reply = ep.completions[b]
        digits = sum(ch.isdigit() for ch in reply) / len(reply)
        assert ep.env_scores[b] == pytest.approx(0.5 * digits + 0.5 * (1 <= len(reply) <= 3))
        _trained_runs(c, ep, b)
    m = ep.metrics
    assert m["reward/env/digits"] == pytest.approx(sum(sum(ch.isdigit() for ch in r) / len(r) for r in ep.completions))
    assert m["reward/env/short"] == pytest.approx(2.0)
    from rltune.train.episodes import finish_metrics

    done = finish_metrics(m, lambda xs: xs)
    assert done["reward/env/short"] == 1.0


def test_a_multi_turn_episode_masks_the_environments_turns_and_scores_the_game():
    from rltune.data.datasets import load_prompts

    rows = [r for r in load_prompts(f"verifiers:{GUESS}").rows if r["vf_task"]["target"] > 2][:2]
    def reply(prompt):        # 1, 2, then 8
        return ["1", "2", "8"][min(prompt.count("Higher."), 2)]

    c, ep = _play(GUESS, rows, reply, max_turns=4)
    for b, row in enumerate(rows):
        ids, trained = _trained_runs(c, ep, b)
        env_text = c.tokenizer.decode([t for t, m in zip(ids, trained) if m == 0])
        assert env_text.count("Higher.") == 2 and "8" not in env_text
        found = 1.0 if row["vf_task"]["target"] == 8 else 0.0
        assert ep.env_scores[b] == pytest.approx(found + 0.5 * 1.0 + 0.25 * 1.0)   # found, number, brief
    want = sum(3 if r["vf_task"]["target"] == 8 else 4 for r in rows)     # the game's own end, else its 4 turns
    assert ep.metrics["episode/turns"] == want and ep.metrics["reward/env/number"] == 2.0


def test_an_episode_rltune_ended_is_scored_over_the_turns_it_played():
    """max_turns 1: the game asks for a second turn, rltune's endpoint ends the episode, and verifiers
    skips its scoring after the failed turn; rltune scores the trace as played (it did not: 0, no parts)."""
    from rltune.data.datasets import load_prompts

    rows = [r for r in load_prompts(f"verifiers:{GUESS}").rows if r["vf_task"]["target"] > 2][:2]
    c, ep = _play(GUESS, rows, lambda prompt: "1", max_turns=1)
    assert ep.env_scores == [pytest.approx(0.5 * 1.0 + 0.25 * 1.0)] * 2   # found 0; number, brief 1 (its one turn: "1")
    assert ep.metrics["reward/env/number"] == 2.0 and ep.metrics["reward/env/found"] == 0.0
    assert ep.metrics["reward/env/brief"] == 2.0
    assert ep.metrics["episode/env_crashes"] == 0 and ep.metrics["episode/truncated"] == 2


def test_a_verifiers_error_is_one_line_naming_verifiers_the_environment_and_a_fix(tmp_path, caplog):
    env = tmp_path / "broken_env.py"
    env.write_text((ROOT / "src/rltune/envs/verifiers_examples/digits.py").read_text().replace(
        "reply = trace.last_reply", "reply = trace.last_reply; raise ValueError('rubric broke')"))
    from rltune.agents.env import EnvError
    from rltune.data.datasets import load_prompts

    rows = load_prompts(f"verifiers:{DIGITS}").rows[:1]
    with pytest.raises(EnvError) as err:
        _play(str(env), rows, lambda p: "12")
    text = str(err.value)
    assert "verifiers environment" in text and "broken_env.py" in text and "rubric broke" in text and "fix:" in text
    assert "\n" not in text.split("fix")[0].strip()


def test_the_shipped_recipe_trains_and_logs_the_rubrics_parts(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rltune", "train", str(ROOT / "recipes/verifiers-tiny.yaml"),
                          f"trainer.output_dir={tmp_path / 'run'}", "trainer.max_steps=2"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    m = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()][-1]
    assert m["reward/env"] == pytest.approx(0.5 * m["reward/env/digits"] + 0.5 * m["reward/env/short"], abs=1e-6)
    assert m["episode/env_crashes"] == 0


@pytest.mark.slow
def test_the_shipped_recipe_learns(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rltune", "train", str(ROOT / "recipes/verifiers-tiny.yaml"),
                          f"trainer.output_dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    m = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    first = sum(x["reward/mean"] for x in m[:3]) / 3
    last = sum(x["reward/mean"] for x in m[-3:]) / 3
    assert last > first + 0.3, (first, last)
