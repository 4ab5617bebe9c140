# Owner(s): ["oncall: export"]
"""torch.export with a named Dim whose example size is 0 or 1 (pytorch#184837, pytorch#186485).

A backed size of 0 or 1 is specialized when its symbol is made: ``Dim("batch", min=1, max=32)``
with an example batch of 1 always failed ("batch was inferred to be a constant (1)").
"""

import torch
from torch.export import Dim, export
from torch.testing._internal.common_utils import run_tests, TestCase


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, y, z):
        return self.lin(x) @ y.t(), x.squeeze(0) * 2, torch.cat([x, z], 0), x.sum(0) + z.sum(0)


def inputs(batch, n):
    return torch.randn(batch, 4), torch.randn(5, 3), torch.randn(n, 4)


class TestExportZeroOneExample(TestCase):
    def check_declared_ranges(self, strict):
        net = Net()
        dims = {"x": {0: Dim("batch", min=1, max=32)}, "y": None, "z": {0: Dim("n", max=8)}}
        ep = export(net, inputs(1, 0), dynamic_shapes=dims, strict=strict)
        ranges = sorted((r.lower, r.upper) for r in ep.range_constraints.values())
        self.assertEqual(ranges, [(0, 8), (1, 32)])
        for batch, n in ((1, 0), (7, 3), (32, 8), (2, 1), (1, 5)):
            args = inputs(batch, n)
            for got, ref in zip(ep.module()(*args), net(*args), strict=True):
                self.assertEqual(got, ref, atol=1e-5, rtol=1e-5)
        with self.assertRaisesRegex(AssertionError, "batch|size"):  # outside the declared range
            ep.module()(*inputs(33, 1))

    def test_examples_of_one_and_zero_export_the_declared_ranges(self):
        self.check_declared_ranges(strict=False)

    def test_examples_of_one_and_zero_export_the_declared_ranges_strict(self):
        self.check_declared_ranges(strict=True)


if __name__ == "__main__":
    run_tests()
