// The shared script of sieverag's HTML pages (inference/core/html/page.py inlines it): reading the
// embedded data, building elements from text only (never parsing data as HTML), sortable
// tables, kept sentences highlighted at their offsets, and a paged list rendered on demand.
"use strict";

function pageData() {
  return JSON.parse(document.getElementById("page-data").textContent);
}

// An element with attributes (`class`, `data-*`, ...) and children (nodes or text).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") {
    return Number.isInteger(value) ? String(value) : value.toFixed(digits === undefined ? 3 : digits);
  }
  if (typeof value === "boolean") return value ? "yes" : "no";
  return String(value);
}

// `text` with each [start, end) of `spans` (character offsets, as Python counts them: code
// points) in a <mark class="kept-sentence" data-start data-end>.
function highlighted(text, spans) {
  const chars = Array.from(text);  // code points, so offsets match Python's
  const fragment = document.createDocumentFragment();
  let at = 0;
  for (const [start, end] of (spans || []).slice().sort((a, b) => a[0] - b[0])) {
    if (start < at || end > chars.length || end <= start) continue;
    if (start > at) fragment.append(chars.slice(at, start).join(""));
    fragment.append(el("mark", {class: "kept-sentence", "data-start": start, "data-end": end},
                       chars.slice(start, end).join("")));
    at = end;
  }
  if (at < chars.length) fragment.append(chars.slice(at).join(""));
  return fragment;
}

function sortKey(cell) {
  const text = cell.textContent.trim();
  const number = parseFloat(text.replace(/[%,]/g, ""));
  return text === "–" ? -Infinity : (isNaN(number) ? text.toLowerCase() : number);
}

// A click on a heading of a table.sortable sorts its rows by that column (again: reversed).
function makeSortable(root) {
  for (const table of root.querySelectorAll("table.sortable")) {
    table.querySelectorAll("thead th").forEach((th, column) => {
      th.addEventListener("click", () => {
        const descending = th.getAttribute("aria-sort") !== "descending";
        table.querySelectorAll("thead th").forEach(h => h.removeAttribute("aria-sort"));
        th.setAttribute("aria-sort", descending ? "descending" : "ascending");
        const body = table.tBodies[0];
        const rows = Array.from(body.rows);
        rows.sort((a, b) => {
          const x = sortKey(a.cells[column]), y = sortKey(b.cells[column]);
          const order = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0)
            : (typeof x === "number" ? -1 : 1);
          return descending ? -order : order;
        });
        body.append(...rows);
      });
    });
  }
}

// A list shown a page at a time: only the shown items are built (`render(item)`), so a list of
// thousands opens as fast as one of a page.
class Pager {
  constructor(list, controls, render, size) {
    this.list = list; this.render = render; this.size = size; this.items = []; this.page = 0;
    this.info = el("span", {class: "page-info"});
    this.previous = el("button", {type: "button", class: "page-previous", text: "◀ previous"});
    this.next = el("button", {type: "button", class: "page-next", text: "next ▶"});
    this.previous.addEventListener("click", () => this.show(this.page - 1));
    this.next.addEventListener("click", () => this.show(this.page + 1));
    controls.append(el("span", {class: "pager"}, this.previous, this.info, this.next));
  }
  setItems(items) { this.items = items; this.show(0); }
  setSize(size) { this.size = size; this.show(0); }
  pages() { return Math.max(1, Math.ceil(this.items.length / this.size)); }
  show(page) {
    this.page = Math.min(Math.max(page, 0), this.pages() - 1);
    const first = this.page * this.size;
    const shown = this.items.slice(first, first + this.size);
    this.list.replaceChildren(...shown.map(this.render));
    this.info.textContent = this.items.length
      ? `${first + 1}–${first + shown.length} of ${this.items.length} (page ${this.page + 1} of ${this.pages()})`
      : "none match";
    this.previous.disabled = this.page === 0;
    this.next.disabled = this.page >= this.pages() - 1;
  }
}

document.addEventListener("DOMContentLoaded", () => makeSortable(document));
