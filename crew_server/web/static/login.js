// A sign-in link (scripts/demo --web) carries the token in the fragment, which the
// browser never sends to the server: fill the form with it, forget it, sign in.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const found = /^#token=([A-Za-z0-9_-]+)$/.exec(window.location.hash);
  if (!found) return;
  history.replaceState(null, "", window.location.pathname + window.location.search);
  const field = document.getElementById("token");
  field.value = found[1];
  field.form.requestSubmit();
});
