"""Test-wide setup: models load from local files only, tokenizers stay single-threaded (the CLI's
own helper, before any test module imports a model library)."""

from workers.settings import prepare_offline_models

prepare_offline_models()
