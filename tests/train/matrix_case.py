"""One case of the training-core matrix (tests/train/test_matrix.py), in its own process(es).

    python tests/train/matrix_case.py CASE_JSON OUT_DIR                 # one rank
    python -m torch.distributed.run --nproc_per_node 2 tests/train/matrix_case.py CASE_JSON OUT_DIR

Every rank builds the same global experience through the trainer's own steps 1-2
(`sampling.sample_step`: the real prompt sampler with a one-rank view, the real hf engine with the
case's top-p, stop strings, dynamic sampling, overlong penalty and truncation mask; tiny Llama,
seeded), keeps its share (the rows a 1-rank run would put in the same updates), then runs the
trainer's own steps 3-8 (`loop.learn`) on real DeepSpeed engines (with the case's LoRA adapter,
ratio level and policy loss) and measures what must hold:

- ratio 1: the first update's forwards reproduce pi_behaviour (`first_dev`); later updates of
  the step move away from it (`later_dev`) and clipping engages (`later_clipfrac`);
- objective: one more update on the fixed experience lowers the surrogate loss;
- 1 x 8 == 8 x 1: fresh actors updated on the step's experience with one micro-batch per rank
  and with micro-batches of one sequence (with `train.max_tokens_per_micro_batch`: the budget's
  packing, `many_micro` micro-batches) end with the same weights (`accum_diff`);
- padding-free passes (`train.padding_free`) are exact: the padded passes' 1 x 8 update ends at the
  same weights (`packing_diff`);
- the final actor weights (rank 0 writes them) so the test can compare 2 ranks with 1.
The test reads OUT_DIR/result.json and OUT_DIR/params.pt.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

MICRO, PER_UPDATE, GROUP, NEW_TOKENS = 2, 8, 4, 6


# the factors a case may leave out take these values (the matrix before they were factors)
DEFAULTS = {"filter": False, "lora": "none", "ratio_level": "token", "policy_loss": "ppo",
            "mask_truncated": False, "overlong": False, "top_p": 1.0, "episodes": False, "stale": False,
            "mb_tokens": None, "checkpointing": False, "padding_free": False, "breaks": False}
# a chat template that rewrites history (as Qwen3 drops past <think> blocks): a past assistant turn is
# shown by its first three characters only, so an episode whose turn was longer breaks its prefix there and
# goes on as a new sample (docs/agents.md, "Tokens"); a shorter turn does not break
BREAKING_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' and not loop.last %}"
    "{{ m['content'][:3] }}{% else %}{{ m['content'] }}{% endif %}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}")
LORA = {"d0": {"r": 8, "alpha": 16, "dropout": 0.0}, "d05": {"r": 8, "alpha": 16, "dropout": 0.05}}


def recipe_for(case: dict):
    from rltune.recipe.schema import Recipe

    case = {**DEFAULTS, **case}
    model = {"policy": "builtin:tiny-llama", "attn_implementation": "eager"}
    if case["lora"] != "none":
        model["lora"] = LORA[case["lora"]]
    algorithm = {"name": case["algo"], "group_size": GROUP, "loss_agg": case["agg"], "clip_range": 0.2,
                 "ratio_level": case["ratio_level"], "policy_loss": case["policy_loss"],
                 "kl": {"coef": 0.05, "mode": case["kl_mode"], "estimator": case["estimator"]},
                 "rollout_correction": {"mode": case["correction"], "cap": 2.0}}
    if case["ratio_level"] != "token":  # GSPO's clip range: a sequence's mean log-ratio is small (arXiv:2507.18071)
        algorithm.update(clip_range=3e-4, clip_range_high=4e-4)
    if case["filter"]:
        algorithm["filter_groups"] = {"metric": "reward", "max_gen_calls": 8 * case["updates"]}
    rollout = {"engine": "hf", "batch_size": PER_UPDATE, "max_new_tokens": NEW_TOKENS, "temperature": 1.0,
               "top_p": case["top_p"], "top_k": 20 if case["top_p"] < 1 else 0,
               "asynchronous": {"max_staleness": 1 if case["stale"] else 0}}
    if case["episodes"]:   # builtin:guess episodes (GuessingEngine plays): model and env turns alternate
        # "agent": the same game as OpenAI-client code (recipes/guess_agent.py) through the recording endpoint
        env = f"{Path(__file__).resolve().parents[2] / 'recipes' / 'guess_agent.py'}:run" if case["episodes"] == "agent" \
            else "builtin:guess"
        rollout.update(env=env, max_turns=3, max_episode_tokens=256)
    if case["mask_truncated"]:
        # a random tiny model almost never samples EOS: digits as stop strings end about half the rows early,
        # so the mask drops some rows and keeps others
        rollout.update(mask_truncated=True, stop=list("0123456789"))
    # overlong buffer 2: the penalty starts past 4 tokens, so the episode cases' turns (2-6 tokens, EOS
    # included) hold both punished turns and episodes of short turns longer than NEW_TOKENS in all
    return Recipe.model_validate({
        "model": model,
        "data": {"train": "builtin:arithmetic", "apply_chat_template": False},
        "reward": {"functions": ["builtin:format"],
                   **({"overlong": {"buffer": 2, "penalty": 1.0}} if case["overlong"] else {})},
        "algorithm": algorithm,
        # eps 1e-2: Adam stays linear in the gradient, so float-rounding differences stay float-sized
        # LoRA: the adapter moves the policy less per step; 10x the lr (the playbook's LoRA factor) so that
        # later updates of a step leave the clip range as the full-weight cases do
        "actor": {"lr": 5e-2 if case["lora"] != "none" else 5e-3, "eps": 1e-2, "warmup_steps": 0, "zero_stage": case["zero"],
                  "grad_clip": 1.0, "gradient_checkpointing": case["checkpointing"]},
        "critic": {"lr": 1e-2, "eps": 1e-2, "warmup_steps": 0, "zero_stage": case["zero"], "grad_clip": 1.0,
                   "gradient_checkpointing": case["checkpointing"]},
        "rollout": rollout,
        "train": {"batch_size": PER_UPDATE, "micro_batch_size": MICRO, "ppo_epochs": case["epochs"],
                  "updates_per_step": case["updates"], "max_tokens_per_micro_batch": case["mb_tokens"], "padding_free": case["padding_free"]},
        "trainer": {"precision": case["precision"], "seed": 0, "device": "cpu"},
    })


def scripted_rewards(prompts, completions, columns, conversations=None, training=True, **_):
    """Seeded scores that a wrong split would scramble: prompts of even `a` score alike across their
    group (no signal: dynamic sampling drops them), the others by a hash of the completion."""
    import zlib

    from rltune.reward import RewardResult

    scores = [0.5 if int(p.split("+")[0]) % 2 == 0 else (zlib.crc32(c.encode()) % 1000) / 1000.0
              for p, c in zip(prompts, completions)]
    return RewardResult(scores, {"scripted": scores})


def global_experience(recipe, updates: int, breaks: bool = False):
    """updates x PER_UPDATE sequences (GROUP samples per prompt), identical on every rank: the
    trainer's steps 1-2 with a one-rank view of the prompts (a 2-rank run then splits them)."""
    from types import SimpleNamespace

    from rltune.data.sampler import PromptSampler
    from rltune.models.loading import load_causal_lm, load_tokenizer
    from rltune.rollout.hf import HFRollout
    from rltune.train.sampling import sample_step

    tok = load_tokenizer("builtin:tiny-llama")
    engine = HFRollout(load_causal_lm("builtin:tiny-llama", "fp32", "eager", "cpu"), tok)
    rows = [{"prompt": f"{a}+{a + 1}=", "answer": str(2 * a + 1), "target": a % 16 + 1} for a in range(200)]
    env = None
    if recipe.rollout.env:
        from rltune.agents.env import load_env_class
        from rltune.agents.rendering import Renderer

        game = load_env_class(recipe.rollout.env)     # builtin:guess, or the agent function
        if breaks:
            tok.chat_template = BREAKING_TEMPLATE
        env, engine, model = (game, Renderer(tok, None)), GuessingEngine(tok), engine.model
    c = SimpleNamespace(recipe=recipe, tokenizer=tok, rollout=engine, rewards=scripted_rewards,
                        train_set=SimpleNamespace(rows=rows, prompt_key="prompt"), dist=SimpleNamespace(is_main=False),
                        env=env, sampler=PromptSampler(len(rows), recipe.prompts_per_call, 0, shuffle=False))
    if recipe.rollout.asynchronous.max_staleness:
        # generation ahead (docs/async.md): the batch was sampled by an older policy than the one that
        # learns from it; its rollout log-probs are that policy's, and the learner's ratio must still
        # be 1 against its own weights at the start of the step (decoupled PPO's proximal policy)
        g = torch.Generator().manual_seed(555)
        with torch.no_grad():
            for p in engine.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.dtype))
    torch.manual_seed(1234)
    if hasattr(engine, "seed"):   # the hf engine samples with an RNG of its own
        engine.seed(1234)
    drawn = sample_step(c)
    exp = drawn.batch.exp
    assert exp.size == updates * PER_UPDATE, exp.size
    samples = [exp] if exp.earlier is None else [exp, exp.earlier]   # and those before a prefix break
    if recipe.rollout.env:   # what a real engine reports: the policy's log-probs of the guesses, at every turn
        from rltune.train.update import forward_logp

        for e in samples:
            e.rollout_logp = forward_logp(model, e, 1.0, MICRO)
    g = torch.Generator().manual_seed(99)
    # the rollout engine's log-probs with a mismatch, so that the correction has work to do
    for e in samples:
        noise = 0.3 * torch.randn(e.response_mask.shape, generator=g)
        e.rollout_logp = (e.rollout_logp + noise) * e.train_mask
    if breaks:   # some episodes broke (rows of their own), some did not: the ranks' rows differ
        owners = exp.earlier.owner.unique().numel() if exp.earlier is not None else 0
        assert 0 < owners < exp.size, owners
    if recipe.rollout.env:   # episodes: several turns each, the environment's tokens between them
        env_tokens = exp.response_mask - exp.train_mask
        assert float(env_tokens.sum()) > 0 and drawn.metrics["episode/turns_mean"] > 1, drawn.metrics
    if recipe.rollout.env and recipe.reward.overlong is not None:
        # every turn has its own rollout.max_new_tokens: an episode of turns short of the penalty's
        # buffer is not punished, however long the episode (issue 44.2: it was, by its total)
        pen = torch.tensor(drawn.batch.raw["overlong"])                                # (B,)
        start = NEW_TOKENS - recipe.reward.overlong.buffer
        short = exp.turn_lengths <= start                                             # (B,)
        assert bool((short & (exp.train_mask.sum(-1) > NEW_TOKENS)).any()), "no long episode of short turns"
        assert bool((pen[short] == 0).all()) and bool((pen[~short] < 0).all()), pen
    return exp, drawn.metrics


class GuessingEngine:
    """The rollout engine of the episode cases: every turn of every episode is a few seeded random
    tokens and EOS, so that episodes run several turns (the random tiny model itself almost never
    samples EOS). Its log-probs are placeholders: the policy's
    are computed over the finished episodes (`global_experience`), then given the same mismatch as
    the sampled cases'."""

    name = "guessing"

    def __init__(self, tok):
        self.tok, self.eos_ids, self.pad_id = tok, {tok.eos_token_id}, tok.pad_token_id
        self.gen = torch.Generator().manual_seed(7)

    def generate(self, prompt_ids, sampling):
        from rltune.rollout.experience import Experience

        # 1-5 random characters (a digit among them now and then: a guess) and EOS
        turns = [torch.randint(4, 60, (int(torch.randint(1, 6, (1,), generator=self.gen)),), generator=self.gen).tolist()
                 + [self.tok.eos_token_id] for _ in prompt_ids]
        T = max(len(t) for t in turns)
        ids = torch.full((len(turns), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(turns), T)
        for i, t in enumerate(turns):
            ids[i, :len(t)], mask[i, :len(t)] = torch.tensor(t), 1.0
        return Experience(prompt_ids=torch.zeros(len(turns), 1, dtype=torch.long),
                          prompt_mask=torch.ones(len(turns), 1, dtype=torch.long), response_ids=ids,
                          response_mask=mask, rollout_logp=-0.5 * mask)

    def sleep(self):
        pass


def rank_rows(total: int, updates: int, rank: int, world: int) -> torch.Tensor:
    """Update u of a 1-rank run holds rows [u*P, (u+1)*P); each rank takes its slice of it, so
    the ranks' update u together is the 1-rank update u (whole groups: P/world % GROUP == 0). Rows
    here are episodes: the samples before a prefix break go with theirs (`Experience.select`)."""
    per = PER_UPDATE // world
    return torch.cat([torch.arange(u * PER_UPDATE + rank * per, u * PER_UPDATE + (rank + 1) * per)
                      for u in range(updates)])


class LossRecorder:
    """Wraps `policy_loss` to record max |logp - behaviour| and clipfrac of every call."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, logp, old, *args, **kw):
        loss, stats = self.fn(logp, old, *args, **kw)
        mask = args[1] > 0
        dev = float((logp.detach() - old).abs()[mask].max()) if mask.any() else 0.0
        self.calls.append((dev, float(stats["clipfrac"])))
        return loss, stats


def fresh_actor(recipe, total: int):
    """An actor at the behaviour weights: a LoRA adapter's init is seeded, so every actor built here
    (and each run's, 1 rank or 2) starts from the same adapter. The adapter is built like a trained
    one, lora_B small and random instead of 0: with B = 0 the adapter's path, dropout included, adds
    nothing, and a dropout that leaked into the update would go unseen."""
    from rltune.engine.roles import build_actor
    from rltune.models import lora

    product = lora.apply_lora

    def trained_like(model, cfg, *args, **kw):
        peft_model = product(model, cfg, *args, **kw)      # the product's adapter (its dropout handling included)
        g = torch.Generator().manual_seed(77)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.02 * torch.randn(p.shape, generator=g).to(p.dtype))
        return peft_model

    lora.apply_lora = trained_like
    try:
        torch.manual_seed(4321)
        return build_actor(recipe, "cpu", total)
    finally:
        lora.apply_lora = product


def global_loss(loss_fn, exp, agg) -> float:
    """The update's objective over every rank, weighted exactly as run_update weighs it."""
    from rltune.train.collective import global_sum
    from rltune.train.update import micro_weight

    with torch.no_grad():
        loss, _ = loss_fn(exp)
    tokens, seqs = global_sum([float(exp.response_mask.sum()), float(exp.size)])
    w = micro_weight(exp.response_mask, tokens, seqs, agg)
    return global_sum([float(loss) * w])[0]


def unshuffled(e, micro: int, size: int, gen, group: int = 1, max_tokens=None, layout: str = "padded"):
    """loop.micro_batches without the shuffle: the ranks' update u must hold the rows of the 1-rank
    update u. Micro-batches of `micro` rows as they come, or the budget's length-sorted packing of
    whole groups (`batching.cut`)."""
    from rltune.train import batching

    if e.episode is not None:   # rows of episodes: update u holds episodes [u*size, (u+1)*size), every row
        E = int(e.episode.max()) + 1
        unit = batching.group_rows(E, group)
        out = []
        for u in range(0, E, size):
            rows = ((e.episode >= u) & (e.episode < u + size)).nonzero().reshape(-1)
            out.append(batching.cut(e, rows, micro, unit, max_tokens, layout, e.episode[rows] // unit))
        return out
    if max_tokens is not None:
        unit = batching.group_rows(size, group)
        return [batching.cut(e, torch.arange(u, min(u + size, e.size)), micro, unit, max_tokens, layout)
                for u in range(0, e.size, size)]
    return [[e.select(torch.arange(u + m, min(u + m + micro, u + size))) for m in range(0, size, micro)]
            for u in range(0, e.size, size)]


def main() -> int:
    case, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    from rltune.engine.distributed import init_distributed, shutdown_distributed
    from rltune.engine.roles import build_actor, build_critic, build_reference
    from rltune.engine.weights import iter_full_params
    from rltune.algo import make_kl_controller
    from rltune.recipe.knobs import Knobs
    from rltune.train import batching, loop, shared_prompt, update
    from rltune.train.collective import global_max, global_sum

    # the tiny model saves too little for the shared-prompt passes to pay off: force them, so the
    # matrix (2 ranks, every ZeRO stage, the critic) runs them
    shared_prompt.MIN_SAVED_FLOP = 0.0
    from rltune.models.lora import AdapterDisabledReference, adapter_reference_ok
    from rltune.train.setup import Components, resolve_correction

    dist = init_distributed("cpu")
    torch.manual_seed(0)
    r = recipe_for(case)
    U = r.train.updates_per_step
    full, sampled = global_experience(r, U, case.get("breaks", False))
    exp = full.select(rank_rows(full.size, U, dist.rank, dist.world_size))
    if r.rollout.env:   # the learner's rows: one per sample (rows of their own after a prefix break)
        exp = exp.rows(0)
    total = 10 * r.optimizer_updates_per_step
    actor = fresh_actor(r, total)
    # the reference as setup builds it: the actor with its adapter disabled under LoRA
    reference = AdapterDisabledReference(actor) if adapter_reference_ok(r) else build_reference(r, "cpu")
    c = Components(r, dist, None, None, None, None, None, actor,
                   build_critic(r, "cpu", total) if r.has_critic else None, reference, None,
                   make_kl_controller(0.05, None, 10000), resolve_correction(r, "hf"))
    knobs = Knobs.from_recipe(r)
    loop.micro_batches = unshuffled   # no shuffling: the ranks' update u holds the rows of the 1-rank update u
    recorder = LossRecorder(update.policy_loss)
    update.policy_loss = recorder
    sizes, run_update = [], loop.run_update

    def counted(engine, mbs, *args, **kw):   # micro-batches per actor update (they vary with rows of episodes)
        if engine is c.actor:
            sizes.append(len(mbs))
        return run_update(engine, mbs, *args, **kw)

    loop.run_update = counted
    fillers, cut = [0], batching.cut

    def counting_cut(*args, **kw):   # micro-batches that only keep this rank in step (batching.filler)
        out = cut(*args, **kw)
        fillers[0] += sum(mb.filler for mb in out)
        return out

    batching.cut = counting_cut
    learned = loop.learn(c, exp, knobs, torch.Generator().manual_seed(0))
    loop.run_update = run_update
    per_update = sizes[0]
    first = recorder.calls[:per_update]
    later = recorder.calls[per_update:]
    # over every rank: a rank may hold only rows that teach nothing (a group scored alike, responses
    # masked out), so the ratio's movement and the clipping are properties of the global batch
    most_rows, fewest_rows = global_max([float(exp.size), -float(exp.size)])   # rows per rank (episodes: they differ)
    first_dev, later_dev, later_clipfrac = global_max([max(d for d, _ in first), max((d for d, _ in later), default=0.0),
                                                       max((f for _, f in later), default=0.0)])
    update.policy_loss = recorder.fn

    # 1 x 8 == 8 x 1 and the objective on a fixed batch, on fresh actors at the behaviour weights.
    # Fresh actors equal the reference, where |logp - ref| (estimator abs) has a kink: float noise
    # of a few ulps would pick the sign of its gradient. Shift the fixed batch's reference off it.
    if exp.ref_logp is not None:
        exp.ref_logp = exp.ref_logp - 0.1 * exp.response_mask
    # one small step (the full-weight lr also under LoRA): "lowers the objective" is a first-order claim
    small = r.model_copy(update={"actor": r.actor.model_copy(update={"lr": 5e-3})})
    actors = [fresh_actor(small, total), fresh_actor(small, total)]
    fn = [update.make_actor_loss(a, r, knobs, c.correction) for a in actors]
    init = {n: t.float().clone() for n, t in iter_full_params(actors[0])}
    # pi_behaviour is the actor's own forward at the weights that sampled, not the engine's numbers
    own = update.forward_logp(actors[0].module, exp, r.logprob_temperature, MICRO)
    behavior_err = float((own - exp.behavior_logp).abs().max())
    rollout_err = float((exp.rollout_logp - exp.behavior_logp).abs().max())
    objective = fn[0]
    if r.algorithm.policy_loss == "cispo":
        # CISPO's loss is sg(w) * A * log pi with w the clipped ratio recomputed at every evaluation: after
        # a step w itself has moved (up to 1 + clip_range_high on the tokens that gained), which scales the
        # large -log pi terms. The objective the step descends holds w at its value when the gradient was
        # taken: 1 at the first update. A clip range of 1e-6 evaluates exactly that (w = 1).
        fixed = r.model_copy(update={"algorithm": r.algorithm.model_copy(
            update={"clip_range": 1e-6, "clip_range_high": 1e-6})})
        objective = update.make_actor_loss(actors[0], fixed, Knobs.from_recipe(fixed), c.correction)
    elif r.algorithm.ratio_level == "sequence-token" and r.algorithm.policy_loss == "ppo":
        # GSPO-token's surrogate has the value s_i * A_t but the gradient s_i * A_t * grad log pi_t: where
        # advantages vary along a sequence (GAE, KL in the reward) its step climbs the token-level
        # objective, not its own value. At s_i = 1 (the first update) the two gradients are equal. (CISPO's
        # loss, sg(weight) * A * log pi, is its own objective at every ratio level.)
        tok = r.model_copy(update={"algorithm": r.algorithm.model_copy(
            update={"ratio_level": "token", "clip_range": 0.2, "clip_range_high": None})})
        objective = update.make_actor_loss(actors[0], tok, Knobs.from_recipe(tok), c.correction)
    elif r.algorithm.ratio_level == "sequence" and r.algorithm.policy_loss == "ppo":
        # GSPO's clip band (3e-4 / 4e-4 here) is far narrower than one Adam step moves a sequence's ratio.
        # Past the band a sequence's gain is capped at eps * |A| while its loss is not (the pessimistic
        # bound), so the clipped value after the step says little about the step's direction (cases 5 and
        # 15 rose, fp32 too). At s_i = 1 (the first update) the clipped surrogate's gradient is the
        # unclipped one's: the check evaluates that, with a band [0, 11] no step here leaves.
        wide = r.model_copy(update={"algorithm": r.algorithm.model_copy(
            update={"clip_range": 1.0, "clip_range_high": 10.0})})
        objective = update.make_actor_loss(actors[0], wide, Knobs.from_recipe(wide), c.correction)
    before = global_loss(objective, exp, r.algorithm.loss_agg)
    res_one = update.run_update(actors[0], [exp], fn[0], r.algorithm.loss_agg)
    many = [exp.select(torch.tensor([i])) for i in range(exp.size)]
    if exp.episode is not None:   # ranks may hold different numbers of rows: as many micro-batches each
        many = batching.cut(exp, torch.arange(exp.size), 1, 1, None, update.batch_layout(r, actors[1]), exp.episode)
    if r.train.max_tokens_per_micro_batch:   # the budget's packing (uneven micro-batches, groups split)
        # where the budget holds this rank's whole batch (truncated responses masked out leave little of
        # it), half the batch's padded tokens splits it: 1 x N == N x 1 needs N > 1
        layout = update.batch_layout(r, actors[1])       # padding-free: the budget counts real tokens
        p, t = batching.widths(exp, torch.arange(exp.size))
        whole = batching.tokens(p, t, 0, exp.size, batching.group_rows(exp.size, GROUP), layout)   # prompt-major rows
        budget = min(r.train.max_tokens_per_micro_batch, max(1, whole // 2))
        many = batching.cut(exp, torch.arange(exp.size), MICRO, GROUP, budget, layout,
                            None if exp.episode is None else exp.episode // GROUP)
    res_many = update.run_update(actors[1], many, fn[1], r.algorithm.loss_agg)
    after = global_loss(objective, exp, r.algorithm.loss_agg)
    p_one, p_many = dict(iter_full_params(actors[0])), dict(iter_full_params(actors[1]))
    accum_diff = max(float((p_one[n].float() - p_many[n].float()).abs().max()) for n in p_one)
    recompute_diff = 0.0
    if r.actor.gradient_checkpointing:
        # recomputation is exact: the same 1 x 8 update by an actor that keeps its activations
        plain = small.model_copy(update={"actor": small.actor.model_copy(update={"gradient_checkpointing": False})})
        keeper = fresh_actor(plain, total)
        update.run_update(keeper, [exp], update.make_actor_loss(keeper, plain, knobs, c.correction), r.algorithm.loss_agg)
        p_plain = dict(iter_full_params(keeper))
        recompute_diff = max(float((p_one[n].float() - p_plain[n].float()).abs().max()) for n in p_one)
    packing_diff = 0.0
    if r.train.padding_free:
        # padding-free passes are exact: the same 1 x 8 update by an actor whose passes are padded
        padded = small.model_copy(update={"train": small.train.model_copy(update={"padding_free": False})})
        assert update.use_padding_free(small, actors[0]) and not update.use_padding_free(padded, actors[0])
        other = fresh_actor(padded, total)
        update.run_update(other, [exp], update.make_actor_loss(other, padded, knobs, c.correction), r.algorithm.loss_agg)
        p_padded = dict(iter_full_params(other))
        packing_diff = max(float((p_one[n].float() - p_padded[n].float()).abs().max()) for n in p_one)
    moved = max(float((p_one[n].float() - init[n]).abs().max()) for n in p_one)

    fillers = int(global_sum([float(fillers[0])])[0])      # in the step and in the 8 x 1 update
    params = {n: t.float().cpu().clone() for n, t in iter_full_params(c.actor)}
    if dist.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(params, out / "params.pt")
        result = {
            "updates": len(learned.actor),
            "skipped": sum(x.skipped for x in learned.actor + learned.critic),
            "first_dev": first_dev, "later_dev": later_dev, "later_clipfrac": later_clipfrac,
            "loss_before": before, "loss_after": after,
            "loss_one": res_one.loss, "loss_many": res_many.loss,
            "accum_diff": accum_diff, "moved": moved, "many_micro": len(many), "recompute_diff": recompute_diff,
            "packing_diff": packing_diff,
            "behavior_err": behavior_err, "rollout_err": rollout_err,
            "trained_rows": int((exp.response_mask.sum(-1) > 0).sum()), "rows": exp.size,
            "rank_rows": [int(-fewest_rows), int(most_rows)], "fillers": fillers,
            "sampled": sampled,
            "finite": all(math.isfinite(float(t.sum())) for t in params.values()),
        }
        (out / "result.json").write_text(json.dumps(result))
    shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
