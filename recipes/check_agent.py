"""An agent that keeps notes instead of its history: it answers, then checks its answer in a fresh
conversation that holds only a note of the first (docs/agents.md, "Tokens").

`rollout.env: check_agent.py:run` in recipes/check-agent.yaml. The second request does not extend
what the model has seen (the first answer is quoted in a new user message, not kept as an assistant
turn): every episode whose first turn ended is a prefix break. With `rollout.prefix_break: rows`
(the default) both answers train, each on the context it was sampled from, with the episode's
advantage; with `context` only the check would.

Outside training the same function runs against any OpenAI-compatible server:

    from openai import OpenAI
    run(OpenAI(base_url="http://localhost:8000/v1", api_key="-"), {"prompt": "What is 2+3?", "answer": "5"})
"""

import re


def run(client, row: dict) -> float:
    """1.0 when the checked answer is row["answer"], 0.2 when only the first answer was."""
    question = row["prompt"]
    first = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": question}])
    choice = first.choices[0]
    if choice.finish_reason == "length":          # cut off before its end: no answer, and the episode is over
        return 0.0
    answer = (choice.message.content or "").strip()
    note = (f"Question: {question}\nA first answer: {answer[:200]}\n"
            "Check it. Reply with the correct number only.")
    second = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": note}])
    checked = second.choices[0].message.content or ""
    if number(checked) == row["answer"]:
        return 1.0
    return 0.2 if number(answer) == row["answer"] else 0.0


def number(text: str):
    match = re.search(r"-?\d+", text[:10_000])
    return None if match is None else match.group()
