# Types for the compiled twin of booking.py (Cython's pure-Python mode: this augmenting .pxd
# types the functions and their locals; booking.py itself stays plain Python and is what
# runs interpreted). setup.py copies it beside the generated _booking_c.py.
import cython

@cython.locals(i=cython.Py_ssize_t, t=cython.double, nxt=cython.double, e=cython.double,
               eps=cython.double)
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
               got=cython.double, end=cython.double, tail=cython.double, r=cython.double,
               e_in=cython.double, tiny=cython.double, c=cython.double,
               arrived=cython.double, backlog=cython.double, rate=cython.double,
               t_next=cython.double, clear=cython.double, a0=cython.double,
               b0=cython.double, r0=cython.double, a=cython.double, b=cython.double,
               finished=cython.bint, pieces=list, booked=cython.double,
               rate_eps=cython.double, time_eps=cython.double, inf=cython.double)
cpdef tuple fit_rate(list lt, list lr, double now, double h, double hd, double body,
                     double tail_at, double last, double busy, list out=*)

@cython.locals(k=cython.Py_ssize_t)
cpdef prune_rate(list lt, list lr, double now)

@cython.locals(i=cython.Py_ssize_t)
cpdef double _snap(list lt, double x)

@cython.locals(done=cython.double, a=cython.double, b=cython.double, r=cython.double,
               a2=cython.double, b2=cython.double)
cpdef double unbook(list lt, list lr, list pieces, double t_from) except? -1.0

@cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t, k=cython.Py_ssize_t, x=cython.double,
               gap=cython.double, reps=cython.double, teps=cython.double)
cpdef _tidy(list lt, list lr, double a, double b)
