"""Shared text for the recipe tests (unique module name: tests/ has no packages; a test that
imported from `conftest` would get whichever directory's conftest pytest loaded last)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = """\
model:
  policy: builtin:tiny-llama
data:
  train: builtin:arithmetic
reward:
  functions: [builtin:exact_answer]
"""

PPO = MINIMAL + """\
algorithm:
  name: ppo
"""


def assert_rule_case(path, rule: str, bad: list, severity: str, fix: str, good: list) -> None:
    """`rule` fires on the recipe at `path` with the `bad` overrides (with `severity`, a fix
    holding `fix`, and the finding placed in the file) and stays silent with the `good` ones."""
    from rltune.recipe import check

    recipe, findings = check(path, bad)
    assert recipe is not None, findings
    hits = [f for f in findings if f.rule == rule]
    assert hits, f"{rule} did not fire on {bad}: {findings}"
    assert severity in {f.severity for f in hits}
    assert any(fix in f.fix for f in hits), [f.fix for f in hits]
    for f in hits:
        assert f.message and f.path and f.file == path and f.line >= 1
    recipe, findings = check(path, good)
    assert recipe is not None, findings
    assert [f for f in findings if f.rule == rule] == []
