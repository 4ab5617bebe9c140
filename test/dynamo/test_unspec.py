# Owner(s): ["module: dynamo"]
import torch
import torch._dynamo.testing
from torch.testing._internal.common_utils import run_tests, TestCase


class TestTensorSplitByZeroDimTensor(TestCase):
    """torch.tensor_split with a 0-d tensor of sections: Dynamo read the tensor's value when it
    made its fake (item_memo) but left the tensor in the graph, and AOTAutograd traced its
    item() as a fresh unbacked count of outputs ("Could not extract specialized integer from
    data-dependent expression u0"). The count is read under Dynamo's guard on the value."""

    FORMS = {
        "function": lambda x, k: torch.tensor_split(x, k, 1),
        "method": lambda x, k: x.tensor_split(k, dim=1),
        "keyword": lambda x, k: torch.tensor_split(x, tensor_indices_or_sections=k, dim=1),
        "method_keyword": lambda x, k: x.tensor_split(tensor_indices_or_sections=k, dim=1),
        "all_keyword": lambda x, k: torch.tensor_split(
            input=x, tensor_indices_or_sections=k, dim=1
        ),
    }

    def _replay(self, *forms):
        # [n, 7] split along its 7 columns by k: every section as eager's, with the batch
        # static and unbacked; one graph per value of k, as eager's count of outputs
        for form in forms:
            split = self.FORMS[form]
            for unbacked in (False, True):
                with self.subTest(form=form, unbacked=unbacked):
                    torch._dynamo.reset()
                    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
                    compiled = torch.compile(split, backend=counter, fullgraph=True)
                    for n, k in [(5, 2), (3, 3), (1, 2), (0, 3), (4, 9), (2, 2), (6, 1)]:
                        x = torch.randn(n, 7)
                        x_c = x.clone()
                        if unbacked:
                            torch._dynamo.decorators.mark_unbacked(x_c, 0)
                        got, ref = compiled(x_c, torch.tensor(k)), split(x, torch.tensor(k))
                        self.assertEqual(len(got), len(ref), msg=f"n={n} k={k}")
                        for g, r in zip(got, ref, strict=True):
                            self.assertEqual(g.stride(), r.stride(), msg=f"n={n} k={k}")
                            self.assertEqual(g, r, msg=f"n={n} k={k}")
                    if unbacked:  # a graph per value of k: 2, 3, 9, 1
                        self.assertEqual(counter.frame_count, 4)

    def test_function_form(self):
        self._replay("function")

    def test_method_and_keyword_forms(self):
        self._replay("method", "keyword", "method_keyword", "all_keyword")

    def test_other_sections_keep_eager_semantics(self):
        # what the handler leaves to the graph: a 1-d tensor of indices, and a 0-d double
        # (Dynamo memoizes its value too), which eager refuses and the compile refuses
        def by_indices(x, i):
            return torch.tensor_split(x, i, 1)

        compiled = torch.compile(by_indices, backend="aot_eager", fullgraph=True)
        x = torch.randn(3, 7)
        indices = torch.tensor([1, 5])
        for got, ref in zip(compiled(x, indices), by_indices(x, indices), strict=True):
            self.assertEqual(got, ref)
        double = torch.tensor(2.0, dtype=torch.float64)
        with self.assertRaisesRegex(RuntimeError, "dtype of long"):
            by_indices(x, double)
        torch._dynamo.reset()
        with self.assertRaisesRegex(Exception, "must be int64"):
            compiled(x, double)

if __name__ == "__main__":
    run_tests()
