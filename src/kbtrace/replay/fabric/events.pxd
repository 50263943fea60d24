# Types for the compiled twin of events.py (Cython's pure-Python mode: this augmenting .pxd
# makes ``after`` a C function for the compiled modules that cimport it: routes, fair,
# heads). setup.py copies it beside the generated _events_c.py.
cpdef object after(object env, double delay, object value=*)
