'use strict';
// Benchmark consumer (rhea). At-least-once: the broker sends unsettled, the
// consumer accepts each message (rhea's autoaccept), with --credit credit.
// Prints {"event":"ready"} once its link is attached, then one JSON result
// line after --messages messages, a stall (--stall seconds with nothing
// received after the first message), or --timeout. Latency is measured per
// message as receive time minus the send time the producer wrote into the body.
// Exit 0 on success, 1 on error, 2 on timeout/stall.
const rhea = require('rhea');
const { nowUs, parseArgs, emit, cpuUs, BODY_TS, BODY_SEQ, connectWatched, Ledger } = require('./common');

const opts = parseArgs(process.argv.slice(2), {
    host: '127.0.0.1',
    port: 5672,
    address: 'bench',
    messages: 100000,   // how many to wait for
    credit: 1000,
    timeout: 120,       // hard limit, seconds
    stall: 15,          // seconds without a message (after the first) = stall
    warmup: 0,          // the first N messages (by sequence) are left out of latency figures
    dump: '',           // write "seq recv_us latency_us" per message to this file (diagnostics)
    seq_base: 0,        // the producer's --seq-base; other sequence numbers are strays (left by an earlier run)
    username: '',
    password: '',
    ledger: '',         // append a ledger line per message received (its message-id) to this file
    client: '',         // the ledger's client name (default consumer-PID)
});
const ledger = opts.ledger ? new Ledger(opts.ledger, opts.client || 'consumer-' + process.pid) : null;

if (!['127.0.0.1', 'localhost', '::1'].includes(opts.host)) {
    throw new Error('this benchmark only talks to the loopback address');
}

const N = opts.messages;
const lat = new Float64Array(N);     // latency µs by arrival order
const latSeq = new Uint32Array(N);   // sequence number by arrival order
const recvAt = new Float64Array(N);  // receive time µs by arrival order
const seen = new Uint8Array(N);
const st = {
    received: 0, dup: 0, outOfOrder: 0, unknownSeq: 0, badBody: 0, redelivered: 0,
    firstRecvUs: 0, lastRecvUs: 0, lastSeq: -1, errors: [],
};
let connection = null;
let finished = false;
const cpu0 = cpuUs();

function pct(sorted, p) {
    if (sorted.length === 0) return null;
    const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p / 100 * sorted.length) - 1));
    return sorted[i];
}

function summary(values) {
    const s = Float64Array.from(values).sort();
    let sum = 0;
    for (const v of s) sum += v;
    return {
        n: s.length,
        mean_us: s.length ? sum / s.length : null,
        p50_us: pct(s, 50), p90_us: pct(s, 90), p99_us: pct(s, 99), p999_us: pct(s, 99.9),
        max_us: s.length ? s[s.length - 1] : null, min_us: s.length ? s[0] : null,
    };
}

function finish(code) {
    if (finished) return;
    finished = true;
    const n = st.received;
    const all = lat.subarray(0, Math.min(n, N));
    const steady = [];
    for (let i = 0; i < all.length; i++) if (latSeq[i] >= opts.warmup) steady.push(all[i]);
    let missing = 0;
    for (let i = 0; i < N; i++) if (!seen[i]) missing++;
    emit({
        role: 'consumer',
        ok: code === 0,
        timed_out: code === 2,
        expected: N,
        received: n,
        missing,
        duplicates: st.dup,
        out_of_order: st.outOfOrder,
        stray: st.unknownSeq,
        bad_body: st.badBody,
        redelivered: st.redelivered,
        first_recv_us: st.firstRecvUs,
        last_recv_us: st.lastRecvUs,
        recv_rate: n > 1 ? (n - 1) / ((st.lastRecvUs - st.firstRecvUs) / 1e6) : 0,
        latency: summary(steady),
        latency_all: summary(all),
        warmup_messages: opts.warmup,
        client_cpu_us: cpuUs() - cpu0,
        errors: st.errors.slice(0, 20),
    });
    if (opts.dump) {
        const rows = [];
        for (let i = 0; i < all.length; i++) rows.push(latSeq[i] + ' ' + recvAt[i].toFixed(1) + ' ' + all[i].toFixed(1));
        require('fs').writeFileSync(opts.dump, rows.join('\n') + '\n');
    }
    // Detach, then close, waiting for the broker's replies (so it has every accept), at most 3 s.
    exitCode = code;
    setTimeout(() => process.exit(code), 3000);
    try {
        if (receiver && receiver.is_open()) receiver.close();
        else if (connection) connection.close();
    } catch (e) { process.exit(code); }
}
let exitCode = 0;
let receiver = null;

const container = rhea.create_container({ id: 'bench-consumer-' + process.pid });
container.on('receiver_open', (ctx) => { receiver = ctx.receiver; emit({ event: 'ready' }); });
container.on('receiver_close', () => { if (finished && connection) connection.close(); });
container.on('connection_close', () => { if (finished) process.exit(exitCode); });
container.on('message', (ctx) => {
    const t = nowUs();
    if (ledger && ctx.message.message_id !== undefined) ledger.add(opts.address, ctx.message.message_id, 'received');
    const body = ctx.message.body;
    const buf = body && body.content;
    if (!Buffer.isBuffer(buf) || buf.length < 12) {
        st.badBody++;
    } else {
        const ts = buf.readDoubleLE(BODY_TS);
        const seq = buf.readUInt32LE(BODY_SEQ) - opts.seq_base;
        if (seq < 0 || seq >= N) {
            // not from this run's producer: counted apart, not toward --messages
            st.unknownSeq++;
            return;
        } else {
            if (seen[seq]) st.dup++;
            seen[seq] = 1;
            if (seq < st.lastSeq) st.outOfOrder++;
            st.lastSeq = seq;
            if (st.received < N) {
                lat[st.received] = t - ts;
                recvAt[st.received] = t;
                latSeq[st.received] = seq;
            }
        }
    }
    if (ctx.message.delivery_count) st.redelivered++;
    if (st.received === 0) st.firstRecvUs = t;
    st.lastRecvUs = t;
    st.received++;
    if (st.received === N) {
        setImmediate(() => finish(st.dup || st.badBody ? 1 : 0));
    }
});
connection = connectWatched(container, opts, 'receiver', st, () => finished, finish, () => process.exit(exitCode));
connection.open_receiver({ source: { address: opts.address }, credit_window: opts.credit, autoaccept: true });

// Stall watchdog: 4 checks a second, bounded by the hard timeout below.
let lastCount = 0;
let lastProgressUs = nowUs();
setInterval(() => {
    if (st.received !== lastCount) { lastCount = st.received; lastProgressUs = nowUs(); return; }
    if (st.received > 0 && nowUs() - lastProgressUs > opts.stall * 1e6) {
        st.errors.push('stalled: nothing received for ' + opts.stall + ' s after ' + st.received + ' messages');
        finish(2);
    }
}, 250).unref();
setTimeout(() => { st.errors.push('timeout after ' + opts.timeout + ' s'); finish(2); }, opts.timeout * 1000).unref();
