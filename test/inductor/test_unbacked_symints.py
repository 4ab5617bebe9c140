# Owner(s): ["module: inductor"]
import contextlib
import copy
import functools
import os

import sympy
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.source import ConstantSource
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor import ir
from torch._inductor.graph import GraphLowering
from torch._inductor.utils import run_and_get_code
from torch._inductor.virtualized import V
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.utils._sympy.printers import PythonPrinter


@contextlib.contextmanager
def _no_graph_caches():
    # Lowering runs on every compile (no FX graph or AOT autograd cache hit
    # skips it); compiled kernels may still come from the code cache.
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(
        enable_autograd_cache=False
    ):
        yield


# Dimension orders as understood by Layout.is_stride_ordered (0 = smallest stride).
NCHW = [3, 2, 1, 0]
NHWC = [3, 0, 2, 1]


class TestStrideOrderCompoundStrides(TestCase):
    """Layout.is_stride_ordered on compound symbolic strides (pytorch#188323)."""

    def setUp(self):
        super().setUp()
        self.shape_env = ShapeEnv()
        graph = torch.fx.Graph()
        graph.output(None)
        self.graph = GraphLowering(
            torch.fx.GraphModule({}, graph), shape_env=self.shape_env
        )

    def backed(self, hint, name):
        return self.shape_env.create_symbol(
            hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC
        )

    def unbacked(self):
        return self.shape_env.create_unbacked_symint().node.expr

    def ordered(self, size, stride, order):
        layout = ir.FixedLayout(torch.device("cpu"), torch.float32, size, stride)
        with V.set_graph_handler(self.graph):
            return layout.is_stride_ordered(order)

    def guard_exprs(self):
        return [g.expr for g in self.shape_env.guards]

    def assertNoGuardsOrAsserts(self):
        self.assertEqual(self.guard_exprs(), [])
        asserts = [
            ra.expr for ras in self.shape_env.deferred_runtime_asserts.values()
            for ra in ras
        ]
        self.assertEqual(asserts, [])

    def assertGuardsWellFormed(self):
        printer = PythonPrinter()
        for expr in self.guard_exprs():
            negative_powers = [
                a
                for a in sympy.preorder_traversal(expr)
                if isinstance(a, sympy.Pow) and a.exp.is_negative
            ]
            self.assertEqual(negative_powers, [], msg=str(expr))
            self.assertTrue(printer.doprint(expr))

    # ---- proof: compound strides in expanded form -------------------------

    def test_backed_expanded_compound_channels_last(self):
        # The #188323 shape: a conv output whose spatial extent is
        # h - c + 3, laid out channels-last, with the strides in the expanded
        # polynomial form that SymInt arithmetic / sizevars.simplify produce.
        n, c, h = self.backed(2, "n"), self.backed(4, "c"), self.backed(10, "h")
        x = h - c + 3
        size = [n, c, x, x]
        stride = [sympy.expand(c * x * x), 1, sympy.expand(c * x), c]
        self.assertTrue(self.ordered(size, stride, NHWC))
        self.assertFalse(self.ordered(size, stride, NCHW))
        self.assertGuardsWellFormed()

    def test_unbacked_expanded_compound_no_guard(self):
        # Same structure over unbacked symbols: the stride comparison may not
        # raise nor leave a guard / runtime assert on u0, u1, and it must not
        # claim the wrong order.
        u0, u1 = self.unbacked(), self.unbacked()
        x = u1 + 2
        size = [4, x, x, u0]
        stride = [sympy.expand(u0 * x * x), sympy.expand(u0 * x), u0, 1]
        self.assertFalse(self.ordered(size, stride, [0, 1, 2, 3]))
        self.assertIsInstance(self.ordered(size, stride, NCHW), bool)
        self.assertNoGuardsOrAsserts()

    # ---- guard: behaviour that must stay ----------------------------------

    def test_unbacked_product_strides(self):
        u0, u1 = self.unbacked(), self.unbacked()
        size = [u0, u1, 256]
        stride = [256 * u1, 256, 1]
        self.assertTrue(self.ordered(size, stride, [2, 1, 0]))
        self.assertFalse(self.ordered(size, stride, [0, 1, 2]))
        size = [2, u0, u1, 256]
        stride = [256 * u0 * u1, 256 * u1, 256, 1]
        self.assertTrue(self.ordered(size, stride, NCHW))
        self.assertFalse(self.ordered(size, stride, [0, 1, 2, 3]))
        self.assertNoGuardsOrAsserts()

    def test_unbacked_max_product_strides(self):
        u0, u1 = self.unbacked(), self.unbacked()
        m = sympy.Max(1, u0)
        size = [u1, m, 8]
        stride = [8 * m, 8, 1]
        self.assertTrue(self.ordered([3, *size], [8 * m * u1, *stride], NCHW))
        self.assertTrue(self.ordered(size, [m * u1 * 8, u1 * 8, 1], [2, 1, 0]))
        self.assertFalse(self.ordered(size, [m * u1 * 8, u1 * 8, 1], [0, 1, 2]))
        self.assertNoGuardsOrAsserts()

    def test_unbacked_simple_strides(self):
        u0 = self.unbacked()
        size = [3, u0, 256]
        self.assertTrue(self.ordered(size, [256 * u0, 256, 1], [2, 1, 0]))
        self.assertFalse(self.ordered(size, [256 * u0, 256, 1], [0, 1, 2]))
        # transposed last two dims: 256*u0 vs 256 still orders correctly
        self.assertTrue(self.ordered(size, [256 * u0, 1, u0], [2, 0, 1]))
        self.assertNoGuardsOrAsserts()

    def test_backed_factored_compound(self):
        n, c, h = self.backed(2, "n"), self.backed(4, "c"), self.backed(10, "h")
        x = h - c + 3
        size = [n, c, x, x]
        stride = [c * x**2, 1, c * x, c]
        self.assertTrue(self.ordered(size, stride, NHWC))
        self.assertFalse(self.ordered(size, stride, NCHW))
        self.assertGuardsWellFormed()

    def test_backed_and_static_simple(self):
        s0, s1 = self.backed(5, "a"), self.backed(7, "b")
        self.assertTrue(self.ordered([s1, s0, 256], [256 * s0, 1, s0], [2, 0, 1]))
        self.assertFalse(self.ordered([s1, s0, 256], [256 * s0, 1, s0], [2, 1, 0]))
        self.assertTrue(self.ordered([2, 3, 4, 5], [60, 20, 5, 1], NCHW))
        self.assertFalse(self.ordered([2, 3, 4, 5], [60, 20, 5, 1], NHWC))
        self.assertTrue(self.ordered([2, 3, 4, 5], [60, 1, 15, 3], NHWC))
        self.assertFalse(self.ordered([2, 3, 4, 5], [60, 1, 15, 3], NCHW))
        self.assertGuardsWellFormed()


class TestStrideOrderCompile(TestCase):
    def test_dynamic_conv_chain_channels_last_cpu(self):
        # The #188323 model shape on CPU: a conv whose output spatial size is
        # a compound expression feeds a second conv (is_stride_ordered on the
        # FixedLayout) and a pointwise tail; compiled must match eager.
        def f(x, w, scalar):
            y = F.conv2d(x, w, padding=1)
            feature = F.leaky_relu(y, 0.1)
            return F.conv2d(y, w, padding=1), F.relu(scalar - feature) + feature

        torch.manual_seed(0)
        x = torch.randn(2, 5, 12, 12).to(memory_format=torch.channels_last)
        w = torch.randn(5, 5, 5, 5)
        s = torch.randn(())
        torch._dynamo.reset()
        with _no_graph_caches():
            out = torch.compile(f, dynamic=True, backend="inductor")(x, w, s)
        for got, ref in zip(out, f(x, w, s)):
            self.assertEqual(got, ref, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------
# symfix: inductor-unbacked-codegen (pytorch/pytorch#183840, shipped in 2.13.0).
# Self-contained: its own imports, so it does not depend on the classes above.


class TestInductorUnbackedCodegen(TestCase):
    """Fallback outputs bind their fresh unbacked symbols; stride order is proven
    without hints; optimization-only stride sorting falls back to hints."""

    def _graph(self, shape_env):
        import torch._inductor.graph as inductor_graph

        graph = torch.fx.Graph()
        graph.output(None)
        return inductor_graph.GraphLowering(
            torch.fx.GraphModule({}, graph), shape_env=shape_env
        )

    def _compile_and_compare(self, fn, args, backend):
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        torch._dynamo.reset()
        with (
            torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True),
            inductor_config.patch(fx_graph_cache=False),
            functorch_config.patch(enable_autograd_cache=False),
        ):
            compiled = torch.compile(fn, backend=backend, fullgraph=True)
            got = compiled(*args)
        ref = fn(*args)
        self.assertEqual(got.shape, ref.shape)
        self.assertEqual(got, ref)

    @staticmethod
    def _gather_repeated(counts, x):
        idx = torch.repeat_interleave(counts)  # fallback op, output length is unbacked
        return x[idx].sin() * 2

    # ---- proof

    def test_fallback_output_symbol_bound_under_ignored_fresh_symbols(self):
        # Inductor driven from inside a trace that ignores fresh unbacked symbols
        # (as standalone / regional compiles are): repeat_interleave's output extent
        # must still be bound from the runtime tensor before the wrapper uses it.
        from torch._guards import detect_fake_mode
        from torch._inductor.compile_fx import compile_fx

        def backend(gm, example_inputs):
            shape_env = detect_fake_mode(example_inputs).shape_env
            with shape_env.ignore_fresh_unbacked_symbols():
                return compile_fx(gm, example_inputs)

        counts = torch.tensor([1, 2, 1, 0, 3])
        x = torch.randn(5, 8)
        self._compile_and_compare(self._gather_repeated, (counts, x), backend)

    def test_stride_order_proven_without_guard(self):
        from torch._inductor.virtualized import V

        shape_env = ShapeEnv()
        u0 = shape_env.create_unbacked_symint().node.expr  # u0 >= 0, no hint
        with V.set_graph_handler(self._graph(shape_env)):
            layout = ir.FixedLayout(
                torch.device("cpu"), torch.float32, [2, u0, 256], [256 * u0, 256, 1]
            )
            self.assertTrue(layout.is_stride_ordered([2, 1, 0]))
            transposed = ir.FixedLayout(
                torch.device("cpu"), torch.float32, [u0, 2, 256], [256, 256 * u0, 1]
            )
            self.assertTrue(transposed.is_stride_ordered([1, 2, 0]))
        self.assertEqual(shape_env.guards, [])
        self.assertEqual(dict(shape_env.deferred_runtime_asserts), {})
        self.assertNotIn(u0, shape_env.replacements)

    def test_stride_order_sort_uses_hint_for_unbacked(self):
        from torch.utils._sympy.functions import FloorDiv, Max

        shape_env = ShapeEnv()
        u0 = shape_env.create_unbacked_symint()
        torch._dynamo.override_optimization_hint(u0, 16)
        first = 256 * Max(1, FloorDiv(u0.node.expr, 2))
        self.assertEqual(ir.get_stride_order([first, 256, 1], shape_env), [2, 1, 0])
        self.assertEqual(shape_env.guards, [])

    # ---- guards

    def test_fallback_output_plain_compile(self):
        counts = torch.tensor([1, 2, 1, 0, 3])
        x = torch.randn(5, 8)
        self._compile_and_compare(self._gather_repeated, (counts, x), "inductor")

    def test_stride_order_rejects_wrong_order_without_guard(self):
        from torch._inductor.virtualized import V

        shape_env = ShapeEnv()
        u0 = shape_env.create_unbacked_symint().node.expr
        with V.set_graph_handler(self._graph(shape_env)):
            layout = ir.FixedLayout(
                torch.device("cpu"), torch.float32, [2, u0, 256], [256 * u0, 256, 1]
            )
            self.assertFalse(layout.is_stride_ordered([0, 1, 2]))
        self.assertEqual(shape_env.guards, [])

    def test_stride_order_static(self):
        self.assertEqual(ir.get_stride_order([4096, 256, 1], ShapeEnv()), [2, 1, 0])
        self.assertEqual(ir.get_stride_order([1, 16, 4], ShapeEnv()), [0, 2, 1])


# ---------------------------------------------------------------------------
# symfix: inductor-compound-stride-guard (pytorch/pytorch#190965) through a real
# CPU compile.


class TestCompoundStrideCompile(TestCase):
    """A whole torch.compile on CPU that reaches Layout's stride-order check with
    compound strides in expanded polynomial form (pytorch#188323, #188422).

    The first conv's lowering specializes the dynamic channel count (its weight
    shares that size). The padded/cropped channels-last tensor is a graph output,
    so Inductor fixes its layout to the FX strides; read after the
    specialization, those come back expanded, e.g. 5*w - 10*p and
    5*h*w - 10*h*p - 10*p*w + 20*p**2. The second conv then asks whether that
    layout is channels-last ordered.
    """

    @staticmethod
    def _pad_then_conv(x, w1, w2, pad_len):
        p = pad_len.shape[0]
        a = F.conv2d(x, w1)
        y = F.pad(x, (p, p, p, p)) * 2
        return a, y, F.conv2d(y, w2)

    @staticmethod
    def _crop_then_conv(x, w1, w2, pad_len):
        p = pad_len.shape[0]
        a = F.conv2d(x, w1)
        y = F.pad(x, (-p, -p, -p, -p)) * 2
        return a, y, F.conv2d(y, w2)

    def _compile_and_compare(self, fn, x, pad_len):
        torch.manual_seed(0)
        w1 = torch.randn(7, 5, 3, 3)
        w2 = torch.randn(6, 5, 3, 3)
        args = (x.to(memory_format=torch.channels_last), w1, w2, pad_len)
        torch._dynamo.reset()
        with _no_graph_caches():
            got = torch.compile(fn, backend="inductor", dynamic=True)(*args)
        ref = fn(*args)
        self.assertEqual(len(got), len(ref))
        for g, r in zip(got, ref):
            self.assertEqual(g.shape, r.shape)
            self.assertEqual(g, r, atol=1e-4, rtol=1e-4)
        # the padded graph output keeps eager's (channels-last) strides
        self.assertEqual(got[1].stride(), ref[1].stride())

    # ---- proof

    def test_conv_of_cropped_channels_last_output(self):
        # Spatial extents h - 2*p, w - 2*p: on 2.13.0 the divisibility guard
        # holds a reciprocal power and raises "ValueError: Exponent must be
        # non-negative" from the second conv's lowering.
        torch.manual_seed(0)
        x = torch.randn(2, 5, 17, 19)
        self._compile_and_compare(self._crop_then_conv, x, torch.zeros(4))

    def test_conv_of_padded_channels_last_output(self):
        # Spatial extents h + 2*p, w + 2*p: the same guard raises
        # "ValueRangeError: Invalid ranges [0:-1]" on 2.13.0.
        torch.manual_seed(0)
        x = torch.randn(2, 5, 9, 11)
        self._compile_and_compare(self._pad_then_conv, x, torch.zeros(4))

    def test_segformer_style_sequence_reduction_conv(self):
        # The #188422 model shape (SegFormer efficient attention): an
        # overlapping patch-embedding conv gives extents (h - 1)//4 + 1,
        # (w - 1)//4 + 1; the normalized token sequence is a graph output and,
        # transposed back to an image, feeds the sequence-reduction conv.
        # 2.13.0 raised "ValueRangeError: Invalid ranges [0:-1]" there.
        def fn(x, w_embed, w_reduce):
            y = F.conv2d(x, w_embed, stride=4, padding=3)
            b, c, h, w = y.shape
            tokens = F.layer_norm(y.flatten(2).transpose(1, 2), (c,))
            image = tokens.transpose(1, 2).reshape(b, c, h, w)
            return tokens, F.conv2d(image, w_reduce, stride=2)

        torch.manual_seed(0)
        args = (
            torch.randn(2, 3, 64, 48),
            torch.randn(16, 3, 7, 7),
            torch.randn(16, 16, 2, 2),
        )
        torch._dynamo.reset()
        with _no_graph_caches():
            got = torch.compile(fn, backend="inductor", dynamic=True)(*args)
        ref = fn(*args)
        for g, r in zip(got, ref):
            self.assertEqual(g.shape, r.shape)
            self.assertEqual(g, r, atol=1e-4, rtol=1e-4)

    def test_tokens_viewed_back_as_image_output(self):
        # The #188423 path: no second conv; the image-shaped view of the
        # token output is itself a graph output, so GraphLowering.run_node asks
        # for the FX stride order of that view (require_stride_order). On
        # 2.13.0 this raised "ValueRangeError: Invalid ranges [0:-1]" outside
        # any lowering.
        def fn(x, w_embed):
            y = F.conv2d(x, w_embed, stride=4, padding=3)
            b, c, h, w = y.shape
            tokens = F.layer_norm(y.flatten(2).transpose(1, 2), (c,))
            return tokens, tokens.transpose(1, 2).reshape(b, c, h, w)

        torch.manual_seed(0)
        args = (torch.randn(2, 3, 64, 48), torch.randn(16, 3, 7, 7))
        torch._dynamo.reset()
        with _no_graph_caches():
            got = torch.compile(fn, backend="inductor", dynamic=True)(*args)
        ref = fn(*args)
        for g, r in zip(got, ref):
            self.assertEqual(g.shape, r.shape)
            self.assertEqual(g.stride(), r.stride())
            self.assertEqual(g, r, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------
# symfix: inductor-diagonal-unbacked-length (ours). torch.diagonal over unbacked
# sizes, compiled once by Inductor, replayed at sizes around the diagonal's edge.


class TestInductorDiagonalUnbacked(TestCase):
    """The lowering's diagonal length, and SizeVarAllocator.evaluate_min's GCD
    shortcut that chose it wrongly (an empty result at every size)."""

    SQUARE = [(5, 5), (1, 1), (2, 2), (9, 9), (0, 0)]
    RECT = [(4, 6), (0, 3), (1, 3), (3, 1), (7, 2), (2, 7)]

    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def _compiled(self, offset, example, square, op=torch.diagonal):
        def step(x):
            if square:
                torch._check(x.size(0) == x.size(1))
            return op(x, offset) * 2

        example = example.clone()
        torch._dynamo.decorators.mark_unbacked(example, 0)
        torch._dynamo.decorators.mark_unbacked(example, 1)
        compiled = torch.compile(step, backend="inductor", fullgraph=True)
        with _no_graph_caches():
            compiled(example)
        return compiled, lambda x: op(x, offset) * 2

    def _replay(self, compiled, eager, sizes):
        for size in sizes:
            x = torch.randn(size)
            got, ref = compiled(x), eager(x)
            self.assertEqual(got.shape, ref.shape, msg=f"size {size}")
            self.assertEqual(got, ref, msg=f"size {size}")

    def _sizevars(self):
        shape_env = ShapeEnv()
        graph = torch.fx.Graph()
        graph.output(None)
        lowering = GraphLowering(torch.fx.GraphModule({}, graph), shape_env=shape_env)
        return shape_env, lowering.sizevars

    # ---- proof

    def test_square_offset_compiled_once(self):
        for offset in (1, -1, 2):
            compiled, eager = self._compiled(offset, torch.randn(5, 5), square=True)
            with torch._dynamo.config.patch(error_on_recompile=True):
                self._replay(compiled, eager, self.SQUARE[:-1])
            # A 0 x 0 input's strides are (1, 1), which Dynamo's stride guard
            # (stride(0) == size(0)) refuses: it compiles again.
            self._replay(compiled, eager, self.SQUARE[-1:])

    def test_rectangular_compiled_once(self):
        for offset in (0, 1, -2):
            compiled, eager = self._compiled(offset, torch.randn(4, 6), square=False)
            with torch._dynamo.config.patch(error_on_recompile=True):
                self._replay(compiled, eager, self.RECT)

    def test_modes_match_eager(self):
        # one compile per mode, replayed at sizes 1, 2, not a multiple of a
        # block, and far from the first: values, dtype and requires_grad as
        # eager's. Under bf16 autocast the step's matmul is cast. (The matmul's
        # backward over an unbacked contracted dim guards Eq(u0, 1), on stock
        # too, so the input that requires grad goes through sin instead.)
        def through_sin(x):
            return torch.diagonal(x.sin(), 1) * 2

        def through_matmul(x):
            return torch.diagonal(x @ x, 1) * 2

        modes = {
            "grad": (contextlib.nullcontext, True, through_sin),
            "autocast_bf16": (
                lambda: torch.autocast("cpu", dtype=torch.bfloat16), False, through_matmul,
            ),
            "no_grad": (torch.no_grad, True, through_matmul),
            "inference_mode": (torch.inference_mode, True, through_matmul),
        }
        for name, (mode, requires_grad, step) in modes.items():
            with self.subTest(mode=name):
                torch._dynamo.reset()
                compiled = torch.compile(step, backend="inductor", fullgraph=True)
                for n in (5, 1, 2, 17, 130):
                    x = torch.randn(n, n, requires_grad=requires_grad)
                    x_c = x.detach().clone().requires_grad_(requires_grad)
                    torch._dynamo.decorators.mark_unbacked(x_c, 0)
                    torch._dynamo.decorators.mark_unbacked(x_c, 1)
                    with mode(), _no_graph_caches():
                        got, ref = compiled(x_c), step(x)
                    self.assertEqual(got.dtype, ref.dtype, msg=f"{name} {n}")
                    self.assertEqual(got.requires_grad, ref.requires_grad, msg=f"{name} {n}")
                    tol = {"atol": 0.5, "rtol": 2e-2} if ref.dtype == torch.bfloat16 else {}
                    self.assertEqual(got, ref, msg=f"{name} {n}", **tol)

    def test_diagonal_copy_and_scatter(self):
        compiled, eager = self._compiled(
            1, torch.randn(5, 5), square=True, op=torch.diagonal_copy
        )
        self._replay(compiled, eager, self.SQUARE)

        def scatter(x):
            torch._check(x.size(0) == x.size(1))
            return torch.diagonal_scatter(x, torch.diagonal(x, 1) + 1, 1)

        x = torch.randn(5, 5)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        torch._dynamo.decorators.mark_unbacked(x, 1)
        compiled = torch.compile(scatter, backend="inductor", fullgraph=True)
        with _no_graph_caches():
            self.assertEqual(compiled(x), scatter(x))
        for n in (1, 2, 6):
            y = torch.randn(n, n)
            self.assertEqual(compiled(y), scatter(y))

    def test_evaluate_min_does_not_take_a_zero_multiple_as_proof(self):
        shape_env, sizevars = self._sizevars()
        u0 = shape_env.create_unbacked_symint().node.expr
        u1 = shape_env.create_unbacked_symint().node.expr
        # gcd(u0 - 1, 0) == u0 - 1 and gcd(u0, u0*u1) == u0, yet neither side
        # is the smaller for every u0, u1 >= 0: undecidable, so no answer.
        for left, right in [(u0 - 1, sympy.Integer(0)), (u0, u0 * u1)]:
            with self.assertRaisesRegex(TypeError, "with unbacked symints"):
                sizevars.evaluate_min(left, right)
            with self.assertRaisesRegex(TypeError, "with unbacked symints"):
                sizevars.evaluate_min(right, left)

    # ---- guards

    def test_evaluate_min_gcd_with_a_positive_multiple(self):
        shape_env, sizevars = self._sizevars()
        u0 = shape_env.create_unbacked_symint()
        torch._check(u0 >= 1)
        u1 = shape_env.create_unbacked_symint()
        torch._check(u1 >= 1)
        a, b = u0.node.expr, u1.node.expr
        self.assertEqual(sizevars.evaluate_min(a, a * b), a)
        self.assertEqual(sizevars.evaluate_min(a * b, a), a)
        self.assertEqual(sizevars.evaluate_min(sympy.Integer(3), sympy.Integer(2)), 2)
        self.assertEqual(shape_env.guards, [])

    def test_static_and_backed_sizes(self):
        def f(x):
            return torch.diagonal(x, 1) * 2

        for dynamic in (False, True):
            torch._dynamo.reset()
            compiled = torch.compile(f, backend="inductor", dynamic=dynamic)
            with _no_graph_caches():
                for size in [(5, 5), (4, 6), (7, 2)]:
                    x = torch.randn(size)
                    self.assertEqual(compiled(x), f(x))

    @settings(max_examples=40, deadline=None)
    @given(
        rows=st.integers(1, 12), cols=st.integers(1, 12), offset=st.sampled_from([-3, 0, 2])
    )
    def test_property_one_graph_per_offset(self, rows, cols, offset):
        # One compiled graph per offset (compiled at 4x6, far from most sizes drawn)
        # computes eager's diagonal at every size. Sizes from 1: an empty input
        # fails Dynamo's stride guard and recompiles (the other tests replay 0).
        # A build that cannot compile it fails every example alike: compile (and fail) once.
        cache = self.__dict__.setdefault("_graphs", {})
        if offset not in cache:
            try:
                cache[offset] = self._compiled(offset, torch.randn(4, 6), square=False)
            except Exception as e:
                cache[offset] = e
        if isinstance(cache[offset], Exception):
            raise cache[offset]
        compiled, eager = cache[offset]
        self._replay(compiled, eager, [(rows, cols)])


class TestNormUnbackedBatch(TestCase):
    """F.group_norm with an unbacked batch (issue 28 item 5): the Python check that more than
    one value per group exists guarded Eq(15*u0, 1); in a graph it is a runtime assertion."""

    MODES = {
        "grad": (contextlib.nullcontext, True),
        "autocast_bf16": (lambda: torch.autocast("cpu", dtype=torch.bfloat16), False),
        "no_grad": (torch.no_grad, True),
        "inference_mode": (torch.inference_mode, True),
    }

    @staticmethod
    def step(x, w, b):
        # the matmul makes autocast cast: group_norm then sees bf16 input, as in a model
        return F.group_norm((x @ w.new_ones(5, 5)) * 0.5, 5, w, b)

    def test_modes_match_eager(self):
        # one compile per mode, replayed at 3, 1, 2 and 17: values, dtype, requires_grad,
        # gradients (grad mode) as eager's
        for name, (mode, requires_grad) in self.MODES.items():
            with self.subTest(mode=name):
                torch._dynamo.reset()
                compiled = torch.compile(self.step, backend="inductor", fullgraph=True)
                for n in (3, 1, 2, 17):
                    x = torch.randn(n, 5, 3, 5, requires_grad=requires_grad)
                    w = torch.randn(5, requires_grad=requires_grad)
                    b = torch.randn(5)
                    x_c = x.detach().clone().requires_grad_(requires_grad)
                    w_c = w.detach().clone().requires_grad_(requires_grad)
                    torch._dynamo.decorators.mark_unbacked(x_c, 0)
                    with mode(), _no_graph_caches():
                        got, ref = compiled(x_c, w_c, b), self.step(x, w, b)
                    self.assertEqual(got.dtype, ref.dtype, msg=f"{name} {n}")
                    self.assertEqual(got.requires_grad, ref.requires_grad, msg=f"{name} {n}")
                    tol = {"atol": 0.1, "rtol": 2e-2} if ref.dtype == torch.bfloat16 else {}
                    self.assertEqual(got, ref, msg=f"{name} {n}", **tol)
                    if ref.requires_grad:
                        got.sum().backward()
                        ref.sum().backward()
                        # sums over the batch: reduction order differs from eager's
                        grad_tol = {"atol": 1e-4, "rtol": 1e-4}
                        self.assertEqual(x_c.grad, x.grad, msg=f"{name} {n}", **grad_tol)
                        self.assertEqual(w_c.grad, w.grad, msg=f"{name} {n}", **grad_tol)

    def test_one_value_per_group_is_refused_at_run_time(self):
        # [n, 3, 1, 1] in 3 groups: one value per group at n = 1, which eager refuses; the
        # graph compiled for an unbacked n asserts it at run time instead of computing
        def norm(x):
            return F.group_norm(x, 3)

        for backend in ("aot_eager", "inductor"):
            with self.subTest(backend=backend):
                torch._dynamo.reset()
                compiled = torch.compile(norm, backend=backend, fullgraph=True)
                x = torch.randn(2, 3, 1, 1)
                torch._dynamo.decorators.mark_unbacked(x, 0)
                with _no_graph_caches():
                    self.assertEqual(compiled(x), norm(x))
                    one = torch.randn(1, 3, 1, 1)
                    with self.assertRaisesRegex(ValueError, "more than 1 value per channel"):
                        norm(one)
                    with self.assertRaisesRegex(RuntimeError, r"Ne\(u0, 1\)"):
                        compiled(one)

    def test_static_sizes_and_torchscript_keep_value_error(self):
        # where no size is unbacked the check is eager's: a ValueError, at compile time for
        # static sizes (Dynamo wraps it); TorchScript still compiles the check (its branch
        # is not scripted)
        one = torch.randn(1, 3, 1, 1)
        torch._dynamo.reset()
        refused = (ValueError, torch._dynamo.exc.TorchRuntimeError)
        with self.assertRaisesRegex(refused, "more than 1 value per channel"):
            torch.compile(lambda x: F.group_norm(x, 3), backend="aot_eager",
                          fullgraph=True)(one)
        scripted = torch.jit.script(torch.nn.GroupNorm(3, 3))
        x = torch.randn(2, 3, 4, 4)
        self.assertEqual(scripted(x), torch.nn.GroupNorm(3, 3)(x))
        with self.assertRaisesRegex(torch.jit.Error, "more than 1 value per channel"):
            scripted(one)


class TestBatchNormUnbackedNumel(TestCase):
    """batch_norm, training and eval, with an unbacked batch (issue 28 item 5): past the Python
    size check, ATen's _batch_norm_impl_index guarded Eq(20*u0, 0) to answer an empty input
    apart (an empty output, running stats untouched)."""

    MODES = TestNormUnbackedBatch.MODES

    @staticmethod
    def train(x, w, b, mean, var):
        # the matmul makes autocast cast, as in a model
        return F.batch_norm(x @ x.new_ones(5, 5).triu(), mean, var, w, b, training=True) * 2

    @staticmethod
    def eval(x, w, b, mean, var):
        return F.batch_norm(x @ x.new_ones(5, 5).triu(), mean, var, w, b, training=False) * 2

    @staticmethod
    def train_any_count(x, w, b, mean, var):
        # torch.batch_norm has no Python check of the count: at one value per channel the
        # kernel divides by n - 1 = 0 for the running variance (NaN), at none by n
        return torch.batch_norm(x, w, b, mean, var, True, 0.1, 1e-5, False) * 2

    def _replay(self, step, mode, requires_grad, sizes, backend="inductor", shape=(4, 5)):
        # one compile, replayed at each size against eager: output (values, dtype, strides,
        # requires_grad), running stats after the step, gradients
        torch._dynamo.reset()
        counter = CompileCounterWithBackend(backend)
        compiled = torch.compile(step, backend=counter, fullgraph=True)
        for n in sizes:
            x = torch.randn(n, *shape)
            params = [torch.randn(4), torch.randn(4), torch.randn(4), torch.rand(4) + 0.5]
            ref_args = [x.clone().requires_grad_(requires_grad),
                        *(p.clone().requires_grad_(requires_grad and i < 2)
                          for i, p in enumerate(params))]
            got_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in ref_args]
            torch._dynamo.decorators.mark_unbacked(got_args[0], 0)
            with mode(), _no_graph_caches():
                got, ref = compiled(*got_args), step(*ref_args)
            msg = f"{step.__name__} n={n}"
            self.assertEqual(got.dtype, ref.dtype, msg=msg)
            self.assertEqual(got.requires_grad, ref.requires_grad, msg=msg)
            tol = {"atol": 0.1, "rtol": 2e-2} if ref.dtype == torch.bfloat16 else {}
            self.assertEqual(got, ref, msg=msg, **tol)
            if n:
                self.assertEqual(got.stride(), ref.stride(), msg=msg)
            # running stats: values, and no autograd history (the kernel updates them in place)
            self.assertEqual(got_args[3:], ref_args[3:], msg=msg, **tol)
            self.assertEqual([s.requires_grad for s in got_args[3:]],
                             [s.requires_grad for s in ref_args[3:]], msg=msg)
            if ref.requires_grad:
                got.sum().backward()
                ref.sum().backward()
                for g, r in zip(got_args[:3], ref_args[:3]):
                    self.assertEqual(g.grad, r.grad, msg=msg, atol=1e-4, rtol=1e-4)
        self.assertEqual(counter.frame_count, 1)

    def test_modes_match_eager(self):
        for step in (self.train, self.eval):
            for name, (mode, requires_grad) in self.MODES.items():
                with self.subTest(step=step.__name__, mode=name):
                    self._replay(step, mode, requires_grad, (3, 1, 0, 2, 17))

    def test_empty_batch_keeps_running_stats_aot_eager(self):
        # the graph runs ATen kernels: the CPU batch norm kernel refuses an empty input, so
        # the graph must not call it there
        self._replay(self.train, torch.no_grad, False, (3, 0, 2), backend="aot_eager")

    def test_empty_and_single_counts_with_grad(self):
        # forward and backward at batches 0 and 1 of one spatial element (one value per
        # channel): the graph computes the kernel's NaN and inf, where it divided Python
        # floats by zero (var_mean's derivative, n / (n - 1) for the running variance)
        for backend in ("aot_eager", "inductor"):
            with self.subTest(backend=backend):
                self._replay(self.train_any_count, contextlib.nullcontext, True, (3, 0, 1, 2),
                             backend=backend, shape=(4, 1, 1))

    def test_static_sizes_keep_the_kernel(self):
        # where the size is known the trace is the kernel's as before (native_batch_norm),
        # and an empty input leaves the running stats alone
        def norm(x, w, b, mean, var):
            return F.batch_norm(x, mean, var, w, b, training=True)

        args = [torch.randn(3, 4, 5), torch.randn(4), torch.randn(4), torch.zeros(4),
                torch.ones(4)]
        graph = make_fx(norm, tracing_mode="symbolic")(*args).graph
        targets = {str(n.target) for n in graph.nodes}
        self.assertTrue(any("native_batch_norm" in t for t in targets), targets)
        self.assertFalse(any("var_mean" in t for t in targets), targets)
        empty = [torch.randn(0, 4, 5), *args[1:]]
        self.assertEqual(norm(*empty).shape, (0, 4, 5))
        self.assertEqual(empty[3:], [torch.zeros(4), torch.ones(4)])


class TestInstanceNormUnbackedBatch(TestCase):
    """instance_norm with affine weights over an unbacked batch (issue 46): the kernel repeats
    the weight and bias once per instance, and repeat's derivative guarded Eq(u0, 0)."""

    def _replay(self, backend, track_running_stats):
        torch.manual_seed(0)
        ref_m = torch.nn.InstanceNorm2d(3, affine=True, track_running_stats=track_running_stats)
        got_m = copy.deepcopy(ref_m)
        torch._dynamo.reset()
        counter = CompileCounterWithBackend(backend)
        compiled = torch.compile(got_m, backend=counter, fullgraph=True)
        for n in (3, 1, 2, 17):
            x = torch.randn(n, 3, 4, 5, requires_grad=True)
            x_c = x.detach().clone().requires_grad_()
            torch._dynamo.decorators.mark_unbacked(x_c, 0)
            with _no_graph_caches():
                got = compiled(x_c)
            ref = ref_m(x)
            msg = f"{backend} n={n}"
            self.assertEqual(got, ref, msg=msg, atol=1e-5, rtol=1e-5)
            self.assertEqual(got.stride(), ref.stride(), msg=msg)
            (got * got).sum().backward()
            (ref * ref).sum().backward()
            self.assertEqual(x_c.grad, x.grad, msg=msg, atol=1e-4, rtol=1e-4)
            for name in ("weight", "bias"):
                self.assertEqual(getattr(got_m, name).grad, getattr(ref_m, name).grad,
                                 msg=f"{msg} {name}", atol=1e-4, rtol=1e-4)
            self.assertEqual(list(got_m.buffers()), list(ref_m.buffers()), msg=msg)
        self.assertEqual(counter.frame_count, 1)
        # an empty batch: eager's kernel indexes the repeated (empty) weight and raises
        # IndexError; the graph refuses it at run time
        x = torch.randn(0, 3, 4, 5)
        with self.assertRaises(IndexError):
            ref_m(x)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        with self.assertRaisesRegex(RuntimeError, r"Ne\(u0, 0\)"):
            compiled(x)

    def test_running_stats_at_an_empty_batch(self):
        # no affine weights: an empty batch runs in eager. Training averages NaN into the
        # running stats, as eager does (the count per channel was divided by N * C = 0 as a
        # float); eval leaves them alone (the graph wrote their NaN average back)
        for training in (True, False):
            with self.subTest(training=training):
                torch.manual_seed(0)
                ref_m = torch.nn.InstanceNorm2d(3, track_running_stats=True).train(training)
                got_m = copy.deepcopy(ref_m)
                torch._dynamo.reset()
                compiled = torch.compile(got_m, backend="aot_eager", fullgraph=True)
                for n in (3, 0, 2):
                    x = torch.randn(n, 3, 4, 5)
                    x_c = x.clone()
                    torch._dynamo.decorators.mark_unbacked(x_c, 0)
                    got, ref = compiled(x_c), ref_m(x)
                    self.assertEqual(got, ref, msg=f"n={n}", atol=1e-5, rtol=1e-5)
                    self.assertEqual(list(got_m.buffers()), list(ref_m.buffers()), msg=f"n={n}")

    def test_affine_training_steps_match_eager(self):
        for backend, track in (("aot_eager", False), ("inductor", True)):
            with self.subTest(backend=backend, track_running_stats=track):
                self._replay(backend, track)

class TestUnfoldUnbacked(TestCase):
    """unfold over unbacked dims (issue 28 item 4): the lowering asked a hint only to decide
    buffer reuse (mark_reuse), a heuristic; an unbacked size has none."""

    @staticmethod
    def through_mul(x, w):
        return (x.unfold(1, 3, 2) * w).sin().sum(-1)

    @staticmethod
    def through_matmul(x, w):
        return (x.unfold(1, 3, 2) @ w.new_ones(3, 4)).sum(-1)

    def test_modes_match_eager(self):
        # one compile per mode with both dims unbacked, replayed at one window (1, 3), widths
        # not a multiple of the step, and far from the first: values, dtype, requires_grad and
        # the input's gradient as eager's. Under bf16 autocast the step's matmul is cast (the
        # fp32 matmul: TestBmmLayoutPolicyUnbacked).
        modes = {
            "grad": (contextlib.nullcontext, True, self.through_mul),
            "autocast_bf16": (
                lambda: torch.autocast("cpu", dtype=torch.bfloat16), False, self.through_matmul,
            ),
            "no_grad": (torch.no_grad, True, self.through_mul),
            "inference_mode": (torch.inference_mode, True, self.through_mul),
        }
        for name, (mode, requires_grad, step) in modes.items():
            with self.subTest(mode=name):
                torch._dynamo.reset()
                counter = CompileCounterWithBackend("inductor")
                compiled = torch.compile(step, backend=counter, fullgraph=True)
                for n, width in ((7, 9), (1, 3), (2, 4), (5, 8), (20, 33)):
                    x = torch.randn(n, width, requires_grad=requires_grad)
                    w = torch.randn(3)
                    x_c = x.detach().clone().requires_grad_(requires_grad)
                    torch._dynamo.decorators.mark_unbacked(x_c, 0)
                    torch._dynamo.decorators.mark_unbacked(x_c, 1)
                    with mode(), _no_graph_caches():
                        got, ref = compiled(x_c, w), step(x, w)
                    msg = f"{name} {n}x{width}"
                    self.assertEqual(got.dtype, ref.dtype, msg=msg)
                    self.assertEqual(got.requires_grad, ref.requires_grad, msg=msg)
                    tol = {"atol": 0.1, "rtol": 2e-2} if ref.dtype == torch.bfloat16 else {}
                    self.assertEqual(got, ref, msg=msg, **tol)
                    if ref.requires_grad:
                        got.sum().backward()
                        ref.sum().backward()
                        self.assertEqual(x_c.grad, x.grad, msg=msg)
                self.assertEqual(counter.frame_count, 1, msg=name)  # one graph serves all

    def test_static_sizes_unchanged(self):
        # static sizes still get their reuse count from the sizes themselves
        x = torch.randn(5, 9)
        torch._dynamo.reset()
        with _no_graph_caches():
            got = torch.compile(self.through_mul, backend="inductor", fullgraph=True)(
                x, torch.ones(3))
        self.assertEqual(got, self.through_mul(x, torch.ones(3)))


class TestNarrowTensorStartUnbacked(TestCase):
    """narrow() with its start in a 0-d tensor over an unbacked size (issue 28 item 2). Dynamo
    reads the start with a backed symbol of its own; its runtime asserts tie that symbol to the
    unbacked size (s0 <= u0) and Inductor emitted them, but no input binds the symbol (NameError
    at run time). The backward's slice_scatter asked the sign of the start (GuardOnDataDependent)."""

    MODES = TestNormUnbackedBatch.MODES

    @staticmethod
    def step(x, start, w):
        return (torch.narrow(x, 0, start, 2) @ w).sin()

    def test_modes_match_eager(self):
        # one compile per mode, replayed at starts from either end (narrow wraps a negative
        # one), at the smallest size that holds the window and far from the first
        cases = ((10, 3), (7, 0), (5, 3), (2, 0), (10, -3), (2, -2), (6, -6), (40, 37))
        for name, (mode, requires_grad) in self.MODES.items():
            with self.subTest(mode=name):
                torch._dynamo.reset()
                counter = CompileCounterWithBackend("inductor")
                compiled = torch.compile(self.step, backend=counter, fullgraph=True)
                for n, start in cases:
                    x = torch.randn(n, 3, requires_grad=requires_grad)
                    w = torch.randn(3, 4, requires_grad=requires_grad)
                    x_c = x.detach().clone().requires_grad_(requires_grad)
                    w_c = w.detach().clone().requires_grad_(requires_grad)
                    torch._dynamo.decorators.mark_unbacked(x_c, 0)
                    s = torch.tensor(start)
                    with mode(), _no_graph_caches():
                        got, ref = compiled(x_c, s, w_c), self.step(x, s, w)
                    msg = f"{name} n={n} start={start}"
                    self.assertEqual(got.dtype, ref.dtype, msg=msg)
                    self.assertEqual(got.requires_grad, ref.requires_grad, msg=msg)
                    tol = {"atol": 0.1, "rtol": 2e-2} if ref.dtype == torch.bfloat16 else {}
                    self.assertEqual(got, ref, msg=msg, **tol)
                    if ref.requires_grad:
                        got.sum().backward()
                        ref.sum().backward()
                        self.assertEqual(x_c.grad, x.grad, msg=msg)
                        self.assertEqual(w_c.grad, w.grad, msg=msg)
                # Dynamo guards the sign of its backed start: one graph per sign
                self.assertEqual(counter.frame_count, 2, msg=name)

    def test_start_out_of_range_is_refused_at_run_time(self):
        # a window past the end, which eager refuses: the graph asserts it at run time with
        # its own symbol for the start rather than reading Dynamo's
        torch._dynamo.reset()
        compiled = torch.compile(self.step, backend="inductor", fullgraph=True)
        w = torch.randn(3, 4)
        for n, start in ((6, 2), (4, 3), (4, -5)):
            x = torch.randn(n, 3)
            torch._dynamo.decorators.mark_unbacked(x, 0)
            with _no_graph_caches():
                if start == 2:
                    self.assertEqual(compiled(x, torch.tensor(start), w),
                                     self.step(x, torch.tensor(start), w))
                    continue
                with self.assertRaises((IndexError, RuntimeError)):
                    self.step(x, torch.tensor(start), w)
                with self.assertRaisesRegex(RuntimeError, r"u\d+.* <= .*u\d+"):
                    compiled(x, torch.tensor(start), w)

    def test_assert_on_an_input_size_is_still_emitted(self):
        # a runtime assert that mixes an input's backed size with an unbacked one binds the
        # backed symbol from that input: Inductor still emits it, and it still refuses
        def f(x, y):
            torch._check(x.size(0) <= y.size(0))
            return x.sum() + y.sum()

        torch._dynamo.reset()
        compiled = torch.compile(f, backend="inductor", fullgraph=True)
        x, y = torch.randn(3), torch.randn(5)
        torch._dynamo.decorators.mark_dynamic(x, 0)
        torch._dynamo.decorators.mark_unbacked(y, 0)
        with _no_graph_caches():
            self.assertEqual(compiled(x, y), f(x, y))
            x, y = torch.randn(4), torch.randn(2)
            torch._dynamo.decorators.mark_dynamic(x, 0)
            torch._dynamo.decorators.mark_unbacked(y, 0)
            with self.assertRaisesRegex(RuntimeError, r"s\d+ <= u\d+"):
                compiled(x, y)


class TestSliceScatterUnbackedBounds(TestCase):
    """slice_scatter whose bounds have an unknown sign: an unbacked start from a size
    (y.size(0) - 3, negative where y is short). The lowering wrapped a negative start and
    asked its sign (GuardOnDataDependentSymNode: u1 - 3 < 0); where the sign is unknown it
    now runs ATen's kernel, which wraps as eager does."""

    MODES = TestNormUnbackedBatch.MODES

    @staticmethod
    def narrow_step(x, y):
        # the backward of narrow is a slice_scatter with the same bounds
        return x.narrow(0, y.size(0) - 3, 2).sin() * y.sum()

    @staticmethod
    def scatter_step(x, y):
        start = y.size(0) - 3
        return torch.slice_scatter(x, x[start:].cos(), 0, start) * 2

    def test_modes_match_eager(self):
        # one compile per mode and step, replayed with the start at 1, at -2 (y of 1), at 0,
        # at 3 far from the first: values, dtype, requires_grad and the input's gradient
        cases = ((6, 4), (6, 1), (2, 3), (5, 6), (40, 6))
        for step in (self.narrow_step, self.scatter_step):
            for name, (mode, requires_grad) in self.MODES.items():
                with self.subTest(step=step.__name__, mode=name):
                    torch._dynamo.reset()
                    counter = CompileCounterWithBackend("inductor")
                    compiled = torch.compile(step, backend=counter, fullgraph=True)
                    for n, m in cases:
                        x = torch.randn(n, 3, requires_grad=requires_grad)
                        y = torch.randn(m)
                        x_c = x.detach().clone().requires_grad_(requires_grad)
                        torch._dynamo.decorators.mark_unbacked(x_c, 0)
                        torch._dynamo.decorators.mark_unbacked(y, 0)
                        with mode(), _no_graph_caches():
                            got, ref = compiled(x_c, y), step(x, y)
                        msg = f"{step.__name__} {name} n={n} m={m}"
                        self.assertEqual(got.dtype, ref.dtype, msg=msg)
                        self.assertEqual(got.requires_grad, ref.requires_grad, msg=msg)
                        tol = {"atol": 0.1, "rtol": 2e-2} if ref.dtype == torch.bfloat16 else {}
                        self.assertEqual(got, ref, msg=msg, **tol)
                        if ref.requires_grad:
                            got.sum().backward()
                            ref.sum().backward()
                            self.assertEqual(x_c.grad, x.grad, msg=msg)
                    self.assertEqual(counter.frame_count, 1, msg=msg)  # one graph serves all

    def test_known_sign_keeps_the_fused_kernel(self):
        # a start whose sign is known (a non-negative size) is still lowered to a pointwise
        # kernel, not to ATen's
        def step(x, y):
            return torch.slice_scatter(x, x[:2].cos(), 0, y.size(0), y.size(0) + 2)

        x, y = torch.randn(8, 3), torch.randn(3)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        torch._dynamo.decorators.mark_unbacked(y, 0)
        torch._dynamo.reset()
        with _no_graph_caches():
            got, (code,) = run_and_get_code(
                torch.compile(step, backend="inductor", fullgraph=True), x, y)
        self.assertEqual(got, step(x, y))
        calls = [ln for ln in code.splitlines() if not ln.lstrip().startswith("#")]
        self.assertFalse([ln for ln in calls if "aten.slice_scatter" in ln])


class TestConvUnbacked(TestCase):
    """Convolutions over unbacked sizes (issue 28 item 3): without hints the fake kernel reported
    a contiguous output where the CPU kernel returns channels-last (Inductor lays conv2d inputs
    out channels-last), and the lowering asked guarding hints of a conv1d's strides."""

    MODES = TestNormUnbackedBatch.MODES

    @staticmethod
    def conv2d(x, w):
        return F.conv2d(x, w, padding=1).relu() * 2

    @staticmethod
    def conv1d(x, w):
        return F.conv1d(x, w, padding=1).relu() * 2

    @staticmethod
    def conv_transpose2d(x, w):
        return F.conv_transpose2d(x, w, stride=2).relu()

    @staticmethod
    def conv2d_channels_last_weight(x, w):
        return F.conv2d(x, w.contiguous(memory_format=torch.channels_last)).sin()

    def _replay(self, step, input_shape, weight_shape, unbacked, sizes=(3, 1, 2, 0, 17)):
        # one compile per mode, replayed at every size: dtype, requires_grad, shape, strides
        # (of a non-empty output: an empty one's are not checked, here nor by Inductor) and
        # values as eager's, and the input's gradient. Triton's interpreter (the Triton path
        # on CPU) computes tl.dot of bf16 operands wrongly: there bf16 values are not compared.
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        for name, (mode, requires_grad) in self.MODES.items():
            with self.subTest(step=step.__name__, mode=name):
                torch._dynamo.reset()
                counter = CompileCounterWithBackend("inductor")
                compiled = torch.compile(step, backend=counter, fullgraph=True)
                w = torch.randn(weight_shape)
                for n in sizes:
                    msg = f"{step.__name__} {name} n={n}"
                    x = torch.randn(input_shape(n), requires_grad=requires_grad)
                    x_c = x.detach().clone().requires_grad_(requires_grad)
                    for dim in unbacked:
                        torch._dynamo.decorators.mark_unbacked(x_c, dim)
                    with mode(), _no_graph_caches():
                        got, ref = compiled(x_c, w), step(x, w)
                    self.assertEqual(got.dtype, ref.dtype, msg=msg)
                    self.assertEqual(got.requires_grad, ref.requires_grad, msg=msg)
                    self.assertEqual(got.shape, ref.shape, msg=msg)
                    if ref.numel():
                        self.assertEqual(got.stride(), ref.stride(), msg=msg)
                    if ref.dtype != torch.bfloat16:
                        self.assertEqual(got, ref, msg=msg)
                    elif not interpreted:
                        self.assertEqual(got, ref, msg=msg, atol=0.1, rtol=2e-2)
                    if ref.requires_grad:
                        got.sum().backward()
                        ref.sum().backward()
                        self.assertEqual(x_c.grad, x.grad, msg=msg, atol=1e-4, rtol=1e-4)
                self.assertEqual(counter.frame_count, 1, msg=name)  # one graph serves all

    def test_modes_match_eager(self):
        self._replay(self.conv2d, lambda n: (n, 5, 6, 7), (4, 5, 3, 3), [0])
        self._replay(self.conv1d, lambda n: (2, 5, n + 1), (4, 5, 3), [2])
        self._replay(self.conv1d, lambda n: (n, 5, n + 4), (4, 5, 3), [0, 2])
        self._replay(self.conv_transpose2d, lambda n: (n, 5, 4, 3), (5, 3, 2, 2), [0])
        self._replay(self.conv2d_channels_last_weight, lambda n: (n, 5, 6, 7), (4, 5, 3, 3), [0])
        # an unbacked height with C * W odd: Eq(15 * u0, 1) cannot be refuted, yet only
        # decides where C = H = W = 1
        self._replay(self.conv2d, lambda n: (2, 3, n + 1, 5), (4, 3, 3, 3), [2])

    def test_every_dim_unbacked_keeps_eager_strides(self):
        # with C, H and W unbacked too, Inductor computes the convolution channels-last
        # and must still return it with eager's contiguous strides (its fake value's order)
        self._replay(self.conv2d, lambda n: (n, 5, n + 2, n + 3), (4, 5, 3, 3), [0, 2, 3])

    def test_every_dim_unbacked_channels_last_aot_eager(self):
        # channels-last input and weight, every dim of both unbacked (the weight's too): the
        # fake output must take its layout without asking is_contiguous of unbacked sizes
        # (a guard on Eq(u0, 0)); stock traces this, with a contiguous fake output
        def conv(x, w, b):
            return F.conv2d(x, w, b, 2, 2, 2, 1)

        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(conv, backend=counter, fullgraph=True)
        for n, size in ((1, 4), (2, 5), (3, 7)):
            x = torch.randn(n, 3, size, size).contiguous(memory_format=torch.channels_last)
            w = torch.randn(3, 3, 3, 3).contiguous(memory_format=torch.channels_last)
            b = torch.randn(3)
            args = [t.clone(memory_format=torch.preserve_format) for t in (x, w, b)]
            for t in args:
                for dim in range(t.dim()):
                    torch._dynamo.decorators.mark_unbacked(t, dim)
            got, ref = compiled(*args), conv(x, w, b)
            self.assertEqual(got, ref)
            self.assertEqual(got.stride(), ref.stride())
        self.assertEqual(counter.frame_count, 1)

    def test_static_and_backed_sizes(self):
        # where no size is unbacked the layouts come from the kernel's own choice, as before
        for dynamic in (False, True):
            for step, x, w in (
                (self.conv2d, torch.randn(3, 5, 6, 7), torch.randn(4, 5, 3, 3)),
                (self.conv1d, torch.randn(3, 5, 9), torch.randn(4, 5, 3)),
            ):
                with self.subTest(step=step.__name__, dynamic=dynamic):
                    torch._dynamo.reset()
                    with _no_graph_caches():
                        got = torch.compile(step, backend="inductor", fullgraph=True,
                                            dynamic=dynamic)(x, w)
                    ref = step(x, w)
                    self.assertEqual(got.stride(), ref.stride())
                    self.assertEqual(got, ref)

    @staticmethod
    def one_channel(x, w):
        # a 1x1 kernel over one channel, padded: channels, height and width all 1 is a
        # size both eager layouts share, where eager answers contiguous
        return F.conv2d(x, w, padding=1).relu() * 2

    @staticmethod
    def _one_channel_input(n, h, w, requires_grad=False):
        # an NHWC image of one channel seen as NCHW: channels-last strides
        return torch.randn(n, h, w, 1).permute(0, 3, 1, 2).requires_grad_(requires_grad)

    def test_one_channel_layout_depends_on_sizes_refused_at_compile_time(self):
        # eager's output is channels-last except at height = width = 1: Inductor refuses
        # to compile it, saying why (stock and 2.15.0 compile it and fail Inductor's stride
        # check at run time wherever the fake layout is not eager's)
        # (a 3x3 weight too, which Inductor lays out channels-last: eager's is contiguous)
        for weight, dims in (((4, 1, 1, 1), (2, 3)), ((4, 1, 3, 3), (0, 2, 3))):
            with self.subTest(weight=weight, dims=dims):
                torch._dynamo.reset()
                x = self._one_channel_input(3, 2, 3)
                for dim in dims:
                    torch._dynamo.decorators.mark_unbacked(x, dim)
                compiled = torch.compile(self.one_channel, backend="inductor", fullgraph=True)
                with _no_graph_caches(), self.assertRaisesRegex(Exception, "Mark a spatial dim"):
                    compiled(x, torch.randn(weight))

    def test_one_channel_min_two_matches_eager(self):
        # a height of at least 2 decides the layout: one graph serves every size, forward
        # and backward, strides included
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("inductor")
        compiled = torch.compile(self.one_channel, backend=counter, fullgraph=True)
        w = torch.randn(4, 1, 1, 1)
        for n, h, wd in ((3, 5, 6), (1, 2, 1), (2, 2, 3), (3, 7, 1)):
            x = self._one_channel_input(n, h, wd, requires_grad=True)
            x_c = x.detach().clone().requires_grad_()
            torch._dynamo.decorators.mark_unbacked(x_c, [0, 3])
            torch._dynamo.decorators.mark_unbacked(x_c, 2, min=2)
            w_c = w.clone().requires_grad_()
            w_e = w.clone().requires_grad_()
            with _no_graph_caches():
                got = compiled(x_c, w_c)
            ref = self.one_channel(x, w_e)
            msg = f"n={n} h={h} w={wd}"
            self.assertEqual(got.stride(), ref.stride(), msg=msg)
            self.assertEqual(got, ref, msg=msg)
            got.sum().backward()
            ref.sum().backward()
            self.assertEqual(x_c.grad, x.grad, msg=msg, atol=1e-4, rtol=1e-4)
            self.assertEqual(w_c.grad, w_e.grad, msg=msg, atol=1e-4, rtol=1e-4)
        self.assertEqual(counter.frame_count, 1)

    def _train_3d(self, module, dtype, sizes, channels_last_weight=False, threads=None):
        # training steps of a 3-d convolution over a channels_last_3d input whose batch is
        # unbacked, compiled once by Inductor: output, input and weight gradients as eager's.
        # The CPU kernel that runs depends on the batch and dtype (oneDNN returns
        # channels_last_3d where the input or weight suggests it, the slow 3d kernels return
        # contiguous), so Inductor gives the kernel contiguous inputs and returns a
        # contiguous output, where eager's is channels_last_3d at some sizes (stock and
        # 2.15.0 alike): that output's strides are not compared.
        torch.manual_seed(0)
        m = module.to(dtype)
        if channels_last_weight:
            m = m.to(memory_format=torch.channels_last_3d)

        def step(module, x):
            out = module(x)
            out.sum().backward()
            return out

        torch._dynamo.reset()
        counter = CompileCounterWithBackend("inductor")
        compiled = torch.compile(m, backend=counter, fullgraph=True)
        old_threads = torch.get_num_threads()
        try:
            if threads:
                torch.set_num_threads(threads)
            for n in sizes:
                msg = f"{module} {dtype} n={n}"
                x = torch.randn(n, 2, 5, 6, 3, dtype=dtype).contiguous(
                    memory_format=torch.channels_last_3d)
                x_c = x.clone().requires_grad_()
                x.requires_grad_()
                torch._dynamo.decorators.mark_unbacked(x_c, 0)
                m.zero_grad()
                with _no_graph_caches():
                    got = step(compiled, x_c)
                got_w = m.weight.grad.clone()
                m.zero_grad()
                ref = step(m, x)
                self.assertEqual(got.dtype, ref.dtype, msg=msg)
                self.assertEqual(got.shape, ref.shape, msg=msg)
                self.assertEqual(got, ref, msg=msg, atol=1e-4, rtol=1e-4)
                self.assertEqual(x_c.grad, x.grad, msg=msg, atol=1e-4, rtol=1e-4)
                self.assertEqual(got_w, m.weight.grad, msg=msg, atol=1e-3, rtol=1e-4)
        finally:
            torch.set_num_threads(old_threads)
        self.assertEqual(counter.frame_count, 1)  # one graph serves all

    def test_conv3d_training_steps_channels_last_input(self):
        # stock runs these; a fake backward that called its outputs channels_last_3d for
        # the unbacked batch failed Inductor's stride check where the slow 3d kernel runs:
        # float32 at a batch of 1, float64 at every batch, 1x1x1 kernels on one thread
        self._train_3d(torch.nn.Conv3d(2, 4, 3, padding=1), torch.float32, (3, 1, 2, 5))
        self._train_3d(torch.nn.Conv3d(2, 4, 3, padding=1), torch.float64, (3, 1, 2))
        self._train_3d(torch.nn.ConvTranspose3d(2, 4, 3, padding=1), torch.float32, (3, 1))
        self._train_3d(torch.nn.Conv3d(2, 4, 1), torch.float32, (3, 1), threads=1)

    def test_conv3d_channels_last_weight_training_steps(self):
        # a model converted to channels_last_3d: the backward's layout follows the weight's
        # too, which Inductor now gives the kernel in the order it declares (stock and
        # 2.15.0 fail the stride check wherever the slow 3d kernel runs)
        for dtype, sizes in ((torch.float64, (3, 1)), (torch.float32, (3, 1, 2))):
            self._train_3d(torch.nn.Conv3d(2, 4, 3, padding=1), dtype, sizes,
                           channels_last_weight=True)


class TestTensorSplitUnbacked(TestCase):
    """tensor_split into a number of sections over an unbacked size: the kernel gave the
    first size % sections sections one more element by a guard on that remainder; hsplit,
    vsplit and dsplit guarded that the number of sections divides the size."""

    MODES = TestNormUnbackedBatch.MODES

    @staticmethod
    def sections(x):
        # the matmul makes autocast cast; sections along the unbacked dim as rows and
        # as columns (a transposed view), each used
        y = x @ x.new_ones(4, 4)
        rows = torch.tensor_split(y, 3)
        return [*(r * (i + 1) for i, r in enumerate(rows)), torch.tensor_split(y.t(), 2, 1)[1]]

    @staticmethod
    def equal_sections(x):
        # x is [n, 6, 4], n unbacked: vsplit, hsplit and dsplit each split n
        return [
            *torch.vsplit(x, 2),
            *torch.hsplit(x.transpose(0, 1), 2),
            *torch.dsplit(x.permute(1, 2, 0), 2),
        ]

    def _assert_like_eager(self, got, ref, msg):
        # dtype, requires_grad, shape, strides (of a non-empty output) and values, output
        # by output; Triton's interpreter computes tl.dot of bf16 operands wrongly: there
        # bf16 values are not compared
        self.assertEqual(len(got), len(ref), msg=msg)
        for g, r in zip(got, ref):
            self.assertEqual(g.dtype, r.dtype, msg=msg)
            self.assertEqual(g.requires_grad, r.requires_grad, msg=msg)
            self.assertEqual(g.shape, r.shape, msg=msg)
            if r.numel():
                self.assertEqual(g.stride(), r.stride(), msg=msg)
            if r.dtype != torch.bfloat16:
                self.assertEqual(g, r, msg=msg)
            elif os.environ.get("TRITON_INTERPRET") != "1":
                self.assertEqual(g, r, msg=msg, atol=0.1, rtol=2e-2)

    def test_modes_match_eager(self):
        # one compile per mode, replayed at sizes that 3 and 2 do and do not divide, 1 and 0
        for name, (mode, requires_grad) in self.MODES.items():
            with self.subTest(mode=name):
                torch._dynamo.reset()
                counter = CompileCounterWithBackend("inductor")
                compiled = torch.compile(self.sections, backend=counter, fullgraph=True)
                for n in (7, 1, 0, 2, 3, 17):
                    msg = f"{name} n={n}"
                    x = torch.randn(n, 4, requires_grad=requires_grad)
                    x_c = x.detach().clone().requires_grad_(requires_grad)
                    torch._dynamo.decorators.mark_unbacked(x_c, 0)
                    with mode(), _no_graph_caches():
                        got, ref = compiled(x_c), self.sections(x)
                    self._assert_like_eager(got, ref, msg)
                    if ref[0].requires_grad:
                        sum(t.sum() for t in got).backward()
                        sum(t.sum() for t in ref).backward()
                        self.assertEqual(x_c.grad, x.grad, msg=msg, atol=1e-4, rtol=1e-4)
                self.assertEqual(counter.frame_count, 1, msg=name)  # one graph serves all

    def test_equal_sections_match_eager_or_refuse_at_run_time(self):
        # one compile serves every even size; an odd one eager refuses, and so does the graph
        for backend in ("aot_eager", "inductor"):
            with self.subTest(backend=backend):
                torch._dynamo.reset()
                counter = CompileCounterWithBackend(backend)
                compiled = torch.compile(self.equal_sections, backend=counter, fullgraph=True)
                for n in (4, 2, 0, 6, 3, 1, 8):
                    x = torch.randn(n, 6, 4)
                    x_c = x.clone()
                    torch._dynamo.decorators.mark_unbacked(x_c, 0)
                    with _no_graph_caches():
                        if n % 2:
                            with self.assertRaisesRegex(RuntimeError, "not divisible"):
                                self.equal_sections(x)
                            with self.assertRaisesRegex(RuntimeError, r"Mod\(u0, 2\)"):
                                compiled(x_c)
                        else:
                            self._assert_like_eager(
                                compiled(x_c), self.equal_sections(x), f"n={n}"
                            )
                self.assertEqual(counter.frame_count, 1)

    def test_refuses_what_eager_refuses(self):
        # the checks of the kernels, traced symbolically: eager's error and message
        cases = [
            (lambda x: torch.tensor_split(x.sum(), 2), (5, 4)),
            (lambda x: torch.tensor_split(x, 0), (5, 4)),
            (lambda x: torch.tensor_split(x, -1, 1), (5, 4)),
            (lambda x: torch.tensor_split(x, 2, 2), (5, 4)),
            (lambda x: torch.tensor_split(x, 0, 5), (5, 4)),  # the dim is checked first
            (lambda x: torch.hsplit(x.sum(), 2), (5, 4)),
            (lambda x: torch.hsplit(x, 0), (5, 4)),
            (lambda x: torch.vsplit(x.sum(0), 2), (5, 4)),
            (lambda x: torch.dsplit(x, 2), (5, 4)),
            (lambda x: torch.vsplit(x, 2), (5, 4)),
        ]
        for i, (fn, shape) in enumerate(cases):
            with self.subTest(case=i):
                x = torch.randn(shape)
                with self.assertRaises(Exception) as eager:
                    fn(x)
                with self.assertRaises(type(eager.exception)) as traced:
                    make_fx(fn, tracing_mode="symbolic")(x)
                self.assertEqual(str(traced.exception), str(eager.exception))

    def test_static_sizes_split_as_eager(self):
        # no size symbolic: the same sections, views of the input at eager's offsets
        x = torch.randn(7, 6, 4)
        gm = make_fx(lambda t: torch.tensor_split(t, 3, 1))(x)
        for got, ref in zip(gm(x), torch.tensor_split(x, 3, 1), strict=True):
            self.assertEqual(got.shape, ref.shape)
            self.assertEqual(got.stride(), ref.stride())
            self.assertEqual(got.storage_offset(), ref.storage_offset())
            self.assertEqual(got, ref)

    def test_backed_sizes_take_the_kernel(self):
        # where no size is unbacked, the C++ kernel runs as on stock: its guards answered by
        # hints (here size % 4 == 2), no sym_min per section, one graph per remainder
        for fn in (lambda t: torch.tensor_split(t, 4), lambda t: torch.vsplit(t, 2)):
            gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(10, 3))
            self.assertNotIn("sym_min", gm.code)
            guards = [str(g.expr) for g in gm.shape_env.guards]
            self.assertTrue([g for g in guards if "Mod" in g], msg=str(guards))
            for n in (10, 2, 14):
                x = torch.randn(n, 3)
                for got, ref in zip(gm(x), fn(x), strict=True):
                    self.assertEqual(got, ref)


MODES = {
    "grad": (contextlib.nullcontext, True),
    "autocast_bf16": (lambda: torch.autocast("cpu", dtype=torch.bfloat16), False),
    "no_grad": (torch.no_grad, True),
    "inference_mode": (torch.inference_mode, True),
}


def _tensors(tree):
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


class _ReplayTestCase(TestCase):
    """One graph per backend and mode, every marked size unbacked, replayed at sizes chosen to
    break it; each result as eager's: shape, dtype, strides, requires_grad, values, and the
    inputs' gradients."""

    BACKENDS = ("aot_eager", "inductor")

    def assert_like_eager(self, got, ref, msg):
        self.assertEqual(len(_tensors(got)), len(_tensors(ref)), msg=msg)
        for g, r in zip(_tensors(got), _tensors(ref)):
            self.assertEqual((g.shape, g.dtype, g.requires_grad),
                             (r.shape, r.dtype, r.requires_grad), msg=msg)
            if r.numel() > 1 and r.is_contiguous():
                self.assertEqual(g.stride(), r.stride(), msg=msg)
            tol = {"atol": 0.1, "rtol": 2e-2} if r.dtype == torch.bfloat16 else {}
            self.assertEqual(g, r, msg=msg, equal_nan=True, **tol)

    def replay(self, fn, make, sizes, unbacked, modes=MODES, backends=BACKENDS):
        """``make(n)`` gives fn's arguments at size ``n``; ``unbacked[i]`` the dims of argument
        ``i`` marked unbacked (each its own symbol). The first size is the trace's."""
        for backend in backends:
            for name, (mode, grad) in modes.items():
                torch._dynamo.reset()
                compiled = torch.compile(fn, backend=backend, fullgraph=True)
                for n in sizes:
                    msg = f"{backend} {name} n={n}"
                    args = make(n)
                    if grad:
                        args = [a.requires_grad_() if a.is_floating_point() else a for a in args]
                    copies = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
                    for a, dims in zip(copies, unbacked):
                        for d in dims:
                            torch._dynamo.decorators.mark_unbacked(a, d)
                    with mode(), _no_graph_caches():
                        got, ref = compiled(*copies), fn(*args)
                    self.assert_like_eager(got, ref, msg)
                    outs = [r for r in _tensors(ref) if r.requires_grad]
                    if outs and name == "grad":
                        sum(g.sum() for g in _tensors(got) if g.requires_grad).backward()
                        sum(r.sum() for r in outs).backward()
                        for a, c in zip(args, copies):
                            if a.requires_grad:
                                self.assertEqual(c.grad, a.grad, msg=f"{msg} grad",
                                                 atol=1e-4, rtol=1e-4)

    def assert_refused_at_run_time(self, fn, ok, bad, unbacked, error=RuntimeError,
                                   message="", values=True):
        """``fn`` compiled once (aot_eager, fullgraph), the dims ``unbacked[i]`` of argument
        ``i`` marked unbacked: on ``ok`` eager's result (its shape where ``values`` is False:
        fn draws random numbers); on ``bad`` eager raises ``error`` matching ``message``, and
        the graph raises where it runs."""
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        for args in (ok, bad):
            for a, dims in zip(args, unbacked):
                for d in dims:
                    torch._dynamo.decorators.mark_unbacked(a, d)
        got, ref = compiled(*ok), fn(*ok)
        self.assertEqual(got if values else got.shape, ref if values else ref.shape)
        with self.assertRaisesRegex(error, message):
            fn(*bad)
        with self.assertRaises((RuntimeError, AssertionError)):
            compiled(*bad)


class TestLossTargetSizeUnbacked(_ReplayTestCase):
    """Losses of an input and a target whose sizes are unbacked, each its own symbol: the
    target-size warning of mse/l1/huber/smooth_l1 guarded Eq(u1, u0), the size check of the
    binary cross entropies too; the warning now says only what is known, the check is a
    runtime assertion."""

    LOSSES = {
        "mse": F.mse_loss,
        "l1": F.l1_loss,
        "huber": F.huber_loss,
        "smooth_l1": F.smooth_l1_loss,
        "bce": lambda x, t: F.binary_cross_entropy(torch.sigmoid(x), t),
        "bce_logits": F.binary_cross_entropy_with_logits,
    }

    def test_losses_match_eager(self):
        def losses(x, t):
            return [loss(x, t) for loss in self.LOSSES.values()]

        self.replay(losses, lambda n: [torch.randn(n, 3), torch.rand(n, 3)], (4, 1, 0, 7, 129),
                    [(0, 1), (0, 1)], modes={"grad": MODES["grad"]})

    def test_reductions_and_modes(self):
        def losses(x, t):
            return (F.mse_loss(x, t, reduction="none"), F.l1_loss(x, t, reduction="sum"),
                    F.binary_cross_entropy_with_logits(x, t, reduction="none"))

        self.replay(losses, lambda n: [torch.randn(n, 5), torch.rand(n, 5)], (3, 1, 2, 13),
                    [(0,), (0,)])

    def test_other_target_size_is_refused_at_run_time(self):
        # the graph traced for equal unbacked sizes asserts them when it runs: eager raises
        # ValueError for the binary cross entropies; the mse graph refuses what eager would
        # broadcast with a warning (no silent broadcast)
        for loss in (F.binary_cross_entropy_with_logits, F.mse_loss):
            torch._dynamo.reset()
            compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
            x, t, other = torch.randn(4, 3), torch.rand(4, 3), torch.rand(5, 3)
            for a in (x, t, other):
                torch._dynamo.decorators.mark_unbacked(a, 0)
            self.assertEqual(compiled(x, t), loss(x, t))
            with self.assertRaisesRegex(AssertionError, "size"):
                compiled(x, other)

    def test_static_sizes_warn_and_script_as_before(self):
        with self.assertWarnsRegex(UserWarning, "target size"):
            F.mse_loss(torch.randn(3, 1), torch.randn(3, 2))
        with self.assertRaisesRegex(ValueError, "must be the same as input size"):
            F.binary_cross_entropy_with_logits(torch.randn(3), torch.rand(4))
        for module in (torch.nn.MSELoss(), torch.nn.BCEWithLogitsLoss(), torch.nn.BCELoss()):
            x, t = torch.rand(4, 3), torch.rand(4, 3)
            self.assertEqual(torch.jit.script(module)(x, t), module(x, t))
        with self.assertRaisesRegex(torch.jit.Error, "must be the same as input size"):
            torch.jit.script(torch.nn.BCEWithLogitsLoss())(torch.randn(3), torch.rand(4))


class TestCrossEntropyUnbacked(_ReplayTestCase):
    """cross_entropy over unbacked batch, class and spatial sizes: ATen's composite asked every
    size whether a target has the input's shape (Eq(u0, u2)), nll_loss_nd whether the input is
    empty (u1*u2 > 0). Traced, the composites are Python's: the size checks are runtime checks
    and the answers are ATen's, probability targets, label smoothing, a class weight and an
    ignored index included."""

    def test_class_index_and_probability_targets(self):
        weight = torch.rand(5)

        def losses(x, idx, prob):
            return (F.cross_entropy(x, idx), F.cross_entropy(x, prob),
                    F.cross_entropy(x, idx, weight=weight, reduction="sum"),
                    F.cross_entropy(x, prob, weight=weight, reduction="none"),
                    F.cross_entropy(x, idx, label_smoothing=0.1, ignore_index=2),
                    F.cross_entropy(x, prob, label_smoothing=0.2),
                    F.cross_entropy(x, idx, weight=weight, label_smoothing=0.3))

        self.replay(losses, lambda n: [torch.randn(n, 5), torch.randint(0, 5, (n,)),
                                       torch.rand(n, 5).softmax(1)],
                    (4, 1, 0, 7, 129), [(0,), (0,), (0,)], modes={"grad": MODES["grad"]})

    def test_spatial_dims_and_modes(self):
        # (batch, classes, sequence): nll_loss_nd flattens the sequence
        def losses(x, idx, prob):
            return (F.cross_entropy(x, idx), F.cross_entropy(x, idx, reduction="none"),
                    F.cross_entropy(x, prob, reduction="sum"))

        self.replay(losses, lambda n: [torch.randn(2, 3, n), torch.randint(0, 3, (2, n)),
                                       torch.rand(2, 3, n)],
                    (5, 1, 0, 2, 13), [(0, 2), (0, 1), (0, 2)])

    def test_other_target_size_is_refused_at_run_time(self):
        torch._dynamo.reset()
        compiled = torch.compile(F.cross_entropy, backend="aot_eager", fullgraph=True)
        x, t, other = torch.randn(4, 3), torch.rand(4, 3), torch.rand(5, 3)
        for a in (x, t, other):
            torch._dynamo.decorators.mark_unbacked(a, 0)
        self.assertEqual(compiled(x, t), F.cross_entropy(x, t))
        # loud, as in TestLossTargetSizeUnbacked: Dynamo's guard on the asserted equality fails
        # before the graph's own assertion runs (stock cannot compile)
        with self.assertRaises((RuntimeError, AssertionError)):
            compiled(x, other)

    def test_static_sizes_trace_as_before(self):
        # guard: with sizes known, the traced tensor ops are ATen's composite's and the values
        # eager's (TorchScript and eager run ATen's own composite)
        x, idx, prob = torch.randn(4, 5), torch.randint(0, 5, (4,)), torch.rand(4, 5)
        g = make_fx(lambda x, t: F.cross_entropy(x, t), tracing_mode="symbolic")(x, prob)
        ops = [str(n.target) for n in g.graph.nodes
               if n.op == "call_function" and str(n.target).startswith("aten.")
               and not str(n.target).startswith("aten.sym_")]
        self.assertExpectedInline(" ".join(ops), """aten._log_softmax.default aten.mul.Tensor aten.sum.default aten.neg.default aten.div.Scalar""")
        self.assertEqual(g(x, prob), F.cross_entropy(x, prob))
        w = torch.rand(5)
        def weighted(kwargs):
            return lambda x, t, w: F.cross_entropy(x, t, weight=w, **kwargs)

        for kwargs in ({}, {"label_smoothing": 0.1}, {"ignore_index": 1}):
            loss = weighted(kwargs)
            g = make_fx(loss, tracing_mode="symbolic")(x, idx, w)
            self.assertEqual(g(x, idx, w), loss(x, idx, w))


class TestLinearCrossEntropyUnbacked(_ReplayTestCase):
    """F.linear_cross_entropy over unbacked batch, feature and class sizes, each its own symbol:
    its size checks were branches on them (`in_features != linear_weight.shape[-1]` guarded
    Ne(u0, u2), and a target was taken as class probabilities where its shape equals the
    logits'). They are conditions now, checked where the graph runs: only a target of the logits'
    dims can be one of probabilities, as in eager."""

    @staticmethod
    def losses(x, w, b, idx, prob):
        weight = torch.linspace(0.5, 1.5, 5)
        return (F.linear_cross_entropy(x, w, idx),
                F.linear_cross_entropy(x, w, prob, linear_bias=b, reduction="none"),
                F.linear_cross_entropy(x, w, idx, linear_bias=b, weight=weight,
                                       reduction="sum", label_smoothing=0.1),
                F.linear_cross_entropy(x, w, idx, ignore_index=2),
                F.linear_cross_entropy(x, w, prob, label_smoothing=0.2))

    @staticmethod
    def make(n):
        return [torch.randn(n, 6), torch.randn(5, 6), torch.randn(5),
                torch.randint(0, 5, (n,)), torch.rand(n, 5).softmax(1)]

    def test_modes_match_eager(self):
        self.replay(self.losses, self.make, (4, 1, 0, 7, 129),
                    [(0, 1), (), (), (0,), (0, 1)])

    def test_other_sizes_are_refused_at_run_time(self):
        torch._dynamo.reset()
        compiled = torch.compile(F.linear_cross_entropy, backend="aot_eager", fullgraph=True)

        def marked(*args):
            for a in args:
                for d in range(a.dim()):
                    torch._dynamo.decorators.mark_unbacked(a, d)
            return args

        x, w, prob = marked(torch.randn(4, 6), torch.randn(5, 6), torch.rand(4, 5))
        self.assertEqual(compiled(x, w, prob), F.linear_cross_entropy(x, w, prob))
        for args in (marked(x, torch.randn(5, 7), prob), marked(x, w, torch.rand(3, 5)),
                     marked(x, w, torch.rand(4, 6))):
            with self.assertRaises((RuntimeError, AssertionError)):
                compiled(*args)

    def test_static_and_backed_sizes_as_before(self):
        # guard: eager's errors and messages; no runtime assertion in a graph of known or
        # backed sizes
        with self.assertRaisesRegex(RuntimeError, "expected equal input and linear_weight last "
                                    r"dimensions \(in_features\), got 6 and 7"):
            F.linear_cross_entropy(torch.randn(4, 6), torch.randn(5, 7), torch.zeros(4).long())
        with self.assertRaisesRegex(RuntimeError, r"expected linear_bias shape \(5,\), got \(4,\)"):
            F.linear_cross_entropy(torch.randn(4, 6), torch.randn(5, 6), torch.zeros(4).long(),
                                   linear_bias=torch.randn(4))
        with self.assertRaisesRegex(RuntimeError, "ignore_index cannot be specified"):
            F.linear_cross_entropy(torch.randn(4, 6), torch.randn(5, 6), torch.rand(4, 5),
                                   ignore_index=1)
        args = self.make(4)
        for mode in ("real", "symbolic"):
            g = make_fx(self.losses, tracing_mode=mode)(*args)
            asserts = [n for n in g.graph.nodes if "assert" in str(n.target)]
            self.assertEqual(asserts, [], msg=mode)
            self.assertEqual(g(*args), self.losses(*args))


class TestTakeAlongDimUnbacked(_ReplayTestCase):
    """torch.take_along_dim over unbacked sizes (a MoE router's top-k gathered back): ATen's
    composite read the sizes as ints to broadcast input and indices against each other, which
    specialized an unbacked one (u0). Traced, the same broadcasts and gather with symbolic sizes,
    indices from the end wrapped as ATen wraps them."""

    @staticmethod
    def gathers(x, idx, row):
        return (torch.take_along_dim(x, idx, 1), torch.take_along_dim(x, row, 1),
                torch.take_along_dim(x, idx, -1).sum(1))

    @staticmethod
    def make(n):
        return [torch.randn(n, 8), torch.randint(-8, 8, (n, 3)), torch.randint(0, 8, (1, 5))]

    def test_modes_match_eager(self):
        self.replay(self.gathers, self.make, (4, 1, 0, 7, 129), [(0,), (0,), ()])

    def test_known_sizes_run_atens(self):
        # guard: without an unbacked size the traced ops are ATen's composite's
        args = self.make(4)
        for mode in ("real", "symbolic"):
            g = make_fx(self.gathers, tracing_mode=mode)(*args)
            self.assertNotIn("aten.where", {str(n.target) for n in g.graph.nodes}, msg=mode)
            self.assertEqual(g(*args), self.gathers(*args))


class TestTensordotUnbacked(_ReplayTestCase):
    """tensordot and inner over unbacked batch and contracted sizes, each its own symbol: ATen's
    tensordot asked each contracted pair whether a size is 1 (to sum it right away, a
    broadcast), which guarded (Eq(u3, 1)), and inner checked the last sizes with C++'s ==
    (Eq(u0, u1)). Traced, a pair not known to be 1 is a runtime check of equal sizes."""

    @staticmethod
    def products(x, y, v, w):
        return (torch.tensordot(x, y, dims=([1, 2], [0, 1])), torch.tensordot(x, y, dims=2),
                torch.inner(x, v), torch.tensordot(x, w, dims=([2], [0])))

    @staticmethod
    def make(n):
        # x (batch, 3, length) against y (3, length, 4); w's contracted size is a static 1
        return [torch.randn(n, 3, n + 1), torch.randn(3, n + 1, 4), torch.randn(5, n + 1),
                torch.randn(1, 2)]

    def test_modes_match_eager(self):
        self.replay(self.products, self.make, (4, 1, 0, 7, 33), [(0, 2), (1,), (1,), ()])

    def test_a_broadcast_one_is_refused_at_run_time(self):
        # eager sums a contracted size of 1 against any other; the graph traced for unbacked
        # sizes takes them as equal and refuses the broadcast loudly
        torch._dynamo.reset()
        compiled = torch.compile(torch.tensordot, backend="aot_eager", fullgraph=True)

        def marked(x, y):
            torch._dynamo.decorators.mark_unbacked(x, 1)
            torch._dynamo.decorators.mark_unbacked(y, 0)
            return x, y

        x, y = marked(torch.randn(2, 5), torch.randn(5, 3))
        self.assertEqual(compiled(x, y, dims=1), torch.tensordot(x, y, dims=1))
        x, y = torch.randn(2, 5), torch.randn(1, 3)
        self.assertEqual(torch.tensordot(x, y, dims=1), x.sum(1, keepdim=True) @ y)
        with self.assertRaises((RuntimeError, AssertionError)):
            compiled(*marked(x, y), dims=1)

    def test_known_sizes_run_atens(self):
        # guard: without an unbacked size the traced ops are ATen's composite's, no runtime
        # assertion
        args = self.make(4)
        for mode in ("real", "symbolic"):
            g = make_fx(self.products, tracing_mode=mode)(*args)
            targets = {str(n.target) for n in g.graph.nodes}
            self.assertFalse({t for t in targets if "assert" in t}, msg=mode)
            self.assertEqual(g(*args), self.products(*args))


class TestKronUnbacked(_ReplayTestCase):
    """torch.kron over unbacked sizes: ATen's composite read the sizes as ints to interleave
    them, which specialized an unbacked one (u0); traced, the same views and product over
    symbolic sizes."""

    @staticmethod
    def products(a, b, v):
        return torch.kron(a, b), torch.kron(v, b)

    def test_modes_match_eager(self):
        self.replay(self.products,
                    lambda n: [torch.randn(n, 2), torch.randn(3, n + 1), torch.randn(n)],
                    (4, 1, 0, 7, 33), [(0,), (1,), (0,)])


class TestRepeatInterleaveUnbacked(_ReplayTestCase):
    """repeat_interleave by a tensor of counts (tokens repeated per expert) whose size is
    unbacked: ATen's composite checked the counts against the input's size with C++'s ==
    (Eq(u3, u1)); traced, a runtime check. The result's length is data, an unbacked size."""

    @staticmethod
    def repeats(x, counts):
        return (x.repeat_interleave(counts, dim=0), torch.repeat_interleave(x, counts[:1].sum()),
                x.repeat_interleave(2, dim=1), x.t().repeat_interleave(counts, dim=-1))

    @staticmethod
    def make(n):
        return [torch.randn(n, 3), torch.randint(0, 3, (n,))]

    def test_modes_match_eager(self):
        self.replay(self.repeats, self.make, (4, 1, 0, 7, 33), [(0,), (0,)])

    def test_a_single_repeat_against_more_is_refused_at_run_time(self):
        # eager repeats every element by a single count; the graph traced for unbacked sizes
        # takes the counts as one per element and refuses it loudly
        torch._dynamo.reset()
        compiled = torch.compile(torch.repeat_interleave, backend="aot_eager", fullgraph=True)

        def marked(*args):
            for a in args:
                torch._dynamo.decorators.mark_unbacked(a, 0)
            return args

        x, counts = torch.randn(4, 3), torch.tensor([1, 0, 2, 1])
        self.assertEqual(compiled(*marked(x, counts), dim=0), x.repeat_interleave(counts, dim=0))
        x, counts = torch.randn(3, 3), torch.tensor([2])
        self.assertEqual(x.repeat_interleave(counts, dim=0).shape, (6, 3))
        with self.assertRaises((RuntimeError, AssertionError)):
            compiled(*marked(x, counts), dim=0)

    def test_known_sizes_run_atens(self):
        # guard: without an unbacked size the traced ops are ATen's composite's, no runtime
        # assertion from the check
        args = self.make(4)
        g = make_fx(self.repeats)(*args)
        self.assertFalse({n for n in g.graph.nodes if "assert" in str(n.target)})
        self.assertEqual(g(*args), self.repeats(*args))


class TestAdaptivePoolMetaMemoryFormatUnbacked(_ReplayTestCase):
    """adaptive_max_pool2d and the adaptive 2-d poolings' backwards over unbacked sizes: their
    metas laid out the result with ``new_empty(...).to(memory_format=...)``, whose ``to`` asks
    eager's is_contiguous and guarded (u0 > 1); the result is now allocated in that layout."""

    @staticmethod
    def pools(x, y):
        return (F.adaptive_max_pool2d(x, (2, 3), return_indices=True),
                F.adaptive_avg_pool2d(y, (3, 2)))

    @staticmethod
    def make(n):
        x = torch.randn(n, n + 2, 5, n + 3).to(memory_format=torch.channels_last)
        return [x, torch.randn(2, n + 1, n + 4, 6)]

    def test_modes_match_eager(self):
        self.replay(self.pools, self.make, (4, 1, 0, 7, 33), [(0, 1, 3), (1, 2)],
                    backends=("aot_eager",))

    def test_inductor_matches_eager(self):
        self.replay(self.pools, self.make, (4, 1, 7), [(0, 1, 3), (1, 2)],
                    modes={"grad": MODES["grad"]}, backends=("inductor",))

    def test_channels_last_result_strides(self):
        # the layout eager picks for a channels-last input, strides compared (replay compares
        # them only for contiguous results)
        torch._dynamo.reset()
        compiled = torch.compile(self.pools, backend="aot_eager", fullgraph=True)
        x, y = self.make(5)
        for d in (0, 1, 3):
            torch._dynamo.decorators.mark_unbacked(x, d)
        got, ref = compiled(x, y), self.pools(x, y)
        for g, r in zip(_tensors(got), _tensors(ref)):
            self.assertEqual(g.stride(), r.stride())


class TestPoolingCeilModeLastWindowUnbacked(_ReplayTestCase):
    """Pooling in ceil_mode where a stride and padding as wide as the kernel may leave the last
    window outside the input: the meta asked whether it does ((o - 1)*s >= L + p) of an
    unbacked L, and Inductor's pooling_size kept that window (a larger result than eager's).
    Both now count the windows that start inside, min(o, (L + p - 1) // s + 1): what ATen's
    test gives."""

    @staticmethod
    def pools(x):
        return (F.max_pool2d(x, 3, stride=3, padding=1, ceil_mode=True),
                F.avg_pool2d(x, 2, stride=3, padding=1, ceil_mode=True),
                F.max_pool2d(x, (3, 2), stride=(4, 3), padding=1, ceil_mode=True,
                             return_indices=True))

    def test_modes_match_eager(self):
        # every remainder of the size by the strides: the last window inside, and outside
        self.replay(self.pools, lambda n: [torch.randn(2, 3, n, n + 5)],
                    (7, 1, 2, 3, 4, 5, 6, 8, 13, 34), [(2, 3)], modes={"grad": MODES["grad"]})
        self.replay(self.pools, lambda n: [torch.randn(2, 3, n, n + 5)], (7, 1, 2, 9),
                    [(2, 3)], backends=("aot_eager",))

    def test_known_sizes_unchanged(self):
        # guard: static sizes take ATen's test as before, and eager's shapes
        x = torch.randn(2, 3, 7, 12)
        g = make_fx(self.pools)(x)
        self.assertEqual([tuple(t.shape) for t in _tensors(g(x))],
                         [tuple(t.shape) for t in _tensors(self.pools(x))])


class TestPoolingCompositesUnbacked(_ReplayTestCase):
    """The pooling composites ATen writes in C++ over unbacked sizes: adaptive_avg_pool2d/3d
    asked whether every output size is 1 (Eq(u2, 1), an input's size passed as None),
    adaptive_max_pool1d and max_pool1d that a size is not 0 (u1 > 0, Ne(u0, 0)); traced, the
    pooling kernel where the answer is unknown, and runtime checks."""

    @staticmethod
    def pools(x, y, z):
        return (F.adaptive_avg_pool2d(x, (None, 3)), F.adaptive_avg_pool2d(x, (None, 1)),
                F.adaptive_avg_pool3d(z, (None, 2, None)),
                F.adaptive_max_pool1d(y, 3, return_indices=True),
                F.max_pool1d(y, 3, stride=2), F.max_pool1d(y, 2, return_indices=True))

    @staticmethod
    def make(n):
        x = torch.randn(2, 3, n, n + 4).to(memory_format=torch.channels_last)
        return [x, torch.randn(n, 3, n + 5), torch.randn(1, 2, n, 3, n + 1)]

    def test_modes_match_eager(self):
        self.replay(self.pools, self.make, (4, 1, 7, 33), [(2, 3), (0, 2), (2, 4)],
                    backends=("aot_eager",))
        self.replay(self.pools, self.make, (4, 1, 7), [(2, 3), (0, 2), (2, 4)],
                    modes={"grad": MODES["grad"]}, backends=("inductor",))

    def test_output_size_one_takes_means_values_and_layout(self):
        # at an output size of 1 eager takes a mean (channels-last strides set by hand); the
        # graph, traced without knowing it is 1, pools: the same values and strides
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: F.adaptive_avg_pool2d(x, (None, 1)),
                                 backend="aot_eager", fullgraph=True)
        for make in (lambda n: torch.randn(2, 3, n, 5).to(memory_format=torch.channels_last),
                     lambda n: torch.randn(3, n, 5)):
            for n in (4, 1):  # traced at 4
                x = make(n)
                ref = F.adaptive_avg_pool2d(x, (None, 1))
                c = x.clone()
                torch._dynamo.decorators.mark_unbacked(c, c.dim() - 2)
                got = compiled(c)
                self.assertEqual(got, ref)
                self.assertEqual(got.stride(), ref.stride())

    def test_empty_sizes_refused_at_run_time(self):
        # eager refuses an empty non-batch size; so does the graph when it runs
        torch._dynamo.reset()
        for pool in (lambda y: F.adaptive_max_pool1d(y, 3), lambda y: F.max_pool1d(y, 2)):
            compiled = torch.compile(pool, backend="aot_eager", fullgraph=True)
            y = torch.randn(2, 3, 0)
            with self.assertRaises(RuntimeError):
                pool(y)
            torch._dynamo.decorators.mark_unbacked(y, 2)
            with self.assertRaises((RuntimeError, AssertionError)):
                compiled(y)

    def test_known_sizes_run_atens(self):
        # guard: without an unbacked size (backed symbols here) the traced ops are ATen's
        # composites', no runtime assertion from the checks
        args = self.make(4)
        g = make_fx(self.pools, tracing_mode="symbolic")(*args)
        self.assertFalse({n for n in g.graph.nodes if "assert" in str(n.target)})
        self.assertEqual(g(*args), self.pools(*args))


class TestAdaptiveMaxPoolKeptSizesUnbacked(_ReplayTestCase):
    """adaptive_max_pool2d/3d keeping an unbacked input size (a None output size): ATen's
    schema takes the output sizes as int[], so the kept size was specialized (u2). A kept dim's
    windows hold one element each: the other dims pool with each kept index apart, and the
    indices are the input's own flat indices, ties (here many) broken as ATen's kernel does."""

    @staticmethod
    def pools(x, z):
        return (F.adaptive_max_pool2d(x, (None, 3), return_indices=True),
                F.adaptive_max_pool2d(x, (None, None)),
                F.adaptive_max_pool3d(z, (2, None, 3), return_indices=True),
                F.adaptive_max_pool3d(z, (None, 2, None), return_indices=True),
                F.adaptive_max_pool3d(z[0], (None, None, None), return_indices=True))

    @staticmethod
    def make(n):
        x = torch.randn(2, 3, n, n + 4).to(memory_format=torch.channels_last)
        return [x, torch.randint(0, 3, (2, 3, n + 1, n, 5)).float()]

    def test_modes_match_eager(self):
        self.replay(self.pools, self.make, (4, 1, 7, 33), [(2, 3), (0, 2, 3)],
                    backends=("aot_eager",))
        self.replay(self.pools, self.make, (4, 1, 7), [(2, 3), (0, 2, 3)],
                    modes={"grad": MODES["grad"]}, backends=("inductor",))

    def test_empty_kept_size_refused_at_run_time(self):
        # eager refuses an empty non-batch size; so does the graph when it runs
        self.assert_refused_at_run_time(lambda z: F.adaptive_max_pool3d(z, (None, 2, 2)),
                                        [torch.randn(2, 3, 4, 5)], [torch.randn(2, 0, 4, 5)],
                                        [(1,)])

    def test_known_sizes_run_atens_op(self):
        # guard: where no kept size is symbolic the traced op is ATen's own
        g = make_fx(self.pools)(*self.make(4))
        targets = {str(n.target) for n in g.graph.nodes if n.op == "call_function"}
        self.assertIn("aten.adaptive_max_pool3d.default", targets)
        self.assertNotIn("aten.arange.start_step", targets)
        self.assertNotIn("aten.arange.default", targets)


class TestFractionalMaxPoolUnbacked(_ReplayTestCase):
    """fractional_max_pool2d/3d over unbacked sizes: an output ratio made int[] output sizes of
    them (TruncToInt(0.5*ToFloat(u1)) specialized), and the C++ metas of fractional_max_pool3d
    and of both backwards read the sizes as ints (u0). Traced, the same windows from the same
    samples, each picked as ATen's kernel picks (ties, a NaN)."""

    @staticmethod
    def pools(x, z, c2, c3):
        s2, s3 = c2.to(x.dtype) / 997, c3.to(z.dtype) / 997
        return (F.fractional_max_pool2d(x, 2, output_ratio=(0.5, 0.7), return_indices=True,
                                        _random_samples=s2),
                F.fractional_max_pool2d(x, (3, 2), output_size=(2, 3), _random_samples=s2),
                F.fractional_max_pool3d(z, 2, output_ratio=(0.6, 0.5, 0.5), return_indices=True,
                                        _random_samples=s3),
                F.fractional_max_pool3d(z[0], (1, 2, 2), output_size=(2, 2, 1),
                                        _random_samples=s3[:1]))

    @staticmethod
    def make(n):
        x = torch.randint(0, 3, (2, 3, n + 4, n + 5)).float()
        x[0, 0, 0, 0] = float("nan")
        return [x, torch.randn(2, 2, n + 3, n + 4, 5), torch.randint(0, 997, (2, 3, 2)),
                torch.randint(0, 997, (2, 2, 3))]

    def test_modes_match_eager(self):
        self.replay(self.pools, self.make, (4, 1, 7, 33), [(0, 2, 3), (0, 2, 3)],
                    backends=("aot_eager",))
        self.replay(self.pools, self.make, (4, 1), [(0, 2, 3), (0, 2, 3)],
                    modes={"grad": MODES["grad"]}, backends=("inductor",))

    def test_pool_too_large_refused_at_run_time(self):
        # a window of 3 does not fit in 2 rows
        self.assert_refused_at_run_time(
            lambda x: F.fractional_max_pool2d(x, 3, output_ratio=(0.5, 0.5)),
            [torch.randn(2, 8, 8)], [torch.randn(2, 2, 8)], [(1,)], values=False)

    def test_known_sizes_run_atens_op(self):
        # guard: without a symbolic size the traced ops are ATen's own
        g = make_fx(self.pools)(*self.make(4))
        targets = {str(n.target) for n in g.graph.nodes if n.op == "call_function"}
        self.assertIn("aten.fractional_max_pool2d.default", targets)
        self.assertIn("aten.fractional_max_pool3d.default", targets)
        self.assertNotIn("aten.gather.default", targets)


class TestInductorInputSizeRuntimeAsserts(TestCase):
    """A step traced with make_fx and compiled by Inductor as it is (a graph trainer's flow):
    the checks on a tensor input's unbacked size, a select's range and the user's
    torch._check, were never emitted (Inductor emitted the asserts of a symbol where a node or
    a SymInt input binds it, and no input of such a graph is a SymInt), so the compiled step
    read past a row where eager raises. They are checked where the graph runs."""

    @staticmethod
    def step(x):
        torch._check(x.size(0) >= 2)
        return x[:, 5] * 2

    def compiled(self):
        from torch._inductor.compile_fx import compile_fx
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import StatelessSymbolicContext
        from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

        shape_env = ShapeEnv()
        fake_mode = FakeTensorMode(shape_env=shape_env)
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.UNBACKED] * 2)
        fake = fake_mode.from_tensor(torch.randn(4, 8), symbolic_context=context)
        with fake_mode:
            gm = make_fx(self.step)(fake)
        insert_deferred_runtime_asserts(gm, shape_env, "step")
        gm.recompile()
        return compile_fx(gm, [fake])

    def test_checks_on_input_sizes_hold_where_the_graph_runs(self):
        compiled = self.compiled()
        for size in ((4, 8), (2, 6), (9, 13)):
            x = torch.randn(size)
            self.assertEqual(compiled(x), self.step(x), msg=str(size))
        for size in ((4, 5), (3, 1), (1, 8)):  # eager raises: a row too short, one row
            x = torch.randn(size)
            with self.assertRaises((IndexError, RuntimeError)):
                self.step(x)
            with self.assertRaises((RuntimeError, AssertionError), msg=str(size)):
                compiled(x)


class TestEmbeddingPaddingIdxUnbacked(_ReplayTestCase):
    """F.embedding with a padding_idx over an unbacked number of rows: its range check (2 <
    u0, -1 >= -u0) guarded. It holds where the graph runs, with eager's AssertionError; a
    negative index counts from the traced number of rows; the padding row gets no gradient."""

    @staticmethod
    def lookups(w, ids):
        return F.embedding(ids, w, padding_idx=2), F.embedding(ids, w, padding_idx=-1)

    @staticmethod
    def make(n):
        return [torch.randn(n + 3, 4), torch.randint(0, n + 3, (2, 5))]

    def test_modes_match_eager(self):
        self.replay(self.lookups, self.make, (4, 1, 7, 33), [(0,), ()], backends=("aot_eager",))
        self.replay(self.lookups, self.make, (4, 1), [(0,), ()],
                    modes={"grad": MODES["grad"]}, backends=("inductor",))

    def test_padding_idx_out_of_range_refused_at_run_time(self):
        ids = torch.tensor([0, 1])
        self.assert_refused_at_run_time(lambda w, ids: F.embedding(ids, w, padding_idx=-4),
                                        [torch.randn(6, 4), ids], [torch.randn(3, 4), ids],
                                        [(0,), ()], AssertionError,
                                        "Padding_idx must be within")


class TestRemoveNoOpsUnbackedBroadcast(_ReplayTestCase):
    """Inductor's joint-graph pass that drops an add of zeros or a multiply by ones compared the
    result's shape with the other operand's by ``!=``: where the zeros broadcast an unbacked
    size the comparison guarded (Eq(u0, 1)) and the compile died. Unknown shapes now keep the
    operation; 2.15.0 behaves that way."""

    @staticmethod
    def broadcasts(x, y):
        n, m = x.shape
        return (torch.zeros(n, 1) + y, y * torch.ones(n, 1), torch.arange(m).view(1, m) + torch.zeros(n, 1),
                x + torch.zeros(n, m))

    def test_matches_eager(self):
        self.replay(self.broadcasts, lambda n: [torch.randn(n, n + 2), torch.randn(1, n + 2)],
                    (3, 1, 8, 33), [(0, 1), (1,)], modes={"grad": MODES["grad"]},
                    backends=("inductor",))


class TestTritonSizeHintsUnbacked(_ReplayTestCase):
    """A Triton kernel's size hints over unbacked sizes are guesses (the fallback per symbol,
    multiplied) that pick block sizes. Three unbacked dims made 2**43 elements, for which the
    config heuristics found no grid a GPU launches and refused the kernel (maxGridSize); the
    guess is now at most 2**31. Only Inductor's Triton path has the heuristics (the C++ path
    passes either way)."""

    @staticmethod
    def kernels(x):
        return x * 2 + 1, x.sum(-1)

    @torch._inductor.config.patch({"triton.autotune_pointwise": False})  # interpreted: slow
    def test_matches_eager(self):
        self.replay(self.kernels, lambda n: [torch.randn(2, n, n + 1, 16)], (3, 1),
                    [(0, 1, 2)], modes={"no_grad": MODES["no_grad"]}, backends=("inductor",))


class TestInterpolateAreaUnbacked(_ReplayTestCase):
    """interpolate(mode="area") of a 3-d input whose length is unbacked: a scale factor's output
    size (TruncToInt(1.7*ToFloat(u2))) went to adaptive_avg_pool1d, whose int[] output size
    specialized it; it is the same 2-d pooling over a size-1 row, which takes a SymInt[]."""

    @staticmethod
    def areas(x):
        return (F.interpolate(x, scale_factor=1.7, mode="area"),
                F.interpolate(x, scale_factor=0.6, mode="area", recompute_scale_factor=True),
                F.interpolate(x, size=5, mode="area"))

    def test_modes_match_eager(self):
        self.replay(self.areas, lambda n: [torch.randn(2, 3, n)], (4, 2, 7, 33), [(0, 2)],
                    backends=("aot_eager",))
        self.replay(self.areas, lambda n: [torch.randn(2, 3, n)], (4, 2, 7), [(0, 2)],
                    modes={"grad": MODES["grad"]}, backends=("inductor",))


class TestAdaptivePoolInductorUnbacked(_ReplayTestCase):
    """Inductor's adaptive 2-d poolings over unbacked sizes: their lowerings read the input's
    sizes as ints to size the windows, and adaptive_max_pool2d's decomposition asked whether
    they divide evenly (Eq(Mod(u2, 3), 0)); an unbacked size now takes ATen's kernel."""

    @staticmethod
    def pools(x):
        return (F.adaptive_avg_pool2d(x, (5, 3)), F.adaptive_max_pool2d(x, (2, 3)),
                F.adaptive_max_pool2d(x, 1, return_indices=True))

    def test_matches_eager(self):
        self.replay(self.pools, lambda n: [torch.randn(2, 3, n, n + 2)], (6, 1, 9, 34),
                    [(2, 3)], modes={"grad": MODES["grad"], "no_grad": MODES["no_grad"]},
                    backends=("inductor",))


class TestSelectDataDependentIndex(TestCase):
    """Selecting by an index computed in the graph (pytorch#186138: ``table[:, t]`` with a 0-d
    tensor ``t``): the capture died (2.13.0: ATen's tuple indexing read the tensor as an int;
    2.14.1, 2.15.0: the index's own symbol, made inside the indexing, was expected among the
    outputs), and Inductor's select read memory at an out-of-range index unchecked where eager
    raises."""

    @staticmethod
    def lookups(table, idx):
        t = idx.sum()
        return table[:, t] * 2, table[t - 1, :, 1], table[t, 2:4]

    def compiled(self, fn, backend):
        torch._dynamo.reset()
        return torch.compile(fn, backend=backend, fullgraph=True)

    @torch._dynamo.config.patch(capture_scalar_outputs=True)
    def test_index_by_computed_0d_tensor_matches_eager(self):
        table = torch.randn(5, 10, 4)
        for backend in ("eager", "aot_eager", "inductor"):
            compiled = self.compiled(self.lookups, backend)
            for idx in ([1, 2], [0, 0], [-3, 1], [2, 2], [-4, 0]):
                idx = torch.tensor(idx)
                with _no_graph_caches():
                    got = compiled(table, idx)
                for g, r in zip(got, self.lookups(table, idx)):
                    self.assertEqual(g, r, msg=f"{backend} {idx.tolist()}", atol=0, rtol=0)
                    self.assertEqual(g.stride(), r.stride())

    @torch._dynamo.config.patch(capture_scalar_outputs=True)
    def test_out_of_range_index_is_refused(self):
        # eager raises IndexError; a compiled select checks the index where the graph runs
        def pick(table, idx):
            return torch.select(table, 1, idx.sum().item()) * 2

        table = torch.randn(4, 10)
        for backend in ("aot_eager", "inductor"):
            compiled = self.compiled(pick, backend)
            self.assertEqual(compiled(table, torch.tensor([1, 2])), pick(table, torch.tensor([1, 2])))
            for bad in ([5, 7], [-20, 5]):
                with self.assertRaises(IndexError):
                    pick(table, torch.tensor(bad))
                with self.assertRaises((IndexError, RuntimeError), msg=f"{backend} {bad}"):
                    compiled(table, torch.tensor(bad))

    def test_static_index_adds_no_check(self):
        # guard: an index known when tracing is checked then, not where the graph runs
        g = make_fx(lambda t: torch.select(t, 1, 3), tracing_mode="symbolic")(torch.randn(4, 10))
        self.assertFalse({n for n in g.graph.nodes if "assert" in str(n.target)})


class TestViewIndexerUnbacked(_ReplayTestCase):
    """Inductor's view of a computed (unrealized) tensor whose dims regroup across an unbacked
    size, the heads split of attention: (L, N, 8) -> (L, N*2, 4). The reshape indexer merged
    the new dims (4, then 2*N) past the old 8 and asserted 8*N == 8 at run time, and Dynamo's
    guard refused the very sizes it traced (1 <= N <= 2). An unproven grouping now falls back
    to a contiguous copy."""

    @staticmethod
    def heads(x):
        y = x * 2 + 1
        return y.view(x.size(0), x.size(1) * 2, 4).transpose(0, 1), y.view(-1, 2, 4)

    def test_inductor_matches_eager(self):
        self.replay(self.heads, lambda n: [torch.randn(n + 2, n, 8)], (3, 1, 6), [(0, 1)],
                    modes={"grad": MODES["grad"], "no_grad": MODES["no_grad"]},
                    backends=("inductor",))


class TestMultiheadAttentionUnbacked(_ReplayTestCase):
    """multi_head_attention_forward over unbacked sizes: its size checks were Python
    comparisons (embed_dim != embed_dim_to_check guarded Ne(u1, 2), key against value shapes,
    the masks' shapes), the packed weights were cut with chunk(3), whose count depends on
    their rows, and the bias_k/bias_v rows were repeated over the batch, whose backward asks
    whether the batch is 0. Traced, the checks hold at run time, chunk's count follows from
    the rows checked to be 3 * embed_dim, and the rows are expanded."""

    @staticmethod
    def mha(**kwargs):
        torch.manual_seed(0)
        return torch.nn.MultiheadAttention(8, 2, **kwargs).eval()

    def test_module_modes_match_eager(self):
        # a batch and sequences of unbacked size, self- and cross-attention with a key
        # padding mask and learned bias rows
        self_attn, cross = self.mha(add_bias_kv=True), self.mha(kdim=5, vdim=3)

        def attend(x, mem, kpm):
            return (self_attn(x, x, x, need_weights=False)[0],
                    cross(x, mem[..., :5], mem[..., 5:], key_padding_mask=kpm))

        def make(n):
            return [torch.randn(n + 1, n, 8), torch.randn(n + 2, n, 8),
                    torch.rand(n, n + 2) > 0.7]

        self.replay(attend, make, (3, 1, 2, 9), [(0, 1), (0, 1), (0, 1)],
                    backends=("aot_eager",))
        self.replay(attend, make, (3, 1, 7), [(0, 1), (0, 1), (0, 1)],
                    modes={"grad": MODES["grad"]}, backends=("inductor",))

    def test_weights_unbacked_match_eager(self):
        # every size unbacked (upstream's method): the weights' rows and columns each their
        # own symbol, equated with the embedding dimension by the checks
        def forward(q, kv, w, b, wo, bk, mask):
            return F.multi_head_attention_forward(
                q, kv, kv, 4, 2, w, b, bk, bk.flip(0), False, 0.0, wo, None,
                attn_mask=mask, need_weights=True)

        def make(n):
            return [torch.randn(n, 3, 4), torch.randn(n + 2, 3, 4), torch.randn(12, 4),
                    torch.randn(12), torch.randn(4, 4), torch.randn(4), torch.randn(n, n + 2)]

        self.replay(forward, make, (3, 1, 6), [(0, 2), (0, 2), (0, 1), (0,), (0, 1), (0,),
                                                (0, 1)], backends=("aot_eager",))

    def test_wrong_sizes_refused_at_run_time(self):
        # eager raises AssertionError (RuntimeError for a mask); the graph traced for unbacked
        # sizes raises when it runs
        def forward(q, w):  # key and value are other tensors: the packed weights are chunked
            return F.multi_head_attention_forward(q, q + 1, q - 1, 4, 2, w, None, None, None,
                                                  False, 0.0, torch.eye(4), None)[0]

        torch._dynamo.reset()
        compiled = torch.compile(forward, backend="aot_eager", fullgraph=True)
        q, w = torch.randn(3, 2, 4), torch.randn(13, 4)
        with self.assertRaisesRegex(AssertionError, "expecting 12 rows of in_proj_weight"):
            forward(q, w)
        torch._dynamo.decorators.mark_unbacked(w, 0)
        with self.assertRaises((RuntimeError, AssertionError)):
            compiled(q, w)

    def test_torchscript_and_tracer_compare_as_before(self):
        # guard: TorchScript and the JIT tracer keep comparing sizes in Python, with eager's
        # errors and messages
        m = self.mha(kdim=5, vdim=3)
        x, k, v = torch.randn(3, 2, 8), torch.randn(6, 2, 5), torch.randn(6, 2, 3)
        scripted = torch.jit.script(m)
        self.assertEqual(scripted(x, k, v)[0], m(x, k, v)[0])
        for f in (m, scripted):
            with self.assertRaisesRegex(Exception, r"2D attn_mask is .*3, 2.*should be \(3, 6\)"):
                f(x, k, v, attn_mask=torch.randn(3, 2))
        with self.assertRaisesRegex(AssertionError, "was expecting embedding dimension of 9"):
            F.multi_head_attention_forward(x, x, x, 9, 1, torch.randn(24, 8), None, None, None,
                                           False, 0.0, torch.eye(8), None)
        traced = torch.jit.trace(m, (x, k, v))
        self.assertEqual(traced(x, k, v)[0], m(x, k, v)[0])


class TestFeatureAndAlphaDropoutUnbacked(TestCase):
    """dropout2d/3d, alpha_dropout and feature_alpha_dropout over unbacked sizes: ATen's
    composite returns an empty input itself and asked input.numel() == 0 (Eq(u0*u1*u2, 0)).
    Traced, ATen's composite op for op, where the emptiness is not known the general path
    runs, exact at 0 elements. Random: each side from the same seed, the same bits."""

    STEPS = {
        "dropout2d": lambda x: F.dropout2d(x, 0.3),
        "dropout3d": lambda x: F.dropout3d(x.unsqueeze(-1), 0.4),
        "alpha_dropout": lambda x: F.alpha_dropout(x, 0.3, True),
        "feature_alpha_dropout": lambda x: F.feature_alpha_dropout(x, 0.2, True),
        "p_1": lambda x: F.dropout2d(x, 1.0),
        "eval": lambda x: F.alpha_dropout(x, 0.5, False),
        "inplace": lambda x: F.dropout2d(x * 1, 0.3, inplace=True),
    }

    def test_modes_match_eager(self):
        # grad: the input's gradient too; without grad mode an input that needs none
        for name, step in self.STEPS.items():
            for mode, (ctx, _) in MODES.items():
                grad = mode == "grad"
                torch._dynamo.reset()
                compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
                for n in (4, 0, 1, 3, 13):
                    msg = f"{name} {mode} n={n}"
                    x = torch.randn(n, 3, n % 4 + 2, requires_grad=grad)
                    x_c = x.detach().clone().requires_grad_(grad)
                    torch._dynamo.decorators.mark_unbacked(x_c, 0)
                    torch._dynamo.decorators.mark_unbacked(x_c, 2)
                    with ctx(), _no_graph_caches():
                        torch.manual_seed(n)
                        ref = step(x)
                        torch.manual_seed(n)
                        got = compiled(x_c)
                    self.assertEqual((got.shape, got.stride(), got.dtype, got.requires_grad),
                                     (ref.shape, ref.stride(), ref.dtype, ref.requires_grad),
                                     msg=msg)
                    self.assertEqual(got, ref, msg=msg, atol=0, rtol=0)
                    if grad:
                        got.sum().backward()
                        ref.sum().backward()
                        self.assertEqual(x_c.grad, x.grad, msg=msg, atol=0, rtol=0)

    def test_empty_input_needing_grad_without_grad_mode_is_refused(self):
        # eager's result is then the input itself, which needs grad; a graph's cannot be
        compiled = torch.compile(self.STEPS["dropout2d"], backend="aot_eager", fullgraph=True)
        x = torch.randn(0, 3, 4, requires_grad=True)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        with torch.no_grad(), self.assertRaisesRegex(RuntimeError, r"Ne\(.*, 0\)"):
            compiled(x)

    def test_static_sizes_trace_as_before(self):
        # guard: sizes known, ATen's composite's ops (TorchScript and eager run ATen's own)
        def ops(step, x):
            g = make_fx(step, tracing_mode="symbolic")(x)
            return " ".join(str(n.target) for n in g.graph.nodes
                            if n.op == "call_function" and str(n.target).startswith("aten."))

        x = torch.randn(2, 3, 4)
        self.assertExpectedInline(ops(self.STEPS["dropout2d"], x), """aten.sym_size.int aten.sym_size.int aten.new_empty.default aten.bernoulli_.float aten.div_.Scalar aten.mul.Tensor""")
        self.assertExpectedInline(ops(self.STEPS["alpha_dropout"], x), """aten.empty_like.default aten.bernoulli_.float aten.add.Scalar aten.mul_.Scalar aten.add_.Scalar aten.mul_.Scalar aten.mul.Tensor aten.add_.Tensor""")
        self.assertExpectedInline(ops(self.STEPS["p_1"], x), """aten.zeros.default aten.mul.Tensor""")
        self.assertExpectedInline(ops(self.STEPS["eval"], x), """""")


class TestGroupNormUnbacked(_ReplayTestCase):
    """group_norm over unbacked batch, channel and spatial sizes: ATen's composite checked
    that the channels divide into the groups by guarding (Eq(Mod(u0, 2), 0)); traced, the
    check is a runtime assertion and the rest is ATen's, op for op."""

    def test_modes_match_eager(self):
        def fn(x, w, b):
            return F.group_norm(x, 2, w, b), F.group_norm(x, 4)

        self.replay(fn, lambda n: [torch.randn(n, 4, n + 2), torch.randn(4), torch.randn(4)],
                    (3, 1, 0, 7, 33), [(0, 2), (), ()])

    def test_unbacked_channels(self):
        def fn(x, w):
            return F.group_norm(x, 3, w)

        self.replay(fn, lambda n: [torch.randn(2, 3 * n, 5), torch.randn(3 * n)], (2, 1, 5),
                    [(1,), (0,)], modes={"grad": MODES["grad"]})
        # channels the groups do not divide: eager raises, the graph's assertion too
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        x, w = torch.randn(2, 4, 5), torch.randn(4)
        torch._dynamo.decorators.mark_unbacked(x, 1)
        torch._dynamo.decorators.mark_unbacked(w, 0)
        with self.assertRaisesRegex(RuntimeError, "divisible by num_groups"):
            fn(x, w)
        with self.assertRaisesRegex(RuntimeError, "Runtime assertion failed"):
            compiled(x, w)


class TestIndexFillUnbacked(_ReplayTestCase):
    """index_fill over unbacked sizes: the ref compared its result's strides with the input's
    to keep them (Eq(Max(1, u1), u1)); strides not known to be equal are now copied, the same
    values and the input's strides, as eager."""

    def test_modes_match_eager(self):
        def fn(x, idx):
            return x.index_fill(1, idx, -1.0), x.t().index_fill(0, idx, 2.0) * 1

        self.replay(fn, lambda n: [torch.randn(n, 5), torch.tensor([0, 3])], (4, 1, 0, 7, 33),
                    [(0, 1), ()])

    def test_strides_of_a_transposed_input(self):
        def fn(x, idx):
            return x.t().index_fill(0, idx, -1.0)

        for backend in self.BACKENDS:
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=backend, fullgraph=True)
            for n in (4, 1, 7):
                x, idx = torch.randn(n, 6), torch.tensor([0, 2])
                torch._dynamo.decorators.mark_unbacked(x, 0)
                torch._dynamo.decorators.mark_unbacked(x, 1)
                got, ref = compiled(x, idx), fn(x, idx)
                self.assertEqual((got.stride(), got), (ref.stride(), ref))


class TestTrapezoidUnbackedSamples(_ReplayTestCase):
    """trapz/trapezoid over an unbacked sample count: ATen's composite asked the count
    whether it is 0 (Eq(u1, 0)); traced, no size is asked where it is not known, and no
    samples integrate to 0, ATen's answer."""

    def test_modes_match_eager(self):
        def fn(y, x):
            return (torch.trapezoid(y, x), torch.trapz(y, dx=0.5),
                    torch.trapezoid(y, dim=0), torch.trapz(y, x.unsqueeze(0).expand_as(y)))

        self.replay(fn, lambda n: [torch.randn(3, n), torch.rand(n).cumsum(0)],
                    (4, 1, 2, 7, 33), [(1,), (0,)])

    def test_no_samples(self):
        # 0 samples integrate to eager's 0 where no grad is needed; with grad, eager's 0
        # needs none and the graph's would: refused at run time, loudly
        def fn(y, x):
            return torch.trapezoid(y, x), torch.trapz(y, dx=0.5)

        make = lambda n: [torch.randn(3, n), torch.rand(n).cumsum(0)]  # noqa: E731
        modes = {k: v for k, v in MODES.items() if k != "grad"}
        self.replay(fn, make, (4, 0, 3), [(1,), (0,)], modes=modes)
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        for n in (4, 0):
            y, x = (t.requires_grad_() for t in make(n))
            torch._dynamo.decorators.mark_unbacked(y, 1)
            torch._dynamo.decorators.mark_unbacked(x, 0)
            if n:
                self.assertEqual(compiled(y, x), fn(y, x))
            else:
                with self.assertRaisesRegex(RuntimeError, "Runtime assertion failed"):
                    compiled(y, x)

    def test_static_sizes_trace_as_before(self):
        # guard: with sizes known the traced tensor ops are ATen's composite's, in its order
        y, x = torch.randn(3, 5), torch.rand(5).cumsum(0)
        for f in (lambda y, x: torch.trapezoid(y, dx=0.5), lambda y, x: torch.trapz(y, x)):
            g = make_fx(f, tracing_mode="symbolic")(y, x)
            ops = [str(n.target) for n in g.graph.nodes if n.op == "call_function"
                   and str(n.target).startswith("aten.") and "sym_" not in str(n.target)]
            with self.subTest(ops=ops):
                self.assertIn(ops, (
                    ["aten.select.int", "aten.select.int", "aten.add.Tensor", "aten.mul.Scalar",
                     "aten.sum.dim_IntList", "aten.sub.Tensor", "aten.mul.Scalar"],
                    ["aten.view.default", "aten.slice.Tensor", "aten.slice.Tensor",
                     "aten.sub.Tensor", "aten.slice.Tensor", "aten.slice.Tensor",
                     "aten.add.Tensor", "aten.mul.Tensor", "aten.sum.dim_IntList",
                     "aten.div.Scalar"]))
                self.assertEqual(g(y, x), f(y, x))


class TestPadCircularUnbacked(_ReplayTestCase):
    """Circular padding over unbacked sizes: ATen's composite checked that the padding wraps
    around at most once (1 <= u1) by guarding; traced, the checks are runtime checks and the
    copies ATen's, with a convolution of circular padding as a model has it."""

    def test_modes_match_eager(self):
        conv = torch.nn.Conv1d(3, 4, 3, padding=1, padding_mode="circular")

        def fn(x, y):
            return (conv(x), F.pad(y, (1, 2, 2, 1), mode="circular"),
                    F.pad(y, (-1, 1, 0, 2), mode="circular"))

        self.replay(fn, lambda n: [torch.randn(n, 3, n + 2), torch.randn(2, 3, n + 2, n + 1)],
                    (4, 1, 2, 7, 33), [(0, 2), (2, 3)])

    def test_padding_past_the_size_is_refused_at_run_time(self):
        torch._dynamo.reset()
        compiled = torch.compile(lambda y: F.pad(y, (2, 2), mode="circular"),
                                 backend="aot_eager", fullgraph=True)
        y = torch.randn(1, 2, 3)
        torch._dynamo.decorators.mark_unbacked(y, 2)
        self.assertEqual(compiled(y), F.pad(y, (2, 2), mode="circular"))
        y = torch.randn(1, 2, 1)
        torch._dynamo.decorators.mark_unbacked(y, 2)
        with self.assertRaisesRegex(RuntimeError, "wrapping around more than once"):
            F.pad(y, (2, 2), mode="circular")
        # loud, as in TestLossTargetSizeUnbacked: Dynamo's guard on the checked size fails
        # before the graph's own assertion runs (stock cannot compile)
        with self.assertRaises((RuntimeError, AssertionError)):
            compiled(y)


class TestSumToSizeUnbacked(_ReplayTestCase):
    """sum_to_size of a tensor whose sizes are unbacked (a gradient reduced to a broadcast
    parameter's shape): ATen's composite asked each size whether it is 1 (Ne(1, u0)); traced,
    expandability is a runtime check and a dim summed to 1 is summed unless known to be 1."""

    def test_modes_match_eager(self):
        def fn(x, b):
            return x.sum_to_size(b.shape), x.sum_to_size(1, x.shape[1], 1), x.sum_to_size(())

        # float64: Inductor sums in another order
        self.replay(fn, lambda n: [torch.randn(n, n + 2, 3, dtype=torch.float64),
                                   torch.randn(1, 3)], (4, 1, 0, 2, 7, 33), [(0, 1), ()])

    def test_static_sizes_trace_as_before(self):
        # guard: with sizes known the traced ops are ATen's composite's
        x = torch.randn(3, 4, 5)
        def to(size):
            return lambda x: x.sum_to_size(size)

        for size, want in (((4, 1), ["aten.sum.dim_IntList", "aten.view.default"]),
                           ((1, 4, 5), ["aten.sum.dim_IntList"]), ((), ["aten.sum.default"])):
            g = make_fx(to(size), tracing_mode="symbolic")(x)
            ops = [str(n.target) for n in g.graph.nodes if n.op == "call_function"
                   and str(n.target).startswith("aten.") and "sym_" not in str(n.target)]
            self.assertEqual(ops, want)
            self.assertEqual(g(x), x.sum_to_size(size))


class TestLocalResponseNormUnbacked(_ReplayTestCase):
    """local_response_norm over unbacked sizes asked whether the input is empty
    (Eq(u0*u1, 0)); where that is not known the general path runs, which serves an empty
    batch, and an empty channel or spatial dim is refused at run time."""

    def test_modes_match_eager(self):
        # (a 4-D or larger input views its trailing dims as -1: an empty one is refused at
        # run time, loudly)
        def fn(x):
            return F.local_response_norm(x, 3), F.local_response_norm(x * 2, 2)

        make = lambda n: [torch.randn(n, 5, n + 2, dtype=torch.float64)]  # noqa: E731
        self.replay(fn, make, (4, 1, 0, 2, 7, 33), [(0, 2)], modes={"grad": MODES["grad"]})
        # without grad mode eager's empty result is the input itself, which needs grad; the
        # graph's would not: an empty input is refused there, at run time
        modes = {k: v for k, v in MODES.items() if k != "grad"}
        self.replay(fn, make, (4, 1, 2, 7), [(0, 2)], modes=modes)

    def test_empty_spatial_dim_is_refused_at_run_time(self):
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: F.local_response_norm(x, 2), backend="aot_eager",
                                 fullgraph=True)
        for n in (3, 0):
            x = torch.randn(2, 4, n)
            torch._dynamo.decorators.mark_unbacked(x, 2)
            if n:
                self.assertEqual(compiled(x), F.local_response_norm(x, 2))
            else:
                self.assertEqual(F.local_response_norm(x, 2).shape, x.shape)  # eager: x
                # loud: the graph's assertion, or Dynamo's guard on it first
                with self.assertRaises((RuntimeError, AssertionError)):
                    compiled(x)

    def test_script_and_static_sizes_as_before(self):
        module = torch.nn.LocalResponseNorm(2)
        scripted = torch.jit.script(module)
        for x in (torch.randn(2, 4, 5), torch.randn(0, 4, 5), torch.randn(2, 4, 0)):
            self.assertEqual(scripted(x), module(x))
        x = torch.randn(2, 4, 0)
        self.assertIs(F.local_response_norm(x, 2), x)


class TestMaskedUnbackedMask(_ReplayTestCase):
    """torch.masked reductions with a mask whose sizes are unbacked symbols of their own:
    _input_mask compared the shapes (Eq(u1, u0)); where that is undecided the mask is now
    broadcast to the input, a no-op for equal shapes."""

    def test_masked_ops_match_eager(self):
        def step(x, mask):
            return (torch.masked.sum(x, 1, mask=mask), torch.masked.softmax(x, 1, mask=mask),
                    torch.masked.amax(x, 0, mask=mask), torch.masked.logsumexp(x, 1, mask=mask))

        def make(n):
            return [torch.randn(n, 4), torch.rand(n, 4) > 0.3]

        self.replay(step, make, (3, 1, 2, 7, 129), [(0, 1), (0, 1)],
                    modes={"grad": MODES["grad"], "no_grad": MODES["no_grad"]})


class TestPoolCeilModeUnbacked(_ReplayTestCase):
    """Pooling with ceil_mode over unbacked sizes: whether the last window starts past the input
    guarded (2*((u1//2)) - 2 >= u1); the output size now says both cases."""

    @staticmethod
    def step(x):
        return (F.max_pool2d(x, 3, 2, 1, ceil_mode=True), F.avg_pool2d(x, 2, 2, ceil_mode=True),
                F.avg_pool1d(x.flatten(2), 3, 3, ceil_mode=True),
                F.max_pool3d(x.unsqueeze(1), 2, 2, ceil_mode=True))

    @staticmethod
    def make(n):
        return [torch.randn(n % 3 + 1, 3, n, n % 5 + 2)]

    def test_modes_match_eager(self):
        sizes, unbacked = (8, 2, 3, 13), [(0, 2, 3)]
        self.replay(self.step, self.make, sizes, unbacked, backends=("aot_eager",))
        no_grad = {k: v for k, v in MODES.items() if k != "grad"}
        self.replay(self.step, self.make, sizes, unbacked, modes=no_grad, backends=("inductor",))

    def test_max_pool_gradients_inductor(self):
        # Inductor's avg_pool2d backward divides a partial ceil_mode window by the whole
        # kernel, static sizes too (stock 2.13.0 and 2.15.0): not a symbolic-size problem
        def step(x):
            return F.max_pool2d(x, 3, 2, 1, ceil_mode=True), F.max_pool3d(x[:, None], 2, 2, ceil_mode=True)

        self.replay(step, self.make, (8, 2, 5), [(0, 2, 3)],
                    modes={"grad": MODES["grad"]}, backends=("inductor",))

    def test_backed_sizes_keep_the_guard(self):
        # where sizes have hints the output size is decided at compile time, as before
        cnt = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(self.step, backend=cnt, dynamic=True, fullgraph=True)
        for n in (8, 9):
            x = torch.randn(2, 3, n, 4)
            self.assert_like_eager(compiled(x), self.step(x), n)
        gm = cnt.graphs[-1]
        self.assertNotIn("sym_ite", gm.code)


class TestShapeChecksUnbacked(_ReplayTestCase):
    """Shape checks of decompositions and meta functions written as Python conditions (``and``,
    ``==`` of shapes, ``all``) guarded on unbacked sizes of separate tensors: nll_loss's
    weight, multilabel_margin_loss's target, take, searchsorted, baddbmm, unfold, max_unpool,
    _chunk_cat. They are symbolic conditions now: decided where the sizes decide them, else
    runtime assertions of the graph."""

    def test_ops_match_eager(self):
        def step(x, w, target, idx, seq, b1, b2):
            # nll_loss takes no gradient for its weight (eager refuses one)
            return (F.nll_loss(x.log_softmax(1), target, weight=w.detach()),
                    F.multilabel_margin_loss(x, target.unsqueeze(1).expand(-1, 5).contiguous()),
                    torch.take(x, idx), torch.searchsorted(seq, x),
                    torch.baddbmm(x.new_zeros(b1.shape[0], b1.shape[1], b2.shape[2]), b1, b2),
                    F.unfold(x[None, None], (2, 2)))

        def make(n):
            return [torch.randn(n, 5), torch.rand(5), torch.randint(0, 5, (n,)),
                    torch.randint(0, 2 * n, (n,)), torch.sort(torch.randn(n, 4)).values,
                    torch.randn(n, 2, 3), torch.randn(n, 3, 4)]

        self.replay(step, make, (4, 2, 3, 7, 13), [(0,), (0,), (0,), (0,), (0, 1), (0,), (0,)],
                    modes={"grad": MODES["grad"], "no_grad": MODES["no_grad"]})

    def test_max_unpool_matches_eager(self):
        def step(x):
            out, idx = F.max_pool2d(x, 2, return_indices=True)
            return F.max_unpool2d(out, idx, 2, output_size=x.shape[-2:])

        self.replay(step, lambda n: [torch.randn(2, 3, n, 6)], (8, 2, 5, 13), [(2,)],
                    modes={"grad": MODES["grad"], "no_grad": MODES["no_grad"]})

    def test_mismatch_is_refused_at_run_time(self):
        # sizes eager refuses are refused when the graph runs, where they were equal at trace
        def step(x, w):
            return F.nll_loss(x, torch.zeros(x.shape[0], dtype=torch.long), weight=w)

        torch._dynamo.reset()
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        x, w, other = torch.randn(3, 4), torch.rand(4), torch.rand(5)
        for a in (x, w, other):
            torch._dynamo.decorators.mark_unbacked(a, a.dim() - 1)
        self.assertEqual(compiled(x, w), step(x, w))
        with self.assertRaises(RuntimeError):
            step(x, other)
        with self.assertRaisesRegex(AssertionError, "size"):
            compiled(x, other)


class TestEmptyAndOneSizeFastPathsUnbacked(_ReplayTestCase):
    """Fast paths for an empty input or a size of 1 guarded on unbacked sizes (Eq(u0*u1, 0)):
    logsumexp, roll, channel_shuffle, addmv, cummax, _chunk_cat's padding and interpolate's
    align_corners scale. A size that may be 0 or 1 takes the general path, made exact there."""

    @staticmethod
    def step(x, v):
        return (torch.logsumexp(x, -1), torch.logsumexp(x, (0, 2), keepdim=True),
                torch.roll(x, 3, 1), torch.roll(x, (1, -2), (0, 2)), torch.roll(x, 5),
                torch.addmv(x.new_ones(x.shape[0]), x.flatten(1), v),
                F.interpolate(x, scale_factor=1.7, mode="linear", align_corners=True))

    @staticmethod
    def make(n):
        return [torch.randn(n, n % 4 + 1, n % 3 + 1), torch.randn((n % 4 + 1) * (n % 3 + 1))]

    @staticmethod
    def one_of_each(x, v):
        return (torch.logsumexp(x, (0, 2), keepdim=True), torch.roll(x, (1, -2), (0, 2)),
                torch.addmv(x.new_ones(x.shape[0]), x.flatten(1), v),
                F.interpolate(x, scale_factor=1.7, mode="linear", align_corners=True))

    def test_modes_match_eager(self):
        # every mode under aot_eager; Inductor's code once for each op's forward and backward
        # (its C++ compile is the cost), the flat roll's forward only (its backward alone
        # compiles for half a minute)
        sizes, unbacked = (4, 0, 1, 3, 13), [(0, 1, 2), (0,)]
        self.replay(self.step, self.make, sizes, unbacked, backends=("aot_eager",))
        self.replay(self.one_of_each, self.make, sizes, unbacked, modes={"grad": MODES["grad"]},
                    backends=("inductor",))
        self.replay(lambda x, v: torch.roll(x, 5), self.make, sizes, unbacked,
                    modes={"no_grad": MODES["no_grad"]}, backends=("inductor",))

    def test_without_grad(self):
        # cummax's backward and _chunk_cat's (it has none) are not part of these fixes
        def step(x):
            return (torch.cummax(x, 1), F.channel_shuffle(x.unsqueeze(1).expand(-1, 2, -1, -1), 2),
                    torch._chunk_cat([x.flatten(1) + 1], 1, 3))

        self.replay(step, lambda n: [torch.randn(n, n % 5 + 1, 3)], (2, 1, 3, 5, 13),
                    [(0, 1)], modes={"no_grad": MODES["no_grad"]})

    def test_known_non_empty_reduced_dim_is_not_padded(self):
        # logsumexp over a static vocabulary of an unbacked batch (a router's z-loss, say):
        # only a reduced dim that may be empty costs the -inf column
        from torch._dynamo.backends.common import aot_autograd

        graphs = []
        backend = aot_autograd(
            fw_compiler=lambda gm, _: graphs.append(gm.code) or gm,
            decompositions=torch._decomp.get_decompositions([torch.ops.aten.logsumexp]))
        torch._dynamo.reset()
        for dims in ((0,), (0, 1)):
            x = torch.randn(6, 5)
            for d in dims:
                torch._dynamo.decorators.mark_unbacked(x, d)
            got = torch.compile(lambda t: torch.logsumexp(t, -1), backend=backend,
                                fullgraph=True)(x)
            self.assertEqual(got, torch.logsumexp(x, -1))
            torch._dynamo.reset()
        self.assertNotIn("cat", graphs[0])
        self.assertIn("cat", graphs[1])

    def test_static_sizes_take_the_fast_paths(self):
        # no size symbolic: the graph is the one stock traces (no sym_max, no padding)
        gm = make_fx(self.step)(torch.randn(2, 3, 4), torch.randn(12))
        self.assertNotIn("sym_max", gm.code)
        self.assertNotIn("aten.cat", gm.code)


class TestSliceEndOfCountsUnbacked(_ReplayTestCase):
    """A slice of an unbacked size up to a sum of data-dependent counts whose sign is known
    only for the sum (EP chunking's ``x[:a + b]``): slice_ bounds the end as Min(a + b, size),
    and SliceView then asked whether that Min is negative (handle_negative_index), which the
    ShapeEnv cannot answer for a Min although it knows each argument's sign. An end of unknown
    sign still wraps as eager's does."""

    @staticmethod
    def step(x, counts):
        a, b = counts.tolist()
        torch._check(a + b >= 0)
        return x[: a + b] * 2, x[a + b :].sum(0), x[: a - b]

    @staticmethod
    def make(n):
        # ends past the size (n=0: 1 > 0), negative (n=5: 2 - 3) and 0
        return [torch.randn(n, 4), torch.tensor([n // 2, (n + 1) // 3 + 1])]

    @torch._dynamo.config.patch(capture_scalar_outputs=True)
    def test_modes_match_eager(self):
        self.replay(self.step, self.make, (6, 0, 1, 5, 131), [(0,), ()])

    def test_start_in_a_slice_of_a_slice(self):
        # a slice's size less a Min of it (torch.diff's second difference over an unbacked
        # length): its start Min(1, u0 - Min(1, u0)) is known non-negative, kept as it is
        from torch._inductor.ir import View

        shape_env = ShapeEnv()
        graph = torch.fx.Graph()
        graph.output(None)
        lowering = GraphLowering(torch.fx.GraphModule({}, graph), shape_env=shape_env)
        u0 = shape_env.create_unbacked_symint()
        torch._check(u0 >= 0)
        size = u0.node.expr - sympy.Min(1, u0.node.expr)
        with V.set_graph_handler(lowering):
            self.assertEqual(View.handle_negative_index(sympy.Min(1, size), size),
                             sympy.Min(1, size))
            self.assertEqual(View.handle_negative_index(sympy.Integer(-1), size), size - 1)


class TestBmmLayoutPolicyUnbacked(_ReplayTestCase):
    """Inductor's bmm lowering of CPU tensors makes an input contiguous unless it already is on
    one of its last two dims; that test compared unbacked sizes (Eq(u1, 1)) and raised, for
    causal SDPA over an unbacked batch and sequence too, on the C++ and the Triton path. A
    layout policy: what is not known counts as not contiguous, and costs one copy."""

    @staticmethod
    def step(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, is_causal=True),
                q @ k.transpose(-1, -2))

    @staticmethod
    def make(n):
        return [torch.randn(n % 3 + 1, 2, n, 8) for _ in range(3)]

    def test_modes_match_eager(self):
        self.replay(self.step, self.make, (8, 1, 0, 5, 17), [(0, 2)] * 3, backends=("inductor",))

    def test_matmul_of_unfolded_windows(self):
        # fp32 windows over an unbacked width (issue 42: Eq(windows, 1) in this test)
        self.replay(lambda x: (x.unfold(1, 3, 2) @ x.new_ones(3, 4)).sum(-1),
                    lambda n: [torch.randn(n % 5 + 1, 2 * n + 3)], (3, 0, 1, 4, 20), [(0, 1)],
                    backends=("inductor",))

    def test_static_sizes_keep_their_layouts(self):
        # no size symbolic: the layouts the lowering chose before, no extra copy
        from torch._inductor.utils import run_and_get_code

        q = torch.randn(2, 8, 16).transpose(1, 2)
        _, (code,) = run_and_get_code(torch.compile(lambda q: q @ q.transpose(1, 2)), q)
        self.assertNotIn("clone", code)
        self.assertEqual(code.count("extern_kernels.bmm"), 1)


class TestMmBackwardLayoutPolicyUnbacked(_ReplayTestCase):
    """MmBackward0 returns an input's gradient column-major where the input is, and asks it with
    C++'s `==` over the input's strides: Eq(u0, 1) raised while tracing the backward of x @ x
    (both dims unbacked) and of a matrix whose contracted width is unbacked (p @ v). A layout
    policy: there, tracing runs mm as a bmm of one batch, whose backward asks nothing."""

    def test_square_matrix_times_itself(self):
        self.replay(lambda x: (x @ x).tanh(), lambda n: [torch.randn(n, n)], (4, 1, 0, 5, 17),
                    [(0, 1)])

    def test_contracted_width_unbacked(self):
        self.replay(lambda p, v: p.softmax(-1) @ v, lambda n: [torch.randn(3, n),
                                                                torch.randn(n, 8)],
                    (6, 1, 0, 2, 33), [(1,), (0,)])

    def test_known_layouts_keep_mm(self):
        # guard: where the layout test is known (static strides, a stride known not 1 over an
        # unbacked batch) or backed (guarded on), the graphs keep ATen's mm and its backward
        graphs = []

        def keep(gm, _):
            graphs.append(gm.code)
            return make_boxed_func(gm.forward)

        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        backend = aot_autograd(fw_compiler=keep, bw_compiler=keep)
        marks = torch._dynamo.decorators
        for mark, dims in ((None, ((), ())), (marks.mark_unbacked, ((0,), ())),
                           (marks.mark_dynamic, ((0, 1), (0,)))):
            torch._dynamo.reset()
            graphs.clear()
            y, w = torch.randn(5, 5, requires_grad=True), torch.randn(5, 2, requires_grad=True)
            for t, t_dims in zip((y, w), dims):
                for d in t_dims:
                    mark(t, d)
            torch.compile(lambda y, w: y @ w, backend=backend, fullgraph=True)(y, w).sum().backward()
            self.assertEqual(len(graphs), 2)
            for code in graphs:
                self.assertIn("aten.mm", code)
                self.assertNotIn("aten.bmm", code)


class TestDiffUnbacked(_ReplayTestCase):
    """torch.diff clamps its order to the length first, and ATen asked `n > size(dim)`: a guard
    over an unbacked length (1 > u0). Where that is not known the differences are taken over
    the sequence with n zeros appended, and the first max(size - n, 0) kept."""

    @staticmethod
    def step(x):
        return x.diff(), x.diff(n=3, dim=0)

    @staticmethod
    def make(n):
        return [torch.randn(n, n + 1)]

    def test_modes_match_eager(self):
        self.replay(self.step, self.make, (5, 1, 2, 3, 17), [(0, 1)])
        # length 0 where grad mode is on (the input needs no grad under autocast here)
        modes = {m: MODES[m] for m in ("grad", "autocast_bf16")}
        self.replay(self.step, self.make, (5, 0), [(0, 1)], modes=modes)

    def test_empty_input_needing_grad_without_grad_mode_is_refused(self):
        # eager's result is then the input itself, which needs grad; a graph's cannot be
        compiled = torch.compile(lambda x: x.diff(dim=0), backend="aot_eager", fullgraph=True)
        x = torch.randn(0, 3, requires_grad=True)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        with torch.no_grad(), self.assertRaisesRegex(RuntimeError, r"Ne\(.*, 0\)"):
            compiled(x)

    def test_prepend_append_and_bool(self):
        def step(x, p, a):
            return x.diff(n=2, prepend=p, append=a), (x > 0).diff()

        self.replay(step, lambda n: [torch.randn(2, n), torch.randn(2, n % 2),
                                     torch.randn(2, 1)], (4, 0, 1, 6), [(1,), (1,), ()],
                    backends=("aot_eager",))

    def test_known_lengths_run_atens(self):
        # guard: a length known to cover the order, or backed (guarded on), traces ATen's
        # composite, as before: its narrows of the input, no zeros appended to it
        for x, n in ((torch.randn(3, 4), 2), (torch.randn(3, 5), 2), (torch.randn(3, 4), 5)):
            gm = make_fx(functools.partial(torch.diff, n=n), tracing_mode="symbolic")(x)
            self.assertNotIn("aten.cat", gm.code)
            self.assertEqual(gm(x), x.diff(n=n))


class TestSDPAGroupedQueryUnbackedHeads(_ReplayTestCase):
    """scaled_dot_product_attention with enable_gqa over unbacked head counts: the composite's
    backend checks and the math kernel's key and value repeat compared the query's heads with
    the key's as bools (Eq(u0, u1)). Where the counts are not known to be equal, key and value
    now get the query's heads by an index before the call, which goes on without enable_gqa."""

    @staticmethod
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    @staticmethod
    def make(n, groups=2):
        # n key and value heads, groups * n query heads; sequences of 2n - 1 and 3n - 3
        return [torch.randn(2, groups * n, 2 * n - 1, 8), torch.randn(2, n, 3 * n - 3, 8),
                torch.randn(2, n, 3 * n - 3, 8)]

    def test_modes_match_eager(self):
        self.replay(self.attend, self.make, (2, 1, 3, 7), [(1, 2), (1, 2), (1, 2)],
                    backends=("aot_eager",))

    def test_inductor_matches_eager(self):
        # not a proof of its own: stock 2.15.0, which has the fix, fails it at Inductor's bmm
        # layout policy (0068 in its series)
        self.replay(self.attend, self.make, (2, 1, 3, 7), [(1, 2), (1, 2), (1, 2)],
                    modes={k: MODES[k] for k in ("grad", "autocast_bf16")}, backends=("inductor",))

    def test_equal_heads_and_batch_unbacked(self):
        self.replay(self.attend, lambda n: self.make(n, groups=1), (3, 1, 5),
                    [(0, 1, 2), (0, 1, 2), (0, 1, 2)], modes={"grad": MODES["grad"]},
                    backends=("aot_eager",))

    def test_heads_not_dividing_refused_at_run_time(self):
        self.assert_refused_at_run_time(
            self.attend, self.make(2), [torch.randn(2, 3, 3, 8), *self.make(2)[1:]],
            [(1,), (1,), (1,)], message="must divide the number of heads")


class TestSplitIterationRangesUnbacked(TestCase):
    """SIMDKernel._split_iteration_ranges over an unbacked leftover extent (pytorch#194972): the
    last check asked the leftover's hint whether it is 1 and raised from the ShapeEnv, where a
    leftover that does not tile is CantSplit, which is_compatible (fusion) answers with False."""

    def setUp(self):
        super().setUp()
        self.shape_env = ShapeEnv()
        graph = torch.fx.Graph()
        graph.output(None)
        self.graph = GraphLowering(torch.fx.GraphModule({}, graph), shape_env=self.shape_env)

    def compatible(self, groups, lengths):
        from torch._inductor.codegen.simd import SIMDKernel

        with V.set_graph_handler(self.graph):
            return SIMDKernel.is_compatible(groups, lengths)

    def test_unbacked_leftover_is_not_compatible(self):
        u0 = self.shape_env.create_unbacked_symint()
        torch._check(u0 >= 0)
        self.assertFalse(self.compatible((4 * u0.node.expr, sympy.S.One), [[sympy.Integer(4)], []]))

    def test_static_leftovers(self):
        self.assertTrue(self.compatible((sympy.Integer(4), sympy.S.One), [[sympy.Integer(4)], []]))
        self.assertFalse(self.compatible((sympy.Integer(8), sympy.S.One), [[sympy.Integer(4)], []]))


class TestUserReportsUnbacked(TestCase):
    """Users' reports upstream (issue 44), kept as guards: they pass on every base we carry."""

    def test_slice_to_a_data_dependent_total(self):
        # pytorch#166460: x[:total] with total from .tolist(), then split and padding, failed in
        # Inductor ("failed OrderedSet([]) >= OrderedSet([u8])"); one graph serves other counts
        def step(x, counts):
            c = counts.tolist()
            total = sum(c)
            y = x[:total]
            parts = [p * (i + 1) for i, p in enumerate(torch.split(y, c))]
            return torch.cat([*parts, y.new_zeros(x.shape[0] - total, x.shape[1])])

        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            torch._dynamo.reset()
            counter = CompileCounterWithBackend("inductor")
            compiled = torch.compile(step, backend=counter, fullgraph=True)
            x = torch.randn(16, 4)
            for counts in ([3, 5, 2], [0, 16, 0], [1, 1, 13], [4, 0, 0]):
                counts = torch.tensor(counts)
                self.assertEqual(compiled(x, counts), step(x, counts), msg=str(counts))
            self.assertEqual(counter.frame_count, 1)


if __name__ == "__main__":
    run_tests()
