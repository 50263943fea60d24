# Types for the compiled twin of fifo.py (Cython's pure-Python mode: this augmenting .pxd
# types the functions and their locals; fifo.py itself stays plain Python and is what runs
# interpreted). setup.py copies it beside the generated _fifo_c.py.
import cython
from kbtrace.replay.fabric._booking_c cimport Steps

# (imported: C doubles here, so the tests against them compare C doubles)
cdef double TIME_EPS, RATE_EPS

@cython.locals(got=cython.double, y=cython.double, a=cython.double, b=cython.double,
               r=cython.double)
cpdef double _when(list arr, double w, double x)

@cython.locals(acc=cython.double, a=cython.double, b=cython.double, r=cython.double)
cpdef double _arrived(list pcs, double x)

@cython.locals(b=cython.double)
cpdef tuple _burst(double a, double w)

cdef Py_ssize_t _CAP0

cdef class _Work:
    cdef double[::1] ua, ub, ur, uo, taus, us, cis, ts, ss, cs, grid, cums, xs, owed

cdef _Work _WORK

@cython.locals(cap=cython.Py_ssize_t, i=cython.Py_ssize_t, new=cython.double[::1])
cdef double[::1] _room(double[::1] a, Py_ssize_t n=*, Py_ssize_t need=*)

@cython.locals(i=cython.Py_ssize_t, k=cython.Py_ssize_t, w=cython.Py_ssize_t, x=cython.double)
cdef Py_ssize_t _sort_unique(double[::1] v, Py_ssize_t n)

@cython.locals(lo=cython.Py_ssize_t, hi=cython.Py_ssize_t, mid=cython.Py_ssize_t)
cdef Py_ssize_t _bisect(double[::1] v, Py_ssize_t n, double x, bint right)

@cython.locals(m=cython.Py_ssize_t, npc=cython.Py_ssize_t, n=cython.Py_ssize_t,
               i=cython.Py_ssize_t, w=cython.double, d=cython.double, got=cython.double,
               x=cython.double, a=cython.double, b=cython.double, r=cython.double)
cdef Py_ssize_t _unserved(_Work wk, list streams) except -1

@cython.locals(k=cython.Py_ssize_t, g=cython.Py_ssize_t, acc=cython.double, x=cython.double)
cdef void _cum_into(_Work wk, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t nt, Py_ssize_t q)

@cython.locals(wk=_Work, m=cython.Py_ssize_t, nu=cython.Py_ssize_t, nt=cython.Py_ssize_t,
               k=cython.Py_ssize_t, n=cython.Py_ssize_t, j=cython.Py_ssize_t,
               i=cython.Py_ssize_t, nts=cython.Py_ssize_t, ng=cython.Py_ssize_t,
               p1=cython.Py_ssize_t, guard=cython.long,
               total=cython.double, tiny=cython.double, t=cython.double, s=cython.double,
               flat=cython.double,
               c=cython.double, nxt=cython.double, rr=cython.double, q=cython.double,
               rate=cython.double, x=cython.double, r=cython.double, a=cython.double,
               b=cython.double, end=cython.double,
               head=cython.double, w=cython.double, d=cython.double, hw=cython.double,
               u=cython.double, u0=cython.double, u1=cython.double, ta=cython.double,
               tb=cython.double, allp=list, pcs=list, out=list)
cpdef list share_fifo(Steps ln, double t0, list streams)

@cython.locals(need=cython.Py_ssize_t)
cdef _more_s(_Work wk, Py_ssize_t n)

@cython.locals(g=cython.Py_ssize_t, i=cython.Py_ssize_t, k=cython.Py_ssize_t,
               kk=cython.Py_ssize_t, x=cython.double, u0=cython.double, f=cython.double)
cdef _served_by(_Work wk, Py_ssize_t ng, Py_ssize_t nts, Py_ssize_t nt, Py_ssize_t m)

@cython.locals(g=cython.Py_ssize_t, i=cython.Py_ssize_t, p=cython.Py_ssize_t,
               ta=cython.double, tb=cython.double, dt=cython.double, tot=cython.double,
               cap=cython.double, f=cython.double, x=cython.double, dw=cython.double,
               r=cython.double, allp=list, pcs=list)
cdef list _pieces(_Work wk, Py_ssize_t ng, Py_ssize_t m, double tiny)

@cython.locals(k=cython.Py_ssize_t)
cdef double _big_u(_Work wk, Py_ssize_t nt, double total, double tau)

@cython.locals(i=cython.Py_ssize_t, s0=cython.double, s1=cython.double, x=cython.double)
cdef double _t_of(_Work wk, Py_ssize_t nts, double tiny, double u)

@cython.locals(i=cython.Py_ssize_t)
cdef double _s_at(_Work wk, Py_ssize_t nts, double t)

@cython.locals(total=cython.double, acc=cython.double, start=cython.double,
               step=cython.double, goal=cython.double, done=cython.double, end=cython.double,
               a=cython.double, b=cython.double, r=cython.double,
               a2=cython.double, b2=cython.double, r2=cython.double)
cpdef list coarse(list pcs, Py_ssize_t k)

@cython.locals(early=cython.double, a=cython.double, b=cython.double, r=cython.double,
               d=cython.double, b2=cython.double, out=list)
cpdef list not_before(list arr, double t)
