"""Old import paths of moved modules still import for one release: the old name is the new
module, with a DeprecationWarning naming where it went."""

from __future__ import annotations

import importlib
import sys

import pytest

MOVED = {
    "sieverag.inference.eval.metrics": "sieverag.inference.metrics.answers",
    "sieverag.inference.eval.filter_metrics": "sieverag.inference.metrics.filter",
    "sieverag.inference.eval.retrieval": "sieverag.inference.metrics.retrieval",
    "sieverag.inference.pipelines.amber_config": "sieverag.inference.pipelines.amber.settings",
    "sieverag.inference.pipelines.amber_trace": "sieverag.inference.pipelines.amber.trace",
    "sieverag.inference.pipelines.memory": "sieverag.inference.pipelines.amber.memory",
    "sieverag.inference.pipelines.collector": "sieverag.inference.pipelines.amber.collector",
    "sieverag.inference.pipelines.router": "sieverag.inference.pipelines.auto.router",
}


@pytest.mark.parametrize(("old", "new"), MOVED.items())
def test_an_old_path_is_the_new_module_and_says_where_it_went(old: str, new: str,
                                                              monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_the_old_generation_config_name_is_the_one_generation_settings_class() -> None:
    from sieverag.inference import config
    from sieverag.inference.llm.base import GenerationSettings

    with pytest.warns(DeprecationWarning, match="GenerationConfig is "):
        assert config.GenerationConfig is GenerationSettings
