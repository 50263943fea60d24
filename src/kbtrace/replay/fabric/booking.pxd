# Types for the compiled twin of booking.py (Cython's pure-Python mode: this augmenting .pxd
# makes the booking state extension types whose values are typed views of their arrays (C
# doubles, no Python float per value) and types the functions and their locals; booking.py
# itself stays plain Python and is what runs interpreted). setup.py copies it beside the
# generated _booking_c.py; fifo.pxd and routes.pxd cimport the classes from there.
import cython

# (imported from intervals: a C double here, so tests against it compare C doubles
# rather than boxing both sides)
cdef double TIME_EPS

cdef class _Sorted:
    # (the order is the C struct's: the count, the last value and the first view's data
    # pointer share the object header's cache line, which a route's walk misses on every
    # resource it books)
    cdef readonly Py_ssize_t n
    cdef Py_ssize_t cap
    cdef readonly double tl
    cdef double[::1] t, v
    cdef object _at, _av
    # (16 bytes of padding: a 496-byte object takes a 512-byte pymalloc block, and with the
    # pool's 48-byte header and the GC's 16 every such object starts on a cache line, so the
    # fields above it up to t's data pointer are one line)
    cdef double _pad0, _pad1
    @cython.locals(cap=cython.Py_ssize_t)
    cdef _grow(self, Py_ssize_t need)
    @cython.locals(q=cython.Py_ssize_t, d=cython.Py_ssize_t)
    cpdef cut(self, Py_ssize_t i, Py_ssize_t j)
    @cython.locals(lo=cython.Py_ssize_t, hi=cython.Py_ssize_t,
                   mid=cython.Py_ssize_t)
    cpdef Py_ssize_t bisect_right(self, double x) except -1
    @cython.locals(lo=cython.Py_ssize_t, hi=cython.Py_ssize_t,
                   mid=cython.Py_ssize_t)
    cpdef Py_ssize_t bisect_left(self, double x) except -1

cdef object _copied(object a, Py_ssize_t n, Py_ssize_t cap)

@cython.final
cdef class Spans(_Sorted):
    cpdef list tolist(self)
    cpdef double at(self, Py_ssize_t i) except? -1.0
    cpdef double last(self)
    @cython.locals(n=cython.Py_ssize_t)
    cpdef push(self, double s, double e)
    @cython.locals(n=cython.Py_ssize_t, q=cython.Py_ssize_t)
    cpdef insert2(self, Py_ssize_t i, double s, double e)
    @cython.locals(i=cython.Py_ssize_t)
    cpdef Py_ssize_t find(self, double s) except -1
    @cython.locals(q=cython.Py_ssize_t)
    cpdef own(self, Py_ssize_t i, double key, double a)
    cpdef bint owned(self)
    @cython.locals(k=cython.Py_ssize_t, q=cython.Py_ssize_t)
    cpdef disown(self, double now)
    @cython.locals(k=cython.Py_ssize_t)
    cpdef prune(self, double now)

@cython.final
cdef class Steps(_Sorted):
    cpdef list times(self)
    cpdef list shares(self)
    @cython.locals(n=cython.Py_ssize_t)
    cpdef push(self, double s, double r, double e)
    @cython.locals(n=cython.Py_ssize_t,
                   q=cython.Py_ssize_t)
    cpdef insert(self, Py_ssize_t i, double x, double r)

@cython.locals(iv=Spans, i=cython.Py_ssize_t)
cpdef Spans spans_of(list values)

@cython.locals(ln=Steps)
cpdef Steps steps_of(list times, list shares)

@cython.locals(n=cython.Py_ssize_t, i=cython.Py_ssize_t, t=cython.double,
               nxt=cython.double, e=cython.double, eps=cython.double)
cpdef double serve(Spans iv, double now, double h, double work) except? -1.0

@cython.locals(n=cython.Py_ssize_t, i=cython.Py_ssize_t, x=cython.double)
cpdef bint take(Spans iv, double s, double e) except -1

@cython.locals(i=cython.Py_ssize_t)
cpdef unreserve(Spans iv, double s)

@cython.locals(r=cython.double, n=cython.Py_ssize_t, lim=cython.double, k=cython.Py_ssize_t,
               j=cython.Py_ssize_t, x=cython.double, q=cython.Py_ssize_t)
cpdef bint take_rate(Steps ln, double s, double e, double busy) except -1

@cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t, k=cython.Py_ssize_t, r=cython.double)
cpdef add_shares(Steps ln, double s, double e, shares)

@cython.locals(e=cython.double, r=cython.double)
cpdef tuple fit_rate(Steps ln, double now, double h, double hd, double body,
                     double tail_at, double last, double busy, list out=*)

@cython.locals(rho=cython.double, n=cython.Py_ssize_t, k=cython.Py_ssize_t,
               t0=cython.double, done=cython.double, head_work=cython.double,
               head=cython.double, start=cython.double, m=cython.double, t1=cython.double,
               got=cython.double, end=cython.double, r=cython.double,
               e_in=cython.double, tiny=cython.double, c=cython.double,
               arrived=cython.double, backlog=cython.double, rate=cython.double,
               t_next=cython.double, clear=cython.double, a0=cython.double,
               b0=cython.double, r0=cython.double, a=cython.double, b=cython.double,
               finished=cython.bint, pieces=list, booked=cython.double,
               rate_eps=cython.double, time_eps=cython.double, inf=cython.double)
cpdef tuple queue_rate(Steps ln, double now, double h, double hd, double e, double tail,
                       double busy, list out=*)

@cython.locals(k=cython.Py_ssize_t)
cpdef prune_rate(Steps ln, double now)

@cython.locals(iv=Spans, ln=Steps)
cpdef prune_states(list node_iv, list link_steps, double now, Py_ssize_t over)

@cython.locals(i=cython.Py_ssize_t)
cpdef double _snap(Steps ln, double x)

@cython.locals(done=cython.double, a=cython.double, b=cython.double, r=cython.double,
               a2=cython.double, b2=cython.double)
cpdef double unbook(Steps ln, list pieces, double t_from) except? -1.0

@cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t, k=cython.Py_ssize_t, x=cython.double,
               gap=cython.double, reps=cython.double, teps=cython.double)
cpdef _tidy(Steps ln, double a, double b)
