'use strict';
// Judging one delivery (protocol.md, "Judging a message", steps 2 to 5): its headers,
// its message id, its token and its payload. Pure: no broker, no store. Whatever fails
// throws Invalid, whose message is the condmsg-reason of the copy on the invalid queue.
const crypto = require('crypto');
const { broken } = require('./defects');

class Invalid extends Error {}

const KINDS = new Set(['original', 'compensation', 'success']);
const REQUIRES = new Set(['none', 'pickup', 'process']);
// RFC 3339 with an offset, as protocol.md's "Instants" (condmsg.core.protocol.INSTANT_PATTERN).
const INSTANT = new RegExp('^(?!0000)(\\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])[Tt]'
  + '([01]\\d|2[0-3]):([0-5]\\d):([0-5]\\d)(?:\\.(\\d+))?(?:[Zz]|([+-])([01]\\d|2[0-3]):([0-5]\\d))$');
const MAX_INSTANT_CHARS = 64;
const FIRST_SECOND = utcSecond(1, 1, 1);
const LAST_SECOND = utcSecond(9999, 12, 31) + 86399;

// Every header rule goes through here.
// DEFECT no-header-validation: a delivery that breaks a header rule is invalid.
function check(ok, reason) {
  if (!ok && !broken('no-header-validation')) throw new Invalid(reason);
}

// Text (protocol.md, "Values on the wire"): non-empty, no C0 control character, no unpaired
// surrogate, at most `max` code points (the store's varchar columns count code points).
function isText(v, max) {
  // eslint-disable-next-line no-control-regex
  return typeof v === 'string' && v.length > 0 && !/[\u0000-\u001f]/.test(v) && !/\p{Cs}/u.test(v)
    && [...v].length <= max;
}

function text(h, name, max, required = true) {
  let v = h[name];
  if (v === undefined || v === null) {
    check(!required, `missing header ${name}`);
    return null;
  }
  if (Buffer.isBuffer(v)) v = v.toString('utf8');
  check(isText(v, max), `header ${name} is not text of at most ${max} characters`);
  return v;
}

// amqplib hands every AMQP number over as one JavaScript number: an integral double passes
// (protocol.md allows it to a client that cannot see the field type); a fraction does not.
function integer(h, name) {
  const v = h[name];
  check(typeof v === 'number' && Number.isInteger(v), `header ${name} is not an integer`);
  return v;
}

// Seconds from 1970 to the start of a day of the proleptic Gregorian calendar (setUTCFullYear,
// unlike Date.UTC, takes years 0-99 as they are), or NaN for a day its month does not have.
function utcSecond(year, month, day) {
  const t = new Date(0);
  t.setUTCFullYear(year, month - 1, day);
  return t.getUTCDate() === day ? t.getTime() / 1000 : NaN;
}

// An instant whose date exists and that lies within years 1-9999 once in UTC; digits beyond
// microseconds round up, so 9999-12-31T23:59:59.9999999Z is past the last instant.
function isInstant(v) {
  const f = typeof v === 'string' && v.length <= MAX_INSTANT_CHARS ? INSTANT.exec(v) : null;
  if (f === null) return false;
  const [y, mo, d, hh, mm, ss] = f.slice(1, 7).map(Number);
  const offset = f[8] === undefined ? 0 : (f[8] === '-' ? -1 : 1) * (Number(f[9]) * 60 + Number(f[10]));
  const second = utcSecond(y, mo, d) + hh * 3600 + (mm - offset) * 60 + ss;
  const fraction = f[7] || '';
  const roundsOver = second === LAST_SECOND && /^9{6}/.test(fraction) && /[1-9]/.test(fraction.slice(6));
  return second >= FIRST_SECOND && second <= LAST_SECOND && !roundsOver;
}

/** The condmsg headers of a delivery `d` ({properties, content}), judged. */
function parse(d, { secret, recipient }) {
  const h = d.properties.headers;
  check(integer(h, 'condmsg-version') === 1, 'unsupported condmsg-version');
  const kind = text(h, 'condmsg-kind', 16);
  check(KINDS.has(kind), `unknown condmsg-kind ${kind}`);
  const m = {
    kind,
    cmId: text(h, 'condmsg-cm-id', 36),
    destination: text(h, 'condmsg-destination', 255),
    recipient: text(h, 'condmsg-recipient', 255, false),
    sender: text(h, 'condmsg-sender', 255),
    sentAt: text(h, 'condmsg-sent-at', MAX_INSTANT_CHARS),
    token: text(h, 'condmsg-token', 64, kind === 'original'), // a copy is always signed
    seqId: text(h, 'condmsg-seq-id', 64, false),
  };
  check(isInstant(m.sentAt), 'header condmsg-sent-at is not an RFC 3339 instant within years 1-9999');
  check(m.token === null || /^[0-9a-f]{64}$/.test(m.token), 'header condmsg-token is not 64 lowercase hex digits');
  const req = text(h, 'condmsg-requires', 16, false);
  check(req === null || REQUIRES.has(req), `unknown condmsg-requires ${req}`);
  check(kind === 'original' || m.seqId === null, `a ${kind} is never split into a sequence`);
  const { replyTo, messageId: id } = d.properties;
  check(replyTo === undefined || !replyTo.includes('\0'), 'reply_to holds a NUL');
  check(kind !== 'original' || (typeof replyTo === 'string' && replyTo.length > 0), 'an original needs reply_to');
  // A whole original's failed attempts are counted under its id (so it needs one); a part's
  // id is kept in no length-bound column: its whole is known by condmsg-seq-id.
  check(kind !== 'original' || m.seqId !== null || (!!id && !id.includes('\0') && [...id].length <= 64),
    'an original needs a message id without NUL, of at most 64 characters');
  if (m.seqId !== null) {
    m.pos = integer(h, 'condmsg-seq-pos');
    m.size = integer(h, 'condmsg-seq-size');
    check(m.size >= 2 && m.size <= 2 ** 31 - 1 && m.pos >= 0 && m.pos < m.size, 'bad sequence numbers');
  }
  // protocol.md, "Trace context": a well-formed traceparent (and its tracestate) is passed
  // on in the ack; a malformed one is ignored, never a reason to refuse the message.
  const tp = h.traceparent;
  if (typeof tp === 'string' && /^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/.test(tp)) {
    m.trace = { traceparent: tp };
    const ts = h.tracestate;
    if (typeof ts === 'string' && ts.length > 0 && ts.length <= 512) m.trace.tracestate = ts;
  }
  // DEFECT refuse-wrong-recipient: a copy for another recipient is to be delivered and acked.
  if (broken('refuse-wrong-recipient') && m.recipient !== null && m.recipient !== recipient) {
    throw new Invalid(`a copy for recipient ${m.recipient}, not ${recipient}`);
  }
  // DEFECT no-verify: every token is to be checked when the secret is known.
  if (secret && !broken('no-verify')) verify(m, d.content, secret);
  return m;
}

// --- tokens (protocol.md, "Tokens") ----------------------------------------------------
function hmac(secret, ...fields) {
  return crypto.createHmac('sha256', secret).update(Buffer.from(fields.join('\x1f'), 'utf8')).digest('hex');
}
function verify(m, body, secret) {
  if (m.token === null) throw new Invalid(`missing header condmsg-token: ${m.kind === 'original' ? 'a copy' : `a ${m.kind}`} must be signed`);
  const r = m.recipient || '';
  const expected = m.kind === 'original' ? hmac(secret, m.cmId, m.destination, r)
    : hmac(secret, m.kind, m.cmId, m.destination, r, crypto.createHash('sha256').update(body).digest('hex'));
  const given = Buffer.from(String(m.token));
  if (given.length !== expected.length || !crypto.timingSafeEqual(Buffer.from(expected), given)) {
    throw new Invalid(`bad token: the ${m.kind}'s HMAC does not verify`);
  }
}

// protocol.md, "Payloads": JSON and text must decode; anything else is bytes.
function checkPayload(body, contentType) {
  const media = (contentType || '').split(';')[0].trim().toLowerCase();
  const json = media === 'application/json' || media.endsWith('+json');
  if (!json && !media.startsWith('text/')) return;
  try {
    const decoded = new TextDecoder('utf-8', { fatal: true }).decode(body);
    if (json) JSON.parse(decoded);
  } catch (e) {
    throw new Invalid(`payload does not decode as ${json ? 'application/json' : 'text/plain'} (${e.message})`);
  }
}

/** A delivery judged: null for a plain message, else its condmsg headers; throws Invalid. */
function judge(d, keys) {
  const plain = !('condmsg-version' in (d.properties.headers || {}));
  const m = plain ? null : parse(d, keys);
  if (m === null || m.seqId === null) checkPayload(d.content, d.properties.contentType);
  return m;
}

module.exports = { Invalid, judge, parse, checkPayload, isInstant };
