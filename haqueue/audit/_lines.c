/* The audit log's per-record work (lines.py): message ids read from the encoded messages, and a
 * batch of records written out as JSON lines in one pass.
 *
 * In CPython a line costs about 0.6 us (three integers to text and a template filled in) and an id
 * 0.45 us; at three lines per message that is a quarter of what the broker spends on a message.
 * Here both cost a fraction of that. Only the usual message layout is read here, with every
 * offset checked against the length; the caller reads any other in Python (message_id.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

PyDoc_STRVAR(message_ids_doc,
"message_ids(records, stride) -> list\n\n"
"records is flat: stride items per record, its message bytes third. For each record, the message's\n"
"properties.message-id as JSON text (bytes) if the message has the usual layout (a list8 header\n"
"section or none, then a list8 properties section whose first field is a str8 of printable ASCII\n"
"without quote or backslash); None otherwise.");

static PyObject *plain_id(const unsigned char *d, Py_ssize_t len)
{
    Py_ssize_t pos = 0;
    if (len >= 5 && d[0] == 0x00 && d[1] == 0x53 && d[2] == 0x70 && d[3] == 0xC0)
        pos = 5 + d[4];
    if (pos + 8 > len || d[pos] != 0x00 || d[pos + 1] != 0x53 || d[pos + 2] != 0x73 || d[pos + 3] != 0xC0
        || d[pos + 5] == 0 || d[pos + 6] != 0xA1)
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

/* Checks a flat record list and its stride; the number of records, or -1 with an exception set. */
static Py_ssize_t records_of(const char *function, PyObject *records, Py_ssize_t stride)
{
    if (stride < 3 || PyList_GET_SIZE(records) % stride) {
        PyErr_Format(PyExc_ValueError, "%s: records must hold whole records of stride >= 3", function);
        return -1;
    }
    return PyList_GET_SIZE(records) / stride;
}

static PyObject *message_ids(PyObject *self, PyObject *args)
{
    PyObject *records;
    Py_ssize_t stride;
    if (!PyArg_ParseTuple(args, "O!n:message_ids", &PyList_Type, &records, &stride))
        return NULL;
    Py_ssize_t count = records_of("message_ids", records, stride);
    if (count < 0)
        return NULL;
    PyObject *result = PyList_New(count);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *data = PyList_GET_ITEM(records, i * stride + 2), *text;
        if (!PyBytes_Check(data)) {
            Py_DECREF(result);
            PyErr_SetString(PyExc_TypeError, "message_ids: a record's third item must be bytes");
            return NULL;
        }
        text = plain_id((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
        if (text == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, i, text);
    }
    return result;
}

#define INT_ROOM 21 /* a long long in decimal, with its sign */

/* The summed sizes of n bytes objects, or -1 with an exception set if one is not bytes. */
static Py_ssize_t total_size(PyObject **items, Py_ssize_t n, const char *what)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "format: %s must be bytes", what);
            return -1;
        }
        total += PyBytes_GET_SIZE(items[i]);
    }
    return total;
}

PyDoc_STRVAR(format_doc,
"format(parts, records, ids, n) -> bytes\n\n"
"records is flat: (time_ns, seq, data) per record, or (time_ns, seq, data, enqueued) when parts has\n"
"6 pieces instead of 5. One line per record:\n"
"parts[0] t parts[1] n parts[2] seq parts[3] id parts[4] [enqueued parts[5]]\n"
"with t = time_ns // 1000, n counting up from n + 1, id = ids[i].");

static PyObject *format(PyObject *self, PyObject *args)
{
    PyObject *parts, *records, *ids;
    long long n;
    if (!PyArg_ParseTuple(args, "O!O!O!L:format", &PyTuple_Type, &parts, &PyList_Type, &records,
                          &PyList_Type, &ids, &n))
        return NULL;
    Py_ssize_t nparts = PyTuple_GET_SIZE(parts);
    if (nparts != 5 && nparts != 6) {
        PyErr_SetString(PyExc_ValueError, "format: parts must hold 5 or 6 pieces");
        return NULL;
    }
    Py_ssize_t stride = nparts - 2, count = records_of("format", records, stride);
    if (count < 0)
        return NULL;
    if (PyList_GET_SIZE(ids) != count) {
        PyErr_SetString(PyExc_ValueError, "format: one id per record");
        return NULL;
    }
    Py_ssize_t fixed = total_size(PySequence_Fast_ITEMS(parts), nparts, "parts");
    Py_ssize_t varying = total_size(PySequence_Fast_ITEMS(ids), count, "ids");
    if (fixed < 0 || varying < 0)
        return NULL;
    Py_ssize_t room = (fixed + stride * INT_ROOM) * count + varying; /* t, n, seq (, enqueued) */
    PyObject *result = PyBytes_FromStringAndSize(NULL, room);
    if (result == NULL)
        return NULL;
    char *out = PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject **record = PySequence_Fast_ITEMS(records) + i * stride;
        long long t, seq, enqueued = 0;
        if ((t = PyLong_AsLongLong(record[0])) == -1 && PyErr_Occurred())
            goto fail;
        if ((seq = PyLong_AsLongLong(record[1])) == -1 && PyErr_Occurred())
            goto fail;
        if (stride == 4 && (enqueued = PyLong_AsLongLong(record[3])) == -1 && PyErr_Occurred())
            goto fail;
        out = put_bytes(out, PyTuple_GET_ITEM(parts, 0));
        out = put_int(out, t / 1000);
        out = put_bytes(out, PyTuple_GET_ITEM(parts, 1));
        out = put_int(out, n + 1 + i);
        out = put_bytes(out, PyTuple_GET_ITEM(parts, 2));
        out = put_int(out, seq);
        out = put_bytes(out, PyTuple_GET_ITEM(parts, 3));
        out = put_bytes(out, PyList_GET_ITEM(ids, i));
        out = put_bytes(out, PyTuple_GET_ITEM(parts, 4));
        if (stride == 4) {
            out = put_int(out, enqueued);
            out = put_bytes(out, PyTuple_GET_ITEM(parts, 5));
        }
    }
    if (_PyBytes_Resize(&result, out - PyBytes_AS_STRING(result)) < 0)
        return NULL;
    return result;
fail:
    Py_DECREF(result);
    return NULL;
}

static PyMethodDef methods[] = {
    {"message_ids", message_ids, METH_VARARGS, message_ids_doc},
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
