// Spillway UI glue. No inline scripts (CSP script-src 'self'): behaviour hangs on data- attributes.
document.addEventListener("htmx:responseError", (event) => {
  const status = event.detail.xhr.status;
  if (status === 401 || status === 403) {
    event.detail.target.insertAdjacentHTML("afterbegin", '<p class="error" role="alert">You are not allowed to do that.</p>');
  }
});

// <form data-confirm="..."> asks before it submits (an inline onsubmit is blocked by the CSP, and the form then
// submitted without asking).
document.addEventListener("submit", (event) => {
  const message = event.target.dataset && event.target.dataset.confirm;
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
});

// <select data-autosubmit> submits its form when changed (the org switch, the quotas page's org).
document.addEventListener("change", (event) => {
  if (event.target.matches && event.target.matches("select[data-autosubmit]") && event.target.form) {
    event.target.form.requestSubmit();
  }
});
