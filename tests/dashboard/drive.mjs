// Drives the dashboard in headless Chromium for tests/it/dashboard.rs (one scenario per run).
//
//   DASH_URL=http://127.0.0.1:PORT/ DASH_TOKEN=… DASH_TASK=demo DASH_SHOTS=DIR \
//   TASKBOX_BIN=…/taskbox TASKBOX_HOME=… node drive.mjs live|task|fleet|auth
//
// Prints `ok SCENARIO` at the end; any failed check throws (exit 1) with what it saw. The CLI
// commands the scenario needs (`taskbox suspend`, `taskbox run`) run from here, with the
// environment the test gave, so that the page is watched while they run.
import { chromium } from "playwright-core";
import { execFileSync } from "node:child_process";
import { mkdirSync } from "node:fs";

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const URL_ = env("DASH_URL");
const TOKEN = env("DASH_TOKEN");
const TASK = env("DASH_TASK");
const SHOTS = env("DASH_SHOTS");
const scenario = process.argv[2];
const WAIT = 60_000;

mkdirSync(SHOTS, { recursive: true });
const taskbox = (...args) =>
  execFileSync(env("TASKBOX_BIN"), args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 120_000 });

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  timeout: WAIT,
});
const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
page.setDefaultTimeout(WAIT);
const LABEL = process.env.DASH_LABEL || "";
const shot = (name) =>
  page.screenshot({ path: `${SHOTS}/${LABEL ? LABEL + "-" : ""}${scenario}-${name}.png`, fullPage: true });

async function login(token) {
  await page.goto(URL_);
  await page.waitForSelector("#token");
  await page.fill("#token", token);
  await Promise.all([page.waitForNavigation(), page.click("button[type=submit]")]);
}

const rowState = (task) =>
  page.locator(`#tasks-table tr[data-task="${task}"] td[data-col="state"] [data-state]`);

try {
  if (scenario === "live") {
    await login(TOKEN);
    await rowState(TASK).waitFor();
    const first = await rowState(TASK).getAttribute("data-state");
    check(["running", "idle", "expired"].includes(first), `a settled state at first, saw ${first}`);
    await page.locator("#live:not(.off)").waitFor();
    await shot("tasks");
    // A mark that a reload would wipe.
    await page.evaluate(() => { window.__sameDocument = true; });

    taskbox("suspend", TASK);
    await page.locator(`#tasks-table tr[data-task="${TASK}"] [data-state="expired"]`).waitFor();
    await page.waitForFunction(
      (t) => document.querySelector(`#tasks-table tr[data-task="${t}"] td[data-col="snapshots"]`)?.textContent === "1",
      TASK,
    );
    check(await page.evaluate(() => window.__sameDocument === true), "the page was not reloaded");
    await shot("suspended");

    // A task that did not exist when the page loaded appears, and a restore shows live too.
    taskbox("run", "--task", `${TASK}-new`, "--", "echo made > made.txt");
    await rowState(`${TASK}-new`).waitFor();
    taskbox("run", "--task", TASK, "--", "cat f");
    await page.locator(`#tasks-table tr[data-task="${TASK}"] [data-state="running"]`).waitFor();
    // The row's details follow the state: the restored sandbox and its deadline.
    await page.locator(`#tasks-table tr[data-task="${TASK}"] td[data-col="sandbox"] code`).waitFor();
    await page.locator(`#tasks-table tr[data-task="${TASK}-new"] td[data-col="backend"]:text("local")`).waitFor();
    check(await page.evaluate(() => window.__sameDocument === true), "the page was not reloaded");

    // Filter and sort.
    await page.fill("#filter", `${TASK}-new`);
    check((await page.locator("#tasks-table tbody tr").count()) === 1, "the filter leaves one row");
    await page.fill("#filter", "");
    await page.click('th[data-key="task"]');
    const names = await page.locator("#tasks-table tbody tr").evaluateAll((rs) => rs.map((r) => r.dataset.task));
    check(names.join() === [...names].sort().reverse().join(), `sorted by task, descending: ${names}`);
    await shot("restored");
  } else if (scenario === "task") {
    await login(TOKEN);
    await page.goto(`${URL_}#/task/${TASK}`);
    await page.locator("#timeline object").waitFor();
    // The picture really drew: the object's SVG has the state bands of the timeline.
    await page.waitForFunction(() => {
      const d = document.querySelector("#timeline object")?.contentDocument;
      return d && d.querySelectorAll("svg rect").length > 3;
    });
    const made = await page.locator('#snapshots td[data-col="made_by"]').allTextContents();
    check(made.includes("suspend"), `a snapshot made by the suspend, saw ${made}`);
    await page.locator('dd a[href="#/task/' + TASK + '-fork"]').waitFor();
    check(!(await page.textContent("#view")).includes("http"), "the fork is a link, not its URL as text");
    check((await page.locator("#journal tbody tr").count()) === 25, "a page of 25 journal entries");
    await shot("page");
    // The older entries are on the next page, down to the first.
    await page.click("text=older →");
    await page.locator("text=page 2").waitFor();
    const seqs = await page.locator("#journal tbody tr td:first-child").allTextContents();
    check(seqs.includes("1") && !seqs.includes("26"), `page 2 holds the oldest entries, saw ${seqs}`);
    await page.click("text=← newer");
    await page.locator("text=page 1").waitFor();
    await page.goto(`${URL_}#/forks`);
    await page.locator(`#forks li[data-task="${TASK}-fork"]`).waitFor();
    await shot("forks");
    await page.goto(`${URL_}#/server`);
    await page.getByText("Live sandboxes").waitFor();
    await shot("server");
  } else if (scenario === "fleet") {
    await login(TOKEN);
    await page.goto(`${URL_}#/server`);
    await page.locator(`#leases tr[data-task="${TASK}"]`).waitFor();
    const owner = await page.locator("#servers tbody tr").first().textContent();
    check(owner.includes("(this server)"), `this server is marked, saw ${owner}`);
    await shot("server");
  } else if (scenario === "auth") {
    // No token: the login form, and nothing of the tasks.
    const res = await page.goto(URL_);
    check(res.status() === 401, `GET / without a session answers 401, saw ${res.status()}`);
    await page.waitForSelector("#token");
    check(!(await page.content()).includes(TASK), "the login page names no task");
    const api = await page.evaluate(async () => (await fetch("/v1/tasks")).status);
    check(api === 401, `GET /v1/tasks without a session answers 401, saw ${api}`);
    await shot("login");

    // A wrong token: the form again, with the error, no cookie, no data.
    await login("not-the-token-0000000000");
    await page.waitForSelector("#token");
    const text = await page.textContent("#login-error");
    check(text.includes("not the server's token"), `the error is shown, saw ${text}`);
    check(!(await page.content()).includes(TASK), "the page after a wrong token names no task");
    check((await page.context().cookies()).length === 0, "no cookie after a wrong token");
    await shot("wrong-token");

    // The right token: the data; the cookie is HttpOnly and SameSite=Strict, and it does not
    // let the page's own script change anything (a POST needs the bearer token).
    await login(TOKEN);
    await rowState(TASK).waitFor();
    const [cookie] = await page.context().cookies();
    check(cookie && cookie.httpOnly && cookie.sameSite === "Strict", `cookie flags: ${JSON.stringify(cookie && { ...cookie, value: "…" })}`);
    check(!cookie.value.includes(TOKEN), "the cookie is not the token");
    check(await page.evaluate(() => document.cookie === ""), "no script sees the cookie");
    const post = await page.evaluate(async (t) => (await fetch(`/v1/tasks/${t}/suspend`, { method: "POST" })).status, TASK);
    check(post === 401, `a POST with only the cookie answers 401, saw ${post}`);
    check(!page.url().includes(TOKEN), "the token is not in the URL");
  } else {
    throw new Error(`unknown scenario ${scenario}: live, task, fleet or auth`);
  }
  console.log(`ok ${scenario}`);
} finally {
  await browser.close();
}
