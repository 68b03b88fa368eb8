// The page of `pactl serve`: upload or drop an image, see its top-k, click a hit to search
// from it. Names, paths and labels are data: they go into textContent, never into HTML.
"use strict";

const state = { token: sessionStorage.getItem("pactl-token") || "", urls: [] };
const $ = (id) => document.getElementById(id);
// This process's secret, in the page only: a write from a browser carries it, so a page of
// another site (which cannot read this one) cannot write.
const pageSecret = document.querySelector('meta[name="pactl-page"]').content;

if (location.hash.startsWith("#token=")) {
  state.token = decodeURIComponent(location.hash.slice(7));
  sessionStorage.setItem("pactl-token", state.token);
  history.replaceState(null, "", location.pathname);
}

function authHeaders() {
  const headers = { "X-Pactl-Page": pageSecret };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  return headers;
}

async function call(path, options = {}) {
  const response = await fetch(path, { ...options, headers: authHeaders() });
  if (response.status === 401) {
    $("token-form").hidden = false;
    throw new Error("this service needs its token: enter it above");
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.detail || response.status + " " + response.statusText);
  return body;
}

async function imageUrl(path) {
  const response = await fetch(path, { headers: authHeaders() });
  if (!response.ok) return "";
  const url = URL.createObjectURL(await response.blob());
  state.urls.push(url);
  return url;
}

function say(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function k() {
  const value = parseInt($("k").value, 10);
  return Number.isFinite(value) && value > 0 ? value : 8;
}

async function searchFile(file) {
  const form = new FormData();
  form.append("file", file, file.name);
  showQuery(URL.createObjectURL(file), file.name);
  await search(`/query?k=${k()}`, { method: "POST", body: form });
}

async function searchItem(id, path) {
  showQuery("", path);
  imageUrl(`/items/${id}/thumbnail`).then((url) => { $("query-image").src = url; });
  await search(`/query?k=${k()}&exclude_self=true&id=${id}`, { method: "POST" });
}

function showQuery(src, name) {
  $("query").hidden = false;
  $("query-image").src = src;
  $("query-name").textContent = shownPath(name);
  $("query-name").title = name;
}

// A path as the page shows it, for a query and its results alike: its folder and file name
// (the whole path in the tooltip).
function shownPath(path) {
  return path.split("/").slice(-2).join("/");
}

async function search(path, options) {
  say("searching…");
  try {
    const answer = await call(path, options);
    await render(answer.results[0].hits);
    say(`${answer.results[0].hits.length} results`);
  } catch (error) {
    say(error.message, true);
  }
}

async function render(hits) {
  for (const url of state.urls.splice(0)) URL.revokeObjectURL(url);
  const list = $("results");
  list.replaceChildren();
  for (const hit of hits) {
    const item = document.createElement("li");
    const tile = document.createElement("button");
    tile.type = "button";
    tile.className = "tile";
    tile.dataset.id = String(hit.id);
    tile.title = hit.path;
    const img = document.createElement("img");
    img.alt = hit.label || "item " + hit.id;
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = hit.score.toFixed(4);
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = hit.label || "(no label)";
    const path = document.createElement("span");
    path.className = "path";
    path.textContent = shownPath(hit.path);
    tile.append(img, score, label, path);
    tile.addEventListener("click", () => searchItem(hit.id, hit.path));
    item.append(tile);
    list.append(item);
    imageUrl(`/items/${hit.id}/thumbnail`).then((url) => { img.src = url; });
  }
  $("results-section").hidden = false;
}

async function about() {
  try {
    const health = await call("/health");
    $("about").textContent = `${health.items.toLocaleString()} items, pactl ${health.version}`;
  } catch (error) {
    $("about").textContent = error.message;
  }
}

$("file").addEventListener("change", (event) => {
  const file = event.target.files[0];
  if (file) searchFile(file);
});
const drop = $("drop");
drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (event) => {
  event.preventDefault();
  drop.classList.remove("over");
  const file = event.dataTransfer.files[0];
  if (file) searchFile(file);
});
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.token = $("token").value;
  sessionStorage.setItem("pactl-token", state.token);
  $("token-form").hidden = true;
  about();
});
about();
