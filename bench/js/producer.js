'use strict';
// Benchmark producer (rhea). At-least-once: transfers are sent unsettled and a
// message counts as done when the broker settles it; at most --inflight are
// unsettled at a time. --rate 0 sends as fast as credit and the in-flight
// limit allow (saturation); --rate R paces R msg/s for --duration seconds.
// The message is encoded once; each send copies the encoded bytes and writes
// the send time and sequence number into the body (see common.js).
// Prints one JSON line with the result; exit 0 on success, 1 on error, 2 on timeout.
const rhea = require('rhea');
const { nowUs, parseArgs, emit, cpuUs, BODY_TS, BODY_SEQ, BODY_MIN, connectWatched, Ledger } = require('./common');

const opts = parseArgs(process.argv.slice(2), {
    host: '127.0.0.1',
    port: 5672,
    address: 'bench',
    messages: 100000,   // message count when --rate is 0
    size: 100,          // body bytes
    inflight: 1000,     // max unsettled deliveries
    rate: 0,            // msg/s; 0 = as fast as possible
    duration: 10,       // seconds, with --rate
    timeout: 120,       // hard limit, seconds
    durable: false,     // set header.durable
    priorities: 0,      // the header's priority of the i-th message sent is i % N (a priority queue's load)
    username: '',       // SASL PLAIN if given; otherwise no SASL layer at all
    password: '',
    seq_base: 0,        // added to each sequence number (the warm-up uses its own range)
    ledger: '',         // append a ledger line per confirmed message to this file; messages get ids CLIENT-SEQ
    client: '',         // the ledger's client name (default producer-PID)
});

if (!['127.0.0.1', 'localhost', '::1'].includes(opts.host)) {
    throw new Error('this benchmark only talks to the loopback address');
}
if (opts.size < BODY_MIN) throw new Error('size must be at least ' + BODY_MIN);

const target = opts.rate > 0 ? Math.round(opts.rate * opts.duration) : opts.messages;

// Encode once, locate the body inside the encoding (the data section is last).
const proto = Buffer.alloc(opts.size, 'x'.charCodeAt(0));
const tmplMsg = { body: rhea.message.data_section(proto) };
if (opts.durable) tmplMsg.durable = true;
const PRIORITY_MARK = 0xAB;  // a placeholder priority, found in the encoding and patched per message
if (opts.priorities) tmplMsg.priority = PRIORITY_MARK;
// With a ledger each message has a message-id, CLIENT-SEQ (SEQ 10 digits, written into a copy of the
// encoding like the body's fields).
const ledger = opts.ledger ? new Ledger(opts.ledger, opts.client || 'producer-' + process.pid) : null;
const ID_DIGITS = 10;
if (ledger) tmplMsg.message_id = ledger.client + '-' + '0'.repeat(ID_DIGITS);
const template = rhea.message.encode(tmplMsg);
const bodyOff = template.length - opts.size;
if (!template.subarray(bodyOff).equals(proto)) throw new Error('cannot locate body in encoded message');
const idOff = ledger ? template.indexOf(Buffer.from(tmplMsg.message_id)) + ledger.client.length + 1 : -1;
if (ledger && idOff <= ledger.client.length) throw new Error('cannot locate message-id in encoded message');
const priorityOff = opts.priorities ? template.indexOf(Buffer.from([0x50, PRIORITY_MARK])) + 1 : -1;  // a ubyte
if (opts.priorities && !(priorityOff > 0 && priorityOff < bodyOff)) throw new Error('cannot locate priority in encoded message');

const st = {
    sent: 0, settled: 0, accepted: 0, released: 0, rejected: 0, modified: 0, other: 0,
    firstSendUs: 0, lastSendUs: 0, lastSettleUs: 0, errors: [],
};
let sender = null;
let connection = null;
let startUs = 0;
let finished = false;
const cpu0 = cpuUs();

function finish(code) {
    if (finished) return;
    finished = true;
    const elapsedUs = (st.lastSettleUs || nowUs()) - st.firstSendUs;
    emit({
        role: 'producer',
        ok: code === 0,
        timed_out: code === 2,
        target,
        size: opts.size,
        rate_target: opts.rate,
        sent: st.sent,
        settled: st.settled,
        accepted: st.accepted,
        released: st.released,
        rejected: st.rejected,
        modified: st.modified,
        other_outcome: st.other,
        first_send_us: st.firstSendUs,
        last_send_us: st.lastSendUs,
        last_settle_us: st.lastSettleUs,
        send_rate: st.sent > 1 ? (st.sent - 1) / ((st.lastSendUs - st.firstSendUs) / 1e6) : 0,
        settle_rate: st.settled > 0 && elapsedUs > 0 ? st.settled / (elapsedUs / 1e6) : 0,
        client_cpu_us: cpuUs() - cpu0,
        errors: st.errors.slice(0, 20),
    });
    // Close and wait for the broker's close (at most 3 s).
    exitCode = code;
    setTimeout(() => process.exit(code), 3000);
    try { if (connection) connection.close(); } catch (e) { process.exit(code); }
}
let exitCode = 0;

function sendOne() {
    const b = Buffer.allocUnsafe(template.length);
    template.copy(b);
    const t = nowUs();
    b.writeDoubleLE(t, bodyOff + BODY_TS);
    b.writeUInt32LE((st.sent + opts.seq_base) >>> 0, bodyOff + BODY_SEQ);
    if (opts.priorities) b[priorityOff] = st.sent % opts.priorities;
    const delivery = sender.send(b, undefined, 0);
    if (ledger) {
        delivery.ledger_id = String(st.sent + opts.seq_base).padStart(ID_DIGITS, '0');
        b.write(delivery.ledger_id, idOff, 'latin1');
    }
    if (st.sent === 0) st.firstSendUs = t;
    st.lastSendUs = t;
    st.sent++;
}

// Send what is allowed now: credit, in-flight limit, and (paced) what is due.
function pump() {
    if (!sender || finished) return;
    let due = target;
    if (opts.rate > 0) {
        due = Math.min(target, Math.floor((nowUs() - startUs) / 1e6 * opts.rate) + 1);
    }
    while (st.sent < due && st.sent - st.settled < opts.inflight && sender.sendable()) {
        sendOne();
    }
}

let pacer = null;
function startPacing() {
    startUs = nowUs();
    if (opts.rate > 0) {
        // setTimeout(1) ticks about every 1.1 ms; each tick sends what is due.
        const tick = () => {
            pump();
            if (st.sent < target && !finished) pacer = setTimeout(tick, 1);
        };
        tick();
    } else {
        pump();
    }
}

function onOutcome(kind) {
    return (ctx) => { st[kind]++; };
}

const container = rhea.create_container({ id: 'bench-producer-' + process.pid });
container.on('sendable', () => pump());
container.on('accepted', (ctx) => {
    st.accepted++;
    if (ledger) ledger.add(opts.address, ledger.client + '-' + ctx.delivery.ledger_id, 'confirmed');
});
container.on('released', onOutcome('released'));
container.on('rejected', (ctx) => {
    st.rejected++;
    if (st.errors.length < 20) {
        const err = ctx.delivery.remote_state && ctx.delivery.remote_state.error;
        st.errors.push('rejected: ' + JSON.stringify(err || null));
    }
});
container.on('settled', () => {
    st.settled++;
    st.lastSettleUs = nowUs();
    if (st.settled >= target && st.sent >= target) {
        finish(st.rejected + st.released > 0 ? 1 : 0);
        return;
    }
    pump();
});
container.on('sender_open', (ctx) => { sender = ctx.sender; startPacing(); });
container.on('connection_close', () => { if (finished) process.exit(exitCode); });
connection = connectWatched(container, opts, 'sender', st, () => finished, finish, () => process.exit(exitCode));
connection.open_sender({ target: { address: opts.address } });

setTimeout(() => { st.errors.push('timeout after ' + opts.timeout + ' s'); finish(2); }, opts.timeout * 1000).unref();
