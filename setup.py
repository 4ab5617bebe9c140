"""setup.py, as at the top of PyTorch's tree, for the tools and habits that still call it:

    python setup.py bdist_wheel [-d DIR] [--variant V] [--base B] [--wheel PATH]
    python setup.py --version

Both run the build `pip wheel .` runs (tools/symfixlib/pep517.py), for this interpreter; not a
second build. `pip install .` and the other PEP 517 front ends do not come through here.
"""

import argparse
import os
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent / "tools"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="setup.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="store_true", help="the version the build makes")
    p.add_argument("command", nargs="?", choices=["bdist_wheel"])
    p.add_argument("-d", "--dist-dir", default="dist", help="where the wheel goes (dist/)")
    for name in ("base", "variant", "wheel"):
        p.add_argument(f"--{name}", help=f"as pip's -C {name}=…")
    args = p.parse_args(argv)
    if not args.version and not args.command:
        p.error("say bdist_wheel or --version")
    # The tool's own dependencies: symfix.py runs again under its tools environment when this
    # Python lacks them; the wheel stays this interpreter's.
    os.environ.setdefault("SYMFIX_BUILD_PYTHON", sys.executable)
    sys.path.insert(0, str(TOOLS))
    import symfix

    symfix._bootstrap(script=__file__)
    from symfixlib import pep517

    settings = {k: getattr(args, k) for k in ("base", "variant", "wheel") if getattr(args, k)}
    if args.version:
        print(pep517.version(settings))
        return 0
    Path(args.dist_dir).mkdir(parents=True, exist_ok=True)
    print(Path(args.dist_dir) / pep517.build_wheel(args.dist_dir, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
