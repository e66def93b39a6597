"""rltune's in-process chat harness for verifiers environments (verifiers.v1 Harness).

verifiers' own harnesses (`null`, `bash`, ...) are programs it prepares with `uv` (fetched with
curl when absent) and runs in a runtime; offline, without uv, they cannot start. This one runs
its loop in the trainer's process, as verifiers' Harness contract allows ("a harness may run its
loop in-process ... as long as every model call goes through `endpoint` + `secret`"): one chat
completion per segment, the conversation so far as its messages. Multi-turn environments resume
it with the accreted conversation (SUPPORTS_RESUME). It offers no tools.
"""

from __future__ import annotations

import verifiers.v1 as vf


class ChatHarnessConfig(vf.HarnessConfig):
    pass


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
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
            messages += [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m)
                         for m in prompt or []]
        async with openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0,
                                      http_client=httpx.AsyncClient(trust_env=False, timeout=3600)) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ChatHarness"]
