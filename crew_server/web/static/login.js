// A sign-in link (POST /api/sign-in-codes, scripts/demo --web) carries a one-time code
// in the fragment, which the browser never sends to the server: drop it from the
// address (and so from this history entry), then post it. The code is spent by that
// post, so a copy left in the browser's history signs nobody in.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const found = /^#code=([A-Za-z0-9_-]+)$/.exec(window.location.hash);
  if (!found) return;
  history.replaceState(null, "", window.location.pathname + window.location.search);
  const form = document.getElementById("code-form");
  form.elements.code.value = found[1];
  form.requestSubmit();
});
// A link opened in a tab already on /login changes only the fragment, and the browser
// does not load the page again. Load it (the fragment stays): the page's sign-in form,
// whose token may be stale or bound to another tab's cookie, is then fresh too.
window.addEventListener("hashchange", () => {
  if (/^#code=/.test(window.location.hash)) window.location.reload();
});
