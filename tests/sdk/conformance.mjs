// SDK conformance: runs Vercel's own Sandbox SDK (@vercel/sandbox, pinned in package.json)
// against `taskbox fake-vercel`. Where the two disagree, the SDK is right and the fake is fixed.
//
// Usage:
//   npm ci --prefix tests/sdk
//   TASKBOX_FAKE_VERCEL_URL=http://127.0.0.1:PORT/api node tests/sdk/conformance.mjs
//
// Optional: TASKBOX_FAKE_VERCEL_TOKEN, the token the fake requires (any non-JWT string works
// when it requires none). The script exits 0 when every check passes and 1, naming the failed
// check, on the first mismatch.

import { Sandbox, Snapshot } from "@vercel/sandbox";

const base = process.env.TASKBOX_FAKE_VERCEL_URL;
if (!base || !/^https?:\/\/[^/]+\/api$/.test(base)) {
  console.error(
    "conformance: set TASKBOX_FAKE_VERCEL_URL to the fake's API base URL, e.g. http://127.0.0.1:PORT/api",
  );
  process.exit(2);
}

// A non-JWT token: a JWT with `owner_id` would make the SDK try an OIDC refresh.
const credentials = {
  token: process.env.TASKBOX_FAKE_VERCEL_TOKEN || "taskbox-conformance-token",
  teamId: "team_taskbox_conformance",
  projectId: "prj_taskbox_conformance",
};

const calls = [];

/** The SDK's fetch, pointed at the fake: Vercel's API hosts are rewritten to `base`. */
async function fetchViaFake(input, init) {
  const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
  let rewritten = null;
  for (const prefix of ["https://vercel.com/api", "https://api.vercel.com"]) {
    if (url.startsWith(prefix)) rewritten = base + url.slice(prefix.length);
  }
  if (rewritten === null) {
    throw new Error(`the SDK called ${url}, which is not under a Vercel API base URL`);
  }
  calls.push(`${init?.method ?? "GET"} ${new URL(rewritten).pathname}`);
  return fetch(rewritten, init);
}

const sdk = { ...credentials, fetch: fetchViaFake };

let step = "start";
function check(condition, message) {
  if (!condition) throw new Error(`${step}: ${message}`);
}
function eq(actual, expected, what) {
  check(
    actual === expected,
    `${what}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`,
  );
}

async function main() {
  const suffix = `${Date.now()}-${process.pid}`;

  step = "Sandbox.create with the default image goes through v3";
  const imaged = await Sandbox.create({
    ...sdk,
    name: `conformance-image-${suffix}`,
    resources: { vcpus: 1 },
    timeout: 60_000,
    persistent: false,
  });
  eq(calls.filter((c) => c.startsWith("POST /api/v")).at(-1), "POST /api/v3/sandboxes", "create path");
  eq(imaged.runtime, undefined, "sandbox.runtime of an image-based sandbox");
  eq(imaged.image, "vercel/sandbox/universal:latest", "sandbox.image (the service's default)");
  const inImage = await imaged.runCommand("bash", ["-c", "echo from-image"]);
  eq(await inImage.stdout(), "from-image\n", "a command in an image-based sandbox");
  await imaged.stop();

  step = "Sandbox.create with a named managed image";
  const node = await Sandbox.create({
    ...sdk,
    name: `conformance-node-image-${suffix}`,
    image: "vercel/sandbox/node:24",
    timeout: 60_000,
    persistent: false,
  });
  eq(node.image, "vercel/sandbox/node:24", "sandbox.image");
  await node.stop();

  step = "an unknown image is refused with 400";
  let refused = null;
  try {
    await Sandbox.create({ ...sdk, name: `conformance-bad-image-${suffix}`, image: "example.com/nope:1" });
  } catch (err) {
    refused = err;
  }
  check(refused !== null, "a create with an unknown image did not fail");
  eq(refused.response?.status, 400, "status of an unknown image");
  check(
    (refused.json?.error?.message ?? "").includes("example.com/nope:1"),
    `the error does not name the image: ${JSON.stringify(refused.json)}`,
  );

  step = "Sandbox.create with a runtime";
  const sandbox = await Sandbox.create({
    ...sdk,
    name: `conformance-${suffix}`,
    runtime: "node24",
    resources: { vcpus: 2 },
    timeout: 120_000,
    persistent: false,
    tags: { suite: "conformance" },
  });
  eq(calls.filter((c) => c.startsWith("POST /api/v")).at(-1), "POST /api/v2/sandboxes", "create path");
  eq(sandbox.runtime, "node24", "sandbox.runtime");
  eq(sandbox.status, "running", "sandbox.status");
  eq(sandbox.cwd, "/vercel/sandbox", "sandbox.cwd");
  eq(sandbox.memory, 4096, "sandbox.memory (2048 MB per vCPU)");

  step = "runCommand waits, with output and exit code";
  const done = await sandbox.runCommand("bash", ["-c", "echo out; echo err >&2; exit 3"]);
  eq(done.exitCode, 3, "exitCode");
  eq(await done.stdout(), "out\n", "stdout");
  eq(await done.stderr(), "err\n", "stderr");

  step = "runCommand with cwd and env";
  const envCmd = await sandbox.runCommand({
    cmd: "bash",
    args: ["-c", 'echo "$GREETING"; pwd >/dev/null'],
    env: { GREETING: "hello env" },
  });
  eq(envCmd.exitCode, 0, "exitCode");
  eq(await envCmd.stdout(), "hello env\n", "stdout");

  step = "detached runCommand, then wait() and logs";
  const detached = await sandbox.runCommand({
    cmd: "bash",
    args: ["-c", "sleep 0.2; echo later"],
    detached: true,
  });
  eq(detached.exitCode, null, "exitCode while running");
  const finished = await detached.wait();
  eq(finished.exitCode, 0, "exitCode after wait()");
  eq(await finished.stdout(), "later\n", "stdout after wait()");

  step = "kill a detached command";
  const sleeper = await sandbox.runCommand({ cmd: "sleep", args: ["30"], detached: true });
  await sleeper.kill("SIGTERM");
  const killed = await sleeper.wait();
  eq(killed.exitCode, 128 + 15, "exitCode after SIGTERM");

  step = "writeFiles / readFileToBuffer / mkDir";
  await sandbox.writeFiles([
    { path: "notes/hello.txt", content: Buffer.from("hello from the SDK\n") },
    { path: "/vercel/sandbox/abs.txt", content: Buffer.from("absolute") },
  ]);
  const read = await sandbox.readFileToBuffer({ path: "notes/hello.txt" });
  check(read !== null, "readFileToBuffer returned null for a file just written");
  eq(read.toString(), "hello from the SDK\n", "file content");
  eq((await sandbox.readFileToBuffer({ path: "abs.txt" }))?.toString(), "absolute", "absolute path");
  eq(await sandbox.readFileToBuffer({ path: "missing.txt" }), null, "a missing file reads as null");
  await sandbox.mkDir("made");
  const seesDir = await sandbox.runCommand("test", ["-d", "made"]);
  eq(seesDir.exitCode, 0, "the directory made by mkDir exists for commands");

  step = "Sandbox.get and Sandbox.list find it";
  const found = await Sandbox.get({ ...sdk, name: sandbox.name });
  eq(found.name, sandbox.name, "Sandbox.get name");
  const listed = await Sandbox.list({ ...sdk, tags: { suite: "conformance" } });
  check(
    listed.sandboxes.some((s) => s.name === sandbox.name),
    `Sandbox.list with the tag did not include ${sandbox.name}`,
  );

  step = "snapshot()";
  const snapshot = await sandbox.snapshot({ expiration: 0 });
  check(snapshot.snapshotId.startsWith("snap_"), `snapshot id ${snapshot.snapshotId}`);
  eq(snapshot.status, "created", "snapshot.status");
  check(snapshot.sizeBytes > 0, `snapshot.sizeBytes ${snapshot.sizeBytes}`);
  eq(snapshot.expiresAt, undefined, "expiresAt of a snapshot that never expires");
  const fetched = await Snapshot.get({ ...sdk, snapshotId: snapshot.snapshotId });
  eq(fetched.snapshotId, snapshot.snapshotId, "Snapshot.get id");

  step = "Sandbox.create from the snapshot reads the file back";
  const restored = await Sandbox.create({
    ...sdk,
    name: `conformance-restored-${suffix}`,
    source: { type: "snapshot", snapshotId: snapshot.snapshotId },
    resources: { vcpus: 1 },
    timeout: 60_000,
    persistent: false,
  });
  eq(restored.sourceSnapshotId, snapshot.snapshotId, "sourceSnapshotId");
  const back = await restored.readFileToBuffer({ path: "notes/hello.txt" });
  eq(back?.toString(), "hello from the SDK\n", "file content after restore");
  const cat = await restored.runCommand("cat", ["abs.txt"]);
  eq(await cat.stdout(), "absolute", "a command sees the restored file");

  step = "the snapshotted sandbox resumes on its next call";
  const resumed = await sandbox.runCommand("cat", ["notes/hello.txt"]);
  eq(await resumed.stdout(), "hello from the SDK\n", "file seen after resume");

  step = "stop()";
  const stopped = await restored.stop();
  eq(stopped.status, "stopped", "status after stop()");
  await sandbox.stop();

  step = "a persistent sandbox snapshots itself on stop() and resumes from it";
  const persistent = await Sandbox.create({
    ...sdk,
    name: `conformance-persistent-${suffix}`,
    runtime: "python3.13",
    persistent: true,
    timeout: 60_000,
  });
  eq(persistent.persistent, true, "sandbox.persistent");
  await persistent.writeFiles([{ path: "state.txt", content: Buffer.from("kept across sessions") }]);
  const firstSession = persistent.currentSession().sessionId;
  const stoppedPersistent = await persistent.stop();
  check(
    stoppedPersistent.snapshot?.id?.startsWith("snap_"),
    `stop() of a persistent sandbox returned no snapshot: ${JSON.stringify(stoppedPersistent.snapshot)}`,
  );
  eq(persistent.currentSnapshotId, stoppedPersistent.snapshot.id, "currentSnapshotId after stop()");
  const kept = await persistent.readFileToBuffer({ path: "state.txt" });
  eq(kept?.toString(), "kept across sessions", "file after the automatic resume");
  check(
    persistent.currentSession().sessionId !== firstSession,
    "reading after stop() did not resume into a new session",
  );
  await persistent.stop();

  step = "Snapshot.delete";
  await fetched.delete();
  let gone = null;
  try {
    await Snapshot.get({ ...sdk, snapshotId: snapshot.snapshotId });
  } catch (err) {
    gone = err;
  }
  check(gone !== null, "Snapshot.get of a deleted snapshot did not fail");
  eq(gone.response?.status, 410, "status of a deleted snapshot");
  eq(gone.json?.error?.code, "snapshot_not_found", "error code of a deleted snapshot");
}

try {
  await main();
  console.log(`conformance: ok (${calls.length} API calls)`);
  process.exit(0);
} catch (err) {
  console.error(`conformance: FAILED at step "${step}": ${err?.message ?? err}`);
  if (err?.json) console.error(`  response body: ${JSON.stringify(err.json)}`);
  if (err?.text && !err?.json) console.error(`  response text: ${err.text}`);
  console.error(`  last API calls: ${calls.slice(-5).join(", ")}`);
  process.exit(1);
}
