/*
 * mpicoll._native_<mpi>: the MPI library's own collectives called on numpy
 * arrays from C, for the kept plans' hot path (mpicoll/native.py says when).
 *
 * Why a CPython extension and not cffi: a kept call of the library's
 * algorithm is a few checks and one MPI call; through mpi4py the call
 * alone costs ~0.7 us of Python-object work on top of the library's ~1.5 us
 * (parsing [buffer, datatype] specs, the buffer protocol twice), and
 * cffi's ffi.from_buffer() costs about as much. Reading a numpy array's
 * pointer, size and flags through numpy's C API costs nanoseconds
 * (measured at p = 2, MPICH, 8-byte sum: mpi4py 2.24 us, cffi with
 * from_buffer 2.27 us, this 1.55 us).
 *
 * One ``Call`` object per kept plan, made once with everything the call
 * does not take from its arrays (kind, communicator, datatype, op, root,
 * the v-forms' counts and displacements in the datatype's units), in three
 * forms: ``run(sbuf, rbuf)`` makes the blocking call on the given arrays,
 * the GIL released, and returns the MPI error code (0: success; the caller
 * raises); ``start(sbuf, rbuf)`` the I-call and ``init(sbuf, rbuf)`` the
 * MPI-4 persistent call, each returning a ``Req`` (Test/Wait/Start/Free,
 * mpi4py's names) that holds the arrays while the library may use them.
 *
 * Bounds: every count the library will read or write is checked against
 * the arrays' sizes here, in C, whatever Python checked before: this code
 * never lets MPI touch memory outside the arrays it was given. An array that
 * is not a C-contiguous, aligned numpy array (writable where written) is a
 * TypeError/ValueError, never undefined behaviour.
 *
 * A kept all-reduce of a compiled schedule (ring, recursive doubling, ...:
 * mpicoll/program.py, csrc/executor.c) is gated the same way: a Call of
 * kind PROGRAM does the kept call's checks, the one-thread gate and the call
 * number here and then runs the program through the executor's
 * mpicoll_x_run, whose address and kit it is given (``program()``).
 *
 * Handles arrive as Fortran integers (mpi4py's py2f()) and are converted
 * with the standard MPI_*_f2c functions, so one source serves MPICH (int
 * handles) and Open MPI (pointers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_20_API_VERSION
#include <numpy/arrayobject.h>
#include <structmember.h>
#include <mpi.h>

#include "executor.h"
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The collectives, as the kept plans call them (mpicoll/kept.py). */
enum kind {
    K_ALLREDUCE = 0,      /* s or in place (s None), r: count = r's size / datatype size */
    K_BCAST = 1,          /* r only: MPI_BYTE, r's bytes */
    K_REDUCE = 2,         /* root: s or in place, r; others: s, r None */
    K_ALLGATHERV = 3,     /* in place: r holds every block, counts/displs in bytes */
    K_SCATTERV = 4,       /* root: s holds the blocks (in place); others: r receives r's bytes */
    K_GATHERV = 5,        /* root: in place into r; others: s's bytes */
    K_ALLTOALL = 6,       /* s, r: block bytes to and from each rank */
    K_REDUCE_SCATTER = 7, /* s, r: counts in datatype elements */
    K_ALLTOALLV = 8,      /* s, r: send and receive counts/displs in bytes */
    K_PROGRAM = 9,        /* a compiled schedule's blocking run (program(), gated): no MPI call of its own */
    K_COUNT = 10
};

/* csrc/executor.c's mpicoll_x_run: K_PROGRAM calls it by its address (the
 * executor is the cffi module beside this one, with the kernels set in it). */
typedef int (*xrun_fn)(struct mpicoll_xstate *, const int64_t *, int64_t, const int64_t *, char *, char *, char **,
                       int, int, intptr_t, int, int, int64_t *);

/* The executor's probe (MPICOLL_X_PROBE): whether a run of the program may
 * start now - a shared-memory program's window takes it; always, for the
 * others. Asked before a call is numbered. */
static int xrun_ready(xrun_fn f, const int64_t *steps, int64_t nsteps, const int64_t *lists, int op, int dtype,
                      intptr_t handle, int64_t *info) {
    return f(NULL, steps, nsteps, lists, NULL, NULL, NULL, op, dtype, handle, 0, MPICOLL_X_PROBE, info)
           == MPICOLL_X_DONE;
}

/* A blocking run of a program, the GIL released: the executor's status, or
 * MPICOLL_X_EINTR with a signal handler's exception set. A shared-memory
 * step's blocking wait comes back every round (PENDING, executor.h): the
 * signal handlers run then (Ctrl-C while a peer is late), and the run goes
 * on, blocking again, unless one raised (the run is then left where it
 * stopped: the caller gives up its kit). */
static int xrun_blocking(xrun_fn f, struct mpicoll_xstate *state, const int64_t *steps, int64_t nsteps,
                         const int64_t *lists, char *buf, char *src, char **scratch, int op, int dtype, intptr_t handle,
                         int tag, int64_t *info) {
    int rc;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        rc = f(state, steps, nsteps, lists, buf, src, scratch, op, dtype, handle, tag, 1, info);
        Py_END_ALLOW_THREADS
        if (rc != MPICOLL_X_PENDING)
            return rc;
        if (PyErr_CheckSignals() < 0)
            return MPICOLL_X_EINTR;
    }
}

typedef struct {
    PyObject_HEAD
    int kind, root, rank, size;
    MPI_Comm comm;
    MPI_Datatype dt;   /* MPI_BYTE for the byte-wise kinds */
    MPI_Op op;
    int dtsize;        /* MPI_Type_size(dt) */
    int block;         /* K_ALLTOALL's block in bytes */
    int *counts, *displs, *rcounts, *rdispls;  /* NULL where the kind has none */
    Py_ssize_t send_extent, recv_extent;        /* bytes the v-forms reach in s and r */
    /* A kept all-reduce's whole short path (gate(), then call the object):
     * the communicator's state and the facts kept.py checks on every call. */
    PyObject *st, *busy, *numbers, *env_data, *env_keys, *env_vals, *engine, *miss;
    int mode; /* kept.py's: 0 no out, 1 out is x, 2 another out */
    int gnd; /* K_GATHERV, K_SCATTERV, K_ALLTOALLV, allgatherv's: the result's shape (the kept call's .shape) */
    npy_intp gdims[NPY_MAXDIMS];
    /* K_ALLGATHERV of kept.KeptAllgatherv (vform): x's block of the result, in its elements (.own) */
    int vform;
    npy_intp vlo, vhi;
    /* K_PROGRAM (program()): one executor.Executable's program and the kit
     * of its blocking runs - what Executable.run passes to mpicoll_x_run -
     * and the two objects that own what the pointers point into. */
    xrun_fn xrun;
    struct mpicoll_xstate *xstate;
    const int64_t *steps, *lists;
    int64_t nsteps, *info;
    char **scratch;
    int xop, xdtype;
    intptr_t xhandle;
    Py_ssize_t nbytes;  /* the size of the buffers the program was recorded for */
    long long tag_span; /* CommState.tag_span: a call's tag is 1 + seq % tag_span */
    PyObject *exe, *kit;
    /* K_PROGRAM's I-calls (program_i()): an XRun over a kit of their own,
     * one run in flight at a time (another I-call meanwhile misses: the
     * Python path gives it a kit of its own), or NULL: I-calls miss. */
    PyObject *ixr;
} Call;

static int int_array(PyObject *seq, int n, int **out, const char *what) {
    *out = NULL;
    if (seq == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "mpicoll native: %s has %zd entries, the communicator %d ranks", what,
                     PySequence_Fast_GET_SIZE(fast), n);
        Py_DECREF(fast);
        return -1;
    }
    int *a = PyMem_Malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    if (a == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) {
            PyMem_Free(a);
            Py_DECREF(fast);
            return -1;
        }
        if (v < 0 || v > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "mpicoll native: %s[%d] = %ld is not an MPI count", what, i, v);
            PyMem_Free(a);
            Py_DECREF(fast);
            return -1;
        }
        a[i] = (int)v;
    }
    Py_DECREF(fast);
    *out = a;
    return 0;
}

/* The furthest byte counts/displs (in units of `unit` bytes) reach. */
static Py_ssize_t extent(const int *counts, const int *displs, int n, int unit) {
    Py_ssize_t end = 0;
    for (int i = 0; i < n; i++) {
        Py_ssize_t e = ((Py_ssize_t)displs[i] + counts[i]) * unit;
        if (counts[i] && e > end)
            end = e;
    }
    return end;
}

static int Call_traverse(Call *self, visitproc visit, void *arg) {
    Py_VISIT(self->st);
    Py_VISIT(self->busy);
    Py_VISIT(self->numbers);
    Py_VISIT(self->env_data);
    Py_VISIT(self->env_keys);
    Py_VISIT(self->env_vals);
    Py_VISIT(self->engine);
    Py_VISIT(self->miss);
    Py_VISIT(self->exe);
    Py_VISIT(self->kit);
    Py_VISIT(self->ixr);
    return 0;
}

static int Call_clear(Call *self) {
    Py_CLEAR(self->st);
    Py_CLEAR(self->busy);
    Py_CLEAR(self->numbers);
    Py_CLEAR(self->env_data);
    Py_CLEAR(self->env_keys);
    Py_CLEAR(self->env_vals);
    Py_CLEAR(self->engine);
    Py_CLEAR(self->miss);
    return 0;
}

/* Call_clear keeps the program (gate() calls it); the collector and the
 * object's end drop both. */
static void program_clear(Call *self) {
    self->xrun = NULL;
    Py_CLEAR(self->exe);
    Py_CLEAR(self->kit);
}

static int Call_clear_all(Call *self) {
    Call_clear(self);
    program_clear(self);
    Py_CLEAR(self->ixr);
    return 0;
}

static void Call_dealloc(Call *self) {
    PyObject_GC_UnTrack(self);
    Call_clear_all(self);
    PyMem_Free(self->counts);
    PyMem_Free(self->displs);
    PyMem_Free(self->rcounts);
    PyMem_Free(self->rdispls);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Call_new_init(Call *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"kind", "comm", "datatype", "op", "root", "block", "counts", "displs", "rcounts",
                            "rdispls", NULL};
    int kind, fcomm, fdt = 0, fop = 0, root = 0, block = 0;
    PyObject *counts = Py_None, *displs = Py_None, *rcounts = Py_None, *rdispls = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ii|iiiiOOOO", names, &kind, &fcomm, &fdt, &fop, &root, &block,
                                     &counts, &displs, &rcounts, &rdispls))
        return -1;
    if (kind < 0 || kind >= K_COUNT) {
        PyErr_Format(PyExc_ValueError, "mpicoll native: unknown kind %d", kind);
        return -1;
    }
    if (self->counts || self->displs || self->rcounts || self->rdispls) {
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: a Call is initialised once");
        return -1;
    }
    self->kind = kind;
    self->comm = MPI_Comm_f2c(fcomm);
    self->dt = fdt ? MPI_Type_f2c(fdt) : MPI_BYTE;
    self->op = fop ? MPI_Op_f2c(fop) : MPI_OP_NULL;
    self->root = root;
    self->block = block;
    if (MPI_Comm_rank(self->comm, &self->rank) != MPI_SUCCESS || MPI_Comm_size(self->comm, &self->size) != MPI_SUCCESS
        || MPI_Type_size(self->dt, &self->dtsize) != MPI_SUCCESS) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: not a valid communicator or datatype");
        return -1;
    }
    if (self->dtsize <= 0 || block < 0 || root < 0 || root >= self->size) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: bad datatype size, block or root");
        return -1;
    }
    int n = self->size;
    if (int_array(counts, n, &self->counts, "counts") || int_array(displs, n, &self->displs, "displs")
        || int_array(rcounts, n, &self->rcounts, "rcounts") || int_array(rdispls, n, &self->rdispls, "rdispls"))
        return -1;
    int needs = kind == K_ALLGATHERV || kind == K_SCATTERV || kind == K_GATHERV || kind == K_ALLTOALLV;
    if (needs && (self->counts == NULL || self->displs == NULL)) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: this kind needs counts and displs");
        return -1;
    }
    if (kind == K_REDUCE_SCATTER && self->counts == NULL) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: reduce_scatter needs counts");
        return -1;
    }
    if (kind == K_ALLTOALLV && (self->rcounts == NULL || self->rdispls == NULL)) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: alltoallv needs rcounts and rdispls");
        return -1;
    }
    if (needs)
        self->send_extent = extent(self->counts, self->displs, n, 1);
    if (kind == K_ALLTOALLV)
        self->recv_extent = extent(self->rcounts, self->rdispls, n, 1);
    return 0;
}

/* obj as a numpy array MPI may read (write: also writable), or NULL with
 * the error set; None gives NULL with no error when allowed. Aligned where
 * the call has a typed datatype (its elements are reduced); the byte-wise
 * calls only copy bytes, which any address serves. */
static PyArrayObject *array_arg(Call *self, PyObject *obj, int write, int allow_none, const char *what) {
    if (obj == Py_None) {
        if (!allow_none)
            PyErr_Format(PyExc_TypeError, "mpicoll native: %s is required", what);
        return NULL;
    }
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "mpicoll native: %s must be a numpy array", what);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    int aligned = self->dt != MPI_BYTE;
    int need = NPY_ARRAY_C_CONTIGUOUS | (aligned ? NPY_ARRAY_ALIGNED : 0) | (write ? NPY_ARRAY_WRITEABLE : 0);
    if ((PyArray_FLAGS(a) & need) != need) {
        PyErr_Format(PyExc_ValueError, "mpicoll native: %s must be a C-contiguous%s%s array", what,
                     aligned ? ", aligned" : "", write ? ", writable" : "");
        return NULL;
    }
    return a;
}

/* The byte ranges of two contiguous arrays meet. */
static int overlaps(PyArrayObject *a, PyArrayObject *b) {
    char *pa = PyArray_DATA(a), *pb = PyArray_DATA(b);
    Py_ssize_t na = PyArray_NBYTES(a), nb = PyArray_NBYTES(b);
    return na && nb && pa < pb + nb && pb < pa + na;
}

static int too_long(Py_ssize_t n) {
    if (n > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "mpicoll native: more than INT_MAX elements in one call");
        return 1;
    }
    return 0;
}

static int bounds_error_(const char *what) {
    PyErr_Format(PyExc_ValueError, "mpicoll native: %s is too small for the call's counts", what);
    return -1;
}

/* The root of a scatterv or gatherv, the one mirrored the other way: ``big``
 * holds every rank's block (scatterv's sbuf, read; gatherv's rbuf, written:
 * ``big_write``) and must reach the counts. Root's own block is ``other``
 * (the opposite direction) when one apart from big is given - the library
 * copies it; it must be the block's size (``exact``) or at least that - and
 * otherwise stays in big (MPI_IN_PLACE, count 0). ``other_bounds`` names
 * other in its size error. -1: a Python error is set, nothing was called. */
static int root_blocks(Call *self, PyObject *big_o, int big_write, const char *big_name, PyObject *other_o,
                       const char *other_name, const char *other_bounds, int exact, void **big, void **own,
                       int *own_count) {
    PyArrayObject *b = array_arg(self, big_o, big_write, 0, big_name);
    if (b == NULL)
        return -1;
    PyArrayObject *o = array_arg(self, other_o, !big_write, 1, other_name);
    if (o == NULL && PyErr_Occurred())
        return -1;
    if (PyArray_NBYTES(b) < self->send_extent)
        return bounds_error_(big_name);
    *big = PyArray_DATA(b);
    *own = MPI_IN_PLACE;
    *own_count = 0;
    if (o != NULL && !overlaps(b, o)) {
        Py_ssize_t nb = PyArray_NBYTES(o), block = self->counts[self->root];
        if (exact ? nb != block : nb < block)
            return bounds_error_(other_bounds);
        *own = PyArray_DATA(o);
        *own_count = (int)block;
    }
    return 0;
}

/* A non-root rank's scatterv receive (written) or gatherv send: the whole
 * array, its pointer and bytes. -1: a Python error is set. */
static int whole(Call *self, PyObject *obj, int write, const char *name, void **p, int *nbytes) {
    PyArrayObject *a = array_arg(self, obj, write, 0, name);
    if (a == NULL)
        return -1;
    Py_ssize_t nb = PyArray_NBYTES(a);
    if (too_long(nb))
        return -1;
    *p = PyArray_DATA(a);
    *nbytes = (int)nb;
    return 0;
}

/* The three forms of one call (MPI's blocking call, its MPI_I... form and
 * its MPI-4 ..._init form take the same arguments, the last two a request
 * after them, the persistent one an info before it). The blocking call
 * releases the GIL; the other two return at once. */
enum form { F_BLOCKING = 0, F_START = 1, F_INIT = 2 };
#if MPI_VERSION >= 4
#define INIT_FORM(P, ...) rc = P(__VA_ARGS__, MPI_INFO_NULL, req)
#else
#define INIT_FORM(P, ...) rc = MPI_ERR_UNSUPPORTED_OPERATION
#endif
#define MPICALL(B, I, P, ...)                   \
    do {                                        \
        if (form == F_BLOCKING) {               \
            Py_BEGIN_ALLOW_THREADS              \
            rc = B(__VA_ARGS__);                \
            Py_END_ALLOW_THREADS                \
        } else if (form == F_START) {           \
            rc = I(__VA_ARGS__, req);           \
        } else {                                \
            INIT_FORM(P, __VA_ARGS__);          \
        }                                       \
    } while (0)

/* Check the arrays against the call and make it in ``form`` (``req``
 * receives the request of the other two). -1: a Python error is set and
 * nothing was called; else 0 and *rcp is MPI's error code. */
static int post(Call *self, PyObject *so, PyObject *ro, int form, MPI_Request *req, int *rcp) {
    PyArrayObject *s = NULL, *r = NULL;
    int rc = MPI_SUCCESS, root_here = self->rank == self->root;
    MPI_Comm comm = self->comm;
    switch (self->kind) {
    case K_ALLREDUCE: {
        if ((r = array_arg(self, ro, 1, 0, "rbuf")) == NULL)
            return -1;
        s = array_arg(self, so, 0, 1, "sbuf");
        if (s == NULL && PyErr_Occurred())
            return -1;
        Py_ssize_t nb = PyArray_NBYTES(r), count = nb / self->dtsize;
        if (nb % self->dtsize || (s != NULL && PyArray_NBYTES(s) != nb))
            return bounds_error_("sbuf or rbuf");
        if (too_long(count))
            return -1;
        const void *sp = s == NULL ? MPI_IN_PLACE : PyArray_DATA(s);
        void *rp = PyArray_DATA(r);
        MPICALL(MPI_Allreduce, MPI_Iallreduce, MPI_Allreduce_init, sp, rp, (int)count, self->dt, self->op,
                comm);
        break;
    }
    case K_BCAST: {
        /* Every rank's buffer is written on non-roots and read on the root:
         * writable everywhere (the kept plan's contract, bcast is in place). */
        if ((r = array_arg(self, ro, 1, 0, "buf")) == NULL)
            return -1;
        Py_ssize_t nb = PyArray_NBYTES(r);
        if (too_long(nb))
            return -1;
        void *rp = PyArray_DATA(r);
        MPICALL(MPI_Bcast, MPI_Ibcast, MPI_Bcast_init, rp, (int)nb, MPI_BYTE, self->root, comm);
        break;
    }
    case K_REDUCE: {
        s = array_arg(self, so, 0, 1, "sbuf");
        if (s == NULL && PyErr_Occurred())
            return -1;
        if (root_here) {
            if ((r = array_arg(self, ro, 1, 0, "rbuf")) == NULL)
                return -1;
        } else if (s == NULL) {
            PyErr_SetString(PyExc_TypeError, "mpicoll native: a non-root rank's reduce needs sbuf");
            return -1;
        }
        PyArrayObject *ref = r != NULL ? r : s;
        Py_ssize_t nb = PyArray_NBYTES(ref), count = nb / self->dtsize;
        if (nb % self->dtsize || (s != NULL && PyArray_NBYTES(s) != nb))
            return bounds_error_("sbuf or rbuf");
        if (too_long(count))
            return -1;
        const void *sp = s == NULL ? MPI_IN_PLACE : PyArray_DATA(s);
        void *rp = r == NULL ? NULL : PyArray_DATA(r);
        MPICALL(MPI_Reduce, MPI_Ireduce, MPI_Reduce_init, sp, rp, (int)count, self->dt, self->op, self->root,
                comm);
        break;
    }
    case K_ALLGATHERV: {
        if ((r = array_arg(self, ro, 1, 0, "rbuf")) == NULL)
            return -1;
        if (PyArray_NBYTES(r) < self->send_extent)
            return bounds_error_("rbuf");
        void *rp = PyArray_DATA(r);
        MPICALL(MPI_Allgatherv, MPI_Iallgatherv, MPI_Allgatherv_init, MPI_IN_PLACE, 0, MPI_BYTE, rp, self->counts,
                self->displs, MPI_BYTE, comm);
        break;
    }
    case K_SCATTERV: {
        if (root_here) {
            void *sp, *own;
            int own_count;
            if (root_blocks(self, so, 0, "sbuf", ro, "rbuf", "rbuf", 0, &sp, &own, &own_count) < 0)
                return -1;
            MPICALL(MPI_Scatterv, MPI_Iscatterv, MPI_Scatterv_init, sp, self->counts, self->displs, MPI_BYTE, own,
                    own_count, MPI_BYTE, self->root, comm);
        } else {
            void *rp;
            int nb;
            if (whole(self, ro, 1, "rbuf", &rp, &nb) < 0)
                return -1;
            MPICALL(MPI_Scatterv, MPI_Iscatterv, MPI_Scatterv_init, NULL, NULL, NULL, MPI_BYTE, rp, nb, MPI_BYTE,
                    self->root, comm);
        }
        break;
    }
    case K_GATHERV: {
        if (root_here) {
            void *rp, *own;
            int own_count;
            if (root_blocks(self, ro, 1, "rbuf", so, "sbuf", "sbuf (root's block)", 1, &rp, &own, &own_count) < 0)
                return -1;
            MPICALL(MPI_Gatherv, MPI_Igatherv, MPI_Gatherv_init, own, own_count, MPI_BYTE, rp, self->counts,
                    self->displs, MPI_BYTE, self->root, comm);
        } else {
            void *sp;
            int nb;
            if (whole(self, so, 0, "sbuf", &sp, &nb) < 0)
                return -1;
            MPICALL(MPI_Gatherv, MPI_Igatherv, MPI_Gatherv_init, sp, nb, MPI_BYTE, NULL, NULL, NULL, MPI_BYTE,
                    self->root, comm);
        }
        break;
    }
    case K_ALLTOALL: {
        if ((s = array_arg(self, so, 0, 0, "sbuf")) == NULL || (r = array_arg(self, ro, 1, 0, "rbuf")) == NULL)
            return -1;
        Py_ssize_t need = (Py_ssize_t)self->block * self->size;
        if (PyArray_NBYTES(s) < need || PyArray_NBYTES(r) < need)
            return bounds_error_("sbuf or rbuf");
        const void *sp = PyArray_DATA(s);
        void *rp = PyArray_DATA(r);
        MPICALL(MPI_Alltoall, MPI_Ialltoall, MPI_Alltoall_init, sp, self->block, MPI_BYTE, rp, self->block, MPI_BYTE,
                comm);
        break;
    }
    case K_REDUCE_SCATTER: {
        if ((s = array_arg(self, so, 0, 0, "sbuf")) == NULL || (r = array_arg(self, ro, 1, 0, "rbuf")) == NULL)
            return -1;
        Py_ssize_t total = 0;
        for (int i = 0; i < self->size; i++)
            total += self->counts[i];
        if (PyArray_NBYTES(s) < total * self->dtsize || PyArray_NBYTES(r) < (Py_ssize_t)self->counts[self->rank]
                                                                                 * self->dtsize)
            return bounds_error_("sbuf or rbuf");
        const void *sp = PyArray_DATA(s);
        void *rp = PyArray_DATA(r);
        MPICALL(MPI_Reduce_scatter, MPI_Ireduce_scatter, MPI_Reduce_scatter_init, sp, rp, self->counts, self->dt,
                self->op, comm);
        break;
    }
    case K_ALLTOALLV: {
        if ((s = array_arg(self, so, 0, 0, "sbuf")) == NULL || (r = array_arg(self, ro, 1, 0, "rbuf")) == NULL)
            return -1;
        if (PyArray_NBYTES(s) < self->send_extent || PyArray_NBYTES(r) < self->recv_extent)
            return bounds_error_("sbuf or rbuf");
        const void *sp = PyArray_DATA(s);
        void *rp = PyArray_DATA(r);
        MPICALL(MPI_Alltoallv, MPI_Ialltoallv, MPI_Alltoallv_init, sp, self->counts, self->displs, MPI_BYTE, rp,
                self->rcounts, self->rdispls, MPI_BYTE, comm);
        break;
    }
    case K_PROGRAM:
        PyErr_SetString(PyExc_TypeError, "mpicoll native: a program's Call runs only gated (program(), gate())");
        return -1;
    default:
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: a Call that was never initialised");
        return -1;
    }
    *rcp = rc;
    return 0;
}

/* run(sbuf, rbuf) -> MPI error code: the blocking call. */
static PyObject *Call_run(Call *self, PyObject *const *args, Py_ssize_t nargs) {
    int rc;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: run(sbuf, rbuf)");
        return NULL;
    }
    if (post(self, args[0], args[1], F_BLOCKING, NULL, &rc) < 0)
        return NULL;
    return PyLong_FromLong(rc);
}


/* ---- requests of the nonblocking and persistent forms ---- */

static PyObject *MPIException; /* mpi4py's MPI.Exception: errors read as mpi4py's own */

static void raise_mpi(int rc) {
    PyObject *e = PyObject_CallFunction(MPIException, "i", rc);
    if (e != NULL) {
        PyErr_SetObject(MPIException, e);
        Py_DECREF(e);
    }
}

/* One MPI request of a Call's I-form or persistent form, with the arrays it
 * reads and writes held while the library may use them. Test()/Wait()/
 * Start()/Free() are mpi4py's names, so the engine and persistent.py drive
 * it as they drive an MPI.Request. A request dropped while the library still
 * works on it keeps its arrays for ever (the library may write them; MPI
 * forbids freeing a pending collective's request). */
typedef struct {
    PyObject_HEAD
    MPI_Request req;
    int active;     /* started, not yet completed */
    int persistent;
    int inside;     /* a thread waits in MPI_Wait with the GIL released */
    PyObject *s, *r;
    /* background progress (bg_*, below): in the C thread's list; completed
     * there, and the MPI error code it met. Read and written under bg_mu
     * while ``bg`` is set: the thread owns ``req`` then. */
    int bg, bg_done, bg_rc;
} Req;

/* A program's run as an MPI request (XRun, below: a persistent request's
 * run, or a gated program Call's I-run): the executor's arguments. */
typedef struct {
    PyObject_HEAD
    xrun_fn xrun;
    struct mpicoll_xstate *state;
    const int64_t *steps, *lists;
    int64_t nsteps, *info;
    char *buf, *src, **scratch;
    int op, dtype, tag, active, inside;
    intptr_t handle;
    long long seq;
    PyObject *owner, *fail;
    /* an I-run's: the arrays buf and src point into (bx NULL in place),
     * held while the run is active - its request holds the XRun */
    PyObject *bo, *bx;
    /* background progress, as Req's: in the C thread's list, the run
     * finished or failed there, and the executor's status it ended with */
    int bg, bg_done, bg_rc;
} XRun;

static PyTypeObject XRunType;

/* ---- background progress of long library requests (a C thread, no GIL) ------
 *
 * The MPI library moves a nonblocking collective only inside MPI calls. A
 * long one started and then overlapped with the caller's computation moved
 * only when the engine's Python progress thread tested it, and that thread
 * needs the GIL: numpy compute lets it run, pure-Python compute barely
 * (the switch interval), and each hand-over costs the caller. Here a plain
 * C thread, started on first use, tests the requests handed to it
 * (``Req.background()``) every BG_POLL_NS (10 us), never touching a Python object:
 * the list holds borrowed pointers, and a Req leaves it (under bg_mu)
 * before anything else uses its MPI request - its Test/Wait, its
 * deallocation. It sleeps on a condition while nothing is pending, and
 * stops (``stop_background()``, engine.py's exit hook) before MPI_Finalize.
 * Needs MPI_THREAD_MULTIPLE (the engine asks before handing requests).
 *
 * A program's run (an XRun, ``XRun.background()``) is advanced the same
 * way: each pass one nonblocking pass of the executor - its messages
 * posted and tested, its reductions and copies done - without the GIL, so
 * that it moves while the caller computes, pure Python included. The
 * thread only records how the run ended (bg_done, bg_rc); the owner's
 * Test/Wait takes it back and settles it (a failure's fail() is Python). */
static pthread_mutex_t bg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bg_cv = PTHREAD_COND_INITIALIZER;
static PyObject **bg_list; /* Req or XRun, borrowed */
static Py_ssize_t bg_n, bg_cap;
static int bg_started, bg_stop;
static pthread_t bg_thread;
static unsigned long long bg_tests; /* MPI_Test calls the thread made (tests read it) */
/* Between passes: short enough that a long message's pipeline (the
 * library's shared-memory cells, rendezvous steps) keeps moving, long
 * enough that the thread takes little of a core from the computation.
 * Measured (make bench-overlap, algorithm mpi, p = 2 on 2 cores, 1 and
 * 4 MiB): 3 us 0-58 %, 5 us 11-60 %, 10 us 25-71 %, 20 us 5-37 %;
 * sched_yield() instead of a sleep 0 % (it takes the core from the
 * computation). */
#define BG_POLL_NS 10000

/* bg_mu taken by a thread that holds the GIL: without blocking while it
 * holds the GIL. The C thread's MPI_Test, under bg_mu, may run Python: a
 * user-defined op (mpi4py's, e.g. mpicoll's NaN-aware max) that the
 * library's progress applies to another request takes the GIL there. Found
 * under Open MPI at p = 3 (tests/test_native_hostile.py): the thread in
 * NBC_Progress waiting for the GIL with bg_mu held, the main thread waiting
 * for bg_mu with the GIL held. Every taker holds bg_mu before the GIL, never
 * the other way round. */
static void bg_lock(void) {
    if (pthread_mutex_trylock(&bg_mu) == 0)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&bg_mu);
    Py_END_ALLOW_THREADS
}

static void *bg_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&bg_mu);
    while (!bg_stop) {
        int pending = 0;
        for (Py_ssize_t i = 0; i < bg_n; i++) {
            if (Py_TYPE(bg_list[i]) == &XRunType) {
                XRun *x = (XRun *)bg_list[i];
                if (x->bg_done)
                    continue;
                int rc = x->xrun(x->state, x->steps, x->nsteps, x->lists, x->buf, x->src, x->scratch, x->op,
                                 x->dtype, x->handle, x->tag, 0, x->info);
                bg_tests++;
                if (rc == MPICOLL_X_PENDING)
                    pending = 1;
                else {
                    x->bg_rc = rc;
                    x->bg_done = 1;
                }
                continue;
            }
            Req *r = (Req *)bg_list[i];
            if (r->bg_done)
                continue;
            int flag = 0, rc = MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE);
            bg_tests++;
            if (rc != MPI_SUCCESS) {
                r->bg_rc = rc;
                r->bg_done = 1;
            } else if (flag)
                r->bg_done = 1;
            else
                pending = 1;
        }
        if (!pending) {
            pthread_cond_wait(&bg_cv, &bg_mu);
            continue;
        }
        pthread_mutex_unlock(&bg_mu);
        struct timespec ts = {0, BG_POLL_NS};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&bg_mu);
    }
    pthread_mutex_unlock(&bg_mu);
    return NULL;
}

/* Take ``r`` out of the thread's list (GIL held): the thread has let go of
 * its MPI request. Returns whether the thread completed it (its error code
 * in *rc). */
static void bg_remove(PyObject *o) { /* (bg_mu held) */
    for (Py_ssize_t i = 0; i < bg_n; i++)
        if (bg_list[i] == o) {
            bg_list[i] = bg_list[--bg_n];
            break;
        }
}

/* Put ``o`` (its bg fields set) in the thread's list, the thread started
 * on first use: whether it is there (not after stop_background(), or out
 * of memory). */
static int bg_add(PyObject *o) {
    bg_lock();
    int ok = !bg_stop;
    if (ok && !bg_started) {
        ok = pthread_create(&bg_thread, NULL, bg_main, NULL) == 0;
        bg_started = ok;
    }
    if (ok && bg_n == bg_cap) {
        Py_ssize_t cap = bg_cap ? 2 * bg_cap : 16;
        PyObject **grown = realloc(bg_list, (size_t)cap * sizeof *grown);
        ok = grown != NULL;
        if (ok) {
            bg_list = grown;
            bg_cap = cap;
        }
    }
    if (ok) {
        bg_list[bg_n++] = o;
        pthread_cond_signal(&bg_cv);
    }
    pthread_mutex_unlock(&bg_mu);
    return ok;
}

static int bg_take(Req *r, int *rc) {
    bg_lock();
    bg_remove((PyObject *)r);
    int done = r->bg_done;
    *rc = r->bg_rc;
    r->bg = r->bg_done = 0;
    r->bg_rc = MPI_SUCCESS;
    pthread_mutex_unlock(&bg_mu);
    return done;
}

/* Whether the thread completed ``r`` (still listed); its code in *rc. */
static int bg_peek(Req *r, int *rc) {
    bg_lock();
    int done = r->bg_done;
    *rc = r->bg_rc;
    pthread_mutex_unlock(&bg_mu);
    return done;
}

/* The same two for a program's run: the thread ended it (its executor
 * status in *rc), or not (taken back: PENDING, the owner runs it on). */
static int xbg_take(XRun *x, int *rc) {
    bg_lock();
    bg_remove((PyObject *)x);
    int done = x->bg_done;
    *rc = done ? x->bg_rc : MPICOLL_X_PENDING;
    x->bg = x->bg_done = 0;
    pthread_mutex_unlock(&bg_mu);
    return done;
}

static int xbg_peek(XRun *x) {
    bg_lock();
    int done = x->bg_done;
    pthread_mutex_unlock(&bg_mu);
    return done;
}

static void Req_dealloc(Req *self) {
    int bgrc;
    if (self->bg && bg_take(self, &bgrc))
        self->active = 0; /* (completed by the thread) */
    if (self->active) {
        /* in the library's hands: s and r stay referenced (leaked on purpose) */
    } else {
        int fin = 0;
        if (self->persistent && self->req != MPI_REQUEST_NULL && MPI_Finalized(&fin) == MPI_SUCCESS && !fin)
            MPI_Request_free(&self->req);
        Py_CLEAR(self->s);
        Py_CLEAR(self->r);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void completed(Req *self) {
    self->active = 0;
    if (!self->persistent) { /* a persistent request keeps its arrays bound for its life */
        Py_CLEAR(self->s);
        Py_CLEAR(self->r);
    }
}

static PyObject *Req_Test(Req *self, PyObject *unused) {
    (void)unused;
    if (!self->active)
        Py_RETURN_TRUE;
    if (self->inside) /* another thread is in Wait(): it completes it */
        Py_RETURN_FALSE;
    if (self->bg) { /* the C thread tests it too: a test of ours, under its lock */
        int rc;
        bg_lock();
        if (!self->bg_done) {
            int flag = 0;
            rc = MPI_Test(&self->req, &flag, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS || flag) {
                self->bg_rc = rc;
                self->bg_done = 1;
            }
        }
        pthread_mutex_unlock(&bg_mu);
        if (!bg_peek(self, &rc))
            Py_RETURN_FALSE;
        bg_take(self, &rc);
        if (rc != MPI_SUCCESS) {
            self->active = 0;
            raise_mpi(rc);
            return NULL;
        }
        completed(self);
        Py_RETURN_TRUE;
    }
    int flag = 0, rc = MPI_Test(&self->req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        raise_mpi(rc);
        return NULL;
    }
    if (!flag)
        Py_RETURN_FALSE;
    completed(self);
    Py_RETURN_TRUE;
}

static PyObject *Req_Wait(Req *self, PyObject *unused) {
    (void)unused;
    if (!self->active)
        Py_RETURN_TRUE;
    if (self->inside) {
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: a request waited for by two threads at once");
        return NULL;
    }
    int rc;
    if (self->bg && bg_take(self, &rc)) { /* completed by the C thread */
        if (rc != MPI_SUCCESS) {
            self->active = 0;
            raise_mpi(rc);
            return NULL;
        }
        completed(self);
        Py_RETURN_TRUE;
    }
    self->inside = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = MPI_Wait(&self->req, MPI_STATUS_IGNORE);
    Py_END_ALLOW_THREADS
    self->inside = 0;
    if (rc != MPI_SUCCESS) {
        raise_mpi(rc);
        return NULL;
    }
    completed(self);
    Py_RETURN_TRUE;
}

/* background() -> bool: hand the started request to the C thread (above),
 * which tests it until it completes; False (nothing done) for a request
 * that is not active, is persistent, or after stop_background(). */
static PyObject *Req_background(Req *self, PyObject *unused) {
    (void)unused;
    if (!self->active || self->persistent || self->inside || self->bg)
        return PyBool_FromLong(self->bg);
    self->bg_done = 0;
    self->bg_rc = MPI_SUCCESS;
    self->bg = 1; /* (before it is listed: the thread reads the fields from then on) */
    if (!bg_add((PyObject *)self))
        self->bg = 0;
    return PyBool_FromLong(self->bg);
}

static PyObject *Req_Start(Req *self, PyObject *unused) {
    (void)unused;
    if (!self->persistent || self->req == MPI_REQUEST_NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: Start() of a request that is not persistent");
        return NULL;
    }
    if (self->active) {
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: Start() of an active request");
        return NULL;
    }
    int rc = MPI_Start(&self->req);
    if (rc != MPI_SUCCESS) {
        raise_mpi(rc);
        return NULL;
    }
    self->active = 1;
    Py_RETURN_NONE;
}

static PyObject *Req_Free(Req *self, PyObject *unused) {
    (void)unused;
    if (self->active) {
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: Free() of an active request (Wait() first)");
        return NULL;
    }
    if (self->req != MPI_REQUEST_NULL) {
        int rc = MPI_Request_free(&self->req);
        if (rc != MPI_SUCCESS) {
            raise_mpi(rc);
            return NULL;
        }
    }
    Py_CLEAR(self->s);
    Py_CLEAR(self->r);
    Py_RETURN_NONE;
}

static PyMethodDef Req_methods[] = {
    {"Test", (PyCFunction)Req_Test, METH_NOARGS, "Test() -> bool: complete? (MPI_Test)"},
    {"Wait", (PyCFunction)Req_Wait, METH_NOARGS, "Wait(): MPI_Wait, the GIL released."},
    {"Start", (PyCFunction)Req_Start, METH_NOARGS, "Start(): MPI_Start of the persistent request."},
    {"Free", (PyCFunction)Req_Free, METH_NOARGS, "Free(): MPI_Request_free of an inactive request."},
    {"background", (PyCFunction)Req_background, METH_NOARGS,
     "background() -> bool: the C progress thread tests it until it completes."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ReqType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpicoll.native.Req",
    .tp_basicsize = sizeof(Req),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An MPI request of a native Call's I-form or persistent form (see csrc/native.c).",
    .tp_methods = Req_methods,
    .tp_dealloc = (destructor)Req_dealloc,
};

/* start(sbuf, rbuf) / init(sbuf, rbuf) -> Req: the I-call started, or the
 * persistent request made (inactive until Start()). */
static PyObject *make_req(Call *self, PyObject *const *args, Py_ssize_t nargs, int form) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: start(sbuf, rbuf) / init(sbuf, rbuf)");
        return NULL;
    }
    Req *q = PyObject_New(Req, &ReqType);
    if (q == NULL)
        return NULL;
    q->req = MPI_REQUEST_NULL;
    q->active = q->inside = 0;
    q->persistent = form == F_INIT;
    q->s = q->r = NULL;
    q->bg = q->bg_done = 0;
    q->bg_rc = MPI_SUCCESS;
    int rc;
    if (post(self, args[0], args[1], form, &q->req, &rc) < 0) {
        Py_DECREF(q);
        return NULL;
    }
    if (rc != MPI_SUCCESS) {
        Py_DECREF(q);
        raise_mpi(rc);
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    q->s = args[0];
    q->r = args[1];
    q->active = form == F_START;
    return (PyObject *)q;
}

static PyObject *Call_start(Call *self, PyObject *const *args, Py_ssize_t nargs) {
    return make_req(self, args, nargs, F_START);
}

static PyObject *Call_persistent(Call *self, PyObject *const *args, Py_ssize_t nargs) {
    return make_req(self, args, nargs, F_INIT);
}

/* fits(x, out) -> bool: out can take x's result as it is: a numpy array
 * (exactly) of x's shape and dtype, C-contiguous, aligned, writable, and
 * not overlapping x (for contiguous arrays that is their byte ranges). What
 * kept.py's _free_out says in Python, for the hot path (~0.4 us there). */
static PyObject *Call_fits(Call *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: fits(x, out)");
        return NULL;
    }
    if (!PyArray_CheckExact(args[0]) || !PyArray_CheckExact(args[1]))
        Py_RETURN_FALSE;
    PyArrayObject *x = (PyArrayObject *)args[0], *o = (PyArrayObject *)args[1];
    int need = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED;
    if ((PyArray_FLAGS(x) & need) != need || (PyArray_FLAGS(o) & (need | NPY_ARRAY_WRITEABLE))
                                                  != (need | NPY_ARRAY_WRITEABLE))
        Py_RETURN_FALSE;
    int nd = PyArray_NDIM(x);
    if (PyArray_NDIM(o) != nd || !PyArray_CompareLists(PyArray_DIMS(x), PyArray_DIMS(o), nd))
        Py_RETURN_FALSE;
    if (PyArray_DESCR(x) != PyArray_DESCR(o) && !PyArray_EquivTypes(PyArray_DESCR(x), PyArray_DESCR(o)))
        Py_RETURN_FALSE;
    char *xa = PyArray_DATA(x), *oa = PyArray_DATA(o);
    Py_ssize_t nb = PyArray_NBYTES(x);
    if (nb && xa < oa + nb && oa < xa + nb)
        Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

/* ---- a kept call's short path, whole (kept.KeptAllreduce.__call__ and the other kept calls) ----
 *
 * gate(st, kept, env_data, engine, miss) binds the object to a kept call
 * of the library's algorithm (any kind but alltoallv): its communicator's state (the
 * one-thread gate ``busy``, the call numbers), the environment it was
 * decided under and the engine (callbacks running). Then calling the object
 * with (x, out) does what KeptAllreduce.__call__ does for such a call - the
 * checks, the gate, the call number, MPI_Allreduce, the gate again - without
 * a Python frame, and returns the result, or ``miss`` when anything is not
 * as usual (a flag, the environment, a thread in the gate, a callback
 * running): the Python path then decides, and raises where it must. */
static PyObject *one; /* the int 1 */
static PyObject *s_freed, *s_seq, *s_acquire, *s_release, *s_running, *s_busy, *s_numbers, *s_env, *s_env_keys,
    *s_mode, *s_tag_span;

/* program(xrun, state, steps, nsteps, lists, scratch, info, op, dtype, comm,
 * nbytes, exe, kit): make a K_PROGRAM Call run one executor.Executable's
 * program on its blocking kit (addresses as integers, from cffi; exe and
 * kit own what they point into and are held here). Called again with a new
 * kit after a failed run abandoned the old one (Executable.gated_failed). */
static PyObject *Call_program(Call *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: program(xrun, state, steps, nsteps, lists, scratch, info, "
                                         "op, dtype, comm, nbytes, exe, kit)");
        return NULL;
    }
    if (self->kind != K_PROGRAM) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: program() of a Call that is not a program's");
        return NULL;
    }
    void *ptr[5];
    static const int at[5] = {0, 1, 2, 4, 6}; /* xrun, state, steps, lists, info: never NULL */
    for (int i = 0; i < 5; i++) {
        ptr[i] = PyLong_AsVoidPtr(args[at[i]]);
        if (ptr[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "mpicoll native: program() got a null pointer");
            return NULL;
        }
    }
    void *scratch = args[5] == Py_None ? NULL : PyLong_AsVoidPtr(args[5]);
    long long nsteps = PyLong_AsLongLong(args[3]), handle = PyLong_AsLongLong(args[9]);
    long op = PyLong_AsLong(args[7]), dtype = PyLong_AsLong(args[8]);
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[10]);
    if (PyErr_Occurred())
        return NULL;
    if (nsteps < 0 || nbytes < 0) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: program() got a negative size");
        return NULL;
    }
    program_clear(self);
    self->xrun = (xrun_fn)ptr[0];
    self->xstate = ptr[1];
    self->steps = ptr[2];
    self->lists = ptr[3];
    self->info = ptr[4];
    self->scratch = scratch;
    self->nsteps = nsteps;
    self->xop = (int)op;
    self->xdtype = (int)dtype;
    self->xhandle = (intptr_t)handle;
    self->nbytes = nbytes;
    Py_INCREF(args[11]);
    self->exe = args[11];
    Py_INCREF(args[12]);
    self->kit = args[12];
    Py_RETURN_NONE;
}

static PyObject *Call_gate(Call *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: gate(st, kept, env_data, engine, miss)");
        return NULL;
    }
    if (self->kind == K_PROGRAM && self->xrun == NULL) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: a program's Call takes a gate after program()");
        return NULL;
    }
    PyObject *st = args[0], *kept = args[1];
    /* allgatherv's kept call (kept.KeptAllgatherv: its own block, .own) or allgather's */
    PyObject *own = self->kind == K_ALLGATHERV ? PyObject_GetAttrString(kept, "own") : NULL;
    if (own == NULL)
        PyErr_Clear();
    self->vform = own != NULL;
    if (own != NULL) {
        int ok = PyTuple_Check(own) && PyTuple_GET_SIZE(own) == 2;
        self->vlo = ok ? PyLong_AsSsize_t(PyTuple_GET_ITEM(own, 0)) : -1;
        self->vhi = ok ? PyLong_AsSsize_t(PyTuple_GET_ITEM(own, 1)) : -1;
        Py_DECREF(own);
        if (!ok || self->vlo < 0 || self->vhi < self->vlo) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "mpicoll native: gate() got an allgatherv whose block it cannot read");
            return NULL;
        }
    }
    if (self->kind == K_GATHERV || self->kind == K_SCATTERV || self->kind == K_ALLTOALLV || self->vform) {
        /* the result's shape (gather's at root, scatter's block, the
         * v-forms' 1-D total), for a new out */
        PyObject *shape = PyObject_GetAttrString(kept, "shape");
        if (shape == NULL)
            return NULL;
        int ok = PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) <= NPY_MAXDIMS;
        for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(shape); i++) {
            self->gdims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
            ok = !(self->gdims[i] < 0);
        }
        self->gnd = ok ? (int)PyTuple_GET_SIZE(shape) : 0;
        Py_DECREF(shape);
        if (!ok) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "mpicoll native: gate() got a kept call whose shape it cannot read");
            return NULL;
        }
    }
    PyObject *busy = PyObject_GetAttr(st, s_busy), *numbers = PyObject_GetAttr(st, s_numbers);
    PyObject *vals = PyObject_GetAttr(kept, s_env), *keys = PyObject_GetAttr(kept, s_env_keys);
    PyObject *mode = PyObject_GetAttr(kept, s_mode), *span = PyObject_GetAttr(st, s_tag_span);
    long m = mode == NULL ? -1 : PyLong_AsLong(mode);
    long long ts = span == NULL ? -1 : PyLong_AsLongLong(span);
    Py_XDECREF(mode);
    Py_XDECREF(span);
    if (busy == NULL || ts <= 0 || numbers == NULL || vals == NULL || keys == NULL || m == -1 || !PyDict_Check(args[2])
        || !PyTuple_Check(vals) || !PyTuple_Check(keys) || PyTuple_GET_SIZE(vals) != PyTuple_GET_SIZE(keys)) {
        Py_XDECREF(busy);
        Py_XDECREF(numbers);
        Py_XDECREF(vals);
        Py_XDECREF(keys);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "mpicoll native: gate() got a state or kept plan it cannot read");
        return NULL;
    }
    Call_clear(self);
    self->mode = (int)m;
    self->tag_span = ts;
    Py_INCREF(st);
    self->st = st;
    self->busy = busy;
    self->numbers = numbers;
    self->env_vals = vals;
    self->env_keys = keys;
    Py_INCREF(args[2]);
    self->env_data = args[2];
    Py_INCREF(args[3]);
    self->engine = args[3];
    Py_INCREF(args[4]);
    self->miss = args[4];
    Py_RETURN_NONE;
}

/* ---- mpicoll's locks: the communicators' gates and the engine's lock --------
 *
 * Both have threading.Lock's meaning in Python - acquire(blocking=True,
 * timeout=-1) -> bool, release(), locked(), a context manager, usable by
 * threading.Condition - and are taken and given from C without a Python
 * call (threading.Lock.acquire parses its arguments as keywords: ~0.1 us a
 * call from C, four per short I-call's wait, two per gated call).
 *   - ``Lock(gate=True)``: a communicator's one-thread gate
 *     (CommState.busy), which runtime.enter and every fast path take with
 *     a non-blocking acquire: a flag read and written only with the GIL
 *     held, so taking it is one test and one store (gate_take/gate_give);
 *     a blocking acquire polls with the GIL released.
 *   - ``Lock()``: the engine's lock (engine._Engine.lock), held by the
 *     progress thread across Python code: the interpreter's own lock
 *     (PyThread_type_lock); a blocking acquire waits with the GIL released
 *     and runs signal handlers when interrupted, as threading.Lock's does. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock; /* NULL: a gate */
    char held;
} Lock;

static PyTypeObject LockType;

static PyObject *Lock_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"gate", NULL};
    int gate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$p:Lock", names, &gate))
        return NULL;
    Lock *m = (Lock *)type->tp_alloc(type, 0);
    if (m == NULL || gate)
        return (PyObject *)m;
    m->lock = PyThread_allocate_lock();
    if (m->lock == NULL) {
        Py_DECREF(m);
        PyErr_SetString(PyExc_MemoryError, "mpicoll native: cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)m;
}

static void Lock_dealloc(Lock *m) {
    if (m->lock != NULL) {
        if (m->held)
            PyThread_release_lock(m->lock);
        PyThread_free_lock(m->lock);
    }
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Take the lock now if it is free: 1 taken, 0 not. */
static int lock_try(Lock *m) {
    if (m->lock == NULL) {
        if (m->held)
            return 0;
    } else if (PyThread_acquire_lock_timed(m->lock, 0, 0) != PY_LOCK_ACQUIRED)
        return 0;
    m->held = 1;
    return 1;
}

/* Take the lock, waiting up to ``timeout`` seconds (< 0: for good; 0: not
 * at all), the GIL released meanwhile. 1 taken, 0 not, -1 a signal
 * handler raised. */
static int lock_wait(Lock *m, double timeout) {
    if (lock_try(m))
        return 1;
    if (timeout == 0)
        return 0;
    double until = timeout > 0 ? mono_now() + timeout : 0;
    for (;;) {
        double left = timeout > 0 ? until - mono_now() : -1;
        if (timeout > 0 && left <= 0)
            return 0;
        if (m->lock == NULL) { /* a gate: poll */
            Py_BEGIN_ALLOW_THREADS
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
            if (PyErr_CheckSignals() < 0)
                return -1;
            if (lock_try(m))
                return 1;
            continue;
        }
        PY_TIMEOUT_T us = left < 0 ? -1 : (PY_TIMEOUT_T)(left * 1e6);
        if (us > PY_TIMEOUT_MAX)
            us = PY_TIMEOUT_MAX;
        PyLockStatus r;
        Py_BEGIN_ALLOW_THREADS
        r = PyThread_acquire_lock_timed(m->lock, us, 1);
        Py_END_ALLOW_THREADS
        if (r == PY_LOCK_ACQUIRED) {
            m->held = 1;
            return 1;
        }
        if (r == PY_LOCK_FAILURE)
            return 0;
        if (Py_MakePendingCalls() < 0) /* PY_LOCK_INTR: a signal, its handler raised */
            return -1;
    }
}

static int lock_release(Lock *m) {
    if (!m->held) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return -1;
    }
    m->held = 0;
    if (m->lock != NULL)
        PyThread_release_lock(m->lock);
    return 0;
}

/* A communicator's gate (CommState.busy, a gate Lock or, where the module
 * is off, a threading.Lock): 1 taken, 0 held by someone, -1 an error. */
static int gate_take(PyObject *busy) {
    if (Py_TYPE(busy) == &LockType)
        return lock_try((Lock *)busy);
    PyObject *got = PyObject_CallMethodOneArg(busy, s_acquire, Py_False);
    if (got == NULL)
        return -1;
    int r = got == Py_True;
    Py_DECREF(got);
    return r;
}

/* 0, or -1 with an error. */
static int gate_give(PyObject *busy) {
    if (Py_TYPE(busy) == &LockType)
        return lock_release((Lock *)busy);
    PyObject *r = PyObject_CallMethodNoArgs(busy, s_release);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static PyObject *Lock_acquire(Lock *m, PyObject *args, PyObject *kw) {
    static char *names[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if ((args != NULL && PyTuple_GET_SIZE(args) > 0) || kw != NULL)
        if (!PyArg_ParseTupleAndKeywords(args, kw, "|pd:acquire", names, &blocking, &timeout))
            return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    int r = lock_wait(m, blocking ? timeout : 0);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

static PyObject *Lock_release(Lock *m, PyObject *unused) {
    (void)unused;
    if (lock_release(m) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Lock_locked(Lock *m, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(m->held);
}

static PyObject *Lock_exit(Lock *m, PyObject *args) {
    (void)args;
    return Lock_release(m, NULL);
}

static PyMethodDef Lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))Lock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool, as threading.Lock's."},
    {"release", (PyCFunction)Lock_release, METH_NOARGS, "release()"},
    {"locked", (PyCFunction)Lock_locked, METH_NOARGS, "locked() -> bool"},
    {"__enter__", (PyCFunction)(void (*)(void))Lock_acquire, METH_VARARGS | METH_KEYWORDS, "acquire()"},
    {"__exit__", (PyCFunction)Lock_exit, METH_VARARGS, "release()"},
    {NULL, NULL, 0, NULL}};

static PyObject *Lock_repr(Lock *m) {
    return PyUnicode_FromFormat("<mpicoll.native.Lock %s%s>", m->lock == NULL ? "(gate) " : "",
                                m->held ? "locked" : "unlocked");
}

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpicoll.native.Lock",
    .tp_basicsize = sizeof(Lock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "threading.Lock's meaning, taken and given from C too: Lock(gate=True) a communicator's gate, "
              "Lock() the engine's lock (see csrc/native.c).",
    .tp_new = Lock_new,
    .tp_dealloc = (destructor)Lock_dealloc,
    .tp_methods = Lock_methods,
    .tp_repr = (reprfunc)Lock_repr,
};

/* ---- the engine's NativeRequest, made and waited for from C ----------------
 *
 * A short native I-call waited for at once is the common case of every
 * nonblocking door, and through engine.py's Python it cost ~1.4 us on top
 * of the library's call (the request built by start_native, wait() and
 * wait_native's two lock passes, _complete, _settle). bind() hands this
 * module engine.py's pieces once; then
 *   - kept_run's F_START builds the NativeRequest itself (what start_native
 *     does for a short request: result, the C Req, a new callback list, the
 *     communicator's state held), and
 *   - ``request_wait`` (NativeRequest.wait, an instance method) runs
 *     wait_native's "alone" path: under the engine's lock, a request nobody
 *     else drives (not finished, listed or waited for, and the engine's list
 *     empty) is marked blocking; MPI_Wait with the GIL released; under the
 *     lock again it is finished and its callbacks taken; then, as _settle,
 *     the state released and the request marked done.
 * Anything else (a finish to run, callbacks, a freed communicator, other
 * requests in flight, an error) goes to the Python code, which stays the
 * one description of what happens. */
/* The fields engine.py's NativeRequest reads and writes, as a C struct
 * (RCore: NativeRequest's first base where this module is built, its
 * members named as the Python attributes): the request made and waited for
 * here touched ~20 of them per call through instance dictionaries, ~0.5 us
 * of a 6 us I-call. The Python code reads the same fields as attributes. */
typedef struct {
    PyObject_HEAD
    PyObject *result, *mpi, *finish, *callbacks, *st, *keep, *error, *settler, *deadline, *expired_fn;
    char done, finished, blocking, listed;
    PyObject *live; /* st._live, where new_request held st (its release pops it) */
} RCore;

static int RCore_traverse(RCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->result);
    Py_VISIT(self->mpi);
    Py_VISIT(self->finish);
    Py_VISIT(self->callbacks);
    Py_VISIT(self->st);
    Py_VISIT(self->keep);
    Py_VISIT(self->error);
    Py_VISIT(self->settler);
    Py_VISIT(self->deadline);
    Py_VISIT(self->expired_fn);
    Py_VISIT(self->live);
    return 0;
}

static int RCore_clear(RCore *self) {
    Py_CLEAR(self->result);
    Py_CLEAR(self->mpi);
    Py_CLEAR(self->finish);
    Py_CLEAR(self->callbacks);
    Py_CLEAR(self->st);
    Py_CLEAR(self->keep);
    Py_CLEAR(self->error);
    Py_CLEAR(self->settler);
    Py_CLEAR(self->deadline);
    Py_CLEAR(self->expired_fn);
    Py_CLEAR(self->live);
    return 0;
}

static void RCore_dealloc(RCore *self) {
    PyObject_GC_UnTrack(self);
    RCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef RCore_members[] = {
    {"result", T_OBJECT, offsetof(RCore, result), 0, "what wait() returns"},
    {"_mpi", T_OBJECT, offsetof(RCore, mpi), 0, "the MPI request (a Req or an MPI.Request)"},
    {"_finish", T_OBJECT, offsetof(RCore, finish), 0, "run once when the MPI request completes, or None"},
    {"_callbacks", T_OBJECT, offsetof(RCore, callbacks), 0, "done-callbacks not yet run (a list), or None"},
    {"_st", T_OBJECT, offsetof(RCore, st), 0, "the CommState held until completion, or None"},
    {"_keep", T_OBJECT, offsetof(RCore, keep), 0, "what holds the buffers until completion"},
    {"_error", T_OBJECT, offsetof(RCore, error), 0, "the error wait() raises, or None"},
    {"_settler", T_OBJECT, offsetof(RCore, settler), 0, "the thread running the callbacks, or None"},
    {"_deadline", T_OBJECT, offsetof(RCore, deadline), 0, "time.monotonic() deadline, or None"},
    {"_expired_fn", T_OBJECT, offsetof(RCore, expired_fn), 0, "makes the timeout error"},
    {"_done", T_BOOL, offsetof(RCore, done), 0, "complete, callbacks run"},
    {"_finished", T_BOOL, offsetof(RCore, finished), 0, "complete (engine lock)"},
    {"_blocking", T_BOOL, offsetof(RCore, blocking), 0, "a thread waits for it in MPI_Wait"},
    {"_listed", T_BOOL, offsetof(RCore, listed), 0, "in the engine's list (engine lock)"},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject RCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpicoll.native.RequestCore",
    .tp_basicsize = sizeof(RCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "engine.NativeRequest's fields as a C struct (see csrc/native.c).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)RCore_traverse,
    .tp_clear = (inquiry)RCore_clear,
    .tp_dealloc = (destructor)RCore_dealloc,
    .tp_members = RCore_members,
};

static PyObject *E_engine, *E_lock, *E_cls, *E_wait, *E_failed, *E_settle;
static Py_ssize_t E_list_min;
static PyObject *s_active, *s_stepper, *s_live_, *s_Wait, *s_thread, *s_list_native, *s_version;

static PyObject *bind(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: bind(engine, NativeRequest, wait, failed, settle, list_min)");
        return NULL;
    }
    Py_ssize_t lm = PyLong_AsSsize_t(args[5]);
    if (lm == -1 && PyErr_Occurred())
        return NULL;
    if (!PyType_Check(args[1]) || !PyType_IsSubtype((PyTypeObject *)args[1], &RCoreType)) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: bind() takes the request class (a RequestCore)");
        return NULL;
    }
    PyObject *lock = PyObject_GetAttrString(args[0], "lock");
    if (lock == NULL)
        return NULL;
    if (Py_TYPE(lock) != &LockType || ((Lock *)lock)->lock == NULL) {
        Py_DECREF(lock);
        PyErr_SetString(PyExc_TypeError, "mpicoll native: bind() takes an engine whose lock is a native Lock()");
        return NULL;
    }
    Py_XSETREF(E_lock, lock);
    PyObject **slots[] = {&E_engine, &E_cls, &E_wait, &E_failed, &E_settle};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], args[i]);
    }
    E_list_min = lm;
    Py_RETURN_NONE;
}

/* obj.name is value (identity); -1 with an error set. */
static int attr_is(PyObject *obj, PyObject *name, PyObject *value) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int is = v == value;
    Py_DECREF(v);
    return is;
}

static int lock_take(void) {
    return lock_wait((Lock *)E_lock, -1) == 1 ? 0 : -1;
}

static int lock_give(void) {
    return lock_release((Lock *)E_lock);
}

/* A new NativeRequest over a started MPI request (a Req: start_native's
 * short case; an XRun: a persistent program's pending run), ``finish`` (or
 * NULL/None) run once it completes, the state ``st`` held (CommState.hold)
 * until then. Its callback list is made when a callback is added
 * (NativeRequest.add_done_callback). */
static PyObject *new_request(PyObject *mpi, PyObject *result, PyObject *finish, PyObject *st) {
    PyTypeObject *cls = (PyTypeObject *)E_cls;
    RCore *r = (RCore *)cls->tp_alloc(cls, 0);
    if (r == NULL)
        return NULL;
    PyObject *live = PyObject_GetAttr(st, s_live_);
    if (live == NULL || !PyList_Check(live) || PyList_Append(live, Py_None) < 0) {
        Py_XDECREF(live);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "mpicoll native: the state's _live is not a list");
        Py_DECREF(r);
        return NULL;
    }
    r->live = live;
    Py_INCREF(result);
    r->result = result;
    Py_INCREF(mpi);
    r->mpi = mpi;
    if (finish != NULL && finish != Py_None) {
        Py_INCREF(finish);
        r->finish = finish;
    }
    Py_INCREF(st);
    r->st = st;
    return (PyObject *)r;
}

/* The end of a request this thread waited for alone (its MPI request
 * complete): _complete and the callbacks taken, under the lock
 * (add_done_callback reads _finished under it); then _settle - without
 * callbacks, and for a communicator not freed, CommState.release's pop and
 * the request marked done; else its Python. 1, or -1 with an error set. */
static int finish_alone(RCore *req) {
    if (lock_take() < 0)
        return -1;
    req->finished = 1;
    PyObject *keep = req->keep, *cbs = req->callbacks;
    req->keep = NULL;
    req->callbacks = NULL;
    int rc = lock_give();
    Py_XDECREF(keep);
    if (rc < 0) {
        Py_XDECREF(cbs);
        return -1;
    }
    int simple = cbs == NULL || (PyList_Check(cbs) && PyList_GET_SIZE(cbs) == 0);
    PyObject *st = req->st;
    if (simple && st != NULL && st != Py_None) {
        PyObject *live = req->live;
        simple = live != NULL && PyList_GET_SIZE(live) > 0 && attr_is(st, s_freed, Py_False) > 0;
        if (simple) {
            rc = PyList_SetSlice(live, PyList_GET_SIZE(live) - 1, PyList_GET_SIZE(live), NULL);
            if (rc == 0) {
                Py_CLEAR(req->st);
                Py_CLEAR(req->live);
            }
        }
    }
    if (PyErr_Occurred())
        rc = -1;
    else if (simple) {
        req->done = 1;
        rc = 1;
    } else {
        PyObject *r = PyObject_CallFunctionObjArgs(E_settle, (PyObject *)req, cbs == NULL ? Py_None : cbs, NULL);
        rc = r == NULL ? -1 : 1;
        Py_XDECREF(r);
    }
    Py_XDECREF(cbs);
    return rc;
}

/* The library's (or the executor's) error from a wait alone: recorded on
 * the request by the engine (wait_native's except branch) and the request
 * settled; wait() raises it from there. 1, or -1 with an error set. */
static int failed_alone(RCore *req) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL)
        PyException_SetTraceback(v, tb);
    PyObject *r = PyObject_CallFunctionObjArgs(E_failed, (PyObject *)req, v, NULL);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
    Py_XDECREF(r);
    return r == NULL ? -1 : 1;
}

/* wait_native's alone path (see above): 1 done (completed, or failed and
 * settled by the engine's Python), 0 not alone (the Python wait decides),
 * -1 an error of ours. */
static int wait_alone(RCore *req) {
    if (req->finish != NULL && req->finish != Py_None)
        return 0;
    int is = attr_is(E_engine, s_stepper, Py_None);
    if (is <= 0)
        return is;
    if (lock_take() < 0)
        return -1;
    int alone = 0, bad = 0;
    PyObject *active = PyObject_GetAttr(E_engine, s_active);
    if (active == NULL || !PyList_Check(active))
        bad = 1;
    else if (PyList_GET_SIZE(active) == 0 && !req->finished && !req->blocking && !req->listed) {
        alone = 1;
        req->blocking = 1;
    } else if (req->listed && !req->finished && !req->blocking && PyList_GET_SIZE(active) == 1
               && PyList_GET_ITEM(active, 0) == (PyObject *)req
               && (req->deadline == NULL || req->deadline == Py_None)) {
        /* listed (a program's run, a long I-call) and the only one: taken
         * back, as wait_native does (the progress thread tests under the lock) */
        if (PyList_SetSlice(active, 0, 1, NULL) < 0)
            bad = 1;
        else {
            req->listed = 0;
            alone = 1;
            req->blocking = 1;
        }
    }
    Py_XDECREF(active);
    if (lock_give() < 0 || bad) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "mpicoll native: the engine's list is not a list");
        return -1;
    }
    if (!alone)
        return 0;
    PyObject *mpi = req->mpi;
    if (mpi == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: a request without its MPI request");
        return -1;
    }
    Py_INCREF(mpi);
    PyObject *w = Py_TYPE(mpi) == &ReqType ? Req_Wait((Req *)mpi, NULL) : PyObject_CallMethodNoArgs(mpi, s_Wait);
    Py_DECREF(mpi);
    if (w == NULL)
        return failed_alone(req);
    Py_DECREF(w);
    return finish_alone(req);
}

/* NativeRequest.wait where this module is bound: the alone path above, else
 * the Python wait (which also raises a recorded error). */
static PyObject *request_wait(PyObject *mod, PyObject *obj) {
    (void)mod;
    if (E_wait == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: request_wait before bind()");
        return NULL;
    }
    if (!PyObject_TypeCheck(obj, &RCoreType))
        return PyObject_CallOneArg(E_wait, obj);
    RCore *req = (RCore *)obj;
    if (!req->done) {
        int r = wait_alone(req);
        if (r < 0)
            return NULL;
        if (r == 0)
            return PyObject_CallOneArg(E_wait, obj);
    }
    if (req->error != NULL && req->error != Py_None)
        return PyObject_CallOneArg(E_wait, obj);
    PyObject *res = req->result == NULL ? Py_None : req->result;
    Py_INCREF(res);
    return res;
}

/* stop_background(): stop the C progress thread and wait for it (engine.py,
 * at exit, before MPI_Finalize); requests still listed are completed by
 * their own Wait. */
static PyObject *stop_background(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    bg_lock();
    int started = bg_started;
    bg_stop = 1;
    bg_started = 0;
    pthread_cond_signal(&bg_cv);
    pthread_mutex_unlock(&bg_mu);
    if (started) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(bg_thread, NULL);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

/* background_stats() -> (tests made by the C thread, requests listed, running) */
static PyObject *background_stats(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    bg_lock();
    unsigned long long t = bg_tests;
    Py_ssize_t n = bg_n;
    int running = bg_started && !bg_stop;
    pthread_mutex_unlock(&bg_mu);
    return Py_BuildValue("(KnO)", t, n, running ? Py_True : Py_False);
}

static PyMethodDef module_methods[] = {
    {"stop_background", (PyCFunction)stop_background, METH_NOARGS,
     "stop_background(): stop the C progress thread (before MPI_Finalize)."},
    {"background_stats", (PyCFunction)background_stats, METH_NOARGS,
     "background_stats() -> (tests made, requests listed, running)."},
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(engine, NativeRequest, wait, failed, settle, list_min): make and wait for the engine's short native "
     "requests from C."},
    {NULL, NULL, 0, NULL}};

static PyMethodDef wait_def = {"wait", (PyCFunction)request_wait, METH_O,
                               "wait(): the request's result, once complete (engine.NativeRequest.wait)."};

/* The call's number (CommState.next_seq): next() of the communicator's
 * itertools.count, and ``st.seq`` one past it. A new reference, or NULL
 * with an error set. kept_run and the persistent front take it here. */
static PyObject *take_number(PyObject *numbers, PyObject *st) {
    PyObject *seq = PyIter_Next(numbers);
    if (seq == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "mpicoll native: the call numbers ran out");
        return NULL;
    }
    PyObject *next = PyNumber_Add(seq, one);
    if (next == NULL || PyObject_SetAttr(st, s_seq, next) < 0) {
        Py_XDECREF(next);
        Py_DECREF(seq);
        return NULL;
    }
    Py_DECREF(next);
    return seq;
}

/* 1: as usual; 0: not (the Python path decides); -1: an error is set. */
static int usual(Call *self) {
    PyObject *v = PyObject_GetAttr(self->st, s_freed);
    if (v == NULL)
        return -1;
    int freed = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (freed)
        return freed < 0 ? -1 : 0;
    Py_ssize_t n = PyTuple_GET_SIZE(self->env_keys);
    for (Py_ssize_t i = 0; i < n; i++) {
        /* kept.py compares the raw values by identity (plancache.env_unchanged) */
        PyObject *got = PyDict_GetItemWithError(self->env_data, PyTuple_GET_ITEM(self->env_keys, i));
        if (got == NULL && PyErr_Occurred())
            return -1;
        if (got == NULL)
            got = Py_None;
        if (got != PyTuple_GET_ITEM(self->env_vals, i))
            return 0;
    }
    v = PyObject_GetAttr(self->engine, s_running);
    if (v == NULL)
        return -1;
    int running = PyObject_IsTrue(v);
    Py_DECREF(v);
    return running ? (running < 0 ? -1 : 0) : 1;
}

/* A new array of x's dtype and ``dims``: a result the call makes. */
static PyArrayObject *new_like(PyArrayObject *x, int nd, npy_intp *dims) {
    PyArray_Descr *d = PyArray_DESCR(x);
    Py_INCREF(d);
    return (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, d, nd, dims, NULL, NULL, 0, NULL);
}

/* ``oo`` takes a result of x's dtype and ``dims`` as it is: an exact numpy
 * array of that shape and dtype, C-contiguous, aligned, writable
 * (kept._out_ok; overlap with x is each caller's rule). */
static int takes(PyObject *oo, PyArrayObject *x, int nd, npy_intp *dims) {
    if (!PyArray_CheckExact(oo))
        return 0;
    PyArrayObject *o = (PyArrayObject *)oo;
    int want = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE;
    return (PyArray_FLAGS(o) & want) == want && PyArray_NDIM(o) == nd && PyArray_CompareLists(PyArray_DIMS(o), dims, nd)
           && (PyArray_DESCR(o) == PyArray_DESCR(x) || PyArray_EquivTypes(PyArray_DESCR(o), PyArray_DESCR(x)));
}

/* The kept call (every gated kind: all-reduce, bcast, reduce, reduce-scatter,
 * allgather, alltoall, scatter, gather, program) on (x, out), blocking
 * (returns the result) or started (F_START: see start_kept); ``miss`` for
 * anything unusual. */
/* A program's I-call (below, after XRun) */
static int iprogram_free(Call *self);
static int iprogram_pass(PyObject *ixr, PyObject *xo, PyObject *out, char *buf, char *src, int tag, long long seq);
static PyObject *iprogram_request(PyObject *ixr, int rc, PyObject *out, PyObject *st, Py_ssize_t nbytes);

static PyObject *kept_run(Call *self, PyObject *xo, PyObject *oo, int form) {
    if (self->st == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: call a Call only after gate()");
        return NULL;
    }
    /* kept.KeptScatter off root: x may be None (it is not read); out stands in for it */
    int no_x = self->kind == K_SCATTERV && xo == Py_None && self->rank != self->root && PyArray_CheckExact(oo);
    if (no_x)
        xo = oo;
    if (!PyArray_CheckExact(xo))
        goto miss;
    PyArrayObject *x = (PyArrayObject *)xo, *out;
    int need = NPY_ARRAY_C_CONTIGUOUS | (self->kind == K_BCAST ? 0 : NPY_ARRAY_ALIGNED);
    if ((PyArray_FLAGS(x) & need) != need)
        goto miss;
    /* A program runs on buffers of the size it was recorded for (the kept
     * signature's; checked again here: its steps' offsets assume it); an
     * I-call only where the Call has its I-run and that is free (else
     * kept.py's ProgramRequest, on a kit of its own). */
    if (self->kind == K_PROGRAM
        && (PyArray_NBYTES(x) != self->nbytes || (form != F_BLOCKING && !iprogram_free(self))))
        goto miss;
    /* A shared-memory program runs only while its window takes it (the
     * executor's probe: nothing queued or running there, slots big enough);
     * else the Python path runs the schedule, which waits its turn. */
    if (self->kind == K_PROGRAM
        && !xrun_ready(self->xrun, self->steps, self->nsteps, self->lists, self->xop, self->xdtype, self->xhandle,
                       self->info))
        goto miss;
    int ok = usual(self);
    if (ok < 0)
        return NULL;
    if (!ok)
        goto miss;
    if (self->kind == K_BCAST) {
        /* kept.KeptBcast: in place, on a writable x */
        if (!(PyArray_FLAGS(x) & NPY_ARRAY_WRITEABLE))
            goto miss;
        out = x;
        Py_INCREF(out);
    } else if (self->kind == K_REDUCE && self->rank != self->root) {
        /* kept.KeptReduce: no result off root (root: allreduce's modes, below) */
        out = (PyArrayObject *)Py_None;
        Py_INCREF(Py_None);
    } else if (self->kind == K_ALLGATHERV && self->vform) {
        /* kept.KeptAllgatherv: a new 1-D out of the total, or a given one
         * that takes it; x placed at its block (nothing to copy when x is
         * that block of out: in place); x overlapping out any other way, or
         * not of its block's size, misses (the Python path decides) */
        if (self->mode == 0) {
            if ((out = new_like(x, self->gnd, self->gdims)) == NULL)
                return NULL;
        } else {
            if (!takes(oo, x, self->gnd, self->gdims))
                goto miss;
            out = (PyArrayObject *)oo;
            Py_INCREF(out);
        }
        Py_ssize_t isz = PyArray_ITEMSIZE(out), at = self->vlo * isz, nb = (self->vhi - self->vlo) * isz;
        if (PyArray_NBYTES(x) != nb || (overlaps(x, out) && PyArray_BYTES(x) != PyArray_BYTES(out) + at)) {
            Py_DECREF(out);
            goto miss;
        }
        if (nb > 0 && PyArray_BYTES(x) != PyArray_BYTES(out) + at)
            memcpy(PyArray_BYTES(out) + at, PyArray_DATA(x), (size_t)nb);
    } else if (self->kind == K_ALLTOALLV) {
        /* kept.KeptAlltoallv: a new 1-D out of the received total, or a
         * given one that takes it apart from x (in place, the Python path
         * sends from a copy of x) */
        if (self->mode == 0) {
            if ((out = new_like(x, self->gnd, self->gdims)) == NULL)
                return NULL;
        } else {
            if (!takes(oo, x, self->gnd, self->gdims) || overlaps(x, (PyArrayObject *)oo))
                goto miss;
            out = (PyArrayObject *)oo;
            Py_INCREF(out);
        }
    } else if (self->kind == K_ALLGATHERV) {
        /* kept.KeptAllgather: a new out of shape (p,) + x.shape, or a given
         * one that takes it apart from x; x copied into row ``rank``, then
         * the library's in-place Allgatherv (mode: whether out was given) */
        int nd = PyArray_NDIM(x);
        npy_intp dims[NPY_MAXDIMS];
        if (nd + 1 > NPY_MAXDIMS)
            goto miss;
        dims[0] = self->size;
        for (int i = 0; i < nd; i++)
            dims[i + 1] = PyArray_DIMS(x)[i];
        if (self->mode == 0) {
            if ((out = new_like(x, nd + 1, dims)) == NULL)
                return NULL;
        } else {
            if (!takes(oo, x, nd + 1, dims) || overlaps(x, (PyArrayObject *)oo))
                goto miss;
            out = (PyArrayObject *)oo;
            Py_INCREF(out);
        }
        if (PyArray_NBYTES(x) > 0)
            memcpy(PyArray_BYTES(out) + (Py_ssize_t)self->rank * PyArray_NBYTES(x), PyArray_DATA(x),
                   (size_t)PyArray_NBYTES(x));
    } else if (self->kind == K_REDUCE_SCATTER) {
        /* kept.KeptReduceScatter: this rank's block, a new array or a given
         * one apart from x (one that overlaps x, or an empty block, which
         * MPICH would see aliased, is staged by the Python path) */
        npy_intp n = self->counts[self->rank];
        if (n == 0)
            goto miss;
        if (self->mode == 0) {
            if ((out = new_like(x, 1, &n)) == NULL)
                return NULL;
        } else {
            if (!takes(oo, x, 1, &n) || overlaps(x, (PyArrayObject *)oo))
                goto miss;
            out = (PyArrayObject *)oo;
            Py_INCREF(out);
        }
    } else if (self->kind == K_SCATTERV) {
        /* kept.KeptScatter: a new out of the kept block shape or a given
         * one that takes it; at root x holds every block, and an out inside
         * x must be exactly root's block (in place); elsewhere x is not read
         * (it may be None) and must not overlap out */
        if (oo == Py_None) {
            if ((out = new_like(x, self->gnd, self->gdims)) == NULL)
                return NULL;
        } else if (!takes(oo, x, self->gnd, self->gdims)) {
            goto miss;
        } else {
            out = (PyArrayObject *)oo;
            Py_INCREF(out);
        }
        if (!no_x && PyArray_NBYTES(x) > 0 && overlaps(x, out)
            && (self->rank != self->root || PyArray_BYTES(out) != PyArray_BYTES(x) + self->displs[self->root]
                || PyArray_NBYTES(out) != self->counts[self->root])) {
            Py_DECREF(out);
            goto miss;
        }
    } else if (self->kind == K_GATHERV) {
        /* kept.KeptGather: no result off root; at root a new out of the
         * kept shape, or a given one that takes it, with x apart from it or
         * exactly root's block of it (in place) */
        if (self->rank != self->root) {
            out = (PyArrayObject *)Py_None; /* (only ever passed on and returned as an object) */
            Py_INCREF(Py_None);
        } else if (oo == Py_None) {
            if ((out = new_like(x, self->gnd, self->gdims)) == NULL)
                return NULL;
        } else {
            if (!takes(oo, x, self->gnd, self->gdims))
                goto miss;
            PyArrayObject *o = (PyArrayObject *)oo;
            if (PyArray_NBYTES(x) > 0 && overlaps(x, o)
                && (PyArray_BYTES(x) != PyArray_BYTES(o) + self->displs[self->root]
                    || PyArray_NBYTES(x) != self->counts[self->root]))
                goto miss;
            out = o;
            Py_INCREF(out);
        }
    } else if (self->mode == 0) {
        if ((out = new_like(x, PyArray_NDIM(x), PyArray_DIMS(x))) == NULL)
            return NULL;
    } else if (self->mode == 1) {
        /* (kept.KeptAlltoall takes no out that overlaps x: the Python path) */
        if (!(PyArray_FLAGS(x) & NPY_ARRAY_WRITEABLE) || self->kind == K_ALLTOALL)
            goto miss;
        out = x;
        Py_INCREF(out);
    } else {
        PyObject *pair[2] = {xo, oo};
        PyObject *fits = Call_fits(self, pair, 2);
        if (fits != Py_True) {
            Py_XDECREF(fits);
            if (PyErr_Occurred())
                return NULL;
            goto miss;
        }
        Py_DECREF(fits);
        out = (PyArrayObject *)oo;
        Py_INCREF(out);
    }
    /* The one-thread gate (runtime.enter): a thread already in it, and the
     * Python path raises the error that applies. */
    int took = gate_take(self->busy);
    if (took != 1) {
        Py_DECREF(out);
        if (took < 0)
            return NULL;
        goto miss;
    }
    PyObject *seq = take_number(self->numbers, self->st), *ixr = NULL;
    int rc = MPI_SUCCESS, xrc = MPICOLL_X_DONE, irc = 0, tag = 0, failed = seq == NULL;
    Req *q = NULL;
    if (!failed && form == F_START && self->kind != K_PROGRAM) {
        q = PyObject_New(Req, &ReqType);
        if (q == NULL)
            failed = 1;
        else {
            q->req = MPI_REQUEST_NULL;
            q->active = q->inside = q->persistent = 0;
            q->s = q->r = NULL;
            q->bg = q->bg_done = 0;
            q->bg_rc = MPI_SUCCESS;
        }
    }
    if (!failed && self->kind == K_PROGRAM) {
        /* Executable.run: the call's tag (CommState.next_seq), then the
         * whole program in one executor call, the GIL released. */
        long long sv = PyLong_AsLongLong(seq);
        if (sv == -1 && PyErr_Occurred())
            failed = 1;
        else {
            tag = (int)(1 + sv % self->tag_span);
            char *bp = PyArray_DATA(out), *sp = self->mode == 1 ? NULL : PyArray_DATA(x);
            if (form == F_START) { /* (held: a failed pass gives the Call a new I-run) */
                ixr = Py_NewRef(self->ixr);
                irc = iprogram_pass(ixr, xo, (PyObject *)out, bp, sp, tag, sv);
            } else
                xrc = xrun_blocking(self->xrun, self->xstate, self->steps, self->nsteps, self->lists, bp, sp,
                                    self->scratch, self->xop, self->xdtype, self->xhandle, tag, self->info);
        }
    } else if (!failed) {
        int rcp;
        PyObject *send = self->kind == K_BCAST || (self->kind == K_SCATTERV && self->rank != self->root)
                                 || (self->kind != K_SCATTERV && self->mode == 1)
                             ? Py_None
                             : xo;
        if (post(self, send, (PyObject *)out, form, q == NULL ? NULL : &q->req, &rcp) < 0)
            failed = 1;
        else
            rc = rcp;
    }
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    if (gate_give(self->busy) < 0) {
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
        Py_XDECREF(seq);
        Py_XDECREF(ixr);
        Py_DECREF(out);
        return NULL;
    }
    PyErr_Restore(exc_type, exc_value, exc_tb);
    if (ixr != NULL) { /* a program's I-call: its request (a pass's error is recorded on it) */
        Py_XDECREF(seq);
        PyObject *res = iprogram_request(ixr, irc, (PyObject *)out, self->st, PyArray_NBYTES(x));
        Py_DECREF(ixr);
        Py_DECREF(out);
        return res;
    }
    if (!failed && xrc != MPICOLL_X_DONE) {
        /* The executor's error: Executable.gated_failed keeps what the
         * library may still write into, gives the gate a new kit and raises
         * the error it describes. Interrupted (EINTR): the same for the
         * kit, and the signal handler's exception is what is raised. */
        PyObject *t = NULL, *v = NULL, *tb = NULL;
        if (xrc == MPICOLL_X_EINTR)
            PyErr_Fetch(&t, &v, &tb);
        PyObject *r = PyObject_CallMethod(self->exe, "gated_failed", "OOiiO", (PyObject *)out,
                                          self->mode == 1 ? Py_None : xo, xrc, tag, seq);
        Py_XDECREF(r);
        if (t != NULL) {
            PyErr_Clear();
            PyErr_Restore(t, v, tb);
        } else if (r != NULL)
            PyErr_SetString(PyExc_RuntimeError, "mpicoll native: the executor failed and nothing raised");
        failed = 1;
    }
    Py_XDECREF(seq);
    if (failed || rc != MPI_SUCCESS) {
        Py_XDECREF(q);
        Py_DECREF(out);
        if (!failed)
            raise_mpi(rc);
        return NULL;
    }
    if (q == NULL)
        return (PyObject *)out;
    /* The request holds the arrays the library reads and writes until it completes. */
    Py_INCREF(xo);
    q->s = xo;
    Py_INCREF(out);
    q->r = (PyObject *)out;
    q->active = 1;
    /* A short one as the engine's NativeRequest (bind()); else the pair, for
     * engine.start_native (it lists a long one for the progress thread). */
    PyObject *res = E_cls != NULL && PyArray_NBYTES(x) < E_list_min
                        ? new_request((PyObject *)q, (PyObject *)out, NULL, self->st)
                        : PyTuple_Pack(2, (PyObject *)out, (PyObject *)q);
    Py_DECREF(q);  /* (the result holds it, or the error drops it: active, its arrays are kept) */
    Py_DECREF(out);
    return res;
miss:
    Py_INCREF(self->miss);
    return self->miss;
}

static PyObject *Call_kept(Call *self, PyObject *args, PyObject *kw) {
    PyObject *xo, *oo = Py_None;
    if (kw != NULL || !PyArg_UnpackTuple(args, "kept", 1, 2, &xo, &oo))
        return NULL;
    return kept_run(self, xo, oo, F_BLOCKING);
}

/* start_kept(x[, out]) -> the engine's NativeRequest (bound, shorter than
 * its list_min), (result, Req), or miss: the same, started. */
static PyObject *Call_start_kept(Call *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: start_kept(x[, out])");
        return NULL;
    }
    return kept_run(self, args[0], nargs == 2 ? args[1] : Py_None, F_START);
}

static PyObject *Call_program_i(Call *self, PyObject *const *args, Py_ssize_t nargs);

static PyMethodDef Call_methods[] = {
    {"start_kept", (PyCFunction)(void (*)(void))Call_start_kept, METH_FASTCALL,
     "start_kept(x, out) -> NativeRequest, (result, Req) or miss: a gated call's I-call, whole."},
    {"program", (PyCFunction)(void (*)(void))Call_program, METH_FASTCALL,
     "program(xrun, state, steps, nsteps, lists, scratch, info, op, dtype, comm, nbytes, exe, kit): a program's "
     "Call runs this executor program (gate() it, then call it)."},
    {"program_i", (PyCFunction)(void (*)(void))Call_program_i, METH_FASTCALL,
     "program_i(xr): the XRun a program Call's I-calls run on (start_kept), or None."},
    {"gate", (PyCFunction)(void (*)(void))Call_gate, METH_FASTCALL,
     "gate(st, kept, env_data, engine, miss): bind a kept call's state; then call the object with (x, out)."},
    {"start", (PyCFunction)(void (*)(void))Call_start, METH_FASTCALL,
     "start(sbuf, rbuf) -> Req: the I-call on these arrays, started."},
    {"init", (PyCFunction)(void (*)(void))Call_persistent, METH_FASTCALL,
     "init(sbuf, rbuf) -> Req: the MPI-4 persistent request over these arrays (Start() it)."},
    {"fits", (PyCFunction)(void (*)(void))Call_fits, METH_FASTCALL,
     "fits(x, out) -> bool: out takes x's result without staging (same shape and dtype, disjoint)."},
    {"run", (PyCFunction)(void (*)(void))Call_run, METH_FASTCALL,
     "run(sbuf, rbuf) -> MPI error code: the call on these arrays, the GIL released."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpicoll.native.Call",
    .tp_basicsize = sizeof(Call),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One kept collective of the MPI library's, called on numpy arrays (see csrc/native.c).",
    .tp_methods = Call_methods,
    .tp_call = (ternaryfunc)Call_kept,
    .tp_traverse = (traverseproc)Call_traverse,
    .tp_clear = (inquiry)Call_clear_all,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Call_new_init,
    .tp_dealloc = (destructor)Call_dealloc,
};

/* ---- a persistent program's run as an MPI request (XRun) ---------------------
 *
 * A persistent request of a compiled schedule (persistent.py: ring,
 * recursive doubling, ... below 64 KiB) runs its program on one kit, bound
 * to its buffers for good. XRun is that run seen as an MPI request, so the
 * engine drives it as it drives the library's: ``Test()`` is one
 * nonblocking pass of the executor (posts what it can, advances while the
 * messages have arrived), ``Wait()`` the blocking rest with the GIL
 * released. Made once per request (persistent.py ``_bind_program``) with
 * the addresses executor.Executable passes to mpicoll_x_run; ``owner``
 * holds the program and the kit they point into. On an executor error the
 * run is over: ``fail(rc, tag, seq)`` (the request's Python) abandons the
 * kit to the library, turns this path off and returns the exception, which
 * Test()/Wait() raise. */

static int XRun_traverse(XRun *self, visitproc visit, void *arg) {
    Py_VISIT(self->owner);
    Py_VISIT(self->fail);
    Py_VISIT(self->bo);
    Py_VISIT(self->bx);
    return 0;
}

static int XRun_clear(XRun *self) {
    if (self->active)
        return 0; /* in the library's hands: what it points into stays */
    Py_CLEAR(self->owner);
    Py_CLEAR(self->fail);
    Py_CLEAR(self->bo);
    Py_CLEAR(self->bx);
    return 0;
}

static void XRun_dealloc(XRun *self) {
    PyObject_GC_UnTrack(self);
    int bgrc;
    if (self->bg && xbg_take(self, &bgrc) && bgrc == MPICOLL_X_DONE)
        self->active = 0; /* (finished by the C thread) */
    if (self->active) { /* (leaked on purpose: the library may still write into it) */
        Py_XINCREF(self->owner);
        Py_XINCREF(self->bo);
        Py_XINCREF(self->bx);
        self->active = 0;
    }
    XRun_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* XRun(xrun, state, steps, nsteps, lists, scratch, info, op, dtype, comm, buf, src, owner, fail): addresses
 * as ints (scratch and src may be None; buf None or 0 for an I-run, whose
 * buffers each I-call binds: iprogram_pass). */
static PyObject *XRun_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *a[14];
    if (kw != NULL && PyDict_GET_SIZE(kw) > 0) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: XRun() takes no keywords");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "XRun", 14, 14, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7], &a[8],
                           &a[9], &a[10], &a[11], &a[12], &a[13]))
        return NULL;
    void *ptr[5];
    static const int at[5] = {0, 1, 2, 4, 6}; /* xrun, state, steps, lists, info: never NULL */
    for (int i = 0; i < 5; i++) {
        ptr[i] = PyLong_AsVoidPtr(a[at[i]]);
        if (ptr[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "mpicoll native: XRun() got a null pointer");
            return NULL;
        }
    }
    void *scratch = a[5] == Py_None ? NULL : PyLong_AsVoidPtr(a[5]);
    void *buf = a[10] == Py_None ? NULL : PyLong_AsVoidPtr(a[10]);
    void *src = a[11] == Py_None ? NULL : PyLong_AsVoidPtr(a[11]);
    long long nsteps = PyLong_AsLongLong(a[3]), handle = PyLong_AsLongLong(a[9]);
    long op = PyLong_AsLong(a[7]), dtype = PyLong_AsLong(a[8]);
    if (PyErr_Occurred())
        return NULL;
    if (nsteps < 0 || !PyCallable_Check(a[13])) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: XRun() got a negative step count or a fail() not callable");
        return NULL;
    }
    XRun *x = (XRun *)type->tp_alloc(type, 0);
    if (x == NULL)
        return NULL;
    x->xrun = (xrun_fn)ptr[0];
    x->state = ptr[1];
    x->steps = ptr[2];
    x->lists = ptr[3];
    x->info = ptr[4];
    x->buf = buf;
    x->scratch = scratch;
    x->src = src;
    x->nsteps = nsteps;
    x->op = (int)op;
    x->dtype = (int)dtype;
    x->handle = (intptr_t)handle;
    Py_INCREF(a[12]);
    x->owner = a[12];
    Py_INCREF(a[13]);
    x->fail = a[13];
    return (PyObject *)x;
}

/* One pass (blocking: the whole rest, the GIL released): the executor's
 * status, or -1 with the run's error raised (fail() made it). */
static int xrun_settle(XRun *x, int rc);

static int xrun_pass(XRun *x, int blocking) {
    int rc;
    if (blocking) {
        x->inside = 1;
        rc = xrun_blocking(x->xrun, x->state, x->steps, x->nsteps, x->lists, x->buf, x->src, x->scratch, x->op,
                           x->dtype, x->handle, x->tag, x->info);
        x->inside = 0;
    } else
        rc = x->xrun(x->state, x->steps, x->nsteps, x->lists, x->buf, x->src, x->scratch, x->op, x->dtype,
                     x->handle, x->tag, 0, x->info);
    return xrun_settle(x, rc);
}

/* After a pass (here or the C thread's) that ended with ``rc``: DONE or
 * PENDING as they are, the run's end noted; else the run's error raised
 * (fail() made it) and -1. */
static int xrun_settle(XRun *x, int rc) {
    if (rc == MPICOLL_X_DONE || rc == MPICOLL_X_PENDING) {
        if (rc == MPICOLL_X_DONE) {
            x->active = 0;
            Py_CLEAR(x->bo);
            Py_CLEAR(x->bx);
        }
        return rc;
    }
    x->active = 0;
    PyObject *t = NULL, *v = NULL, *tb = NULL;
    if (rc == MPICOLL_X_EINTR) /* (fail() gives up the kit; the handler's exception is raised) */
        PyErr_Fetch(&t, &v, &tb);
    /* (fail() keeps the kit and an I-run's arrays for the library: after it, ours go) */
    PyObject *exc = PyObject_CallFunction(x->fail, "iiL", rc, x->tag, x->seq);
    Py_CLEAR(x->bo);
    Py_CLEAR(x->bx);
    if (t != NULL) {
        Py_XDECREF(exc);
        PyErr_Clear();
        PyErr_Restore(t, v, tb);
        return -1;
    }
    if (exc == NULL)
        return -1;
    if (PyExceptionInstance_Check(exc))
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    else
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: an XRun's fail() returned no exception");
    Py_DECREF(exc);
    return -1;
}

/* The rest of a run, blocking (its owner's wait): a run the C thread ended
 * is settled, one it has not is taken back and finished here. 0, or -1
 * with the run's error raised. */
static int xrun_finish(XRun *x) {
    int rc;
    if (x->bg && xbg_take(x, &rc))
        return xrun_settle(x, rc) < 0 ? -1 : 0;
    return xrun_pass(x, 1) < 0 ? -1 : 0;
}

static PyObject *XRun_Test(XRun *self, PyObject *unused) {
    (void)unused;
    if (!self->active)
        Py_RETURN_TRUE;
    if (self->inside) /* another thread is in Wait(): it completes it */
        Py_RETURN_FALSE;
    int rc;
    if (self->bg) { /* the C thread runs it: done there, or left to it */
        if (!xbg_peek(self))
            Py_RETURN_FALSE;
        xbg_take(self, &rc);
        rc = xrun_settle(self, rc);
    } else
        rc = xrun_pass(self, 0);
    if (rc < 0)
        return NULL;
    return PyBool_FromLong(rc == MPICOLL_X_DONE);
}

static PyObject *XRun_Wait(XRun *self, PyObject *unused) {
    (void)unused;
    if (!self->active)
        Py_RETURN_TRUE;
    if (self->inside) {
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: a program's run waited for by two threads at once");
        return NULL;
    }
    if (xrun_finish(self) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* posted(tag, seq): the run a nonblocking pass made elsewhere began on
 * this XRun's kit (executor.Executable.started) is this XRun's, in flight:
 * its Test/Wait/background() go on from where that pass stopped. */
static PyObject *XRun_posted(XRun *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: posted(tag, seq)");
        return NULL;
    }
    long tag = PyLong_AsLong(args[0]);
    long long seq = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (self->active || self->buf == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: posted() of an XRun in flight or without buffers");
        return NULL;
    }
    self->tag = (int)tag;
    self->seq = seq;
    self->active = 1;
    Py_RETURN_NONE;
}

/* background() -> bool: hand the run in flight to the C thread, which
 * runs nonblocking passes until it ends; False (nothing done) for a run
 * not active, waited for, or after stop_background(). */
static PyObject *XRun_background(XRun *self, PyObject *unused) {
    (void)unused;
    if (!self->active || self->inside || self->bg)
        return PyBool_FromLong(self->bg);
    self->bg_done = 0;
    self->bg_rc = MPICOLL_X_PENDING;
    self->bg = 1;
    if (!bg_add((PyObject *)self))
        self->bg = 0;
    return PyBool_FromLong(self->bg);
}

/* bufs: an I-run's arrays while it runs, (out,) or (x, out); None. */
static PyObject *XRun_bufs(XRun *self, void *closure) {
    (void)closure;
    if (self->bo == NULL)
        Py_RETURN_NONE;
    return self->bx == NULL ? PyTuple_Pack(1, self->bo) : PyTuple_Pack(2, self->bx, self->bo);
}

static PyGetSetDef XRun_getset[] = {
    {"bufs", (getter)XRun_bufs, NULL, "an I-run's arrays while it runs, (out,) or (x, out); None", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef XRun_methods[] = {
    {"Test", (PyCFunction)XRun_Test, METH_NOARGS, "Test() -> bool: one nonblocking pass of the executor."},
    {"Wait", (PyCFunction)XRun_Wait, METH_NOARGS, "Wait(): the rest of the run, the GIL released."},
    {"posted", (PyCFunction)(void (*)(void))XRun_posted, METH_FASTCALL,
     "posted(tag, seq): the run a pass made elsewhere began on this kit, in flight here from now on."},
    {"background", (PyCFunction)XRun_background, METH_NOARGS,
     "background() -> bool: the run handed to the C progress thread (False: it was not)."},
    {NULL, NULL, 0, NULL}};

static PyMemberDef XRun_members[] = {
    {"active", T_INT, offsetof(XRun, active), READONLY, "started, not yet complete"},
    {"tag", T_INT, offsetof(XRun, tag), READONLY, "the current run's tag"},
    {"seq", T_LONGLONG, offsetof(XRun, seq), READONLY, "the current run's call number"},
    {"bg", T_INT, offsetof(XRun, bg), READONLY, "handed to the C progress thread and not taken back"},
    {"bg_done", T_INT, offsetof(XRun, bg_done), READONLY,
     "the C thread ended the run (a snapshot read without its mutex: for tests)"},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject XRunType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpicoll.native.XRun",
    .tp_basicsize = sizeof(XRun),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A persistent program's run as an MPI request: Test/Wait over the executor (see csrc/native.c).",
    .tp_new = XRun_new,
    .tp_traverse = (traverseproc)XRun_traverse,
    .tp_clear = (inquiry)XRun_clear,
    .tp_dealloc = (destructor)XRun_dealloc,
    .tp_methods = XRun_methods,
    .tp_members = XRun_members,
    .tp_getset = XRun_getset,
};

/* ---- a persistent request's start and wait, in C (persistent.Persistent) -----
 *
 * ``req.start(); req.wait()`` of a persistent plan of the library's
 * algorithm is, in persistent.py's Python, the gate, the inputs, a call
 * number, MPI_Start, and MPI_Wait when nothing else is in flight: ~1 us of
 * Python frames on top of the library's ~2 us at 8 B (mpi4py's own
 * Prequest is two C calls). PersistFront is Persistent's base class where
 * this module is built: its start/wait/__call__/Start/Wait do that in C
 * once ``_front()`` has bound the request's facts, and call Persistent's
 * ``_start``/``_wait`` (the Python, which stays the one full description)
 * for everything else: no request bound (another algorithm, a timeout, the
 * native module off), a callback running or a thread in the gate (the
 * Python raises the error that applies), a run already handed to the
 * engine, other requests in flight, a second thread waiting.
 *
 * A persistent request of a compiled schedule (_program: an XRun over its
 * kit) runs the same way: start is the gate, the inputs, the call number
 * and the executor's first pass; a run that pass finished is finished
 * there, a pending one is put in the engine's list as a NativeRequest over
 * the XRun (as Python's start lists its ProgramRequest: other threads'
 * waits and the progress thread advance it); wait takes it back when it is
 * the only request listed and finishes it in one blocking pass, the GIL
 * released. Forced ring at 8 B, p = 2: 8.4 -> 3.6 us a start+wait. */
typedef struct {
    PyObject_HEAD
    PyObject *fast;     /* _fast: the library's persistent Req this front runs, or None/NULL */
    PyObject *req;      /* _req: persistent.py's request of the current run, or None/NULL */
    char active;        /* _active: started, not yet waited for */
    long long seq;      /* _seq: the current run's call number */
    /* bound by _front(): the communicator's state, its gate's acquire and
     * release, its call numbers, the engine module, the plan's result, and
     * the steps before MPI_Start and after MPI_Wait (tuples; see run_steps) */
    PyObject *st, *busy, *numbers, *engmod, *result, *pre, *post;
    /* bound by _program(): a compiled schedule's run (an XRun, or NULL: the
     * library's request above, if any), the plan's finish (the listed
     * run's _finish) and the completed request a run finished at its start
     * stands as (_req); the communicator's tag span */
    PyObject *xr, *xfinish, *ran;
    long long tag_span;
    int xbg; /* _program's bg: a pending run of xr goes to the C progress thread */
} Persist;

static PyObject *s__start, *s__wait;

static int Persist_traverse(Persist *self, visitproc visit, void *arg) {
    Py_VISIT(self->fast);
    Py_VISIT(self->req);
    Py_VISIT(self->st);
    Py_VISIT(self->busy);
    Py_VISIT(self->numbers);
    Py_VISIT(self->engmod);
    Py_VISIT(self->result);
    Py_VISIT(self->pre);
    Py_VISIT(self->post);
    Py_VISIT(self->xr);
    Py_VISIT(self->xfinish);
    Py_VISIT(self->ran);
    return 0;
}

static void Persist_unbind(Persist *self) {
    Py_CLEAR(self->st);
    Py_CLEAR(self->busy);
    Py_CLEAR(self->numbers);
    Py_CLEAR(self->engmod);
    Py_CLEAR(self->result);
    Py_CLEAR(self->pre);
    Py_CLEAR(self->post);
}

static int Persist_clear(Persist *self) {
    Py_CLEAR(self->fast);
    Py_CLEAR(self->req);
    Py_CLEAR(self->xr);
    Py_CLEAR(self->xfinish);
    Py_CLEAR(self->ran);
    Persist_unbind(self);
    return 0;
}

static void Persist_dealloc(Persist *self) {
    PyObject_GC_UnTrack(self);
    Persist_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The bound Req, or NULL: the C path applies (no error set either way). */
static Req *persist_fast(Persist *self) {
    if (self->fast == NULL || Py_TYPE(self->fast) != &ReqType || self->st == NULL)
        return NULL;
    return (Req *)self->fast;
}

/* _front(st, engine, result, pre, post): bind the facts the C start and
 * wait use (persistent.py, once): the communicator's state, the engine
 * module, the plan's result, and its steps as tuples - ``pre`` (the stage
 * and the prologue) before MPI_Start, ``post`` (the finish) after MPI_Wait;
 * a step is a callable, or (dst, src) for a buffers.Copy. ``_fast`` then
 * names the library's request; setting it to None turns the C path off. */
static PyObject *Persist_front(Persist *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_Check(args[3]) || !PyTuple_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: _front(st, engine, result, pre, post), the steps tuples");
        return NULL;
    }
    PyObject *busy = PyObject_GetAttr(args[0], s_busy), *numbers = PyObject_GetAttr(args[0], s_numbers);
    if (busy == NULL || numbers == NULL) {
        Py_XDECREF(busy);
        Py_XDECREF(numbers);
        return NULL;
    }
    Persist_unbind(self);
    self->busy = busy;
    self->numbers = numbers;
    PyObject **slots[] = {&self->st, &self->engmod, &self->result, &self->pre, &self->post};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(args[i]);
        *slots[i] = args[i];
    }
    Py_RETURN_NONE;
}

/* Run a tuple of steps: call each callable; a (dst, src) pair is one
 * memmove where both are contiguous arrays of one dtype and size (what
 * ``dst[...] = src`` does then), else that assignment. 0, or -1 with the
 * step's error set. */
static int run_steps(PyObject *steps) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(steps); i++) {
        PyObject *f = PyTuple_GET_ITEM(steps, i);
        if (PyTuple_Check(f) && PyTuple_GET_SIZE(f) == 2) {
            PyObject *dst = PyTuple_GET_ITEM(f, 0), *src = PyTuple_GET_ITEM(f, 1);
            PyArrayObject *d = (PyArrayObject *)dst, *s = (PyArrayObject *)src;
            if (PyArray_CheckExact(dst) && PyArray_CheckExact(src) && PyArray_ISCARRAY(d)
                && PyArray_IS_C_CONTIGUOUS(s) && PyArray_NBYTES(d) == PyArray_NBYTES(s)
                && PyArray_SIZE(d) == PyArray_SIZE(s) && PyArray_EquivTypes(PyArray_DESCR(d), PyArray_DESCR(s))) {
                if (PyArray_NBYTES(d) > 0)
                    memmove(PyArray_DATA(d), PyArray_DATA(s), (size_t)PyArray_NBYTES(d));
            } else if (PyObject_SetItem(dst, Py_Ellipsis, src) < 0)
                return -1;
        } else {
            PyObject *r = PyObject_CallNoArgs(f);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
        }
    }
    return 0;
}

static int persist_leave(Persist *self);

static PyObject *persist_again(void) {
    PyErr_SetString(PyExc_RuntimeError,
                    "mpicoll: persistent request started again before it completed (wait() first)");
    return NULL;
}

/* The start of a run in C, either kind (Persistent._start's first steps):
 * the started-again error; runtime.enter's two checks - a callback
 * running, a thread in the gate - where 0 is returned (the Python start
 * raises the error that applies); the gate taken; Plan.inputs (the stage,
 * then the prologue); the call number (*seq). 1: entered, the gate held
 * (persist_leave gives it back); -1: an error set, the gate given back. */
static int persist_enter(Persist *self, long long *seq) {
    if (self->active) {
        persist_again();
        return -1;
    }
    PyObject *v = PyObject_GetAttr(self->engmod, s_running);
    if (v == NULL)
        return -1;
    int running = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (running < 0)
        return -1;
    int took = running ? 0 : gate_take(self->busy);
    if (took != 1)
        return took;
    PyObject *num = run_steps(self->pre) < 0 ? NULL : take_number(self->numbers, self->st);
    long long sv = num == NULL ? -1 : PyLong_AsLongLong(num);
    Py_XDECREF(num);
    if (sv == -1 && PyErr_Occurred()) {
        persist_leave(self);
        return -1;
    }
    *seq = sv;
    return 1;
}

/* The gate given back, an error set meanwhile kept: 0, or -1. */
static int persist_leave(Persist *self) {
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    if (gate_give(self->busy) < 0) {
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
        return -1;
    }
    PyErr_Restore(exc_type, exc_value, exc_tb);
    return 0;
}

/* _program(xr, finish, ran[, bg]): run a compiled schedule's starts and
 * waits here (after _front): ``xr`` the XRun over the request's kit,
 * ``finish`` the plan's finish (None or a callable; ``post`` holds it as
 * steps), ``ran`` the completed request a run that finished at its start
 * stands as; ``bg``: a run its start leaves pending goes to the C progress
 * thread too (engine.start_native's rule for 1-4 MiB, decided by
 * persistent.py). _program(None, None, None) turns it off (a failed run:
 * the next start, in Python, makes a new kit and binds it again). */
static PyObject *Persist_program(Persist *self, PyObject *const *args, Py_ssize_t nargs) {
    if ((nargs != 3 && nargs != 4) || (args[0] != Py_None && Py_TYPE(args[0]) != &XRunType)) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: _program(xr, finish, ran[, bg]), xr an XRun or None");
        return NULL;
    }
    int bg = nargs == 4 ? PyObject_IsTrue(args[3]) : 0;
    if (bg < 0)
        return NULL;
    self->xbg = bg;
    if (args[0] == Py_None) {
        Py_CLEAR(self->xr);
        Py_CLEAR(self->xfinish);
        Py_CLEAR(self->ran);
        Py_RETURN_NONE;
    }
    if (self->st == NULL) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: _program() before _front()");
        return NULL;
    }
    PyObject *span = PyObject_GetAttr(self->st, s_tag_span);
    long long ts = span == NULL ? -1 : PyLong_AsLongLong(span);
    Py_XDECREF(span);
    if (ts <= 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "mpicoll native: _program() got a state without a tag span");
        return NULL;
    }
    self->tag_span = ts;
    PyObject **slots[] = {&self->xr, &self->xfinish, &self->ran};
    for (int i = 0; i < 3; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], args[i]);
    }
    Py_RETURN_NONE;
}

/* Put a pending request in the engine's list - engine.list_locked, here
 * while the progress thread exists and no step runs on this thread; else
 * the Python (it spawns the thread, or refuses a call from a step) - so
 * that any thread's wait() or the progress thread advances it while this
 * rank waits for something else. 0, or -1 with an error set. */
static int list_pending(RCore *r) {
    PyObject *thread = PyObject_GetAttr(E_engine, s_thread);
    int is = thread == NULL ? -1 : thread != Py_None;
    Py_XDECREF(thread);
    if (is > 0)
        is = attr_is(E_engine, s_stepper, Py_None);
    if (is > 0) {
        if (lock_take() < 0)
            return -1;
        PyObject *active = PyObject_GetAttr(E_engine, s_active);
        int bad = active == NULL || !PyList_Check(active) || PyList_Append(active, (PyObject *)r) < 0;
        if (!bad)
            r->listed = 1;
        Py_XDECREF(active);
        if (lock_give() < 0 || bad) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "mpicoll native: the engine's list is not a list");
            return -1;
        }
        return 0;
    }
    if (is < 0)
        return -1;
    PyObject *got = PyObject_CallMethodOneArg(E_engine, s_list_native, (PyObject *)r);
    Py_XDECREF(got);
    return got == NULL ? -1 : 0;
}

/* A run a first pass left pending, as the engine's request: a
 * NativeRequest over the XRun ``run`` (``finish`` its _finish), the state
 * ``st`` held, listed (as Python's start lists its ProgramRequest). The
 * request, or NULL with an error. */
static PyObject *listed_request(PyObject *run, PyObject *result, PyObject *finish, PyObject *st) {
    RCore *r = (RCore *)new_request(run, result, finish, st);
    if (r == NULL)
        return NULL;
    if (list_pending(r) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

/* A completed request carrying ``exc`` (Python's start records a finish's
 * error so: engine.Request.completed, its _error set). */
static PyObject *completed_with(Persist *self, PyObject *exc) {
    PyObject *cls = PyObject_GetAttrString(self->engmod, "Request");
    PyObject *req = cls == NULL ? NULL : PyObject_CallMethod(cls, "completed", "O", self->result);
    Py_XDECREF(cls);
    if (req != NULL && PyObject_SetAttrString(req, "_error", exc) < 0)
        Py_CLEAR(req);
    return req;
}

/* start() of a compiled schedule's run: Persistent._start's program branch
 * (the gate, the inputs, the call number and its tag, the executor's first
 * pass); a run the pass finished is finished here (``ran``), a pending one
 * listed (listed_request), an executor error handed to Python's _xstarted. */
static PyObject *persist_xstart(Persist *self, XRun *x) {
    if (E_cls == NULL || x->active)
        return self->active ? persist_again() : PyObject_CallMethodNoArgs((PyObject *)self, s__start);
    /* (a shared-memory program whose window does not take a run now: Python's start runs the schedule) */
    if (!xrun_ready(x->xrun, x->steps, x->nsteps, x->lists, x->op, x->dtype, x->handle, x->info))
        return PyObject_CallMethodNoArgs((PyObject *)self, s__start);
    long long sv;
    int entered = persist_enter(self, &sv), rc = MPICOLL_X_DONE;
    if (entered <= 0)
        return entered < 0 ? NULL : PyObject_CallMethodNoArgs((PyObject *)self, s__start);
    self->seq = x->seq = sv;
    x->tag = (int)(1 + sv % self->tag_span);
    x->active = 1;
    rc = x->xrun(x->state, x->steps, x->nsteps, x->lists, x->buf, x->src, x->scratch, x->op, x->dtype, x->handle,
                 x->tag, 0, x->info);
    if (rc != MPICOLL_X_PENDING)
        x->active = 0;
    if (persist_leave(self) < 0)
        return NULL;
    PyObject *req;
    if (rc == MPICOLL_X_DONE) {
        if (run_steps(self->post) == 0) {
            Py_INCREF(self->ran);
            req = self->ran;
        } else {
            PyObject *t, *e, *tb;
            PyErr_Fetch(&t, &e, &tb);
            PyErr_NormalizeException(&t, &e, &tb);
            req = completed_with(self, e);
            Py_XDECREF(t);
            Py_XDECREF(e);
            Py_XDECREF(tb);
        }
    } else if (rc == MPICOLL_X_PENDING) {
        req = listed_request((PyObject *)x, self->result, self->xfinish, self->st);
        if (req != NULL && self->xbg) { /* (not handed: it stays listed only) */
            PyObject *b = XRun_background(x, NULL);
            Py_XDECREF(b);
            if (b == NULL)
                PyErr_Clear();
        }
    }
    else
        req = PyObject_CallMethod((PyObject *)self, "_xstarted", "iiL", rc, x->tag, x->seq);
    if (req == NULL)
        return NULL; /* (a pending run stays with the library: x->active keeps what it points into) */
    Py_XSETREF(self->req, req);
    self->active = 1;
    Py_RETURN_NONE;
}

/* wait() of a compiled schedule's run: a run finished at its start returns
 * at once; a pending one that is the only request in the engine's list is
 * taken back (as wait_native does) and finished here in one blocking pass,
 * the GIL released, then the plan's finish; anything else is Python's
 * _wait (which drives it with the others). */
static PyObject *persist_xwait(Persist *self, XRun *x) {
    if (!self->active) {
        Py_INCREF(self->result);
        return self->result;
    }
    PyObject *req = self->req;
    if (req != NULL && req == self->ran) {
        self->active = 0;
        Py_CLEAR(self->req);
        Py_INCREF(self->result);
        return self->result;
    }
    if (req == NULL || Py_TYPE(req) != (PyTypeObject *)E_cls || ((RCore *)req)->mpi != (PyObject *)x)
        return PyObject_CallMethodNoArgs((PyObject *)self, s__wait);
    RCore *r = (RCore *)req;
    if (lock_take() < 0)
        return NULL;
    PyObject *active = PyObject_GetAttr(E_engine, s_active);
    int bad = active == NULL || !PyList_Check(active), alone = 0;
    if (!bad && !r->finished && !r->blocking && r->listed && PyList_GET_SIZE(active) == 1
        && PyList_GET_ITEM(active, 0) == req && (r->deadline == NULL || r->deadline == Py_None)) {
        bad = PyList_SetSlice(active, 0, 1, NULL) < 0;
        if (!bad) {
            alone = 1;
            r->listed = 0;
            r->blocking = 1;
        }
    }
    Py_XDECREF(active);
    if (lock_give() < 0 || bad) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "mpicoll native: the engine's list is not a list");
        return NULL;
    }
    if (!alone)
        return PyObject_CallMethodNoArgs((PyObject *)self, s__wait);
    Py_INCREF(req);
    int done;
    if (xrun_finish(x) < 0)
        done = failed_alone(r);
    else {
        /* NativeRequest._end: the finish, its error recorded on the request */
        if (run_steps(self->post) < 0) {
            PyObject *t, *e, *tb;
            PyErr_Fetch(&t, &e, &tb);
            PyErr_NormalizeException(&t, &e, &tb);
            Py_XSETREF(r->error, e);
            Py_XDECREF(t);
            Py_XDECREF(tb);
        }
        done = finish_alone(r);
    }
    int clean = done > 0 && (r->error == NULL || r->error == Py_None) && r->done;
    Py_DECREF(req);
    if (done < 0)
        return NULL;
    if (!clean) /* (an error recorded on the run: Python's _wait raises it) */
        return PyObject_CallMethodNoArgs((PyObject *)self, s__wait);
    self->active = 0;
    Py_CLEAR(self->req);
    Py_INCREF(self->result);
    return self->result;
}

static PyObject *Persist_start(Persist *self, PyObject *unused) {
    (void)unused;
    if (self->xr != NULL) { /* (held: a failed run's Python unbinds it) */
        PyObject *x = Py_NewRef(self->xr), *r = persist_xstart(self, (XRun *)x);
        Py_DECREF(x);
        return r;
    }
    Req *q = persist_fast(self);
    if (q == NULL)
        return PyObject_CallMethodNoArgs((PyObject *)self, s__start);
    long long sv;
    int entered = persist_enter(self, &sv), rc = MPI_SUCCESS;
    if (entered <= 0)
        return entered < 0 ? NULL : PyObject_CallMethodNoArgs((PyObject *)self, s__start);
    self->seq = sv;
    int failed = q->active;
    if (failed)
        PyErr_SetString(PyExc_RuntimeError, "mpicoll native: Start() of an active request");
    else if ((rc = MPI_Start(&q->req)) == MPI_SUCCESS)
        q->active = 1;
    if (persist_leave(self) < 0 || failed)
        return NULL;
    if (rc != MPI_SUCCESS) {
        raise_mpi(rc);
        return NULL;
    }
    self->active = 1;
    Py_CLEAR(self->req);
    Py_RETURN_NONE;
}

static PyObject *Persist_wait(Persist *self, PyObject *unused) {
    (void)unused;
    if (self->xr != NULL) {
        PyObject *x = Py_NewRef(self->xr), *r = persist_xwait(self, (XRun *)x);
        Py_DECREF(x);
        return r;
    }
    Req *q = persist_fast(self);
    if (q == NULL || (self->active && ((self->req != NULL && self->req != Py_None) || q->inside)))
        return PyObject_CallMethodNoArgs((PyObject *)self, s__wait);
    if (!self->active) { /* MPI: waiting on an inactive persistent request returns at once */
        Py_INCREF(self->result);
        return self->result;
    }
    /* Nothing else in flight (engine._engine.active empty; persistent.py's
     * wait reads it the same way, without the lock) */
    if (E_engine == NULL)
        return PyObject_CallMethodNoArgs((PyObject *)self, s__wait);
    PyObject *lst = PyObject_GetAttr(E_engine, s_active);
    if (lst == NULL)
        return NULL;
    int busy = !PyList_Check(lst) || PyList_GET_SIZE(lst) > 0;
    Py_DECREF(lst);
    if (busy)
        return PyObject_CallMethodNoArgs((PyObject *)self, s__wait);
    int rc;
    q->inside = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = MPI_Wait(&q->req, MPI_STATUS_IGNORE);
    Py_END_ALLOW_THREADS
    q->inside = 0;
    self->active = 0;
    Py_CLEAR(self->req);
    if (rc != MPI_SUCCESS) {
        raise_mpi(rc);
        return NULL;
    }
    completed(q);
    if (run_steps(self->post) < 0)
        return NULL;
    Py_INCREF(self->result);
    return self->result;
}

static PyObject *Persist_call(PyObject *self, PyObject *args, PyObject *kw) {
    if ((args != NULL && PyTuple_GET_SIZE(args) > 0) || (kw != NULL && PyDict_GET_SIZE(kw) > 0)) {
        PyErr_SetString(PyExc_TypeError, "mpicoll: a persistent request is called with no arguments");
        return NULL;
    }
    PyObject *r = Persist_start((Persist *)self, NULL);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    return Persist_wait((Persist *)self, NULL);
}

/* Wait(status=None) -> True: mpi4py's spelling. */
static PyObject *Persist_Wait(Persist *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    (void)args;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 1 || (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "status"))) {
        PyErr_SetString(PyExc_TypeError, "mpicoll: Wait(status=None)");
        return NULL;
    }
    PyObject *r = Persist_wait(self, NULL);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_TRUE;
}

static PyMemberDef Persist_members[] = {
    {"_fast", T_OBJECT, offsetof(Persist, fast), 0, "the library's persistent Req the C start/wait run, or None"},
    {"_req", T_OBJECT, offsetof(Persist, req), 0, "the engine's request of the current run, or None"},
    {"_active", T_BOOL, offsetof(Persist, active), 0, "started and not yet waited for"},
    {"_seq", T_LONGLONG, offsetof(Persist, seq), 0, "the current run's call number"},
    {"_xr", T_OBJECT, offsetof(Persist, xr), READONLY, "the XRun the C start/wait run (_program), or None"},
    {NULL, 0, 0, 0, NULL}};

static PyMethodDef Persist_methods[] = {
    {"_front", (PyCFunction)(void (*)(void))Persist_front, METH_FASTCALL,
     "_front(st, engine, result, pre, post): bind what the C start and wait use."},
    {"_program", (PyCFunction)(void (*)(void))Persist_program, METH_FASTCALL,
     "_program(xr, finish, ran): run a compiled schedule's starts and waits in C (None: not)."},
    {"start", (PyCFunction)Persist_start, METH_NOARGS, "Start the collective (MPI_Start)."},
    {"Start", (PyCFunction)Persist_start, METH_NOARGS, "start(), mpi4py's spelling."},
    {"wait", (PyCFunction)Persist_wait, METH_NOARGS, "Wait for the run and return the result."},
    {"Wait", (PyCFunction)(void (*)(void))Persist_Wait, METH_FASTCALL | METH_KEYWORDS,
     "Wait(status=None) -> True: wait(), mpi4py's spelling."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject PersistType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpicoll.native.PersistFront",
    .tp_basicsize = sizeof(Persist),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A persistent request's start and wait in C (persistent.Persistent's base; see csrc/native.c).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)Persist_traverse,
    .tp_clear = (inquiry)Persist_clear,
    .tp_dealloc = (destructor)Persist_dealloc,
    .tp_call = Persist_call,
    .tp_methods = Persist_methods,
    .tp_members = Persist_members,
};

/* ---- a program's I-call, in C (a gated kept all-reduce's start_kept) --------
 *
 * ``mpicoll.iallreduce(x, out=y, algorithm=...)`` of a kept signature whose
 * compiled schedule (or shm's program) the blocking calls already run in C
 * (K_PROGRAM, gated): kept_run makes the call's checks, takes the gate, the
 * call number and its tag as for a blocking call, then runs the executor's
 * first pass on the Call's I-run - an XRun over a kit of its own
 * (executor.Executable.point), the call's arrays bound to it for the run.
 * A run that pass finished is a completed request; a pending one is the
 * engine's NativeRequest over the XRun, listed as Python's ProgramRequest
 * is (other threads' waits and the progress thread advance it); its wait()
 * with nothing else listed takes it back and finishes it in one blocking
 * pass, the GIL released (wait_alone). An error of the pass is recorded on
 * the request and raised by wait(), as ProgramRequest does. One run at a
 * time: while the I-run is in flight, another I-call of the signature
 * misses, and kept.py's ProgramRequest runs it on a kit of its own. */

/* Whether kept_run may run an I-call on the Call's I-run now. */
static int iprogram_free(Call *self) {
    XRun *x = (XRun *)self->ixr;
    return x != NULL && !x->active && !x->inside && E_cls != NULL;
}

/* The first pass of an I-call on ``ixr``: the arrays (xo, out) held and
 * their data (buf, src) bound, the run numbered (tag, seq). The executor's
 * status (DONE or PENDING), or -1 with the run's error set (its fail() has
 * kept the kit and the arrays). */
static int iprogram_pass(PyObject *ixr, PyObject *xo, PyObject *out, char *buf, char *src, int tag, long long seq) {
    XRun *x = (XRun *)ixr;
    /* (two references, not a tuple: no allocation per call) */
    Py_XSETREF(x->bo, Py_NewRef(out));
    Py_XSETREF(x->bx, xo == out ? NULL : Py_NewRef(xo));
    x->buf = buf;
    x->src = src;
    x->tag = tag;
    x->seq = seq;
    x->active = 1;
    return xrun_pass(x, 0);
}

/* The request of an I-call of ``nbytes`` whose first pass ended with
 * ``rc``: pending, the engine's NativeRequest over the run, listed, the
 * state ``st`` held - or, from the engine's list_min, the pair (out, run)
 * for engine.start_native (api.started_long), which hands a long run to
 * the C thread (XRun.background) or lists it, woken; otherwise a
 * completed one, the pass's error (set: rc -1) recorded on it. NULL with
 * an error of ours. */
static PyObject *iprogram_request(PyObject *ixr, int rc, PyObject *out, PyObject *st, Py_ssize_t nbytes) {
    if (rc == MPICOLL_X_PENDING && nbytes >= E_list_min)
        return PyTuple_Pack(2, out, ixr); /* (the run holds its arrays: x->bo, x->bx) */
    if (rc == MPICOLL_X_PENDING) {
        /* (on an error the run stays active: the XRun keeps what it points into) */
        return listed_request(ixr, out, NULL, st);
    }
    PyObject *exc = NULL;
    if (rc < 0) {
        PyObject *t, *tb;
        PyErr_Fetch(&t, &exc, &tb);
        PyErr_NormalizeException(&t, &exc, &tb);
        if (tb != NULL && exc != NULL)
            PyException_SetTraceback(exc, tb);
        Py_XDECREF(t);
        Py_XDECREF(tb);
    }
    PyTypeObject *cls = (PyTypeObject *)E_cls;
    RCore *r = (RCore *)cls->tp_alloc(cls, 0);
    if (r == NULL) {
        Py_XDECREF(exc);
        return NULL;
    }
    r->result = Py_NewRef(out);
    r->error = exc;
    r->finished = r->done = 1;
    return (PyObject *)r;
}

/* program_i(xr): the XRun (buffers unbound) this program Call's I-calls
 * run on, or None: they miss. */
static PyObject *Call_program_i(Call *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || (args[0] != Py_None && Py_TYPE(args[0]) != &XRunType) || self->kind != K_PROGRAM) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: program_i(xr), a program Call's, xr an XRun or None");
        return NULL;
    }
    Py_XSETREF(self->ixr, args[0] == Py_None ? NULL : Py_NewRef(args[0]));
    Py_RETURN_NONE;
}

/* ---- the front doors of the gated calls, in C ---------------------------------
 *
 * ``mpicoll.allreduce`` and the other gated doors (api.py) are Door objects
 * over their Python functions when this module is built, and mpicoll.Comm's
 * methods of the same collectives MethodDoors (dropin.py): a repeated call
 * of a kept, gated signature with the usual arguments - a numpy array, a
 * string op, ``comm``, ``out``, ``algorithm``, ``root`` and nothing else -
 * builds the signature's key exactly as the Python door does (api.py's
 * ``_door`` keys, e.g. ``(name, x.shape, x.dtype, op, algorithm, mode)``;
 * a change to those keys must be made here too: the tests' ``fallbacks``
 * counts show a mismatch), finds the kept entry in the
 * communicator's plan cache and runs its gated Call (kept_run). Anything
 * else - another keyword, an MPI.Op, no state or no entry yet, a call the
 * Call does not take (miss) - goes to the Python function with the same
 * arguments, which decides and raises as before. The Python door's frames
 * cost ~0.8 us of a 3 us all-reduce (p = 2, 8 B) and ~1.2 us of an I-call. */
enum door {
    D_ALLREDUCE, D_IALLREDUCE, D_BCAST, D_IBCAST, D_ALLTOALL, D_IALLTOALL, D_GATHER, D_IGATHER, D_REDUCE, D_IREDUCE,
    D_ALLGATHER, D_IALLGATHER, D_REDUCE_SCATTER, D_IREDUCE_SCATTER, D_SCATTER, D_ISCATTER, D_ALLGATHERV,
    D_IALLGATHERV, D_ALLTOALLV, D_IALLTOALLV,
    /* mpicoll.Comm's methods (dropin.py), bound to the communicator (MethodDoor) */
    D_COMM_ALLREDUCE, D_COMM_IALLREDUCE, D_COMM_BCAST, D_COMM_IBCAST, D_COMM_REDUCE, D_COMM_IREDUCE, D_COMM_ALLGATHER,
    D_COMM_IALLGATHER, D_COMM_ALLTOALL, D_COMM_IALLTOALL, D_COMM_GATHER, D_COMM_IGATHER, D_COMM_SCATTER,
    D_COMM_ISCATTER, D_COMM_REDUCE_SCATTER_BLOCK, D_COMM_IREDUCE_SCATTER_BLOCK, D_COMM_ALLGATHERV,
    D_COMM_IALLGATHERV, D_COMM_ALLTOALLV, D_COMM_IALLTOALLV, D_COMM_SCATTERV, D_COMM_ISCATTERV, D_COMM_GATHERV,
    D_COMM_IGATHERV, D_COMM_REDUCE_SCATTER, D_COMM_IREDUCE_SCATTER, D_COUNT
};

/* A door's references, in Door_new's argument order: the Python function,
 * commstate._by_handle, COMM_WORLD's handle, MPI.Comm, the key's name,
 * api.started_long, plancache.MISS; a method's five more: dropin's globals
 * (``_calls``, ``_FAST_OPS``), MPI.SUM, MPI.IN_PLACE, MPI.Op, PLAIN_KINDS;
 * then the instance dict (functools.update_wrapper's attributes). */
enum { R_FALLBACK, R_BY_HANDLE, R_WORLD, R_COMM_TYPE, R_NAME, R_STARTED_LONG, R_MISS, R_GLOBALS, R_SUM_OP,
       R_IN_PLACE, R_OP_TYPE, R_PLAIN_KINDS, R_DICT, R_COUNT };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int which;
    PyObject *refs[R_COUNT];
    Py_ssize_t fallbacks; /* calls handed to the Python function (tests read it) */
    PyObject *m_st, *m_plans, *m_key, *m_fast, *m_version; /* the last hit (door_run); m_plans: m_st.plans */
} Door;

static PyObject *s_comm, *s_out, *s_algorithm, *s_op, *s_root, *s_handle, *s_plans, *s_d_, *s_fast, *s_move_to_end,
    *s_sum, *s_auto, *s_calls_, *s_fast_ops_, *s_size, *s_rank, *s_mpi, *mode_ints[3], *zero;

static PyObject *door_fallback(Door *d, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    d->fallbacks++;
    return PyObject_Vectorcall(d->refs[R_FALLBACK], args, nargsf, kwnames);
}

/* kwnames[i] is ``name`` (interned: identity first) */
static int kw_is(PyObject *k, PyObject *name) {
    return k == name || PyUnicode_Compare(k, name) == 0;
}

/* A door call's keywords: comm and out where the door takes them (non-NULL),
 * algorithm, and op/root (at positions opi/rooti, 0: none) where they were
 * not given by position. 0: another keyword (the function decides). */
static int door_keywords(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **comm, PyObject **out,
                         PyObject **algorithm, int opi, PyObject **op, int rooti, PyObject **root) {
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i), *v = args[nargs + i];
        if (comm != NULL && kw_is(k, s_comm))
            *comm = v;
        else if (kw_is(k, s_algorithm))
            *algorithm = v;
        else if (out != NULL && kw_is(k, s_out))
            *out = v;
        else if (opi && nargs <= opi && kw_is(k, s_op))
            *op = v;
        else if (rooti && nargs <= rooti && kw_is(k, s_root))
            *root = v;
        else
            return 0;
    }
    return 1;
}

/* The communicator's CommState (borrowed), NULL without an error when it has none. */
static PyObject *door_state(Door *d, PyObject *comm) {
    if (comm == Py_None)
        return PyDict_GetItemWithError(d->refs[R_BY_HANDLE], d->refs[R_WORLD]);
    int is = PyObject_IsInstance(comm, d->refs[R_COMM_TYPE]);
    if (is <= 0)
        return NULL;
    PyObject *h = PyObject_GetAttr(comm, s_handle);
    if (h == NULL)
        return NULL;
    PyObject *st = PyDict_GetItemWithError(d->refs[R_BY_HANDLE], h);
    Py_DECREF(h);
    return st;
}

/* x's shape as a tuple (x.shape) */
static PyObject *shape_of(PyArrayObject *x) {
    int nd = PyArray_NDIM(x);
    PyObject *shape = PyTuple_New(nd);
    for (int i = 0; shape != NULL && i < nd; i++) {
        PyObject *v = PyLong_FromSsize_t(PyArray_DIMS(x)[i]);
        if (v == NULL)
            Py_CLEAR(shape);
        else
            PyTuple_SET_ITEM(shape, i, v);
    }
    return shape;
}

/* The door's memo (m_*): the state, key, gated Call and plan-cache version
 * of its last hit, after that hit moved the entry to the end. While the
 * cache's version is that one, nothing has been added, cleared or used
 * since, so the entry is still the most recently used: a call with the same
 * state and key runs the Call without the look-up and the move to the end
 * (~0.15 us of a 2 us call: the key hashed twice, the ordered dict's
 * bookkeeping). Any other call takes the full path, which bumps the
 * version after its move (PlanCache.touch's meaning) and remembers. */
static void door_forget(Door *d) {
    Py_CLEAR(d->m_st);
    Py_CLEAR(d->m_plans);
    Py_CLEAR(d->m_key);
    Py_CLEAR(d->m_fast);
    Py_CLEAR(d->m_version);
}

/* Whether ``shape`` is a tuple of a's dimensions (a's shape). */
static int shape_is(PyObject *shape, PyArrayObject *a) {
    int nd = PyArray_NDIM(a);
    if (!PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) != nd)
        return 0;
    for (int i = 0; i < nd; i++) {
        PyObject *v = PyTuple_GET_ITEM(shape, i);
        if (!PyLong_CheckExact(v) || PyLong_AsSsize_t(v) != PyArray_DIMS(a)[i]) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* Whether the door's memo has state ``st`` and a key of the n ``items``,
 * an item NULL standing for the shape of shapes[i]: a repeated call is
 * compared item by item, without making its shape and key tuples (their
 * allocation, and the collections of the cyclic GC that tracked tuples
 * bring on, were half of what a door added to a short call). */
static int memo_same(Door *d, PyObject *st, PyObject *const *items, PyArrayObject *const *shapes, Py_ssize_t n) {
    PyObject *key = d->m_key;
    if (st != d->m_st || key == NULL || PyTuple_GET_SIZE(key) != n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyTuple_GET_ITEM(key, i);
        if (items[i] == NULL) {
            if (!shape_is(m, shapes[i]))
                return 0;
            continue;
        }
        if (items[i] == m)
            continue;
        int eq = PyObject_RichCompareBool(items[i], m, Py_EQ);
        if (eq <= 0) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* The key of the n ``items`` (an item NULL: the shape of shapes[i]), as
 * api.py builds it: a new tuple, or NULL with *memo set when the door's
 * memo holds that key already (memo_same: nothing made), or NULL with an
 * error set. */
static PyObject *door_key(Door *d, PyObject *st, PyObject *const *items, PyArrayObject *const *shapes, Py_ssize_t n,
                          int *memo) {
    if (memo_same(d, st, items, shapes, n)) {
        *memo = 1;
        return NULL;
    }
    PyObject *key = PyTuple_New(n);
    for (Py_ssize_t i = 0; key != NULL && i < n; i++) {
        PyObject *v = items[i] != NULL ? Py_NewRef(items[i]) : shape_of(shapes[i]);
        if (v == NULL)
            Py_CLEAR(key);
        else
            PyTuple_SET_ITEM(key, i, v);
    }
    return key;
}

/* The kept entry of ``key`` in st's plan cache, run through its gated Call
 * on (x, out): the result (blocking), the request (start), ``miss`` for no
 * entry or a call the Call does not take (nothing started), NULL with an
 * error. ``key`` NULL: the memo's (memo_same said the call's key is it). */
static PyObject *door_run(Door *d, PyObject *st, PyObject *key, PyObject *x, PyObject *out, int start) {
    PyObject *plans = NULL, *dd = NULL, *k = NULL, *fast = NULL, *res = NULL, *ver = NULL;
    int remembered = 0;
    if (key == NULL)
        key = d->m_key;
    Py_INCREF(key); /* (held: the memo may change below) */
    /* (a state's plan cache is made with it and never replaced: the memo's is this state's) */
    plans = st == d->m_st ? Py_NewRef(d->m_plans) : PyObject_GetAttr(st, s_plans);
    if (plans != NULL && (ver = PyObject_GetAttr(plans, s_version)) != NULL && st == d->m_st && ver == d->m_version) {
        int same = key == d->m_key ? 1 : PyObject_RichCompareBool(key, d->m_key, Py_EQ);
        if (same > 0) {
            remembered = 1;
            fast = Py_NewRef(d->m_fast);
        }
    }
    if (!remembered && !PyErr_Occurred() && plans != NULL && ver != NULL
        && (dd = PyObject_GetAttr(plans, s_d_)) != NULL && PyDict_Check(dd)
        && (k = PyDict_GetItemWithError(dd, key)) != NULL) {
        Py_INCREF(k);
        fast = PyObject_GetAttr(k, s_fast);
    }
    int failed = PyErr_Occurred() != NULL;
    if (!failed && fast != NULL && Py_TYPE(fast) == &CallType) {
        res = kept_run((Call *)fast, x, out, start ? F_START : F_BLOCKING);
        failed = res == NULL;
        if (res != NULL && res != d->refs[R_MISS]) {
            if (!remembered) {
                /* a hit: most recently used (plancache.PlanCache.touch), remembered */
                PyObject *m = PyObject_CallMethodOneArg(dd, s_move_to_end, key), *nv = NULL;
                failed = m == NULL || (nv = PyNumber_Add(ver, one)) == NULL
                         || PyObject_SetAttr(plans, s_version, nv) < 0;
                Py_XDECREF(m);
                if (!failed) {
                    Py_INCREF(st);
                    Py_INCREF(key);
                    Py_INCREF(fast);
                    door_forget(d);
                    d->m_st = st;
                    d->m_plans = Py_NewRef(plans);
                    d->m_key = key;
                    d->m_fast = fast;
                    d->m_version = nv;
                } else
                    Py_XDECREF(nv);
            }
            if (!failed && start && PyTuple_Check(res)) {
                /* a long call, started: the engine lists it (api.started_long) */
                PyObject *r = PyObject_CallFunctionObjArgs(d->refs[R_STARTED_LONG], res, x == Py_None ? out : x, st,
                                                           NULL); /* (scatter's x may be None: its size is out's) */
                Py_SETREF(res, r);
                failed = r == NULL;
            }
            if (failed)
                Py_CLEAR(res);
        }
    }
    Py_XDECREF(fast);
    Py_XDECREF(k);
    Py_XDECREF(dd);
    Py_XDECREF(ver);
    Py_XDECREF(plans);
    Py_DECREF(key);
    if (failed)
        return NULL;
    if (res == NULL) {
        Py_INCREF(d->refs[R_MISS]);
        res = d->refs[R_MISS];
    }
    return res;
}

/* The api doors' usual calls: x, then the parameters below by position or
 * by keyword (op defaults to "sum", root to 0), and the keywords comm, out
 * (not bcast's) and algorithm; nothing else. The key is api.py's. */
static const struct {
    int op, root; /* the position of op and root after x (0: none) */
    int out, start;
    int counts; /* count vectors after x (the v-forms: counts; sendcounts, recvcounts) */
} door_params[] = {
    [D_ALLREDUCE] = {1, 0, 1, 0}, [D_IALLREDUCE] = {1, 0, 1, 1}, [D_BCAST] = {0, 1, 0, 0},
    [D_IBCAST] = {0, 1, 0, 1},    [D_ALLTOALL] = {0, 0, 1, 0},   [D_IALLTOALL] = {0, 0, 1, 1},
    [D_GATHER] = {0, 1, 1, 0},    [D_IGATHER] = {0, 1, 1, 1},    [D_REDUCE] = {1, 2, 1, 0},
    [D_IREDUCE] = {1, 2, 1, 1},   [D_ALLGATHER] = {0, 0, 1, 0},  [D_IALLGATHER] = {0, 0, 1, 1},
    [D_REDUCE_SCATTER] = {1, 0, 1, 0}, [D_IREDUCE_SCATTER] = {1, 0, 1, 1}, [D_SCATTER] = {0, 1, 1, 0},
    [D_ISCATTER] = {0, 1, 1, 1},  [D_ALLGATHERV] = {0, 0, 1, 0, 1}, [D_IALLGATHERV] = {0, 0, 1, 1, 1},
    [D_ALLTOALLV] = {0, 0, 1, 0, 2}, [D_IALLTOALLV] = {0, 0, 1, 1, 2},
};

/* A count vector as api.py's key has it (plancache.counts_key): a list or
 * tuple of ints as a tuple (new reference); NULL, no error set, for
 * anything else - an array, another number type, an empty vector - which
 * the function decides. */
static PyObject *counts_of(PyObject *c) {
    if (PyTuple_CheckExact(c) || PyList_CheckExact(c)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(c);
        PyObject **items = PySequence_Fast_ITEMS(c);
        if (n == 0)
            return NULL;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!PyLong_CheckExact(items[i]))
                return NULL;
        return PyTuple_CheckExact(c) ? Py_NewRef(c) : PyList_AsTuple(c);
    }
    return NULL;
}

/* The v-forms' key (x's shape, the dtype, the count vectors c1 and c2 as
 * tuples; mode 0 or 2), as api.py builds it: a new tuple, or NULL (an
 * error set, or none: no key for such counts). */
static PyObject *counts_key(PyArrayObject *x, PyObject *name, PyObject *descr, PyObject *out, PyObject *algorithm,
                            PyObject *c1o, PyObject *c2o) {
    PyObject *shape = shape_of(x), *key = NULL;
    if (shape == NULL)
        return NULL;
    PyObject *c1 = counts_of(c1o), *c2 = c2o != NULL ? counts_of(c2o) : NULL;
    PyObject *m2 = mode_ints[out == Py_None ? 0 : 2];
    if (c1 != NULL && c2o == NULL)
        key = PyTuple_Pack(6, name, shape, descr, c1, algorithm, m2);
    else if (c1 != NULL && c2 != NULL)
        key = PyTuple_Pack(7, name, shape, descr, c1, c2, algorithm, m2);
    Py_XDECREF(c1);
    Py_XDECREF(c2);
    Py_DECREF(shape);
    return key;
}

static PyObject *door_api(Door *d, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int w = d->which, opi = door_params[w].op, rooti = door_params[w].root, nc = door_params[w].counts;
    int npos = 1 + (opi > 0) + (rooti > 0) + nc;
    if (nargs < 1 + nc || nargs > npos) /* (the v-forms' counts: positional only, here) */
        return door_fallback(d, args, nargsf, kwnames);
    PyObject *x = args[0], *op = opi ? (nargs > opi ? args[opi] : s_sum) : NULL;
    PyObject *root = rooti ? (nargs > rooti ? args[rooti] : zero) : NULL;
    PyObject *comm = Py_None, *out = Py_None, *algorithm = s_auto;
    if (!door_keywords(args, nargs, kwnames, &comm, door_params[w].out ? &out : NULL, &algorithm, opi, &op, rooti,
                       &root))
        return door_fallback(d, args, nargsf, kwnames);
    /* scatter's x may be None off root (then out is required: its array stands in) */
    int no_x = (w == D_SCATTER || w == D_ISCATTER) && x == Py_None && PyArray_CheckExact(out);
    PyArrayObject *xa = (PyArrayObject *)(no_x ? out : x);
    if (!PyArray_CheckExact((PyObject *)xa) || !PyUnicode_CheckExact(algorithm)
        || (op != NULL && !PyUnicode_CheckExact(op)) || (root != NULL && !PyLong_CheckExact(root)))
        return door_fallback(d, args, nargsf, kwnames);
    PyObject *st = door_state(d, comm);
    if (st == NULL)
        return PyErr_Occurred() ? NULL : door_fallback(d, args, nargsf, kwnames);
    Py_INCREF(st);
    /* The key, as api.py builds it. The doors' keys but the v-forms' have no
     * item made from an array other than shapes: their items are listed
     * (NULL: the shape of that item's array in shapes), and a repeated call
     * is compared with the memo's key item by item before any tuple is made
     * (door_key). */
    PyObject *descr = (PyObject *)PyArray_DESCR(xa), *name = d->refs[R_NAME], *key = NULL, *res = NULL;
    PyObject *mode = mode_ints[out == Py_None ? 0 : out == x ? 1 : 2], *given = out == Py_None ? Py_False : Py_True;
    PyObject *items[8] = {name, NULL, descr};
    PyArrayObject *shapes[8] = {NULL, xa};
    Py_ssize_t n = 0;
    switch (w) {
    case D_ALLREDUCE:
    case D_IALLREDUCE:
        items[3] = op, items[4] = algorithm, items[5] = mode, n = 6;
        break;
    case D_BCAST:
    case D_IBCAST:
        items[3] = root, items[4] = algorithm, n = 5;
        break;
    case D_GATHER:
    case D_IGATHER: /* (no counts: None) */
        items[3] = Py_None, items[4] = root, items[5] = algorithm, items[6] = given, n = 7;
        break;
    case D_REDUCE:
    case D_IREDUCE: /* (no dtype name: None) */
        items[3] = op, items[4] = Py_None, items[5] = root, items[6] = algorithm, items[7] = mode, n = 8;
        break;
    case D_ALLGATHER:
    case D_IALLGATHER:
        items[3] = algorithm, items[4] = given, n = 5;
        break;
    case D_ALLTOALL:
    case D_IALLTOALL:
        items[3] = algorithm, items[4] = mode, n = 5;
        break;
    case D_REDUCE_SCATTER:
    case D_IREDUCE_SCATTER: /* (no dtype name, no counts: None, None; mode 0 or 2) */
        items[3] = op, items[4] = Py_None, items[5] = Py_None, items[6] = algorithm;
        items[7] = mode_ints[out == Py_None ? 0 : 2], n = 8;
        break;
    case D_SCATTER:
    case D_ISCATTER: /* (x's shape or None off root, out's shape or None, no counts: None) */
        if (no_x)
            items[1] = Py_None;
        if (out == Py_None)
            items[3] = Py_None;
        else if (PyArray_CheckExact(out))
            shapes[3] = (PyArrayObject *)out;
        else
            break; /* (no key: the function decides) */
        items[4] = Py_None, items[5] = root, items[6] = algorithm, n = 7;
        break;
    default: /* the v-forms': counts_key */
        break;
    }
    int memo = 0;
    if (n > 0)
        key = door_key(d, st, items, shapes, n, &memo);
    else if (nc > 0)
        key = counts_key(xa, name, descr, out, algorithm, args[1], nc == 2 ? args[2] : NULL);
    if (key != NULL || memo)
        res = door_run(d, st, key, x, door_params[w].out ? out : Py_None, door_params[w].start);
    else if (!PyErr_Occurred()) { /* (no key for such a call: the function decides) */
        Py_INCREF(d->refs[R_MISS]);
        res = d->refs[R_MISS];
    }
    Py_XDECREF(key);
    Py_DECREF(st);
    if (res != d->refs[R_MISS])
        return res;
    Py_DECREF(res);
    return door_fallback(d, args, nargsf, kwnames);
}

/* mpicoll.Comm's methods with a door, in mpi4py's argument order after
 * self: their buffers, then op and root where they take them (positions
 * in args, self being 0; 0: none), and the keyword algorithm. */
static const struct {
    int nbufs, op, root, start;
} comm_params[] = {
    [D_COMM_ALLREDUCE - D_COMM_ALLREDUCE] = {2, 3, 0, 0}, [D_COMM_IALLREDUCE - D_COMM_ALLREDUCE] = {2, 3, 0, 1},
    [D_COMM_BCAST - D_COMM_ALLREDUCE] = {1, 0, 2, 0},     [D_COMM_IBCAST - D_COMM_ALLREDUCE] = {1, 0, 2, 1},
    [D_COMM_REDUCE - D_COMM_ALLREDUCE] = {2, 3, 4, 0},    [D_COMM_IREDUCE - D_COMM_ALLREDUCE] = {2, 3, 4, 1},
    [D_COMM_ALLGATHER - D_COMM_ALLREDUCE] = {2, 0, 0, 0}, [D_COMM_IALLGATHER - D_COMM_ALLREDUCE] = {2, 0, 0, 1},
    [D_COMM_ALLTOALL - D_COMM_ALLREDUCE] = {2, 0, 0, 0},  [D_COMM_IALLTOALL - D_COMM_ALLREDUCE] = {2, 0, 0, 1},
    [D_COMM_GATHER - D_COMM_ALLREDUCE] = {2, 0, 3, 0},    [D_COMM_IGATHER - D_COMM_ALLREDUCE] = {2, 0, 3, 1},
    [D_COMM_SCATTER - D_COMM_ALLREDUCE] = {2, 0, 3, 0},   [D_COMM_ISCATTER - D_COMM_ALLREDUCE] = {2, 0, 3, 1},
    [D_COMM_REDUCE_SCATTER_BLOCK - D_COMM_ALLREDUCE] = {2, 3, 0, 0},
    [D_COMM_IREDUCE_SCATTER_BLOCK - D_COMM_ALLREDUCE] = {2, 3, 0, 1},
    [D_COMM_ALLGATHERV - D_COMM_ALLREDUCE] = {2, 0, 0, 0}, [D_COMM_IALLGATHERV - D_COMM_ALLREDUCE] = {2, 0, 0, 1},
    [D_COMM_ALLTOALLV - D_COMM_ALLREDUCE] = {2, 0, 0, 0},  [D_COMM_IALLTOALLV - D_COMM_ALLREDUCE] = {2, 0, 0, 1},
    [D_COMM_SCATTERV - D_COMM_ALLREDUCE] = {2, 0, 3, 0},   [D_COMM_ISCATTERV - D_COMM_ALLREDUCE] = {2, 0, 3, 1},
    [D_COMM_GATHERV - D_COMM_ALLREDUCE] = {2, 0, 3, 0},    [D_COMM_IGATHERV - D_COMM_ALLREDUCE] = {2, 0, 3, 1},
    /* (Reduce_scatter's recvcounts: a third positional argument, taken as a buffer's place) */
    [D_COMM_REDUCE_SCATTER - D_COMM_ALLREDUCE] = {3, 4, 0, 0},
    [D_COMM_IREDUCE_SCATTER - D_COMM_ALLREDUCE] = {3, 4, 0, 1},
};

/* The kernel op's name for (dtype, MPI.Op), as dropin._fast_op decided it
 * (its _FAST_OPS; borrowed), or NULL (with an error only if one occurred). */
static PyObject *op_name(Door *d, PyArrayObject *a, PyObject *op) {
    if (Py_TYPE(op) != (PyTypeObject *)d->refs[R_OP_TYPE])
        return NULL;
    PyObject *ops = PyDict_GetItemWithError(d->refs[R_GLOBALS], s_fast_ops_), *h = NULL, *pair = NULL, *name = NULL;
    if (ops != NULL && PyDict_Check(ops) && (h = PyObject_GetAttr(op, s_handle)) != NULL
        && (pair = PyTuple_Pack(2, (PyObject *)PyArray_DESCR(a), h)) != NULL)
        name = PyDict_GetItemWithError(ops, pair);
    Py_XDECREF(h);
    Py_XDECREF(pair);
    return name != NULL && PyUnicode_CheckExact(name) ? name : NULL;
}

/* a plain array of a kind mpi4py maps (dropin's PLAIN_KINDS): 1, 0, -1 */
static int plain_kind(Door *d, PyArrayObject *a) {
    PyObject *kind = PyUnicode_FromOrdinal(PyArray_DESCR(a)->kind);
    int plain = kind == NULL ? -1 : PySequence_Contains(d->refs[R_PLAIN_KINDS], kind);
    Py_XDECREF(kind);
    return plain;
}

/* ``a`` (C-contiguous) as an array of ``dims`` (itself if it has them):
 * dropin's ``reshape`` of the receive buffer. */
static PyObject *as_shape(PyArrayObject *a, int nd, npy_intp *dims) {
    if (PyArray_NDIM(a) == nd && PyArray_CompareLists(PyArray_DIMS(a), dims, nd)) {
        Py_INCREF(a);
        return (PyObject *)a;
    }
    PyArray_Dims shape = {dims, nd};
    return PyArray_Newshape(a, &shape, NPY_CORDER);
}

/* The in-place rule of Allreduce and of Reduce's root: the receive buffer
 * (or IN_PLACE, or None) as send buffer is mode 1, a separate array of its
 * dtype and shape mode 2; -1: neither (the method decides). */
static int reduce_mode(Door *d, PyObject *sendbuf, PyArrayObject *recvbuf, PyObject **x) {
    if (sendbuf == (PyObject *)recvbuf || sendbuf == d->refs[R_IN_PLACE] || sendbuf == Py_None) {
        *x = (PyObject *)recvbuf;
        return 1;
    }
    if (PyArray_CheckExact(sendbuf) && PyArray_NDIM((PyArrayObject *)sendbuf) == 1
        && PyArray_DIMS((PyArrayObject *)sendbuf)[0] == PyArray_DIMS(recvbuf)[0]
        && PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)sendbuf), PyArray_DESCR(recvbuf))) {
        *x = sendbuf;
        return 2;
    }
    return -1;
}

/* mpicoll.Comm's Allreduce, Bcast, Reduce, Allgather, Alltoall and Gather
 * (and their I-forms) on plain arrays: the kept entry the api door filed (what
 * the generated method reaches through its _<collective> method, _door and
 * the api function), with the arrays the method would pass it. Returns
 * what the method returns (None; the request), or miss. */
/* Both arrays as 1-D views (as_shape) for the call the method makes on
 * them flattened, and the first one's shape for the key: 0, or -1 (an
 * error set, or not: the caller's done path sorts it out). */
static int flat_pair(PyArrayObject *a, PyArrayObject *b, PyObject **va, PyObject **vb, PyObject **shape) {
    npy_intp na = PyArray_SIZE(a), nb = PyArray_SIZE(b);
    if ((*va = as_shape(a, 1, &na)) == NULL || (*vb = as_shape(b, 1, &nb)) == NULL
        || (*shape = shape_of((PyArrayObject *)*va)) == NULL)
        return -1;
    return 0;
}

/* The sum of a count tuple's ints (counts_of made it): -1 for a negative
 * count, which the Python path refuses (no error set). */
static Py_ssize_t counts_total(PyObject *c) {
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(c); i++) {
        Py_ssize_t v = PyLong_AsSsize_t(PyTuple_GET_ITEM(c, i));
        if (v < 0) {
            PyErr_Clear();
            return -1;
        }
        total += v;
    }
    return total;
}

/* Whether MPICOLL_ALGORITHM is unset in the environment, as
 * dropin._family_name reads it (the module _env of the door's globals:
 * os.environ's own dict); 0 also where it cannot be read (the Python path
 * reads it). */
static PyObject *s_env_mod, *s_data_, *b_env_algorithm;
static int env_unset(Door *d) {
    PyObject *mod = PyDict_GetItemWithError(d->refs[R_GLOBALS], s_env_mod), *data;
    if (mod == NULL || (data = PyObject_GetAttr(mod, s_data_)) == NULL) {
        PyErr_Clear();
        return 0;
    }
    int unset = PyDict_Check(data) && PyDict_GetItemWithError(data, b_env_algorithm) == NULL && !PyErr_Occurred();
    PyErr_Clear();
    Py_DECREF(data);
    return unset;
}

/* specs.plain_v: the array of a v-form spec ``[array, counts]`` (borrowed)
 * over a C-contiguous array of a plain kind (writable if asked; of
 * ``like``'s dtype when given) whose p counts - a list of non-negative
 * ints, in elements - tile it exactly; *counts gets them as a
 * tuple (new reference). NULL, no error set, for anything else. */
static PyArrayObject *plain_v(Door *d, PyObject *spec, long p, int writable, PyArrayObject *like, PyObject **counts) {
    if ((!PyList_CheckExact(spec) && !PyTuple_CheckExact(spec)) || PySequence_Fast_GET_SIZE(spec) != 2)
        return NULL;
    PyObject *ao = PySequence_Fast_ITEMS(spec)[0];
    if (!PyArray_CheckExact(ao))
        return NULL;
    PyArrayObject *a = (PyArrayObject *)ao;
    if (!PyArray_IS_C_CONTIGUOUS(a) || (writable && !PyArray_ISWRITEABLE(a)) || plain_kind(d, a) <= 0
        || (like != NULL && !PyArray_EquivTypes(PyArray_DESCR(a), PyArray_DESCR(like))))
        return NULL;
    /* (a list: mpi4py reads a tuple here as (counts, displs), parse_v's case) */
    PyObject *c = PyList_CheckExact(PySequence_Fast_ITEMS(spec)[1]) ? counts_of(PySequence_Fast_ITEMS(spec)[1]) : NULL;
    if (c == NULL || PyTuple_GET_SIZE(c) != p) {
        Py_XDECREF(c);
        return NULL;
    }
    Py_ssize_t total = counts_total(c);
    if (total < 0 || total != PyArray_SIZE(a)) {
        Py_DECREF(c);
        return NULL;
    }
    *counts = c;
    return a;
}

static PyObject *door_comm_run(Door *d, PyObject *const *args, PyObject *second, PyObject *root,
                               PyObject *algorithm, PyObject *st) {
    int w = d->which, start = comm_params[w - D_COMM_ALLREDUCE].start;
    PyObject *name = d->refs[R_NAME], *x = NULL, *out = Py_None, *key = NULL, *shape = NULL, *res = NULL, *opn;
    PyObject *oshape = NULL; /* Scatterv's: the receive buffer's shape */
    PyObject *c1 = NULL, *c2 = NULL; /* the v-forms' count vectors */
    PyObject *va = NULL, *vb = NULL; /* reshaped views */
    int memo = 0; /* door_key found the call's key in the memo */
    PyObject *v = PyObject_GetAttr(st, s_size), *rv = PyObject_GetAttr(st, s_rank);
    long p = v == NULL ? -1 : PyLong_AsLong(v), rank = rv == NULL ? -1 : PyLong_AsLong(rv);
    Py_XDECREF(v);
    Py_XDECREF(rv);
    long rt = root == NULL ? -1 : PyLong_AsLong(root);
    if (p <= 0 || rank < 0 || PyErr_Occurred()) {
        PyErr_Clear(); /* (a root out of long's range: the method's error) */
        goto done;
    }
    int reducing = w == D_COMM_ALLREDUCE || w == D_COMM_IALLREDUCE, reduce = w == D_COMM_REDUCE || w == D_COMM_IREDUCE;
    if (reducing || (reduce && rt == rank)) {
        if (!PyArray_CheckExact(args[2]) || PyArray_NDIM((PyArrayObject *)args[2]) != 1)
            goto done;
        PyArrayObject *r = (PyArrayObject *)args[2];
        int mode = reduce_mode(d, args[1], r, &x);
        if (mode < 0 || (opn = op_name(d, r, second)) == NULL)
            goto done;
        out = (PyObject *)r;
        PyObject *descr = (PyObject *)PyArray_DESCR(r);
        PyObject *m = mode_ints[mode];
        PyArrayObject *sh[] = {NULL, r};
        key = root == NULL ? door_key(d, st, (PyObject *[]){name, NULL, descr, opn, algorithm, m}, sh, 6, &memo)
                           : door_key(d, st, (PyObject *[]){name, NULL, descr, opn, Py_None, root, algorithm, m}, sh, 8,
                                      &memo);
    } else if (reduce) {
        /* off root: the send buffer only (mpi4py ignores recvbuf there) */
        if (!PyArray_CheckExact(args[1]) || PyArray_NDIM((PyArrayObject *)args[1]) != 1)
            goto done;
        PyArrayObject *a = (PyArrayObject *)args[1];
        if ((opn = op_name(d, a, second)) == NULL)
            goto done;
        x = (PyObject *)a;
        key = door_key(d, st,
                       (PyObject *[]){name, NULL, (PyObject *)PyArray_DESCR(a), opn, Py_None, root, algorithm,
                                      mode_ints[0]},
                       (PyArrayObject *[]){NULL, a}, 8, &memo);
    } else if (w == D_COMM_GATHER || w == D_COMM_IGATHER) {
        /* specs.plain_rooted: the send buffer everywhere; at root the
         * receive buffer, apart from it, shaped (p,) + its shape */
        if (!PyArray_CheckExact(args[1]) || rt < 0 || rt >= p || plain_kind(d, (PyArrayObject *)args[1]) <= 0)
            goto done;
        PyArrayObject *a = (PyArrayObject *)args[1];
        int nd = PyArray_NDIM(a);
        if (rt == rank) {
            if (!PyArray_CheckExact(args[2]) || nd + 1 > NPY_MAXDIMS)
                goto done;
            PyArrayObject *b = (PyArrayObject *)args[2];
            if (!PyArray_IS_C_CONTIGUOUS(b) || PyArray_SIZE(b) != p * PyArray_SIZE(a) || overlaps(a, b)
                || !PyArray_EquivTypes(PyArray_DESCR(a), PyArray_DESCR(b)))
                goto done;
            npy_intp dims[NPY_MAXDIMS];
            dims[0] = p;
            for (int i = 0; i < nd; i++)
                dims[i + 1] = PyArray_DIMS(a)[i];
            if ((vb = as_shape(b, nd + 1, dims)) == NULL)
                goto done;
            out = vb;
        }
        x = (PyObject *)a;
        key = door_key(d, st,
                       (PyObject *[]){name, NULL, (PyObject *)PyArray_DESCR(a), Py_None, root, algorithm,
                                      out == Py_None ? Py_False : Py_True},
                       (PyArrayObject *[]){NULL, a}, 7, &memo);
    } else if (w == D_COMM_SCATTER || w == D_COMM_ISCATTER) {
        /* specs.plain_rooted, the receive side: the receive buffer
         * everywhere, writable; at root the send buffer, apart from it,
         * shaped (p,) + its shape; elsewhere x is None (mpi4py ignores
         * sendbuf there). The key is api.scatter's (x's shape or None,
         * the dtype, out's shape, no counts: None). */
        if (!PyArray_CheckExact(args[2]) || rt < 0 || rt >= p || plain_kind(d, (PyArrayObject *)args[2]) <= 0)
            goto done;
        PyArrayObject *b = (PyArrayObject *)args[2];
        int nd = PyArray_NDIM(b);
        if (!PyArray_IS_C_CONTIGUOUS(b) || !PyArray_ISWRITEABLE(b))
            goto done;
        if (rt == rank) {
            if (!PyArray_CheckExact(args[1]) || nd + 1 > NPY_MAXDIMS)
                goto done;
            PyArrayObject *a = (PyArrayObject *)args[1];
            if (!PyArray_IS_C_CONTIGUOUS(a) || PyArray_SIZE(a) != p * PyArray_SIZE(b) || overlaps(a, b)
                || !PyArray_EquivTypes(PyArray_DESCR(a), PyArray_DESCR(b)))
                goto done;
            npy_intp dims[NPY_MAXDIMS];
            dims[0] = p;
            for (int i = 0; i < nd; i++)
                dims[i + 1] = PyArray_DIMS(b)[i];
            if ((va = as_shape(a, nd + 1, dims)) == NULL)
                goto done;
            x = va;
        } else
            x = Py_None;
        out = (PyObject *)b;
        PyObject *descr = (PyObject *)PyArray_DESCR(x == Py_None ? b : (PyArrayObject *)x);
        PyObject *xshape = x == Py_None ? Py_None : NULL; /* (None off root; at root va's shape) */
        key = door_key(d, st, (PyObject *[]){name, xshape, descr, NULL, Py_None, root, algorithm},
                       (PyArrayObject *[]){NULL, (PyArrayObject *)va, NULL, b}, 7, &memo);
    } else if (w == D_COMM_REDUCE_SCATTER || w == D_COMM_IREDUCE_SCATTER) {
        /* dropin's plain Reduce_scatter: two C-contiguous arrays of one
         * dtype, the receive buffer writable, p non-negative counts (a list
         * or tuple of ints) that the send buffer's size adds up to and this
         * rank's the receive buffer's, apart; then api.reduce_scatter on
         * both flattened with those counts (out given: mode 2) */
        if (!PyArray_CheckExact(args[1]) || !PyArray_CheckExact(args[2]) || (c1 = counts_of(args[3])) == NULL
            || PyTuple_GET_SIZE(c1) != p)
            goto done;
        PyArrayObject *a = (PyArrayObject *)args[1], *b = (PyArrayObject *)args[2];
        Py_ssize_t total = counts_total(c1), mine = total < 0 ? -1 : PyLong_AsSsize_t(PyTuple_GET_ITEM(c1, rank));
        if (total < 0 || !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_IS_C_CONTIGUOUS(b) || !PyArray_ISWRITEABLE(b)
            || !PyArray_EquivTypes(PyArray_DESCR(a), PyArray_DESCR(b)) || PyArray_SIZE(a) != total
            || PyArray_SIZE(b) != mine || overlaps(a, b) || (opn = op_name(d, b, second)) == NULL)
            goto done;
        if (flat_pair(a, b, &va, &vb, &shape) < 0)
            goto done;
        x = va;
        out = vb;
        key = PyTuple_Pack(8, name, shape, (PyObject *)PyArray_DESCR(a), opn, Py_None, c1, algorithm, mode_ints[2]);
    } else if (w == D_COMM_REDUCE_SCATTER_BLOCK || w == D_COMM_IREDUCE_SCATTER_BLOCK) {
        /* dropin's plain Reduce_scatter_block: two C-contiguous arrays of one
         * dtype, the receive buffer writable, p of its blocks in the send
         * buffer, apart; then api.reduce_scatter on both flattened (its key:
         * no dtype name, no counts: None, None; out given: mode 2) */
        if (!PyArray_CheckExact(args[1]) || !PyArray_CheckExact(args[2]))
            goto done;
        PyArrayObject *a = (PyArrayObject *)args[1], *b = (PyArrayObject *)args[2];
        if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_IS_C_CONTIGUOUS(b) || !PyArray_ISWRITEABLE(b)
            || !PyArray_EquivTypes(PyArray_DESCR(a), PyArray_DESCR(b)) || PyArray_SIZE(a) != p * PyArray_SIZE(b)
            || overlaps(a, b) || (opn = op_name(d, b, second)) == NULL)
            goto done;
        if (flat_pair(a, b, &va, &vb, &shape) < 0)
            goto done;
        x = va;
        out = vb;
        key = PyTuple_Pack(8, name, shape, (PyObject *)PyArray_DESCR(a), opn, Py_None, Py_None, algorithm,
                           mode_ints[2]);
    } else if (w == D_COMM_ALLGATHERV || w == D_COMM_IALLGATHERV) {
        /* dropin's plain Allgatherv: a plain send buffer, a receive spec
         * [array, counts] over a plain writable array of its dtype that the
         * counts tile (specs.plain_v), this rank's count its size, apart;
         * then api.allgatherv on both flattened (out given: mode 2) */
        PyArrayObject *a = (PyArrayObject *)args[1], *b;
        if (!PyArray_CheckExact(args[1]) || !PyArray_IS_C_CONTIGUOUS(a) || plain_kind(d, a) <= 0
            || (b = plain_v(d, args[2], p, 1, a, &c1)) == NULL
            || PyLong_AsSsize_t(PyTuple_GET_ITEM(c1, rank)) != PyArray_SIZE(a) || overlaps(a, b))
            goto done;
        if (flat_pair(a, b, &va, &vb, &shape) < 0)
            goto done;
        x = va;
        out = vb;
        key = PyTuple_Pack(6, name, shape, (PyObject *)PyArray_DESCR(a), c1, algorithm, mode_ints[2]);
    } else if (w == D_COMM_ALLTOALLV || w == D_COMM_IALLTOALLV) {
        /* dropin's plain Alltoallv: both specs [array, counts] over plain
         * arrays of one dtype (the receive one writable), apart; then
         * api.alltoallv on both flattened (out given: mode 2) */
        PyArrayObject *a, *b;
        if ((a = plain_v(d, args[1], p, 0, NULL, &c1)) == NULL || (b = plain_v(d, args[2], p, 1, a, &c2)) == NULL
            || overlaps(a, b))
            goto done;
        if (flat_pair(a, b, &va, &vb, &shape) < 0)
            goto done;
        x = va;
        out = vb;
        key = PyTuple_Pack(7, name, shape, (PyObject *)PyArray_DESCR(a), c1, c2, algorithm, mode_ints[2]);
    } else if (w >= D_COMM_SCATTERV && w <= D_COMM_IGATHERV) {
        /* dropin's _fast_rooted_v: this rank's block (Scatterv's receive
         * buffer, writable; Gatherv's send buffer) a plain array; at root
         * the other spec [array, counts] over a plain array of its dtype
         * (writable for Gatherv) whose count at root is the block's size,
         * apart; elsewhere counts [0, .., block size, .., 0]. Then
         * api.scatter/gather with those counts (keys as api.py builds
         * them) under the algorithm "mpi", which "auto" means here when
         * MPICOLL_ALGORITHM is not set (the Python path decides otherwise). */
        int scatter = w == D_COMM_SCATTERV || w == D_COMM_ISCATTERV;
        PyObject *blk = args[scatter ? 2 : 1], *full = args[scatter ? 1 : 2];
        if (!PyArray_CheckExact(blk) || rt < 0 || rt >= p || !kw_is(algorithm, s_auto) || !env_unset(d))
            goto done;
        PyArrayObject *b = (PyArrayObject *)blk, *a = NULL;
        if (!PyArray_IS_C_CONTIGUOUS(b) || (scatter && !PyArray_ISWRITEABLE(b)) || plain_kind(d, b) <= 0)
            goto done;
        if (rt == rank) {
            if ((a = plain_v(d, full, p, !scatter, b, &c1)) == NULL
                || PyLong_AsSsize_t(PyTuple_GET_ITEM(c1, rank)) != PyArray_SIZE(b) || overlaps(a, b))
                goto done;
        } else {
            if ((c1 = PyTuple_New(p)) == NULL)
                goto done;
            for (long i = 0; i < p; i++) {
                PyObject *v = i == rank ? PyLong_FromSsize_t(PyArray_SIZE(b)) : Py_NewRef(zero);
                if (v == NULL)
                    goto done;
                PyTuple_SET_ITEM(c1, i, v);
            }
        }
        npy_intp nb = PyArray_SIZE(b), na = a == NULL ? 0 : PyArray_SIZE(a);
        if ((vb = as_shape(b, 1, &nb)) == NULL || (a != NULL && (va = as_shape(a, 1, &na)) == NULL))
            goto done;
        PyObject *mpi = s_mpi;
        if (scatter) {
            x = va == NULL ? Py_None : va;
            out = vb;
            if (va != NULL && (shape = shape_of((PyArrayObject *)va)) == NULL)
                goto done;
            if ((oshape = shape_of((PyArrayObject *)vb)) == NULL)
                goto done;
            key = PyTuple_Pack(7, name, shape == NULL ? Py_None : shape, (PyObject *)PyArray_DESCR(b), oshape, c1,
                               root, mpi);
        } else {
            x = vb;
            out = va == NULL ? Py_None : va;
            if ((shape = shape_of((PyArrayObject *)vb)) == NULL)
                goto done;
            key = PyTuple_Pack(7, name, shape, (PyObject *)PyArray_DESCR(b), c1, root, mpi,
                               va == NULL ? Py_False : Py_True);
        }
    } else if (w == D_COMM_BCAST || w == D_COMM_IBCAST) {
        if (!PyArray_CheckExact(args[1]) || plain_kind(d, (PyArrayObject *)args[1]) <= 0)
            goto done;
        x = args[1];
        PyArrayObject *a = (PyArrayObject *)x;
        key = door_key(d, st, (PyObject *[]){name, NULL, (PyObject *)PyArray_DESCR(a), root, algorithm},
                       (PyArrayObject *[]){NULL, a}, 5, &memo);
    } else {
        /* Allgather, Alltoall: two plain C-contiguous arrays of one dtype,
         * reshaped as the method reshapes them */
        if (!PyArray_CheckExact(args[1]) || !PyArray_CheckExact(args[2]))
            goto done;
        PyArrayObject *a = (PyArrayObject *)args[1], *b = (PyArrayObject *)args[2];
        if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_IS_C_CONTIGUOUS(b)
            || !PyArray_EquivTypes(PyArray_DESCR(a), PyArray_DESCR(b)) || plain_kind(d, a) <= 0)
            goto done;
        npy_intp dims[NPY_MAXDIMS];
        if (w == D_COMM_ALLGATHER || w == D_COMM_IALLGATHER) {
            int nd = PyArray_NDIM(a);
            if (nd + 1 > NPY_MAXDIMS || PyArray_SIZE(b) != p * PyArray_SIZE(a))
                goto done;
            dims[0] = p;
            for (int i = 0; i < nd; i++)
                dims[i + 1] = PyArray_DIMS(a)[i];
            if ((vb = as_shape(b, nd + 1, dims)) == NULL)
                goto done;
            x = (PyObject *)a;
            out = vb;
            key = door_key(d, st, (PyObject *[]){name, NULL, (PyObject *)PyArray_DESCR(a), algorithm, Py_True},
                           (PyArrayObject *[]){NULL, a}, 5, &memo);
        } else {
            if (PyArray_SIZE(a) != PyArray_SIZE(b) || PyArray_SIZE(a) % p)
                goto done;
            dims[0] = p;
            dims[1] = PyArray_SIZE(a) / p;
            if ((va = as_shape(a, 2, dims)) == NULL || (vb = as_shape(b, 2, dims)) == NULL)
                goto done;
            x = va;
            out = vb;
            key = door_key(d, st, (PyObject *[]){name, NULL, (PyObject *)PyArray_DESCR(a), algorithm, mode_ints[2]},
                           (PyArrayObject *[]){NULL, (PyArrayObject *)va}, 5, &memo);
        }
    }
    if (key != NULL || memo)
        res = door_run(d, st, key, x, out, start);
done:
    Py_XDECREF(key);
    Py_XDECREF(shape);
    Py_XDECREF(oshape);
    Py_XDECREF(c1);
    Py_XDECREF(c2);
    Py_XDECREF(va);
    Py_XDECREF(vb);
    if (res == NULL && !PyErr_Occurred()) {
        Py_INCREF(d->refs[R_MISS]);
        res = d->refs[R_MISS];
    }
    return res;
}

static PyObject *door_comm(Door *d, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int w = d->which, lead = 1 + comm_params[w - D_COMM_ALLREDUCE].nbufs; /* self and the buffers */
    int opi = comm_params[w - D_COMM_ALLREDUCE].op, rooti = comm_params[w - D_COMM_ALLREDUCE].root;
    if (nargs < lead || nargs > lead + (opi > 0) + (rooti > 0))
        return door_fallback(d, args, nargsf, kwnames);
    PyObject *op = opi ? (nargs > opi ? args[opi] : d->refs[R_SUM_OP]) : NULL;
    PyObject *root = rooti ? (nargs > rooti ? args[rooti] : zero) : NULL, *algorithm = s_auto;
    if (!door_keywords(args, nargs, kwnames, NULL, NULL, &algorithm, opi, &op, rooti, &root))
        return door_fallback(d, args, nargsf, kwnames);
    PyObject *calls = PyDict_GetItemWithError(d->refs[R_GLOBALS], s_calls_); /* counting: the Python path counts */
    if (calls != Py_None || !PyUnicode_CheckExact(algorithm) || (root != NULL && !PyLong_CheckExact(root)))
        return PyErr_Occurred() ? NULL : door_fallback(d, args, nargsf, kwnames);
    PyObject *st = door_state(d, args[0]), *res;
    if (st == NULL)
        return PyErr_Occurred() ? NULL : door_fallback(d, args, nargsf, kwnames);
    Py_INCREF(st);
    res = door_comm_run(d, args, op, root, algorithm, st);
    Py_DECREF(st);
    if (res == NULL)
        return NULL;
    if (res == d->refs[R_MISS]) {
        Py_DECREF(res);
        return door_fallback(d, args, nargsf, kwnames);
    }
    if (comm_params[w - D_COMM_ALLREDUCE].start)
        return res;
    Py_DECREF(res); /* mpi4py's blocking methods return None */
    Py_RETURN_NONE;
}

static PyObject *door_call(Door *d, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return d->which >= D_COMM_ALLREDUCE ? door_comm(d, args, nargsf, kwnames) : door_api(d, args, nargsf, kwnames);
}

static int Door_traverse(Door *d, visitproc visit, void *arg) {
    for (int i = 0; i < R_COUNT; i++)
        Py_VISIT(d->refs[i]);
    Py_VISIT(d->m_st);
    Py_VISIT(d->m_plans);
    Py_VISIT(d->m_key);
    Py_VISIT(d->m_fast);
    Py_VISIT(d->m_version);
    return 0;
}

static void door_forget(Door *d);

static int Door_clear(Door *d) {
    for (int i = 0; i < R_COUNT; i++)
        Py_CLEAR(d->refs[i]);
    door_forget(d);
    return 0;
}

static void Door_dealloc(Door *d) {
    PyObject_GC_UnTrack(d);
    Door_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyTypeObject MethodDoorType;

/* Door(which, fallback, by_handle, world_handle, Comm, name, started_long, miss[, extra]);
 * a method's ``extra``: (dropin's globals, MPI.SUM, MPI.IN_PLACE, MPI.Op, PLAIN_KINDS) */
static PyObject *Door_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    int which;
    PyObject *o[7], *extra = NULL;
    if (kw != NULL && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "mpicoll native: Door() takes positional arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "iOO!OOUOO|O!:Door", &which, &o[0], &PyDict_Type, &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &PyTuple_Type, &extra))
        return NULL;
    int method = which >= D_COMM_ALLREDUCE;
    if (which < 0 || which >= D_COUNT || !PyCallable_Check(o[0]) || !PyType_Check(o[3])
        || method != (extra != NULL) || (extra != NULL && PyTuple_GET_SIZE(extra) != 5)) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: Door() needs a door kind, a function, a type (and a "
                                          "method's five extras)");
        return NULL;
    }
    if (method != (type == &MethodDoorType)) {
        PyErr_SetString(PyExc_ValueError, "mpicoll native: a method's door is a MethodDoor, a function's a Door");
        return NULL;
    }
    Door *d = (Door *)type->tp_alloc(type, 0);
    if (d == NULL)
        return NULL;
    d->vectorcall = (vectorcallfunc)door_call;
    d->which = which;
    for (int i = 0; i < 7; i++) {
        Py_INCREF(o[i]);
        d->refs[i] = o[i];
    }
    for (Py_ssize_t i = 0; extra != NULL && i < 5; i++) {
        Py_INCREF(PyTuple_GET_ITEM(extra, i));
        d->refs[R_GLOBALS + i] = PyTuple_GET_ITEM(extra, i);
    }
    if (extra != NULL && (!PyDict_Check(d->refs[R_GLOBALS]) || !PyType_Check(d->refs[R_OP_TYPE]))) {
        Py_DECREF(d);
        PyErr_SetString(PyExc_TypeError, "mpicoll native: a method's door needs dropin's globals and MPI.Op");
        return NULL;
    }
    return (PyObject *)d;
}

static PyObject *Door_repr(Door *d) {
    return PyUnicode_FromFormat("<mpicoll door in C over %R>", d->refs[R_FALLBACK]);
}

static PyObject *Door_call(PyObject *self, PyObject *args, PyObject *kw) {
    return PyVectorcall_Call(self, args, kw);
}

static PyObject *Door_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)obj;
    (void)type;
    Py_INCREF(self); /* a door stored on a class stays a plain function (as builtins do) */
    return self;
}

static PyMemberDef Door_members[] = {
    {"fallbacks", T_PYSSIZET, offsetof(Door, fallbacks), 0, "calls handed to the Python function"},
    {NULL, 0, 0, 0, NULL}};

/* pickled by name, as a function is (its __module__ and __qualname__ are
 * the function's: functools.update_wrapper) */
static PyObject *Door_reduce(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef Door_methods[] = {
    {"__reduce__", (PyCFunction)Door_reduce, METH_NOARGS, "pickled by name, as the function"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Door_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL}, {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject DoorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpicoll.native.Door",
    .tp_basicsize = sizeof(Door),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A gated collective's front door in C over its Python function (see csrc/native.c).",
    .tp_new = Door_new,
    .tp_call = Door_call,
    .tp_descr_get = Door_get,
    .tp_vectorcall_offset = offsetof(Door, vectorcall),
    .tp_dictoffset = offsetof(Door, refs) + R_DICT * sizeof(PyObject *),
    .tp_members = Door_members,
    .tp_getset = Door_getset,
    .tp_methods = Door_methods,
    .tp_repr = (reprfunc)Door_repr,
    .tp_traverse = (traverseproc)Door_traverse,
    .tp_clear = (inquiry)Door_clear,
    .tp_dealloc = (destructor)Door_dealloc,
};

/* mpicoll.Comm's doors: bound to the communicator like the methods they
 * stand for (a method descriptor: the interpreter passes the instance as
 * the first argument without making a bound method). */
static PyObject *MethodDoor_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyTypeObject MethodDoorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpicoll.native.MethodDoor",
    .tp_base = &DoorType, /* (the rest is Door's) */
    .tp_basicsize = sizeof(Door),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "A gated collective's mpicoll.Comm method in C over its Python method (see csrc/native.c).",
    .tp_new = Door_new,
    .tp_call = Door_call,
    .tp_descr_get = MethodDoor_get,
    .tp_vectorcall_offset = offsetof(Door, vectorcall),
    .tp_traverse = (traverseproc)Door_traverse,
    .tp_clear = (inquiry)Door_clear,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, NULL, "The MPI library's collectives on numpy arrays.",
                                    -1, module_methods};

static PyObject *init(const char *name) {
    import_array1(NULL);  /* (returns NULL with numpy's error if numpy's C API is missing) */
    module.m_name = name;
    if (PyType_Ready(&CallType) < 0 || PyType_Ready(&ReqType) < 0 || PyType_Ready(&DoorType) < 0
        || PyType_Ready(&MethodDoorType) < 0 || PyType_Ready(&PersistType) < 0
        || PyType_Ready(&LockType) < 0 || PyType_Ready(&RCoreType) < 0
        || PyType_Ready(&XRunType) < 0)
        return NULL;
    static const struct { PyObject **s; const char *text; } names[] = {
        {&s_freed, "freed"}, {&s_seq, "seq"}, {&s_acquire, "acquire"}, {&s_release, "release"},
        {&s_running, "_running_callbacks"}, {&s_busy, "busy"}, {&s_numbers, "_numbers"}, {&s_env, "env"},
        {&s_env_keys, "env_keys"}, {&s_mode, "mode"}, {&s_tag_span, "tag_span"}, {&s_active, "active"},
        {&s_stepper, "stepper"}, {&s_live_, "_live"}, {&s_version, "version"}, {&s_thread, "thread"},
        {&s_list_native, "list_native"}, {&s_Wait, "Wait"}, {&s_comm, "comm"}, {&s_out, "out"}, {&s_algorithm, "algorithm"},
        {&s_op, "op"}, {&s_root, "root"}, {&s_handle, "handle"}, {&s_plans, "plans"}, {&s_d_, "_d"},
        {&s_fast, "fast"}, {&s_move_to_end, "move_to_end"}, {&s_sum, "sum"}, {&s_auto, "auto"},
        {&s_calls_, "_calls"}, {&s_fast_ops_, "_FAST_OPS"}, {&s_size, "size"}, {&s_rank, "rank"}, {&s__start, "_start"},
        {&s__wait, "_wait"}, {&s_mpi, "mpi"}, {&s_env_mod, "_env"}, {&s_data_, "_DATA"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (*names[i].s == NULL && (*names[i].s = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL)
        return NULL;
    for (int i = 0; i < 3; i++)
        if (mode_ints[i] == NULL && (mode_ints[i] = PyLong_FromLong(i)) == NULL)
            return NULL;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    if (b_env_algorithm == NULL && (b_env_algorithm = PyBytes_FromString("MPICOLL_ALGORITHM")) == NULL)
        return NULL;
    if (MPIException == NULL) {
        PyObject *mpi = PyImport_ImportModule("mpi4py.MPI");
        if (mpi == NULL)
            return NULL;
        MPIException = PyObject_GetAttrString(mpi, "Exception");
        Py_DECREF(mpi);
        if (MPIException == NULL)
            return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddType(m, &CallType) < 0 || PyModule_AddType(m, &DoorType) < 0
        || PyModule_AddType(m, &MethodDoorType) < 0 || PyModule_AddType(m, &PersistType) < 0
        || PyModule_AddType(m, &ReqType) < 0 || PyModule_AddType(m, &LockType) < 0
        || PyModule_AddType(m, &RCoreType) < 0
        || PyModule_AddType(m, &XRunType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    /* NativeRequest.wait (engine.py binds it): an instance method, so that
     * it is bound to the request as a def would be. */
    PyObject *fn = PyCFunction_New(&wait_def, NULL), *meth = fn == NULL ? NULL : PyInstanceMethod_New(fn);
    Py_XDECREF(fn);
    if (meth == NULL || PyModule_AddObject(m, "request_wait", meth) < 0) {
        Py_XDECREF(meth);
        Py_DECREF(m);
        return NULL;
    }
    static const struct { const char *name; int v; } kinds[] = {
        {"ALLREDUCE", K_ALLREDUCE}, {"BCAST", K_BCAST}, {"REDUCE", K_REDUCE}, {"ALLGATHERV", K_ALLGATHERV},
        {"SCATTERV", K_SCATTERV}, {"GATHERV", K_GATHERV}, {"ALLTOALL", K_ALLTOALL},
        {"REDUCE_SCATTER", K_REDUCE_SCATTER}, {"ALLTOALLV", K_ALLTOALLV}, {"PROGRAM", K_PROGRAM},
        {"D_ALLREDUCE", D_ALLREDUCE}, {"D_IALLREDUCE", D_IALLREDUCE}, {"D_BCAST", D_BCAST}, {"D_IBCAST", D_IBCAST},
        {"D_ALLTOALL", D_ALLTOALL}, {"D_GATHER", D_GATHER}, {"D_REDUCE", D_REDUCE}, {"D_ALLGATHER", D_ALLGATHER},
        {"D_IALLTOALL", D_IALLTOALL}, {"D_IGATHER", D_IGATHER}, {"D_IREDUCE", D_IREDUCE},
        {"D_IALLGATHER", D_IALLGATHER}, {"D_REDUCE_SCATTER", D_REDUCE_SCATTER},
        {"D_IREDUCE_SCATTER", D_IREDUCE_SCATTER}, {"D_SCATTER", D_SCATTER}, {"D_ISCATTER", D_ISCATTER},
        {"D_ALLGATHERV", D_ALLGATHERV}, {"D_IALLGATHERV", D_IALLGATHERV}, {"D_ALLTOALLV", D_ALLTOALLV},
        {"D_IALLTOALLV", D_IALLTOALLV},
        {"D_COMM_ALLREDUCE", D_COMM_ALLREDUCE},
        {"D_COMM_IALLREDUCE", D_COMM_IALLREDUCE}, {"D_COMM_BCAST", D_COMM_BCAST}, {"D_COMM_IBCAST", D_COMM_IBCAST},
        {"D_COMM_REDUCE", D_COMM_REDUCE}, {"D_COMM_IREDUCE", D_COMM_IREDUCE}, {"D_COMM_ALLGATHER", D_COMM_ALLGATHER},
        {"D_COMM_IALLGATHER", D_COMM_IALLGATHER}, {"D_COMM_ALLTOALL", D_COMM_ALLTOALL},
        {"D_COMM_IALLTOALL", D_COMM_IALLTOALL}, {"D_COMM_GATHER", D_COMM_GATHER}, {"D_COMM_IGATHER", D_COMM_IGATHER},
        {"D_COMM_SCATTER", D_COMM_SCATTER}, {"D_COMM_ISCATTER", D_COMM_ISCATTER},
        {"D_COMM_REDUCE_SCATTER_BLOCK", D_COMM_REDUCE_SCATTER_BLOCK},
        {"D_COMM_IREDUCE_SCATTER_BLOCK", D_COMM_IREDUCE_SCATTER_BLOCK}, {"D_COMM_ALLGATHERV", D_COMM_ALLGATHERV},
        {"D_COMM_IALLGATHERV", D_COMM_IALLGATHERV}, {"D_COMM_ALLTOALLV", D_COMM_ALLTOALLV},
        {"D_COMM_IALLTOALLV", D_COMM_IALLTOALLV}, {"D_COMM_SCATTERV", D_COMM_SCATTERV},
        {"D_COMM_ISCATTERV", D_COMM_ISCATTERV}, {"D_COMM_GATHERV", D_COMM_GATHERV},
        {"D_COMM_IGATHERV", D_COMM_IGATHERV}, {"D_COMM_REDUCE_SCATTER", D_COMM_REDUCE_SCATTER},
        {"D_COMM_IREDUCE_SCATTER", D_COMM_IREDUCE_SCATTER}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (PyModule_AddIntConstant(m, kinds[i].name, kinds[i].v) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}

/* One source, two module names (the two MPI libraries' builds live side by
 * side in one tree, as the executor's do). */
PyMODINIT_FUNC PyInit__native_mpich(void) { return init("mpicoll._native_mpich"); }
PyMODINIT_FUNC PyInit__native_openmpi(void) { return init("mpicoll._native_openmpi"); }
