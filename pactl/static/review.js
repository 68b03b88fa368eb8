// The review page of `pactl serve --findings --decisions`: each suspected label with its
// evidence and neighbours; keep or reject appends a decision. Names, paths and labels are
// data: they go into textContent, never into HTML.
"use strict";

const state = { token: sessionStorage.getItem("pactl-token") || "", shown: 0, total: 0 };
const $ = (id) => document.getElementById(id);
const pageSecret = document.querySelector('meta[name="pactl-page"]').content;
const PAGE = 50;

if (location.hash.startsWith("#token=")) {
  state.token = decodeURIComponent(location.hash.slice(7));
  sessionStorage.setItem("pactl-token", state.token);
  history.replaceState(null, "", location.pathname);
}

function authHeaders(extra = {}) {
  const headers = { "X-Pactl-Page": pageSecret, ...extra };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  return headers;
}

async function call(path, options = {}) {
  const response = await fetch(path, { ...options, headers: authHeaders(options.headers) });
  if (response.status === 401) {
    $("token-form").hidden = false;
    throw new Error("this service needs its token: enter it above");
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.detail || response.status + " " + response.statusText);
  return body;
}

async function thumbnail(img, item) {
  if (item === null || item === undefined) return;
  const response = await fetch(`/items/${item}/thumbnail`, { headers: authHeaders() });
  if (response.ok) img.src = URL.createObjectURL(await response.blob());
}

function say(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

const share = (value) => (value === null || value === undefined ? "–" : value.toFixed(2));
const shortPath = (path) => path.split("/").slice(-2).join("/");

function neighbours(finding) {
  const list = el("ol", "near");
  for (const n of finding.neighbours) {
    const item = el("li", n.label === finding.suggested ? "is-suggested"
      : n.label === finding.label ? "is-given" : "");
    const img = el("img");
    img.alt = n.label || "item " + n.id;
    item.title = n.path || "";
    item.append(img, el("div", "label", n.label), el("div", "score", n.cosine.toFixed(3)));
    list.append(item);
    thumbnail(img, n.item);
  }
  return list;
}

function card(finding) {
  const box = el("article", "finding");
  box.dataset.id = String(finding.id);
  const figure = el("figure");
  const img = el("img");
  img.alt = finding.path;
  const caption = el("figcaption", "path", shortPath(finding.path));
  caption.title = finding.path;
  figure.append(img, caption);
  thumbnail(img, finding.item);
  const body = el("div");
  const labels = el("p", "labels");
  labels.append(`#${finding.rank} `, el("span", "given", finding.label), " → ",
    el("span", "suggested", finding.suggested || "(none)"));
  const evidence = el("p", "evidence");
  evidence.append(el("span", "", `doubt ${finding.score.toFixed(3)}`),
    el("span", "", `class share ${share(finding.class_share)}`),
    el("span", "", `neighbour share ${share(finding.neighbour_share)}`),
    el("span", "muted", `${finding.split || ""} · item ${finding.id}`));
  const actions = el("div", "actions");
  const keep = el("button", "do-keep", `Keep: relabel ${finding.suggested || "?"}`);
  const reject = el("button", "do-reject", `Reject: stays ${finding.label}`);
  keep.type = reject.type = "button";
  keep.disabled = !finding.suggested;
  const verdict = el("span", "verdict");
  keep.addEventListener("click", () => decide(finding, "keep", box, verdict));
  reject.addEventListener("click", () => decide(finding, "reject", box, verdict));
  actions.append(keep, reject, verdict);
  body.append(labels, evidence, neighbours(finding), actions);
  box.append(figure, body);
  show(finding.decision, box, verdict, finding);
  return box;
}

function show(decision, box, verdict, finding) {
  box.classList.remove("keep", "reject");
  if (!decision) { verdict.textContent = ""; return; }
  box.classList.add(decision.decision === "reject" ? "reject" : "keep");
  verdict.textContent = decision.decision === "reject"
    ? `rejected: stays ${finding.label}` : `kept: ${decision.label || finding.suggested}`;
}

async function decide(finding, decision, box, verdict) {
  try {
    const answer = await call("/review/decisions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ id: finding.id, decision }),
    });
    show(answer.recorded, box, verdict, finding);
    say(`${answer.decided} of ${state.total} decided`);
  } catch (error) {
    say(error.message, true);
  }
}

async function load() {
  try {
    const page = await call(`/review/findings?offset=${state.shown}&limit=${PAGE}`);
    state.total = page.total;
    for (const finding of page.findings) $("findings").append(card(finding));
    state.shown += page.findings.length;
    $("more").hidden = state.shown >= state.total;
    $("about").textContent = `${page.total} suspected labels; decisions to ${page.decisions}`;
    say(`${page.decided} of ${page.total} decided`);
  } catch (error) {
    say(error.message, true);
  }
}

$("more").addEventListener("click", load);
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.token = $("token").value;
  sessionStorage.setItem("pactl-token", state.token);
  $("token-form").hidden = true;
  load();
});
load();
