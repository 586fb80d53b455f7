'use strict';
// Runs this receiver's judging code (judge.js) over condmsg's test vectors
// (condmsg/schema/vectors, protocol.md "Test vectors"): `node interop/node/vectors.js`
// prints every vector whose verdict differs and exits 1 if any does. Vectors that need
// what amqplib cannot tell (a float field from an integer one, a long string's raw bytes)
// are skipped, as protocol.md allows.
const fs = require('fs');
const path = require('path');
const { judge, isInstant } = require('./judge');

const DIR = path.join(__dirname, '..', '..', 'condmsg', 'schema', 'vectors');
const CANNOT = new Set(['field-types', 'raw-strings']);
const load = (name) => JSON.parse(fs.readFileSync(path.join(DIR, `${name}.json`), 'utf8')).vectors;

// A vector's bytes: {"utf8": ..} or {"hex": ..}, "times" times, or a list of those.
function bytes(v) {
  if (v === null || v === undefined) return null;
  if (Array.isArray(v)) return Buffer.concat(v.map(bytes));
  const one = 'hex' in v ? Buffer.from(v.hex, 'hex') : Buffer.from(v.utf8, 'utf8');
  return Buffer.concat(Array(v.times || 1).fill(one));
}

// A header value as amqplib's decoder hands it over: every number as a JavaScript number,
// a long string decoded from UTF-8, a decimal as its {'!': 'decimal'} object.
function field(v) {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map(field);
  if ('int64' in v) return v.int64;
  if ('float' in v) return v.float;
  if ('decimal' in v) {
    const [whole, part = ''] = v.decimal.split('.');
    return { '!': 'decimal', value: { places: part.length, digits: Number(whole + part) } };
  }
  if ('string_hex' in v) return Buffer.from(v.string_hex, 'hex').toString('utf8');
  return Object.fromEntries(Object.entries(v.table).map(([k, x]) => [k, field(x)]));
}

function delivery(v) {
  const p = v.properties || {};
  const headers = v.headers === undefined || v.headers === null ? undefined
    : Object.fromEntries(Object.entries(v.headers).map(([k, x]) => [k, field(x)]));
  return {
    properties: { headers, replyTo: p.reply_to, messageId: p.message_id, contentType: p.content_type },
    content: bytes(v.body) || Buffer.alloc(0),
  };
}

// What the receiver makes of a vector's delivery, in the vectors' terms.
function verdict(v) {
  try {
    const m = judge(delivery(v), { secret: bytes(v.secret), recipient: 'vectors' });
    // protocol.md, "Trace context": what the ack passes on, as JSON (null: nothing).
    const trace = JSON.stringify((m && m.trace) || null);
    return { valid: true, plain: m === null, part: m !== null && m.seqId !== null, kind: m && m.kind, trace };
  } catch (e) {
    return { valid: false, reason: e.message };
  }
}

let failed = 0; let skipped = 0; let checked = 0;
function expectSame(file, v, got, want) {
  checked += 1;
  const differs = Object.keys(got).filter((k) => k !== 'reason' && k in want && got[k] !== want[k]);
  if (differs.length === 0) return;
  failed += 1;
  console.log(`${file}: ${v.name}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}
for (const file of ['headers', 'messages']) {
  for (const v of load(file)) {
    if ((v.needs || []).some((n) => CANNOT.has(n))) { skipped += 1; continue; }
    const want = { ...v.expect };
    if (want.parsed) Object.assign(want, { kind: want.parsed.kind, part: want.parsed.seq_id !== null });
    if ('trace' in want) want.trace = JSON.stringify(want.trace);
    expectSame(file, v, verdict(v), want);
  }
}
for (const v of load('instants')) expectSame('instants', v, { valid: isInstant(v.value) }, v.expect);
console.log(`${checked} vectors checked, ${skipped} skipped (they need what amqplib does not tell), ${failed} differ`);
process.exit(failed === 0 ? 0 : 1);
