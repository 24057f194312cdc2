// The Operations page refreshes its body from data.json every few seconds.
// The body is HTML Django rendered (and escaped) with the same figures.
(function () {
  "use strict";
  function start() {
    var body = document.getElementById("ops-body");
    var status = document.getElementById("ops-refresh-status");
    if (!body) { return; }
    var every = Math.max(2, parseInt(body.getAttribute("data-refresh"), 10) || 5) * 1000;
    function refresh() {
      fetch(body.getAttribute("data-url"), { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (response) {
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.json();
        })
        .then(function (data) {
          body.innerHTML = data.html;
          status.textContent = "Updated " + new Date(data.at * 1000).toLocaleTimeString() + ".";
        })
        .catch(function (error) {
          status.textContent = "Refresh failed (" + error.message + "); retrying.";
        })
        .then(function () { window.setTimeout(refresh, every); });
    }
    window.setTimeout(refresh, every);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
