// Confirmation before a destructive form is sent (Kick, Delete, Remove, Revoke).
document.addEventListener("submit", function (event) {
  var question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
