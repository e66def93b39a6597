"""How an episode becomes tokens: token-in, token-out (docs/agents.md, "Tokens").

An episode is built by appending token ids, never by re-tokenising the conversation:

    prompt ids   = tokenize(render(start messages, generation prompt))
    model turn   = the ids the rollout engine sampled, exactly (their log-probs with them)
    env turn     = tokenize(render(all messages, generation prompt)[len(text so far):])

where "text so far" is the rendered start plus the decoded text of every turn appended. The env
turn is the part of the re-rendered conversation that comes after what the model has already
seen, tokenised on its own: the model trained on exactly the ids it sampled from. That holds only
when rendering the longer conversation reproduces the shorter one as its prefix. A template that
rewrites history (Qwen3 drops `<think>` blocks from past assistant turns; templates that strip
whitespace around an assistant's content) breaks it: `env_delta` returns None, and the episode
goes on as a new sample from the re-rendered conversation (train/episodes.py: the turns before
the break become its prompt, not trained; `episode/prefix_breaks` counts it).

Tokenizers without a chat template (the tiny test models) get a plain one: `role: content` turns,
each ended by the EOS token, so a model turn ends where its EOS is sampled. Templates that ignore
`tools=` get the tool schemas in a system message instead, with the `<tool_call>` format to use.
Lone UTF-16 surrogates (a non-UTF-8 file name an environment read) are rendered as U+FFFD.
"""

from __future__ import annotations

import json
import re

# a chat template for tokenizers that have none: each turn `role: content` + EOS
PLAIN_TEMPLATE = ("{{ bos_token if bos_token else '' }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
                  "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")

HEAD_SLACK = 64      # ids_within: tokens of margin for where the head is cut
_MAX_TOKEN_CHARS: dict[tuple[int, int], int] = {}   # (id(tokenizer), vocabulary size) -> Renderer.max_token_chars
SURROGATE = re.compile("[\ud800-\udfff]")   # a lone UTF-16 surrogate (a valid pair decodes to one character)

TOOLS_PREAMBLE = ("You can call tools. To call one, write\n<tool_call>\n{\"name\": TOOL_NAME, \"arguments\": "
                  "{ARGUMENTS}}\n</tool_call>\nand wait for its answer. The tools, as JSON schemas:\n")


def clean_text(text: str) -> str:
    """`text` with each lone UTF-16 surrogate replaced by U+FFFD. They come from JSON's unpaired
    "\\ud800" escapes and from undecodable bytes read with surrogateescape (os.listdir's non-UTF-8
    file names); no tokenizer, chat template or UTF-8 log takes them. Valid text comes back as it is."""
    return SURROGATE.sub("\ufffd", text) if SURROGATE.search(text) else text


def clean_messages(messages: list[dict]) -> list[dict]:
    """The messages with `clean_text` applied to their str values (content, name, ...): copies
    where something changed, the same dicts where nothing did."""
    out = []
    for m in messages:
        bad = [k for k, v in m.items() if isinstance(v, str) and SURROGATE.search(v)]
        out.append({**m, **{k: clean_text(m[k]) for k in bad}} if bad else m)
    return out


class Renderer:
    """The policy tokenizer's chat template, with the tools an environment offers."""

    def __init__(self, tokenizer, tools: list[dict] | None = None):
        self.tok = tokenizer
        self.template = getattr(tokenizer, "chat_template", None) or PLAIN_TEMPLATE
        self.tools = tools or None
        self.native_tools = bool(self.tools) and self._renders_tools()
        self.warned_long_prompts = False   # a run's episode prompts over data.max_prompt_length were said (once)

    def _renders_tools(self) -> bool:
        probe = [{"role": "user", "content": "x"}]
        return self._render(probe, True, self.tools) != self._render(probe, True, None)

    def _render(self, messages: list[dict], generation_prompt: bool, tools) -> str:
        """The template's text, lone surrogates (in messages or tool schemas) as U+FFFD (clean_text)."""
        return clean_text(self.tok.apply_chat_template(messages, tools=tools, chat_template=self.template,
                                                       add_generation_prompt=generation_prompt, tokenize=False))

    def start(self, messages: list[dict]) -> list[dict]:
        """The episode's first messages as the model reads them: with the tools in a system
        message where the template does not render `tools=` itself."""
        if not self.tools or self.native_tools:
            return list(messages)
        text = TOOLS_PREAMBLE + "\n".join(json.dumps(t) for t in self.tools)
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}] + list(messages[1:])
        return [{"role": "system", "content": text}] + list(messages)

    def text(self, messages: list[dict]) -> str:
        """The conversation rendered up to the next assistant turn (generation prompt on)."""
        return self._render(messages, True, self.tools if self.native_tools else None)

    def ids(self, text: str) -> list[int]:
        return list(self.tok(clean_text(text), add_special_tokens=False)["input_ids"])

    def ids_within(self, text: str, room: int) -> list[int] | None:
        """The ids of `text`, exactly as `ids` gives them, when they are at most `room`; None when
        they are more, found by tokenising a bounded head of it, never the whole (a 20 MB answer
        would take minutes and gigabytes; only the episode's room can be used).

        A token covers at most `max_token_chars` characters (its longest vocabulary entry, in
        bytes for byte-level vocabularies), so c characters take at least c / max_token_chars
        tokens: a head of (room + 1 + HEAD_SLACK) x max_token_chars characters takes more than
        room + HEAD_SLACK (even a flood of the longest token), which says the whole takes more than
        `room` (HEAD_SLACK: margin for where the head is cut). Text up to that length is tokenised
        whole; a tokenizer whose normaliser packs more characters into a token than its
        vocabulary shows gets the whole text tokenised too: exact either way."""
        bound = (max(room, 0) + 1 + HEAD_SLACK) * self.max_token_chars()
        if len(text) > bound and len(self.ids(text[:bound])) > max(room, 0) + HEAD_SLACK:
            return None
        ids = self.ids(text)
        return ids if len(ids) <= room else None

    def prompt_ids(self, text: str, keep: int) -> tuple[list[int], int | None]:
        """(the last `keep` ids of `text`, how many ids it has in all): a prompt left-truncated to
        data.max_prompt_length. Text too long to fit is tokenised from a bounded tail only ((keep +
        1 + HEAD_SLACK) x max_token_chars characters, as `ids_within` bounds a head): its count
        is then None (more than `keep`). The ids are the prompt the model is given, either way."""
        bound = (keep + 1 + HEAD_SLACK) * self.max_token_chars()
        if len(text) > bound:
            tail = self.ids(text[-bound:])
            if len(tail) > keep + HEAD_SLACK:
                return tail[-keep:], None
        ids = self.ids(text)
        return ids[-keep:], len(ids)

    def max_token_chars(self) -> int:
        """The most characters one token of this tokenizer can stand for (cached per tokenizer)."""
        key = (id(self.tok), len(self.tok))
        if key not in _MAX_TOKEN_CHARS:
            try:
                longest = max((len(t) for t in self.tok.get_vocab()), default=1)
            except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: a generous guess (only costs time)
                longest = 256
            _MAX_TOKEN_CHARS[key] = max(longest, 16)
        return _MAX_TOKEN_CHARS[key]

    def env_delta(self, seen: str, messages: list[dict], room: int | None = None) -> tuple[list[int] | None, str] | None:
        """(ids, text) of the environment's turn: what rendering `messages` (the whole conversation,
        the new environment messages last) adds after `seen` (the text the model has seen,
        its last turn included). None where the template does not reproduce `seen` as a prefix.
        With `room`, ids is None when the turn takes more than `room` tokens (`ids_within`: only a
        bounded head of it is tokenised)."""
        full = self.text(messages)
        if not full.startswith(seen) or len(full) == len(seen):
            return None
        extra = full[len(seen):]
        return (self.ids(extra) if room is None else self.ids_within(extra, room)), extra


__all__ = ["Renderer", "PLAIN_TEMPLATE", "clean_messages", "clean_text"]
