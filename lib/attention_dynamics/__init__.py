"""attention_dynamics: the library behind the reproducible book of
*Gradient Dynamics of Attention: How Cross-Entropy Sculpts Bayesian Manifolds*
(Agarwal, Dalal, Misra, arXiv:2512.22473).

Modules: ``head`` (forward pass), ``laws`` (closed-form backward, R1-R3), ``readout``
(cross-entropy read-out), ``checks`` (argument validation), ``records`` (numbers a
notebook records), ``runner`` (executes the notebooks), ``plotting``.
"""
__version__ = "0.1.0"
