"""Typed configs: unknown keys and bad values are errors naming the field; prompt templates."""

from __future__ import annotations

import pytest

from sieverag.inference.composition.config import RunConfig, load_run_config
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.prompt_templates import load_template, parse_template
from sieverag.inference.core.settings import validate_settings


def test_round_trip_through_yaml(tmp_path):
    config = validate_settings(RunConfig, {"dataset": "d.jsonl", "pipelines": ["vanilla",
                                                                          "main-rag"],
                                           "judge": {"bar_n": 1}, "limit": 5}, "test")
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    assert load_run_config(path) == config
    assert config.judge.bar_n == 1.0 and config.pipelines == ("vanilla", "main-rag")


@pytest.mark.parametrize(("data", "message"), [
    ({"dataset": "d", "judge": {"barn": 1}}, "judge.barn: unknown setting"),
    ({"dataset": "d", "colour": "red"}, "colour: unknown setting"),
    ({"dataset": "d", "answer_extraction": "all"}, "answer_extraction: Input should be"),
    ({"dataset": "d", "limit": "ten"}, "limit: Input should be a valid integer"),
    ({"dataset": "d", "limit": 0}, "limit must be >= 1"),
    ({"dataset": "d", "models": {"generator": {"kind": "openai"}}},
     "models.generator.kind: unknown setting"),
    ({"dataset": "d", "models": {"filter": {"endpoint": "http://h/v1", "model": "f",
                                             "adapter": "a"}}},
     "adapter 'a' is for an in-process model"),
    ({"dataset": "d", "models": {"filter": {"endpoint": "http://h/v1"}}},
     "a model served at http://h/v1 needs its name there"),
    ({"dataset": "d", "generation": {"max_new_tokens": 0}}, "max_new_tokens must be >= 1"),
    ({"pipelines": ["vanilla"]}, "dataset: required, not given"),
])
def test_bad_configs_are_errors_naming_the_field(data, message):
    with pytest.raises(ConfigError, match=message):
        validate_settings(RunConfig, data, "test")


def test_missing_or_broken_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_run_config(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("dataset: x\nmodels: {generator: [unclosed}\n")
    # One line: where and what, without PyYAML's excerpt and caret drawn under it.
    with pytest.raises(ConfigError) as caught:
        load_run_config(broken)
    assert str(caught.value) == (f"config file {broken}, line 2, column 30: not valid YAML "
                                 "(expected ',' or ']', but got '}')")


def test_templates_render_exactly_their_inputs():
    template = load_template("judge_predictor")
    messages = template.messages(question="Q?", document="D {braces} kept")
    assert messages[0]["role"] == "system" and "reliable assistant" in messages[0]["content"]
    assert "D {braces} kept" in messages[1]["content"]
    with pytest.raises(ValueError, match="missing inputs"):
        template.messages(question="Q?")
    with pytest.raises(ValueError, match="unknown inputs"):
        template.messages(question="Q?", document="D", extra="x")
    # A template with no system prompt renders its user turn alone.
    assert [m["role"] for m in load_template("judge_evaluator").messages()] == ["user"]
    assert len(template.sha256) == 64


def test_template_placeholders_must_match_declared_inputs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ninputs: [question]\nsystem: ''\nuser: '{question} {document}'\n")
    with pytest.raises(ConfigError, match="do not match"):
        parse_template(bad)
    with pytest.raises(ConfigError, match="no prompt template"):
        load_template("does_not_exist")
