"""Inductor's Triton (GPU) code path on a CPU machine: symfix's `triton` column.

With SYMFIX_INDUCTOR=triton, test/conftest.py sets TRITON_INTERPRET=1 before torch is imported
and calls ``activate()``: Inductor then generates the kernels it generates for a GPU (``@triton.jit``
pointwise, reduction and template kernels, the Triton FlexAttention and flex decoding templates)
and Triton's interpreter runs them in numpy over CPU tensors. Nothing installed is edited; this
process is patched:

- ``torch._inductor.config.cpu_backend = "triton"``: Triton kernels for CPU tensors;
- a Triton driver for CPU is made active (``driver.set_active``), whose target is a GPU
  (sm_80, warp 32) so that Inductor picks its GPU heuristics and templates;
- ``triton.language.extra.libdevice`` is bodiless outside a GPU backend (its functions return
  None under the interpreter): its functions get CPU implementations (torch's, on the numpy data);
- FlexAttention's lowering sends CPU tensors to its C++ template first; that one branch is
  dropped, so CPU tensors take the Triton templates, as CUDA tensors do;
- flex decoding sizes its split of the keys by the GPU's SM count: without CUDA,
  ``torch.cuda.get_device_properties`` answers for a GPU of 4 SMs (small grids for the interpreter);
- the interpreter's atomics get their mask and values as contiguous arrays of the pointers' shape:
  with a [1, 1] mask over a [1, N] block (XBLOCK=1) it updated the first element only, which
  made a persistent reduction's embedding gradient wrong.

It checks the torch and triton releases it was written for and says loudly why it cannot run.
Slow (numpy runs every program of a grid): sizes stay small.
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap

# written against these: the libdevice names, the interpreter's TensorHandle, the flex lowering
SUPPORTED = {"torch": ("2.13.", "2.14.", "2.15."), "triton": ("3.7.", "3.8.", "3.9.")}


class TritonPathUnavailable(RuntimeError):
    pass


def check_versions() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise TritonPathUnavailable(
            "TRITON_INTERPRET=1 must be set before torch is imported (test/conftest.py does it)")
    try:
        import triton
    except ImportError as e:
        raise TritonPathUnavailable(f"triton is not installed here ({e})") from None
    import torch

    for name, version in (("torch", torch.__version__), ("triton", triton.__version__)):
        if not version.startswith(SUPPORTED[name]):
            raise TritonPathUnavailable(
                f"written for {name} {', '.join(v + 'x' for v in SUPPORTED[name])}; "
                f"this is {name} {version}")


def _cpu_driver():
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class CPUDriver(DriverBase):
        """What Inductor and Triton's launcher ask of a driver, answered for CPU tensors."""

        @classmethod
        def is_active(cls):
            return True

        def map_python_to_cpp_type(self, ty):
            return ty

        def get_current_target(self):
            return GPUTarget("cuda", 80, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_benchmarker(self):
            from triton.testing import do_bench

            return do_bench

        def get_current_device(self):
            return 0

        def set_current_device(self, device):
            pass

        def get_current_stream(self, device=None):
            return 0

        def get_device_capability(self, device=None):
            return (8, 0)

    return CPUDriver()


# libdevice name -> torch function of the same meaning (applied to the numpy data)
def _libdevice_impls():
    import torch

    same = ["exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin",
            "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh",
            "atanh", "erf", "erfc", "erfinv", "lgamma", "floor", "ceil", "trunc", "isnan",
            "isinf", "signbit", "pow", "atan2", "hypot", "copysign", "fmod", "nextafter"]
    impls = {name: getattr(torch, name) for name in same}
    impls.update({
        "abs": torch.abs, "fabs": torch.abs, "rint": torch.round, "nearbyint": torch.round,
        "round": lambda x: torch.where(x >= 0, torch.floor(x + 0.5), torch.ceil(x - 0.5)),
        "tgamma": lambda x: torch.lgamma(x).exp() * torch.where(
            (x < 0) & (torch.floor(x) % 2 == 1), -1.0, 1.0),
        "fma": lambda a, b, c: a * b + c, "isfinited": torch.isfinite,
        "finitef": torch.isfinite, "isinfd": torch.isinf, "isnand": torch.isnan,
        "fmin": torch.fmin, "fmax": torch.fmax,
    })
    return impls


def _libdevice_fn(torch_fn):
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def fn(*args, **kwargs):
        tensors = [a for a in args if isinstance(a, tl.core.tensor)]
        like = tensors[0]
        data = [torch.from_numpy(np.asarray(a.handle.data)) if isinstance(a, tl.core.tensor)
                else a for a in args]
        out = torch_fn(*data).numpy()
        if out.dtype == np.bool_:
            scalar = tl.int1
        else:
            out = out.astype(like.handle.data.dtype, copy=False)
            scalar = like.handle.dtype
        ty = tl.block_type(scalar, like.type.shape) if like.type.is_block() else scalar
        return tl.core.tensor(TensorHandle(out, scalar), ty)

    return fn


def _flex_lowering_without_cpu_branch():
    """FlexAttention's forward lowering, less ``if query.get_device().type == "cpu": ...``,
    registered in its place."""
    import torch
    from torch._inductor.kernel.flex import flex_attention as module

    tree = ast.parse(textwrap.dedent(inspect.getsource(module.flex_attention)))
    fn = tree.body[0]
    cpu_branches = [s for s in fn.body if isinstance(s, ast.If)
                    and ast.unparse(s.test) == "query.get_device().type == 'cpu'"]
    if len(cpu_branches) != 1:
        raise TritonPathUnavailable("the FlexAttention lowering's CPU branch was not found")
    fn.body.remove(cpu_branches[0])
    fn.decorator_list = []
    namespace: dict = {}
    exec(compile(tree, inspect.getsourcefile(module), "exec"), module.__dict__, namespace)
    new = namespace["flex_attention"]
    module.register_lowering(torch.ops.higher_order.flex_attention, type_promotion_kind=None)(new)
    return new


def _device_properties(get_device_properties):
    import types

    import torch

    def props(device=None):
        if torch.cuda.is_available():
            return get_device_properties(device)
        return types.SimpleNamespace(name="symfix Triton on CPU", major=8, minor=0,
                                     multi_processor_count=4, warp_size=32)

    return props


def _contiguous_atomics():
    """The interpreter's C++ atomics with every operand a contiguous array of the pointers'
    shape (see the module's docstring)."""
    import numpy as np
    from triton.runtime import interpreter

    native = interpreter._interpreter

    def full(a, shape):
        return np.ascontiguousarray(np.broadcast_to(a, shape))

    class Atomics:
        def __getattr__(self, name):
            return getattr(native, name)

        @staticmethod
        def atomic_rmw(op, ptr, val, mask, sem):
            return native.atomic_rmw(op, full(ptr, ptr.shape), full(val, ptr.shape),
                                     full(mask, ptr.shape), sem)

        @staticmethod
        def atomic_cas(ptr, cmp, val, sem):
            return native.atomic_cas(full(ptr, ptr.shape), full(cmp, ptr.shape),
                                     full(val, ptr.shape), sem)

    interpreter._interpreter = Atomics()


_ACTIVE = None


def activate() -> None:
    """Route this process's Inductor compiles through the Triton path (idempotent)."""
    global _ACTIVE
    if _ACTIVE is not None:
        return
    check_versions()
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime import triton_helpers
    from triton.runtime.driver import driver

    driver.set_active(_cpu_driver())
    inductor_config.cpu_backend = "triton"
    torch.cuda.get_device_properties = _device_properties(torch.cuda.get_device_properties)
    for name, torch_fn in _libdevice_impls().items():
        if hasattr(triton_helpers.libdevice, name):
            setattr(triton_helpers.libdevice, name, _libdevice_fn(torch_fn))
    _contiguous_atomics()
    _ACTIVE = _flex_lowering_without_cpu_branch()
