# Types for the compiled twin of fair.py (Cython's pure-Python mode: this augmenting .pxd
# types its classes, functions and their locals; fair.py itself stays plain Python and is
# what runs interpreted). setup.py copies it beside the generated _fair_c.py.
import cython

from kbtrace.replay.fabric._booking_c cimport Steps
from kbtrace.replay.fabric._events_c cimport after
from kbtrace.replay.fabric._ledger_c cimport FabState, Recs, Slots

# (imported from intervals: a C double here, so tests against it compare C doubles
# rather than boxing both sides)
cdef double TIME_EPS
cdef double INF

cdef class Flow:
    cdef public FabState fab
    cdef public object rt, op_id, tile, ev, rows, nres, sl, rd
    cdef public double ack, tt
    cdef public list segs, links
    cdef public object en, lv, hn
    cdef public bint fin, wr
    cdef public Py_ssize_t slot

cdef class _Arrival:
    cdef public object src
    cdef public double p0, k, s
    cdef public list arr
    cpdef list pieces(self)

cdef class Booked:
    cdef public Flow f
    cdef public Py_ssize_t j
    cdef public double s, e, r, busy, tail, a_end
    cdef public object pcs, arr
    cdef public _Arrival lz
    cpdef list pieces(self)
    cpdef list arrival(self)
    cpdef arrive(self, list arr)
    cpdef arrive_as(self, _Arrival lz, double a_end)

@cython.locals(a=cython.double, b=cython.double, r=cython.double)
cpdef list _arrival(list src, double p0, double k, double s)

cpdef book(list link_flows, Flow f, Py_ssize_t j, double s, double e, double busy, pcs,
           double tail)

@cython.locals(r=cython.double, b=Booked, a_end=cython.double)
cdef _book(Recs lst, Flow f, Py_ssize_t j, double s, double e, double busy, pcs, double tail)

cpdef booked(Flow f, Py_ssize_t j)

@cython.locals(s=cython.double, e=cython.double, busy=cython.double, tail=cython.double,
               r=cython.double)
cdef Booked _made(Slots tab, Flow f, Py_ssize_t j)

@cython.locals(b=Booked)
cdef Booked _record(Flow f, Py_ssize_t j, double s, double e, double r, double busy, double tail,
                    double a_end)

@cython.locals(lst=Recs, got=list, inc=list, i=cython.Py_ssize_t)
cpdef list incumbents(list link_flows, Py_ssize_t li, f, double h, double now)

@cython.locals(lst=Recs)
cpdef prune_flows(list link_flows, double now)

@cython.locals(streams=list, kept=list, kp=list, pcs=list, res=list, b=Booked, i=cython.Py_ssize_t,
               d=cython.double, end=cython.double, tail=cython.double, a=cython.double,
               z=cython.double, r=cython.double)
cpdef list share_with(FabState fab, Steps ln, double h, list inc, list extra)

@cython.locals(busy=cython.double, e=cython.double, rho=cython.double, hd_d=cython.double,
               body=cython.double, last_d=cython.double, b=Booked, d=cython.double,
               end=cython.double, head=cython.double, start=cython.double, tl=cython.double,
               tail=cython.double, streams=list, kept=list, kp=list, pcs=list,
               a=cython.double, z=cython.double, r=cython.double)
cpdef tuple fair_hop(FabState fab, rt, Py_ssize_t j, double h, double t, list inc, f)

@cython.locals(en=list, lv=list, hp=tuple, tcur=cython.double, n=cython.Py_ssize_t,
               j=cython.Py_ssize_t, mode=cython.int, last_d=cython.double, p=cython.double,
               rec=Booked, prev=Booked, x=cython.double, tin=cython.double,
               p0=cython.double, k=cython.double, tl=cython.double, tj=cython.double,
               src=object, a=cython.double, b=cython.double, r=cython.double,
               busy=tuple, hops=tuple, end=cython.double, body=cython.double, ha=cython.double,
               pm=tuple)
cpdef _push(FabState fab, Flow g, Py_ssize_t j0, double tail, double t_from, double hs=*)

cpdef tuple _leave(tuple rw, double x)

@cython.locals(old=object)
cpdef _move(FabState fab, Flow g, double tt)

@cython.locals(lv=list, rows=list, i=cython.Py_ssize_t, rw=tuple, sg=tuple, n=cython.Py_ssize_t,
               h=cython.double, t=cython.double, dn=cython.double, x=cython.double,
               y=cython.double, a=cython.double, b=cython.double, en=cython.double)
cpdef list expand(Flow f)

@cython.locals(en=list, lv=list, rw=tuple, sg=tuple, n=cython.Py_ssize_t, h=cython.double,
               t=cython.double, dn=cython.double, x=cython.double, y=cython.double,
               a=cython.double, b=cython.double, e0=cython.double)
cpdef tuple _times(Flow f)
