"""Test-wide setup: models load from local files only, tokenizers stay single-threaded (the CLI's
own helper, before any test module imports a model library); the service-test fixtures of
tests/support.py (own database, own stream prefix, fake models) are registered once, for every suite
that asks for them."""

from workers.settings import prepare_offline_models

prepare_offline_models()

pytest_plugins = ["tests.support"]
