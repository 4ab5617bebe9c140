"""A fix's tests, carried into the upstream test file at the same path of a PyTorch checkout.

Our tests live at PyTorch's paths (test/test_dynamic_shapes.py::TestUnbackedRebind::test_x). For
an exported commit, the test classes a fix's proof and guard tests belong to go into the
checkout's file: before its ``if __name__ == "__main__":`` block, with the imports and the
module-level helpers they use (what the file already binds is not added again). A class the file
already has (an earlier commit of the stack added it) gets the methods it lacks. Where the file
does not exist, it is created in PyTorch's style: owner line, imports, classes, ``run_tests()``.
Everything is found with ``ast``, and the result must compile.
"""

from __future__ import annotations

import ast
import py_compile
import tempfile
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from .errors import Refused
from .series import Fix

MAIN = 'if __name__ == "__main__":\n    run_tests()\n'


# symfix's own tests (of the tooling, and a source-only fix's check compiled against a wheel's
# headers) stay here: upstream runs a fix's tests in its own source build.
TOOLING = "test/tools/"
# The scoreboards' per-op tests read their expectations from symfix's data
# (patches/<series>/ops_unbacked.toml, dtensor_unbacked.toml); upstream's files at those paths
# have their own TestOpsUnbacked and TestUnbackedDTensorOps, whose expectations are its
# ops_dde_xfail and ops_unbacked_dtensor_dde lists: a PR drops the ops it fixes from those lists
# (our mails do, in common_ops_unbacked.py) and carries the fix's other tests.
SCOREBOARDS = ("test/test_ops_unbacked.py::TestOpsUnbacked",
               "test/distributed/tensor/test_dtensor_ops.py::TestUnbackedDTensorOps")


def wanted(fix: Fix) -> dict[str, dict[str, set[str] | None]]:
    """file -> class (or module-level test function) -> the test methods named (None: all)."""
    out: dict[str, dict[str, set[str] | None]] = defaultdict(dict)
    for test in fix.tests:
        if test.startswith((TOOLING, *SCOREBOARDS)):
            continue
        path, name, *method = test.split("::")
        have = out[path].setdefault(name, set() if method else None)
        if method and have is not None:
            have.add(method[0])
        elif not method:
            out[path][name] = None
    return dict(out)


def test_commands(fix: Fix) -> list[str]:
    """How to run the fix's tests in the checkout: PyTorch's runner, one line per file."""
    return [f"python {path} " + " ".join(f"-k {name}" for name in names)
            for path, names in wanted(fix).items()]


def _is_main(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
            and len(node.test.comparators) == 1
            and isinstance(node.test.comparators[0], ast.Constant)
            and node.test.comparators[0].value == "__main__")


def _is_plain_main(node: ast.If) -> bool:
    return ast.dump(node) == ast.dump(ast.parse(MAIN).body[0])


def _binds(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    return []


def _used(node: ast.AST) -> tuple[set[str], set[str]]:
    """Names a piece of code reads, and the dotted chains it reads (torch._dynamo.config...)."""
    names, chains = set(), set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute):
            parts, cur = [], n
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                parts.append(cur.id)
                dotted = ".".join(reversed(parts))
                chains.update(dotted.rsplit(".", k)[0] for k in range(len(parts)))
    return names, chains


@dataclass
class Module:
    path: str
    text: str

    def __post_init__(self):
        try:
            self.tree = ast.parse(self.text)
        except SyntaxError as e:
            raise Refused(f"{self.path}: does not parse ({e})") from None
        self.lines = self.text.splitlines(keepends=True)
        self.defs: dict[str, ast.stmt] = {}  # top-level name -> the statement binding it
        self.imports: list[tuple[ast.stmt, ast.alias]] = []  # in the file's order
        self.imported: set[str] = set()  # the names they bind
        self.plain_imports: set[str] = set()  # `import a.b.c` modules
        self.main: ast.If | None = None
        for node in self.tree.body:
            if _is_main(node):
                self.main = self.main or node
                continue
            for inner in ([node] if not isinstance(node, ast.If | ast.Try) else ast.walk(node)):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    for alias in inner.names:
                        self.imports.append((inner, alias))
                        self.imported.add(alias.asname or alias.name.split(".")[0])
                        if isinstance(inner, ast.Import) and not alias.asname:
                            self.plain_imports.add(alias.name)
            if not isinstance(node, ast.Import | ast.ImportFrom):
                for name in _binds(node):
                    self.defs.setdefault(name, node)

    def binds(self, name: str) -> bool:
        return name in self.defs or name in self.imported

    def start(self, node: ast.stmt) -> int:
        """0-based first line of ``node``: its decorators and the comment lines right above."""
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
        while first > 0 and self.lines[first - 1].lstrip().startswith("#") \
                and not self.lines[first - 1].startswith("# Owner(s):"):
            first -= 1
        return first

    def source(self, node: ast.stmt) -> str:
        return "".join(self.lines[self.start(node):node.end_lineno])

    def owner(self) -> str:
        first = self.lines[0] if self.lines else ""
        return first if first.startswith("# Owner(s):") else '# Owner(s): ["module: unknown"]\n'


def _class_text(mod: Module, cls: ast.ClassDef, methods: set[str] | None) -> str:
    """The class's source with only the wanted test methods (and every non-test member)."""
    if methods is not None:
        have = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        if missing := sorted(methods - have):
            raise Refused(f"{mod.path}: class {cls.name} has no test {missing[0]}")
    drop: set[int] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                and node.name.startswith("test") and methods is not None \
                and node.name not in methods:
            end = node.end_lineno
            while end < len(mod.lines) and end < cls.end_lineno and not mod.lines[end].strip():
                end += 1  # the blank lines after it
            drop.update(range(mod.start(node), end))
    first = mod.start(cls)
    kept = [ln for i, ln in enumerate(mod.lines[first:cls.end_lineno], first) if i not in drop]
    return "".join(kept).rstrip() + "\n"


def _members(cls: ast.ClassDef) -> dict[str, ast.stmt]:
    out = {}
    for node in cls.body:
        for name in _binds(node):
            out[name] = node
    return out


def _import_text(node: ast.stmt, aliases: list[ast.alias]) -> str:
    names = [a.name + (f" as {a.asname}" if a.asname else "") for a in aliases]
    if isinstance(node, ast.Import):
        return "".join(f"import {n}\n" for n in names)
    module = "." * node.level + (node.module or "")
    line = f"from {module} import {', '.join(names)}\n"
    if len(line) <= 89:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")\n"


def carry(ours_text: str, target_text: str | None, path: str,
          classes: dict[str, set[str] | None]) -> str:
    """``target_text`` (None: no such file) with ``classes`` of ``ours_text`` carried into it."""
    ours = Module(f"our {path}", ours_text)
    new_file = target_text is None
    target = Module(f"{path} in the checkout",
                    ours.owner() + (ours.source(ours.main) if ours.main else MAIN)
                    if new_file else target_text)

    insert: dict[int, list[str]] = defaultdict(list)  # 0-based line of target -> text before it
    fragments: dict[int, str] = {}  # our statement's line -> the text to add
    used_names: set[str] = set()
    used_chains: set[str] = set()

    def use(tree: ast.AST) -> None:
        names, chains = _used(tree)
        used_names.update(names)
        used_chains.update(chains)

    def same(a: ast.AST, b: ast.AST) -> bool:
        return ast.dump(a) == ast.dump(b)

    for name, methods in classes.items():
        node = ours.defs.get(name)
        if not isinstance(node, ast.ClassDef | ast.FunctionDef):
            raise Refused(f"{ours.path}: no test class or function {name}")
        text = _class_text(ours, node, methods) if isinstance(node, ast.ClassDef) \
            else ours.source(node)
        mine = ast.parse(text).body[0]
        have = target.defs.get(name)
        if have is None:
            fragments[node.lineno] = text
            use(mine)
            continue
        if not (isinstance(have, ast.ClassDef) and isinstance(mine, ast.ClassDef)
                and [ast.dump(b) for b in have.bases] == [ast.dump(b) for b in mine.bases]):
            raise Refused(f"{target.path} has a different {name}; rename ours or merge by hand")
        theirs = _members(have)
        for member, stmt in _members(mine).items():
            if member not in theirs:
                lines = text.splitlines(keepends=True)
                first = min([stmt.lineno, *(d.lineno for d in
                                            getattr(stmt, "decorator_list", []))]) - 1
                insert[have.end_lineno].append("\n" + "".join(lines[first:stmt.end_lineno]))
                use(stmt)
            elif not same(theirs[member], stmt):
                raise Refused(f"{target.path}: {name}.{member} differs from ours; "
                              "merge by hand")

    main_text = None  # what replaces (or becomes) the target's __main__ block
    if ours.main and not _is_plain_main(ours.main) and not new_file:
        if target.main is None or _is_plain_main(target.main):
            main_text = ours.source(ours.main)
        elif not same(target.main, ours.main):
            raise Refused(f"{target.path}: its __main__ block and ours differ; merge by hand")
    if new_file or main_text or (target.main and ours.main and same(target.main, ours.main)):
        use(ours.main or ast.parse(MAIN))
    elif target.main is None:
        main_text = MAIN
        use(ast.parse(MAIN))

    # Module-level helpers the carried code uses, and what they use in turn.
    done: set[str] = set()
    while todo := sorted(n for n in used_names if n in ours.defs and n not in done):
        for name in todo:
            done.add(name)
            node = ours.defs[name]
            if node.lineno in fragments or name in classes:
                continue
            if name in target.defs:
                if not same(target.defs[name], node):
                    raise Refused(f"{target.path} defines {name} differently from ours; "
                                  "rename ours or merge by hand")
                continue
            if name in target.imported:
                continue
            fragments[node.lineno] = ours.source(node)
            use(node)
    # Instantiation calls of ours for the classes carried (instantiate_parametrized_tests(...)).
    for node in ours.tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and _used(node)[0] & set(classes) and not any(
                    same(node, t) for t in target.tree.body):
            fragments[node.lineno] = ours.source(node)
            use(node)

    # Imports of ours that bind a name the carried code uses and the target lacks.
    needed: dict[int, tuple[ast.stmt, list[ast.alias]]] = {}
    for node, alias in ours.imports:
        bound = alias.asname or alias.name.split(".")[0]
        dotted = isinstance(node, ast.Import) and not alias.asname and "." in alias.name
        if dotted:
            want = alias.name in used_chains
            have = any(m == alias.name or m.startswith(alias.name + ".")
                       for m in target.plain_imports)
        else:
            want, have = bound in used_names, target.binds(bound)
        if want and not have:
            needed.setdefault(node.lineno, (node, []))[1].append(alias)
    # A name from a module the file already imports from joins that statement.
    replace: dict[int, tuple[int, str]] = {}  # first line -> (end line, new text)
    for key, (node, aliases) in list(needed.items()):
        if not isinstance(node, ast.ImportFrom):
            continue
        theirs = next((n for n in target.tree.body if isinstance(n, ast.ImportFrom)
                       and (n.module, n.level) == (node.module, node.level)
                       and n.names[0].name != "*"
                       and "#" not in "".join(target.lines[n.lineno - 1:n.end_lineno])), None)
        if theirs is None or theirs.lineno - 1 in replace:
            continue
        names = [*theirs.names, *aliases]
        if [a.name.lower() for a in theirs.names] == sorted(a.name.lower() for a in theirs.names):
            names.sort(key=lambda a: a.name.lower())
        replace[theirs.lineno - 1] = (theirs.end_lineno, _import_text(theirs, names))
        del needed[key]
    imports = "".join(_import_text(node, aliases) for _, (node, aliases) in sorted(needed.items()))

    if imports:
        head = []
        for i, node in enumerate(target.tree.body):
            if not (isinstance(node, ast.Import | ast.ImportFrom)
                    or (i == 0 and isinstance(node, ast.Expr))):
                break
            head.append(node)
        last = max((n.end_lineno for n in head if isinstance(n, ast.Import | ast.ImportFrom)),
                   default=None)
        if last is None:  # no imports yet: after the owner line, comments and docstring
            last = max([n.end_lineno for n in head], default=0)
            while last < len(target.lines) and target.lines[last].startswith("#"):
                last += 1
            if last and not new_file:
                imports = "\n" + imports
        insert[last].append(imports)

    lines = list(target.lines)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    main_at = target.start(target.main) if target.main else len(lines)
    tail = [fragments[k] for k in sorted(fragments)]
    if main_text is not None:
        if target.main is not None:
            del lines[main_at:target.main.end_lineno]
        tail.append(main_text)
    if tail:
        before = "\n\n" if (new_file or target.main is None) and lines else ""
        after = "\n\n" if target.main is not None and main_text is None else ""
        insert[main_at].append(before + "\n\n".join(tail) + after)
    for at in sorted({*insert, *replace}, reverse=True):
        if at in replace:
            lines[at:replace[at][0]] = [replace[at][1]]
        lines[at:at] = insert.get(at, [])
    return "".join(lines)


def compiles(text: str, path: str) -> None:
    with tempfile.TemporaryDirectory(prefix="symfix-compile-") as tmp:
        src = Path(tmp) / Path(path).name
        src.write_text(text)
        try:
            py_compile.compile(str(src), cfile=str(Path(tmp) / "out.pyc"), doraise=True)
        except py_compile.PyCompileError as e:
            raise Refused(f"{path}: the carried tests do not compile: {e.msg.strip()}") from None


def test_source(ours_root: Path, test_id: str) -> str | None:
    """The source of one of our tests (``path::Class::method``), dedented."""
    path, *names = test_id.split("::")
    try:
        node: ast.AST = ast.parse((ours_root / path).read_text())
    except (OSError, SyntaxError):
        return None
    lines = (ours_root / path).read_text().splitlines(keepends=True)
    for name in names:
        node = next((n for n in getattr(node, "body", []) if getattr(n, "name", None) == name),
                    None)
        if node is None:
            return None
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    return textwrap.dedent("".join(lines[first:node.end_lineno]))


def carry_fix(fix: Fix, ours_root: Path, checkout: Path) -> list[str]:
    """Write ``fix``'s tests into ``checkout``; returns the paths changed (relative).

    Every file is made and checked first; nothing is written unless all of them are good.
    """
    changed = {}
    for path, classes in wanted(fix).items():
        ours = ours_root / path
        if not ours.is_file():
            raise Refused(f"{fix.id}: its test file {path} does not exist")
        dest = checkout / path
        before = dest.read_text() if dest.is_file() else None
        after = carry(ours.read_text(), before, path, classes)
        compiles(after, path)
        tree = ast.parse(after)
        defined = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
        for name, methods in classes.items():
            have = {m.name for m in ast.walk(defined[name]) if isinstance(m, ast.FunctionDef)} \
                if name in defined else set()
            if name not in defined or not (methods or set()) <= have:
                raise Refused(f"{path}: carrying {name} into the checkout's file failed")
        if after != before:
            changed[path] = after
    for path, text in changed.items():
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text(text)
    return list(changed)
