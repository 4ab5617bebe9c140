# Owner(s): ["module: fakeTensor"]
"""symfix regression tests for FakeTensor/ATen meta fixes that 2.13.0 already ships.

Folded matmul (pytorch/pytorch#183397) and broadcasted bmm / math SDPA /
aten.size.default redirect (pytorch/pytorch#183398).  Each class pairs proof tests
(they fail under test/controls/<fix>.py, which takes the fix out again) with guard
tests (behaviour that holds with or without the fix).
"""

import contextlib

import sympy
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import free_symbols, ShapeEnv
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.utils._sympy.functions import FloorDiv


def _exprs(shape):
    """Sizes as sympy expressions, compared structurally (never guards)."""
    return tuple(
        s.node.expr if isinstance(s, torch.SymInt) else sympy.Integer(s)
        for s in shape
    )


def _math_sdpa(q, k, v):
    with sdpa_kernel(SDPBackend.MATH):
        return (F.scaled_dot_product_attention(q, k, v),)


def _size_then_view(x):
    sizes = torch.ops.aten.size.default(x)
    return (x.view(sizes[0] * sizes[1], sizes[2]),)


class _UnbackedTraceMixin:
    """Trace like the graph trainer: make_fx(tracing_mode="real") over fake inputs
    whose sizes carry an unbacked symbol u0, optionally under the Python dispatcher."""

    def trace(self, fn, shapes, *, python_dispatcher=False, hint=None):
        shape_env = ShapeEnv()
        fake_mode = FakeTensorMode(shape_env=shape_env)
        with fake_mode:
            u0 = shape_env.create_unbacked_symint()
            if hint is not None:
                shape_env.var_to_hint_override[u0.node.expr] = hint
            torch._check(u0 >= 2)
            inputs = [torch.randn(*make_shape(u0)) for make_shape in shapes]
        ctx = enable_python_dispatcher() if python_dispatcher else contextlib.nullcontext()
        with ctx:
            gm = make_fx(fn, tracing_mode="real")(*inputs)
        self.shape_env = shape_env
        self.u0 = u0.node.expr
        return gm

    def outputs(self, gm):
        (out,) = gm.graph.find_nodes(op="output")
        return [arg.meta["val"] for arg in out.args[0]]

    def targets(self, gm):
        return [n.target for n in gm.graph.nodes if n.op == "call_function"]

    def assert_no_guard_on_u0(self):
        self.assertEqual(self.shape_env.guards, [])
        # u0 was never specialized to a number either
        self.assertNotIn(self.u0, self.shape_env.replacements)

    def assert_output_shape(self, gm, *expected):
        vals = self.outputs(gm)
        self.assertEqual(len(vals), len(expected))
        for val, shape in zip(vals, expected):
            self.assertEqual(_exprs(val.shape), tuple(sympy.sympify(s) for s in shape))


class TestFoldedMatmulUnbacked(_UnbackedTraceMixin, TestCase):
    """ND @ 1D / ND @ 2D with an unbacked batch (pytorch/pytorch#183397)."""

    # ---- proof: plain FakeTensorMode, no Python dispatcher (C++ _matmul_impl fold)

    def _check_folded(self, gm, *expected):
        self.assert_output_shape(gm, *expected)
        targets = self.targets(gm)
        self.assertIn(torch.ops.aten._unsafe_view.default, targets)
        self.assertNotIn(torch.ops.aten.bmm.default, targets)
        self.assert_no_guard_on_u0()

    def test_rank3_at_2d_no_python_dispatcher(self):
        gm = self.trace(lambda x, w: (x @ w,), [lambda u: (u, 5, 32), lambda u: (32, 64)])
        self._check_folded(gm, (self.u0, 5, 64))
        self.assertIn(torch.ops.aten.mm.default, self.targets(gm))

    def test_rank4_at_2d_no_python_dispatcher(self):
        gm = self.trace(
            lambda x, w: (x @ w,), [lambda u: (u, 3, 5, 16), lambda u: (16, 8)]
        )
        self._check_folded(gm, (self.u0, 3, 5, 8))
        self.assertIn(torch.ops.aten.mm.default, self.targets(gm))

    def test_rank3_at_1d_no_python_dispatcher(self):
        gm = self.trace(lambda x, v: (x @ v,), [lambda u: (u, 5, 32), lambda u: (32,)])
        self._check_folded(gm, (self.u0, 5))
        self.assertIn(torch.ops.aten.mv.default, self.targets(gm))

    def test_rank4_at_1d_no_python_dispatcher(self):
        gm = self.trace(
            lambda x, v: (x @ v,), [lambda u: (2, u, 5, 16), lambda u: (16,)]
        )
        self._check_folded(gm, (2, self.u0, 5))
        self.assertIn(torch.ops.aten.mv.default, self.targets(gm))

    def test_linear_rank3_no_bias_no_python_dispatcher(self):
        gm = self.trace(
            lambda x, w: (F.linear(x, w),), [lambda u: (u, 5, 32), lambda u: (64, 32)]
        )
        self._check_folded(gm, (self.u0, 5, 64))

    def test_chunked_view_hinted_contiguity(self):
        # Token grid [4, u0] chunked to an even length 2 * (u0 // 2): the row stride
        # is still u0, so flattening needs u0 == 2 * (u0 // 2).  That holds at the
        # hint (16) and must be recorded as a runtime check, not forced into a guard
        # or a specialization.
        def chunk_and_flatten(x):
            n = x.shape[1] // 2
            return (x.narrow(1, 0, 2 * n).view(-1),)

        gm = self.trace(chunk_and_flatten, [lambda u: (4, u)], hint=16)
        half = FloorDiv(self.u0, 2)
        self.assert_output_shape(gm, (8 * half,))
        self.assert_no_guard_on_u0()
        (val,) = self.outputs(gm)
        self.assertEqual(free_symbols(val.numel()), {self.u0})
        asserts = [str(ra.expr) for ra in self.shape_env.deferred_runtime_asserts.get(self.u0, [])]
        self.assertTrue(any("Eq(" in a and "u0//2" in a for a in asserts), asserts)

    # ---- guards: Python dispatcher path (Python decomposition), static shapes

    def test_rank3_and_rank4_at_2d_python_dispatcher(self):
        gm = self.trace(
            lambda x, y, w: (x @ w, y @ w),
            [lambda u: (u, 5, 16), lambda u: (u, 3, 5, 16), lambda u: (16, 8)],
            python_dispatcher=True,
        )
        self.assert_output_shape(gm, (self.u0, 5, 8), (self.u0, 3, 5, 8))
        self.assertIn(torch.ops.aten.mm.default, self.targets(gm))
        self.assert_no_guard_on_u0()

    def test_rank3_and_rank4_at_1d_python_dispatcher(self):
        gm = self.trace(
            lambda x, y, v: (x @ v, y @ v),
            [lambda u: (u, 5, 16), lambda u: (u, 3, 5, 16), lambda u: (16,)],
            python_dispatcher=True,
        )
        self.assert_output_shape(gm, (self.u0, 5), (self.u0, 3, 5))
        self.assert_no_guard_on_u0()

    def test_chunked_view_contiguous_rows(self):
        # [u0, 8] rows chunked to (2, u0 // 2, 8): contiguous, no hint needed.
        def chunk(x):
            n = x.shape[0] // 2
            y = x.narrow(0, 0, 2 * n).view(2, n, 8)
            return (y, y.view(2 * n, 8))

        gm = self.trace(chunk, [lambda u: (u, 8)])
        half = FloorDiv(self.u0, 2)
        self.assert_output_shape(gm, (2, half, 8), (2 * half, 8))
        self.assert_no_guard_on_u0()

    def test_static_fold_unchanged(self):
        with FakeTensorMode():
            x, w = torch.randn(4, 5, 32), torch.randn(32, 64)
            gm = make_fx(lambda x, w: (x @ w,), tracing_mode="real")(x, w)
        (val,) = self.outputs(gm)
        self.assertEqual(tuple(val.shape), (4, 5, 64))
        self.assertIn(torch.ops.aten.mm.default, self.targets(gm))


class TestBmmSdpaUnbackedBatch(_UnbackedTraceMixin, TestCase):
    """Broadcasted bmm / math SDPA with an unbacked batch and the aten.size.default
    -> aten.sym_size.default redirect (pytorch/pytorch#183398)."""

    def _check_bmm(self, gm, *expected):
        self.assert_output_shape(gm, *expected)
        self.assertIn(torch.ops.aten.bmm.default, self.targets(gm))
        self.assert_no_guard_on_u0()

    # ---- proof: C++ broadcasted-bmm branch, no Python dispatcher

    def test_rank4_broadcast_bmm_no_python_dispatcher(self):
        gm = self.trace(
            lambda x, w: (x @ w,), [lambda u: (u, 2, 5, 8), lambda u: (2, 8, 5)]
        )
        self._check_bmm(gm, (self.u0, 2, 5, 5))

    def test_rank3_batched_bmm_no_python_dispatcher(self):
        gm = self.trace(
            lambda x, y: (x @ y,), [lambda u: (u, 5, 8), lambda u: (u, 8, 3)]
        )
        self._check_bmm(gm, (self.u0, 5, 3))

    def test_math_sdpa_unbacked_batch_no_python_dispatcher(self):
        gm = self.trace(_math_sdpa, [lambda u: (u, 2, 5, 8)] * 3)
        self._check_bmm(gm, (self.u0, 2, 5, 8))

    def test_math_sdpa_unbacked_heads_no_python_dispatcher(self):
        gm = self.trace(_math_sdpa, [lambda u: (2, u, 5, 8)] * 3)
        self._check_bmm(gm, (2, self.u0, 5, 8))

    # ---- proof: aten.size.default redirect during torch-function metadata tracing

    def test_size_default_redirected_to_sym_size(self):
        gm = self.trace(_size_then_view, [lambda u: (u, 5, 8)])
        self.assert_output_shape(gm, (5 * self.u0, 8))
        self.assertIn(torch.ops.aten.sym_size.int, self.targets(gm))
        self.assertNotIn(torch.ops.aten.size.default, self.targets(gm))
        self.assert_no_guard_on_u0()

    def test_size_default_redirected_python_dispatcher(self):
        gm = self.trace(
            _size_then_view, [lambda u: (u, 5, 8)], python_dispatcher=True, hint=8
        )
        self.assert_output_shape(gm, (5 * self.u0, 8))
        self.assert_no_guard_on_u0()

    # ---- guards

    def test_rank4_broadcast_bmm_python_dispatcher(self):
        gm = self.trace(
            lambda x, w: (x @ w,),
            [lambda u: (u, 2, 5, 8), lambda u: (2, 8, 5)],
            python_dispatcher=True,
        )
        self._check_bmm(gm, (self.u0, 2, 5, 5))

    def test_math_sdpa_unbacked_batch_python_dispatcher(self):
        gm = self.trace(_math_sdpa, [lambda u: (u, 2, 5, 8)] * 3, python_dispatcher=True)
        self._check_bmm(gm, (self.u0, 2, 5, 8))

    def test_size_default_static_sizes_stay_ints(self):
        def fn(x):
            sizes = torch.ops.aten.size.default(x)
            self.assertEqual(list(sizes), [3, 5, 8])
            return (x.view(sizes[0] * sizes[1], sizes[2]),)

        with FakeTensorMode():
            gm = make_fx(fn, tracing_mode="real")(torch.randn(3, 5, 8))
        (val,) = self.outputs(gm)
        self.assertEqual(tuple(val.shape), (15, 8))
        self.assertNotIn(torch.ops.aten.sym_size.int, self.targets(gm))


class TestFakeConstantPadNdModes(TestCase):
    """F.pad (aten.constant_pad_nd) over an unbacked size on the plain
    FakeTensorMode path (a graph trainer's make_fx under its own fake mode,
    no Python dispatcher) runs the Python meta (symfix 0008). Its output
    must require grad exactly where eager's does: not under no_grad or
    inference_mode, whatever the input requires."""

    MODES = {
        "grad": (contextlib.nullcontext, True),
        "no_grad": (torch.no_grad, False),
        "inference_mode": (torch.inference_mode, False),
    }

    def _fake_unbacked(self, cols=4):
        shape_env = ShapeEnv()
        fake_mode = FakeTensorMode(shape_env=shape_env)
        with fake_mode:
            x = torch.empty(shape_env.create_unbacked_symint(), cols, requires_grad=True)
        return fake_mode, x

    def test_requires_grad_as_eager_in_every_mode(self):
        fake_mode, x = self._fake_unbacked()
        for name, (mode, want) in self.MODES.items():
            with self.subTest(mode=name):
                with mode():
                    eager = F.pad(torch.randn(3, 4, requires_grad=True), (1, 2))
                with fake_mode, mode():
                    out = F.pad(x, (1, 2))
                self.assertEqual(eager.requires_grad, want)
                self.assertEqual(out.requires_grad, want)
                self.assertEqual(out.shape[1], 7)

    def test_no_grad_pad_then_in_place(self):
        # eager accepts an in-place op on a no_grad pad of a leaf that
        # requires grad; an output marked as requiring grad raised "a leaf
        # Variable that requires grad is being used in an in-place operation"
        fake_mode, x = self._fake_unbacked()
        with fake_mode:
            with torch.no_grad():
                y = F.pad(x, (1, 1))
            y.add_(1)
        self.assertFalse(y.requires_grad)

    def test_captured_step_branching_on_requires_grad(self):
        # the step's branch is taken at trace time: the graph must take
        # eager's, then compute eager's values at every size, 0 and 1 included
        def step(x):
            with torch.no_grad():
                y = F.pad(x, (1, 1), value=0.5)
            return y * 3 if y.requires_grad else y - 1

        fake_mode, x = self._fake_unbacked()
        with fake_mode:
            gm = make_fx(step)(x)
        for rows in (0, 1, 3, 17):
            real = torch.randn(rows, 4, requires_grad=True)
            self.assertEqual(gm(real), step(real))


class TestFakeConvUnbackedLayout(TestCase):
    """A CPU convolution over an unbacked batch, on fake tensors: its output's strides must be
    those the CPU kernel returns at every non-empty batch. Without hints the fake kernel cannot
    ask _select_conv_backend and reported contiguous strides, where the kernel returns
    channels-last for a channels-last input or weight (what Inductor then trusted)."""

    KINDS = {  # weight shape from (C, O); the call
        "conv2d": (lambda c, o: (o, c, 3, 3), lambda x, w: F.conv2d(x, w, padding=1)),
        "conv2d_1x1": (lambda c, o: (o, c, 1, 1), lambda x, w: F.conv2d(x, w)),
        "dilated": (lambda c, o: (o, c, 3, 3), lambda x, w: F.conv2d(x, w, dilation=2, padding=2)),
        "transposed": (lambda c, o: (c, o, 2, 2), lambda x, w: F.conv_transpose2d(x, w, stride=2)),
        "conv1d": (lambda c, o: (o, c, 3), lambda x, w: F.conv1d(x, w)),
    }

    @given(
        kind=st.sampled_from(sorted(KINDS)),
        channels=st.sampled_from([1, 2, 5]),
        spatial=st.tuples(st.sampled_from([1, 3, 6]), st.sampled_from([1, 4, 7])),
        input_channels_last=st.booleans(),
        weight_channels_last=st.booleans(),
    )
    @settings(max_examples=60, deadline=None)
    def test_strides_of_the_cpu_kernel(
        self, kind, channels, spatial, input_channels_last, weight_channels_last
    ):
        weight_shape, call = self.KINDS[kind]
        one_d = kind == "conv1d"

        def layout(t, channels_last):
            return t.contiguous(memory_format=torch.channels_last) if channels_last and \
                t.dim() == 4 else t

        w = layout(torch.randn(weight_shape(channels, 3)), weight_channels_last)
        rest = (channels, sum(spatial) + 1) if one_d else (channels, *spatial)
        shape_env = ShapeEnv()
        with FakeTensorMode(shape_env=shape_env) as fake_mode:
            n = shape_env.create_unbacked_symint()
            x = layout(torch.empty(n, *rest), input_channels_last)
            out = call(x, fake_mode.from_tensor(w, static_shapes=True))
        u0 = n.node.expr
        for batch in (1, 2, 17):
            real = call(layout(torch.randn(batch, *rest), input_channels_last), w)
            claimed = [int(sympy.sympify(s.node.expr if isinstance(s, torch.SymInt) else s)
                           .subs(u0, batch)) for s in out.stride()]
            self.assertEqual(list(out.shape[1:]), list(real.shape[1:]))
            # strides of dims of size 1 do not matter
            self.assertEqual(
                [s for s, size in zip(claimed, real.shape) if size > 1],
                [s for s, size in zip(real.stride(), real.shape) if size > 1],
                msg=f"batch {batch}",
            )


class TestChannelsLastUnbackedBatch(TestCase):
    """suggest_memory_format (the layout the Python refs and decompositions give an output) of a
    channels-last tensor whose batch is unbacked: "the batch may be 0" made it contiguous, so a
    traced F.pad returned a layout eager does not (and its .contiguous() was dropped). The
    answer is now the one for non-empty sizes (symfix 0031 names the one op that reads the
    layout of an empty input: cat)."""

    LAYOUTS = {
        "contiguous": lambda t: t,
        "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last),
        "permuted": lambda t: t.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1),
    }

    @given(
        layout=st.sampled_from(sorted(LAYOUTS)),
        chw=st.tuples(*[st.sampled_from([1, 2, 5])] * 3),
        unbacked=st.sets(st.sampled_from([1, 2, 3])),
    )
    @settings(max_examples=80, deadline=None)
    def test_suggest_memory_format_as_eager(self, layout, chw, unbacked):
        # the batch and the dims in `unbacked` are unbacked; at the sizes chw (and batches
        # 1, 2, 7) a real tensor with the fake's strides gets eager's layout (F.pad allocates
        # in its input's suggested memory format) in the fake's answer, where strides matter
        # (dims longer than 1: where C, H and W are all 1 both answers agree)
        from torch._prims_common import suggest_memory_format

        shape_env = ShapeEnv()
        with FakeTensorMode(shape_env=shape_env):
            sizes = [shape_env.create_unbacked_symint()] + [
                shape_env.create_unbacked_symint() if d in unbacked else n
                for d, n in enumerate(chw, start=1)
            ]
            fake = self.LAYOUTS[layout](torch.empty(*sizes))
            got = suggest_memory_format(fake)
        for batch in (1, 2, 7):
            values = {s.node.expr: n for s, n in zip(sizes, (batch, *chw))
                      if isinstance(s, torch.SymInt)}
            strides = [int(sympy.sympify(st.node.expr if isinstance(st, torch.SymInt) else st)
                           .subs(values)) for st in fake.stride()]
            padded = F.pad(torch.empty_strided((batch, *chw), strides), (1, 1))
            laid_out = torch.empty(padded.shape).contiguous(memory_format=got)
            self.assertEqual(
                [stride for stride, size in zip(laid_out.stride(), padded.shape) if size > 1],
                [stride for stride, size in zip(padded.stride(), padded.shape) if size > 1],
                msg=f"batch {batch}",
            )

    def test_pad_keeps_eager_layout(self):
        # aot_eager and the graph trainer's make_fx capture, traced once with an unbacked
        # batch, replayed at 1, 2 and 5 (and 0: values only) under each mode
        def step(x):
            y = F.pad(x, (1, 1), value=0.5)
            return y, y.contiguous() * 2

        def inputs(n, requires_grad):
            t = torch.randn(n, 3, 4, 5).contiguous(memory_format=torch.channels_last)
            return t.requires_grad_(requires_grad)

        modes = {
            "grad": (contextlib.nullcontext, True),
            "no_grad": (torch.no_grad, True),
            "inference_mode": (torch.inference_mode, False),
        }
        for name, (mode, requires_grad) in modes.items():
            torch._dynamo.reset()
            compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
            shape_env = ShapeEnv()
            with FakeTensorMode(shape_env=shape_env):
                fake = inputs(shape_env.create_unbacked_symint(), requires_grad)
                with mode():
                    gm = make_fx(step)(fake)
            for batch in (1, 2, 5, 0):
                x = inputs(batch, requires_grad)
                x_c = x.detach().clone(memory_format=torch.preserve_format)
                x_c.requires_grad_(requires_grad)
                torch._dynamo.decorators.mark_unbacked(x_c, 0)
                with mode():
                    ref = step(x)
                    for how, got in (("aot_eager", compiled(x_c)), ("make_fx", gm(x))):
                        msg = f"{name} {how} batch {batch}"
                        for g, r in zip(got, ref):
                            self.assertEqual(g, r, msg=msg)
                            self.assertEqual(g.requires_grad, r.requires_grad, msg=msg)
                            if batch:
                                self.assertEqual(g.stride(), r.stride(), msg=msg)


if __name__ == "__main__":
    run_tests()
