"""The tools of a tools environment: JSON schemas built from a method's signature and
docstring, reading the tool calls a model wrote, and calling a tool under a time limit.

Standard library only: the rollout imports this for every episode, and `validate` must stay
light. The user's environment class is plain Python; nothing here depends on a model family
except the two call formats `parse_tool_calls` reads (Hermes/Qwen tags and Llama-3 JSON).
"""

from __future__ import annotations

import inspect
import json
import math
import re
import threading
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

NOT_TOOLS = frozenset({"reset", "reward", "step"})
MAX_PARSE_CHARS = 100_000   # only this much of a completion is searched for tool calls
MAX_RESULT_CHARS = 8_000    # a tool's answer is cut to this many characters
OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
END_TOKENS = ("<|eom_id|>", "<|eot_id|>", "<|im_end|>")
SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns?|Raises|Yields?|Examples?|Notes?):\s*$")
ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


# ---------------------------------------------------------------- schemas

def tool_methods(cls_or_obj: Any) -> dict[str, Callable]:
    """{name: method} of the tools a class (or an instance) defines, in definition order.

    A tool is a plain method whose name does not start with `_` and is not reset/reward/step;
    inherited methods count (a base class's first). Given an instance, the methods are bound.
    """
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        for name, raw in vars(klass).items():
            if inspect.isfunction(raw) and not name.startswith("_") and name not in NOT_TOOLS:
                names[name] = None
    return {name: getattr(cls_or_obj, name) for name in names}


def tool_schemas(cls_or_obj: Any) -> list[dict]:
    """The function schema of every tool of a class or instance (ValueError on a bad tool)."""
    return [tool_schema(fn) for fn in tool_methods(cls_or_obj).values()]


def tool_schema(fn: Callable) -> dict:
    """An OpenAI / Hugging Face style function schema for one tool, from its signature (type
    hints give the JSON types) and its docstring (the text before `Args:` describes the tool,
    the Google-style `Args:` entries describe the parameters).

    Raises ValueError for what a model could not be told: no docstring, a parameter without a
    type hint, *args/**kwargs, or a type JSON cannot carry.
    """
    name = fn.__name__
    doc = inspect.getdoc(fn)
    if not doc or not doc.strip():
        raise ValueError(f"tool {name!r} has no docstring: the model reads it to learn what the tool "
                         "does; write one (and an `Args:` section describing each parameter)")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as err:  # noqa: BLE001 - a forward reference that does not resolve
        raise ValueError(f"the type hints of tool {name!r} cannot be resolved: {type(err).__name__}: {err}") from None
    description, arg_docs = _split_docstring(doc)
    properties: dict[str, dict] = {}
    required: list[str] = []
    for param in _parameters(fn):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"tool {name!r} takes {'*' if param.kind == param.VAR_POSITIONAL else '**'}"
                             f"{param.name}: a tool's parameters must be named, each with a type hint")
        if param.name not in hints:
            raise ValueError(f"parameter {param.name!r} of tool {name!r} has no type hint: the schema the "
                             f"model sees needs one, e.g. `{param.name}: str`")
        schema, optional = _json_type(hints[param.name], f"parameter {param.name!r} of tool {name!r}")
        if param.name in arg_docs:
            schema["description"] = arg_docs[param.name]
        properties[param.name] = schema
        if not optional and param.default is inspect.Parameter.empty:
            required.append(param.name)
    return {"type": "function",
            "function": {"name": name, "description": description,
                         "parameters": {"type": "object", "properties": properties, "required": required}}}


def _parameters(fn: Callable) -> list[inspect.Parameter]:
    """The parameters the model fills in: the signature without `self` (unbound methods)."""
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name == "self" and not inspect.ismethod(fn):
        params = params[1:]
    return params


def _json_type(hint: Any, where: str) -> tuple[dict, bool]:
    """(JSON schema, optional) for a type hint; optional is True for Optional[X] / X | None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        kept = [a for a in args if a is not type(None)]
        optional = len(kept) < len(args)
        if len(kept) == 1:
            return _json_type(kept[0], where)[0], optional
        return {"anyOf": [_json_type(a, where)[0] for a in kept]}, optional
    if hint is Any:
        return {}, False
    if origin is typing.Literal:
        return _literal(args), False
    if isinstance(hint, type) and hint in SCALARS:
        return {"type": SCALARS[hint]}, False
    if hint in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset):
        schema: dict = {"type": "array"}
        if args and args[0] is not Ellipsis:
            try:
                schema["items"] = _json_type(args[0], where)[0]
            except ValueError:
                pass  # an item type JSON cannot name: any items
        return schema, False
    if hint is dict or origin is dict:
        return {"type": "object"}, False
    raise ValueError(f"{where} has the type {hint!r}, which a JSON tool call cannot carry: use str, int, "
                     "float, bool, list, dict, Literal[...] or Optional[...] of those")


def _literal(values: tuple) -> dict:
    """A JSON enum for Literal[...]: typed when all values share one JSON type."""
    schema: dict = {"enum": list(values)}
    kinds = {SCALARS.get(type(v)) for v in values}
    if len(kinds) == 1 and None not in kinds:
        schema = {"type": kinds.pop(), **schema}
    return schema


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a cleaned docstring.

    The description is the text before the first Google-style section header, whitespace
    collapsed; parameter entries are `name: text` or `name (type): text` lines of an `Args:`
    section, with more-indented lines continuing the entry above.
    """
    lines = doc.splitlines()
    head: list[str] = []
    i = 0
    while i < len(lines) and not SECTION.match(lines[i].strip()):
        head.append(lines[i])
        i += 1
    args: dict[str, str] = {}
    while i < len(lines):
        header = SECTION.match(lines[i].strip())
        i += 1
        if header and header.group(1) in ("Args", "Arguments", "Parameters"):
            i = _read_args(lines, i, args)
    return " ".join(" ".join(head).split()), args


def _read_args(lines: list[str], i: int, out: dict[str, str]) -> int:
    """Read one `Args:` section starting at line i into `out`; return the line after it."""
    entry_indent = None
    current = None
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        if entry_indent is None:
            entry_indent = indent
        if indent < entry_indent or (indent == entry_indent and SECTION.match(line.strip())):
            break
        match = ARG_LINE.match(line.strip()) if indent == entry_indent else None
        if match:
            current = match.group(1)
            out[current] = match.group(2).strip()
        elif current is not None:
            out[current] = (out[current] + " " + line.strip()).strip()
        i += 1
    return i


# ---------------------------------------------------------------- parsing calls

@dataclass
class ToolCall:
    """One call the model wrote: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict = field(default_factory=dict)


def parse_tool_calls(text: str) -> tuple[list[ToolCall], str | None]:
    """(calls, None) for the tool calls in a completion, ([], None) when it makes none, and
    ([], why) when it tries and the call cannot be read.

    Reads Hermes/Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (several,
    and an unclosed last one at the end of the text), else a Llama-3 call: the whole text, or
    what follows `<|python_tag|>`, is a JSON object with "name" and "parameters"/"arguments".
    Linear time: plain `str.find` and one json decode per block, over the first 100,000 chars.
    """
    text = text[:MAX_PARSE_CHARS]
    if OPEN in text:
        return _parse_tagged(text)
    tagged = PYTHON_TAG in text
    body = text.split(PYTHON_TAG, 1)[1] if tagged else text
    body = body.strip()
    for token in END_TOKENS:
        body = body.removesuffix(token).rstrip()
    if not (body.startswith("{") and body.endswith("}")):
        return [], (f"the text after {PYTHON_TAG} is not a JSON object" if tagged else None)
    obj, why = _decode(body)
    if why is not None or not isinstance(obj, dict) or "name" not in obj:
        if tagged:
            return [], why or f"the text after {PYTHON_TAG} is not an object with a \"name\""
        return [], None  # a plain answer that happens to be JSON
    call, why = _to_call(obj)
    return ([call], None) if call else ([], why)


def _parse_tagged(text: str) -> tuple[list[ToolCall], str | None]:
    """The calls of every <tool_call> block, or the first problem found."""
    calls = []
    pos = text.find(OPEN)
    while pos != -1:
        start = pos + len(OPEN)
        end = text.find(CLOSE, start)
        body = text[start:] if end == -1 else text[start:end]
        obj, why = _decode(body.strip())
        if why is not None:
            return [], f"the text in <tool_call> is not valid JSON ({why})"
        call, why = _to_call(obj)
        if call is None:
            return [], why
        calls.append(call)
        if end == -1:
            break
        pos = text.find(OPEN, end + len(CLOSE))
    return calls, None


def _decode(body: str) -> tuple[Any, str | None]:
    """(value, None) for valid JSON, (None, why) otherwise (deep nesting included)."""
    if not body:
        return None, "it is empty"
    try:
        return json.loads(body), None
    except json.JSONDecodeError as err:
        return None, f"{err.msg} at character {err.pos}"
    except (ValueError, RecursionError) as err:
        return None, f"{type(err).__name__}: {str(err)[:100]}"


def _to_call(obj: Any) -> tuple[ToolCall | None, str | None]:
    """A ToolCall from a decoded object, or (None, why) when it is not a call."""
    if not isinstance(obj, dict):
        return None, f"a tool call is a JSON object, not {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, "the tool call has no \"name\" string"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args, why = _decode(args.strip() or "{}")
        if why is not None:
            return None, f"the arguments of {name!r} are a string that is not valid JSON ({why})"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f"the arguments of {name!r} must be a JSON object, not {type(args).__name__}"
    return ToolCall(name, args), None


# ---------------------------------------------------------------- calling

def run_with_timeout(fn: Callable, timeout_s: float, /, *args: Any,
                     **kwargs: Any) -> tuple[bool, Any, BaseException | None]:
    """(finished, value, exception) of fn(*args, **kwargs) run in a daemon worker thread.

    Past `timeout_s` the thread is abandoned, not stopped (Python cannot kill a thread): it
    keeps running in the background, may still change the environment's state, and is never
    joined; being a daemon it does not keep the process alive at exit.
    """
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - SystemExit in user code is reported, not obeyed
            box["error"] = err

    worker = threading.Thread(target=work, daemon=True, name=f"rltune-env-{getattr(fn, '__name__', 'call')}")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return False, None, None
    return True, box.get("value"), box.get("error")


def call_tool(obj: Any, call: ToolCall, timeout_s: float) -> tuple[str, str | None]:
    """(text of the tool message, error kind or None) for one call on an environment instance.

    Error kinds: "unknown" (no such tool), "arguments" (they do not fit the signature),
    "raised" (the tool raised), "timeout" (no answer within timeout_s; see run_with_timeout).
    The model sees the error text, so it can correct itself on the next turn.
    """
    tools = tool_methods(obj)
    fn = tools.get(call.name)
    if fn is None:
        return f"error: unknown tool {call.name!r}; tools: {', '.join(tools) or '(none)'}", "unknown"
    problem = _argument_problem(fn, call.arguments)
    arguments = dict(call.arguments)
    if not problem:
        problem = _coerce_scalars(fn, arguments)
    if problem:
        return f"error: bad arguments for {call.name}({_signature_text(fn)}): {problem}", "arguments"
    if inspect.iscoroutinefunction(fn):  # an `async def` tool runs in its own event loop
        import asyncio

        fn = _sync(fn, asyncio.run)
    finished, value, err = run_with_timeout(fn, timeout_s, **arguments)
    if not finished:
        return f"error: the tool did not answer within {timeout_s:g} s", "timeout"
    if err is not None:
        return f"error: {type(err).__name__}: {err}", "raised"
    try:
        return _result_text(value), None
    except Exception as err:  # noqa: BLE001 - a value whose str() raises
        return f"error: the tool's result cannot be shown: {type(err).__name__}: {err}", "raised"


def _sync(fn: Callable, run: Callable) -> Callable:
    """A plain function running the coroutine function `fn` to completion with `run`."""
    def call(**kwargs: Any) -> Any:
        return run(fn(**kwargs))
    call.__name__ = fn.__name__
    return call


def _argument_problem(fn: Callable, arguments: dict) -> str | None:
    """Why `arguments` do not fit the tool's signature (unknown names first), or None."""
    params = _parameters(fn)
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        known = {p.name for p in params if p.kind not in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)}
        unknown = [k for k in arguments if k not in known]
        if unknown:
            return "unknown argument " + ", ".join(repr(k) for k in unknown)
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError as err:
        return str(err)
    return None


def _coerce_scalars(fn: Callable, arguments: dict) -> str | None:
    """Give each argument of a str / int / float / bool parameter (or Optional of one) that type,
    in place, where that loses nothing: 12 -> "12" for str, "12" or 12.0 -> 12 for int, 3 or "3.5"
    -> float, "true" / "false" -> bool. Returns why an argument cannot have its type, or None."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - hints that do not resolve were refused by tool_schema already
        return None
    for name, value in arguments.items():
        hint = hints.get(name)
        kept = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (
            typing.Union, getattr(types, "UnionType", None)) else [hint]
        if value is None or len(kept) != 1 or kept[0] not in SCALARS:
            continue
        try:
            converted = _as_scalar(value, kept[0])
        except (ValueError, OverflowError, TypeError):   # a number its type cannot hold (10**400 for a float)
            converted = None
        if converted is None:
            return f"{name} must be {SCALARS[kept[0]]}, got {_shown(value)}"
        arguments[name] = converted
    return None


def _shown(value: Any, limit: int = 60) -> str:
    """`value` as JSON, cut to `limit` characters, for an error message (whatever it is: a list
    nested too deep to encode, an int too long to print, are named by their type)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    try:
        return json.dumps(value, default=str)[:limit]
    except (ValueError, RecursionError) as err:
        return f"a {type(value).__name__} that cannot be shown ({type(err).__name__})"


def _as_scalar(value: Any, kind: type) -> Any:
    """`value` as `kind` (str, int, float or bool) when nothing is lost, else None."""
    if isinstance(value, float) and not math.isfinite(value) and kind is not str:
        return None                        # inf (JSON's 1e400 overflows a float) or NaN: no number a tool can use
    if isinstance(value, kind) and not (kind is not bool and isinstance(value, bool)):
        return value
    if isinstance(value, bool) or isinstance(value, (dict, list)):
        return None
    if kind is str:
        return str(value) if isinstance(value, (int, float)) else None
    if kind is bool:
        return {"true": True, "false": False}.get(str(value).strip().lower())
    if kind is int and isinstance(value, str):
        try:
            return int(value.strip())      # every digit kept (float() would round past 2**53)
        except ValueError:                 # not an integer's digits (or past int()'s 4300-digit limit): maybe "12.0"
            pass
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        return None
    if kind is float:                      # float(10**400) raises OverflowError: the caller says "bad arguments"
        return float(number) if math.isfinite(float(number)) else None
    return int(number) if float(number).is_integer() and abs(number) < 2**63 else None


def _signature_text(fn: Callable) -> str:
    """`a: str, b: int = 5`: the parameters a model should pass, without self."""
    parts = []
    for p in _parameters(fn):
        ann = p.annotation
        text = p.name if ann is p.empty else f"{p.name}: {ann if isinstance(ann, str) else getattr(ann, '__name__', ann)}"
        parts.append(text if p.default is p.empty else f"{text} = {p.default!r}")
    return ", ".join(parts)


def _result_text(value: Any) -> str:
    """What a tool returned, as the text of the tool message (cut to MAX_RESULT_CHARS)."""
    if value is None:
        text = ""
    elif isinstance(value, str):
        text = value
    elif isinstance(value, (bool, int, float, dict, list)):
        try:
            text = json.dumps(value, default=str)
        except (TypeError, ValueError):  # e.g. dict keys JSON cannot hold
            text = str(value)
    else:
        text = str(value)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"...[cut: {len(text) - MAX_RESULT_CHARS} chars]"
    return text
