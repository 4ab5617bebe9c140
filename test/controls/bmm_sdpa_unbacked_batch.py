"""Control for bmm-sdpa-unbacked-batch (pytorch/pytorch#183398), shipped in 2.13.0.

What the fix did, and what this control takes out again:

1. C++ broadcasted-bmm branch of ``_matmul_impl`` (LinearAlgebra.cpp), the branch
   taken when matmul does not fold and one operand has rank >= 3 (batched @ batched,
   broadcast batches, and every matmul inside math SDPA).  Before the fix it read
   the batch dims as ``int64_t`` (``sizes()``, ``IntArrayRef``, ``DimVector``,
   ``infer_size``) before expand/reshape/view, which throws on a fake tensor with
   symbolic sizes.  The fix carried ``sym_sizes()`` / ``SymDimVector`` /
   ``infer_size_symdimvector`` / ``expand_symint`` / ``reshape_symint`` through.

   A Python monkeypatch cannot remove C++ code, so this control re-registers the
   ``aten::matmul`` CompositeImplicitAutograd kernel with a Python wrapper (in this
   process only).  When the call takes that branch and either operand has symbolic
   sizes or strides, the wrapper raises the error the pre-fix code raised
   (``Cannot call sizes() on tensor with symbolic sizes/strides``); every other call,
   including the folded ND @ 1D/2D path (#183397, not this fix), is forwarded to the
   shipped C++ kernel captured before the override.

   Fidelity: the failure mode and the set of failing calls are the pre-fix ones; the
   pre-fix C++ code itself does not run.  With the Python dispatcher enabled,
   ``aten.matmul`` runs the Python decomposition instead of this kernel before and
   after the fix, so that path is untouched here and its tests are guards.

2. ``TorchFunctionMetadataMode.__torch_function__`` (torch/fx/experimental/
   proxy_tensor.py, the Python half).  The fix redirects ``aten.size.default`` on a
   tensor with symbolic sizes to ``aten.sym_size.default``, because the ``int[]``
   schema of ``aten.size.default`` forces every symbol (a data-dependent error for
   unbacked ones).  This control restores the method without that redirect: record
   the torch function, then call it.  That is an exact revert of the Python hunk.
"""

import torch

PRE_FIX_ERROR = "Cannot call sizes() on tensor with symbolic sizes/strides"

_keep_alive = []


def _has_symbolic_metadata(t: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))


def _takes_fold_path(t1: torch.Tensor, t2: torch.Tensor) -> bool:
    """should_fold() in LinearAlgebra.cpp, up to the stride check (shapes only)."""
    dim1, dim2 = t1.dim(), t2.dim()
    tensor1_larger = dim1 >= dim2
    dim_big = max(dim1, dim2)
    dim_small = dim2 if tensor1_larger else dim1
    if not (dim_big >= 3 and dim_small <= 2):
        return False
    if t1.requires_grad and not tensor1_larger:
        return True
    return dim1 != 2


def _takes_broadcast_bmm_path(t1: torch.Tensor, t2: torch.Tensor) -> bool:
    if t1.dim() < 3 and t2.dim() < 3:
        return False  # dot / mv / mm branches
    # The fold decision also depends on strides; on a fold candidate the pre-fix
    # fold path is #183397's business, so leave all fold candidates to the kernel.
    return not _takes_fold_path(t1, t2)


def apply() -> None:
    import torch.fx.experimental.proxy_tensor as proxy_tensor

    shipped = torch.library.get_kernel("aten::matmul", "CPU")
    keyset = torch._C.DispatchKeySet("CPU")

    def matmul_pre_183398(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        if _takes_broadcast_bmm_path(self, other) and (
            _has_symbolic_metadata(self) or _has_symbolic_metadata(other)
        ):
            raise RuntimeError(PRE_FIX_ERROR)
        return shipped.call_boxed(keyset, self, other)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("matmul", matmul_pre_183398, "CompositeImplicitAutograd")
    _keep_alive.append(lib)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.tracer.torch_fn_metadata = func
        self.tracer.torch_fn_counts[func] = self.tracer.torch_fn_counts.get(func, 0) + 1
        return func(*args, **kwargs)

    proxy_tensor.TorchFunctionMetadataMode.__torch_function__ = __torch_function__
