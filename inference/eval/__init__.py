"""Evaluation: answer and filter metrics (`metrics`), trust metrics (`trust`), the resumable
runner (`runner.run_evaluation`), per-example records, summaries, the Markdown report, and
`trace` (one saved example rendered readably, `sieverag trace`).
Datasets are read by the data layer below it (`inference.data`)."""
