"""The reward model reads the conversation rendered with its OWN chat template (issue 10, item 7)."""

from __future__ import annotations

import pytest
import torch

from rltune.recipe.schema import DataCfg
from rltune.reward import RewardComputer
from rltune.reward.model import RewardModelScorer
from rltune.train.prompts import encode_prompt, prompt_messages

RM_TEMPLATE = ("{% for m in messages %}<|rm_{{ m['role'] }}|>{{ m['content'] }}<|rm_end|>{% endfor %}")
POLICY_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                   "{% if add_generation_prompt %}assistant: {% endif %}")


def _tiny_dir(path, template=None):
    from rltune.models.builtin import build_tiny
    from transformers import AutoTokenizer

    build_tiny("tiny-llama", path)
    if template is not None:
        tok = AutoTokenizer.from_pretrained(path)
        tok.chat_template = template
        tok.save_pretrained(path)
    return str(path)


class Spy:
    """Forwards to a tokenizer and records the texts it is called on."""

    def __init__(self, tok):
        self._tok, self.calls = tok, []

    def __call__(self, texts, **kw):
        self.calls.append((list(texts), kw))
        return self._tok(texts, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def _direct_scores(scorer, texts, add_special_tokens):
    out = []
    for t in texts:
        ids = scorer.tokenizer(t, add_special_tokens=add_special_tokens)["input_ids"]
        with torch.no_grad():
            out.append(float(scorer.model(input_ids=torch.tensor([ids])).logits[0, 0]))
    return out


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return _tiny_dir(tmp_path_factory.mktemp("rm"), RM_TEMPLATE)


def test_rm_scores_its_own_chat_template_rendering(rm_dir, tmp_path):
    data = DataCfg(train="builtin:arithmetic", system_prompt="Be brief.")
    rows = [{"prompt": "1+2=?"}, {"prompt": [{"role": "user", "content": "3*4=?"}]}]
    convs = [prompt_messages(r, "prompt", data) for r in rows]
    assert convs[0] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2=?"}]
    assert convs[1][1] == {"role": "user", "content": "3*4=?"}

    # the policy renders the same messages with a different template
    from transformers import AutoTokenizer
    policy_tok = AutoTokenizer.from_pretrained(_tiny_dir(tmp_path / "policy", POLICY_TEMPLATE))
    ids = encode_prompt(rows[0], policy_tok, data, "prompt")
    assert policy_tok.decode(ids) == "system: Be brief.\nuser: 1+2=?\nassistant: "

    scorer = RewardModelScorer(rm_dir, max_length=512)
    spy = scorer.tokenizer = Spy(scorer.tokenizer)
    prompts, completions = ["1+2=?", "3*4=?"], ["3", "12"]
    scores = scorer(prompts, completions, conversations=convs)
    expected = ["<|rm_system|>Be brief.<|rm_end|><|rm_user|>1+2=?<|rm_end|><|rm_assistant|>3<|rm_end|>",
                "<|rm_system|>Be brief.<|rm_end|><|rm_user|>3*4=?<|rm_end|><|rm_assistant|>12<|rm_end|>"]
    assert spy.calls and all(texts == expected for texts, _ in spy.calls)
    assert all(kw["add_special_tokens"] is False for _, kw in spy.calls)  # the template holds them
    assert scores == pytest.approx(_direct_scores(scorer, expected, add_special_tokens=False), abs=1e-5)

    # without conversations each prompt is one user message
    spy.calls.clear()
    scorer(prompts[:1], completions[:1])
    assert spy.calls[0][0] == ["<|rm_user|>1+2=?<|rm_end|><|rm_assistant|>3<|rm_end|>"]


def test_rm_without_chat_template_scores_plain_text(tmp_path):
    scorer = RewardModelScorer(_tiny_dir(tmp_path / "rm"), max_length=512)
    assert not scorer.tokenizer.chat_template
    spy = scorer.tokenizer = Spy(scorer.tokenizer)
    convs = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2=?"}]]
    scores = scorer(["1+2=?"], ["3"], conversations=convs)
    assert spy.calls[0][0] == ["1+2=?3"] and spy.calls[0][1]["add_special_tokens"] is True
    assert scores == pytest.approx(_direct_scores(scorer, ["1+2=?3"], add_special_tokens=True), abs=1e-5)


def test_reward_computer_passes_conversations_to_the_model():
    from rltune.recipe.schema import RewardCfg

    seen = {}

    def model(prompts, completions, conversations=None):
        seen["conversations"] = conversations
        return [1.0] * len(prompts)

    rewards = RewardComputer(RewardCfg(functions=[], model="rm", max_length=64), reward_model=model)
    convs = [[{"role": "user", "content": "1+2=?"}]]
    assert rewards(["1+2=?"], ["3"], {}, conversations=convs).scores == [1.0]
    assert seen["conversations"] == convs
    rewards(["1+2=?"], ["3"], {})
    assert seen["conversations"] is None
