'use strict';
// Flood one address with rhea as fast as the broker's credit allows (at-least-once: unsettled
// transfers, counted when the broker settles them), and report progress.
// argv[2]: JSON {"host", "port", "address", "size" (body bytes, >= 8), "report_ms" (default 50)}
// Message i has a data section of `size` bytes that starts with i as a float64 LE.
// stdout: a JSON line every report_ms: {"opened", "sent", "accepted", "rejected", "released", "modified",
//   "credit", "errors": [first few distinct rejection errors]}; the last line also has "done": true.
// stdin: a line or EOF stops the flood: it stops sending, waits (at most 5 s) until every transfer
// sent is settled, closes the connection and prints its last line. Exit code 0 unless the
// connection failed. Connects without a username: no SASL layer.
const rhea = require('rhea');

const opts = Object.assign({report_ms: 50}, JSON.parse(process.argv[2]));
const st = {opened: false, sent: 0, accepted: 0, rejected: 0, released: 0, modified: 0, credit: 0, errors: []};
const body = Buffer.alloc(opts.size, 'f'.charCodeAt(0));
const template = rhea.message.encode({body: rhea.message.data_section(body)});
const bodyAt = template.length - opts.size;
let sender = null;
let stopping = false;
let finished = false;

function report(extra) {
    if (sender) st.credit = sender.credit;
    process.stdout.write(JSON.stringify(Object.assign({}, st, extra)) + '\n');
}

function finish(error) {
    if (finished) return;
    finished = true;
    clearInterval(reporter);
    if (error) st.errors.push(error);
    report({done: true});
    process.exit(error ? 1 : 0);
}

function pump() {
    // Hand rhea no more than its credit covers (it would queue the rest): at zero credit, every
    // message counted as sent has reached the broker.
    while (!stopping && sender && sender.sendable() && st.sent - sender.delivery_count < sender.credit) {
        const b = Buffer.from(template);
        b.writeDoubleLE(st.sent, bodyAt);
        sender.send(b, undefined, 0);
        st.sent++;
    }
}

function settledAll() {
    return st.accepted + st.rejected + st.released + st.modified >= st.sent;
}

function stop() {
    if (stopping) return;
    stopping = true;
    const deadline = Date.now() + 5000;
    const check = () => {
        if (settledAll() || Date.now() > deadline) {
            connection.close();
            setTimeout(() => finish(null), 200);  // the broker's close, if it comes in time
        } else {
            setTimeout(check, 10);
        }
    };
    check();
}

const container = rhea.create_container({id: 'rhea-flood-' + process.pid});
container.on('sendable', pump);
container.on('sender_open', (ctx) => { sender = ctx.sender; st.opened = true; pump(); });
container.on('accepted', () => { st.accepted++; pump(); });
container.on('released', () => { st.released++; });
container.on('modified', () => { st.modified++; });
container.on('rejected', (ctx) => {
    st.rejected++;
    const error = JSON.stringify((ctx.delivery.remote_state && ctx.delivery.remote_state.error) || null);
    if (st.errors.length < 5 && !st.errors.includes(error)) st.errors.push(error);
});
container.on('connection_close', () => finish(stopping ? null : 'the broker closed the connection'));
container.on('disconnected', (ctx) => {
    if (!stopping) finish('disconnected: ' + (ctx.error ? (ctx.error.message || String(ctx.error)) : 'socket closed'));
});
container.on('error', (ctx) => finish('error: ' + JSON.stringify(ctx.error || null)));

const reporter = setInterval(() => report({}), opts.report_ms);
process.stdin.on('data', stop);
process.stdin.on('end', stop);
const connection = container.connect({host: opts.host, port: opts.port, reconnect: false});
connection.open_sender({target: {address: opts.address}});
