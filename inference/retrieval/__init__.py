"""Retrieval over a user's own corpus: read, chunk, index, search, evaluate.

* `corpus` — corpus readers (jsonl, nutrition pages, SQuAD, HotpotQA) → source Documents
* `chunking` — word-window / sentence / whole-document chunks with stable ids
* `sentences` — `split_sentences`, the sentence splitter the filters and metrics reuse
* `bm25` — bm25s index with stemming, stop words and its saved tokenizer vocabulary
* `dense` — sentence-transformers + FAISS, built in resumable on-disk shards
* `hybrid` — weighted min-max fusion and reciprocal-rank fusion
* `rerank` — the optional cross-encoder reranker hook
* `hygiene` — evidence hygiene presets (off / loose / strict) that report what they drop
* `index` — `build_index`, `Index.load(...).search(query, k, mode)`, `ensure_index`
* `config`, `manifest`, `cache`, `retrieved` — settings, the index manifest, the retrieval
  cache, the search hit type (atomic writes come from `inference.io_utils`)
* `evaluation` — recall@k / MRR against gold source documents
* `cli` — `register(subparsers)`: `index build`, `index search`, `eval-retrieval`
"""
