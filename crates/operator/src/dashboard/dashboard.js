"use strict";
// Served with the page: its SHA-256 is the page's script-src, so nothing else runs.
(function () {
  var message = document.getElementById("message");
  function say(text, ok) {
    message.textContent = text;
    message.className = ok ? "ok" : "refused";
    message.hidden = false;
  }
  // The buttons post to the operator API: the server checks the role, as for `slate fleet`.
  document.addEventListener("click", function (ev) {
    var b = ev.target.closest("button[data-action]");
    if (!b) return;
    var action = b.getAttribute("data-action");
    var group = b.getAttribute("data-group");
    if (action === "abort" && !window.confirm("Abort the rollout of " + group + "?")) return;
    b.disabled = true;
    fetch("/v1/fleet/" + action, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ group: group, reason: "from the dashboard" }),
      credentials: "same-origin",
    })
      .then(function (r) {
        return r.text().then(function (t) {
          var body = {};
          try { body = JSON.parse(t); } catch (e) { body = { message: t }; }
          if (r.ok) {
            say(action + " " + group + ": done", true);
          } else {
            say(action + " " + group + " refused (" + r.status + "): " + (body.message || t), false);
          }
          refresh();
        });
      })
      .catch(function (e) { say(action + " " + group + " failed: " + e, false); })
      .then(function () { b.disabled = false; });
  });
  // The server renders; every few seconds the same URL's <main> replaces this one.
  var busy = false;
  function refresh() {
    if (busy) return;
    busy = true;
    fetch(location.pathname + location.search, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var main = doc.getElementById("main");
        var updated = doc.getElementById("updated");
        if (main) document.getElementById("main").replaceWith(main);
        if (updated) document.getElementById("updated").replaceWith(updated);
      })
      .catch(function () {})
      .then(function () { busy = false; });
  }
  setInterval(refresh, 3000);
})();
