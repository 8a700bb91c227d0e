"""sieverag runtime: LLM backends, filters, pipelines and evaluation.

`inference` is the base of the project: `data_gen`, `training` and `serving` import it,
it imports none of them.
"""

__version__ = "0.1.0"
