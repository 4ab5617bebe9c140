"""python -m torch._symfix audit FILE.py[:NAME]: audit a step's unbacked sizes (see audit.py)."""

import sys

from torch._symfix.audit import main

USAGE = ("usage: python -m torch._symfix audit FILE.py[:NAME] [--json] [--repro-dir DIR] "
         "[--replay [--modes MODES]]")

if __name__ == "__main__":
    if sys.argv[1:2] != ["audit"]:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[2:]))
