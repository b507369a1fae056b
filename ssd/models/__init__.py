"""Model code: the decoder and the feature-reading draft, the paged KV cache and its blocks, attention, rotary
embeddings, CUDA graphs, tensor parallelism, and model folders (layout, loading, preparing, downloading); see
docs/architecture.md."""
