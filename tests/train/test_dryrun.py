"""`rltune train --dry-run`: every engine built, two small steps at the longest prompts and responses,
peak memory per phase beside the plan's estimate at those lengths, nothing written. How close the
dry run comes to the plan and to a real run's peak: tests/plan/test_rss.py."""

from __future__ import annotations

import json

import pytest

from trainlib import cli_env, run_cli, run_inproc

STEP_PHASES = ("rollout", "experience", "update")


def _no_run_written(run_dir):
    assert not run_dir.exists(), f"the dry run wrote {sorted(p.name for p in run_dir.iterdir())}"


def _tree(run_dir):
    return sorted((str(p.relative_to(run_dir)), p.read_bytes() if p.is_file() else None) for p in run_dir.rglob("*"))


@pytest.mark.parametrize("name,existing", [("tiny-grpo.yaml", True), ("tiny-ppo.yaml", False)])
def test_dry_run_prints_every_phase_measured_and_planned_and_writes_nothing(capfd, recipe_factory, tmp_path, name,
                                                                           existing):
    """`existing`: trainer.output_dir holds a run: the dry run moves nothing aside and adds
    nothing, so a later `--resume auto` sees exactly what was there."""
    run_dir = tmp_path / "run"
    if existing:
        (run_dir / "checkpoints").mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
        before = _tree(run_dir)
    res = run_inproc(capfd, "train", recipe_factory(name), "--dry-run")
    assert res.returncode == 0, res.stderr[-4000:]
    assert "Traceback" not in res.stderr
    out = res.stdout
    assert "rltune dry run:" in out and "1 optimizer update" in out
    assert "peak RSS (VmHWM)" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    for phase in ("setup", *STEP_PHASES, "sync"):
        assert phase in rows, out
    for phase in STEP_PHASES:   # measured and planned, both in MiB/GiB, and their ratio
        cells = rows[phase].split()
        assert cells[2] in ("MiB", "GiB") and cells[4] in ("MiB", "GiB"), rows[phase]
        assert float(cells[5]) > 0, rows[phase]
    # each phase's passes, indented under it, in the order they ran, measured beside the plan's group
    table = [line for line in out.splitlines() if line.startswith("  ") and not line.startswith("  (")][1:]
    under, phase = {}, None
    for line in table:
        if line.startswith("    "):
            under[phase].append(line[4:18].strip())
        else:
            phase = line.split()[0]
            under[phase] = []
    ppo = name == "tiny-ppo.yaml"      # the KL in the reward (both recipes): step 4 runs; PPO: the critic
    assert under == {"setup": [], "rollout": ["generation"],
                     "experience": ["reference pass", "behaviour pass"] + ["value pass"] * ppo,
                     "update": ["actor pass", "actor step"] + ["critic pass", "critic step"] * ppo, "sync": []}, out
    actor = next(line for line in table if line.startswith("    actor pass")).split()
    assert actor[3] in ("KiB", "MiB") and actor[5] in ("KiB", "MiB"), actor      # measured, plan
    assert "actor activations" in " ".join(actor) and "actor gradients" in " ".join(actor), actor
    assert "Nothing was written" in out
    if existing:
        assert _tree(run_dir) == before
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("run")] == ["run"]   # nothing moved aside
    else:
        _no_run_written(run_dir)


def test_dry_run_json_numbers_are_positive_and_ordered(recipe_factory, tmp_path):
    # PPO: the update phase holds the actor's and the critic's gradients and Adam state on top of
    # what the no-grad experience passes need. A process of its own: each pass's figure is the
    # resident memory it adds (below)
    path = recipe_factory("tiny-ppo.yaml")
    res = run_cli("train", path, "--dry-run", "--format", "json", env=cli_env(OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stderr[-4000:]
    report = json.loads(res.stdout)
    phases = report["phases"]
    assert list(phases) == ["setup", "rollout", "experience", "update", "sync"]
    assert report["device"] == "cpu" and report["world_size"] == 1
    assert report["work"] == {"steps": 2, "generation_calls": 1, "sequences_per_call": 16, "micro_batch_size": 16,
                              "micro_batches_per_rank": 1, "optimizer_updates": 2}
    assert report["written"] == [] and report["plan_error"] is None
    for name, p in phases.items():
        assert p["measured"] > 0 and p["seconds"] >= 0, (name, p)
    assert phases["update"]["measured"] >= phases["experience"]["measured"]
    for name in STEP_PHASES:
        est = phases[name]["plan"]
        assert est and est > 0, (name, phases[name])
        # same order of magnitude (how close the plan gets is tests/plan's business)
        assert 0.25 < phases[name]["measured"] / est < 4, (name, phases[name])
    assert phases["setup"]["plan"] is None and phases["sync"]["plan"] is None
    assert report["step"]["actor/loss"] is not None
    _no_run_written(tmp_path / "run")

    # each phase's passes (the plan's item groups) with their own peak
    groups = {name: p["groups"] for name, p in phases.items()}
    assert {k: list(v) for k, v in groups.items()} == {
        "setup": [], "rollout": ["generation"], "experience": ["reference pass", "behaviour pass", "value pass"],
        "update": ["actor pass", "actor step", "critic pass", "critic step"], "sync": []}
    assert not report["cumulative"], "VmHWM could not be reset here: no pass can be measured"
    before = report["plan_runtime"]["here"]       # resident before the engines were built
    for phase, passes in groups.items():
        for name, g in passes.items():
            assert g["why"] is None and isinstance(g["measured"], int) and g["measured"] >= 0, (name, g)
            # a pass runs inside its phase: its absolute peak is within the phase's, and what it added
            # above its start is within what the phase holds above the process before any engine
            assert g["peak"] <= phases[phase]["measured"], (phase, name, g, phases[phase])
            assert g["measured"] <= phases[phase]["measured"] - before, (phase, name, g)
            assert g["measured"] <= g["peak"] - before, (name, g)
            assert len(g["runs"]) == 2 and all(r is not None for r in g["runs"]), (name, g)   # once per step
            if name.endswith(" step"):   # the second step's: the first also created the optimizer state
                assert g["measured"] == g["runs"][1], (name, g)
            else:                        # the larger of the two steps, like the phases
                assert g["measured"] == max(g["runs"]), (name, g)
    # the first backward allocates the gradients, which never existed before (a fresh process: in one
    # that ran dry runs before, memory their passes freed and the allocator kept would serve them)
    assert groups["update"]["actor pass"]["runs"][0] > 0 and groups["update"]["critic pass"]["runs"][0] > 0
    # the plan column: the plan at these lengths, its items summed by group; a forward + backward pass
    # also its role's gradients
    from rltune.plan import Hardware, estimate
    from rltune.recipe import load_recipe

    recipe = load_recipe(path).recipe
    recipe = recipe.model_copy(update={"data": recipe.data.model_copy(
        update={"max_prompt_length": max(8, report["lengths"]["prompt_tokens"])})})
    plan = estimate(recipe, Hardware(device="cpu"))
    for phase, passes in groups.items():
        for name, g in passes.items():
            items = [it for it in plan.items if it.group == name
                     or (name in ("actor pass", "critic pass") and it.name == name.replace(" pass", " gradients"))]
            if name == "behaviour pass":    # the KL in the reward needs it; the plan counts it only for
                assert items == [] and g["plan"] is None   # several updates per step
                continue
            if name.endswith(" step") and not items:   # one rank, fp32: the step needs nothing beyond the
                assert g["plan"] is None                 # resident state (no all-reduce copy, fused AdamW)
                continue
            assert items and g["plan"] == sum(it.bytes for it in items), (name, g, items)
            assert g["plan_items"] == [it.name for it in items if it.group] + [it.name for it in items
                                                                               if not it.group]
            assert phase in g["plan_phases"], (name, g)


def test_reduced_recipe_keeps_per_pass_sizes():
    from rltune.recipe import load_recipe
    from rltune.train.dryrun import reduced
    from trainlib import ROOT

    r = load_recipe(ROOT / "recipes" / "quickstart.yaml").recipe
    small = reduced(r, world=1)
    assert (small.rollout.batch_size, small.train.micro_batch_size) == (16, 8)       # as the recipe
    assert (small.train.batch_size, small.gen_calls_per_step) == (16, 1)             # lcm(16, 8): one call
    assert (small.train.ppo_epochs, small.train.updates_per_step) == (1, 1)
    assert (small.trainer.max_steps, small.trainer.save_every, small.trainer.eval_every) == (2, 0, 0)
    big = reduced(r.model_copy(update={"train": r.train.model_copy(update={"micro_batch_size": 32})}), world=2)
    assert big.train.batch_size == 64 and big.gen_calls_per_step == 4                # fills 32 per rank x 2
    # a token budget: one micro-batch of what it holds at the longest sequence, 256 + 16 tokens
    tokens = r.model_copy(update={"train": r.train.model_copy(update={"max_tokens_per_micro_batch": 3 * 272 + 5})})
    small = reduced(tokens, world=1)
    assert (small.train.micro_batch_size, small.train.batch_size) == (3, 48)          # lcm(16, 3)
    assert reduced(tokens.model_copy(update={"train": tokens.train.model_copy(
        update={"max_tokens_per_micro_batch": 100})}), world=1).train.micro_batch_size == 1   # one row at least


def test_dry_run_takes_the_longest_prompts_and_full_length_responses(capfd, recipe_factory, tmp_path):
    """The worst case the run can meet: the one long prompt among short ones is in every call, and no
    response ends before rollout.max_new_tokens (a random tiny model would stop early now and then)."""
    import yaml

    from rltune.data import load_prompts
    from rltune.models.loading import load_tokenizer
    from rltune.recipe import load_recipe
    from rltune.train.prompts import encode_prompt

    data = tmp_path / "prompts.jsonl"
    rows = [{"prompt": f"{i % 10}+1=", "answer": str(i % 10 + 1)} for i in range(63)]
    rows.insert(37, {"prompt": "1+2+3+4+5+6+7+8+9+1+2+3+4+5+6+7+8+9+1+2+3+4=", "answer": "100"})
    data.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    path = recipe_factory("tiny-grpo.yaml", data__train=str(data), rollout__max_new_tokens=12, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path, "--dry-run", "--format", "json")
    assert res.returncode == 0, res.stderr[-4000:]
    report = json.loads(res.stdout)
    r = load_recipe(path).recipe
    tok = load_tokenizer(r.model.policy)
    prompts = load_prompts(str(data))
    lengths = [len(encode_prompt(row, tok, r.data, prompts.prompt_key)) for row in prompts.rows]
    assert report["lengths"]["prompt_tokens"] == max(lengths) > sorted(lengths)[-2], (report["lengths"], lengths)
    assert report["lengths"]["response_tokens"] == 12
    # every response at 12 tokens: tests/rollout/test_hf_sampling.py (a pad sampled last reads as padding)
    assert report["step"]["response/length_mean"] > 11, report["step"]
    assert yaml.safe_load(path.read_text())["trainer"]["max_steps"] == 20      # the recipe itself untouched
    _no_run_written(tmp_path / "run")


def test_format_json_needs_dry_run(capfd, recipe_factory):
    res = run_inproc(capfd, "train", recipe_factory(), "--format", "json")
    assert res.returncode == 2 and "--format applies to --dry-run only" in res.stderr


@pytest.mark.slow
def test_dry_run_on_two_ranks_through_the_launcher(recipe_factory, tmp_path):
    """trainer.nproc 2: every rank runs the dry step; rank 0 prints the largest peak over ranks."""
    res = run_cli("train", recipe_factory("tiny-grpo.yaml"), "--dry-run", "--nproc", "2", "--format", "json",
                  env=cli_env(OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stderr[-4000:]
    report = json.loads(res.stdout)
    assert report["world_size"] == 2
    assert report["work"]["micro_batches_per_rank"] == 1 and report["work"]["sequences_per_call"] == 16
    assert all(p["measured"] > 0 for p in report["phases"].values())
    _no_run_written(tmp_path / "run")


def test_cuda_comparison_leaves_out_the_context_and_swaps_in_the_measured_workspaces(recipe_factory):
    """On CUDA the measure is torch's allocator: the plan's CUDA context (outside it) is left out of
    every phase and its BLAS-workspace constant is replaced by the workspaces measured in the process
    (on an H200, torch 2.11: 64 MiB planned, 65 MiB measured, tiny-ppo's phases then within 1%)."""
    from rltune.plan import Hardware, estimate
    from rltune.plan.estimate import BLAS_WORKSPACES, CUDA_CONTEXT
    from rltune.recipe import load_recipe
    from rltune.train.dryrun import comparable

    recipe = load_recipe(recipe_factory("tiny-ppo.yaml")).recipe
    plan = estimate(recipe, Hardware(device="cuda", gpus=1, mem_bytes=80 << 30))
    here = BLAS_WORKSPACES + (3 << 20)
    phases, constant = comparable(plan, True, here)
    assert constant == BLAS_WORKSPACES
    for name, total in plan.phases.items():
        assert phases[name] == total - CUDA_CONTEXT + (3 << 20)
    cpu = estimate(recipe, Hardware(device="cpu"))
    runtime = next(it.bytes for it in cpu.items if it.name.startswith("runtime"))
    phases, constant = comparable(cpu, False, 100 << 20)
    assert constant == runtime and all(phases[k] == v - runtime + (100 << 20) for k, v in cpu.phases.items())
    assert comparable(cpu, False, None)[0] == dict(cpu.phases)


def test_meter_gives_each_pass_its_own_peak_and_keeps_the_phase_whole():
    """A pass resets the peak counter as it begins: its figure is its own working memory, and the
    phase's peak still covers what ran before it (64 MiB freed before a later pass began)."""
    from rltune.train.dryrun import Meter

    meter = Meter("cpu")
    meter.begin()
    if meter.cumulative:
        pytest.skip("/proc/self/clear_refs refused: VmHWM cannot be reset here")
    mib = 1 << 20
    with meter.region("outer"):
        with meter.region("big"):
            buf = b"\x01" * (64 * mib)       # touched: resident; mmapped, so freed back to the system
            del buf
        with meter.region("small"):
            buf = b"\x01" * (4 * mib)
            del buf
    meter.mark("update")
    big, small, outer = (meter.groups[n]["runs"][0] for n in ("big", "small", "outer"))
    assert all(meter.groups[n]["phase"] == "update" for n in ("big", "small", "outer"))
    assert 60 * mib <= big["above"] <= 80 * mib, big
    assert small["above"] < 32 * mib, small                       # not the earlier pass's peak
    assert big["held"] < 8 * mib, big                             # freed before it ended
    assert outer["above"] >= big["above"] and outer["peak"] >= big["peak"], (outer, big)   # nested
    assert meter.peaks["update"] >= big["peak"] > small["peak"], (meter.peaks, big, small)


def test_a_pass_is_not_measured_where_the_peak_counter_cannot_be_reset(recipe_factory):
    """/proc/self/clear_refs refused: the phases' figures are cumulative, and a pass's figure would be
    the phase's so far: none is given, and the row says why (no number made up)."""
    from rltune.recipe import load_recipe
    from rltune.train.dryrun import Meter, group_rows, pass_figures

    meter = Meter("cpu")
    meter.cumulative = True
    meter.begin()
    with meter.region("actor pass"):
        buf = b"\x01" * (8 << 20)
        del buf
    meter.mark("update")
    figures = pass_figures(meter)
    assert figures["actor pass"]["measured"] is None and figures["actor pass"]["runs"] == [None]
    assert figures["actor pass"]["peak"] > 0                 # the absolute peak is still known
    recipe = load_recipe(recipe_factory("tiny-grpo.yaml")).recipe
    row = group_rows(figures, {"actor pass": {"plan": 5, "items": ["actor activations"], "phases": ["update"]}},
                     recipe)["update"]["actor pass"]
    assert row["measured"] is None and row["plan"] == 5 and "clear_refs" in row["why"]


def test_a_pass_the_plan_counts_that_the_dry_run_does_not_run_says_why(recipe_factory):
    """Several optimizer updates per step need the behaviour pass (step 4); the dry run makes one per
    step: its row shows the plan's figure, no measurement, and why."""
    from rltune.plan import Hardware, estimate
    from rltune.recipe import load_recipe
    from rltune.train.dryrun import group_rows, plan_groups

    recipe = load_recipe(recipe_factory("tiny-grpo.yaml", train__updates_per_step=2, algorithm__kl__mode="loss")).recipe
    planned = plan_groups(estimate(recipe, Hardware(device="cpu")))
    measured = {"generation": {"phase": "rollout", "measured": 5, "peak": 9, "held": 1, "seconds": 0.1, "runs": [5]}}
    rows = group_rows(measured, planned, recipe)
    assert list(rows["experience"]) == ["reference pass", "behaviour pass"]
    behaviour = rows["experience"]["behaviour pass"]
    assert behaviour["measured"] is None and behaviour["plan"] == planned["behaviour pass"]["plan"] > 0
    assert "one optimizer update per step" in behaviour["why"] and "2 per step" in behaviour["why"]
    assert rows["rollout"]["generation"]["measured"] == 5 and rows["rollout"]["generation"]["why"] is None
    assert "export" not in {g for p in rows.values() for g in p}          # the save phase: not in a dry run
