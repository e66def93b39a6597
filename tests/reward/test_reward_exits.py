"""Reward functions that end the process (issue 11, item 7): `sys.exit` is caught and named;
`reward.isolate: true` runs user functions in a worker, so `os._exit`, a segfault or a hang
becomes a RewardError naming the function and the sample (or a score of 0 with
`reward.on_error: zero`). Ctrl-C still interrupts."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from rltune.recipe.schema import RewardCfg
from rltune.reward import RewardComputer, RewardError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

REWARDS = '''
import os, signal, sys, time

def bye(prompts, completions, **kw):
    if any(p.startswith("b") for p in prompts):
        sys.exit(3)
    return [1.0] * len(prompts)

def hard_exit(prompts, completions, **kw):
    if any(p.startswith("b") for p in prompts):
        os._exit(1)
    return [1.0] * len(prompts)

def segfault(prompts, completions, **kw):
    os.kill(os.getpid(), signal.SIGSEGV)

def slow(prompts, completions, **kw):
    if any(p.startswith("b") for p in prompts):
        time.sleep(60)
    return [0.5] * len(prompts)

def interrupt(prompts, completions, **kw):
    raise KeyboardInterrupt

def boom(prompts, completions, **kw):
    if any(p.startswith("b") for p in prompts):
        raise ValueError("cannot score this one")
    return [1.0] * len(prompts)

def echo(prompts, completions, answer=None, **kw):
    return [float(a) for a in answer]

def pid(prompts, completions, **kw):
    return [float(os.getpid())] * len(prompts)

def as_dict(prompts, completions, **kw):
    return {30 + i: 1.0 for i in range(len(prompts))}

def as_string(prompts, completions, **kw):
    return "101"

def as_generator(prompts, completions, **kw):
    return (0.5 for _ in prompts)

def huge(prompts, completions, **kw):
    return [1e10 if p.startswith("b") else 0.0 for p in prompts]

def beyond_f32(prompts, completions, **kw):
    return [1e39 if p.startswith("b") else 1.0 for p in prompts]

def big(prompts, completions, **kw):
    return [3e38 if p.startswith("b") else 1.0 for p in prompts]

def bigger(prompts, completions, **kw):
    return [3.2e38 if p.startswith("b") else 1.0 for p in prompts]
'''

PROMPTS = ["a1", "b2", "a3"]
COMPLETIONS = ["x", "y", "z"]
COLUMNS = {"answer": ["1", "2", "3"]}


@pytest.fixture
def rewards(tmp_path):
    (tmp_path / "rew.py").write_text(REWARDS)

    def make(name, **cfg):
        return RewardComputer(RewardCfg(functions=[f"{tmp_path / 'rew.py'}:{name}"], **cfg),
                              log=logging.getLogger("rltune"))
    made = []
    yield lambda name, **cfg: made.append(make(name, **cfg)) or made[-1]
    for rc in made:
        rc.close()


def score(rc, prompts=PROMPTS):
    return rc(prompts, COMPLETIONS[:len(prompts)], {k: v[:len(prompts)] for k, v in COLUMNS.items()}).scores


def test_sys_exit_is_a_reward_error_naming_function_and_sample(rewards):
    rc = rewards("bye")
    with pytest.raises(RewardError) as err:
        score(rc)
    msg = str(err.value)
    assert "rew.py:bye called sys.exit(3)" in msg and "sample 1 (prompt 'b2')" in msg, msg
    assert "fix:" in msg and "reward.on_error: zero" in msg


def test_sys_exit_with_on_error_zero_scores_zero(rewards, caplog):
    rc = rewards("bye", on_error="zero")
    assert score(rc) == [0.0, 0.0, 0.0]
    assert "called sys.exit(3)" in caplog.text and "scored 0" in caplog.text


def test_sys_exit_while_importing_the_reward_file(tmp_path):
    (tmp_path / "bad.py").write_text("import sys\nsys.exit(2)\n")
    with pytest.raises(RewardError, match=r"importing reward file .*bad.py called sys.exit\(2\)"):
        RewardComputer(RewardCfg(functions=[f"{tmp_path / 'bad.py'}:f"]))


def test_ctrl_c_still_interrupts(rewards):
    with pytest.raises(KeyboardInterrupt):
        score(rewards("interrupt"))


def test_isolated_function_scores_in_a_worker(rewards):
    import os

    rc = rewards("echo", isolate=True)
    assert score(rc) == [1.0, 2.0, 3.0]               # data columns reach the worker
    assert score(rewards("pid", isolate=True))[0] != os.getpid()
    builtin = RewardComputer(RewardCfg(functions=["builtin:format"], isolate=True))
    assert not hasattr(builtin.functions[0][1], "close")   # builtins run in process


def test_isolated_os_exit_is_named_then_the_worker_restarts(rewards, caplog):
    rc = rewards("hard_exit", isolate=True)
    with pytest.raises(RewardError) as err:
        score(rc)
    msg = str(err.value)
    assert "rew.py:hard_exit exited with code 1 while scoring sample 1 (prompt 'b2')" in msg, msg
    assert "fix:" in msg and "reward.on_error: zero" in msg
    assert score(rc, ["a1"]) == [1.0]                 # a fresh worker takes the next call
    rc = rewards("hard_exit", isolate=True, on_error="zero")
    assert score(rc) == [0.0, 0.0, 0.0] and "exited with code 1" in caplog.text
    assert score(rc, ["a1", "a3"]) == [1.0, 1.0]


def test_isolated_segfault_and_sys_exit_and_exception(rewards):
    with pytest.raises(RewardError, match=r"segfault was killed by signal SIGSEGV while scoring sample 0"):
        score(rewards("segfault", isolate=True))
    with pytest.raises(RewardError, match=r"bye called sys.exit\(3\) while scoring sample 1"):
        score(rewards("bye", isolate=True))
    with pytest.raises(RewardError, match=r"boom raised ValueError: cannot score this one on sample 1"):
        score(rewards("boom", isolate=True))


def test_isolated_timeout(rewards):
    rc = rewards("slow", isolate=True, timeout=1.5)
    with pytest.raises(RewardError) as err:
        score(rc)
    msg = str(err.value)
    assert "rew.py:slow timed out after 1.5 s (reward.timeout) while scoring sample 1 (prompt 'b2')" in msg, msg
    assert "raise reward.timeout" in msg


def test_ctrl_c_interrupts_an_isolated_call_and_stops_its_worker(rewards):
    import signal
    import time

    rc = rewards("slow", isolate=True, timeout=30)
    worker = rc.functions[0][1]
    proc = worker._proc

    def ctrl_c(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            score(rc)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - t0 < 10
    proc.join(5)
    assert not proc.is_alive()                         # the busy worker was stopped
    assert score(rc, ["a1"]) == [0.5]                  # and the next call gets a fresh one


def test_isolated_load_errors_surface_at_start(tmp_path):
    (tmp_path / "dies.py").write_text("import os\nos._exit(4)\n")
    with pytest.raises(RewardError, match=r"dies.py:f \(reward.isolate\) exited with code 4 while its worker loaded it"):
        RewardComputer(RewardCfg(functions=[f"{tmp_path / 'dies.py'}:f"], isolate=True))
    with pytest.raises(RewardError, match=r"reward file .*missing.py does not exist"):
        RewardComputer(RewardCfg(functions=[f"{tmp_path / 'missing.py'}:f"], isolate=True))


# -- through the trainer: the run ends with the message, exit 1, no traceback

def _train(capfd, tmp_path, fn, **reward):
    from trainlib import run_inproc, tiny_recipe

    (tmp_path / "rew.py").write_text(REWARDS.replace('p.startswith("b")', "True"))
    path = tiny_recipe(tmp_path, reward={"functions": [f"{tmp_path / 'rew.py'}:{fn}"], **reward},
                       trainer__max_steps=1, trainer__eval_every=0)
    return run_inproc(capfd, "train", path)


def test_train_with_a_reward_that_calls_sys_exit(capfd, tmp_path):
    res = _train(capfd, tmp_path, "bye")
    assert res.returncode == 1, res.stderr[-3000:]
    assert "rew.py:bye called sys.exit(3) while scoring sample 0" in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stderr


def test_train_with_an_isolated_reward_that_calls_os_exit(capfd, tmp_path):
    res = _train(capfd, tmp_path, "hard_exit", isolate=True)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "rew.py:hard_exit exited with code 1 while scoring sample 0" in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stderr


# ---- what a reward function returns: one float per completion, and sums that stay finite

@pytest.mark.parametrize("name,shape", [("as_dict", "a dict"), ("as_string", "a str")])
def test_a_dict_or_a_string_is_not_a_list_of_scores(rewards, name, shape):
    # a dict's keys (mean 31) and a string's characters used to become rewards
    with pytest.raises(RewardError, match=f"{name} must return a list of floats .*got {shape}"):
        score(rewards(name))
    assert score(rewards(name, on_error="zero")) == [0.0, 0.0, 0.0]


def test_a_generator_of_scores_is_fine(rewards):
    assert score(rewards("as_generator")) == [0.5, 0.5, 0.5]


def test_an_overflowing_sum_names_the_function_and_obeys_on_error(rewards, caplog):
    # weight 1e300 on a finite 1e10: the sum is inf even in float64; the message names the
    # function, sample 1, the value and the weight
    with pytest.raises(RewardError, match=r"sample 1 .*overflows to inf: reward function .*:huge returned "
                                          r"1e\+10 \(weight 1e\+300\)"):
        score(rewards("huge", weights=[1e300]))
    with caplog.at_level(logging.WARNING, logger="rltune"):
        assert score(rewards("huge", weights=[1e300], on_error="zero")) == [0.0, 0.0, 0.0]
    assert any("overflows" in r.getMessage() for r in caplog.records)


# ---- float32: the trainer holds rewards in a float32 tensor, where a finite Python 1e39 is inf
# (issue 44, item 6: that stopped the run with "check the reward model / normalisation")

def test_a_score_beyond_float32_names_the_function_the_value_and_the_sample(rewards):
    with pytest.raises(RewardError) as err:
        score(rewards("beyond_f32"))
    msg = str(err.value)
    assert "rew.py:beyond_f32 returned 1e+39 for sample 1 (prompt 'b2')" in msg, msg
    assert "float32" in msg and "fix:" in msg and "reward.on_error: zero" in msg, msg


def test_a_score_beyond_float32_with_on_error_zero_scores_zero_and_warns(rewards, caplog):
    with caplog.at_level(logging.WARNING, logger="rltune"):
        assert score(rewards("beyond_f32", on_error="zero")) == [1.0, 0.0, 1.0]
    assert "beyond_f32 returned 1e+39 for sample 1" in caplog.text and "scored 0" in caplog.text, caplog.text


def test_a_score_at_float32s_limit_is_kept(rewards):
    # 3e38 is large but float32 holds it: no error, the score as returned
    assert score(rewards("big")) == [1.0, 3e38, 1.0]


def test_a_weighted_sum_beyond_float32_names_the_larger_source(rewards, caplog):
    # 3e38 + 3.2e38: both terms fit float32, the sum does not (finite in float64); the larger names it
    rc = rewards("big")
    rc.functions += rewards("bigger").functions
    rc.weights = [1.0, 1.0]
    with pytest.raises(RewardError) as err:
        score(rc)
    msg = str(err.value)
    assert "sample 1 (prompt 'b2') overflows float32 at 6.2e+38" in msg, msg
    assert "rew.py:bigger returned 3.2e+38 (weight 1)" in msg and "reward.on_error: zero" in msg, msg
    rc.cfg = rc.cfg.model_copy(update={"on_error": "zero"})
    with caplog.at_level(logging.WARNING, logger="rltune"):
        assert score(rc) == [2.0, 0.0, 2.0]
    assert "overflows float32" in caplog.text and "scored 0" in caplog.text


def test_a_weight_that_takes_a_score_beyond_float32_is_named(rewards):
    with pytest.raises(RewardError, match=r"sample 1 .*overflows float32 at 6e\+38.*:big returned 3e\+38 \(weight 2\)"):
        score(rewards("big", weights=[2.0]))


def test_the_normaliser_never_sees_a_score_beyond_float32(rewards):
    rc = rewards("beyond_f32", normalize=True)
    with pytest.raises(RewardError):
        score(rc)
    assert rc.moments.count == 0                       # raised before the running moments moved
    rc = rewards("beyond_f32", normalize=True, on_error="zero")
    out = score(rc)
    assert rc.moments.count == 3 and rc.moments.mean == pytest.approx(2 / 3), rc.state_dict()
    assert all(abs(v) < 10 for v in out), out
    rc = rewards("big", weights=[2.0], normalize=True, on_error="zero")
    score(rc)
    assert rc.moments.mean == pytest.approx(2 * 2 / 3), rc.state_dict()    # the 6e38 sum was scored 0


@pytest.mark.parametrize("source,name", [("model", "the reward model"), ("env", "the environment's reward")])
@pytest.mark.parametrize("value,shown", [(1e39, "1e+39"), (float("nan"), "nan")])
def test_reward_model_and_environment_scores_beyond_float32_are_named(source, name, value, shown, caplog):
    values = [1.0, value, 1.0]
    model = (lambda prompts, completions, conversations=None: values) if source == "model" else None
    env = {"env_scores": values} if source == "env" else {}
    for on_error in ("raise", "zero"):
        rc = RewardComputer(RewardCfg(functions=[], on_error=on_error), reward_model=model,
                            env_reward=source == "env", log=logging.getLogger("rltune"))
        call = lambda: rc(PROMPTS, COMPLETIONS, {}, **env).scores
        if on_error == "raise":
            with pytest.raises(RewardError) as err:
                call()
            msg = str(err.value)
            assert f"{name}" in msg and f"returned {shown} for sample 1 (prompt 'b2')" in msg and "fix:" in msg, msg
        else:
            with caplog.at_level(logging.WARNING, logger="rltune"):
                assert call() == [1.0, 0.0, 1.0]
            assert name in caplog.text and "scored 0" in caplog.text, caplog.text


def test_misspelt_reward_function_lists_close_matches(tmp_path):
    """Issue 46 item 9: `rewards.py:exact_matc` names a misspelt function: the error lists the
    file's functions and the close match."""
    from rltune.reward.functions import load_reward_function

    (tmp_path / "rewards.py").write_text("def exact_match(prompts, completions, **kw):\n    return [1.0]\n"
                                         "def other(prompts, completions, **kw):\n    return [0.0]\n")
    with pytest.raises(RewardError) as e:
        load_reward_function("rewards.py:exact_matc", tmp_path)
    text = str(e.value)
    assert "it defines the functions `exact_match`, `other`" in text, text
    assert "did you mean `rewards.py:exact_match`?" in text, text
