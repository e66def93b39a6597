"""A local OpenEnv environment, built with openenv-core's own helpers (`Action`, `Observation`,
`Environment`, `create_app`): guess a whole number from 1 to `high` (16), told "Higher." or
"Lower.". The game and its reward are builtin:guess's (rltune/agents/builtin.py): a hit on turn t
is rewarded max(0.1, 1.0 - 0.1 (t - 1)) on that step, every other step 0.

rltune drives it as `rollout.env: openenv:rltune.envs.openenv_guess` (recipes/openenv-tiny.yaml):
it starts this module's `app` as a child server on 127.0.0.1 (rltune/envs/openenv_env.py). To
run it yourself, bound to this machine only (an OpenEnv server has no authentication: anyone who
reaches it can drive it):

    python -m rltune.envs.openenv_guess --port 8000        # then env_args: {url: http://127.0.0.1:8000}

Imported only in the server's process (and by whoever names it): it imports openenv-core.
"""

from __future__ import annotations

from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    """One guess: the assistant's text (its first whole number is the guess)."""

    guess: str = Field(..., description="the assistant's text; its first whole number is the guess")


class GuessObservation(Observation):
    """What the player is told: the question, a hint, or that the number was found."""

    prompt: str = Field(default="", description="the question or the hint")


def _first_integer(text: str) -> Optional[int]:
    digits = ""
    for ch in text:
        if ch.isdigit():
            digits += ch
            if len(digits) > 6:
                break
        elif digits:
            break
    return int(digits) if digits else None


class GuessEnvironment(Environment):
    """One game per WebSocket session (OpenEnv creates an instance per session)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.high, self.target, self.turns, self.found = 16, 1, 0, False
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, target: Any = None,
              high: Any = 16, **kwargs: Any) -> GuessObservation:
        import random

        self.high = int(high or 16)
        self.target = int(target) if target is not None else random.Random(seed).randint(1, self.high)
        if not 1 <= self.target <= self.high:
            raise ValueError(f"the target {self.target} is not between 1 and {self.high}")
        self.turns, self.found = 0, False
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(prompt=f"I am thinking of a whole number from 1 to {self.high}. "
                                       "Guess it: answer with the number only.", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self.turns += 1
        self._state.step_count = self.turns
        guess = _first_integer(action.guess)
        if guess is None:
            return GuessObservation(prompt="Answer with a number only.", done=False, reward=0.0)
        if guess == self.target:
            self.found = True
            return GuessObservation(prompt="Found.", done=True, reward=max(0.1, round(1.0 - 0.1 * (self.turns - 1), 10)))
        return GuessObservation(prompt="Higher." if guess < self.target else "Lower.", done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


# one session per episode in flight: rltune holds rollout.batch_size (or eval_size) sessions at once
app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="rltune_guess", max_concurrent_envs=1024)


if __name__ == "__main__":
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description="the rltune guess game as an OpenEnv server")
    parser.add_argument("--host", default="127.0.0.1", help="the interface to bind (default: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    a = parser.parse_args()
    uvicorn.run(app, host=a.host, port=a.port)
