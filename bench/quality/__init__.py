"""``mnemos bench quality`` (and ``precision``): every arm on identical questions, its report and studies."""
