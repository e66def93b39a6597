"""builtin:guess written as an agent: ordinary code against the OpenAI client (docs/agents.md).

`rollout.env: guess_agent.py:run` in recipes/tiny-guess-agent.yaml. In training, `client` talks to
rltune's recording endpoint and every turn the model writes is trained; outside training the same
function plays against any OpenAI-compatible server:

    from openai import OpenAI
    run(OpenAI(base_url="http://localhost:8000/v1", api_key="-"), {"target": 11})
"""

import re

MAX_TURNS = 8        # the agent's own bound; in training rollout.max_turns may end an episode first


def run(client, row: dict) -> float:
    """Find row["target"] (1..row["high"], default 16) with "Higher."/"Lower." hints: 1.0 for a
    first-turn hit, 0.1 less per extra turn (at least 0.1), 0.0 if never found."""
    target, high = int(row["target"]), int(row.get("high", 16))
    messages = [{"role": "user", "content": f"I am thinking of a whole number from 1 to {high}. "
                                            "Guess it: answer with the number only."}]
    for turn in range(1, MAX_TURNS + 1):
        reply = client.chat.completions.create(model="policy", messages=messages)
        choice = reply.choices[0]
        text = choice.message.content or ""
        if choice.finish_reason == "length":      # cut off before its end: no answer
            return 0.0
        guess = first_integer(text)
        if guess == target:
            return max(0.1, round(1.0 - 0.1 * (turn - 1), 10))
        hint = "Answer with a number only." if guess is None else ("Higher." if guess < target else "Lower.")
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": hint}]
    return 0.0


def first_integer(text: str):
    match = re.search(r"-?\d+", text[:10_000])
    if match is None:
        return None
    digits = match.group()
    return int(digits) if len(digits.lstrip("-")) <= 18 else (-(10**18) if digits.startswith("-") else 10**18)
