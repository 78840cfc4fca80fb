// whisperane's page: a file's transcript with word times (the word playing highlighted), the microphone live
// over the WebSocket (confirmed text plain, the hypothesis dim). Plain JavaScript, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const keyInput = $("key");
keyInput.value = localStorage.getItem("whisperane-key") || "";
keyInput.addEventListener("change", () => { localStorage.setItem("whisperane-key", keyInput.value); loadModels(); });

function headers() {
  return keyInput.value ? { Authorization: "Bearer " + keyInput.value } : {};
}

async function errorText(response) {
  try { return (await response.json()).error.message; } catch (e) { return response.statusText; }
}

async function loadModels() {
  const response = await fetch("/v1/models", { headers: headers() });
  const select = $("model");
  select.innerHTML = "";
  if (!response.ok) { $("file-status").textContent = await errorText(response); return; }
  for (const m of (await response.json()).data) {
    select.add(new Option(m.id, m.id));
  }
}

// --- a file ------------------------------------------------------------------------------------------

let words = [];

async function transcribeFile(file) {
  $("file-status").textContent = "Transcribing " + file.name + " ...";
  $("transcript").textContent = "";
  const player = $("player");
  player.src = URL.createObjectURL(file);
  player.hidden = false;
  const form = new FormData();
  form.append("file", file);
  form.append("model", $("model").value || "whisper-1");
  form.append("response_format", "verbose_json");
  form.append("timestamp_granularities[]", "word");
  form.append("timestamp_granularities[]", "segment");
  const response = await fetch("/v1/audio/transcriptions", { method: "POST", body: form, headers: headers() });
  if (!response.ok) {
    $("file-status").innerHTML = "";
    $("file-status").append(Object.assign(document.createElement("span"), { className: "error", textContent: await errorText(response) }));
    return;
  }
  const result = await response.json();
  $("file-status").textContent = file.name + ": " + result.duration.toFixed(1) + " s, " + result.language;
  showWords(result.words || []);
}

function showWords(list) {
  const out = $("transcript");
  out.textContent = "";
  words = list.map((w) => {
    const span = document.createElement("span");
    span.className = "word";
    span.textContent = w.word;
    span.title = w.start.toFixed(2) + " - " + w.end.toFixed(2) + " s";
    span.dataset.start = w.start;
    span.dataset.end = w.end;
    span.addEventListener("click", () => { $("player").currentTime = w.start; $("player").play(); });
    out.append(span);
    return { start: w.start, end: w.end, span };
  });
}

$("player").addEventListener("timeupdate", () => {
  const t = $("player").currentTime;
  for (const w of words) w.span.classList.toggle("now", w.start <= t && t < w.end);
});

$("file").addEventListener("change", (e) => { if (e.target.files.length) transcribeFile(e.target.files[0]); });
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  if (e.dataTransfer.files.length) transcribeFile(e.dataTransfer.files[0]);
});

// --- the microphone ------------------------------------------------------------------------------------

let live = null;

function toPcm16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    out[i] = s < 0 ? s * 32768 : s * 32767;
  }
  return out.buffer;
}

async function startMic() {
  $("mic-start").disabled = true;
  $("confirmed").textContent = "";
  $("hypothesis").textContent = "";
  const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
  const context = new AudioContext({ sampleRate: 16000 });  // the browser resamples the microphone to 16 kHz
  const source = context.createMediaStreamSource(stream);
  const processor = context.createScriptProcessor(4096, 1, 1);
  const protocols = ["whisperane"].concat(keyInput.value ? ["bearer." + keyInput.value] : []);
  const url = location.origin.replace(/^http/, "ws") + "/v1/audio/live?model=" + encodeURIComponent($("model").value || "whisper-1");
  const socket = new WebSocket(url, protocols);
  socket.binaryType = "arraybuffer";
  live = { stream, context, source, processor, socket };
  socket.onopen = () => {
    $("mic-status").textContent = "listening";
    $("mic-stop").disabled = false;
    processor.onaudioprocess = (e) => {
      if (socket.readyState === WebSocket.OPEN) socket.send(toPcm16(e.inputBuffer.getChannelData(0)));
    };
    source.connect(processor);
    processor.connect(context.destination);
  };
  socket.onmessage = (m) => {
    const event = JSON.parse(m.data);
    if (event.type === "confirmed") $("confirmed").textContent += event.text;
    else if (event.type === "hypothesis") $("hypothesis").textContent = event.text;
    else if (event.type === "done") { $("confirmed").textContent = event.text; $("hypothesis").textContent = ""; $("mic-status").textContent = "done"; }
    else if (event.type === "error") $("mic-status").textContent = event.error.message;
  };
  socket.onclose = () => { stopAudio(); $("mic-start").disabled = false; $("mic-stop").disabled = true; };
}

function stopAudio() {
  if (!live || live.stopped) return;
  live.stopped = true;
  live.processor.onaudioprocess = null;
  live.source.disconnect();
  live.processor.disconnect();
  live.stream.getTracks().forEach((t) => t.stop());
  live.context.close();
}

function stopMic() {
  if (!live) return;
  stopAudio();
  $("mic-status").textContent = "finishing";
  $("mic-stop").disabled = true;
  if (live.socket.readyState === WebSocket.OPEN) live.socket.send(JSON.stringify({ type: "end" }));
}

$("mic-start").addEventListener("click", () => startMic().catch((e) => { $("mic-status").textContent = String(e); $("mic-start").disabled = false; }));
$("mic-stop").addEventListener("click", stopMic);
loadModels();
