'use strict';
// Send messages with rhea, described as tagged JSON (see typed.js), and report what happened.
// stdin: {"host", "port", "address", "messages": [spec, ...], "timeout_ms"}
// stdout: {"sent": [{"state": "accepted"|..., "raw": base64 of the encoding rhea sent}], "error"?}
// Connects without a username: no SASL layer. Exit code 0 when every message was accepted.
const rhea = require('rhea');
const {toRhea} = require('./typed.js');

const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const container = rhea.create_container({id: 'rhea-send'});
const results = input.messages.map(() => ({state: null}));
let done = 0;

function finish(error, code) {
    const out = {sent: results};
    if (error) out.error = String(error);
    process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(code));
}

const timer = setTimeout(() => finish('timed out', 3), input.timeout_ms || 10000);

container.on('sendable', (context) => {
    if (context.sender.sent) return;
    context.sender.sent = true;
    input.messages.forEach((spec, i) => {
        const msg = toRhea(spec);
        results[i].raw = rhea.message.encode(msg).toString('base64');
        const delivery = context.sender.send(msg);
        delivery.index = i;
    });
});

function settled(context, state) {
    const r = results[context.delivery.index];
    r.state = state;
    if (context.delivery.remote_state && context.delivery.remote_state.error) {
        r.error = context.delivery.remote_state.error;
    }
    done += 1;
    if (done === results.length) {
        clearTimeout(timer);
        context.connection.close();
    }
}
container.on('accepted', (context) => settled(context, 'accepted'));
container.on('rejected', (context) => settled(context, 'rejected'));
container.on('released', (context) => settled(context, 'released'));
container.on('modified', (context) => settled(context, 'modified'));
container.on('connection_close', () => {
    const ok = results.every((r) => r.state === 'accepted');
    finish(null, ok ? 0 : 1);
});
container.on('disconnected', (context) => {
    if (done < results.length) finish('disconnected: ' + (context.error || 'no reason'), 2);
});
container.on('error', (context) => finish('error: ' + (context.error || ''), 2));

const conn = container.connect({host: input.host, port: input.port, reconnect: false});
conn.open_sender(input.address);
