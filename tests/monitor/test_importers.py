"""`rltune diagnose --from trl|verl|openrlhf`: other tools' logs, in the shapes those tools write
(TRL trainer_state.json and HF console dicts, verl's console and file loggers, OpenRLHF's tqdm
postfix and W&B keys), mapped onto rltune's metric names."""

import json
import math
import random

import pytest

from rltune.commands.diagnose import run
from rltune.monitor import importers as im
from rltune.monitor.runlog import RunLogError


def diag(capsys, *a, **kw):
    rc = run(*a, fmt="json", **kw)
    cap = capsys.readouterr()
    return rc, (json.loads(cap.out) if cap.out.strip() else None), cap.err


def fired(out):
    return [(e["step"], e["kind"]) for e in out["events"]]


def base(n=20, seed=0):
    """Per step: a run that learns (reward up, small KL, steady grad norm), in rltune's terms."""
    rng = random.Random(seed)
    rows = []
    for t in range(1, n + 1):
        f = t / n
        rows.append({"step": t, "reward": 0.2 + 0.4 * f + rng.gauss(0, 0.01), "reward_std": 0.3,
                     "kl": 0.01 + 0.02 * f + abs(rng.gauss(0, 0.002)),
                     "grad_norm": 0.3 * (1 + rng.gauss(0, 0.05)), "entropy": 1.2 - 0.2 * f,
                     "length": 120 + rng.gauss(0, 3), "lr": 1e-6, "clipfrac": 0.02, "loss": rng.gauss(0, 0.02),
                     "vf_loss": 0.5 * math.exp(-f)})
    return rows


# ------------------------------------------------------------------ TRL


def trl_state(tmp_path, spike_at=14):
    hist = []
    for r in base():
        kl = 2.0 if r["step"] == spike_at else r["kl"]
        hist.append({"clip_ratio/high_max": 0.0, "clip_ratio/region_mean": r["clipfrac"],
                     "completions/clipped_ratio": 0.0, "completions/mean_length": r["length"],
                     "completions/max_length": r["length"] + 40, "entropy": r["entropy"],
                     "epoch": round(r["step"] / 40, 4), "frac_reward_zero_std": 0.1, "grad_norm": r["grad_norm"],
                     "kl": kl, "learning_rate": r["lr"], "loss": r["loss"], "num_tokens": 1000.0 * r["step"],
                     "reward": r["reward"], "reward_std": r["reward_std"],
                     "rewards/accuracy_reward/mean": r["reward"],
                     "sampling/importance_sampling_ratio/max": 1.2, "step": r["step"], "step_time": 10.0})
        if r["step"] == 10:
            hist.append({"eval_loss": 0.1, "eval_reward": r["reward"], "epoch": 0.25, "step": 10})
    hist.append({"epoch": 0.5, "step": 20, "total_flos": 0.0, "train_loss": 0.01, "train_runtime": 200.0})
    doc = {"best_metric": None, "epoch": 0.5, "global_step": 20, "log_history": hist, "max_steps": 20}
    d = tmp_path / "trl_run"
    d.mkdir()
    (d / "trainer_state.json").write_text(json.dumps(doc, indent=2))
    return d


def test_trl_trainer_state_kl_spike(tmp_path, capsys):
    d = trl_state(tmp_path)
    rc, out, _ = diag(capsys, d / "trainer_state.json", source="trl")
    assert rc == 1 and out["steps"] == 20 and (out["first_step"], out["last_step"]) == (1, 20)
    assert (14, "kl_spike") in fired(out)
    assert out["verdict"]["kind"] == "kl_spike" and out["verdict"]["step"] == 14
    note = " ".join(out["notes"])
    assert "no rltune equivalent" in note and "num_tokens" in note   # unmapped keys are counted
    assert "repeated step" not in note   # the eval line of step 10 joins step 10


def test_trl_autodetected_in_run_dir(tmp_path, capsys):
    d = trl_state(tmp_path)
    rc, out, _ = diag(capsys, d)   # no --from: trainer_state.json is found and recognised
    assert rc == 1 and (14, "kl_spike") in fired(out)
    assert any("read as a log of trl" in n for n in out["notes"])


def test_trl_console_dict_lines(tmp_path, capsys):
    """The HF Trainer's console: a printed dict per logging step (numpy reprs), tqdm bars around it."""
    lines = ["Loading checkpoint shards: 100%|##########| 2/2 [00:01<00:00,  1.50it/s]"]
    for r in base():
        kl = 2.0 if r["step"] == 14 else r["kl"]
        bar = f"\r  {r['step'] * 5}%|#         | {r['step']}/20 [00:{r['step']:02d}<00:10,  1.0s/it]"
        d = (f"{{'loss': {r['loss']:.4f}, 'grad_norm': np.float64({r['grad_norm']}), 'learning_rate': {r['lr']}, "
             f"'num_tokens': {1000.0 * r['step']}, 'completions/mean_length': {r['length']}, "
             f"'reward': {r['reward']}, 'reward_std': {r['reward_std']}, 'kl': {kl}, "
             f"'entropy': {r['entropy']}, 'clip_ratio/region_mean': {r['clipfrac']}, 'epoch': {r['step'] / 40}}}")
        lines.append(bar + "\n" + d)
    lines.append("{'train_runtime': 200.1, 'train_samples_per_second': 1.2, 'train_loss': 0.01, 'epoch': 0.5}")
    f = tmp_path / "trl_console.log"
    f.write_text("\n".join(lines) + "\n")
    rc, out, _ = diag(capsys, f, source="trl")
    assert rc == 1 and out["steps"] == 20
    assert (14, "kl_spike") in fired(out)


# ------------------------------------------------------------------ verl


def verl_console(tmp_path, nan_at=12):
    lines = ["(TaskRunner pid=4242) Training Progress:   0%|          | 0/20 [00:00<?, ?it/s]"]
    for r in base():
        vf = float("nan") if r["step"] == nan_at else r["vf_loss"]
        m = {"actor/entropy": r["entropy"], "actor/kl_loss": r["kl"], "actor/pg_loss": r["loss"],
             "actor/pg_clipfrac": r["clipfrac"], "actor/ppo_kl": 0.001, "actor/grad_norm": r["grad_norm"],
             "actor/lr": r["lr"], "critic/vf_loss": vf, "critic/grad_norm": 0.5, "critic/score/mean": r["reward"],
             "critic/rewards/mean": r["reward"], "response_length/mean": r["length"],
             "response_length/clip_ratio": 0.0, "timing_s/gen": 12.5, "timing_s/update_actor": 4.0,
             "perf/throughput": 1500.0}
        # verl's console logger: "step:N - key:value - ..." with 3 decimals
        lines.append("(TaskRunner pid=4242) " + " - ".join([f"step:{r['step']}"] + [f"{k}:{v:.3f}" for k, v in m.items()]))
    f = tmp_path / "verl_train.log"
    f.write_text("\n".join(lines) + "\n")
    return f


def test_verl_console_critic_nan(tmp_path, capsys):
    f = verl_console(tmp_path)
    rc, out, _ = diag(capsys, f, source="verl")
    assert rc == 1 and out["steps"] == 20
    assert (12, "critic_nan") in fired(out) and out["verdict"]["kind"] == "critic_nan"
    rc, out2, _ = diag(capsys, f)   # detected from the `step:N - key:value` lines
    assert rc == 1 and fired(out2) == fired(out)
    assert any("read as a log of verl" in n for n in out2["notes"])


def test_verl_file_logger_grad_spike(tmp_path, capsys):
    rows = []
    for r in base(24):
        data = {"actor/grad_norm": 30.0 if r["step"] == 15 else r["grad_norm"], "actor/pg_loss": r["loss"],
                "actor/kl_loss": r["kl"], "critic/score/mean": r["reward"], "response_length/mean": r["length"],
                "actor/entropy": r["entropy"], "training/global_step": r["step"]}
        rows.append({"step": r["step"], "data": data})
    d = tmp_path / "verl_run"
    d.mkdir()
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    rc, out, _ = diag(capsys, d, source="verl")
    assert rc == 1 and (15, "grad_spike") in fired(out)


# ------------------------------------------------------------------ OpenRLHF


def openrlhf_console(tmp_path, spike_at=12):
    """PPO status on the episode bar's postfix (one new postfix per step, redrawn), the train-epoch
    micro-batch bars in between (short names: not steps)."""
    segs = []
    for r in base():
        kl = 2.0 if r["step"] == spike_at else r["kl"]
        for mb in range(1, 3):
            segs.append(f"Train epoch [1/1]: {mb * 50}%|#####     | {mb}/2 [00:0{mb}<00:01, 1.00it/s, "
                        f"act_loss={r['loss']:.3g}, reward={r['reward']:.3g}, gen_len={r['length']:.3g}, "
                        f"kl={kl * 1.1:.3g}, act_lr=1e-6]")
        post = (f"policy_loss={r['loss']:.3g}, actor_lr=5e-7, ppo_clip_ratio={r['clipfrac']:.3g}, "
                f"ppo_kl=0.001, kl={kl:.3g}, reward={r['reward']:.3g}, return={r['reward']:.3g}, "
                f"response_length={r['length']:.4g}, total_length={r['length'] + 100:.4g}, "
                f"critic_loss={r['vf_loss']:.3g}, values=0.1, critic_lr=9e-6")
        t = r["step"]
        for redraw in (t, t + 1):   # set_postfix, then pbar.update() redraws the same postfix
            segs.append(f"Episode [1/1]: {redraw * 5:3d}%|##        | {redraw}/20 [0{redraw}:00<10:00, 30.0s/it, {post}]")
    f = tmp_path / "openrlhf.log"
    f.write_text("\r".join(segs) + "\n")
    return f


def test_openrlhf_console_kl_spike(tmp_path, capsys):
    f = openrlhf_console(tmp_path)
    rc, out, _ = diag(capsys, f, source="openrlhf")
    assert rc == 1 and out["steps"] == 20
    assert (12, "kl_spike") in fired(out)
    rc, out2, _ = diag(capsys, f)   # detected
    assert rc == 1 and fired(out2) == fired(out)


def test_openrlhf_wandb_jsonl_critic_nan(tmp_path, capsys):
    rows = []
    for r in base():
        m = {"policy_loss": r["loss"], "actor_lr": 5e-7, "kl": r["kl"], "reward": r["reward"],
             "return": r["reward"], "response_length": r["length"], "total_length": r["length"] + 100,
             "critic_loss": float("nan") if r["step"] == 7 else r["vf_loss"], "values": 0.1, "critic_lr": 9e-6}
        rows.append({"_step": r["step"] - 1, "_runtime": 10.0 * r["step"],
                     **{f"train/{k}": v for k, v in m.items()}, "train/global_step": r["step"]})
    f = tmp_path / "wandb_history.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in rows) + "\n")   # json.dumps writes NaN
    rc, out, _ = diag(capsys, f, source="openrlhf")
    assert rc == 1 and (7, "critic_nan") in fired(out)
    assert (out["first_step"], out["last_step"]) == (1, 20)   # train/global_step, not W&B's _step


# ------------------------------------------------------------------ bad input


def test_unknown_format_names_file_and_formats(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("epoch 1 done\nloss went down\n")
    rc, out, err = diag(capsys, f)
    assert rc == 2 and out is None
    assert str(f) in err and "not a log format" in err and "openrlhf" in err and "Traceback" not in err
    g = tmp_path / "other.jsonl"
    g.write_text("\n".join(json.dumps({"iteration": i, "foo_metric": 0.1 * i}) for i in range(5)) + "\n")
    rc, _, err = diag(capsys, g)
    assert rc == 2 and str(g) in err and "accepted" in err


def test_no_usable_metric_says_so_with_fix(tmp_path, capsys):
    f = tmp_path / "sft.jsonl"
    f.write_text("\n".join(json.dumps({"step": i, "foo": 1.0, "bar": 2.0}) for i in range(1, 6)) + "\n")
    rc, _, err = diag(capsys, f, source="trl")
    assert rc == 2 and "no metric rltune reads" in err and "--map" in err and "foo" in err
    # a verl log read as TRL: named, with the right flag
    v = verl_console(tmp_path)
    rc, _, err = diag(capsys, v, source="openrlhf")
    assert rc == 2 and "use --from verl" in err
    e = tmp_path / "empty.log"
    e.write_text("starting...\n")
    rc, _, err = diag(capsys, e, source="verl")
    assert rc == 2 and "no metric records found for --from verl" in err
    rc, _, err = diag(capsys, e, source="nemo")
    assert rc == 2 and "trl, verl, openrlhf" in err


def test_cli_flag(tmp_path, capsys):
    from rltune.cli import main

    f = verl_console(tmp_path)
    with pytest.raises(SystemExit) as ex:
        main(["diagnose", str(f), "--from", "verl", "--format", "json"])
    assert ex.value.code == 1
    assert json.loads(capsys.readouterr().out)["verdict"]["kind"] == "critic_nan"


# ------------------------------------------------------------------ mapping units


def test_value_parsing():
    assert im._num("0.5") == 0.5 and im._num(" 5e-7, ") == 5e-7 and math.isnan(im._num("nan"))
    assert im._num("-inf") == -math.inf and im._num("np.float64(0.25)") == 0.25
    assert im._num("tensor(1.5, device='cuda:0')") == 1.5 and im._num("'text'") is None
    assert im._num("[1, 2]") is None


def test_line_shapes():
    assert im._verl_line("(WorkerDict pid=1) step:3 - actor/pg_loss:0.100 - critic/vf_loss:nan - x:abc") == {
        "step": 3, "actor/pg_loss": 0.1, "critic/vf_loss": pytest.approx(float("nan"), nan_ok=True)}
    assert im._verl_line("no step here") is None
    d = im._dict_line("{'loss': 0.1, 'grad_norm': tensor(0.3, device='cuda:0'), 'lr': np.float32(1e-06), "
                      "'name': 'abc', 'epoch': 0.01}")
    assert d == {"loss": 0.1, "grad_norm": 0.3, "lr": 1e-6, "epoch": 0.01}
    bar, post = im._tqdm_segment("Episode [1/2]:  50%|#####     | 3/6 [01:00<01:00, 20.0s/it, "
                                 "policy_loss=0.0123, actor_lr=5e-7, kl=nan]")
    assert bar == "Episode [1/2]:" and post["policy_loss"] == 0.0123 and post["actor_lr"] == 5e-7
    assert im._tqdm_segment("Episode [1/2]:  50%|#####     | 3/6 [01:00<01:00, 20.0s/it]") is None


@pytest.mark.parametrize("tool,rec,want", [
    ("trl", {"reward": 0.5, "kl": 0.01, "completions/mean_length": 80.0, "grad_norm": 0.3, "learning_rate": 1e-6,
             "clip_ratio/region_mean": 0.02, "frac_reward_zero_std": 0.1, "step": 4, "epoch": 0.1},
     {"step": 4, "reward/mean": 0.5, "kl": 0.01, "response/length_mean": 80.0, "actor/grad_norm": 0.3,
      "actor/lr": 1e-6, "actor/clipfrac": 0.02, "batch/zero_adv_frac": 0.1}),
    ("trl", {"train/reward": 0.5, "train/kl": 0.2, "train/global_step": 9},   # W&B keys of the HF Trainer
     {"step": 9, "reward/mean": 0.5, "kl": 0.2}),
    ("verl", {"critic/score/mean": 0.7, "actor/kl_loss": 0.03, "actor/ppo_kl": 0.001, "critic/vf_loss": 0.4,
              "response_length/mean": 300.0, "timing_s/update_weights": 0.45, "step": 2},
     {"step": 2, "reward/mean": 0.7, "kl": 0.03, "critic/loss": 0.4, "response/length_mean": 300.0,
      "timing/sync_ms": 450.0}),
    ("openrlhf", {"train/policy_loss": 0.1, "train/kl": 0.02, "train/reward": 1.0, "train/response_length": 200.0,
                  "train/critic_loss": 0.3, "train/actor_lr": 5e-7, "train/global_step": 5},
     {"step": 5, "actor/loss": 0.1, "kl": 0.02, "reward/mean": 1.0, "response/length_mean": 200.0,
      "critic/loss": 0.3, "actor/lr": 5e-7}),
    ("openrlhf", {"act_loss": 0.1, "reward": 1.0, "gen_len": 50.0, "kl": 0.02, "act_lr": 1e-6, "ent_loss": 0.9},
     {"actor/loss": 0.1, "reward/mean": 1.0, "response/length_mean": 50.0, "kl": 0.02, "actor/lr": 1e-6,
      "actor/entropy": 0.9}),
])
def test_map_record(tool, rec, want):
    row, left = im.map_record(rec, tool, im.TOOL_MAPS[tool])
    assert row == pytest.approx(want)
    assert "epoch" not in left and not any(k.endswith("global_step") for k in left)


def test_map_record_counts_unmapped_not_alternates():
    row, left = im.map_record({"critic/score/mean": 0.7, "actor/kl_loss": 0.03, "actor/ppo_kl": 0.001,
                               "perf/throughput": 9.0, "step": 1}, "verl", im.TOOL_MAPS["verl"])
    assert left == {"perf/throughput"}


def test_detect():
    assert im.detect([("json", {"reward/mean": 1.0, "kl": 0.1, "step": 1})])[0] == "native"
    assert im.detect([("json", {"reward": 1.0, "reward_std": 0.1, "completions/mean_length": 5.0})])[0] == "trl"
    assert im.detect([("verl-console", {"step": 1, "actor/pg_loss": 0.1})])[0] == "verl"
    assert im.detect([("json", {"train/policy_loss": 0.1, "train/actor_lr": 1e-6})])[0] == "openrlhf"
    assert im.detect([("json", {"loss": 0.1, "foo": 1.0})])[0] is None


def test_read_log_errors(tmp_path):
    with pytest.raises(RunLogError, match="unknown source"):
        im.read_log(tmp_path, source="deepspeed-chat")
    (tmp_path / "a.log").write_text("x")
    (tmp_path / "b.log").write_text("y")
    with pytest.raises(RunLogError, match="point at the log file"):
        im.read_log(tmp_path, source="verl")


def test_console_noise_does_not_shift_steps(tmp_path, capsys):
    """A config dump and other tools' bars (vLLM, no postfix metrics) before the metric lines."""
    lines = ["{'learning_rate': 1e-06, 'beta': 0.04, 'output_dir': 'out'}",
             "Processed prompts: 100%|##########| 8/8 [00:01<00:00, 6.1it/s, est. speed input: 99.5 toks/s]"]
    for r in base():
        kl = 2.0 if r["step"] == 14 else r["kl"]
        lines.append(f"{{'loss': {r['loss']}, 'grad_norm': {r['grad_norm']}, 'learning_rate': 1e-06, "
                     f"'reward': {r['reward']}, 'kl': {kl}, 'completions/mean_length': {r['length']}, 'epoch': 0.1}}")
        if r["step"] == 10:
            lines.append("{'eval_loss': 0.2, 'eval_reward': 0.4, 'epoch': 0.1}")   # joins step 10
    f = tmp_path / "trl.out"
    f.write_text("\n".join(lines) + "\n")
    rc, out, _ = diag(capsys, f, source="trl")
    assert rc == 1 and out["steps"] == 20 and (14, "kl_spike") in fired(out)


def test_micro_batch_bars_only(tmp_path, capsys):
    segs = [f"Train epoch [1/1]: 50%|#####     | {i}/40 [00:01<00:01, 1.00it/s, act_loss=0.01, reward={0.1 + i / 100:.3g}, "
            f"gen_len=100, kl={2.0 if i == 15 else 0.02}, act_lr=1e-6]" for i in range(1, 21)]
    f = tmp_path / "actor.log"
    f.write_text("\r".join(segs))   # no newline at all
    rc, out, _ = diag(capsys, f, source="openrlhf")
    assert rc == 1 and out["steps"] == 20 and (15, "kl_spike") in fired(out)
    assert any("micro-batch" in n for n in out["notes"])


def test_segments_split_across_blocks(tmp_path):
    f = tmp_path / "x.log"
    f.write_bytes(b"ab\rcd\nef" * 5 + b"\r\n")
    want = ["ab", "cd", "efab", "cd", "efab", "cd", "efab", "cd", "efab", "cd", "ef", ""]
    assert list(im._segments(f, block=3)) == want == list(im._segments(f))


def test_user_map_on_top_of_from(tmp_path, capsys):
    rows = [{"step": r["step"], "policy_loss": r["loss"], "my_kl": 2.0 if r["step"] == 12 else r["kl"],
             "reward": r["reward"]} for r in base()]
    f = tmp_path / "custom.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    rc, out, _ = diag(capsys, f, source="openrlhf", maps=["kl=my_kl"])
    assert rc == 1 and (12, "kl_spike") in fired(out)
