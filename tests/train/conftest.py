import pytest

from trainlib import tiny_recipe


@pytest.fixture
def recipe_factory(tmp_path):
    def make(name="tiny-grpo.yaml", **overrides):
        return tiny_recipe(tmp_path, name, **overrides)
    return make
