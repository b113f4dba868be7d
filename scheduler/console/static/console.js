// The console's only script of its own (pages hold no inline script or handler, and the
// Content-Security-Policy would refuse one). A form with a data-confirm attribute is
// sent only when the person agrees to its question. The question is read as text from
// the attribute, never built into code, so a job or schedule id in it stays text.
// Bidirectional-text controls in it are shown as \u escapes: an id holding U+202E would
// otherwise turn the rest of the question around and hide which job it names.
"use strict";
var BIDI_CONTROLS = /[\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

document.addEventListener("submit", function (event) {
  var form = event.target;
  if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-confirm")) {
    return;
  }
  var question = form.getAttribute("data-confirm").replace(BIDI_CONTROLS, function (c) {
    return "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0");
  });
  if (!window.confirm(question)) {
    event.preventDefault();
  }
});
