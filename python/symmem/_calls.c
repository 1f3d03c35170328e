/* symmem._calls: the per-call library functions (collectives, barriers,
 * signals, the pointer lookup) as METH_FASTCALL functions, for the loops
 * that call them once per step.
 *
 * The module neither links libsymmem nor CUDA: symmem._lib loads the
 * library with ctypes as always and hands bind() the addresses of the
 * functions below, so this module calls the very library the package
 * loaded. Each function takes ints (addresses as ints, None for a NULL
 * pointer), releases the GIL around the library call (a host-backend call
 * waits for its peers), and returns the library's result code, which the
 * Python side turns into an exception as it does for ctypes' calls. Nothing
 * here keeps state besides the bound addresses; an unbound call raises.
 *
 * Built with the package where a C compiler and Python's headers are found
 * (Makefile, buildsys/symmem_build.py); symmem._lib falls back to ctypes
 * where it is missing or SYMMEM_PYTHON_EXTENSION is off. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

typedef int (*collective_fn)(void *, int, int, int, size_t, void *, int, int, void *);
typedef int (*barrier_fn)(void *, int, int64_t, void *);
typedef int (*put_signal_fn)(void *, int, int, void *);
typedef int (*wait_signal_fn)(void *, int, int, int64_t, void *);
/* symmem_pointer_get_info: only its result is used; the info is a scratch
 * struct at least as large as symmem_pointer_info (include/symmem.h). */
typedef int (*pointer_info_fn)(const void *, void *);
typedef int (*all_to_all_fn)(void *, int, size_t, void *, void *);
typedef int (*collective_from_fn)(void *, int, int, int, size_t, const void *, void *, int, int, void *);

static collective_fn f_collective;
static barrier_fn f_barrier;
static put_signal_fn f_put_signal;
static wait_signal_fn f_wait_signal;
static pointer_info_fn f_pointer_info;
static all_to_all_fn f_all_to_all;
static collective_from_fn f_collective_from;

/* An address argument: an int, or None for NULL. */
static int arg_ptr(PyObject *o, void **out) {
  if (o == Py_None) {
    *out = NULL;
    return 0;
  }
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "symmem._calls: an address must be an int or None, not %.100s",
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  *out = PyLong_AsVoidPtr(o);
  return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

static int arg_int(PyObject *o, int *out) {
  long v = PyLong_AsLong(o);
  if (v == -1 && PyErr_Occurred())
    return -1;
  if (v < INT32_MIN || v > INT32_MAX) {
    PyErr_Format(PyExc_OverflowError, "symmem._calls: %ld does not fit in a C int", v);
    return -1;
  }
  *out = (int)v;
  return 0;
}

static int arg_i64(PyObject *o, int64_t *out) {
  long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred())
    return -1;
  *out = (int64_t)v;
  return 0;
}

static int arg_size(PyObject *o, size_t *out) {
  size_t v = PyLong_AsSize_t(o);
  if (v == (size_t)-1 && PyErr_Occurred())
    return -1;
  *out = v;
  return 0;
}

static int nargs_are(const char *name, Py_ssize_t got, Py_ssize_t want) {
  if (got == want)
    return 0;
  PyErr_Format(PyExc_TypeError, "symmem._calls.%s takes %zd arguments (%zd given)", name, want, got);
  return -1;
}

static int bound(const void *fn, const char *name) {
  if (fn != NULL)
    return 0;
  PyErr_Format(PyExc_RuntimeError, "symmem._calls.%s: bind() was not called", name);
  return -1;
}

/* bind(collective, barrier, put_signal, wait_signal, pointer_get_info,
 * all_to_all, collective_from): the library's functions by address. */
static PyObject *py_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  void *p[7];
  (void)self;
  if (nargs_are("bind", nargs, 7))
    return NULL;
  for (int i = 0; i < 7; i++) {
    if (arg_ptr(args[i], &p[i]))
      return NULL;
    if (p[i] == NULL) {
      PyErr_Format(PyExc_ValueError, "symmem._calls.bind: address %d is NULL", i);
      return NULL;
    }
  }
  f_collective = (collective_fn)p[0];
  f_barrier = (barrier_fn)p[1];
  f_put_signal = (put_signal_fn)p[2];
  f_wait_signal = (wait_signal_fn)p[3];
  f_pointer_info = (pointer_info_fn)p[4];
  f_all_to_all = (all_to_all_fn)p[5];
  f_collective_from = (collective_from_fn)p[6];
  Py_RETURN_NONE;
}

/* collective(handle, coll, dtype, op, count, out, algo, channel, stream) -> rc */
static PyObject *py_collective(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  void *h, *out, *stream;
  int coll, dtype, op, algo, channel, rc;
  size_t count;
  (void)self;
  if (nargs_are("collective", nargs, 9) || bound((const void *)f_collective, "collective"))
    return NULL;
  if (arg_ptr(args[0], &h) || arg_int(args[1], &coll) || arg_int(args[2], &dtype) || arg_int(args[3], &op) ||
      arg_size(args[4], &count) || arg_ptr(args[5], &out) || arg_int(args[6], &algo) ||
      arg_int(args[7], &channel) || arg_ptr(args[8], &stream))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = f_collective(h, coll, dtype, op, count, out, algo, channel, stream);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

/* collective_from(handle, coll, dtype, op, count, in, out, algo, channel,
 * stream) -> rc */
static PyObject *py_collective_from(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  void *h, *in, *out, *stream;
  int coll, dtype, op, algo, channel, rc;
  size_t count;
  (void)self;
  if (nargs_are("collective_from", nargs, 10) || bound((const void *)f_collective_from, "collective_from"))
    return NULL;
  if (arg_ptr(args[0], &h) || arg_int(args[1], &coll) || arg_int(args[2], &dtype) || arg_int(args[3], &op) ||
      arg_size(args[4], &count) || arg_ptr(args[5], &in) || arg_ptr(args[6], &out) || arg_int(args[7], &algo) ||
      arg_int(args[8], &channel) || arg_ptr(args[9], &stream))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = f_collective_from(h, coll, dtype, op, count, in, out, algo, channel, stream);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

/* barrier(handle, channel, timeout_ms, stream) -> rc */
static PyObject *py_barrier(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  void *h, *stream;
  int channel, rc;
  int64_t timeout;
  (void)self;
  if (nargs_are("barrier", nargs, 4) || bound((const void *)f_barrier, "barrier"))
    return NULL;
  if (arg_ptr(args[0], &h) || arg_int(args[1], &channel) || arg_i64(args[2], &timeout) || arg_ptr(args[3], &stream))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = f_barrier(h, channel, timeout, stream);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

/* put_signal(handle, dst_rank, channel, stream) -> rc */
static PyObject *py_put_signal(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  void *h, *stream;
  int dst, channel, rc;
  (void)self;
  if (nargs_are("put_signal", nargs, 4) || bound((const void *)f_put_signal, "put_signal"))
    return NULL;
  if (arg_ptr(args[0], &h) || arg_int(args[1], &dst) || arg_int(args[2], &channel) || arg_ptr(args[3], &stream))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = f_put_signal(h, dst, channel, stream);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

/* wait_signal(handle, src_rank, channel, timeout_ms, stream) -> rc */
static PyObject *py_wait_signal(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  void *h, *stream;
  int src, channel, rc;
  int64_t timeout;
  (void)self;
  if (nargs_are("wait_signal", nargs, 5) || bound((const void *)f_wait_signal, "wait_signal"))
    return NULL;
  if (arg_ptr(args[0], &h) || arg_int(args[1], &src) || arg_int(args[2], &channel) || arg_i64(args[3], &timeout) ||
      arg_ptr(args[4], &stream))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = f_wait_signal(h, src, channel, timeout, stream);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

/* all_to_all(handle, dtype, count, out, stream) -> rc */
static PyObject *py_all_to_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  void *h, *out, *stream;
  int dtype, rc;
  size_t count;
  (void)self;
  if (nargs_are("all_to_all", nargs, 5) || bound((const void *)f_all_to_all, "all_to_all"))
    return NULL;
  if (arg_ptr(args[0], &h) || arg_int(args[1], &dtype) || arg_size(args[2], &count) || arg_ptr(args[3], &out) ||
      arg_ptr(args[4], &stream))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = f_all_to_all(h, dtype, count, out, stream);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

/* is_symmem(address) -> bool: whether the address lies inside a live
 * libsymmem allocation (symmem_pointer_get_info succeeds). A lookup in the
 * allocator's tables: the GIL stays held. */
static PyObject *py_is_symmem(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  void *p;
  /* struct symmem_pointer_info is 48 bytes on LP64; room to spare. */
  uint64_t info[16];
  (void)self;
  if (nargs_are("is_symmem", nargs, 1) || bound((const void *)f_pointer_info, "is_symmem"))
    return NULL;
  if (arg_ptr(args[0], &p))
    return NULL;
  if (p == NULL)
    Py_RETURN_FALSE;
  return PyBool_FromLong(f_pointer_info(p, info) == 0);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))py_bind, METH_FASTCALL, "bind(7 addresses): the library's functions"},
    {"collective", (PyCFunction)(void (*)(void))py_collective, METH_FASTCALL, "symmem_collective -> rc"},
    {"collective_from", (PyCFunction)(void (*)(void))py_collective_from, METH_FASTCALL,
     "symmem_collective_from -> rc"},
    {"barrier", (PyCFunction)(void (*)(void))py_barrier, METH_FASTCALL, "symmem_barrier -> rc"},
    {"put_signal", (PyCFunction)(void (*)(void))py_put_signal, METH_FASTCALL, "symmem_put_signal -> rc"},
    {"wait_signal", (PyCFunction)(void (*)(void))py_wait_signal, METH_FASTCALL, "symmem_wait_signal -> rc"},
    {"all_to_all", (PyCFunction)(void (*)(void))py_all_to_all, METH_FASTCALL, "symmem_all_to_all -> rc"},
    {"is_symmem", (PyCFunction)(void (*)(void))py_is_symmem, METH_FASTCALL, "symmem_pointer_get_info == 0"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "symmem._calls",
    "libsymmem's per-call functions as METH_FASTCALL functions (see _calls.c)", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__calls(void) { return PyModule_Create(&module); }
