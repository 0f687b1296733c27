"""python -m attention_dynamics.book: execute the chapters and build the book (see runner)."""
import sys

from .runner import main

sys.exit(main())
