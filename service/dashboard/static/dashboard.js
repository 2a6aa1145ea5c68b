/* The admin dashboard: a hash-routed page over /v1/admin/... (nothing else is requested).
   The admin key lives in sessionStorage only; every value from the API is inserted as text. */
"use strict";

(function () {
  const KEY = "ppr.adminKey";
  const $ = (id) => document.getElementById(id);
  const view = () => $("view");
  const fmt = (v) => (v === null || v === undefined ? "—" : window.Charts.fmt(v));
  const eps = (v) => (v === null || v === undefined ? "—" : Number(v).toFixed(4));
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  const when = (iso) => (iso ? iso.replace("T", " ").slice(0, 19) + " UTC" : "never");

  /* DOM builder: h("div", {class: "x", onclick: f}, "text", child, ...) */
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "class") node.className = v;
      else if (v === true) node.setAttribute(k, "");
      else node.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  class ApiError extends Error {
    constructor(status, body) {
      const err = (body && body.error) || {};
      super(err.message || `HTTP ${status}`);
      this.status = status;
      this.code = err.code || "http_error";
      this.details = err.details;
    }
  }

  async function api(path, options) {
    const key = sessionStorage.getItem(KEY);
    const init = Object.assign({ headers: {} }, options || {});
    init.headers = Object.assign({ Authorization: `Bearer ${key}`, Accept: "application/json" }, init.headers);
    if (init.json !== undefined) {
      init.body = JSON.stringify(init.json);
      init.headers["Content-Type"] = "application/json";
    }
    const response = await fetch(path, init);
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    if (!response.ok) {
      const error = new ApiError(response.status, body);
      if (response.status === 401) { signOut(error.message); }
      throw error;
    }
    return body;
  }

  function qs(params) {
    const search = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) search.set(k, v);
    const s = search.toString();
    return s ? "?" + s : "";
  }

  function card(title, ...body) {
    return h("section", { class: "card" }, title ? h("h2", {}, title) : null, ...body);
  }

  function stat(label, value, note, cls) {
    return h("div", { class: "stat " + (cls || "") }, h("div", { class: "stat-label" }, label),
      h("div", { class: "stat-value" }, value), note ? h("div", { class: "stat-note" }, note) : null);
  }

  function errorBox(error) {
    return h("p", { class: "error", role: "alert" }, `${error.code ? error.code + ": " : ""}${error.message}`);
  }

  function usageBar(fraction) {
    const pct = Math.max(0, Math.min(1, fraction || 0));
    const meter = h("meter", { min: 0, max: 1, low: 0.6, high: 0.8, optimum: 0, value: pct.toFixed(4),
      title: `${(100 * (fraction || 0)).toFixed(1)}% of cap` });
    return meter;
  }

  function accountLink(id, text) {
    return h("a", { href: `#/accounts/${id}` }, text || `#${id}`);
  }

  function typeBadge(type) {
    return h("span", { class: `badge badge-${type}` }, type);
  }

  function accountRowsTable(rows, opts) {
    const compact = opts && opts.compact;
    const head = compact
      ? ["Account", "Type", "Node", "Spent ε", "Cap ε", "Used"]
      : ["Account", "Type", "Node", "Cap ε", "δ", "Spent ε", "Remaining ε", "Used", "Charges", "Last query"];
    const body = rows.map((r) => {
      const cells = compact
        ? [accountLink(r.account_id, r.label ? `#${r.account_id} ${r.label}` : `#${r.account_id}`), typeBadge(r.type),
          r.node_id || "—", eps(r.spent_epsilon), eps(r.cap_epsilon), usageBar(r.used_fraction)]
        : [accountLink(r.account_id, `#${r.account_id}`), typeBadge(r.type), r.node_id || (r.label || "—"),
          eps(r.cap_epsilon), r.delta.toExponential(1), eps(r.spent_epsilon),
          h("span", { class: r.used_fraction > 1 ? "over" : "" }, eps(r.remaining_epsilon)),
          usageBar(r.used_fraction), String(r.charges), when(r.last_charge_at)];
      return h("tr", { "data-account": r.account_id }, cells.map((c) => h("td", {}, c)));
    });
    return h("table", { class: "table" + (compact ? " compact" : "") },
      h("thead", {}, h("tr", {}, head.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, body.length ? body : h("tr", {}, h("td", { colspan: head.length, class: "muted" }, "No accounts"))));
  }

  /* when an account runs out at its recent rate (GET /v1/admin/run-out, .../accounts/{id}/run-out) */
  function runOutText(r) {
    if (r.days_left === null) return r.window_charges ? "not within a century at this rate" : "no charges in the window";
    if (r.days_left === 0) return "now (at its cap)";
    const days = r.days_left < 1 ? `${(24 * r.days_left).toFixed(1)} h` : `${r.days_left.toFixed(1)} days`;
    return `${r.runs_out_at.slice(0, 10)} (in ${days})`;
  }

  function projectionNote(page) {
    return `Runs out on: the live charges of the last ${fmt(page.window_days)} days, composed by the RDP accountant, ` +
      "repeated at the same rate and added to the spend so far; the date is when that reaches the cap at the account's δ. " +
      `${page.near_cap_total} near their cap` + (page.scanned < page.near_cap_total ? `, the ${page.scanned} most used projected.` : ".");
  }

  function runOutTable(page) {
    const head = ["Account", "Node", "Spent ε", "Cap ε", "Used", "Charges, 7 days", "Runs out on"];
    const body = page.items.map(({ account: r, run_out: o }) => h("tr", { "data-account": r.account_id },
      [accountLink(r.account_id, r.label ? `#${r.account_id} ${r.label}` : `#${r.account_id}`), r.node_id || "—",
        eps(r.spent_epsilon), eps(r.cap_epsilon), usageBar(r.used_fraction), String(o.window_charges),
        h("span", { class: o.days_left !== null && o.days_left < 7 ? "warn-text" : "", "data-testid": "runs-out-on" }, runOutText(o))]
        .map((c) => h("td", {}, c))));
    return h("table", { class: "table compact", id: "run-out" },
      h("thead", {}, h("tr", {}, head.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, body.length ? body : h("tr", {}, h("td", { colspan: head.length, class: "muted" }, "No accounts near their cap"))));
  }

  function pager(page, onGo) {
    const from = page.total ? page.offset + 1 : 0;
    const to = Math.min(page.offset + page.items.length, page.total);
    return h("div", { class: "pager" },
      h("span", { class: "muted", "data-testid": "page-info" }, `${from}–${to} of ${page.total.toLocaleString("en-US")}`),
      h("button", { class: "button ghost", type: "button", disabled: page.offset === 0,
        onclick: () => onGo(Math.max(0, page.offset - page.limit)) }, "‹ Previous"),
      h("button", { class: "button ghost", type: "button", disabled: to >= page.total,
        onclick: () => onGo(page.offset + page.limit) }, "Next ›"));
  }

  /* --- sign-in ------------------------------------------------------------------------------ */

  async function signIn(key) {
    sessionStorage.setItem(KEY, key);
    try {
      const me = await api("/v1/admin/me");
      return me;
    } catch (error) {
      sessionStorage.removeItem(KEY);
      if (error.status === 403) {
        throw new Error("This key belongs to a user or service account. The dashboard needs an admin API key.");
      }
      if (error.status === 401) throw new Error("Unknown or revoked API key.");
      throw error;
    }
  }

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    showSignIn(message);
  }

  function showSignIn(message) {
    $("nav").hidden = true;
    $("session").hidden = true;
    view().replaceChildren();
    $("sign-in").hidden = false;
    const err = $("sign-in-error");
    err.hidden = !message;
    err.textContent = message || "";
    $("api-key").value = "";
    $("api-key").focus();
  }

  async function start() {
    $("sign-in-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const key = $("api-key").value.trim();
      try {
        await signIn(key);
        $("api-key").value = "";
        await enter();
      } catch (error) {
        showSignIn(error.message);
      }
    });
    $("sign-out").addEventListener("click", () => { signOut(""); location.hash = ""; });
    window.addEventListener("hashchange", route);
    if (sessionStorage.getItem(KEY)) {
      try { await enter(); } catch (error) { showSignIn(error.message); }
    } else {
      showSignIn("");
    }
  }

  async function enter() {
    const me = await api("/v1/admin/me");
    $("sign-in").hidden = true;
    $("nav").hidden = false;
    $("session").hidden = false;
    $("who").textContent = `admin #${me.account_id}${me.label ? " · " + me.label : ""}`;
    if (!location.hash || location.hash === "#") location.hash = "#/overview";
    else await route();
  }

  async function route() {
    if (!sessionStorage.getItem(KEY)) return;
    const parts = location.hash.replace(/^#\/?/, "").split("/");
    const [name, arg] = parts;
    for (const a of document.querySelectorAll("#nav a")) {
      a.classList.toggle("active", a.dataset.view === (name || "overview"));
    }
    const views = { overview: overviewView, accounts: arg ? () => accountView(Number(arg)) : accountsView,
      exposure: exposureView, synthesis: synthesisView, audit: auditView };
    const render = views[name] || overviewView;
    view().replaceChildren(h("p", { class: "muted loading" }, "Loading…"));
    try {
      await render();
    } catch (error) {
      view().replaceChildren(errorBox(error));
    }
  }

  /* --- overview ----------------------------------------------------------------------------- */

  async function overviewView() {
    const [usage, refusals, spenders, exposure, graph, health, runOut] = await Promise.all([
      api("/v1/admin/usage?hours=48"), api("/v1/admin/refusals?hours=168"), api("/v1/admin/spenders?limit=8"),
      api("/v1/admin/exposure"), api("/v1/admin/graph/degrees"), api("/v1/admin/health"),
      api("/v1/admin/run-out?limit=8&window_days=7")]);
    const root = h("div", { class: "grid", id: "overview" });
    root.appendChild(h("div", { class: "stats span-2" },
      stat("Queries, last 48 h", usage.queries.toLocaleString("en-US")),
      stat("Per-query ε charged, 48 h", fmt(usage.epsilon), "a volume, not a composed spend"),
      stat("Refusals, last 7 days", refusals.total.toLocaleString("en-US")),
      stat("Graph-wide exposure ε", eps(exposure.epsilon),
        exposure.cap_epsilon ? `cap ${fmt(exposure.cap_epsilon)} at δ ${exposure.delta.toExponential(1)}` : `no cap · δ ${exposure.delta.toExponential(1)}`,
        exposure.cap_epsilon && exposure.epsilon > 0.8 * exposure.cap_epsilon ? "warn" : ""),
      stat("Near cap", String(spenders.near_cap_total), `≥ ${Math.round(spenders.near_cap_fraction * 100)}% used · ${spenders.over_cap_total} over`,
        spenders.near_cap_total ? "warn" : "")));

    const hourLabel = (iso) => iso.slice(11, 13) + "h";
    const queriesChart = h("div", { class: "chart-box", id: "chart-queries" });
    const epsChart = h("div", { class: "chart-box", id: "chart-eps" });
    root.appendChild(card("Queries per hour (UTC)", queriesChart));
    root.appendChild(card("ε charged per hour (per-query ε summed)", epsChart));

    const reasons = Object.entries(refusals.by_reason);
    root.appendChild(card("Refusals by reason · last 7 days",
      reasons.length
        ? h("table", { class: "table compact", id: "refusals" }, h("tbody", {}, reasons.map(([r, n]) =>
          h("tr", {}, h("td", {}, h("code", {}, r)), h("td", { class: "num" }, String(n)),
            h("td", { class: "bar-cell" }, h("meter", { min: 0, max: refusals.total, value: n }))))))
        : h("p", { class: "muted" }, "No refusals in this window.")));

    const exposureChart = h("div", { class: "chart-box", id: "chart-exposure-mini" });
    root.appendChild(card("Graph-wide exposure over time", exposureChart,
      h("p", {}, h("a", { href: "#/exposure" }, "Open the exposure view ›"))));

    root.appendChild(card("Top spenders (composed ε)", accountRowsTable(spenders.top, { compact: true })));
    root.appendChild(card(`Near their cap (≥ ${Math.round(runOut.near_cap_fraction * 100)}%), by when they run out`,
      runOutTable(runOut), h("p", { class: "muted", id: "run-out-note" }, projectionNote(runOut))));

    const histo = h("div", { class: "chart-box", id: "chart-degrees" });
    root.appendChild(card("Loaded graph",
      h("dl", { class: "facts" },
        h("dt", {}, "Version"), h("dd", {}, h("code", {}, graph.version.slice(0, 16))),
        h("dt", {}, "Nodes"), h("dd", {}, graph.nodes.toLocaleString("en-US")),
        h("dt", {}, "Edges"), h("dd", {}, graph.edges.toLocaleString("en-US")),
        h("dt", {}, "Degree"), h("dd", {}, `min ${graph.degree_min} · mean ${graph.degree_mean.toFixed(1)} · max ${graph.degree_max}`),
        h("dt", {}, "Degrees from"), h("dd", {}, graph.degree_source === "cache" ? "degree cache" : "graph (cache refilled)")),
      h("h3", {}, "Degree histogram (nodes per degree bucket)"), histo));

    root.appendChild(card("Service health",
      h("dl", { class: "facts" },
        h("dt", {}, "Database"), h("dd", {}, h("span", { class: "dot-status " + (health.database.status === "ok" ? "ok" : "bad") }),
          `${health.database.status} · ${health.database.dialect}` + (health.database.latency_ms !== null ? ` · ${health.database.latency_ms.toFixed(1)} ms` : "")),
        h("dt", {}, "In-flight charges"), h("dd", {}, `${fmt(health.database.in_flight_charges)}` +
          (health.database.oldest_in_flight_seconds !== null ? ` · oldest ${health.database.oldest_in_flight_seconds.toFixed(0)} s` : "")),
        h("dt", {}, "Workers"), h("dd", {}, `${health.workers.live_pids.length} live of ${health.workers.configured} configured · pid ${health.workers.pid} up ${Math.round(health.workers.uptime_seconds)} s`),
        h("dt", {}, "Cache"), h("dd", {}, h("span", { class: "dot-status " + (health.cache.status === "ok" ? "ok" : "bad") }),
          `${health.cache.backend} · ${health.cache.status}`)),
      h("h3", {}, `Cache hit rates (${health.cache.scope})`),
      h("table", { class: "table compact", id: "cache-rates" },
        h("thead", {}, h("tr", {}, ["Cache", "Hits", "Misses", "Hit rate"].map((t) => h("th", {}, t)))),
        h("tbody", {}, health.cache.rates.map((r) => h("tr", {}, h("td", {}, r.cache), h("td", { class: "num" }, String(r.hits)),
          h("td", { class: "num" }, String(r.misses)),
          h("td", { class: "num" }, r.hit_rate === null ? "—" : (100 * r.hit_rate).toFixed(1) + "%")))))));
    view().replaceChildren(root);

    window.Charts.barChart(queriesChart, { bars: usage.series.map((s) => ({ label: hourLabel(s.at), value: s.queries,
      title: `${s.at.slice(0, 13)}h: ${s.queries} queries, ${s.refunded} refunded, ${s.refusals} refused` })),
    yLabel: "queries", title: "queries per hour" });
    window.Charts.barChart(epsChart, { bars: usage.series.map((s) => ({ label: hourLabel(s.at), value: s.epsilon })),
      yLabel: "ε", cls: "alt", title: "epsilon per hour" });
    drawExposure(exposureChart, exposure, 200);
    window.Charts.barChart(histo, { bars: graph.histogram.map((b) => ({ label: b.low === b.high ? String(b.low) : `${b.low}–${b.high}`,
      value: b.nodes })), yLabel: "nodes", cls: "alt2", height: 180, labelEvery: 1, title: "degree histogram" });
  }

  function drawExposure(container, exposure, height) {
    /* hourly totals: each hour's value is reached by the end of that hour (drawn as a ramp
       across the hour, since when within it is not known at this resolution) */
    const now = Date.now();
    const points = exposure.series.map((p) => ({ x: Math.min(Date.parse(p.at) + 3600e3, now), y: p.epsilon }));
    if (points.length) {
      points.unshift({ x: Date.parse(exposure.series[0].at), y: 0 });
      points.push({ x: Math.max(now, points[points.length - 1].x), y: exposure.epsilon });
    }
    const lines = exposure.cap_epsilon ? [{ y: exposure.cap_epsilon, label: `cap ε ${fmt(exposure.cap_epsilon)}`, cls: "cap" }] : [];
    window.Charts.lineChart(container, { series: [{ name: "composed exposure ε", cls: "s1", points }],
      lines, yLabel: "ε", height, title: "graph-wide exposure" });
  }

  /* --- accounts table ----------------------------------------------------------------------- */

  const tableState = { q: "", type: "", status: "any", sort: "spent", order: "desc", offset: 0, limit: 50 };

  async function accountsView() {
    const form = h("form", { class: "filters", id: "account-filters" },
      h("label", {}, "Search", h("input", { name: "q", type: "search", value: tableState.q, placeholder: "id, node or label", id: "filter-q" })),
      h("label", {}, "Type", select("type", tableState.type, [["", "any"], ["user", "user"], ["service", "service"], ["admin", "admin"]])),
      h("label", {}, "Status", select("status", tableState.status, [["any", "any"], ["active", "has charges"], ["idle", "no charges"],
        ["near_cap", "near cap (≥ 80%)"], ["over_cap", "over cap"]])),
      h("label", {}, "Sort by", select("sort", tableState.sort, [["spent", "spent ε"], ["remaining", "remaining ε"], ["used", "share of cap used"],
        ["cap", "cap ε"], ["charges", "charges"], ["last_charge", "last query"], ["account_id", "account id"], ["created", "created"]])),
      h("label", {}, "Order", select("order", tableState.order, [["desc", "descending"], ["asc", "ascending"]])),
      h("button", { type: "submit", class: "button primary", id: "apply-filters" }, "Apply"));
    const results = h("div", { id: "account-results" });
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const data = new FormData(form);
      for (const k of ["q", "type", "status", "sort", "order"]) tableState[k] = String(data.get(k) || "");
      tableState.offset = 0;
      load();
    });
    form.addEventListener("change", (e) => { if (e.target.tagName === "SELECT") form.requestSubmit(); });
    view().replaceChildren(card("Accounts", form, results));

    async function load() {
      results.replaceChildren(h("p", { class: "muted" }, "Loading…"));
      try {
        const page = await api("/v1/admin/account-table" + qs({ q: tableState.q, type: tableState.type, status: tableState.status,
          sort: tableState.sort, order: tableState.order, limit: tableState.limit, offset: tableState.offset }));
        results.replaceChildren(pager(page, (o) => { tableState.offset = o; load(); }), accountRowsTable(page.items),
          pager(page, (o) => { tableState.offset = o; load(); }));
      } catch (error) {
        results.replaceChildren(errorBox(error));
      }
    }
    await load();
  }

  function select(name, value, options) {
    return h("select", { name, id: `filter-${name}` }, options.map(([v, t]) => h("option", { value: v, selected: v === value }, t)));
  }

  /* --- one account -------------------------------------------------------------------------- */

  async function accountView(id) {
    const account = await api(`/v1/admin/accounts/${id}`);
    const [curve, keys, runOut] = await Promise.all([api(`/v1/admin/accounts/${id}/curve`), api(`/v1/admin/accounts/${id}/keys`),
      api(`/v1/admin/accounts/${id}/run-out`)]);
    const service = account.type === "service" ? await api(`/v1/admin/accounts/${id}/service-usage`) : null;
    const b = account.budget;
    const root = h("div", { class: "grid", id: "account" });
    root.appendChild(h("div", { class: "span-2 title-row" },
      h("h1", {}, `Account #${account.account_id} `, typeBadge(account.type)),
      h("p", { class: "muted" }, [account.node_id ? `node ${account.node_id}` : null, account.label, `created ${when(account.created_at)}`].filter(Boolean).join(" · ")),
      h("p", {}, h("a", { href: "#/accounts" }, "‹ All accounts"))));

    const budgetStats = h("div", { class: "stats", id: "budget-stats" });
    // With a budget period, the lifetime figure and the current period's side by side.
    const periodStat = (bv) => bv.period ? h("div", { class: "stat", id: "period-spent" },
      h("div", { class: "stat-label" }, `This ${bv.period}: spent ε (composed)`),
      h("div", { class: "stat-value", "data-testid": "period-spent-value" }, eps(bv.period_spent_epsilon)),
      h("div", { class: "stat-note", "data-testid": "period-resets" }, `of its cap ${eps(bv.period_cap_epsilon)}; renews ${when(bv.period_resets_at)}`)) : null;
    const renderBudget = (bv, flag) => budgetStats.replaceChildren(...[
      stat(bv.period ? "Lifetime spent ε (composed)" : "Spent ε (composed)", eps(bv.spent_epsilon), `at δ ${bv.delta.toExponential(2)}`),
      periodStat(bv),
      stat(bv.period ? "Lifetime cap ε" : "Cap ε", eps(bv.cap_epsilon)),
      h("div", { class: "stat " + (flag ? "bad" : ""), id: "remaining" }, h("div", { class: "stat-label" }, "Remaining ε"),
        h("div", { class: "stat-value", "data-testid": "remaining-value" }, eps(bv.remaining_epsilon)),
        flag ? h("div", { class: "stat-note" }, "cap is below what is already spent: every further query is refused") : null),
      stat("Charges", String(bv.charges))].filter(Boolean));
    renderBudget(b, b.cap_epsilon < b.spent_epsilon);
    const chart = h("div", { class: "chart-box", id: "chart-curve" });
    const note = h("p", { class: "muted", id: "curve-note" });
    const drawCurve = (c) => {
      const saved = c.naive_epsilon - c.composed_epsilon;
      note.textContent = c.charges
        ? `${c.charges} live charges. Composed by the RDP accountant at δ ${c.delta.toExponential(1)}: ε ${eps(c.composed_epsilon)}; ` +
          `the per-query ε added up: ${eps(c.naive_epsilon)}` + (saved > 0 ? ` (composition saves ${eps(saved)}).` : ".")
        : "No live charges yet.";
      window.Charts.lineChart(chart, {
        series: [{ name: "composed (RDP accountant)", cls: "s1", points: c.points.map((p) => ({ x: Date.parse(p.at), y: p.composed_epsilon })), step: true },
          { name: "naive sum of per-query ε", cls: "s2", points: c.points.map((p) => ({ x: Date.parse(p.at), y: p.naive_epsilon })), step: true }],
        lines: [{ y: c.cap_epsilon, label: `cap ε ${fmt(c.cap_epsilon)}`, cls: "cap" }],
        yLabel: "cumulative ε", title: "cumulative epsilon" });
    };
    const runsOut = h("p", { id: "account-run-out" });
    const showRunOut = (o) => runsOut.replaceChildren(h("strong", {}, "Runs out on: "),
      h("span", { "data-testid": "runs-out-on" }, runOutText(o)),
      h("span", { class: "muted" }, ` · at the rate of its last ${fmt(o.window_days)} days (${plural(o.window_charges, "charge")}, ` +
        `ε ${eps(o.window_epsilon)} composed), composed forward with its spend by the RDP accountant`));
    const onSaved = async (bv, flag) => {
      renderBudget(bv, flag);
      const [c, o] = await Promise.all([api(`/v1/admin/accounts/${id}/curve`), api(`/v1/admin/accounts/${id}/run-out`)]);
      drawCurve(c);
      showRunOut(o);
    };
    root.appendChild(card("Budget", budgetStats, runsOut, budgetForm(account, onSaved)));
    root.appendChild(card("Cumulative ε over time", chart, note));

    if (service) root.appendChild(card("Service account", serviceSection(service)));
    root.appendChild(card("API keys", keysSection(account)));
    const charges = h("div", { id: "charges" });
    root.appendChild(h("div", { class: "span-2" }, card(account.type === "service" ? "Charges to this account" : "Charges", charges)));
    if (service) {
      const made = h("div", { id: "charges-made" });
      root.appendChild(h("div", { class: "span-2" }, card("Queries it made (charged to itself or to seed users)", made)));
      chargesTable(made, id, "principal");
    }
    view().replaceChildren(root);

    drawCurve(curve);
    showRunOut(runOut);
    chargesTable(charges, id, "charged");
  }

  function budgetForm(account, renderBudget) {
    const b = account.budget;
    const cap = h("input", { type: "number", step: "any", min: "0", name: "cap_epsilon", id: "cap-input", value: b.cap_epsilon });
    const delta = h("input", { type: "text", name: "delta", id: "delta-input", value: String(b.delta), inputmode: "decimal" });
    const message = h("div", { id: "budget-message", role: "status" });
    const form = h("form", { class: "inline-form", id: "budget-form" },
      h("label", {}, "Cap ε", cap), h("label", {}, "δ", delta),
      h("button", { type: "submit", class: "button", id: "budget-review" }, "Review change…"), message);
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const body = {};
      const capValue = Number(cap.value), deltaValue = Number(delta.value);
      if (cap.value.trim() === "" || !Number.isFinite(capValue) || capValue <= 0) {
        message.replaceChildren(h("p", { class: "error" }, "Cap ε must be a finite number above 0."));
        return;
      }
      if (!(deltaValue > 0 && deltaValue < 1)) {
        message.replaceChildren(h("p", { class: "error" }, "δ must be in (0, 1)."));
        return;
      }
      if (capValue !== b.cap_epsilon) body.cap_epsilon = capValue;
      if (deltaValue !== b.delta) body.delta = deltaValue;
      if (!Object.keys(body).length) {
        message.replaceChildren(h("p", { class: "muted" }, "Nothing to change."));
        return;
      }
      try {
        const preview = await api(`/v1/admin/accounts/${account.account_id}/budget/preview`, { method: "POST", json: body });
        const confirm = h("button", { type: "button", class: "button primary", id: "budget-confirm" }, "Confirm change");
        const cancel = h("button", { type: "button", class: "button ghost" }, "Cancel");
        message.replaceChildren(h("div", { class: "confirm", id: "budget-confirmation" },
          h("p", {}, h("strong", {}, "Confirm: "),
            `cap ε ${fmt(b.cap_epsilon)} → ${fmt(preview.cap_epsilon)}, δ ${b.delta.toExponential(2)} → ${preview.delta.toExponential(2)}. ` +
            `Spent at this δ: ${eps(preview.spent_epsilon)}; remaining would be ${eps(preview.remaining_epsilon)}. This is written to the audit log.`),
          preview.cap_below_spent ? h("p", { class: "warn-text" }, "The new cap is below what is already spent: the account's further queries will be refused.") : null,
          h("div", { class: "actions" }, confirm, cancel)));
        cancel.addEventListener("click", () => message.replaceChildren());
        confirm.addEventListener("click", async () => {
          confirm.disabled = true;
          try {
            const result = await api(`/v1/admin/accounts/${account.account_id}/budget`, { method: "PUT", json: body });
            Object.assign(b, result);
            await renderBudget(result, result.cap_below_spent);
            message.replaceChildren(h("p", { class: result.cap_below_spent ? "warn-text" : "ok-text", id: "budget-saved" },
              `Saved. Remaining ε ${eps(result.remaining_epsilon)}.` + (result.cap_below_spent ? " Flagged: cap below spent." : "")));
          } catch (error) {
            message.replaceChildren(errorBox(error));
          }
        });
      } catch (error) {
        message.replaceChildren(errorBox(error));
      }
    });
    return form;
  }

  function serviceSection(s) {
    return h("div", {},
      h("dl", { class: "facts", id: "service-usage" },
        h("dt", {}, "Modes"), h("dd", {}, s.modes.join(", ")),
        h("dt", {}, "May create seed accounts"), h("dd", {}, s.may_create_seed_accounts ? "yes" : "no"),
        h("dt", {}, "Quota (24 h, to others)"), h("dd", {}, `${fmt(s.quota_epsilon)} ε` + (s.quota_is_default ? " (default)" : "")),
        h("dt", {}, "Used in the last 24 h"), h("dd", {}, `${eps(s.used_24h_epsilon)} ε `, usageBar(s.used_24h_epsilon / s.quota_epsilon)),
        h("dt", {}, "Charged to others"), h("dd", {}, `${plural(s.charges_to_others, "charge")} · ${eps(s.epsilon_to_others)} per-query ε · ${plural(s.accounts_charged, "account")}`),
        h("dt", {}, "Has read (composed)"), h("dd", { id: "service-read" }, `${eps(s.read_epsilon)} ε over ${plural(s.read_releases, "distinct release")}`,
          s.read_cap_epsilon == null ? " · no read cap" : h("span", {}, ` · read cap ${fmt(s.read_cap_epsilon)} ε `, usageBar(s.read_epsilon / s.read_cap_epsilon)))),
      s.top_charged.length ? h("table", { class: "table compact" },
        h("thead", {}, h("tr", {}, ["Charged account", "Charges", "Per-query ε"].map((t) => h("th", {}, t)))),
        h("tbody", {}, s.top_charged.map((c) => h("tr", {}, h("td", {}, accountLink(c.account_id)), h("td", { class: "num" }, String(c.charges)),
          h("td", { class: "num" }, eps(c.epsilon)))))) : null);
  }

  function keysSection(account) {
    const box = h("div", { id: "keys" });
    const shown = h("div", { id: "new-key" });
    async function load() {
      const keys = await api(`/v1/admin/accounts/${account.account_id}/keys`);
      box.replaceChildren(h("table", { class: "table compact" },
        h("thead", {}, h("tr", {}, ["Key", "Prefix", "Created", "Status", ""].map((t) => h("th", {}, t)))),
        h("tbody", {}, keys.map((k) => {
          const revoke = k.revoked_at ? null : h("button", { type: "button", class: "button danger small", "data-key": k.key_id }, "Revoke…");
          if (revoke) revoke.addEventListener("click", async () => {
            if (revoke.dataset.armed !== "1") { revoke.dataset.armed = "1"; revoke.textContent = "Confirm revoke"; return; }
            try { await api(`/v1/admin/keys/${k.key_id}/revoke`, { method: "POST" }); await load(); } catch (error) { box.appendChild(errorBox(error)); }
          });
          return h("tr", {}, h("td", {}, `#${k.key_id}`), h("td", {}, h("code", {}, k.prefix + "…")), h("td", {}, when(k.created_at)),
            h("td", {}, k.revoked_at ? h("span", { class: "badge badge-revoked" }, "revoked " + when(k.revoked_at)) : h("span", { class: "badge badge-active" }, "active")),
            h("td", {}, revoke));
        }))));
    }
    const issue = h("button", { type: "button", class: "button", id: "issue-key" }, "Issue a new key");
    issue.addEventListener("click", async () => {
      try {
        const key = await api(`/v1/admin/accounts/${account.account_id}/keys`, { method: "POST" });
        shown.replaceChildren(h("div", { class: "confirm" },
          h("p", {}, h("strong", {}, "New key (shown once; copy it now): ")),
          h("input", { type: "text", readonly: true, value: key.api_key, class: "key-once", id: "new-key-value" }),
          h("p", { class: "muted" }, "Only its hash is stored. Closing this page forgets it.")));
        await load();
      } catch (error) {
        shown.replaceChildren(errorBox(error));
      }
    });
    load();
    return h("div", {}, box, h("div", { class: "actions" }, issue), shown);
  }

  /* the parameters shown in the charges table (all of them in the cell's tooltip) */
  const SHOWN_PARAMS = ["delta", "steps", "noisy_steps", "noise_scale", "beta"];

  function chargesTable(container, id, role) {
    const state = { offset: 0, limit: 20, state: "" };
    async function load() {
      const page = await api(`/v1/admin/accounts/${id}/charges` + qs({ role, limit: state.limit, offset: state.offset, state: state.state }));
      const stateSelect = h("select", { "aria-label": "state" }, [["", "all states"], ["admitted", "admitted"], ["released", "released"], ["refunded", "refunded"]]
        .map(([v, t]) => h("option", { value: v, selected: v === state.state }, t)));
      stateSelect.addEventListener("change", () => { state.state = stateSelect.value; state.offset = 0; load(); });
      container.replaceChildren(h("div", { class: "filters" }, h("label", {}, "State", stateSelect)),
        h("table", { class: "table compact" },
          h("thead", {}, h("tr", {}, ["Charge", "When", "Seed", "Mechanism", "Mode", "ε", "Parameters", role === "charged" ? "By" : "Charged to", "State"].map((t) => h("th", {}, t)))),
          h("tbody", {}, page.items.length ? page.items.map((c) => h("tr", {},
            h("td", {}, `#${c.charge_id}`), h("td", {}, when(c.created_at)), h("td", {}, c.seed), h("td", {}, c.mechanism), h("td", {}, c.mode),
            h("td", { class: "num" }, fmt(c.epsilon)),
            h("td", { class: "params", title: JSON.stringify(c.params) }, Object.entries(c.params)
              .filter(([k]) => SHOWN_PARAMS.includes(k)).map(([k, v]) => `${k}=${typeof v === "number" ? fmt(v) : v}`).join(" ")),
            h("td", {}, accountLink(role === "charged" ? c.principal_account_id : c.charged_account_id)),
            h("td", {}, h("span", { class: `badge state-${c.state}` }, c.state))))
            : h("tr", {}, h("td", { colspan: 9, class: "muted" }, "No charges")))),
        pager(page, (o) => { state.offset = o; load(); }));
    }
    load().catch((error) => container.replaceChildren(errorBox(error)));
  }

  /* --- exposure ----------------------------------------------------------------------------- */

  async function exposureView() {
    const [exposure, runs] = await Promise.all([api("/v1/admin/exposure"), api("/v1/admin/synthetic" + qs({ limit: 100 }))]);
    const chart = h("div", { class: "chart-box", id: "chart-exposure" });
    const modes = Object.entries(exposure.by_mode);
    view().replaceChildren(h("div", { class: "grid", id: "exposure" },
      h("div", { class: "stats span-2" },
        stat("Composed exposure ε", eps(exposure.epsilon), `δ ${exposure.delta.toExponential(2)}`),
        stat("Cap ε", exposure.cap_epsilon ? eps(exposure.cap_epsilon) : "none", exposure.cap_epsilon ? `${(100 * exposure.epsilon / exposure.cap_epsilon).toFixed(1)}% used` : "PPR_GRAPH_CAP_EPSILON not set"),
        stat("Live charges", exposure.charges.toLocaleString("en-US")),
        stat("Graph-wide releases", String(exposure.graph_releases))),
      h("div", { class: "span-2" }, card("Graph-wide exposure over time", chart,
        h("p", { class: "muted" }, "Every live charge of every account and every graph-wide release, composed in time order by the RDP accountant: an upper bound on what all accounts together can have learned about any one edge."))),
      card("By mode", h("table", { class: "table compact", id: "exposure-modes" },
        h("thead", {}, h("tr", {}, ["Mode", "Charges", "Composed ε"].map((t) => h("th", {}, t)))),
        h("tbody", {}, modes.length ? modes.map(([m, v]) => h("tr", {}, h("td", {}, m), h("td", { class: "num" }, String(v.charges)), h("td", { class: "num" }, eps(v.epsilon))))
          : h("tr", {}, h("td", { colspan: 3, class: "muted" }, "No charges"))))),
      card("Check", h("dl", { class: "facts" }, h("dt", {}, "From the exposure shards"), h("dd", {}, eps(exposure.shards_epsilon)),
        h("dt", {}, "Recomposed from charges"), h("dd", {}, eps(exposure.epsilon)))),
      h("div", { class: "span-2" }, card("Synthesis runs in this exposure", synthesisTable(runs.jobs.filter((j) => j.charge_state !== "refunded"), "exposure-synthesis"),
        h("p", { class: "muted" }, "Each synthesis run is one graph-wide release, composed into the exposure above with its charge (refunded runs are not). ",
          h("a", { href: "#/synthesis" }, "All runs ›"))))));
    drawExposure(chart, exposure, 320);
  }

  /* --- synthesis runs ----------------------------------------------------------------------- */

  async function download(job) {
    const key = sessionStorage.getItem(KEY);
    const response = await fetch(job.file_url, { headers: { Authorization: `Bearer ${key}` } });
    if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
    const url = URL.createObjectURL(await response.blob());
    const link = h("a", { href: url, download: `synthetic-${job.method}-${job.job_id.slice(0, 12)}.txt` });
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  function synthesisTable(jobs, id) {
    const unit = (u) => (u === "node" ? "node-level DP" : "edge-level DP");
    return h("table", { class: "table compact", id },
      h("thead", {}, h("tr", {}, ["When", "Method", "Privacy unit", "ε", "δ", "Charge", "State", "Source", "Edges", "File"].map((t) => h("th", {}, t)))),
      h("tbody", {}, jobs.length ? jobs.map((j) => h("tr", { class: "synthesis-run", "data-job": j.job_id },
        h("td", {}, when(j.created_at)), h("td", {}, h("code", {}, j.method)), h("td", {}, unit(j.privacy_unit)),
        h("td", { class: "num" }, eps(j.epsilon)), h("td", { class: "num" }, j.delta ? j.delta.toExponential(1) : "0"),
        h("td", {}, h("span", { class: `badge state-${j.charge_state}` }, j.epsilon === 0 ? "free (post-processing)" : j.charge_state)),
        h("td", {}, j.state === "running" ? `running ${(100 * j.progress).toFixed(0)}%` : j.state,
          j.error ? h("div", { class: "muted" }, `${j.error.code}: ${j.error.message}`) : null),
        h("td", {}, j.source === "api" ? "API" : "command"), h("td", { class: "num" }, j.edges === null ? "—" : j.edges.toLocaleString("en-US")),
        h("td", {}, j.file_url ? h("button", { type: "button", class: "button ghost download", onclick: (e) => download(j).catch((error) => e.target.replaceWith(errorBox(error))) }, "Download") : "—")))
        : h("tr", {}, h("td", { colspan: 10, class: "muted" }, "No synthesis runs"))));
  }

  async function synthesisView() {
    const runs = await api("/v1/admin/synthetic" + qs({ limit: 100 }));
    view().replaceChildren(card(`Synthesis runs (${runs.total})`, synthesisTable(runs.jobs, "synthesis-runs"),
      h("p", { class: "muted" }, "Synthetic graphs published with ",
        h("code", {}, "python -m service synthesize"), " or ", h("code", {}, "POST /v1/admin/synthetic"),
        ". communities and chung_lu are edge-level DP, privdpr node-level DP: not the same promise. chung_lu reuses the degree release and charges nothing of its own.")));
  }

  /* --- audit log ---------------------------------------------------------------------------- */

  async function auditView() {
    const state = { action: "", account_id: "", offset: 0, limit: 50 };
    const results = h("div", { id: "audit-results" });
    const form = h("form", { class: "filters", id: "audit-filters" });
    view().replaceChildren(card("Audit log", form, results));
    async function load() {
      const page = await api("/v1/admin/audit-log" + qs({ action: state.action, account_id: state.account_id, limit: state.limit, offset: state.offset }));
      const actions = [["", "any action"]].concat(page.actions.map((a) => [a, a]));
      form.replaceChildren(
        h("label", {}, "Action", h("select", { name: "action", id: "audit-action" }, actions.map(([v, t]) => h("option", { value: v, selected: v === state.action }, t)))),
        h("label", {}, "Account (actor or target)", h("input", { name: "account_id", type: "number", min: 1, value: state.account_id, id: "audit-account" })),
        h("button", { type: "submit", class: "button primary" }, "Apply"));
      results.replaceChildren(h("table", { class: "table compact" },
        h("thead", {}, h("tr", {}, ["#", "When", "Actor", "Action", "Target", "Details"].map((t) => h("th", {}, t)))),
        h("tbody", {}, page.items.length ? page.items.map((e) => h("tr", {}, h("td", {}, String(e.id)), h("td", {}, when(e.created_at)),
          h("td", {}, e.actor_account_id ? accountLink(e.actor_account_id) : "operator (CLI)"), h("td", {}, h("code", {}, e.action)),
          h("td", {}, e.target_account_id ? accountLink(e.target_account_id) : "—"),
          h("td", { class: "params" }, JSON.stringify(e.details))))
          : h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No entries")))),
      pager(page, (o) => { state.offset = o; load(); }));
    }
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const data = new FormData(form);
      state.action = String(data.get("action") || "");
      state.account_id = String(data.get("account_id") || "");
      state.offset = 0;
      load().catch((error) => results.replaceChildren(errorBox(error)));
    });
    await load();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
