"""Numbered SQL migrations (``0001_name.sql`` …), shipped as package data and applied in order by
``mnemos migrate`` (see :mod:`workers.ops.migrate`)."""
