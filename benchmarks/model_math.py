"""The model-math floor of one bench-vs-trl step: what any trainer must compute, and nothing else.

    python benchmarks/model_math.py [--reps 3] [--json out.json]     (rltune's .venv python)

Same model (SmolLM2-135M-Instruct, fp32, 2 threads) and the workload's real token lengths: the
16 prompts of step 1 (builtin arithmetic rows in rltune's sampler order, chat template applied)
x 4 samples, responses from one real sampled `generate` (1..16 tokens, cut after EOS).

  (a) generate: one batched `generate` with KV cache, 64 sequences x 16 new tokens, T=1, no top-k/p;
  (b) reference: one no-grad forward over the 64 sequences at their real lengths: sorted by
      length and cut into micro-batches of 8 (next to no padding), logits only for response
      positions (`logits_to_keep`), log-softmax + gather of the sampled tokens;
  (c) train: the same micro-batches with grad (clipped-ratio policy loss + k3 KL to (b),
      token-mean) and backward, then clip_grad_norm_ and one fused torch.optim.AdamW step;
  (b', c') the same with each prompt computed once per group of 4: the prompt forward once, its
      keys/values repeated for the 4 responses (DynamicCache.batch_repeat_interleave), the
      responses on top (2 groups = 8 sequences per micro-batch).

Prints a markdown table; the median of --reps repetitions after one warm-up repetition.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def left_pad(seqs: list[list[int]], pad: int):
    import torch

    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, L - len(s):] = torch.tensor(s)
        mask[i, L - len(s):] = 1
    return ids, mask


def resp_logp(model, prompts: list[list[int]], resps: list[list[int]], pad: int):
    """Log-probs of the response tokens (B, R) and their mask, one forward, left-padded."""
    import torch

    seqs = [p + r for p, r in zip(prompts, resps)]
    ids, mask = left_pad(seqs, pad)
    R = max(len(r) for r in resps)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=R + 1).logits[:, :-1]
    target = ids[:, -R:]
    rmask = torch.zeros((len(seqs), R))
    for i, r in enumerate(resps):
        rmask[i, R - len(r):] = 1
    return torch.log_softmax(logits.float(), -1).gather(-1, target.unsqueeze(-1)).squeeze(-1), rmask


def resp_logp_shared(model, prompt: list[int] | list[list[int]], resps: list[list[int]], group: int, pad: int):
    """The same with each prompt computed once: prompts (G, P) of equal length, their KV cache
    repeated `group` times, then the (G*group, R) right-padded responses on top of it."""
    import torch

    prompts = torch.tensor(prompt)
    G, P = prompts.shape
    out = model(input_ids=prompts, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.batch_repeat_interleave(group)
    first = out.logits[:, -1:].repeat_interleave(group, 0)                     # predicts response token 1
    R = max(len(r) for r in resps)
    ids = torch.full((len(resps), R), pad, dtype=torch.long)
    rmask = torch.zeros((len(resps), R))
    for i, r in enumerate(resps):
        ids[i, :len(r)] = torch.tensor(r)
        rmask[i, :len(r)] = 1
    attn = torch.cat([torch.ones((len(resps), P), dtype=torch.long), rmask.long()], 1)
    pos = torch.arange(P, P + R).unsqueeze(0).expand(len(resps), -1)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache,
                   logits_to_keep=R).logits                                   # (B, R)
    logits = torch.cat([first, logits[:, :-1]], 1)
    return torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1), rmask


def policy_loss(logp, ref, mask, adv, n_tokens, coef=0.02, eps=0.2):
    import torch

    ratio = torch.exp(logp - logp.detach())
    a = adv.unsqueeze(-1)
    pg = -torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
    x = (ref - logp).clamp(-20, 20)
    kl = (torch.exp(x) - x - 1).clamp(-10, 10)
    return ((pg + coef * kl) * mask).sum() / n_tokens


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--no-shared", action="store_true", help="skip (b', c')")
    p.add_argument("--model", default=None, help="another model spec (e.g. builtin:tiny-llama for a quick check)")
    a = p.parse_args()

    import torch
    from transformers import GenerationConfig

    torch.set_num_threads(2)
    torch.manual_seed(0)
    from bench_vs_trl import OVERRIDES
    from trl_side import load_recipe, step_rows

    from rltune.models.loading import load_causal_lm, load_tokenizer
    from rltune.train.prompts import encode_prompt

    recipe = load_recipe(OVERRIDES + ([f"model.policy={a.model}"] if a.model else []))
    d, ro = recipe.data, recipe.rollout
    G, micro = recipe.algorithm.group_size, recipe.train.micro_batch_size
    rows, _ = step_rows(recipe, 1)
    tok = load_tokenizer(recipe.model.policy)
    model = load_causal_lm(recipe.model.policy, "fp32")
    model.config.use_cache = True
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos if eos is not None else tok.eos_token_id])
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    prompts = [encode_prompt(r, tok, d, d.prompt_key) for r in rows]
    gcfg = GenerationConfig(do_sample=True, temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k,
                            max_new_tokens=ro.max_new_tokens, eos_token_id=sorted(eos), pad_token_id=pad)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=True)   # what rltune runs on CPU (engine.roles)

    gen_prompts = [p for p in prompts for _ in range(G)]                        # 16 x 4 = 64
    resps: list[list[int]] = []

    def generate():
        ids, mask = left_pad(gen_prompts, pad)
        model.eval()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gcfg)[:, ids.shape[1]:]
        got = []
        for row in out.tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            got.append(row[:cut])
        return got

    def order():  # sort by total length, micro-batches of `micro`
        idx = sorted(range(len(resps)), key=lambda i: len(gen_prompts[i]) + len(resps[i]))
        return [idx[i:i + micro] for i in range(0, len(idx), micro)]

    def reference():
        with torch.no_grad():
            return {tuple(mb): resp_logp(model, [gen_prompts[i] for i in mb], [resps[i] for i in mb], pad)[0]
                    for mb in order()}

    adv = torch.randn(len(gen_prompts))                                         # stand-in advantages
    n_tok = None

    def train(ref):
        model.train()
        for mb in order():
            logp, m = resp_logp(model, [gen_prompts[i] for i in mb], [resps[i] for i in mb], pad)
            policy_loss(logp, ref[tuple(mb)], m, adv[mb], n_tok).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def groups_mb():  # micro-batches of micro // G groups with equal prompt length
        per = max(1, micro // G)
        gs = sorted(range(len(prompts)), key=lambda g: (len(prompts[g]), max(len(resps[g * G + j]) for j in range(G))))
        out, cur = [], []
        for g in gs:
            if cur and (len(cur) == per or len(prompts[cur[0]]) != len(prompts[g])):
                out.append(cur)
                cur = []
            cur.append(g)
        return out + [cur]

    def shared_logp(mb):
        rs = [resps[g * G + j] for g in mb for j in range(G)]
        return resp_logp_shared(model, [prompts[g] for g in mb], rs, G, pad)

    def reference_shared():
        with torch.no_grad():
            return {tuple(mb): shared_logp(mb)[0] for mb in groups_mb()}

    def train_shared(ref):
        model.train()
        for mb in groups_mb():
            logp, m = shared_logp(mb)
            idx = [g * G + j for g in mb for j in range(G)]
            policy_loss(logp, ref[tuple(mb)], m, adv[idx], n_tok).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def timed(fn, *args):
        t0 = time.perf_counter()
        res = fn(*args)
        return time.perf_counter() - t0, res

    times: dict[str, list[float]] = {k: [] for k in ("generate", "reference", "train", "reference_shared", "train_shared")}
    for rep in range(a.reps + 1):                                               # rep 0: warm-up
        t, got = timed(generate)
        if rep == 0:
            resps[:] = got                                                      # the real lengths, kept fixed
            n_tok = float(sum(len(r) for r in resps))
        tr, ref = timed(reference)
        row = {"generate": t, "reference": tr}
        if not a.no_shared:
            # before any update: the shared-prompt log-probs must equal the padded ones (same weights)
            trs, refs = timed(reference_shared)
            row["reference_shared"] = trs
            if rep == 0:
                full = {i: v for mb, lp in ref.items() for i, v in zip(mb, lp)}
                diffs = []
                for mb, lp in refs.items():
                    for k, i in enumerate(g * G + j for g in mb for j in range(G)):
                        n = len(resps[i])
                        diffs.append(float((lp[k, :n] - full[i][-n:]).abs().max()))
                print(f"shared-prompt vs padded log-probs: max |diff| {max(diffs):.2e}", flush=True)
        row["train"], _ = timed(train, ref)
        if not a.no_shared:
            row["train_shared"], _ = timed(train_shared, refs)
        print(f"{'warm-up' if rep == 0 else f'rep {rep}'}: " + ", ".join(f"{k} {v:.2f} s" for k, v in row.items()), flush=True)
        if rep > 0:
            for k, v in row.items():
                times[k].append(v)

    med = {k: statistics.median(v) for k, v in times.items() if v}
    lens = [len(r) for r in resps]
    pad_tokens = sum(max(len(gen_prompts[i]) + len(resps[i]) for i in mb) * len(mb)
                     - sum(len(gen_prompts[i]) + len(resps[i]) for i in mb) for mb in order())
    res = {"reps": a.reps, "generate_s": med["generate"], "reference_s": med["reference"], "train_s": med["train"],
           "sum_s": med["generate"] + med["reference"] + med["train"],
           "prompt_len": sorted({len(p) for p in prompts}), "response_len_mean": statistics.mean(lens),
           "response_len_min_max": [min(lens), max(lens)], "completion_tokens": sum(lens),
           "pad_tokens_ref_train": pad_tokens, "threads": torch.get_num_threads(), "torch": torch.__version__}
    if "reference_shared" in med:
        res.update(reference_shared_s=med["reference_shared"], train_shared_s=med["train_shared"],
                   sum_shared_s=med["generate"] + med["reference_shared"] + med["train_shared"])
    print(f"\nModel-math floor, {recipe.model.policy} fp32, {res['threads']} threads, 64 sequences: prompts "
          f"{res['prompt_len']} tokens, responses {res['response_len_min_max'][0]}..{res['response_len_min_max'][1]} "
          f"(mean {res['response_len_mean']:.1f}, {res['completion_tokens']} tokens); padding in (b)/(c): "
          f"{pad_tokens} tokens; median of {a.reps} after a warm-up, seconds")
    print("| part | all 64 sequences | prompt once per group of 4 |\n| --- | --- | --- |")
    sh = "reference_shared_s" in res
    print(f"| (a) generate 64 x 16 tokens, KV cache | {res['generate_s']:.2f} | {res['generate_s']:.2f} |")
    print(f"| (b) reference forward, no grad | {res['reference_s']:.2f} | {res['reference_shared_s']:.2f} |" if sh else
          f"| (b) reference forward, no grad | {res['reference_s']:.2f} | - |")
    print(f"| (c) forward+backward + AdamW | {res['train_s']:.2f} | {res['train_shared_s']:.2f} |" if sh else
          f"| (c) forward+backward + AdamW | {res['train_s']:.2f} | - |")
    print(f"| sum | {res['sum_s']:.2f} | {res['sum_shared_s']:.2f} |" if sh else f"| sum | {res['sum_s']:.2f} | - |")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
