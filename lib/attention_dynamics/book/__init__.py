"""The book machinery, apart from the science: it executes the chapter notebooks, records
what they compute with its provenance, judges the paper's claims and builds the HTML book.
A reader of the science never needs to open it.

The runner, one job a module:

- ``cli``: the command line ``python -m attention_dynamics.book``
- ``jobs``: what is run (a chapter at a profile, the points of a grid) and how a failure reads
- ``cache``: the cache key of a chapter and whether its last outputs can be trusted
- ``execution``: one chapter through papermill, its outputs moved into place only on success
- ``kernel``: the kernel a chapter runs in, its libraries loaded first, and the template
  that forks such kernels
- ``templates``: the runner's side of the templates: kernels forked, adopted and managed
- ``scheduling``: many chapters, one after another, side by side, or on a Dask cluster
- ``timetable``: the time table a build prints
- ``publishing``: a paper build's records into results/paper/, with the claims that moved

And around it:

- ``chapter``: the call every chapter starts with (parameters checked, figure style, record)
- ``launch``: every notebook's first code cell, which installs the library on Colab from the
  repository setting of ``book/_config.yml``
- ``profiles``: ``notebooks/profiles.yml`` and the YAML in which parameter values travel
- ``parameters``: each chapter's parameters with their ranges (``parameters.yml``), checked
  by the notebook and by the runner
- ``provenance``: what a record carries about its run, and the footer of every chapter
- ``records``: the numbers a notebook records (and glues into its text), written atomically
- ``scorecard``: the page listing every claim of the paper with its computed verdict
- ``compare``: two sets of records side by side (another machine, the kernels off, a new
  commit): what moved, by how much, and which claims changed
- ``render``: the Sphinx extension that renders each page's summary box, its run-time box
  and its verdict sentences from its record when the book is built
- ``build``: the HTML book (Jupyter Book 1.x) and its check for pages that show errors
"""
