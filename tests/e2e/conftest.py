"""End-to-end tests use the service-test fixtures of tests/support.py (own database, own stream
prefix), registered in tests/conftest.py."""
