"""A stand-in for sgl-kernel, so that SGLang 0.5.23's server starts on a CPU without it (tools/real_sglang.py puts
this folder on the server's PYTHONPATH).

With SGLANG_USE_CPU_ENGINE=1, SGLang imports a few names from `sgl_kernel` at module level; the real package's CPU
build is not on PyPI and needs AVX-512/AMX. Without AMX every layer runs its `forward_native` path, so none of these
is ever called: each name is a function that raises NotImplementedError if one is, which would show at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def __getattr__(name: str) -> Callable[..., Any]:
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel.{name} is a stand-in (tools/sglang_cpu): the real kernel is not here")

    missing.__name__ = name
    return missing
