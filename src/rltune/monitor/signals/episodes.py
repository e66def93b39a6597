"""Episodes (rollout.env, docs/agents.md): the tools failing, and a policy that stops using them.

Both read the episode metrics a run with an environment logs (train/episodes.py) and are skipped
where those are absent (single-turn runs, other tools' logs)."""

from __future__ import annotations

import statistics

from ..base import Event, Sustained, _rd

STORM_FRAC = 0.5          # more than this share of the tool calls failing ...
STORM_STEPS = 3           # ... this many steps in a row
DROP_RATIO = 0.25         # tool calls per episode below this share of their best window ...
DROP_MIN_PEAK = 0.2       # ... which had at least this many calls per episode


class ToolErrorStorm(Sustained):
    """Most tool calls fail (raise, name no tool, bad arguments, cannot be parsed, time out) for
    STORM_STEPS steps: the episodes teach the model about broken tools, not the task."""
    name = "tool_errors"
    key = "episode/tool_error_frac"

    def steps_needed(self, mon):
        return STORM_STEPS

    def check(self, mon, step, v, fired):
        self._now = v                   # this step's values: not in the monitor's history yet
        return super().check(mon, step, v, fired)

    def condition(self, mon, x):
        return x > STORM_FRAC

    def event(self, mon, step, x, n):
        timeouts = mon.recent("episode/timeouts", STORM_STEPS - 1) + [self._now.get("episode/timeouts", 0.0)]
        timeouts = [sum(timeouts)]
        t = mon.recipe.rollout.tool_timeout_s
        lines = ["read the tool messages in the logged samples (logging.sample_every): a tool that raises on the "
                 "model's arguments, or a docstring that describes the arguments wrongly, is the usual cause",
                 "an unparseable call means the model does not know the format: docs/agents.md, \"Tools as a class\""]
        ch: dict = {}
        if timeouts and timeouts[-1] > 0:
            ch = {"rollout.tool_timeout_s": min(3600.0, 2 * t)}
            lines.insert(0, f"set rollout.tool_timeout_s: {min(3600.0, 2 * t):g} (was {t:g}): "
                            f"{int(timeouts[-1])} call(s) timed out in the last {STORM_STEPS} steps")
        return Event(step, "tool_errors", "warning",
                     f"Tool errors: {x:.0%} of the tool calls failed for {n} steps (step {step}): the model learns "
                     "from error messages, not from the tools' answers",
                     {"tool_error_frac": _rd(x), "steps": n, "role": "rollout"}, lines, ch)


class ToolUseDropped(Sustained):
    """Tool calls per episode fell below DROP_RATIO of their best window mean (which was at least
    DROP_MIN_PEAK) for `window` steps: the policy stopped calling the tools. Where the reward
    depends on a tool's answer, that is the policy giving up on it (a reward that pays without the
    tool, or a tool that fails); an info where the reward rose meanwhile (the model may need the
    tool less), a warning where it did not."""
    name = "tool_use_dropped"
    key = "episode/tool_calls_mean"

    def _peak(self, mon) -> tuple[float, int]:
        """(the best mean over `window` consecutive steps so far, the step index where its latest
        window at that level ended: the reward is compared with the reward there)."""
        h, w = mon.hist.get(self.key, []), mon.h.window
        best, at = 0.0, -1
        for i in range(w, len(h) + 1):
            m = statistics.fmean(h[i - w:i])
            if m >= best:
                best, at = m, i
        return best, at

    def ready(self, mon):
        return self._peak(mon)[0] >= DROP_MIN_PEAK

    def condition(self, mon, x):
        return x < DROP_RATIO * self._peak(mon)[0]

    def event(self, mon, step, x, n):
        peak, at = self._peak(mon)
        rewards = mon.hist.get("reward/mean", [])
        then = statistics.fmean(rewards[max(0, at - mon.h.window):at]) if at > 0 and rewards[:at] else None
        now = statistics.fmean(rewards[-mon.h.window:]) if rewards else None
        rose = then is not None and now is not None and now > then + 0.05 * max(abs(then), 0.1)
        lines = ["check that the reward depends on the tools' answers (a reward that pays for an answer the model can "
                 "guess teaches it to skip the tools)",
                 "look at episode/tool_errors: a tool that fails is one the policy learns to avoid"]
        rew = "" if then is None or now is None else f"; reward {now:.3g} now, {then:.3g} then"
        return Event(step, "tool_use_dropped", "info" if rose else "warning",
                     f"Tool use dropped: {x:.2f} tool calls per episode, below {DROP_RATIO:.0%} of its best "
                     f"{peak:.2f}, for {n} steps{rew}",
                     {"tool_calls_mean": _rd(x), "peak": _rd(peak), "steps": n, "role": "actor"}, lines, {})
