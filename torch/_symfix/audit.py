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
import copy
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
        out.append({"kind": "raw SymInt in graph", "expr": f"{n.format_node()}"[:200],
                    "fatal": False, "layer": "FX", "torch": None, "torch_func": None,
                    "torch_frames": [], "user": node_user(n, target_dir)})
    return out


SUBCLASS_REMEDY = ("pass its local tensor (marked) and make the DTensor in the step "
                   "(DTensor.from_local), and return .to_local(): a make_fx capture, as this "
                   "audit makes, does not trace into a tensor subclass")


_SUBCLASS_FINDING = {"fatal": True, "layer": "make_fx (a tensor subclass)", "torch": None,
                     "torch_func": None, "torch_frames": [], "user": None,
                     "remedy": SUBCLASS_REMEDY}


def _subclass_input_findings(inputs) -> list[dict]:
    """A tensor subclass (a DTensor) among the inputs: make_fx would trace its own ops into
    constants of the capture, so the graph would give the traced values at every size."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    for k, t in enumerate(inputs):
        if is_traceable_wrapper_subclass(t):
            inner = [getattr(t, a) for a in t.__tensor_flatten__()[0]]
            marked = not getattr(t, "_dynamo_unbacked_indices", None) and any(
                getattr(i, "_dynamo_unbacked_indices", None) for i in inner)
            return [dict(_SUBCLASS_FINDING, kind="tensor subclass input", expr=f"input {k} is a "
                         f"{type(t).__name__}" + (" whose inner tensor alone is marked unbacked"
                                                  if marked else ""))]
    return []


def _fake_constant_findings(gm, target_dir: str) -> list[dict]:
    """A fake tensor graph ``gm`` holds as a constant (a tensor subclass the step made and
    returned, or one it computed from): the graph gives the traced value at every size."""
    from torch._subclasses.fake_tensor import is_fake

    for n in gm.graph.find_nodes(op="get_attr"):
        if is_fake(getattr(gm, n.target, None)):
            user = next((node_user(u, target_dir) for u in n.users), None)
            return [dict(_SUBCLASS_FINDING, kind="fake constant in graph", user=user,
                         expr=f"{n.target}: a tensor of the trace the graph returns or "
                         "computes from, the same at every size")]
    return []


def node_user(n, target_dir: str) -> str | None:
    """The user's ``file:line`` that made graph node ``n`` (its innermost user frame)."""
    for line in reversed((n.meta.get("stack_trace") or "").splitlines()):
        line = line.strip()
        if line.startswith('File "'):
            path, _, rest = line[6:].partition('", line ')
            if _user_file(path, target_dir):
                return f"{os.path.relpath(path)}:{rest.split(',')[0]}"
    return None


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


def _stateful(x) -> bool:
    import torch

    return isinstance(x, torch.nn.Module | torch.optim.Optimizer)


def state_entries(obj) -> list[tuple[str, object, object]]:
    """(name, value, param) for what a module or an optimizer holds that a step may change: a
    module's parameters and buffers and the parameters' grads (``param``: whose grad it is;
    None where there is none), an optimizer's hyperparameters (lr, a float or a tensor),
    parameters and state (per parameter, as in its state_dict)."""
    import torch
    from torch.utils._pytree import tree_leaves

    if isinstance(obj, torch.nn.Module):
        params = list(obj.named_parameters())
        return ([(n, p, None) for n, p in params] + list(
            (n, b, None) for n, b in obj.named_buffers())
            + [(f"{n}.grad", p.grad, p) for n, p in params])
    params = [p for group in obj.param_groups for p in group["params"]]
    out = [(f"param_groups[{g}].{key}", v, None) for g, group in enumerate(obj.param_groups)
           for key, v in sorted(group.items()) if key != "params"]
    out += [(f"params[{k}]", p, None) for k, p in enumerate(params)]
    out += [(f"params[{k}].grad", p.grad, p) for k, p in enumerate(params)]
    for k, p in enumerate(params):
        for key, v in sorted(obj.state.get(p, {}).items()):
            leaves = tree_leaves(v)  # a list of tensors (LBFGS's history): each its own
            out += ([(f"state[{k}].{key}", v, None)] if len(leaves) == 1 and leaves[0] is v else
                    [(f"state[{k}].{key}[{j}]", x, None) for j, x in enumerate(leaves)])
    return out


def state_of(args) -> list[tuple[str, object, object]]:
    """``state_entries`` of every module and optimizer in ``args``, the tensors only, each
    tensor once (an optimizer's parameters are its module's), named by argument."""
    import torch
    from torch.utils._pytree import tree_leaves

    seen, out = set(), []
    for i, arg in enumerate(args):
        for obj in filter(_stateful, tree_leaves(arg)):
            for name, t, param in state_entries(obj):
                if isinstance(t, torch.Tensor) and id(t) not in seen:
                    seen.add(id(t))
                    out.append((f"argument {i} ({type(obj).__name__}) {name}", t, param))
    return out


def refuse_hidden_state(args, spec: str) -> None:
    """BadInput where a module or an optimizer is reachable only through an object of the
    arguments that is not a list, tuple or dict (a trainer object): the audit lifts the state
    of those the arguments hold (a scheduler may hold an optimizer that is an argument)."""
    import torch
    from torch.utils._pytree import tree_leaves

    todo = [(x, i) for i, a in enumerate(args) for x in tree_leaves(a)]
    lifted = {id(x) for x, _ in todo if _stateful(x)}
    seen: set[int] = set()
    while todo:
        obj, i = todo.pop(0)
        if id(obj) in seen or isinstance(obj, torch.Tensor | str | int | float | type):
            continue
        seen.add(id(obj))
        if _stateful(obj):
            if id(obj) not in lifted:
                raise BadInput(f"{spec}: argument {i} holds a {type(obj).__name__} inside an "
                               "object the audit does not look into: pass the modules and "
                               "optimizers as arguments (or in lists, tuples or dicts)")
            continue
        kids = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
        kids += list(obj.values()) if isinstance(obj, dict) else (
            list(obj) if isinstance(obj, list | tuple | set) else [])
        todo += [(k, i) for k in kids]


def with_state(args, new: list):
    """``args`` with what is not a tensor copied (modules, optimizers, a scheduler of an
    optimizer: one copy), the tensors of its modules and optimizers (``state_of``) swapped for
    ``new``, in order.  Inside a trace another tensor of theirs (an attribute that is not a
    buffer) is copied as a real tensor: a constant of the graph."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes
    from torch.utils._pytree import tree_flatten, tree_unflatten

    old = state_of(args)
    memo = {id(t): n for (_, t, param), n in zip(old, new, strict=True) if param is None}
    leaves, spec = tree_flatten(args)
    with _disable_current_modes():
        leaves = [x if isinstance(x, torch.Tensor) else copy.deepcopy(x, memo) for x in leaves]
    for (_, _, param), n in zip(old, new, strict=True):
        if param is not None:
            memo[id(param)].grad = n
    return tree_unflatten(leaves, spec)


def lifted(fn, args):
    """``fn(*args)`` as a function of tensors alone, as a graph trainer captures its step: the
    tensors of its modules and optimizers (``state_of``) are inputs, then its tensor arguments;
    ``(body, inputs)``.  A graph of ``body`` updates the state it is given in place."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    n_state = len(state_of(args))
    leaves, spec = tree_flatten(args)
    at = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def body(*inputs):
        new = list(leaves)
        for k, t in zip(at, inputs[n_state:], strict=True):
            new[k] = t
        step_args = tree_unflatten(new, spec)
        return fn(*with_state(step_args, list(inputs[:n_state])))

    return body, graph_inputs(args)


def graph_inputs(args) -> list:
    """What a graph of ``lifted(fn, args)``'s body takes: the tensors of the step's modules
    and optimizers, then its tensor arguments."""
    import torch
    from torch.utils._pytree import tree_leaves

    return ([t for _, t, _ in state_of(args)]
            + [x for x in tree_leaves(args) if isinstance(x, torch.Tensor)])


def written(gm) -> set[int]:
    """The positions of the inputs graph ``gm`` updates in place."""
    import torch

    if "symfix_written" not in gm.meta:
        at = {n: k for k, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
        gm.meta["symfix_written"] = {
            at[x] for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)
            for a, arg in zip(n.args, n.target._schema.arguments, strict=False)
            if arg.alias_info is not None and arg.alias_info.is_write
            for x in (a if isinstance(a, list | tuple) else [a]) if x in at}  # foreach: lists
    return gm.meta["symfix_written"]


def graph_given(gm, inputs) -> list:
    """``inputs`` as graph ``gm`` takes them: one it updates in place that requires grad (a
    parameter a training step's optimizer updates) detached, sharing its storage.  Eager's
    optimizer updated it under no_grad, which the graph's ops do not say."""
    return [t.detach() if k in written(gm) and t.requires_grad else t
            for k, t in enumerate(inputs)]


def trains(gm, inputs) -> bool:
    """Whether graph ``gm`` updates a parameter in place (a training step's graph)."""
    return any(inputs[k].requires_grad for k in written(gm))


def run_graph(gm, args, run=None):
    """Graph ``gm`` of ``lifted(fn, args)``'s body (or ``run``, which runs it) on ``args``, as
    ``fn`` runs on them: the state the graph updates is ``args``' own."""
    return (run or gm)(*graph_given(gm, graph_inputs(args)))


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
    return trace(fn, args, target_dir)[0]


def trace(fn, args, target_dir: str, stack_traces: bool = False, mode: str = "plain"):
    """``capture``'s result, and the graph (runtime asserts inserted, None when the capture
    failed) with the fake inputs it was traced with.  ``stack_traces``: the nodes made by
    the user's code say where (node.meta["stack_trace"]); ``mode``: traced in that mode (one
    of MODES: autocast's casts and no_grad's missing autograd are in the graph)."""
    import torch
    import torch._dynamo.config
    from torch._guards import tracing, TracingContext
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    body, tensors = lifted(fn, args)
    n_state = len(state_of(args))
    findings: list[dict] = _subclass_input_findings(tensors)
    fake_inputs = [] if findings else (
        [fake_mode.from_tensor(t, static_shapes=True) for t in tensors[:n_state]]
        + [fakeify(fake_mode, a, f"arg{k}") for k, a in enumerate(tensors[n_state:])])
    inputs = sorted(str(s) for s in fake_mode.shape_env.var_to_range if _is_unbacked(s))
    non_strict = getattr(torch.compiler, "_non_strict_tracing_context", contextlib.nullcontext)
    cfg = {k: True for k in ("force_compile_during_fx_trace",) if hasattr(torch._dynamo.config, k)}
    events: list = []
    gm = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with (_watch_shape_env(events, target_dir), torch._dynamo.config.patch(**cfg),
                  fake_mode, tracing(TracingContext(fake_mode)),
                  torch.autograd.set_multithreading_enabled(False), non_strict()):
                with _user_stack_traces(fn, target_dir, stack_traces), mode_context(mode):
                    if not findings:  # a subclass input: nothing to trace
                        gm = make_fx(body, record_module_stack=False,
                                     record_stack_traces=stack_traces)(*fake_inputs)
        except Exception as e:  # noqa: BLE001 - recorded as a finding
            try:
                findings.append(failure_finding(e, target_dir))
            except Exception:  # noqa: BLE001 - a finding without locations beats no report
                findings.append({"kind": "capture error", "fatal": True, "layer": "?",
                                 "expr": f"{type(e).__name__}: {e}"[:200], "torch": None,
                                 "torch_func": None, "torch_frames": [], "user": None,
                                 "message": str(e)[-2000:]})
    if gm is not None and (constants := _fake_constant_findings(gm, target_dir)):
        findings += constants
        gm = None
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
        "state_inputs": n_state,
        "runtime_asserts": asserts,
        "findings": _dedup(findings),
    }, gm, fake_inputs


@contextlib.contextmanager
def _user_stack_traces(fn, target_dir: str, on: bool):
    """make_fx keeps only frames named ``forward`` in a node's stack trace, and those of the
    functions registered as anchors: register every function of the user's files that the
    step can reach (its module's functions and the functions defined in them)."""
    import torch.fx.proxy

    anchors = getattr(torch.fx.proxy, "_STACK_TRACE_ANCHORS", None)
    if not on or anchors is None:
        yield
        return
    codes = [fn.__code__] if hasattr(fn, "__code__") else []
    for mod in list(sys.modules.values()):
        if os.path.abspath(getattr(mod, "__file__", None) or "/").startswith(target_dir + os.sep):
            codes += [f.__code__ for f in vars(mod).values() if hasattr(f, "__code__")]
    added, todo = set(), codes
    while todo:
        code = todo.pop()
        key = (code.co_filename, code.co_name)
        if key not in anchors:
            added.add(key)
        todo += [c for c in code.co_consts if hasattr(c, "co_filename")]
    anchors |= added
    try:
        yield
    finally:
        anchors -= added


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
    lines = [f"[{n}] {f['kind']}: {f['expr']}", f"    layer   {f['layer']}"]
    if f.get("at"):  # a replay's difference: where it shows, the graph node it starts at
        at = f["at"][0]
        if len(f["at"]) > 1:
            at += f" (and {len(f['at']) - 1} more: {', '.join(f['at'][1:6])}"
            at += ", …)" if len(f["at"]) > 6 else ")"
        lines += [f"    at      {at}", f"    node    {f['node'] or '–'}"]
    else:
        torch_loc = f["torch"] or "–"
        if f.get("torch_func"):
            torch_loc += f" ({f['torch_func']})"
        lines.append(f"    torch   {torch_loc}")
    lines += [f"    yours   {f['user'] or '–'}", f"    remedy  {remedy}"]
    return "\n".join(lines) + "\n"


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


def write_repro(out_dir: str, n: int, f: dict, spec: str, version: str,
                stateful: bool = False) -> str:
    """A script that shows finding ``f`` of the capture; ``stateful``: the step takes modules
    or optimizers, which only the engine lifts (``lifted``), so the script runs the engine."""
    path, sep, func = spec.partition(":")
    os.makedirs(out_dir, exist_ok=True)
    name = os.path.join(out_dir, f"repro-{n}.py")
    with open(name, "w") as fh:
        if stateful:
            fh.write(ENGINE_REPRO.format(
                title=f"{f['kind']} ({f['layer']}) at {f['torch']}", expr=f["expr"].replace(
                    '"""', "'''"), where=f"yours: {f['user']}", version=version,
                name=name, engine_dir=os.path.dirname(os.path.abspath(__file__)),
                argv=[os.path.abspath(path) + sep + func]))
            return name
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
    replayed = result.get("replay")
    if replayed and not result["traced"]:
        lines.append(f"{len(result['findings'])} problem(s) found; the step does not trace, so "
                     "nothing was replayed.")
    elif result["findings"]:
        lines.append(f"{len(result['findings'])} problem(s) found."
                     + (f" Replayed: {replay_summary(result)}." if replayed else ""))
    elif replayed:
        lines.append(f"clean: the graph gives eager's results at every size and mode checked: "
                     f"{replay_summary(result)}.")
    else:
        lines.append("clean: the step traces with its unbacked sizes symbolic.")
    if result.get("runtime_asserts") is not None:
        lines.append(RUNTIME_ASSERTS.format(n=result["runtime_asserts"]))
    return "\n".join(lines)


# --replay: the one captured graph, run at other sizes and in other modes, against eager.

MODES = ("plain", "autocast", "no_grad", "inference_mode")


def parse_modes(text: str | None) -> list[str]:
    """``--modes``: names separated by commas, or ``all`` (the default)."""
    if text is None or text == "all":
        return list(MODES)
    names = [m.strip() for m in text.split(",")]
    bad = [m for m in names if m not in MODES]
    if bad:
        raise BadInput(f"--modes {text}: no mode {bad[0]!r} (modes: all, {', '.join(MODES)})")
    return [m for m in MODES if m in names]


def mode_context(name: str):
    import torch

    return {"plain": contextlib.nullcontext,
            "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
            "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[name]()


def replay_sizes(lo: int, hi: int | None, hint: int) -> list[int]:
    """Sizes that break things: the mark's min, 1, 2, 3, 7, 13, one far from the hint;
    capped by the mark's max."""
    sizes = {lo, 1, 2, 3, 7, 13, hint * 8 + 1}
    if hi is not None:
        sizes = {min(n, hi) for n in sizes}
    return sorted(n for n in sizes if n >= lo)


def size_groups(args, fake_inputs) -> list[dict]:
    """The unbacked sizes of the inputs: one group per symbol, or per shape_id (its sizes
    move together), with the marked dims it sets, its hint and its sizes to replay."""
    import torch
    from torch.utils._pytree import tree_leaves

    groups: dict = {}
    fakes = iter(fake_inputs[len(state_of(args)):])  # the step's state first (lifted)
    for i, t in enumerate(tree_leaves(args)):
        if not isinstance(t, torch.Tensor):
            continue
        f = next(fakes)
        bounds = getattr(t, "_dynamo_unbacked_bounds", {})
        for d in sorted(getattr(t, "_dynamo_unbacked_indices", ())):
            if not isinstance(f.shape[d], torch.SymInt):
                continue
            shape_id = getattr(t, "_dynamo_shape_ids", {}).get(d)
            g = groups.setdefault(shape_id or str(f.shape[d]), {
                "name": str(f.shape[d]), "dims": [], "hint": t.shape[d],
                "sizes": replay_sizes((bounds.get(d) or (None,))[0] or 0,
                                      (bounds.get(d) or (None, None))[1], t.shape[d])})
            g["dims"].append((i, d))
    return list(groups.values())


def resized(t, dims: dict):
    """A new tensor like ``t`` (dtype, device, layout of its strides, requires_grad) with the
    sizes ``dims`` gives: random floats, integers in ``t``'s range (token ids stay ids)."""
    import torch

    shape = [dims.get(d, n) for d, n in enumerate(t.shape)]
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))  # outermost dim first
    physical = [shape[d] for d in order]
    if t.is_floating_point() or t.is_complex():
        new = torch.randn(physical, dtype=t.dtype, device=t.device)
    elif t.dtype == torch.bool:
        new = torch.randint(0, 2, physical, device=t.device).bool()
    else:
        lo, hi = (int(t.min()), int(t.max())) if t.numel() else (0, 1)
        new = torch.randint(lo, hi + 1, physical, dtype=t.dtype, device=t.device)
    new = new.permute([order.index(d) for d in range(t.dim())])
    return new.requires_grad_(t.requires_grad)


def inputs_at(args, group: dict, size: int):
    """``args`` with ``group``'s marked dims at ``size``, the other marked dims at their hint;
    unmarked arguments as they are."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(args)
    torch.manual_seed(size)
    new = {}
    for i, d in group["dims"]:
        new.setdefault(i, {})[d] = size
    return tree_unflatten([resized(t, new[i]) if i in new else t
                           for i, t in enumerate(leaves)], spec)


def fresh(args):
    """A copy of the arguments for one side of a comparison (modules, optimizers, tensors),
    the parameters' grads too (a Parameter's deep copy has none)."""
    import torch
    from torch.utils._pytree import tree_leaves

    memo = {id(t): t.detach().clone().requires_grad_(t.requires_grad)  # deepcopy refuses these
            for t in tree_leaves(args) if isinstance(t, torch.Tensor) and not t.is_leaf}
    new = copy.deepcopy(args, memo)
    for _, grad, param in state_of(args):
        if param is not None:
            memo[id(param)].grad = grad.detach().clone()
    return new


def _leaf(x, state: bool = False):
    """What is compared of a leaf: a tensor's local value (a DTensor's placements too), strides
    and requires_grad (not of a module's or optimizer's ``state``: the graph's backward ops
    run with autograd where eager's did not); a number, string or None itself; of another
    object its type (each side has its own copy)."""
    import torch

    if not isinstance(x, torch.Tensor):
        plain = x is None or isinstance(x, bool | int | float | complex | str | tuple
                                        | torch.dtype | torch.device)
        return x if plain else f"<{type(x).__name__}>"
    placements = getattr(x, "placements", None)
    local = x.to_local() if placements is not None else x
    return {"t": local.detach().clone(), "stride": local.stride(),
            "requires_grad": None if state else x.requires_grad, "placements": placements}


def snapshot(value) -> dict:
    """``_leaf`` of every leaf of ``value`` by its place; a module's or an optimizer's state
    (``state_entries``) in its stead."""
    from torch.utils._pytree import tree_leaves

    out = {}
    for k, x in enumerate(tree_leaves(value)):
        if _stateful(x):
            out |= {f"{k} ({type(x).__name__}) {name}": _leaf(v, state=True)
                    for name, v, _ in state_entries(x)}
        else:
            out[str(k)] = _leaf(x)
    return out


def _dense(t) -> bool:
    """Non-overlapping and dense: strides say something about the layout eager chose."""
    if t.numel() == 0:
        return False
    expect = 1
    for d in sorted((d for d in range(t.dim()) if t.shape[d] > 1), key=t.stride):
        if t.stride(d) != expect:
            return False
        expect *= t.shape[d]
    return True


def _tolerance(dtype, mode: str) -> tuple[float, float]:
    import torch

    if mode == "autocast" or dtype in (torch.bfloat16, torch.float16):
        return 5e-2, 5e-2  # rtol, atol
    return (1e-7, 1e-7) if dtype == torch.float64 else (1e-4, 1e-5)


def leaf_difference(a, b, mode: str) -> tuple[str, str] | None:
    """(what, how) differs between the graph's leaf ``a`` and eager's ``b``, or None."""
    import torch

    if not isinstance(a, dict) or not isinstance(b, dict):
        if isinstance(a, dict) != isinstance(b, dict):
            return "type", f"{_kind(a)} where eager has {_kind(b)}"
        if isinstance(a, float) and isinstance(b, float) and (a == b or (a != a and b != b)
                                                              or abs(a - b) <= 1e-5 * abs(b)):
            return None
        return None if a == b else ("value", f"{a!r} where eager has {b!r}")
    x, y = a["t"], b["t"]
    checks = (("placements", a["placements"], b["placements"]),
              ("shape", tuple(x.shape), tuple(y.shape)), ("dtype", x.dtype, y.dtype))
    for what, mine, eager in checks:
        if mine != eager:
            return what, f"{mine} where eager has {eager}"
    if _dense(y):
        mine = [s for s, n in zip(a["stride"], x.shape, strict=True) if n > 1]
        eager = [s for s, n in zip(b["stride"], y.shape, strict=True) if n > 1]
        if mine != eager:
            return "strides", f"{a['stride']} where eager has {b['stride']}"
    if a["requires_grad"] != b["requires_grad"]:
        return "requires_grad", f"{a['requires_grad']} where eager has {b['requires_grad']}"
    rtol, atol = _tolerance(y.dtype, mode)
    try:
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol, equal_nan=True,
                                   check_stride=False)
    except AssertionError as e:
        worst = next((ln.strip() for ln in str(e).splitlines() if "Greatest" in ln), "")
        return "values", f"differ beyond rtol={rtol}, atol={atol}" + (f" ({worst})" if worst
                                                                         else "")
    return None


def _kind(x) -> str:
    return "a tensor" if isinstance(x, dict) else "None" if x is None else type(x).__name__


def differences(got: dict, want: dict, mode: str, label: str) -> list[tuple[str, str]]:
    """(what, how) for every leaf of two snapshots that differs, named ``label`` and its
    place."""
    out = []
    for name in [*want, *(n for n in got if n not in want)]:
        if name not in got or name not in want:
            what = (f"missing where eager has {_kind(want[name])}" if name not in got
                    else f"{_kind(got[name])} where eager has nothing")
            out.append((f"{label} {name}", what))
        elif d := leaf_difference(got[name], want[name], mode):
            out.append((f"{label} {name} {d[0]}", d[1]))
    return out


def run_side(call, args, mode: str):
    """(snapshot of the outputs and of the arguments after the call, None), or (None, error)."""
    import torch

    torch.manual_seed(0)
    try:
        with mode_context(mode):
            out = call(*args)
        return (snapshot(out), snapshot(args)), None
    except Exception as e:  # noqa: BLE001 - one side raising is what is compared
        return None, e


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"[:200]


def compare_at(fn, gm, args, mode: str, run=None) -> dict | None:
    """Graph ``gm`` (run by ``run``, its compiled code, where given) against eager on ``args``
    in ``mode``: None when they agree, else the kind of difference and what differs."""
    want, eager_err = run_side(fn, fresh(args), mode)
    got, graph_err = run_side(lambda *a: run_graph(gm, a, run), fresh(args), mode)
    if eager_err is not None and graph_err is not None:
        return None
    if graph_err is not None:
        refused = "Runtime assertion failed" in str(graph_err)
        return {"kind": "refused" if refused else "raised",
                "expr": f"the graph raises {_first_line(graph_err)}; eager runs", "what": ()}
    if eager_err is not None:
        return {"kind": "accepted", "expr": f"the graph runs; eager raises "
                f"{_first_line(eager_err)}", "what": ()}
    diffs = (differences(got[0], want[0], mode, "output")
             + differences(got[1], want[1], mode, "argument (after the step)"))
    if not diffs:
        return None
    if all(w.startswith("argument") and (h.startswith("missing")
                                         or h == "None where eager has a tensor")
           for w, h in diffs):
        return {"kind": "state not kept", "what": tuple(w for w, _ in diffs),
                "expr": f"{len(diffs)} tensor(s) the step creates are not kept, as "
                f"{diffs[0][0]}", "remedy": STATE_NOT_KEPT,
                "layer": "make_fx (state the step creates in Python)"}
    loss_only = trains(gm, graph_inputs(args)) and all(
        w.startswith("output") and w.endswith("requires_grad") for w, _ in diffs)
    return {"kind": "differs from eager", "what": tuple(w for w, _ in diffs),
            "expr": "; ".join(f"{w}: {h}" for w, h in diffs[:3])
            + (f"; {len(diffs) - 3} more" if len(diffs) > 3 else ""),
            **({"remedy": RETURN_DETACHED, "layer": "make_fx (a training step's graph holds "
                "its backward)"} if loss_only else {})}


RETURN_DETACHED = ("return the loss detached (loss.detach()), as trainers do: the graph of a "
                   "training step holds its backward, so nothing of it needs grad")
STATE_NOT_KEPT = ("create that state before the capture, as trainers do (one eager step, or "
                  "the optimizer's state initialized): the graph computes what the step "
                  "creates, but no input of the graph holds it")


def _op_nodes(gm, args, mode: str):
    """(node, snapshot) of every ATen op node that makes tensors, running ``gm`` node by
    node on ``args`` in ``mode``; and the node that raised, if one did."""
    import torch
    import torch.fx

    skip = ("aten::sym_", "aten::_assert", "aten::_local_scalar_dense", "profiler::")
    seen, failed = [], None

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            nonlocal failed
            failed = n
            out = super().run_node(n)
            failed = None
            if (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                    and not n.target.name().startswith(skip)):
                seen.append((n, snapshot(out)))
            return out

    torch.manual_seed(0)
    with contextlib.suppress(Exception), mode_context(mode):
        run_graph(gm, args, Recorder(gm).run)
    return seen, failed


def first_node(fn, gm, args, mode: str) -> tuple[object, str] | None:
    """The first node of the captured graph whose value differs from the same node of a trace
    of ``fn`` at these sizes (make_fx, real tensors), both run node by node: (node, why)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    captured, failed = _op_nodes(gm, fresh(args), mode)
    torch.manual_seed(0)
    try:
        with mode_context(mode):
            body, inputs = lifted(fn, fresh(args))
            real = make_fx(body, tracing_mode="real", record_module_stack=False)(*inputs)
        ref, _ = _op_nodes(real, fresh(args), mode)
    except Exception:  # noqa: BLE001 - eager itself raises here: nothing to compare with
        ref = []
    for (n, got), (m, want) in zip(captured, ref, strict=False):
        if n.target != m.target:
            return n, f"a trace at this size runs {m.target} here"
        if diffs := differences(got, want, mode, "output"):
            w, h = diffs[0]
            return n, f"{w}: {h}"
    if failed is not None:
        return failed, "it raised"
    return None


def _describe_node(n, why: str) -> str:
    target = getattr(n.target, "__name__", str(n.target))
    if hasattr(n.target, "name"):
        target = f"aten.{n.target.name().removeprefix('aten::')}"
    return f"{n.name} ({target}): {why}"


def inductor_compiled(gm, fake_inputs):
    """``gm`` compiled by Inductor from the fake inputs it was traced with, as a graph trainer
    compiles its captured step (compile_fx: AOTAutograd, then Inductor's C++ or Triton code)."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, list(fake_inputs))


def _replay_layer(diff: dict, node, in_inductor: bool) -> str:
    """The PT2 layer a replay's difference ``diff`` comes from, ``node`` its first node."""
    if in_inductor:
        return "Inductor (its compiled code: the captured graph gives eager's result here)"
    if diff["kind"] in ("refused", "accepted"):
        return "ShapeEnv (the trace's runtime asserts)"
    if "layer" in diff:
        return diff["layer"]
    if node is None and all(w.startswith("argument") for w in diff["what"]):
        return "make_fx (a change of the step's state that the graph does not make)"
    return "FakeTensor (a value the capture saw)"


def replay(fn, args, target_dir: str, modes: list[str], only: str | None = None,
           say=lambda line: print(line, file=sys.stderr, flush=True),
           inductor: bool = False) -> dict:
    """Capture ``fn(*args)`` once per mode, as a trainer captures its step in that mode, then
    run that one graph in the mode at the sizes the marks allow (one unbacked size, or
    shape_id, at a time, the others at their hint), against eager at the same sizes.
    ``inductor``: the graph run is the capture compiled by Inductor."""
    result = None
    found: dict = {}
    points, skipped = [], []
    for mode in modes:
        captured, gm, fake_inputs = trace(fn, args, target_dir, stack_traces=True, mode=mode)
        if gm is None and mode != "plain" and run_side(fn, fresh(args), mode)[1] is not None:
            say(f"replay  {mode}: eager raises in this mode too (a training step under "
                "no_grad): not replayed")
            skipped.append(mode)
            result = result or dict(captured, findings=[], traced=True)
            continue
        if gm is None:  # the capture failed: its findings say why
            for f in captured["findings"]:
                f["expr"] += "" if mode == "plain" else f" (captured under {mode})"
            return dict(captured, replay={"points": 0, "sizes": 0, "modes": modes})
        result = result or dict(captured, capture_findings=len(captured["findings"]))
        run = gm
        if inductor:
            try:
                with mode_context(mode):
                    run = inductor_compiled(gm, graph_given(gm, fake_inputs))
            except Exception as e:  # noqa: BLE001 - a compile that dies is the finding
                f = failure_finding(e, target_dir)
                f["expr"] += f" (compiling the captured graph with Inductor, {mode})"
                return dict(result, traced=False, findings=[f],
                            replay={"points": 0, "sizes": 0, "modes": modes, "inductor": True})
        if not points:
            groups = size_groups(args, fake_inputs)
            if only is not None:
                name, _, size = only.partition("=")
                groups = [dict(g, sizes=[int(size)]) for g in groups if g["name"] == name]
            points = [(f"{g['name']}={n}", inputs_at(args, g, n))
                      for g in groups for n in g["sizes"]]
        for size, at_size in points:
            diff = compare_at(fn, gm, at_size, mode, run)
            where = f"{size} {mode}"
            say(f"replay  {where:<24} {diff['kind'] if diff else 'ok'}")
            if diff is None:
                continue
            key = (diff["kind"], diff["what"])
            if key in found:
                found[key]["at"].append(where)
                continue
            # compiled: a captured graph that gives eager's result points at Inductor's code
            in_inductor = run is not gm and compare_at(fn, gm, at_size, mode) is None
            node = (None if in_inductor or diff["kind"] == "state not kept"
                    else first_node(fn, gm, at_size, mode))
            found[key] = {"kind": diff["kind"], "expr": diff["expr"], "fatal": False,
                          "layer": _replay_layer(diff, node, in_inductor),
                          "remedy": diff.get("remedy"),
                          "torch": None, "torch_func": None, "torch_frames": [],
                          "user": node_user(node[0], target_dir) if node else None,
                          "node": _describe_node(*node) if node else None,
                          "at": [where], "mode": mode, "only": size, "inductor": run is not gm}
    result["findings"] = list(found.values())
    replayed = [m for m in modes if m not in skipped]
    result["replay"] = {"points": len(points) * len(replayed), "sizes": len(points),
                        "modes": replayed, "skipped": skipped, "inductor": inductor}
    return result


def replay_summary(result: dict) -> str:
    r = result["replay"]
    return (f"{r['sizes']} size(s) of the unbacked inputs, in {len(r['modes'])} mode(s) "
            f"({', '.join(r['modes'])}): {r['points']} replay(s) of the captured graph"
            + (" compiled by Inductor" if r.get("inductor") else "")
            + (f"; not in {', '.join(r['skipped'])}, where eager raises too"
               if r.get("skipped") else ""))


ENGINE_REPRO = '''\
"""symfix audit repro: {title}: {expr}

{where}. Found with torch {version}. Run: python {name}
"""
import sys

sys.path.insert(0, {engine_dir!r})
import audit  # noqa: E402  (symfix's torch/_symfix/audit.py)

sys.exit(audit.main({argv!r}))
'''


def write_replay_repro(out_dir: str, n: int, f: dict, spec: str, version: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    name = os.path.join(out_dir, f"replay-{n}.py")
    path, sep, func = spec.partition(":")
    with open(name, "w") as fh:
        fh.write(ENGINE_REPRO.format(
            title=f"--replay: {f['kind']} at {f['at'][0]}", expr=f["expr"].replace(
                '"""', "'''"), where=f"node: {f['node']}; yours: {f['user']}",
            version=version, name=name, engine_dir=os.path.dirname(os.path.abspath(__file__)),
            argv=["--replay", os.path.abspath(path) + sep + func, "--modes", f["mode"],
                  "--only", f["only"], *(["--inductor"] if f.get("inductor") else [])]))
    return name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch._symfix audit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="FILE.py[:NAME], NAME defaults to audit_target")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--repro-dir", default="symfix-audit",
                   help="where repros of problems without a fix go (default: ./symfix-audit)")
    p.add_argument("--replay", action="store_true", help="run the captured graph at other "
                   "sizes and in other modes, against eager")
    p.add_argument("--modes", help=f"with --replay: {','.join(MODES)} or all (the default)")
    p.add_argument("--only", metavar="SYM=SIZE", help="with --replay: that size alone")
    p.add_argument("--inductor", action="store_true", help="with --replay: compile the "
                   "captured graph with Inductor, as a trainer does, and replay that")
    args = p.parse_args(argv)
    try:
        modes = parse_modes(args.modes)
        fn, fargs, path = load_target(args.target)
        refuse_hidden_state(fargs, args.target)
    except BadInput as e:
        print(f"symfix audit: {e}", file=sys.stderr)
        return 2
    if args.replay:
        result = replay(fn, fargs, os.path.dirname(path), modes, args.only,
                        inductor=args.inductor)
    else:
        result = capture(fn, fargs, os.path.dirname(path))
    if args.json:
        print(json.dumps(result, indent=1, default=str))
        return 1 if result["findings"] else 0
    ids = result["symfix"]
    built = f"symfix build with {len(ids)} fixes" if ids is not None else "no symfix fixes"
    remedies = []
    for n, f in enumerate(result["findings"], 1):
        if f.get("remedy"):  # the step's own, no fix of torch's
            remedies.append(f["remedy"])
            continue
        if args.only:  # a replay at one size: the repro is this command
            remedies.append(f"no known fix in this torch ({built})")
            continue
        if f.get("at"):
            repro = write_replay_repro(args.repro_dir, n, f, args.target, result["torch_version"])
        else:
            repro = write_repro(args.repro_dir, n, f, args.target, result["torch_version"],
                                bool(result["state_inputs"]))
        remedies.append(f"no known fix in this torch ({built}); repro: {repro}")
    header = (f"audit {args.target} with torch {result['torch_version']} ({built}); unbacked "
              f"inputs: {', '.join(result['unbacked_inputs']) or '–'}\n")
    print(report(result, remedies, header))
    return 1 if result["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
