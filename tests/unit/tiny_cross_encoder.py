"""A tiny randomly initialised BERT cross-encoder, built from local files only (no downloads).

Two layers, hidden size 32, one output logit; the tokenizer files are the bundled bi-encoder's
(all-MiniLM-L6-v2's uncased WordPiece vocabulary). Scores mean nothing: tests use it for
plumbing, batching, truncation and precision, never quality.
"""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def build_tiny_cross_encoder(directory: Path, *, seed: int = 0) -> Path:
    """Write the tiny model into ``directory`` (created) and return it."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from mnemos.encoder import bundled_bi_encoder_path

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=1,
                        initializer_range=0.5)  # wide weights: scores that differ between texts
    BertForSequenceClassification(config).save_pretrained(directory)
    source = bundled_bi_encoder_path()
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, directory / name)
    return directory
