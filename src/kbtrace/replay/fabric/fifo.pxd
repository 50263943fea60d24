# Types for the compiled twin of fifo.py (Cython's pure-Python mode: this augmenting .pxd
# types the functions and their locals; fifo.py itself stays plain Python and is what runs
# interpreted). setup.py copies it beside the generated _fifo_c.py.
import cython
from kbtrace.replay.fabric._booking_c cimport Steps

@cython.locals(got=cython.double, y=cython.double, a=cython.double, b=cython.double,
               r=cython.double)
cpdef double _when(list arr, double w, double x)

@cython.locals(k=cython.Py_ssize_t, n=cython.Py_ssize_t, acc=cython.double, x=cython.double,
               a=cython.double, b=cython.double, r=cython.double, out=list)
cpdef list _cum_at(list pcs, list taus)

@cython.locals(got=cython.double, x=cython.double, a=cython.double, b=cython.double,
               r=cython.double, out=list)
cpdef list _unserved(list arr, double w, double d)

@cython.locals(b=cython.double)
cpdef tuple _burst(double a, double w)

@cython.locals(m=cython.Py_ssize_t, nt=cython.Py_ssize_t, k=cython.Py_ssize_t,
               n=cython.Py_ssize_t, j=cython.Py_ssize_t, i=cython.Py_ssize_t,
               guard=cython.long,
               total=cython.double, tiny=cython.double, t=cython.double, s=cython.double,
               flat=cython.double,
               c=cython.double, nxt=cython.double, rr=cython.double, q=cython.double,
               rate=cython.double, x=cython.double, r=cython.double, a=cython.double, b=cython.double, end=cython.double,
               head=cython.double, w=cython.double, d=cython.double, hw=cython.double,
               u=cython.double, u0=cython.double, u1=cython.double, ta=cython.double,
               tb=cython.double,
               us=list, taus=list, ts=list, ss=list, cs=list, ups=list, up=list, cum=list,
               cis=list, cums=list, allp=list, grid=list, pcs=list, out=list)
cpdef list share_fifo(Steps ln, double t0, list streams)

@cython.locals(m=cython.Py_ssize_t, nt=cython.Py_ssize_t, ng=cython.Py_ssize_t,
               g=cython.Py_ssize_t, i=cython.Py_ssize_t, k=cython.Py_ssize_t,
               x=cython.double, u0=cython.double, f=cython.double, cums=list, cum=list)
cpdef list _served_by(list grid, list ts, list ss, list us, list cis)

@cython.locals(m=cython.Py_ssize_t, ng=cython.Py_ssize_t, g=cython.Py_ssize_t,
               i=cython.Py_ssize_t, p=cython.Py_ssize_t, ta=cython.double, tb=cython.double,
               dt=cython.double, tot=cython.double, cap=cython.double, f=cython.double,
               x=cython.double, dw=cython.double, r=cython.double,
               allp=list, owed=list, xs=list, cum=list, pcs=list)
cpdef list _pieces(list grid, list cums, list ts, list cs, double tiny)

@cython.locals(k=cython.Py_ssize_t)
cpdef double _big_u(list taus, list us, double total, double tau) except? -1.0

@cython.locals(i=cython.Py_ssize_t, s0=cython.double, s1=cython.double, x=cython.double)
cpdef double _t_of(list ts, list ss, double tiny, double u) except? -1.0

@cython.locals(i=cython.Py_ssize_t)
cpdef double _s_at(list ts, list ss, double t)

@cython.locals(total=cython.double, acc=cython.double, start=cython.double,
               step=cython.double, goal=cython.double, done=cython.double, end=cython.double,
               a=cython.double, b=cython.double, r=cython.double,
               a2=cython.double, b2=cython.double, r2=cython.double)
cpdef list coarse(list pcs, Py_ssize_t k)

@cython.locals(early=cython.double, a=cython.double, b=cython.double, r=cython.double,
               d=cython.double, b2=cython.double, out=list)
cpdef list not_before(list arr, double t)
