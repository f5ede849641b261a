// coordinator's admin page: the live parts. Hand-written, no dependencies, no build.
//
// The page is complete without this script (forms post and redirect back). With it:
// - the page follows the daemon's events (/ui/events, server-sent) and re-fetches only
//   the fragment an event names: a job's row, a run's row, the status panel. Progress
//   events move the progress bar without asking the server at all.
// - buttons post in the background (the CSRF token travels in the form) and say what
//   happened in a toast; the page does not reload.
// - ages ("3 min ago") are kept current from the clock, without the server.
// Nothing here polls: with no event, the page sends nothing.
(function () {
  "use strict";

  var REFRESH_DELAY = 250; // ms: events in a burst cost one fetch per element
  var AGES_EVERY = 30000; // ms: relative times are rewritten locally

  var pending = new Set();
  var timer = null;
  var skew = 0; // server clock minus ours, ms

  function all(selector, root) {
    return Array.prototype.slice.call((root || document).querySelectorAll(selector));
  }

  // ---------------------------------------------------------------- fragments
  //
  // Refreshes are keyed by the fragment's address (data-src), not by element: a refresh
  // replaces the element, and a later event must reach its successor. One fetch per
  // address at a time; an event that arrives meanwhile fetches it once more afterwards,
  // so the newest state always wins and answers never race.

  var inflight = {}; // data-src or run id -> true, or "again" when wanted meanwhile

  function want(el) {
    if (!el || !el.dataset.src) return;
    pending.add(el.dataset.src);
    if (!timer) timer = setTimeout(flush, REFRESH_DELAY);
  }

  function flush() {
    timer = null;
    var srcs = Array.from(pending);
    pending.clear();
    srcs.forEach(load);
  }

  function settle(key, retry) {
    var again = inflight[key] === "again";
    delete inflight[key];
    if (again) retry();
  }

  function fetchHtml(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
  }

  function load(src) {
    if (inflight[src]) {
      inflight[src] = "again";
      return;
    }
    var els = all("[data-src]").filter(function (el) { return el.dataset.src === src; });
    if (!els.length) return;
    inflight[src] = true;
    fetchHtml(src).then(function (r) {
      if (r.status === 204 || r.status === 404) {
        els.forEach(function (el) {
          if (r.status === 404 && el.classList.contains("job-head")) gone(el);
          else el.remove();
        });
        return null;
      }
      if (r.status === 401) {
        location.assign("/signin");
        return null;
      }
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (!html) return;
      els.forEach(function (el) {
        var fresh = parse(html);
        if (fresh && el.isConnected) {
          el.replaceWith(fresh);
          ages(fresh);
        }
      });
    }).catch(function () { /* offline: the next event or reconnect tries again */ })
      .then(function () {
        settle(src, function () {
          pending.add(src);
          if (!timer) timer = setTimeout(flush, REFRESH_DELAY);
        });
      });
  }

  // The job of this page was removed: say so where its head was (its title, details
  // and buttons went, and the runs below were left looking like a job's).
  function gone(head) {
    var note = document.createElement("p");
    note.className = "note";
    note.setAttribute("role", "status");
    note.dataset.gone = head.dataset.job || "";
    note.textContent = "This job was removed: its runs went with it unless it was removed " +
      "with --keep-history. ";
    var back = document.createElement("a");
    back.href = "/";
    back.textContent = "All jobs";
    note.appendChild(back);
    head.replaceWith(note);
  }

  function parse(html) {
    var t = document.createElement("template");
    t.innerHTML = html.trim();
    return t.content.firstElementChild;
  }

  // A run the page lists nowhere yet: a job's history on its first page gains a row.
  function addRun(jobId, runId) {
    var bodies = all('tbody[data-runs-of="' + jobId + '"][data-first-page]');
    if (!bodies.length) return;
    var key = "run:" + runId;
    if (inflight[key]) {
      inflight[key] = "again";
      return;
    }
    inflight[key] = true;
    fetchHtml("/ui/run-row/" + runId).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (!html) return;
      bodies.forEach(function (body) {
        if (!body.isConnected || body.querySelector('[data-run="' + runId + '"]')) return;
        var row = parse(html);
        if (!row) return;
        all("tr.none", body).forEach(function (none) { none.remove(); });
        // In the history's order (newest, i.e. highest id, first), whatever order the
        // fetches of several new runs (an attempt and its retry) came back in.
        var older = Array.from(body.children).find(function (tr) {
          return Number(tr.dataset.run) < Number(runId);
        });
        body.insertBefore(row, older || null);
        ages(row);
      });
    }).catch(function () {}).then(function () {
      settle(key, function () { all('[data-run="' + runId + '"]').forEach(want); });
    });
  }

  function everything(selector) {
    // A fragment inside another one read again comes with it: a jobs table's rows are
    // not fetched one by one besides the table (a change to two jobs, or a worker
    // connecting, was 101 requests and 101 database connections per open page).
    var els = all(selector);
    els.filter(function (el) {
      return !els.some(function (other) { return other !== el && other.contains(el); });
    }).forEach(want);
  }

  // ---------------------------------------------------------------- events

  function onJob(jobId, structural) {
    var found = all('[data-job="' + jobId + '"]');
    found.forEach(want);
    if (!structural) return;
    // The job changed (or a run of it, by a path that names only the job): a run's
    // detail of it reads itself again too.
    all('[data-run-job="' + jobId + '"]').forEach(want);
    if (!found.length) everything('[data-live="jobs"]');
  }

  function onRun(d) {
    // A pause names only the run: the job showing it as outstanding reads itself again.
    if (d.job_id == null) all('[data-outstanding="' + d.run + '"]').forEach(want);
    else onJob(d.job_id, false);
    var found = all('[data-run="' + d.run + '"]');
    found.forEach(want);
    all('[data-chain~="' + d.run + '"]').forEach(want); // a detail listing it as an attempt
    if (!found.length && d.job_id != null) addRun(d.job_id, d.run);
    if (d.retry && d.job_id != null) addRun(d.job_id, d.retry); // a retry, waiting
    everything('[data-live="status"]');
  }

  function onProgress(d) {
    all('[data-progress-run="' + d.run + '"]').forEach(function (box) {
      var bar = box.querySelector("progress");
      if (bar) {
        if (typeof d.percent === "number") bar.value = d.percent;
        else bar.removeAttribute("value");
      }
      text(box, ".pct", typeof d.percent === "number" ? Math.round(d.percent) + " %" : "");
      text(box, ".step", d.label || "");
      text(box, ".pmsg", d.message || "");
    });
  }

  function text(root, selector, value) {
    var el = root.querySelector(selector);
    if (el) el.textContent = value;
  }

  function listen() {
    var live = document.getElementById("live");
    var down = false;
    var source = new EventSource("/ui/events");
    function state(on, words) {
      if (!live) return;
      live.textContent = words;
      live.className = "live " + (on ? "on" : "off");
      live.title = on ? "Following the daemon's events" : "Not connected: reconnecting";
    }
    source.onopen = function () {
      state(true, "live");
      if (down) everything("[data-src]"); // events may have been missed meanwhile
      down = false;
    };
    source.onerror = function () {
      down = true;
      state(false, "reconnecting");
    };
    function on(kind, handle) {
      source.addEventListener(kind, function (e) {
        var data = {};
        try { data = JSON.parse(e.data); } catch (err) { return; }
        handle(data);
      });
    }
    on("run", onRun);
    on("progress", onProgress);
    on("job", function (d) { onJob(d.job_id, true); });
    on("jobs", function () { everything('[data-live="jobs"], [data-job], [data-run-job]'); });
    on("worker", function () {
      everything('[data-live="status"], [data-live="jobs"], [data-job]');
    });
    on("status", function () { everything('[data-live="status"]'); });
    on("missed", function () { everything("[data-src]"); });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  // ---------------------------------------------------------------- actions

  function toast(message, bad) {
    var box = document.getElementById("toast");
    if (!box) return;
    box.textContent = message;
    box.className = bad ? "show bad" : "show";
    clearTimeout(box._hide);
    box._hide = setTimeout(function () { box.className = ""; }, 4000);
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.matches || !form.matches("form[data-fetch]")) return;
    ev.preventDefault();
    // Sent urlencoded, as the browser itself posts the form without this script.
    var body = new URLSearchParams(new FormData(form, ev.submitter || undefined));
    var buttons = all("button", form);
    buttons.forEach(function (b) { b.disabled = true; });
    fetch(form.action, {
      method: "POST",
      body: body,
      credentials: "same-origin",
      headers: { "X-Requested-With": "fetch", Accept: "application/json" },
    }).then(function (r) {
      if (r.status === 401) { location.assign("/signin"); return null; }
      return r.json().catch(function () {
        return { ok: false, message: "refused (" + r.status + ")" };
      });
    }).then(function (answer) {
      if (!answer) return;
      toast(answer.message, !answer.ok);
      var host = form.closest("[data-src]");
      if (host) want(host);
      if (answer.ok && answer.run) {
        all('[data-run="' + answer.run + '"]').forEach(want);
      }
    }).catch(function () {
      toast("not sent: is the daemon running?", true);
    }).then(function () {
      buttons.forEach(function (b) { b.disabled = false; });
    });
  });

  // Filters apply as soon as one is chosen (the Apply button stays for JS-less use).
  // A filter goes back to the first page; a choice that lists the same rows (the
  // sparklines' span) keeps the page it was made on: its hidden field, disabled for
  // every other change (and without this script), is sent.
  document.addEventListener("change", function (ev) {
    var form = ev.target.form;
    if (!form || !form.hasAttribute("data-autosubmit")) return;
    all("input[data-kept-by]", form).forEach(function (input) {
      input.disabled = input.dataset.keptBy !== ev.target.name;
    });
    form.submit();
  });

  // ---------------------------------------------------------------- ages

  function relative(ms) {
    var size = Math.abs(ms) / 1000;
    var amount;
    if (size < 1) return "just now";
    if (size < 60) amount = Math.floor(size) + " s";
    else if (size < 3600) amount = Math.floor(size / 60) + " min";
    else if (size < 48 * 3600) amount = Math.floor(size / 3600) + " h";
    else amount = Math.floor(size / 86400) + " days";
    return ms > 0 ? "in " + amount : amount + " ago";
  }

  function ages(root) {
    var now = Date.now() + skew;
    all("time[data-rel]", root).forEach(function (t) {
      var at = Date.parse(t.getAttribute("datetime"));
      if (!isNaN(at)) t.textContent = relative(at - now);
    });
  }

  function start() {
    var server = Date.parse(document.body.dataset.serverTime || "");
    if (!isNaN(server)) skew = server - Date.now();
    if (document.body.dataset.live !== "on") return;
    listen();
    setInterval(function () { ages(document); }, AGES_EVERY);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
