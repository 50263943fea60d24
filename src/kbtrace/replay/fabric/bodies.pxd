# Types for the compiled twin of bodies.py (Cython's pure-Python mode; see routes.pxd).
# body_hold and hold_bodies (every stream noted at a router, for each head served there):
# their times as C doubles, a node's reservations and notes through C calls (as heads.pxd).
import cython

from kbtrace.replay.fabric._booking_c cimport Notes, Spans

cdef double TIME_EPS

@cython.locals(n=cython.Py_ssize_t, nf=cython.Py_ssize_t, iv=Spans, ft=cython.double,
               dt=cython.double, own=Notes, i=cython.Py_ssize_t, cur=cython.double,
               s_r=cython.double, e_r=cython.double, ar=cython.double, x=cython.double,
               fw=cython.double, p0=cython.double, k=cython.Py_ssize_t)
cpdef double body_hold(fab, rt, Py_ssize_t j, double a, double t_in, double t) except? -1.0

@cython.locals(a=cython.double, t_in=cython.double)
cpdef double live_tail(tuple it, double now) except? -1.0

@cython.locals(now=cython.double, a=cython.double, t0=cython.double, t_in=cython.double,
               tail=cython.double, j=cython.Py_ssize_t, nf=cython.Py_ssize_t,
               k=cython.Py_ssize_t, i=cython.Py_ssize_t, lst=list)
cpdef hold_bodies(fab, Py_ssize_t n, double h, double e, f)

@cython.locals(w=cython.double, a=cython.double, b=cython.double, r=cython.double)
cpdef double _work_by(list pcs, double x) except? -1.0
