# Owner(s): ["module: inductor"]
"""symfix regression tests for collective bucketing with unbacked symbols.

bucketing-isolate-unbacked (pytorch/pytorch#183495) and bucketing-symbolic-sizes
(pytorch/pytorch#183544), both shipped in 2.13.0.  Graphs are traced with make_fx
(tracing_mode="real") over fake inputs on the fake process group, then bucketed with
bucket_all_gather / bucket_reduce_scatter.
"""

import torch
import torch._inductor.fx_passes.bucketing as bucketing
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import free_symbols, ShapeEnv
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore

WORLD_SIZE = 2
_c10d = torch.ops._c10d_functional


def _two_all_gathers(group_name):
    def fn(a, b):
        x = _c10d.wait_tensor(_c10d.all_gather_into_tensor(a, WORLD_SIZE, group_name))
        y = _c10d.wait_tensor(_c10d.all_gather_into_tensor(b, WORLD_SIZE, group_name))
        return x, y

    return fn


def _two_reduce_scatters(group_name):
    def fn(a, b):
        x = _c10d.wait_tensor(
            _c10d.reduce_scatter_tensor(a, "sum", WORLD_SIZE, group_name)
        )
        y = _c10d.wait_tensor(
            _c10d.reduce_scatter_tensor(b, "sum", WORLD_SIZE, group_name)
        )
        return x, y

    return fn


_COLLECTIVES = {
    _c10d.all_gather_into_tensor.default,
    _c10d.all_gather_into_tensor_out.default,
    _c10d.reduce_scatter_tensor.default,
}


class _BucketingMixin:
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._owns_pg = not dist.is_initialized()
        if cls._owns_pg:
            dist.init_process_group(
                "fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE
            )
        cls.group_name = dist.group.WORLD.group_name

    @classmethod
    def tearDownClass(cls):
        if cls._owns_pg:
            dist.destroy_process_group()
        super().tearDownClass()

    def trace(self, make_fn, shape, *, unbacked=True, hint=16):
        """Trace two collectives over inputs of `shape(u0)`.  u0 is treated as bound
        by the outer trace (not pending); `hint` is its optimization hint."""
        self.shape_env = ShapeEnv()
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env)
        with self.fake_mode:
            u0 = self.shape_env.create_unbacked_symint() if unbacked else 16
            if unbacked:
                if hint is not None:
                    self.shape_env.var_to_hint_override[u0.node.expr] = hint
                torch._check(u0 >= 4)
            a, b = torch.randn(*shape(u0)), torch.randn(*shape(u0))
        gm = make_fx(make_fn(self.group_name), tracing_mode="real")(a, b)
        self.shape_env.pending_fresh_unbacked_symbols.clear()
        self.u0 = u0.node.expr if unbacked else None
        return gm

    def bucket(self, gm, pass_fn):
        with self.fake_mode:
            pass_fn(gm)
        gm.graph.lint()

    def collectives(self, gm):
        return [
            n for n in gm.graph.nodes if n.op == "call_function" and n.target in _COLLECTIVES
        ]

    def symbols_in_graph(self, gm):
        syms = set()
        for n in gm.graph.nodes:
            val = n.meta.get("val")
            for v in val if isinstance(val, (list, tuple)) else [val]:
                if isinstance(v, torch.Tensor):
                    syms |= free_symbols(v)
        return syms

    def assert_one_symbolic_bucket(self, gm):
        colls = self.collectives(gm)
        self.assertEqual(len(colls), 1, colls)
        # every size in the merged graph is still an expression in u0 (none became a number)
        for n in gm.graph.nodes:
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor) and n.op != "placeholder":
                self.assertTrue(free_symbols(val) <= {self.u0}, (n, val.shape))
        self.assertEqual(self.symbols_in_graph(gm), {self.u0})
        self.assertEqual(self.shape_env.guards, [])
        self.assertNotIn(self.u0, self.shape_env.replacements)


def _half(u):
    return (u // 2, 4)


def _even(u):
    return (2 * (u // 2), 4)


class TestBucketingSymbolicSizes(_BucketingMixin, TestCase):
    """Semantic sizes stay symbolic; hints only size buckets (pytorch#183544)."""

    # ---- proof

    def test_all_gather_hinted_unbacked(self):
        gm = self.trace(_two_all_gathers, _half)
        self.bucket(gm, bucketing.bucket_all_gather)
        self.assert_one_symbolic_bucket(gm)
        (out,) = gm.graph.find_nodes(op="output")
        shapes = [str(a.meta["val"].shape) for a in out.args[0]]
        self.assertEqual(shapes, ["torch.Size([2*((u0//2)), 4])"] * 2)

    def test_reduce_scatter_hinted_unbacked(self):
        gm = self.trace(_two_reduce_scatters, _even)
        self.bucket(gm, bucketing.bucket_reduce_scatter)
        self.assert_one_symbolic_bucket(gm)
        (out,) = gm.graph.find_nodes(op="output")
        shapes = [str(a.meta["val"].shape) for a in out.args[0]]
        self.assertEqual(shapes, ["torch.Size([(u0//2), 4])"] * 2)

    def test_all_gather_unhinted_fails_fast(self):
        gm = self.trace(_two_all_gathers, _half, hint=None)
        with self.assertRaisesRegex(RuntimeError, "Could not extract optimization hint"):
            self.bucket(gm, bucketing.bucket_all_gather)
        self.assertEqual(self.shape_env.guards, [])

    def test_reduce_scatter_unhinted_fails_fast(self):
        gm = self.trace(_two_reduce_scatters, _even, hint=None)
        with self.assertRaisesRegex(RuntimeError, "Could not extract optimization hint"):
            self.bucket(gm, bucketing.bucket_reduce_scatter)
        self.assertEqual(self.shape_env.guards, [])

    # ---- guard

    def test_static_shapes_bucket_into_one(self):
        for make_fn, pass_fn in (
            (_two_all_gathers, bucketing.bucket_all_gather),
            (_two_reduce_scatters, bucketing.bucket_reduce_scatter),
        ):
            gm = self.trace(make_fn, lambda u: (8, 4), unbacked=False)
            self.bucket(gm, pass_fn)
            self.assertEqual(len(self.collectives(gm)), 1)
            self.assertEqual(self.symbols_in_graph(gm), set())


class TestBucketingIsolateUnbacked(_BucketingMixin, TestCase):
    """The nested bucketing trace ignores the outer ShapeEnv's pending unbacked
    symbols and leaves them as it found them (pytorch#183495)."""

    def _with_ambient_pending(self, make_fn, pass_fn, shape, unbacked):
        gm = self.trace(make_fn, shape, unbacked=unbacked)
        with self.fake_mode:
            ambient = self.shape_env.create_unbacked_symint()  # outer trace, not yet bound
        pending = list(self.shape_env.pending_fresh_unbacked_symbols)
        self.assertEqual(pending, [ambient.node.expr])
        self.bucket(gm, pass_fn)
        self.assertEqual(len(self.collectives(gm)), 1)
        self.assertEqual(self.shape_env.pending_fresh_unbacked_symbols, pending)
        return gm

    # ---- proof

    def test_all_gather_static_with_ambient_pending_symbol(self):
        self._with_ambient_pending(
            _two_all_gathers, bucketing.bucket_all_gather, lambda u: (8, 4), False
        )

    def test_reduce_scatter_static_with_ambient_pending_symbol(self):
        self._with_ambient_pending(
            _two_reduce_scatters, bucketing.bucket_reduce_scatter, lambda u: (8, 4), False
        )

    def test_all_gather_unbacked_with_ambient_pending_symbol(self):
        gm = self._with_ambient_pending(
            _two_all_gathers, bucketing.bucket_all_gather, _half, True
        )
        self.assert_one_symbolic_bucket(gm)

    # ---- guard

    def test_no_ambient_pending_symbols(self):
        gm = self.trace(_two_all_gathers, lambda u: (8, 4), unbacked=False)
        self.bucket(gm, bucketing.bucket_all_gather)
        self.assertEqual(len(self.collectives(gm)), 1)
        self.assertEqual(self.shape_env.pending_fresh_unbacked_symbols, [])


if __name__ == "__main__":
    run_tests()
