"""agents.tools: schemas from signatures and docstrings, parsing tool calls, calling tools."""

from __future__ import annotations

import json
import time
from typing import Literal, Optional

import pytest

from rltune.agents.tools import (MAX_RESULT_CHARS, ToolCall, call_tool, parse_tool_calls, tool_methods,
                                 tool_schema, tool_schemas)


class Box:
    """A tools environment for the tests below."""

    def reset(self, row: dict) -> None:
        return None

    def search(self, query: str, limit: int = 5, exact: bool = False) -> str:
        """Search the   index
        for documents.

        Args:
            query: words to look for,
                one or more.
            limit (int): how many results at most
            exact: match whole words only

        Returns:
            the results, one a line
        """
        return f"{query}:{limit}:{exact}"

    def scale(self, factor: float, ids: list[int], tags: Optional[list[str]] = None) -> dict:
        """Scale some things."""
        return {"factor": factor, "ids": ids, "tags": tags}

    def mode(self, which: Literal["fast", "slow"], note: str | None = None) -> str:
        """Pick a mode."""
        return which

    def fail(self) -> str:
        """Always raises."""
        raise KeyError("nope")

    def hang(self) -> str:
        """Never answers in time."""
        time.sleep(5)
        return "late"

    def nothing(self) -> None:
        """Returns None."""

    def huge(self) -> str:
        """Returns too much text."""
        return "x" * 20_000

    def weird(self) -> object:
        """Returns an object."""
        return {1, 2}

    def _private(self) -> str:
        return "hidden"

    def reward(self) -> float:
        return 1.0


def test_tool_methods_are_public_methods_in_definition_order():
    assert list(tool_methods(Box)) == ["search", "scale", "mode", "fail", "hang", "nothing", "huge", "weird"]
    bound = tool_methods(Box())
    assert bound["search"]("q") == "q:5:False"


def test_inherited_tools_come_first_and_overrides_keep_their_place():
    class Child(Box):
        def extra(self, x: int) -> int:
            """Extra tool."""
            return x

        def search(self, query: str) -> str:
            """Overridden."""
            return query

    names = list(tool_methods(Child))
    assert names[0] == "search" and names[-1] == "extra"
    assert tool_schemas(Child)[0]["function"]["description"] == "Overridden."


def test_schema_from_signature_and_google_docstring():
    schema = tool_schema(Box.search)
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "search"
    assert fn["description"] == "Search the index for documents."
    params = fn["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["query"]
    assert params["properties"]["query"] == {"type": "string", "description": "words to look for, one or more."}
    assert params["properties"]["limit"] == {"type": "integer", "description": "how many results at most"}
    assert params["properties"]["exact"] == {"type": "boolean", "description": "match whole words only"}
    assert "self" not in params["properties"]


def test_schema_types_optional_lists_and_literals():
    props = tool_schema(Box.scale)["function"]["parameters"]
    assert props["required"] == ["factor", "ids"]
    assert props["properties"]["factor"] == {"type": "number"}
    assert props["properties"]["ids"] == {"type": "array", "items": {"type": "integer"}}
    assert props["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    mode = tool_schema(Box.mode)["function"]["parameters"]
    assert mode["properties"]["which"] == {"type": "string", "enum": ["fast", "slow"]}
    assert mode["properties"]["note"] == {"type": "string"}
    assert mode["required"] == ["which"]


def test_schema_of_a_bound_method_skips_self_too():
    assert tool_schema(Box().search) == tool_schema(Box.search)


def test_schema_dict_and_bare_list():
    def f(self, a: dict, b: list) -> str:
        """Doc."""

    props = tool_schema(f)["function"]["parameters"]["properties"]
    assert props == {"a": {"type": "object"}, "b": {"type": "array"}}


def test_missing_hint_or_docstring_is_a_value_error():
    def no_hint(self, a) -> str:
        """Has a docstring."""

    def no_doc(self, a: str) -> str:
        return a

    def star(self, *args: str) -> str:
        """Doc."""

    def odd(self, a: complex) -> str:
        """Doc."""

    with pytest.raises(ValueError, match="parameter 'a' of tool 'no_hint' has no type hint"):
        tool_schema(no_hint)
    with pytest.raises(ValueError, match="tool 'no_doc' has no docstring"):
        tool_schema(no_doc)
    with pytest.raises(ValueError, match=r"\*args"):
        tool_schema(star)
    with pytest.raises(ValueError, match="cannot carry"):
        tool_schema(odd)


# ---------------------------------------------------------------- parsing

def test_hermes_single_call():
    text = 'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "cats"}}\n</tool_call>'
    assert parse_tool_calls(text) == ([ToolCall("search", {"query": "cats"})], None)


def test_hermes_several_calls_and_an_unclosed_last_one():
    text = ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>\n'
            '<tool_call>\n{"name": "c", "arguments": {"y": [1, 2]}}\n')
    calls, why = parse_tool_calls(text)
    assert why is None
    assert calls == [ToolCall("a", {"x": 1}), ToolCall("b", {}), ToolCall("c", {"y": [1, 2]})]


def test_llama_json_call_and_python_tag():
    assert parse_tool_calls('  {"name": "calc", "parameters": {"expression": "1+2"}}  ') == (
        [ToolCall("calc", {"expression": "1+2"})], None)
    text = 'thinking...<|python_tag|>{"name": "calc", "arguments": {"expression": "3"}}<|eom_id|>'
    assert parse_tool_calls(text) == ([ToolCall("calc", {"expression": "3"})], None)


def test_arguments_given_as_a_json_string_are_decoded():
    text = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}</tool_call>'
    assert parse_tool_calls(text) == ([ToolCall("f", {"a": 2})], None)


def test_no_call_is_not_an_error():
    assert parse_tool_calls("The answer is 42.") == ([], None)
    assert parse_tool_calls('{"answer": 42}') == ([], None)      # JSON, but no "name": an answer
    assert parse_tool_calls("") == ([], None)


@pytest.mark.parametrize("text, why", [
    ("<tool_call>{name: f}</tool_call>", "not valid JSON"),
    ("<tool_call></tool_call>", "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
    ('<tool_call>{"name": 3}</tool_call>', '"name"'),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "JSON object"),
    ('<tool_call>{"name": "f", "arguments": "nope"}</tool_call>', "not valid JSON"),
    ('<tool_call>[1, 2]</tool_call>', "JSON object"),
    ("<|python_tag|>print(1)", "python_tag"),
])
def test_malformed_calls_give_a_reason_and_no_calls(text, why):
    calls, problem = parse_tool_calls(text)
    assert calls == []
    assert problem is not None and why in problem


def test_one_bad_block_voids_the_good_ones():
    text = '<tool_call>{"name": "a"}</tool_call><tool_call>{oops}</tool_call>'
    calls, why = parse_tool_calls(text)
    assert calls == [] and "not valid JSON" in why


@pytest.mark.parametrize("text", [
    "<tool_call>" * 100_000,
    "<tool_call>" + "[" * 1_000_000,
    "{" * 500_000 + "}" * 500_000,
    "a" * 1_000_000,
    '<tool_call>{"name": "f", "arguments": "' + "\\" * 1_000_000,
])
def test_adversarial_megabyte_inputs_return(text):
    calls, why = parse_tool_calls(text)
    assert calls == []


# ---------------------------------------------------------------- calling

def test_call_returns_text_of_the_result():
    box = Box()
    assert call_tool(box, ToolCall("search", {"query": "q", "limit": 2}), 5) == ("q:2:False", None)
    text, err = call_tool(box, ToolCall("scale", {"factor": 2.5, "ids": [1]}), 5)
    assert err is None and json.loads(text) == {"factor": 2.5, "ids": [1], "tags": None}
    assert call_tool(box, ToolCall("nothing", {}), 5) == ("", None)
    assert call_tool(box, ToolCall("weird", {}), 5) == (str({1, 2}), None)


@pytest.mark.parametrize("args, seen", [
    ({"query": 12, "limit": "3", "exact": "true"}, "12:3:True"),       # lossless: converted
    ({"query": "q", "limit": 4.0}, "q:4:False"),
    ({"query": "q", "limit": 2, "exact": False}, "q:2:False"),          # already right: as they are
])
def test_scalar_arguments_get_their_hinted_type_where_nothing_is_lost(args, seen):
    assert call_tool(Box(), ToolCall("search", args), 5) == (seen, None)
    text, err = call_tool(Box(), ToolCall("scale", {"factor": 3, "ids": [1]}), 5)
    assert err is None and json.loads(text)["factor"] == 3.0 and "3.0" in text


@pytest.mark.parametrize("args, why", [
    ({"query": "q", "limit": "3.5"}, "limit must be integer, got \"3.5\""),
    ({"query": "q", "limit": True}, "limit must be integer, got true"),
    ({"query": "q", "exact": "maybe"}, "exact must be boolean"),
    ({"query": ["a"]}, "query must be string"),
])
def test_scalar_arguments_that_cannot_have_their_type_are_an_arguments_error(args, why):
    text, err = call_tool(Box(), ToolCall("search", args), 5)
    assert err == "arguments" and text.startswith("error: bad arguments for search(") and why in text


def test_call_cuts_huge_results():
    text, err = call_tool(Box(), ToolCall("huge", {}), 5)
    assert err is None
    assert text == "x" * MAX_RESULT_CHARS + f"...[cut: {20_000 - MAX_RESULT_CHARS} chars]"


def test_call_errors_are_text_for_the_model():
    box = Box()
    text, err = call_tool(box, ToolCall("fail", {}), 5)
    assert (text, err) == ("error: KeyError: 'nope'", "raised")
    text, err = call_tool(box, ToolCall("nope", {}), 5)
    assert err == "unknown" and text.startswith("error: unknown tool 'nope'; tools: search, scale, mode")
    text, err = call_tool(box, ToolCall("search", {"querry": "q"}), 5)
    assert err == "arguments" and text.startswith("error: ") and "querry" in text
    text, err = call_tool(box, ToolCall("_private", {}), 5)
    assert err == "unknown"
    assert call_tool(box, ToolCall("reward", {}), 5)[1] == "unknown"


def test_a_hanging_tool_times_out():
    t0 = time.perf_counter()
    text, err = call_tool(Box(), ToolCall("hang", {}), 0.2)
    assert time.perf_counter() - t0 < 2
    assert err == "timeout"
    assert text == "error: the tool did not answer within 0.2 s"


def test_sys_exit_in_a_tool_is_reported_not_obeyed():
    class Exits:
        def reset(self, row: dict) -> None:
            return None

        def bye(self) -> str:
            """Exits."""
            raise SystemExit(3)

    assert call_tool(Exits(), ToolCall("bye", {}), 5) == ("error: SystemExit: 3", "raised")


def test_an_async_tool_is_awaited():
    class Async:
        def reset(self, row: dict) -> None:
            return None

        async def fetch(self, key: str) -> str:
            """Fetch a key."""
            return key.upper()

    assert tool_schema(Async.fetch)["function"]["parameters"]["required"] == ["key"]
    assert call_tool(Async(), ToolCall("fetch", {"key": "ab"}), 5) == ("AB", None)


def _deep(n: int) -> list:
    value: list = []
    for _ in range(n):
        value = [value]
    return value


@pytest.mark.parametrize("tool, args, why", [
    ("scale", {"factor": 10 ** 400, "ids": [1]}, "factor must be number"),            # float(int) overflows
    ("scale", {"factor": "1e400", "ids": [1]}, "factor must be number"),              # inf
    ("scale", {"factor": float("inf"), "ids": [1]}, "factor must be number"),
    ("search", {"query": "q", "limit": "9" * 5000}, "limit must be integer"),        # past int()'s digit limit
    ("search", {"query": "q", "limit": "1e400"}, "limit must be integer"),
    ("search", {"query": "q", "limit": float("nan")}, "limit must be integer"),
    ("search", {"query": _deep(5000), "limit": 1}, "query must be string"),            # a list too deep to show
])
def test_an_argument_that_overflows_its_type_is_a_bad_arguments_error_not_a_crash(tool, args, why):
    """Issue 45 item 10: numbers a JSON call can carry but the parameter's type cannot hold."""
    text, err = call_tool(Box(), ToolCall(tool, args), 5)
    assert err == "arguments" and text.startswith(f"error: bad arguments for {tool}(") and why in text
    assert len(text) < 500


def test_a_long_integer_string_keeps_every_digit():
    # "nothing lost": an int given as a string of digits is that int, not a float's approximation of it
    assert call_tool(Box(), ToolCall("search", {"query": "q", "limit": "9007199254740993"}), 5) == (
        "q:9007199254740993:False", None)
