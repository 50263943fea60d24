# Types for the compiled twin of enters.py (Cython's pure-Python mode; see fair.pxd).
import cython


@cython.locals(hn=dict, v=tuple)
cpdef entered(g, Py_ssize_t j, double ha, double s0)

@cython.locals(rw=tuple, q=cython.double, x=cython.double, s0=cython.double, hn=dict,
               m=cython.double, k=cython.Py_ssize_t, v=object)
cpdef enter_rows(f, list rows)

@cython.locals(rw=tuple, q=cython.double)
cpdef row_at(list rows, Py_ssize_t k, double en, double lv)
