"""Turn data rows into prompt token ids (chat template when the tokenizer has one)."""

from __future__ import annotations


def uses_chat_template(tokenizer, data_cfg) -> bool:
    return bool(data_cfg.apply_chat_template and getattr(tokenizer, "chat_template", None))


def prompt_messages(row: dict, prompt_key: str, data_cfg) -> list[dict]:
    """The prompt as chat messages ({"role", "content"} dicts, no assistant turn), exactly as
    the policy's chat template receives them: a list-of-messages prompt as it is, a text prompt
    as one user message; `data.system_prompt` first when set and the prompt has no system turn.
    The reward model renders these with its own chat template."""
    value = row[prompt_key]
    messages = list(value) if isinstance(value, list) else [{"role": "user", "content": str(value)}]
    if data_cfg.system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": data_cfg.system_prompt}] + messages
    return messages


def encode_prompt(row: dict, tokenizer, data_cfg, prompt_key: str) -> list[int]:
    """Token ids of one prompt, left-truncated to `data.max_prompt_length` (see
    `truncation_warning`: the run says once how many prompts that cuts)."""
    return prompt_ids(row, tokenizer, data_cfg, prompt_key)[-data_cfg.max_prompt_length:]


def prompt_ids(row: dict, tokenizer, data_cfg, prompt_key: str) -> list[int]:
    """Token ids of one prompt as the policy receives it (chat template applied), untruncated."""
    value = row[prompt_key]
    if uses_chat_template(tokenizer, data_cfg):
        messages = prompt_messages(row, prompt_key, data_cfg)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
    else:
        text = value if isinstance(value, str) else "\n".join(m.get("content", "") for m in value)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id] + ids
    return list(ids)


def truncation_warning(rows: list[dict], tokenizer, data_cfg, prompt_key: str, key: str = "data.train",
                       max_checked: int = 2000) -> str | None:
    """One warning for the prompts longer than `data.max_prompt_length` (they are left-truncated:
    the policy never sees their beginning), with their count, the longest length and the fix;
    None when every prompt fits. Checks every row, or `max_checked` evenly spaced ones."""
    n = len(rows)
    limit = data_cfg.max_prompt_length
    step = max(1, -(-n // max_checked))
    checked = over = longest = 0
    for i in range(0, n, step):
        length = len(prompt_ids(rows[i], tokenizer, data_cfg, prompt_key))
        checked += 1
        if length > limit:
            over += 1
            longest = max(longest, length)
    if not over:
        return None
    share = f"{over} of {checked} prompts" if checked == n else f"{over} of {checked} sampled prompts (of {n})"
    return (f"{key}: {share} are longer than data.max_prompt_length ({limit} tokens; the longest has {longest}) "
            "and are left-truncated: the policy does not see their beginning\n"
            f"  fix: raise data.max_prompt_length to {longest} (rollout.max_model_len and reward.max_length "
            "must then hold it plus rollout.max_new_tokens), or shorten those prompts")


def prompt_text(row: dict, prompt_key: str) -> str:
    """The prompt as text, as reward functions receive it (no template)."""
    value = row[prompt_key]
    if isinstance(value, list):
        return "\n".join(str(m.get("content", "")) for m in value)
    return str(value)


def reward_columns(rows: list[dict], prompt_key: str) -> dict[str, list]:
    """The rows' extra fields as aligned lists (keyword arguments of reward functions)."""
    keys = [k for k in (rows[0].keys() if rows else []) if k != prompt_key]
    return {k: [r.get(k) for r in rows] for k in keys}
