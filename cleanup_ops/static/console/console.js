/* Live refresh for the retention console (no build step; htmx does the
   fetching and swapping, see templatetags/console.py `live_attrs`).

   A page's #live fragment is re-fetched every few seconds. It is not while
   the tab is hidden, while the "Live" box is unticked, or while the operator
   has ticked a checkbox or is typing inside the fragment: a refresh must
   never throw away a selection. */
(function () {
  "use strict";

  var STORAGE_KEY = "console-live";

  function toggle() {
    return document.getElementById("live-toggle");
  }

  window.consoleMayRefresh = function () {
    if (document.hidden) return false;
    var box = toggle();
    if (box && !box.checked) return false;
    var live = document.getElementById("live");
    if (!live) return false;
    if (live.querySelector("input[type=checkbox]:checked")) return false;
    var active = document.activeElement;
    if (active && active !== document.body && live.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
      return false;
    }
    return true;
  };

  // Times in the viewer's zone, the zone named. The server writes UTC
  // (<time datetime> with a UTC text or title); this rewrites them where the
  // browser knows its zone, and says which zone that is in the header.
  function zoneName() {
    try {
      return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
    } catch (e) {
      return "UTC";
    }
  }

  function pad(n) {
    return (n < 10 ? "0" : "") + n;
  }

  function shortZone(date) {
    try {
      var parts = new Intl.DateTimeFormat("en-GB", { timeZoneName: "short" }).formatToParts(date);
      for (var i = 0; i < parts.length; i++) {
        if (parts[i].type === "timeZoneName") return parts[i].value;
      }
    } catch (e) { /* fall through */ }
    return zoneName();
  }

  function localText(date, seconds) {
    var text = date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) + " " +
      pad(date.getHours()) + ":" + pad(date.getMinutes()) + (seconds ? ":" + pad(date.getSeconds()) : "");
    return text + " " + shortZone(date);
  }

  function localClock(iso) {
    var date = new Date(iso);
    if (isNaN(date.getTime())) return "";
    return pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds()) + " " + shortZone(date);
  }

  function localize(root) {
    var times = (root || document).querySelectorAll("time[datetime][data-local]");
    for (var i = 0; i < times.length; i++) {
      var el = times[i];
      var date = new Date(el.getAttribute("datetime"));
      if (isNaN(date.getTime())) continue;
      var utcTitle = el.getAttribute("data-utc") || el.getAttribute("title") || "";
      el.setAttribute("data-utc", utcTitle);
      el.setAttribute("title", localText(date, true) + (utcTitle ? " (" + utcTitle + ")" : ""));
      if (el.getAttribute("data-local") === "text") el.textContent = localText(date, false);
    }
    var zone = document.getElementById("viewer-zone");
    if (zone) zone.textContent = "times in " + zoneName();
  }
  window.consoleLocalize = localize;

  function stamp() {
    var status = document.getElementById("live-status");
    var live = document.getElementById("live");
    if (!status || !live) return;
    var at = live.getAttribute("data-generated") || "";
    status.textContent = at ? "updated " + localClock(at) : "";
    status.className = "muted";
    status.removeAttribute("data-stale");
    status.removeAttribute("title");
  }

  // A refresh that fails (an error status, no answer, a timeout) must not
  // look like a page that is up to date: the figures are marked stale, with
  // the time of the last good update, until a refresh succeeds again.
  var failingSince = null;

  function stale(event) {
    var status = document.getElementById("live-status");
    var live = document.getElementById("live");
    if (!status || !live) return;
    if (event && event.detail && event.detail.elt && event.detail.elt !== live) return;
    var now = localClock(new Date().toISOString());
    if (!failingSince) failingSince = now;
    var at = live.getAttribute("data-generated") || "";
    var xhr = event && event.detail ? event.detail.xhr : null;
    var why = xhr && xhr.status ? "HTTP " + xhr.status : "no answer";
    status.textContent = "STALE: refresh failing since " + failingSince + " (" + why + "); figures from " +
      (at ? localClock(at) : "the page load");
    status.className = "stale";
    status.setAttribute("data-stale", "true");
    status.setAttribute("title", "The last refreshes failed; the figures shown may be out of date.");
  }

  // The live fragment's refreshes ask here first (not in an hx-trigger
  // filter, which htmx would compile with eval: the Content-Security-Policy
  // refuses it). A refused refresh is simply skipped until the next tick.
  document.addEventListener("htmx:confirm", function (event) {
    var elt = event.detail ? event.detail.elt : null;
    if (elt && elt.id === "live" && !window.consoleMayRefresh()) event.preventDefault();
  });

  document.addEventListener("htmx:responseError", stale);
  document.addEventListener("htmx:sendError", stale);
  document.addEventListener("htmx:timeout", stale);

  document.addEventListener("DOMContentLoaded", function () {
    var box = toggle();
    if (box) {
      try {
        box.checked = window.localStorage.getItem(STORAGE_KEY) !== "off";
      } catch (e) { /* storage unavailable: keep the default */ }
      box.addEventListener("change", function () {
        try {
          window.localStorage.setItem(STORAGE_KEY, box.checked ? "on" : "off");
        } catch (e) { /* ignore */ }
      });
    }
    localize(document);
    stamp();
  });

  // A session that expired answers with the login page: reload the whole page
  // (which shows the login form) rather than swapping it into the fragment.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr;
    // The login page's path comes from the page (reverse() of LOGIN_URL), not from here.
    var login = document.body.getAttribute("data-login-url");
    if (xhr && xhr.responseURL && login && xhr.responseURL.indexOf(login) !== -1) {
      event.detail.shouldSwap = false;
      window.location.reload();
    }
  });

  // "Select all": a header checkbox with data-select-all="<name>" ticks (or
  // unticks) every enabled checkbox of that name in its form. Delegated from
  // the document, so it keeps working after a live refresh swaps the table.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box || !box.getAttribute || !box.getAttribute("data-select-all")) return;
    var scope = box.form || document;
    var name = box.getAttribute("data-select-all");
    var boxes = scope.querySelectorAll("input[type=checkbox][name='" + name + "']");
    for (var i = 0; i < boxes.length; i++) {
      if (!boxes[i].disabled) boxes[i].checked = box.checked;
    }
  });

  document.addEventListener("htmx:afterSwap", function () {
    failingSince = null;
    localize(document);
    stamp();
  });
})();
