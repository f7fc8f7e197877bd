/* Element-wise checks and the count encoding of the number vectors a scrape carries
(app/vectors.py holds the same functions in Python and says where each is used).

Why C: per histogram series and scrape the ingest path checks its buckets for a decrease
(the adapter), checks every number against the series' previous sample for a counter reset
(the writer's 5-minute level) and encodes the counts as uint32 (the stored row). In Python
each is a loop of one call per number; without the C extensions the whole ingest path takes
1.5-1.8 times the CPU per scrape (bench/ingest.py, docs/benchmarks.md#ingest). Each function
here answers exactly what its Python twin answers; for numbers that are not all floats it
compares through Python's own comparison (all_le, any_decrease) or answers None
(encode_counts: the caller takes the Python path).
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

/* Python's comparison of two items, held while it may run code that changes a list. */
static int
compare_held(PyObject *left, PyObject *right, int op)
{
    Py_INCREF(left);
    Py_INCREF(right);
    int result = PyObject_RichCompareBool(left, right, op);
    Py_DECREF(left);
    Py_DECREF(right);
    return result;
}

/* a[i] <= b[i] for every i below the shorter length: all(map(operator.le, a, b)). */
static PyObject *
all_le(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "all_le(a, b) takes two sequences");
        return NULL;
    }
    PyObject *a = PySequence_Fast(args[0], "all_le: a must be a sequence");
    if (a == NULL) {
        return NULL;
    }
    PyObject *b = PySequence_Fast(args[1], "all_le: b must be a sequence");
    if (b == NULL) {
        Py_DECREF(a);
        return NULL;
    }
    Py_ssize_t n = Py_MIN(PySequence_Fast_GET_SIZE(a), PySequence_Fast_GET_SIZE(b));
    PyObject **x = PySequence_Fast_ITEMS(a), **y = PySequence_Fast_ITEMS(b);
    int result = 1;
    for (Py_ssize_t i = 0; i < n && result == 1; i++) {
        if (PyFloat_CheckExact(x[i]) && PyFloat_CheckExact(y[i])) {
            result = PyFloat_AS_DOUBLE(x[i]) <= PyFloat_AS_DOUBLE(y[i]);
        }
        else {
            result = compare_held(x[i], y[i], Py_LE);
            n = Py_MIN(PySequence_Fast_GET_SIZE(a), PySequence_Fast_GET_SIZE(b));
            x = PySequence_Fast_ITEMS(a);
            y = PySequence_Fast_ITEMS(b);
        }
    }
    Py_DECREF(a);
    Py_DECREF(b);
    if (result < 0) {
        return NULL;
    }
    return PyBool_FromLong(result);
}

/* c[i] > c[i + 1] for some i: any(map(operator.gt, c, c[1:])). */
static PyObject *
any_decrease(PyObject *module, PyObject *c)
{
    PyObject *seq = PySequence_Fast(c, "any_decrease takes a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **x = PySequence_Fast_ITEMS(seq);
    int result = 0;
    for (Py_ssize_t i = 0; i + 1 < n && result == 0; i++) {
        if (PyFloat_CheckExact(x[i]) && PyFloat_CheckExact(x[i + 1])) {
            result = PyFloat_AS_DOUBLE(x[i]) > PyFloat_AS_DOUBLE(x[i + 1]);
        }
        else {
            result = compare_held(x[i], x[i + 1], Py_GT);
            n = PySequence_Fast_GET_SIZE(seq);
            x = PySequence_Fast_ITEMS(seq);
        }
    }
    Py_DECREF(seq);
    if (result < 0) {
        return NULL;
    }
    return PyBool_FromLong(result);
}

/* app.store.encoding.encode_counts for a sequence of floats: b"I" + little-endian uint32
   when every count is whole and in [0, 2**32), else b"d" + little-endian float64; None
   when some count is not a float. */
static PyObject *
encode_counts(PyObject *module, PyObject *counts)
{
    PyObject *seq = PySequence_Fast(counts, "encode_counts takes a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **x = PySequence_Fast_ITEMS(seq);
    int small_whole = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyFloat_CheckExact(x[i])) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        double v = PyFloat_AS_DOUBLE(x[i]);
        /* float.is_integer (finite, no fraction) and what struct's "I" takes */
        if (!(isfinite(v) && floor(v) == v && v > -1.0 && v < 4294967296.0)) {
            small_whole = 0;
        }
    }
    Py_ssize_t width = small_whole ? 4 : 8;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 1 + n * width);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    *p++ = small_whole ? 'I' : 'd';
    for (Py_ssize_t i = 0; i < n; i++, p += width) {
        double v = PyFloat_AS_DOUBLE(x[i]);
        if (small_whole) {
            uint32_t u = (uint32_t)v;
            p[0] = (unsigned char)(u & 0xff);
            p[1] = (unsigned char)((u >> 8) & 0xff);
            p[2] = (unsigned char)((u >> 16) & 0xff);
            p[3] = (unsigned char)((u >> 24) & 0xff);
        }
        else if (PyFloat_Pack8(v, (char *)p, 1) < 0) {
            Py_DECREF(out);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"all_le", (PyCFunction)(void (*)(void))all_le, METH_FASTCALL,
     "all_le(a, b): a[i] <= b[i] for every i below the shorter length."},
    {"any_decrease", (PyCFunction)any_decrease, METH_O, "any_decrease(c): c[i] > c[i + 1] for some i."},
    {"encode_counts", (PyCFunction)encode_counts, METH_O,
     "encode_counts(counts): the stored encoding of float counts (uint32 or float64), or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_vectors", "Element-wise checks and the count encoding of number vectors.", 0,
    methods,
};

PyMODINIT_FUNC
PyInit__vectors(void)
{
    return PyModule_Create(&module);
}
