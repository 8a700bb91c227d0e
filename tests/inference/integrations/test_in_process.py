"""InProcessFilter, the framework adapters' filter without a server (tiny model, random filter
adapter): its selection is MCF's own (`rank_by_filter` on an hf backend of the same adapter),
ordered and cut as the endpoint client cuts, under the default or a given MCF bar; bad
settings and an unknown filter fail when it is built."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tiny_adapter import make_lora_adapter, one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.filters.adapter_files import AdapterError
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.filters.ranking import as_documents, rank_by_filter
from sieverag.inference.integrations.in_process import InProcessFilter
from sieverag.inference.integrations.rerank_client import RerankSettings
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

QUERY = "Where was Liora Tamsin born?"
TEXTS = ["Liora Tamsin was born in Quorrin in 1848. She later worked as a cartographer.",
         "Quorrin is a port town. Liora Tamsin grew up there.",
         "The Calder Bridge opened in 1901. It crosses a gorge.",
         "Penguins huddle together in winter."]


@pytest.fixture(scope="module")
def adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lora_adapter(tiny_model_dir, tmp_path_factory.mktemp("lora"))


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path, adapter: Path) -> HFBackend:
    """An hf backend of the same adapter, to rank with MCF directly."""
    return HFBackend(HFBackendConfig(model=str(tiny_model_dir), adapter=str(adapter)))


def test_it_keeps_what_mcf_keeps_best_first(tiny_model_dir: Path, adapter: Path,
                                            reference: HFBackend) -> None:
    ranked = rank_by_filter(reference, MCFConfig(), QUERY, as_documents(TEXTS))
    order = sorted(ranked, key=lambda r: -r.relevance_score)
    kept = InProcessFilter(str(adapter), base_model=str(tiny_model_dir)).select(QUERY, TEXTS)
    assert [r.index for r in kept] == [r.index for r in order if r.kept]
    assert len(kept) == 2  # MCF's default bar: the round's 2 best
    assert [r.relevance_score for r in kept] == pytest.approx(
        [r.relevance_score for r in order if r.kept], abs=1e-6)
    assert all(r.kept is True and r.key_sentences is None for r in kept)
    # keep="top_n": every document, best first, kept or not; top_n cuts it.
    every = InProcessFilter(str(adapter), base_model=str(tiny_model_dir), keep="top_n",
                            top_n=3).select(QUERY, TEXTS)
    assert [(r.index, r.kept) for r in every] == [(r.index, r.kept) for r in order[:3]]


def test_sentence_granularity_and_a_given_bar(tiny_model_dir: Path, adapter: Path,
                                              reference: HFBackend) -> None:
    """granularity='sentence' runs MCF's sentence stage (the async path alike); `mcf` sets
    the bar: a fixed bar far below every score keeps every document."""
    sentence = MCFConfig(sentence_stage=True)
    ranked = {r.index: r for r in rank_by_filter(reference, sentence, QUERY, as_documents(TEXTS))}
    narrowed = InProcessFilter(str(adapter), base_model=str(tiny_model_dir),
                               granularity="sentence")
    results = asyncio.run(narrowed.aselect(QUERY, TEXTS))
    assert [r.key_sentences for r in results] == [ranked[r.index].key_sentences
                                                  for r in results]
    assert all(r.key_sentences for r in results)  # kept ones name their sentences
    lenient = InProcessFilter(str(adapter), base_model=str(tiny_model_dir),
                              mcf=MCFConfig(bar="fixed", threshold=-100.0))
    assert sorted(r.index for r in lenient.select(QUERY, TEXTS)) == [0, 1, 2, 3]


def test_no_texts_no_work_and_settings_build_it(tiny_model_dir: Path, adapter: Path) -> None:
    settings = RerankSettings(filter=str(adapter), base_model=str(tiny_model_dir), top_n=1)
    ranker = settings.ranker(api_key=None)
    assert isinstance(ranker, InProcessFilter) and ranker.top_n == 1
    assert ranker.select(QUERY, []) == []
    assert len(ranker.select(QUERY, TEXTS)) == 1


def test_bad_settings_and_an_unknown_filter_fail_when_built(tiny_model_dir: Path,
                                                            adapter: Path) -> None:
    with pytest.raises(ConfigError, match="keep must be one of"):
        InProcessFilter(str(adapter), base_model=str(tiny_model_dir), keep="all")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="top_n must be >= 1"):
        InProcessFilter(str(adapter), base_model=str(tiny_model_dir), top_n=0)
    with pytest.raises(AdapterError, match="'no-such-filter' is neither a folder nor"):
        InProcessFilter("no-such-filter", base_model=str(tiny_model_dir))
