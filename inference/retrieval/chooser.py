"""The one chooser: `open_backend(source)` opens the index an `IndexSource` names (a local
folder, `sieverag index serve`, or Milvus) as a `search_backend.SearchBackend`. Every command that
searches an index opens it here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sieverag.inference.retrieval.search_backend import IndexSource, SearchBackend, read_secret

if TYPE_CHECKING:
    from sieverag.inference.retrieval.config import SearchConfig


def open_backend(source: IndexSource, search_config: SearchConfig | None = None, *,
                 use_cache: bool = True) -> SearchBackend:
    """Open the index `source` names, searching as `search_config` says (a served index
    must fuse as it does: the client checks). Fails at once, naming the source, when the
    index cannot be reached."""
    if source.backend == "milvus":
        from sieverag.inference.retrieval.milvus import MilvusIndex

        return MilvusIndex.connect(source.uri or "", source.collection_name,
                                   search_config=search_config,
                                   token=read_secret(source.api_key_env),
                                   timeout=source.timeout_s)
    if source.endpoint is not None:
        from sieverag.inference.retrieval.remote import RemoteIndex

        return RemoteIndex(source.endpoint, search_config=search_config,
                           api_key=read_secret(source.api_key_env), timeout=source.timeout_s)
    from sieverag.inference.retrieval.index_folder import Index

    return Index.load(source.index or "", search_config=search_config, use_cache=use_cache)
