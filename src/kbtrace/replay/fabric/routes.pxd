# Types for the compiled twin of routes.py (Cython's pure-Python mode: this augmenting .pxd
# makes routes and plans extension types and the booking walk's times C doubles; routes.py
# itself stays plain Python and is what runs interpreted). setup.py copies it beside the
# generated _routes_c.py.
import cython
from kbtrace.replay.fabric._booking_c cimport (Spans, Steps, fit_rate, queue_rate, take,
                                               take_rate, unreserve)
from kbtrace.replay.fabric._events_c cimport after
from kbtrace.replay.fabric._fair_c cimport Flow, book, fair_hop, incumbents
from kbtrace.replay.fabric._bodies_c cimport body_hold
from kbtrace.replay.fabric._heads_c cimport prune_all, serve_flit, serve_head
from kbtrace.replay.fabric._ledger_c cimport FabState, Recs, Slots

# (imported from intervals: a C double here, so tests against it compare C doubles
# rather than boxing both sides)
cdef double TIME_EPS
cdef double _NEG_INF
cdef Py_ssize_t _PRUNE

cdef class _Route:
    cdef public tuple nodes, links, hops, stage, node, busy
    cdef public object dst, dst_iv, hbm, term_stage, nb
    cdef public double dst_ov, term_busy, flit_max
    cdef public list plans
    cdef public bint movable, fixed
    cpdef _Plan build(self, FabState fab, Py_ssize_t j0)

cdef class _Plan:
    cdef public Py_ssize_t j0, n_hops, n_rows, n_res
    cdef public object pid
    cdef public list sts, res_hop, first, start, rows, recs
    cdef readonly double[::1] off, bk
    cdef public double h_in, h_end, t_a, t_b

    @cython.locals(H=cython.double, A=cython.double, B=cython.double, ov=cython.double,
                   hd_d=cython.double, body=cython.double, last_d=cython.double,
                   p=cython.double, bz=cython.double, en=cython.double, h_in=cython.double,
                   jr=cython.Py_ssize_t, j=cython.Py_ssize_t, mode=cython.Py_ssize_t,
                   n=cython.Py_ssize_t, m=cython.Py_ssize_t, hops=tuple, res=list, recs=list,
                   res_hop=list, first=list, start=list, rows=list)
    cdef _build(self, _Route rt, FabState fab, Py_ssize_t j0)
    @cython.locals(q=cython.Py_ssize_t)
    cdef _put(self, Py_ssize_t i, double s, double a, double b, double busy, double kind,
              double j, double x, double ov, double a0, double b0)
    @cython.locals(k=cython.Py_ssize_t, q=cython.Py_ssize_t, sp=Spans, ln=Steps, off="double[::1]",
                   bz=cython.double,
                   s=cython.double, e=cython.double, x=cython.double, y=cython.double,
                   r=cython.double, i=cython.Py_ssize_t, n=cython.Py_ssize_t,
                   jj=cython.Py_ssize_t, lst=Recs)
    cpdef Py_ssize_t take(self, double h, double t, double key=*, Flow f=*) except -1

@cython.locals(i=cython.Py_ssize_t)
cpdef bint held(Spans sp, double s, double t_in) except -1

@cython.locals(f=Flow)
cpdef complete(FabState fab, double tt, double ack)

cpdef Flow begin(FabState fab, _Route rt, op_id, tile, double ack)

@cython.locals(rt=_Route, f=Flow, now=cython.double, t0=cython.double, h=cython.double,
               t=cython.double)
cpdef send(FabState fab, op_id, tile, src, dst, nbytes, addr=*, ready=*, at=*, double ack=*,
           span=*, shape=*, Py_ssize_t group=*, bursts=*)

@cython.locals(f=Flow, ln=Steps, busy=cython.double, hd_d=cython.double, body=cython.double,
               last_d=cython.double, e=cython.double, li=cython.Py_ssize_t, inc=list, pcs=list,
               s=cython.double, hd=cython.double, td=cython.double)
cpdef tuple stream(FabState fab, _Route rt, Py_ssize_t j, double h, double t, double now)

@cython.locals(j=cython.Py_ssize_t, k=cython.Py_ssize_t, jr=cython.Py_ssize_t, pl=_Plan,
               i=cython.Py_ssize_t,
               hh=cython.double, tt=cython.double, x=cython.double, H=cython.double,
               tab=Slots,
               A=cython.double, B=cython.double, S=cython.double)
cpdef book_route(FabState fab, _Route rt, f, op_id, tile, addr, double h, double t, double ack,
                 double now)

@cython.locals(hops=tuple, f=Flow, H=cython.double, A=cython.double, B=cython.double,
               H0=cython.double, A0=cython.double, B0=cython.double, rows=list,
               j=cython.Py_ssize_t, n=cython.Py_ssize_t, niv=Spans, ov=cython.double,
               ln=Steps, mode=cython.Py_ssize_t, hd_d=cython.double, body=cython.double,
               last_d=cython.double, p=cython.double, e=cython.double, x=cython.double,
               tt=cython.double, hh=cython.double)
cpdef tuple walk(FabState fab, _Route rt, Py_ssize_t j0, op_id, tile, double h, double t, addr,
                 double ack)

@cython.locals(ov=cython.double, mode=cython.Py_ssize_t, hd_d=cython.double,
               body=cython.double, last_d=cython.double, p=cython.double, fair=cython.bint,
               enter=cython.double, q=cython.double, s=cython.double, t_in=cython.double,
               hd=cython.double, td=cython.double, n=cython.Py_ssize_t)
cpdef tuple hop_seq(FabState fab, _Route rt, Py_ssize_t j, op_id, tile, double h, double t,
                    double now)
