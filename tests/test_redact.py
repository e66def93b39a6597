"""What a run directory keeps carries no credentials (issue 25, item 16): rltune/redact.py and the
run's recipe.yaml / state.json recipe."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rltune.redact import redact, redact_text


@pytest.mark.parametrize("text,want", [
    ("https://bob:hunter2@mlflow.corp:5000/x", "https://bob:***@mlflow.corp:5000/x"),
    ("postgresql://u:p%40ss@db/x", "postgresql://u:***@db/x"),
    ("https://h/x?token=abc&x=1", "https://h/x?token=***&x=1"),
    ("https://h/?api_key=K;sig=S", "https://h/?api_key=***;sig=***"),
    ("databricks", "databricks"), ("file:///tmp/a", "file:///tmp/a"), ("https://bob@h/x", "https://bob@h/x"),
    ("actor.lr=1e-6 logging.mlflow_tracking_uri=https://a:b@h", "actor.lr=1e-6 logging.mlflow_tracking_uri=https://a:***@h"),
])
def test_redact_text(text, want):
    assert redact_text(text) == want


def test_the_run_keeps_a_redacted_recipe(tmp_path):
    from rltune.recipe.schema import Recipe
    from rltune.train.run import _resume_point

    recipe = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                                    "reward": {"functions": ["builtin:exact_answer"]},
                                    "logging": {"mlflow": True, "mlflow_tracking_uri": "https://bob:hunter2@mlflow.corp"}})
    run = SimpleNamespace(recipe=recipe, run_dir=tmp_path / "run", recipe_dict={}, rhash="")
    _resume_point(run, "never", False)
    assert run.recipe_dict["logging"]["mlflow_tracking_uri"] == "https://bob:***@mlflow.corp"
    assert "hunter2" not in str(run.recipe_dict)
    assert redact({"a": ["https://x:y@h", 1, None]}) == {"a": ["https://x:***@h", 1, None]}
