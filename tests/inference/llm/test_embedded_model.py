"""Integration tests on the embedded SmolLM2-135M-Instruct (converted once into the cache)."""

from __future__ import annotations

import pytest
import torch

from sieverag.inference.core.errors import ModelNotFoundError
from sieverag.inference.llm import model_resolution
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "Is Paris the capital of France? Answer Yes or No."}]


@pytest.fixture(scope="module")
def smollm(embedded_model_dir) -> HFBackend:
    return HFBackend(HFBackendConfig(model=model_resolution.DEFAULT_MODEL))


def test_embedded_model_is_converted_to_safetensors_in_the_cache(embedded_model_dir):
    assert (embedded_model_dir / "model.safetensors").is_file()
    assert (embedded_model_dir / "config.json").is_file()
    assert model_resolution.resolve_model(model_resolution.DEFAULT_MODEL) == embedded_model_dir


def test_label_logprobs_agree_with_a_manual_forward_pass(smollm):
    scores = smollm.label_logprobs([QUESTION], ["Yes", "No"])[0]
    ids = torch.tensor([smollm.prompt_ids(QUESTION)])
    with torch.no_grad():
        logprobs = torch.log_softmax(smollm.model(input_ids=ids).logits[0, -1].float(), dim=-1)
    yes = smollm.tokenizer("Yes", add_special_tokens=False)["input_ids"]
    no = smollm.tokenizer("No", add_special_tokens=False)["input_ids"]
    assert len(yes) == len(no) == 1
    assert scores["Yes"] == pytest.approx(logprobs[yes[0]].item(), abs=1e-4)
    assert scores["No"] == pytest.approx(logprobs[no[0]].item(), abs=1e-4)


def test_padded_and_unpadded_batches_give_the_same_scores(smollm):
    document = ("Document: The Nile flows through Egypt and Sudan into the Mediterranean Sea. "
                "Is it useful? Yes or No.")
    prompts = [QUESTION, [{"role": "user", "content": document}],
               [{"role": "user", "content": "Hi"}]]
    together = smollm.label_logprobs(prompts, ["Yes", "No"])
    alone = [smollm.label_logprobs([p], ["Yes", "No"])[0] for p in prompts]
    for batch_row, single in zip(together, alone, strict=True):
        assert batch_row == pytest.approx(single, abs=1e-4)


def test_embedded_model_answers_a_simple_question(smollm):
    reply = smollm.generate([[{"role": "user", "content": "What is the capital of France?"}]])[0]
    assert "Paris" in reply


def test_unknown_names_and_bad_folders_are_clear_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="unknown model 'gpt-9'"):
        model_resolution.resolve_model("gpt-9")
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        model_resolution.resolve_model(str(tmp_path))


def test_missing_model_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SIEVERAG_CACHE", str(tmp_path))
    monkeypatch.setitem(model_resolution.EMBEDDED_MODELS, "ghost", model_resolution.EmbeddedModel(
        package="no_such_package_xyz", gguf_file="x.gguf", install_hint="pip install ghost",
        hub_name="nobody/ghost"))
    with pytest.raises(ModelNotFoundError, match="pip install ghost"):
        model_resolution.resolve_model("ghost")
