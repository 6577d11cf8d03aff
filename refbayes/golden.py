"""Deprecated: golden traces live in ``refbayes.tracing``; this module re-exports its names for
one release, and ``python -m refbayes.golden FOLDER`` still blesses a folder of traces."""
import sys

from refbayes.tracing import *  # noqa: F401, F403
from refbayes.tracing import __all__  # noqa: F401  (the names re-exported)
from refbayes.tracing.files import MANIFEST_KEY  # noqa: F401
from refbayes.tracing.tracer import main

if __name__ == "__main__":
    sys.exit(main())
