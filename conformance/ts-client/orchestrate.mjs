// The proMCP orchestration pattern against physd, driven by the official
// TypeScript SDK v2 client (@modelcontextprotocol/client), in both protocol
// eras, over Streamable HTTP and stdio:
//
//   PLAN     can_do: heating in zone_a
//   OBSERVE  the related read_ tools, in parallel
//   EXECUTE  do_fan_zone_b with a fresh idempotency key (needs no role
//            without a policy), and the same key again (the recorded answer)
//   VERIFY   read the related humidity again from the device
//
// and the approval round of the greenhouse policy: the operator asks for
// do_heater_zone_a at 70 % (the policy asks a human above 60 %). A
// 2026-07-28 client that elicits confirms and gets status success; a legacy
// client over stateless HTTP cannot be asked and gets status failed with
// permission requires_human_approval. Each approval case gets its own
// daemon (do_heater_zone_a has a 15 s cooldown once it has run).
//
// With --tls-dir DIR (ca.pem, server.pem, server-key.pem from
// conformance/testca; the caller puts ca.pem in NODE_EXTRA_CA_CERTS), the
// same runs over HTTPS against physd --tls-cert/--tls-key: the orchestration
// in both eras with a transport token, and the approval round with the
// policy's operator token; plain HTTP to the TLS port and HTTPS without a
// token must both fail.
//
// Usage: node orchestrate.mjs --physd BIN --manifest FILE --policy FILE [--tls-dir DIR]
// Prints one line per check, then one summary line; exits 1 on any failed
// expectation.

import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const { values: opt } = parseArgs({
  options: {
    physd: { type: 'string' },
    manifest: { type: 'string' },
    policy: { type: 'string' },
    'tls-dir': { type: 'string' },
    'timeout-ms': { type: 'string', default: '120000' },
  },
});
for (const k of ['physd', 'manifest', 'policy']) {
  if (!opt[k]) {
    console.error(`usage: node orchestrate.mjs --physd BIN --manifest FILE --policy FILE (missing --${k})`);
    process.exit(2);
  }
}

const OPERATOR_TOKEN = 'greenhouse-operator-demo-token';
const MODERN = '2026-07-28';
let checks = 0;
const failures = [];
const daemons = [];
const tmpDirs = [];

function check(label, ok, detail = '') {
  checks++;
  if (ok) {
    console.log(`ok   ${label}`);
  } else {
    failures.push(label);
    console.log(`FAIL ${label}${detail ? ': ' + detail : ''}`);
  }
  return ok;
}

function stateDir() {
  const d = mkdtempSync(join(tmpdir(), 'physd-ts-'));
  tmpDirs.push(d);
  return d;
}

// startDaemon runs physd on an ephemeral loopback port and resolves with
// its MCP URL (http or https, as physd logs it) once it logs "ready".
function startDaemon(extra = []) {
  const args = ['run', '--manifest', opt.manifest, '--state', stateDir(), '--http', '127.0.0.1:0', ...extra];
  const child = spawn(opt.physd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  daemons.push(child);
  const lines = [];
  return new Promise((resolve, reject) => {
    let url = '';
    const timer = setTimeout(() => reject(new Error(`physd did not get ready:\n${lines.join('\n')}`)), 20000);
    child.on('exit', code => reject(new Error(`physd exited (${code}):\n${lines.join('\n')}`)));
    createInterface({ input: child.stderr }).on('line', line => {
      lines.push(line);
      let rec;
      try { rec = JSON.parse(line); } catch { return; }
      if (rec.msg === 'listening') url = rec.mcp;
      if (rec.msg === 'ready' && url) {
        clearTimeout(timer);
        resolve(url);
      }
    });
  });
}

function structured(res, label) {
  if (res.isError) throw new Error(`${label}: tool error: ${JSON.stringify(res.content)}`);
  if (!res.structuredContent) throw new Error(`${label}: no structuredContent`);
  return res.structuredContent;
}

function newClient(era, { elicit } = {}) {
  const capabilities = elicit ? { elicitation: { form: {} } } : {};
  const client = new Client({ name: 'physd-ts-orchestrate', version: '1' }, {
    capabilities,
    versionNegotiation: era === MODERN ? { mode: { pin: MODERN } } : { mode: 'legacy' },
  });
  if (elicit) client.setRequestHandler('elicitation/create', elicit);
  return client;
}

function httpTransport(url, token) {
  const requestInit = token ? { headers: { Authorization: `Bearer ${token}` } } : undefined;
  return new StreamableHTTPClientTransport(new URL(url), { requestInit });
}

function stdioTransport(extra = []) {
  return new StdioClientTransport({
    command: opt.physd,
    args: ['run', '--manifest', opt.manifest, '--state', stateDir(), '--stdio', ...extra],
    stderr: 'ignore',
  });
}

// orchestrate runs can_do → parallel reads → do → replay → verifying read.
async function orchestrate(name, era, transport) {
  const client = newClient(era);
  try {
    await client.connect(transport);
    check(`${name}: connected in the ${era === MODERN ? 'modern' : 'legacy'} era`,
      client.getProtocolEra() === (era === MODERN ? 'modern' : 'legacy'), `era ${client.getProtocolEra()}`);
    const { tools } = await client.listTools();
    const names = new Set(tools.map(t => t.name));
    check(`${name}: tools/list has can_do, read_ and do_ tools`, names.has('can_do') && names.has('do_fan_zone_b') && names.has('read_humidity_zone_b'),
      [...names].join(','));

    // PLAN (the fan needs no role: these callers are anonymous, or a viewer)
    const sent = Date.now();
    const plan = structured(await client.callTool({ name: 'can_do', arguments: {
      intent: { semantic_tags: ['ventilation'], action: 'increase', location: 'zone_b' } } }), 'can_do');
    const top = plan.candidates?.[0];
    check(`${name}: can_do ventilation in zone_b is feasible with do_fan_zone_b first`,
      plan.feasible === true && top?.capability === 'do_fan_zone_b' && top?.permission === 'allowed',
      JSON.stringify({ feasible: plan.feasible, top }));
    check(`${name}: the candidate's valid_until is in the future`, Date.parse(top?.valid_until) > sent, top?.valid_until);
    const related = plan.context?.related_reads ?? [];
    check(`${name}: can_do names related reads`, related.includes('read_humidity_zone_b'), JSON.stringify(related));

    // OBSERVE, in parallel
    const obs = await Promise.all(related.map(r => client.callTool({ name: r, arguments: {} }).then(res => structured(res, r))));
    check(`${name}: ${related.length} parallel reads are good observations`,
      obs.length > 0 && obs.every(o => o.quality === 'good' && typeof o.value === 'number' && o.unit && !Number.isNaN(Date.parse(o.timestamp))),
      JSON.stringify(obs));

    // EXECUTE with a fresh key, then the same key again
    const key = randomUUID();
    const value = era === MODERN ? 40 : 55;
    const args = { value, idempotency_key: key };
    const done = structured(await client.callTool({ name: 'do_fan_zone_b', arguments: args }), 'do_fan_zone_b');
    check(`${name}: do_fan_zone_b ${value} succeeds with the proMCP fields`,
      done.status === 'success' && done.idempotency_key === key && done.applied_value === value && done.compensable === true &&
      typeof done.compensation_hint === 'string' && Array.isArray(done.side_effects), JSON.stringify(done));
    const again = structured(await client.callTool({ name: 'do_fan_zone_b', arguments: args }), 'do_fan_zone_b replay');
    check(`${name}: the same key returns the recorded answer`, JSON.stringify(again) === JSON.stringify(done), JSON.stringify(again));

    // VERIFY: read the fan's related observation from the device now
    const after = structured(await client.callTool({ name: 'read_humidity_zone_b', arguments: { max_age_ms: 0 } }), 'read_humidity_zone_b');
    check(`${name}: verifying read is fresh`, after.quality === 'good' && after.cached === false, JSON.stringify(after));
  } catch (e) {
    check(`${name}: orchestration`, false, e?.stack ?? String(e));
  } finally {
    await client.close().catch(() => {});
  }
}

// approval asks for do_heater_zone_a 70 as the operator.
async function approval(name, era, transport, want) {
  let asked = 0;
  let message = '';
  const client = newClient(era, {
    elicit: async req => {
      asked++;
      message = req.params?.message ?? '';
      return { action: 'accept', content: { confirm: true } };
    },
  });
  try {
    await client.connect(transport);
    const key = randomUUID();
    const r = structured(await client.callTool({ name: 'do_heater_zone_a', arguments: { value: 70, idempotency_key: key } }), 'do_heater_zone_a');
    if (want === 'success') {
      check(`${name}: the human confirms and do_heater_zone_a 70 succeeds`,
        r.status === 'success' && r.applied_value === 70 && asked === 1 && message.includes('do_heater_zone_a'),
        JSON.stringify({ asked, status: r.status, permission: r.permission, reason: r.reason }));
    } else {
      check(`${name}: a client that cannot be asked gets failed / requires_human_approval`,
        r.status === 'failed' && r.permission === 'requires_human_approval' && asked === 0,
        JSON.stringify({ asked, status: r.status, permission: r.permission, reason: r.reason }));
    }
  } catch (e) {
    check(`${name}: approval`, false, e?.stack ?? String(e));
  } finally {
    await client.close().catch(() => {});
  }
}

async function main() {
  const plain = await startDaemon();
  for (const era of [MODERN, 'legacy']) {
    await orchestrate(`http/${era}`, era, httpTransport(plain));
    await orchestrate(`stdio/${era}`, era, stdioTransport());
  }
  const policy = ['--policy', opt.policy];
  const [p1, p2] = await Promise.all([startDaemon(policy), startDaemon(policy)]);
  await approval(`http/${MODERN} approval`, MODERN, httpTransport(p1, OPERATOR_TOKEN), 'success');
  await approval('http/legacy approval', 'legacy', httpTransport(p2, OPERATOR_TOKEN), 'refused');
  await approval(`stdio/${MODERN} approval`, MODERN, stdioTransport([...policy, '--stdio-role', 'operator']), 'success');
  await approval('stdio/legacy approval', 'legacy', stdioTransport([...policy, '--stdio-role', 'operator']), 'success');
  if (opt['tls-dir']) await overTLS(opt['tls-dir']);
}

// refused connects a client that must not get in.
async function refused(name, transport) {
  const client = newClient(MODERN);
  try {
    await client.connect(transport);
    await client.listTools();
    check(name, false, 'connected and listed tools');
  } catch (e) {
    check(name, true);
  } finally {
    await client.close().catch(() => {});
  }
}

// overTLS repeats the checks over HTTPS with a test CA.
async function overTLS(dir) {
  const token = 'ts-client-transport-token-' + randomUUID();
  const tokenFile = join(stateDir(), 'token');
  writeFileSync(tokenFile, token, { mode: 0o600 });
  const tls = ['--tls-cert', join(dir, 'server.pem'), '--tls-key', join(dir, 'server-key.pem')];
  const url = await startDaemon([...tls, '--auth-token-file', tokenFile]);
  check('https: physd serves MCP over TLS', url.startsWith('https://'), url);
  for (const era of [MODERN, 'legacy']) {
    await orchestrate(`https/${era}`, era, httpTransport(url, token));
  }
  await refused('https: no token is refused', httpTransport(url));
  await refused('https: plain HTTP to the TLS port is refused', httpTransport(url.replace('https://', 'http://'), token));
  const p = await startDaemon([...tls, '--policy', opt.policy]);
  await approval(`https/${MODERN} approval`, MODERN, httpTransport(p, OPERATOR_TOKEN), 'success');
}

function cleanup() {
  for (const d of daemons) if (d.exitCode === null) d.kill('SIGTERM');
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
}

const deadline = setTimeout(() => {
  console.log(`FAIL timed out after ${opt['timeout-ms']} ms`);
  cleanup();
  process.exit(1);
}, Number(opt['timeout-ms']));

try {
  await main();
} catch (e) {
  check('setup', false, e?.stack ?? String(e));
}
clearTimeout(deadline);
cleanup();
if (failures.length === 0) {
  const https = opt['tls-dir'] ? ', HTTPS with a test CA' : '';
  console.log(`ts-client: ok (${checks} checks: HTTP and stdio${https}, 2026-07-28 and legacy, approval rounds)`);
  process.exit(0);
}
console.log(`ts-client: FAILED ${failures.length} of ${checks} checks: ${failures.join('; ')}`);
process.exit(1);
