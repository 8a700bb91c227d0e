// The questions of a run's report.html (inference/eval/html_report.py writes the data): a page of
// questions at a time, each with every pipeline's answer; what a pipeline read and kept is built
// when its details are opened. Needs page.js (pageData, el, fmt, highlighted, Pager).
"use strict";

const DATA = pageData();
const PIPELINES = DATA.pipelines;

const label = key => key.replace(/_/g, " ");
const shellWord = word => /^[\w@%+=:,./-]+$/.test(word) ? word : "'" + word.replace(/'/g, "'\\''") + "'";

function isPassage(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value) &&
    typeof value.id === "string" && typeof value.kept === "boolean" && typeof value.score === "number";
}

// Fields of a passage shown in its heading, or not at all; every other field is a chip.
const PASSAGE_HEADING = new Set(["id", "title", "score", "kept", "is_gold", "hl", "key_sentences"]);

function passage(entry, docs) {
  const [title, text] = docs[entry.id] || [entry.title || "", null];
  const chips = Object.entries(entry).filter(([key]) => !PASSAGE_HEADING.has(key))
    .map(([key, value]) => el("span", {class: "chip"}, `${label(key)} ${Array.isArray(value) ? value.join(", ") : fmt(value)}`));
  if (entry.key_sentences) chips.push(el("span", {class: "chip"}, `key sentences ${entry.key_sentences.map(k => k + 1).join(", ") || "none"}`));
  return el("div", {class: `passage ${entry.kept ? "kept" : "dropped"}`, "data-doc": entry.id},
    el("div", {},
      el("strong", {}, entry.kept ? "✓ kept" : "✗ dropped"), ` score ${fmt(entry.score)} `,
      entry.is_gold ? el("span", {class: "gold"}, "★ gold ") : null,
      el("code", {}, entry.id), title ? ` — ${title}` : ""),
    chips.length ? el("div", {}, chips) : null,
    text === null ? el("div", {class: "ptext muted"}, "(text not found: see the note at the top)")
      : el("div", {class: "ptext", "data-doc": entry.id}, highlighted(text, entry.hl)));
}

// A value of a record or its trace, labelled, walked field by field: lists of passages as
// passages, lists of objects (rounds) one block each, objects as nested fields.
function field(key, value, docs) {
  if (Array.isArray(value)) {
    if (value.length && value.every(isPassage)) {
      return el("div", {class: "trace-field"}, el("div", {class: "label"}, `${label(key)} (${value.length})`),
        value.map(p => passage(p, docs)));
    }
    if (value.length && value.every(v => v !== null && typeof v === "object" && !Array.isArray(v))) {
      return el("div", {class: "trace-field"}, value.map((item, i) => el("div", {class: "round"},
        el("div", {class: "label"}, el("strong", {}, `${label(key)} ${i + 1}`)), fields(item, docs))));
    }
    return el("div", {class: "trace-field"}, el("span", {class: "label"}, `${label(key)}: `),
      value.length ? value.map(v => fmt(v)).join(" · ") : "(none)");
  }
  if (value !== null && typeof value === "object") {
    return el("div", {class: "trace-field"}, el("div", {class: "label"}, label(key)),
      el("div", {style: "margin-left: 14px"}, fields(value, docs)));
  }
  return el("div", {class: "trace-field"}, el("span", {class: "label"}, `${label(key)}: `), fmt(value));
}

function fields(object, docs) {
  return Object.entries(object).map(([key, value]) => field(key, value, docs));
}

function usageTable(usage) {
  const rows = Object.entries(usage || {}).map(([agent, u]) => el("tr", {},
    el("td", {}, agent), ...["calls", "prompt_tokens", "completion_tokens", "seconds"]
      .map(key => el("td", {class: "num"}, fmt(u[key], 2)))));
  return rows.length ? el("table", {class: "usage"},
    el("thead", {}, el("tr", {}, ["agent", "calls", "prompt tokens", "completion tokens", "seconds"]
      .map(h => el("th", {}, h)))), el("tbody", {}, rows)) : null;
}

// What the pipeline read and kept: built the first time its details open.
function readAndKept(view, docs) {
  const {prediction, raw_prediction, metrics, flags, usage, trace, filter, trust, ...rest} = view;
  const parts = [];
  if (filter) parts.push(field("filter", filter, docs));
  if (trace) parts.push(el("h3", {}, "trace"), ...fields(trace, docs));
  const read = rest.documents_read || [];
  parts.push(el("div", {class: "trace-field"}, el("span", {class: "label"}, "documents read: "),
    read.length ? read.join(", ") : "(none)"));
  if (rest.hygiene_removed) parts.push(field("hygiene removed", rest.hygiene_removed, docs));
  if (trust) {
    parts.push(el("div", {class: "trace-field"}, el("span", {class: "label"}, "trust: "),
      Object.entries(trust).map(([key, value]) => value !== null && typeof value === "object"
        ? field(key, value, docs) : el("span", {class: "chip"}, `${label(key)} ${fmt(value)}`))));
  }
  parts.push(el("h3", {}, "tokens and seconds by agent"), usageTable(usage));
  return parts;
}

function answerCard(name, view, question) {
  if (view === null) {
    return el("div", {class: "answer", "data-pipeline": name}, el("div", {class: "name"}, name),
      el("div", {class: "muted"}, "(not answered yet)"));
  }
  const m = view.metrics || {};
  const metricChips = Object.entries(m).map(([key, value]) => el("span", {class: "chip"}, `${key} ${fmt(value, 2)}`));
  const flagChips = [view.flags.wrong ? el("span", {class: "chip bad"}, "wrong") : el("span", {class: "chip good"}, "right"),
    view.flags.gold_dropped ? el("span", {class: "chip bad flag-gold-dropped"}, "gold dropped") : null];
  const details = el("details", {class: "read"}, el("summary", {}, "what it read, kept and answered"));
  details.addEventListener("toggle", () => {
    if (details.open && details.children.length === 1) details.append(...readAndKept(view, question.docs));
  }, {once: false});
  const command = ["sieverag", "trace", DATA.run_dir, question.id, "--pipeline", name].map(shellWord).join(" ");
  return el("div", {class: `answer ${view.flags.wrong ? "wrong" : "right"}`, "data-pipeline": name},
    el("div", {class: "name"}, name, " ", flagChips),
    el("div", {class: "pred"}, view.prediction || "(empty)"),
    view.raw_prediction !== undefined ? el("div", {class: "muted"}, `raw reply: ${view.raw_prediction}`) : null,
    el("div", {}, metricChips),
    el("div", {class: "muted"}, `${fmt(view.llm_calls)} LLM calls · ${fmt(view.input_tokens)} input tokens ` +
      `(${fmt(view.generator_input_tokens)} to the generator) · ${fmt(view.seconds, 2)} s`),
    el("div", {}, el("code", {class: "trace-command"}, command)),
    details);
}

function questionCard(index) {
  const q = DATA.questions[index];
  return el("section", {class: "question", "data-id": q.id},
    el("header", {}, el("span", {class: "qid"}, q.id), q.kind ? el("span", {class: "chip"}, q.kind) : null,
      q.differ ? el("span", {class: "chip"}, "answers differ") : null),
    el("div", {class: "qtext"}, q.question),
    el("div", {}, el("span", {class: "muted"}, "gold: "), q.answers.length ? q.answers.join(" | ") : "–"),
    q.reference ? el("div", {}, el("span", {class: "muted"}, "reference: "), q.reference) : null,
    el("div", {class: "answers"}, PIPELINES.map(name => answerCard(name, DATA.answers[name][index], q))));
}

// ----- finding questions -----

const controls = document.getElementById("controls");
const search = el("input", {type: "search", id: "search", placeholder: "search id, question, gold, answers"});
const show = el("select", {id: "show"},
  el("option", {value: "all"}, "all questions"),
  el("option", {value: "differ"}, "answered differently"),
  el("option", {value: "wrong"}, "got wrong by"),
  el("option", {value: "gold_dropped"}, "gold dropped by"));
const by = el("select", {id: "by"}, el("option", {value: ""}, "any pipeline"),
  PIPELINES.map(name => el("option", {value: name}, name)));
const size = el("select", {id: "page-size"}, [10, 20, 50, 100].map(n =>
  el("option", {value: n, selected: n === DATA.page_size}, `${n} a page`)));
controls.append(search, show, by, size);
const pager = new Pager(document.getElementById("questions"), controls, questionCard, DATA.page_size);

let haystacks = null;
function haystack(index) {
  if (haystacks === null) {
    haystacks = DATA.questions.map((q, i) => [q.id, q.question, ...q.answers,
      ...PIPELINES.map(name => (DATA.answers[name][i] || {}).prediction || "")].join("\n").toLowerCase());
  }
  return haystacks[index];
}

function flagged(index, flag) {
  const names = by.value ? [by.value] : PIPELINES;
  return names.some(name => { const view = DATA.answers[name][index]; return view !== null && view.flags[flag]; });
}

function matching() {
  const needle = search.value.trim().toLowerCase();
  const kept = [];
  for (let i = 0; i < DATA.questions.length; i++) {
    if (show.value === "differ" && !DATA.questions[i].differ) continue;
    if ((show.value === "wrong" || show.value === "gold_dropped") && !flagged(i, show.value)) continue;
    if (needle && !haystack(i).includes(needle)) continue;
    kept.push(i);
  }
  return kept;
}

const update = () => pager.setItems(matching());
search.addEventListener("input", update);
for (const select of [show, by]) select.addEventListener("change", update);
size.addEventListener("change", () => pager.setSize(Number(size.value)));
update();
