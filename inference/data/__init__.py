"""The data layer: QA benchmark files read into `Example`s, below retrieval and evaluation.

* `loading` — `load_examples(path, fmt="auto", limit)` and `detect_format`: pick a file's
  format (by its name, else by the keys of its first record) and read it;
* `readers` — the built-in formats (hotpotqa, nq, popqa, squad, common, triviaqa, arc) and
  the SQuAD paragraphs as a corpus (`load_squad_paragraphs`, `load_squad_corpus`);
* `formats` — the format registry (`DATASET_FORMATS`, `register_format`,
  `register_jsonl_format`) the readers add themselves to;
* `records` — reading one record's fields, with errors that name the file, line and field;
* `files` — jsonl (gzip told by content) and whole JSON documents (zipped or not);
* `demo` — `write_demo_dataset`: the demo set of invented facts (`sieverag demo`).

It imports only the shared base (`inference.types`, `inference.errors`); retrieval,
evaluation, data_gen and training import it (tests/test_layers.py keeps it so).
"""

from sieverag.inference.data.files import iter_jsonl
from sieverag.inference.data.formats import (
    DATASET_FORMATS,
    DatasetFormat,
    register_format,
    register_jsonl_format,
)
from sieverag.inference.data.loading import detect_format, example_source, load_examples
from sieverag.inference.data.readers import load_squad_corpus, load_squad_paragraphs

__all__ = ["DATASET_FORMATS", "DatasetFormat", "detect_format", "example_source", "iter_jsonl",
           "load_examples", "load_squad_corpus", "load_squad_paragraphs", "register_format",
           "register_jsonl_format"]
