"""What several benchmarks share: datasets, corpora, questions, folds, statistics, caches, plots, data, the service harness."""
