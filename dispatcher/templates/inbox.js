// glia inbox: the live queue (server-sent events).
// Plain JavaScript, no build step. Fragments come from the server already
// escaped; they are inserted only from same-origin responses.
(function () {
  "use strict";
  function keys(el) {
    return Array.prototype.map.call(el.querySelectorAll("tr.item"), function (tr) {
      return tr.dataset.run + "/" + tr.dataset.call;
    }).join(" ");
  }
  function refreshRows(tbody) {
    var checked = {};
    tbody.querySelectorAll("input[name=item]:checked").forEach(function (c) { checked[c.value] = true; });
    fetch(tbody.dataset.rows, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) { throw new Error("rows: " + r.status); }
      return r.text();
    }).then(function (html) {
      // Replace the rows only when the set of approvals changed, so that a
      // row someone is about to click stays where it is.
      var fresh = document.createElement("tbody");
      fresh.innerHTML = html;
      if (keys(fresh) === keys(tbody)) { return; }
      tbody.innerHTML = html;
      tbody.querySelectorAll("input[name=item]").forEach(function (c) { if (checked[c.value]) { c.checked = true; } });
      var count = document.getElementById("count");
      if (count) { count.textContent = String(tbody.querySelectorAll("tr.item").length); }
    }).catch(function (e) { console.warn(e); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var tbody = document.querySelector("[data-live]");
    if (tbody && window.EventSource) {
      var es = new EventSource(tbody.dataset.live);
      es.addEventListener("queue", function () { refreshRows(tbody); });
    }
    var all = document.getElementById("select-all");
    if (all) {
      all.addEventListener("change", function () {
        document.querySelectorAll("input[name=item]").forEach(function (c) { c.checked = all.checked; });
      });
    }
  });
})();
