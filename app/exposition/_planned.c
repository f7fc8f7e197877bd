/* The parser's plan applied to a page's bytes (app/exposition/parser.py, class _Plan).

Why C: for a page of a known shape the plan only verifies the lines and converts the values,
and in Python nearly all of that time goes to making a string object of every line and every
value (split, removeprefix, float). Here each line is checked in place and each value
converted from the page's own bytes, through the same CPython function float() uses.

values(page, kinds, patterns, n_samples) -> list[float] | None

    page      the page's bytes, line ends "\n" (the caller replaces "\r\n"); one trailing
              newline is ignored, as the parser does
    kinds     one byte per line of the plan: EXACT, SKIP or SAMPLE
    patterns  one bytes per line (UTF-8): the whole line (EXACT), what it starts with (SKIP:
              the family's base name), or what precedes the value (SAMPLE: identity + " ")
    n_samples how many SAMPLE lines there are

Returns the value of every SAMPLE line in page order, or None as soon as anything differs
from the plan: line count, an exact line, a prefix, or a value that is not plain ASCII
without blanks and underscores or does not convert. None never means an error, only "parse
this page the long way", which decides every doubtful case exactly as before (non-ASCII or
blank characters in a value, which float() of a str may take; a page that is not UTF-8,
whose plan holds its decoded text).
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

enum { EXACT = 0, SKIP = 1, SAMPLE = 2 };

/* float(value) for ASCII text with no blanks or underscores, else -1 with *ok = 0. */
static double
convert(const char *start, const char *end, int *ok)
{
    char buffer[64];
    Py_ssize_t len = end - start;
    *ok = 0;
    if (len <= 0 || len >= (Py_ssize_t)sizeof(buffer)) {
        return -1.0;
    }
    for (const char *c = start; c < end; c++) {
        if (*c <= ' ' || *c > '~' || *c == '_') {  /* blanks, controls, non-ASCII, "_" */
            return -1.0;
        }
    }
    memcpy(buffer, start, len);
    buffer[len] = '\0';
    char *stop = NULL;
    double x = PyOS_string_to_double(buffer, &stop, NULL);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1.0;
    }
    if (stop != buffer + len) {
        return -1.0;
    }
    *ok = 1;
    return x;
}

static PyObject *
values(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "values(page: bytes, kinds: bytes, patterns: tuple, n_samples: int)");
        return NULL;
    }
    const char *page = PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    const char *kinds = PyBytes_AS_STRING(args[1]);
    Py_ssize_t n_lines = PyBytes_GET_SIZE(args[1]);
    PyObject *patterns = args[2];
    Py_ssize_t n_samples = PyLong_AsSsize_t(args[3]);
    if (n_samples == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(patterns) != n_lines || n_lines == 0 || n_samples < 0 || n_samples > n_lines) {
        PyErr_SetString(PyExc_ValueError, "patterns, kinds and n_samples do not describe the same lines");
        return NULL;
    }
    if (size > 0 && page[size - 1] == '\n') {
        size--;
    }
    PyObject *out = PyList_New(n_samples);
    if (out == NULL) {
        return NULL;
    }
    const char *pos = page, *end = page + size;
    Py_ssize_t taken = 0;
    for (Py_ssize_t i = 0; i < n_lines; i++) {
        const char *eol = memchr(pos, '\n', end - pos);
        if (eol == NULL) {
            if (i != n_lines - 1) {
                goto differs;  /* fewer lines */
            }
            eol = end;
        }
        else if (i == n_lines - 1) {
            goto differs;  /* more lines */
        }
        PyObject *pattern = PyTuple_GET_ITEM(patterns, i);
        if (!PyBytes_Check(pattern)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "patterns must be bytes");
            return NULL;
        }
        Py_ssize_t plen = PyBytes_GET_SIZE(pattern), len = eol - pos;
        const char *p = PyBytes_AS_STRING(pattern);
        switch (kinds[i]) {
        case EXACT:
            if (len != plen || memcmp(pos, p, len) != 0) {
                goto differs;
            }
            break;
        case SKIP:
            if (len < plen || memcmp(pos, p, plen) != 0) {
                goto differs;
            }
            break;
        case SAMPLE: {
            if (len <= plen || memcmp(pos, p, plen) != 0 || taken >= n_samples) {
                goto differs;
            }
            int ok;
            double x = convert(pos + plen, eol, &ok);
            if (!ok) {
                goto differs;
            }
            PyObject *value = PyFloat_FromDouble(x);
            if (value == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(out, taken, value);
            taken++;
            break;
        }
        default:
            Py_DECREF(out);
            PyErr_SetString(PyExc_ValueError, "unknown line kind");
            return NULL;
        }
        pos = eol + 1;
    }
    if (taken != n_samples) {
        goto differs;
    }
    return out;
differs:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"values", (PyCFunction)(void (*)(void))values, METH_FASTCALL,
     "values(page, kinds, patterns, n_samples): the plan's sample values from the page's bytes, "
     "or None when the page differs from the plan."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_planned", "The parser's plan applied to a page's bytes.", 0, methods,
};

PyMODINIT_FUNC
PyInit__planned(void)
{
    return PyModule_Create(&module);
}
