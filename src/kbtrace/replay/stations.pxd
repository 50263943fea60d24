# Types for the compiled twin of stations.py (Cython's pure-Python mode: this augmenting .pxd
# makes the PE model's commands, tokens, stations and servers extension types, their fields
# C slots and their per-service methods C calls; stations.py itself stays plain Python and
# is what runs interpreted and in flit mode). setup.py copies it beside the generated
# _stations_c.py. A server is the SimPy event of its service: ``callbacks`` stays a
# Python-visible attribute and ``_ok`` a class attribute (``env.step`` reads both).
import cython
from kbtrace.replay.fabric._eventq_c cimport EventQueue
from kbtrace.replay.fabric._opcore_c cimport OpCore
from kbtrace.replay.fabric._rowbuf_c cimport HopRows

cdef Py_ssize_t _DMA_READ, _FETCH, _STORE, _GEMM

cdef class Command:
    cdef public object op, op_id, plan
    cdef public Py_ssize_t left
    cdef public double t_start, t_issue

cdef class Token:
    cdef public Command cmd
    cdef public object tile
    cdef public tuple stages
    cdef public Py_ssize_t idx
    cdef public double t_in

@cython.locals(c=Command)
cpdef Command command(op, plan, double t_issue)
@cython.locals(tok=Token)
cpdef Token token(Command cmd, tile, tuple stages, double t_in)

cdef class Program:
    cdef public object done, it
    cdef public Py_ssize_t n

cdef class Station:
    cdef public list idle
    cdef public object waiting
    cpdef submit(self, tok)

cdef class Server:
    cdef public object callbacks
    cdef public list _cbl
    cdef public object _fire_cb, pe, env, rec, tok, sched_name
    cdef public EventQueue queue
    cdef public HopRows x
    cdef public OpCore core
    cdef public dict engine_of
    cdef public Station station
    cdef public double t0
    cpdef _timer(self, double delay)
    cpdef drain(self)
    cpdef _next(self)
    cpdef bint serve(self, tok) except -1
    cpdef route(self)
    @cython.locals(t_start=double)
    cdef _finish(self, Command cmd)

cdef class StageServer(Server):
    cdef public list stations
    cdef public bint in_place
    cdef _begin(self, Token tok)
    @cython.locals(idx=Py_ssize_t, kind=Py_ssize_t, cmd=Command)
    cdef _pass_on(self, Token tok, double now)

cdef class Compute(StageServer):
    cdef public double dur, fetch_bw, store_bw
    cdef public object mac_rows, mac_cols, pipe, gemm_ghz, lanes, math_ov, math_ghz
    cdef public object n_fs, n_gemm, n_math
    @cython.locals(kind=Py_ssize_t)
    cpdef bint serve(self, tok) except -1
    @cython.locals(tok=Token, now=double, kind=Py_ssize_t, t_in=double)
    cpdef route(self)

cdef class DmaServer(StageServer):
    cdef public object sim, fab, n_dma, src, _data_cb, _sent_cb, _stage
    cdef public double setup, lat, t_ack
    cdef public bint fast
    cdef public dict hbm, lats, resolved
    @cython.locals(tok=Token, now=double, t_in=double, t0=double, t_ack=double, lat=double)
    cpdef route(self)
    cdef _begin_at(self, Token tok)
    cdef double _cmd_ns(self, node) except? -1.0

cdef class DmaReadFast(DmaServer):
    @cython.locals(lat=double, t=double)
    cpdef bint serve(self, tok) except -1
    @cython.locals(tok=Token)
    cpdef _request_arrived(self, _ev)

cdef class DmaWriteFast(DmaServer):
    @cython.locals(lat=double)
    cpdef bint serve(self, tok) except -1

cdef class DmaFlit(DmaServer):
    cpdef bint serve(self, tok) except -1

cdef class Scheduler(Server):
    cdef public double ov
    cdef public object n_sched
    cdef public list stations
    @cython.locals(ov=double)
    cpdef bint serve(self, cmd) except -1
    cpdef book(self, Command cmd, double t0)
    @cython.locals(cmd=Command, now=double, stations=list, ti=Py_ssize_t)
    cpdef route(self)

cdef class Proc(Server):
    cdef public object fn
    cpdef bint serve(self, tok) except -1
    cpdef route(self)
