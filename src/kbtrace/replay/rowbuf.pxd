# Types for the compiled twin of rowbuf.py (Cython's pure-Python mode: this augmenting .pxd
# makes the row buffer a typed memoryview of its array, so ``add`` is C stores; rowbuf.py
# itself stays plain Python and is what runs interpreted). setup.py copies it beside the
# generated _rowbuf_c.py.
import cython

cdef class _Rows:
    cdef public Py_ssize_t width, n, cap
    cdef object _arr
    cdef double[::1] _buf
    cpdef _grow(self)
    cpdef drop(self, Py_ssize_t k)

cdef class HopRows(_Rows):
    @cython.locals(i=cython.Py_ssize_t)
    cpdef add(self, op, tile, stage, node, link, double enter, double leave, double busy,
              double queue, nbytes)
    @cython.locals(r=tuple)
    cpdef extend(self, rows)

cdef class CompactRows(_Rows):
    cdef public HopRows x
    cdef public double rows
    @cython.locals(i=cython.Py_ssize_t)
    cpdef add(self, double pos, op, tile, plan, double h0, double t0, double done, n)
    @cython.locals(x=HopRows)
    cpdef transfer(self, op, tile, plan, double h0, double t0, double done, n)

cdef class IssueRows(_Rows):
    @cython.locals(i=cython.Py_ssize_t)
    cpdef add(self, double t_issue, double op)

cdef class DoneRows(_Rows):
    cdef public dict codes
    cdef public list names
    cdef public HopRows x
    cdef public CompactRows c
    cdef public Py_ssize_t batch_rows
    cdef public IssueRows iss
    @cython.locals(i=cython.Py_ssize_t)
    cpdef bint add(self, double op, double t_issue, double t_start, double t_end,
                   str engine) except -1
