# Types for the compiled twin of hbm.py (Cython's pure-Python mode: this augmenting .pxd
# types the controller's fields and the locals of its pseudo-channel arithmetic; hbm.py
# itself stays plain Python and is what runs interpreted, and what flit mode uses).
# setup.py copies it beside the generated _hbm_c.py.
import cython

cdef class Bursts:
    cdef public Py_ssize_t n, npcs
    cdef public double full, tail
    cdef public list f0
    cdef public object _t
    @cython.locals(n=Py_ssize_t, npcs=Py_ssize_t, full=cython.double, tail=cython.double,
                   out=list, j=Py_ssize_t, cnt=Py_ssize_t, k_tail=Py_ssize_t,
                   f=cython.double, k=Py_ssize_t)
    cpdef list times(self)

@cython.locals(b=Bursts)
cpdef Bursts known_bursts(list times)

cdef class HbmController:
    cdef public long node_idx, shift, mask, burst, n_pcs
    cdef public double bw, penalty
    cdef public list pc_avail, last_dir
    cdef public object pc_iv, log

    @cython.locals(pc=cython.long, start=cython.double, dur=cython.double,
                   finish=cython.double)
    cpdef double commit(self, long addr, long nbytes, double t, long write, long op_id=*) except? -1.0

    cpdef list read(self, long addr, long nbytes, double t, long op_id=*)

    @cython.locals(b=Bursts, first=cython.double, last=cython.double)
    cpdef tuple read_bursts(self, long addr, long nbytes, double t, long op_id=*)

    @cython.locals(b=Bursts)
    cpdef tuple read_lazy(self, long addr, long nbytes, double t, long op_id=*)

    cpdef tuple read_span(self, long addr, long nbytes, double t, long op_id=*)

    @cython.locals(burst=cython.long, shift=cython.long, mask=cython.long, bw=cython.double,
                   pen=cython.double, npcs=cython.long, n=cython.long, full=cython.double,
                   tail_b=cython.long, tail=cython.double, p0=cython.long,
                   first=cython.double, last=cython.double, j=cython.long, pc=cython.long,
                   cnt=cython.long, k_tail=cython.long, f=cython.double, f0=cython.double,
                   f1=cython.double, k=cython.long, avail=list, last_dir=list)
    cpdef tuple read_into(self, long addr, long nbytes, double t, long op_id=*, Bursts lazy=*)

    @cython.locals(burst=cython.long, shift=cython.long, mask=cython.long, bw=cython.double,
                   pen=cython.double, n=cython.long, step=cython.double, last=cython.double,
                   off=cython.long, full=cython.double, i=cython.long, sz=cython.long,
                   dur=cython.double, t=cython.double, pc=cython.long, s0=cython.double,
                   f=cython.double, k=cython.long, prev=cython.double, avail=list,
                   last_dir=list, ivs=list, pend=list)
    cpdef double write_stream(self, long addr, long nbytes, double head, double tail,
                              double now, long op_id=*, w=*, list at=*) except? -1.0

    @cython.locals(pend=list, k=cython.Py_ssize_t, n=cython.Py_ssize_t)
    cpdef _fold(self, long pc, double now)

    @cython.locals(moved=list, f=cython.double, prev2=cython.double)
    cpdef _rechain(self, long pc, Py_ssize_t k, double prev)
