// A finished transcript (the server's verbose_json: text, segments, words) on the page and as files: segments with
// their start times, words that seek the player, speakers in colour where a segment or word names one, and txt,
// srt, vtt as whisperane's writers write a result without word cues (one cue a segment).
"use strict";

const SPEAKER_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

function speakerColour(speaker) {
  const digits = String(speaker).match(/\d+/);
  return SPEAKER_COLOURS[(digits ? Number(digits[0]) : 0) % SPEAKER_COLOURS.length];
}

// [HH:]MM:SS.mmm rounded to the millisecond, hours only when needed unless asked (writers.format_timestamp).
function formatTimestamp(seconds, alwaysHours = false, marker = ".") {
  let ms = Math.round(seconds * 1000);
  const hours = Math.floor(ms / 3600000);
  ms -= hours * 3600000;
  const minutes = Math.floor(ms / 60000);
  ms -= minutes * 60000;
  const secs = Math.floor(ms / 1000);
  ms -= secs * 1000;
  const two = (n) => String(n).padStart(2, "0");
  return (alwaysHours || hours > 0 ? two(hours) + ":" : "") + two(minutes) + ":" + two(secs) + marker +
    String(ms).padStart(3, "0");
}

// A segment's start on the page: [h:]m:ss.s
function clockTime(seconds) {
  const tenths = Math.round(seconds * 10);
  const h = Math.floor(tenths / 36000), m = Math.floor(tenths / 600) % 60, s = (tenths % 600) / 10;
  return (h ? h + ":" + String(m).padStart(2, "0") : m) + ":" + s.toFixed(1).padStart(4, "0");
}

// The words of each segment: the server lists words apart from segments (OpenAI's shape); both are in time order,
// so a word belongs to the last segment that starts at or before it.
function wordsBySegment(segments, words) {
  const out = segments.map(() => []);
  let i = 0;
  for (const w of words || []) {
    while (i + 1 < segments.length && w.start >= segments[i + 1].start) i++;
    if (out.length) out[i].push(w);
  }
  return out;
}

function cueText(segment) {
  const text = segment.text.trim().replaceAll("-->", "->");
  return segment.speaker ? "[" + segment.speaker + "]: " + text : text;
}

function asText(result) {
  const segments = result.segments || [];
  if (!segments.length) return result.text.trim() + "\n";
  return segments.map((s) => cueText(s) + "\n").join("");
}

function asSrt(result) {
  return (result.segments || []).map((s, i) => (i + 1) + "\n" + formatTimestamp(s.start, true, ",") + " --> " +
    formatTimestamp(s.end, true, ",") + "\n" + cueText(s) + "\n\n").join("");
}

function asVtt(result) {
  return "WEBVTT\n\n" + (result.segments || []).map((s) => formatTimestamp(s.start) + " --> " +
    formatTimestamp(s.end) + "\n" + cueText(s) + "\n\n").join("");
}

const EXPORTS = {
  txt: [asText, "text/plain"],
  srt: [asSrt, "application/x-subrip"],
  vtt: [asVtt, "text/vtt"],
  json: [(r) => JSON.stringify(r, null, 2) + "\n", "application/json"],
};

function speakerLabel(speaker) {
  const label = document.createElement("span");
  label.className = "speaker";
  label.textContent = speaker;
  label.style.color = speakerColour(speaker);
  return label;
}

// Renders `result` into `out`; `seek(t)` plays the audio from t seconds. Returns the word spans with their times
// (the player's position highlights the word it is in).
function showTranscript(out, result, seek) {
  out.textContent = "";
  const segments = result.segments || [];
  if (!segments.length) { out.textContent = result.text; return []; }
  const grouped = wordsBySegment(segments, result.words);
  const spans = [];
  segments.forEach((s, i) => {
    const row = document.createElement("div");
    row.className = "segment";
    row.dataset.start = s.start;
    const time = document.createElement("button");
    time.className = "time";
    time.textContent = clockTime(s.start);
    time.title = "play from " + s.start.toFixed(2) + " s";
    time.addEventListener("click", () => seek(s.start));
    row.append(time);
    if (s.speaker) row.append(speakerLabel(s.speaker));
    if (!grouped[i].length) row.append(s.text);
    for (const w of grouped[i]) {
      const span = document.createElement("span");
      span.className = "word";
      span.textContent = w.word;
      span.title = w.start.toFixed(2) + " - " + w.end.toFixed(2) + " s" + (w.speaker ? ", " + w.speaker : "");
      span.dataset.start = w.start;
      if (w.speaker) span.style.color = speakerColour(w.speaker);
      span.addEventListener("click", () => seek(w.start));
      row.append(span);
      spans.push({ start: w.start, end: w.end, span });
    }
    out.append(row);
  });
  return spans;
}
