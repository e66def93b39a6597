"""Metric names: how other tools' keys map to rltune's (`--from trl|verl|openrlhf`, `--map`), and
applying such a map to a row. The lowest layer of the log readers: runlog.py and importers.py both
import it, it imports neither. No torch import."""

from __future__ import annotations

from typing import Optional

FORMATS = ("trl", "verl", "openrlhf")

# our key -> candidates (their key, scale), first hit wins; a key ending in "*" matches a prefix
TOOL_MAPS: dict[str, dict[str, list[tuple[str, float]]]] = {
    "trl": {   # GRPOTrainer / PPOTrainer (and the HF Trainer's own keys)
        "reward/mean": [("reward", 1.0), ("objective/scores", 1.0), ("env/reward_mean", 1.0)],
        "reward/std": [("reward_std", 1.0), ("env/reward_std", 1.0)],
        "kl": [("kl", 1.0), ("objective/kl", 1.0)],
        "actor/entropy": [("entropy", 1.0), ("policy/entropy_avg", 1.0)],
        "response/length_mean": [("completions/mean_length", 1.0), ("completion_length", 1.0)],
        "response/clip_ratio": [("completions/clipped_ratio", 1.0)],
        "actor/grad_norm": [("grad_norm", 1.0)],
        "actor/lr": [("learning_rate", 1.0), ("lr", 1.0)],
        "actor/loss": [("loss", 1.0), ("loss/policy_avg", 1.0)],
        "critic/loss": [("loss/value_avg", 1.0)],
        "actor/clipfrac": [("clip_ratio/region_mean", 1.0), ("clip_ratio", 1.0), ("policy/clipfrac_avg", 1.0)],
        "batch/zero_adv_frac": [("frac_reward_zero_std", 1.0)],
        "rollout/is_weight_max": [("sampling/importance_sampling_ratio/max", 1.0)],
        "rollout/is_weight_mean": [("sampling/importance_sampling_ratio/mean", 1.0)],
        "rollout/logprob_diff_mean": [("sampling/sampling_logp_difference/mean", 1.0)],
        "rollout/logprob_diff_max": [("sampling/sampling_logp_difference/max", 1.0)],
        "timing/step_s": [("step_time", 1.0)],
        "eval/reward": [("eval_reward", 1.0), ("eval/reward", 1.0)],
    },
    "verl": {   # ray_trainer metrics (metric_utils) and the actor/critic workers
        "reward/mean": [("critic/score/mean", 1.0), ("critic/rewards/mean", 1.0)],
        "kl": [("actor/kl_loss", 1.0), ("critic/kl", 1.0), ("actor/ppo_kl", 1.0)],
        "kl_coef": [("actor/kl_coef", 1.0), ("critic/kl_coef", 1.0)],
        "actor/entropy": [("actor/entropy", 1.0), ("actor/entropy_loss", 1.0)],
        "actor/grad_norm": [("actor/grad_norm", 1.0)],
        "actor/loss": [("actor/pg_loss", 1.0)],
        "actor/clipfrac": [("actor/pg_clipfrac", 1.0)],
        "actor/lr": [("actor/lr", 1.0)],
        "critic/loss": [("critic/vf_loss", 1.0)],
        "critic/grad_norm": [("critic/grad_norm", 1.0)],
        "critic/explained_var": [("critic/vf_explained_var", 1.0)],
        "critic/lr": [("critic/lr", 1.0)],
        "response/length_mean": [("response_length/mean", 1.0)],
        "response/clip_ratio": [("response_length/clip_ratio", 1.0)],
        "timing/rollout_s": [("timing_s/gen", 1.0)],
        "timing/train_s": [("timing_s/update_actor", 1.0)],
        "timing/step_s": [("timing_s/step", 1.0)],
        "timing/sync_ms": [("timing_s/update_weights", 1000.0), ("timing_s/sync_weights", 1000.0)],
        "eval/reward": [("val-core/*", 1.0), ("val/test_score/*", 1.0)],
    },
    "openrlhf": {   # PPO status dict (`train/` prefix under W&B/TensorBoard) and its short tqdm names
        "reward/mean": [("reward", 1.0), ("rm", 1.0)],
        "kl": [("kl", 1.0)],
        "actor/loss": [("policy_loss", 1.0), ("act_loss", 1.0), ("pg", 1.0)],
        "critic/loss": [("critic_loss", 1.0), ("cri", 1.0)],
        "actor/lr": [("actor_lr", 1.0), ("act_lr", 1.0)],
        "critic/lr": [("critic_lr", 1.0), ("cri_lr", 1.0)],
        "response/length_mean": [("response_length", 1.0), ("gen_len", 1.0), ("glen", 1.0)],
        "actor/entropy": [("entropy_loss", 1.0), ("ent_loss", 1.0)],
        "actor/clipfrac": [("ppo_clip_ratio", 1.0)],
    },
}


def is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def lookup(row: dict, cands: list[tuple[str, float]]) -> Optional[tuple[str, float]]:
    """(their key, value x scale) of the first candidate the row has; a key ending in "*" matches
    a prefix (the first such key in sorted order)."""
    for key, scale in cands:
        if key.endswith("*"):
            hits = sorted(k for k in row if k.startswith(key[:-1]) and is_num(row[k]))
            if hits:
                return hits[0], row[hits[0]] * scale
        elif key in row and is_num(row[key]):
            return key, row[key] * scale
    return None


def apply_mapping(row: dict, mapping: dict) -> dict:
    """The row with our keys added from their candidates; their keys that a map names are dropped."""
    if not mapping:
        return row
    theirs = {k for c in mapping.values() for k, _ in c}
    out = {k: v for k, v in row.items() if k not in theirs or k in mapping}
    for ours, cands in mapping.items():
        hit = lookup(row, cands)
        if hit is not None:
            out[ours] = hit[1]
    return out
