"""attention_dynamics: the library behind the reproducible book of
*Gradient Dynamics of Attention: How Cross-Entropy Sculpts Bayesian Manifolds*
(Agarwal, Dalal, Misra, arXiv:2512.22473). A map, module by module:

One attention head
    head            the forward pass: scores, attention, outputs; parameters; heads split and merged
    laws            the closed-form backward pass (R1 routing, R2 values, R3 queries and keys)
    readout         the linear cross-entropy read-out and its gradient u = dL/dg
    gradcheck       the closed forms against autograd (R1-R3; the selective SSM's, R9), one error measure
    first_order     the loss change of a step against its first-order prediction (R4)

Training and its two timescales
    training        one training loop, pluggable update rules, roles and the EM-style schedule
    em              attention as EM (R6): mixtures, textbook EM, the head's E- and M-steps
    tuning          baselines tuned with the same budget as the EM-style schedule (R6, R7)
    tuned_trials    the tuned comparison's trials, stored, so that a build makes them as tasks (R6, R7)
    tuned_arms      from tuning to the test: grids, seeds kept apart, scores, chosen rates, arms (R6, R7)
    wt_tuning       the wind tunnel's fair comparison: a rate's trial, the test's arms (R6, R8)

Models
    causal_head     the single causal head of the sticky-chain protocol (R7), fast and reference
    transformer     one small causal transformer and the one way it trains (fit)
    windtunnel      the wind-tunnel experiment's settings, model and training (R8)
    devices         where a wind-tunnel run trains (CPU, or CUDA where present) and the steps a time budget allows
    windtunnel_rates  the wind tunnel with an optimizer and a rate per role, judged held out (R6, R8)
    windtunnel_ablation  the wind tunnel's ablations (a channel, roles frozen; rates), each a stored run (R8)
    ssm             a selective state-space model (Mamba's S6) as content-based routing (R9)
    deep_variant    the sticky chain's deep variant: a transformer per seed, each seed a stored run (R7)
    primitive_models  the inference-primitives experiment: attention and SSM side by side (R9)
    ssm_reference   our selective SSM against the reference implementation (mambapy)

Tasks and their exact posteriors (attention_dynamics.tasks)
    tasks.clusters      queries from clusters reading a memory of slots (R5, R6)
    tasks.sticky_chain  the sticky Markov chain and its Bayes floors (R7)
    tasks.bijection     the bijection wind tunnel and its exact posterior (R8)
    tasks.primitives    accumulation, transport and binding with their Bayes predictors (R9)

The paper's claims
    reference       what the paper and the authors' script report, with where each comes from
    rules           how a number becomes a verdict: the verdicts' words and the rules common to many claims
    claims          the table of claims, each with its reading of its chapter's record (rendered by
                    book.render, book.scorecard)
    readings        the sentences a chapter phrases from its verdicts and numbers

Measurements
    agreement       whether a change has the sign a law predicts (one measure, the weighting chosen)
    specialization  routing and content specializing together (R5)
    geometry        calibration and the geometry of a trained transformer (R8)
    law_probe       the two laws inside a trained transformer (R8)
    routing_probe   which routing law moves the weights of a trained attention or SSM model (R9)
    frame_probe     the key frame of the retrieval heads, Paper I's alignment and value manifold (R8)
    entropy_probe   whether posterior entropy is encoded beyond position (R8)
    stats           slopes, spreads, first steps below a threshold, settling times

Support
    validation      argument checks whose errors name the argument and the allowed range
    plotting        the book's look and the figures chapters share
    native          compiled kernels (C, built on first use) behind the fast paths, each the
                    default only on processors where it measured faster (native/speed.json)
    machine         the processor, as records, kernel caches and the kernel choice name it
    artifacts       trained models kept on disk between chapters, with their provenance
    store           where the trained-model store is and which models it holds (no torch)
    files           files written whole or not at all (one rename from a temporary beside them)
    sources         which library source files a computation depends on (cache keys)

The book machinery lives apart, in attention_dynamics.book (the runner: cli, jobs, cache,
execution, plans, dispatch, scheduling, timetable, publishing; and profiles, parameters, provenance, records,
scorecard, render, compare, build); a reader of the science never needs to open it.
"""
__version__ = "0.2.0"
