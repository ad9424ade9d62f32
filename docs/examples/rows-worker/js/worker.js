// A worker that takes tasks from a meshbox table of rows and does them.
//
// A task is a row of table tasks with status=queued and an input field.
// The worker lists the queued rows, claims one by writing claim=<worker>
// and lease=<until, RFC3339>, reads the row back and goes on only if its
// claim is the current one (of two claims, the later stamp wins), does
// the work (here: input in upper case), writes status=done and
// result=<output>, and exits once no task is left for it.
//
//   meshbox program add workers --read tasks --write tasks
//   npm ci
//   node worker.js --server nats://127.0.0.1:4222 --nkey <credential> --program workers
//
// The work must be safe to do twice: two workers that claim a task at
// the same moment may both see their own claim before the later one
// arrives. The result is the same either way.
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { parseArgs } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { connect, nkeyAuthenticator } from "nats";

const { values: opt } = parseArgs({
  options: {
    server: { type: "string", default: "nats://127.0.0.1:4222" },
    nkey: { type: "string" }, // the program's credential file
    program: { type: "string" }, // its answers come to _INBOX.<program>
    worker: { type: "string" }, // this worker's name in its claims
    table: { type: "string", default: "tasks" },
    lease: { type: "string", default: "300" }, // seconds a claim holds
    settle: { type: "string", default: "0" }, // ms before reading a claim back
  },
});
if (!opt.nkey || !opt.program) {
  console.error("--nkey and --program are needed (meshbox program add NAME --read tasks --write tasks)");
  process.exit(2);
}
const name = opt.worker || `${opt.program}-${hostname()}-${process.pid}`;

// The credential file: comment lines, then the seed (SU...).
const seed = readFileSync(opt.nkey, "utf8").split("\n").map((l) => l.trim()).find((l) => l.startsWith("SU"));
const nc = await connect({
  servers: opt.server,
  authenticator: nkeyAuthenticator(new TextEncoder().encode(seed)),
  inboxPrefix: `_INBOX.${opt.program}`, // a program may receive only on its own inbox
  name,
});

// The rows API: a JSON request on $MESH.rows.<table>.<op>, answered in
// JSON, or with an error in the headers Nats-Service-Error-Code and
// Nats-Service-Error (404: no such row or table, 400: bad input).
async function call(op, req) {
  const m = await nc.request(`$MESH.rows.${opt.table}.${op}`, JSON.stringify(req), { timeout: 10000 });
  const code = m.headers?.get("Nats-Service-Error-Code");
  if (code) {
    const err = new Error(`${op} ${req.row ?? ""}: ${code} ${m.headers.get("Nats-Service-Error")}`);
    err.code = code;
    throw err;
  }
  return m.json();
}

// A worker may claim a row that is queued and that nobody holds (no
// claim, or a lease that ran out: that worker is gone).
function free(row) {
  if (row.fields.status !== "queued") return false;
  if (!row.fields.claim) return true;
  const until = Date.parse(row.fields.lease ?? "");
  return Number.isNaN(until) || Date.now() > until;
}

// The free rows, the table listed page by page.
async function claimable() {
  const out = [];
  let after = "";
  for (;;) {
    const page = await call("list", { limit: 100, after });
    out.push(...page.rows.filter(free));
    if (!page.more || page.rows.length === 0) return out;
    after = page.rows[page.rows.length - 1].row;
  }
}

async function get(key) {
  try {
    return await call("get", { row: key });
  } catch (err) {
    if (err.code === "404") return { row: key, fields: {}, versions: {} }; // deleted: not free
    throw err;
  }
}

// claim takes task key; it returns the row as claimed, or null when the
// task is not (or no longer) this worker's.
async function claim(key) {
  if (!free(await get(key))) return null; // the list may be old
  const until = new Date(Date.now() + Number(opt.lease) * 1000).toISOString().replace(/\.\d+Z$/, "Z");
  const written = await call("put", { row: key, set: { claim: name, lease: until } });
  await sleep(Number(opt.settle)); // workers on other nodes: their claims arrive
  const row = await get(key);
  // Ours only if the claim is still the one we wrote: a later one wins.
  const c = row.versions.claim;
  return c && c.value === name && c.stamp === written.stamp && row.fields.status === "queued" ? row : null;
}

// The work.
const work = (row) => (row.fields.input ?? "").toUpperCase();

let done = 0;
try {
  for (;;) {
    const tasks = await claimable();
    if (tasks.length === 0) break; // none left for us
    tasks.sort(() => Math.random() - 0.5); // another order than the other workers
    for (const t of tasks) {
      const row = await claim(t.row);
      if (!row) continue; // another worker has it
      // Bytes larger than a field (16 KiB) belong in a blob (the program
      // needs --blobs); the row then holds its name.
      await call("put", { row: t.row, set: { status: "done", result: work(row) } });
      done++;
      console.log(`${name}: task ${t.row} done`);
    }
  }
  console.log(`${name}: ${done} tasks done, none left`);
} catch (err) {
  console.error(`${name}: ${err.message} (after ${done} tasks)`);
  process.exitCode = 1;
} finally {
  await nc.close();
}
