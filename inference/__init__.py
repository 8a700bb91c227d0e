"""sieverag runtime: dataset loading, LLM backends, retrieval, filters, pipelines and evaluation.

`inference` is the base of the project: `data_gen`, `training` and `serving` import it,
it imports none of them.
"""

__version__ = "0.1.0"
