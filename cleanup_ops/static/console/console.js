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

  function stamp() {
    var status = document.getElementById("live-status");
    var live = document.getElementById("live");
    if (!status || !live) return;
    var at = live.getAttribute("data-generated") || "";
    status.textContent = at ? "updated " + at.slice(11, 19) + " UTC" : "";
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
    var now = new Date().toISOString().slice(11, 19);
    if (!failingSince) failingSince = now;
    var at = live.getAttribute("data-generated") || "";
    var xhr = event && event.detail ? event.detail.xhr : null;
    var why = xhr && xhr.status ? "HTTP " + xhr.status : "no answer";
    status.textContent = "STALE: refresh failing since " + failingSince + " UTC (" + why + "); figures from " +
      (at ? at.slice(11, 19) + " UTC" : "the page load");
    status.className = "stale";
    status.setAttribute("data-stale", "true");
    status.setAttribute("title", "The last refreshes failed; the figures shown may be out of date.");
  }

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

  document.addEventListener("htmx:afterSwap", function () {
    failingSince = null;
    stamp();
  });
})();
