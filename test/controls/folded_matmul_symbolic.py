"""Control for folded-matmul-symbolic (pytorch/pytorch#183397), shipped in 2.13.0.

What the fix did, and what this control takes out again:

1. C++ ``_matmul_impl`` / ``should_fold`` (aten/src/ATen/native/LinearAlgebra.cpp).
   Before the fix, the folded path for ND @ 1D and ND @ 2D (the larger operand has
   rank >= 3, the other rank <= 2) read concrete metadata from the folded operand:
   ``numel()`` for the empty-tensor shortcut and ``sizes()`` for the fold/view
   shape.  On a fake tensor with symbolic sizes both throw
   ``Cannot call numel() on tensor with symbolic sizes/strides`` (the error of
   pytorch/pytorch#187709 and torchtitan#3322).  The fix moved that path to
   ``sym_numel()`` / ``sym_sizes()`` / ``reshape_symint()`` / ``_unsafe_view_symint()``.

   A Python monkeypatch cannot remove C++ code, so this control re-registers the
   ``aten::matmul`` CompositeImplicitAutograd kernel with a Python wrapper (in this
   process only).  The wrapper decides, with the same shape rules as the C++
   ``should_fold`` up to the point where the old code first touched ``numel()``,
   whether the call takes the fold path; if it does and the folded operand has
   symbolic sizes or strides, it raises the pre-fix error.  Every other call is
   forwarded unchanged to the shipped C++ kernel, captured before the override.

   Fidelity: the failure mode (the exception, and the set of calls that hit it) is
   the pre-fix one; the pre-fix C++ code itself does not run.  The wrapper treats
   any symbolic size as fatal on that path, as ``numel()`` did.  With the Python
   dispatcher enabled, ``aten.matmul`` runs the Python decomposition
   (torch/_decomp/decompositions.py) instead of this C++ kernel, both before and
   after the fix, so that path is untouched here and its tests are guards.

2. Fake view metadata (torch/_subclasses/fake_impls.py, the Python half).  The fix
   added ``_is_contiguous_with_hinted_checks``: when a size-oblivious view of a
   tensor with unbacked sizes fails, a contiguity relation that holds at the
   optimization hint (e.g. stride ``u0`` vs. size ``2 * (u0 // 2)``) is recorded as
   a ``torch._check`` instead of failing.  Before the fix that step did not exist
   and ``_view_unbacked_meta`` went straight to the non-oblivious retry, which
   raises.  This control makes the helper answer False, which is exactly the
   pre-fix control flow of ``_view_unbacked_meta``.
"""

import torch

PRE_FIX_ERROR = "Cannot call numel() on tensor with symbolic sizes/strides"

_keep_alive = []


def _has_symbolic_metadata(t: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))


def _folded_operand(t1: torch.Tensor, t2: torch.Tensor) -> torch.Tensor | None:
    """The operand whose numel()/sizes() the pre-fix fold path read, else None.

    Mirrors should_fold() in LinearAlgebra.cpp up to (and including) the point where
    the old code called numel() on the larger operand.
    """
    dim1, dim2 = t1.dim(), t2.dim()
    tensor1_larger = dim1 >= dim2
    big = t1 if tensor1_larger else t2.mT
    dim_big = big.dim()
    dim_small = dim2 if tensor1_larger else dim1
    if not (dim_big >= 3 and dim_small <= 2):
        return None
    if t1.requires_grad and not tensor1_larger:
        return big  # folds without the numel() check, then reads sizes()
    if dim1 == 2:
        return None  # 2D @ ND without grad: not folded, takes the bmm path
    return big


def apply() -> None:
    import torch._subclasses.fake_impls as fake_impls

    shipped = torch.library.get_kernel("aten::matmul", "CPU")
    keyset = torch._C.DispatchKeySet("CPU")

    def matmul_pre_183397(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        folded = _folded_operand(self, other)
        if folded is not None and _has_symbolic_metadata(folded):
            raise RuntimeError(PRE_FIX_ERROR)
        return shipped.call_boxed(keyset, self, other)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("matmul", matmul_pre_183397, "CompositeImplicitAutograd")
    _keep_alive.append(lib)

    fake_impls._is_contiguous_with_hinted_checks = lambda a: False
