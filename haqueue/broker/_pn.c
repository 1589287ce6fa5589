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
 *   read(transport, fd, budget) -> int           socket -> proton's input buffer, no copy on the way
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
#include <sys/socket.h>

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

static int PN_DELIVERY = -1, PN_LINK_FLOW = -1;
enum { EVENT_TYPES = 128 };
static bool kept[EVENT_TYPES]; /* the event types proton_adapter.py handles with proton's objects (opens, closes) */
enum { ACCEPTED = 0x24, MODIFIED = 0x27, TRANSACTIONAL = 0x34 };
/* What drain() reports: a whole message in hand, an outcome, a delivery for proton_adapter.py to handle
 * itself (aborted, over the size limit, transactional), a link's flow, or an event proton_adapter.py
 * keeps, left at the collector's head. */
enum { RAW = 0, TRANSFER = 1, OUTCOME = 2, FLOW = 3, EVENT = 4 };
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
    Py_RETURN_NONE;
}

static void *address(PyObject *value)
{
    return PyLong_AsVoidPtr(value);
}

#define ADDRESS(p) PyLong_FromVoidPtr(p)

/* One delivery event as an item of drain's list, or NULL with *skip set when there is nothing to
 * report: an outcome event with no outcome yet, a message not complete yet (proton holds its frames
 * until the last one: the message is then read with one copy into one bytes object, and no frame
 * costs Python anything). A message over `limit` bytes (0: none), complete or not, an aborted one, a
 * transactional one, and one behind such a message on its link (not readable until proton_adapter.py has
 * read that one: it keeps their order) go to proton_adapter.py. */
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
    if (!delivery_aborted(delivery) && delivery_readable(delivery)) {
        size_t pending = delivery_pending(delivery);
        bool over = limit && pending > limit;
        if (delivery_partial(delivery) && !over) {
            *skip = true;
            return NULL;
        }
        /* A transactional transfer (its state names the transaction) is read by proton_adapter.py: a cold path. */
        if (!over && delivery_remote_state(delivery) != TRANSACTIONAL) {
            PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)pending);
            if (data == NULL)
                return NULL;
            ssize_t got = link_recv(link, PyBytes_AS_STRING(data), pending);
            if (got != (ssize_t)pending && !(got < 0 && pending == 0)) {
                Py_DECREF(data);
                return PyErr_Format(PyExc_RuntimeError, "proton gave %zd bytes of a %zu-byte delivery", got, pending);
            }
            link_advance(link);
            return Py_BuildValue("(iNNNO)", TRANSFER, ADDRESS(link), ADDRESS(delivery), data,
                                 delivery_settled(delivery) ? Py_True : Py_False);
        }
    }
    return Py_BuildValue("(iNN)", RAW, ADDRESS(link), ADDRESS(delivery));
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
            one = item(event_delivery(event), limit, &skip);
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

/* Read the socket straight into proton's input buffer (no bytes object, no copy into proton) until it
 * has nothing more or `budget` bytes came, letting proton decode each read. Returns the bytes read,
 * or -1 once the peer closed or the socket failed (after handing proton what came before). If proton
 * takes no more input (it stopped reading), what comes is read and dropped. */
static PyObject *read_socket(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "read(transport, fd, budget)");
    void *transport = address(args[0]);
    int fd = (int)PyLong_AsLong(args[1]);
    Py_ssize_t budget = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    char dropped[16384];
    Py_ssize_t total = 0;
    while (total < budget) {
        ssize_t capacity = transport_capacity(transport);
        char *into = capacity > 0 ? transport_tail(transport) : dropped;
        size_t room = capacity > 0 ? (size_t)capacity : sizeof dropped;
        ssize_t n;
        Py_BEGIN_ALLOW_THREADS
        n = recv(fd, into, room, MSG_DONTWAIT);
        Py_END_ALLOW_THREADS
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0)
            return PyLong_FromLong(-1);
        if (capacity > 0)
            transport_process(transport, (size_t)n);
        total += n;
        if ((size_t)n < room)
            break; /* the socket had no more: spare the call that would say so */
    }
    return PyLong_FromSsize_t(total);
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
    {"read", (PyCFunction)(void (*)(void))read_socket, METH_FASTCALL,
     "read(transport, fd, budget) -> bytes read from the socket into the transport, -1 once it is closed"},
    {"write", (PyCFunction)(void (*)(void))write_socket, METH_FASTCALL,
     "write(transport, fd, left, at) -> (WRITTEN, b\"\", 0), (CLOSED, b\"\", 0) all written and the transport "
     "closed, (FULL, left, at) the socket is full, (FAILED, b\"\", 0)"},
    {"drain", (PyCFunction)(void (*)(void))drain, METH_FASTCALL,
     "drain(collector, limit) -> the events at the head of the collector, popped: "
     "(TRANSFER, link, delivery, data, settled), (OUTCOME, link, delivery, state, failed, undeliverable), "
     "(RAW, link, delivery), (FLOW, link, drain); last, (EVENT, type) for one left at the head for the caller"},
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
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "RAW", RAW) < 0 || PyModule_AddIntConstant(m, "TRANSFER", TRANSFER) < 0
        || PyModule_AddIntConstant(m, "OUTCOME", OUTCOME) < 0 || PyModule_AddIntConstant(m, "FLOW", FLOW) < 0
        || PyModule_AddIntConstant(m, "EVENT", EVENT) < 0 || PyModule_AddIntConstant(m, "WRITTEN", WRITTEN) < 0
        || PyModule_AddIntConstant(m, "FULL", FULL) < 0 || PyModule_AddIntConstant(m, "FAILED", FAILED) < 0
        || PyModule_AddIntConstant(m, "CLOSED", CLOSED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
