'use strict';
// Receive N messages with rhea and print each as canonical tagged JSON (see typed.js).
// stdin: {"host", "port", "address", "count", "timeout_ms",
//         optional: "distribution_mode" ("copy": browse), "selector" (rhea.filter.selector),
//         "snd_settle_mode" (0 unsettled, 1 settled, 2 mixed: rhea's default),
//         "one_at_a_time" (grant 1 credit at a time instead of a window of `count`),
//         "quiet_ms" (after `count` messages, wait this long and count any more in "extra"),
//         "container_id", "link_name", "durable" (a durable subscription: source durable 2, expiry-policy never)}
// stdout: {"received": [{"canonical": {...}, "raw": base64, "settled": bool}], "filter": {...}|null,
//          "extra": n, "error"?}
// Connects without a username: no SASL layer. Exit code 0 when `count` messages arrived. Written as
// rhea's examples are: the receiver auto-accepts.
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

const container = rhea.create_container({id: input.container_id || 'rhea-receive'});
const received = [];
let filter = null;
let extra = 0;
let done = false;

function finish(error, code) {
    if (done) return;
    done = true;
    const out = {received, filter, extra};
    if (error) out.error = String(error);
    process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(code));
}
const timer = setTimeout(() => finish('timed out after ' + received.length + ' messages', 3),
                         input.timeout_ms || 10000);

// the filters the broker echoed in its attach: key -> the selector text (or the value) of each
function echoed(source) {
    if (!source || !source.filter) return null;
    const out = {};
    for (const key of Object.keys(source.filter)) {
        const v = source.filter[key];
        out[key] = v && v.value !== undefined ? String(v.value) : String(v);
    }
    return out;
}

container.on('receiver_open', (context) => {
    filter = echoed(context.receiver.remote.attach.source);
    if (input.one_at_a_time) context.receiver.add_credit(1);
});
container.on('message', (context) => {
    if (received.length >= input.count) {
        extra++;
        return;
    }
    const raw = context.message.__raw;
    received.push({canonical: canonical(raw), raw: raw.toString('base64'),
                   settled: Boolean(context.delivery.remote_settled)});
    if (received.length === input.count) {
        clearTimeout(timer);
        if (input.quiet_ms) setTimeout(() => context.connection.close(), input.quiet_ms);
        else context.connection.close();
    } else if (input.one_at_a_time) {
        context.receiver.add_credit(1);
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

const source = {address: input.address};
if (input.distribution_mode) source.distribution_mode = input.distribution_mode;
if (input.selector !== undefined) source.filter = rhea.filter.selector(input.selector);
if (input.durable) Object.assign(source, {durable: 2, expiry_policy: 'never'});
const options = {source, credit_window: input.one_at_a_time ? 0 : input.count, autoaccept: true};
if (input.link_name) options.name = input.link_name;
if (input.snd_settle_mode !== undefined) options.snd_settle_mode = input.snd_settle_mode;
const conn = container.connect({host: input.host, port: input.port, reconnect: false});
conn.open_receiver(options);
