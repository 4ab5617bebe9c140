# Owner(s): ["module: dynamo"]
import torch
import torch._dynamo.testing
from torch.testing._internal.common_utils import run_tests, TestCase


class TestNotOfSymbolicSequence(TestCase):
    """`not` of a tuple or torch.Size whose items are symbolic sizes: Dynamo knew `not` of a list
    but not of a tuple, and refused it ("Failed to trace builtin operator `not_` with argument
    types ['Size']") with dynamic or unbacked sizes. A tuple is false exactly when empty."""

    @staticmethod
    def step(x):
        no_features = not x.shape[1:]
        no_dims = not tuple(x.shape)
        return x * 2 if no_features else x + int(no_dims) + 1

    def test_not_of_size_equals_eager(self):
        for dims, unbacked in [(1, False), (2, False), (1, True), (2, True)]:
            with self.subTest(dims=dims, unbacked=unbacked):
                torch._dynamo.reset()
                counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
                compiled = torch.compile(self.step, backend=counter, fullgraph=True,
                                         dynamic=True)
                for n in (3, 0, 1, 7):
                    x = torch.randn((n, 5)[:dims])
                    x_c = x.clone()
                    if unbacked:
                        for d in range(dims):
                            torch._dynamo.decorators.mark_unbacked(x_c, d)
                    self.assertEqual(compiled(x_c), self.step(x), msg=f"n={n}")
                if unbacked:  # one graph for every size: `not` asked nothing of them
                    self.assertEqual(counter.frame_count, 1)


if __name__ == "__main__":
    run_tests()
