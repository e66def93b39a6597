"""rltune's in-process chat harness for verifiers environments (verifiers.v1 Harness).

verifiers' own harnesses (`null`, `bash`, ...) are programs it prepares with `uv` (fetched with
curl when absent) and runs in a runtime; offline, without uv, they cannot start. This one runs
its loop in the trainer's process, as verifiers' Harness contract allows ("a harness may run its
loop in-process ... as long as every model call goes through `endpoint` + `secret`"): the
conversation so far is sent as one chat completion; multi-turn environments resume it with the
accreted conversation (SUPPORTS_RESUME).

Tools (SUPPORTS_MCP): the task's tool servers (`vf.Toolset`, `mcp_urls`) are listed once per
segment and offered to the model as `tools` (named `SERVER_TOOL`, as verifiers' own harnesses name
them). While the model's reply calls tools, each call is answered by its server and the results
are sent back as `tool` messages in the next request; a reply without calls ends the segment.
The servers run behind rltune's guard (rltune/envs/verifiers_tools.py): every call carries the
run's secret. What a tool answers is the environment's, untrusted: an unknown tool, arguments that
are not a JSON object, a call past `tool_timeout_s` or a failing call are answered to the model
as an `error: ...` result, never raised. The episode bounds (`rollout.max_turns`,
`max_episode_tokens`, the agent's own time under `rollout.tool_timeout_s`) are rltune's recording
endpoint's, as for any agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import verifiers.v1 as vf


class ChatHarnessConfig(vf.HarnessConfig):
    tool_timeout_s: float = 60.0     # one tool call; past it the model is told so


def _message(m) -> dict:
    return m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m)


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    SUPPORTS_MCP = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_):
        import httpx
        import openai

        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [_message(m) for m in prompt or []]
        async with contextlib.AsyncExitStack() as stack:
            tools, dispatch, servers = await self._tools(mcp_urls, stack)
            client = await stack.enter_async_context(openai.AsyncOpenAI(
                base_url=endpoint, api_key=secret, max_retries=0,
                http_client=httpx.AsyncClient(trust_env=False, timeout=3600)))
            while True:
                reply = await client.chat.completions.create(model=ctx.model, messages=messages,
                                                             **({"tools": tools} if tools else {}))
                message = reply.choices[0].message
                calls = list(message.tool_calls or [])
                if not calls:
                    break
                messages.append(message.model_dump(exclude_none=True))
                for call in calls:
                    result = await self._answer(call, dispatch, servers)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

    async def _tools(self, mcp_urls: dict, stack):
        """(OpenAI tool schemas, dispatch, connections) of the task's guarded tool servers."""
        if not mcp_urls:
            return [], {}, {}
        from verifiers.v1.harnesses.utils.mcp import connect_mcp

        from rltune.envs.verifiers_tools import headers

        spec = {"mcpServers": {name: {"url": url, "headers": headers(), "timeout": self.config.tool_timeout_s}
                               for name, url in mcp_urls.items()}}
        return await connect_mcp(spec, stack)

    async def _answer(self, call, dispatch: dict, servers: dict) -> str:
        """One tool call's result text, or `error: ...` for what went wrong."""
        from verifiers.v1.harnesses.utils.mcp import call_mcp

        name = call.function.name
        if name not in dispatch:
            return f"error: there is no tool named {name!r}; the tools are: {', '.join(sorted(dispatch)) or 'none'}"
        try:
            args = json.loads(call.function.arguments or "{}")
        except (TypeError, ValueError):
            args = None
        if not isinstance(args, dict):
            return f"error: the arguments of {name} are not a JSON object"
        try:
            result = await asyncio.wait_for(call_mcp(servers, dispatch, name, args), self.config.tool_timeout_s)
        except asyncio.TimeoutError:
            return f"error: {name} did not answer in {self.config.tool_timeout_s:g} s"
        except Exception as err:  # noqa: BLE001 - the environment's failure, told to the model
            return f"error: {name} failed: {type(err).__name__}: {str(err)[:300]}"
        if isinstance(result, list):
            result = "\n".join(p.get("text", "") for p in result if isinstance(p, dict))
        return str(result)


__all__ = ["ChatHarness"]
