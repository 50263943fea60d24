# Types for the compiled twin of segsort.py (Cython's pure-Python mode: this augmenting .pxd
# makes the columns typed memoryviews and the loops' locals C numbers; segsort.py itself stays
# plain Python). setup.py copies it beside the generated _segsort_c.py. ``long`` is int64 on
# the LP64 platforms the core is built on (numpy's int64 buffers have the format 'l').
import cython

@cython.locals(n=cython.Py_ssize_t, span=cython.Py_ssize_t, i=cython.Py_ssize_t,
               k=cython.Py_ssize_t)
cdef int _count(long[::1] major, long lo, long[::1] cnt, long[::1] out) except -1

@cython.locals(span=cython.Py_ssize_t, k=cython.Py_ssize_t, a=cython.Py_ssize_t,
               b=cython.Py_ssize_t, small=cython.Py_ssize_t)
cdef int _within(double[::1] minor, long[::1] cnt, long[::1] out, long[::1] tmp) except -1

@cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t, x=cython.long, v=cython.double)
cdef bint _insertion(double[::1] minor, long[::1] out, Py_ssize_t a, Py_ssize_t b,
                    Py_ssize_t budget) except -1

@cython.locals(r=cython.Py_ssize_t, e=cython.Py_ssize_t, i=cython.Py_ssize_t,
               j=cython.Py_ssize_t, k=cython.Py_ssize_t, m=cython.Py_ssize_t,
               w=cython.Py_ssize_t, x=cython.long, v=cython.double, small=cython.Py_ssize_t)
cpdef _merge_sort(double[::1] minor, long[::1] out, long[::1] tmp, Py_ssize_t a, Py_ssize_t b)

@cython.locals(n=cython.Py_ssize_t, m=cython.Py_ssize_t, i=cython.Py_ssize_t,
               k=cython.Py_ssize_t, r=cython.long, r0=cython.long, x=cython.double,
               run=cython.double)
cpdef Py_ssize_t _windows(long[::1] res, double[::1] s, double[::1] e, double[::1] b,
                          long[::1] c, long[::1] perm, double eps, double rel,
                          long[::1] w_r, double[::1] w_s, double[::1] w_e, double[::1] w_b,
                          long[::1] w_c) except -1

@cython.locals(nc=cython.Py_ssize_t, nx=cython.Py_ssize_t, r=cython.Py_ssize_t,
               ix=cython.Py_ssize_t, t=cython.Py_ssize_t, pos=cython.Py_ssize_t,
               f=cython.Py_ssize_t, pid=cython.Py_ssize_t, base=cython.Py_ssize_t,
               j=cython.Py_ssize_t, i=cython.Py_ssize_t, h0=cython.double, t0=cython.double,
               a=cython.double, b=cython.double)
cpdef _expand(double[:, ::1] C, double[:, ::1] X, long[::1] off, long[::1] pnb, long[::1] pst,
              long[::1] pnd, long[::1] plk, double[::1] pbusy, double[::1] pen,
              double[::1] pla, double[::1] plb, unsigned char[::1] pterm, double[:, ::1] out,
              Py_ssize_t r0)

cdef double _mx(double a, double b)

@cython.locals(n=cython.Py_ssize_t, m=cython.Py_ssize_t, i=cython.Py_ssize_t,
               j=cython.Py_ssize_t, k=cython.Py_ssize_t, s=cython.Py_ssize_t,
               r=cython.Py_ssize_t, o=cython.Py_ssize_t, x=cython.double, y=cython.double,
               iss=cython.double, te=cython.double, prev=cython.double, f=cython.double)
cpdef Py_ssize_t _finish(double[:, ::1] P, long[::1] order, long[::1] lo, double[::1] t_issue,
                         double[::1] t_end, double[::1] crit_r, long[::1] op, int[::1] hop,
                         int[::1] tile, short[::1] stage, int[::1] node, int[::1] link,
                         double[::1] en, double[::1] lv, double[::1] busy, double[::1] q,
                         double[::1] crit, long[::1] nb, long[::1] starts,
                         long[::1] seg_ops) except -1

@cython.locals(n=cython.Py_ssize_t, top=cython.Py_ssize_t, m=cython.Py_ssize_t,
               i=cython.Py_ssize_t, bz=cython.double, r=cython.long, key=cython.long,
               ranked=cython.bint)
cpdef Py_ssize_t _intervals(double[:, ::1] P, long[::1] rid_of, long[::1] rank, long[::1] res,
                            double[::1] s, double[::1] e, double[::1] b) except -1

@cython.locals(lo=cython.long, hi=cython.long, first=cython.bint, inf=cython.double,
               w_lo=cython.double, i=cython.Py_ssize_t, r=cython.long, x=cython.double,
               y=cython.double, z=cython.double, te=cython.double, ncap=cython.Py_ssize_t,
               miss=cython.bint)
cpdef int _busy_scan(long[::1] o_res, double[::1] o_s, double[::1] o_e, long[::1] res,
                     double[::1] s, double[::1] e, double[::1] b, double w_prev, double eps,
                     double rel, double[::1] cap, long[::1] mm) except -3

@cython.locals(m=cython.Py_ssize_t, ncap=cython.Py_ssize_t, shut=cython.Py_ssize_t,
               u=cython.double, i=cython.Py_ssize_t, k=cython.Py_ssize_t, x=cython.double,
               r=cython.long, c=cython.double, d=cython.double, v=cython.double)
cpdef Py_ssize_t _busy_close(long[::1] w_r, double[::1] w_s, double[::1] w_e, double[::1] w_b,
                             long[::1] w_c, double w_new, double[::1] cap, double eps,
                             double rel, double[::1] out) except -3

@cython.locals(n=cython.Py_ssize_t, m=cython.Py_ssize_t, i=cython.Py_ssize_t, r=cython.long,
               lo=cython.long, hi=cython.long, nan=cython.long)
cpdef Py_ssize_t _ranks(double[:, ::1] P, long[::1] rank_of, long rank_lo, long[::1] rank,
                        long[::1] info) except -2

@cython.locals(n=cython.Py_ssize_t, c=cython.Py_ssize_t, i=cython.Py_ssize_t,
               f=cython.Py_ssize_t)
cpdef _part(double[:, ::1] P, long[::1] rank, double[:, ::1] C)
