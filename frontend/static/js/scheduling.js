// Jobs UI glue. No inline scripts or style attributes under the CSP: behaviour hangs on data-
// attributes and styles are set through the CSSOM, which the CSP allows.
(function () {
  // Show only the fields of the chosen schedule type (cron, interval, once). `hidden` alone loses
  // to `.field { display: flex }`, so display is set directly.
  function sync(form) {
    const select = form && form.querySelector("[data-schedule-type]");
    if (!select) return;
    form.querySelectorAll("[data-schedule-field]").forEach((field) => {
      const show = field.getAttribute("data-schedule-field").split(" ").includes(select.value);
      field.style.display = show ? "" : "none";
    });
  }
  // Show only the parameters of the chosen job kind; the others stay in the form but are not sent.
  function syncKind(form) {
    const select = form && form.querySelector("[data-job-kind]");
    if (!select) return;
    form.querySelectorAll("[data-kind-params]").forEach((box) => {
      const show = box.getAttribute("data-kind-params") === select.value;
      box.style.display = show ? "" : "none";
      box.querySelectorAll("input, select, textarea").forEach((el) => { el.disabled = !show; });
    });
  }
  // Blocks marked .wide span the whole form grid.
  function widen(root) {
    root.querySelectorAll("[data-job-form] .wide").forEach((el) => { el.style.gridColumn = "1 / -1"; });
  }
  function init(root) {
    const scope = root || document;
    scope.querySelectorAll("[data-job-form]").forEach((form) => { sync(form); syncKind(form); });
    if (scope.matches && scope.matches("[data-job-form]")) { sync(scope); syncKind(scope); }
    widen(document);
  }
  document.addEventListener("DOMContentLoaded", () => init(document));
  document.addEventListener("change", (event) => {
    if (event.target.matches("[data-schedule-type]")) sync(event.target.closest("[data-job-form]"));
    if (event.target.matches("[data-job-kind]")) syncKind(event.target.closest("[data-job-form]"));
  });
  document.addEventListener("htmx:afterSwap", (event) => init(event.detail.target));
})();
