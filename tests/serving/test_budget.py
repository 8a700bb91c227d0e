"""The context budget (serving/context_budget.py): rerank's `context_tokens` and the proxy's
`--proxy-context-tokens` / `"sieverag": {"context_tokens": N}` keep the best context that fits
N tokens of the filter's tokenizer: the bar's kept passages whole, best first, while they
fit, then the next one's kept sentences, never a cut sentence, never a passage the bar
dropped. The arithmetic with the tiny model's (SmolLM2's) tokenizer; 1,000 random requests
through the selection functions, none over its budget; then a few through the server."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_openai_server import FakeOpenAIServer
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Document, RerankResult
from sieverag.inference.filters.mcf import document_sentences
from sieverag.inference.retrieval.sentences import split_sentences
from sieverag.serving.api.rerank.serving import within_budget
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.context_budget import Candidate, each_text_measure, fit_to_budget
from sieverag.serving.local_server import LocalServer
from sieverag.serving.proxy.chat_proxy import passages_within_budget
from sieverag.serving.proxy.marked_documents import (
    CLOSE_TAG,
    OPEN_TAG,
    Passage,
    passage_lines,
)

QUESTION = "Where was Liora Tamsin born?"
DOCUMENTS = [
    "Liora Tamsin was born in Quorrin in 1848. She later worked as a cartographer. "
    "Her maps are kept in Ostmere.",
    "Penguins huddle together in winter. They live in the south.",
    "The Calder Bridge opened in 1901. It crosses a gorge. Its engineer was Wren Ivers.",
    "Quorrin is a port town. Liora Tamsin grew up there. The harbour is deep.",
    "Tea is grown on terraced hills. It is picked by hand.",
]
WORDS = ("river bridge harbour Quorrin Tamsin winter penguin tea hill map born town port "
         "gorge engineer 1848 cartographer deep south opened crosses").split()
SERVER_BUDGET = 25


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


# ----- the arithmetic -----

def test_whole_passages_while_they_fit_then_the_next_ones_sentences(
        tokenizer: PreTrainedTokenizerBase) -> None:
    candidates = [Candidate(text, tuple(split_sentences(text))) for text in DOCUMENTS[:3]]
    sizes = [tokens(tokenizer, c.text) for c in candidates]
    first_of_third = tokens(tokenizer, candidates[2].sentences[0])
    two_of_third = tokens(tokenizer, candidates[2].part(2))
    measure = each_text_measure(tokenizer)

    def fitted(budget: int) -> list[tuple[int, int | None]]:
        placed = fit_to_budget(candidates, budget, measure)
        assert measure(placed) <= budget
        return [(p.position, p.sentences) for p in placed]

    assert fitted(sum(sizes)) == [(0, None), (1, None), (2, None)]
    assert fitted(sum(sizes) - 1) == [(0, None), (1, None), (2, 2)]
    assert fitted(sizes[0] + sizes[1] + two_of_third) == [(0, None), (1, None), (2, 2)]
    assert fitted(sizes[0] + sizes[1] + two_of_third - 1) == [(0, None), (1, None), (2, 1)]
    assert fitted(sizes[0] + sizes[1] + first_of_third) == [(0, None), (1, None), (2, 1)]
    # Not even the third's first sentence fits: nothing of it, nothing after it.
    assert fitted(sizes[0] + sizes[1] + first_of_third - 1) == [(0, None), (1, None)]
    # The first passage does not fit whole: its sentences that fit, and nothing more.
    first_sentence = tokens(tokenizer, candidates[0].sentences[0])
    assert fitted(first_sentence) == [(0, 1)]
    assert fitted(first_sentence - 1) == []
    placed = fit_to_budget(candidates, sizes[0] + sizes[1] + two_of_third, measure)
    assert placed[-1].text == " ".join(candidates[2].sentences[:2])
    assert placed[0].text == DOCUMENTS[0]


def ranked_results(rng: random.Random, texts: list[str], sentence_stage: bool
                   ) -> list[RerankResult]:
    """A random ranking of `texts`: scores, the bar's verdicts and (sentence stage) each kept
    document's key sentences, in document order, as `rank_by_filter` gives them."""
    results = []
    for index, text in enumerate(texts):
        kept = rng.random() < 0.6
        extra = {}
        if sentence_stage:
            sentences = split_sentences(text)
            keys = sorted(rng.sample(range(len(sentences)),
                                     rng.randint(1, len(sentences)))) if kept else []
            extra = {"key_sentences": tuple(sentences[i] for i in keys),
                     "pruned_text": " ".join(sentences[i].strip() for i in keys)}
        results.append(RerankResult(index, rng.random(), kept, **extra))
    return results


def random_text(rng: random.Random) -> str:
    return " ".join(" ".join(rng.choices(WORDS, k=rng.randint(2, 14))).capitalize() + "."
                    for _ in range(rng.randint(1, 6)))


def test_a_budget_of_n_never_returns_more_than_n_tokens_over_1000_random_requests(
        tokenizer: PreTrainedTokenizerBase) -> None:
    """Rerank's selection (`within_budget`, each result's pruned_text counted apart) and the
    proxy's (`passages_within_budget`, the numbered lines it forwards) on 1,000 random
    requests each: never over the budget, only what the bar kept, best first, the whole ones
    a prefix, at most one trimmed (the last, its first kept sentences), and the next one does
    not fit."""
    rng = random.Random(67)
    for trial in range(1000):
        texts = [random_text(rng) for _ in range(rng.randint(1, 8))]
        budget = rng.randint(1, 200)
        sentence_stage = trial % 2 == 1
        ranked = ranked_results(rng, texts, sentence_stage)
        kept = sorted((r for r in ranked if r.kept), key=lambda r: -r.relevance_score)
        context = within_budget(tokenizer, ranked, texts, budget, sentence_stage)
        assert sum(tokens(tokenizer, r.pruned_text) for r in context) <= budget
        assert [r.index for r in context] == [r.index for r in kept[:len(context)]]
        wholes = [kept[i].pruned_text if sentence_stage else texts[kept[i].index]
                  for i in range(len(context))]
        trimmed = [i for i, r in enumerate(context) if r.pruned_text != wholes[i]]
        assert trimmed in ([], [len(context) - 1])
        if trimmed:
            keys = (kept[trimmed[0]].key_sentences if sentence_stage
                    else tuple(split_sentences(texts[kept[trimmed[0]].index])))
            taken = context[-1].key_sentences
            assert taken == keys[:len(taken)] and 0 < len(taken) < len(keys) + 1
            assert context[-1].pruned_text == " ".join(s.strip() for s in taken)
        if len(context) < len(kept) and not trimmed:
            used = sum(tokens(tokenizer, r.pruned_text) for r in context)
            first = (kept[len(context)].key_sentences if sentence_stage
                     else split_sentences(texts[kept[len(context)].index]))[0]
            assert used + tokens(tokenizer, first.strip()) > budget

        passages = [Passage(str(i + 1), Document(id=str(i), text=t, title=rng.choice(["", "T"])))
                    for i, t in enumerate(texts)]
        best = rng.sample(passages, rng.randint(0, len(passages)))
        forwarded, info = passages_within_budget(tokenizer, best, budget)
        assert tokens(tokenizer, passage_lines(forwarded)) == info["context_tokens_used"]
        assert info["context_tokens_used"] <= budget and info["context_tokens"] == budget
        assert [p.number for p in forwarded] == [p.number for p in best[:len(forwarded)]]
        assert all(p.document.text == b.document.text
                   for p, b in zip(forwarded[:-1], best, strict=False))
        if info["trimmed"] is not None:
            last, whole = forwarded[-1], best[len(forwarded) - 1]
            assert info["trimmed"] == int(whole.document.id)
            sentences = document_sentences(whole.document)
            assert any(last.document.text == " ".join(s.strip() for s in sentences[:k])
                       for k in range(1, len(sentences) + 1))


# ----- through the server -----

@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, adapter_dir: Path,
           upstream: FakeOpenAIServer) -> Iterator[LocalServer]:
    config = LocalServerConfig(model=str(tiny_model_dir), adapters=(f"filter={adapter_dir}",),
                               port=0, access_log=False, proxy_to=upstream.base_url,
                               proxy_context_tokens=SERVER_BUDGET)
    with LocalServer(config) as running:
        yield running


@pytest.fixture()
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=600) as client:
        yield client


def rerank(http: httpx.Client, path: str = "/rerank", **fields: object) -> dict:
    """POST /v1`path` (/v2/rerank: at the root)."""
    url = str(http.base_url.copy_with(path=path)) if path.startswith("/v2") else path
    reply = http.post(url, json={"model": "filter", "query": QUESTION,
                                  "documents": DOCUMENTS, **fields})
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize("granularity", ["chunk", "sentence"])
def test_rerank_returns_the_best_context_that_fits(http: httpx.Client,
                                                   tokenizer: PreTrainedTokenizerBase,
                                                   granularity: str) -> None:
    unbounded = rerank(http, granularity=granularity)["results"]
    kept = [r for r in unbounded if r["kept"]]  # best first, as sent
    assert 2 <= len(kept) < len(DOCUMENTS)
    whole = [r.get("pruned_text") or DOCUMENTS[r["index"]] for r in kept]
    # A budget that holds every kept document: exactly them, and nothing the bar dropped.
    roomy = rerank(http, granularity=granularity, context_tokens=10_000)["results"]
    assert [r["index"] for r in roomy] == [r["index"] for r in kept]
    assert [r["pruned_text"] for r in roomy] == whole
    # The first whole, the second's first kept sentence.
    first = tokens(tokenizer, whole[0])
    second = (kept[1]["key_sentences"] if granularity == "sentence"
              else split_sentences(DOCUMENTS[kept[1]["index"]]))[0]
    budget = first + tokens(tokenizer, second.strip())
    tight = rerank(http, granularity=granularity, context_tokens=budget)["results"]
    assert [r["index"] for r in tight] == [r["index"] for r in kept[:2]]
    assert tight[0]["pruned_text"] == whole[0]
    assert tight[1]["pruned_text"] == second.strip() and tight[1]["key_sentences"] == [second]
    assert all(r["kept"] for r in tight)
    assert sum(tokens(tokenizer, r["pruned_text"]) for r in tight) <= budget
    if granularity == "sentence":  # the trimmed one's spans keep only what is in the context
        assert sum(s["kept"] for s in tight[1]["spans"]) == 1


def test_every_dialect_takes_the_budget(http: httpx.Client,
                                        tokenizer: PreTrainedTokenizerBase) -> None:
    budget = 40  # more than any document's first sentence: never an empty context
    assert all(tokens(tokenizer, split_sentences(d)[0]) <= budget for d in DOCUMENTS)
    for path, fields in (("/rerank", {}), ("/v2/rerank", {}),
                         ("/rerank", {"raw_scores": True}), ("/rerank", {"top_k": 3})):
        body = rerank(http, path, context_tokens=budget, **fields)
        results = body.get("results", body.get("data"))
        assert results and all(r["kept"] for r in results), (path, fields)
        assert sum(tokens(tokenizer, r["pruned_text"]) for r in results) <= budget
    reply = http.post("/rerank", json={"query": QUESTION, "texts": DOCUMENTS, "model": "filter",
                                       "context_tokens": budget})
    assert reply.status_code == 200, reply.text
    assert sum(tokens(tokenizer, r["pruned_text"]) for r in reply.json()) <= budget


@pytest.mark.parametrize("value", [0, -3, 1.5, "ten", True])
def test_a_bad_budget_is_a_400_naming_it(http: httpx.Client, value: object) -> None:
    reply = http.post("/rerank", json={"model": "filter", "query": QUESTION,
                                       "documents": DOCUMENTS, "context_tokens": value})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "context_tokens"


def forwarded_lines(upstream: FakeOpenAIServer) -> str:
    content = upstream.requests[-1].json["messages"][-1]["content"]
    inside = content.split(OPEN_TAG, 1)[1].split(CLOSE_TAG, 1)[0]
    return inside.strip("\n")


def test_the_proxy_forwards_the_best_context_of_its_budget(
        http: httpx.Client, upstream: FakeOpenAIServer,
        tokenizer: PreTrainedTokenizerBase) -> None:
    chat = {"model": "generator", "messages": [{"role": "user", "content": QUESTION}],
            "documents": DOCUMENTS}
    # The server's budget (--proxy-context-tokens).
    reply = http.post("/chat/completions", json=chat)
    assert reply.status_code == 200, reply.text
    info = reply.json()["sieverag"]
    assert info["context_tokens"] == SERVER_BUDGET
    assert tokens(tokenizer, forwarded_lines(upstream)) == info["context_tokens_used"]
    assert info["context_tokens_used"] <= SERVER_BUDGET
    assert "sieverag" not in upstream.requests[-1].json
    # A request's own, roomy: every passage the bar kept, whole, and none it dropped.
    roomy = http.post("/chat/completions",
                      json={**chat, "sieverag": {"context_tokens": 5000}}).json()["sieverag"]
    assert roomy["context_tokens"] == 5000 and roomy["trimmed"] is None
    assert roomy["documents_kept"] < len(DOCUMENTS)
    assert set(info["kept"]) <= set(roomy["kept"])
    assert info["kept"] == roomy["kept"][:len(info["kept"])]
    # One token: no whole sentence fits, nothing is forwarded.
    tiny = http.post("/chat/completions",
                     json={**chat, "sieverag": {"context_tokens": 1}}).json()["sieverag"]
    assert tiny["kept"] == [] and tiny["context_tokens_used"] == 0
    assert forwarded_lines(upstream) == ""


@pytest.mark.parametrize(("settings", "param"), [
    ({"context_tokens": 0}, "sieverag.context_tokens"),
    ({"context_tokens": "many"}, "sieverag.context_tokens"),
    ({"tokens": 5}, "sieverag.tokens"),
    ("20", "sieverag")])
def test_a_bad_proxy_budget_is_a_400_naming_it(http: httpx.Client, settings: object,
                                               param: str) -> None:
    reply = http.post("/chat/completions", json={
        "model": "generator", "messages": [{"role": "user", "content": QUESTION}],
        "documents": DOCUMENTS, "sieverag": settings})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_a_budget_without_documents_is_refused(http: httpx.Client) -> None:
    reply = http.post("/chat/completions", json={
        "model": "generator", "messages": [{"role": "user", "content": QUESTION}],
        "sieverag": {"context_tokens": 50}})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "sieverag"


def test_proxy_context_tokens_is_checked_at_start() -> None:
    with pytest.raises(ConfigError, match="proxy_context_tokens must be >= 1"):
        LocalServerConfig(proxy_to="http://127.0.0.1:9/v1", proxy_context_tokens=0)
    with pytest.raises(ConfigError, match="--proxy-context-tokens needs --proxy-to"):
        LocalServerConfig(proxy_context_tokens=100)
