// ledgerweb: copy buttons, bulk selection on queue pages and the approvals inbox, pausing the
// queue's live refresh while a selection is in progress, the arguments' editor of
// edit-and-approve, and keyboard shortcuts. No inline script, no eval: works under the
// strict CSP.
(function () {
  "use strict";

  function flash(button, text) {
    var original = button.getAttribute("data-label") || button.textContent;
    button.setAttribute("data-label", original);
    button.textContent = text;
    window.setTimeout(function () { button.textContent = original; }, 1200);
  }

  function copyText(value, button) {
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(value).then(
        function () { flash(button, "Copied"); },
        function () { fallbackCopy(value, button); }
      );
    } else {
      fallbackCopy(value, button);
    }
  }

  function fallbackCopy(value, button) {
    var area = document.createElement("textarea");
    area.value = value;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    flash(button, ok ? "Copied" : "Select & copy");
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (button) {
      event.preventDefault();
      copyText(button.getAttribute("data-copy"), button);
      return;
    }
    var all = event.target.closest("[data-select-all]");
    if (all) {
      var boxes = document.querySelectorAll("input.bulk-pick");
      for (var i = 0; i < boxes.length; i++) { boxes[i].checked = all.checked; }
      updateBulk();
    }
  });

  document.addEventListener("change", function (event) {
    if (event.target.matches("input.bulk-pick")) { updateBulk(); }
  });

  function selectedCount() {
    return document.querySelectorAll("input.bulk-pick:checked").length;
  }

  function updateBulk() {
    var n = selectedCount();
    var counter = document.querySelector("[data-bulk-count]");
    if (counter) { counter.textContent = n ? n + " selected" : "none selected"; }
    var buttons = document.querySelectorAll("[data-bulk-button]");
    for (var i = 0; i < buttons.length; i++) { buttons[i].disabled = n === 0; }
    var bar = document.querySelector("[data-poll-status]");
    if (bar) { bar.textContent = n ? "live refresh paused while you select" : bar.getAttribute("data-live"); }
  }

  // The queue table polls itself; skip a poll while rows are selected so the selection and the
  // user's place survive.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var source = event.detail && event.detail.elt;
    if (source && source.hasAttribute("data-poll") && selectedCount() > 0) {
      event.preventDefault();
    }
  });

  // Edit-and-approve: the arguments' editor says at once whether what is typed is a JSON
  // object (the server checks it again, and shows what differs before anything is recorded).
  function checkJson(area) {
    var status = area.form && area.form.querySelector("[data-json-status]");
    var submit = area.form && area.form.querySelector("[data-json-submit]");
    var problem = "";
    try {
      var value = JSON.parse(area.value);
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        problem = "The arguments must be a JSON object ({ ... }).";
      }
    } catch (e) {
      problem = "Not valid JSON: " + e.message;
    }
    area.setAttribute("aria-invalid", problem ? "true" : "false");
    if (status) {
      status.textContent = problem || "Valid JSON object.";
      status.className = "small " + (problem ? "error" : "muted");
    }
    if (submit) { submit.disabled = !!problem; }
    return !problem;
  }

  document.addEventListener("input", function (event) {
    if (event.target.matches("[data-json-input]")) { checkJson(event.target); }
  });

  document.addEventListener("submit", function (event) {
    var area = event.target.querySelector && event.target.querySelector("[data-json-input]");
    if (area && !checkJson(area)) { event.preventDefault(); area.focus(); }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var areas = document.querySelectorAll("[data-json-input]");
    for (var i = 0; i < areas.length; i++) { checkJson(areas[i]); }
  });

  // A page whose first job is a decision (an attempt's Actions) starts there: the next Tab
  // reaches its first control, whatever the navigation above it holds.
  document.addEventListener("DOMContentLoaded", function () {
    var first = document.querySelector("[data-focus-first]");
    if (first && !window.location.hash) { first.focus({ preventScroll: true }); }
  });

  document.addEventListener("htmx:afterSwap", function () { updateBulk(); reselect(); });
  document.addEventListener("DOMContentLoaded", updateBulk);

  // Keyboard shortcuts: "/" search, "j"/"k" next/previous row, Enter opens it, "n" the next
  // attempt needing attention (on an attempt's page), "i" the approvals inbox, "?" help; in the
  // inbox "x" selects a row, "o" opens it, "a"/"r" go to its approve comment / reject reason.
  var selectedId = null;

  function rows() { return Array.prototype.slice.call(document.querySelectorAll("tr[data-row]")); }

  function select(row) {
    rows().forEach(function (r) { r.classList.remove("selected"); });
    if (!row) { return; }
    row.classList.add("selected");
    selectedId = row.getAttribute("data-attempt");
    var link = row.querySelector("a");
    if (link) { link.focus({ preventScroll: true }); }
    row.scrollIntoView({ block: "nearest" });
  }

  function reselect() {
    if (!selectedId) { return; }
    var row = document.querySelector("tr[data-row][data-attempt='" + selectedId + "']");
    if (row) { row.classList.add("selected"); }
  }

  function typing(target) {
    return target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName));
  }

  function openHelp() {
    var dialog = document.getElementById("shortcuts");
    if (dialog && !dialog.open) { dialog.showModal(); }
  }

  // A row's folded details (the approvals inbox): its arguments and the decision forms.
  function showDetails(group, show) {
    var details = group.querySelector("[data-row-details]");
    var toggle = group.querySelector("[data-row-toggle]");
    if (!details) { return; }
    details.hidden = !show;
    if (toggle) { toggle.setAttribute("aria-expanded", show ? "true" : "false"); }
  }

  document.addEventListener("click", function (event) {
    if (event.target.closest("[data-shortcuts-open]")) { openHelp(); }
    var filters = event.target.closest("[data-filters-toggle]");
    if (filters) {
      var more = document.getElementById(filters.getAttribute("aria-controls"));
      if (more) {
        var open = more.classList.toggle("open");
        filters.setAttribute("aria-expanded", open ? "true" : "false");
      }
    }
    var toggle = event.target.closest("[data-row-toggle]");
    if (toggle) {
      var group = toggle.closest("tbody");
      var details = group && group.querySelector("[data-row-details]");
      if (details) { showDetails(group, details.hidden); }
    }
  });

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) { return; }
    if (document.querySelector("dialog[open]")) { return; }
    if (event.key === "/") {
      var search = document.querySelector("[data-search]");
      if (search) { event.preventDefault(); search.focus(); search.select(); }
    } else if (event.key === "j" || event.key === "k") {
      var all = rows();
      if (!all.length) { return; }
      event.preventDefault();
      var current = all.findIndex(function (r) { return r.classList.contains("selected"); });
      var next = event.key === "j" ? Math.min(all.length - 1, current + 1) : Math.max(0, current - 1);
      select(all[current === -1 ? 0 : next]);
    } else if (event.key === "x" || event.key === "o" || event.key === "a" || event.key === "r") {
      // On a list whose rows carry a checkbox and folded details (the approvals inbox): select
      // the row, open it, or open it at its approve or reject form (Enter there decides).
      var row = document.querySelector("tr[data-row].selected");
      if (!row) { return; }
      var group = row.closest("tbody") || row;
      var details = group.querySelector("tr[data-row-details]");
      if (event.key === "x") {
        var pick = row.querySelector(".bulk-pick");
        if (pick) { event.preventDefault(); pick.click(); }
        return;
      }
      if (!details) { return; }
      event.preventDefault();
      if (event.key === "o") { showDetails(group, details.hidden); return; }
      showDetails(group, true);
      var field = details.querySelector(event.key === "a" ? "[data-approve-comment]" : "[data-reject-reason]");
      if (field) { field.focus(); }
    } else if (event.key === "i") {
      var inbox = document.querySelector("[data-testid=nav-approvals]");
      if (inbox) { event.preventDefault(); window.location.assign(inbox.href); }
    } else if (event.key === "n") {
      var onward = document.querySelector("a[rel=next][data-testid=next-attempt]");
      if (onward) { event.preventDefault(); window.location.assign(onward.href); }
    } else if (event.key === "?") {
      event.preventDefault();
      openHelp();
    }
  });
})();
