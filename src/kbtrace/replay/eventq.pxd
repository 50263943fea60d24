# Types for the compiled twin of eventq.py (Cython's pure-Python mode: this augmenting .pxd
# makes the event heap an extension type, its times C doubles and its keys and slots C
# integers, and ``push`` a C call for the compiled modules that cimport it: stations, cpu,
# events). setup.py copies it beside the generated _eventq_c.py.
import cython

cdef long long _PRIO_SHIFT, _PRIO_BIAS, _ID_MASK
cdef Py_ssize_t _CAP0

cdef class EventQueue:
    cdef readonly Py_ssize_t n
    cdef Py_ssize_t nf, cap
    cdef long long eid
    cdef double[::1] t
    cdef long long[::1] k, ix, fr
    cdef list evs
    cdef object _at, _ak, _ai, _af
    @cython.locals(cap=Py_ssize_t)
    cdef _grow(self)
    @cython.locals(key="long long", i=Py_ssize_t, p=Py_ssize_t, tp=double, slot=Py_ssize_t)
    cpdef push(self, double t, long long prio, ev)
    cpdef double peek(self)
    @cython.locals(n=Py_ssize_t, i=Py_ssize_t, c=Py_ssize_t, t=double, tc=double, tr=double,
                   key="long long", slot=Py_ssize_t)
    cpdef object pop(self, env)
