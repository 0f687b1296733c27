"""The book machinery, apart from the science: it executes the chapter notebooks, records
what they compute with its provenance, judges the paper's claims and builds the HTML book.
A reader of the science never needs to open it.

- ``runner``: executes chapters with a parameter profile (papermill), caches, grids, the
  command line ``python -m attention_dynamics.book``
- ``profiles``: ``notebooks/profiles.yml`` and the YAML in which parameter values travel
- ``provenance``: what a record carries about its run, and the footer of every chapter
- ``records``: the numbers a notebook records (and glues into its text), written atomically
- ``scorecard``: the page listing every claim of the paper with its computed verdict
- ``compare``: two sets of records side by side (another machine, the kernels off, a new
  commit): what moved, by how much, and which claims changed
- ``render``: the Sphinx extension that renders each page's summary box and verdict
  sentences from its record when the book is built
- ``build``: the HTML book (Jupyter Book 1.x) and its check for pages that show errors
"""
