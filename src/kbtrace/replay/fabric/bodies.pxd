# Types for the compiled twin of bodies.py (Cython's pure-Python mode; see routes.pxd).
# body_hold and hold_bodies: a head served at a router reads the records of the links into it
# (``ledger.Recs``) and their slots' values (``ledger.Slots``) as C doubles, reading a flow
# only where they pass; their times as C doubles, a node's reservations through C calls.
import cython

from kbtrace.replay.fabric._booking_c cimport Spans
from kbtrace.replay.fabric._fair_c cimport Flow
from kbtrace.replay.fabric._ledger_c cimport FabState, Recs, Slots

cdef double TIME_EPS
cdef Py_ssize_t GONE, LIVE, REC, HOP

@cython.locals(nf=cython.Py_ssize_t, tab=Slots, i=cython.Py_ssize_t,
               cur=cython.double, s_r=cython.double, e_r=cython.double, ar=cython.double,
               x=cython.double, k=cython.Py_ssize_t, lng=cython.bint, arr=list)
cpdef double body_hold(FabState fab, rt, Py_ssize_t j, Py_ssize_t n, Spans iv, double ov, double ft,
                       double a, double t_in, double t) except? -1.0

@cython.locals(tab=Slots, lst=Recs, sf=cython.Py_ssize_t, sb=cython.Py_ssize_t, g=Flow,
               hi=cython.double, nh=cython.Py_ssize_t, got=list, p=cython.double,
               m=cython.Py_ssize_t, dead=cython.Py_ssize_t, i=cython.Py_ssize_t,
               q=cython.Py_ssize_t, sl=cython.Py_ssize_t, st=cython.int, jj=cython.Py_ssize_t,
               w=cython.Py_ssize_t, v=cython.double[::1], fl=cython.double, lo=cython.double)
cpdef hold_bodies(FabState fab, list ins, double now, double h, double e, Flow f, bint one,
                  double ov)

@cython.locals(j=cython.Py_ssize_t, pm=tuple, hp=tuple, s=cython.double, tl=cython.double,
               a=cython.double, t0=cython.double, t_in=cython.double, pcs=list,
               k=cython.Py_ssize_t, tail=cython.double)
cpdef _hold(FabState fab, double h, double e, Flow g, Py_ssize_t jj, double now, bint one)

@cython.locals(s=cython.double, e=cython.double, busy=cython.double, r=cython.double)
cpdef _pieces(Flow f, Py_ssize_t j)

cdef Py_ssize_t _flits_after(Py_ssize_t nf, double x, double a, double t_in, list pcs,
                             tuple pm) except? -1

@cython.locals(w=cython.double, a=cython.double, b=cython.double, r=cython.double)
cpdef double _work_by(list pcs, double x) except? -1.0
