"""sieverag's runtime: the filter and the other agents, the pipelines that use them, their
composition and their evaluation.

Its modules are layers, and imports point down them: the map (each layer's rank, modules and
role, and which layers the other parts may import) is docs/architecture.md, "The parts and
their layers", generated from the declaration tests/test_layers.py checks. `data_gen`,
`training` and `serving` build on its shared core only; `inference` imports none of the parts
built on it.
"""
