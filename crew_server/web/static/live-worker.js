// The SharedWorker every tab of a browser connects to: one live stream for all of them.
"use strict";
importScripts("/static/live-hub.js");

const hub = createLiveHub();

self.addEventListener("connect", (event) => {
  const port = event.ports[0];
  port.addEventListener("message", ({ data }) => {
    if (data.type === "join") hub.join(data.topics, data.csrf, (update) => port.postMessage(update));
    else if (data.type === "leave") hub.leave(data.keys, data.csrf);
  });
  port.start();
});
