"""Who runs each model role of a run — generator, judge, filter — in-process or served; shared by
every command that calls models by role (`eval`, `ask`, `demo`, `eval-filter`)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import httpx

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import settings
from sieverag.inference.filters.adapter_store import (
    CARD_FILE,
    DEFAULT_FILTER_NAME,
    AdapterError,
    find_adapter,
    read_card,
    resolve_filter,
)
from sieverag.inference.filters.card.combination import (
    PRIORS_ONLY,
    Combination,
    card_combination,
    ranking_statement,
)
from sieverag.inference.llm.backend_registry import BackendSpec

if TYPE_CHECKING:
    from sieverag.inference.filters.mcf import MCFConfig

# The `models.filter_card` that ranks a served filter's documents by BM25 + dense alone.
RETRIEVAL_ONLY = "retrieval-only"
# The source of the card a run reads when retrieval is asked for by name (none).
RETRIEVAL_ONLY_SOURCE = f"models.filter_card={RETRIEVAL_ONLY}"
# Seconds to wait for a server's model list.
_MODELS_TIMEOUT_S = 10.0


@settings
class ModelRoles:
    """The three model roles, each in-process (model + optional adapter) or served (endpoint +
    model name): the generator answers; the judge (MAIN-RAG, training-free) scores documents
    on a base model; the filter (MCF) is the trained LoRA adapter.

    `filter_card` lives here, not on the filter's `BackendSpec`: a spec says how a model is
    reached, which every role shares, while the card says how the filter's scores are read
    (`filter_card`), which only a served filter role needs named; an in-process filter's card
    is its adapter's, so naming one there is refused."""

    generator: BackendSpec = field(default_factory=BackendSpec,
                                   metadata={"help": "the model that answers"})
    judge: BackendSpec | None = field(default=None, metadata={
        "help": "the MAIN-RAG judge's model (unset: the generator's; once any judge field is "
                "set, its unset fields take their own defaults, not the generator's)"})
    filter: BackendSpec = field(default_factory=BackendSpec, metadata={
        "help": "the trained filter: in-process, its base `model` and `adapter` (a folder or "
                f"a filter's name; default {DEFAULT_FILTER_NAME}: installed, else shipped); "
                "served, `endpoint` and the served adapter's `model` name"})
    filter_card: str | None = field(default=None, metadata={
        "help": "a served filter's card, which says how its scores are read: a filter's name "
                "(`sieverag filter list`) or an adapter folder holding one, or "
                f"{RETRIEVAL_ONLY} (rank by BM25 + dense alone, on purpose); unset: the card "
                "the server shows on /v1/models (sieverag's server does), else the installed "
                "or shipped filter of the served name, else an error"})

    def __post_init__(self) -> None:
        if self.filter_card is not None and self.filter.endpoint is None:
            raise ConfigError(
                f"models.filter_card {self.filter_card!r} names the card of a served filter; "
                "an in-process filter's card is its adapter's (models.filter.adapter): unset "
                "filter_card")

    @property
    def judge_spec(self) -> BackendSpec:
        return self.judge or self.generator


def resolve_filter_role(spec: BackendSpec) -> BackendSpec:
    """An in-process filter role with its adapter resolved to a checked folder (the given
    path or name, else the default filter); a served filter as it is."""
    if spec.endpoint is not None:
        return spec
    folder = resolve_filter(spec.adapter or DEFAULT_FILTER_NAME, spec.model)
    return replace(spec, adapter=str(folder))


@dataclass(frozen=True)
class FilterCard:
    """The card a filter role's scores are read by (`filter_card`): the card (None: ranking
    by retrieval alone, asked for by name), where it was read, and the adapter folder that
    holds it where it is local."""

    card: Mapping[str, Any] | None
    source: str
    folder: str | None = None

    @property
    def combination(self) -> Combination:
        """The combination the card ranks by (`card_combination`: its fitted one, else
        `FILTER_ALONE`); no card (retrieval asked for by name, or none): `PRIORS_ONLY`."""
        if self.card is None:
            return PRIORS_ONLY
        return card_combination(self.card, self.source)

    def ranking_statement(self, mcf: MCFConfig) -> str:
        """Which score MCF ranks by with this card under `mcf`, and why: the line `eval`,
        `ask` and `demo` print at start (`combination.ranking_statement`)."""
        if self.card is not None:
            where = self.source
        elif self.source == RETRIEVAL_ONLY_SOURCE:
            where = f"{RETRIEVAL_ONLY_SOURCE} asks for it"
        else:
            where = (f"the filter adapter {self.folder} has no {CARD_FILE}" if self.folder
                     else "the in-process filter has no adapter")
        return ranking_statement(self.combination, where,
                                 priors_only=mcf.combination == "priors_only",
                                 score_rule=mcf.score_rule, lexical_weight=mcf.lexical_weight,
                                 always_score=mcf.always_score_chunks, home=mcf.home)


def filter_card(spec: BackendSpec, named: str | None = None) -> FilterCard:
    """The card of the filter role `spec` (resolved by `resolve_filter_role`), which every
    command that ranks by a filter reads its scores with. In-process: its adapter's card.
    Served: the card `named` (`models.filter_card`: a filter's name or folder, or
    `RETRIEVAL_ONLY`); else the card the server shows for the served model on its
    `/v1/models` (`filter_card`, as sieverag's embedded server shows each adapter's); else
    the installed or shipped filter of the served name (serve a filter under its own name,
    e.g. `--adapters smollm2-filter=smollm2-filter`); else a `ConfigError` naming both
    remedies, never a silent ranking by retrieval alone."""
    if spec.endpoint is None:
        folder = spec.adapter
        card = read_card(folder) if folder is not None else None
        if card is None:
            adapter = "the in-process filter has no adapter, so no" if folder is None else (
                f"the filter adapter {folder} has no")
            warnings.warn(f"{adapter} {CARD_FILE}: MCF ranks its "
                          "documents by BM25 + dense alone (`sieverag filter package` gives "
                          "a training run one, `sieverag filter fit-combination` fits the "
                          "combination that ranks by the filter)",
                          stacklevel=2)
        return FilterCard(card, f"{folder}/{CARD_FILE}", folder)
    if named == RETRIEVAL_ONLY:
        return FilterCard(None, RETRIEVAL_ONLY_SOURCE)
    if named is not None:
        try:
            local = local_card(named)
        except AdapterError as err:
            raise ConfigError(f"models.filter_card: {err}") from None
        if local.card is None:
            raise ConfigError(f"models.filter_card {named!r}: {local.folder} holds no "
                              f"{CARD_FILE}; name a filter that has a card (`sieverag filter "
                              "list`)")
        return local
    shown = served_card(spec)
    if shown is not None:
        return FilterCard(shown, f"the card {spec.endpoint}/models shows for {spec.model!r}")
    try:
        local = local_card(spec.model or "")
    except AdapterError:
        local = None
    if local is None or local.card is None:
        raise ConfigError(
            f"the filter served at {spec.endpoint} as {spec.model!r} has no filter card: the "
            "server shows none on /models and no installed or shipped filter has that name, "
            "so its scores cannot be read as the filter's. Name its card with "
            "--models.filter-card NAME_OR_FOLDER (or serve it under its filter's name), or "
            f"rank by BM25 + dense alone on purpose with --models.filter-card {RETRIEVAL_ONLY}")
    return local


def local_card(name_or_folder: str) -> FilterCard:
    """The card (None: it has none) of the installed or shipped filter, or adapter folder,
    `name_or_folder` names (`find_adapter`; `AdapterError` when it names none)."""
    folder = find_adapter(name_or_folder).path
    return FilterCard(read_card(folder), f"{folder}/{CARD_FILE}", str(folder))


def served_card(spec: BackendSpec) -> Mapping[str, Any] | None:
    """The filter card a server shows for the served model `spec.model` on its `/models`
    (the entry's `filter_card`); None where it shows none (vLLM) or has no model list. A
    server that cannot be reached is a `ConfigError` naming it."""
    # Imported here: the OpenAI SDK loads only for a served role.
    from sieverag.inference.llm.openai_backend import server_key

    url = f"{(spec.endpoint or '').rstrip('/')}/models"
    # The key the role's backend sends (`server_key`): none, no Authorization header.
    key = server_key(spec.api_key_env)
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    try:
        response = httpx.get(url, headers=headers, timeout=_MODELS_TIMEOUT_S)
    except httpx.HTTPError as err:
        raise ConfigError(f"cannot read the served filter's model list at {url} "
                          f"({type(err).__name__}: {err}); is the server running?") from None
    if response.status_code in (401, 403):
        raise ConfigError(f"the server at {url} refused its model list (HTTP "
                          f"{response.status_code}): give its key with "
                          "--models.filter.api-key-env VAR")
    if response.status_code != 200:
        return None
    try:
        entries = response.json().get("data") or []
    except (ValueError, AttributeError):
        return None
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == spec.model:
            card = entry.get("filter_card")
            return card if isinstance(card, dict) else None
    return None
