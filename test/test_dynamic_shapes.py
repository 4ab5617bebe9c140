# Owner(s): ["oncall: pt2"]
import contextlib
import operator
import unittest.mock

import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.testing._internal.common_utils import run_tests, TestCase


def _retrace(gm):
    """FakeTensorProp over ``gm`` again, reusing the fake inputs of its first trace."""
    inputs = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
    FakeTensorProp(gm, detect_fake_mode(inputs)).propagate_dont_convert_inputs(*inputs)


def _only_node(gm, target):
    (node,) = gm.graph.find_nodes(op="call_function", target=target)
    return node


class TestUnbackedRebind(TestCase):
    """rebind_unbacked when a graph is retraced after a pass rewrote a binding node.

    Graph passes (chunking the token grid, say) rewrite a node in place and keep its
    ``meta``, including ``unbacked_bindings``; the next FakeTensorProp then has to tie the
    node's old unbacked symbol to whatever the node produces now.
    """

    def _nonzero_graph(self):
        gm = make_fx(torch.nonzero, tracing_mode="symbolic")(torch.tensor([1, 0, 1, 1, 1]))
        return gm, _only_node(gm, torch.ops.aten.nonzero.default)

    def _item_graph(self):
        def f(t):
            return t.sum().item() + 1

        gm = make_fx(f, tracing_mode="symbolic")(torch.tensor([3, 4]))
        return gm, _only_node(gm, torch.ops.aten._local_scalar_dense.default)

    def test_rebind_size_to_derived_expr_after_pass(self):
        gm, node = self._nonzero_graph()
        (old_u0,) = node.meta["unbacked_bindings"]
        # The pass: compute nonzero() afresh and keep every second row in the old node.
        with gm.graph.inserting_before(node):
            fresh = gm.graph.call_function(torch.ops.aten.nonzero.default, node.args)
        node.target = torch.ops.aten.slice.Tensor
        node.args = (fresh, 0, 0, 2**63 - 1, 2)
        gm.recompile()

        _retrace(gm)

        fresh_rows = fresh.meta["val"].shape[0]
        self.assertEqual(
            str(node.meta["val"].shape[0].node.expr), str(((fresh_rows + 1) // 2).node.expr)
        )
        self.assertNotEqual(str(node.meta["val"].shape[0].node.expr), str(old_u0))
        x = torch.tensor([1, 1, 0, 1, 1, 1, 0])
        self.assertEqual(gm(x), torch.nonzero(x)[::2])

    def test_rebind_item_to_derived_expr_records_replacement(self):
        gm, node = self._item_graph()
        (old_u0,) = node.meta["unbacked_bindings"]
        shape_env = node.meta["val"].node.shape_env
        with gm.graph.inserting_before(node):
            fresh = gm.graph.call_function(torch.ops.aten._local_scalar_dense.default, node.args)
        node.target = operator.floordiv
        node.args = (fresh, 2)
        gm.recompile()

        _retrace(gm)

        new_expr = (fresh.meta["val"] // 2).node.expr
        self.assertEqual(node.meta["val"].node.expr, new_expr)
        # The old symbol is eliminated in favour of the expression, so anything that still
        # refers to it (runtime asserts, metadata of nodes not retraced) reads the new value.
        self.assertEqual(shape_env.simplify(old_u0), new_expr)
        self.assertEqual(gm(torch.tensor([5, 4])), 9 // 2 + 1)

    def test_rebind_to_fresh_symbol_renames(self):
        gm, node = self._nonzero_graph()
        (old_u0,) = node.meta["unbacked_bindings"]

        _retrace(gm)

        # The fresh symbol of the retrace is renamed back to the old one.
        self.assertEqual(node.meta["val"].shape[0].node.expr, old_u0)

    def test_rebind_to_constant_is_discarded(self):
        gm, node = self._item_graph()
        (old_u0,) = node.meta["unbacked_bindings"]
        shape_env = node.meta["val"].node.shape_env
        node.target = operator.floordiv
        node.args = (6, 2)
        gm.recompile()

        _retrace(gm)

        self.assertEqual(node.meta["val"], 3)
        self.assertNotIn(old_u0, shape_env.replacements)


class TestForeignUnbackedTransfer(TestCase):
    """A nested torch.compile region entered from a non-strict make_fx trace
    (as a graph trainer does) receives the outer trace's unbacked values: raw
    SymInts and fake tensors whose sizes carry outer symbols.  Those must be
    taken into the nested ShapeEnv without specializing, keep their sharing,
    and produce guards that hold on the outer values."""

    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    def _trace_non_strict(self, fn, *args):
        # Outer trace: ambient FakeTensorMode with a ShapeEnv, make_fx over
        # its fake inputs, inside the non-strict tracing context.
        import torch._dynamo.config
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        fake_args = [fake_mode.from_tensor(a) for a in args]
        with (
            torch._dynamo.config.patch(force_compile_during_fx_trace=True),
            torch.compiler._non_strict_tracing_context(),
            fake_mode,
        ):
            # The torch-function metadata mode is part of Dynamo's guards on
            # the mode stack and changes with every traced op; keep it out so
            # that cache reuse is observable.
            return make_fx(
                fn, tracing_mode="real", _disable_torch_fn_metadata_mode=True
            )(*fake_args)

    def test_nested_compile_takes_outer_unbacked_symint_and_reuses_it(self):
        from torch._dynamo.testing import CompileCounterWithBackend
        from torch.fx.experimental.symbolic_shapes import (
            free_unbacked_symbols,
            statically_known_true,
        )

        cnt = CompileCounterWithBackend("eager")

        @torch.compile(backend=cnt, fullgraph=True)
        def inner(x, n):
            return x.sum(1) * n + x.shape[1]

        seen = []

        def outer(t, x):
            n = t.item()  # unbacked in the outer ShapeEnv
            torch._check(n >= 0)
            y = x.new_ones(x.shape[0], n)
            a = inner(y, n)
            b = inner(y * 2, n)
            seen.append((n, a.shape, b.shape))
            return a + b

        gm = self._trace_non_strict(outer, torch.tensor(5), torch.randn(3))

        # Compiled once; the second call (a different tensor, same symbolic
        # layout) is served by the same entry, i.e. its guards, which include
        # the stride relation Max(1, u) of y, evaluate on the outer values.
        self.assertEqual(cnt.frame_count, 1)
        (n, a_shape, b_shape), = seen
        self.assertTrue(free_unbacked_symbols(n))
        self.assertEqual(len(a_shape), 1)
        self.assertTrue(statically_known_true(a_shape[0] == b_shape[0]))

        # Inside the region, x.shape[1] and n are one local unbacked symbol.
        phs = {
            node.name.lower(): node.meta["example_value"]
            for node in cnt.graphs[0].graph.nodes
            if node.op == "placeholder"
        }
        x_val, n_val = phs["l_x_"], phs["l_n_"]
        self.assertIsInstance(n_val, torch.SymInt)
        self.assertTrue(free_unbacked_symbols(n_val))
        self.assertEqual(n_val.node.expr, x_val.shape[1].node.expr)

        # The outer graph stays symbolic over the data-dependent value.
        self.assertIn("_local_scalar_dense", gm.code)
        self.assertIn("sym_size", gm.code)

    def test_tensor_dim_and_raw_symint_share_symbols(self):
        # x.shape[1] == n (and a derived m == x.shape[1] + 1) must be
        # decidable inside the region, whichever of the two is wrapped first.
        from torch._dynamo.testing import CompileCounterWithBackend

        cnt = CompileCounterWithBackend("eager")

        @torch.compile(backend=cnt, fullgraph=True)
        def tensor_first(x, n, m):
            if x.shape[1] == n and m == x.shape[1] + 1:
                return x * 2
            return x * 3

        @torch.compile(backend=cnt, fullgraph=True)
        def scalar_first(n, x):
            if n == x.shape[1]:
                return x + 1
            return x - 1

        results = []

        def outer(t, x):
            n = t.item()
            torch._check(n >= 0)
            y = x.new_ones(2, n)
            results.append(tensor_first(y, n, n + 1))
            results.append(scalar_first(n, y))
            return results[0] + results[1]

        gm = self._trace_non_strict(outer, torch.tensor(4), torch.randn(2))
        self.assertEqual(cnt.frame_count, 2)
        # Both regions took the "equal" branch: y * 2 and y + 1.
        self.assertIn("aten.mul.Tensor", gm.code)
        self.assertIn("aten.add.Tensor", gm.code)
        self.assertNotIn("aten.sub.Tensor", gm.code)
        self.assertNotIn(", 3)", gm.code)

    def test_branch_on_transferred_symint_raises_data_dependent_error(self):
        # The value is taken in, but not specialized: branching on it is the
        # ordinary data-dependent error, even with an optimization hint.
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        def fn(n):
            if n > 3:
                return torch.ones(())
            return torch.zeros(())

        compiled = torch.compile(fn, backend="eager", fullgraph=True)
        shape_env = ShapeEnv()
        n = shape_env.create_unbacked_symint()
        shape_env.var_to_hint_override[n.node.expr] = 8
        with self.assertRaisesRegex(
            torch._dynamo.exc.UserError,
            "Could not guard on data-dependent expression",
        ):
            with torch.compiler._non_strict_tracing_context():
                compiled(n)

    def test_branch_on_outer_unbacked_symint_never_specializes(self):
        # Holds before and after the backport: a nested region either refuses
        # the outer unbacked value or raises a data-dependent error; it never
        # picks a branch from a hint.
        from torch._dynamo.testing import CompileCounterWithBackend

        cnt = CompileCounterWithBackend("eager")

        @torch.compile(backend=cnt, fullgraph=True)
        def inner(x, n):
            if n > 3:
                return x + 1
            return x - 1

        def outer(t, x):
            return inner(x, t.item())

        with self.assertRaisesRegex(
            (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError),
            "Attempted to wrap unbacked SymInt"
            "|Could not guard on data-dependent expression",
        ):
            self._trace_non_strict(outer, torch.tensor(5), torch.randn(3))
        self.assertEqual(cnt.frame_count, 0)

    def test_raw_unbacked_symint_of_another_shape_env_compiles_strict(self):
        # strict (fullgraph) Dynamo takes in another trace's unbacked SymInt as non-strict
        # tracing does (pytorch#187547: it refused it); called again, its guards hold
        from torch._dynamo.testing import CompileCounterWithBackend
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        cnt = CompileCounterWithBackend("eager")
        compiled = torch.compile(lambda n: torch.ones((n,)) * 2, backend=cnt, fullgraph=True)
        env = ShapeEnv()
        n = env.create_unbacked_symint()
        self.assertFalse(torch.compiler._is_non_strict_tracing())
        with FakeTensorMode(shape_env=env):
            for _ in range(2):
                self.assertEqual(str(compiled(n).shape), "torch.Size([u0])")
        self.assertEqual(cnt.frame_count, 1)

    def test_max_min_guards_still_evaluate_on_ints(self):
        # Guards over Max/Min of ordinary (backed) sizes keep their meaning on
        # plain ints: pass when they hold, fail (recompile) when they do not.
        from torch._dynamo.testing import CompileCounterWithBackend

        cnt = CompileCounterWithBackend("eager")

        @torch.compile(backend=cnt, dynamic=True)
        def fn(x, y, z):
            hi = torch.sym_max(torch.sym_max(x.shape[0], y.shape[0]), z.shape[0])
            lo = torch.sym_min(x.shape[0], y.shape[0])
            if hi > 6 and lo < 4:
                return x.sum() + 1
            return x.sum() - 1

        def call(a, b, c):
            return fn(torch.ones(a), torch.ones(b), torch.ones(c))

        # Entry 1 guards Max(..) <= 6.
        self.assertEqual(call(2, 3, 5), 1.0)
        self.assertEqual(call(3, 2, 4), 2.0)
        self.assertEqual(cnt.frame_count, 1)
        # Entry 2 guards Max(..) > 6 and Min(..) < 4.
        self.assertEqual(call(2, 9, 3), 3.0)
        self.assertEqual(call(3, 7, 2), 4.0)
        self.assertEqual(cnt.frame_count, 2)
        # Neither holds: recompile.
        self.assertEqual(call(5, 4, 8), 4.0)
        self.assertEqual(cnt.frame_count, 3)
        # Back to entry 1.
        self.assertEqual(call(4, 5, 2), 3.0)
        self.assertEqual(cnt.frame_count, 3)


class TestReplicationPadUnbacked(TestCase):
    """F.pad(mode="replicate") with a negative pad over unbacked sizes (OpInfo
    nn.functional.pad replicate_negative, every dim unbacked): 2.13.0's meta
    combined its output checks with Python `or`, a guard on u >= 1."""

    MODES = {
        "grad": (contextlib.nullcontext, True),
        "no_grad": (torch.no_grad, True),
        "inference_mode": (torch.inference_mode, False),
    }

    @staticmethod
    def step(x):
        return F.pad(x, (-1, 0, 2, -4), mode="replicate") * 2

    def _run(self, fn, mode, x):
        try:
            with mode():
                return fn(x)
        except Exception as e:  # eager's refusal, or the graph's
            return e

    def _replay(self, compiled, mode, requires_grad, shape):
        x = torch.randn(shape, requires_grad=requires_grad)
        x_c = x.detach().clone().requires_grad_(requires_grad)
        for dim in range(4):
            torch._dynamo.decorators.mark_unbacked(x_c, dim)
        ref, got = self._run(self.step, mode, x), self._run(compiled, mode, x_c)
        if isinstance(ref, Exception):
            self.assertIsInstance(got, Exception, msg=f"{shape}")
            return
        self.assertNotIsInstance(got, Exception, msg=f"{shape}")
        self.assertEqual(got, ref, msg=f"{shape}")
        self.assertEqual(got.requires_grad, ref.requires_grad)
        if ref.requires_grad:
            got.sum().backward()
            ref.sum().backward()
            self.assertEqual(x_c.grad, x.grad, msg=f"{shape}")

    def test_negative_pad_matches_eager(self):
        # one compile per backend and mode, every dim unbacked, replayed at
        # shapes with sizes of 1; then at an output width of 0 (2.13.0's eager
        # returns an empty tensor, 2.14 and later refuse) and an output height
        # below 0 (refused): equal to eager, or refused where eager refuses
        # (Dynamo turns a failed size check into a recompile, hence last)
        for backend in ("aot_eager", "inductor"):
            for name, (mode, requires_grad) in self.MODES.items():
                with self.subTest(backend=backend, mode=name):
                    torch._dynamo.reset()
                    counter = CompileCounterWithBackend(backend)
                    compiled = torch.compile(self.step, backend=counter, fullgraph=True)
                    for shape in ((6, 2, 4, 4), (1, 1, 5, 3), (2, 3, 7, 2)):
                        self._replay(compiled, mode, requires_grad, shape)
                    self.assertEqual(counter.frame_count, 1)
                    for shape in ((3, 2, 4, 1), (2, 2, 1, 5)):
                        self._replay(compiled, mode, requires_grad, shape)


class TestOptimizationHintWideExpressions(TestCase):
    """ShapeEnv.optimization_hint of an expression over hundreds of unbacked symbols, with as many
    equalities between unbacked expressions recorded (pytorch#185235: minutes in SymPy's subs,
    from Inductor's heuristics on a wide MoE graph). SymPy's subs rebuilds the expression once per
    key; the hint takes a bounded number of such rebuilds."""

    @staticmethod
    def shape_env(n):
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        env = ShapeEnv()
        a = [env.create_unbacked_symint() for _ in range(n)]
        b = [env.create_unbacked_symint() for _ in range(n)]
        for x in a + b:
            torch._check(x >= 0)
        for i in range(n - 1):  # equalities of expressions: replacements keyed by expressions
            torch._check(a[i] + b[i] == a[i + 1] * 2 + b[i + 1])
        return env, [x.node.expr for x in a], [x.node.expr for x in b]

    @contextlib.contextmanager
    def subs_keys(self):
        """How many keys each sympy subs call was given, while the block runs."""
        import sympy

        seen, subs = [], sympy.Basic.subs

        def counting(expr, *args, **kwargs):
            seen.append(len(args[0]) if args and isinstance(args[0], dict) else 1)
            return subs(expr, *args, **kwargs)

        with unittest.mock.patch.object(sympy.Basic, "subs", counting):
            yield seen

    def test_wide_expression_bounded_substitution(self):
        env, a, b = self.shape_env(300)
        wide = sum((i + 1) * x for i, x in enumerate(a)) + sum(b)
        with self.subs_keys() as seen:
            self.assertEqual(env.optimization_hint(wide, fallback=0), 0)
        self.assertLessEqual(sum(seen), 64, msg=f"subs calls with {sorted(seen)[-3:]} keys")

    def test_narrow_expression_keeps_the_equalities(self):
        # few symbols: the recorded equalities still make the hint consistent with them
        env, a, b = self.shape_env(3)
        lhs, rhs = a[0] + b[0], 2 * a[1] + b[1]
        self.assertEqual(env.optimization_hint(lhs - rhs, fallback=5), 0)
        self.assertEqual(env.optimization_hint(a[0] * 3, fallback=5), 15)


if __name__ == "__main__":
    run_tests()
