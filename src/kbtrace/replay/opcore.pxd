# Types for the compiled twin of opcore.py (Cython's pure-Python mode: this augmenting .pxd
# makes OpCore an extension type, its fields C slots and its per-op methods C calls that the
# compiled servers and PE_CPU make directly; opcore.py itself stays plain Python and is what
# runs interpreted and in flit mode). setup.py copies it beside the generated _opcore_c.py.
import cython
from kbtrace.replay.fabric._hbm_c cimport Bursts, HbmController
from kbtrace.replay.fabric._rowbuf_c cimport DoneRows, HopRows, IssueRows

cdef Py_ssize_t PLAN_CACHE
cdef long _C_HBM

cdef class OpCore:
    cdef public object env, params, rec, fabric
    cdef public DoneRows dones
    cdef public HopRows x
    cdef public IssueRows iss
    cdef public bytearray done
    cdef public dict waiting, plans, hbm
    cdef public bint fast, flows
    @cython.locals(cache=dict, tpl=Py_ssize_t)
    cpdef plan(self, op)
    cpdef issue(self, Py_ssize_t op_id, double t_issue)
    @cython.locals(cbs=list)
    cpdef on_done(self, Py_ssize_t op_id, fn)
    @cython.locals(op_id=Py_ssize_t, now=double, cbs=list)
    cpdef complete(self, op, double t_issue, double t_start, str engine)
    @cython.locals(h=HbmController, t=double, shape=long, group=long, first=double,
                   last=double, bursts=Bursts, times=list, ready=list)
    cpdef hbm_read(self, long op_id, long tile, long src, long dst, long addr, long nbytes)
