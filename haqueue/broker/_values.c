/* AMQP values of the brokers' control traffic through proton's own codec, called from C (amqp_values.py).
 *
 * The HA wiring snapshot, its events and reports, and the properties of every link and connection are
 * encoded and decoded with proton's pn_data_t. Its Python wrapper walks a value one call at a time: at
 * 10,000 queues a new primary spent 0.7 s encoding the snapshot for one backup and each backup 0.25 s
 * decoding it, on the failover's critical path. This module walks the same pn_data_t from C, with the
 * functions of the already loaded cproton_ffi library found with dlsym (as _pn.c), so the bytes are
 * proton's exactly. It handles the types the brokers put themselves (null, bool, int as long, float as
 * double, str as string, bytes as binary, proton's symbol, ulong, uint and int32, dict as map, list and
 * tuple as list); for any other it returns UNSUPPORTED and the caller uses proton's Python codec. Binary is
 * read as bytes (proton's Python codec gives a memoryview of its buffer: equal, and bytes outlive the data).
 *
 *   bind(path, unsupported, symbol, ulong, uint, int32)
 *   encode_body(value) -> bytes | UNSUPPORTED     a message whose only section is the amqp-value `value`,
 *                                                  byte for byte as proton's Message(body=value).encode()
 *   decode_body(data) -> value | UNSUPPORTED       the amqp-value of a message encoded so
 *   read(pn_data address) -> value | None | UNSUPPORTED   the data's first value (None if it has none)
 *   write(pn_data address, value) -> bool          value appended; False (nothing written) if unsupported
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_proton_lib.h"
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static void *(*data_new)(size_t);
static void (*data_free)(void *);
static void (*data_rewind)(void *);
static bool (*data_next)(void *);
static int (*data_type)(void *);
static bool (*data_enter)(void *);
static bool (*data_exit)(void *);
static size_t (*data_get_map)(void *);
static size_t (*data_get_list)(void *);
static bool (*data_get_bool)(void *);
static int64_t (*data_get_long)(void *);
static uint64_t (*data_get_ulong)(void *);
static uint32_t (*data_get_uint)(void *);
static int32_t (*data_get_int)(void *);
static double (*data_get_double)(void *);
static pn_bytes (*data_get_string)(void *);
static pn_bytes (*data_get_binary)(void *);
static pn_bytes (*data_get_symbol)(void *);
static int (*data_put_map)(void *);
static int (*data_put_list)(void *);
static int (*data_put_null)(void *);
static int (*data_put_bool)(void *, bool);
static int (*data_put_long)(void *, int64_t);
static int (*data_put_ulong)(void *, uint64_t);
static int (*data_put_uint)(void *, uint32_t);
static int (*data_put_int)(void *, int32_t);
static int (*data_put_double)(void *, double);
static int (*data_put_string)(void *, pn_bytes);
static int (*data_put_binary)(void *, pn_bytes);
static int (*data_put_symbol)(void *, pn_bytes);
static ssize_t (*data_encoded_size)(void *);
static ssize_t (*data_encode)(void *, char *, size_t);
static ssize_t (*data_decode)(void *, const char *, size_t);
static int (*data_append)(void *, void *);

static PyObject *UNSUPPORTED, *SYMBOL, *ULONG, *UINT, *INT32;

/* pn_type_t */
enum { NUL = 1, BOOL = 2, UINT_T = 7, INT_T = 8, ULONG_T = 10, LONG = 11, DOUBLE = 14, BINARY = 19, STRING = 20,
       SYMBOL_T = 21, LIST = 24, MAP = 25 };

/* The sections proton's Message.encode() writes before the body of a message that has a body alone: an empty
 * header and an empty properties, then the amqp-value descriptor. */
static const char PREFIX[] = {0x00, 0x53, 0x70, 0x45, 0x00, 0x53, 0x73, 0x45, 0x00, 0x53, 0x77};

static PyObject *bind_library(PyObject *self, PyObject *args)
{
    const char *path;
    PyObject *unsupported, *symbol, *ulong, *uint, *int32;
    if (!PyArg_ParseTuple(args, "sOOOOO", &path, &unsupported, &symbol, &ulong, &uint, &int32))
        return NULL;
    void *lib = proton_library(path);
    if (lib == NULL)
        return NULL;
    FIND(data_new, "pn_data");
    FIND(data_free, "pn_data_free");
    FIND(data_rewind, "pn_data_rewind");
    FIND(data_next, "pn_data_next");
    FIND(data_type, "pn_data_type");
    FIND(data_enter, "pn_data_enter");
    FIND(data_exit, "pn_data_exit");
    FIND(data_get_map, "pn_data_get_map");
    FIND(data_get_list, "pn_data_get_list");
    FIND(data_get_bool, "pn_data_get_bool");
    FIND(data_get_long, "pn_data_get_long");
    FIND(data_get_ulong, "pn_data_get_ulong");
    FIND(data_get_uint, "pn_data_get_uint");
    FIND(data_get_int, "pn_data_get_int");
    FIND(data_get_double, "pn_data_get_double");
    FIND(data_get_string, "pn_data_get_string");
    FIND(data_get_binary, "pn_data_get_binary");
    FIND(data_get_symbol, "pn_data_get_symbol");
    FIND(data_put_map, "pn_data_put_map");
    FIND(data_put_list, "pn_data_put_list");
    FIND(data_put_null, "pn_data_put_null");
    FIND(data_put_bool, "pn_data_put_bool");
    FIND(data_put_long, "pn_data_put_long");
    FIND(data_put_ulong, "pn_data_put_ulong");
    FIND(data_put_uint, "pn_data_put_uint");
    FIND(data_put_int, "pn_data_put_int");
    FIND(data_put_double, "pn_data_put_double");
    FIND(data_put_string, "pn_data_put_string");
    FIND(data_put_binary, "pn_data_put_binary");
    FIND(data_put_symbol, "pn_data_put_symbol");
    FIND(data_encoded_size, "pn_data_encoded_size");
    FIND(data_encode, "pn_data_encode");
    FIND(data_decode, "pn_data_decode");
    FIND(data_append, "pn_data_append");
    PyObject *kept[] = {unsupported, symbol, ulong, uint, int32};
    for (int i = 0; i < 5; i++)
        Py_INCREF(kept[i]);
    UNSUPPORTED = unsupported, SYMBOL = symbol, ULONG = ulong, UINT = uint, INT32 = int32;
    Py_RETURN_NONE;
}

static PyObject *unsupported(void)
{
    Py_INCREF(UNSUPPORTED);
    return UNSUPPORTED;
}

/* A typed integer (proton's ulong, uint, int32: int subclasses) from a C integer. */
static PyObject *typed(PyObject *type, PyObject *number)
{
    if (number == NULL)
        return NULL;
    PyObject *value = PyObject_CallOneArg(type, number);
    Py_DECREF(number);
    return value;
}

static PyObject *get(void *d);

/* The value at the data's current node; UNSUPPORTED for a type this module leaves, or for what it cannot
 * convert (bad UTF-8): proton's codec then says what it says of it. */
static PyObject *value_at(void *d)
{
    PyObject *value = get(d);
    if (value == NULL) {
        PyErr_Clear();
        return unsupported();
    }
    return value;
}

static PyObject *get(void *d)
{
    pn_bytes b;
    switch (data_type(d)) {
    case NUL:
        Py_RETURN_NONE;
    case BOOL:
        return PyBool_FromLong(data_get_bool(d));
    case LONG:
        return PyLong_FromLongLong(data_get_long(d));
    case ULONG_T:
        return typed(ULONG, PyLong_FromUnsignedLongLong(data_get_ulong(d)));
    case UINT_T:
        return typed(UINT, PyLong_FromUnsignedLong(data_get_uint(d)));
    case INT_T:
        return typed(INT32, PyLong_FromLong(data_get_int(d)));
    case DOUBLE:
        return PyFloat_FromDouble(data_get_double(d));
    case STRING:
        b = data_get_string(d);
        return PyUnicode_DecodeUTF8(b.start, (Py_ssize_t)b.size, NULL);
    case SYMBOL_T:
        b = data_get_symbol(d);
        return typed(SYMBOL, PyUnicode_DecodeASCII(b.start, (Py_ssize_t)b.size, NULL));
    case BINARY:
        b = data_get_binary(d);
        return PyBytes_FromStringAndSize(b.start, (Py_ssize_t)b.size);
    case LIST: {
        size_t n = data_get_list(d);
        PyObject *list = PyList_New((Py_ssize_t)n);
        if (list == NULL)
            return NULL;
        data_enter(d);
        for (size_t i = 0; i < n; i++) {
            PyObject *item = data_next(d) ? get(d) : unsupported();
            if (item == NULL || item == UNSUPPORTED) {
                Py_DECREF(list);
                return item;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
        }
        data_exit(d);
        return list;
    }
    case MAP: {
        size_t n = data_get_map(d);
        PyObject *dict = PyDict_New();
        if (dict == NULL)
            return NULL;
        data_enter(d);
        for (size_t i = 0; i < n; i += 2) {
            PyObject *key = data_next(d) ? get(d) : unsupported();
            if (key == NULL || key == UNSUPPORTED) {
                Py_DECREF(dict);
                return key;
            }
            PyObject *value = i + 1 == n ? (Py_INCREF(Py_None), Py_None) /* a key without a value, as proton reads it */
                              : data_next(d) ? get(d) : unsupported();
            if (value == NULL || value == UNSUPPORTED) {
                Py_DECREF(key);
                Py_DECREF(dict);
                return value;
            }
            int failed = PyDict_SetItem(dict, key, value); /* fails on an unhashable key, as proton's does */
            Py_DECREF(key);
            Py_DECREF(value);
            if (failed) {
                Py_DECREF(dict);
                return NULL;
            }
        }
        data_exit(d);
        return dict;
    }
    default:
        return unsupported();
    }
}

static pn_bytes text(PyObject *o, bool *ok)
{
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    *ok = s != NULL;
    if (s == NULL)
        PyErr_Clear(); /* a lone surrogate: proton's codec says what it says of it */
    return (pn_bytes){(size_t)n, s};
}

/* Put `o` at the data's current position: true, or false if it holds a type this module leaves (the data is
 * then partly written: callers write into a data of their own). */
static bool put(void *d, PyObject *o)
{
    bool ok = true;
    PyTypeObject *type = Py_TYPE(o);
    if (o == Py_None)
        data_put_null(d);
    else if (type == &PyBool_Type)
        data_put_bool(d, o == Py_True);
    else if (type == &PyLong_Type) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow)
            return false;
        data_put_long(d, v);
    } else if (type == &PyFloat_Type)
        data_put_double(d, PyFloat_AS_DOUBLE(o));
    else if (type == &PyUnicode_Type) {
        pn_bytes b = text(o, &ok);
        if (ok)
            data_put_string(d, b);
    } else if ((PyObject *)type == SYMBOL) {
        pn_bytes b = text(o, &ok);
        if (ok)
            data_put_symbol(d, b);
    } else if (type == &PyBytes_Type)
        data_put_binary(d, (pn_bytes){(size_t)PyBytes_GET_SIZE(o), PyBytes_AS_STRING(o)});
    else if ((PyObject *)type == INT32) {
        long v = PyLong_AsLong(o);
        if ((v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX) {
            PyErr_Clear();
            return false;
        }
        data_put_int(d, (int32_t)v);
    } else if ((PyObject *)type == ULONG || (PyObject *)type == UINT) {
        unsigned long long v = PyLong_AsUnsignedLongLong(o);
        if (PyErr_Occurred() || ((PyObject *)type == UINT && v > UINT32_MAX)) {
            PyErr_Clear();
            return false;
        }
        if ((PyObject *)type == ULONG)
            data_put_ulong(d, v);
        else
            data_put_uint(d, (uint32_t)v);
    } else if (type == &PyDict_Type) {
        Py_ssize_t at = 0;
        PyObject *key, *value;
        data_put_map(d);
        data_enter(d);
        while (ok && PyDict_Next(o, &at, &key, &value))
            ok = put(d, key) && put(d, value);
        data_exit(d);
    } else if (type == &PyList_Type || type == &PyTuple_Type) {
        PyObject *items = PySequence_Fast(o, "");
        if (items == NULL) {
            PyErr_Clear();
            return false;
        }
        data_put_list(d);
        data_enter(d);
        for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(items); i++)
            ok = put(d, PySequence_Fast_GET_ITEM(items, i));
        data_exit(d);
        Py_DECREF(items);
    } else
        return false;
    return ok;
}

/* A data of its own holding `o`, or NULL (UNSUPPORTED: *supported false; else an error set). */
static void *filled(PyObject *o, bool *supported)
{
    void *d = data_new(16);
    if (d == NULL) {
        *supported = true; /* the error is the memory, not the value */
        PyErr_NoMemory();
        return NULL;
    }
    *supported = put(d, o);
    if (!*supported) {
        data_free(d);
        return NULL;
    }
    return d;
}

static PyObject *encode_body(PyObject *self, PyObject *value)
{
    if (value == Py_None)
        return unsupported(); /* proton writes no body section at all */
    bool supported;
    void *d = filled(value, &supported);
    if (d == NULL)
        return supported ? NULL : unsupported();
    ssize_t size = data_encoded_size(d);
    PyObject *out = size < 0 ? NULL : PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(sizeof PREFIX + (size_t)size));
    if (out != NULL) {
        char *at = PyBytes_AS_STRING(out);
        memcpy(at, PREFIX, sizeof PREFIX);
        if (data_encode(d, at + sizeof PREFIX, (size_t)size) != size)
            Py_CLEAR(out);
    }
    data_free(d);
    return out != NULL || PyErr_Occurred() ? out : unsupported();
}

static PyObject *decode_body(PyObject *self, PyObject *data)
{
    char *bytes;
    Py_ssize_t length;
    if (PyBytes_AsStringAndSize(data, &bytes, &length) < 0)
        return NULL;
    if ((size_t)length <= sizeof PREFIX || memcmp(bytes, PREFIX, sizeof PREFIX) != 0)
        return unsupported(); /* other sections than proton's Message(body=...) writes */
    void *d = data_new(16);
    if (d == NULL)
        return PyErr_NoMemory();
    size_t rest = (size_t)length - sizeof PREFIX;
    PyObject *value;
    if (data_decode(d, bytes + sizeof PREFIX, rest) != (ssize_t)rest)
        value = unsupported();
    else {
        data_rewind(d);
        value = data_next(d) ? value_at(d) : unsupported();
    }
    data_free(d);
    return value;
}

static PyObject *read_data(PyObject *self, PyObject *address)
{
    void *d = PyLong_AsVoidPtr(address);
    if (d == NULL)
        return PyErr_Occurred() ? NULL : (Py_INCREF(Py_None), Py_None);
    data_rewind(d);
    if (!data_next(d))
        Py_RETURN_NONE;
    return value_at(d);
}

static PyObject *write_data(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "write(data, value) takes 2 arguments");
    void *target = PyLong_AsVoidPtr(args[0]);
    if (target == NULL)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "write: no data");
    bool supported;
    void *d = filled(args[1], &supported);
    if (d == NULL)
        return supported ? NULL : (Py_INCREF(Py_False), Py_False);
    int failed = data_append(target, d);
    data_free(d);
    if (failed)
        return PyErr_Format(PyExc_RuntimeError, "proton could not append a value (%d)", failed);
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"bind", bind_library, METH_VARARGS,
     "bind(path, unsupported, symbol, ulong, uint, int32): find proton's codec in the loaded library"},
    {"encode_body", encode_body, METH_O, "encode_body(value) -> a message of this amqp-value, or UNSUPPORTED"},
    {"decode_body", decode_body, METH_O, "decode_body(data) -> the message's amqp-value, or UNSUPPORTED"},
    {"read", read_data, METH_O, "read(data) -> its first value, None if none, or UNSUPPORTED"},
    {"write", (PyCFunction)(void (*)(void))write_data, METH_FASTCALL,
     "write(data, value) -> True once appended; False, nothing written, if unsupported"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_values", NULL, -1, methods};

PyMODINIT_FUNC PyInit__values(void)
{
    return PyModule_Create(&module);
}
