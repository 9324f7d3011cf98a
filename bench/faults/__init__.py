"""``mnemos bench faults``: real worker processes, private Redis and Postgres, injected faults, then a count."""
