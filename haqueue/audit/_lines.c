/* The audit log's per-record work (events.py, lines.py).
 *
 * Recorder: one per logged queue; the hot path's hooks append (time, seq, message bytes[, the
 * primary's enqueue time]) to a C array per kind of event: no Python frame, no int objects. Its
 * first record since the audit last took its records lists it in the audit's `pending` list, so
 * the end of a loop pass visits only the queues that recorded something.
 * Batch: a kind's records taken from a Recorder, handed to the writer thread.
 * write(): formats batches into JSON lines and writes them with the GIL released, reading each
 * message's id from its bytes when it has the usual encoding (every offset checked against the
 * length); read_id, in Python, reads any other.
 *
 * In CPython a line cost about 0.6 us (three integers to text and a template filled in), an id
 * 0.45 us and a hook 0.2 us; at three events per message a quarter of what the broker spends on
 * the message, all of it on the thread its clients wait for.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

static const char PAIRS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* Writes v in decimal at out, two digits per division; returns the end. */
static char *put_int(char *out, long long v)
{
    char digits[24], *p = digits + sizeof digits;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    if (v < 0)
        *out++ = '-';
    while (u >= 100) {
        p -= 2;
        memcpy(p, PAIRS + 2 * (u % 100), 2);
        u /= 100;
    }
    if (u >= 10) {
        p -= 2;
        memcpy(p, PAIRS + 2 * u, 2);
    } else
        *--p = (char)('0' + u);
    size_t n = (size_t)(digits + sizeof digits - p);
    memcpy(out, p, n);
    return out + n;
}

/* The size of the section value at d[pos] (a list or map), or -1 for an encoding not handled here. */
static Py_ssize_t value_size(const unsigned char *d, Py_ssize_t len, Py_ssize_t pos)
{
    if (pos >= len)
        return -1;
    switch (d[pos]) {
    case 0x45: /* list0 */
        return 1;
    case 0xC0: case 0xC1: /* list8, map8: size, then that many bytes */
        return pos + 1 < len ? 2 + (Py_ssize_t)d[pos + 1] : -1;
    case 0xD0: case 0xD1: /* list32, map32 */
        if (pos + 4 >= len)
            return -1;
        return 5 + (Py_ssize_t)((uint32_t)d[pos + 1] << 24 | (uint32_t)d[pos + 2] << 16 | (uint32_t)d[pos + 3] << 8 | d[pos + 4]);
    default:
        return -1;
    }
}


/* Where data's message-id is, as JSON: PLAIN (a string to quote: data[*start .. *start + *size)),
 * NULL_ID (none), or OTHER (read it in Python). Reads no byte past len. */
enum id_kind { PLAIN, NULL_ID, OTHER };

static enum id_kind find_id(const unsigned char *d, Py_ssize_t len, Py_ssize_t *start, Py_ssize_t *size)
{
    Py_ssize_t pos = 0;
    /* Sections in order: header, delivery and message annotations are skipped by their sizes. */
    while (pos + 3 < len && d[pos] == 0x00 && d[pos + 1] == 0x53 && d[pos + 2] < 0x73) {
        Py_ssize_t skip = value_size(d, len, pos + 3);
        if (skip < 0 || d[pos + 2] < 0x70)
            return OTHER;
        pos += 3 + skip;
    }
    if (pos + 3 > len || d[pos] != 0x00 || d[pos + 1] != 0x53)
        return OTHER; /* cut short, or not a message */
    if (d[pos + 2] > 0x73) /* application properties or the body: there are no properties */
        return NULL_ID;
    if (pos + 3 < len && d[pos + 3] == 0x45) /* the properties as list0: no fields */
        return NULL_ID;
    if (pos + 7 > len || d[pos + 3] != 0xC0) /* else a list8 whose first field is the message-id */
        return OTHER;
    if (d[pos + 5] == 0 || d[pos + 6] == 0x40) /* no fields, or a null id */
        return NULL_ID;
    if (pos + 8 > len || d[pos + 6] != 0xA1) /* not a str8 */
        return OTHER;
    *size = d[pos + 7];
    *start = pos + 8;
    if (*start + *size > len || d[pos + 4] < *size + 3) /* the string lies in the data and in the list */
        return OTHER;
    for (Py_ssize_t i = *start; i < *start + *size; i++)
        if (d[i] < 0x20 || d[i] > 0x7E || d[i] == '"' || d[i] == '\\')
            return OTHER;
    return PLAIN;
}

#define INT_ROOM 21 /* a long long in decimal, with its sign */
/* The kinds of records, exported by these names (lines.Kind numbers its members with them). */
/* KEPT_LOCAL: the confirmation of a message kept off the backups (HA's selective replication). */
enum kind { ENQUEUE, COMPLETE, DEQUEUE, LIVE, CATCHUP, MIRRORED, DIVERGED, KEPT_LOCAL, KINDS };

struct record {
    long long t, seq, enqueued; /* time.time_ns(); the primary's enqueue time in us (a live replica) */
    PyObject *data;             /* the message, a new reference */
};

struct records {
    struct record *items;
    Py_ssize_t count, capacity;
};

static void release(struct records *r)
{
    for (Py_ssize_t i = 0; i < r->count; i++)
        Py_DECREF(r->items[i].data);
    PyMem_Free(r->items);
    r->items = NULL;
    r->count = r->capacity = 0;
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static PyObject *SEQ, *DATA, *DELETED; /* attribute names */

/* ---- Batch: records taken from a Recorder ---------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    struct records records;
} Batch;

static void batch_dealloc(Batch *self)
{
    release(&self->records);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t batch_length(Batch *self)
{
    return self->records.count;
}

static PySequenceMethods batch_sequence = {.sq_length = (lenfunc)batch_length};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "haqueue.audit._lines.Batch",
    .tp_doc = "Records of one kind taken from a Recorder, for write().",
    .tp_basicsize = sizeof(Batch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_as_sequence = &batch_sequence,
};

/* ---- Recorder: one queue's records, by kind ------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    struct records kinds[KINDS];
    PyObject *pending; /* a list, or NULL: where the first record since unlist() lists this recorder */
    int listed;
} Recorder;

static void recorder_dealloc(Recorder *self)
{
    for (int k = 0; k < KINDS; k++)
        release(&self->kinds[k]);
    Py_XDECREF(self->pending);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int recorder_init(Recorder *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"pending", NULL};
    PyObject *pending = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O!:Recorder", names, &PyList_Type, &pending))
        return -1;
    Py_XINCREF(pending);
    Py_XSETREF(self->pending, pending);
    self->listed = 0;
    return 0;
}

/* Appends a record; data is borrowed (a reference is taken). -1 with an exception set on failure. */
static int add(Recorder *self, int kind, long long t, long long seq, PyObject *data, long long enqueued)
{
    struct records *r = &self->kinds[kind];
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "Recorder: a message must be bytes");
        return -1;
    }
    if (r->count == r->capacity) {
        Py_ssize_t capacity = r->capacity ? 2 * r->capacity : 256;
        struct record *items = PyMem_Realloc(r->items, (size_t)capacity * sizeof *items);
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->items = items;
        r->capacity = capacity;
    }
    if (!self->listed && self->pending != NULL) {
        if (PyList_Append(self->pending, (PyObject *)self) < 0)
            return -1;
        self->listed = 1;
    }
    Py_INCREF(data);
    r->items[r->count++] = (struct record){t ? t : now_ns(), seq, enqueued, data};
    return 0;
}

/* Appends (now, entry.seq, entry.data) to a kind's records. */
static PyObject *add_entry(Recorder *self, int kind, PyObject *entry)
{
    PyObject *seq = PyObject_GetAttr(entry, SEQ), *data = seq ? PyObject_GetAttr(entry, DATA) : NULL;
    long long n = seq ? PyLong_AsLongLong(seq) : -1;
    int failed = data == NULL || (n == -1 && PyErr_Occurred()) || add(self, kind, 0, n, data, 0) < 0;
    Py_XDECREF(seq);
    Py_XDECREF(data);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* The queue observer's methods take (queue, entry). */
static int two_args(const char *name, Py_ssize_t nargs)
{
    if (nargs == 2)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes 2 arguments (%zd given)", name, nargs);
    return 0;
}

static PyObject *recorder_enqueued(Recorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!two_args("enqueued", nargs))
        return NULL;
    return add_entry(self, ENQUEUE, args[1]);
}

static PyObject *recorder_dequeued(Recorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!two_args("dequeued", nargs))
        return NULL;
    PyObject *deleted = PyObject_GetAttr(args[0], DELETED);
    int purge = deleted ? PyObject_IsTrue(deleted) : -1;
    Py_XDECREF(deleted);
    if (purge < 0)
        return NULL;
    if (purge) /* a deleted queue's purge is not a consume */
        Py_RETURN_NONE;
    return add_entry(self, DEQUEUE, args[1]);
}

static PyObject *recorder_completed(Recorder *self, PyObject *entry)
{
    return add_entry(self, COMPLETE, entry);
}

static PyObject *recorder_add(Recorder *self, PyObject *args)
{
    int kind;
    long long seq, enqueued = 0, t = 0;
    PyObject *data;
    if (!PyArg_ParseTuple(args, "iLO|LL:add", &kind, &seq, &data, &enqueued, &t))
        return NULL;
    if (kind < 0 || kind >= KINDS) {
        PyErr_Format(PyExc_ValueError, "add: kind %d is not one of 0..%d", kind, KINDS - 1);
        return NULL;
    }
    if (add(self, kind, t, seq, data, enqueued) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *recorder_take(Recorder *self, PyObject *arg)
{
    long kind = PyLong_AsLong(arg);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    if (kind < 0 || kind >= KINDS) {
        PyErr_Format(PyExc_ValueError, "take: kind %ld is not one of 0..%d", kind, KINDS - 1);
        return NULL;
    }
    if (self->kinds[kind].count == 0)
        Py_RETURN_NONE;
    Batch *batch = PyObject_New(Batch, &BatchType);
    if (batch == NULL)
        return NULL;
    batch->records = self->kinds[kind];
    self->kinds[kind] = (struct records){NULL, 0, 0};
    return (PyObject *)batch;
}

static PyObject *recorder_unlist(Recorder *self, PyObject *unused)
{
    self->listed = 0;
    Py_RETURN_NONE;
}

static PyMethodDef recorder_methods[] = {
    {"enqueued", (PyCFunction)(void (*)(void))recorder_enqueued, METH_FASTCALL,
     "enqueued(queue, entry): the queue observer's enqueue (ENQUEUE)"},
    {"dequeued", (PyCFunction)(void (*)(void))recorder_dequeued, METH_FASTCALL,
     "dequeued(queue, entry): the queue observer's dequeue (DEQUEUE), unless the queue is deleted"},
    {"completed", (PyCFunction)recorder_completed, METH_O, "completed(entry): a confirmed publish (COMPLETE)"},
    {"add", (PyCFunction)recorder_add, METH_VARARGS,
     "add(kind, seq, data, enqueued=0, t=0): a record of any kind; t = time.time_ns(), 0 for now"},
    {"take", (PyCFunction)recorder_take, METH_O, "take(kind) -> Batch | None: the kind's records, leaving none"},
    {"unlist", (PyCFunction)recorder_unlist, METH_NOARGS,
     "unlist(): its records were taken (and it left `pending`): the next record lists it again"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "haqueue.audit._lines.Recorder",
    .tp_doc = "Recorder(pending=None): one logged queue's records since they were last taken, by kind\n"
              "(lines.Kind); its first record after unlist() appends it to the list `pending`.",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)recorder_init,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_methods = recorder_methods,
};

/* ---- write ------------------------------------------------------------------------------------ */

struct group {
    const char *literal; /* lines already formatted (bytes), written as they are */
    Py_ssize_t literal_size;
    const char *part[6];
    Py_ssize_t size[6], nparts;
    struct records *records;
    long long n;
    Py_ssize_t first; /* its records' ids: ids[first ..] */
};

struct id {
    enum id_kind kind;
    Py_ssize_t start, size;
    PyObject *text; /* OTHER: read_id's answer, a new reference */
};

static char *put(char *out, const char *text, Py_ssize_t size)
{
    memcpy(out, text, (size_t)size);
    return out + size;
}

PyDoc_STRVAR(write_doc,
"write(fd, groups, read_id) -> int\n\n"
"Write JSON lines to the file descriptor fd; the number of bytes written. groups is a list of\n"
"lines already formatted (bytes) and of (parts, batch, n): parts 5 bytes, or 6 for a batch of live\n"
"replicas; one line per record:\n"
"parts[0] t parts[1] n parts[2] seq parts[3] id parts[4] [enqueued parts[5]]\n"
"with t in us, n counting up from n + 1, and id the message-id as JSON text: a plain string or\n"
"null read here, any other by read_id(data) -> bytes. Formats and writes with the GIL released.");

static PyObject *write_groups(PyObject *self, PyObject *args)
{
    int fd;
    PyObject *groups, *read_id, *result = NULL;
    if (!PyArg_ParseTuple(args, "iO!O:write", &fd, &PyList_Type, &groups, &read_id))
        return NULL;
    Py_ssize_t ngroups = PyList_GET_SIZE(groups), total = 0, others = 0, done = 0;
    struct group *g = PyMem_Calloc((size_t)ngroups + 1, sizeof *g);
    struct id *ids = NULL;
    char *buffer = NULL;
    if (g == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < ngroups; k++) {
        PyObject *group = PyList_GET_ITEM(groups, k), *parts, *batch;
        if (PyBytes_Check(group)) {
            g[k].literal = PyBytes_AS_STRING(group);
            g[k].literal_size = PyBytes_GET_SIZE(group);
            continue;
        }
        if (!PyArg_ParseTuple(group, "O!O!L:write: a group", &PyTuple_Type, &parts, &BatchType, &batch, &g[k].n))
            goto done;
        g[k].nparts = PyTuple_GET_SIZE(parts);
        if (g[k].nparts != 5 && g[k].nparts != 6) {
            PyErr_SetString(PyExc_ValueError, "write: a group has 5 or 6 parts");
            goto done;
        }
        for (Py_ssize_t i = 0; i < g[k].nparts; i++) {
            PyObject *part = PyTuple_GET_ITEM(parts, i);
            if (!PyBytes_Check(part)) {
                PyErr_SetString(PyExc_TypeError, "write: parts must be bytes");
                goto done;
            }
            g[k].part[i] = PyBytes_AS_STRING(part);
            g[k].size[i] = PyBytes_GET_SIZE(part);
        }
        g[k].records = &((Batch *)batch)->records;
        g[k].first = total;
        total += g[k].records->count;
    }
    if ((ids = PyMem_Calloc((size_t)total + 1, sizeof *ids)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Find every id without the GIL (the batches and their messages are held by groups). */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < ngroups; k++)
        for (Py_ssize_t i = 0; g[k].literal == NULL && i < g[k].records->count; i++) {
            PyObject *data = g[k].records->items[i].data;
            struct id *id = &ids[g[k].first + i];
            id->kind = find_id((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                               &id->start, &id->size);
            others += id->kind == OTHER;
        }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t k = 0; others && k < ngroups; k++)
        for (Py_ssize_t i = 0; g[k].literal == NULL && i < g[k].records->count; i++) {
            struct id *id = &ids[g[k].first + i];
            if (id->kind != OTHER)
                continue;
            if ((id->text = PyObject_CallOneArg(read_id, g[k].records->items[i].data)) == NULL)
                goto done;
            if (!PyBytes_Check(id->text)) {
                PyErr_SetString(PyExc_TypeError, "write: read_id must return bytes");
                goto done;
            }
        }
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t room = 0;
    for (Py_ssize_t k = 0; k < ngroups; k++) {
        room += g[k].literal_size;
        Py_ssize_t fixed = (g[k].nparts - 2) * INT_ROOM; /* t, n, seq (, enqueued) */
        for (Py_ssize_t i = 0; i < g[k].nparts; i++)
            fixed += g[k].size[i];
        for (Py_ssize_t i = 0; g[k].literal == NULL && i < g[k].records->count; i++) {
            const struct id *id = &ids[g[k].first + i];
            room += fixed + (id->kind == PLAIN ? id->size + 2 : id->kind == NULL_ID ? 4 : PyBytes_GET_SIZE(id->text));
        }
    }
    buffer = PyMem_RawMalloc((size_t)room + 1);
    char *out = buffer;
    for (Py_ssize_t k = 0; buffer != NULL && k < ngroups; k++) {
        const struct group *gk = &g[k];
        if (gk->literal != NULL) {
            out = put(out, gk->literal, gk->literal_size);
            continue;
        }
        for (Py_ssize_t i = 0; i < gk->records->count; i++) {
            const struct record *r = &gk->records->items[i];
            const struct id *id = &ids[gk->first + i];
            out = put(out, gk->part[0], gk->size[0]);
            out = put_int(out, r->t / 1000);
            out = put(out, gk->part[1], gk->size[1]);
            out = put_int(out, gk->n + 1 + i);
            out = put(out, gk->part[2], gk->size[2]);
            out = put_int(out, r->seq);
            out = put(out, gk->part[3], gk->size[3]);
            if (id->kind == PLAIN) {
                *out++ = '"';
                out = put(out, PyBytes_AS_STRING(r->data) + id->start, id->size);
                *out++ = '"';
            } else if (id->kind == NULL_ID)
                out = put(out, "null", 4);
            else
                out = put(out, PyBytes_AS_STRING(id->text), PyBytes_GET_SIZE(id->text));
            out = put(out, gk->part[4], gk->size[4]);
            if (gk->nparts == 6) {
                out = put_int(out, r->enqueued);
                out = put(out, gk->part[5], gk->size[5]);
            }
        }
    }
    Py_ssize_t size = buffer != NULL ? out - buffer : 0;
    while (buffer != NULL && done < size) {
        ssize_t n = write(fd, buffer + done, (size_t)(size - done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            error = n < 0 ? errno : EIO;
            break;
        }
        done += n;
    }
    Py_END_ALLOW_THREADS
    if (buffer == NULL)
        PyErr_NoMemory();
    else if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
    } else
        result = PyLong_FromSsize_t(done);
done:
    for (Py_ssize_t i = 0; ids != NULL && i < total; i++)
        Py_XDECREF(ids[i].text);
    PyMem_Free(ids);
    PyMem_Free(g);
    PyMem_RawFree(buffer);
    return result;
}

static PyMethodDef methods[] = {
    {"write", write_groups, METH_VARARGS, write_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "haqueue.audit._lines", "The audit log's per-record work, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__lines(void)
{
    if (PyType_Ready(&BatchType) < 0 || PyType_Ready(&RecorderType) < 0)
        return NULL;
    if ((SEQ = PyUnicode_InternFromString("seq")) == NULL || (DATA = PyUnicode_InternFromString("data")) == NULL
        || (DELETED = PyUnicode_InternFromString("deleted")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Recorder", (PyObject *)&RecorderType) < 0
        || PyModule_AddObjectRef(m, "Batch", (PyObject *)&BatchType) < 0
        || PyModule_AddIntMacro(m, ENQUEUE) < 0 || PyModule_AddIntMacro(m, COMPLETE) < 0
        || PyModule_AddIntMacro(m, DEQUEUE) < 0 || PyModule_AddIntMacro(m, LIVE) < 0
        || PyModule_AddIntMacro(m, CATCHUP) < 0 || PyModule_AddIntMacro(m, MIRRORED) < 0
        || PyModule_AddIntMacro(m, DIVERGED) < 0 || PyModule_AddIntMacro(m, KEPT_LOCAL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
