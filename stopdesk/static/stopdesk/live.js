/* Live refresh at a person's pace.
   The task page polls once a second and receives its live parts out of band. A part is not
   replaced while a person is using it (an open form, focus inside it, typed text): the next poll
   after they are done brings it up to date. A part whose content did not change is not replaced
   at all, so nothing moves on the screen and a live region announces each change once. Evidence
   trails a person opened stay open across refreshes. A wrapper marked data-keep-height never gets
   shorter during a visit, so the parts below it do not move up as items settle (the wrapper, not
   the swapped part: htmx's settle step would drop a style set on the part).

   Focus follows a person's own swaps at once: into the field marked autofocus (the Stop
   confirmation's reason), or, when the control they used is gone (Stop was pressed), to the new
   state it names in data-focus-next. htmx would focus [autofocus] only when the swap settles,
   20 ms later; a key pressed in between went nowhere, and a check of the focus in that gap found
   <body>. */
(function () {
  "use strict";

  function inUse(el) {
    if (el.querySelector("form")) return true;
    var active = document.activeElement;
    if (active && active !== document.body && el.contains(active)) return true;
    var fields = el.querySelectorAll("input, textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value !== fields[i].defaultValue) return true;
    }
    return false;
  }

  function sameContent(current, incoming) {
    var copy = current.cloneNode(true);
    copy.classList.remove("htmx-settling", "htmx-swapping", "htmx-added");
    copy.querySelectorAll("details[open]").forEach(function (d) { d.removeAttribute("open"); });
    copy.querySelectorAll(".htmx-added").forEach(function (n) { n.classList.remove("htmx-added"); });
    return copy.isEqualNode(incoming);
  }

  function focusLost() {
    var active = document.activeElement;
    return !active || active === document.body || !document.body.contains(active);
  }

  // htmx:afterSwap fires on each new element, in the same task as the swap itself. Only the
  // element the request targeted moves focus: a refresh's out-of-band parts never do.
  document.addEventListener("htmx:afterSwap", function (event) {
    var el = event.target;
    var target = event.detail && event.detail.target;
    if (!el || !el.id || !target || target.id !== el.id || !focusLost()) return;
    var next = el.matches("[autofocus]") ? el : el.querySelector("[autofocus]");
    if (next) {
      next.removeAttribute("autofocus"); // focused now; htmx's settle must not take it back later
    } else if (el.dataset.focusNext) {
      next = document.getElementById(el.dataset.focusNext);
    }
    if (next) next.focus();
  });

  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var target = event.detail.target;
    var incoming = event.detail.fragment && event.detail.fragment.firstElementChild;
    if (!target || !incoming) return;
    if (target.hasAttribute("data-live-guard") && inUse(target)) {
      event.detail.shouldSwap = false;
      return;
    }
    if (sameContent(target, incoming)) {
      event.detail.shouldSwap = false;
      return;
    }
    var keep = target.parentElement && target.parentElement.closest("[data-keep-height]");
    if (keep) keep.style.minHeight = Math.max(parseFloat(keep.style.minHeight) || 0, keep.getBoundingClientRect().height) + "px";
    // Keep open the evidence trails a person opened.
    target.querySelectorAll("details[open][id]").forEach(function (d) {
      var twin = incoming.querySelector("#" + CSS.escape(d.id));
      if (twin) twin.setAttribute("open", "");
    });
  });
})();
