# Types for the compiled twin of fast.py (Cython's pure-Python mode: this augmenting .pxd only
# cimports routes' typed ``send``, so ``FastFabric.send`` calls it as a C function; fast.py
# itself stays plain Python and is what runs interpreted). ``FastFabric`` stays a Python class
# (its bases: ``base.Fabric``, a Python class, and ``ledger.FabState``, an extension type).
# setup.py copies it beside the generated _fast_c.py.
from kbtrace.replay.fabric._routes_c cimport send
