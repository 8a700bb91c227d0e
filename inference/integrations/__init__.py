"""The trained filter inside other RAG frameworks, through the rerank endpoint.

* `rerank_client` — `RerankEndpoint`: POST {base_url}/rerank (the embedded server's
  `/v1/rerank`) and the documents it keeps, best first; framework-free (httpx only).
* `in_process` — `InProcessFilter`: the same ranking with the filter loaded in this process.
* `selection` — what both share: which documents to keep (`Keep`, `choose`), at which
  granularity, and the `Ranker` protocol the adapters take.
* `langchain` — `SieveragCompressor`, a LangChain document compressor, and
  `FilteredRetriever`, a retriever whose documents pass it (`pip install "sieverag[langchain]"`).
* `llamaindex` — `SieveragPostprocessor`, a LlamaIndex node post-processor
  (`pip install "sieverag[llamaindex]"`).

Each framework is imported only by its own module, so nothing else in sieverag needs it.
"""
