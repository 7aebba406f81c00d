// Spillway UI glue. No inline scripts (CSP script-src 'self'): behaviour hangs on data- attributes.
// A request that did not come back as something to show (a 4xx other than the form errors' 422, a 5xx, a dropped
// connection, no answer in time) says so where the user acted, and leaves what they typed in place: htmx swaps
// nothing then, and without this the click looked like it did nothing.
function requestFailed(event, message) {
  let target = event.detail.target || document.querySelector("main");
  // A row or a control cannot hold a paragraph: the note goes to the nearest element around them that can.
  while (target && /^(TR|TD|TH|TBODY|THEAD|TFOOT|TABLE|SELECT|OPTION|INPUT|BUTTON|TEXTAREA)$/.test(target.tagName)) {
    target = target.parentElement;
  }
  if (!target) {
    return;
  }
  const old = target.querySelector(":scope > .request-error");
  if (old) {
    old.remove();
  }
  const note = document.createElement("p");
  note.className = "error request-error";
  note.setAttribute("role", "alert");
  note.textContent = message;  // text, never HTML: the server's message can quote what a user typed
  target.prepend(note);
}

function serverText(xhr) {
  const type = xhr.getResponseHeader("Content-Type") || "";
  const body = (xhr.responseText || "").trim();
  // A short plain sentence ("Your role cannot change routes."), whichever type it was sent as; a page is not one.
  if ((type.startsWith("text/plain") || type.startsWith("text/html")) && body && body.length <= 300 &&
      !body.includes("<")) {
    return body;
  }
  if (type.startsWith("application/json")) {
    try {
      const parsed = JSON.parse(body);
      if (parsed && typeof parsed.detail === "string") {
        return parsed.detail;
      }
    } catch (error) {
      return "";
    }
  }
  return "";
}

document.addEventListener("htmx:responseError", (event) => {
  const xhr = event.detail.xhr;
  const status = xhr.status;
  const said = serverText(xhr);
  const kept = " What you entered is still here.";
  let message;
  if (status === 401) {
    message = "You are signed out: sign in again in another tab, then try again." + kept;
  } else if (status === 403) {
    message = (said || "You are not allowed to do that.") + kept;
  } else if (status === 404) {
    message = "This is gone, or you can no longer see it: reload the page." + kept;
  } else if (status === 429 || status === 503) {
    const wait = parseInt(xhr.getResponseHeader("Retry-After") || "", 10);
    message = (said || (status === 429 ? "Too many requests." : "Spillway is unavailable for a moment.")) +
      (wait > 0 ? ` Try again in ${wait} s.` : " Try again shortly.") + kept;
  } else {
    message = `The request failed (HTTP ${status})${said ? ": " + said : "."} Try again.` + kept;
  }
  requestFailed(event, message);
});

document.addEventListener("htmx:sendError", (event) => {
  // The connection can fail after the server took the request: the user is told to look before trying again.
  requestFailed(event, "Spillway could not be reached (the connection failed). What you entered is still here: " +
    "reload the list to see whether it was saved, then try again.");
});

document.addEventListener("htmx:timeout", (event) => {
  requestFailed(event, "No answer from Spillway in time: check the page again before trying once more. " +
    "What you entered is still here.");
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
