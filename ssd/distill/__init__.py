"""Training the embedded default's draft: a feature-reading (EAGLE-style) head over SmolLM2-135M-Instruct.

`data` synthesises training prompts and has the target answer them, keeping its final hidden state for
every token; `train` fits the draft on those features; `evaluate` measures acceptance against the target.
"""
