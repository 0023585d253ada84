"""Write the demo conversations data set into a folder: the launcher of :mod:`hyperparallel.data.demo`
(its docstring has the flags), runnable from a checkout without installing the package.

    python tools/make_demo_data.py data/demo
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hyperparallel.data.demo import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
