'use strict';
// Receive N messages with rhea and print each as canonical tagged JSON (see typed.js).
// stdin: {"host", "port", "address", "count", "timeout_ms"}
// stdout: {"received": [{"canonical": {...}, "raw": base64}], "error"?}
// Connects without a username: no SASL layer. Exit code 0 when `count` messages arrived.
const rhea = require('rhea');
const {canonical} = require('./typed.js');

const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));

// keep the raw bytes of every message: wrap the decoder rhea's session calls
const decode = rhea.message.decode;
rhea.message.decode = function (buffer) {
    const m = decode(buffer);
    Object.defineProperty(m, '__raw', {value: Buffer.from(buffer), enumerable: false});
    return m;
};

const container = rhea.create_container({id: 'rhea-receive'});
const received = [];

function finish(error, code) {
    const out = {received};
    if (error) out.error = String(error);
    process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(code));
}
const timer = setTimeout(() => finish('timed out after ' + received.length + ' messages', 3),
                         input.timeout_ms || 10000);

container.on('message', (context) => {
    const raw = context.message.__raw;
    received.push({canonical: canonical(raw), raw: raw.toString('base64')});
    if (received.length === input.count) {
        clearTimeout(timer);
        context.connection.close();
    }
});
container.on('connection_close', () => finish(null, received.length >= input.count ? 0 : 1));
container.on('receiver_close', (context) => {
    const e = context.receiver.error;
    finish('receiver closed' + (e ? ': ' + JSON.stringify(e) : ''), 2);
});
container.on('disconnected', (context) => {
    if (received.length < input.count) finish('disconnected: ' + (context.error || 'no reason'), 2);
});
container.on('error', (context) => finish('error: ' + (context.error || ''), 2));

const conn = container.connect({host: input.host, port: input.port, reconnect: false});
conn.open_receiver({source: input.address, credit_window: input.count, autoaccept: true});
