"""Training the embedded default's draft: a feature-reading (EAGLE-style) head over SmolLM2-135M-Instruct.

`data` synthesises training prompts and has the target answer them, keeping its final hidden state for
every token; `corpus` holds those sequences in memory; `unroll` is the draft's forward unrolled on its own
outputs; `train` fits the draft on the features with it; `evaluate` measures acceptance against the target.
"""
