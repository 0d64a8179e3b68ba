"""The tuner's proof machinery: token forcing, the paired-run controller, the cost model.

Every later speed-up must be proven faster by more than the noise (``controller``) and
lossless against the stock system (``forcing``); ``cost_model`` and ``profiler`` say where the
remaining speed is; ``sealed`` keeps a held-out request set away from tuning. Systems under
test are Protocols (``ForcedScorer``, ``GreedyDecoder``, ``Runner``) so the judges run on
simulated systems (``simulate``) as well as on the engine.
"""
