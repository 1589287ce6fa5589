/* The audit log's per-record work (lines.py): a batch of records written out as JSON lines, with
 * each message's id read from its encoded bytes.
 *
 * In CPython a line costs about 0.6 us (three integers to text and a template filled in) and an id
 * 0.45 us; at three lines per message that is a quarter of what the broker spends on a message.
 * Here both cost a fraction of that. Only the usual encodings are read here, with every offset
 * checked against the length; the caller reads any other in Python (message_id.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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

static char *put_bytes(char *out, PyObject *b)
{
    Py_ssize_t size = PyBytes_GET_SIZE(b);
    memcpy(out, PyBytes_AS_STRING(b), (size_t)size);
    return out + size;
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

PyDoc_STRVAR(format_doc,
"format(parts, records, n, read_id) -> bytes\n\n"
"records is flat: (time_ns, seq, data) per record, or (time_ns, seq, data, enqueued) when parts has\n"
"6 pieces instead of 5. One line per record:\n"
"parts[0] t parts[1] n parts[2] seq parts[3] id parts[4] [enqueued parts[5]]\n"
"with t = time_ns // 1000, n counting up from n + 1, and id the message-id of data as JSON text:\n"
"read here for the usual encodings (a str8 of printable ASCII without quote or backslash, or no id),\n"
"by read_id(data) -> bytes for any other.");

static PyObject *format(PyObject *self, PyObject *args)
{
    PyObject *parts, *records, *read_id;
    long long n;
    if (!PyArg_ParseTuple(args, "O!O!LO:format", &PyTuple_Type, &parts, &PyList_Type, &records, &n, &read_id))
        return NULL;
    Py_ssize_t nparts = PyTuple_GET_SIZE(parts), stride = nparts - 2;
    if ((nparts != 5 && nparts != 6) || PyList_GET_SIZE(records) % stride) {
        PyErr_SetString(PyExc_ValueError, "format: 5 or 6 parts, and whole records of 3 or 4 items");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(records) / stride, room = 0;
    for (Py_ssize_t i = 0; i < nparts; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(parts, i))) {
            PyErr_SetString(PyExc_TypeError, "format: parts must be bytes");
            return NULL;
        }
        room += PyBytes_GET_SIZE(PyTuple_GET_ITEM(parts, i));
    }
    room = (room + stride * INT_ROOM) * count; /* and the ids: t, n, seq (, enqueued) are integers */
    PyObject **ids = PyMem_Calloc((size_t)count + 1, sizeof(PyObject *)), *result = NULL;
    if (ids == NULL)
        return PyErr_NoMemory();
    PyObject **items = PySequence_Fast_ITEMS(records);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *data = items[i * stride + 2];
        if (!PyBytes_Check(data)) {
            PyErr_SetString(PyExc_TypeError, "format: a record's third item must be bytes");
            goto done;
        }
        ids[i] = plain_id((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
        if (ids[i] == Py_None) {
            Py_DECREF(Py_None);
            ids[i] = PyObject_CallOneArg(read_id, data);
        }
        if (ids[i] == NULL)
            goto done;
        if (!PyBytes_Check(ids[i])) {
            PyErr_SetString(PyExc_TypeError, "format: read_id must return bytes");
            goto done;
        }
        room += PyBytes_GET_SIZE(ids[i]);
    }
    if ((result = PyBytes_FromStringAndSize(NULL, room)) == NULL)
        goto done;
    char *out = PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject **record = items + i * stride;
        long long t, seq, enqueued = 0;
        if (as_int(record[0], &t) || as_int(record[1], &seq) || (stride == 4 && as_int(record[3], &enqueued))) {
            Py_CLEAR(result);
            goto done;
        }
        out = put_bytes(out, PyTuple_GET_ITEM(parts, 0));
        out = put_int(out, t / 1000);
        out = put_bytes(out, PyTuple_GET_ITEM(parts, 1));
        out = put_int(out, n + 1 + i);
        out = put_bytes(out, PyTuple_GET_ITEM(parts, 2));
        out = put_int(out, seq);
        out = put_bytes(out, PyTuple_GET_ITEM(parts, 3));
        out = put_bytes(out, ids[i]);
        out = put_bytes(out, PyTuple_GET_ITEM(parts, 4));
        if (stride == 4) {
            out = put_int(out, enqueued);
            out = put_bytes(out, PyTuple_GET_ITEM(parts, 5));
        }
    }
    if (_PyBytes_Resize(&result, out - PyBytes_AS_STRING(result)) < 0)
        result = NULL;
done:
    for (Py_ssize_t i = 0; i < count && ids[i] != NULL; i++)
        Py_DECREF(ids[i]);
    PyMem_Free(ids);
    return result;
}

static PyMethodDef methods[] = {
    {"format", format, METH_VARARGS, format_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "haqueue.audit._lines", "The audit log's per-record work, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__lines(void)
{
    return PyModule_Create(&module);
}
