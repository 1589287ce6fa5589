'use strict';
// Shared helpers for the benchmark's rhea clients (producer.js, consumer.js).
const fs = require('fs');

// Microseconds on CLOCK_MONOTONIC (Node's hrtime), comparable between processes
// on the same machine: the producer stamps it into the body, the consumer
// subtracts it from its own reading.
function nowUs() {
    return Number(process.hrtime.bigint()) / 1000;
}

// --name value / --flag parsing against a table of defaults; numbers stay numbers.
function parseArgs(argv, defaults) {
    const out = Object.assign({}, defaults);
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        if (!a.startsWith('--')) throw new Error('unexpected argument: ' + a);
        const key = a.slice(2).replace(/-/g, '_');
        if (!(key in defaults)) throw new Error('unknown option: ' + a);
        if (typeof defaults[key] === 'boolean') {
            out[key] = true;
            continue;
        }
        const v = argv[++i];
        if (v === undefined) throw new Error('missing value for ' + a);
        out[key] = typeof defaults[key] === 'number' ? Number(v) : v;
        if (typeof defaults[key] === 'number' && !Number.isFinite(out[key])) {
            throw new Error('not a number for ' + a + ': ' + v);
        }
    }
    return out;
}

// The orchestrator may stop reading (it gave up on this run): don't crash on EPIPE.
process.stdout.on('error', () => {});

function emit(obj) {
    process.stdout.write(JSON.stringify(obj) + '\n');
}

function cpuUs() {
    const u = process.cpuUsage();
    return u.user + u.system;
}

// Body layout: [0..8) float64 LE send time in µs (nowUs), [8..12) uint32 LE
// sequence number, then filler up to the body size.
const BODY_TS = 0;
const BODY_SEQ = 8;
const BODY_MIN = 12;

// Connect (SASL PLAIN only when a username is given) and fail the run on any error or on a
// disconnect before it finished; `role` is 'sender' or 'receiver'.
function connectWatched(container, opts, role, st, isFinished, finish, exitNow) {
    for (const ev of ['connection_error', 'session_error', role + '_error', 'protocol_error', 'error']) {
        container.on(ev, (ctx) => {
            if (isFinished()) return;
            const e = ctx.error || (ctx.connection && ctx.connection.error) || (ctx[role] && ctx[role].error);
            st.errors.push(ev + ': ' + (e && (e.description || e.message || JSON.stringify(e))));
            finish(1);
        });
    }
    container.on('disconnected', (ctx) => {
        if (!isFinished()) {
            st.errors.push('disconnected: ' + (ctx.error ? (ctx.error.message || String(ctx.error)) : 'socket closed'));
            finish(1);
        } else {
            exitNow();
        }
    });
    const connOpts = { host: opts.host, port: opts.port, reconnect: false };
    if (opts.username) { connOpts.username = opts.username; connOpts.password = opts.password; }
    return container.connect(connOpts);
}

// A client ledger for `haqueue audit lag --ledger` (design/audit-events.md): a JSON line per message
// the broker confirmed (producer) or the client received (consumer). Lines are appended every
// 50 ms and when the process exits, so a run cut short keeps what it saw.
class Ledger {
    constructor(path, client) {
        this.fd = fs.openSync(path, 'a');
        this.client = client;
        this.lines = [];
        setInterval(() => this.flush(), 50).unref();
        process.on('exit', () => this.flush());
    }

    add(queue, id, op) {
        id = Buffer.isBuffer(id) ? id.toString('hex') : String(id);  // as the audit's events write ids
        this.lines.push(JSON.stringify({ client: this.client, queue, id, op, t: Math.round(Date.now() * 1000) }));
    }

    flush() {
        if (this.lines.length === 0) return;
        fs.writeSync(this.fd, this.lines.join('\n') + '\n');
        this.lines = [];
    }
}

module.exports = { nowUs, parseArgs, emit, cpuUs, connectWatched, Ledger, BODY_TS, BODY_SEQ, BODY_MIN };
