'use strict';
// A condmsg receiver in Node.js (amqplib + pg), written against docs/protocol.md and the
// conformance contract (docs/conformance.md). It shares the receiver store's tables with
// Python consumers of the same queue, so the two can compete for one destination.
const crypto = require('crypto');
const os = require('os');
const amqp = require('amqplib');
const { Pool } = require('pg');

const env = process.env;
const QUEUE = env.CONDMSG_QUEUE;
const RECIPIENT = env.CONDMSG_RECIPIENT;
const SECRET = env.CONDMSG_SECRET ? Buffer.from(env.CONDMSG_SECRET, 'utf8') : null;
const INVALID = env.CONDMSG_INVALID_QUEUE || 'condmsg.invalid';
const MAX_ATTEMPTS = Number(env.CONDMSG_MAX_ATTEMPTS || 5);
const BACKOFF_MS = Number(env.CONDMSG_RETRY_BACKOFF_MS || 200);
const BACKOFF_MAX_MS = 25 * BACKOFF_MS;
const SEQ_TIMEOUT_MS = Number(env.CONDMSG_SEQUENCE_TIMEOUT_MS || 300000);
const RECEIVER_ID = `${os.hostname()}:${process.pid}:${RECIPIENT}`.slice(0, 255);
const ACK_TYPE = 'application/vnd.condmsg.ack+json';
const INSTANT = /^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;
const KINDS = new Set(['original', 'compensation', 'success']);

class Invalid extends Error {} // the message's fault: it goes to the invalid-message queue
class AppFailure extends Error {} // the application failed: counted, retried, then invalid

// --- the application of the conformance contract --------------------------------------
const failedOnce = new Set();
function app(client, delivery, kind, cmId, destination, body) {
  const text = body.toString('latin1');
  if (kind !== 'plain' && !delivery.fields.redelivered && text === 'conformance:crash-before-commit') {
    process.exit(3);
  }
  if (text === 'conformance:fail') throw new AppFailure('the application fails on this message');
  const id = delivery.properties.messageId || '';
  if (text === 'conformance:fail-once' && !failedOnce.has(id)) {
    failedOnce.add(id);
    throw new AppFailure('the application fails on this message once');
  }
  return client.query(
    'INSERT INTO conformance_received (kind, cm_id, destination, message_id, body) VALUES ($1, $2, $3, $4, $5)',
    [kind, cmId, destination, delivery.properties.messageId || null, body]).catch((e) => {
    throw new AppFailure(e.message);
  });
}
const crashAfterCommit = (d, kind, body) => kind !== 'plain' && !d.fields.redelivered &&
  body.toString('latin1') === 'conformance:crash-after-commit';

// --- strict reading of the headers (protocol.md, "Messages to a receiver") -------------
function text(h, name, max, required = true) {
  let v = h[name];
  if (v === undefined || v === null) {
    if (required) throw new Invalid(`missing header ${name}`);
    return null;
  }
  if (Buffer.isBuffer(v)) v = v.toString('utf8');
  // eslint-disable-next-line no-control-regex
  if (typeof v !== 'string' || v.length === 0 || /[\u0000-\u001f]/.test(v) || /\p{Cs}/u.test(v)) {
    throw new Invalid(`header ${name} is not text`);
  }
  if ([...v].length > max) throw new Invalid(`header ${name} is longer than ${max} characters`);
  return v;
}
function integer(h, name) {
  const v = h[name];
  if (typeof v !== 'number' || !Number.isInteger(v)) throw new Invalid(`header ${name} is not an integer`);
  return v;
}
function parse(d) {
  const h = d.properties.headers;
  if (integer(h, 'condmsg-version') !== 1) throw new Invalid('unsupported condmsg-version');
  const kind = text(h, 'condmsg-kind', 16);
  if (!KINDS.has(kind)) throw new Invalid(`unknown condmsg-kind ${kind}`);
  const m = {
    kind,
    cmId: text(h, 'condmsg-cm-id', 36),
    destination: text(h, 'condmsg-destination', 255),
    recipient: text(h, 'condmsg-recipient', 255, false),
    sender: text(h, 'condmsg-sender', 255),
    sentAt: text(h, 'condmsg-sent-at', 64),
    token: text(h, 'condmsg-token', 64, false),
    seqId: kind === 'original' ? text(h, 'condmsg-seq-id', 64, false) : null,
  };
  if (!INSTANT.test(m.sentAt)) throw new Invalid('header condmsg-sent-at is not an RFC 3339 instant');
  if (m.token !== null && !/^[0-9a-f]{64}$/.test(m.token)) throw new Invalid('header condmsg-token is not 64 hex digits');
  const req = text(h, 'condmsg-requires', 16, false);
  if (req !== null && !['none', 'pickup', 'process'].includes(req)) throw new Invalid(`unknown condmsg-requires ${req}`);
  if (kind === 'original' && !d.properties.replyTo) throw new Invalid('an original needs reply_to');
  const id = d.properties.messageId;
  if (kind === 'original' && m.seqId === null && id && (id.includes('\0') || [...id].length > 64)) {
    throw new Invalid('an original\'s message id holds a NUL or is longer than 64 characters');
  }
  if (m.seqId !== null) {
    m.pos = integer(h, 'condmsg-seq-pos');
    m.size = integer(h, 'condmsg-seq-size');
    if (m.size < 2 || m.size > 2 ** 31 - 1 || m.pos < 0 || m.pos >= m.size) throw new Invalid('bad sequence numbers');
  }
  if (SECRET) verify(m, d.content);
  return m;
}

// --- tokens (protocol.md, "Tokens") ----------------------------------------------------
const hmac = (...fields) => crypto.createHmac('sha256', SECRET).update(Buffer.from(fields.join('\x1f'), 'utf8')).digest('hex');
function verify(m, body) {
  if (m.token === null) throw new Invalid(`missing header condmsg-token: ${m.kind === 'original' ? 'a copy' : `a ${m.kind}`} must be signed`);
  const r = m.recipient || '';
  const expected = m.kind === 'original' ? hmac(m.cmId, m.destination, r)
    : hmac(m.kind, m.cmId, m.destination, r, crypto.createHash('sha256').update(body).digest('hex'));
  if (!crypto.timingSafeEqual(Buffer.from(expected), Buffer.from(m.token))) {
    throw new Invalid(`bad token: the ${m.kind}'s HMAC does not verify`);
  }
}

// --- the receiver log (protocol.md, "The receiver log", "Transactions and locks") ------
async function decide(c, m, messageId, readAt) {
  const key = [m.cmId, m.destination];
  const locked = async (col) => (await c.query(
    `SELECT state, ${col} AS at FROM condmsg_rlog WHERE cm_id = $1 AND destination = $2 FOR UPDATE`, key)).rows[0];
  if (m.kind === 'original') {
    const r = await c.query(
      `INSERT INTO condmsg_rlog (cm_id, destination, state, message_id, recipient, receiver, sender, read_at,
         transactional, updated_at) VALUES ($1, $2, 'consumed', $3, $4, $5, $6, $7, true, $7) ON CONFLICT DO NOTHING`,
      [...key, messageId, RECIPIENT, RECEIVER_ID, m.sender, readAt]);
    if (r.rowCount === 1) return true;
    const row = await locked('discarded_at');
    if (row.state === 'cancelled' && row.at === null) {
      await c.query('UPDATE condmsg_rlog SET discarded_at = $3, message_id = $4, updated_at = $3 WHERE cm_id = $1 AND destination = $2',
        [...key, readAt, messageId]);
    }
    return false;
  }
  if (m.kind === 'compensation') {
    const r = await c.query(
      `INSERT INTO condmsg_rlog (cm_id, destination, state, receiver, sender, compensated_at, updated_at)
       VALUES ($1, $2, 'cancelled', $3, $4, $5, $5) ON CONFLICT DO NOTHING`, [...key, RECEIVER_ID, m.sender, readAt]);
    if (r.rowCount === 1) return false; // it came first: the original will be dropped
    const row = await locked('compensated_at');
    if (row.state !== 'consumed' || row.at !== null) return false;
    await c.query('UPDATE condmsg_rlog SET compensated_at = $3, updated_at = $3 WHERE cm_id = $1 AND destination = $2', [...key, readAt]);
    return true;
  }
  const r = await c.query(
    "INSERT INTO condmsg_rx_inbox (cm_id, destination, kind, delivered_at) VALUES ($1, $2, 'success', $3) ON CONFLICT DO NOTHING",
    [...key, readAt]);
  if (r.rowCount === 0) return false;
  const row = await locked('success_at');
  if (row === undefined) return true;
  if (row.at !== null) return false;
  await c.query('UPDATE condmsg_rlog SET success_at = $3, updated_at = $3 WHERE cm_id = $1 AND destination = $2', [...key, readAt]);
  return true;
}

async function enqueueAck(c, m, replyTo, readAt) {
  const committedAt = new Date();
  const ack = {
    v: 1, ack_id: crypto.randomBytes(16).toString('hex'), cm_id: m.cmId, destination: m.destination,
    recipient: RECIPIENT, receiver: RECEIVER_ID, kind: 'commit', read_at: readAt.toISOString(),
    committed_at: committedAt.toISOString(), token: m.token,
  };
  await c.query(
    `INSERT INTO condmsg_outbox (created_at, state, exchange, routing_key, body, message_id, correlation_id,
       content_type, message_type, persistent, mandatory, attempts)
     VALUES ($1, 'pending', '', $2, $3, $4, $5, $6, 'condmsg.ack', true, true, 0)`,
    [committedAt, replyTo, Buffer.from(JSON.stringify(ack)), ack.ack_id, m.cmId, ACK_TYPE]);
}

// --- the broker --------------------------------------------------------------------------
let ch; let confirm; let pool;
let returned = false; // set by the confirm channel's 'return' event (before the confirm)
// protocol.md, "The invalid-message queue": the body and headers unchanged, four
// properties kept, the reason added; mandatory, and acked only once the broker confirmed
// the copy. A returned copy (the queue was deleted) throws: the process ends and the
// message comes again, after the queue is declared anew at start.
async function toInvalid(props, body, reason, kept = true) {
  const headers = { ...(props.headers || {}), 'condmsg-reason': String(reason).slice(0, 1000) };
  if (kept) headers['condmsg-original-queue'] = QUEUE;
  const { messageId, correlationId, replyTo, contentType } = kept ? props : {};
  returned = false;
  confirm.sendToQueue(INVALID, body, {
    persistent: true, mandatory: true, headers, messageId, correlationId, replyTo, contentType,
  });
  await confirm.waitForConfirms();
  if (returned) throw new Error(`the broker returned the copy to ${INVALID}`);
}
async function inTx(work) {
  const c = await pool.connect();
  try {
    await c.query('BEGIN');
    const after = await work(c);
    await c.query('COMMIT');
    return after;
  } catch (e) {
    await c.query('ROLLBACK').catch(() => {});
    throw e;
  } finally {
    c.release();
  }
}

// protocol.md, "Payloads": JSON and text must decode; anything else is bytes.
function checkPayload(body, contentType) {
  const media = (contentType || '').split(';')[0].trim().toLowerCase();
  const json = media === 'application/json' || media.endsWith('+json');
  if (!json && !media.startsWith('text/')) return;
  try {
    const text = new TextDecoder('utf-8', { fatal: true }).decode(body);
    if (json) JSON.parse(text);
  } catch (e) {
    throw new Invalid(`payload does not decode as ${json ? 'application/json' : 'text/plain'} (${e.message})`);
  }
}

// One delivery: judge it, hand it over in a transaction with its RLOG row and its ack,
// commit, and only then ack it to RabbitMQ (a crash in between means a redelivery, which
// the RLOG row drops).
async function handle(d) {
  const readAt = new Date();
  const h = d.properties.headers || {};
  const plain = !('condmsg-version' in h);
  let m = null;
  try {
    if (!plain) m = parse(d);
    if (plain || m.seqId === null) checkPayload(d.content, d.properties.contentType);
  } catch (e) { // anything that fails while judging the one message condemns it alone
    await toInvalid(d.properties, d.content, e.message);
    return ch.ack(d);
  }
  if (m !== null && m.seqId !== null) return storePart(d, m);
  if (await poisoned(d)) return;
  if (plain) return settle(d, () => inTx((c) => app(c, d, 'plain', null, null, d.content)));
  return settle(d, () => deliver(m, d, d.content, d.properties.messageId || null, d.properties.replyTo, readAt));
}

async function deliver(m, d, body, messageId, replyTo, readAt) {
  const crash = await inTx(async (c) => {
    if (!(await decide(c, m, messageId, readAt))) return false;
    await app(c, d, m.kind, m.cmId, m.destination, body);
    if (m.kind === 'original') await enqueueAck(c, m, replyTo, readAt);
    return crashAfterCommit(d, m.kind, body);
  });
  if (crash) process.exit(3);
}

// --- failed attempts (protocol.md, "Failed attempts") -----------------------------------
// The counts' key: the message id, or the SHA-256 of one its column cannot hold.
const poisonKey = (id) => ([...id].length <= 128 && !id.includes('\0') && !/\p{Cs}/u.test(id) ? id
  : `sha256:${crypto.createHash('sha256').update(id, 'utf8').digest('hex')}`);

// A redelivered message that failed max_attempts times goes to the invalid-message queue.
async function poisoned(d) {
  if (!d.fields.redelivered || !d.properties.messageId) return false;
  const key = poisonKey(d.properties.messageId);
  const { rows } = await pool.query('SELECT attempts, last_error FROM condmsg_poison WHERE message_id = $1', [key]);
  if (rows.length === 0 || rows[0].attempts < MAX_ATTEMPTS) return false;
  await pool.query('DELETE FROM condmsg_poison WHERE message_id = $1', [key]);
  await toInvalid(d.properties, d.content, `poison message: processing failed ${rows[0].attempts} times: ${rows[0].last_error}`);
  ch.ack(d);
  return true;
}

async function settle(d, work) {
  try {
    await work();
    ch.ack(d);
  } catch (e) {
    const key = d.properties.messageId ? poisonKey(d.properties.messageId) : null;
    if (!(e instanceof AppFailure) || !key) {
      setTimeout(() => ch.nack(d, false, true), BACKOFF_MS); // uncounted: the store's fault, or no id
      return;
    }
    const { rows } = await pool.query(
      `INSERT INTO condmsg_poison (message_id, attempts, last_error, updated_at) VALUES ($1, 1, $2, $3)
       ON CONFLICT (message_id) DO UPDATE SET attempts = condmsg_poison.attempts + 1, last_error = $2, updated_at = $3
       RETURNING attempts`, [key, e.message.slice(0, 500), new Date()]);
    const pause = Math.min(BACKOFF_MS * 2 ** (rows[0].attempts - 1), BACKOFF_MAX_MS);
    setTimeout(() => ch.nack(d, false, true), pause); // held unacked meanwhile: no one else gets it
  }
}

// --- Message Sequences (protocol.md, "Message Sequences") ---------------------------------
async function storePart(d, m) {
  const p = d.properties;
  const props = { content_type: p.contentType || null, message_id: p.messageId || null, correlation_id: p.correlationId || null, reply_to: p.replyTo || null };
  await pool.query(
    `INSERT INTO condmsg_sequence_part (seq_id, position, size, queue, headers_json, properties_json, body, received_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`,
    [m.seqId, m.pos, m.size, QUEUE, JSON.stringify(p.headers), JSON.stringify(props), d.content, new Date()]);
  ch.ack(d);
  await completeSequences();
}

async function completeSequences() {
  const { rows } = await pool.query(
    'SELECT seq_id FROM condmsg_sequence_part WHERE queue = $1 GROUP BY seq_id, size HAVING count(*) = size LIMIT 10', [QUEUE]);
  for (const { seq_id: seqId } of rows) {
    await inTx(async (c) => {
      // The DELETE is the claim: a competing consumer blocks on the rows, then finds none.
      const parts = (await c.query(
        'DELETE FROM condmsg_sequence_part WHERE seq_id = $1 RETURNING position, size, body, headers_json, properties_json', [seqId]))
        .rows.sort((a, b) => a.position - b.position);
      if (parts.length === 0 || parts.length !== parts[0].size) return;
      const headers = JSON.parse(parts[0].headers_json);
      const props = JSON.parse(parts[0].properties_json);
      const d = { fields: { redelivered: false }, properties: { headers, messageId: props.message_id, replyTo: props.reply_to } };
      const body = Buffer.concat(parts.map((r) => r.body));
      const readAt = new Date();
      let m;
      try { // the whole is judged again: a whole that fails goes as one message
        m = parse({ ...d, content: body });
        checkPayload(body, props.content_type);
      } catch (e) {
        await toInvalid({ headers }, body, e.message, false);
        return;
      }
      if (!(await decide(c, m, seqId, readAt))) return;
      await app(c, d, 'original', m.cmId, m.destination, body);
      await enqueueAck(c, m, props.reply_to, readAt);
    }).catch((e) => console.error(`sequence ${seqId} stays stored: ${e.message}`));
  }
}

async function expireSequences() {
  const cutoff = new Date(Date.now() - SEQ_TIMEOUT_MS);
  await inTx(async (c) => {
    const { rows } = await c.query(
      `DELETE FROM condmsg_sequence_part WHERE seq_id IN (SELECT seq_id FROM condmsg_sequence_part GROUP BY seq_id, size
         HAVING min(received_at) < $1 AND count(*) < size) RETURNING seq_id, position, size, body, headers_json`, [cutoff]);
    for (const r of rows) { // published before the DELETE commits: a crash duplicates, never loses
      const reason = `incomplete sequence ${r.seq_id}: part ${r.position + 1} of ${r.size}, others missing after ${SEQ_TIMEOUT_MS} ms`;
      await toInvalid({ headers: JSON.parse(r.headers_json) }, r.body, reason, false);
    }
  });
}

async function main() {
  pool = new Pool({ connectionString: env.CONDMSG_PG_URL, max: 4 });
  const conn = await amqp.connect(env.CONDMSG_AMQP_URL);
  ch = await conn.createChannel();
  confirm = await conn.createConfirmChannel();
  confirm.on('return', () => { returned = true; });
  await confirm.assertQueue(INVALID, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
  await ch.prefetch(20);
  let chain = Promise.resolve(); // one message at a time, in arrival order
  const fatal = (e) => { console.error(e); process.exit(1); };
  await ch.consume(QUEUE, (d) => {
    if (d === null) fatal(new Error('the broker cancelled the consumer (queue deleted?)'));
    chain = chain.then(() => handle(d)).catch(fatal);
  });
  const timer = setInterval(() => {
    chain = chain.then(() => expireSequences()).then(() => completeSequences()).catch(fatal);
  }, 500);
  const stop = () => { clearInterval(timer); chain.then(() => conn.close()).then(() => pool.end()).then(() => process.exit(0), fatal); };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main().catch((e) => { console.error(e); process.exit(1); });
