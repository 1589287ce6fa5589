/* The audit log's per-record work (lines.py): batches of records written out as JSON lines, each
 * message's id read from its encoded bytes, on the audit's writer thread with the GIL released.
 *
 * In CPython a line costs about 0.6 us (three integers to text and a template filled in) and an id
 * 0.45 us; at three lines per message that is a quarter of what the broker spends on a message.
 * Here both cost a fraction of that. Only the usual encodings are read here, with every offset
 * checked against the length; the caller reads any other in Python (message_id.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
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

static PyObject *plain_id(const unsigned char *d, Py_ssize_t len)
{
    Py_ssize_t pos = 0;
    /* Sections in order: header, delivery and message annotations are skipped by their sizes. */
    while (pos + 3 < len && d[pos] == 0x00 && d[pos + 1] == 0x53 && d[pos + 2] < 0x73) {
        Py_ssize_t size = value_size(d, len, pos + 3);
        if (size < 0 || d[pos + 2] < 0x70)
            Py_RETURN_NONE;
        pos += 3 + size;
    }
    if (pos + 3 > len || d[pos] != 0x00 || d[pos + 1] != 0x53)
        Py_RETURN_NONE; /* cut short, or not a message */
    if (d[pos + 2] > 0x73) /* application properties or the body: there are no properties */
        return PyBytes_FromStringAndSize("null", 4);
    /* The properties, a list8 whose first field is the message-id (list0: no fields). */
    if (pos + 3 < len && d[pos + 3] == 0x45)
        return PyBytes_FromStringAndSize("null", 4);
    if (pos + 7 > len || d[pos + 3] != 0xC0)
        Py_RETURN_NONE;
    if (d[pos + 5] == 0 || d[pos + 6] == 0x40) /* no fields, or a null id */
        return PyBytes_FromStringAndSize("null", 4);
    if (pos + 8 > len || d[pos + 6] != 0xA1) /* not a str8 */
        Py_RETURN_NONE;
    Py_ssize_t size = d[pos + 7], start = pos + 8;
    if (start + size > len || d[pos + 4] < size + 3) /* the string lies in the data and in the list */
        Py_RETURN_NONE;
    for (Py_ssize_t i = start; i < start + size; i++)
        if (d[i] < 0x20 || d[i] > 0x7E || d[i] == '"' || d[i] == '\\')
            Py_RETURN_NONE;
    PyObject *text = PyBytes_FromStringAndSize(NULL, size + 2);
    if (text == NULL)
        return NULL;
    char *out = PyBytes_AS_STRING(text);
    out[0] = out[size + 1] = '"';
    memcpy(out + 1, d + start, (size_t)size);
    return text;
}

#define INT_ROOM 21 /* a long long in decimal, with its sign */

/* *v = the integer o; -1 with an exception set if it is none. */
static int as_int(PyObject *o, long long *v)
{
    *v = PyLong_AsLongLong(o);
    return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

/* One line's values, read from a record while the GIL is held. */
struct line {
    long long t, seq, enqueued;
    PyObject *id; /* JSON text (bytes), a new reference */
};

/* One group's constant text, borrowed from its parts tuple (kept alive by the caller). */
struct group {
    const char *literal; /* a group may be lines already formatted (bytes): written as they are */
    Py_ssize_t literal_size;
    const char *part[6];
    Py_ssize_t size[6];
    Py_ssize_t nparts, first, count; /* its lines: line[first .. first + count) */
    long long n;
};

static char *put(char *out, const char *text, Py_ssize_t size)
{
    memcpy(out, text, (size_t)size);
    return out + size;
}

PyDoc_STRVAR(write_doc,
"write(fd, groups, read_id) -> int\n\n"
"Write JSON lines to the file descriptor fd; the number of bytes written. groups is a list of\n"
"lines already formatted (bytes) and of (parts, records, n): parts 5 or 6 bytes, records flat, (time_ns, seq, data) per record or\n"
"(time_ns, seq, data, enqueued) with 6 parts. One line per record:\n"
"parts[0] t parts[1] n parts[2] seq parts[3] id parts[4] [enqueued parts[5]]\n"
"with t = time_ns // 1000, n counting up from n + 1, and id the message-id of data as JSON text:\n"
"read here for the usual encodings (a str8 of printable ASCII without quote or backslash, or no id),\n"
"by read_id(data) -> bytes for any other. The values are read with the GIL held; the lines are\n"
"formatted and written without it, so the broker's thread runs meanwhile.");

static PyObject *write_groups(PyObject *self, PyObject *args)
{
    int fd;
    PyObject *groups, *read_id, *result = NULL;
    if (!PyArg_ParseTuple(args, "iO!O:write", &fd, &PyList_Type, &groups, &read_id))
        return NULL;
    Py_ssize_t ngroups = PyList_GET_SIZE(groups), total = 0, room = 0, done = 0;
    struct group *g = PyMem_Calloc((size_t)ngroups + 1, sizeof *g);
    struct line *lines = NULL;
    char *buffer = NULL;
    if (g == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < ngroups; k++) {
        PyObject *group = PyList_GET_ITEM(groups, k), *parts, *records;
        if (PyBytes_Check(group)) {
            g[k].literal = PyBytes_AS_STRING(group);
            room += g[k].literal_size = PyBytes_GET_SIZE(group);
            continue;
        }
        if (!PyArg_ParseTuple(group, "O!O!L:write: a group", &PyTuple_Type, &parts, &PyList_Type, &records, &g[k].n))
            goto done;
        g[k].nparts = PyTuple_GET_SIZE(parts);
        Py_ssize_t stride = g[k].nparts - 2;
        if ((g[k].nparts != 5 && g[k].nparts != 6) || PyList_GET_SIZE(records) % stride) {
            PyErr_SetString(PyExc_ValueError, "write: 5 or 6 parts, and whole records of 3 or 4 items");
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
            room += g[k].size[i] * (PyList_GET_SIZE(records) / stride);
        }
        g[k].first = total;
        g[k].count = PyList_GET_SIZE(records) / stride;
        total += g[k].count;
        room += stride * INT_ROOM * g[k].count; /* t, n, seq (, enqueued) */
    }
    if ((lines = PyMem_Calloc((size_t)total + 1, sizeof *lines)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < ngroups; k++) {
        if (g[k].literal != NULL)
            continue;
        PyObject **items = PySequence_Fast_ITEMS(PyTuple_GET_ITEM(PyList_GET_ITEM(groups, k), 1));
        Py_ssize_t stride = g[k].nparts - 2;
        for (Py_ssize_t i = 0; i < g[k].count; i++) {
            PyObject **record = items + i * stride;
            struct line *line = &lines[g[k].first + i];
            if (!PyBytes_Check(record[2])) {
                PyErr_SetString(PyExc_TypeError, "write: a record's third item must be bytes");
                goto done;
            }
            if (as_int(record[0], &line->t) || as_int(record[1], &line->seq)
                || (stride == 4 && as_int(record[3], &line->enqueued)))
                goto done;
            line->id = plain_id((const unsigned char *)PyBytes_AS_STRING(record[2]), PyBytes_GET_SIZE(record[2]));
            if (line->id == Py_None) {
                Py_DECREF(Py_None);
                line->id = PyObject_CallOneArg(read_id, record[2]);
            }
            if (line->id == NULL)
                goto done;
            if (!PyBytes_Check(line->id)) {
                PyErr_SetString(PyExc_TypeError, "write: read_id must return bytes");
                goto done;
            }
            room += PyBytes_GET_SIZE(line->id);
        }
    }
    if ((buffer = PyMem_RawMalloc((size_t)room + 1)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    char *out = buffer;
    for (Py_ssize_t k = 0; k < ngroups; k++) {
        const struct group *gk = &g[k];
        if (gk->literal != NULL)
            out = put(out, gk->literal, gk->literal_size);
        for (Py_ssize_t i = 0; i < gk->count; i++) {
            const struct line *line = &lines[gk->first + i];
            out = put(out, gk->part[0], gk->size[0]);
            out = put_int(out, line->t / 1000);
            out = put(out, gk->part[1], gk->size[1]);
            out = put_int(out, gk->n + 1 + i);
            out = put(out, gk->part[2], gk->size[2]);
            out = put_int(out, line->seq);
            out = put(out, gk->part[3], gk->size[3]);
            out = put(out, PyBytes_AS_STRING(line->id), PyBytes_GET_SIZE(line->id));
            out = put(out, gk->part[4], gk->size[4]);
            if (gk->nparts == 6) {
                out = put_int(out, line->enqueued);
                out = put(out, gk->part[5], gk->size[5]);
            }
        }
    }
    Py_ssize_t size = out - buffer;
    while (done < size) {
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
    if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
    } else
        result = PyLong_FromSsize_t(done);
done:
    if (lines != NULL)
        for (Py_ssize_t i = 0; i < total; i++)
            Py_XDECREF(lines[i].id);
    PyMem_Free(lines);
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
    return PyModule_Create(&module);
}
