// physd console: keeps the server-rendered page live. Every second it asks
// /console/live for the values and for each section's revision; values
// and ages change in place, and a section whose revision changed is
// replaced by the same section of a fresh GET / (unless the keyboard focus
// is inside it: a half-typed reason is never thrown away). Without this
// script the page still works; it is only static.
'use strict';
(function () {
  const main = document.getElementById('main');
  if (!main) return;
  const conn = document.getElementById('conn');
  const url = main.dataset.live;
  let offset = 0; // server clock minus this clock, ms
  let swapping = false;

  // ago says how old a timestamp is, as agoText does on the server.
  function ago(ms) {
    const s = Math.floor(ms / 1000);
    if (ms < 1000) return 'just now';
    if (s < 60) return s + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    if (s < 86400) return Math.floor(s / 3600) + ' h ago';
    return Math.floor(s / 86400) + ' d ago';
  }

  function now() { return Date.now() + offset; }

  // ages rewrites every age from its datetime, and marks values older than
  // their row's stale limit.
  function ages() {
    const t = now();
    for (const el of document.querySelectorAll('time.age[datetime]')) {
      const ms = t - Date.parse(el.getAttribute('datetime'));
      el.textContent = ago(Math.max(ms, 0));
      const row = el.closest('tr');
      if (row) {
        const q = row.querySelector('.q');
        const bad = q && (q.textContent === 'stale' || q.textContent === 'degraded');
        row.classList.toggle('is-stale', bad || ms > Number(row.dataset.staleMs || 10000));
      }
    }
    for (const el of document.querySelectorAll('time[data-ago][datetime]')) {
      if (!el.dataset.clock) el.dataset.clock = el.textContent;
      el.textContent = ago(Math.max(t - Date.parse(el.getAttribute('datetime')), 0)) + ' (' + el.dataset.clock + ')';
    }
  }

  function setValue(v) {
    const row = document.getElementById('cap-' + v.tool);
    if (!row) return false;
    const val = row.querySelector('.v');
    if (val.textContent !== v.display) {
      val.textContent = v.display;
      row.classList.remove('changed');
      void row.offsetWidth; // restart the highlight
      row.classList.add('changed');
    }
    const q = row.querySelector('.q');
    q.textContent = v.quality;
    q.className = 'q ' + v.quality;
    row.dataset.staleMs = v.stale_ms;
    const age = row.querySelector('time.age');
    if (v.timestamp) age.setAttribute('datetime', v.timestamp);
    else { age.removeAttribute('datetime'); age.textContent = 'never read'; }
    row.querySelector('.err').textContent = v.error || '';
    return true;
  }

  // swap replaces the sections whose revision changed with those of a
  // fresh page.
  async function swap(changed) {
    if (swapping) return;
    swapping = true;
    try {
      const r = await fetch('/', { headers: { Accept: 'text/html' }, credentials: 'same-origin', cache: 'no-store' });
      if (!r.ok) return;
      const doc = new DOMParser().parseFromString(await r.text(), 'text/html');
      for (const name of changed) {
        const cur = document.getElementById('sec-' + name);
        const next = doc.getElementById('sec-' + name);
        if (!cur || !next || cur.contains(document.activeElement)) continue;
        cur.replaceWith(document.importNode(next, true));
      }
      ages();
    } finally {
      swapping = false;
    }
  }

  function status(text, ok) {
    if (conn.textContent !== text) conn.textContent = text;
    conn.className = 'badge ' + (ok ? 'good' : 'warn');
  }

  async function poll() {
    try {
      const r = await fetch(url, { headers: { Accept: 'application/json' }, credentials: 'same-origin', cache: 'no-store' });
      if (r.status === 401 || r.redirected) { location.assign('/login?next=/'); return; }
      if (!r.ok) throw new Error('HTTP ' + r.status);
      const d = await r.json();
      offset = Date.parse(d.now) - Date.now();
      let missing = false;
      for (const v of d.values) missing = !setValue(v) || missing;
      const changed = [];
      for (const [name, rev] of Object.entries(d.revs)) {
        const sec = document.getElementById('sec-' + name);
        if (sec && sec.dataset.rev !== rev) changed.push(name);
      }
      if (missing && !changed.includes('values')) changed.push('values');
      if (changed.length) await swap(changed);
      ages();
      status('live', true);
    } catch (e) {
      status('connection lost: values may be old', false);
    }
    setTimeout(poll, 1000);
  }

  const notice = document.getElementById('notice');
  if (notice) notice.focus();
  ages();
  setInterval(ages, 1000);
  poll();
})();
