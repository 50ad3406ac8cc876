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

  // Keyboard focus across a live refresh: the swap replaces the fragment,
  // and with it the focused link or button, so the browser would drop focus
  // to <body> and the next Tab would start again at the top of the page. The
  // focused element is described before the swap (tag, then what identifies
  // it: id, test id, name and value, href, label, text) and the same element
  // of the new fragment is focused after it; if it is gone, the one at the
  // same place among the fragment's focusable elements is.
  var FOCUSABLE = "a[href], button, input, select, textarea, summary, [tabindex]:not([tabindex='-1'])";
  var IDENTIFYING = ["id", "data-testid", "name", "value", "href", "aria-label"];
  var focusKept = null;

  function describe(el, live) {
    var key = { tag: el.tagName, text: (el.textContent || "").trim(), attrs: {} };
    for (var i = 0; i < IDENTIFYING.length; i++) key.attrs[IDENTIFYING[i]] = el.getAttribute(IDENTIFYING[i]);
    key.index = Array.prototype.indexOf.call(live.querySelectorAll(FOCUSABLE), el);
    return key;
  }

  function matches(el, key) {
    if (el.tagName !== key.tag || (el.textContent || "").trim() !== key.text) return false;
    for (var i = 0; i < IDENTIFYING.length; i++) {
      if (el.getAttribute(IDENTIFYING[i]) !== key.attrs[IDENTIFYING[i]]) return false;
    }
    return true;
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    var live = document.getElementById("live");
    var active = document.activeElement;
    focusKept = null;
    if (!live || event.detail.target !== live || !active || active === live || !live.contains(active)) return;
    focusKept = describe(active, live);
  });

  function refocus() {
    var key = focusKept;
    focusKept = null;
    var live = document.getElementById("live");
    if (!key || !live || (document.activeElement && document.activeElement !== document.body)) return;
    var all = live.querySelectorAll(FOCUSABLE);
    var found = null;
    for (var i = 0; i < all.length && !found; i++) if (matches(all[i], key)) found = all[i];
    if (!found && all.length) found = all[Math.min(Math.max(key.index, 0), all.length - 1)];
    if (found) found.focus({ preventScroll: true });
  }

  // A reason typed into a form survives a failed CSRF check (403_csrf.html,
  // cleanup_ops/views/errors.py): it is saved in sessionStorage (this tab
  // only, never sent anywhere) as the form is sent; the failure page marks
  // the draft as failed and shows it; the form's page, opened afresh, fills
  // it into the same form's empty reason field. Any other page after a send
  // means the send went through: the draft is dropped.
  var DRAFT_KEY = "console-reason-draft";

  function formKey(form) {
    var hidden = form.querySelectorAll("input[type=hidden]:not([name=csrfmiddlewaretoken]):not([name=next])");
    var parts = [form.getAttribute("action") || window.location.pathname];
    for (var i = 0; i < hidden.length; i++) parts.push(hidden[i].name + "=" + hidden[i].value);
    return parts.join("&");
  }

  function readDraft() {
    try {
      return JSON.parse(window.sessionStorage.getItem(DRAFT_KEY) || "null");
    } catch (e) {
      return null;
    }
  }

  function writeDraft(draft) {
    try {
      if (draft) window.sessionStorage.setItem(DRAFT_KEY, JSON.stringify(draft));
      else window.sessionStorage.removeItem(DRAFT_KEY);
    } catch (e) { /* storage unavailable: nothing is kept */ }
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form || !form.querySelector || (form.method || "").toLowerCase() !== "post") return;
    var reason = form.querySelector("[name=reason]");
    if (reason && reason.value) writeDraft({ form: formKey(form), reason: reason.value, failed: false });
  });

  function draftOnLoad() {
    var draft = readDraft();
    if (!draft) return;
    var failure = document.querySelector("[data-csrf-failure]");
    if (failure) {
      draft.failed = true;
      writeDraft(draft);
      var box = document.getElementById("csrf-draft");
      var text = document.getElementById("csrf-draft-text");
      if (box && text) {
        text.textContent = draft.reason;
        box.hidden = false;
      }
      return;
    }
    if (draft.failed) {
      var forms = document.querySelectorAll("form");
      for (var i = 0; i < forms.length; i++) {
        var reason = forms[i].querySelector("[name=reason]");
        if (reason && !reason.value && formKey(forms[i]) === draft.form) {
          reason.value = draft.reason;
          break;
        }
      }
    }
    writeDraft(null);
  }

  document.addEventListener("DOMContentLoaded", draftOnLoad);

  document.addEventListener("htmx:afterSwap", function () {
    failingSince = null;
    localize(document);
    stamp();
    refocus();
  });
})();
