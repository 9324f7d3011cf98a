"""``mnemos bench packets``: evidence packets against a top-k list at equal token budgets."""
