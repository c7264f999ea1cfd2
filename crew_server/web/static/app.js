// The web app's page script (ours, no library). It only:
//  - subscribes every element with data-live to the browser's one live stream (held by
//    the SharedWorker live-worker.js, shared by all tabs; live-hub.js in the page when
//    there is no SharedWorker) and applies its updates (server-rendered, escaped
//    fragments: {target, mode, html});
//  - sends a composer's message without a reload, showing it at once as pending until
//    the stream brings the server's copy;
//  - completes @handles in a composer;
//  - tells the server once the person begins typing in a room (at most every 30 s), so
//    the room's agents are warm before the message arrives (a hint, never a turn);
//  - counts the seconds of a running tool call (elements with data-elapsed-since).
// Without it every page still works: forms post and the page reloads.
"use strict";

function applyUpdate(update) {
  if (update.mode === "signed-out") {
    window.location.reload(); // the page's own check sends the tab to the sign-in form
    return;
  }
  const target = document.getElementById(update.target);
  if (!target || update.mode === "end") return;
  if (update.mode === "append") {
    const empty = target.querySelector(".empty");
    if (empty) empty.remove();
    const nearBottom = target.scrollHeight - target.scrollTop - target.clientHeight < 80;
    target.insertAdjacentHTML("beforeend", update.html);
    replacePending(target);
    if (nearBottom) target.scrollTop = target.scrollHeight;
  } else if (update.mode === "replace") {
    target.innerHTML = update.html;
  } else if (update.mode === "outer") {
    target.outerHTML = update.html;
  }
}

// The browser's live hub: the SharedWorker's, or (without SharedWorker) this page's own.
function liveHub() {
  if (typeof SharedWorker === "function") {
    try {
      const worker = new SharedWorker("/static/live-worker.js", { name: "crew-live" });
      worker.port.start();
      return {
        join: (topics, csrf, deliver) => {
          worker.port.onmessage = (event) => deliver(event.data);
          worker.port.postMessage({ type: "join", topics, csrf });
        },
        leave: (keys, csrf) => worker.port.postMessage({ type: "leave", keys, csrf }),
      };
    } catch (error) {
      // a browser that refuses workers here: the page holds its own stream
    }
  }
  return createLiveHub();
}

function openLiveStreams() {
  const elements = [...document.querySelectorAll("[data-live]")];
  const csrfField = document.querySelector("input[name=csrf]");
  if (!elements.length || !csrfField) return;
  const csrf = csrfField.value;
  // Keys name this tab's topics on the shared stream (not a secret).
  const tab = Date.now().toString(36) + Math.random().toString(36).slice(2);
  const topics = elements.map((element) => ({ key: tab + ":" + element.id, topic: element.dataset.live }));
  const keys = topics.map((topic) => topic.key);
  const hub = liveHub();
  hub.join(topics, csrf, applyUpdate);
  window.addEventListener("pagehide", () => hub.leave(keys, csrf));
  window.addEventListener("pageshow", (event) => {
    if (event.persisted) hub.join(topics, csrf, applyUpdate); // back from the back/forward cache
  });
}

// Sends the composer's message without a reload, shown at once as pending (optimistic);
// the stream's copy of it replaces the pending one (matched by the client id the server
// echoes as data-client-id, or by the message id the post answered). A refused post
// leaves the pending one marked failed, with the reason, and the text in the composer.
function sendWithoutReload(form) {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const field = form.querySelector("textarea");
    const button = form.querySelector("button[type=submit]");
    const text = field.value;
    if (!text.trim()) return;
    const clientId = "c" + Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
    const clientField = form.querySelector("input[name=client_id]");
    if (clientField) clientField.value = clientId;
    const body = new URLSearchParams(new FormData(form));
    const pending = showPending(form, text, clientId);
    field.value = "";
    button.disabled = true;
    try {
      const answer = await fetch(form.action, {
        method: "POST",
        body,
        headers: { "X-Crew-Fetch": "1" },
        credentials: "same-origin",
      });
      if (answer.ok) {
        const sent = await answer.json().catch(() => null);
        if (sent && sent.id) settlePending(pending, String(sent.id));
        showProblem(form, "");
      } else {
        notSent(form, pending, text, await refusalText(answer));
      }
    } catch (error) {
      notSent(form, pending, text, "Not sent: the server did not answer. Try again.");
    } finally {
      button.disabled = false;
      field.focus();
    }
  });
}

// The first keystroke in a composer: POST …/prewarm (CSRF-checked like every form post),
// again at most every PREWARM_EVERY_MS; the server rate limits per agent as well.
const PREWARM_EVERY_MS = 30000;
function warmWhileTyping(form) {
  const csrfField = form.querySelector("input[name=csrf]");
  const field = form.querySelector("textarea");
  if (!csrfField || !field || !form.action.endsWith("/messages")) return;
  const target = form.action.slice(0, -"/messages".length) + "/prewarm";
  let last = -Infinity;
  field.addEventListener("input", () => {
    const now = Date.now();
    if (now - last < PREWARM_EVERY_MS) return;
    last = now;
    fetch(target, {
      method: "POST",
      body: new URLSearchParams({ csrf: csrfField.value }),
      headers: { "X-Crew-Fetch": "1" },
      credentials: "same-origin",
    }).catch(() => {}); // only a hint: a lost one costs the first reply's start, nothing else
  });
}

// The person's own message in the timeline, until the stream brings the server's copy.
// Built with DOM methods: the text goes in as text, never as markup.
function showPending(form, text, clientId) {
  const timeline = document.getElementById(form.dataset.timeline || "");
  if (!timeline) return null;
  const message = document.createElement("article");
  message.className = "message kind-normal by-user pending";
  message.dataset.clientId = clientId;
  const header = document.createElement("header");
  const author = document.createElement("span");
  author.className = "author";
  // The name the server shows for the person's messages, when one is on the page.
  const shown = timeline.querySelector(".message.by-user:not(.pending) .author");
  author.textContent = shown ? shown.textContent : "You";
  const state = document.createElement("span");
  state.className = "state";
  state.setAttribute("role", "status");
  state.textContent = "sending…";
  header.append(author, " ", state);
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text;
  message.append(header, body);
  const empty = timeline.querySelector(".empty");
  if (empty) empty.remove();
  timeline.append(message);
  timeline.scrollTop = timeline.scrollHeight;
  return message;
}

// The post was stored as message `id`: the pending copy goes if the stream's is here.
function settlePending(pending, id) {
  if (!pending || !pending.isConnected) return;
  pending.dataset.messageId = id;
  if (document.getElementById("m-" + id) || document.getElementById("t-" + id)) pending.remove();
}

// A message the stream appended: the pending copy it stands for goes.
function replacePending(target) {
  const added = target.lastElementChild;
  if (!added || !added.classList.contains("message") || added.classList.contains("pending")) return;
  const clientId = added.dataset.clientId;
  const messageId = added.id.replace(/^[mt]-/, "");
  for (const pending of target.querySelectorAll(".message.pending")) {
    if ((clientId && pending.dataset.clientId === clientId) || pending.dataset.messageId === messageId) {
      pending.remove();
    }
  }
}

function notSent(form, pending, text, reason) {
  if (pending) {
    pending.classList.add("failed");
    pending.querySelector(".state").textContent = reason;
  }
  const field = form.querySelector("textarea");
  if (!field.value.trim()) field.value = text; // the text is not lost
  showProblem(form, reason);
}

// What a refused post says: the server's sentence, or its status when it sent a page.
async function refusalText(answer) {
  const type = answer.headers.get("content-type") || "";
  if (!type.includes("html")) return await answer.text();
  return "Not sent: the server refused it (HTTP " + answer.status + "). Reload the page and try again.";
}

function showProblem(form, text) {
  let note = form.querySelector(".problem");
  if (!note) {
    note = document.createElement("p");
    note.className = "problem";
    note.setAttribute("role", "alert");
    form.append(note);
  }
  note.textContent = text;  // text, never markup
  note.hidden = !text;
}

function completeHandles(field) {
  const handles = (field.dataset.handles || "").split(" ").filter(Boolean);
  const list = field.form.querySelector(".completions");
  if (!handles.length || !list) return;

  function wordAtCaret() {
    const before = field.value.slice(0, field.selectionStart);
    const match = before.match(/@([a-z0-9_-]*)$/);
    return match ? match[1] : null;
  }

  function choose(handle) {
    const start = field.selectionStart;
    const before = field.value.slice(0, start).replace(/@([a-z0-9_-]*)$/, "@" + handle + " ");
    field.value = before + field.value.slice(start);
    field.selectionStart = field.selectionEnd = before.length;
    list.hidden = true;
    field.focus();
  }

  field.addEventListener("input", () => {
    const word = wordAtCaret();
    const found = word === null ? [] : handles.filter((h) => h.startsWith(word));
    list.replaceChildren();
    for (const handle of found) {
      const item = document.createElement("li");
      item.setAttribute("role", "option");
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = "@" + handle;
      button.addEventListener("click", () => choose(handle));
      item.append(button);
      list.append(item);
    }
    list.hidden = found.length === 0;
  });
  field.addEventListener("keydown", (event) => {
    if (event.key === "Tab" && !list.hidden) {
      const first = list.querySelector("button");
      if (first) {
        event.preventDefault();
        choose(first.textContent.slice(1));
      }
    } else if (event.key === "Escape") {
      list.hidden = true;
    } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      field.form.requestSubmit();
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  openLiveStreams();
  for (const form of document.querySelectorAll("form[data-composer]")) sendWithoutReload(form);
  for (const form of document.querySelectorAll("form[data-composer]")) warmWhileTyping(form);
  for (const field of document.querySelectorAll("textarea[data-handles]")) completeHandles(field);
  const timeline = document.getElementById("timeline");
  if (timeline) timeline.scrollTop = timeline.scrollHeight;
  tickElapsed();
});

// How long each running tool call has run, once a second: " · 12 s" after its static
// start time. Live updates add and replace such elements, so each tick looks them up.
function tickElapsed() {
  if (!document.querySelector("[data-live], [data-elapsed-since]")) return;
  const tick = () => {
    for (const element of document.querySelectorAll("[data-elapsed-since]")) {
      const since = Date.parse(element.dataset.elapsedSince);
      if (Number.isNaN(since)) continue;
      const seconds = Math.max(0, Math.round((Date.now() - since) / 1000));
      element.textContent = " · " + seconds + " s";
    }
  };
  tick();
  setInterval(tick, 1000);
}
