"""Evaluation: answer and filter metrics (`metrics`), trust metrics (`trust`), the resumable
runner (`runner.run_evaluation`), per-example records, summaries and the Markdown report.
Datasets are read by the data layer below it (`inference.data`)."""
