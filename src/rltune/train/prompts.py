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
    """Token ids of one prompt, left-truncated to `data.max_prompt_length`."""
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
    ids = list(ids)
    return ids[-data_cfg.max_prompt_length:]


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
