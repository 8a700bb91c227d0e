"""The demo set: questions about invented facts, each with one relevant and several noisy
documents, written in the common `{id, question, answers, ctxs}` jsonl format.

The facts are invented so no model knows them: `direct` cannot answer, and a pipeline that
reads the relevant document can. Noisy documents state the same kind of fact about other
invented entities (hard distractors) or are off-topic. Generation is deterministic per seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from sieverag.inference.core.io_utils import write_atomic

FIRST = ["Mara", "Tobin", "Elsa", "Quentin", "Ilse", "Rafael", "Nadia", "Oskar", "Liora",
         "Casimir", "Wren", "Anselm", "Petra", "Dorian", "Yusra", "Fenn"]
LAST = ["Quill", "Varga", "Holloway", "Brandt", "Okafor", "Lindqvist", "Moreau", "Castell",
        "Ivers", "Tamsin", "Petrov", "Aldane", "Whitcombe", "Sorel", "Kestrel", "Navarre"]
TOWNS = ["Grellford", "Ostmere", "Pallwick", "Dunharrow", "Selvane", "Brackenby", "Tirmouth",
         "Korvath", "Elmstead", "Vantry", "Quorrin", "Ashgrove", "Mirrowdale", "Feldspar"]
THINGS = ["Veltran", "Osprey", "Calder", "Myrrin", "Halvard", "Thessaly", "Brimstone",
          "Lantern", "Corvel", "Ambrose", "Zephyr", "Greywater", "Solenne", "Harrow"]
PRODUCTS = ["ceramic valves", "sailcloth", "pocket telescopes", "clockwork toys",
            "glass lenses", "copper kettles", "wool blankets", "rope bridges"]
OFF_TOPIC = [
    "Sourdough bread rises because wild yeast and lactic acid bacteria ferment the dough, "
    "producing carbon dioxide and the sour taste.",
    "A haiku is a short poem of three lines with five, seven and five syllables.",
    "Penguins huddle together in winter to share warmth against the Antarctic wind.",
    "Chess openings such as the Sicilian Defence have been studied for centuries.",
    "Terracotta pots let water evaporate through their walls, cooling the soil inside.",
]


@dataclass(frozen=True)
class FactTemplate:
    """How to state one kind of fact, and how to ask about it."""

    fact: str
    question: str
    filler: str


TEMPLATES = [
    FactTemplate("{person} was born in {town} in {year}.",
                 "In which town was {person} born?", "{person} later worked as a cartographer."),
    FactTemplate("The {thing} Bridge was completed in {year} by engineer {person}.",
                 "In what year was the {thing} Bridge completed?",
                 "It carries a road over a narrow river gorge."),
    FactTemplate("{thing} Works, a maker of {product}, was founded by {person}.",
                 "Who founded {thing} Works?", "The company still exports to three countries."),
    FactTemplate("The capital of the island of {thing} is {town}.",
                 "What is the capital of the island of {thing}?",
                 "The island is known for its basalt cliffs."),
    FactTemplate("The opera The {thing} Lantern was composed by {person} in {year}.",
                 "Who composed the opera The {thing} Lantern?",
                 "It premiered to a small audience."),
    FactTemplate("{person} discovered the {thing} comet from an observatory in {town}.",
                 "Who discovered the {thing} comet?",
                 "The comet returns roughly every seventy years."),
]
ANSWER_FIELD = {0: "town", 1: "year", 2: "person", 3: "town", 4: "person", 5: "person"}


def _entity(rng: random.Random) -> dict[str, str]:
    return {"person": f"{rng.choice(FIRST)} {rng.choice(LAST)}", "town": rng.choice(TOWNS),
            "thing": rng.choice(THINGS), "year": str(rng.randint(1801, 1979)),
            "product": rng.choice(PRODUCTS)}


def build_demo_examples(per_template: int = 6, noisy: int = 3, seed: int = 13) -> list[dict]:
    """Demo records: one relevant document, `noisy` same-kind distractors, one off-topic."""
    rng = random.Random(seed)
    records = []
    for t_index, template in enumerate(TEMPLATES):
        for q_index in range(per_template):
            facts = [_entity(rng) for _ in range(noisy + 1)]
            # Distractors must be about other entities, or the question becomes ambiguous.
            asked = template.question.format(**facts[0])
            facts = [facts[0]] + [f for f in facts[1:] if template.question.format(**f) != asked]
            ctxs = [{"title": "",
                     "text": f"{template.fact.format(**f)} {template.filler.format(**f)}",
                     "isgold": i == 0} for i, f in enumerate(facts)]
            ctxs.append({"title": "", "text": rng.choice(OFF_TOPIC), "isgold": False})
            rng.shuffle(ctxs)
            records.append({"id": f"demo-{t_index}-{q_index}", "question": asked,
                            "answers": [facts[0][ANSWER_FIELD[t_index]]], "ctxs": ctxs})
    return records


def write_demo_dataset(path: str | Path, seed: int = 13, per_template: int = 6) -> Path:
    """Write the demo set as jsonl to `path` (atomically) and return the path."""
    path = Path(path)
    examples = build_demo_examples(per_template=per_template, seed=seed)
    lines = [json.dumps(r, ensure_ascii=False) for r in examples]
    write_atomic(path, "\n".join(lines) + "\n")
    return path


def build_bridge_examples(count: int = 2, noisy: int = 3, seed: int = 13) -> list[dict]:
    """Two-hop demo records: "In which town was the founder of X Works born?" needs the
    company's document (it names the founder: the bridge) and the founder's (it names the
    town). Distractors state the same kinds of fact about other invented entities."""
    rng = random.Random(seed)
    company, birth = TEMPLATES[2], TEMPLATES[0]
    records = []
    for index in range(count):
        facts = [_entity(rng) for _ in range(noisy + 1)]
        things = {f["thing"] for f in facts[1:]} - {facts[0]["thing"]}
        people = {f["person"] for f in facts[1:]} - {facts[0]["person"]}
        facts = [facts[0]] + [f for f in facts[1:] if f["thing"] in things
                              and f["person"] in people]
        ctxs = []
        for i, fact in enumerate(facts):
            ctxs.append({"title": f"{fact['thing']} Works", "isgold": i == 0,
                         "text": f"{company.fact.format(**fact)} {company.filler}"})
            ctxs.append({"title": fact["person"], "isgold": i == 0,
                         "text": f"{birth.fact.format(**fact)} {birth.filler.format(**fact)}"})
        rng.shuffle(ctxs)
        records.append({"id": f"bridge-{index}",
                        "question": f"In which town was the founder of {facts[0]['thing']} "
                                    "Works born?",
                        "answers": [facts[0]["town"]], "ctxs": ctxs})
    return records


def write_bridge_demo(folder: str | Path, seed: int = 13) -> tuple[Path, Path]:
    """Write the two-hop demo questions (`bridge.jsonl`, common format with gold marks) and
    the corpus of all their documents (`bridge-corpus.jsonl`, `{id, title, text}`) into
    `folder`; returns both paths."""
    folder = Path(folder)
    records = build_bridge_examples(seed=seed)
    dataset, corpus = folder / "bridge.jsonl", folder / "bridge-corpus.jsonl"
    write_atomic(dataset, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    documents = [{"id": f"{r['id']}-{i}", "title": c["title"], "text": c["text"]}
                 for r in records for i, c in enumerate(r["ctxs"])]
    write_atomic(corpus, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in documents))
    return dataset, corpus
