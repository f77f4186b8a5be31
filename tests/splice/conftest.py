"""Splice tests import their shared tool schema from splice_fixtures (this folder goes on sys.path)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
