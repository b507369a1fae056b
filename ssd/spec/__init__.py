"""The speculative algorithm's torch-free part: what the router (which never imports torch) and the engines
share.

`theory` (the paper's closed forms), `backup` (which backup speculation a miss gets, and the measurements
behind it), `adaptive` (K per round), `fanout` (forks per acceptance position), `cache` (the speculation
cache keyed by outcome), `ngram` (the n-gram backup) and `check` (whether drafted tokens with their proposal
rows can be verified). Plain Python and numpy; tests/test_import_graph.py checks that nothing here reaches
torch. The tensor side of the algorithm (verification, the proposal distribution, fork selection) lives in
`ssd.engine` (`verify`, `proposal`, `forks`).
"""
