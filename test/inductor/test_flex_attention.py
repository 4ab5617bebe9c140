# Owner(s): ["module: flex attention"]
import contextlib
import os

import torch
import torch._dynamo.config
import torch.nn.functional as F
from torch._dynamo.decorators import mark_unbacked
from torch._dynamo.source import ConstantSource
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._higher_order_ops.flex_attention import flex_attention as flex_attention_hop
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    free_unbacked_symbols,
    ShapeEnv,
    StatelessSymbolicContext,
    statically_known_true,
)
from torch.nn.attention.flex_attention import (
    BlockMask,
    create_block_mask,
    create_mask,
    flex_attention,
)
from torch.testing._internal.common_utils import run_tests, TestCase

# where the tests make their tensors: CPU, or the GPU of tools/gpu_check.sh (test/conftest.py)
DEVICE = torch.get_default_device()


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
        from torch.fx.experimental.symbolic_shapes import (
            free_unbacked_symbols,
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

        gm = _trace_non_strict(outer, torch.tensor(5), torch.ones(8))

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
        return create_block_mask(self._causal, None, None, self.S, self.S, device=DEVICE)

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


def _trace_under_fake_mode(fn, *real_args):
    # How a graph trainer captures its step: make_fx under the trainer's own
    # FakeTensorMode (no Python dispatcher), with the lengths data-dependent.
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    args = [fake_mode.from_tensor(a) for a in real_args]
    with fake_mode:
        return make_fx(fn, tracing_mode="real")(*args)


def _trace_non_strict(fn, *real_args):
    # The same capture under non-strict tracing, with torch.compile'd regions
    # (the flex_attention HOP wrapper) compiled while tracing.
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    args = [fake_mode.from_tensor(a) for a in real_args]
    with (
        torch._dynamo.config.patch(force_compile_during_fx_trace=True),
        torch.compiler._non_strict_tracing_context(),
        fake_mode,
    ):
        return make_fx(fn, tracing_mode="real", _disable_torch_fn_metadata_mode=True)(
            *args
        )


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


# The modes of the differential checks (issue 24): one capture or compile per mode,
# replayed at several lengths, against eager.
_MODES = {
    "grad": contextlib.nullcontext,
    "autocast_bf16": lambda: torch.autocast(DEVICE.type, dtype=torch.bfloat16),
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}
# FlexAttention refuses inputs that require grad on CPU, in eager and when traced
# (_validate_device: "does not support backward on CPU"), stock too: there the grad
# mode runs with grad enabled and no input requiring it, and the refusal is checked.
_BACKWARD_ON_DEVICE = DEVICE.type != "cpu"


def _strides(t):
    # the strides eager defines: those of dims longer than 1 (Inductor's C++ flex
    # template gives a batch of 1 the stride 1, eager S*H*D)
    return [st for n, st in zip(t.shape, t.stride()) if n != 1]


def _assert_like_eager(test, got, ref, msg, fp32_tol=None):
    test.assertEqual(got.shape, ref.shape, msg=msg)
    test.assertEqual(_strides(got), _strides(ref), msg=msg)
    test.assertEqual(got.dtype, ref.dtype, msg=msg)
    test.assertEqual(got.requires_grad, ref.requires_grad, msg=msg)
    if ref.dtype in (torch.bfloat16, torch.float16):
        tol = {"atol": 3e-2, "rtol": 3e-2}
    else:
        tol = fp32_tol or {}
    test.assertEqual(got, ref, msg=msg, **tol)


class TestFlexAttentionBlockMaskInTracedStep(TestCase):
    """The BlockMask of a traced step built from the step's unbacked sequence
    length: padding the dense mask up to whole blocks (aten.constant_pad_nd)
    and the q-block transpose of the kv blocks (compute_q_blocks)."""

    BLOCK = 128

    @classmethod
    def _pad_to_blocks(cls, mask):
        def pad(n):
            return (n + cls.BLOCK - 1) // cls.BLOCK * cls.BLOCK - n

        return F.pad(mask, (0, pad(mask.shape[-1]), 0, pad(mask.shape[-2])))

    @staticmethod
    def _seq_len(t):
        seq = t.item()
        torch._check(seq >= 1)
        torch._check(seq <= 1024)
        return seq

    def _block_counts_step(self, t):
        # What create_block_mask does on the way to kv_num_blocks.
        seq = self._seq_len(t)
        mask = self._pad_to_blocks(create_mask(_causal, 1, 1, seq, seq, DEVICE))
        _, _, q, kv = mask.shape
        blocks = mask.view(1, 1, q // self.BLOCK, self.BLOCK, kv // self.BLOCK, self.BLOCK)
        return (blocks.sum(dim=[3, 5]) > 0).sum(-1)

    # Proof tests: stock 2.13.0 runs the C++ constant_pad_nd kernel on the
    # symbolic sizes (no Python dispatcher under a user fake mode).

    def test_pad_mask_to_blocks_with_unbacked_seq_len(self):
        def step(t):
            return self._block_counts_step(t)

        gm = _trace_under_fake_mode(step, torch.tensor(200))
        (pad_node,) = gm.graph.find_nodes(
            op="call_function", target=torch.ops.aten.constant_pad_nd.default
        )
        self.assertTrue(free_unbacked_symbols(pad_node.meta["val"].shape[-1]))
        # One graph for every length.
        for seq in (1, 128, 200, 300):
            t = torch.tensor(seq)
            self.assertEqual(gm(t), self._block_counts_step(t))

    def test_pad_with_unbacked_amount_of_static_tensor(self):
        def fn(t, x):
            return F.pad(x, (0, self._seq_len(t)), value=3.0)

        x = torch.randn(2, 5)
        gm = _trace_under_fake_mode(fn, torch.tensor(4), x)
        for n in (1, 4, 9):
            self.assertEqual(gm(torch.tensor(n), x), fn(torch.tensor(n), x))

    def test_pad_backed_sizes_does_not_specialize(self):
        shape_env = ShapeEnv()
        fake_mode = FakeTensorMode(shape_env=shape_env)
        x = fake_mode.from_tensor(
            torch.ones(200, 200),
            symbolic_context=StatelessSymbolicContext(
                dynamic_sizes=[DimDynamic.DYNAMIC] * 2
            ),
            source=ConstantSource("mask"),
        )
        s0, s1 = x.shape
        with fake_mode:
            out = self._pad_to_blocks(x)
        self.assertEqual(len(shape_env.guards), 0)
        self.assertTrue(statically_known_true(out.shape[-2] == (s0 + 127) // 128 * 128))
        self.assertTrue(statically_known_true(out.shape[-1] == (s1 + 127) // 128 * 128))

    # Guard tests: what a fake pad must keep.

    def test_pad_static_sizes_under_fake_mode(self):
        x = torch.randn(3, 4, 5)
        pads = ((1, 2), (0, 0, 2, 3), (-1, 2, 0, -2), (0, -5))
        expected = [F.pad(x, pad).shape for pad in pads]
        with FakeTensorMode() as fake_mode:
            fx = fake_mode.from_tensor(x)
            self.assertEqual([F.pad(fx, pad).shape for pad in pads], expected)

    def test_pad_negative_unbacked_size_is_runtime_error(self):
        def fn(t, x):
            return F.pad(x, (0, -self._seq_len(t)))

        x = torch.randn(2, 5)
        gm = _trace_under_fake_mode(fn, torch.tensor(4), x)
        self.assertEqual(gm(torch.tensor(3), x), x[:, :2])
        with self.assertRaises(RuntimeError):
            gm(torch.tensor(6), x)

    # BlockMask.from_kv_blocks(compute_q_blocks=True): the q-block transpose.

    @staticmethod
    def _ordered_from_dense(dense):
        # kv_num_blocks / kv_indices of a dense block mask [..., rows, cols].
        num = dense.sum(-1).to(torch.int32)
        idx = torch.argsort(dense.to(torch.int32), dim=-1, descending=True, stable=True)
        return num, idx.to(torch.int32)

    @staticmethod
    def _dense_from_ordered(num, idx, cols):
        dense = torch.zeros(*idx.shape[:-1], cols, dtype=torch.int32)
        for pos in torch.cartesian_prod(*[torch.arange(n) for n in idx.shape[:-1]]):
            pos = tuple(pos.tolist())
            dense[pos][idx[pos][: num[pos]].long()] = 1
        return dense

    def _q_blocks_step(self, t):
        # A triangular block mask with a data-dependent number of blocks.
        n = self._seq_len(t)
        kv_indices = torch.arange(n, dtype=torch.int32).expand(1, 1, n, n).contiguous()
        kv_num_blocks = torch.arange(1, n + 1, dtype=torch.int32).view(1, 1, n)
        bm = BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, compute_q_blocks=True)
        return bm.q_num_blocks, bm.q_indices

    # Proof tests: stock 2.13.0 and 2.14.1 fail in create_dense_one (vmap of an
    # advanced-index write) on the unbacked number of block rows.

    def test_q_blocks_from_unbacked_kv_blocks(self):
        def step(t):
            return self._q_blocks_step(t)

        gm = _trace_under_fake_mode(step, torch.tensor(5))
        for n in (1, 3, 8):
            t = torch.tensor(n)
            self.assertEqual(gm(t), step(t))

    def test_q_blocks_from_unbacked_kv_blocks_compiled(self):
        def fn(kv_num_blocks, kv_indices):
            bm = BlockMask.from_kv_blocks(
                kv_num_blocks, kv_indices, compute_q_blocks=True
            )
            return bm.q_num_blocks, bm.q_indices

        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(fn, backend=counter, fullgraph=True)
        for rows in (4, 6):
            dense = torch.rand(2, 3, rows, rows) < 0.5
            num, idx = self._ordered_from_dense(dense)
            num_c, idx_c = num.clone(), idx.clone()
            mark_unbacked(num_c, 2)
            mark_unbacked(idx_c, 2)
            mark_unbacked(idx_c, 3)
            self.assertEqual(compiled(num_c, idx_c), fn(num, idx))
        self.assertEqual(counter.frame_count, 1)

    def test_create_block_mask_and_attend_in_traced_step(self):
        # The trainer's step: the causal BlockMask is built inside the graph
        # from the unbacked sequence length and used by flex_attention.
        def step(t, x):
            seq = self._seq_len(t)
            q = x[:seq].view(1, 1, seq, 8)
            bm = create_block_mask(_causal, None, None, seq, seq, device=DEVICE)
            return flex_attention(q, q * 2, q + 1, block_mask=bm)

        x = torch.randn(1024, 8)
        gm = _trace_non_strict(step, torch.tensor(200), x)
        self.assertEqual(
            len(gm.graph.find_nodes(op="call_function", target=flex_attention_hop)), 1
        )
        for seq in (200, 129, 300):
            t = torch.tensor(seq)
            self.assertEqual(gm(t, x), step(t, x))

    def test_decoding_shapes_in_traced_step(self):
        # Decoding under graph-trainer capture: 1 to 16 new queries against an
        # unbacked KV length in the thousands, the query block aligned to the
        # end of the KV (a mask_mod closing over the SymInt KV - Q), with the
        # BlockMask built in the graph.  One graph for every (Q, KV).
        def step(tq, tkv, xq, xkv):
            q_len = tq.item()
            torch._check(q_len >= 1)
            torch._check(q_len <= xq.size(2))
            kv_len = tkv.item()
            torch._check(kv_len >= 1)
            torch._check(kv_len <= xkv.size(2))
            offset = kv_len - q_len

            def decode_causal(b, h, q_idx, kv_idx):
                return q_idx + offset >= kv_idx

            bm = create_block_mask(decode_causal, None, None, q_len, kv_len, device=DEVICE)
            k = xkv[:, :, :kv_len]
            return flex_attention(xq[:, :, :q_len], k, k * 2, block_mask=bm)

        xq, xkv = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 4096, 8)
        gm = _trace_non_strict(step, torch.tensor(4), torch.tensor(2000), xq, xkv)
        for q_len, kv_len in ((1, 1000), (7, 2048), (16, 3000), (16, 16)):
            real = (torch.tensor(q_len), torch.tensor(kv_len), xq, xkv)
            self.assertEqual(gm(*real), step(*real))

    # The differential check of 0010 (issue 24): the whole BlockMask of a traced step
    # and the attention with it, in every mode, replayed at 1 block (128, and 1 token),
    # lengths that are not a multiple of the block (200, 300) and far from the hint
    # (1000). Proof test: stock 2.13.0 and 2.15.0 fail the make_fx capture in the
    # in-graph pad (0008; 2.15.0's 0001), Dynamo in the q-block transpose
    # (Ne(((u0 + 127)//128), 0), this fix's bug).

    LENGTHS = (200, 128, 1, 300, 1000)

    @staticmethod
    def _mask_and_attend(x, w, seq):
        # the projection is a matmul, which bf16 autocast casts: the attention runs in bf16
        h = (x[:seq] @ w).view(1, seq, 2, 8).transpose(1, 2)
        bm = create_block_mask(_causal, None, None, seq, seq, device=DEVICE)
        out = flex_attention(h, h * 2, h + 1, block_mask=bm)
        return (
            out,
            bm.kv_num_blocks,
            bm.kv_indices,
            bm.full_kv_num_blocks,
            bm.full_kv_indices,
            bm.q_num_blocks,
            bm.q_indices,
            bm.full_q_num_blocks,
            bm.full_q_indices,
        )

    @classmethod
    def _step_from_item(cls, t, x, w):
        return cls._mask_and_attend(x, w, cls._seq_len(t))

    @classmethod
    def _step_from_input_length(cls, x, w):
        return cls._mask_and_attend(x, w, x.size(0))

    def _check_replays(self, name, run, step_args, eager, w):
        for seq in self.LENGTHS:
            args = step_args(seq)
            msg = f"{name} seq={seq}"
            with _MODES[name]():
                got, ref = run(*args, w), eager(*args, w)
            self.assertEqual(len(got), len(ref), msg=msg)
            for g, r in zip(got, ref):
                _assert_like_eager(self, g, r, msg)
            if ref[0].requires_grad:
                (grad,) = torch.autograd.grad(got[0].sum(), w)
                (ref_grad,) = torch.autograd.grad(ref[0].sum(), w)
                self.assertEqual(grad, ref_grad, msg=msg)

    def test_block_mask_modes_match_eager(self):
        def step(t, x, w):  # make_fx traces a plain function
            return self._step_from_item(t, x, w)

        x = torch.randn(1024, 16)
        for name in _MODES:
            with self.subTest(mode=name):
                w = (torch.randn(16, 16) / 4).requires_grad_(
                    name == "grad" and _BACKWARD_ON_DEVICE
                )
                if name == "grad" and not _BACKWARD_ON_DEVICE:
                    w_grad = w.detach().requires_grad_()
                    refused = "does not support backward on CPU"
                    with self.assertRaisesRegex(NotImplementedError, refused):
                        self._step_from_item(torch.tensor(200), x, w_grad)
                    with self.assertRaisesRegex(NotImplementedError, refused):
                        _trace_non_strict(step, torch.tensor(200), x, w_grad)
                # the graph trainer's capture: make_fx, the length from .item()
                with _MODES[name]():
                    gm = _trace_non_strict(step, torch.tensor(200), x, w)
                self._check_replays(
                    name, gm, lambda seq: (torch.tensor(seq), x), self._step_from_item, w
                )
                # torch.compile(backend="aot_eager"), the length an unbacked input size
                torch._dynamo.reset()
                counter = CompileCounterWithBackend("aot_eager")
                compiled = torch.compile(
                    self._step_from_input_length, backend=counter, fullgraph=True
                )

                def unbacked_tokens(seq):
                    tokens = x[:seq].clone()
                    mark_unbacked(tokens, 0)
                    return (tokens,)

                self._check_replays(
                    name, compiled, unbacked_tokens, self._step_from_input_length, w
                )
                self.assertEqual(counter.frame_count, 1)

    # Guard test: the transpose itself, with batch and head dims.

    def test_q_blocks_are_transposed_kv_blocks(self):
        torch.manual_seed(0)
        dense = torch.rand(2, 3, 5, 7) < 0.4
        num, idx = self._ordered_from_dense(dense)
        bm = BlockMask.from_kv_blocks(num, idx, compute_q_blocks=True)
        self.assertEqual(bm.q_num_blocks.shape, (2, 3, 7))
        self.assertEqual(
            self._dense_from_ordered(bm.q_num_blocks, bm.q_indices, 5),
            dense.transpose(-2, -1).to(torch.int32),
        )


class TestFlexAttentionCompiledCausalBlockMask(TestCase):
    """torch.compile of a step that builds its causal BlockMask from an unbacked
    sequence length and attends with it, on CPU: one compile serves lengths
    256, 200 and 384 (not multiples of each other, 200 not of the block size).
    Head dim 16: the least the Triton templates take (the `triton` column)."""

    LENGTHS = (256, 200, 384)

    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    @staticmethod
    def _attend(q, seq):
        bm = create_block_mask(_causal, None, None, seq, seq, device=DEVICE)
        return flex_attention(q, q * 2, q + 1, block_mask=bm)

    @classmethod
    def _step_from_input_length(cls, x):
        # x is [B, S, H, D] (a projection's layout); the length is x's dim 1.
        return cls._attend(x.transpose(1, 2), x.size(1))

    @classmethod
    def _step_from_item(cls, t, x):
        # The length is data: a graph trainer's unbacked sequence length.
        seq = t.item()
        torch._check(seq >= 1)
        torch._check(seq <= x.size(1))
        return cls._attend(x[:, :seq].transpose(1, 2), seq)

    def _run_from_input_length(self, backend):
        counter = CompileCounterWithBackend(backend)
        compiled = torch.compile(self._step_from_input_length, backend=counter, fullgraph=True)
        for seq in self.LENGTHS:
            x = torch.randn(1, seq, 2, 16)
            x_unbacked = x.clone()
            mark_unbacked(x_unbacked, 1)
            self.assertEqual(compiled(x_unbacked), self._step_from_input_length(x))
        self.assertEqual(counter.frame_count, 1)

    def _run_from_item(self, backend):
        counter = CompileCounterWithBackend(backend)
        compiled = torch.compile(self._step_from_item, backend=counter, fullgraph=True)
        x = torch.randn(1, 512, 2, 16)
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            for seq in self.LENGTHS:
                t = torch.tensor(seq)
                self.assertEqual(compiled(t, x), self._step_from_item(t, x))
        self.assertEqual(counter.frame_count, 1)

    # Proof tests.  Stock 2.13.0 and 2.15.0 fail the in-graph create_block_mask
    # (_ordered_to_dense, see TestFlexAttentionBlockMaskInTracedStep); then:

    def test_fill_order_of_unbacked_strides(self):
        # The FlexAttention fake rule orders its output like the query with
        # get_fill_order(query.stride()) and no ShapeEnv: stock 2.13.0 sorted
        # with Python comparisons and raised on 16*u0 < 8.
        from torch._inductor.ir import get_fill_order

        u0 = ShapeEnv().create_unbacked_symint()
        self.assertEqual(list(get_fill_order([16 * u0, 8, 16, 1])), [3, 1, 2, 0])
        self.assertEqual(list(get_fill_order([16, 8 * u0, 8, 1])), [3, 2, 0, 1])

    def test_length_from_input_size_aot_eager(self):
        # Patched 2.13.0 before 0020: data-dependent 16*u0 < 8 in get_fill_order.
        self._run_from_input_length("aot_eager")

    def test_length_from_input_size_inductor(self):
        # Patched 2.13.0 before 0021: lower_cpu's u0 <= 128*((u0 + 127)//128).
        self._run_from_input_length("inductor")

    def test_length_from_item_inductor(self):
        # Patched 2.13.0 before 0021: same_ordered has no hint for
        # ((u0 + 127)//128)**2, then lower_cpu's check as above.
        self._run_from_item("inductor")

    def test_length_from_item_aot_eager(self):
        self._run_from_item("aot_eager")

    def test_decode_with_unbacked_kv_length_inductor(self):
        # A few queries over a KV cache of unbacked length (flex decoding's
        # template on the Triton path), one compile for every length.
        def step(q, kv):
            return flex_attention(q, kv, kv * 2)

        counter = CompileCounterWithBackend("inductor")
        compiled = torch.compile(step, backend=counter, fullgraph=True)
        for kv_len in (200, 1000, 129, 16):
            q, kv = torch.randn(1, 2, 4, 16), torch.randn(1, 2, kv_len, 16)
            kv_unbacked = kv.clone()
            mark_unbacked(kv_unbacked, 2)
            self.assertEqual(compiled(q, kv_unbacked), step(q, kv))
        self.assertEqual(counter.frame_count, 1)

    # Guard tests: static sizes keep their behaviour.

    def test_fill_order_of_static_strides(self):
        from torch._inductor.ir import get_fill_order

        self.assertEqual(list(get_fill_order([32, 8, 8, 1])), [3, 2, 1, 0])
        self.assertEqual(list(get_fill_order([16, 8, 128, 1])), [3, 1, 0, 2])

    def test_inference_modes_inductor(self):
        # the C++ lowering is inference-only: one compile under each of no_grad
        # and inference_mode serves every length, values and requires_grad as
        # eager's (bf16 autocast is not listed: flex_attention has no autocast rule;
        # an input that requires grad is refused at compile time even under
        # no_grad, "FlexAttention does not support backward on CPU", stock too)
        for mode in (torch.no_grad, torch.inference_mode):
            with self.subTest(mode=mode.__name__):
                torch._dynamo.reset()
                counter = CompileCounterWithBackend("inductor")
                compiled = torch.compile(
                    self._step_from_input_length, backend=counter, fullgraph=True
                )
                for seq in self.LENGTHS:
                    x = torch.randn(1, seq, 2, 16)
                    x_unbacked = x.clone()
                    mark_unbacked(x_unbacked, 1)
                    with mode():
                        got = compiled(x_unbacked)
                        ref = self._step_from_input_length(x)
                    self.assertEqual(got.requires_grad, ref.requires_grad)
                    self.assertEqual(got.dtype, ref.dtype)
                    self.assertEqual(got, ref)
                self.assertEqual(counter.frame_count, 1)

    # The differential check of 0025 (issue 24), on the Triton path with
    # SYMFIX_INDUCTOR=triton (and on the C++ one without): one Inductor compile per
    # mode, replayed at 1 block (128, and 1 token), a length that is not a multiple
    # of the block (200, the hint) and one far from it (520). Proof test: stock
    # 2.13.0 and 2.15.0 fail the in-graph create_block_mask (0008, 0010).

    @classmethod
    def _projected_step(cls, x, w):
        # The projection is a matmul, which autocast casts: the attention runs in bf16.
        # Scaled, so that the query is a buffer of its own: the C++ template reads the
        # query's buffer as 4-d and fails on a view of the mm's 2-d output (a
        # LoweringException "expected 4, got 2", static shapes and stock 2.13.0 too).
        return cls._step_from_input_length((x @ w) * 0.5)

    def test_modes_match_eager_inductor(self):
        # Triton's interpreter computes tl.dot of bf16 operands wrongly (1e10 off a
        # plain 16x16 matmul, triton 3.7 and 3.9; fp16 is exact): under it the bf16
        # values are not compared, the fp16 autocast mode checks the low-precision
        # kernel's values instead. The online softmax of the Triton template sums in
        # another order than eager: fp32 to 1e-4.
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        modes = dict(_MODES, autocast_fp16=lambda: torch.autocast(DEVICE.type, dtype=torch.float16))
        for name, mode in modes.items():
            with self.subTest(mode=name):
                w = (torch.randn(16, 16) / 4).requires_grad_(
                    name == "grad" and _BACKWARD_ON_DEVICE
                )
                torch._dynamo.reset()
                counter = CompileCounterWithBackend("inductor")
                compiled = torch.compile(self._projected_step, backend=counter, fullgraph=True)
                if name == "grad" and not _BACKWARD_ON_DEVICE:
                    x = torch.randn(1, 200, 2, 16)
                    w_grad = w.detach().requires_grad_()
                    refused = "does not support backward on CPU"
                    with self.assertRaisesRegex(NotImplementedError, refused):
                        self._projected_step(x, w_grad)
                    # Dynamo reports it as Unsupported under fullgraph, with eager's message
                    with self.assertRaisesRegex(
                        (NotImplementedError, torch._dynamo.exc.Unsupported), refused
                    ):
                        compiled(x, w_grad)
                    torch._dynamo.reset()
                    counter.frame_count = 0
                for seq in (200, 128, 1, 520):
                    msg = f"{name} seq={seq}"
                    x = torch.randn(1, seq, 2, 16)
                    x_unbacked = x.clone()
                    mark_unbacked(x_unbacked, 1)
                    with mode():
                        got, ref = compiled(x_unbacked, w), self._projected_step(x, w)
                    if interpreted and ref.dtype == torch.bfloat16:
                        self.assertEqual(got.shape, ref.shape, msg=msg)
                        self.assertEqual(_strides(got), _strides(ref), msg=msg)
                        self.assertEqual(got.dtype, ref.dtype, msg=msg)
                        self.assertEqual(got.requires_grad, ref.requires_grad, msg=msg)
                    else:
                        _assert_like_eager(
                            self, got, ref, msg, fp32_tol={"atol": 1e-4, "rtol": 1e-4}
                        )
                    if ref.requires_grad:
                        (grad,) = torch.autograd.grad(got.sum(), w)
                        (ref_grad,) = torch.autograd.grad(ref.sum(), w)
                        self.assertEqual(grad, ref_grad, msg=msg, atol=1e-3, rtol=1e-3)
                self.assertEqual(counter.frame_count, 1, msg=name)

    def test_static_lengths_inductor(self):
        x = torch.randn(1, 200, 2, 16)
        compiled = torch.compile(self._step_from_input_length, backend="inductor", dynamic=False)
        self.assertEqual(compiled(x), self._step_from_input_length(x))

    def test_block_mask_too_small_is_runtime_error(self):
        # The lowering's "block mask covers the length" check on unbacked sizes
        # is a runtime assertion of the compiled code, not dropped.
        def fn(x, kv_num_blocks, kv_indices):
            seq = x.size(1)
            bm = BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, seq_lengths=(seq, seq))
            q = x.transpose(1, 2)
            return flex_attention(q, q * 2, q + 1, block_mask=bm)

        def inputs(seq, n):
            # All n kv blocks in every one of the n q block rows.
            x = torch.randn(1, seq, 2, 16)
            num = torch.full((1, 1, n), n, dtype=torch.int32)
            idx = torch.arange(n, dtype=torch.int32).expand(1, 1, n, n).contiguous()
            unbacked = [x.clone(), num.clone(), idx.clone()]
            mark_unbacked(unbacked[0], 1)
            mark_unbacked(unbacked[1], 2)
            mark_unbacked(unbacked[2], 2)
            mark_unbacked(unbacked[2], 3)
            return (x, num, idx), unbacked

        counter = CompileCounterWithBackend("inductor")
        compiled = torch.compile(fn, backend=counter, fullgraph=True)
        for seq, n in ((200, 2), (300, 3)):
            args, unbacked = inputs(seq, n)
            self.assertEqual(compiled(*unbacked), fn(*args))
        _, unbacked = inputs(300, 2)  # 2 blocks of 128 do not cover 300
        with self.assertRaisesRegex(RuntimeError, "Q seqlen must be smaller"):
            compiled(*unbacked)
        self.assertEqual(counter.frame_count, 1)


class TestFlexAttentionDecodeBlockMaskInTracedStep(TestCase):
    """Decoding shapes under graph-trainer capture: a few query tokens (1..16)
    attend to a KV cache whose length is unbacked and in the thousands, with
    the BlockMask built inside the step (create_block_mask pads the dense
    mask, then transposes the kv blocks into q blocks)."""

    MAX_Q = 16
    MAX_KV = 4096

    def _lengths(self, lens):
        q_len, kv_len = lens[0].item(), lens[1].item()
        torch._check(q_len >= 1)
        torch._check(q_len <= self.MAX_Q)
        torch._check(kv_len >= q_len)
        torch._check(kv_len <= self.MAX_KV)
        return q_len, kv_len

    def _block_mask(self, q_len, kv_len):
        # Query i sits at position kv_len - q_len + i of the sequence.
        offset = kv_len - q_len

        def decode_causal(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + offset

        return create_block_mask(decode_causal, None, None, q_len, kv_len, device=DEVICE)

    SHAPES = ((1, 1000), (16, 4096), (5, 2049), (1, 1), (16, 16))

    # Proof tests: stock 2.13.0 and 2.15.0 fail in the in-graph padding
    # (constant_pad_nd on unbacked sizes); under Dynamo also in the q-block
    # transpose of an unbacked number of kv blocks (Ne(u0, 0)).

    def test_decode_block_mask_built_in_traced_step(self):
        def step(lens):
            bm = self._block_mask(*self._lengths(lens))
            return bm.kv_num_blocks, bm.kv_indices, bm.q_num_blocks, bm.q_indices

        gm = _trace_non_strict(step, torch.tensor([4, 2000]))
        for q_len, kv_len in self.SHAPES:
            lens = torch.tensor([q_len, kv_len])
            num, idx, q_num, q_idx = gm(lens)
            ref = step(lens)
            self.assertEqual(num, ref[0])
            self.assertEqual(q_num, ref[2])
            # Only the first num entries of each row are meaningful.
            n = int(num.max())
            self.assertEqual(idx[..., :n], ref[1][..., :n])
            qn = int(q_num.max())
            self.assertEqual(q_idx[..., :qn], ref[3][..., :qn])

    def test_decode_q_blocks_from_unbacked_kv_blocks_compiled(self):
        # One q block row (Q <= 128) against an unbacked number of kv blocks
        # (KV of 1024..4096 tokens); the kv blocks per head differ.
        def fn(kv_num_blocks, kv_indices):
            bm = BlockMask.from_kv_blocks(kv_num_blocks, kv_indices)
            return bm.q_num_blocks, bm.q_indices

        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(fn, backend=counter, fullgraph=True)
        for cols in (8, 19, 32):
            num = torch.tensor([cols, cols // 2, 1], dtype=torch.int32).view(1, 3, 1)
            idx = torch.stack(
                [torch.randperm(cols, dtype=torch.int32) for _ in range(3)]
            ).view(1, 3, 1, cols)
            idx_c = idx.clone()
            mark_unbacked(idx_c, 3)
            q_num, q_idx = compiled(num, idx_c)
            ref_num, ref_idx = fn(num, idx)
            self.assertEqual(q_num, ref_num)
            self.assertEqual(q_num.shape, (1, 3, cols))
            self.assertEqual(q_idx, ref_idx)
        self.assertEqual(counter.frame_count, 1)

    def test_decode_attend_in_traced_step(self):
        def step(lens, q_src, kv_src):
            q_len, kv_len = self._lengths(lens)
            bm = self._block_mask(q_len, kv_len)
            q = q_src[:q_len].view(1, 1, q_len, 8)
            k = kv_src[:kv_len].view(1, 1, kv_len, 8)
            return flex_attention(q, k, k * 2, block_mask=bm)

        q_src = torch.randn(self.MAX_Q, 8)
        kv_src = torch.randn(self.MAX_KV, 8)
        gm = _trace_non_strict(step, torch.tensor([4, 2000]), q_src, kv_src)
        self.assertEqual(
            len(gm.graph.find_nodes(op="call_function", target=flex_attention_hop)), 1
        )
        for q_len, kv_len in self.SHAPES:
            lens = torch.tensor([q_len, kv_len])
            out = gm(lens, q_src, kv_src)
            self.assertEqual(out.shape, (1, 1, q_len, 8))
            self.assertEqual(out, step(lens, q_src, kv_src))
            # The last query sees the whole cache: plain attention over it.
            q = q_src[q_len - 1 : q_len].view(1, 1, 1, 8)
            k = kv_src[:kv_len].view(1, 1, kv_len, 8)
            self.assertEqual(
                out[:, :, -1:], F.scaled_dot_product_attention(q, k, k * 2)
            )


class TestFlexDecodingOffsetOfUnbackedLength(TestCase):
    """Decoding compiled by Inductor: the mask_mod and score_mod close over the query's offset
    in the sequence, L - Q with L (and Q) unbacked, a SymInt that is an expression, not a
    symbol. The C++ template took every such value that is not a symbol for a buffer
    ('Add' object has no attribute 'get_name'); the Triton templates took it already.
    Inference only: the C++ lowering has no backward."""

    @staticmethod
    def step(q, k, v):
        off = k.shape[2] - q.shape[2]
        bm = create_block_mask(
            lambda b, h, qi, kv: qi + off >= kv, None, None, q.shape[2], k.shape[2], device=DEVICE)
        return flex_attention(
            q, k, v, score_mod=lambda s, b, h, qi, kv: s + (qi + off - kv) * 0.01, block_mask=bm)

    def test_modes_match_eager(self):
        # the offset L - 1 (a static query), then L - Q (both unbacked)
        for unbacked_q, name in ((False, "no_grad"), (True, "inference_mode")):
            torch._dynamo.reset()
            compiled = torch.compile(self.step, fullgraph=True)
            shapes = ((1, 200), (1, 129), (1, 1)) if not unbacked_q else ((2, 7), (1, 129), (3, 300))
            for q_len, kv_len in shapes:
                msg = f"{name} Q={q_len} L={kv_len} unbacked Q: {unbacked_q}"
                q = torch.randn(2, 2, q_len, 16)
                k, v = torch.randn(2, 2, kv_len, 16), torch.randn(2, 2, kv_len, 16)
                for t, dims in ((q, (2,) if unbacked_q else ()), (k, (2,)), (v, (2,))):
                    for d in dims:
                        mark_unbacked(t, d)
                with _MODES[name]():
                    _assert_like_eager(self, compiled(q, k, v), self.step(q, k, v), msg)


class TestFlexAttentionQueryViewingA2DBuffer(TestCase):
    """A query that views a 2-D buffer, as a projection's output does
    (x @ w viewed as [B, S, H, D] and transposed): Inductor's C++ flex template
    read the sizes of the buffer under its views as [B, H, S, D] and failed to
    lower ("not enough values to unpack (expected 4, got 2)"), with static
    sizes too, on stock 2.13.0, 2.14.1 and 2.15.0."""

    H, D = 2, 16
    LENGTHS = (256, 200, 384)
    VIEWS = {
        "projection": lambda t, h, d: t.view(1, -1, h, d).transpose(1, 2),
        "heads_first": lambda t, h, d: t.view(1, h, -1, d),
    }

    def test_query_views_match_eager_inductor(self):
        # with static and unbacked lengths (one compile serves every unbacked
        # one) under each mode of the C++ lowering (inference-only): as eager
        for view_name, view in self.VIEWS.items():

            def step(q2, k, v, view=view):
                return flex_attention(view(q2, self.H, self.D), k, v)

            for unbacked in (False, True):
                for mode in (torch.no_grad, torch.inference_mode):
                    name = f"{view_name} unbacked={unbacked} {mode.__name__}"
                    with self.subTest(name):
                        torch._dynamo.reset()
                        counter = CompileCounterWithBackend("inductor")
                        compiled = torch.compile(step, backend=counter, fullgraph=True)
                        k = torch.randn(1, self.H, 128, self.D, device=DEVICE)
                        v = torch.randn(1, self.H, 128, self.D, device=DEVICE)
                        for seq in self.LENGTHS:
                            shape = {"projection": (seq, self.H * self.D),
                                     "heads_first": (self.H * seq, self.D)}[view_name]
                            q2 = torch.randn(shape, device=DEVICE)
                            q2_c = q2.clone()
                            if unbacked:
                                mark_unbacked(q2_c, 0)
                            with mode():
                                got, ref = compiled(q2_c, k, v), step(q2, k, v)
                            _assert_like_eager(self, got, ref, f"{name} {seq}",
                                               fp32_tol={"atol": 1e-4, "rtol": 1e-4})
                        if unbacked:  # static lengths recompile: one graph each
                            self.assertEqual(counter.frame_count, 1, msg=name)


if __name__ == "__main__":
    run_tests()
