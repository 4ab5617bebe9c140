# Owner(s): ["module: flex attention"]
import torch
import torch._dynamo.config
from torch._dynamo.utils import counters
from torch._higher_order_ops.flex_attention import flex_attention as flex_attention_hop
from torch.testing._internal.common_utils import run_tests, TestCase


class TestFlexAttentionOuterUnbackedSeqLen(TestCase):
    """FlexAttention inside a non-strict make_fx trace whose sequence length is
    an unbacked SymInt of the outer trace: the BlockMask carries that SymInt
    raw (seq_lengths), the q/k/v sizes carry it as a tensor dim, and the
    nested torch.compile of the HOP wrapper has to take both in as one
    symbol."""

    def setUp(self):
        super().setUp()
        torch._dynamo.reset()
        counters.clear()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    def test_block_mask_seq_lengths_from_outer_unbacked_symint(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.experimental.symbolic_shapes import (
            free_unbacked_symbols,
            ShapeEnv,
            statically_known_true,
        )
        from torch.nn.attention.flex_attention import BlockMask, flex_attention

        seen = []

        def outer(t, x):
            seq = t.item()  # unbacked in the outer ShapeEnv
            torch._check(seq >= 1)
            torch._check(seq <= 128)
            q = x.new_ones(1, 1, seq, 8)
            k = q + 1
            v = q + 2
            block_mask = BlockMask.from_kv_blocks(
                torch.ones(1, 1, 1, dtype=torch.int32),
                torch.zeros(1, 1, 1, 1, dtype=torch.int32),
                seq_lengths=(seq, seq),
            )
            a = flex_attention(q, k, v, block_mask=block_mask)
            b = flex_attention(q * 2, k, v, block_mask=block_mask)
            seen.append((seq, a.shape, b.shape))
            return a + b

        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        args = [fake_mode.from_tensor(a) for a in (torch.tensor(5), torch.ones(8))]
        with (
            torch._dynamo.config.patch(force_compile_during_fx_trace=True),
            torch.compiler._non_strict_tracing_context(),
            fake_mode,
        ):
            gm = make_fx(
                outer, tracing_mode="real", _disable_torch_fn_metadata_mode=True
            )(*args)

        ((seq, a_shape, b_shape),) = seen
        self.assertTrue(free_unbacked_symbols(seq))
        for shape in (a_shape, b_shape):
            self.assertEqual(len(shape), 4)
            self.assertTrue(statically_known_true(shape[2] == seq))
        # The HOP wrapper was compiled once and reused for the second call.
        self.assertEqual(counters["stats"]["unique_graphs"], 1)
        self.assertEqual(
            len(gm.graph.find_nodes(op="call_function", target=flex_attention_hop)),
            2,
        )


if __name__ == "__main__":
    run_tests()
