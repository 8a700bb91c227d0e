"""The shared base of `inference` (rank 0 of its layers): the types every part passes
around (`types`), its errors (`errors`), file I/O (`io_utils`), the prompt templates
(`prompt_templates`, reading `inference/prompts/`), the one configuration system
(`settings`, with `inference/presets/`), many questions in flight (`in_flight`) and
self-contained HTML pages (`html/`). It imports nothing else of sieverag; every other part
may import it."""
