# Types for the compiled twin of booking.py (Cython's pure-Python mode: this augmenting .pxd
# types the functions and their locals; booking.py itself stays plain Python and is what
# runs interpreted). setup.py copies it beside the generated _booking_c.py.
import cython

@cython.locals(i=cython.Py_ssize_t, t=cython.double, nxt=cython.double, e=cython.double)
cpdef double serve(list iv, double now, double h, double work) except? -1.0

@cython.locals(i=cython.Py_ssize_t)
cpdef bint take(list iv, double s, double e) except -1

@cython.locals(i=cython.Py_ssize_t)
cpdef unreserve(list iv, double s)

@cython.locals(r=cython.double, n=cython.Py_ssize_t, lim=cython.double, k=cython.Py_ssize_t,
               j=cython.Py_ssize_t, x=cython.double, q=cython.Py_ssize_t)
cpdef bint take_rate(list lt, list lr, double s, double e, double busy) except -1

@cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t, k=cython.Py_ssize_t, r=cython.double)
cpdef add_shares(list lt, list lr, double s, double e, shares)

@cython.locals(e=cython.double, rho=cython.double, n=cython.Py_ssize_t, k=cython.Py_ssize_t,
               t0=cython.double, done=cython.double, head_work=cython.double,
               head=cython.double, start=cython.double, m=cython.double, t1=cython.double,
               got=cython.double, end=cython.double, tail=cython.double)
cpdef tuple fit_rate(list lt, list lr, double now, double h, double hd, double body,
                     double tail_at, double last, double busy, list out=*)

@cython.locals(k=cython.Py_ssize_t)
cpdef prune_rate(list lt, list lr, double now)

@cython.locals(i=cython.Py_ssize_t)
cpdef double _snap(list lt, double x)

@cython.locals(done=cython.double, a=cython.double, b=cython.double, r=cython.double,
               a2=cython.double, b2=cython.double)
cpdef double unbook(list lt, list lr, list pieces, double t_from) except? -1.0

@cython.locals(got=cython.double, y=cython.double, a=cython.double, b=cython.double,
               r=cython.double)
cpdef double _when(list arr, double w, double x)

@cython.locals(k=cython.Py_ssize_t, n=cython.Py_ssize_t, acc=cython.double, x=cython.double,
               a=cython.double, b=cython.double, r=cython.double, out=list)
cpdef list _cum_at(list pcs, list taus)

@cython.locals(got=cython.double, x=cython.double, a=cython.double, b=cython.double,
               r=cython.double, out=list)
cpdef list _unserved(list arr, double w, double d)

@cython.locals(m=cython.Py_ssize_t, nt=cython.Py_ssize_t, k=cython.Py_ssize_t,
               n=cython.Py_ssize_t, j=cython.Py_ssize_t, i=cython.Py_ssize_t,
               g=cython.Py_ssize_t, ng=cython.Py_ssize_t, guard=cython.long,
               total=cython.double, tiny=cython.double, t=cython.double, s=cython.double,
               flat=cython.double,
               c=cython.double, nxt=cython.double, rr=cython.double, q=cython.double,
               rate=cython.double, x=cython.double, dt=cython.double, dw=cython.double,
               r=cython.double, a=cython.double, b=cython.double, end=cython.double,
               head=cython.double, w=cython.double, d=cython.double, hw=cython.double,
               us=list, taus=list, ts=list, ss=list, ups=list, up=list, cum=list, srt=list,
               grid=list, tau_g=list, tau_o=list, order=list, pcs=list, out=list)
cpdef list share_fifo(list lt, list lr, double t0, list streams)

@cython.locals(k=cython.Py_ssize_t)
cpdef double _big_u(list taus, list us, double total, double tau) except? -1.0

@cython.locals(k=cython.Py_ssize_t, nt=cython.Py_ssize_t, u0=cython.double, u1=cython.double)
cpdef double _tau_of(list taus, list us, double u) except? -1.0

@cython.locals(i=cython.Py_ssize_t, s0=cython.double, s1=cython.double, x=cython.double)
cpdef double _t_of(list ts, list ss, double tiny, double u) except? -1.0

@cython.locals(i=cython.Py_ssize_t)
cpdef double _s_at(list ts, list ss, double t)

@cython.locals(k=cython.Py_ssize_t, i=cython.Py_ssize_t, iv=list, lr=list, S=cython.double,
               A=cython.double, B=cython.double, bz=cython.double, s=cython.double,
               e=cython.double, x=cython.double, r=cython.double)
cpdef Py_ssize_t take_plan(tuple res, double h, double t) except -1
