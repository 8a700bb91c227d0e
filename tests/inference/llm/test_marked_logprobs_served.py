"""`marked_label_logprobs` served: the `openai` backend against the embedded server (a
token-id prompt, its echoed top-k) and the engine backend read, at every mark and for the
reply, what `HFBackend` reads in-process on the same tiny model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from fake_backend import ScriptedBackend
from tiny_server import model

from sieverag.inference.core.errors import ConfigError, ContextError
from sieverag.inference.core.types import Conversation
from sieverag.inference.llm.backend_protocol import LABEL_MARK, marked_prompt_ids
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig
from sieverag.serving.engine.engine_backend import EngineBackend
from sieverag.serving.engine.sequence_types import SequenceRequest
from sieverag.serving.local_server import LocalServer
from sieverag.training.evaluation.caching_backend import CachingBackend

pytest_plugins = ["tiny_server"]

TOP_K = 20  # the most the server returns per token (protocol.MAX_LOGPROBS)
TOLERANCE = 1e-4
# No mark, one, and three (one of them in the system message).
CONVERSATIONS: list[Conversation] = [
    [{"role": "user", "content": "Is Paris the capital of France?"}],
    [{"role": "user", "content": f"Paris is in France.{LABEL_MARK} Is it the capital?"}],
    [{"role": "system", "content": f"Judge each sentence.{LABEL_MARK}"},
     {"role": "user", "content": f"Paris is in France.{LABEL_MARK} It is large.{LABEL_MARK} "
                                 "Is it the capital?"}],
]
MARKS = [0, 1, 3]

RemoteFactory = Callable[..., OpenAIBackend]


@pytest.fixture(scope="module")
def in_process(tiny_model_dir: Path) -> HFBackend:
    return HFBackend(HFBackendConfig(model=str(tiny_model_dir)))


@pytest.fixture
def make_remote(server: LocalServer, tiny_model_dir: Path) -> Iterator[RemoteFactory]:
    """OpenAI backends on the embedded server, with the tiny model's tokenizer; closed at
    teardown."""
    made: list[OpenAIBackend] = []

    def make(**options: object) -> OpenAIBackend:
        settings = {"base_url": server.base_url, "model": model(server), "top_logprobs": TOP_K,
                    "chat_template_model": str(tiny_model_dir), **options}
        made.append(OpenAIBackend(OpenAIBackendConfig(**settings)))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


def read_distributions(backend: HFBackend, conversation: Conversation) -> torch.Tensor:
    """The model's next-token log-probs at each read of `conversation` (each mark's, then the
    prompt's last token's), from one plain forward pass: [reads, vocabulary]."""
    ids, positions = marked_prompt_ids(backend.tokenizer, backend.render(conversation))
    with torch.inference_mode():
        logits = backend.model(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits[[*positions, len(ids) - 1]].float(), dim=-1)


def one_token(tokenizer: object, text: str) -> bool:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) == 1  # type: ignore


@pytest.fixture(scope="module")
def labels(in_process: HFBackend) -> list[str]:
    """The labels the comparisons read: Yes and No, which no read of the flat tiny model has
    in its top 20; for each conversation the word token it likes best at its last read (in
    the top 20 there), spelled with its leading space; and that word without the space, a
    token of its own, which must be read as itself, not as its likelier variant."""
    tokenizer = in_process.tokenizer
    listed = {token for conversation in CONVERSATIONS
              for read in read_distributions(in_process, conversation)
              for token in torch.topk(read, TOP_K).indices.tolist()}
    assert not {tokenizer.decode([t]).strip() for t in listed} & {"Yes", "No"}
    chosen = ["Yes", "No"]
    for conversation in CONVERSATIONS:
        for token in torch.topk(read_distributions(in_process, conversation)[-1], 5).indices:
            text = tokenizer.decode([int(token)])
            if (text.startswith(" ") and text[1:].isalpha() and text not in chosen
                    and one_token(tokenizer, text) and one_token(tokenizer, text[1:])):
                chosen += [text, text[1:]]
                break
    assert len(chosen) >= 6, chosen
    return chosen


def test_a_token_id_prompt_echoes_every_positions_top_k(server: LocalServer,
                                                        in_process: HFBackend) -> None:
    """The server takes `prompt` as token ids and echoes, for each prompt token, the top-k
    of the distribution it was drawn from, then the generated token's."""
    ids, _ = marked_prompt_ids(in_process.tokenizer, in_process.render(CONVERSATIONS[0]))
    reply = httpx.post(f"{server.base_url}/completions", timeout=60, json={
        "model": model(server), "prompt": ids, "max_tokens": 1, "temperature": 0,
        "echo": True, "logprobs": TOP_K})
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["text"].startswith(in_process.tokenizer.decode(ids))
    table = choice["logprobs"]["top_logprobs"]
    assert len(table) == len(ids) + 1 and table[0] is None
    with torch.inference_mode():
        logits = in_process.model(input_ids=torch.tensor([ids])).logits[0]
    expected = torch.topk(torch.log_softmax(logits.float(), dim=-1), TOP_K)
    for entry, values, tokens in zip(table[1:], expected.values, expected.indices, strict=True):
        # The k best, plus the prompt token itself where it is not among them.
        assert sorted(entry.values(), reverse=True)[:TOP_K] == pytest.approx(
            values.tolist(), abs=TOLERANCE)
        assert in_process.tokenizer.decode([int(tokens[0])]) in entry


def test_served_reads_equal_in_process_at_every_mark(
    server: LocalServer, make_remote: RemoteFactory, in_process: HFBackend, labels: list[str]
) -> None:
    """Through the openai backend (labels in the top-k read there, the rest scored exactly)
    and the engine backend, each conversation's reads (marks + 1 of them) are HFBackend's."""
    expected = in_process.marked_label_logprobs(CONVERSATIONS, labels)
    remote = make_remote()
    served = remote.marked_label_logprobs(CONVERSATIONS, labels, agent="one_pass")
    engine = EngineBackend(server.engine, model(server)).marked_label_logprobs(
        CONVERSATIONS, labels)
    assert [len(reads) for reads in expected] == [m + 1 for m in MARKS]
    for got in (served, engine):
        assert [len(reads) for reads in got] == [m + 1 for m in MARKS]
        for got_reads, want_reads in zip(got, expected, strict=True):
            for read, want in zip(got_reads, want_reads, strict=True):
                assert list(read) == labels
                assert read == pytest.approx(want, abs=TOLERANCE)
    # One request per conversation, one more per (read, label) outside the top k: Yes and
    # No at every read, the best-liked words not at every one.
    reads = sum(MARKS) + len(MARKS)
    calls = remote.meter.snapshot()["one_pass"].calls
    assert len(CONVERSATIONS) + 2 * reads <= calls < len(CONVERSATIONS) + len(labels) * reads


@pytest.mark.parametrize("floor", [-99.0, "topk_min"])
def test_a_label_outside_the_top_k_gets_the_floor(
    make_remote: RemoteFactory, in_process: HFBackend, labels: list[str], floor: float | str
) -> None:
    """With a floor set, each read is the label's own entry where the server's top 20 holds
    it, else the floor (a number, or the 20th best log-prob), and nothing is sent again."""
    remote = make_remote(missing_label_logprob=floor)
    served = remote.marked_label_logprobs(CONVERSATIONS, labels, agent="one_pass")
    assert remote.meter.snapshot()["one_pass"].calls == len(CONVERSATIONS)  # no exact scoring
    label_ids = [in_process.tokenizer(label, add_special_tokens=False)["input_ids"][0]
                 for label in labels]
    checked = {"in": 0, "out": 0}
    for conversation, got_reads in zip(CONVERSATIONS, served, strict=True):
        for read, got in zip(read_distributions(in_process, conversation), got_reads,
                             strict=True):
            best = torch.topk(read, TOP_K + 1).values
            boundary = float(best[TOP_K - 1] + best[TOP_K]) / 2
            for label, token in zip(labels, label_ids, strict=True):
                value = float(read[token])
                if abs(value - boundary) < TOLERANCE:
                    continue  # too near the k-th best to say which side the server saw
                inside = value > boundary
                checked["in" if inside else "out"] += 1
                want = value if inside else (
                    float(best[TOP_K - 1]) if floor == "topk_min" else floor)
                assert got[label] == pytest.approx(want, abs=TOLERANCE), (label, inside)
    assert checked["in"] and checked["out"], checked


def test_without_chat_template_model_it_is_a_config_error_naming_it(
    server: LocalServer,
) -> None:
    with OpenAIBackend(OpenAIBackendConfig(base_url=server.base_url,
                                           model=model(server))) as remote:
        with pytest.raises(ConfigError, match="marked_label_logprobs .*chat_template_model"):
            remote.marked_label_logprobs(CONVERSATIONS, ["Yes", "No"])


def test_a_label_of_more_than_one_token_is_refused(server: LocalServer,
                                                 make_remote: RemoteFactory) -> None:
    for backend in (make_remote(), EngineBackend(server.engine, model(server))):
        with pytest.raises(ValueError, match="one token per label.*'Banana split'"):
            backend.marked_label_logprobs(CONVERSATIONS, ["Yes", "Banana split"])


@pytest.mark.parametrize(("options", "message"), [
    ({"label_positions": (1,), "label_token_ids": (5,)}, "needs prompt_logprobs"),
    ({"label_positions": (1,), "prompt_logprobs": True}, "label_token_ids"),
    ({"label_positions": (2, 1), "prompt_logprobs": True, "label_token_ids": (5,)}, "in order"),
    ({"label_positions": (3,), "prompt_logprobs": True, "label_token_ids": (5,)}, "within"),
])
def test_an_engine_request_reads_labels_only_at_prompt_positions_in_order(
    options: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SequenceRequest(model="m", prompt_ids=(1, 2, 3), max_tokens=0, **options)


def test_prompts_go_through_the_context_guard(make_remote: RemoteFactory) -> None:
    remote = make_remote(context_length=16, context_overflow="error")
    with pytest.raises(ContextError):
        remote.marked_label_logprobs(CONVERSATIONS, ["Yes", "No"])


def test_the_caching_backend_asks_each_marked_request_once() -> None:
    inner = ScriptedBackend(labels=lambda text: {"Yes": -0.5})
    cached = CachingBackend(inner)
    first = cached.marked_label_logprobs(CONVERSATIONS, ["Yes", "No"])
    again = cached.marked_label_logprobs([*CONVERSATIONS, CONVERSATIONS[2]], ["Yes", "No"])
    assert inner.meter.snapshot()["scorer"].calls == len(CONVERSATIONS)
    assert again == [*first, first[2]]
    assert [len(reads) for reads in first] == [m + 1 for m in MARKS]
    assert first[2][0] == {"Yes": -0.5, "No": -20.0}
    # Other labels are another request.
    cached.marked_label_logprobs(CONVERSATIONS[:1], ["No"])
    assert inner.meter.snapshot()["scorer"].calls == len(CONVERSATIONS) + 1
