"""Control for bucketing-symbolic-sizes (pytorch/pytorch#183544), shipped in 2.13.0.

Collective bucketing (torch/_inductor/fx_passes/bucketing.py) needs Python integers
for two policy decisions: bucket byte accounting in ``greedy_bucket_collective_by_mb``
(``cur_bucket_size_bytes + size_bytes > bucket_size_bytes``) and the all-gather
foreach grouping key in ``_compute_foreach_groups``.  Before the fix both used the
tensor metadata directly (``numel() * element_size()`` and ``tuple(shape)``), so with
an unbacked size the byte comparison guarded on the symbol and raised a
data-dependent error (pytorch/pytorch#183676), even when the symbol had an
optimization hint.  The fix routes those two policy reads through
``_size_bytes_hint_or_raise`` / ``_hint_int_or_raise``, which use hints (backed
values, ``var_to_hint_override``) and fail fast with "Could not extract optimization
hint ..." on an unhinted symbol, while the traced merge graph keeps symbolic sizes.

This control restores the pre-fix reads by replacing those two helpers (looked up
through the module by every caller): byte sizes are the symbolic
``numel() * itemsize`` again, and the grouping key takes the raw size.
"""


def apply() -> None:
    import torch._inductor.fx_passes.bucketing as bucketing

    def _size_bytes_hint_or_raise(tensor, *, dtype=None, context):
        element_size = tensor.element_size() if dtype is None else dtype.itemsize
        return tensor.numel() * element_size

    def _hint_int_or_raise(value, *, context):
        return value

    bucketing._size_bytes_hint_or_raise = _size_bytes_hint_or_raise
    bucketing._hint_int_or_raise = _hint_int_or_raise
