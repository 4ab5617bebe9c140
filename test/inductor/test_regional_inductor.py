# Owner(s): ["module: inductor"]
import torch
import torch.fx.traceback as fx_traceback
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.source import LocalSource
from torch._guards import tracing, TracingContext
from torch._inductor.standalone_compile import AOTCompiledArtifact
from torch._inductor.utils import fresh_cache
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    free_unbacked_symbols,
    ShapeEnv,
    StatelessSymbolicContext,
)
from torch.fx.passes.regional_inductor import regional_inductor
from torch.testing._internal.common_utils import run_tests, TestCase


def _region_modules(gm):
    return [
        n.target
        for n in gm.graph.nodes
        if n.op == "call_module" and n.target.startswith("__marked_inductor_submod")
    ]


def _compiled_region_calls(gm):
    # regional_inductor replaces each region with a call to (a thin wrapper
    # around) the AOT-compiled artifact of that region
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and isinstance(getattr(n.target, "__wrapped__", None), AOTCompiledArtifact)
    ]


class TestRegionalInductorSymbolicMeta(TestCase):
    """
    Regional Inductor compiles a region whose fake metadata has unbacked
    sizes (symfix backport of pytorch/pytorch#187231, issue #187230).
    """

    def test_region_with_unbacked_sized_fake_constant(self):
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        ctx = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.UNBACKED, DimDynamic.STATIC]
        )
        x = mode.from_tensor(
            torch.randn(6, 4), source=LocalSource("x"), symbolic_context=ctx
        )
        shape_env.pending_fresh_unbacked_symbols.clear()
        with mode:
            # captured by the traced function below; make_fx stores it on the
            # GraphModule as a fake constant whose size is the unbacked batch
            scale = torch.empty_like(x)
        self.assertTrue(free_unbacked_symbols(scale))

        def f(x):
            y = x.cos()
            with fx_traceback.annotate({"compile_with_inductor": 0}):
                z = y.sin() * scale
            return z + 1

        with mode, fx_traceback.preserve_node_meta():
            gm = make_fx(f)(x)
        self.assertEqual(len([n for n in gm.graph.nodes if n.op == "get_attr"]), 1)

        with fresh_cache(), tracing(TracingContext(mode)):
            out = regional_inductor(gm, x)

        self.assertEqual(_region_modules(out), [])
        self.assertEqual(len(_compiled_region_calls(out)), 1)
        # the batch dim is still unbacked on the graph's placeholder
        (ph,) = [n for n in out.graph.nodes if n.op == "placeholder"]
        self.assertTrue(free_unbacked_symbols(ph.meta["val"]))

    def test_regional_inductor_numerics_dynamic_batch(self):
        # Guard: the ordinary torch.compile regional-inductor flow still
        # compiles the marked region and computes the same values.
        def f(x, w):
            y = x @ w
            with fx_traceback.annotate({"compile_with_inductor": 0}):
                z = torch.relu(y) * 2 + 1
            return z.sum(1)

        graphs = []

        def fw_compiler(gm, example_inputs):
            out = regional_inductor(gm, *example_inputs)
            graphs.append(out)
            return out

        backend = aot_autograd(fw_compiler=fw_compiler)
        w = torch.randn(4, 3)
        with fresh_cache():
            compiled = torch.compile(f, backend=backend, fullgraph=True)
            for batch in (5, 7):
                x = torch.randn(batch, 4)
                torch._dynamo.decorators.mark_unbacked(x, 0)
                self.assertEqual(compiled(x, w), f(x, w))
        self.assertGreaterEqual(len(graphs), 1)
        for g in graphs:
            self.assertEqual(_region_modules(g), [])
            self.assertEqual(len(_compiled_region_calls(g)), 1)

    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()


if __name__ == "__main__":
    run_tests()
