// The recall inspector: vanilla JS over the service's JSON API on the same origin.
//
// Guarantees (docs/inspector.md):
// - the tenant key lives in sessionStorage only (never localStorage, a cookie or a URL) and is
//   sent only as "Authorization: Bearer KEY";
// - no text from the server is ever parsed as HTML: every node is built with createElement and
//   every string goes in through textContent / text nodes (no HTML-parsing sink is used here);
// - user text sits in its own <bdi>, so a right-to-left override (U+202E) in a turn reorders
//   only that turn's text, never the speaker, timestamp or label beside it.
"use strict";

(function () {
  const KEY_SLOT = "memsifter.inspector.key";
  const PAGE_SIZE = 20;
  // The page is served at <prefix>/ui/, the API at <prefix>/v1/...: resolve against the page.
  const API_BASE = new URL("../", window.location.href);

  const $ = (id) => document.getElementById(id);
  let sessionsOffset = 0;
  let sessionsUser = null;

  // ---------------------------------------------------------------------------------- DOM help

  // el("div", {class: "x"}, "text", node, ...): strings become text nodes, never markup.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "dataset") Object.assign(node.dataset, value);
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  // Text a user (or a model) wrote, isolated for the bidi algorithm: <bdi> ends every
  // embedding and override its text opens, and takes its direction from its own first letter.
  function userText(value, attrs) {
    return el("bdi", attrs || {}, value === null || value === undefined ? "" : String(value));
  }

  function setText(node, text) {
    node.textContent = text === null || text === undefined ? "" : String(text);
  }

  function num(value, digits) {
    if (value === null || value === undefined) return "—";
    return typeof value === "number" ? value.toFixed(digits) : String(value);
  }

  function field(name, value) {
    return el("span", { class: "field" }, el("span", { class: "name" }, name), value);
  }

  function chips(words) {
    if (!words || words.length === 0) return el("div", { class: "chips muted" }, "no keywords");
    return el("div", { class: "chips" }, words.map((w) => userText(w, { class: "chip" })));
  }

  function kvTable(table, rows) {
    clear(table);
    for (const [name, value] of rows) {
      table.appendChild(el("tr", {}, el("th", {}, name), el("td", {}, value)));
    }
  }

  // ---------------------------------------------------------------------------------- messages

  // `text` and each of `details`: a string, or an array of strings and nodes (server text
  // wrapped in userText), written in order.
  function message(kind, text, details, requestId) {
    const box = el("div", { class: "message " + kind }, text);
    if (details && details.length) {
      box.appendChild(el("ul", {}, details.map((d) => el("li", {}, d))));
    }
    if (requestId) box.appendChild(el("div", { class: "muted mono" }, "request id: " + requestId));
    $("messages").appendChild(box);
    while ($("messages").childElementCount > 5) $("messages").removeChild($("messages").firstChild);
  }

  function clearMessages() {
    clear($("messages"));
  }

  class ApiError extends Error {
    constructor(status, body) {
      const err = body && typeof body === "object" && body.error ? body.error : null;
      super(err ? String(err.message) : "HTTP " + status);
      this.status = status;
      this.type = err ? String(err.type) : "http_" + status;
      this.fields = err && Array.isArray(err.fields) ? err.fields : [];
      this.fieldsTotal = err ? err.fields_total : 0;
      this.requestId = body && typeof body === "object" ? body.request_id : null;
    }
  }

  function showError(what, error) {
    if (error instanceof ApiError) {
      const details = error.fields.map((f) => [userText(f.field), ": ", userText(f.message)]);
      if (error.fieldsTotal > error.fields.length) {
        details.push("… and " + (error.fieldsTotal - error.fields.length) + " more");
      }
      const hint = error.status === 401 ? " (is the tenant key right?)" : "";
      message(
        "error",
        [what + " failed: " + error.status + " " + error.type + ": ", userText(error.message), hint],
        details,
        error.requestId,
      );
    } else {
      message("error", what + " failed: " + (error && error.message ? error.message : error));
    }
  }

  // --------------------------------------------------------------------------------------- key

  function storedKey() {
    try {
      return window.sessionStorage.getItem(KEY_SLOT) || "";
    } catch (e) {
      return "";
    }
  }

  function showKeyState() {
    const has = storedKey() !== "";
    setText($("key-state"), has ? "key set (this tab only)" : "no key");
    $("key-state").className = has ? "" : "muted";
  }

  function useKey(event) {
    if (event) event.preventDefault();
    const key = $("key").value.trim();
    if (key === "") {
      message("error", "Enter the tenant key first.");
      return;
    }
    window.sessionStorage.setItem(KEY_SLOT, key);
    $("key").value = "";
    showKeyState();
  }

  function forgetKey() {
    window.sessionStorage.removeItem(KEY_SLOT);
    $("key").value = "";
    showKeyState();
  }

  // --------------------------------------------------------------------------------------- API

  function userPath(user) {
    return "v1/users/" + encodeURIComponent(user);
  }

  function sessionPath(sessionId) {
    // Session ids may contain "/" (the route takes a path): encode each segment.
    return sessionId.split("/").map(encodeURIComponent).join("/");
  }

  async function api(method, path, body) {
    if ($("key").value.trim() !== "") useKey(); // typed but "Use key" not pressed
    const key = storedKey();
    if (key === "") throw new Error("no tenant key: enter one and press \u201cUse key\u201d");
    const headers = { Authorization: "Bearer " + key, Accept: "application/json" };
    const init = { method, headers, credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(new URL(path, API_BASE), init);
    let data = null;
    const type = response.headers.get("content-type") || "";
    if (type.includes("application/json")) {
      try {
        data = await response.json();
      } catch (e) {
        data = null;
      }
    }
    if (!response.ok) throw new ApiError(response.status, data);
    if (data === null) throw new Error("the response was not JSON (HTTP " + response.status + ")");
    return data;
  }

  function currentUser() {
    const user = $("user").value.trim();
    if (user === "") throw new Error("enter a user id");
    return user;
  }

  // ---------------------------------------------------------------------------------- sessions

  async function loadSessions(user, offset) {
    const data = await api("GET", userPath(user) + "/sessions?limit=" + PAGE_SIZE + "&offset=" + offset);
    sessionsUser = user;
    sessionsOffset = offset;
    const box = clear($("sessions"));
    box.className = "";
    setText($("sessions-total"), "(" + data.total + " for " + data.user_id + ")");
    if (data.sessions.length === 0) {
      box.className = "muted";
      box.appendChild(document.createTextNode("No sessions stored for this user."));
    } else {
      const rows = data.sessions.map((s) =>
        el(
          "tr",
          { dataset: { sessionId: s.session_id } },
          el("td", { class: "mono" }, s.session_id),
          el("td", {}, userText(s.date_text || s.date || "—")),
          el("td", {}, String(s.n_turns)),
          el("td", {}, String(s.n_pages)),
          el("td", {}, String(s.n_tokens)),
          el(
            "td",
            {},
            el(
              "button",
              {
                type: "button",
                class: "small secondary show-pages",
                onclick: () => run("Loading the session", () => loadSession(user, s.session_id)),
              },
              "Show pages",
            ),
          ),
        ),
      );
      box.appendChild(
        el(
          "table",
          { id: "sessions-table" },
          el(
            "thead",
            {},
            el("tr", {}, ["session", "date", "turns", "pages", "tokens", ""].map((h) => el("th", {}, h))),
          ),
          el("tbody", {}, rows),
        ),
      );
    }
    $("sessions-prev").disabled = offset <= 0;
    $("sessions-next").disabled = offset + data.sessions.length >= data.total;
  }

  function turnNode(t) {
    return el(
      "div",
      { class: "turn" },
      el("span", { class: "speaker" }, userText(t.speaker), ":"),
      userText(t.text),
      t.timestamp ? el("span", { class: "muted timestamp" }, "  (" + t.timestamp + ")") : null,
    );
  }

  async function loadSession(user, sessionId) {
    const data = await api("GET", userPath(user) + "/sessions/" + sessionPath(sessionId));
    const s = data.session;
    const box = clear($("session-detail"));
    box.appendChild(el("h3", {}, "Session " + s.session_id));
    box.appendChild(
      el(
        "div",
        { class: "page-head" },
        field("date", userText(s.date_text || s.date || "—")),
        field("turns", String(s.n_turns)),
        field("pages", String(s.n_pages)),
        field("tokens", String(s.n_tokens)),
        field("stored", s.created_at),
      ),
    );
    const pages = data.pages.map((p) =>
      el(
        "div",
        { class: "page", dataset: { pageId: p.page_id } },
        el("div", { class: "page-head" }, field("page", el("span", { class: "mono" }, p.page_id)), field("tokens", String(p.n_tokens))),
        el("div", { class: "muted" }, "keyword bookmarks:"),
        chips(p.keywords),
        el("div", { class: "text" }, p.turns.map(turnNode)),
      ),
    );
    box.appendChild(el("div", { class: "pages" }, pages));
  }

  // ------------------------------------------------------------------------------------- facts

  async function loadFacts(user) {
    const data = await api("GET", userPath(user) + "/facts");
    const box = clear($("facts"));
    box.className = "";
    if (data.facts.length === 0) {
      box.className = "muted";
      box.appendChild(document.createTextNode("No facts remembered for this user."));
      return;
    }
    const rows = data.facts.map((f) =>
      el(
        "tr",
        { dataset: { factId: f.fact_id } },
        el("td", {}, f.type),
        el("td", {}, userText(f.subject)),
        el("td", {}, userText(f.text)),
        el("td", {}, num(f.importance, 2)),
        el("td", {}, num(f.score, 3)),
        el("td", {}, f.expires_at || "—"),
        el("td", {}, userText(f.source || "—")),
      ),
    );
    box.appendChild(
      el(
        "table",
        { id: "facts-table" },
        el(
          "thead",
          {},
          el("tr", {}, ["type", "subject", "text", "importance", "score", "expires", "source"].map((h) => el("th", {}, h))),
        ),
        el("tbody", {}, rows),
      ),
    );
  }

  // ------------------------------------------------------------------------------------ recall

  async function recall(user) {
    const question = $("question").value;
    if (question.trim() === "") throw new Error("enter a question");
    const topK = Number.parseInt($("top-k").value, 10);
    const body = { question, top_k: Number.isFinite(topK) ? topK : 5 };
    const data = await api("POST", userPath(user) + "/recall", body);

    setText($("ranker"), data.ranker);
    setText($("recall-request-id"), data.request_id || "—");
    const t = data.timings || {};
    kvTable($("timings"), [
      ["index_load", t.index_load || "—"],
      ["index_ms", num(t.index_ms, 2)],
      ["coarse_ms", num(t.coarse_ms, 2)],
      ["proxy_ms", num(t.proxy_ms, 2)],
      ["model_ms", num(t.model_ms, 2)],
      ["total_ms", num(t.total_ms, 2)],
    ]);
    const p = data.parse || {};
    kvTable($("parse"), [
      ["status", p.status],
      ["error", p.error || "—"],
      ["completed", String(p.completed)],
      ["n_from_model", String(p.n_from_model)],
      ["dropped", String(p.dropped)],
      ["duplicates", String(p.duplicates)],
      ["shown", String(p.shown)],
      ["cut_by_coarse", String(p.cut_by_coarse)],
    ]);
    const think = $("think");
    if (data.think === null || data.think === undefined || data.think === "") {
      setText(think, "(no think text: " + (p.status === "not_applicable" ? "this ranker runs no model" : "the proxy gave none") + ")");
      think.classList.add("muted");
    } else {
      clear(think).appendChild(userText(data.think));
      think.classList.remove("muted");
    }
    setText($("hits-count"), "(" + data.hits.length + ")");
    const hits = clear($("hits"));
    if (data.hits.length === 0) hits.appendChild(el("li", { class: "muted" }, "No pages recalled."));
    for (const h of data.hits) {
      hits.appendChild(
        el(
          "li",
          { class: "hit", dataset: { pageId: h.page_id, rank: String(h.rank) } },
          el(
            "div",
            { class: "hit-head" },
            el("span", { class: "rank" }, "#" + h.rank),
            field("page", el("span", { class: "mono" }, h.page_id)),
            field("session", el("span", { class: "mono" }, h.session_id)),
          ),
          el(
            "div",
            { class: "hit-head" },
            field("score", num(h.score, 4)),
            field("coarse_score", num(h.coarse_score, 4)),
            field("bookmark_score", num(h.bookmark_score, 4)),
            field("date", userText(h.date_text || h.date || "—")),
            field("tokens", String(h.n_tokens)),
          ),
          chips(h.keywords),
          el("pre", { class: "text hit-text" }, userText(h.text)),
        ),
      );
    }
    $("recall-result").hidden = false;
  }

  // ------------------------------------------------------------------------------------ wiring

  let busy = 0;
  async function run(what, action) {
    busy += 1;
    document.body.setAttribute("aria-busy", "true");
    try {
      await action();
    } catch (error) {
      showError(what, error);
    } finally {
      busy -= 1;
      if (busy === 0) document.body.removeAttribute("aria-busy");
    }
  }

  function init() {
    $("key-form").addEventListener("submit", useKey);
    $("forget-key").addEventListener("click", forgetKey);
    $("user-form").addEventListener("submit", (event) => {
      event.preventDefault();
      clearMessages();
      run("Loading the user", async () => {
        const user = currentUser();
        clear($("session-detail"));
        // Both panels load even when one of them fails; each failure is its own message.
        const results = await Promise.allSettled([loadSessions(user, 0), loadFacts(user)]);
        results.forEach((r, i) => {
          if (r.status === "rejected") showError(i === 0 ? "Listing sessions" : "Listing facts", r.reason);
        });
      });
    });
    $("sessions-prev").addEventListener("click", () =>
      run("Listing sessions", () => loadSessions(sessionsUser, Math.max(0, sessionsOffset - PAGE_SIZE))),
    );
    $("sessions-next").addEventListener("click", () =>
      run("Listing sessions", () => loadSessions(sessionsUser, sessionsOffset + PAGE_SIZE)),
    );
    $("recall-form").addEventListener("submit", (event) => {
      event.preventDefault();
      clearMessages();
      run("Recall", () => recall(currentUser()));
    });
    showKeyState();
    document.body.dataset.ready = "1";
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
