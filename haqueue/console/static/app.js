// The haqueue console's pages: one page of HTML whose views (#/, #/queues, #/queue/NAME, #/connections,
// #/exchanges, #/audit) read the JSON API (design/console.md) and refresh their figures every second.
// The API is that of the primary's console when it answers, else of any broker of the cluster that does: when
// the broker it talks to dies, the page goes on with another (the session token is good at every broker).
"use strict";

const REFRESH_MS = 1000;      // figures refresh at most this often
const TIMEOUT_MS = 3000;      // a read that takes longer counts as its broker not answering
const ACTION_TIMEOUT_MS = 12000;  // an action may wait on the broker (a promotion waits up to 3 s): the API's 10 s, and some
const PAGE_SIZES = [25, 50, 100, 250, 500];
const CHART_MIN_SECONDS = 60;  // a rates chart spans at least this long
const PRIMARY_TRIES = 3;      // overviews asked for the primary before a change a backup refused is shown refused

const state = {
  base: "",                    // the console the API calls go to ("" = this page's own)
  token: sessionStorage.getItem("haqueue.token"),
  csrf: sessionStorage.getItem("haqueue.csrf"),
  user: null,
  brokers: [],                 // [{name, role, console}] as last seen: where to go when the current one dies
  names: {},                   // each broker's name by peer address, as last seen: for one that no longer answers
  busy: false,
  view: null,                  // the current view: {page, argument}
  charts: {},
  queues: {offset: 0, limit: 50, sort: "name", order: "asc", filter: "", shard: null},
  openConnections: new Set(),  // the connections whose links the Connections page shows
  owners: {},                  // a sharded cluster's: where one shard's queues are served, by "shard:K" or "queue:NAME"
};

// ---- the API -------------------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, message, body) { super(message); this.status = status; this.body = body || {}; }
}

// `options.session`: the {token, csrf} to send (default the page's own).
async function call(base, path, options = {}) {
  const headers = {}, session = options.session || state;
  if (session.token) headers["Authorization"] = "Bearer " + session.token;
  const method = options.method || "GET";
  if (method !== "GET") {
    headers["X-CSRF-Token"] = session.csrf || "";
    headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(base + path, {method, headers, body: options.body ? JSON.stringify(options.body) : undefined,
                                         credentials: base ? "omit" : "same-origin",
                                         signal: AbortSignal.timeout(method === "GET" ? TIMEOUT_MS : ACTION_TIMEOUT_MS)});
  } catch (e) {
    throw new ApiError(0, `no answer from ${base || location.origin} (${e.name})`);
  }
  const body = (response.headers.get("Content-Type") || "").startsWith("application/json") ? await response.json() : {};
  if (!response.ok) throw new ApiError(response.status, body.error || response.statusText, body);
  return body;
}

// A call to the current console; if it does not answer, the others are tried (the primary's first). A 401 asks for
// a login only if the page is still in the session the request was made in: one made before a logout may be
// answered after the next login.
async function api(path, options = {}) {
  const token = state.token;
  try {
    return await call(state.base, path, options);
  } catch (e) {
    if (e.status === 401) { if (token === state.token) showLogin(e.message); throw e; }
    if (e.status !== 0 || options.method && options.method !== "GET") throw e;
    await failOver();
    return call(state.base, path, options);
  }
}

// A request about one shard's queues (a sharded cluster): its primary's console answers it, and any other says
// which that is (421); `key` remembers it ("shard:K" for a table, "queue:NAME" for a queue's page).
async function owned(key, path, options = {}) {
  const base = state.owners[key];
  if (base !== undefined) {  // unless it no longer is that shard's primary: then ask again whose it is
    try { return await call(base, path, options); }
    catch (e) { if (e.status !== 0 && e.status !== 421 && !isBackup(e)) throw e; delete state.owners[key]; }
  }
  try {
    return await api(path, options);
  } catch (e) {
    if (e.status !== 421 || !e.body.console) throw e;
    state.owners[key] = baseOf(e.body.console);
    return call(state.owners[key], path, options);
  }
}

// The API's base for a console's URL ("" for this page's own).
function baseOf(url) { return url === location.origin + "/" ? "" : url.replace(/\/$/, ""); }

function consoles() {
  const own = location.origin + "/";
  const known = state.brokers.filter(b => b.console).sort((a, b) => (b.role === "primary") - (a.role === "primary"));
  const urls = known.map(b => b.console);
  if (!urls.includes(own)) urls.push(own);
  return urls.map(baseOf);
}

async function failOver() {
  const token = state.token;
  for (const base of consoles()) {
    if (base === state.base) continue;
    let overview;
    try {
      overview = await call(base, "/api/overview");
    } catch (e) {
      if (e.status === 401) { state.base = base; if (token === state.token) showLogin(e.message); throw e; }
      continue;
    }
    state.base = base;
    await learn(overview);
    return;
  }
  throw new ApiError(0, "no broker of the cluster answers");
}

// What an overview of the console the page talks to says: shown (show); then, if that console is not the
// primary's, the page talks to the primary's from then on, if it answers as the primary. True if the page now talks
// to the primary.
async function learn(overview) {
  show(overview);
  if (overview.broker.role === "primary") return true;
  const primary = state.brokers.find(b => b.role === "primary" && b.console);
  if (!primary || baseOf(primary.console) === state.base) return false;
  let there;
  try { there = await call(baseOf(primary.console), "/api/overview"); } catch (e) { return false; }
  if (there.broker.role !== "primary") return false;  // not yet, or no longer: the next overview tells
  state.base = baseOf(primary.console);
  show(there);
  return true;
}

// An overview in the header and, on the Overview, its tables: all from one answer, which is one reading of the
// cluster (two answers may disagree while a broker takes over).
function show(overview) {
  if (overview.brokers.length) state.brokers = overview.brokers;
  for (const b of overview.brokers) if (b.name && b.address) state.names[b.address] = b.name;
  const here = overview.broker;
  text(byId("talking-to"), `talking to ${here.name} (${here.role}${here.state ? ", " + here.state : ""}) at ` +
       `${state.base || location.origin}`);
  if (state.view && state.view.page === "overview" && byId("brokers-box")) views.overview.draw(overview);
}

// A change a backup refused (409), which the page sends to the primary instead.
function isBackup(e) { return e.status === 409 && !!e.body.backup; }

// Moves the page to the primary's console, as the overview of the console it talks to names it; true if the page
// talks to the primary. Asked again a second later while it names none that answers: a console whose first reading
// of the cluster was not ready, or a failover under way.
async function toPrimary() {
  for (let tries = 1; ; tries++) {
    let overview;
    try { overview = await api("/api/overview"); } catch (e) { return false; }
    if (await learn(overview)) return true;
    if (tries === PRIMARY_TRIES) return false;
    await new Promise(resolve => setTimeout(resolve, REFRESH_MS));
  }
}

// ---- small DOM helpers ---------------------------------------------------------------------------------
function byId(id) { return document.getElementById(id); }
function text(node, value) { node.textContent = value; return node; }
function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) if (child !== null && child !== undefined) node.append(child);
  return node;
}
function number(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en"); }
function size(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}
function rate(n) { return n === null || n === undefined ? "–" : Number(n).toFixed(1); }
// The replication protocols a broker speaks, [oldest, newest]: "1–2", or "2" for one.
function protocols(p) { return !p ? "" : p[0] === p[1] ? String(p[1]) : `${p[0]}–${p[1]}`; }
// An action's result, naming the action (role=alert): it stays until the next action or navigation. `page`: the
// route it belongs to (an action that leads to another page, as a delete does, shows its result there).
function notice(message, ok = false, page = location.hash) {
  const node = byId("notice");
  node.hidden = !message;
  node.className = ok ? "ok" : "";
  node.dataset.page = page;
  text(node, message || "");
}
// What keeps the page's figures from being fresh (a read refused, no broker answering), apart from the actions'
// results: until a refresh works or the page changes. Set only when it changes, so it is not announced each second.
function problem(message) {
  const node = byId("problem");
  if (node.textContent === (message || "")) return;
  node.hidden = !message;
  text(node, message || "");
}
function table(id, headers, rows, caption) {
  return el("table", {id}, caption ? el("caption", {class: "muted", text: caption}) : null,
            el("thead", {}, el("tr", {}, headers.map(h => el("th", {scope: "col", class: h.num ? "num" : null},
                                                              h.node || h.label)))),
            el("tbody", {}, rows));
}
function cell(value, num = false, cls = null) {
  return el("td", {class: [num ? "num" : null, cls].filter(Boolean).join(" ") || null}, value);
}
function figure(label, value, id) {
  return el("li", {}, el("span", {class: "value", id, text: value}), el("span", {class: "muted", text: label}));
}

// ---- charts (uPlot, copied from npm by make setup) ------------------------------------------------------------
function chart(key, container, points, title) {
  if (typeof uPlot === "undefined") {
    container.replaceChildren(el("p", {class: "muted", text: "(no chart: the charting library is not installed; run make setup)"}));
    return;
  }
  const data = [points.map(p => p[0]), points.map(p => p[1]), points.map(p => p[2])];
  const existing = state.charts[key];
  if (existing && existing.root.isConnected) { existing.setData(data); return; }
  const width = Math.max(320, Math.min(container.clientWidth || 900, 1100));
  state.charts[key] = new uPlot({title, width, height: 220, scales: {x: {range: timeRange}},
    series: [{}, {label: "in msg/s", stroke: "#1f5fbf", width: 2}, {label: "out msg/s", stroke: "#157f3b", width: 2}],
    axes: [{}, {label: "msg/s"}]}, data, container);
}

// The time axis: the points' span, and at least the minute up to the last (uPlot spread one point over years).
function timeRange(u, min, max) {
  const end = Number.isFinite(max) ? max : Date.now() / 1000;
  return [Number.isFinite(min) ? Math.min(min, end - CHART_MIN_SECONDS) : end - CHART_MIN_SECONDS, end];
}

// ---- login ---------------------------------------------------------------------------------------------
function showLogin(message) {
  byId("login").hidden = false;
  byId("page").hidden = true;
  if (message && message !== "log in first") problem(message);
  byId("login-user").focus();
}

async function login(event) {
  event.preventDefault();
  const user = byId("login-user").value, password = byId("login-password").value;
  notice("");
  try {
    const answer = await call(state.base, "/api/login", {method: "POST", body: {user, password}});
    state.token = answer.token; state.csrf = answer.csrf; state.user = answer.user;
    sessionStorage.setItem("haqueue.token", answer.token);
    sessionStorage.setItem("haqueue.csrf", answer.csrf);
    byId("login-password").value = "";
    byId("login").hidden = true;
    byId("page").hidden = false;
    begin();
  } catch (e) {
    notice(refusal(`log in as ${user}`, e));
  }
}

// The page leaves the session at once; the console it talks to ends it at every broker of the cluster.
function logout() {
  const session = {token: state.token, csrf: state.csrf};
  state.token = state.csrf = state.user = null;
  sessionStorage.clear();
  byId("login-user").value = "";
  notice("");
  showUser();
  showLogin();
  endSession(session);
}

async function endSession(session) {
  for (const base of [state.base, ...consoles().filter(b => b !== state.base)]) {
    try { await call(base, "/api/logout", {method: "POST", session}); return; }
    catch (e) { if (e.status !== 0) return; }  // no answer: the next console
  }
}

function showUser() {
  text(byId("user"), state.user ? `logged in as ${state.user}` : "");
  byId("logout").hidden = !state.user || state.user === "anonymous";
}

// ---- actions -------------------------------------------------------------------------------------------------
// A change, named `what`, sent with `send` (the console the page talks to): the page's last action from now on, its
// result in the notice, `done(answer)` saying what it did and `then` the page it leads to. A backup refuses changes
// (409): the page then moves to the primary's console and sends it there.
async function act(what, path, options, {send = api, done = () => "done", then = null} = {}) {
  notice("");
  let answer;
  try {
    try {
      answer = await send(path, options);
    } catch (e) {
      if (!isBackup(e) || !await toPrimary()) throw e;
      answer = await send(path, options);
    }
  } catch (e) {
    notice(refusal(what, e));
    return null;
  }
  notice(`${what}: ${done(answer)}`, true, then || location.hash);
  if (then) location.hash = then;
  return answer;
}
function refusal(what, e) { return `${what}: ${e.status ? "refused" : "failed"}: ${e.message}`; }

// ---- views -----------------------------------------------------------------------------------------------
const views = {
  overview: {
    render() {
      return el("div", {},
        el("h2", {id: "brokers-title", text: "Brokers"}), el("div", {id: "brokers-box"}), el("div", {id: "shards-box"}),
        el("div", {id: "mirror-box"}),
        el("h2", {text: "Totals"}), el("ul", {class: "figures", id: "totals"}),
        el("h2", {id: "rates-title", text: "Message rates (this broker, all queues)"}), el("div", {id: "rates", class: "chart"}));
    },
    async refresh() { await learn(await api("/api/overview")); },  // learn draws it (show)
    draw(o) {
      const named = b => b.name || state.names[b.address];  // one that never answered this console: as seen before
      const brokers = o.brokers.map(b => el("tr", {"data-name": named(b) || b.address, "data-role": b.role || "",
                                                   "data-state": b.state || "", "data-ready": String(!!b.ready),
                                                   "data-release": b.release || ""},
        el("th", {scope: "row", text: named(b) || "?"}), cell(b.address || ""),
        cell(b.role || "–", false, b.role ? "role-" + b.role : null), cell(b.state || "", false, "state-" + b.state),
        cell(number(b.epoch), true), cell(b.sync || ""),
        cell(b.role === "backup" && b.ready !== undefined ? (b.ready ? "ready" : "no") : "", false),
        cell(number(b.lag), true), cell(b.lag_seconds === undefined || b.lag_seconds === null ? "–" : b.lag_seconds.toFixed(3), true),
        cell(b.catchup && b.catchup.total ? `${b.catchup.done}/${b.catchup.total}` : "–", true),
        cell(b.release || ""), cell(protocols(b.protocols)),
        cell(b.console ? el("a", {href: b.console, text: b.console}) : (b.error || "")),
        cell(o.admin && b.role === "backup" && b.console ?
             el("button", {type: "button", "aria-label": `promote ${b.name}`, onclick: () => promote(b)}, "Promote") : "")));
      byId("brokers-box").replaceChildren(
        o.admin ? el("p", {class: "muted", id: "primary", text: `primary: ${primaryOf(o)}` +
                                              (o.public ? `; clients connect to ${o.public}` : "") + `; read ${o.age} s ago`}) :
                  el("p", {class: "muted", text: "Only an admin sees the brokers' state and lag."}),
        table("brokers", ["broker", "address", "role", "state", {label: "epoch", num: 1}, "sync", "ready",
                          {label: "lag msgs", num: 1}, {label: "lag s", num: 1}, {label: "catch-up", num: 1},
                          "release", "protocols", "console", ""].map(h => typeof h === "string" ? {label: h} : h), brokers));
      const t = o.totals;
      const temporary = t && t.queues_left_out.temporary;
      byId("totals").replaceChildren(...(t ? [figure("queues" + (temporary ? ` (${number(temporary)} temporary not counted)` : ""),
                                                     number(t.queues), "total-queues"),
        figure("messages", number(t.messages), "total-messages"), figure("bytes", size(t.bytes)),
        figure("connections", number(t.connections)), figure("memory alarm", t.memory_alarm ? "ON" : "off")] :
        [el("li", {class: "muted", text: "(admins only)"})]));
      byId("rates-title").hidden = !o.rates;
      if (o.rates) chart("overview", byId("rates"), o.rates, "");
      byId("mirror-box").replaceChildren(...(o.mirror ? mirrorSection(o.mirror) : []));
      if (o.broker.shard !== undefined) text(byId("brokers-title"), `Brokers of shard ${o.broker.shard}`);
      if (o.shards) byId("shards-box").replaceChildren(el("h2", {text: "Shards"}), table("shards",
        ["shard", "primary", "preferred", "direct address", {label: "epoch", num: 1}, "backups as the primary sees them"]
          .map(h => typeof h === "string" ? {label: h} : h),
        o.shards.map(s => el("tr", {"data-shard": s.shard, "data-primary": s.primary || ""},
          el("th", {scope: "row", text: s.shard}),
          cell(!s.primary ? "none" : s.console ? el("a", {href: s.console, text: s.primary}) : s.primary),
          cell(s.preferred), cell(s.public), cell(number(s.epoch), true),
          cell(s.backups.map(b => `${b.name} ${b.state}` + (b.lag === null || b.lag === undefined ? "" :
                                  `, lag ${number(b.lag)} (${b.lag_seconds.toFixed(3)} s)`)).join("; "))))));
    },
  },

  queues: {
    render() {
      const q = state.queues;
      const sizeSelect = el("select", {id: "page-size", onchange: e => { q.limit = +e.target.value; q.offset = 0; refreshNow(); }},
                            PAGE_SIZES.map(n => el("option", {value: n, selected: n === q.limit, text: n})));
      return el("div", {},
        el("h2", {text: "Queues"}),
        el("form", {class: "inline", role: "search", onsubmit: e => e.preventDefault()},
          el("label", {for: "queue-filter", text: "Filter"}),
          el("input", {id: "queue-filter", type: "search", value: q.filter, placeholder: "part of a name, or a glob",
                       oninput: e => { q.filter = e.target.value; q.offset = 0; refreshNow(); }}),
          el("label", {for: "page-size", text: "Rows"}), sizeSelect,
          el("label", {for: "queue-shard", id: "queue-shard-label", hidden: true, text: "Shard"}),
          el("select", {id: "queue-shard", hidden: true,
                        onchange: e => { q.shard = +e.target.value; q.offset = 0; refreshNow(); }})),
        el("div", {id: "queues-box"}),
        el("div", {class: "pager"},
          el("button", {type: "button", id: "prev", onclick: () => { q.offset = Math.max(0, q.offset - q.limit); refreshNow(); }}, "Previous"),
          el("span", {id: "page-info", "aria-live": "polite"}),
          el("button", {type: "button", id: "next", onclick: () => { q.offset += q.limit; refreshNow(); }}, "Next")),
        el("h2", {text: "Declare a queue"}),
        el("form", {class: "inline", id: "declare-queue", onsubmit: declareQueue},
          el("label", {for: "new-queue", text: "Name"}), el("input", {id: "new-queue", required: true}),
          el("label", {for: "new-queue-args", text: "Arguments (JSON)"}),
          el("input", {id: "new-queue-args", placeholder: '{"max_depth": 1000}'}),
          el("button", {type: "submit"}, "Declare")));
    },
    async refresh() {
      const q = state.queues;
      const params = new URLSearchParams({offset: q.offset, limit: q.limit, sort: q.sort, order: q.order, filter: q.filter});
      if (q.shard !== null) params.set("shard", q.shard);
      const answer = await owned("shard:" + q.shard, "/api/queues?" + params);
      if (answer.shards) shardChoice(answer);
      const columns = [["name", "queue"], ["depth", "depth", 1], ["bytes", "bytes", 1], ["rate_in", "in/s", 1],
                       ["rate_out", "out/s", 1], ["consumers", "consumers", 1], [null, "x-replicate"], [null, "limits"]];
      const headers = columns.map(([key, label, num]) => ({num, label, node: key ? el("button", {type: "button",
        "aria-sort": q.sort === key ? (q.order === "asc" ? "ascending" : "descending") : null,
        "aria-label": `sort by ${label}`, onclick: () => sortBy(key)},
        label + (q.sort === key ? (q.order === "asc" ? " ▲" : " ▼") : "")) : null}));
      const rows = answer.items.map(r => el("tr", {"data-name": r.name},
        el("th", {scope: "row"}, el("a", {href: "#/queue/" + encodeURIComponent(r.name), text: r.name})),
        cell(number(r.depth), true, "depth"), cell(size(r.bytes), true), cell(rate(r.rate_in), true),
        cell(rate(r.rate_out), true), cell(number(r.consumers), true), cell(r.replicate || "–"),
        cell(limits(r))));
      byId("queues-box").replaceChildren(table("queues-table", headers, rows, `${number(answer.total)} queues` +
                                               (answer.shards ? ` of shard ${answer.shard}, on ${answer.broker}` : "")));
      text(byId("page-info"), answer.total ? `${answer.offset + 1}–${answer.offset + answer.items.length} of ${number(answer.total)}` : "none");
      byId("prev").disabled = answer.offset === 0;
      byId("next").disabled = answer.offset + answer.items.length >= answer.total;
    },
  },

  queue: {
    render(name) {
      return el("div", {},
        el("h2", {}, "Queue ", el("span", {id: "queue-name", text: name})),
        el("p", {class: "muted", id: "queue-where"}),
        el("ul", {class: "figures", id: "queue-figures"}),
        el("p", {},
          el("button", {type: "button", id: "purge", class: "danger", onclick: () => purge(name)}, "Purge"), " ",
          el("button", {type: "button", id: "delete-queue", class: "danger", onclick: () => deleteQueue(name)}, "Delete")),
        el("h2", {text: "Message rates"}), el("div", {id: "queue-rates", class: "chart"}),
        el("h2", {text: "First messages (not taken)"}), el("div", {id: "peek-box"}),
        el("p", {class: "muted", id: "queue-args"}));
    },
    async refresh(name) {
      const path = "/api/queues/" + encodeURIComponent(name), at = (p, o) => owned("queue:" + name, p, o);
      const q = await at(path);  // first: it finds the queue's shard
      const peek = await at(path + "/messages?count=10").catch(e => ({error: e.message}));
      byId("queue-figures").replaceChildren(figure("depth", number(q.depth), "queue-depth"), figure("bytes", size(q.bytes)),
        figure("consumers", number(q.consumers)), figure("enqueued", number(q.enqueued)),
        figure("dequeued", number(q.dequeued)), figure("expired", number(q.expired)),
        figure("dead-lettered", number(q.dead_lettered)), figure("x-replicate", q.replicate || "–"));
      text(byId("queue-args"), "arguments: " + JSON.stringify(q.args));
      const owner = state.owners["queue:" + name];
      text(byId("queue-where"), `on ${q.broker}` + (owner !== undefined ? ` (its shard's primary), at ${owner || location.origin}` : ""));
      chart("queue:" + name, byId("queue-rates"), q.rates, "");
      byId("peek-box").replaceChildren(peek.error ? el("p", {class: "bad", text: peek.error}) :
        peek.messages.length === 0 ? el("p", {class: "muted", text: "(empty)"}) :
        table("peek", ["seq", "state", "size", "properties", "body"].map(label => ({label, num: label === "seq" || label === "size"})),
          peek.messages.map(m => el("tr", {}, cell(m.seq, true), cell(m.state), cell(size(m.size), true),
            cell(JSON.stringify({...m.properties, ...m.application_properties})),
            el("td", {class: "body-preview", text: m.error || m.body})))));
    },
  },

  connections: {
    render() { return el("div", {}, el("h2", {text: "Connections"}), el("div", {id: "connections-box"})); },
    async refresh() {
      const answer = await api("/api/connections?limit=500");
      const open = answer.items.filter(c => state.openConnections.has(c.name));
      const links = Object.fromEntries(await Promise.all(open.map(async c => [c.name,
        await api(`/api/connections/${encodeURIComponent(c.name)}`).then(read => read.links, e => e.message)])));
      const headers = ["peer", "user", "container", "client", {label: "links", num: 1}, "TLS", ""];
      byId("connections-box").replaceChildren(table("connections", headers.map(h => typeof h === "string" ? {label: h} : h),
        answer.items.flatMap(c => [el("tr", {"data-name": c.name}, el("th", {scope: "row", text: c.name}), cell(c.user || "–"),
          cell(c.container), cell(`${c.product} ${c.version}`.trim()),
          cell(el("button", {type: "button", "aria-expanded": String(c.name in links), "aria-label": `links of ${c.name}`,
                             onclick: () => toggleLinks(c.name)}, number(c.links)), true),
          cell(c.tls ? "yes" : "no"),
          cell(el("button", {type: "button", class: "danger", "aria-label": `close connection from ${c.name}`,
                             onclick: () => closeConnection(c.name)}, "Close"))),
          c.name in links ? linkRow(c.name, links[c.name], headers.length) : null]),
        `${number(answer.total)} connections`));
    },
  },

  exchanges: {
    render() {
      return el("div", {},
        el("h2", {text: "Exchanges"}), el("div", {id: "exchanges-box"}),
        el("form", {class: "inline", onsubmit: declareExchange},
          el("label", {for: "new-exchange", text: "Name"}), el("input", {id: "new-exchange", required: true}),
          el("label", {for: "new-exchange-type", text: "Type"}),
          el("select", {id: "new-exchange-type"}, ["direct", "topic", "fanout"].map(t => el("option", {text: t}))),
          el("button", {type: "submit"}, "Declare exchange")),
        el("h2", {text: "Bindings"}), el("div", {id: "bindings-box"}),
        el("form", {class: "inline", onsubmit: bind},
          el("label", {for: "bind-exchange", text: "Exchange"}), el("input", {id: "bind-exchange", required: true}),
          el("label", {for: "bind-queue", text: "Queue"}), el("input", {id: "bind-queue", required: true}),
          el("label", {for: "bind-key", text: "Key"}), el("input", {id: "bind-key"}),
          el("button", {type: "submit"}, "Bind")));
    },
    async refresh() {
      const [exchanges, bindings] = await Promise.all([api("/api/exchanges?limit=500"), api("/api/bindings?limit=500")]);
      byId("exchanges-box").replaceChildren(table("exchanges", [{label: "exchange"}, {label: "type"}, {label: "arguments"}, {label: ""}],
        exchanges.items.map(x => el("tr", {"data-name": x.name}, el("th", {scope: "row", text: x.name}), cell(x.type),
          cell(JSON.stringify(x.args)), cell(el("button", {type: "button", class: "danger", "aria-label": `delete exchange ${x.name}`,
                                                          onclick: () => deleteExchange(x.name)}, "Delete")))),
        `${number(exchanges.total)} exchanges`));
      byId("bindings-box").replaceChildren(table("bindings", [{label: "exchange"}, {label: "queue"}, {label: "key"}, {label: ""}],
        bindings.items.map(b => el("tr", {}, cell(b.exchange), cell(b.queue), cell(b.key),
          cell(el("button", {type: "button", class: "danger", "aria-label": `unbind ${b.queue} from ${b.exchange}`,
                             onclick: () => unbind(b)}, "Unbind")))),
        `${number(bindings.total)} bindings`));
    },
  },

  audit: {
    render() { return el("div", {}, el("h2", {text: "Replication audit"}), el("div", {id: "audit-box"})); },
    async refresh() {
      const box = byId("audit-box");
      if (box.dataset.shown) return;  // a report changes rarely: read once per visit
      const answer = await api("/api/audit").catch(e => ({error: e.message}));
      box.dataset.shown = "1";
      if (answer.error || !answer.report) {
        box.replaceChildren(el("p", {class: "muted", text: answer.error ||
          `No report yet: run haqueue audit lag --events ${answer.events} --out ${answer.events}/report`}));
        return;
      }
      const image = el("img", {class: "lag", alt: "replication lag per queue and backup (lag.png)"});
      box.replaceChildren(el("p", {class: "muted", text: `${answer.report}, written ${new Date(answer.written * 1000).toLocaleString()}`}),
                          el("pre", {id: "audit-summary", text: answer.summary}), answer.chart ? image : null);
      if (answer.chart) {  // fetched with the session's token, which an <img src> would not send to another broker
        const response = await fetch(state.base + "/api/audit/lag.png", {headers: state.token ? {Authorization: "Bearer " + state.token} : {}});
        if (response.ok) image.src = URL.createObjectURL(await response.blob());
      }
    },
  },
};

// The Overview's Mirror section (design/mirroring.md), from `admin mirror status`: on a source, its connection to
// the standby and each mirrored queue's lag; on a standby, its mirror queues and their source, and once promoted its
// mirror epoch.
function mirrorSection(m) {
  const parts = [el("h2", {id: "mirror-title", text: "Mirror"})];
  const s = m.source;
  if (s && (!s.active || s.dormant)) parts.push(el("p", {class: "muted", id: "mirror-source", "data-connected": "false",
                                                        text: s.dormant || "A source cluster's backup: its primary mirrors."}));
  else if (s) {
    parts.push(el("p", {id: "mirror-source", "data-connected": String(s.connected), class: s.connected ? null : "bad",
                        text: s.connected ? `mirroring to ${s.address} (mirror epoch ${s.epoch})`
                                          : `not connected to the standby (${s.to.join(", ")}): ${s.down || "connecting"}`}),
               table("mirror-queues", ["queue", "state", {label: "lag msgs", num: 1}, {label: "lag s", num: 1},
                                       {label: "held back", num: 1}, {label: "last mirrored seq", num: 1}, "backlog limit",
                                       "refused"].map(h => typeof h === "string" ? {label: h} : h),
                     s.queues.map(q => el("tr", {"data-name": q.queue, "data-state": q.state},
                       el("th", {scope: "row", text: q.queue}), cell(q.state, false, q.state === "mirroring" ? null : "bad"),
                       cell(number(q.lag_messages), true, "lag"), cell(q.lag_seconds.toFixed(3), true),
                       cell(size(q.bytes_held_back), true), cell(number(q.last_mirrored_seq), true),
                       cell(q.backlog_limit_reached ? "reached" : "", false, q.backlog_limit_reached ? "bad" : null),
                       cell(q.refused || "")))));
  }
  const t = m.standby;
  if (t) {
    const sources = Object.entries(t.sources).map(([name, c]) => `${name} (${c.connected ? "connected" : "not connected"})`);
    parts.push(el("p", {id: "mirror-standby", "data-role": t.role, "data-epoch": t.epoch,
                        text: (t.role === "promoted" ? `promoted at mirror epoch ${t.epoch}` +
                                 (t.promoted_at ? ` (${new Date(t.promoted_at * 1000).toISOString()})` : "") +
                                 ": its mirror queues are writable, their sources fenced off"
                               : `a standby at mirror epoch ${t.epoch}: its mirror queues are read-only until promoted`) +
                              `; sources: ${sources.join(", ") || "none since it started"}`}),
               table("mirror-copies", ["queue", "source", {label: "messages", num: 1}, {label: "last applied seq", num: 1},
                                       "source connected"].map(h => typeof h === "string" ? {label: h} : h),
                     t.queues.map(q => el("tr", {"data-name": q.queue, "data-source": q.source},
                       el("th", {scope: "row", text: q.queue}), cell(q.source), cell(number(q.messages), true, "messages"),
                       cell(number(q.last_applied_seq), true), cell(q.connected ? "yes" : "no")))));
  }
  return parts;
}

// The primary of an overview, and its state while it takes over ("b1 (recovering)").
function primaryOf(o) {
  const row = o.brokers.find(b => b.role === "primary" && b.name === o.primary);
  return !o.primary ? "none" : o.primary + (row && row.state !== "active" ? ` (${row.state})` : "");
}

// A sharded cluster's queue table is one shard's at a time (its primary's own): the list to choose it.
function shardChoice(answer) {
  const q = state.queues, select = byId("queue-shard");
  if (q.shard === null) q.shard = answer.shard;  // first that of the console the page talks to
  if (select.options.length !== answer.shards) {
    select.replaceChildren(...Array.from({length: answer.shards}, (_, k) => el("option", {value: k, text: `shard ${k}`})));
  }
  select.value = String(q.shard);
  select.hidden = byId("queue-shard-label").hidden = false;
}

function limits(r) {
  const parts = [];
  if (r.max_depth) parts.push(`${number(r.max_depth)} msgs`);
  if (r.max_bytes) parts.push(size(r.max_bytes));
  return parts.length ? parts.join(", ") + ` (${r.overflow})` : "–";
}

function sortBy(key) {
  const q = state.queues;
  q.order = q.sort === key && q.order === "asc" ? "desc" : (q.sort === key ? "asc" : (key === "name" ? "asc" : "desc"));
  q.sort = key;
  q.offset = 0;
  refreshNow();
}

async function purge(name) {
  if (!confirm(`Purge every message of ${name} that no consumer holds?`)) return;
  await act(`purge ${name}`, `/api/queues/${encodeURIComponent(name)}/purge`, {method: "POST"},
            {send: (p, o) => owned("queue:" + name, p, o), done: answer => `${answer.purged} messages dropped`});
  refreshNow();
}
async function deleteQueue(name) {
  if (!confirm(`Delete the queue ${name} and its messages?`)) return;
  await act(`delete ${name}`, `/api/queues/${encodeURIComponent(name)}`, {method: "DELETE"},
            {send: (p, o) => owned("queue:" + name, p, o), then: "#/queues"});
}
async function declareQueue(event) {
  event.preventDefault();
  const name = byId("new-queue").value;
  let args = {};
  try { args = byId("new-queue-args").value ? JSON.parse(byId("new-queue-args").value) : {}; }
  catch (e) { notice(`declare ${name}: the arguments are not JSON: ${e.message}`); return; }
  await act(`declare ${name}`, "/api/queues", {method: "POST", body: {name, args}});
  refreshNow();
}
async function declareExchange(event) {
  event.preventDefault();
  await act(`declare exchange ${byId("new-exchange").value}`, "/api/exchanges",
            {method: "POST", body: {name: byId("new-exchange").value, type: byId("new-exchange-type").value}});
  refreshNow();
}
async function deleteExchange(name) {
  if (!confirm(`Delete the exchange ${name}?`)) return;
  await act(`delete exchange ${name}`, `/api/exchanges/${encodeURIComponent(name)}`, {method: "DELETE"});
  refreshNow();
}
async function bind(event) {
  event.preventDefault();
  await act("bind", "/api/bindings", {method: "POST", body: {exchange: byId("bind-exchange").value,
                                                             queue: byId("bind-queue").value, key: byId("bind-key").value}});
  refreshNow();
}
async function unbind(b) {
  await act(`unbind ${b.queue} from ${b.exchange}`, "/api/bindings/delete", {method: "POST", body: b});
  refreshNow();
}
// A connection's links, in a row under it while it is open: a read of that connection each refresh.
function toggleLinks(name) {
  if (!state.openConnections.delete(name)) state.openConnections.add(name);
  refreshNow();
}
function linkRow(name, links, span) {
  const content = typeof links === "string" ? el("p", {class: "bad", text: links}) :
    table(null, ["link", "address", "role"].map(label => ({label})),
          links.map(l => el("tr", {}, el("th", {scope: "row", text: l.name}), cell(l.address || "–"), cell(l.role))),
          `links of ${name}`);
  return el("tr", {class: "links", "data-links-of": name}, el("td", {colspan: span}, content));
}
async function closeConnection(name) {
  if (!confirm(`Close the connection from ${name}?`)) return;
  await act(`close ${name}`, `/api/connections/${encodeURIComponent(name)}`, {method: "DELETE"});
  refreshNow();
}
async function promote(broker) {
  if (!confirm(`Make ${broker.name} the primary?`)) return;
  // at that broker's own console: it promotes itself, refusing as `haqueue admin ha promote` would
  await act(`promote ${broker.name}`, "/api/promote", {method: "POST", body: {force: false}},
            {send: (p, o) => call(baseOf(broker.console), p, o)});
}

// ---- routing and the refresh loop ------------------------------------------------------------------------------
function current() {
  const hash = location.hash || "#/";
  if (hash.startsWith("#/queue/")) return ["queue", decodeURIComponent(hash.slice("#/queue/".length))];
  const page = hash.slice(2) || "overview";
  return [views[page] ? page : "overview", null];
}

function route() {
  const [page, argument] = current();
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.page === (page === "queue" ? "queues" : page)) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  state.charts = {};
  state.view = {page, argument};
  problem("");
  byId("page").replaceChildren(views[page].render(argument));
  refreshNow();
}

// A navigation ends the last action's result, unless that action led here.
function navigated() {
  if (byId("notice").dataset.page !== location.hash) notice("");
  route();
}

async function refreshNow() {
  if (state.busy || !byId("login").hidden) return;
  state.busy = true;
  const view = state.view;
  try {
    await views[view.page].refresh(view.argument);
    if (view === state.view) problem("");
  } catch (e) {
    if (e.status !== 401 && view === state.view) problem(e.message);
  } finally {
    state.busy = false;
  }
}

// The page's first view once it knows who the user is; and where the primary's console is, so that an action on
// any view goes there (a page opened on a backup's console, from a bookmark or a link, moves to it).
function begin() {
  showUser();
  route();
  toPrimary();
}

async function start() {
  byId("login-form").addEventListener("submit", login);
  byId("logout").addEventListener("click", logout);
  window.addEventListener("hashchange", navigated);
  setInterval(refreshNow, REFRESH_MS);
  try {
    const session = await call("", "/api/session");
    text(byId("talking-to"), `talking to ${session.broker} at ${location.origin}`);
    if (!session.user) {
      state.view = {page: current()[0], argument: current()[1]};
      showLogin();
      return;
    }
    state.user = session.user;
    state.token = session.token;
    state.csrf = session.csrf;
  } catch (e) {
    problem(e.message);
  }
  begin();
}

document.addEventListener("DOMContentLoaded", start);
