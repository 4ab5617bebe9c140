"""A miniature graph trainer: the workload symfix exists for.

One whole distributed training step of a tiny MoE decoder (forward, backward,
optimizer step and the FSDP collectives) is captured as ONE FX graph whose batch
and sequence sizes are unbacked, hinted SymInts; the graph is rewritten (token
chunking, collective bucketing) and then run for every batch shape.

Used by test_graph_trainer_unbacked.py and bench_graph_trainer.py.  Each capture
layer is wrapped in ``stage(name)`` so that a failure names the layer that broke.

``beyond_upstream`` (threaded through forward_loss / train_step / capture /
run_workload) selects between two ways of doing exactly two things; everything
else is the same model:

* False (default, upstream-compatible: runs on 2.14.1 and on the patched build):
  the causal BlockMask is one constant 128x128 block built with
  ``BlockMask.from_kv_blocks(..., seq_lengths=(S, S))`` (so S <= MAX_SEQ), and
  the output layers and the loss are plain data parallel (loss / world size).
* True (needs symfix 0008/0009/0010, fails on 2.14.1): the BlockMask is built in
  the graph with ``create_block_mask`` from the unbacked sequence length (no cap
  on S), and the output layers and the loss run on a Shard(1) DTensor over the
  unbacked sequence (``seq_sharded_loss``).
"""

import contextlib
import datetime
import json
import math
import os
import sys
import tempfile
import traceback
import warnings
from unittest import mock

import torch
import torch._dynamo.decorators
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.tensor import (
    distribute_tensor,
    DTensor,
    Partial,
    Replicate,
    Shard,
)

# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------

VOCAB, DIM, HEADS, EXPERTS, TOPK, FFN = 64, 32, 2, 4, 2, 32
HEAD_DIM = DIM // HEADS
# Upstream-compatible mask: one FlexAttention block (BLOCK_SIZE 128) covers
# every sequence, so the sequence is capped there (beyond_upstream: no cap).
MAX_SEQ = 128
LR, MOMENTUM = 0.1, 0.9

PARAM_SHAPES = {
    "embed": (VOCAB, DIM),
    "attn_norm": (DIM,),
    "wqkv": (3 * DIM, DIM),
    "wo": (DIM, DIM),
    "ffn_norm": (DIM,),
    "router": (EXPERTS, DIM),
    "w1": (EXPERTS, FFN, DIM),
    "w2": (EXPERTS, DIM, FFN),
    "final_norm": (DIM,),
    "head": (VOCAB, DIM),
}


def scale_model(size=1):
    """Set the model's widths to ``size`` times the default ones (1: the tiny
    test model).  The benchmark uses it to measure the same step with enough
    compute per op that the per-node overhead no longer dominates."""
    global VOCAB, DIM, FFN, HEAD_DIM
    VOCAB, DIM, FFN = 64 * size, 32 * size, 32 * size
    HEAD_DIM = DIM // HEADS
    PARAM_SHAPES.update(
        embed=(VOCAB, DIM), attn_norm=(DIM,), wqkv=(3 * DIM, DIM), wo=(DIM, DIM),
        ffn_norm=(DIM,), router=(EXPERTS, DIM), w1=(EXPERTS, FFN, DIM),
        w2=(EXPERTS, DIM, FFN), final_norm=(DIM,), head=(VOCAB, DIM),
    )


def _torch_frame(exc):
    """``torch/<file>:<function>`` of the innermost torch frame that raised."""
    where = None
    for e in (exc, exc.__cause__):
        tb = getattr(e, "__traceback__", None)
        while tb is not None:
            f = tb.tb_frame.f_code.co_filename
            if "/torch/" in f and not f.endswith(("_stats.py", "contextlib.py")):
                where = f"torch/{f.rsplit('/torch/', 1)[1]}:{tb.tb_frame.f_code.co_name}"
            tb = tb.tb_next
        if where:
            return where
    return "?"


class StageError(RuntimeError):
    """A layer of the capture/rewrite/run stack failed; ``stage`` names it."""

    def __init__(self, stage, exc):
        self.stage = f"{stage} [raised in {_torch_frame(exc)}]"
        self.exc = exc
        super().__init__(
            f"[graph-trainer] layer '{self.stage}' failed: {type(exc).__name__}: {exc}"
        )


@contextlib.contextmanager
def stage(name):
    try:
        yield
    except StageError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised with the layer's name
        raise StageError(name, e) from e


def full_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in PARAM_SHAPES.items():
        if name.endswith("norm"):
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            fan_in = shape[-1]
            out[name] = torch.randn(shape, generator=g) / math.sqrt(fan_in)
    return out


def sharded_state(mesh, seed=0):
    """Parameters and momentum buffers as DTensors, FSDP style: Shard(0)."""
    params = {
        k: distribute_tensor(v, mesh, [Shard(0)]).requires_grad_()
        for k, v in full_params(seed).items()
    }
    momentum = {
        k: distribute_tensor(torch.zeros(v.shape), mesh, [Shard(0)])
        for k, v in params.items()
    }
    return params, momentum


def fsdp_gather(p):
    # SimpleFSDP: all-gather the Shard(0) parameter for compute; its gradient
    # leaves as Partial and is reduce-scattered back to Shard(0) in backward.
    return p.redistribute(p.device_mesh, [Replicate()]).to_local(
        grad_placements=[Partial("sum")]
    )


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def causal_block_mask(seq, beyond_upstream=False):
    """Causal BlockMask for an (unbacked) sequence length ``seq``.

    Upstream-compatible (default): ``seq`` <= MAX_SEQ.  The block structure is
    static (one partial 128x128 block, causal inside it), only the lengths are
    symbolic.  create_block_mask(seq) inside the traced step and from_kv_blocks
    with unbacked block counts fail even on 2.14.1 (see the report); this is the
    closest path that works there.

    ``beyond_upstream``: built with the public create_block_mask.  Inside the
    traced step ``seq`` is the batch's unbacked sequence length, so the mask is
    built in the graph: create_mask, the pad of the dense mask up to whole
    128-blocks (aten.constant_pad_nd, symfix 0008) and the q-block transpose of
    the kv blocks (symfix 0010) all run on symbolic sizes; the number of blocks
    is ceil(seq / 128), so there is no cap on ``seq``.
    """
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    if beyond_upstream:
        return create_block_mask(causal, None, None, seq, seq, device="cpu")
    return BlockMask.from_kv_blocks(
        torch.ones(1, 1, 1, dtype=torch.int32),
        torch.zeros(1, 1, 1, 1, dtype=torch.int32),
        BLOCK_SIZE=MAX_SEQ,
        mask_mod=causal,
        seq_lengths=(seq, seq),
    )


def _flex_hop_entry(q, k, v, block_mask_tuple, scale, kernel_options):
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
    from torch.nn.attention.flex_attention import _identity

    return flex_hop(q, k, v, _identity, block_mask_tuple, scale, kernel_options)


_compiled_flex_entry = None


def flex_attention_train(q, k, v, block_mask):
    """FlexAttention for CPU *training*.

    torch.nn.attention.flex_attention refuses q/k/v that require grad on CPU
    (_validate_device: "FlexAttention does not support backward on CPU", in
    2.13.0 and 2.14.1).  The public entry point is itself only a thin shell
    around the flex_attention higher-order op, compiled with torch.compile; we
    call that same op through the same kind of compiled entry point.  The HOP's
    autograd rule on CPU is the dense math path (sdpa_dense + the
    flex_attention_backward HOP), so the captured step contains the
    flex_attention and flex_attention_backward nodes.  Forward-only callers can
    and do use the public API (see test_public_flex_attention_matches_hop_path).
    """
    global _compiled_flex_entry
    # the options the public entry point fills in (_apply_kernel_options), which
    # Inductor's Triton templates read
    kernel_options = {
        "BACKEND": "AUTO", "PRESCALE_QK": False, "ROWS_GUARANTEED_SAFE": False,
        "BLOCKS_ARE_CONTIGUOUS": False, "WRITE_DQ": True,
        "OUTPUT_LOGSUMEXP": True, "OUTPUT_MAX": False,
    }
    scale = 1.0 / math.sqrt(HEAD_DIM)
    if not torch.compiler._is_non_strict_tracing():
        # Eager reference: the same op, uncompiled, so that the eager runs
        # never touch Dynamo (the test counts Dynamo compiles).
        return _flex_hop_entry(q, k, v, block_mask.as_tuple(), scale, kernel_options)[0]
    if _compiled_flex_entry is None:
        _compiled_flex_entry = torch.compile(
            _flex_hop_entry, backend="eager", fullgraph=True
        )
    out, _lse, _max = _compiled_flex_entry(
        q, k, v, block_mask.as_tuple(), scale, kernel_options
    )
    return out


def moe(h, router, w1, w2):
    """Top-k MoE over flat tokens h [T, D]; per-expert token counts are data."""
    logits = h @ router.t()  # [T, E]  (the chunking pass splits this one)
    probs = logits.softmax(-1)
    topv, topi = probs.topk(TOPK, dim=-1)
    topv = topv / topv.sum(-1, keepdim=True)
    flat_e = topi.reshape(-1)  # [T*K]
    order = flat_e.argsort(stable=True)
    token_idx = order // TOPK
    # bincount's length is itself unbacked: slice it to the expert count first.
    counts = torch.bincount(flat_e, minlength=EXPERTS)[:EXPERTS].tolist()
    for c in counts:
        torch._check(c >= 0)
    torch._check(sum(counts) == flat_e.size(0))
    xs = h[token_idx]
    outs = [
        F.silu(chunk @ w1[e].t()) @ w2[e].t()
        for e, chunk in enumerate(xs.split_with_sizes(counts))
    ]
    ys = torch.cat(outs) * topv.reshape(-1)[order].unsqueeze(-1)
    return torch.zeros_like(h).index_add(0, token_idx, ys)


def forward_loss(params, batch, attn="flex", beyond_upstream=False):
    tokens, labels = batch[0], batch[1]
    B, S = tokens.shape
    mesh = params["embed"].device_mesh
    # beyond_upstream: the output layers' parameters are gathered by
    # seq_sharded_loss as Replicate DTensors instead
    skip = SEQ_PARALLEL_PARAMS if beyond_upstream else ()
    p = {k: fsdp_gather(v) for k, v in params.items() if k not in skip}
    x = F.embedding(tokens, p["embed"])  # [B, S, D]
    h = rms_norm(x, p["attn_norm"])
    qkv = (h @ p["wqkv"].t()).view(B, S, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    if attn == "flex":
        o = flex_attention_train(q, k, v, causal_block_mask(S, beyond_upstream))
    else:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + o.transpose(1, 2).reshape(B, S, DIM) @ p["wo"].t()
    h = rms_norm(x, p["ffn_norm"]).reshape(B * S, DIM)
    x = x + moe(h, p["router"], p["w1"], p["w2"]).view(B, S, DIM)
    if beyond_upstream:
        return seq_sharded_loss(x, labels, params, mesh)
    return dp_loss(x, labels, p, mesh)


def dp_loss(x, labels, p, mesh):
    """Final norm, output projection and loss, data parallel (upstream-compatible)."""
    logits = rms_norm(x, p["final_norm"]) @ p["head"].t()
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
    # data parallel: the reduce-scatter sums, so average over ranks here
    return loss / mesh.size()


# The output layers run on sequence-sharded DTensor activations; their
# parameters are all-gathered as Replicate DTensors instead of fsdp_gather.
SEQ_PARALLEL_PARAMS = ("final_norm", "head")
# Placements seen by the last seq_sharded_loss call (the capture records them;
# empty for the upstream-compatible data-parallel loss).
SEQ_SHARDING = {}


def seq_sharded_loss(x, labels, params, mesh):
    """Final norm, output projection and loss over Shard(1) activations.

    Every rank holds its own [B, S] batch (data parallel).  Its activations are
    one sequence shard of a global [B, W * S] DTensor (W = world size): Shard(1)
    over the unbacked sequence dim.  The per-token ops of the output layers stay
    local, and the loss is the mean over all W * B * S tokens, i.e. exactly the
    data-parallel loss / W with summed gradients of dp_loss (same gradients),
    here a DTensor reduction (Partial sum -> all-reduce).

    Flattening the tokens of the Shard(1) [B, W*S, D] tensor gives
    _StridedShard(0, split_factor=B), so the next op's sharding check compares
    the token count B*W*S with the symbolic bound W*B: is_tensor_shardable's
    hint_proves_at_least (symfix 0009), which needs the hint overrides of both
    B and S (mark_unbacked(..., hint_override=...) in capture).

    Sizes: the global sequence W * S is a multiple of W by construction, so any
    local S works (1 and odd included) and the shapes need no divisibility.
    The flatten is reshape(-1, D), as a model would write it: the global token
    count 2*u0*u1 is then computed inside DTensor's sharding propagation, outside
    the trace, and make_fx rebuilds it from the sympy expression. Without symfix
    0014 that became ONE operator.mul node with three arguments (the n-ary
    sympy.Mul mapped to the binary operator.mul), which fails when the graph
    runs ("mul expected 2 arguments, got 3"; 2.13.0 and 2.14.1 alike).
    """
    # On a 1-rank mesh (the benchmark's default) Shard(1) and Replicate are
    # the same layout, and DTensor's view rule refuses to flatten a sharded
    # dim of static size 1 (its static S=1 capture): replicate there.
    seq = [Shard(1) if mesh.size() > 1 else Replicate()]
    xs = DTensor.from_local(x, mesh, seq, run_check=False)  # [B, W*S, D]
    ys = DTensor.from_local(labels, mesh, seq, run_check=False)
    # FSDP all-gather, kept as Replicate DTensors; their gradients leave as
    # Partial and are reduce-scattered back to Shard(0)
    w = {k: params[k].redistribute(mesh, [Replicate()]) for k in SEQ_PARALLEL_PARAMS}
    B, S = labels.shape
    n_tok = B * (S * mesh.size())  # global token count, traced
    h = rms_norm(xs, w["final_norm"]).reshape(-1, DIM)  # _StridedShard(0, B)
    logits = h @ w["head"].t()
    loss = F.cross_entropy(logits, ys.reshape(-1), reduction="sum") / n_tok
    SEQ_SHARDING.update(
        activations=[str(p) for p in xs.placements],
        tokens=[str(p) for p in h.placements],
        logits=[str(p) for p in logits.placements],
    )
    return loss.full_tensor()


def train_step(params, momentum, batch, attn="flex", beyond_upstream=False):
    """Forward, backward, SGD-with-momentum step (in place) on DTensor state."""
    names = list(params)
    loss = forward_loss(params, batch, attn, beyond_upstream)
    grads = torch.autograd.grad(loss, [params[n] for n in names])
    with torch.no_grad():
        for n, g in zip(names, grads):
            momentum[n].mul_(MOMENTUM).add_(g)
            params[n].add_(momentum[n], alpha=-LR)
    return loss.detach(), [g.to_local() for g in grads]


# ---------------------------------------------------------------------------
# Capture (make_fx over fake inputs, like a graph trainer)
# ---------------------------------------------------------------------------


def make_batch(B, S, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (2, B, S), generator=g)


def _fakeify(fake_mode, t, name):
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        StatelessSymbolicContext,
    )

    unbacked = getattr(t, "_dynamo_unbacked_indices", set())
    if not unbacked:
        return fake_mode.from_tensor(t, static_shapes=True)
    ctx = StatelessSymbolicContext(
        dynamic_sizes=[
            DimDynamic.UNBACKED if i in unbacked else DimDynamic.STATIC
            for i in range(t.dim())
        ],
        unbacked_bounds=getattr(t, "_dynamo_unbacked_bounds", None),
    )
    return fake_mode.from_tensor(
        t, source=LocalSource(name, is_input=True), symbolic_context=ctx
    )


class Captured:
    def __init__(self, gm, fake_mode, fake_args, names, specs):
        self.gm, self.fake_mode, self.fake_args = gm, fake_mode, fake_args
        self.names, self.specs = names, specs

    def flat(self, params, momentum):
        """The graph's state inputs: the local tensors of the parameters, then momentum."""
        return [params[n]._local_tensor for n in self.names] + [
            momentum[n]._local_tensor for n in self.names
        ]

    def run(self, params, momentum, batch, fn=None):
        with torch.no_grad():
            out = (fn or self.gm)(*self.flat(params, momentum), batch)
        return out[0], list(out[1:])


CAPTURES = {"make_fx": 0}


def capture(
    params, momentum, batch, *, attn="flex", unbacked=True, hint=None, beyond_upstream=False
):
    """Trace ``train_step`` into one FX graph.  ``batch`` is a real example."""
    from torch._guards import tracing, TracingContext
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    CAPTURES["make_fx"] += 1
    names = list(params)
    specs = {n: (params[n]._spec, params[n].size(), params[n].stride()) for n in names}
    batch = batch.clone()
    if unbacked:
        hb, hs = hint or batch.shape[1:]
        with stage("mark_unbacked"):
            torch._dynamo.decorators.mark_unbacked(batch, 1, hint_override=hb, min=1)
            # the upstream-compatible one-block mask caps the sequence
            seq_max = {} if beyond_upstream else {"max": MAX_SEQ}
            torch._dynamo.decorators.mark_unbacked(
                batch, 2, hint_override=hs, min=1, **seq_max
            )

    def rewrap(local, n):
        spec, size, stride = specs[n]
        return DTensor(local, spec, requires_grad=False)

    def step(*flat):
        k = len(names)
        ps = {n: rewrap(flat[i], n).requires_grad_() for i, n in enumerate(names)}
        ms = {n: rewrap(flat[k + i], n) for i, n in enumerate(names)}
        loss, grads = train_step(ps, ms, flat[-1], attn, beyond_upstream)
        return [loss, *grads]

    real = [params[n]._local_tensor.detach() for n in names]
    real += [momentum[n]._local_tensor for n in names]
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    with stage("fakeify inputs"):
        fake_args = [_fakeify(fake_mode, t, f"arg{i}") for i, t in enumerate(real)]
        fake_args.append(_fakeify(fake_mode, batch, "batch"))
    with (
        stage(f"make_fx capture ({attn})"),
        torch._dynamo.config.patch(force_compile_during_fx_trace=True),
        fake_mode,
        tracing(TracingContext(fake_mode)),
        torch.autograd.set_multithreading_enabled(False),
        torch.compiler._non_strict_tracing_context(),
    ):
        gm = make_fx(step, record_module_stack=False)(*fake_args)
    return Captured(gm, fake_mode, fake_args, names, specs)


# ---------------------------------------------------------------------------
# Rewrites
# ---------------------------------------------------------------------------


def chunk_router_tokens(gm):
    """Split the router matmul over the token dimension into two chunks with
    derived symbolic extents T // 2 and T - T // 2 (T = B * S, unbacked)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    g = gm.graph
    mm = torch.ops.aten.mm.default
    targets = [
        n
        for n in g.find_nodes(op="call_function", target=mm)
        if tuple(n.meta["val"].shape[1:]) == (EXPERTS,)
        and free_unbacked_symbols(n.meta["val"].shape[0])
    ]
    if len(targets) != 1:
        raise AssertionError(f"expected one router mm with an unbacked token dim, got {targets}")
    (node,) = targets
    x, w = node.args
    T = x.meta["val"].shape[0]
    half = T // 2
    with g.inserting_before(node):
        sizes = g.materialize_symints([half, T - half])
        parts = g.call_function(torch.ops.aten.split_with_sizes.default, (x, sizes, 0))
        outs = []
        for i in range(2):
            piece = g.call_function(__import__("operator").getitem, (parts, i))
            outs.append(g.call_function(mm, (piece, w)))
        cat = g.call_function(torch.ops.aten.cat.default, (outs, 0))
    node.replace_all_uses_with(cat)
    g.erase_node(node)
    g.lint()
    gm.recompile()
    return half, T - half


def chunk_expert_counts(gm):
    """EP-style chunking of the routing: per-expert token counts are computed
    per token chunk (extents L // 2 and L - L // 2 of the L = B * S * TOPK
    routed slots), as expert parallelism needs them to dispatch each chunk.
    Each original count node ``u_e = bincount(...)[e].item()`` now computes
    ``count_e(chunk0) + count_e(chunk1)``: when FakeTensorProp runs again, the
    unbacked symbol it bound is re-bound to a derived expression (#183837)."""
    import operator

    g = gm.graph
    aten = torch.ops.aten
    (bc,) = g.find_nodes(op="call_function", target=aten.bincount.default)
    (sl,) = bc.users
    (ub,) = sl.users
    flat_e = bc.args[0]
    L = flat_e.meta["val"].shape[0]
    half = L // 2
    getitems = sorted(ub.users, key=lambda n: n.args[1])
    items = [next(iter(gi.users)) for gi in getitems]
    assert all(i.target == aten._local_scalar_dense.default for i in items), items
    with g.inserting_before(bc):
        sizes = g.materialize_symints([half, L - half])
        parts = g.call_function(aten.split_with_sizes.default, (flat_e, sizes, 0))
        chunk_counts = []
        for c in range(2):
            part = g.call_function(operator.getitem, (parts, c))
            cb = g.call_function(aten.bincount.default, (part, None, EXPERTS))
            cs = g.call_function(aten.slice.Tensor, (cb, 0, 0, EXPERTS))
            chunk_counts.append(g.call_function(aten.unbind.int, (cs,)))
        new_items = [
            [
                g.call_function(
                    aten._local_scalar_dense.default,
                    (g.call_function(operator.getitem, (cc, e)),),
                )
                for cc in chunk_counts
            ]
            for e in range(EXPERTS)
        ]
    for e, node in enumerate(items):
        node.target = operator.add
        node.args = tuple(new_items[e])
    for n in [*getitems, ub, sl, bc]:
        g.erase_node(n)
    g.lint()
    gm.recompile()
    return half, L - half


def fake_prop(cap):
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    # The graph ends in an in-place optimizer step on leaves: no autograd here.
    with torch.no_grad(), cap.fake_mode:
        FakeTensorProp(cap.gm, mode=cap.fake_mode).propagate_dont_convert_inputs(
            *cap.fake_args
        )


def bucket_collectives(gm):
    from torch._inductor.fx_passes.bucketing import (
        bucket_all_gather,
        bucket_reduce_scatter,
    )
    from torch._inductor.pattern_matcher import stable_topological_sort

    bucket_all_gather(gm)
    bucket_reduce_scatter(gm)
    # As in Inductor's post_grad: a bucketed collective is inserted after the
    # last collective of its bucket, so users of earlier members must be moved
    # after it (the bucketing guarantees such an order exists).
    stable_topological_sort(gm.graph)
    gm.graph.lint()
    gm.recompile()


def count_collectives(gm):
    """Collective launches in the graph (bucketed ones included), by kind."""
    counts = {"all_gather": 0, "reduce_scatter": 0}
    for n in gm.graph.nodes:
        name = str(n.target)
        if n.op != "call_function" or "_c10d_functional" not in name:
            continue
        for kind in counts:
            if kind in name:
                counts[kind] += 1
    return counts


@contextlib.contextmanager
def raw_symint_warning_is_error():
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "error", message="Raw .* passed as argument to Graph.create_node", category=UserWarning
        )
        yield


# ---------------------------------------------------------------------------
# The spawned 2-rank run (gloo, file rendezvous)
# ---------------------------------------------------------------------------


def init_gloo(rank, world, init_file):
    # File rendezvous in the run's own temporary directory: a free TCP port picked
    # beforehand can be taken by a run beside this one (EADDRINUSE, and the other
    # rank then waits for its peer). A rank that fails lets the other give up in
    # minutes, not after the default half hour.
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=datetime.timedelta(minutes=10),
    )


def _max_diff(a, b):
    return float((a - b).abs().max()) if a.numel() else 0.0


def _run_variant(mesh, attn, rank, shapes, hint, beyond_upstream=False, compiled=False):
    """Capture once, rewrite, run every shape; returns a JSON-able record.

    ``compiled``: instead of the eager comparison, compile the rewritten graph
    once with Inductor ("cpp" or "triton") and compare it with the graph at every
    shape."""
    from torch._dynamo.utils import counters
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    rec = {"attn": attn, "beyond_upstream": beyond_upstream, "steps": []}
    graph_state = sharded_state(mesh, seed=1)
    eager_state = sharded_state(mesh, seed=1)
    example = make_batch(*hint, seed=0)

    SEQ_SHARDING.clear()
    cap = capture(*graph_state, example, attn=attn, hint=hint, beyond_upstream=beyond_upstream)
    batch_val = cap.gm.graph.find_nodes(op="placeholder")[-1].meta["val"]
    rec["batch_shape"] = [str(d) for d in batch_val.shape]
    rec["batch_dims_unbacked"] = [
        bool(free_unbacked_symbols(d)) for d in batch_val.shape[1:]
    ]
    rec["collectives_captured"] = count_collectives(cap.gm)
    rec["flex_nodes"] = sorted(
        {str(n.target) for n in cap.gm.graph.nodes if "flex_attention" in str(n.target)}
    )
    rec["block_mask"] = block_mask_record(cap.gm)
    rec["seq_sharding"] = dict(SEQ_SHARDING)

    with raw_symint_warning_is_error():
        with stage("chunk pass (materialize_symints)"):
            extents = chunk_router_tokens(cap.gm)
        rec["chunk_extents"] = [str(e) for e in extents]
        with stage("EP count chunking pass (materialize_symints)"):
            rec["count_chunk_extents"] = [str(e) for e in chunk_expert_counts(cap.gm)]
        with stage("FakeTensorProp over the chunked graph (rebind_unbacked)"):
            fake_prop(cap)
        with stage("collective bucketing"):
            bucket_collectives(cap.gm)
        with stage("insert_deferred_runtime_asserts"):
            # make_fx leaves the ShapeEnv's facts (input ranges, torch._check)
            # unchecked; a graph trainer inserts them before it runs the graph.
            insert_deferred_runtime_asserts(
                cap.gm, cap.fake_mode.shape_env, "graph trainer step"
            )
            insert_input_range_asserts(cap.gm, cap.fake_mode.shape_env)
    rec["collectives_bucketed"] = count_collectives(cap.gm)
    if compiled:
        rec["compiled"] = _run_compiled(cap, mesh, rank, shapes)
        return rec

    captures = CAPTURES["make_fx"]
    for i, (B, S) in enumerate(shapes):
        # ranks see different data (data parallel), same shape
        batch = make_batch(B, S, seed=100 * i + rank)
        dynamo_before = dict(counters["stats"])
        with stage(f"run captured graph B={B} S={S}"):
            loss, grads = cap.run(*graph_state, batch)
        dynamo_after = dict(counters["stats"])
        with stage(f"eager step B={B} S={S}"):
            eloss, egrads = train_step(*eager_state, batch, attn, beyond_upstream)
        names = cap.names
        step = {
            "shape": [B, S],
            "loss": float(loss),
            "eager_loss": float(eloss),
            "loss_diff": abs(float(loss) - float(eloss)),
            "grad_diff": max(_max_diff(g, e) for g, e in zip(grads, egrads)),
            "param_diff": max(
                _max_diff(graph_state[0][n]._local_tensor, eager_state[0][n]._local_tensor)
                for n in names
            ),
            "momentum_diff": max(
                _max_diff(graph_state[1][n]._local_tensor, eager_state[1][n]._local_tensor)
                for n in names
            ),
            "dynamo_stats_changed": dynamo_before != dynamo_after,
        }
        rec["steps"].append(step)
    rec["retraced"] = CAPTURES["make_fx"] - captures
    # Sizes outside what the capture assumed (batch and sequence >= 1, and in the
    # upstream-compatible variant a sequence of at most one block) are refused
    # by the graph, not computed.
    rec["refused"] = {}
    for B, S in refused_shapes(beyond_upstream):
        try:
            cap.run(*graph_state, make_batch(B, S, seed=rank))
        except Exception as e:  # noqa: BLE001 - the record says which error it was
            rec["refused"][f"{B}x{S}"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        else:
            rec["refused"][f"{B}x{S}"] = None
    return rec


def _run_compiled(cap, mesh, rank, shapes):
    """The rewritten graph compiled once by Inductor, as a graph trainer compiles
    its step for the GPU, and run at every shape beside the graph itself, each on
    a state of its own: per shape, the largest difference of the loss, the
    gradients, the parameters and the momentum after the step."""
    from torch._guards import tracing, TracingContext
    from torch._inductor.compile_fx import compile_fx

    with stage("compile_fx (Inductor)"), tracing(TracingContext(cap.fake_mode)):
        fn = compile_fx(cap.gm, cap.fake_args)
    compiled_state, graph_state = sharded_state(mesh, seed=1), sharded_state(mesh, seed=1)
    diffs = {}
    for i, (B, S) in enumerate(shapes):
        batch = make_batch(B, S, seed=100 * i + rank)
        with stage(f"run compiled step B={B} S={S}"):
            loss, grads = cap.run(*compiled_state, batch, fn=fn)
        ref_loss, ref_grads = cap.run(*graph_state, batch)
        pairs = zip([loss, *grads, *cap.flat(*compiled_state)],
                    [ref_loss, *ref_grads, *cap.flat(*graph_state)], strict=True)
        diffs[f"{B}x{S}"] = max(_max_diff(a, b) for a, b in pairs)
    return diffs


def _triton_path():
    """Inductor's Triton (GPU) code path on CPU tensors, for this process: the
    helper of the Triton column (test/inductor/_triton_cpu.py)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "inductor", "_triton_cpu.py")
    spec = importlib.util.spec_from_file_location("symfix_triton_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.activate()


def insert_input_range_asserts(gm, shape_env):
    """Assert the ranges mark_unbacked gave the input sizes (min=1, max=MAX_SEQ).

    insert_deferred_runtime_asserts checks torch._check facts and the ranges
    of symbols the graph itself binds, not those of the inputs' sizes, which
    Dynamo would guard; in a make_fx capture nothing else refuses them.
    """
    import operator
    import sys

    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for dim, size in enumerate(val.shape):
            expr = size.node.expr if isinstance(size, torch.SymInt) else None
            if expr is None or not expr.is_Symbol:
                continue
            vr = shape_env.var_to_range[expr]
            checks = [(operator.ge, ">=", vr.lower)] if vr.lower > 0 else []
            if vr.upper.is_finite and vr.upper < sys.maxsize - 1:
                checks.append((operator.le, "<=", vr.upper))
            for op, sign, bound in checks:
                with gm.graph.inserting_before(first_op):
                    ok = gm.graph.call_function(
                        op, (gm.graph.create_size_node(node, dim), int(bound))
                    )
                    gm.graph.call_function(
                        torch.ops.aten._assert_scalar.default,
                        (ok, f"Runtime assertion failed for expression {expr} {sign} {bound}"),
                    )
    gm.recompile()


def refused_shapes(beyond_upstream):
    """Sizes the capture does not serve: batch and sequence below mark_unbacked's
    min=1; upstream-compatible, a sequence past the one-block mask. Beyond
    upstream a batch of 1 on 2 ranks runs (rank 1's batch shard is empty):
    sharding propagation's choice of a Shard(0) strategy over the unbacked
    batch is a policy, not a check on the batch (symfix's
    dtensor-shardable-unbacked-policy)."""
    return [(0, 5), (2, 0)] if beyond_upstream else [(0, 5), (2, 0), (1, MAX_SEQ + 1)]


def block_mask_record(gm):
    """Where the BlockMask tensors of the captured flex_attention come from:
    (producer op kind, shape) of each, and whether the dense mask was padded to
    whole blocks on unbacked sizes (aten.constant_pad_nd) inside the graph."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    flex = gm.graph.find_nodes(
        op="call_function", target=torch.ops.higher_order.flex_attention
    )
    if not flex:
        return None
    tensors = [
        a
        for a in flex[0].args[4]
        if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)
    ]
    pads = gm.graph.find_nodes(
        op="call_function", target=torch.ops.aten.constant_pad_nd.default
    )
    return {
        "tensors": [[a.op, str(list(a.meta["val"].shape))] for a in tensors],
        "unbacked_pads": sum(
            bool(free_unbacked_symbols(n.meta["val"].shape)) for n in pads
        ),
    }


def _worker(rank, world, out_dir, variants, shapes, hint, beyond_upstream=False,
            compiled=False):
    out = {
        "rank": rank,
        "torch": torch.__version__,
        "beyond_upstream": beyond_upstream,
        "variants": {},
    }
    try:
        torch.set_num_threads(1)
        if compiled == "triton":
            with stage("Triton path (test/inductor/_triton_cpu.py)"):
                _triton_path()
        with stage("init gloo process group"):
            init_gloo(rank, world, os.path.join(out_dir, "store"))
            mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (world,))
        for attn in variants:
            try:
                out["variants"][attn] = _run_variant(
                    mesh, attn, rank, shapes, hint, beyond_upstream, compiled
                )
            except StageError as e:
                out["variants"][attn] = {
                    "attn": attn,
                    "failed_stage": e.stage,
                    "error": f"{type(e.exc).__name__}: {str(e.exc)[:2000]}",
                    "traceback": traceback.format_exc()[-6000:],
                }
    except Exception as e:  # noqa: BLE001 - reported to the parent
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-6000:]
    finally:
        if dist.is_initialized():
            # gloo may abort at teardown if one rank leaves early
            dist.barrier()
            dist.destroy_process_group()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f, indent=1)


# What the server that forks the ranks imports once for every run: each rank is
# a process of its own, without the importing.
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "torch.distributed.tensor", __name__]


def run_workload(
    world=2, variants=("flex", "sdpa"), shapes=((1, 1),), hint=(4, 8), beyond_upstream=False,
    compiled=False,
):
    """``compiled``: the captured step compiled by Inductor (see _run_compiled)
    through its C++ path ("cpp") or its Triton path ("triton"); the Triton
    path's ranks are spawned afresh, since Triton's interpreter must be switched
    on before they import torch."""
    mp.set_forkserver_preload(FORKSERVER_PRELOAD)
    args = (world, tuple(variants), [tuple(s) for s in shapes], tuple(hint), beyond_upstream,
            compiled)
    if not compiled:
        return _start_ranks(args, "forkserver", {})
    if compiled == "cpp":
        with tempfile.TemporaryDirectory() as caches:
            return _start_ranks(args, "forkserver", {"TORCHINDUCTOR_CACHE_DIR": caches})
    # Triton's interpreter on CPU: a rank of the compiled run has died by SIGSEGV inside it now
    # and then (the 2.14.1 build, in the matrix beside the Triton column; not reproduced alone).
    # Each run gets Inductor and Triton caches of its own, and a rank killed by a signal runs
    # the whole step once more, saying so; a second death fails the test.
    for attempt in (1, 2):
        with tempfile.TemporaryDirectory() as caches:
            env = {"TRITON_INTERPRET": "1", "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor",
                   "TRITON_CACHE_DIR": f"{caches}/triton"}
            try:
                return _start_ranks(args, "spawn", env)
            except mp.ProcessExitedException as e:
                if attempt == 2 or e.signal_name is None:
                    raise
                print(f"graph trainer workload: {e}; running it once more", file=sys.stderr)


def _start_ranks(args, start_method, env):
    world = args[0]
    with mock.patch.dict(os.environ, env), tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(world, d, *args[1:]), nprocs=world, join=True,
                           start_method=start_method)
        results = []
        for r in range(world):
            with open(os.path.join(d, f"rank{r}.json")) as f:
                results.append(json.load(f))
    return results
