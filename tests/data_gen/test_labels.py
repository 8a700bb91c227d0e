"""Label policy, agreement with gold, the labelling run and the dataset builder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_reply

from sieverag.cli import main
from sieverag.data_gen.cli import BuildDatasetCommand, LabelCommand
from sieverag.data_gen.dataset import (
    DatasetConfig,
    build_dataset,
    split_of,
    split_questions,
)
from sieverag.data_gen.label_records import ChunkLabels, LabelRecord, read_labels
from sieverag.data_gen.labelling import (
    CONFIG_FILE,
    LABELS_FILE,
    SUMMARY_FILE,
    LabelRunConfig,
    run_labelling,
)
from sieverag.data_gen.labels import ChunkSignals, LabelPolicy, gold_agreement, label_chunk
from sieverag.data_gen.teacher import TeacherConfig
from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.io_utils import JsonlLog
from sieverag.inference.core.settings import parse_settings
from sieverag.inference.filters.filter_format import parse_sentence_answer


def entry(*, strinc=False, cxmi=None, teacher=None, gold=None, sentences=3,
          sentence_strinc=(), sentence_cxmi=None, teacher_keys=(), gold_sentences=None,
          status="valid") -> dict:
    """A chunk entry as `labels.jsonl` holds it."""
    return {
        "id": "c", "title": "T", "text": "x", "sentences": [f"s{i}." for i in range(sentences)],
        "sentences_given": True, "gold": gold, "gold_sentences": gold_sentences,
        "strinc": strinc, "sentence_strinc": [i in sentence_strinc for i in range(sentences)],
        "cxmi": None if cxmi is None else cxmi_entry(cxmi),
        "sentence_cxmi": None if sentence_cxmi is None else [cxmi_entry(s) for s in sentence_cxmi],
        "teacher": None if teacher is None else {
            "status": status, "relevant": teacher if status == "valid" else None,
            "key_sentences": list(teacher_keys), "reply": "{}",
            "error": "" if status == "valid" else "broken", "attempts": 1},
    }


def cxmi_entry(score: float) -> dict:
    return {"score": score, "alias": "a", "logprob_with": -1.0, "logprob_without": -1.0 - score}


def question_entry(chunks: list[dict], number: int = 0) -> dict:
    """A question record as `labels.jsonl` holds it."""
    return {"question_id": f"q{number}", "source": "hotpotqa", "question": f"Q{number}?",
            "answers": ["a"], "no_context_logprobs": None, "chunks": chunks}


DEFAULT_POLICY = LabelPolicy()


def decide(policy: LabelPolicy = DEFAULT_POLICY, **signals):
    return label_chunk(ChunkSignals.from_entry(ChunkLabels.model_validate(entry(**signals))),
                       policy)


def test_default_chunk_rule_needs_the_teacher_and_an_automatic_signal() -> None:
    assert decide(teacher=True, strinc=True).relevant is True
    assert decide(teacher=True, cxmi=7.0).relevant is True
    assert decide(teacher=True, cxmi=5.5).relevant is False  # CXMI under the 6.0 bar
    assert decide(teacher=False, strinc=True).relevant is False
    # no (valid) teacher verdict: the automatic rule decides
    assert decide(strinc=True).relevant is True
    assert decide(teacher=True, status="invalid", strinc=False).relevant is False


def test_other_chunk_rules_and_thresholds() -> None:
    assert decide(LabelPolicy(chunk_rule="teacher"), teacher=True).relevant is True
    assert decide(LabelPolicy(chunk_rule="strinc"), strinc=False, cxmi=9.0).relevant is False
    assert decide(LabelPolicy(chunk_rule="auto", chunk_cxmi_threshold=0.2), cxmi=0.5).relevant
    with pytest.raises(ConfigError, match="needs CXMI"):
        decide(LabelPolicy(chunk_rule="cxmi"), strinc=True)
    with pytest.raises(ConfigError):
        LabelPolicy(chunk_rule="majority")  # type: ignore[arg-type]


def test_sentence_rules() -> None:
    label = decide(teacher=True, strinc=True, sentence_strinc=(2,), teacher_keys=(0,))
    assert label.key_sentences == (0, 2)  # teacher's picks plus the answer-bearing sentence
    assert decide(LabelPolicy(sentence_rule="auto", sentence_cxmi_threshold=0.0),
                  sentence_cxmi=[-1.0, 0.5, 0.0]).key_sentences == (1,)
    assert decide(LabelPolicy(sentence_rule="teacher"), teacher=True,
                  sentence_strinc=(2,), teacher_keys=(1,)).key_sentences == (1,)


def test_gold_prefer_decides_and_disagreements_are_kept() -> None:
    label = decide(gold=False, teacher=True, strinc=True, gold_sentences=[],
                   sentence_strinc=(1,))
    assert label.relevant is False and label.key_sentences == ()
    assert set(label.chunk_disagree) == {"strinc", "teacher"}
    assert "strinc" in label.sentence_disagree
    ignored = decide(LabelPolicy(gold="ignore"), gold=False, strinc=True)
    assert ignored.relevant is True and ignored.chunk_disagree == ("gold",)
    only = decide(LabelPolicy(gold="only"), strinc=True)
    assert only.relevant is None and only.key_sentences is None


def test_gold_agreement_pools_counts_per_signal() -> None:
    question = LabelRecord.model_validate(question_entry([
        entry(gold=True, strinc=True, cxmi=6.5, gold_sentences=[0], sentence_strinc=(0, 1)),
        entry(gold=True, strinc=False, cxmi=0.0, gold_sentences=[2]),
        entry(gold=False, strinc=True, cxmi=7.0, gold_sentences=[]),
        entry(gold=False, strinc=False, cxmi=-1.0, gold_sentences=[]),
    ]))
    report = gold_agreement([question])
    assert report["chunk"]["strinc"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "items": 4,
                                         "gold_positive": 2, "predicted_positive": 2}
    assert report["chunk"]["cxmi"]["precision"] == 0.5
    assert "teacher" not in report["chunk"]
    sentence = report["sentence"]["strinc"]
    assert (sentence["precision"], sentence["recall"], sentence["items"]) == (0.5, 0.5, 12)


def labelled_question(number: int, relevant: int = 2, irrelevant: int = 6) -> dict:
    chunks = ([entry(strinc=True, gold=True, sentence_strinc=(1,), gold_sentences=[1])
               for _ in range(relevant)]
              + [entry(gold=False, gold_sentences=[]) for _ in range(irrelevant)])
    for index, chunk in enumerate(chunks):
        chunk["id"] = f"q{number}/{index}"
    return question_entry(chunks, number)


def write_labels(folder: Path, questions: list[dict]) -> None:
    folder.mkdir(parents=True)
    (folder / LABELS_FILE).write_text("".join(json.dumps(q) + "\n" for q in questions))


def test_a_label_record_is_read_back_unchanged(tmp_path: Path) -> None:
    question = question_entry([
        entry(strinc=True, cxmi=2.5, sentence_cxmi=[0.1, 3.0, -0.2], teacher=True,
              teacher_keys=(1,), gold=True, gold_sentences=[1], sentence_strinc=(1,)),
        entry(teacher=False, status="invalid")])
    record = LabelRecord.model_validate(question)
    JsonlLog(tmp_path / LABELS_FILE).append(record.to_json())
    (read,) = read_labels(tmp_path / LABELS_FILE)
    assert read == record and read.to_json() == question
    assert (tmp_path / LABELS_FILE).read_text() == json.dumps(question) + "\n"


def test_a_renamed_or_missing_label_key_names_the_line_and_key(tmp_path: Path) -> None:
    good = labelled_question(0)
    renamed = labelled_question(1)
    renamed["chunks"][0]["str_inc"] = renamed["chunks"][0].pop("strinc")
    missing = labelled_question(2)
    del missing["source"]
    write_labels(tmp_path / "labels", [good, renamed, missing])
    path = tmp_path / "labels" / LABELS_FILE
    expected = (rf"{path}, line 2: not a valid LabelRecord \(chunks\.0\.strinc: missing key; "
                r"chunks\.0\.str_inc: unknown key\)")
    with pytest.raises(DatasetError, match=expected):
        read_labels(path)
    # build-dataset reads label folders the same way (before any tokenizer is loaded).
    with pytest.raises(DatasetError, match=expected):
        build_dataset(DatasetConfig(labels=(str(tmp_path / "labels"),), out=str(tmp_path / "d")),
                      progress=False)
    write_labels(tmp_path / "other", [good, missing])
    with pytest.raises(DatasetError, match=r"line 2: not a valid LabelRecord \(source: missing"):
        read_labels(tmp_path / "other" / LABELS_FILE)


def test_build_dataset_splits_by_question_balances_and_mixes(tmp_path: Path,
                                                             tiny_model_dir: Path) -> None:
    write_labels(tmp_path / "labels", [labelled_question(i) for i in range(30)])
    out = tmp_path / "dataset"
    config = DatasetConfig(labels=(str(tmp_path / "labels"),), out=str(out),
                           validation_fraction=0.3, tokenizer=str(tiny_model_dir))
    summary = build_dataset(config, progress=False)
    records = {split: [json.loads(line) for line in (out / f"{split}.jsonl").open()]
               for split in ("train", "validation")}
    train_ids = {r["question_id"] for r in records["train"]}
    validation_ids = {r["question_id"] for r in records["validation"]}
    assert train_ids and validation_ids and not train_ids & validation_ids
    assert set((out / "validation_ids.txt").read_text().split()) == validation_ids
    assert set((out / "train_ids.txt").read_text().split()) == train_ids
    assert summary.questions == {"train": len(train_ids), "validation": len(validation_ids)}
    for split, rows in records.items():
        chunk = [r for r in rows if r["task"] == "chunk"]
        positives = sum(r["completion"][0]["content"] == "Yes" for r in chunk)
        assert positives * 2 == len(chunk)  # balanced to 0.5 from 2 of 8
        sentences = [r for r in rows if r["task"] == "sentence"]
        assert len(sentences) == 2 * len({r["question_id"] for r in rows})
        assert all(parse_sentence_answer(r["completion"][0]["content"], 3) == [1]
                   for r in sentences)
        assert summary.chunk_positive_fraction[split] == 0.5
    assert summary.token_lengths["chunk"]["count"] == sum(
        summary.counts[s]["chunk"] for s in ("train", "validation"))
    assert 30 < summary.token_lengths["chunk"]["mean"] < 80  # templated prompt + "Yes"/"No"
    stats = json.loads((out / "stats.json").read_text())
    assert stats["counts"] == summary.counts and stats["policy"]["gold"] == "prefer"

    from datasets import load_from_disk

    saved = load_from_disk(str(out / "dataset"))
    assert saved["train"].num_rows == len(records["train"])
    assert saved["train"][0]["prompt"][0]["role"] == "system"

    mixed = build_dataset(DatasetConfig(labels=config.labels, out=str(out), mix={"chunk": 3,
                                        "sentence": 1}, tokenizer=str(tiny_model_dir),
                                        validation_fraction=0.0), progress=False)
    assert mixed.counts["train"]["chunk"] == 3 * mixed.counts["train"]["sentence"]


def test_a_small_set_keeps_a_question_in_each_split() -> None:
    """The hash split holds out no question of a small set (the README's two-question
    sample): the one placed lowest is held out; one placed highest is trained on when all
    were held out; a single question, or no validation share, trains on everything."""
    ids = [f"q{i}" for i in range(40)]
    assert split_questions(ids, 0.5, 0) == {i: split_of(i, 0.5, 0) for i in ids}
    two = [i for i in ids if split_of(i, 0.1, 0) == "train"][:2]
    assert sorted(split_questions(two, 0.1, 0).values()) == ["train", "validation"]
    assert sorted(split_questions(two, 0.999, 0).values()) == ["train", "validation"]
    assert split_questions(two[:1], 0.1, 0) == {two[0]: "train"}
    assert set(split_questions(two, 0.0, 0).values()) == {"train"}


def test_an_empty_validation_split_loads_with_its_columns(tmp_path: Path,
                                                          tiny_model_dir: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    from datasets import load_from_disk

    write_labels(tmp_path / "labels", [labelled_question(0)])
    out = tmp_path / "dataset"
    assert main(["build-dataset", "--labels", str(tmp_path / "labels"), "--out", str(out),
                 "--tokenizer", str(tiny_model_dir), "--quiet"]) == 0
    assert "note: the validation split is empty (0 question(s) held out)" in \
        capsys.readouterr().out
    saved = load_from_disk(str(out / "dataset"))
    assert saved["validation"].num_rows == 0 and saved["train"].num_rows > 0
    assert saved["validation"].column_names == saved["train"].column_names


def test_no_training_records_is_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    write_labels(tmp_path / "labels", [labelled_question(0, relevant=0, irrelevant=2)])
    config = DatasetConfig(labels=(str(tmp_path / "labels"),), out=str(tmp_path / "dataset"),
                           mix={"sentence": 1.0}, tokenizer=str(tiny_model_dir))
    with pytest.raises(DatasetError, match="no training records built from .*: the label "
                                           "policy, --chunk-positive-fraction or --mix"):
        build_dataset(config, progress=False)
    assert not (tmp_path / "dataset").exists()


def test_split_is_stable_and_mix_validates() -> None:
    assert split_of("abc", 0.5, 0) == split_of("abc", 0.5, 0)
    assert {split_of(f"q{i}", 0.0, 0) for i in range(50)} == {"train"}
    with pytest.raises(ConfigError, match="mix.chunk"):
        parse_settings(BuildDatasetCommand, ["--labels", "x", "--out", "y", "--mix",
                                             "chunk=lots"], "sieverag build-dataset")
    with pytest.raises(ConfigError):
        DatasetConfig(labels=("x",), out="y", mix={"summary": 1.0})
    assert DatasetConfig(labels=("x",), out="y", chunk_positive_fraction=0) \
        .chunk_positive_fraction is None


def test_build_dataset_command_reads_its_flags(tmp_path: Path, tiny_model_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    command = parse_settings(BuildDatasetCommand, [
        "--labels", "a,b", "--out", "o", "--mix", "chunk=0.5,sentence=0.5",
        "--policy.gold", "ignore", "--chunk-positive-fraction", "0"], "sieverag build-dataset")
    assert command.labels == ("a", "b") and command.mix == {"chunk": 0.5, "sentence": 0.5}
    assert command.policy.gold == "ignore" and command.chunk_positive_fraction is None

    write_labels(tmp_path / "labels", [labelled_question(i) for i in range(4)])
    out = tmp_path / "dataset"
    assert main(["build-dataset", "--labels", str(tmp_path / "labels"), "--out", str(out),
                 "--mix", "chunk=1,sentence=0", "--chunk-positive-fraction", "0",
                 "--validation-fraction", "0", "--policy.chunk-rule", "strinc",
                 "--tokenizer", str(tiny_model_dir), "--quiet"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["counts"]["train"]["chunk"] == 32  # every chunk kept: no balancing
    assert stats["counts"]["train"].get("sentence", 0) == 0
    assert stats["policy"]["chunk_rule"] == "strinc"
    assert "train: " in capsys.readouterr().out and stats["chunk_positive_fraction"]["train"] \
        == 0.25


def teacher_reply(request: RecordedRequest) -> Reply:
    user = request.json["messages"][1]["content"]
    relevant = "Vienna" in user
    return Reply(body=chat_reply(json.dumps({"relevant": relevant,
                                             "key_sentences": [1] if relevant else []})))


def write_dataset(path: Path) -> Path:
    """Three copies of one question, each with a gold chunk and a distractor (common format)."""
    rows = [{"id": f"q{i}", "question": "Where was Lise Meitner born?", "answers": ["Vienna"],
             "ctxs": [{"title": "Meitner", "text": "She was born in Vienna. She studied physics.",
                       "is_gold": True},
                      {"title": "Danube", "text": "The Danube is long.", "is_gold": False}]}
            for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_label_run_records_every_signal_and_resumes(tmp_path: Path, tiny_model_dir: Path) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl")
    out = tmp_path / "labels"
    with FakeOpenAIServer(teacher_reply) as server:
        config = LabelRunConfig(dataset=str(dataset), out=str(out), scorer=str(tiny_model_dir),
                                device="cpu", teacher=TeacherConfig(endpoint=server.base_url,
                                                                    model="t"))
        summary = run_labelling(config, progress=False)
        assert summary.questions_labelled == 3 and summary.chunks_labelled == 6
        again = run_labelling(config, progress=False)
        assert again.questions_labelled == 0 and again.questions_done_before == 3
        assert len(server.requests) == 6
    record = json.loads((out / LABELS_FILE).read_text().splitlines()[0])
    first, second = record["chunks"]
    assert record["source"] == "common" and record["answers"] == ["Vienna"]
    assert first["sentences"] == ["She was born in Vienna.", "She studied physics."]
    assert first["sentences_given"] is False
    assert (first["strinc"], second["strinc"]) == (True, False)
    assert first["sentence_strinc"] == [True, False]
    assert (first["gold"], second["gold"]) == (True, False)
    assert set(first["cxmi"]) == {"score", "alias", "logprob_with", "logprob_without"}
    assert len(first["sentence_cxmi"]) == 2
    assert first["teacher"]["relevant"] is True and first["teacher"]["key_sentences"] == [0]
    assert set(record["no_context_logprobs"]) == {"Vienna"}
    stored = json.loads((out / SUMMARY_FILE).read_text())
    assert stored["gold_agreement"]["chunk"]["strinc"]["precision"] == 1.0
    assert stored["gold_agreement"]["chunk"]["teacher"]["recall"] == 1.0
    with pytest.raises(ConfigError, match="cxmi_level"):
        run_labelling(LabelRunConfig(dataset=str(dataset), out=str(out), cxmi_level="chunk",
                                     scorer=str(tiny_model_dir)), progress=False)


def test_label_command_reads_teacher_section_and_scorer_none() -> None:
    command = parse_settings(LabelCommand, [
        "--dataset", "d.jsonl", "--out", "o", "--scorer", "none", "--teacher.endpoint",
        "http://h/v1", "--teacher.model", "m", "--teacher.max-concurrency", "2"],
        "sieverag label")
    assert command.scorer is None and command.teacher == TeacherConfig(
        endpoint="http://h/v1", model="m", max_concurrency=2)
    assert parse_settings(LabelCommand, ["--dataset", "d", "--out", "o"], "sieverag label") \
        .teacher is None
    with pytest.raises(ConfigError, match="teacher.model"):
        parse_settings(LabelCommand, ["--dataset", "d", "--out", "o", "--teacher.endpoint",
                                      "http://h/v1"], "sieverag label")


def test_label_command_config_file_gives_defaults_and_flags_override(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl")
    out = tmp_path / "labels"
    config = tmp_path / "label.yaml"
    config.write_text(f"dataset: {dataset}\nout: {out}\nscorer: none\nmax_documents: 1\n"
                      "seed: 3\nquiet: true\n")
    assert main(["label", "--config", str(config), "--max-documents", "2"]) == 0
    settings = json.loads((out / CONFIG_FILE).read_text())
    assert (settings["scorer"], settings["seed"], settings["max_documents"]) == (None, 3, 2)
    assert json.loads((out / SUMMARY_FILE).read_text())["questions_total"] == 3
    assert "labelled 3 question(s) now, 0 before; 3 in all" in capsys.readouterr().out
    record = json.loads((out / LABELS_FILE).read_text().splitlines()[0])
    assert len(record["chunks"]) == 2 and record["chunks"][0]["cxmi"] is None

    config.write_text(f"dataset: {dataset}\nout: {out}\nscorr: none\n")
    assert main(["label", "--config", str(config)]) == 2
    assert "scorr: unknown setting" in capsys.readouterr().err


def test_label_command_refuses_a_bad_teacher_url_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "labels"
    assert main(["label", "--dataset", str(write_dataset(tmp_path / "data.jsonl")), "--out",
                 str(out), "--scorer", "none", "--teacher.endpoint", "host:8000",
                 "--teacher.model", "m"]) == 2
    assert "base_url must start with http://" in capsys.readouterr().err
    assert not out.exists()
