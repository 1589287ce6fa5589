'use strict';
// Type-tagged JSON <-> rhea values, the same form as tests/integration/typed.py:
// a value is {t: TYPE, v: VALUE}; a message is {header, properties, application_properties,
// message_annotations, body: {section: 'value'|'data'|'sequence'|'none', v}}.
const rhea = require('rhea');
const types = rhea.types;

// rhea type names (lib/types.js) -> tag
const TAGS = {
    Null: 'null', Boolean: 'bool', True: 'bool', False: 'bool',
    Ubyte: 'ubyte', Ushort: 'ushort', Uint: 'uint', SmallUint: 'uint', Uint0: 'uint',
    Ulong: 'ulong', SmallUlong: 'ulong', Ulong0: 'ulong',
    Byte: 'byte', Short: 'short', Int: 'int', SmallInt: 'int', Long: 'long', SmallLong: 'long',
    Float: 'float', Double: 'double', Timestamp: 'timestamp', Uuid: 'uuid', CharUTF32: 'char',
    Vbin8: 'binary', Vbin32: 'binary', Str8: 'string', Str32: 'string', Sym8: 'symbol', Sym32: 'symbol',
    List0: 'list', List8: 'list', List32: 'list', Map8: 'map', Map32: 'map', Array8: 'array', Array32: 'array',
};
const ARRAY_CODES = {
    bool: 0x56, ubyte: 0x50, ushort: 0x60, uint: 0x70, ulong: 0x80, byte: 0x51, short: 0x61, int: 0x71,
    long: 0x81, float: 0x72, double: 0x82, timestamp: 0x83, uuid: 0x98, binary: 0xb0, string: 0xb1,
    symbol: 0xb3,
};

function num(v) {
    if (Buffer.isBuffer(v)) {  // rhea reads 64-bit values it cannot hold exactly as buffers
        return Number(v.readBigInt64BE ? v.readBigUInt64BE(0) : v);
    }
    return typeof v === 'object' && v !== null && v.valueOf ? Number(v.valueOf()) : v;
}

// A Typed value read by types.Reader -> tagged JSON
function tag(typed) {
    if (typed === undefined || typed === null) return {t: 'null'};
    if (typed.descriptor !== undefined) {
        const inner = Object.assign(Object.create(Object.getPrototypeOf(typed)), typed);
        delete inner.descriptor;
        return {t: 'described', d: tag(typed.descriptor), v: tag(inner)};
    }
    const name = TAGS[typed.type.name];
    if (!name) throw new Error('no tag for rhea type ' + typed.type.name);
    const v = typed.value;
    switch (name) {
    case 'null': return {t: 'null'};
    case 'bool': return {t: 'bool', v: typed.type.name === 'True' ? true : typed.type.name === 'False' ? false : !!v};
    case 'ulong': case 'long': case 'timestamp':
        if (typed.type.name === 'Ulong0') return {t: name, v: 0};
        return {t: name, v: (name === 'ulong' && Buffer.isBuffer(v)) ? Number(v.readBigUInt64BE(0)) :
                              Buffer.isBuffer(v) ? Number(v.readBigInt64BE(0)) : num(v)};
    case 'uint': return {t: 'uint', v: typed.type.name === 'Uint0' ? 0 : num(v)};
    case 'binary': return {t: 'binary', v: Buffer.from(v).toString('hex')};
    case 'uuid': return {t: 'uuid', v: Buffer.from(v).toString('hex')};
    case 'string': case 'symbol': return {t: name, v: String(v)};
    case 'char': return {t: 'char', v: String.fromCodePoint(v)};
    case 'list': return {t: 'list', v: (v || []).map(tag)};
    case 'map': {
        const pairs = [];
        for (let i = 0; i < v.length; i += 2) pairs.push([tag(v[i]), tag(v[i + 1])]);
        return {t: 'map', v: pairs};
    }
    case 'array': return {t: 'array', v: (v || []).map(tag)};
    default: return {t: name, v: num(v)};
    }
}

// tagged JSON -> a rhea Typed value for sending
function untag(tv) {
    const v = tv.v;
    switch (tv.t) {
    case 'null': return types.Null();
    case 'bool': return types.wrap_boolean(v);
    case 'ubyte': return types.wrap_ubyte(v);
    case 'ushort': return types.wrap_ushort(v);
    case 'uint': return types.wrap_uint(v);
    case 'ulong': return types.wrap_ulong(v);
    case 'byte': return types.wrap_byte(v);
    case 'short': return types.wrap_short(v);
    case 'int': return types.wrap_int(v);
    case 'long': return types.wrap_long(v);
    case 'float': return types.wrap_float(v);
    case 'double': return types.wrap_double(v);
    case 'timestamp': return types.wrap_timestamp(v);
    case 'uuid': return types.wrap_uuid(Buffer.from(v, 'hex'));
    case 'binary': return types.wrap_binary(Buffer.from(v, 'hex'));
    case 'string': return types.wrap_string(v);
    case 'symbol': return types.wrap_symbol(v);
    case 'list': return types.wrap_list(v.map(untag));
    case 'map': {
        const items = [];
        for (const [k, x] of v) { items.push(untag(k)); items.push(untag(x)); }
        return types.Map32(items);
    }
    case 'array': {
        const kind = v[0].t;
        return types.wrap_array(v.map((e) => untag(e).value), ARRAY_CODES[kind]);
    }
    case 'described': return types.described(untag(tv.d), untag(v));
    default: throw new Error('unknown tag ' + tv.t);
    }
}

// spec (tagged JSON message) -> rhea message object for sender.send()
function toRhea(spec) {
    const m = {};
    const h = spec.header || {};
    for (const k of ['durable', 'priority', 'ttl', 'first_acquirer', 'delivery_count']) {
        if (k in h) m[k] = h[k];
    }
    const p = spec.properties || {};
    for (const k of ['to', 'subject', 'reply_to', 'content_type', 'content_encoding', 'group_id',
                     'group_sequence', 'reply_to_group_id', 'absolute_expiry_time', 'creation_time']) {
        if (k in p) m[k] = p[k];
    }
    if ('absolute_expiry_time' in p) m.absolute_expiry_time = new Date(p.absolute_expiry_time);
    if ('creation_time' in p) m.creation_time = new Date(p.creation_time);
    if ('message_id' in p) m.message_id = untag(p.message_id);
    if ('correlation_id' in p) m.correlation_id = untag(p.correlation_id);
    if ('user_id' in p) m.user_id = Buffer.from(p.user_id, 'hex');
    if (spec.application_properties) {
        m.application_properties = {};
        for (const [k, x] of Object.entries(spec.application_properties)) m.application_properties[k] = untag(x);
    }
    if (spec.message_annotations) {
        m.message_annotations = {};
        for (const [k, x] of Object.entries(spec.message_annotations)) m.message_annotations[k] = untag(x);
    }
    const body = spec.body || {section: 'none'};
    if (body.section === 'data') m.body = rhea.message.data_section(Buffer.from(body.v, 'hex'));
    else if (body.section === 'sequence') m.body = rhea.message.sequence_section(body.v.map(untag));
    else if (body.section === 'value') m.body = untag(body.v);
    // 'none': rhea always writes a body (amqp-value null); the caller must not ask for it
    return m;
}

const HEADER_FIELDS = ['durable', 'priority', 'ttl', 'first_acquirer', 'delivery_count'];
const PROPERTY_FIELDS = ['message_id', 'user_id', 'to', 'subject', 'reply_to', 'correlation_id',
    'content_type', 'content_encoding', 'absolute_expiry_time', 'creation_time', 'group_id',
    'group_sequence', 'reply_to_group_id'];

// raw encoded message (Buffer) -> canonical tagged JSON, read section by section with rhea's Reader
function canonical(raw) {
    const out = {header: {}, properties: {}, application_properties: {}, message_annotations: {},
                 body: {section: 'none'}, sections: []};
    const reader = new types.Reader(raw);
    while (reader.remaining()) {
        const s = reader.read();
        const code = Number(s.descriptor.value);
        out.sections.push(code);
        const plain = (typed) => (typed === undefined || typed.type.name === 'Null') ? undefined : tag(typed);
        if (code === 0x70 || code === 0x73) {
            const fields = code === 0x70 ? HEADER_FIELDS : PROPERTY_FIELDS;
            const target = code === 0x70 ? out.header : out.properties;
            (s.value || []).forEach((typed, i) => {
                const t = plain(typed);
                if (t === undefined) return;
                const name = fields[i];
                if (name === 'message_id' || name === 'correlation_id') target[name] = t;
                else if (name === 'user_id') target[name] = t.v;
                else target[name] = t.v;
            });
        } else if (code === 0x74 || code === 0x72) {
            const target = code === 0x74 ? out.application_properties : out.message_annotations;
            const items = s.value || [];
            for (let i = 0; i < items.length; i += 2) target[String(items[i].value)] = tag(items[i + 1]);
        } else if (code === 0x75) {
            out.body = {section: 'data', v: Buffer.from(s.value).toString('hex')};
        } else if (code === 0x76) {
            out.body = {section: 'sequence', v: (s.value || []).map(tag)};
        } else if (code === 0x77) {
            const inner = Object.assign(Object.create(Object.getPrototypeOf(s)), s);
            delete inner.descriptor;
            out.body = {section: 'value', v: tag(inner)};
        }
    }
    // fill the header defaults the way the Python side reports them
    out.header = Object.assign({durable: false, priority: 4, ttl: 0, first_acquirer: false, delivery_count: 0},
                               out.header);
    return out;
}

module.exports = {tag, untag, toRhea, canonical};
