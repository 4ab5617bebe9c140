# Owner(s): ["oncall: pt2"]
import operator

import torch
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


if __name__ == "__main__":
    run_tests()
