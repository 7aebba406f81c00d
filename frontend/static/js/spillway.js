// Spillway UI glue. No inline scripts (CSP script-src 'self'): behaviour hangs on data- attributes.
document.addEventListener("htmx:responseError", (event) => {
  const status = event.detail.xhr.status;
  if (status === 401 || status === 403) {
    event.detail.target.insertAdjacentHTML("afterbegin", '<p class="error" role="alert">You are not allowed to do that.</p>');
  }
});
