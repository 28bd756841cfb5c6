// The dashboard's views, drawn from the server's JSON API (docs/dashboard.md). No framework and
// no build step: this file is served as it is written. Every text that comes from the server is
// put in the page with textContent (el()), never as HTML.
"use strict";

const PAGE = 25; // journal entries per page

const st = {
  tasks: [],          // GET /v1/tasks
  costs: new Map(),   // task -> a row of GET /dashboard/costs
  filter: "",
  sort: { key: "task", desc: false },
  route: null,
  journalPage: 0,
  taskRefresh: null,  // redraws the open task page after a change
};

// ---- helpers ----

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids.flat(Infinity)) {
    if (k === null || k === undefined) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}

async function api(path) {
  const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (r.status === 401) { location.replace("/"); throw new Error("logged out"); }
  const body = await r.json().catch(() => null);
  if (!r.ok) throw new Error((body && body.message) || `${path}: ${r.status}`);
  return body;
}

function debounce(fn, ms) {
  let t = null;
  return () => { clearTimeout(t); t = setTimeout(fn, ms); };
}

function ago(ms) { return ms ? dur(Date.now() - ms) + " ago" : ""; }
function dur(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}
function until(ms) {
  if (!ms) return "";
  const d = ms - Date.now();
  return d >= 0 ? "in " + dur(d) : dur(-d) + " ago";
}
function when(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) + "Z" : ""; }
function bytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KB", "MB", "GB", "TB"];
  const i = Math.min(u.length - 1, Math.floor(Math.log(n) / Math.log(1024)));
  return (n / 1024 ** i).toFixed(i ? 1 : 0) + " " + u[i];
}
function badge(state) { return el("span", { class: `state s-${state}`, "data-state": state, text: state }); }
function taskLink(id) { return el("a", { href: `#/task/${encodeURIComponent(id)}`, text: id }); }
function complete(t) { return (t.snapshots || []).filter((s) => s.status === "complete").length; }

function costText(c) {
  if (!c) return "";
  if (c.estimate_usd) return "$" + c.estimate_usd.total.toFixed(4);
  return dur(c.sandbox_seconds * 1000) + " sandbox";
}
function costValue(c) { return c ? (c.estimate_usd ? c.estimate_usd.total : c.sandbox_seconds / 1e6) : -1; }

// ---- the live stream: every task's transitions (GET /dashboard/events) ----

const liveBadge = () => document.getElementById("live");

async function follow() {
  for (;;) {
    try {
      const r = await fetch("/dashboard/events", { credentials: "same-origin" });
      if (r.status === 401) { location.replace("/"); return; }
      if (!r.ok || !r.body) throw new Error(String(r.status));
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (line) onEvent(JSON.parse(line));
        }
      }
    } catch (e) {
      // The server went away (it stops when idle) or the network failed: try again below.
    }
    const b = liveBadge();
    b.textContent = "offline: the server is not answering (reload to start it again)";
    b.classList.add("off");
    await new Promise((res) => setTimeout(res, 3000));
  }
}

const refreshTasks = debounce(() => loadTasks().catch(showError), 250);
const refreshCosts = debounce(() => loadCosts().catch(() => {}), 1000);

function onEvent(ev) {
  const b = liveBadge();
  if (ev.type === "hello") {
    b.textContent = "live";
    b.classList.remove("off");
    refreshTasks();
    return;
  }
  if (ev.type === "lagged") { refreshTasks(); return; }
  if (ev.type !== "transition") return;
  const t = st.tasks.find((x) => x.id === ev.task);
  if (t) {
    t.state = ev.to;
    t._flash = true;
    if (st.route.view === "tasks") drawTasks();
  }
  refreshTasks();
  refreshCosts();
  if (st.route.view === "task" && st.route.task === ev.task && st.taskRefresh) st.taskRefresh();
}

async function loadTasks() {
  st.tasks = await api("/v1/tasks");
  if (st.route.view === "tasks") drawTasks();
  else if (st.route.view === "forks") drawForks();
}

async function loadCosts() {
  const rows = await api("/dashboard/costs");
  st.costs = new Map(rows.map((r) => [r.task, r]));
  if (st.route.view === "tasks") drawTasks();
}

// ---- the tasks table ----

const COLUMNS = [
  { key: "task", title: "Task", value: (t) => t.id, cell: (t) => taskLink(t.id) },
  { key: "state", title: "State", value: (t) => t.state, cell: (t) => badge(t.state) },
  { key: "backend", title: "Backend", value: (t) => (st.costs.get(t.id) || {}).backend || "", cell: (t) => (st.costs.get(t.id) || {}).backend || "" },
  { key: "sandbox", title: "Live sandbox", value: (t) => (t.sandbox ? t.sandbox.id : ""), cell: (t) => (t.sandbox ? el("code", { text: t.sandbox.id }) : el("span", { class: "muted", text: "none" })) },
  { key: "deadline", title: "Deadline", value: (t) => (t.sandbox ? t.sandbox.deadline : 0), cell: (t) => (t.sandbox ? el("span", { "data-until": t.sandbox.deadline, title: when(t.sandbox.deadline), text: until(t.sandbox.deadline) }) : "") },
  { key: "snapshots", title: "Snapshots", num: true, value: complete, cell: complete },
  { key: "cost", title: "Cost", num: true, value: (t) => costValue(st.costs.get(t.id)), cell: (t) => costText(st.costs.get(t.id)) },
  { key: "activity", title: "Last activity", value: (t) => t.last_activity || 0, cell: (t) => el("span", { title: when(t.last_activity), text: ago(t.last_activity) }) },
];

function viewTasks(root) {
  const search = el("input", {
    type: "search", id: "filter", placeholder: "filter: task, state, backend, sandbox", value: st.filter,
    oninput: (e) => { st.filter = e.target.value; drawTasks(); },
  });
  root.replaceChildren(el("h1", { text: "Tasks" }), search, el("div", { id: "tasks" }));
  drawTasks();
  loadCosts().catch(() => {});
}

function drawTasks() {
  const box = document.getElementById("tasks");
  if (!box) return;
  const q = st.filter.trim().toLowerCase();
  const col = COLUMNS.find((c) => c.key === st.sort.key) || COLUMNS[0];
  const rows = st.tasks
    .filter((t) => !q || [t.id, t.state, (st.costs.get(t.id) || {}).backend, t.sandbox && t.sandbox.id]
      .some((v) => v && String(v).toLowerCase().includes(q)))
    .sort((a, b) => {
      const x = col.value(a), y = col.value(b);
      const c = x < y ? -1 : x > y ? 1 : 0;
      return st.sort.desc ? -c : c;
    });
  const head = el("tr", {}, COLUMNS.map((c) => el("th", {
    class: [c.num && "num", c.key === st.sort.key && "sorted", c.key === st.sort.key && st.sort.desc && "desc"].filter(Boolean).join(" "),
    "data-key": c.key, text: c.title,
    onclick: () => { st.sort = { key: c.key, desc: st.sort.key === c.key ? !st.sort.desc : false }; drawTasks(); },
  })));
  const body = rows.map((t) => {
    const tr = el("tr", { "data-task": t.id, class: t._flash ? "flash" : null },
      COLUMNS.map((c) => el("td", { class: c.num ? "num" : null, "data-col": c.key }, c.cell(t))));
    t._flash = false;
    return tr;
  });
  const table = el("table", { id: "tasks-table" }, el("thead", {}, head), el("tbody", {}, body));
  const foot = el("p", { class: "note", text: `${rows.length} of ${st.tasks.length} tasks` });
  box.replaceChildren(st.tasks.length ? table : el("p", { class: "note", text: "No task yet: `taskbox run --task NAME -- CMD` creates one." }), foot);
}

// ---- one task ----

function viewTask(root, id) {
  st.journalPage = 0;
  root.replaceChildren(el("p", { class: "note", text: "Loading…" }));
  const draw = async () => {
    try { await drawTask(root, id); } catch (e) { root.replaceChildren(el("h1", { text: id }), el("p", { class: "error", text: e.message })); }
  };
  st.taskRefresh = debounce(draw, 400);
  draw();
}

async function drawTask(root, id) {
  const n = PAGE * (st.journalPage + 1);
  const [v, snaps] = await Promise.all([
    api(`/v1/tasks/${encodeURIComponent(id)}?journal=${n}`),
    api(`/dashboard/tasks/${encodeURIComponent(id)}/snapshots`),
  ]);
  const t = v.task;
  const children = st.tasks.filter((x) => x.lineage && x.lineage.parent === id);
  const facts = el("dl", { class: "facts" },
    el("dt", { text: "State" }), el("dd", {}, badge(t.state)),
    el("dt", { text: "Backend" }), el("dd", { text: (v.marks && v.marks.backend) || "not recorded yet" }),
    el("dt", { text: "Live sandbox" }), el("dd", {}, t.sandbox ? [el("code", { text: t.sandbox.id }), ` (generation ${t.sandbox.generation}, deadline ${until(t.sandbox.deadline)})`] : "none"),
    el("dt", { text: "Created" }), el("dd", { text: `${when(t.created_at)} (${ago(t.created_at)})` }),
    el("dt", { text: "Last activity" }), el("dd", { text: ago(t.last_activity) }),
    el("dt", { text: "Forked from" }), el("dd", {}, t.lineage ? [taskLink(t.lineage.parent), ` snapshot s${t.lineage.parent_seq}, ${ago(t.lineage.forked_at)}`] : "—"),
    el("dt", { text: "Forks" }), el("dd", {}, children.length ? children.map((c, i) => [i ? ", " : "", taskLink(c.id)]) : "—"),
    v.marks && v.marks.removed_at ? [el("dt", { text: "Removed" }), el("dd", { text: when(v.marks.removed_at) })] : null,
  );
  const svg = `/dashboard/tasks/${encodeURIComponent(id)}/timeline.svg?at=${Date.now()}`;
  const timeline = el("div", { class: "timeline", id: "timeline" }, el("object", { type: "image/svg+xml", data: svg, "aria-label": `timeline of ${id}` }));

  const snapTable = snaps.length ? el("table", { id: "snapshots" },
    el("thead", {}, el("tr", {}, ["#", "Id", "Status", "Size", "Taken", "Made by", "Expires"].map((h) => el("th", { text: h })))),
    el("tbody", {}, snaps.map((s) => el("tr", {},
      el("td", { text: `s${s.seq}` }), el("td", {}, el("code", { text: s.provider_id || "" })), el("td", { text: s.status }),
      el("td", { class: "num", text: bytes(s.size_bytes) }), el("td", { title: when(s.created_at || s.started_at), text: ago(s.created_at || s.started_at) }),
      el("td", { "data-col": "made_by", text: s.made_by }), el("td", { text: s.expires_at ? until(s.expires_at) : "never" }))))) : el("p", { class: "note", text: "No snapshot yet." });

  const all = v.journal;
  const page = all.slice(0, Math.max(0, all.length - PAGE * st.journalPage)).slice(-PAGE).reverse();
  const older = all.length >= n;
  const pager = el("div", { class: "pager" },
    el("button", { disabled: st.journalPage === 0 ? "" : null, onclick: () => { st.journalPage -= 1; drawTask(root, id); }, text: "← newer" }),
    el("span", { class: "note", text: `page ${st.journalPage + 1}` }),
    el("button", { disabled: older ? null : "", onclick: () => { st.journalPage += 1; drawTask(root, id); }, text: "older →" }));
  const journal = el("table", { id: "journal" },
    el("thead", {}, el("tr", {}, ["#", "At", "Event", "State", "Commands"].map((h) => el("th", { text: h })))),
    el("tbody", {}, page.map((e) => el("tr", {},
      el("td", { text: e.task_seq }), el("td", { title: when(e.at), text: when(e.at) }),
      el("td", {}, el("code", { text: eventText(e.event) })),
      el("td", {}, e.state_before === e.state_after ? badge(e.state_after) : [badge(e.state_before), " → ", badge(e.state_after)]),
      el("td", { class: "muted", text: (e.commands || []).map((c) => c.type).join(", ") })))));

  root.replaceChildren(
    el("h1", {}, "Task ", el("code", { text: id })),
    el("div", { class: "card" }, facts),
    el("h2", { text: "Timeline" }), timeline,
    el("h2", { text: "Snapshots" }), snapTable,
    el("h2", { text: "Journal" }), pager, journal);
}

function eventText(ev) {
  if (!ev) return "";
  if (ev.type === "run_requested" && ev.command) return `run_requested \`${ev.command.length > 60 ? ev.command.slice(0, 57) + "…" : ev.command}\``;
  return ev.type;
}

// ---- the fork tree ----

function viewForks(root) {
  root.replaceChildren(el("h1", { text: "Fork tree" }), el("div", { id: "forks" }));
  drawForks();
}

function drawForks() {
  const box = document.getElementById("forks");
  if (!box) return;
  const names = new Set(st.tasks.map((t) => t.id));
  const kids = new Map();
  for (const t of st.tasks) {
    const p = t.lineage && names.has(t.lineage.parent) ? t.lineage.parent : "";
    if (!kids.has(p)) kids.set(p, []);
    kids.get(p).push(t);
  }
  const node = (t) => el("li", { "data-task": t.id }, taskLink(t.id), " ", badge(t.state),
    t.lineage ? el("span", { class: "muted", text: ` from s${t.lineage.parent_seq}` }) : null,
    kids.has(t.id) ? el("ul", {}, kids.get(t.id).map(node)) : null);
  const roots = (kids.get("") || []).filter((t) => kids.has(t.id) || t.lineage);
  const forked = st.tasks.some((t) => t.lineage);
  box.replaceChildren(forked
    ? el("ul", { class: "tree" }, roots.map(node))
    : el("p", { class: "note", text: "No task was forked yet (`taskbox fork TASK NEW`)." }));
}

// ---- the server (and a fleet) ----

async function viewServer(root) {
  const [h, fleet] = await Promise.all([api("/v1/health"), api("/dashboard/fleet")]);
  root.replaceChildren(
    el("h1", { text: "Server" }),
    el("div", { class: "card" }, el("dl", { class: "facts" },
      el("dt", { text: "Version" }), el("dd", { text: h.version }),
      el("dt", { text: "Process" }), el("dd", { text: `pid ${h.pid}, since ${when(h.started_at)} (${ago(h.started_at)})` }),
      el("dt", { text: "Data dir" }), el("dd", {}, el("code", { text: h.data_dir })),
      el("dt", { text: "Started by" }), el("dd", { text: h.auto ? `the CLI (exits after ${h.idle_exit_seconds}s idle with no live sandbox)` : "taskbox serve" }),
      el("dt", { text: "TCP" }), el("dd", { text: h.tcp || "none (Unix socket only)" }),
      el("dt", { text: "Store" }), el("dd", { text: fleet.store === "postgres" ? "PostgreSQL (a fleet's servers share it)" : "the data dir's SQLite file" }),
      el("dt", { text: "Requests in flight" }), el("dd", { text: h.requests_in_flight }))),
    el("h2", { text: "Live sandboxes" }),
    h.live_tasks.length ? el("table", {}, el("thead", {}, el("tr", {}, ["Task", "State", "Sandbox", "Deadline"].map((x) => el("th", { text: x })))),
      el("tbody", {}, h.live_tasks.map((l) => el("tr", {}, el("td", {}, taskLink(l.task)), el("td", {}, badge(l.state)), el("td", {}, el("code", { text: l.sandbox })), el("td", { text: until(l.deadline) })))))
      : el("p", { class: "note", text: "None." }),
    el("h2", { text: "Fleet" }),
    fleetView(fleet, h));
}

function fleetView(fleet, h) {
  if (fleet.store !== "postgres") {
    return el("p", { class: "note", text: "This server keeps its tasks in the data dir's SQLite file: no other server shares them. A fleet shares a PostgreSQL store (docs/running.md)." });
  }
  const mine = (owner) => owner.includes(`pid ${h.pid} `);
  const servers = new Map();
  for (const l of fleet.leases) {
    const s = servers.get(l.owner) || { live: 0, expired: 0 };
    if (l.remaining_ms > 0) s.live += 1; else s.expired += 1;
    servers.set(l.owner, s);
  }
  const inMs = (ms) => (ms > 0 ? "in " + dur(ms) : "expired " + dur(-ms) + " ago");
  return el("div", { id: "fleet" },
    el("table", { id: "servers" },
      el("thead", {}, el("tr", {}, ["Server (lease owner)", "Leases held", "Expired (any server may take them over)"].map((x) => el("th", { text: x })))),
      el("tbody", {}, [...servers].map(([owner, s]) => el("tr", {},
        el("td", {}, el("code", { text: owner }), mine(owner) ? el("span", { class: "muted", text: " (this server)" }) : null),
        el("td", { class: "num", text: s.live }), el("td", { class: "num", text: s.expired }))))),
    el("h2", { text: "Leases" }),
    fleet.leases.length ? el("table", { id: "leases" },
      el("thead", {}, el("tr", {}, ["Task", "Owner", "Token", "Expires"].map((x) => el("th", { text: x })))),
      el("tbody", {}, fleet.leases.map((l) => el("tr", { "data-task": l.task_id },
        el("td", {}, taskLink(l.task_id)), el("td", {}, el("code", { text: l.owner })),
        el("td", { class: "num", text: l.token }), el("td", { text: inMs(l.remaining_ms) })))))
      : el("p", { class: "note", text: "No lease yet." }),
    el("p", { class: "note", text: "Servers appear here by the leases they hold or held: a server that never drove a task is not listed." }));
}

// ---- routing ----

function parseRoute() {
  const h = decodeURIComponent(location.hash.replace(/^#\/?/, ""));
  if (h.startsWith("task/")) return { view: "task", task: h.slice(5) };
  if (h === "forks") return { view: "forks" };
  if (h === "server") return { view: "server" };
  return { view: "tasks" };
}

function showError(e) {
  const root = document.getElementById("view");
  root.prepend(el("p", { class: "error", text: e.message }));
}

function route() {
  st.route = parseRoute();
  st.taskRefresh = null;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("on", a.dataset.view === st.route.view || (st.route.view === "task" && a.dataset.view === "tasks"));
  }
  const root = document.getElementById("view");
  if (st.route.view === "task") viewTask(root, st.route.task);
  else if (st.route.view === "forks") viewForks(root);
  else if (st.route.view === "server") viewServer(root).catch(showError);
  else viewTasks(root);
}

// The deadlines count down without a request.
setInterval(() => {
  for (const e of document.querySelectorAll("[data-until]")) e.textContent = until(Number(e.dataset.until));
}, 1000);

window.addEventListener("hashchange", route);
route();
loadTasks().catch(showError);
follow();
