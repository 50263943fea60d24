"""Make a stage package callable as its main function.

``kbtrace.capture`` and ``kbtrace.replay`` are both packages (the fixed layout)
and the library's entry functions (``kbtrace.capture(...)``,
``kbtrace.replay(...)``). Python binds the submodule over any same-named
attribute of the parent package once it is imported, so instead of fighting
that, each package's module object gets a class whose ``__call__`` forwards to
the function: both ``kbtrace.replay(trace, topo)`` and
``kbtrace.replay.ReplayOptions`` work, in any import order.
"""

from __future__ import annotations

import sys
import types

__all__ = ["make_module_callable"]


def make_module_callable(module_name: str, func_name: str) -> None:
    module = sys.modules[module_name]

    class _CallableModule(types.ModuleType):
        def __call__(self, *args: object, **kwargs: object) -> object:
            return getattr(self, func_name)(*args, **kwargs)

    _CallableModule.__name__ = f"CallableModule[{module_name}]"
    _CallableModule.__call__.__doc__ = getattr(module, func_name).__doc__
    module.__class__ = _CallableModule
