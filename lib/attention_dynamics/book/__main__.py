"""python -m attention_dynamics.book: execute the chapters and build the book (see cli)."""
import sys

from .cli import main

sys.exit(main())
