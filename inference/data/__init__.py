"""The data layer: QA benchmarks read into `Example`s, below retrieval and evaluation.

* `loading` — `load_examples(dataset, fmt="auto", limit)` and `detect_format`: pick a
  dataset's format (by its name, else by the keys of its first record) and read it;
* `sources` — what a dataset name opens (`open_dataset`): a file (jsonl, parquet, SQuAD's
  JSON), a `datasets` save_to_disk folder (`FOLDER[:SPLIT]`) or a hub split
  (`hf:NAME[:CONFIG]:SPLIT`); `dataset_fingerprint` identifies its content;
* `hf_datasets` — loading hub splits and save_to_disk folders with `datasets`;
* `readers` — the built-in formats (hotpotqa, nq, popqa, squad, common, triviaqa, arc) and
  the SQuAD paragraphs as a corpus (`load_squad_paragraphs`, `load_squad_corpus`);
* `standard_schemas` — the benchmarks' own published schemas (hotpotqa-original,
  2wikimultihopqa, triviaqa-original, nq-open, squad-flat, asqa), one adapter each;
* `formats` — the format registry (`DATASET_FORMATS`, `register_format`,
  `register_record_format`) the readers add themselves to;
* `record_fields` — reading one record's fields, with errors that name the dataset, record
  and field;
* `files` — jsonl (gzip told by content), parquet and whole JSON documents (zipped or not);
* `demo` — `write_demo_dataset`: the demo set of invented facts (`sieverag demo`).
* `dataset_fields` — the `dataset`, `dataset_format` and `limit` settings fields every command
  that reads a dataset declares alike.
* `odd_passages` — `odd_passages_line`: the one line every such command prints counting the
  empty, blank, duplicated and over-long passages, and what it does with them
  (`PassageHandling`).

It imports only the shared base (`inference.types`, `inference.errors`); retrieval,
evaluation, data_gen and training import it (tests/test_layers.py keeps it so).
"""

from sieverag.inference.data.files import iter_jsonl
from sieverag.inference.data.formats import (
    DATASET_FORMATS,
    DatasetFormat,
    register_format,
    register_record_format,
)
from sieverag.inference.data.loading import detect_format, example_source, load_examples
from sieverag.inference.data.odd_passages import PassageHandling, odd_passages_line
from sieverag.inference.data.readers import load_squad_corpus, load_squad_paragraphs
from sieverag.inference.data.sources import dataset_fingerprint, dataset_identity, open_dataset

__all__ = ["DATASET_FORMATS", "DatasetFormat", "PassageHandling", "dataset_fingerprint",
           "dataset_identity", "detect_format", "example_source", "iter_jsonl", "load_examples",
           "load_squad_corpus", "load_squad_paragraphs", "odd_passages_line", "open_dataset",
           "register_format", "register_record_format"]
