/* The review queue's keys and selection.
   j / k: next / previous item; x: select it; r: resolve it; e: extend it; o: open its page;
   /: the search field. Keys are ignored while a person types in a field.
   "Select all N in this group" ticks the rows shown; the server applies it to every item of the
   group, including those on no page yet. A refused decision (400) is shown where it was made. */
(function () {
  "use strict";

  function items() { return Array.prototype.slice.call(document.querySelectorAll(".qitem")); }

  function current() {
    var active = document.activeElement;
    return active && active.closest ? active.closest(".qitem") : null;
  }

  // The next item still waiting, counted from the focused row (a decided row keeps its place
  // in the order, so j after a decision goes on to the row below it).
  function move(step) {
    var list = items();
    var at = list.indexOf(current());
    if (at === -1) at = step > 0 ? -1 : list.length;
    for (var i = at + step; i >= 0 && i < list.length; i += step) {
      if (!list[i].classList.contains("done")) {
        list[i].focus();
        list[i].scrollIntoView({ block: "nearest" });
        return;
      }
    }
  }

  function typing(el) {
    return el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
  }

  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey || typing(event.target)) return;
    if (!document.getElementById("uncertain")) return;
    var row = current();
    var key = event.key;
    if (key === "j" || key === "k") {
      move(key === "j" ? 1 : -1);
    } else if (key === "/") {
      var search = document.getElementById("queue-q");
      if (search) search.focus();
    } else if (row && key === "x") {
      var pick = row.querySelector(".pick");
      if (pick) pick.click();
    } else if (row && (key === "r" || key === "e")) {
      var action = row.querySelector('[data-key="' + key + '"]');
      if (action) action.click();
    } else if (row && key === "o") {
      var open = row.querySelector("a.open");
      if (open) window.location.assign(open.href);
    } else {
      return;
    }
    event.preventDefault();
  });

  document.addEventListener("change", function (event) {
    var all = event.target;
    if (!all.matches || !all.matches("[data-select-all]")) return;
    var name = all.getAttribute("data-select-all");
    var group = document.getElementById(name === "late" ? "late" : "group-" + name);
    if (!group) return;
    group.querySelectorAll(".pick").forEach(function (pick) { pick.checked = all.checked; });
  });

  // A row decided in place keeps the focus where the person was.
  document.addEventListener("htmx:load", function (event) {
    var elt = event.detail.elt;
    if (elt && elt.matches && elt.matches(".qitem.done")) elt.focus();
  });

  // A form opened beside a row takes the focus, so typing can start at once.
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail.target;
    if (target && target.classList && target.classList.contains("row-panel")) {
      var first = target.querySelector("input, select, textarea");
      if (first) first.focus();
    }
  });

  // A refused decision comes back 400 with its message: show it in place of the form.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    if (event.detail.xhr.status === 400 && target && target.closest && target.closest("#uncertain, #late")) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
})();

/* "Cancel" in a form beside a row closes the form and leaves the page where it is. */
document.addEventListener("click", function (event) {
  "use strict";
  var link = event.target.closest && event.target.closest(".row-panel a");
  if (!link || !/\/queue\/(\?|#|$)/.test(link.getAttribute("href") || "")) return;
  event.preventDefault();
  event.stopPropagation();
  var panel = link.closest(".row-panel");
  var row = panel.closest(".qitem");
  panel.innerHTML = "";
  if (row) row.focus();
}, true);
