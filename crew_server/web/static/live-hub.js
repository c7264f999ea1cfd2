// The browser's one live stream (GET /live) and the topics of the tabs it serves.
// It runs in the SharedWorker (live-worker.js), so all tabs of a browser share one
// connection (a browser allows six to a host: a stream per page left the 7th tab of a
// room unable to load); a page whose browser has no SharedWorker runs it itself.
"use strict";

function createLiveHub() {
  const subscriptions = new Map(); // key → {topic, csrf, deliver, last}
  let source = null;
  let streamId = null;

  function send(path, fields) {
    return fetch(path, {
      method: "POST",
      body: new URLSearchParams(fields),
      headers: { "X-Crew-Fetch": "1" },
      credentials: "same-origin",
    }).catch(() => {}); // the stream's next hello subscribes everything again
  }

  function subscribe(key, sub) {
    const fields = [["csrf", sub.csrf], ["stream", streamId], ["key", key], ["topic", sub.topic]];
    if (sub.last !== null) fields.push(["last", String(sub.last)]);
    send("/live/subscriptions", fields);
  }

  function received(update) {
    if (update.mode === "hello") {
      // A new stream (the first, or after a reconnect): it knows no topic yet.
      streamId = update.stream;
      for (const [key, sub] of subscriptions) subscribe(key, sub);
      return;
    }
    if (update.mode === "signed-out") {
      for (const sub of subscriptions.values()) sub.deliver(update);
      subscriptions.clear();
      close();
      return;
    }
    const sub = subscriptions.get(update.key);
    if (!sub) return;
    if (update.id !== null && update.id !== undefined) sub.last = update.id;
    sub.deliver(update);
    if (update.mode === "end") subscriptions.delete(update.key);
  }

  function open() {
    if (source) return;
    source = new EventSource("/live");
    source.addEventListener("update", (event) => received(JSON.parse(event.data)));
    source.addEventListener("error", () => {
      streamId = null; // reconnecting: a new stream says hello
      if (source && source.readyState === EventSource.CLOSED) source = null;
    });
  }

  function close() {
    if (source) source.close();
    source = null;
    streamId = null;
  }

  return {
    // A tab's topics ([{key, topic}]); `deliver` gets their updates.
    join(topics, csrf, deliver) {
      for (const { key, topic } of topics) {
        const sub = { topic, csrf, deliver, last: null };
        subscriptions.set(key, sub);
        if (streamId) subscribe(key, sub);
      }
      open();
    },
    // A tab went: its topics stop; the stream closes with the last tab.
    leave(keys, csrf) {
      const gone = keys.filter((key) => subscriptions.delete(key));
      if (gone.length && streamId) {
        send("/live/subscriptions/leave", [["csrf", csrf], ["stream", streamId], ...gone.map((key) => ["key", key])]);
      }
      if (!subscriptions.size) close();
    },
  };
}
