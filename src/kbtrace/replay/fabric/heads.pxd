# Types for the compiled twin of heads.py (Cython's pure-Python mode: this augmenting .pxd
# types its hot functions and their locals, so a node's reservations (``Spans``) and their
# owners (``Slots.owner``) are read through C calls and C doubles rather than Python method calls and
# boxed floats; heads.py itself stays plain Python and is what runs interpreted). setup.py
# copies it beside the generated _heads_c.py; routes.pxd cimports the functions its
# ``hop_seq`` calls.
import cython

from kbtrace.replay.fabric._bodies_c cimport hold_bodies
from kbtrace.replay.fabric._events_c cimport after
from kbtrace.replay.fabric._booking_c cimport Spans, Steps, fit_rate, serve
from kbtrace.replay.fabric._fair_c cimport Flow
from kbtrace.replay.fabric._ledger_c cimport FabState, Slots

# (imported from intervals: a C double here, so tests against it compare C doubles
# rather than boxing both sides)
cdef double TIME_EPS

@cython.locals(tab=Slots, pushed=list, i=cython.Py_ssize_t, hz=cython.double,
               s_r=cython.double, e_r=cython.double, jg=cython.Py_ssize_t, a=cython.double,
               e=cython.double, e2=cython.double, w=cython.double, ins=list)
cpdef double serve_head(FabState fab, Py_ssize_t n, Spans iv, double now, double h, double ov,
                        Py_ssize_t j, f, bint flits=*) except? -1.0

cpdef prune_all(FabState fab, double now)

@cython.locals(e=cython.double, k=cython.Py_ssize_t, s0=cython.double, tab=Slots)
cpdef double _reserve(FabState fab, Py_ssize_t n, Spans iv, Flow g, Py_ssize_t j, double a,
                      double w) except? -1.0

@cython.locals(hp=tuple, ln=Steps, hd=cython.double, busy=cython.double, pcs=list,
               s=cython.double, hd2=cython.double, td=cython.double, hi=cython.double)
cpdef tuple serve_flit(FabState fab, rt, Py_ssize_t j, double now, double h)

@cython.locals(iv=Spans)
cpdef prune_owners(list node_iv, double now)

@cython.locals(niv=Spans, ov=cython.double, n=cython.Py_ssize_t, tab=Slots, s0=cython.double,
               i=cython.Py_ssize_t)
cpdef double head_at(FabState fab, g, Py_ssize_t j, double old, double ha) except? -1.0

@cython.locals(j=cython.Py_ssize_t, pcs=list, n=cython.Py_ssize_t, s0=cython.double,
               span=cython.double, work=cython.double, scale=cython.double, out=list,
               k=cython.Py_ssize_t, done=cython.double, i=cython.Py_ssize_t, x=cython.double,
               a=cython.double, e=cython.double, r=cython.double, t=cython.double)
cpdef list arrivals(Flow f, double hh, double tt, long burst)
