# Owner(s): ["module: dynamo"]
import warnings

import torch
import torch._dynamo
import torch._dynamo.testing
from torch.testing._internal.common_utils import run_tests, TestCase


def caught(fn, *args):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [(type(w.message), str(w.message)) for w in seen]


class TestReorderConstantWarnings(TestCase):
    """warnings.warn in a compiled region whose arguments hold no tensor: Dynamo refused it
    ("Dynamo does not know how to trace the Python builtin `_warnings.warn`"), so fullgraph
    failed on a warning at any size (linear_cross_entropy's fallback with `options`). It is now
    replayed after the graph, as a function registered to reorderable_logging_functions is, with
    its keyword arguments (those were dropped) and sizes read at run time."""

    @staticmethod
    def step(x):
        if x.shape[1:]:
            warnings.warn(f"rows {x.shape[0]}, features {tuple(x.shape[1:])}", stacklevel=2)
        warnings.warn("deprecated path", DeprecationWarning, stacklevel=1)
        return x.sum(-1)

    def test_warning_replayed_after_the_graph(self):
        for unbacked in (False, True):
            with self.subTest(unbacked=unbacked):
                torch._dynamo.reset()
                counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
                compiled = torch.compile(self.step, backend=counter, fullgraph=True,
                                         dynamic=True)
                for n in (4, 0, 1, 9):
                    x = torch.randn(n, 3)
                    x_c = x.clone()
                    if unbacked:
                        torch._dynamo.decorators.mark_unbacked(x_c, 0)
                        torch._dynamo.decorators.mark_unbacked(x_c, 1)
                    (got, got_w), (ref, ref_w) = caught(compiled, x_c), caught(self.step, x)
                    self.assertEqual(got, ref)
                    self.assertEqual(got_w, ref_w)
                if unbacked:  # one graph for every size (backed ones specialize 0 and 1)
                    self.assertEqual(counter.frame_count, 1)

    def test_linear_cross_entropy_fallback_warning(self):
        # options with a K-dimensional weight: the chunked path does not apply, and eager warns
        from torch.nn.functional import linear_cross_entropy
        from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

        def loss(x, w, t):
            return linear_cross_entropy(x, w, t, options=LinearCrossEntropyOptions())

        compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
        x, w = torch.randn(5, 4), torch.randn(6, 3, 4)
        t = torch.randint(0, 6, (5, 3))
        for arg in (x, t):
            torch._dynamo.decorators.mark_unbacked(arg, 0)
        (got, got_w), (ref, ref_w) = caught(compiled, x, w, t), caught(loss, x, w, t)
        self.assertEqual(got, ref)
        self.assertEqual(got_w, ref_w)
        self.assertTrue(any("options" in m for _, m in ref_w))

    def test_registered_function_called_from_an_inlined_function(self):
        # a registered function called in a function Dynamo inlines was dropped, silently
        seen = []

        def log(*args, **kwargs):
            seen.append((args, kwargs))

        def inner(x):
            log("inner", f"{x.shape[0]} rows", sep="|")
            return x * 2

        def step(x):
            log("outer")
            return inner(x) + 1

        x = torch.ones(3)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        with torch._dynamo.config.patch(reorderable_logging_functions={log}):
            out = torch.compile(step, backend="eager", fullgraph=True)(x)
        self.assertEqual(out, step(torch.ones(3)))
        self.assertEqual(seen[:2], [(("outer",), {}), (("inner", "3 rows"), {"sep": "|"})])

    def test_ignored_warnings_stay_ignored(self):
        with torch._dynamo.config.patch(ignore_logging_functions={warnings.warn}):
            compiled = torch.compile(self.step, backend="eager", fullgraph=True)
            (got, got_w), ref = caught(compiled, torch.ones(2, 3)), self.step(torch.ones(2, 3))
        self.assertEqual(got, ref)
        self.assertEqual(got_w, [])

    def test_warning_of_a_tensor_still_breaks_the_graph(self):
        # its message would read a value computed in the graph: only an explicit registration
        # reorders it, as before
        def step(x):
            warnings.warn(f"got {x}", stacklevel=2)
            return x + 1

        with self.assertRaisesRegex(torch._dynamo.exc.Unsupported, "warn"):
            torch.compile(step, backend="eager", fullgraph=True)(torch.ones(2))


if __name__ == "__main__":
    run_tests()
