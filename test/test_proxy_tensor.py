# Owner(s): ["module: ProxyTensor"]
import operator

import torch
import torch.utils._pytree as pytree
from torch._dynamo.source import LocalSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import DecompositionInterpreter, make_fx
from torch.fx.experimental.symbolic_shapes import (
    CallMethodKey,
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)
from torch.testing._internal.common_utils import run_tests, TestCase


def _placeholders(gm):
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


class TestUnbackedBindingProvenance(TestCase):
    """
    unbacked_bindings land on the proxy that owns each binding (symfix
    backport of pytorch/pytorch#187231, issue #187230).
    """

    def _check_binding_resolves(self, node):
        # every recorded path is relative to the node's own value and leads
        # to the very symbol it binds
        bindings = node.meta["unbacked_bindings"]
        for sym, path in bindings.items():
            got = pytree.key_get(node.meta["val"], path)
            self.assertIsInstance(got, torch.SymInt)
            self.assertEqual(got.node._expr, sym)
        return bindings

    def test_inputs_sharing_unbacked_shape_id(self):
        # The graph-chunking pattern: token ids and labels share one unbacked
        # batch dim (same shape_id); each fakified input brings a fresh
        # unbacked symbol into make_fx.
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        ctx = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.UNBACKED, DimDynamic.STATIC],
            shape_ids={0: "batch"},
        )
        fresh = {}
        for name in ("tokens", "labels"):
            before = set(shape_env.pending_fresh_unbacked_symbols)
            fresh[name] = mode.from_tensor(
                torch.zeros(4, 8, dtype=torch.long),
                source=LocalSource(name),
                symbolic_context=ctx,
            )
            (sym,) = set(shape_env.pending_fresh_unbacked_symbols) - before
            fresh[name + "_sym"] = sym

        def step(tokens, labels):
            b = tokens.shape[0]
            return (tokens + labels).view(b * 8).float().sum() / b

        with mode:
            gm = make_fx(step, tracing_mode="real")(fresh["tokens"], fresh["labels"])

        tokens_ph, labels_ph = _placeholders(gm)
        # each input's fresh symbol is bound on its own placeholder
        self.assertEqual(
            list(self._check_binding_resolves(tokens_ph)), [fresh["tokens_sym"]]
        )
        self.assertEqual(
            list(self._check_binding_resolves(labels_ph)), [fresh["labels_sym"]]
        )
        # no binding was left on a non-owner node
        for n in gm.graph.nodes:
            if n.op != "placeholder":
                self.assertNotIn("unbacked_bindings", n.meta)

        # the batch stays symbolic: the graph runs for another batch size
        tokens = torch.randint(0, 5, (3, 8))
        labels = torch.randint(0, 5, (3, 8))
        self.assertEqual(gm(tokens, labels), step(tokens, labels))

    def test_single_unbacked_input_binding_path(self):
        shape_env = ShapeEnv()
        mode = FakeTensorMode(shape_env=shape_env)
        ctx = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.STATIC, DimDynamic.UNBACKED]
        )
        x = mode.from_tensor(
            torch.randn(2, 6), source=LocalSource("x"), symbolic_context=ctx
        )
        (sym,) = shape_env.pending_fresh_unbacked_symbols

        with mode:
            gm = make_fx(lambda x: x.sum(1), tracing_mode="real")(x)
        (x_ph,) = _placeholders(gm)
        # the list-of-placeholders prefix is dropped; only size()[1] remains
        self.assertEqual(
            x_ph.meta["unbacked_bindings"],
            {sym: (CallMethodKey("size"), pytree.SequenceKey(1))},
        )

    def test_op_output_binding_unchanged(self):
        # Guard: a single output proxy owns all of its bindings with the
        # full path, as before (single tensor and multi-output ops).
        def f(x):
            nz = x.nonzero()
            vals, counts = torch.unique(x, return_counts=True)
            return nz, vals, counts

        gm = make_fx(f, tracing_mode="symbolic")(torch.tensor([1, 0, 2, 2]))
        nodes = {
            n.target: n for n in gm.graph.nodes if "unbacked_bindings" in n.meta
        }
        nonzero = nodes[torch.ops.aten.nonzero.default]
        bindings = self._check_binding_resolves(nonzero)
        self.assertEqual(
            list(bindings.values()),
            [(CallMethodKey("size"), pytree.SequenceKey(0))],
        )
        (unique_target,) = [t for t in nodes if t is not torch.ops.aten.nonzero.default]
        unique = nodes[unique_target]
        bindings = self._check_binding_resolves(unique)
        for path in bindings.values():
            # the path still starts with the output index of the tuple
            self.assertIsInstance(path[0], pytree.SequenceKey)
        for n in gm.graph.nodes:
            if n.target is operator.getitem:
                self.assertNotIn("unbacked_bindings", n.meta)


class TestScalarPlaceholderVal(TestCase):
    """Scalar placeholders carry meta["val"] (pytorch/pytorch#187231)."""

    def test_make_fx_scalar_placeholders(self):
        def f(x, n, scale, flag):
            y = x * n * scale
            return y if flag else -y

        args = (torch.randn(3), 3, 0.5, True)
        for mode in ("real", "fake"):
            gm = make_fx(f, tracing_mode=mode)(*args)
            phs = _placeholders(gm)
            self.assertEqual(len(phs), 4)
            for ph, arg in zip(phs[1:], args[1:]):
                self.assertIn("val", ph.meta, f"{mode}: {ph.name}")
                self.assertIs(type(ph.meta["val"]), type(arg))
                self.assertEqual(ph.meta["val"], arg)

    def test_decomposition_interpreter_scalar_placeholders(self):
        def f(x, n, scale):
            return torch.add(x, x, alpha=n) * scale

        gm = torch.fx.symbolic_trace(f)
        new_graph = torch.fx.Graph()
        DecompositionInterpreter(gm, new_graph).run(torch.randn(2), 2, 1.5)
        phs = [n for n in new_graph.nodes if n.op == "placeholder"]
        self.assertEqual([ph.meta.get("val") for ph in phs[1:]], [2, 1.5])
        self.assertEqual([type(ph.meta.get("val")) for ph in phs[1:]], [int, float])

    def test_symbolic_int_placeholder_keeps_symint_val(self):
        # Guard: with tracing_mode="symbolic" ints become SymInts and keep the
        # symbolic val; tensor placeholders keep their fake tensor val.
        gm = make_fx(lambda x, n: x * n, tracing_mode="symbolic")(torch.randn(3), 4)
        x_ph, n_ph = _placeholders(gm)
        self.assertIsInstance(n_ph.meta["val"], torch.SymInt)
        self.assertIsInstance(x_ph.meta["val"], torch.Tensor)


if __name__ == "__main__":
    run_tests()
