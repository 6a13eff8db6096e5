// Reads a `conformance server` log and prints one line of shell variable
// assignments: how many scored scenarios ran clean, how many had failures
// (all of them baselined when the suite exited 0), and whether the pending
// http-header-validation scenario passed. It never prints the suite's own
// "N passed, N failed" wording.
//
// Usage: node summarize.mjs LOG SCENARIOS
// where SCENARIOS is the output of `conformance list --server --requirements ERA`
// (its "Server scenarios" section is the scored set).
import { readFileSync } from 'node:fs';

const scored = new Set();
let inServer = false;
for (const l of readFileSync(process.argv[3], 'utf8').split('\n')) {
  if (/^Server scenarios/.test(l)) inServer = true;
  else if (/^\S/.test(l)) inServer = false;
  const m = /^\s+- (\S+)/.exec(l);
  if (inServer && m) scored.add(m[1]);
}

const text = readFileSync(process.argv[2], 'utf8').replace(/\x1b\[[0-9;]*m/g, '');
const lines = text.split('\n');
const start = lines.findIndex(l => l.startsWith('=== SUMMARY ==='));
const total = lines.findIndex((l, i) => i > start && l.startsWith('Total:'));
let clean = 0;
let failing = 0;
let header = 'missing';
for (const l of start >= 0 && total > start ? lines.slice(start + 1, total) : []) {
  const m = /^([✓✗]) ([^:]+):/.exec(l);
  if (!m) continue;
  if (m[2] === 'http-header-validation') header = m[1] === '✓' ? 'ok' : 'failed';
  if (!scored.has(m[2])) continue;
  if (m[1] === '✓') clean++;
  else failing++;
}
console.log(`clean=${clean} failing=${failing} header=${header} parsed=${start >= 0 && total > start && scored.size > 0 ? 1 : 0}`);
