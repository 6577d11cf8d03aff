"""``python -m refbayes.tracing FOLDER...``: bless the golden traces of each folder."""
import sys

from refbayes.tracing.tracer import main

sys.exit(main())
