// skiplock web: refresh the parts marked data-refresh="URL" every data-every ms while the page is
// visible, and ask before a form marked data-confirm is sent. No other script runs on the pages.
"use strict";
function refresh(el) {
  if (document.hidden) return;
  fetch(el.dataset.refresh, {credentials: "same-origin", headers: {"X-Requested-With": "fetch"}})
    .then(function (r) { return r.ok ? r.text() : null; })
    .then(function (html) { if (html !== null) el.innerHTML = html; })
    .catch(function () {});
}
document.querySelectorAll("[data-refresh]").forEach(function (el) {
  if (el.dataset.now) refresh(el);  // a part left out of the page so that the page answers at once
  setInterval(function () { refresh(el); }, parseInt(el.dataset.every || "2000", 10));
});
document.addEventListener("submit", function (e) {
  var msg = e.target.dataset.confirm;
  if (msg && !window.confirm(msg)) e.preventDefault();
});
document.addEventListener("change", function (e) {
  if (e.target.id === "select-all") {
    document.querySelectorAll("input[type=checkbox][name=id]").forEach(function (c) { c.checked = e.target.checked; });
  }
});
