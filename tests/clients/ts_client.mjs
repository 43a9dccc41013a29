// The official TypeScript SDK client against the torch-skills server; run by tests/test_ts_client.py.
//
// Usage: node ts_client.mjs <scenario> <transport> <target> [json options]
//   scenario  "tour": discover the Skills extension, list and call every tool, check progress
//             and cancellation; "long": one call of options.sleep_s seconds under a 60 s
//             request timeout that resets on progress.
//   transport "stdio" (target: a JSON array, the server command line) or "http" (target: URL;
//             the bearer token comes from $TORCH_SKILLS_TOKEN).
// Prints one JSON report on stdout; the Python test asserts on it. Structured results are
// checked against each tool's outputSchema twice: by the SDK's own callTool (it validates
// whenever listTools gave it the schema) and here with Ajv, so a pass does not hinge on the
// SDK's choice.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ResultSchema } from "@modelcontextprotocol/sdk/types.js";
import AjvModule from "ajv";

const SKILLS = "io.modelcontextprotocol/skills";
const [scenario, transportKind, target, rawOptions] = process.argv.slice(2);
const options = JSON.parse(rawOptions ?? "{}");
const Ajv = AjvModule.default ?? AjvModule;
const ajv = new Ajv({ strict: false, allErrors: true });

function transport() {
  if (transportKind === "stdio") {
    const [command, ...args] = JSON.parse(target);
    return new StdioClientTransport({ command, args, cwd: options.cwd, env: { ...process.env }, stderr: "inherit" });
  }
  // The server needs its bearer token on every request (TORCH_SKILLS_TOKEN, as the server reads it).
  const token = process.env.TORCH_SKILLS_TOKEN;
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  return new StreamableHTTPClientTransport(new URL(target), { requestInit: { headers } });
}

function progressRecorder() {
  const events = [];
  const start = Date.now();
  return {
    events,
    onprogress: (p) => events.push({ t: (Date.now() - start) / 1000, progress: p.progress, total: p.total, message: p.message }),
  };
}

function checkProgress(events) {
  const problems = [];
  for (let i = 1; i < events.length; i++) {
    if (!(events[i].progress > events[i - 1].progress)) problems.push(`progress did not increase at ${i}`);
  }
  const times = [0, ...events.map((e) => e.t)];
  const maxGap = Math.max(0, ...times.slice(1).map((t, i) => t - times[i]));
  return { count: events.length, maxGap, problems, messages: [...new Set(events.map((e) => e.message))].slice(0, 8) };
}

async function tour(client, report) {
  const caps = client.getServerCapabilities() ?? {};
  report.protocolVersion = client.getNegotiatedProtocolVersion?.() ?? null;
  report.skillsDeclared = {
    experimental: caps.experimental?.[SKILLS] !== undefined,
    extensions: caps.extensions?.[SKILLS] !== undefined,
  };
  if (report.skillsDeclared.experimental || report.skillsDeclared.extensions) {
    const listing = await client.request({ method: "skills/list", params: {} }, ResultSchema);
    report.skills = listing.skills.map((s) => s.frontmatter.name);
    const got = await client.request({ method: "skills/get", params: { uri: listing.skills[0].uri } }, ResultSchema);
    report.skillGet = got.skill.uri;
  }

  const { tools } = await client.listTools();
  report.tools = tools.map((t) => t.name);
  const schemas = Object.fromEntries(tools.map((t) => [t.name, t.outputSchema]));
  report.calls = {};
  for (const [name, args] of Object.entries(options.calls)) {
    const rec = progressRecorder();
    const started = Date.now();
    const entry = (report.calls[name] = {});
    try {
      const result = await client.callTool({ name, arguments: args }, undefined, {
        onprogress: rec.onprogress,
        timeout: 120_000,
        resetTimeoutOnProgress: true,
      });
      entry.isError = result.isError ?? false;
      entry.text = result.content?.[0]?.text?.slice(0, 400);
      entry.hasStructured = result.structuredContent !== undefined;
      if (schemas[name] && result.structuredContent !== undefined) {
        const validate = ajv.compile(schemas[name]);
        entry.schemaValid = validate(result.structuredContent);
        entry.schemaErrors = validate.errors?.slice(0, 3);
      }
      entry.textIsCompactJson = entry.hasStructured && !result.content[0].text.includes("\n");
    } catch (e) {
      entry.error = String(e);
    }
    entry.seconds = (Date.now() - started) / 1000;
    entry.progress = checkProgress(rec.events);
  }

  // Cancellation: abort a slow call after its first progress notification.
  if (options.cancel) {
    const controller = new AbortController();
    const rec = progressRecorder();
    const started = Date.now();
    const pending = client.callTool({ name: options.cancel.name, arguments: options.cancel.arguments }, undefined, {
      signal: controller.signal,
      onprogress: (p) => {
        rec.onprogress(p);
        controller.abort("test cancels");
      },
      timeout: 120_000,
      resetTimeoutOnProgress: true,
    });
    report.cancel = {};
    try {
      await pending;
      report.cancel.outcome = "completed";
    } catch (e) {
      report.cancel.outcome = "rejected";
      report.cancel.error = String(e);
    }
    report.cancel.seconds = (Date.now() - started) / 1000;
    // The server must still answer, and a new job must start at once (the cancelled one is gone).
    const after = await client.callTool({ name: "route", arguments: { query: "CUDA out of memory" } });
    report.cancel.serverStillAnswers = !after.isError;
  }
}

async function long(client, report) {
  const rec = progressRecorder();
  const started = Date.now();
  try {
    const result = await client.callTool({ name: options.name, arguments: options.arguments }, undefined, {
      onprogress: rec.onprogress,
      timeout: 60_000, // the TypeScript SDK's default request timeout
      resetTimeoutOnProgress: true,
    });
    report.isError = result.isError ?? false;
    report.text = result.content?.[0]?.text?.slice(0, 300);
  } catch (e) {
    report.error = String(e);
  }
  report.seconds = (Date.now() - started) / 1000;
  report.progress = checkProgress(rec.events);
}

const client = new Client(
  { name: "torch-skills-ts-test", version: "1.0.0" },
  { capabilities: { extensions: { [SKILLS]: {} } } },
);
const report = { scenario, transport: transportKind };
try {
  await client.connect(transport());
  await (scenario === "long" ? long : tour)(client, report);
} catch (e) {
  report.fatal = String(e?.stack ?? e);
} finally {
  await client.close().catch(() => {});
}
process.stdout.write(JSON.stringify(report) + "\n");
process.exit(0);
