# Types for the compiled twin of cpu.py (Cython's pure-Python mode: this augmenting .pxd makes
# PE_CPU an extension type, its fields C slots and its per-op methods C calls; cpu.py itself
# stays plain Python and is what runs interpreted and in flit mode). setup.py copies it beside
# the generated _cpu_c.py. PE_CPU is the SimPy event of its timers: ``callbacks`` stays a
# Python-visible attribute and ``_ok`` a class attribute (``env.step`` reads both).
import cython
from kbtrace.replay.fabric._eventq_c cimport EventQueue
from kbtrace.replay.fabric._opcore_c cimport OpCore
from kbtrace.replay.fabric._rowbuf_c cimport HopRows
from kbtrace.replay.fabric._stations_c cimport Command, Program, Scheduler, Station, command

cdef Py_ssize_t DISPATCH, CYCLES

cdef class Cpu:
    cdef public object pe, sim, env, callbacks, progs, op
    cdef public Program prog
    cdef public list _cbl, issued
    cdef public Py_ssize_t i, phase, n_wait
    cdef public double t_issue, t_ready, t0
    cdef public object _resume_cb, _dep_cb, _end_cb, _credit_cb
    cdef public EventQueue queue
    cdef public OpCore core
    cdef public bytearray done
    cdef public HopRows x
    cdef public object n_cpu, cpu_name
    cdef public double dispatch_ns
    cdef public Station sched
    cpdef submit(self, prog)
    cdef _timer(self, Py_ssize_t phase, double delay)
    @cython.locals(n=Py_ssize_t, t=double, prog=Program)
    cpdef _advance(self)
    @cython.locals(done=bytearray)
    cdef bint _wait(self, op_ids, cb) except -1
    cdef bint _program_done(self) except -1
    @cython.locals(now=double, d=double, t=double, srv=Scheduler, idle=list, cmd=Command)
    cdef bint _dispatch(self) except -1
    @cython.locals(now=double)
    cdef bint _dispatched(self) except -1
    cdef _cycles_done(self)
