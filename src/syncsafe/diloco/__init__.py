"""Real DiLoCo training pieces: corpus, tokenizer, model, outer step, checkpoints, export.

Modules (imported individually; this package imports nothing heavy on its own):

- :mod:`~syncsafe.diloco.corpus`: offline stdlib corpus (cpu), HF streaming (gpu),
  per-island shards and step-indexed token batches.
- :mod:`~syncsafe.diloco.tokenizer`: locally trained byte-level BPE, cached.
- :mod:`~syncsafe.diloco.model`: tiny seeded Llama or pretrained model; eval loss.
- :mod:`~syncsafe.diloco.outer`: pseudo-gradients, weighted averaging, outer Nesterov step.
- :mod:`~syncsafe.diloco.comm`: the ``torch.distributed`` all-reduce injected into merges.
- :mod:`~syncsafe.diloco.checkpoint`: atomic, validated island checkpoints.
- :mod:`~syncsafe.diloco.export`: atomic Hugging Face export of the global model.
"""
