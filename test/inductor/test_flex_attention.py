# Owner(s): ["module: flex attention"]
import torch
import torch._dynamo.config
from torch._dynamo.decorators import mark_unbacked
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._higher_order_ops.flex_attention import flex_attention as flex_attention_hop
from torch.nn.attention.flex_attention import (
    BlockMask,
    create_block_mask,
    flex_attention,
)
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


class TestFlexAttentionUnbackedLengths(TestCase):
    """BlockMask/query length checks and the backward fake rule with unbacked
    (data-dependent) batch and sequence lengths, compiled with aot_eager on CPU."""

    S = 256

    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    @staticmethod
    def _causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def _block_mask(self):
        return create_block_mask(self._causal, None, None, self.S, self.S, device="cpu")

    @staticmethod
    def _compile(fn):
        return torch.compile(fn, backend="aot_eager", fullgraph=True)

    @staticmethod
    def _qkv(seq_len, batch=2):
        # One tensor for q/k/v, so that marking one of its dims unbacked gives
        # q, k and v the same unbacked size.
        return torch.randn(3, batch, 2, seq_len, 16)

    def _mask_with_lengths(self, bm, n):
        # Same blocks as ``bm``, but the BlockMask lengths are the SymInt ``n``.
        return BlockMask(
            (n, n),
            bm.kv_num_blocks,
            bm.kv_indices,
            bm.full_kv_num_blocks,
            bm.full_kv_indices,
            bm.q_num_blocks,
            bm.q_indices,
            bm.full_q_num_blocks,
            bm.full_q_indices,
            bm.BLOCK_SIZE,
            bm.mask_mod,
        )

    def _lengths_from_tensor_fn(self):
        bm = self._block_mask()

        def fn(qkv, positions):
            q, k, v = qkv.unbind(0)
            block_mask = self._mask_with_lengths(bm, positions.size(0))
            return flex_attention(q, k, v, block_mask=block_mask)

        return fn

    @staticmethod
    def _unbacked_inputs(qkv, positions):
        qkv, positions = qkv.clone(), positions.clone()
        mark_unbacked(qkv, 3, min=2)
        mark_unbacked(positions, 0, min=2)
        return qkv, positions

    def _expected_length_error(self):
        # 2.13.x raises ValueError for a BlockMask/sequence length mismatch; a
        # patch release keeps that.  2.14 changed it to RuntimeError.
        return ValueError if torch.__version__ < "2.14" else RuntimeError

    # Proof tests: stock 2.13.0 raises a data-dependent error while tracing.

    def test_concrete_block_mask_with_unbacked_seq_len(self):
        bm = self._block_mask()

        def fn(qkv):
            q, k, v = qkv.unbind(0)
            return flex_attention(q, k, v, block_mask=bm)

        qkv = self._qkv(self.S)
        compiled_in = qkv.clone()
        mark_unbacked(compiled_in, 3)
        self.assertEqual(self._compile(fn)(compiled_in), fn(qkv))

    def test_block_mask_lengths_from_other_unbacked_tensor(self):
        fn = self._lengths_from_tensor_fn()
        qkv, positions = self._qkv(self.S), torch.arange(self.S)
        out = self._compile(fn)(*self._unbacked_inputs(qkv, positions))
        self.assertEqual(out, fn(qkv, positions))

    def test_unbacked_length_mismatch_is_runtime_assert(self):
        fn = self._lengths_from_tensor_fn()
        compiled = self._compile(fn)
        qkv, positions = self._qkv(self.S), torch.arange(self.S)
        self.assertEqual(compiled(*self._unbacked_inputs(qkv, positions)), fn(qkv, positions))
        # Same graph (unbacked lengths do not guard), lengths that do not match.
        short = self._qkv(self.S - 56)
        with self.assertRaisesRegex(RuntimeError, "Runtime assertion failed"):
            compiled(short, positions)
        with self.assertRaises(self._expected_length_error()):
            fn(short, positions)

    def test_backward_with_unbacked_batch(self):
        # FlexAttention refuses q/k/v that require grad on CPU; a captured
        # score_mod buffer that requires grad still traces the backward rule.
        def fn(qkv, bias):
            q, k, v = qkv.unbind(0)

            def score_mod(score, b, h, q_idx, kv_idx):
                return score + bias[h]

            return flex_attention(q, k, v, score_mod=score_mod)

        qkv = self._qkv(128, batch=4)
        bias = torch.randn(2, requires_grad=True)
        compiled_qkv = qkv.clone()
        mark_unbacked(compiled_qkv, 1)
        compiled_bias = bias.detach().clone().requires_grad_()

        out = self._compile(fn)(compiled_qkv, compiled_bias)
        expected = fn(qkv, bias)
        self.assertEqual(out, expected)
        out.sum().backward()
        expected.sum().backward()
        self.assertEqual(compiled_bias.grad, bias.grad)

    # Guard tests: behaviour the fix must keep.

    def test_concrete_length_mismatch_keeps_exception_type(self):
        bm = self._block_mask()

        def fn(qkv):
            q, k, v = qkv.unbind(0)
            return flex_attention(q, k, v, block_mask=bm)

        compiled = torch.compile(fn, backend="aot_eager")
        error = self._expected_length_error()
        for seq_len, msg in ((self.S // 2, "larger length"), (2 * self.S, "smaller length")):
            qkv = self._qkv(seq_len)
            with self.assertRaisesRegex(error, msg):
                fn(qkv)
            torch._dynamo.reset()
            with self.assertRaisesRegex(error, msg):
                compiled(qkv)

    def test_unbacked_length_mismatch_never_returns(self):
        fn = self._lengths_from_tensor_fn()
        qkv, positions = self._unbacked_inputs(self._qkv(self.S - 56), torch.arange(self.S))
        with self.assertRaises(RuntimeError):
            self._compile(fn)(qkv, positions)

    def test_backed_dynamic_lengths_unchanged(self):
        fn = self._lengths_from_tensor_fn()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(fn, backend=counter)
        for seq_len in (self.S, self.S - 56, self.S - 100):
            qkv, positions = self._qkv(seq_len), torch.arange(seq_len)
            torch._dynamo.mark_dynamic(qkv, 3)
            torch._dynamo.mark_dynamic(positions, 0)
            self.assertEqual(compiled(qkv, positions), fn(qkv, positions))
        # Backed lengths equal to the BlockMask lengths: one graph for all of them.
        self.assertEqual(counter.frame_count, 1)
        with self.assertRaisesRegex(self._expected_length_error(), "larger length"):
            compiled(self._qkv(self.S - 56), torch.arange(self.S))


if __name__ == "__main__":
    run_tests()
