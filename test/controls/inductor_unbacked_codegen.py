"""Control for inductor-unbacked-codegen (pytorch/pytorch#183840), shipped in 2.13.0.

The fix has three Python parts; this control reverts each of them by replacing the
one function that carries it (in this process only):

1. Fallback kernels bind their fresh unbacked outputs
   (torch/_inductor/ir.py ``_fallback_kernel_symbol_tracking_context``).
   ``FallbackKernel.process_kernel`` re-runs the op's fake kernel to get the example
   output.  When Inductor is driven from inside a trace that ignores fresh unbacked
   symbols (``ShapeEnv.ignore_fresh_unbacked_symbols()``, as standalone/regional
   compiles are), the output's fresh symbols (e.g. the length of
   ``repeat_interleave(repeats)``) never became pending, ``compute_unbacked_bindings``
   found nothing, and the wrapper used the symbol without defining it
   (``NameError: name 'u4' is not defined``, pytorch/pytorch#185341).  The fix re-enables
   fresh-symbol tracking around that call.  Reverted here: the context is always a
   ``nullcontext()``, i.e. the pre-fix ``with enable_python_dispatcher():`` alone.

2. Stride-order proof without hints (``Layout._stride_expr_ge_or_false``, used by
   ``Layout.is_stride_ordered`` and so by ``require_strides``).  The fix proves
   ``left >= right`` for strides with ``guard_or_false(Ge)`` *or* divisibility
   ``guard_or_false(Eq(left % right, 0))`` (plus the zero-stride cases), so that
   ``256 * u0 >= 256`` is proven for an unbacked ``u0 >= 0`` without a guard.
   Reverted here to the plain, non-proving comparison ``guard_or_false(Ge(left, right))``.

3. Optimization-only stride sorting with hints (torch/_inductor/utils.py
   ``argsort_sym``, called by ``ir.get_fill_order`` / ``get_stride_order``).  The fix
   falls back to ``optimization_hint`` comparisons when ``evaluate_expr`` raises
   ``GuardOnDataDependentSymNode`` (pytorch/pytorch#183834).  Reverted here to the same
   sort without that fallback, so a data-dependent comparison raises.

Not reverted: the ``require_strides`` change that freezes a proven current layout
instead of bailing out on any unbacked stride (its Python is inline in a large method;
no test here targets it on its own).
"""

import contextlib
import functools

import sympy


def _argsort_sym_pre_183840(shape_env, seq, *, reverse=False):
    import torch

    def cmp(a, b):
        a_idx, a_val = a
        b_idx, b_val = b

        def evaluate(expr):
            if isinstance(expr, bool):
                return expr
            return shape_env.evaluate_expr(expr)

        if evaluate(a_val < b_val):
            return -1
        if evaluate(a_val > b_val):
            return 1
        if a_idx < b_idx:
            return 1
        if a_idx > b_idx:
            return -1
        return 0

    exprs = [
        (idx, s.node.expr if isinstance(s, torch.SymInt) else s)
        for idx, s in enumerate(seq)
    ]
    exprs = sorted(exprs, key=functools.cmp_to_key(cmp), reverse=reverse)
    return [idx for idx, _ in exprs]


def apply() -> None:
    import torch._inductor.ir as ir
    import torch._inductor.utils as inductor_utils
    from torch._inductor.virtualized import V

    ir._fallback_kernel_symbol_tracking_context = (
        lambda shape_env: contextlib.nullcontext()
    )

    def _stride_expr_ge_or_false(left, right):
        return V.graph.sizevars.guard_or_false(sympy.Ge(left, right))

    ir.Layout._stride_expr_ge_or_false = staticmethod(_stride_expr_ge_or_false)

    inductor_utils.argsort_sym = _argsort_sym_pre_183840
    ir.argsort_sym = _argsort_sym_pre_183840
