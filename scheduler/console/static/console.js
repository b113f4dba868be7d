// The console's only script of its own (pages hold no inline script or handler, and the
// Content-Security-Policy would refuse one). A form with a data-confirm attribute is
// sent only when the person agrees to its question. The question is read as text from
// the attribute, never built into code, so a job or schedule id in it stays text.
"use strict";
document.addEventListener("submit", function (event) {
  var form = event.target;
  if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-confirm")) {
    return;
  }
  if (!window.confirm(form.getAttribute("data-confirm"))) {
    event.preventDefault();
  }
});
