/* The hot path's calls into proton, made from C (proton_adapter.py uses them; design/performance.md).
 *
 * python-qpid-proton's cffi wrappers release and retake the GIL around every C call, and a message
 * costs the broker about twenty of them: a tenth of its CPU went to the GIL's mutexes. This module
 * calls the same engine, the functions of the already loaded cproton_ffi library found with dlsym,
 * without releasing the GIL (each call is a few hundred nanoseconds of C; read and write release it
 * around their system calls only, as socket.recv and send do). Links, deliveries, transports and
 * collectors are passed as their addresses (Python ints); proton_adapter.py keeps cffi for everything else.
 *
 *   bind(path, PN_DELIVERY, PN_LINK_FLOW, kept)  find the functions in the library at path; `kept`: the
 *                                                other event types proton_adapter.py handles itself
 *   reader(limit) -> reader                      a connection's reader of its input (below: large bodies)
 *   read(transport, fd, budget, reader) -> int   socket -> the reader -> proton's input buffer
 *   feed(transport, reader, data) -> bool        bytes read elsewhere (TLS, the preamble) -> the reader -> proton
 *   reader_close(reader)                         the connection is gone: the bodies its reader holds are freed
 *   write(transport, fd, left, at) -> (int, bytes, int)  proton's output -> socket, many frames a call
 *   drain(collector, limit) -> list              the collector's events up to one proton_adapter.py keeps
 *   send(link, tag, data, settled) -> int        a new delivery with these bytes, or the pieces of a
 *                                                list of bytes one after the other (0 if settled)
 *   settle(delivery, outcome)                    give the outcome (unless 0), settle
 *   credit(link) -> int
 *   pending(transport) -> int                    the bytes of output proton has (< 0: none will come)
 *   drained(link) -> bool                        answer a drain request, if the peer made one
 *   tag(delivery) -> bytes
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_proton_lib.h"
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>

static void *(*collector_peek)(void *);
static bool (*collector_pop)(void *);
static int (*event_type)(void *);
static void *(*event_delivery)(void *);
static void *(*delivery_link)(void *);
static bool (*link_is_sender)(void *);
static bool (*delivery_aborted)(void *);
static bool (*delivery_readable)(void *);
static size_t (*delivery_pending)(void *);
static bool (*delivery_partial)(void *);
static ssize_t (*link_recv)(void *, char *, size_t);
static bool (*link_advance)(void *);
static bool (*delivery_settled)(void *);
static bool (*delivery_updated)(void *);
static uint64_t (*delivery_remote_state)(void *);
static void *(*delivery_remote)(void *);
static bool (*disposition_is_failed)(void *);
static bool (*disposition_is_undeliverable)(void *);
static void *(*new_delivery)(void *, pn_bytes);
static ssize_t (*link_send)(void *, const char *, size_t);
static void (*delivery_settle)(void *);
static void (*delivery_abort)(void *);
static void (*delivery_update)(void *, uint64_t);
static int (*link_credit)(void *);
static pn_bytes (*delivery_tag)(void *);
static bool (*link_get_drain)(void *);
static int (*link_drained)(void *);
static void *(*event_link)(void *);
static bool (*transport_closed)(void *);
static ssize_t (*transport_capacity)(void *);
static char *(*transport_tail)(void *);
static int (*transport_process)(void *, size_t);
static ssize_t (*transport_pending)(void *);
static const char *(*transport_head)(void *);
static void (*transport_pop)(void *, size_t);
static uint32_t (*transport_max_frame)(void *);

static int PN_DELIVERY = -1, PN_LINK_FLOW = -1;
enum { EVENT_TYPES = 128 };
static bool kept[EVENT_TYPES]; /* the event types proton_adapter.py handles with proton's objects (opens, closes) */
enum { ACCEPTED = 0x24, MODIFIED = 0x27, TRANSACTIONAL = 0x34 };
/* What drain() reports: a whole message in hand, an outcome, a delivery for proton_adapter.py to handle
 * itself (aborted, over the size limit, transactional), a link's flow, or an event proton_adapter.py
 * keeps, left at the collector's head. */
enum { RAW = 0, TRANSFER = 1, OUTCOME = 2, FLOW = 3, EVENT = 4, LOST = 5 };
/* What write() reports. */
enum { WRITTEN = 0, FULL = 1, FAILED = -1, CLOSED = 2 };
enum { MAX_BATCH = 4096 };

static PyObject *bind_library(PyObject *self, PyObject *args)
{
    const char *path;
    PyObject *kept_types;
    if (!PyArg_ParseTuple(args, "siiO", &path, &PN_DELIVERY, &PN_LINK_FLOW, &kept_types))
        return NULL;
    PyObject *types = PySequence_Fast(kept_types, "bind: kept must be a sequence of event types");
    if (types == NULL)
        return NULL;
    for (int t = 0; t < EVENT_TYPES; t++)
        kept[t] = false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(types); i++) {
        long t = PyLong_AsLong(PySequence_Fast_GET_ITEM(types, i));
        if (t >= 0 && t < EVENT_TYPES)
            kept[t] = true;
    }
    Py_DECREF(types);
    if (PyErr_Occurred())
        return NULL;
    void *lib = proton_library(path);
    if (lib == NULL)
        return NULL;
    FIND(collector_peek, "pn_collector_peek");
    FIND(collector_pop, "pn_collector_pop");
    FIND(event_type, "pn_event_type");
    FIND(event_delivery, "pn_event_delivery");
    FIND(delivery_link, "pn_delivery_link");
    FIND(link_is_sender, "pn_link_is_sender");
    FIND(delivery_aborted, "pn_delivery_aborted");
    FIND(delivery_readable, "pn_delivery_readable");
    FIND(delivery_pending, "pn_delivery_pending");
    FIND(delivery_partial, "pn_delivery_partial");
    FIND(link_recv, "pn_link_recv");
    FIND(link_advance, "pn_link_advance");
    FIND(delivery_settled, "pn_delivery_settled");
    FIND(delivery_updated, "pn_delivery_updated");
    FIND(delivery_remote_state, "pn_delivery_remote_state");
    FIND(delivery_remote, "pn_delivery_remote");
    FIND(disposition_is_failed, "pn_disposition_is_failed");
    FIND(disposition_is_undeliverable, "pn_disposition_is_undeliverable");
    FIND(new_delivery, "pn_delivery");
    FIND(link_send, "pn_link_send");
    FIND(delivery_settle, "pn_delivery_settle");
    FIND(delivery_abort, "pn_delivery_abort");
    FIND(delivery_update, "pn_delivery_update");
    FIND(link_credit, "pn_link_credit");
    FIND(delivery_tag, "pn_delivery_tag");
    FIND(link_get_drain, "pn_link_get_drain");
    FIND(link_drained, "pn_link_drained");
    FIND(event_link, "pn_event_link");
    FIND(transport_closed, "pn_transport_closed");
    FIND(transport_capacity, "pn_transport_capacity");
    FIND(transport_tail, "pn_transport_tail");
    FIND(transport_process, "pn_transport_process");
    FIND(transport_pending, "pn_transport_pending");
    FIND(transport_head, "pn_transport_head");
    FIND(transport_pop, "pn_transport_pop");
    FIND(transport_max_frame, "pn_transport_get_max_frame");
    Py_RETURN_NONE;
}

static void *address(PyObject *value)
{
    return PyLong_AsVoidPtr(value);
}

#define ADDRESS(p) PyLong_FromVoidPtr(p)

/* ---- The reader: a large message's body kept out of proton (design/performance.md, "Issue 48") ----
 *
 * Proton copied a body received in many frames twice before the broker had it: its input buffer into the
 * delivery (pn_do_transfer), the delivery into the broker's bytes (pn_link_recv). Every byte proton is
 * given now passes through a connection's reader first, which follows the frames: the transfer frames of
 * a delivery whose first frame is a large one (ASSEMBLE_FROM bytes of payload or more, more=true) reach
 * proton with their payload cut off, and the payload goes into one bytes object of the reader's. The last
 * frame (more=false) carries a token of TOKEN_SIZE bytes instead: the process's secret and the number
 * the body is kept under in `completed`, where drain's item() finds it when proton reports the delivery.
 * Proton still sees every frame (credit, session windows, settlement and ordering are its own), and
 * every other frame reaches it unchanged. A delivery's state is dropped when it ends (its last frame, an
 * abort), and with its handle's detach, its session's end and the connection's close; one the reader
 * cannot follow (a performative not encoded as the spec's small descriptor, in a connection with a body
 * being assembled) fails the connection rather than giving proton half a body. */
enum { ASSEMBLE_FROM = 16 * 1024, HEAD_MAX = 2048, TOKEN_SIZE = 16, FRAME_HEADER = 8 };
#define GUESS_MAX ((size_t)1 << 30)
/* What the reader is doing with the bytes coming: the protocol header (passed on), a frame's start (its
 * header and performative, collected in `head`), the rest of a frame passed on, a payload taken into a
 * body, a payload dropped, all passed on untouched (the input is not AMQP frames). */
enum { M_HEADER, M_HEAD, M_PASS, M_BODY, M_DROP, M_OFF };
/* A delivery in progress on a (channel, handle): passed on to proton whole, assembled, or over the limit
 * (its bytes dropped, the token says so). */
enum { S_PASS, S_ASSEMBLE, S_OVER };
enum { TRANSFER_CODE = 0x14, DETACH_CODE = 0x16, END_CODE = 0x17, CLOSE_CODE = 0x18 };

typedef struct {
    uint16_t channel;
    uint32_t handle;
    int state;
    bool id_present;
    uint32_t id;
    PyObject *body; /* S_ASSEMBLE: a bytes object of `cap` bytes, the first `size` filled */
    size_t size, cap;
} slot_t;

typedef struct {
    int mode;
    size_t header_left;            /* M_HEADER: bytes of the protocol header still to pass */
    unsigned char head[HEAD_MAX];  /* M_HEAD: the frame's first bytes */
    size_t head_len, want;         /* ... collected, needed */
    size_t left;                   /* M_PASS, M_BODY, M_DROP: bytes of the frame still to come */
    int cur;                       /* M_BODY: the slot filled; with `last` */
    bool last;                     /* the frame is the delivery's last: sent with its token once whole */
    size_t payload_at;             /* where the frame's payload starts (the last frame waits in head) */
    size_t limit;                  /* a body over it is dropped and refused (0: none) */
    slot_t *slots;
    int nslots, capslots;
    PyObject *issued;              /* numbers this reader put in `completed` (dropped with it) */
    char *tail;                    /* proton's input buffer, `queued` bytes written, `room` free */
    size_t queued;
    ssize_t room;
    const char *error;             /* why the connection fails (M_OFF after it) */
    unsigned long assembled;       /* deliveries taken apart so far (tests see the reader work) */
} reader_t;

static PyObject *completed;      /* number -> the body's bytes, or its size (int) when it was over the limit */
static uint64_t secret, issued_count;

/* What the reader holds goes: the bodies being assembled and those drain has not taken. */
static void reader_clear(reader_t *r)
{
    for (int i = 0; i < r->nslots; i++)
        Py_CLEAR(r->slots[i].body);
    r->nslots = 0;
    r->cur = -1;
    if (r->issued != NULL) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(r->issued); i++)
            if (PyDict_DelItem(completed, PyList_GET_ITEM(r->issued, i)) < 0)
                PyErr_Clear();
        if (PyList_SetSlice(r->issued, 0, PyList_GET_SIZE(r->issued), NULL) < 0)
            PyErr_Clear();
    }
}

static void reader_free(PyObject *capsule)
{
    reader_t *r = PyCapsule_GetPointer(capsule, "haqueue.reader");
    if (r == NULL)
        return;
    reader_clear(r);
    PyMem_Free(r->slots);
    Py_XDECREF(r->issued);
    PyMem_Free(r);
}

/* reader(limit) -> a connection's reader */
static PyObject *reader_new(PyObject *self, PyObject *arg)
{
    size_t limit = PyLong_AsSize_t(arg);
    if (PyErr_Occurred())
        return NULL;
    reader_t *r = PyMem_Calloc(1, sizeof *r);
    if (r == NULL)
        return PyErr_NoMemory();
    r->mode = M_HEADER;
    r->header_left = 8;
    r->limit = limit;
    r->cur = -1;
    r->issued = PyList_New(0);
    PyObject *capsule = r->issued ? PyCapsule_New(r, "haqueue.reader", reader_free) : NULL;
    if (capsule == NULL) {
        Py_XDECREF(r->issued);
        PyMem_Free(r);
    }
    return capsule;
}

/* Bytes for proton, written into its input buffer; processed by proton at `flush` (or when it is full). */
static void give(reader_t *r, void *transport, const void *data, size_t n)
{
    const char *from = data;
    while (n > 0) {
        if (r->room <= 0) {
            if (r->queued)
                transport_process(transport, r->queued);
            r->queued = 0;
            ssize_t capacity = transport_capacity(transport);
            if (capacity <= 0)
                return; /* proton reads no more (closed, or an error it has reported): dropped */
            r->tail = transport_tail(transport);
            r->room = capacity;
        }
        size_t take = n < (size_t)r->room ? n : (size_t)r->room;
        memcpy(r->tail + r->queued, from, take);
        r->queued += take;
        r->room -= (ssize_t)take;
        from += take;
        n -= take;
    }
}

static void flush(reader_t *r, void *transport)
{
    if (r->queued)
        transport_process(transport, r->queued);
    r->queued = 0;
    r->room = 0;
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* The end of the AMQP value at p (not past end), or NULL if it does not end there or is not understood. */
static const unsigned char *skip(const unsigned char *p, const unsigned char *end, int depth)
{
    if (p >= end || depth > 8)
        return NULL;
    unsigned char c = *p++;
    size_t n;
    if (c == 0x00) { /* described: descriptor, then value */
        p = skip(p, end, depth + 1);
        return p ? skip(p, end, depth + 1) : NULL;
    }
    switch (c >> 4) {
    case 0x4: n = 0; break;
    case 0x5: n = 1; break;
    case 0x6: n = 2; break;
    case 0x7: n = 4; break;
    case 0x8: n = 8; break;
    case 0x9: n = 16; break;
    case 0xa: case 0xc: case 0xe:
        if (p >= end) return NULL;
        n = 1 + (size_t)*p;
        break;
    case 0xb: case 0xd: case 0xf:
        if (end - p < 4) return NULL;
        n = 4 + (size_t)be32(p);
        break;
    default: return NULL;
    }
    return (size_t)(end - p) >= n ? p + n : NULL;
}

/* An unsigned int (uint, smalluint, uint0) or null at p: its value in *v and the end, or NULL. */
static const unsigned char *read_uint(const unsigned char *p, const unsigned char *end, bool *present, uint32_t *v)
{
    if (p >= end) return NULL;
    *present = true;
    switch (*p) {
    case 0x40: *present = false; *v = 0; return p + 1;
    case 0x43: *v = 0; return p + 1;
    case 0x52: if (end - p < 2) return NULL; *v = p[1]; return p + 2;
    case 0x70: if (end - p < 5) return NULL; *v = be32(p + 1); return p + 5;
    default: return NULL;
    }
}

static const unsigned char *read_bool(const unsigned char *p, const unsigned char *end, bool *v)
{
    if (p >= end) return NULL;
    switch (*p) {
    case 0x40: case 0x42: *v = false; return p + 1;
    case 0x41: *v = true; return p + 1;
    case 0x56: if (end - p < 2) return NULL; *v = p[1] != 0; return p + 2;
    default: return NULL;
    }
}

typedef struct {
    int code;             /* the performative's descriptor, -1 if not the spec's small one */
    bool ok;              /* the fields below were read */
    uint32_t handle, id;
    bool id_present, more, aborted;
    size_t payload_at;    /* from the frame's start */
} performative_t;

/* The performative of the frame in head[0..len) (its header says doff): what the reader needs of it. A
 * transfer's list may end before its last fields (absent: false). */
static performative_t parse(const unsigned char *frame, size_t len, size_t doff)
{
    performative_t f = {-1, false, 0, 0, false, false, false, 0};
    const unsigned char *p = frame + doff, *end = frame + len;
    if (end - p < 3 || p[0] != 0x00 || p[1] != 0x53)
        return f;
    f.code = p[2];
    p += 3;
    if (f.code != TRANSFER_CODE && f.code != DETACH_CODE)
        return f;
    if (p >= end) return f;
    size_t count;
    const unsigned char *list_end;
    if (*p == 0x45) {
        count = 0; list_end = p + 1; p += 1;
    } else if (*p == 0xc0) {
        if (end - p < 3) return f;
        list_end = p + 2 + p[1]; count = p[2]; p += 3;
    } else if (*p == 0xd0) {
        if (end - p < 9) return f;
        list_end = p + 5 + be32(p + 1); count = be32(p + 5); p += 9;
    } else {
        return f;
    }
    if (list_end > end || list_end < p)
        return f;
    bool present = false, flag;
    for (size_t i = 0; i < count && i < 10; i++) {
        const unsigned char *next;
        if (i == 0) {
            next = read_uint(p, list_end, &present, &f.handle);
            if (next && !present) return f; /* a handle is mandatory */
        } else if (f.code == DETACH_CODE) {
            break;
        } else if (i == 1) {
            next = read_uint(p, list_end, &f.id_present, &f.id);
        } else if (i == 5) {
            next = read_bool(p, list_end, &f.more);
        } else if (i == 9) {
            next = read_bool(p, list_end, &flag);
            f.aborted = flag;
        } else {
            next = skip(p, list_end, 0);
        }
        if (next == NULL)
            return f;
        p = next;
    }
    if (count == 0)
        return f;
    f.ok = true;
    f.payload_at = (size_t)(list_end - frame);
    return f;
}

/* A message's size guessed from its first bytes: where its data (or amqp-value binary) section ends; 0 if
 * not found there. The body is first sized to it, so that it is seldom grown. */
static size_t guess_size(const unsigned char *start, size_t n)
{
    const unsigned char *p = start, *end = start + n;
    while (end - p >= 3 && p[0] == 0x00 && p[1] == 0x53) {
        unsigned char code = p[2];
        const unsigned char *value = p + 3;
        if ((code == 0x75 || code == 0x77) && value < end && *value == 0xb0 && end - value >= 5)
            return (size_t)(value + 5 - start) + be32(value + 1);
        p = skip(value, end, 0);
        if (p == NULL)
            return 0;
    }
    return 0;
}

static int find_slot(reader_t *r, uint16_t channel, uint32_t handle)
{
    for (int i = 0; i < r->nslots; i++)
        if (r->slots[i].channel == channel && r->slots[i].handle == handle)
            return i;
    return -1;
}

static void drop_slot(reader_t *r, int i)
{
    Py_CLEAR(r->slots[i].body);
    r->slots[i] = r->slots[--r->nslots];
    if (r->cur == r->nslots)
        r->cur = i;
}

static int new_slot(reader_t *r, uint16_t channel, uint32_t handle, int state)
{
    if (r->nslots == r->capslots) {
        int cap = r->capslots ? 2 * r->capslots : 4;
        slot_t *slots = PyMem_Realloc(r->slots, (size_t)cap * sizeof *slots);
        if (slots == NULL)
            return -1;
        r->slots = slots;
        r->capslots = cap;
    }
    slot_t *s = &r->slots[r->nslots];
    memset(s, 0, sizeof *s);
    s->channel = channel;
    s->handle = handle;
    s->state = state;
    return r->nslots++;
}

static bool assembling(reader_t *r, int channel)
{
    for (int i = 0; i < r->nslots; i++)
        if (r->slots[i].state != S_PASS && (channel < 0 || r->slots[i].channel == channel))
            return true;
    return false;
}

/* Payload bytes for the current body (or dropped once it is over the limit). */
static void take_body(reader_t *r, const unsigned char *data, size_t n)
{
    slot_t *s = &r->slots[r->cur];
    if (s->state != S_ASSEMBLE || n == 0)
        return;
    if (r->limit && s->size + n > r->limit) {
        Py_CLEAR(s->body);
        s->state = S_OVER;
        s->size += n;
        return;
    }
    if (s->size + n > s->cap) {
        size_t cap = 2 * s->cap > s->size + n ? 2 * s->cap : s->size + n;
        if (r->limit && cap > r->limit)
            cap = r->limit;
        if (_PyBytes_Resize(&s->body, (Py_ssize_t)cap) < 0) { /* no memory: refused as over a limit */
            PyErr_Clear();
            s->body = NULL;
            s->state = S_OVER;
            s->size += n;
            return;
        }
        s->cap = cap;
    }
    memcpy(PyBytes_AS_STRING(s->body) + s->size, data, n);
    s->size += n;
}

/* The current frame's payload is all in: a last frame goes to proton with its token, the body to `completed`. */
static void end_payload(reader_t *r, void *transport)
{
    r->mode = M_HEAD;
    r->head_len = 0;
    r->want = FRAME_HEADER;
    if (!r->last)
        return;
    slot_t *s = &r->slots[r->cur];
    PyObject *value;
    if (s->state == S_ASSEMBLE && (size_t)PyBytes_GET_SIZE(s->body) != s->size)
        if (_PyBytes_Resize(&s->body, (Py_ssize_t)s->size) < 0) {
            PyErr_Clear();
            s->body = NULL;
            s->state = S_OVER;
        }
    if (s->state == S_ASSEMBLE) {
        value = s->body;
        s->body = NULL;
    } else {
        value = PyLong_FromSize_t(s->size);
    }
    uint64_t number = ++issued_count;
    PyObject *key = PyLong_FromUnsignedLongLong(number);
    if (value == NULL || key == NULL || PyDict_SetItem(completed, key, value) < 0 || PyList_Append(r->issued, key) < 0)
        PyErr_Clear(); /* drain finds no body under the token: the delivery is reported as failed */
    Py_XDECREF(key);
    Py_XDECREF(value);
    drop_slot(r, r->cur);
    r->cur = -1;
    /* forget the numbers drain has taken, now and then */
    if (PyList_GET_SIZE(r->issued) >= 64) {
        PyObject *kept = PyList_New(0);
        for (Py_ssize_t i = 0; kept && i < PyList_GET_SIZE(r->issued); i++) {
            PyObject *k = PyList_GET_ITEM(r->issued, i);
            if (PyDict_Contains(completed, k) == 1 && PyList_Append(kept, k) < 0)
                Py_CLEAR(kept);
        }
        if (kept) {
            Py_SETREF(r->issued, kept);
        } else {
            PyErr_Clear();
        }
    }
    unsigned char token[TOKEN_SIZE];
    memcpy(token, &secret, 8);
    memcpy(token + 8, &number, 8);
    unsigned char *h = r->head;
    uint32_t size = (uint32_t)(r->payload_at + TOKEN_SIZE);
    h[0] = size >> 24; h[1] = size >> 16; h[2] = size >> 8; h[3] = size;
    give(r, transport, h, r->payload_at);
    give(r, transport, token, TOKEN_SIZE);
}

static void fail(reader_t *r, const char *why)
{
    r->error = why;
    r->mode = M_OFF;
}

/* A frame's first bytes are in head (all of it, or HEAD_MAX): decide what becomes of it. */
static void frame_start(reader_t *r, void *transport, size_t frame_size)
{
    unsigned char *h = r->head;
    size_t doff = 4 * (size_t)h[4];
    uint16_t channel = (uint16_t)(h[6] << 8 | h[7]);
    performative_t f = h[5] == 0 && doff >= FRAME_HEADER && doff < r->head_len
        ? parse(h, r->head_len, doff) : (performative_t){-1, false, 0, 0, false, false, false, 0};
    r->left = frame_size - r->head_len;
    r->mode = M_PASS;
    if (f.code == TRANSFER_CODE && f.ok) {
        int i = find_slot(r, channel, f.handle);
        size_t payload = frame_size - f.payload_at;
        if (i >= 0 && r->slots[i].state != S_PASS) {
            slot_t *s = &r->slots[i];
            if (f.id_present && s->id_present && f.id != s->id) { /* not a continuation: proton refuses it */
                drop_slot(r, i);
                give(r, transport, h, r->head_len);
                return;
            }
            r->cur = i;
        } else if (i >= 0) { /* a delivery passed on whole */
            if (!f.more || f.aborted)
                drop_slot(r, i);
            give(r, transport, h, r->head_len);
            return;
        } else if (f.more && !f.aborted && payload >= ASSEMBLE_FROM) {
            r->cur = new_slot(r, channel, f.handle, S_ASSEMBLE);
            if (r->cur < 0) {
                PyErr_Clear();
                give(r, transport, h, r->head_len);
                return;
            }
            slot_t *s = &r->slots[r->cur];
            s->id_present = f.id_present;
            s->id = f.id;
            /* sized to the message's own account of its size, unless that is past belief (the pages a
             * larger guess leaves untouched cost nothing; a wrong one is only a regrowth or a shrink) */
            size_t guess = guess_size(h + f.payload_at, r->head_len - f.payload_at);
            s->cap = guess > payload && guess <= GUESS_MAX ? guess : 4 * payload;
            if (r->limit && s->cap > r->limit)
                s->cap = r->limit; /* what goes past it is dropped (take_body) */
            s->body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)s->cap);
            if (s->body == NULL && s->cap > payload) {
                PyErr_Clear();
                s->cap = payload;
                s->body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)s->cap);
            }
            if (s->body == NULL) { /* refused as too large, all the same */
                PyErr_Clear();
                s->state = S_OVER;
            }
            r->assembled++;
        } else {
            if (f.more && !f.aborted && new_slot(r, channel, f.handle, S_PASS) < 0)
                fail(r, "out of memory following a delivery");
            give(r, transport, h, r->head_len);
            return;
        }
        /* a frame of an assembled delivery: proton gets its performative, the broker its payload */
        r->payload_at = f.payload_at;
        if (f.aborted) { /* its bytes go; proton reports the delivery aborted */
            drop_slot(r, r->cur);
            r->cur = -1;
            r->last = false;
            r->mode = M_DROP;
        } else {
            r->last = !f.more;
            r->mode = M_BODY;
        }
        if (!r->last) {
            uint32_t size = (uint32_t)f.payload_at;
            h[0] = size >> 24; h[1] = size >> 16; h[2] = size >> 8; h[3] = size;
            give(r, transport, h, f.payload_at);
        }
        if (r->mode == M_BODY)
            take_body(r, h + f.payload_at, r->head_len - f.payload_at);
        if (r->left == 0) {
            if (r->mode == M_BODY)
                end_payload(r, transport);
            else
                r->mode = M_HEAD, r->head_len = 0, r->want = FRAME_HEADER;
        }
        return;
    }
    if (f.code == TRANSFER_CODE || (f.code < 0 && h[5] == 0 && doff < frame_size)) {
        /* a transfer the reader cannot read, or a performative it cannot name */
        if (assembling(r, -1)) {
            fail(r, "a frame the broker could not read in the middle of a large message");
            return;
        }
    } else if (f.code == DETACH_CODE) {
        int i = f.ok ? find_slot(r, channel, f.handle) : -1;
        if (i >= 0)
            drop_slot(r, i);
        else if (!f.ok && assembling(r, channel)) {
            fail(r, "a detach the broker could not read in the middle of a large message");
            return;
        }
    } else if (f.code == END_CODE || f.code == CLOSE_CODE) {
        for (int i = r->nslots - 1; i >= 0; i--)
            if (f.code == CLOSE_CODE || r->slots[i].channel == channel)
                drop_slot(r, i);
    }
    give(r, transport, h, r->head_len);
}

/* Follow `n` bytes of the connection's input, handing proton what is its. */
static void follow(reader_t *r, void *transport, const unsigned char *data, size_t n)
{
    while (n > 0) {
        size_t take;
        switch (r->mode) {
        case M_OFF:
            if (r->error == NULL)
                give(r, transport, data, n);
            return;
        case M_HEADER: /* collected in head, then passed on */
            take = n < r->header_left ? n : r->header_left;
            memcpy(r->head + 8 - r->header_left, data, take);
            r->header_left -= take;
            if (r->header_left == 0) {
                give(r, transport, r->head, 8);
                /* not AMQP's header: proton alone reads what follows (and refuses it) */
                r->mode = memcmp(r->head, "AMQP", 4) == 0 ? M_HEAD : M_OFF;
                r->head_len = 0;
                r->want = FRAME_HEADER;
            }
            break;
        case M_HEAD: {
            take = r->want - r->head_len < n ? r->want - r->head_len : n;
            memcpy(r->head + r->head_len, data, take);
            r->head_len += take;
            if (r->head_len < r->want)
                break;
            size_t frame_size = be32(r->head);
            if (frame_size < FRAME_HEADER) { /* not a frame proton reads: it says so */
                give(r, transport, r->head, r->head_len);
                r->mode = M_OFF;
                break;
            }
            uint32_t max_frame = transport_max_frame(transport);
            size_t doff = 4 * (size_t)r->head[4];
            if (r->head_len == FRAME_HEADER && ((max_frame && frame_size > max_frame) || doff < FRAME_HEADER
                                                || doff > frame_size || r->head[5] != 0)) {
                /* no AMQP frame the reader takes apart (proton refuses the first three at once) */
                give(r, transport, r->head, r->head_len);
                r->left = frame_size - FRAME_HEADER;
                r->mode = M_PASS;
                break;
            }
            size_t want = frame_size < HEAD_MAX ? frame_size : HEAD_MAX;
            if (r->head_len < want) {
                r->want = want;
                break;
            }
            frame_start(r, transport, frame_size);
            break;
        }
        case M_PASS:
        case M_DROP:
        case M_BODY:
            take = n < r->left ? n : r->left;
            if (r->mode == M_PASS)
                give(r, transport, data, take);
            else if (r->mode == M_BODY)
                take_body(r, data, take);
            r->left -= take;
            if (r->left == 0) {
                if (r->mode == M_BODY) {
                    end_payload(r, transport);
                } else {
                    r->mode = M_HEAD;
                    r->head_len = 0;
                    r->want = FRAME_HEADER;
                }
            }
            break;
        default:
            return;
        }
        data += take;
        n -= take;
    }
}

static reader_t *reader_of(PyObject *capsule)
{
    return PyCapsule_GetPointer(capsule, "haqueue.reader");
}

/* Read the socket through the connection's reader into proton until it has nothing more or `budget` bytes
 * came. Returns the bytes read, or -1 once the peer closed or the socket failed (after handing proton what
 * came before), or -2 when the reader failed the connection (reader_error says why). A payload being
 * assembled is read straight into its body (recvmsg's first piece), what follows into `inbox`. */
enum { INBOX = 256 * 1024, SMALL_INBOX = 16 * 1024 };
static unsigned char inbox[INBOX];
/* Set under the GIL while a read uses `inbox` (the socket is read with the GIL released): a second thread
 * reading at the same time uses a smaller one of its own. */
static bool inbox_busy;

static PyObject *read_socket(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4)
        return PyErr_Format(PyExc_TypeError, "read(transport, fd, budget, reader)");
    void *transport = address(args[0]);
    int fd = (int)PyLong_AsLong(args[1]);
    Py_ssize_t budget = PyLong_AsSsize_t(args[2]);
    reader_t *r = reader_of(args[3]);
    if (r == NULL || PyErr_Occurred())
        return NULL;
    Py_ssize_t total = 0;
    long result = 0;
    unsigned char small[SMALL_INBOX];
    bool mine = !inbox_busy;
    unsigned char *box = mine ? inbox : small;
    size_t box_size = mine ? INBOX : SMALL_INBOX;
    inbox_busy = true;
    while (total < budget && r->error == NULL) {
        struct iovec pieces[2];
        int count = 0;
        size_t direct = 0;
        if (r->mode == M_BODY && r->slots[r->cur].state == S_ASSEMBLE) {
            slot_t *s = &r->slots[r->cur];
            direct = r->left < s->cap - s->size ? r->left : s->cap - s->size;
            if (direct) {
                pieces[count].iov_base = PyBytes_AS_STRING(s->body) + s->size;
                pieces[count++].iov_len = direct;
            }
        }
        /* after a payload read straight into its body, only the next frame's start into the inbox */
        pieces[count].iov_base = box;
        pieces[count++].iov_len = direct ? HEAD_MAX : box_size;
        struct msghdr message = {.msg_iov = pieces, .msg_iovlen = (size_t)count};
        size_t room = direct + pieces[count - 1].iov_len;
        ssize_t n;
        Py_BEGIN_ALLOW_THREADS
        n = recvmsg(fd, &message, MSG_DONTWAIT);
        Py_END_ALLOW_THREADS
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            result = -1;
            break;
        }
        size_t in_body = (size_t)n < direct ? (size_t)n : direct;
        if (in_body) { /* already in place: counted as taken */
            slot_t *s = &r->slots[r->cur];
            s->size += in_body;
            r->left -= in_body;
            if (r->left == 0)
                end_payload(r, transport);
        }
        follow(r, transport, box, (size_t)n - in_body);
        total += n;
        if ((size_t)n < room)
            break; /* the socket had no more: spare the call that would say so */
    }
    if (mine)
        inbox_busy = false;
    flush(r, transport);
    if (r->error != NULL)
        return PyLong_FromLong(-2);
    return PyLong_FromSsize_t(result < 0 ? -1 : total);
}

/* feed(transport, reader, data): bytes of the connection's input read elsewhere (TLS, the preamble's rest).
 * False when the reader failed the connection. */
static PyObject *feed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "feed(transport, reader, data)");
    void *transport = address(args[0]);
    reader_t *r = reader_of(args[1]);
    Py_buffer data;
    if (r == NULL || PyErr_Occurred() || PyObject_GetBuffer(args[2], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    follow(r, transport, data.buf, (size_t)data.len);
    flush(r, transport);
    PyBuffer_Release(&data);
    return PyBool_FromLong(r->error == NULL);
}

/* reader_state(reader) -> (deliveries assembled so far, deliveries followed now, bodies not taken by drain) */
static PyObject *reader_state(PyObject *self, PyObject *capsule)
{
    reader_t *r = reader_of(capsule);
    if (r == NULL)
        return NULL;
    Py_ssize_t waiting = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(r->issued); i++)
        waiting += PyDict_Contains(completed, PyList_GET_ITEM(r->issued, i)) == 1;
    return Py_BuildValue("(kin)", r->assembled, r->nslots, waiting);
}

/* reader_close(reader): the connection is gone (ProtonConnection.release). Its bodies go now, with proton's
 * buffers, not when the reader object is collected: that may wait for a cyclic collection, which the broker
 * makes rare, and a connection cut in the middle of large messages would keep them until then. */
static PyObject *reader_close(PyObject *self, PyObject *capsule)
{
    reader_t *r = reader_of(capsule);
    if (r == NULL)
        return NULL;
    reader_clear(r);
    fail(r, "the connection is closed");
    Py_RETURN_NONE;
}

static PyObject *reader_error(PyObject *self, PyObject *capsule)
{
    reader_t *r = reader_of(capsule);
    if (r == NULL)
        return NULL;
    if (r->error == NULL)
        Py_RETURN_NONE;
    return PyUnicode_FromString(r->error);
}

/* The body a token names, taken from `completed`: a bytes object, an int (the size of a body over the
 * limit), or NULL when `token` is no token (a message of TOKEN_SIZE bytes of its own); Py_None if the body
 * is gone. */
static PyObject *take_token(const char *token)
{
    uint64_t number;
    if (memcmp(token, &secret, 8) != 0)
        return NULL;
    memcpy(&number, token + 8, 8);
    PyObject *key = PyLong_FromUnsignedLongLong(number);
    if (key == NULL)
        return NULL;
    PyObject *value = PyDict_GetItemWithError(completed, key);
    if (value != NULL) {
        Py_INCREF(value);
        if (PyDict_DelItem(completed, key) < 0)
            PyErr_Clear();
    } else {
        PyErr_Clear();
        value = Py_NewRef(Py_None);
    }
    Py_DECREF(key);
    return value;
}

/* One delivery event as an item of drain's list, or NULL with *skip set when there is nothing to
 * report: an outcome event with no outcome yet, a message not complete yet (proton holds its frames
 * until the last one, or the reader holds its body: the message is then read with one copy into one bytes
 * object, or is the reader's, and no frame costs Python anything). A message over `limit` bytes (0: none),
 * complete or not, an aborted one, a transactional one, and one behind such a message on its link (not
 * readable until proton_adapter.py has read that one: it keeps their order) go to proton_adapter.py as
 * RAW, with the message's bytes when they were taken already (the reader's), or the size of a body the
 * reader dropped over its limit. A body the reader should hold and does not is reported as LOST. */
static PyObject *item(void *delivery, size_t limit, bool *skip)
{
    void *link = delivery_link(delivery);
    *skip = false;
    if (link_is_sender(link)) {
        bool settled = delivery_settled(delivery);
        uint64_t state = settled || delivery_updated(delivery) ? delivery_remote_state(delivery) : 0;
        if (!state && !settled) {
            *skip = true;
            return NULL;
        }
        bool failed = false, undeliverable = false;
        if (state == MODIFIED) {
            void *remote = delivery_remote(delivery);
            failed = disposition_is_failed(remote);
            undeliverable = disposition_is_undeliverable(remote);
        }
        return Py_BuildValue("(iNNKOO)", OUTCOME, ADDRESS(link), ADDRESS(delivery),
                             (unsigned long long)(state ? state : ACCEPTED),
                             failed ? Py_True : Py_False, undeliverable ? Py_True : Py_False);
    }
    if (delivery_aborted(delivery) || !delivery_readable(delivery))
        return Py_BuildValue("(iNNO)", RAW, ADDRESS(link), ADDRESS(delivery), Py_None);
    size_t pending = delivery_pending(delivery);
    bool partial = delivery_partial(delivery);
    PyObject *data = NULL;
    if (!partial && pending == TOKEN_SIZE) { /* the reader's token, or a message of that size */
        char token[TOKEN_SIZE];
        if (link_recv(link, token, TOKEN_SIZE) != TOKEN_SIZE)
            return PyErr_Format(PyExc_RuntimeError, "proton gave less than a %d-byte delivery", TOKEN_SIZE);
        data = take_token(token);
        if (data == NULL) {
            if (PyErr_Occurred())
                return NULL;
            data = PyBytes_FromStringAndSize(token, TOKEN_SIZE);
            if (data == NULL)
                return NULL;
        } else if (data == Py_None) {
            Py_DECREF(data);
            link_advance(link);
            return Py_BuildValue("(iNNs)", LOST, ADDRESS(link), ADDRESS(delivery),
                                 "the broker lost the body of a large message it was receiving");
        } else if (PyLong_Check(data)) { /* dropped over the limit */
            return Py_BuildValue("(iNNN)", RAW, ADDRESS(link), ADDRESS(delivery), data);
        }
        pending = (size_t)PyBytes_GET_SIZE(data);
    }
    bool over = limit && pending > limit;
    if (data == NULL && partial && !over) {
        *skip = true;
        return NULL;
    }
    /* A transactional transfer (its state names the transaction) is read by proton_adapter.py: a cold path. */
    if (over || delivery_remote_state(delivery) == TRANSACTIONAL)
        return Py_BuildValue("(iNNN)", RAW, ADDRESS(link), ADDRESS(delivery), data ? data : Py_NewRef(Py_None));
    if (data == NULL) {
        data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)pending);
        if (data == NULL)
            return NULL;
        ssize_t got = link_recv(link, PyBytes_AS_STRING(data), pending);
        if (got != (ssize_t)pending && !(got < 0 && pending == 0)) {
            Py_DECREF(data);
            return PyErr_Format(PyExc_RuntimeError, "proton gave %zd bytes of a %zu-byte delivery", got, pending);
        }
    }
    link_advance(link);
    return Py_BuildValue("(iNNNO)", TRANSFER, ADDRESS(link), ADDRESS(delivery), data,
                         delivery_settled(delivery) ? Py_True : Py_False);
}

/* A delivery whose item failed (an error set): (LOST, link, delivery, why), its link advanced past it. */
static PyObject *lost(void *delivery)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *why = value ? PyObject_Str(value) : NULL;
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (why == NULL) {
        PyErr_Clear();
        why = PyUnicode_FromString("a message could not be read");
        if (why == NULL)
            return NULL;
    }
    void *link = delivery_link(delivery);
    if (!link_is_sender(link) && delivery_readable(delivery) && !delivery_partial(delivery))
        link_advance(link);
    return Py_BuildValue("(iNNN)", LOST, ADDRESS(link), ADDRESS(delivery), why);
}

/* The events at the collector's head, popped, as drain's items: deliveries (item above), links' flows, and
 * nothing for the events the broker does not act on (the transport has output, local opens and closes,
 * objects made or freed). It stops at an event of a type proton_adapter.py keeps, reported last as
 * (EVENT, type) and left at the head for it to handle and pop; an empty list: the collector is empty. */
static PyObject *drain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "drain(collector, limit)");
    void *collector = address(args[0]);
    size_t limit = PyLong_AsSize_t(args[1]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *items = PyList_New(0);
    if (items == NULL)
        return NULL;
    void *event;
    while (PyList_GET_SIZE(items) < MAX_BATCH && (event = collector_peek(collector)) != NULL) {
        int type = event_type(event);
        PyObject *one = NULL;
        bool skip = false, stop = false;
        if (type == PN_DELIVERY) {
            void *delivery = event_delivery(event);
            one = item(delivery, limit, &skip);
            if (one == NULL && !skip) /* reported on its own: the other items stand */
                one = lost(delivery);
        } else if (type == PN_LINK_FLOW) {
            void *link = event_link(event);
            one = Py_BuildValue("(iNO)", FLOW, ADDRESS(link), link_get_drain(link) ? Py_True : Py_False);
        } else if (type < 0 || type >= EVENT_TYPES || kept[type]) {
            one = Py_BuildValue("(ii)", EVENT, type);
            stop = true;
        } else {
            skip = true;
        }
        if (!stop)
            collector_pop(collector); /* even when it failed: the next call goes on with the next event */
        if (one == NULL && !skip) {
            Py_DECREF(items);
            return NULL;
        }
        if (one != NULL) {
            int failed = PyList_Append(items, one);
            Py_DECREF(one);
            if (failed) {
                Py_DECREF(items);
                return NULL;
            }
        }
        if (stop)
            break;
    }
    return items;
}

/* Write proton's pending output to the socket, gathered: proton hands out at most one frame of the
 * peer's max-frame-size at a time (64 KiB from most clients), and on loopback each send also runs the
 * receiver's TCP input and wakes it. 1 MB messages sent 64 KiB a call cost the broker ~1.7 times the
 * system time of a few calls each (design/performance.md, "Large messages"). So proton's output is
 * copied into a stage of STAGE bytes, popped, and the stage sent in one call. What a full socket did not
 * take comes back as `left` (bytes) with `at`, how much of it went already; it is sent first next time.
 * Returns (WRITTEN, b"", 0) when all is written, (CLOSED, b"", 0) when all is written and the transport
 * is closed both ways (the connection is over), (FULL, left, at) when the socket is full, (FAILED, b"", 0)
 * when it failed. */
enum { STAGE = 1024 * 1024 };
/* Static: the same 1 MiB from PyMem_RawMalloc halved a 100-byte pair's msg/s (design/performance.md).
 * One engine thread writes; `staging` (set under the GIL, held across the sends, which release it) makes
 * a second one an error rather than a stage written twice at once. */
static char stage[STAGE];
static bool staging;

/* Send what `data` holds: the bytes sent (0 if the socket is full), or -1 with errno. */
static ssize_t send_some(int fd, const char *data, size_t size)
{
    ssize_t n;
    do {
        Py_BEGIN_ALLOW_THREADS
        n = send(fd, data, size, MSG_DONTWAIT | MSG_NOSIGNAL);
        Py_END_ALLOW_THREADS
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    return n;
}

/* Proton's output through the stage to the socket: write's second half. */
static PyObject *stage_out(void *transport, int fd)
{
    for (;;) {
        size_t filled = 0;
        ssize_t pending;
        while (filled < STAGE && (pending = transport_pending(transport)) > 0) {
            size_t take = (size_t)pending < STAGE - filled ? (size_t)pending : STAGE - filled;
            memcpy(stage + filled, transport_head(transport), take);
            transport_pop(transport, take);
            filled += take;
        }
        if (filled == 0)
            break;
        ssize_t n = send_some(fd, stage, filled);
        if (n < 0)
            return Py_BuildValue("(iyi)", FAILED, "", 0);
        if ((size_t)n < filled)
            return Py_BuildValue("(iy#i)", FULL, stage + n, (Py_ssize_t)(filled - (size_t)n), 0);
    }
    return Py_BuildValue("(iyi)", transport_closed(transport) ? CLOSED : WRITTEN, "", 0);
}

static PyObject *write_socket(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyBytes_Check(args[2]))
        return PyErr_Format(PyExc_TypeError, "write(transport, fd, left: bytes, at)");
    void *transport = address(args[0]);
    int fd = (int)PyLong_AsLong(args[1]);
    PyObject *left = args[2];
    Py_ssize_t at = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(left);
    if (at < size) {
        ssize_t n = send_some(fd, PyBytes_AS_STRING(left) + at, (size_t)(size - at));
        if (n < 0)
            return Py_BuildValue("(iyi)", FAILED, "", 0);
        if (at + n < size)
            return Py_BuildValue("(iOn)", FULL, left, at + n);
    }
    if (staging)
        return PyErr_Format(PyExc_RuntimeError, "_pn.write: a second thread writes while the stage is in use");
    staging = true;
    PyObject *result = stage_out(transport, fd);
    staging = false;
    return result;
}

/* Hand one buffer's bytes to proton (which copies them into its own). */
static int send_piece(void *link, PyObject *piece)
{
    Py_buffer data;
    if (PyObject_GetBuffer(piece, &data, PyBUF_SIMPLE) < 0)
        return -1;
    link_send(link, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return 0;
}

static PyObject *send_delivery(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer tag;
    if (nargs != 4)
        return PyErr_Format(PyExc_TypeError, "send(link, tag, data, settled)");
    void *link = address(args[0]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *data = args[2];
    bool pieces = PyList_Check(data);
    if (!pieces && !PyObject_CheckBuffer(data))
        return PyErr_Format(PyExc_TypeError, "send: data must be bytes or a list of bytes, not %s",
                            Py_TYPE(data)->tp_name);
    if (PyObject_GetBuffer(args[1], &tag, PyBUF_SIMPLE) < 0)
        return NULL;
    pn_bytes t = {(size_t)tag.len, tag.buf};
    void *delivery = new_delivery(link, t);
    PyBuffer_Release(&tag);
    int failed = 0;
    if (pieces) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(data) && !failed; i++)
            failed = send_piece(link, PyList_GET_ITEM(data, i));
    } else {
        failed = send_piece(link, data);
    }
    if (failed) { /* a piece that is not bytes: the delivery goes out aborted, never half a message */
        delivery_abort(delivery);
        return NULL;
    }
    link_advance(link);
    if (PyObject_IsTrue(args[3])) {
        delivery_settle(delivery);
        return PyLong_FromLong(0);
    }
    return ADDRESS(delivery);
}

static PyObject *settle(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "settle(delivery, outcome)");
    void *delivery = address(args[0]);
    unsigned long long outcome = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (outcome)
        delivery_update(delivery, outcome);
    delivery_settle(delivery);
    Py_RETURN_NONE;
}

static PyObject *credit(PyObject *self, PyObject *link)
{
    void *p = address(link);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(link_credit(p));
}

static PyObject *pending(PyObject *self, PyObject *transport)
{
    void *p = address(transport);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromSsize_t(transport_pending(p));
}

static PyObject *drained(PyObject *self, PyObject *link)
{
    void *p = address(link);
    if (PyErr_Occurred())
        return NULL;
    if (!link_get_drain(p))
        Py_RETURN_FALSE;
    link_drained(p);
    Py_RETURN_TRUE;
}

static PyObject *tag(PyObject *self, PyObject *delivery)
{
    void *p = address(delivery);
    if (PyErr_Occurred())
        return NULL;
    pn_bytes t = delivery_tag(p);
    return PyBytes_FromStringAndSize(t.start, (Py_ssize_t)t.size);
}

static PyMethodDef methods[] = {
    {"bind", bind_library, METH_VARARGS,
     "bind(path, PN_DELIVERY, PN_LINK_FLOW, kept): find proton's functions in the loaded library; kept: the "
     "event types drain leaves to the caller"},
    {"reader", reader_new, METH_O, "reader(limit) -> a connection's reader of its input (bodies over limit dropped; 0: none)"},
    {"read", (PyCFunction)(void (*)(void))read_socket, METH_FASTCALL,
     "read(transport, fd, budget, reader) -> bytes read from the socket into the transport, -1 once it is closed, "
     "-2 once the reader failed the connection"},
    {"feed", (PyCFunction)(void (*)(void))feed, METH_FASTCALL,
     "feed(transport, reader, data) -> False once the reader failed the connection"},
    {"reader_state", reader_state, METH_O,
     "reader_state(reader) -> (deliveries assembled so far, deliveries in progress, bodies drain has not taken)"},
    {"reader_close", reader_close, METH_O, "reader_close(reader): the connection is gone; what its reader holds is freed"},
    {"reader_error", reader_error, METH_O, "reader_error(reader) -> why the reader failed the connection, or None"},
    {"write", (PyCFunction)(void (*)(void))write_socket, METH_FASTCALL,
     "write(transport, fd, left, at) -> (WRITTEN, b\"\", 0), (CLOSED, b\"\", 0) all written and the transport "
     "closed, (FULL, left, at) the socket is full, (FAILED, b\"\", 0)"},
    {"drain", (PyCFunction)(void (*)(void))drain, METH_FASTCALL,
     "drain(collector, limit) -> the events at the head of the collector, popped: "
     "(TRANSFER, link, delivery, data, settled), (OUTCOME, link, delivery, state, failed, undeliverable), "
     "(RAW, link, delivery, data: bytes, int (its size, dropped) or None (not read)), (FLOW, link, drain), "
     "(LOST, link, delivery, why); last, (EVENT, type) for one left at the head for the caller"},
    {"send", (PyCFunction)(void (*)(void))send_delivery, METH_FASTCALL,
     "send(link, tag, data, settled) -> the new delivery (0 when sent settled)"},
    {"settle", (PyCFunction)(void (*)(void))settle, METH_FASTCALL, "settle(delivery, outcome): update unless 0, settle"},
    {"credit", credit, METH_O, "credit(link) -> the link's credit"},
    {"pending", pending, METH_O, "pending(transport) -> the bytes of output proton has (< 0: its output is closed)"},
    {"drained", drained, METH_O, "drained(link) -> whether the peer asked for a drain (then answered)"},
    {"tag", tag, METH_O, "tag(delivery) -> its tag"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pn", NULL, -1, methods};

PyMODINIT_FUNC PyInit__pn(void)
{
    /* the tokens' secret: a peer cannot make a message of its own look like one */
    if (getrandom(&secret, sizeof secret, 0) != sizeof secret)
        return PyErr_SetFromErrno(PyExc_OSError);
    completed = PyDict_New();
    if (completed == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "RAW", RAW) < 0 || PyModule_AddIntConstant(m, "TRANSFER", TRANSFER) < 0
        || PyModule_AddIntConstant(m, "OUTCOME", OUTCOME) < 0 || PyModule_AddIntConstant(m, "FLOW", FLOW) < 0
        || PyModule_AddIntConstant(m, "EVENT", EVENT) < 0 || PyModule_AddIntConstant(m, "LOST", LOST) < 0 || PyModule_AddIntConstant(m, "WRITTEN", WRITTEN) < 0
        || PyModule_AddIntConstant(m, "FULL", FULL) < 0 || PyModule_AddIntConstant(m, "FAILED", FAILED) < 0
        || PyModule_AddIntConstant(m, "CLOSED", CLOSED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
