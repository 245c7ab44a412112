// Progressive enhancement only: every page works without JavaScript.
// A form marked "once" disables its buttons after the first submit, so a double click sends
// one request (the server refuses a repeated promotion anyway, with a message).
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement) || !form.classList.contains("once")) return;
  if (form.dataset.sent === "1") {
    event.preventDefault();
    return;
  }
  form.dataset.sent = "1";
  // Disable after the browser has collected the form data, or the button's value is lost.
  setTimeout(() => form.querySelectorAll("button").forEach((b) => { b.disabled = true; }), 0);
});
