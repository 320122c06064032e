// The console's script: small, hand-written, no build step (docs/console.md).
// Pages mark what they need with data- attributes; this file wires them up:
//   [data-live-tail]  a run page's live tail (EventSource on the console's run stream)
//   [data-chat]       the playground's chat (the same stream, drawn as a conversation)
"use strict";

// Every frame name the run stream sends (docs/api.md "Streams"); EventSource delivers
// named events only to listeners registered under their name.
const FRAMES = [
  "agent", "steer", "text", "thinking", "tool_call", "tool_result", "error", "done", "usage",
  "awaiting_input", "turn_cancelled", "interruption_pending", "interruption_notify", "forked",
  "provider_fallback", "retry", "retried", "fallback_suppressed", "reasoning_invalidated",
  "context_compaction", "context_compaction_skipped", "context_compaction_failed", "compaction",
  "waiting_budget", "started", "session", "cache_invalidated", "message",
];
const TURN_ENDS = new Set(["awaiting_input", "turn_cancelled", "done", "error"]);

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function pretty(value) {
  return JSON.stringify(value, null, 2);
}

// Follow a run's stream; `sink.frame(name, data, seq)` for each frame, `sink.status(text)`.
function follow(url, sink) {
  const source = new EventSource(url);
  source.onopen = () => sink.status("connected");
  source.onerror = () => sink.status(source.readyState === EventSource.CLOSED ? "closed" : "reconnecting");
  for (const name of FRAMES) {
    source.addEventListener(name, (ev) => {
      let data = {};
      try { data = JSON.parse(ev.data); } catch (e) { data = {raw: ev.data}; }
      sink.frame(name, data, ev.lastEventId);
      if (TURN_ENDS.has(name)) document.body.dispatchEvent(new CustomEvent("turn-ended"));
      if (name === "done") { source.close(); sink.status("ended"); }
    });
  }
  return source;
}

// A live text bubble: `text` frames concatenate to the turn's text (live pieces, then the
// committed remainder); a void frame (`discarded_chars`) takes back what was shown.
// A step's events commit together after its model call, so the step's user turn (`steer`)
// arrives after the live text it caused: it goes in before the open bubble (`before`).
class LiveText {
  constructor(make) { this.make = make; this.node = null; this.box = null; }
  add(text, committed) {
    if (!this.node) { this.node = this.make(); this.box = this.node.closest("li"); }
    this.node.textContent += text;
    if (committed) this.end();
  }
  before(li) {
    if (this.box) this.box.before(li);
    return Boolean(this.box);
  }
  discard(chars) {
    if (this.node && chars) this.node.textContent = this.node.textContent.slice(0, -chars);
  }
  end() { this.node = null; this.box = null; }
}

function timelineSink(panel) {
  const list = document.querySelector(panel.dataset.target);
  const status = panel.querySelector("#tail-status");
  const item = (kind, title, text, detail) => {
    const li = el("li", kind);
    li.append(el("div", "title", title));
    if (text !== undefined) li.append(el("div", "text", text));
    if (detail) { const pre = el("pre", "detail", detail); li.append(pre); }
    if (!(kind === "user" && live.before(li))) list.append(li);
    return li;
  };
  const live = new LiveText(() => item("assistant", "assistant (live)", "").querySelector(".text"));
  return {
    status(text) { status.textContent = text; },
    frame(name, d) {
      if (name === "text") return live.add(d.text || "", !d.live);
      if (d.discarded_chars) return live.discard(d.discarded_chars);
      if (name === "thinking" || name === "agent") return;
      if (name !== "steer") live.end();
      if (name === "steer") item("user", "user (" + (d.user_input || {}).source + ")", (d.user_input || {}).text);
      else if (name === "tool_call") item("tool_call", "tool call " + (d.tool_use || {}).name, undefined, pretty((d.tool_use || {}).input));
      else if (name === "tool_result") item("tool_result", "tool result " + ((d.tool_use || {}).name || ""), d.text);
      else if (name === "error") item("error", "error", d.error);
      else if (name === "done") item("done", "done", d.stop_reason || "");
      else item("event", name, undefined, pretty(d));
      if (name === "done") document.querySelector("#run-status") && (document.querySelector("#run-status").textContent = "ended");
    },
  };
}

function chatSink(panel) {
  const list = document.querySelector(panel.dataset.target);
  const status = panel.querySelector("[data-chat-status]");
  const bubble = (cls, text) => {
    const li = el("li", cls, text);
    if (!(cls === "user" && live.before(li))) list.append(li);
    return li;
  };
  const live = new LiveText(() => bubble("assistant", ""));
  return {
    status(text) { status.textContent = text; status.dataset.state = text; },
    frame(name, d) {
      if (name === "text") return live.add(d.text || "", !d.live);
      if (d.discarded_chars) return live.discard(d.discarded_chars);
      if (name === "thinking" || name === "agent") return;
      if (name !== "steer") live.end();
      if (name === "steer") bubble("user", (d.user_input || {}).text);
      else if (name === "tool_call" || name === "tool_result") {
        const use = d.tool_use || {};
        const li = bubble("tool", "");
        const details = el("details");
        details.append(el("summary", "", (name === "tool_call" ? "tool call " : "tool result ") + (use.name || "")));
        details.append(el("pre", "", name === "tool_call" ? pretty(use.input) : (d.text || "")));
        li.append(details);
      } else if (name === "error") bubble("error", d.error);
      else if (name === "turn_cancelled") bubble("event", "turn cancelled: " + ((d.turn_cancelled || {}).reason || ""));
      if (name === "awaiting_input" || name === "turn_cancelled" || name === "done") {
        status.textContent = name === "done" ? "ended" : name.replace("_", " ");
        status.dataset.state = name;
      }
    },
  };
}

document.addEventListener("DOMContentLoaded", () => {
  for (const panel of document.querySelectorAll("[data-live-tail]")) follow(panel.dataset.liveTail, timelineSink(panel));
  for (const panel of document.querySelectorAll("[data-chat]")) follow(panel.dataset.chat, chatSink(panel));
});

// htmx swaps a 4xx answer (the console's error fragment) into the request's target, so a
// refused steer or turn-cancel says why where the user looks.
document.addEventListener("htmx:beforeSwap", (ev) => {
  if (ev.detail.xhr.status >= 400 && ev.detail.xhr.status < 500) {
    ev.detail.shouldSwap = true;
    ev.detail.isError = false;
  }
});
