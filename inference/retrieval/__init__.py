"""Retrieval over a user's own corpus: read, chunk, index, search, evaluate.

* `corpus` — corpus readers (jsonl, nutrition pages, SQuAD, HotpotQA) → source Documents
* `chunking` — word-window / sentence / whole-document chunks with stable ids
* `sentences` — `split_sentences`, the sentence splitter the filters and metrics reuse
* `bm25` — bm25s index with stemming, stop words and its saved tokenizer vocabulary
* `dense` — sentence-transformers + FAISS, built in resumable on-disk shards
* `hybrid` — weighted min-max fusion and reciprocal-rank fusion
* `rerank` — the optional cross-encoder reranker hook
* `hygiene` — evidence hygiene presets (off / loose / strict) that report what they drop
* `index_folder` — `build_index`, `Index.load(...).search(query, k, mode)`, `ensure_index`
* `search_backend` — `SearchBackend`, what every command needs of an index, and `IndexSource`, where
  it lives: a local folder, `sieverag index serve` or Milvus; `chooser` — `open_backend`
* `remote` — `RemoteIndex`, an index served by `sieverag index serve`, and its wire format
* `milvus` — `MilvusIndex` and `build_collection`: text, dense and BM25 in one Milvus collection
* `config`, `manifest`, `cache`, `retrieved` — settings, the index manifest, the retrieval
  cache, the search hit type (atomic writes come from `inference.io_utils`)
* `evaluation` — recall@k / MRR against gold source documents
* `cli` — `register(subparsers)`: `index build`, `index search`, `eval-retrieval`
"""
