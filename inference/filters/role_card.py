"""The card a filter role reads its scores with (`filter_card`): an in-process filter's
adapter's card; a served filter's card named by `models.filter_card`, shown by its server on
`/models`, or that of the installed or shipped filter of its served name (`adapter_store`).
What a card holds and the questions asked of it are the card package's (`card/`)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import httpx

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.filters.adapter_files import AdapterError
from sieverag.inference.filters.adapter_store import find_adapter
from sieverag.inference.filters.card.card_file import CARD_FILE, read_card
from sieverag.inference.filters.card.filter_card import (
    RETRIEVAL_ONLY,
    RETRIEVAL_ONLY_SOURCE,
    FilterCard,
)
from sieverag.inference.llm.backend_registry import BackendSpec

_MODELS_TIMEOUT_S = 10.0  # reading a server's /models


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
