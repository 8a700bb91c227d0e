"""Where the benchmarks find their data: the shared data folder of public QA sets
($SIEVERAG_DATA_DIR, else `../shared/data` beside the checkout) and the question sets kept
beside the benchmarks. Every benchmark reads these names, so the rule lives here once."""

from __future__ import annotations

import os
from pathlib import Path

from sieverag.inference.cli.index import DATA_DIR_ENV

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = Path(os.environ.get(DATA_DIR_ENV) or ROOT.parent / "shared" / "data")
HOTPOT = DATA_DIR / "hotpotqa_distractor.jsonl"
NUTRITION_QUESTIONS = ROOT / "tests" / "benchmarks" / "data" / "nutrition_questions.jsonl"
