# Owner(s): ["oncall: distributed", "module: dynamic shapes"]
"""symfix acceptance test: one traced training step of a small MoE model
serves every batch shape.

A whole distributed training step (forward, backward, SGD-with-momentum step,
FSDP all-gathers and reduce-scatters as functional collectives) of a tiny MoE
decoder with DTensor Shard(0) parameters is captured ONCE with make_fx over
fake inputs whose batch and sequence sizes are unbacked, hinted SymInts
(mark_unbacked(..., hint_override=..., min=1)).  The graph is rewritten (the
token grid of the MoE router is split into two chunks of extents T // 2 and
T - T // 2, and the per-expert token counts are computed per chunk of the
routed slots, EP style, so that each count u_e becomes a derived expression
u_a + u_b; sizes from Graph.materialize_symints; FakeTensorProp again;
collective bucketing) and then run on 2 gloo ranks for 3 x 3 batch/sequence
shapes (1 and odd sizes included).  Loss, gradients and updated parameters are
compared with eager after every step, and nothing may be traced or compiled
again after the one capture.

The workload runs in two forms (M.run_workload(..., beyond_upstream=...)):

* TestGraphTrainerUnbacked, upstream-compatible: a constant one-block causal
  BlockMask (BlockMask.from_kv_blocks(..., seq_lengths=(S, S)), so S <= 128)
  and data-parallel output layers and loss.  Passes on 2.14.1 and on the
  patched build, fails on stock 2.13.0.
* TestGraphTrainerBeyondUpstream, through symfix's own fixes: inside the step,
  the causal FlexAttention BlockMask is built from the unbacked sequence length
  with the public create_block_mask (symfix 0008 + 0010), and the output layers
  and the loss run on sequence-sharded activations: a DTensor Shard(1) over the
  unbacked sequence dim, flattened to _StridedShard(0, split_factor=batch)
  tokens (the hint policy of is_tensor_shardable, symfix 0009).  No cap on the
  sequence (a sequence longer than one 128-block is run).  Passes on the
  patched build only.

Each layer of the stack runs inside ``stage(name)``; a failure names the first
layer that broke (on stock 2.13.0 that is the capture of the FlexAttention
backward: see the symfix report).  The raw-SymInt warning of FX is an error in
the rewrite passes.
"""

import os
import sys

import torch
from torch.testing._internal.common_utils import run_tests, TestCase

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _graph_trainer_model as M  # noqa: E402

WORLD = 2
HINT = (4, 8)  # hint_override for (batch, seq): policy only, never a run shape
BATCHES = (1, 2, 3)
# Upstream-compatible: the one-block BlockMask caps the sequence at M.MAX_SEQ.
SEQS = (1, 5, 16)
# Beyond upstream: each rank's sequence is one Shard(1) shard of a global W * S
# sequence, so the sequence-sharded loss needs no S divisible by WORLD: keep 1
# and odd sizes.  131 > 128: the in-graph BlockMask has two kv/q blocks there
# (one full, one partial), so there is no one-block cap.
SEQS_BEYOND_UPSTREAM = (1, 5, 131)
# Beyond upstream a batch of 1 leaves rank 1's Shard(0) batch shard empty; it runs, equal to eager.
BATCHES_BEYOND_UPSTREAM = BATCHES
VARIANTS = ("flex", "sdpa")
ATOL = RTOL = 1e-4


class _WorkloadRun:
    """One 2-rank spawned run (setUpClass) loops over both attention variants
    and all shapes; the tests check its record.  Mixed into a TestCase below."""

    BEYOND_UPSTREAM = False
    COMPILED = False
    VARIANTS = VARIANTS
    SHAPES = ()
    results = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.results = M.run_workload(
            WORLD, cls.VARIANTS, cls.SHAPES, HINT, beyond_upstream=cls.BEYOND_UPSTREAM,
            compiled=cls.COMPILED,
        )

    def _variant(self, attn):
        for res in self.results:
            self.assertNotIn("error", res, res.get("traceback"))
            rec = res["variants"][attn]
            if "failed_stage" in rec:
                self.fail(
                    f"rank {res['rank']} ({attn}, torch {res['torch']}, "
                    f"beyond_upstream={res['beyond_upstream']}): first failing "
                    f"layer: {rec['failed_stage']}\n{rec['error']}\n{rec['traceback']}"
                )
        return [res["variants"][attn] for res in self.results]


class _GraphTrainerRun(_WorkloadRun):
    """The captured step against eager, shape by shape."""

    def _check_one_graph_for_all_shapes(self, attn):
        for rec in self._variant(attn):
            self.assertEqual(rec["beyond_upstream"], self.BEYOND_UPSTREAM)
            # batch and sequence stayed unbacked SymInts through the capture
            self.assertEqual(rec["batch_dims_unbacked"], [True, True], rec["batch_shape"])
            self.assertEqual(rec["retraced"], 0)
            self.assertEqual(
                [s["shape"] for s in rec["steps"]], [list(s) for s in self.SHAPES]
            )
            for step in rec["steps"]:
                self.assertFalse(step["dynamo_stats_changed"], step)

    def _check_matches_eager(self, attn):
        for rec in self._variant(attn):
            for step in rec["steps"]:
                tol = ATOL + RTOL * abs(step["eager_loss"])
                self.assertLessEqual(step["loss_diff"], tol, step)
                for key in ("grad_diff", "param_diff", "momentum_diff"):
                    self.assertLessEqual(step[key], 1e-4, (key, step))

    def _check_violating_sizes_refused(self, attn):
        for rec in self._variant(attn):
            expected = [f"{b}x{s}" for b, s in M.refused_shapes(self.BEYOND_UPSTREAM)]
            self.assertEqual(sorted(rec["refused"]), sorted(expected))
            for shape, error in rec["refused"].items():
                self.assertIsNotNone(error, f"{attn} {shape} ran instead of being refused")
                self.assertIn("Runtime assertion failed", error, shape)

    def test_flex_one_capture_serves_all_shapes(self):
        self._check_one_graph_for_all_shapes("flex")

    def test_flex_violating_sizes_refused(self):
        self._check_violating_sizes_refused("flex")

    def test_sdpa_violating_sizes_refused(self):
        self._check_violating_sizes_refused("sdpa")

    def test_flex_step_matches_eager(self):
        self._check_matches_eager("flex")

    def test_sdpa_one_capture_serves_all_shapes(self):
        self._check_one_graph_for_all_shapes("sdpa")

    def test_sdpa_step_matches_eager(self):
        self._check_matches_eager("sdpa")


class TestGraphTrainerUnbacked(_GraphTrainerRun, TestCase):
    """Upstream-compatible workload: constant one-block BlockMask (S <= 128),
    data-parallel output layers and loss."""

    BEYOND_UPSTREAM = False
    SHAPES = [(b, s) for b in BATCHES for s in SEQS]
    assert max(SEQS) <= M.MAX_SEQ

    def _check_rewrites(self, attn):
        for rec in self._variant(attn):
            self.assertEqual(
                [e.replace(" ", "") for e in rec["chunk_extents"]],
                ["((u0*u1)//2)", "u0*u1-(((u0*u1)//2))"],
            )
            # L = B * S * TOPK routed slots, split in two
            self.assertEqual(rec["count_chunk_extents"], ["u0*u1", "u0*u1"])
            cap, bucketed = rec["collectives_captured"], rec["collectives_bucketed"]
            # one all-gather per parameter in forward, one reduce-scatter per
            # parameter gradient in backward
            self.assertEqual(cap, {"all_gather": 10, "reduce_scatter": 10})
            self.assertLess(bucketed["all_gather"], cap["all_gather"])
            self.assertLess(bucketed["reduce_scatter"], cap["reduce_scatter"])
            # data parallel output layers: no sequence-sharded DTensor
            self.assertEqual(rec["seq_sharding"], {})

    def test_flex_rewrites(self):
        self._check_rewrites("flex")
        for rec in self._variant("flex"):
            self.assertIn("flex_attention_backward", " ".join(rec["flex_nodes"]))

    def test_sdpa_rewrites(self):
        self._check_rewrites("sdpa")


class TestGraphTrainerBeyondUpstream(_GraphTrainerRun, TestCase):
    """The workload through symfix's own fixes: causal BlockMask built in the
    graph with create_block_mask from the unbacked sequence length (0008, 0010),
    output layers and loss on Shard(1) activations over the unbacked sequence
    (0009).  Fails on 2.14.1 by design."""

    BEYOND_UPSTREAM = True
    SHAPES = [(b, s) for b in BATCHES_BEYOND_UPSTREAM for s in SEQS_BEYOND_UPSTREAM]

    def test_block_mask_built_in_graph(self):
        for rec in self._variant("flex"):
            self.assertIn("flex_attention_backward", " ".join(rec["flex_nodes"]))
            # every block-mask tensor of flex_attention is computed in the
            # graph (no constant, no input), its block counts are ceil(S / 128)
            # of the unbacked sequence length, and the dense mask was padded to
            # whole blocks on unbacked sizes
            mask = rec["block_mask"]
            self.assertEqual(mask["unbacked_pads"], 1)
            self.assertEqual(len(mask["tensors"]), 8)
            u_seq = rec["batch_shape"][2]
            for op, shape in mask["tensors"]:
                self.assertEqual(op, "call_function")
                self.assertIn(f"(({u_seq} + 127)//128)", shape)

    def test_activations_sequence_sharded(self):
        # the output layers ran on Shard(1) activations whose flattened tokens
        # are _StridedShard(0) with the unbacked batch size as split factor
        for attn in VARIANTS:
            for rec in self._variant(attn):
                u_batch = rec["batch_shape"][1]
                self.assertEqual(
                    rec["seq_sharding"],
                    {
                        "activations": ["S(1)"],
                        "tokens": [f"_S(0, {u_batch})"],
                        "logits": [f"_S(0, {u_batch})"],
                    },
                    attn,
                )


class TestPublicFlexAttentionInCapture(TestCase):
    """Single process, no collectives: the public FlexAttention entry point
    (which compiles the flex_attention HOP wrapper with torch.compile) inside
    the graph-trainer capture context, forward only.  The training step cannot
    use it on CPU: see test_public_flex_attention_refuses_cpu_backward."""

    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    @staticmethod
    def _qkv(x):
        B, S = x.shape[1], x.shape[2]
        q = x[0].unsqueeze(1).expand(B, M.HEADS, S, M.HEAD_DIM)
        return q, q.sin(), q.cos()

    def _attend(self, x):
        from torch.nn.attention.flex_attention import flex_attention

        q, k, v = self._qkv(x)
        return flex_attention(q, k, v, block_mask=M.causal_block_mask(x.shape[2]))

    def test_public_flex_attention_forward_in_unbacked_capture(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, ShapeEnv

        example = torch.randn(1, 4, 8, M.HEAD_DIM)
        for dim, hint in ((1, 4), (2, 8)):
            torch._dynamo.decorators.mark_unbacked(example, dim, hint_override=hint, min=1)
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
        fake = M._fakeify(fake_mode, example, "x")
        with (
            torch._dynamo.config.patch(force_compile_during_fx_trace=True),
            fake_mode,
            torch.compiler._non_strict_tracing_context(),
        ):
            gm = make_fx(lambda x: [self._attend(x)])(fake)
        out = gm.graph.output_node().args[0][0].meta["val"]
        self.assertTrue(free_unbacked_symbols(out.shape[0]))
        self.assertTrue(free_unbacked_symbols(out.shape[2]))
        for B, S in ((1, 1), (3, 5), (2, 16)):
            x = torch.randn(1, B, S, M.HEAD_DIM)
            self.assertEqual(gm(x)[0], self._attend(x))
            # the HOP path the training step uses computes the same attention
            q, k, v = self._qkv(x)
            self.assertEqual(
                gm(x)[0], M.flex_attention_train(q, k, v, M.causal_block_mask(S))
            )

    def test_public_flex_attention_refuses_cpu_backward(self):
        # Why the captured training step reaches FlexAttention through the HOP
        # (M.flex_attention_train) and not the public function: as of 2.13.0
        # and 2.14.1 the public API rejects q/k/v that require grad on CPU.
        x = torch.randn(1, 2, 16, M.HEAD_DIM)
        q, k, v = (t.detach().requires_grad_() for t in self._qkv(x))
        from torch.nn.attention.flex_attention import flex_attention

        with self.assertRaisesRegex(NotImplementedError, "backward on CPU"):
            flex_attention(q, k, v, block_mask=M.causal_block_mask(16))
        out = M.flex_attention_train(q, k, v, M.causal_block_mask(16))
        out.sum().backward()  # the HOP's math path has a backward on CPU
        self.assertEqual(q.grad.shape, q.shape)


class _CompiledRun(_WorkloadRun):
    """The beyond-upstream step as a graph trainer runs it: the rewritten capture
    (EP count chunking included) compiled once by Inductor, then run at shapes
    far from the hint beside the captured graph itself: batches 1..3, sequences
    1, odd and past one 128-block."""

    BEYOND_UPSTREAM = True
    SHAPES = [(1, 131), (2, 1), (3, 5)]

    def _check_compiled_matches_graph(self, attn):
        for rec in self._variant(attn):
            self.assertEqual(rec["count_chunk_extents"], ["u0*u1", "u0*u1"])
            self.assertEqual(sorted(rec["compiled"]), sorted(f"{b}x{s}" for b, s in self.SHAPES))
            for shape, diff in rec["compiled"].items():
                self.assertLessEqual(diff, 1e-4, (attn, shape))


class TestGraphTrainerCompiledTritonPath(_CompiledRun, TestCase):
    """Through Inductor's Triton code path (kernels and the flex templates, run by
    Triton's interpreter on CPU tensors: test/inductor/_triton_cpu.py); small
    shapes, since the interpreter runs every kernel in numpy."""

    COMPILED = "triton"

    def test_flex_compiled_step_matches_graph(self):
        self._check_compiled_matches_graph("flex")

    def test_sdpa_compiled_step_matches_graph(self):
        self._check_compiled_matches_graph("sdpa")


class TestGraphTrainerCompiledCppPath(_CompiledRun, TestCase):
    """Through Inductor's C++ backend: the causal SDPA variant (its flex lowering
    is inference-only, so the flex variant has no C++ training step)."""

    COMPILED = "cpp"
    VARIANTS = ("sdpa",)

    def test_sdpa_compiled_step_matches_graph(self):
        self._check_compiled_matches_graph("sdpa")


if __name__ == "__main__":
    run_tests()
