// The SharedWorker every tab of a browser connects to: one live stream for all of them.
"use strict";
importScripts("/static/live-hub.js");

const hub = createLiveHub();

self.addEventListener("connect", (event) => {
  const port = event.ports[0];
  let joined = { keys: [], csrf: "" };
  port.addEventListener("message", ({ data }) => {
    if (data.type === "join") {
      joined = { keys: data.topics.map((topic) => topic.key), csrf: data.csrf };
      hub.join(data.topics, data.csrf, (update) => port.postMessage(update));
    } else if (data.type === "leave") {
      hub.leave(data.keys, data.csrf);
    }
  });
  // A tab that went without its pagehide (it crashed): where the browser tells us.
  port.addEventListener("close", () => hub.leave(joined.keys, joined.csrf));
  port.start();
});
