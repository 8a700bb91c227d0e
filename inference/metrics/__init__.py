"""Every metric's definition, below the pipelines and the runner: pure functions of answers,
decisions and gold, shared by every command that reports them (`eval`, `eval-filter`,
`eval-retrieval`, `label`'s agreement with gold).

* `answer_scores` — exact match, token F1, accuracy (a gold alias in the answer), choice accuracy,
  ASQA's STR-EM / STR-Hit and ROUGE-L;
* `filter_scores` — a filter's kept passages and sentences against gold: precision, recall, F1,
  AUROC, AP, calibration error;
* `retrieval` — recall@k and MRR;
* `trust` — the Auto-RAG study's trust metrics (AQS, TAAS, faithfulness, hallucination rate,
  context precision, evidence noise, sentence support rate) and sieverag's own variants;
* `grader` — the study's six-criterion LLM grader.
"""
