// whisperane's page: a file transcribed with its text streamed as it comes (the server's SSE deltas), then its
// segments and words with times (the done event's verbose_json fields), downloads and copy; the microphone live
// over the WebSocket. One request at a time: a new one (another file, the same file under another model,
// language, task or speaker choice) aborts the one running, and only the newest may write to the page.
// Plain JavaScript, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const keyInput = $("key");
const TICK_MS = 100;
const KEY_SETTLE_MS = 400;  // the key is checked once typing pauses
keyInput.value = localStorage.getItem("whisperane-key") || "";

function headers() {
  return keyInput.value ? { Authorization: "Bearer " + keyInput.value } : {};
}

class PageError extends Error {
  constructor(message, status = 0) { super(message); this.status = status; }
}

// A failed response as the user should read it: a refused key points at the key field (the server's own text is
// for API clients: "Authorization: Bearer KEY").
async function responseError(response) {
  if (response.status === 401) {
    return new PageError(keyInput.value ? "the API key was not accepted: check the API key field"
      : "this server needs an API key: enter it in the API key field", 401);
  }
  let message = response.status + " " + response.statusText;
  try { message = (await response.json()).error.message; } catch (e) { /* not OpenAI's error object */ }
  return new PageError(message, response.status);
}

function networkError(e) {
  return e instanceof PageError ? e : new PageError("the server could not be reached (" + e.message + ")");
}

// Where the user acted gets the message; a key error also marks the key field, and goes once a key works.
function showError(element, error) {
  element.textContent = error.message;
  element.className = "error" + (error.status === 401 ? " key-error" : "");
  if (error.status === 401) {
    $("key-error").textContent = keyInput.value ? "not accepted" : "needed";
    keyInput.classList.add("invalid");
  }
}

function keyWorks() {
  $("key-error").textContent = "";
  keyInput.classList.remove("invalid");
  for (const e of document.querySelectorAll(".key-error")) { e.textContent = ""; e.className = ""; }
}

// --- the models -----------------------------------------------------------------------------------------

let cards = {};

async function loadModels() {
  let response;
  try {
    response = await fetch("/v1/models", { headers: headers() });
  } catch (e) {
    return showError($("model-note"), networkError(e));
  }
  if (!response.ok) return showError($("model-note"), await responseError(response));
  keyWorks();
  const select = $("model");
  const chosen = select.value;
  select.innerHTML = "";
  cards = {};
  for (const m of (await response.json()).data) {
    cards[m.id] = m;
    select.add(new Option(m.id, m.id, false, m.id === chosen));
  }
  modelChanged(false);
}

function languageName(code) {
  try { return new Intl.DisplayNames(["en"], { type: "language" }).of(code); } catch (e) { return code; }
}

// The model's nature beside its picker; an English-only model has no language choice and no translation.
function modelChanged(rerun) {
  const card = cards[$("model").value] || {};
  const multilingual = card.multilingual !== false;
  const note = $("model-note");
  note.className = "note";
  note.textContent = multilingual ? "multilingual" : "English-only: transcribes English, no translation";
  const language = $("language");
  const kept = language.value;
  language.length = 1;
  for (const code of multilingual ? card.languages || [] : []) language.add(new Option(languageName(code), code));
  language.value = [...language.options].some((o) => o.value === kept) ? kept : "";
  language.disabled = $("translate").disabled = !multilingual;
  if (!multilingual) $("translate").checked = false;
  if (rerun && lastFile) transcribe(lastFile);
}

// --- a file ---------------------------------------------------------------------------------------------

let current = null;  // the request whose results the page shows: { file, model, controller, started, timer }
let lastFile = null;
let playerUrl = null;
let words = [];
let shown = null;  // the finished result (verbose_json) the downloads are made from

function elapsed(run) {
  return ((performance.now() - run.started) / 1000).toFixed(1) + " s";
}

function setState(state, status) {
  $("transcript").dataset.state = state;
  $("file-status").className = "";
  $("file-status").textContent = status;
}

function start(file) {
  const previous = current;
  if (previous) { previous.controller.abort(); clearInterval(previous.timer); }
  const run = { file, model: $("model").value || "whisper-1", translate: $("translate").checked,
                speakers: $("speakers").checked, language: $("language").value, controller: new AbortController(),
                started: performance.now() };
  run.timer = setInterval(() => { $("elapsed").textContent = elapsed(run); }, TICK_MS);
  current = run;
  lastFile = file;
  shown = null;
  words = [];
  $("exports").hidden = true;
  $("copy-status").textContent = "";
  $("transcript").textContent = "";
  $("elapsed").textContent = "";
  $("cancel").hidden = false;
  const what = (run.translate ? "Translating " : "Transcribing ") + file.name + " with " + run.model +
    (run.speakers ? ", labelling speakers (the text comes at the end)" : "");
  setState("waiting", what + (previous && previous.busy ? " (the previous request was cancelled)" : "") + " ...");
  run.busy = true;
  if (!playerUrl || playerUrl.file !== file) {
    if (playerUrl) URL.revokeObjectURL(playerUrl.url);
    playerUrl = { file, url: URL.createObjectURL(file) };
    $("player").src = playerUrl.url;
  }
  $("player").hidden = false;
  return run;
}

function finish(run) {
  run.busy = false;
  clearInterval(run.timer);
  $("cancel").hidden = true;
}

async function transcribe(file) {
  const run = start(file);
  try {
    const result = run.translate ? await translated(run) : run.speakers ? await labelled(run) : await streamed(run);
    if (current !== run) return;
    finish(run);
    shown = result;
    words = showTranscript($("transcript"), result, seek);
    const facts = [result.duration != null ? result.duration.toFixed(1) + " s of audio" : null, result.language,
                   run.model, "in " + elapsed(run)].filter(Boolean);
    setState("done", file.name + ": " + facts.join(", "));
    $("elapsed").textContent = "";
    $("exports").hidden = false;
  } catch (e) {
    if (current !== run) return;  // superseded: the newer request says so
    finish(run);
    if (e.name === "AbortError") return setState("cancelled", "Cancelled after " + elapsed(run) + ".");
    $("transcript").dataset.state = "error";
    showError($("file-status"), networkError(e));
  }
}

const WORD_TIMES = [["timestamp_granularities[]", "word"], ["timestamp_granularities[]", "segment"]];

function form(run, fields) {
  const body = new FormData();
  body.append("file", run.file);
  body.append("model", run.model);
  body.append("response_format", "verbose_json");
  if (run.speakers) body.append("diarize", "true");
  for (const [name, value] of fields) body.append(name, value);
  return body;
}

async function post(path, body, run) {
  const response = await fetch(path, { method: "POST", body, headers: headers(), signal: run.controller.signal });
  if (!response.ok) throw await responseError(response);
  keyWorks();
  return response;
}

// Transcription: the text as the server's delta events bring it; the done event carries verbose_json's fields.
async function streamed(run) {
  const fields = [["stream", "true"], ...WORD_TIMES];
  if (run.language) fields.push(["language", run.language]);
  const response = await post("/v1/audio/transcriptions", form(run, fields), run);
  let done = null;
  await readEvents(response, (event) => {
    if (current !== run) return;
    if (event.error) throw new PageError(event.error.message, 400);
    if (event.type === "transcript.text.delta") {
      $("transcript").dataset.state = "streaming";
      $("transcript").append(event.delta);
    } else if (event.type === "transcript.text.done") {
      done = event;
    }
  });
  if (!done) throw new PageError("the server ended the stream before the transcript was done");
  return done;
}

// Speaker labels need the whole transcript (the server refuses them on a stream): one verbose_json answer.
async function labelled(run) {
  const fields = run.language ? [...WORD_TIMES, ["language", run.language]] : WORD_TIMES;
  return (await post("/v1/audio/transcriptions", form(run, fields), run)).json();
}

// Translation has no stream in OpenAI's API: one verbose_json answer (segments, no words).
async function translated(run) {
  return (await post("/v1/audio/translations", form(run, []), run)).json();
}

// Server-Sent Events: blocks separated by a blank line, each `data: <json>`.
async function readEvents(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const data = buffer.slice(0, end).split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5));
      buffer = buffer.slice(end + 2);
      if (data.length) onEvent(JSON.parse(data.join("\n")));
    }
  }
}

function seek(t) {
  $("player").currentTime = t;
  $("player").play().catch(() => {});
}

$("player").addEventListener("timeupdate", () => {
  const t = $("player").currentTime;
  for (const w of words) w.span.classList.toggle("now", w.start <= t && t < w.end);
});

$("cancel").addEventListener("click", () => { if (current && current.busy) current.controller.abort(); });

function download(format) {
  const [render, type] = EXPORTS[format];
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([render(shown)], { type }));
  link.download = lastFile.name.replace(/\.[^.]*$/, "") + "." + format;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

for (const button of document.querySelectorAll("#exports [data-format]")) {
  button.addEventListener("click", () => download(button.dataset.format));
}
$("copy").addEventListener("click", () => {
  navigator.clipboard.writeText(asText(shown)).then(
    () => { $("copy-status").className = "note"; $("copy-status").textContent = "copied"; },
    (e) => showError($("copy-status"), new PageError("could not copy: " + e.message)));
});

// The same file chosen again fires no change event unless the input is emptied after each choice.
$("file").addEventListener("change", (e) => {
  if (e.target.files.length) transcribe(e.target.files[0]);
  e.target.value = "";
});
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  if (e.dataTransfer.files.length) transcribe(e.dataTransfer.files[0]);
});
$("model").addEventListener("change", () => modelChanged(true));
for (const id of ["language", "translate", "speakers"]) {
  $(id).addEventListener("change", () => { if (lastFile) transcribe(lastFile); });
}

let keyTimer = null;
function keyChanged() {
  clearTimeout(keyTimer);
  keyTimer = setTimeout(() => { localStorage.setItem("whisperane-key", keyInput.value); loadModels(); }, KEY_SETTLE_MS);
}
keyInput.addEventListener("input", keyChanged);
keyInput.addEventListener("change", keyChanged);
loadModels();
