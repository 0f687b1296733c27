"""Tasks with known solutions or exact Bayesian posteriors."""
