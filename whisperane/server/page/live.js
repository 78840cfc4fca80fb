// The microphone live over the WebSocket /v1/audio/live: 16 kHz s16le PCM frames out, the engine's events in
// (confirmed text plain, the hypothesis dim); Stop sends {"type": "end"} and the stream ends with `done`.
"use strict";

let live = null;

function toPcm16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    out[i] = s < 0 ? s * 32768 : s * 32767;
  }
  return out.buffer;
}

function micStatus(text) {
  $("mic-status").className = "";
  $("mic-status").textContent = text;
}

// A browser sees neither the HTTP status of a refused WebSocket handshake nor its reason (the close is 1006),
// so the key is checked over HTTP first, where a refusal can be told apart and pointed at.
async function checkAccess() {
  const response = await fetch("/v1/models", { headers: headers() });
  if (!response.ok) throw await responseError(response);
  keyWorks();
}

async function startMic() {
  $("mic-start").disabled = true;
  micStatus("connecting ...");
  await checkAccess();
  let stream;
  try {
    // The voice as the microphone hears it: the browser's call processing (noise suppression, gain control, echo
    // cancellation) reshapes speech in ways Whisper was not trained on, and tiny.en then mishears words.
    const raw = { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false };
    stream = await navigator.mediaDevices.getUserMedia({ audio: raw });
  } catch (e) {
    throw new PageError("the microphone could not be opened (" + e.message + ")");
  }
  const context = new AudioContext({ sampleRate: 16000 });  // the browser resamples the microphone to 16 kHz
  const source = context.createMediaStreamSource(stream);
  const processor = context.createScriptProcessor(4096, 1, 1);
  const protocols = ["whisperane"].concat(keyInput.value ? ["bearer." + keyInput.value] : []);
  const query = new URLSearchParams({ model: $("model").value || "whisper-1" });
  if ($("language").value) query.set("language", $("language").value);
  const socket = new WebSocket(location.origin.replace(/^http/, "ws") + "/v1/audio/live?" + query, protocols);
  socket.binaryType = "arraybuffer";
  const session = { stream, context, source, processor, socket, opened: false, ended: false, failed: false };
  live = session;
  $("confirmed").textContent = "";
  $("hypothesis").textContent = "";
  socket.onopen = () => {
    session.opened = true;
    micStatus("listening");
    $("mic-stop").disabled = false;
    processor.onaudioprocess = (e) => {
      if (socket.readyState === WebSocket.OPEN && !session.stopped) socket.send(toPcm16(e.inputBuffer.getChannelData(0)));
    };
    source.connect(processor);
    processor.connect(context.destination);
  };
  socket.onmessage = (m) => onLiveEvent(session, JSON.parse(m.data));
  socket.onclose = (e) => onLiveClose(session, e);
}

function onLiveEvent(session, event) {
  if (event.type === "confirmed") $("confirmed").textContent += event.text;
  else if (event.type === "hypothesis") $("hypothesis").textContent = event.text;
  else if (event.type === "done") {
    session.ended = true;
    $("confirmed").textContent = event.text;
    $("hypothesis").textContent = "";
    micStatus("done");
  } else if (event.type === "error") {
    session.failed = true;
    showError($("mic-status"), new PageError(event.error.message, event.error.code === "invalid_api_key" ? 401 : 400));
  }
}

function onLiveClose(session, e) {
  stopAudio(session);
  $("mic-start").disabled = false;
  $("mic-stop").disabled = true;
  if (session.ended || session.failed) return;
  const why = e.reason ? ": " + e.reason : " (close code " + e.code + ")";
  showError($("mic-status"), new PageError(session.opened ? "the live stream ended early" + why
    : "the server refused the live connection" + why + "; check the key field and the server's --allow-origin"));
}

function stopAudio(session) {
  if (!session || session.stopped) return;
  session.stopped = true;
  session.processor.onaudioprocess = null;
  session.source.disconnect();
  session.processor.disconnect();
  session.stream.getTracks().forEach((t) => t.stop());
  session.context.close();
}

function stopMic() {
  if (!live) return;
  stopAudio(live);
  micStatus("finishing ...");
  $("mic-stop").disabled = true;
  if (live.socket.readyState === WebSocket.OPEN) live.socket.send(JSON.stringify({ type: "end" }));
}

$("mic-start").addEventListener("click", () => startMic().catch((e) => {
  showError($("mic-status"), networkError(e));
  $("mic-start").disabled = false;
}));
$("mic-stop").addEventListener("click", stopMic);
