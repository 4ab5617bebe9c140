"""Audit a graph trainer's step for unbacked sizes that break or specialize.

    python -m torch._symfix audit FILE.py[:NAME]      (inside a symfix build of torch)
    python torch/_symfix/audit.py FILE.py[:NAME]      (any torch; this file, run directly)

NAME (default ``audit_target``) is a function of FILE taking no arguments and returning
``(fn, args)``.  Tensors in ``args`` carry ``torch._dynamo.decorators.mark_unbacked`` marks
(``hint_override``, ``shape_id``, ``min``, ``max``).  The step is captured as a graph trainer
captures it: fake inputs made from the marks in one ShapeEnv, ``make_fx`` in its default tracing
mode under ``tracing(TracingContext(fake_mode))`` and non-strict tracing.

Every problem is reported, not only the first: the error that stops the capture (a
data-dependent error, an assertion of PT2's internals, any other error), unbacked sizes that
became constants, guards on unbacked sizes, raw SymInts in the graph.  Exit status: 1 when
something was found, 0 when the step traces clean, 2 for bad input (one line on stderr).

This module imports torch only when it runs a capture, so that symfix's tooling can import it
for its report format without torch.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import sys
import traceback
import warnings

DEFAULT_NAME = "audit_target"

# Where in PT2 a torch file belongs, first match wins.
LAYERS = (
    ("torch/fx/experimental/symbolic_shapes.py", "ShapeEnv"),
    ("torch/fx/experimental/sym_node.py", "ShapeEnv"),
    ("torch/fx/experimental/proxy_tensor.py", "ProxyTensor (make_fx)"),
    ("torch/fx/", "FX"),
    ("torch/_subclasses/", "FakeTensor"),
    ("torch/_meta_registrations.py", "ATen meta"),
    ("torch/_refs/", "ATen refs"),
    ("torch/_prims", "ATen prims"),
    ("torch/_decomp/", "decompositions"),
    ("torch/nn/attention/flex_attention.py", "FlexAttention"),
    ("torch/_higher_order_ops/flex_attention.py", "FlexAttention HOP"),
    ("torch/_higher_order_ops/", "higher-order ops"),
    ("torch/distributed/tensor/", "DTensor"),
    ("torch/distributed/", "distributed"),
    ("torch/_inductor/", "Inductor"),
    ("torch/_dynamo/", "Dynamo"),
    ("torch/_functorch/", "functorch"),
    ("torch/nn/", "torch.nn"),
    ("torch/", "torch"),
)

# Frames that only carry a guard to the ShapeEnv: the frame that asked for the guard is the one
# that matters (the caller of ``bool(sym)``, not ``SymNode.guard_bool``).
_PLUMBING_FILES = (
    "torch/__init__.py", "torch/fx/experimental/sym_node.py", "torch/fx/experimental/recording.py",
    "torch/_stats.py", "torch/utils/_sympy/", "torch/_logging/", "torch/_dynamo/exc.py",
    "torch/_dynamo/convert_frame.py", "torch/_dynamo/eval_frame.py",
    "torch/_dynamo/output_graph.py",
    "torch/_dynamo/symbolic_convert.py", "torch/_dynamo/variables/", "torch/_dynamo/utils.py",
    "torch/_dynamo/bytecode_transformation.py", "torch/_utils_internal.py",
    "torch/utils/_python_dispatch.py", "torch/_ops.py", "torch/_compile.py", "torch/_guards.py",
    "torch/utils/_stats.py", "torch/fx/_symbolic_trace.py", "torch/fx/experimental/_backward_state",
    "torch/_functorch/vmap.py", "torch/_functorch/apis.py", "torch/_functorch/pyfunctorch.py",
    "torch/overrides.py", "torch/utils/_contextlib.py",
)
# make_fx's dispatch glue: every op passes through these
_PROXY_GLUE = ("__torch_function__", "__torch_dispatch__", "inner_torch_dispatch", "wrapped",
               "dispatch", "proxy_call")
_PLUMBING_FUNCS = ("evaluate_", "_evaluate", "_inner_evaluate", "guard_", "_guard", "expect_true",
                   "_expect_true",
                   "defer_runtime_assert", "size_hint", "_maybe_evaluate", "evaluate_expr",
                   "_make_data_dependent_error", "statically_known", "_check", "_check_with")


_DDE_TEXT = re.compile(r"Could not guard on data-dependent expression (.+?) \(unhinted")


class BadInput(Exception):
    """The target cannot be audited (no such file or function, wrong return shape)."""


def torch_rel(filename: str) -> str | None:
    """``torch/...`` for a file of a torch package (any install, an overlay), else None."""
    name = filename.replace(os.sep, "/")
    if "/torch/" not in name or "/torch/_symfix/" in name:
        return None
    return "torch/" + name.rsplit("/torch/", 1)[1]


def layer_of(rel: str | None) -> str:
    for prefix, layer in LAYERS:
        if rel and rel.startswith(prefix):
            return layer
    return "?"


def is_plumbing(rel: str, func: str) -> bool:
    if rel.startswith(_PLUMBING_FILES):
        return True
    if rel == "torch/fx/experimental/proxy_tensor.py":
        return func in _PROXY_GLUE
    return rel == "torch/fx/experimental/symbolic_shapes.py" and func.startswith(_PLUMBING_FUNCS)


def _user_file(filename: str, target_dir: str) -> bool:
    if filename.startswith("<"):  # generated code: <eval_with_key>, <string>
        return False
    name = os.path.abspath(filename)
    if torch_rel(filename) is not None or name == os.path.abspath(__file__):
        return False
    if name.startswith(target_dir):
        return True
    return not ("site-packages" in name or "/lib/python3" in name or name.startswith("<"))


def frames_of(frames, target_dir: str) -> dict:
    """Locations in a stack (outermost first): the torch frames below the user's innermost frame
    (all of them when the user's code is not on the stack), the one that matters, the user's."""
    torch_frames, user = [], None
    for f in frames:
        rel = torch_rel(f.filename)
        if rel is not None:
            torch_frames.append({"file": rel, "line": f.lineno, "func": f.name})
        elif _user_file(f.filename, target_dir):
            user = f"{os.path.relpath(f.filename)}:{f.lineno}"
            torch_frames = []  # what the user's line called is what broke
    significant = [t for t in torch_frames if not is_plumbing(t["file"], t["func"])]
    where = (significant or torch_frames or [None])[-1]
    return {"torch_frames": torch_frames, "torch": where, "user": user}


def _root_exception(exc: BaseException) -> list[BaseException]:
    """The exception and its causes, outermost first."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return chain


def failure_finding(exc: BaseException, target_dir: str) -> dict:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    chain = _root_exception(exc)
    dde = next((e for e in chain if isinstance(e, GuardOnDataDependentSymNode)), None)
    # Locations: the innermost exception that has torch frames (Dynamo re-raises from outside).
    tb_exc = dde or next((e for e in reversed(chain) if e.__traceback__ is not None), exc)
    frames = traceback.extract_tb(tb_exc.__traceback__)
    # the user's frame is on the outer exception's stack when Dynamo re-raised
    user_stack = traceback.extract_tb(exc.__traceback__)
    loc = frames_of(frames, target_dir)
    loc["user"] = loc["user"] or frames_of(user_stack, target_dir)["user"]
    if dde is not None:
        cond = getattr(dde, "cond", None)  # a SymPy relation: never ask for its truth
        kind = "data-dependent error"
        expr = str(cond) if cond is not None else (str(dde).strip().splitlines() or [""])[0]
    elif m := _DDE_TEXT.search(str(chain[-1])):  # a data-dependent error Dynamo re-raised
        kind, expr = "data-dependent error", m.group(1)
    else:
        root = chain[-1]
        kind = "internal assertion" if isinstance(root, AssertionError) else "capture error"
        first = (str(root).strip().splitlines() or [""])[0]
        expr = f"{type(root).__name__}: {first}"[:200]
    where = loc["torch"]
    return {
        "kind": kind, "expr": expr, "fatal": True,
        "layer": layer_of(where and where["file"]),
        "torch": f"{where['file']}:{where['line']}" if where else None,
        "torch_func": where["func"] if where else None,
        "torch_frames": loc["torch_frames"], "user": loc["user"],
        "message": "".join(traceback.format_exception_only(type(chain[-1]), chain[-1]))[-2000:],
    }


def _is_unbacked(sym) -> bool:
    from torch.utils._sympy.symbol import symbol_is_type, SymT

    return symbol_is_type(sym, SymT.UNBACKED_INT)


@contextlib.contextmanager
def _watch_shape_env(events: list, target_dir: str):
    """Record where an unbacked symbol is replaced by a constant or guarded."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    orig_set = getattr(ShapeEnv, "_set_replacement", None)

    def _set_replacement(self, a, tgt, *args, **kwargs):
        out = orig_set(self, a, tgt, *args, **kwargs)
        try:
            if _is_unbacked(a) and getattr(self.replacements.get(a), "is_number", False):
                stack = traceback.extract_stack()[:-1]
                events.append({"kind": "specialized", "expr": f"{a} = {self.replacements[a]}",
                               "stack": stack})
        except Exception:  # noqa: BLE001 - the audit never changes what tracing does
            pass
        return out

    if orig_set is not None:
        ShapeEnv._set_replacement = _set_replacement
    try:
        yield
    finally:
        if orig_set is not None:
            ShapeEnv._set_replacement = orig_set


def _event_finding(kind: str, expr: str, frames, target_dir: str, **extra) -> dict:
    loc = frames_of(frames, target_dir)
    where = loc["torch"]
    return {"kind": kind, "expr": expr, "fatal": False, "layer": layer_of(where and where["file"]),
            "torch": f"{where['file']}:{where['line']}" if where else None,
            "torch_func": where["func"] if where else None,
            "torch_frames": loc["torch_frames"], "user": loc["user"], **extra}


def _guard_findings(shape_env, target_dir: str) -> list[dict]:
    """Guards that mention unbacked symbols: decided through a hint, not proved."""
    out = []
    for g in getattr(shape_env, "guards", []):
        syms = [s for s in g.expr.free_symbols if _is_unbacked(s)]
        if not syms:
            continue
        floc = getattr(g.sloc, "framework_loc", None)
        frames = [floc] if isinstance(floc, traceback.FrameSummary) else []
        f = _event_finding("guarded", str(g.expr), frames, target_dir)
        user = getattr(g.sloc, "maybe_user_loc", None)
        f["user"] = f["user"] or user
        out.append(f)
    return out


def _raw_symint_findings(gm, target_dir: str) -> list[dict]:
    """Graph nodes holding a SymInt/SymFloat/SymBool as an argument (no producer node)."""
    import torch
    from torch.utils._pytree import tree_leaves

    out = []
    for n in gm.graph.nodes:
        raw = [a for a in tree_leaves((n.args, n.kwargs))
               if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool))]
        if not raw:
            continue
        user = None
        for line in reversed((n.meta.get("stack_trace") or "").splitlines()):
            line = line.strip()
            if line.startswith('File "'):
                path, _, rest = line[6:].partition('", line ')
                if _user_file(path, target_dir):
                    user = f"{os.path.relpath(path)}:{rest.split(',')[0]}"
                    break
        out.append({"kind": "raw SymInt in graph", "expr": f"{n.format_node()}"[:200],
                    "fatal": False, "layer": "FX", "torch": None, "torch_func": None,
                    "torch_frames": [], "user": user})
    return out


def load_target(spec: str):
    """(fn, args, target file) of ``FILE.py[:NAME]``; BadInput with one line when it cannot."""
    path, _, name = spec.partition(":") if not os.path.isfile(spec) else (spec, "", "")
    name = name or DEFAULT_NAME
    if not os.path.isfile(path):
        raise BadInput(f"{path}: no such file")
    mod_name = "_symfix_audit_target_" + os.path.basename(path).removesuffix(".py")
    mspec = importlib.util.spec_from_file_location(mod_name, path)
    if mspec is None or mspec.loader is None:
        raise BadInput(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[mod_name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        mspec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file: one line, not a traceback
        raise BadInput(f"{path}: importing it failed: {type(e).__name__}: {e}") from None
    target = getattr(module, name, None)
    if not callable(target):
        raise BadInput(f"{path}: has no function {name}")
    try:
        got = target()
    except Exception as e:  # noqa: BLE001
        raise BadInput(f"{path}:{name}(): raised {type(e).__name__}: {e}") from None
    if not (isinstance(got, tuple | list) and len(got) == 2 and callable(got[0])
            and isinstance(got[1], tuple | list)):
        raise BadInput(f"{path}:{name}() must return (fn, args): a callable and a tuple of "
                       f"arguments, got {type(got).__name__}")
    return got[0], tuple(got[1]), os.path.abspath(path)


def fakeify(fake_mode, t, name: str):
    """A fake tensor with the sizes ``mark_unbacked`` asked for (hint, shape_id, bounds)."""
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    unbacked = getattr(t, "_dynamo_unbacked_indices", set())
    if not unbacked:
        return fake_mode.from_tensor(t, static_shapes=True)
    ctx = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.UNBACKED if i in unbacked else DimDynamic.STATIC
                       for i in range(t.dim())],
        shape_ids=getattr(t, "_dynamo_shape_ids", None),
        unbacked_bounds=getattr(t, "_dynamo_unbacked_bounds", None),
    )
    return fake_mode.from_tensor(t, source=LocalSource(name, is_input=True),
                                 symbolic_context=ctx)


def capture(fn, args, target_dir: str) -> dict:
    """Capture ``fn(*args)`` like a graph trainer; every finding on the way."""
    import torch
    import torch._dynamo.config
    from torch._guards import tracing, TracingContext
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch.utils._pytree import tree_map

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    counter = iter(range(1 << 30))
    fake_args = tree_map(lambda a: fakeify(fake_mode, a, f"arg{next(counter)}")
                         if isinstance(a, torch.Tensor) else a, args)
    inputs = sorted(str(s) for s in fake_mode.shape_env.var_to_range if _is_unbacked(s))
    non_strict = getattr(torch.compiler, "_non_strict_tracing_context", contextlib.nullcontext)
    cfg = {k: True for k in ("force_compile_during_fx_trace",) if hasattr(torch._dynamo.config, k)}
    events: list = []
    findings: list[dict] = []
    gm = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with (_watch_shape_env(events, target_dir), torch._dynamo.config.patch(**cfg),
                  fake_mode, tracing(TracingContext(fake_mode)),
                  torch.autograd.set_multithreading_enabled(False), non_strict()):
                gm = make_fx(fn, record_module_stack=False)(*fake_args)
        except Exception as e:  # noqa: BLE001 - recorded as a finding
            try:
                findings.append(failure_finding(e, target_dir))
            except Exception:  # noqa: BLE001 - a finding without locations beats no report
                findings.append({"kind": "capture error", "fatal": True, "layer": "?",
                                 "expr": f"{type(e).__name__}: {e}"[:200], "torch": None,
                                 "torch_func": None, "torch_frames": [], "user": None,
                                 "message": str(e)[-2000:]})
    for ev in events:
        findings.append(_event_finding(ev["kind"], ev["expr"], ev["stack"], target_dir))
    findings += _guard_findings(fake_mode.shape_env, target_dir)
    asserts = None
    if gm is not None:
        findings += _raw_symint_findings(gm, target_dir)
        asserts = runtime_asserts(gm, fake_mode.shape_env)
    for w in caught:
        if "passed as argument to Graph.create_node" in str(w.message):
            findings.append({"kind": "raw SymInt in graph", "expr": str(w.message)[:200],
                             "fatal": False, "layer": "FX",
                             "torch": f"{torch_rel(w.filename)}:{w.lineno}",
                             "torch_func": None, "torch_frames": [], "user": None})
    # the fatal error first, then the others in the order they happened
    findings.sort(key=lambda f: not f["fatal"])
    return {
        "torch_version": torch.__version__,
        "symfix": _symfix_ids(),
        "traced": gm is not None,
        "unbacked_inputs": inputs,
        "graph_nodes": len(gm.graph.nodes) if gm is not None else None,
        "runtime_asserts": asserts,
        "findings": _dedup(findings),
    }


def runtime_asserts(gm, shape_env) -> int:
    """What a graph trainer must do before it runs a make_fx capture, done: the facts the trace
    relied on (torch._check, the marks' min and max, PyTorch's own checks on the sizes) become
    assertions in the graph (upstream's pass), and the module runs the new graph (recompile).
    Returns how many the graph checks."""
    import torch
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    insert_deferred_runtime_asserts(gm, shape_env, "audit")
    gm.recompile()
    assert_scalar = torch.ops.aten._assert_scalar.default
    return len(gm.graph.find_nodes(op="call_function", target=assert_scalar))


RUNTIME_ASSERTS = ("runtime asserts: {n} facts of the trace checked when the graph runs "
                   "(insert_deferred_runtime_asserts, then recompile: docs/audit.md)")


def _dedup(findings: list[dict]) -> list[dict]:
    seen, out = set(), []
    for f in findings:
        key = (f["kind"], f["expr"], f["user"]) if f["kind"] == "specialized" else (
            f["kind"], f["expr"], f["torch"], f["user"])
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def _symfix_ids() -> list[str] | None:
    try:
        import torch._symfix as s
    except ImportError:
        return None
    return [p["id"] for p in getattr(s, "PATCHES", [])]


def signature(f: dict) -> tuple:
    """What identifies a finding across torch builds (line numbers move, symbols are renamed)."""
    return (f["kind"], f["torch_func"] or f["torch"], f["user"])


def format_finding(n: int, f: dict, remedy: str) -> str:
    torch_loc = f["torch"] or "–"
    if f.get("torch_func"):
        torch_loc += f" ({f['torch_func']})"
    return (f"[{n}] {f['kind']}: {f['expr']}\n"
            f"    layer   {f['layer']}\n"
            f"    torch   {torch_loc}\n"
            f"    yours   {f['user'] or '–'}\n"
            f"    remedy  {remedy}\n")


REPRO = '''\
"""symfix audit repro: {kind} ({layer}) at {torch}; yours: {user}.

{expr}

Found with torch {version}. Run: python {name}
"""
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("target", {path!r})
target = importlib.util.module_from_spec(spec)
sys.path.insert(0, {dir!r})
spec.loader.exec_module(target)
fn, args = target.{func}()

import torch  # noqa: E402
from torch._dynamo.source import LocalSource  # noqa: E402
from torch._guards import tracing, TracingContext  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from torch.fx.experimental.symbolic_shapes import (  # noqa: E402
    DimDynamic, ShapeEnv, StatelessSymbolicContext)

mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


def fake(i, t):
    if not isinstance(t, torch.Tensor):
        return t
    marked = getattr(t, "_dynamo_unbacked_indices", set())
    if not marked:
        return mode.from_tensor(t, static_shapes=True)
    dyn = [DimDynamic.UNBACKED if d in marked else DimDynamic.STATIC for d in range(t.dim())]
    ctx = StatelessSymbolicContext(dynamic_sizes=dyn,
                                   shape_ids=getattr(t, "_dynamo_shape_ids", None),
                                   unbacked_bounds=getattr(t, "_dynamo_unbacked_bounds", None))
    return mode.from_tensor(t, source=LocalSource(f"arg{{i}}", is_input=True),
                            symbolic_context=ctx)


fake_args = [fake(i, a) for i, a in enumerate(args)]
with torch._dynamo.config.patch(force_compile_during_fx_trace=True), mode, \\
        tracing(TracingContext(mode)), torch.compiler._non_strict_tracing_context():
    make_fx(fn, record_module_stack=False)(*fake_args)  # expected: {kind}
print("traced: the problem is gone")
'''


def write_repro(out_dir: str, n: int, f: dict, spec: str, version: str) -> str:
    path, _, func = spec.partition(":")
    os.makedirs(out_dir, exist_ok=True)
    name = os.path.join(out_dir, f"repro-{n}.py")
    with open(name, "w") as fh:
        fh.write(REPRO.format(kind=f["kind"], layer=f["layer"], torch=f["torch"], user=f["user"],
                              expr=f["expr"].replace('"""', "'''"), version=version, name=name,
                              path=os.path.abspath(path),
                              dir=os.path.dirname(os.path.abspath(path)),
                              func=func or DEFAULT_NAME))
    return name


def report(result: dict, remedies: list[str], header: str) -> str:
    lines = [header]
    for n, (f, remedy) in enumerate(zip(result["findings"], remedies, strict=False), 1):
        lines.append(format_finding(n, f, remedy))
    if result["findings"]:
        lines.append(f"{len(result['findings'])} problem(s) found.")
    else:
        lines.append("clean: the step traces with its unbacked sizes symbolic.")
    if result.get("runtime_asserts") is not None:
        lines.append(RUNTIME_ASSERTS.format(n=result["runtime_asserts"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch._symfix audit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="FILE.py[:NAME], NAME defaults to audit_target")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--repro-dir", default="symfix-audit",
                   help="where repros of problems without a fix go (default: ./symfix-audit)")
    args = p.parse_args(argv)
    try:
        fn, fargs, path = load_target(args.target)
    except BadInput as e:
        print(f"symfix audit: {e}", file=sys.stderr)
        return 2
    result = capture(fn, fargs, os.path.dirname(path))
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        ids = result["symfix"]
        built = f"symfix build with {len(ids)} fixes" if ids is not None else "no symfix fixes"
        remedies = []
        for n, f in enumerate(result["findings"], 1):
            repro = write_repro(args.repro_dir, n, f, args.target, result["torch_version"])
            remedies.append(f"no known fix in this torch ({built}); repro: {repro}")
        print(report(result, remedies, f"audit {args.target} with torch {result['torch_version']}"
                     f" ({built}); unbacked inputs: {', '.join(result['unbacked_inputs']) or '–'}"
                     "\n"))
    return 1 if result["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
