// The web view of dedup serve. Plain JavaScript, no framework: every value from
// the server goes into the page through textContent, never as HTML.
'use strict';

const REFRESH_MS = 2000;
const ENDING_MS = 10000;  // "about to run out": lease left under this
let prefix = '';
let after = null;        // cursor of the current page (null: the first; '' is a cursor)
let pendingForget = null;

function url(path) { return new URL(path, document.baseURI).toString(); }

async function getJson(path) {
  const r = await fetch(url(path), { credentials: 'same-origin' });
  if (!r.ok) throw new Error(path.split('?')[0] + ': HTTP ' + r.status);
  return r.json();
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function b64ToBytes(b64) {
  const s = atob(b64);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

function compareBytes(x, y) {
  for (let i = 0; i < x.length && i < y.length; i++) {
    if (x[i] !== y[i]) return x[i] - y[i];
  }
  return x.length - y.length;
}

// A key's bytes, percent-encoded for its URL (/v1/keys/{key}).
function keyPath(rec) {
  let p = '';
  for (const b of b64ToBytes(rec.key_b64)) {
    const c = String.fromCharCode(b);
    p += /[A-Za-z0-9\-._~]/.test(c) ? c : '%' + b.toString(16).toUpperCase().padStart(2, '0');
  }
  return p;
}

// Text keys show as they are; other bytes as base64.
function keyText(rec) { return rec.key !== undefined ? rec.key : 'base64:' + rec.key_b64; }

function duration(ms) {
  const s = Math.abs(ms) / 1000;
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + ' s';
  if (s < 3600) return (s / 60).toFixed(1) + ' min';
  if (s < 86400) return (s / 3600).toFixed(1) + ' h';
  return (s / 86400).toFixed(1) + ' d';
}

function leaseCell(rec, now) {
  if (rec.state !== 'in_progress') return el('td', '—', 'num');
  const left = rec.lease_deadline_ms - now;
  if (left <= 0) return el('td', 'ran out ' + duration(left) + ' ago', 'num expired');
  return el('td', duration(left), 'num' + (left < ENDING_MS ? ' expired' : ''));
}

function forgetButton(rec) {
  const b = el('button', 'Forget', 'danger');
  b.type = 'button';
  b.dataset.key = keyText(rec);
  b.addEventListener('click', () => askForget(rec));
  return b;
}

function recordRow(rec, now, full) {
  const tr = el('tr');
  tr.append(el('td', keyText(rec), 'key'));
  if (full) tr.append(el('td', rec.state.replace('_', ' '), 'state-' + rec.state));
  tr.append(leaseCell(rec, now));
  tr.append(el('td', rec.fence, 'num'));
  tr.append(el('td', rec.attempt, 'num'));
  tr.append(el('td', duration(rec.retention_deadline_ms - now), 'num'));
  if (full) {
    tr.append(el('td', rec.status || '—'));
    tr.append(el('td', rec.result_bytes + ' B', 'num'));
  }
  const act = el('td');
  act.append(forgetButton(rec));
  tr.append(act);
  return tr;
}

// A record the store cannot decode: its key, why, and Forget (which removes it;
// a Redis key of another type answers 409: only a forced forget, which the page
// does not send for it, removes that).
function undecodableRow(u) {
  const tr = el('tr');
  tr.append(el('td', keyText(u), 'key'));
  tr.append(el('td', 'undecodable', 'state-undecodable'));
  const why = el('td', u.why, 'error');
  why.colSpan = 6;
  tr.append(why);
  const act = el('td');
  act.append(forgetButton(u));
  tr.append(act);
  return tr;
}

function showError(e) {
  const p = document.getElementById('error');
  p.hidden = !e;
  p.textContent = e ? String(e.message || e) : '';
}

async function loadRecords() {
  const q = 'v1/keys?limit=100&prefix=' + encodeURIComponent(prefix) +
            (after !== null ? '&after=' + encodeURIComponent(after) : '');
  const page = await getJson(q);
  const now = page.now_ms;
  const body = document.querySelector('#records tbody');
  // Records and undecodable records in one list, in key order (bytes), as the
  // API pages them.
  const bad = page.undecodable || [];
  const rows = [...bad.map((u) => ({ u, k: b64ToBytes(u.key_b64) })),
                ...page.records.map((r) => ({ r, k: b64ToBytes(r.key_b64) }))];
  rows.sort((a, b) => compareBytes(a.k, b.k));
  body.replaceChildren(...rows.map((e) => (e.u ? undecodableRow(e.u) : recordRow(e.r, now, true))));
  document.getElementById('records-empty').hidden = page.records.length + bad.length > 0;
  const next = document.getElementById('next');
  // The empty key's cursor is '': only null ends the listing.
  next.hidden = page.next === null || page.next === undefined;
  next.dataset.cursor = page.next ?? '';
  document.getElementById('page-note').textContent =
      page.records.length + ' shown' +
      (bad.length ? ', ' + bad.length + ' undecodable' : '') + (page.truncated ? ' (listing capped at 10000 records read)' : '');
}

// In-progress records whose lease ran out (claimable by the next claim) or is
// about to, under the current prefix.
async function loadStuck() {
  const page = await getJson('v1/keys?limit=1000&prefix=' + encodeURIComponent(prefix));
  const now = page.now_ms;
  const stuck = page.records.filter(
      (r) => r.state === 'in_progress' && r.lease_deadline_ms - now < ENDING_MS);
  stuck.sort((a, b) => a.lease_deadline_ms - b.lease_deadline_ms);
  document.querySelector('#stuck tbody').replaceChildren(...stuck.map((r) => recordRow(r, now, false)));
  document.getElementById('stuck-empty').hidden = stuck.length > 0;
}

// Prometheus text: sum each family's series by one label.
function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    const m = /^([a-z_]+)(\{([^}]*)\})? ([0-9.eE+-]+)$/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const kv of (m[3] || '').split(',')) {
      const i = kv.indexOf('=');
      if (i > 0) labels[kv.slice(0, i)] = kv.slice(i + 2, -1);
    }
    (out[m[1]] = out[m[1]] || []).push({ labels, value: Number(m[4]) });
  }
  return out;
}

async function loadCounters() {
  const r = await fetch(url('metrics'), { credentials: 'same-origin' });
  if (!r.ok) throw new Error('metrics: HTTP ' + r.status);
  const m = parseMetrics(await r.text());
  const tiles = [];
  const add = (family, label, title) => {
    for (const s of m[family] || []) {
      tiles.push([title + ' ' + (s.labels[label] || ''), s.value]);
    }
  };
  add('dedup_serve_claims_total', 'outcome', 'claims');
  add('dedup_serve_writes_total', 'op', 'writes');
  add('dedup_proxy_requests_total', 'outcome', 'proxy');
  add('dedup_serve_forgets_total', 'result', 'forgets');
  let requests = 0;
  for (const s of m.dedup_serve_requests_total || []) requests += s.value;
  tiles.unshift(['HTTP requests', requests]);
  const box = document.getElementById('counters');
  box.replaceChildren(...tiles.map(([label, n]) => {
    const d = el('div', undefined, 'counter');
    d.dataset.name = label;
    d.append(el('div', n, 'n'), el('div', label, 'l'));
    return d;
  }));
}

async function loadInfo() {
  const info = await getJson('v1/info');
  document.getElementById('info').textContent =
      'store ' + info.store + ' · version ' + info.version + (info.proxy ? ' · proxy mode' : '');
}

function askForget(rec) {
  pendingForget = rec;
  document.getElementById('confirm-key').textContent = keyText(rec);
  // Confirming here is the operator's force (the API refuses a running lease without it).
  rec.force = rec.state === 'in_progress';
  document.getElementById('confirm-leased').hidden = !rec.force;
  document.getElementById('confirm').showModal();
}

async function doForget(rec) {
  const r = await fetch(url('v1/keys/' + keyPath(rec) + (rec.force ? '?force=true' : '')), {
    method: 'DELETE', credentials: 'same-origin',
    headers: { 'X-Requested-With': 'dedup-page' } });
  if (!r.ok && r.status !== 404) {
    const p = await r.json().catch(() => ({}));
    throw new Error('forget: HTTP ' + r.status + (p.detail ? ': ' + p.detail : ''));
  }
  document.body.dataset.forgotten = keyText(rec);
}

async function refresh() {
  try {
    await Promise.all([loadRecords(), loadStuck(), loadCounters()]);
    showError(null);
  } catch (e) {
    showError(e);
  }
}

document.addEventListener('DOMContentLoaded', async () => {
  const params = new URLSearchParams(location.search);
  prefix = params.get('prefix') || '';
  document.getElementById('prefix').value = prefix;
  document.getElementById('filter').addEventListener('submit', (ev) => {
    ev.preventDefault();
    prefix = document.getElementById('prefix').value;
    after = null;
    refresh();
  });
  document.getElementById('next').addEventListener('click', (ev) => {
    after = ev.target.dataset.cursor;
    refresh();
  });
  document.getElementById('confirm').addEventListener('close', async () => {
    const dlg = document.getElementById('confirm');
    const rec = pendingForget;
    pendingForget = null;
    if (dlg.returnValue !== 'forget' || !rec) return;
    try { await doForget(rec); } catch (e) { showError(e); }
    refresh();
  });
  try { await loadInfo(); } catch (e) { showError(e); }
  await refresh();
  // Set once the first round of fetches has been rendered (tests wait for it).
  document.body.dataset.ready = '1';
  setInterval(refresh, REFRESH_MS);
});
