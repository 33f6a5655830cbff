// The dashboard's live updates: poll /ui/live (one JSON snapshot, the server builds it
// at most once a second) and update the page in place. Text only (textContent): a
// value from a rollout is never parsed as HTML.
(function () {
  "use strict";
  var root = document.getElementById("live");
  if (!root) { return; }
  var src = root.getAttribute("data-live-src");
  var every = Math.max(250, 1000 * Number(root.getAttribute("data-live-every") || 1));

  function get(obj, path) {
    return path.split(".").reduce(function (o, k) { return o == null ? o : o[k]; }, obj);
  }

  function text(value) {
    return value == null ? "" : String(value);
  }

  function fillRows(tbody, items) {
    var cols = tbody.getAttribute("data-cols").split(",");
    var link = tbody.getAttribute("data-link");
    var rows = document.createDocumentFragment();
    (items || []).forEach(function (item) {
      var tr = document.createElement("tr");
      cols.forEach(function (c) {
        var td = document.createElement("td");
        if (c === link) {
          var a = document.createElement("a");
          a.href = "/ui/jobs/" + encodeURIComponent(text(item[c]));
          a.textContent = text(item[c]);
          td.appendChild(a);
        } else {
          td.textContent = text(item[c]);
        }
        tr.appendChild(td);
      });
      rows.appendChild(tr);
    });
    tbody.replaceChildren(rows);
  }

  function apply(snap) {
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var value = get(snap, el.getAttribute("data-live"));
      el.textContent = value == null ? "none" : text(value);
    });
    document.querySelectorAll("tbody[data-rows]").forEach(function (tbody) {
      fillRows(tbody, snap[tbody.getAttribute("data-rows")]);
    });
    document.querySelectorAll("[data-chart]").forEach(function (line) {
      line.setAttribute("points", text(get(snap.chart, line.getAttribute("data-chart"))));
    });
    root.setAttribute("data-live-updates", String(Number(root.getAttribute("data-live-updates")) + 1));
  }

  function tick() {
    fetch(src, { credentials: "same-origin", cache: "no-store" })
      .then(function (resp) {
        if (resp.status === 401) { window.location.assign("/ui/login?next=/ui/"); return null; }
        return resp.ok ? resp.json() : null;
      })
      .then(function (snap) { if (snap) { apply(snap); } })
      .catch(function () { /* the server is away: try again at the next tick */ })
      .then(function () { window.setTimeout(tick, every); });
  }

  window.setTimeout(tick, every);
}());
