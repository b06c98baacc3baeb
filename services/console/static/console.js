// Confirmation before a destructive form is sent (Kick, Delete, Remove, Revoke, Drain): the
// browser's own dialog, answered with Enter or Escape. `data-confirm-field` names a field of
// the form whose value replaces %s in the question.
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute("data-confirm");
  if (!question) {
    return;
  }
  var field = form.getAttribute("data-confirm-field");
  if (field && form.elements[field]) {
    question = question.replace("%s", form.elements[field].value);
  }
  if (!window.confirm(question)) {
    event.preventDefault();
  }
});
