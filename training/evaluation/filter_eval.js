// The questions of eval-filter's report.html (training/evaluation/filter_eval_html.py writes the data):
// each question's passages ranked by every selector, gold marked, and the questions where one
// row lost to another (one click: the default against dense top-k). Needs page.js.
"use strict";

const DATA = pageData();

function ranking(question, row) {
  const kept = new Set(row.kept);
  const gold = new Set(question.gold);
  const ids = question.docs.map(d => d[0]);
  // Ranked by the row's score where it has one, else its kept passages first, in its order.
  const order = row.scores ? ids.slice().sort((a, b) => (row.scores[b] ?? -Infinity) - (row.scores[a] ?? -Infinity))
    : [...row.kept, ...ids.filter(id => !kept.has(id))];
  return order.map((id, rank) => el("span", {class: `chip ${kept.has(id) ? "good" : ""}`, "data-doc": id,
      title: row.scores && row.scores[id] !== undefined ? `score ${fmt(row.scores[id])}` : null},
    `#${rank + 1} ${kept.has(id) ? "✓" : "✗"} `, gold.has(id) ? el("span", {class: "gold"}, "★ ") : null, id));
}

function questionCard(index) {
  const q = DATA.questions[index];
  const rows = DATA.methods.filter(m => q.rows[m]).map(m => el("tr", {"data-method": m},
    el("td", {}, m), el("td", {class: "num"}, fmt(q.rows[m].f1, 2)), el("td", {}, ranking(q, q.rows[m]))));
  const texts = el("details", {}, el("summary", {}, "the passages"),
    q.docs.map(([id, title, text]) => el("div", {class: `passage ${q.gold.includes(id) ? "kept" : ""}`},
      el("div", {}, q.gold.includes(id) ? el("span", {class: "gold"}, "★ gold ") : null, el("code", {}, id),
        title ? ` — ${title}` : ""), el("div", {class: "ptext"}, text))));
  return el("section", {class: "question", "data-id": q.id},
    el("header", {}, el("span", {class: "qid"}, q.id), el("span", {class: "chip"}, q.dataset)),
    el("div", {class: "qtext"}, q.question),
    el("div", {}, el("span", {class: "muted"}, "gold answers: "), q.answers.join(" | ") || "–"),
    el("table", {}, el("thead", {}, el("tr", {}, ["row", "F1", "passages, best first (✓ kept, ★ gold)"]
      .map(h => el("th", {}, h)))), el("tbody", {}, rows)),
    texts);
}

const controls = document.getElementById("controls");
const dataset = el("select", {id: "dataset"}, el("option", {value: ""}, "every dataset"),
  DATA.datasets.map(name => el("option", {value: name}, name)));
const lost = el("input", {type: "checkbox", id: "lost"});
const rowA = el("select", {id: "row-a"}, DATA.methods.map(m => el("option", {value: m, selected: m === DATA.default}, m)));
const rowB = el("select", {id: "row-b"}, DATA.methods.map(m => el("option", {value: m, selected: m === DATA.dense}, m)));
const oneClick = el("button", {type: "button", id: "default-lost-to-dense",
  text: `where did the default lose to ${DATA.dense || "dense"}?`});
const search = el("input", {type: "search", id: "search", placeholder: "search id or question"});
controls.append(dataset, el("label", {}, lost, " only where "), rowA, " lost to ", rowB, oneClick, search);
const pager = new Pager(document.getElementById("questions"), controls, questionCard, DATA.page_size);

function matching() {
  const needle = search.value.trim().toLowerCase();
  const kept = [];
  DATA.questions.forEach((q, i) => {
    if (dataset.value && q.dataset !== dataset.value) return;
    if (lost.checked) {
      const a = q.rows[rowA.value], b = q.rows[rowB.value];
      if (!a || !b || a.f1 === null || b.f1 === null || !(a.f1 < b.f1)) return;
    }
    if (needle && !(q.id + "\n" + q.question).toLowerCase().includes(needle)) return;
    kept.push(i);
  });
  return kept;
}

const update = () => pager.setItems(matching());
oneClick.addEventListener("click", () => {
  if (DATA.default) rowA.value = DATA.default;
  if (DATA.dense) rowB.value = DATA.dense;
  lost.checked = true;
  update();
});
for (const input of [dataset, lost, rowA, rowB]) input.addEventListener("change", update);
search.addEventListener("input", update);
update();
