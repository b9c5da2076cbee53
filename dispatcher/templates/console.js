// glia console: the live timeline of a run page (server-sent events).
// Plain JavaScript, no build step. Fragments come from this server already
// escaped (minijinja auto-escaping); they are inserted only from its own
// same-origin event stream, and the page's CSP allows no inline script.
(function () {
  "use strict";
  function replace(id, html) {
    var old = document.getElementById(id);
    if (!old) { return; }
    // Leave a form someone is filling in alone.
    var active = document.activeElement;
    if (active && old.contains(active) && (active.tagName === "TEXTAREA" || active.tagName === "INPUT")) { return; }
    var box = document.createElement("div");
    box.innerHTML = html;
    var fresh = box.querySelector("#" + id);
    if (fresh) { old.replaceWith(fresh); }
  }
  document.addEventListener("DOMContentLoaded", function () {
    var timeline = document.getElementById("timeline");
    if (!timeline || !timeline.dataset.live || !window.EventSource) { return; }
    var es = new EventSource(timeline.dataset.live);
    es.addEventListener("event", function (m) {
      var seq = m.lastEventId;
      if (seq && document.getElementById("e" + seq)) { return; }
      timeline.insertAdjacentHTML("beforeend", m.data);
      ["shown-to", "head-total"].forEach(function (id) {
        var el = document.getElementById(id);
        if (el && seq) { el.textContent = seq; }
      });
    });
    es.addEventListener("head", function (m) {
      replace("run-facts", m.data);
      replace("run-actions", m.data);
    });
    es.addEventListener("end", function () {
      es.close();
      var note = document.getElementById("live-note");
      if (note) { note.textContent = "The run is done."; }
    });
  });
})();
