# Types for the compiled twin of events.py (Cython's pure-Python mode: this augmenting .pxd
# makes ``after`` a C function for the compiled modules that cimport it: routes, fair,
# heads, and its push onto the environment's ``EventQueue`` a C call). setup.py copies it
# beside the generated _events_c.py.
import cython
from kbtrace.replay.fabric._eventq_c cimport EventQueue

@cython.locals(q=EventQueue)
cpdef object after(object env, double delay, object value=*)
