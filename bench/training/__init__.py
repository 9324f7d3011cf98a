"""Training of the project's own cross-encoder reranker (the ``train`` extra: datasets, accelerate).

:mod:`bench.training.pairs` selects positive pairs and mines negatives; :mod:`bench.training.cross_encoder`
fine-tunes on them and writes the model with its provenance. ``mnemos reranker train``
(:mod:`bench.training.cli`) runs both. The service never imports this package: it only reads the
provenance file beside a model (:data:`workers.runtime.models.PROVENANCE_FILE`).
"""
