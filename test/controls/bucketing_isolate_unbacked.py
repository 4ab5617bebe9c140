"""Control for bucketing-isolate-unbacked (pytorch/pytorch#183495), shipped in 2.13.0.

Collective bucketing (torch/_inductor/fx_passes/bucketing.py) builds each merged
collective by tracing a merge function with a nested ``make_fx`` inside the graph's
own FakeTensorMode / ShapeEnv.  The fix made ``_trace`` snapshot and clear the
ShapeEnv's ``pending_fresh_unbacked_symbols`` and ``ignorable_fresh_unbacked_symbols``
around that nested trace and restore them afterwards, so the nested trace only
accounts for symbols it creates.  Without it, ``compute_unbacked_bindings`` in the
nested trace sees the outer trace's pending symbols, finds them in none of the merge
graph's outputs and raises ``PendingUnbackedSymbolNotFound`` (pytorch/pytorch#183679).

This control replaces ``bucketing._trace`` (the one function the fix changed; callers
look it up through the module) with its pre-fix body: trace under the fake mode and
the Python dispatcher, then drop ``aten.detach`` nodes, with no snapshot/clear/restore.
"""


def apply() -> None:
    import torch
    import torch._inductor.fx_passes.bucketing as bucketing
    from torch._dispatch.python import enable_python_dispatcher
    from torch._dynamo.utils import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    def _trace(fn, inps):
        fake_mode = detect_fake_mode(inps)
        assert fake_mode is not None
        with fake_mode, enable_python_dispatcher():
            out = make_fx(fn)(*inps)
        for node in out.graph.find_nodes(
            op="call_function", target=torch.ops.aten.detach.default
        ):
            node.replace_all_uses_with(node.args[0])
            out.graph.erase_node(node)
        return out

    bucketing._trace = _trace
