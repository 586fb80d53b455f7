'use strict';
// A condmsg receiver in Node.js (amqplib + pg), written against docs/protocol.md and the
// conformance contract (docs/conformance.md). It shares the receiver store's tables with
// Python consumers of the same queue, so the two can compete for one destination.
const crypto = require('crypto');
const os = require('os');
const amqp = require('amqplib');
const { Pool } = require('pg');
const { broken, fromArgs } = require('./defects');
const { judge, parse, checkPayload } = require('./judge');

fromArgs(process.argv.slice(2));

const env = process.env;
const QUEUE = env.CONDMSG_QUEUE;
const RECIPIENT = env.CONDMSG_RECIPIENT;
const SECRET = env.CONDMSG_SECRET ? Buffer.from(env.CONDMSG_SECRET, 'utf8') : null;
const INVALID = env.CONDMSG_INVALID_QUEUE || 'condmsg.invalid';
const MAX_ATTEMPTS = Number(env.CONDMSG_MAX_ATTEMPTS || 5);
const BACKOFF_MS = Number(env.CONDMSG_RETRY_BACKOFF_MS || 200);
const BACKOFF_MAX_MS = 25 * BACKOFF_MS;
const SEQ_TIMEOUT_MS = Number(env.CONDMSG_SEQUENCE_TIMEOUT_MS || 300000);
// protocol.md, "Which type a receiver declares": classic when unset; case and blanks aside.
const QUEUE_TYPE = env.CONDMSG_DESTINATION_QUEUE_TYPE === undefined ? 'classic' : env.CONDMSG_DESTINATION_QUEUE_TYPE.trim().toLowerCase();
const RECEIVER_ID = `${os.hostname()}:${process.pid}:${RECIPIENT}`.slice(0, 255);
const ACK_TYPE = 'application/vnd.condmsg.ack+json';

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
  // DEFECT ignore-fail-once: the app is to fail the first attempt of this payload.
  if (text === 'conformance:fail-once' && !failedOnce.has(id) && !broken('ignore-fail-once')) {
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
    // DEFECT deliver-duplicates: a consumed row means the app has it already.
    if (row.state === 'consumed') return broken('deliver-duplicates');
    // DEFECT no-cancel-out: a cancelled row means its compensation came first.
    if (broken('no-cancel-out')) return true;
    if (row.at === null) {
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
    // DEFECT no-compensation: the app that has the original is to get its compensation.
    if (row.state !== 'consumed' || row.at !== null || broken('no-compensation')) return false;
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
  // DEFECT read-mode: a transactional read earns a COMMIT ack, never a READ ack.
  const read = broken('read-mode');
  const ack = {
    v: 1, ack_id: crypto.randomBytes(16).toString('hex'), cm_id: m.cmId, destination: m.destination,
    // DEFECT wrong-ack-recipient: the ack names the receiving application's own identity.
    recipient: broken('wrong-ack-recipient') ? `${RECIPIENT}-not` : RECIPIENT,
    receiver: RECEIVER_ID, kind: read ? 'read' : 'commit', read_at: readAt.toISOString(),
    committed_at: read ? null : committedAt.toISOString(), token: m.token,
  };
  // protocol.md, "Trace context": the copy's context goes on with its ack (this receiver
  // records no span of its own). DEFECT drop-trace-context: the ack carries it.
  const trace = m.trace && !broken('drop-trace-context') ? JSON.stringify(m.trace) : null;
  await c.query(
    `INSERT INTO condmsg_outbox (created_at, state, exchange, routing_key, body, message_id, correlation_id,
       content_type, message_type, headers, persistent, mandatory, attempts)
     VALUES ($1, 'pending', '', $2, $3, $4, $5, $6, 'condmsg.ack', $7, true, true, 0)`,
    [committedAt, replyTo, Buffer.from(JSON.stringify(ack)), ack.ack_id, m.cmId, ACK_TYPE, trace]);
}

// --- the broker --------------------------------------------------------------------------
let ch; let confirm; let pool;
let returned = false; // set by the confirm channel's 'return' event (before the confirm)
let lost = false; // a copy came back: the queue is to be declared again before the next
const declareInvalid = () => confirm.assertQueue(INVALID, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
// protocol.md, "The invalid-message queue": the body and headers unchanged, four
// properties kept (a message held in the store has only its headers), the reason and the
// queue it came from added; mandatory, and acked only once the broker confirmed the copy.
// A returned copy (the queue was deleted) throws: the message is not moved.
async function toInvalid(props, body, reason, from = QUEUE) {
  // DEFECT no-invalid-queue: an invalid message is to be moved, not dropped.
  if (broken('no-invalid-queue')) return;
  if (lost) await declareInvalid();
  lost = false;
  const headers = { ...(props.headers || {}), 'condmsg-reason': [...String(reason)].slice(0, 1000).join('') };
  // DEFECT no-original-queue-header: a message moved says which queue it came from.
  if (!broken('no-original-queue-header')) headers['condmsg-original-queue'] = from;
  const { messageId, correlationId, replyTo, contentType } = props;
  returned = false;
  confirm.sendToQueue(INVALID, body, {
    persistent: true, mandatory: true, headers, messageId, correlationId, replyTo, contentType,
  });
  await confirm.waitForConfirms();
  lost = returned;
  if (returned) throw new Error(`the broker returned the copy to ${INVALID}`);
}
// A connection that fails while checked out also says so as an 'error' event, which would
// end the process unheard; the failed query's own error is what counts. A connection that
// failed is closed rather than returned to the pool.
const quiet = () => {};
async function inTx(work) {
  const c = await pool.connect();
  c.on('error', quiet);
  let failed;
  try {
    await c.query('BEGIN');
    const after = await work(c);
    await c.query('COMMIT');
    return after;
  } catch (e) {
    await c.query('ROLLBACK').catch(() => {});
    failed = e instanceof AppFailure ? undefined : e;
    throw e;
  } finally {
    c.off('error', quiet);
    c.release(failed);
  }
}

const isPart = (m) => m !== null && m.seqId !== null;

// One delivery: judge it, hand it over in a transaction with its RLOG row and its ack,
// commit, and only then ack it to RabbitMQ (a crash in between means a redelivery, which
// the RLOG row drops).
async function handle(d) {
  const readAt = new Date();
  let m;
  try {
    try {
      m = judge(d, { secret: SECRET, recipient: RECIPIENT });
    } catch (e) { // anything that fails while judging the one message condemns it alone
      await toInvalid(d.properties, d.content, e.message);
      return ch.ack(d);
    }
    if (isPart(m)) await storePart(d, m);
    else if (await poisoned(d)) return;
  } catch (e) { // the store or the broker failed, not the message: it comes back, uncounted
    console.error(`message ${d.properties.messageId} goes back to its queue: ${e.message}`);
    return setTimeout(() => ch.nack(d, false, true), pauseAfter(1));
  }
  if (isPart(m)) return completeSequences();
  if (m === null) return settle(d, () => inTx((c) => app(c, d, 'plain', null, null, d.content)));
  return settle(d, () => deliver(m, d, d.content, d.properties.messageId || null, d.properties.replyTo, readAt));
}

// The decision, the app's work and the COMMIT ack in one transaction `c`; true if the app
// got the message.
async function deliverIn(c, m, d, body, messageId, replyTo, readAt) {
  if (!(await decide(c, m, messageId, readAt))) {
    // DEFECT ack-duplicates: a duplicate or a discarded original earns no ack.
    if (broken('ack-duplicates') && m.kind === 'original') await enqueueAck(c, m, replyTo, readAt);
    return false;
  }
  await app(c, d, m.kind, m.cmId, m.destination, body);
  // DEFECT ack-second-transaction: the ack commits with the app's work, or not at all.
  if (m.kind === 'original' && !broken('ack-second-transaction')) await enqueueAck(c, m, replyTo, readAt);
  return true;
}

// DEFECT ack-second-transaction (its second half): the ack after the app's commit.
async function ackApart(m, replyTo, readAt) {
  if (m.kind === 'original' && broken('ack-second-transaction')) await inTx((c) => enqueueAck(c, m, replyTo, readAt));
}

async function deliver(m, d, body, messageId, replyTo, readAt) {
  const delivered = await inTx((c) => deliverIn(c, m, d, body, messageId, replyTo, readAt));
  if (delivered) await ackApart(m, replyTo, readAt);
  if (delivered && crashAfterCommit(d, m.kind, body)) process.exit(3);
}

// --- failed attempts (protocol.md, "Failed attempts") -----------------------------------
// The counts' key: the message id, or the SHA-256 of one its column cannot hold.
const poisonKey = (id) => ([...id].length <= 128 && !id.includes('\0') && !/\p{Cs}/u.test(id) ? id
  : `sha256:${crypto.createHash('sha256').update(id, 'utf8').digest('hex')}`);

// The reason to move the message counted under `key` to the invalid-message queue if its
// failed attempts reached max_attempts (their row is deleted), else null; `q` is the pool
// or a transaction's client.
async function exhausted(q, key) {
  const { rows } = await q.query('SELECT attempts, last_error FROM condmsg_poison WHERE message_id = $1', [key]);
  // DEFECT never-give-up: a message that failed max_attempts times is to be moved.
  if (rows.length === 0 || rows[0].attempts < MAX_ATTEMPTS || broken('never-give-up')) return null;
  await q.query('DELETE FROM condmsg_poison WHERE message_id = $1', [key]);
  return `poison message: processing failed ${rows[0].attempts} times: ${rows[0].last_error}`;
}

// A redelivered message that failed max_attempts times goes to the invalid-message queue.
async function poisoned(d) {
  if (!d.fields.redelivered || !d.properties.messageId) return false;
  const moved = await inTx(async (c) => { // the count goes only once the copy is confirmed
    const reason = await exhausted(c, poisonKey(d.properties.messageId));
    if (reason !== null) await toInvalid(d.properties, d.content, reason);
    return reason !== null;
  });
  if (moved) ch.ack(d);
  return moved;
}

// One more failed attempt of the message counted under `key`, in a transaction of its own
// (the app's rolled back); returns the count.
async function countFailure(key, error) {
  const { rows } = await pool.query(
    `INSERT INTO condmsg_poison (message_id, attempts, last_error, updated_at) VALUES ($1, 1, $2, $3)
     ON CONFLICT (message_id) DO UPDATE SET attempts = condmsg_poison.attempts + 1, last_error = $2, updated_at = $3
     RETURNING attempts`, [key, [...error.message].slice(0, 500).join(''), new Date()]);
  return rows[0].attempts;
}

// The pause after the `attempts`-th failure: the message is held meanwhile, so that no
// consumer gets it again at once. None after the last one: the next reading moves it.
function pauseAfter(attempts) {
  // DEFECT no-retry-pause: a failed message waits before it goes back to its queue.
  if (attempts >= MAX_ATTEMPTS || broken('no-retry-pause')) return 0;
  return Math.min(BACKOFF_MS * 2 ** (attempts - 1), BACKOFF_MAX_MS);
}

async function settle(d, work) {
  // DEFECT ack-before-commit, read-mode: the broker ack waits for the commit.
  const early = broken('ack-before-commit') || broken('read-mode');
  if (early) ch.ack(d);
  try {
    await work();
    if (!early) ch.ack(d);
  } catch (e) {
    if (early) return; // the broker has forgotten the message: it is lost
    const key = d.properties.messageId ? poisonKey(d.properties.messageId) : null;
    if (!(e instanceof AppFailure) || !key) {
      setTimeout(() => ch.nack(d, false, true), pauseAfter(1)); // uncounted: the store's fault, or no id
      return;
    }
    const attempts = await countFailure(key, e).catch(() => 1); // a store that fails counts nothing
    setTimeout(() => ch.nack(d, false, true), pauseAfter(attempts));
  }
}

// --- Message Sequences (protocol.md, "Message Sequences") ---------------------------------
// protocol.md, "headers_json": the AMQP values that JSON cannot hold are stored as text.
function jsonHeader(v) {
  if (Buffer.isBuffer(v)) return v.toString('utf8');
  if (Array.isArray(v)) return v.map(jsonHeader);
  if (typeof v === 'number' && !Number.isFinite(v)) return String(v);
  if (v === null || typeof v !== 'object') return v;
  if (v['!'] === 'decimal') {
    const digits = String(v.value.digits).padStart(v.value.places + 1, '0');
    return v.value.places === 0 ? digits : `${digits.slice(0, -v.value.places)}.${digits.slice(-v.value.places)}`;
  }
  if (v['!'] === 'timestamp') return new Date(v.value * 1000).toISOString();
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, jsonHeader(x)]));
}
// Stored headers read back; ones that cannot be are none (the reason alone goes with them).
function storedHeaders(json) {
  try {
    const h = JSON.parse(json);
    return h !== null && typeof h === 'object' && !Array.isArray(h) ? h : {};
  } catch {
    return {};
  }
}

async function storePart(d, m) {
  const p = d.properties;
  const props = { content_type: p.contentType || null, message_id: p.messageId || null, correlation_id: p.correlationId || null, reply_to: p.replyTo || null };
  await inTx(async (c) => {
    // A part whose whole was delivered or discarded already can never complete a sequence:
    // a duplicate, dropped.
    const taken = await c.query('SELECT 1 FROM condmsg_rlog WHERE cm_id = $1 AND destination = $2 AND message_id = $3',
      [m.cmId, m.destination, m.seqId]);
    if (taken.rowCount > 0) return;
    await c.query(
      `INSERT INTO condmsg_sequence_part (seq_id, position, size, queue, headers_json, properties_json, body, received_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`,
      [m.seqId, m.pos, m.size, QUEUE, JSON.stringify(jsonHeader(p.headers)), JSON.stringify(props), d.content, new Date()]);
    // DEFECT ack-per-part: one ack goes out for the whole copy, none for a part.
    if (broken('ack-per-part')) await enqueueAck(c, m, p.replyTo, new Date());
  });
  ch.ack(d);
}

// Why the parts taken for a complete sequence do not make one whole, or null if they do:
// positions 0 to size - 1 of one size.
function discord(seqId, parts) {
  const sizes = [...new Set(parts.map((r) => r.size))].sort((a, b) => a - b);
  if (sizes.length === 1) {
    const whole = parts.length === sizes[0] && parts.every((r, i) => r.position === i);
    return whole ? null : `incomplete sequence ${seqId}: ${parts.length} of ${sizes[0]} parts when taken`;
  }
  const claims = sizes.map((size) => {
    const at = parts.filter((r) => r.size === size).map((r) => r.position + 1);
    return `${at.length > 1 ? 'parts' : 'part'} ${at.join(', ')}: ${size}`;
  });
  return `inconsistent sequence ${seqId}: its parts disagree on its size (${claims.join('; ')})`;
}

// Takes a complete sequence in transaction `c` and delivers its whole; returns what its
// ack needs if the app got it, else null. Whatever the store holds only goes to the
// invalid-message queue before the DELETE commits: a crash duplicates it, never loses it.
async function takeSequence(c, seqId) {
  // The DELETE is the claim: a competing consumer blocks on the rows, then finds none.
  const parts = (await c.query(
    'DELETE FROM condmsg_sequence_part WHERE seq_id = $1 RETURNING position, size, queue, body, headers_json, properties_json', [seqId]))
    .rows.sort((a, b) => a.position - b.position);
  if (parts.length === 0) return null; // another consumer took it
  const disagree = discord(seqId, parts);
  if (disagree !== null) {
    for (const r of parts) {
      await toInvalid({ headers: storedHeaders(r.headers_json) }, r.body, `${disagree}; this is part ${r.position + 1} of ${r.size}`, r.queue);
    }
    return null;
  }
  const headers = storedHeaders(parts[0].headers_json);
  const props = JSON.parse(parts[0].properties_json);
  const body = Buffer.concat(parts.map((r) => r.body));
  const readAt = new Date();
  // DEFECT wrong-sequence-id: the whole's message id is the sequence id, not part 0's.
  const messageId = broken('wrong-sequence-id') ? props.message_id : seqId;
  const d = { fields: { redelivered: false }, properties: { headers, messageId, replyTo: props.reply_to }, content: body };
  let m;
  try { // the whole is judged again: a whole that fails goes as one message
    m = parse(d, { secret: SECRET, recipient: RECIPIENT });
    checkPayload(body, props.content_type);
  } catch (e) {
    await toInvalid({ headers }, body, e.message, parts[0].queue);
    return null;
  }
  const poison = await exhausted(c, poisonKey(seqId)); // its failed attempts go by its sequence id
  if (poison !== null) {
    await toInvalid({ headers }, body, poison, parts[0].queue);
    return null;
  }
  return (await deliverIn(c, m, d, body, seqId, props.reply_to, readAt)) ? { m, replyTo: props.reply_to, readAt } : null;
}

// Sequences whose whole failed here wait out their pause: seq id -> when (ms since 1970).
// There is no delivery to hold unacked, so the pause is this process's alone.
const heldBack = new Map();

// Looks for complete sequences after each part and every half second; a store that fails
// meanwhile leaves them stored for the next look.
async function completeSequences() {
  const { rows } = await pool.query(
    'SELECT seq_id FROM condmsg_sequence_part WHERE queue = $1 GROUP BY seq_id, size HAVING count(*) = size LIMIT 10', [QUEUE])
    .catch((e) => { console.error(`cannot look for complete sequences: ${e.message}`); return { rows: [] }; });
  for (const { seq_id: seqId } of rows) {
    if ((heldBack.get(seqId) || 0) > Date.now()) continue;
    heldBack.delete(seqId);
    let taken;
    try {
      taken = await inTx((c) => takeSequence(c, seqId));
    } catch (e) { // rolled back: the parts stay stored
      const attempts = e instanceof AppFailure ? await countFailure(poisonKey(seqId), e).catch(() => 1) : 1;
      heldBack.set(seqId, Date.now() + pauseAfter(attempts));
      console.error(`sequence ${seqId} stays stored: ${e.message}`);
      continue;
    }
    if (taken) await ackApart(taken.m, taken.replyTo, taken.readAt);
  }
}

async function expireSequences() {
  // DEFECT no-sequence-timeout: an incomplete sequence is moved out at its timeout.
  if (broken('no-sequence-timeout')) return;
  const cutoff = new Date(Date.now() - SEQ_TIMEOUT_MS);
  await inTx(async (c) => {
    const { rows } = await c.query(
      `DELETE FROM condmsg_sequence_part WHERE seq_id IN (SELECT seq_id FROM condmsg_sequence_part GROUP BY seq_id, size
         HAVING min(received_at) < $1 AND count(*) < size) RETURNING seq_id, position, size, queue, body, headers_json`, [cutoff]);
    for (const r of rows) { // published before the DELETE commits: a crash duplicates, never loses
      const reason = `incomplete sequence ${r.seq_id}: part ${r.position + 1} of ${r.size}, others missing after ${SEQ_TIMEOUT_MS} ms`;
      await toInvalid({ headers: storedHeaders(r.headers_json) }, r.body, reason, r.queue);
    }
  });
}

// --- starting ------------------------------------------------------------------------------
class Refused extends Error {} // a setting or a store this receiver cannot run with: exit 2

// protocol.md, "Versions": the store must hold exactly the revisions this receiver
// implements; a row belongs to the store named by its text up to its last `_`.
const REVISIONS = { receiver: 'receiver_0001', outbox: 'outbox_0001' };
async function checkStore() {
  const upgrade = 'run `condmsg db upgrade --store receiver`';
  let rows;
  try {
    ({ rows } = await pool.query('SELECT version_num FROM condmsg_schema_version'));
  } catch (e) {
    if (e.code !== '42P01') throw e; // undefined_table
    throw new Refused(`the receiver store has no condmsg_schema_version table: ${upgrade}`);
  }
  for (const [store, want] of Object.entries(REVISIONS)) {
    const found = rows.map((r) => r.version_num).filter((v) => v.slice(0, v.lastIndexOf('_')) === store);
    if (found.length !== 1 || found[0] !== want) {
      throw new Refused(`the receiver store is at ${found.join(', ') || 'no revision'} of ${store}, `
        + `this receiver implements ${want}: ${upgrade} with the matching condmsg`);
    }
  }
}

// protocol.md, "Queues": declared on a channel of its own, since RabbitMQ closes the channel
// of a declaration whose arguments differ from the queue's (406); a queue of another type
// cannot be read as this one, other differences are the application's choice.
async function declareQueue(conn) {
  const quorum = QUEUE_TYPE === 'quorum';
  const args = quorum ? { 'x-queue-type': 'quorum' } : { 'x-queue-type': 'classic', 'x-max-priority': 10 };
  const own = await conn.createChannel();
  own.on('error', () => {}); // the 406 arrives as the declaration's rejection as well
  try {
    await own.assertQueue(QUEUE, { durable: true, arguments: args });
    await own.close();
  } catch (e) {
    if (e.code !== 406) throw e;
    if (/x-queue-type/.test(e.message) || (quorum && /x-max-priority/.test(e.message))) {
      throw new Refused(`queue ${QUEUE} exists with another type than ${QUEUE_TYPE} `
        + `(CONDMSG_DESTINATION_QUEUE_TYPE): ${e.message}`);
    }
  }
}

async function main() {
  const missing = ['CONDMSG_PG_URL', 'CONDMSG_AMQP_URL', 'CONDMSG_QUEUE', 'CONDMSG_RECIPIENT'].filter((k) => !env[k]);
  if (missing.length > 0) throw new Refused(`set ${missing.join(', ')}`);
  if (!['classic', 'quorum'].includes(QUEUE_TYPE)) {
    throw new Refused(`CONDMSG_DESTINATION_QUEUE_TYPE must be classic or quorum, not ${QUEUE_TYPE}`);
  }
  pool = new Pool({ connectionString: env.CONDMSG_PG_URL, max: 4 });
  // An idle client whose server went away reports it here; the next query gets a new one.
  pool.on('error', (e) => console.error(`an idle database connection failed: ${e.message}`));
  await checkStore();
  const conn = await amqp.connect(env.CONDMSG_AMQP_URL);
  await declareQueue(conn);
  ch = await conn.createChannel();
  confirm = await conn.createConfirmChannel();
  confirm.on('return', () => { returned = true; });
  await declareInvalid();
  await ch.prefetch(20);
  let chain = Promise.resolve(); // one message at a time, in arrival order
  const fatal = (e) => { console.error(e); process.exit(1); };
  await ch.consume(QUEUE, (d) => {
    if (d === null) fatal(new Error('the broker cancelled the consumer (queue deleted?)'));
    chain = chain.then(() => handle(d)).catch(fatal);
  });
  const timer = setInterval(() => {
    const expire = () => expireSequences().catch((e) => console.error(`cannot expire sequences: ${e.message}`));
    chain = chain.then(expire).then(() => completeSequences()).catch(fatal);
  }, 500);
  const stop = () => { clearInterval(timer); chain.then(() => conn.close()).then(() => pool.end()).then(() => process.exit(0), fatal); };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main().catch((e) => {
  console.error(`receiver: ${e instanceof Refused ? '' : 'cannot start: '}${e.message}`);
  process.exit(e instanceof Refused ? 2 : 1);
});
