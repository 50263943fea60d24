# Types for the compiled twin of ledger.py (Cython's pure-Python mode: this augmenting .pxd makes
# the slot table and a link's bookings extension types whose values are typed views of their
# arrays: C doubles and bytes, no Python object per booking; ledger.py itself stays plain
# Python and is what runs interpreted). setup.py copies it beside the generated _ledger_c.py;
# fair.pxd cimports the classes from there.
import cython

from kbtrace.replay.fabric._booking_c cimport Spans

cdef double TIME_EPS
cdef Py_ssize_t GONE, LIVE, MOVED, REC, HOP, _CAP0, SLOTS_MAX
cdef double _INF

@cython.final
cdef class Slots:
    cdef public list flows, free, gone
    cdef object _ast
    cdef signed char[::1] st
    cdef object _asn
    cdef double[::1] sn
    cdef public double serial
    cdef object _ahv
    cdef double[::1] hv
    cdef public Py_ssize_t hops
    cdef Py_ssize_t cap
    @cython.locals(i=cython.Py_ssize_t)
    cpdef Py_ssize_t enter(self, f, Py_ssize_t hops) except -1
    @cython.locals(h=cython.Py_ssize_t, w=cython.Py_ssize_t, i=cython.Py_ssize_t)
    cdef _layout(self, Py_ssize_t cap, Py_ssize_t hops)
    @cython.locals(q=cython.Py_ssize_t)
    cpdef note(self, Py_ssize_t i, Py_ssize_t j, double s, double e, double busy, double tail)
    @cython.locals(q=cython.Py_ssize_t)
    cpdef tuple values(self, Py_ssize_t i, Py_ssize_t j)
    cpdef leave(self, Py_ssize_t i)
    cpdef moved(self, Py_ssize_t i, Py_ssize_t j)
    cpdef retimed(self, Py_ssize_t i)
    cpdef bint moved_at(self, Py_ssize_t i, Py_ssize_t j)
    cpdef double key(self, Py_ssize_t i) except? -1.0
    cpdef own(self, Spans iv, Py_ssize_t i, Py_ssize_t slot, double a)
    @cython.locals(x=cython.double, k=cython.Py_ssize_t, sl=cython.Py_ssize_t, a=cython.double)
    cpdef owner(self, Spans iv, Py_ssize_t i, Py_ssize_t n)
    cpdef recycle(self)

cdef class _Table:
    cdef readonly Py_ssize_t n
    cdef Py_ssize_t cap
    cdef public Slots tab

@cython.final
cdef class Recs(_Table):
    cdef double[::1] v
    cdef object _a
    # (40 bytes of padding: a 304-byte object takes a 320-byte pymalloc block, so each starts
    # on a cache line, its count and view's data pointer in the header's; booking.pxd's _Sorted)
    cdef double _pad0, _pad1, _pad2, _pad3, _pad4
    @cython.locals(r=cython.double, a_end=cython.double, n=cython.Py_ssize_t,
                   q=cython.Py_ssize_t)
    cpdef double book(self, Py_ssize_t slot, Py_ssize_t j, double s, double e, double busy,
                      double tail) except? -1.0
    @cython.locals(cap=cython.Py_ssize_t)
    cdef _grow(self)
    cpdef Py_ssize_t slot_at(self, Py_ssize_t i)
    cpdef Py_ssize_t hop_at(self, Py_ssize_t i)
    @cython.locals(out=list, hi=cython.double, w=cython.Py_ssize_t, i=cython.Py_ssize_t,
                   q=cython.Py_ssize_t, sl=cython.Py_ssize_t, a=cython.double, st=cython.int,
                   tab=Slots, p=cython.Py_ssize_t)
    cpdef list scan(self, Py_ssize_t slot, double h, double now)
    cpdef prune(self, double now)
    @cython.locals(j=cython.Py_ssize_t)
    cdef double _a_end(self, Py_ssize_t q, Py_ssize_t sl) except? -1.0

cdef class FabState:
    cdef public object env, rec, hbm, flit_bytes, _f
    cdef public list link_bw, link_prop, node_ov, node_kind, link_steps, node_iv, link_flows
    cdef public list link_own, body_in
    cdef public Slots flow_slots
    cdef public bint fair
    cdef public Py_ssize_t push_depth, held, sends
    cdef public dict routes_nb
